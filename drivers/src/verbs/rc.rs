//! The verbs backend's objects: a device context, protection domains, memory regions, and
//! completion queues polled by the engine (connections and queue pairs are in `cm.rs`).
//!
//! Ownership follows rdma-core's teardown order: a memory region holds its protection domain,
//! a queue pair holds its protection domain and both completion queues, and everything holds the
//! context, so `Drop` always destroys children before parents.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::io;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};

use barewire_engine::{poll_readable, spawn_local, JoinHandle, Poller};
use barewire_rdma_types::{
    Access, CompletionQueue as Queue, Stag, WcOpcode, WcStatus, WorkCompletion,
};
use rdma_sys as sys;

use crate::transport::DriverError;

/// Most SGEs one work request may carry on this backend.
pub const MAX_SGE: usize = 16;

pub(crate) fn last_os_error(what: &str) -> DriverError {
    DriverError::Verbs {
        call: what.to_string(),
        error: io::Error::last_os_error().to_string(),
    }
}

pub(crate) fn os_error(what: &str, rc: i32) -> DriverError {
    DriverError::Verbs {
        call: what.to_string(),
        error: io::Error::from_raw_os_error(rc).to_string(),
    }
}

pub(crate) fn set_nonblocking(fd: RawFd) -> Result<(), DriverError> {
    // SAFETY: fcntl on an fd rdma-core handed us; only the O_NONBLOCK flag changes.
    let rc = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
    };
    if rc < 0 {
        return Err(last_os_error("fcntl(O_NONBLOCK)"));
    }
    Ok(())
}

/// A device context, taken from librdmacm's own list so that connection identifiers resolve to
/// the very same `ibv_context` the protection domains and queues were made on.
pub struct Context {
    list: *mut *mut sys::ibv_context,
    pub(crate) ctx: *mut sys::ibv_context,
    pub(crate) name: String,
    /// The device binds type 2 memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2B`, `max_mw` > 0).
    pub(crate) windows: bool,
}

impl Context {
    /// Opens the device called `name`.
    pub fn open(name: &str) -> Result<Rc<Context>, DriverError> {
        let mut n = 0i32;
        // SAFETY: librdmacm allocates the list; Drop frees it.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() {
            return Err(last_os_error("rdma_get_devices"));
        }
        let mut found = Vec::new();
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds n valid contexts.
            let ctx = unsafe { *list.add(i) };
            if ctx.is_null() {
                break;
            }
            // SAFETY: a context's device and its NUL-terminated name live as long as the list.
            let dev_name = unsafe { CStr::from_ptr(sys::ibv_get_device_name((*ctx).device)) }
                .to_string_lossy()
                .into_owned();
            if dev_name == name {
                // SAFETY: all-zero is a valid ibv_device_attr for the query to fill; ctx is
                // live.
                let windows = unsafe {
                    let mut attr: sys::ibv_device_attr = std::mem::zeroed();
                    sys::ibv_query_device(ctx, &mut attr) == 0
                        && attr.max_mw > 0
                        && attr.device_cap_flags
                            & sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0
                            != 0
                };
                return Ok(Rc::new(Context {
                    list,
                    ctx,
                    name: dev_name,
                    windows,
                }));
            }
            found.push(dev_name);
        }
        // SAFETY: freeing the list we were given.
        unsafe { sys::rdma_free_devices(list) };
        Err(DriverError::NoSuchDevice {
            name: name.into(),
            found: if found.is_empty() {
                "no devices".into()
            } else {
                found.join(", ")
            },
        })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every object made on the context holds an Rc to it, so none is left.
        unsafe { sys::rdma_free_devices(self.list) };
    }
}

/// A protection domain (`ibv_alloc_pd`).
pub struct Pd {
    pub(crate) ctx: Rc<Context>,
    pub(crate) pd: *mut sys::ibv_pd,
}

