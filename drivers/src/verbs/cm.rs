//! The verbs backend's connections: RC queue pairs set up through librdmacm on non-blocking
//! event channels (address and route resolution, private data, a watcher that moves the queue
//! pair to ERROR when the peer disconnects), work request posting, and the listener.

use std::cell::{Cell, RefCell};
use std::ffi::CStr;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use barewire_engine::{poll_readable, spawn_local, JoinHandle};
use barewire_rdma_types::{QpState, RecvWr, SendOp, SendWr, Sge, Stag};
use rdma_sys as sys;

use super::rc::{last_os_error, os_error, set_nonblocking, Cq, Pd, MAX_SGE};
use crate::transport::DriverError;

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
    /// Send requests the queue holds, as the device granted (at least what was asked).
    max_send_wr: u32,
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

/// A TCP-port-space connection identifier on its own non-blocking event channel; the caller
/// destroys both.
fn new_id() -> Result<(*mut sys::rdma_event_channel, *mut sys::rdma_cm_id), DriverError> {
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
    Ok((ch, id))
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

/// Creates the RC queue pair on `id` (which must sit on the PD's device); returns what the
/// device granted (its queue depths and inline size, which may exceed what was asked).
fn create_qp(
    id: *mut sys::rdma_cm_id,
    pd: &Rc<Pd>,
    scq: &Rc<Cq>,
    rcq: &Rc<Cq>,
    s: &CmSettings,
) -> Result<sys::ibv_qp_cap, DriverError> {
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
    Ok(attr.cap)
}

impl Qp {
    fn finish(
        id: *mut sys::rdma_cm_id,
        channel: *mut sys::rdma_event_channel,
        pd: &Rc<Pd>,
        scq: &Rc<Cq>,
        rcq: &Rc<Cq>,
        cap: sys::ibv_qp_cap,
    ) -> Rc<Qp> {
        let qp = Rc::new(Qp {
            id,
            channel,
            // SAFETY: rdma_create_qp succeeded on this id.
            qp: unsafe { (*id).qp },
            _pd: pd.clone(),
            _cqs: (scq.clone(), rcq.clone()),
            max_inline: cap.max_inline_data,
            max_send_wr: cap.max_send_wr,
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
        recvs: &[RecvWr],
    ) -> Result<(Rc<Qp>, Vec<u8>), DriverError> {
        let (ch, id) = new_id()?;
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
            let cap = create_qp(id, pd, scq, rcq, s)?;
            post_initial(id, recvs)?;
            let mut param = conn_param(s);
            // SAFETY: a live id with a QP; param points at our private data, alive here.
            if unsafe { sys::rdma_connect(id, &mut param) } != 0 {
                return Err(last_os_error("rdma_connect"));
            }
            let ev = expect(ch, sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED).await?;
            Ok((cap, ev.private_data))
        }
        .await;
        match result {
            Ok((cap, data)) => Ok((Qp::finish(id, ch, pd, scq, rcq, cap), data)),
            Err(e) => {
                cleanup(id, ch);
                Err(e)
            }
        }
    }

    /// How many send requests its queue holds (unsignaled ones until a later signaled one
    /// completes).
    pub fn send_queue_depth(&self) -> usize {
        self.max_send_wr as usize
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

    /// Posts an unsignaled bind of the type 2 window `mw` (to take the key `rkey`) over `len`
    /// bytes at `addr` of the region `mr`, granting `flags` (`IBV_ACCESS_REMOTE_*`). A bind
    /// that fails moves the queue pair to the error state, which every later operation shows.
    pub(crate) fn post_bind_mw(
        &self,
        mw: *mut sys::ibv_mw,
        rkey: u32,
        mr: *mut sys::ibv_mr,
        addr: u64,
        len: usize,
        flags: u32,
    ) -> Result<(), DriverError> {
        // SAFETY: all-zero is a valid ibv_send_wr before we fill it.
        let mut w: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        w.opcode = sys::ibv_wr_opcode::IBV_WR_BIND_MW;
        w.bind_mw_tso_union.bind_mw = sys::bind_mw_t {
            mw,
            rkey,
            bind_info: sys::ibv_mw_bind_info {
                mr,
                addr,
                length: len as u64,
                mw_access_flags: flags,
            },
        };
        let mut bad = std::ptr::null_mut();
        // SAFETY: w lives across the call and names a live window and region of this queue
        // pair's protection domain (the caller's).
        let rc = unsafe { sys::ibv_post_send(self.qp, &mut w, &mut bad) };
        if rc != 0 {
            return Err(os_error("ibv_post_send (bind window)", rc));
        }
        Ok(())
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
        let atomic = |remote_addr: u64, rkey: Stag, compare_add: u64, swap: u64| sys::wr_t {
            atomic: sys::atomic_t {
                remote_addr,
                compare_add,
                swap,
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
                w.wr = atomic(remote_addr, rkey, add, 0);
            }
            SendOp::CmpSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                w.opcode = op::IBV_WR_ATOMIC_CMP_AND_SWP;
                w.wr = atomic(remote_addr, rkey, compare, swap);
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
        post_recv_on(self.qp, wr)
    }

    /// Disconnects: the queue pair goes to ERROR and outstanding work flushes.
    pub fn disconnect(&self) {
        if !self.disconnected.replace(true) {
            // SAFETY: a live, connected id.
            unsafe { sys::rdma_disconnect(self.id) };
        }
    }
}

/// Posts receives on a fresh queue pair before the connection is accepted or completed, so a
/// peer that sends the moment it is connected finds them (an iWARP device, unlike InfiniBand's
/// RNR retry, fails the connection on a Send with no receive posted).
fn post_initial(id: *mut sys::rdma_cm_id, recvs: &[RecvWr]) -> Result<(), DriverError> {
    // SAFETY: the id has a QP (created just before).
    let qp = unsafe { (*id).qp };
    recvs.iter().try_for_each(|wr| post_recv_on(qp, wr))
}

/// `ibv_post_recv` of one work request on `qp` (a live queue pair).
fn post_recv_on(qp: *mut sys::ibv_qp, wr: &RecvWr) -> Result<(), DriverError> {
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
    // SAFETY: a live QP; w and its SGEs live across the call, and the SGEs point at registered
    // memory the caller keeps until the completion.
    let rc = unsafe { sys::ibv_post_recv(qp, &mut w, &mut bad) };
    if rc != 0 {
        return Err(os_error("ibv_post_recv", rc));
    }
    Ok(())
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
        let (ch, id) = new_id()?;
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
        recvs: &[RecvWr],
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
            let cap = create_qp(child, pd, scq, rcq, &self.settings)?;
            post_initial(child, recvs)?;
            let mut param = conn_param(&self.settings);
            // SAFETY: a live id with a QP; param points at our private data.
            if unsafe { sys::rdma_accept(child, &mut param) } != 0 {
                return Err(last_os_error("rdma_accept"));
            }
            expect(ch, sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED).await?;
            Ok(cap)
        }
        .await;
        match result {
            Ok(cap) => Ok((Qp::finish(child, ch, pd, scq, rcq, cap), req.private_data)),
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
