//! The verbs backend's objects: a device context, protection domains, memory regions,
//! completion queues polled by the engine, and RC queue pairs connected through librdmacm.
//!
//! Ownership follows rdma-core's teardown order: a memory region holds its protection domain,
//! a queue pair holds its protection domain and both completion queues, and everything holds the
//! context, so `Drop` always destroys children before parents.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::{Rc, Weak};
use std::time::Duration;

use barewire_engine::{poll_readable, spawn_local, JoinHandle, Poller};
use barewire_soft_rdma::stream::{RecvWr, SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{
    Access, CompletionQueue as Queue, QpState, Stag, WcOpcode, WcStatus, WorkCompletion,
};
use rdma_sys as sys;

use crate::transport::DriverError;

/// Most SGEs one work request may carry on this backend.
pub const MAX_SGE: usize = 16;

fn last_os_error(what: &str) -> DriverError {
    DriverError::Verbs {
        call: what.to_string(),
        error: io::Error::last_os_error().to_string(),
    }
}

fn os_error(what: &str, rc: i32) -> DriverError {
    DriverError::Verbs {
        call: what.to_string(),
        error: io::Error::from_raw_os_error(rc).to_string(),
    }
}

fn set_nonblocking(fd: RawFd) -> Result<(), DriverError> {
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
    ctx: *mut sys::ibv_context,
    name: String,
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
                return Ok(Rc::new(Context {
                    list,
                    ctx,
                    name: dev_name,
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

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
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
    ctx: Rc<Context>,
    pd: *mut sys::ibv_pd,
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
        let mut flags = 0u32;
        for (a, f) in [
            (
                Access::LOCAL_WRITE,
                sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            ),
            (
                Access::REMOTE_WRITE,
                sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
            ),
            (
                Access::REMOTE_READ,
                sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ,
            ),
            (
                Access::REMOTE_ATOMIC,
                sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC,
            ),
        ] {
            if access.contains(a) {
                flags |= f.0;
            }
        }
        // SAFETY: the caller vouches for the memory; the PD is live.
        let mr = unsafe { sys::ibv_reg_mr(self.pd, addr.cast(), len, flags as i32) };
        if mr.is_null() {
            return Err(last_os_error("ibv_reg_mr"));
        }
        Ok(Mr {
            _pd: self.clone(),
            mr,
            access,
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

/// A memory region (`ibv_reg_mr`); deregistered on drop.
pub struct Mr {
    _pd: Rc<Pd>,
    mr: *mut sys::ibv_mr,
    access: Access,
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

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: deregistering our own region once.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}

/// A completion queue with its own completion channel. The core's verbs poller moves work
/// completions from the device into `queue`, which is what applications await.
pub struct Cq {
    ctx: Rc<Context>,
    cq: *mut sys::ibv_cq,
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
            barewire_engine::register_poller(Box::new(VerbsPoller));
        }
    });
}

/// Polls this core's verbs completion queues while the core is busy; arms them with
/// `ibv_req_notify_cq` and waits on their completion channels (through the reactor) when it
/// is about to sleep.
struct VerbsPoller;

impl VerbsPoller {
    fn each(mut f: impl FnMut(&Rc<Cq>)) {
        CQS.with(|c| {
            let live: Vec<Rc<Cq>> = {
                let mut cqs = c.cqs.borrow_mut();
                cqs.retain(|w| w.strong_count() > 0);
                cqs.iter().filter_map(Weak::upgrade).collect()
            };
            for cq in &live {
                f(cq);
            }
        })
    }
}

impl Poller for VerbsPoller {
    fn poll(&mut self) -> bool {
        let mut moved = 0;
        VerbsPoller::each(|cq| moved += cq.drain());
        moved > 0
    }

    fn pure_poll(&mut self) -> bool {
        false
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        let mut ready = true;
        VerbsPoller::each(|cq| {
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
                .map_or(true, JoinHandle::is_finished);
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

// ---- connections and queue pairs ----------------------------------------------------------

/// Connection settings the verbs backend uses.
#[derive(Debug, Clone)]
pub struct CmSettings {
    /// Private data for the peer (at most 56 bytes on InfiniBand/RoCE, 196 on iWARP... as the
    /// device allows; rdma_cm refuses more).
    pub private_data: Vec<u8>,
    /// Address and route resolution timeout.
    pub timeout: Duration,
    /// Send and receive queue depth.
    pub depth: u32,
    /// Inline data the send queue should accept.
    pub max_inline: u32,
    /// Outstanding RDMA Reads and atomics, as responder and as initiator.
    pub ird: u8,
    /// See `ird`.
    pub ord: u8,
    /// IP type of service for RoCE v2 (DSCP << 2), set on the connection identifier.
    pub tos: Option<u8>,
}

/// `RDMA_OPTION_ID` and `RDMA_OPTION_ID_TOS` from `<rdma/rdma_cma.h>` (anonymous enums that
/// bindgen skips).
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_TOS: i32 = 0;

fn set_tos(id: *mut sys::rdma_cm_id, tos: Option<u8>) -> Result<(), DriverError> {
    let Some(mut tos) = tos else { return Ok(()) };
    // SAFETY: a live id; the option is one byte, passed by pointer.
    let rc = unsafe {
        sys::rdma_set_option(
            id,
            RDMA_OPTION_ID,
            RDMA_OPTION_ID_TOS,
            (&mut tos as *mut u8).cast(),
            1,
        )
    };
    if rc != 0 {
        return Err(last_os_error("rdma_set_option(TOS)"));
    }
    Ok(())
}

/// A connected RC queue pair.
pub struct Qp {
    id: *mut sys::rdma_cm_id,
    channel: *mut sys::rdma_event_channel,
    qp: *mut sys::ibv_qp,
    _pd: Rc<Pd>,
    _cqs: (Rc<Cq>, Rc<Cq>),
    max_inline: u32,
    monitor: RefCell<Option<JoinHandle<()>>>,
    disconnected: Cell<bool>,
}

struct Event {
    kind: u32,
    status: i32,
    id: *mut sys::rdma_cm_id,
    private_data: Vec<u8>,
}

fn event_name(kind: u32) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { CStr::from_ptr(sys::rdma_event_str(kind)) }
        .to_string_lossy()
        .into_owned()
}

/// The next event on a (non-blocking) channel, copied out and acknowledged.
async fn next_event(ch: *mut sys::rdma_event_channel) -> Result<Event, DriverError> {
    loop {
        let mut ev = std::ptr::null_mut();
        // SAFETY: a live channel.
        if unsafe { sys::rdma_get_cm_event(ch, &mut ev) } == 0 {
            // SAFETY: a valid event until acknowledged; the private data is copied first.
            let out = unsafe {
                let e = &*ev;
                let conn = &e.param.conn;
                let pd = if conn.private_data.is_null() {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(
                        conn.private_data as *const u8,
                        conn.private_data_len as usize,
                    )
                    .to_vec()
                };
                Event {
                    kind: e.event,
                    status: e.status,
                    id: e.id,
                    private_data: pd,
                }
            };
            // SAFETY: acknowledging the event we took.
            unsafe { sys::rdma_ack_cm_event(ev) };
            return Ok(out);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock {
            return Err(DriverError::Verbs {
                call: "rdma_get_cm_event".into(),
                error: e.to_string(),
            });
        }
        // SAFETY: the channel outlives this wait (its owner awaits us or cancels us first).
        poll_readable(unsafe { (*ch).fd })
            .await
            .map_err(|e| DriverError::Verbs {
                call: "poll(rdma_cm channel)".into(),
                error: e.to_string(),
            })?;
    }
}

async fn expect(ch: *mut sys::rdma_event_channel, want: u32) -> Result<Event, DriverError> {
    let ev = next_event(ch).await?;
    if ev.kind == want {
        return Ok(ev);
    }
    if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED {
        return Err(DriverError::Rejected {
            private_data: ev.private_data,
        });
    }
    Err(DriverError::Verbs {
        call: format!("waiting for {}", event_name(want)),
        error: format!("got {} (status {})", event_name(ev.kind), ev.status),
    })
}

fn new_channel() -> Result<*mut sys::rdma_event_channel, DriverError> {
    // SAFETY: creating a channel; destroyed by its owner.
    let ch = unsafe { sys::rdma_create_event_channel() };
    if ch.is_null() {
        return Err(last_os_error("rdma_create_event_channel"));
    }
    // SAFETY: a fresh channel.
    if let Err(e) = set_nonblocking(unsafe { (*ch).fd }) {
        // SAFETY: destroying what we made.
        unsafe { sys::rdma_destroy_event_channel(ch) };
        return Err(e);
    }
    Ok(ch)
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn conn_param(s: &CmSettings) -> sys::rdma_conn_param {
    sys::rdma_conn_param {
        private_data: s.private_data.as_ptr().cast(),
        private_data_len: s.private_data.len().min(255) as u8,
        responder_resources: s.ird,
        initiator_depth: s.ord,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// Creates the RC queue pair on `id` (which must sit on the PD's device).
fn create_qp(
    id: *mut sys::rdma_cm_id,
    pd: &Rc<Pd>,
    scq: &Rc<Cq>,
    rcq: &Rc<Cq>,
    s: &CmSettings,
) -> Result<u32, DriverError> {
    // SAFETY: id is a live identifier whose device is now known.
    let verbs = unsafe { (*id).verbs };
    if verbs != pd.ctx.ctx {
        let other = if verbs.is_null() {
            "no device".to_string()
        } else {
            // SAFETY: naming the device the route went through (a live context).
            unsafe { CStr::from_ptr(sys::ibv_get_device_name((*verbs).device)) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(DriverError::Verbs {
            call: "rdma_create_qp".into(),
            error: format!(
                "the address is reached through RDMA device {other}, not {}; set BAREWIRE_DEVICE={other}",
                pd.ctx.name
            ),
        });
    }
    // SAFETY: all-zero is a valid ibv_qp_init_attr before we fill it.
    let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
    attr.send_cq = scq.cq;
    attr.recv_cq = rcq.cq;
    attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
    attr.sq_sig_all = 0;
    attr.cap = sys::ibv_qp_cap {
        max_send_wr: s.depth,
        max_recv_wr: s.depth,
        max_send_sge: MAX_SGE as u32,
        max_recv_sge: MAX_SGE as u32,
        max_inline_data: s.max_inline,
    };
    // SAFETY: a live id, PD and CQs on the same device.
    let rc = unsafe { sys::rdma_create_qp(id, pd.pd, &mut attr) };
    if rc != 0 {
        return Err(last_os_error("rdma_create_qp"));
    }
    Ok(attr.cap.max_inline_data)
}

impl Qp {
    fn finish(
        id: *mut sys::rdma_cm_id,
        channel: *mut sys::rdma_event_channel,
        pd: &Rc<Pd>,
        scq: &Rc<Cq>,
        rcq: &Rc<Cq>,
        max_inline: u32,
    ) -> Rc<Qp> {
        let qp = Rc::new(Qp {
            id,
            channel,
            // SAFETY: rdma_create_qp succeeded on this id.
            qp: unsafe { (*id).qp },
            _pd: pd.clone(),
            _cqs: (scq.clone(), rcq.clone()),
            max_inline,
            monitor: RefCell::new(None),
            disconnected: Cell::new(false),
        });
        // Watch the connection: when the peer disconnects (or the connection fails), move the
        // queue pair to ERROR so everything outstanding flushes.
        let weak = Rc::downgrade(&qp);
        *qp.monitor.borrow_mut() = Some(spawn_local(async move {
            loop {
                let Ok(ev) = next_event(channel).await else {
                    return;
                };
                let Some(qp) = weak.upgrade() else { return };
                use sys::rdma_cm_event_type as t;
                if matches!(
                    ev.kind,
                    t::RDMA_CM_EVENT_DISCONNECTED
                        | t::RDMA_CM_EVENT_DEVICE_REMOVAL
                        | t::RDMA_CM_EVENT_TIMEWAIT_EXIT
                ) {
                    qp.disconnect();
                    if ev.kind != t::RDMA_CM_EVENT_DISCONNECTED {
                        return;
                    }
                }
            }
        }));
        qp
    }

    /// Connects to `addr`.
    pub async fn connect(
        addr: SocketAddr,
        pd: &Rc<Pd>,
        scq: &Rc<Cq>,
        rcq: &Rc<Cq>,
        s: &CmSettings,
    ) -> Result<(Rc<Qp>, Vec<u8>), DriverError> {
        let ch = new_channel()?;
        let mut id = std::ptr::null_mut();
        // SAFETY: a live channel; the id is destroyed on every path below.
        let rc = unsafe {
            sys::rdma_create_id(
                ch,
                &mut id,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            let e = last_os_error("rdma_create_id");
            // SAFETY: destroying what we made.
            unsafe { sys::rdma_destroy_event_channel(ch) };
            return Err(e);
        }
        let cleanup = |id: *mut sys::rdma_cm_id, ch: *mut sys::rdma_event_channel| {
            // SAFETY: destroying what we made, QP first when there is one.
            unsafe {
                if !(*id).qp.is_null() {
                    sys::rdma_destroy_qp(id);
                }
                sys::rdma_destroy_id(id);
                sys::rdma_destroy_event_channel(ch);
            }
        };
        let result = async {
            set_tos(id, s.tos)?;
            let (mut ss, _) = sockaddr(addr);
            let ms = s.timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: a live id and a valid address.
            let rc = unsafe {
                sys::rdma_resolve_addr(
                    id,
                    std::ptr::null_mut(),
                    (&mut ss as *mut libc::sockaddr_storage).cast(),
                    ms,
                )
            };
            if rc != 0 {
                return Err(last_os_error("rdma_resolve_addr"));
            }
            expect(ch, sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED).await?;
            // SAFETY: a live id with a resolved address.
            if unsafe { sys::rdma_resolve_route(id, ms) } != 0 {
                return Err(last_os_error("rdma_resolve_route"));
            }
            expect(ch, sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED).await?;
            let inline = create_qp(id, pd, scq, rcq, s)?;
            let mut param = conn_param(s);
            // SAFETY: a live id with a QP; param points at our private data, alive here.
            if unsafe { sys::rdma_connect(id, &mut param) } != 0 {
                return Err(last_os_error("rdma_connect"));
            }
            let ev = expect(ch, sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED).await?;
            Ok((inline, ev.private_data))
        }
        .await;
        match result {
            Ok((inline, data)) => Ok((Qp::finish(id, ch, pd, scq, rcq, inline), data)),
            Err(e) => {
                cleanup(id, ch);
                Err(e)
            }
        }
    }

    /// The queue pair number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: a live QP.
        unsafe { (*self.qp).qp_num }
    }

    /// Its state (`ibv_query_qp`).
    pub fn state(&self) -> QpState {
        // SAFETY: zeroed attribute structs are valid outputs for ibv_query_qp.
        let (rc, state) = unsafe {
            let mut attr: sys::ibv_qp_attr = std::mem::zeroed();
            let mut init: sys::ibv_qp_init_attr = std::mem::zeroed();
            let rc = sys::ibv_query_qp(
                self.qp,
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
                &mut init,
            );
            (rc, attr.qp_state)
        };
        use sys::ibv_qp_state as s;
        match (rc, state) {
            (0, s::IBV_QPS_RESET) => QpState::Reset,
            (0, s::IBV_QPS_INIT) => QpState::Init,
            (0, s::IBV_QPS_RTR) => QpState::Rtr,
            (0, s::IBV_QPS_RTS) => QpState::Rts,
            _ => QpState::Error,
        }
    }

    /// Posts a send work request.
    pub fn post_send(&self, wr: &SendWr) -> Result<(), DriverError> {
        use sys::ibv_wr_opcode as op;
        let mut sges = [sys::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        let n = fill_sges(&mut sges, &wr.sges)?;
        // SAFETY: all-zero is a valid ibv_send_wr before we fill it.
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.wr_id = wr.wr_id;
        w.sg_list = sges.as_mut_ptr();
        w.num_sge = n as i32;
        let mut flags = 0u32;
        if wr.signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if wr.fence {
            flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        }
        let rdma = |remote_addr: u64, rkey: Stag| sys::wr_t {
            rdma: sys::rdma_t {
                remote_addr,
                rkey: rkey.0,
            },
        };
        let payload: u32 = wr.sges.iter().map(|s| s.len).sum();
        let mut may_inline = false;
        match wr.op {
            SendOp::Send {
                solicited,
                invalidate,
            } => {
                may_inline = true;
                if solicited {
                    flags |= sys::ibv_send_flags::IBV_SEND_SOLICITED.0;
                }
                match invalidate {
                    Some(stag) => {
                        w.opcode = op::IBV_WR_SEND_WITH_INV;
                        w.imm_data_invalidated_rkey_union.invalidated_rkey = stag.0;
                    }
                    None => w.opcode = op::IBV_WR_SEND,
                }
            }
            SendOp::Write { remote_addr, rkey } => {
                may_inline = true;
                w.opcode = op::IBV_WR_RDMA_WRITE;
                w.wr = rdma(remote_addr, rkey);
            }
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                may_inline = true;
                w.opcode = op::IBV_WR_RDMA_WRITE_WITH_IMM;
                w.wr = rdma(remote_addr, rkey);
                w.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
            SendOp::Read { remote_addr, rkey } => {
                w.opcode = op::IBV_WR_RDMA_READ;
                w.wr = rdma(remote_addr, rkey);
            }
            SendOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                w.opcode = op::IBV_WR_ATOMIC_FETCH_AND_ADD;
                w.wr = sys::wr_t {
                    atomic: sys::atomic_t {
                        remote_addr,
                        compare_add: add,
                        swap: 0,
                        rkey: rkey.0,
                    },
                };
            }
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                w.opcode = op::IBV_WR_ATOMIC_CMP_AND_SWP;
                w.wr = sys::wr_t {
                    atomic: sys::atomic_t {
                        remote_addr,
                        compare_add: compare,
                        swap,
                        rkey: rkey.0,
                    },
                };
            }
            SendOp::LocalInvalidate { stag } => {
                w.opcode = op::IBV_WR_LOCAL_INV;
                w.imm_data_invalidated_rkey_union.invalidated_rkey = stag.0;
            }
            SendOp::Swap { .. } => {
                return Err(DriverError::Unsupported(
                    "Swap: rdma-core has no plain atomic swap work request (use CmpSwap)".into(),
                ))
            }
        }
        if may_inline && payload > 0 && payload <= self.max_inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        w.send_flags = flags;
        let mut bad = std::ptr::null_mut();
        // SAFETY: w and its SGE array live across the call; rdma-core copies what it keeps
        // (inline data included), and the SGEs point at registered memory the caller keeps
        // alive until the completion.
        let rc = unsafe { sys::ibv_post_send(self.qp, &mut w, &mut bad) };
        if rc != 0 {
            return Err(os_error("ibv_post_send", rc));
        }
        Ok(())
    }

    /// Posts a receive.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<(), DriverError> {
        let mut sges = [sys::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SGE];
        let n = fill_sges(&mut sges, &wr.sges)?;
        let mut w = sys::ibv_recv_wr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: sges.as_mut_ptr(),
            num_sge: n as i32,
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: as post_send.
        let rc = unsafe { sys::ibv_post_recv(self.qp, &mut w, &mut bad) };
        if rc != 0 {
            return Err(os_error("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// Disconnects: the queue pair goes to ERROR and outstanding work flushes.
    pub fn disconnect(&self) {
        if !self.disconnected.replace(true) {
            // SAFETY: a live, connected id.
            unsafe { sys::rdma_disconnect(self.id) };
        }
    }
}

fn fill_sges(out: &mut [sys::ibv_sge; MAX_SGE], sges: &[Sge]) -> Result<usize, DriverError> {
    if sges.len() > MAX_SGE {
        return Err(DriverError::Unsupported(format!(
            "{} SGEs in one work request; the verbs backend takes at most {MAX_SGE}",
            sges.len()
        )));
    }
    for (o, s) in out.iter_mut().zip(sges) {
        *o = sys::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey.0,
        };
    }
    Ok(sges.len())
}

impl Drop for Qp {
    fn drop(&mut self) {
        if let Some(m) = self.monitor.get_mut().take() {
            m.cancel();
        }
        self.disconnect();
        // SAFETY: tearing down our own QP, id and channel, in that order; every event was
        // acknowledged as it was read.
        unsafe {
            sys::rdma_destroy_qp(self.id);
            sys::rdma_destroy_id(self.id);
            sys::rdma_destroy_event_channel(self.channel);
        }
    }
}

/// Listens for RC connections through librdmacm.
pub struct Listener {
    id: *mut sys::rdma_cm_id,
    channel: *mut sys::rdma_event_channel,
    settings: CmSettings,
}

impl Listener {
    /// Binds and listens on `addr`.
    pub fn bind(addr: SocketAddr, settings: CmSettings) -> Result<Listener, DriverError> {
        let ch = new_channel()?;
        let mut id = std::ptr::null_mut();
        // SAFETY: a live channel.
        let rc = unsafe {
            sys::rdma_create_id(
                ch,
                &mut id,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            let e = last_os_error("rdma_create_id");
            // SAFETY: destroying what we made.
            unsafe { sys::rdma_destroy_event_channel(ch) };
            return Err(e);
        }
        let l = Listener {
            id,
            channel: ch,
            settings,
        };
        set_tos(id, l.settings.tos)?;
        let (mut ss, _) = sockaddr(addr);
        // SAFETY: a live id and a valid address.
        if unsafe { sys::rdma_bind_addr(id, (&mut ss as *mut libc::sockaddr_storage).cast()) } != 0
        {
            return Err(last_os_error("rdma_bind_addr"));
        }
        // SAFETY: a bound id.
        if unsafe { sys::rdma_listen(id, 64) } != 0 {
            return Err(last_os_error("rdma_listen"));
        }
        Ok(l)
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        // SAFETY: a bound id; the port is in network order.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.id) })
    }

    /// Accepts one connection: its queue pair and the peer's private data.
    pub async fn accept(
        &self,
        pd: &Rc<Pd>,
        scq: &Rc<Cq>,
        rcq: &Rc<Cq>,
    ) -> Result<(Rc<Qp>, Vec<u8>), DriverError> {
        let req = loop {
            let ev = next_event(self.channel).await?;
            if ev.kind == sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                break ev;
            }
        };
        let child = req.id;
        let ch = match new_channel() {
            Ok(ch) => ch,
            Err(e) => {
                // SAFETY: refusing and destroying the request's id.
                unsafe {
                    sys::rdma_reject(child, std::ptr::null(), 0);
                    sys::rdma_destroy_id(child);
                }
                return Err(e);
            }
        };
        let result = async {
            // SAFETY: moving the new id's events to its own channel.
            if unsafe { sys::rdma_migrate_id(child, ch) } != 0 {
                return Err(last_os_error("rdma_migrate_id"));
            }
            let inline = create_qp(child, pd, scq, rcq, &self.settings)?;
            let mut param = conn_param(&self.settings);
            // SAFETY: a live id with a QP; param points at our private data.
            if unsafe { sys::rdma_accept(child, &mut param) } != 0 {
                return Err(last_os_error("rdma_accept"));
            }
            expect(ch, sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED).await?;
            Ok(inline)
        }
        .await;
        match result {
            Ok(inline) => Ok((
                Qp::finish(child, ch, pd, scq, rcq, inline),
                req.private_data,
            )),
            Err(e) => {
                // SAFETY: destroying the half-made connection.
                unsafe {
                    if !(*child).qp.is_null() {
                        sys::rdma_destroy_qp(child);
                    }
                    sys::rdma_destroy_id(child);
                    sys::rdma_destroy_event_channel(ch);
                }
                Err(e)
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // SAFETY: our own id and channel.
        unsafe {
            sys::rdma_destroy_id(self.id);
            sys::rdma_destroy_event_channel(self.channel);
        }
    }
}