impl Pd {
    /// Allocates one on `ctx`.
    pub fn new(ctx: &Rc<Context>) -> Result<Rc<Pd>, DriverError> {
        // SAFETY: a live context.
        let pd = unsafe { sys::ibv_alloc_pd(ctx.ctx) };
        if pd.is_null() {
            return Err(last_os_error("ibv_alloc_pd"));
        }
        Ok(Rc::new(Pd {
            ctx: ctx.clone(),
            pd,
        }))
    }

    /// Registers `len` bytes at `addr` (`ibv_reg_mr`).
    ///
    /// # Safety
    /// The memory must stay valid, and not be freed, while the region lives; the device may
    /// read or write it whenever a peer or a posted work request says so.
    pub unsafe fn register(
        self: &Rc<Pd>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Mr, DriverError> {
        let mut flags = ibv_access(access);
        if self.ctx.windows {
            // Windows may be bound over it (MemoryRegion::bind_window).
            flags |= sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        }
        // SAFETY: the caller vouches for the memory; the PD is live.
        let mr = unsafe { sys::ibv_reg_mr(self.pd, addr.cast(), len, flags as i32) };
        if mr.is_null() {
            return Err(last_os_error("ibv_reg_mr"));
        }
        Ok(Mr {
            pd: self.clone(),
            mr,
            access,
            windows: RefCell::default(),
        })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: regions and queue pairs hold an Rc to the PD, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.pd) };
        let _ = &self.ctx;
    }
}

/// A memory region (`ibv_reg_mr`); deregistered on drop, after the windows bound in it are
/// deallocated (a window must not outlive the memory it reaches).
pub struct Mr {
    pd: Rc<Pd>,
    mr: *mut sys::ibv_mr,
    access: Access,
    windows: RefCell<Vec<Weak<MwSlot>>>,
}

impl Mr {
    /// First byte.
    pub fn addr(&self) -> *mut u8 {
        // SAFETY: a live region.
        unsafe { (*self.mr).addr.cast() }
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: a live region.
        unsafe { (*self.mr).length }
    }
    /// The local key.
    pub fn lkey(&self) -> Stag {
        // SAFETY: a live region.
        Stag(unsafe { (*self.mr).lkey })
    }
    /// The remote key.
    pub fn rkey(&self) -> Stag {
        // SAFETY: a live region.
        Stag(unsafe { (*self.mr).rkey })
    }
    /// Its access rights.
    pub fn access(&self) -> Access {
        self.access
    }
}

impl Mr {
    /// Takes the region's own remote rights away (`ibv_rereg_mr` with local access and
    /// `IBV_ACCESS_MW_BIND` only): peers reach it only through windows. Its keys change.
    pub fn remote_only_through_windows(&self) -> Result<(), DriverError> {
        if !self.pd.ctx.windows {
            return Err(no_windows(&self.pd.ctx));
        }
        let flags = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        // SAFETY: a live region of ours, re-registered in place (same PD, memory and length).
        let rc = unsafe {
            sys::ibv_rereg_mr(
                self.mr,
                sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_ACCESS.0 as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
                flags as i32,
            )
        };
        if rc != 0 {
            return Err(os_error("ibv_rereg_mr", rc));
        }
        Ok(())
    }

    /// Binds a type 2 memory window over the whole region to `qp`, granting `access` (remote
    /// rights this region was registered with): a work request on `qp`'s send queue, so the
    /// window is in force before anything posted after it (the descriptor sent to the peer
    /// included). Only `qp`'s peer can use its key.
    pub fn bind_window(&self, qp: &super::cm::Qp, access: Access) -> Result<Mw, DriverError> {
        let ctx = &self.pd.ctx;
        if !ctx.windows {
            return Err(no_windows(ctx));
        }
        let remote = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        if !self.access.contains(access) || !remote.contains(access) {
            return Err(DriverError::Unsupported(format!(
                "a window granting {access:?} over a region registered with {:?}",
                self.access
            )));
        }
        let flags = ibv_access(access);
        // SAFETY: a live PD; rdma-sys returns None when the provider has no alloc_mw.
        let mw = unsafe { sys::ibv_alloc_mw(self.pd.pd, sys::ibv_mw_type::IBV_MW_TYPE_2) }
            .filter(|m| !m.is_null())
            .ok_or_else(|| last_os_error("ibv_alloc_mw"))?;
        // SAFETY: mw is the window just allocated; a type 2 bind names the key it will have:
        // the allocated one with its low byte (the consumer's part) moved on.
        let rkey = unsafe { sys::ibv_inc_rkey((*mw).rkey) };
        let slot = Rc::new(MwSlot { mw: Cell::new(mw) });
        if let Err(e) = qp.post_bind_mw(mw, rkey, self.mr, self.addr() as u64, self.len(), flags) {
            slot.dealloc();
            return Err(e);
        }
        let mut windows = self.windows.borrow_mut();
        windows.retain(|w| w.strong_count() > 0);
        windows.push(Rc::downgrade(&slot));
        Ok(Mw {
            slot,
            rkey: Stag(rkey),
        })
    }
}

/// `IBV_ACCESS_*` flags for these rights.
fn ibv_access(access: Access) -> u32 {
    use sys::ibv_access_flags as f;
    [
        (Access::LOCAL_WRITE, f::IBV_ACCESS_LOCAL_WRITE),
        (Access::REMOTE_WRITE, f::IBV_ACCESS_REMOTE_WRITE),
        (Access::REMOTE_READ, f::IBV_ACCESS_REMOTE_READ),
        (Access::REMOTE_ATOMIC, f::IBV_ACCESS_REMOTE_ATOMIC),
    ]
    .iter()
    .filter(|(a, _)| access.contains(*a))
    .fold(0, |flags, (_, flag)| flags | flag.0)
}

fn no_windows(ctx: &Context) -> DriverError {
    DriverError::Unsupported(format!(
        "{} binds no type 2 memory windows (IBV_DEVICE_MEM_WINDOW_TYPE_2B)",
        ctx.name
    ))
}

impl Drop for Mr {
    fn drop(&mut self) {
        for w in self.windows.borrow().iter().filter_map(Weak::upgrade) {
            w.dealloc();
        }
        // SAFETY: deregistering our own region once, with no window left bound in it.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// A bound type 2 memory window (`ibv_alloc_mw`): deallocated, which invalidates its key, when
/// dropped or when its region is, whichever comes first.
pub struct Mw {
    slot: Rc<MwSlot>,
    rkey: Stag,
}

impl Mw {
    /// The key its one peer uses.
    pub fn rkey(&self) -> Stag {
        self.rkey
    }

    /// False once its region is gone.
    pub fn is_live(&self) -> bool {
        !self.slot.mw.get().is_null()
    }
}

impl Drop for Mw {
    fn drop(&mut self) {
        self.slot.dealloc();
    }
}

/// The window, shared by its handle and its region's list; null once deallocated.
struct MwSlot {
    mw: Cell<*mut sys::ibv_mw>,
}

impl MwSlot {
    fn dealloc(&self) {
        let mw = self.mw.replace(std::ptr::null_mut());
        if !mw.is_null() {
            // SAFETY: a window we allocated, deallocated once (the pointer is taken out
            // first); deallocating invalidates it.
            unsafe { sys::ibv_dealloc_mw(mw) };
        }
    }
}

/// A completion queue with its own completion channel. The core's verbs poller moves work
/// completions from the device into `queue`, which is what applications await.
pub struct Cq {
    ctx: Rc<Context>,
    pub(crate) cq: *mut sys::ibv_cq,
    channel: *mut sys::ibv_comp_channel,
    queue: Queue,
    /// `ibv_req_notify_cq` was called and no event has been consumed since.
    armed: Cell<bool>,
    /// A task waits on the channel's fd.
    waiter: RefCell<Option<JoinHandle<()>>>,
}

impl Cq {
    /// Creates one of `depth` entries and hands it to this core's poller.
    pub fn new(ctx: &Rc<Context>, depth: usize) -> Result<Rc<Cq>, DriverError> {
        // SAFETY: a live context; the channel and queue are destroyed in Drop.
        let channel = unsafe { sys::ibv_create_comp_channel(ctx.ctx) };
        if channel.is_null() {
            return Err(last_os_error("ibv_create_comp_channel"));
        }
        // SAFETY: the channel was just created.
        if let Err(e) = set_nonblocking(unsafe { (*channel).fd }) {
            // SAFETY: destroying what we made.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        // SAFETY: as above.
        let cq =
            unsafe { sys::ibv_create_cq(ctx.ctx, depth as i32, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = last_os_error("ibv_create_cq");
            // SAFETY: destroying what we made.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(e);
        }
        let cq = Rc::new(Cq {
            ctx: ctx.clone(),
            cq,
            channel,
            queue: Queue::new(depth),
            armed: Cell::new(false),
            waiter: RefCell::new(None),
        });
        register(&cq);
        Ok(cq)
    }

    /// What applications poll and await.
    pub fn queue(&self) -> &Queue {
        &self.queue
    }

    /// Moves what the device has completed into the queue. The number moved.
    fn drain(&self) -> usize {
        let mut wcs: [std::mem::MaybeUninit<sys::ibv_wc>; 16] =
            [const { std::mem::MaybeUninit::uninit() }; 16];
        let mut total = 0;
        loop {
            // SAFETY: wcs has room for 16 entries; the provider fills the first n.
            let n = unsafe { sys::ibv_poll_cq(self.cq, 16, wcs.as_mut_ptr().cast()) };
            if n <= 0 {
                return total;
            }
            for wc in &wcs[..n as usize] {
                // SAFETY: the first n entries were written by ibv_poll_cq.
                self.queue.push(convert_wc(unsafe { wc.assume_init_ref() }));
            }
            total += n as usize;
            if n < 16 {
                return total;
            }
        }
    }

    /// Consumes and acknowledges the channel's pending events (the fd is non-blocking).
    fn take_events(&self) {
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: a live channel; returns -1 (EAGAIN) when nothing is pending.
            if unsafe { sys::ibv_get_cq_event(self.channel, &mut cq, &mut ctx) } != 0 {
                return;
            }
            // SAFETY: acknowledging the event we just took, on the queue it named.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
            self.armed.set(false);
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        if let Some(w) = self.waiter.get_mut().take() {
            w.cancel();
        }
        self.take_events();
        // SAFETY: queue pairs hold an Rc to their CQs, so none uses this one; every event was
        // acknowledged above, which ibv_destroy_cq requires.
        unsafe {
            sys::ibv_destroy_cq(self.cq);
            sys::ibv_destroy_comp_channel(self.channel);
        }
        let _ = &self.ctx;
    }
}

fn convert_wc(wc: &sys::ibv_wc) -> WorkCompletion {
    use sys::ibv_wc_opcode as op;
    use sys::ibv_wc_status as st;
    let status = match wc.status {
        st::IBV_WC_SUCCESS => WcStatus::Success,
        st::IBV_WC_LOC_LEN_ERR => WcStatus::LocLenErr,
        st::IBV_WC_LOC_PROT_ERR => WcStatus::LocProtErr,
        st::IBV_WC_REM_ACCESS_ERR => WcStatus::RemAccessErr,
        st::IBV_WC_REM_INV_REQ_ERR => WcStatus::RemInvReqErr,
        st::IBV_WC_REM_OP_ERR => WcStatus::RemOpErr,
        st::IBV_WC_WR_FLUSH_ERR => WcStatus::WrFlushErr,
        st::IBV_WC_RETRY_EXC_ERR | st::IBV_WC_RNR_RETRY_EXC_ERR => WcStatus::RetryExcErr,
        _ => WcStatus::GeneralErr,
    };
    let opcode = match wc.opcode {
        op::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
        op::IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
        op::IBV_WC_COMP_SWAP => WcOpcode::CompSwap,
        op::IBV_WC_FETCH_ADD => WcOpcode::FetchAdd,
        op::IBV_WC_LOCAL_INV => WcOpcode::LocalInv,
        op::IBV_WC_RECV => WcOpcode::Recv,
        op::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
        _ => WcOpcode::Send,
    };
    let flags = wc.wc_flags;
    // SAFETY: the union's meaning is given by wc_flags, checked before each read.
    let (imm, inv) = unsafe {
        (
            (flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
                .then(|| u32::from_be(wc.imm_data_invalidated_rkey_union.imm_data)),
            (flags & sys::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0)
                .then_some(wc.imm_data_invalidated_rkey_union.invalidated_rkey),
        )
    };
    WorkCompletion {
        wr_id: wc.wr_id,
        status,
        opcode,
        byte_len: wc.byte_len,
        imm,
        invalidated: inv,
        solicited: false,
        qp_num: wc.qp_num,
    }
}

// ---- the per-core poller ----------------------------------------------------------------

struct CoreCqs {
    core: Cell<u64>,
    cqs: RefCell<Vec<Weak<Cq>>>,
    registered: Cell<bool>,
}

thread_local! {
    static CQS: CoreCqs = const {
        CoreCqs { core: Cell::new(0), cqs: RefCell::new(Vec::new()), registered: Cell::new(false) }
    };
}

fn register(cq: &Rc<Cq>) {
    CQS.with(|c| {
        let token = barewire_engine::core_token();
        if c.core.replace(token) != token {
            c.cqs.borrow_mut().clear();
            c.registered.set(false);
        }
        c.cqs.borrow_mut().push(Rc::downgrade(cq));
        if !c.registered.replace(true) {
            barewire_engine::register_poller(Box::new(VerbsPoller { live: Vec::new() }));
        }
    });
}

/// Polls this core's verbs completion queues while the core is busy; arms them with
/// `ibv_req_notify_cq` and waits on their completion channels (through the reactor) when it
/// is about to sleep.
struct VerbsPoller {
    /// The live queues of the current pass (kept to reuse its allocation).
    live: Vec<Rc<Cq>>,
}

impl VerbsPoller {
    fn each(&mut self, mut f: impl FnMut(&Rc<Cq>)) {
        CQS.with(|c| {
            let mut cqs = c.cqs.borrow_mut();
            cqs.retain(|w| w.strong_count() > 0);
            self.live.extend(cqs.iter().filter_map(Weak::upgrade));
        });
        for cq in self.live.drain(..) {
            f(&cq);
        }
    }
}

impl Poller for VerbsPoller {
    fn poll(&mut self) -> bool {
        let mut moved = 0;
        self.each(|cq| moved += cq.drain());
        moved > 0
    }

    fn pure_poll(&mut self) -> bool {
        false
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        let mut ready = true;
        self.each(|cq| {
            if !cq.armed.get() {
                // SAFETY: a live CQ; 0 asks for an event on any next completion.
                if unsafe { sys::ibv_req_notify_cq(cq.cq, 0) } == 0 {
                    cq.armed.set(true);
                }
                // Completions that landed before the arm raise no event: take them now.
                if cq.drain() > 0 {
                    ready = false;
                }
            }
            let idle = cq
                .waiter
                .borrow()
                .as_ref()
                .is_none_or(JoinHandle::is_finished);
            if idle {
                let weak = Rc::downgrade(cq);
                // SAFETY: the channel lives as long as the CQ, which cancels this task first.
                let fd = unsafe { (*cq.channel).fd };
                *cq.waiter.borrow_mut() = Some(spawn_local(async move {
                    let _ = poll_readable(fd).await;
                    if let Some(cq) = weak.upgrade() {
                        cq.take_events();
                        cq.drain();
                    }
                }));
                ready = false; // let the task submit its poll before the core sleeps
            }
        });
        ready
    }
}
