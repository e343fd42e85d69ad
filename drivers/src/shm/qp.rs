//! Queue pairs: their state, what posting a work request does, and their failure. Beside it:
//! - `exec`: the send queue, each request carried out on the peer's mapping or ring;
//! - `inbound`: what the peer put in this side's ring, delivered to posted receives;
//! - `control`: the control socket (keys asked for, granted, refused and revoked);
//! - `setup` and `listener`: connecting, and accepting under the listener's limits;
//! - `percore`: the core's shared state, its poller, and the stall watch.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use barewire_engine::{poll_readable, poll_readable_relaxed, spawn_local, JoinHandle, Poller};
use barewire_rdma_types::{
    Access, CompletionQueue, QpState, RecvWr, SendOp, SendWr, Sge, Stag, StagMap, WcOpcode,
    WcStatus, WorkCompletion,
};

use super::mem::Mapping;
use super::ring::{self, Reader, Ring, Writer};
use super::{sock, Device, Pd};
use crate::api::QueuePair;
use crate::backend::{MappedPeer, QpOps};
use crate::ops::MappedRemote;
use crate::transport::DriverError;

mod control;
mod exec;
mod inbound;
mod listener;
mod percore;
mod setup;
#[cfg(test)]
mod tests;

use control::serve_control;
use listener::Intake;
pub(crate) use listener::Listener;
use percore::{core_wake, watch_for_stalls, CORE};
pub(crate) use setup::{connect, reach, Reach};
use setup::{finish, hear, Heard, Ours};

/// Each direction's ring.
const RING: usize = 1 << 20;
/// The largest private data a side sends at setup.
const MAX_PRIVATE: usize = 1024;
/// Setup messages' fixed part.
const HELLO: usize = 64;
const MAGIC: [u8; 6] = *b"bwshm1";

// Control message kinds.
const M_HELLO: u8 = 1;
const M_ACCEPT: u8 = 2;
const M_REJECT: u8 = 3;
const M_ASK: u8 = 4;
const M_GRANT: u8 = 5;
const M_REFUSE: u8 = 6;
/// The receiver could not place a Send (byte 1: the status its receive completed with); the
/// queue pair ends right after.
const M_BROKE: u8 = 7;

// Rights as a grant carries them.
const G_READ: u8 = 1;
const G_WRITE: u8 = 2;
const G_ATOMIC: u8 = 4;

/// Queue pair numbers with the top bit set, so they never equal the software provider's (which
/// count from 1 per core) in the key tables both use under `auto`: a window is bound to one
/// queue pair by its number.
fn next_qp_num() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    0x8000_0000 | (NEXT.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff)
}

fn connect_error(what: impl std::fmt::Display) -> DriverError {
    DriverError::Connect(format!("shm: {what}"))
}

/// What a peer was granted of one key.
enum Grant {
    /// Asked; the answer has not come.
    Asked,
    /// Shared with the `MappedRemote`s made of it, which keep it mapped after a revocation.
    Mapped(Rc<Mapping>),
    Refused,
}

/// The peer's keys this queue pair has asked for and what became of each, with the mapping of
/// the last key an operation found mapped: a flow of operations on one region then pays one
/// compare for its key instead of a table lookup. Every change to the table forgets that key
/// first (`change`), so a key refused or revoked since is never served from it, and the
/// pointer it keeps never outlives the table's `Rc` of the mapping.
struct PeerKeys {
    table: RefCell<StagMap<Grant>>,
    last: Cell<Option<(u32, NonNull<Mapping>)>>,
}

impl PeerKeys {
    fn new() -> PeerKeys {
        PeerKeys {
            table: RefCell::new(StagMap::default()),
            last: Cell::new(None),
        }
    }

    /// The table, to read.
    fn read(&self) -> std::cell::Ref<'_, StagMap<Grant>> {
        self.table.borrow()
    }

    /// The table, to change: forgets the last key first.
    fn change(&self) -> std::cell::RefMut<'_, StagMap<Grant>> {
        self.last.set(None);
        self.table.borrow_mut()
    }

    /// The mapping of `rkey` if the table has it mapped, remembered for the next call.
    #[inline]
    fn mapped(&self, rkey: u32) -> Option<NonNull<Mapping>> {
        match self.last.get() {
            Some((k, m)) if k == rkey => Some(m),
            _ => self.mapped_slow(rkey),
        }
    }

    /// `mapped` through the table.
    fn mapped_slow(&self, rkey: u32) -> Option<NonNull<Mapping>> {
        let table = self.table.borrow();
        let Some(Grant::Mapped(m)) = table.get(&rkey) else {
            return None;
        };
        let m = NonNull::from(&**m);
        self.last.set(Some((rkey, m)));
        Some(m)
    }
}

/// One send-queue entry.
enum Work {
    Op {
        wr: SendWr,
        /// Bytes of a Send already in the ring.
        sent: usize,
    },
    /// Tell the peer a key it was granted is gone.
    Revoke(u32),
}

/// How far one entry got.
enum Step {
    /// Finished; `Some(bytes)`: it is signaled, and its completion carries `bytes`. (The
    /// completion itself is built by the caller, which holds the request: a small return
    /// value stays in registers, where a whole completion went through memory.)
    Done(Option<u32>),
    /// It waits (for ring room or a grant); later entries wait behind it.
    Wait,
    /// A large WRITE or READ copied one step ([`COPY_STEP`]) and goes on at the next pass;
    /// later entries wait behind it.
    More,
}

/// Which way `copy_sges` copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyDir {
    /// From the other range into the SGEs (a READ, a received Send).
    IntoSges,
    /// From the SGEs into the other range (a Write, a Send into the ring).
    OutOfSges,
    /// As `OutOfSges`, in ascending order (`ops::copy_ascending`): a Write the peer watches.
    OutOfSgesAscending,
}

/// The most bytes one WRITE or READ copies per loop pass. A copy is synchronous on the core
/// that posts it: a 256 MiB WRITE copied at once held its core for a quarter of a second or
/// more, long enough for the cluster's failure detector to declare the node down; in steps the
/// core keeps running its other tasks between them (the software provider likewise moves at
/// most a MiB per queue pair per pass).
const COPY_STEP: usize = 1 << 20;

pub(crate) struct QpInner {
    num: u32,
    pd: Pd,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    sock: OwnedFd,
    /// The peer core's wake-up eventfd.
    peer_wake: OwnedFd,
    state: Cell<QpState>,
    tx: RefCell<Tx>,
    /// `tx.held` is not empty (read without borrowing `tx`, on every request's completion).
    holding: Cell<bool>,
    rx: RefCell<Rx>,
    grants: PeerKeys,
    /// Keys a local invalidate killed, whose grants are revoked once the send queue is free.
    invalidated: RefCell<Vec<u32>>,
    task: RefCell<Option<JoinHandle<()>>>,
    /// How long the peer may leave this side waiting without a sign of life (the connection's
    /// setup timeout, as the soft provider's stall timeout).
    timeout: Duration,
    /// Keys asked of the peer and not yet answered.
    asked: Cell<u32>,
    /// Requests carried out so far (a sign of progress for the stall watch).
    popped: Cell<u64>,
    /// Since when the peer has owed this side something with no progress, and the progress
    /// mark then (see [`QpInner::watch`]).
    stall: Cell<Option<(u64, Instant)>>,
    /// An accepted queue pair's place among its listener's open connections, given back when
    /// it fails (the application may hold it a while yet).
    admission: Cell<Option<Admission>>,
}

/// An accepted queue pair's place among its listener's open connections; also where its
/// peer's protection violations are counted.
struct Admission {
    open: barewire_engine::net::Admitted<libc::pid_t>,
    intake: Weak<Intake>,
}

struct Tx {
    w: Writer,
    queue: VecDeque<Work>,
    /// Finished requests whose completions wait, in posting order: a Send or a Write with
    /// immediate data completes once the peer has taken its record from the ring (matched it
    /// with a posted receive), as verbs completes it once the responder has placed it; every
    /// later completion waits behind it. Each entry: the ring position the peer must have
    /// consumed up to (0: none, it waits only for those ahead of it), its successful
    /// completion, and whether it is signaled (an unsignaled one completes only if it fails,
    /// as on verbs).
    held: VecDeque<(u64, WorkCompletion, bool)>,
    /// The front entry is a large copy part way through ([`Step::More`]): the core must keep
    /// passing (it is not waiting for the peer).
    copying: bool,
}

struct Rx {
    r: Reader,
    recvs: VecDeque<RecvWr>,
    /// Bytes of the current Send placed in the front receive.
    placed: usize,
    /// The current Send could not be placed in the front receive (too long: a length error;
    /// its region gone: a protection error): the rest is dropped, and the receive completes
    /// with that status.
    error: Option<WcStatus>,
}

/// A connected shm queue pair; it disconnects when dropped.
pub(crate) struct Qp(Rc<QpInner>);

impl Drop for Qp {
    fn drop(&mut self) {
        self.0.disconnect();
    }
}

/// Keeps a granted mapping alive for a `MappedRemote`, and wakes the queue pair's peer.
struct MappedPeerOf {
    _map: Rc<Mapping>,
    qp: Weak<QpInner>,
}

impl MappedPeer for MappedPeerOf {
    fn wake_if_asleep(&self) {
        let Some(q) = self.qp.upgrade() else {
            return;
        };
        // (Never called from inside the queue pair's own code, so the writer is free.)
        let tx = q.tx.try_borrow();
        if let Ok(tx) = &tx {
            q.wake_peer_if(&tx.w);
        }
    }
}

impl Qp {
    /// Its protection domain's keys (what windows bound to it must belong to).
    pub(crate) fn pd(&self) -> &barewire_rdma_types::ProtectionDomain {
        &self.0.pd.pd
    }
}

impl QpOps for Qp {
    fn qp_num(&self) -> u32 {
        self.0.num
    }
    fn transport(&self) -> crate::Transport {
        crate::Transport::Shm
    }
    fn watch_memory(&self) -> bool {
        self.0.rx.borrow().r.watch();
        true
    }
    fn map_remote(&self, region: &barewire_rdma_types::RegionDescriptor) -> Option<MappedRemote> {
        let grants = self.0.grants.read();
        let Some(Grant::Mapped(m)) = grants.get(&region.rkey.0) else {
            return None;
        };
        if !m.writable {
            return None;
        }
        let ptr = m.at(region.addr, region.len)?;
        let peer = MappedPeerOf {
            _map: m.clone(),
            qp: Rc::downgrade(&self.0),
        };
        Some(MappedRemote::new(ptr, region.len as usize, Box::new(peer)))
    }
    fn state(&self) -> QpState {
        self.0.state.get()
    }
    fn disconnect(&self) {
        self.0.disconnect()
    }
    fn post_send(&self, wr: SendWr) -> Result<(), DriverError> {
        self.0.post_send(wr)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<(), DriverError> {
        self.0.post_recv(wr)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl QpInner {
    fn dev(&self) -> &Device {
        &self.pd.dev
    }

    #[inline]
    fn complete(&self, cq: &CompletionQueue, wc: WorkCompletion) {
        if !cq.push(wc) {
            // An overflowed completion queue, as verbs' IBV_EVENT_CQ_ERR: the queue pair can
            // no longer report, so it stops.
            self.fail(WcStatus::GeneralErr);
        }
    }

    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, status, opcode, byte_len, self.num)
    }

    /// The completion of a signaled request that moved `len` bytes.
    fn success(&self, wr: &SendWr, len: u32) -> WorkCompletion {
        self.wc(wr.wr_id, WcStatus::Success, wr.op.opcode(), len)
    }

    /// A request has been carried out: its completion (`len`: signaled, with that many bytes)
    /// goes out now, or waits behind an earlier one, or (a Send, a Write with immediate data)
    /// waits until the peer has taken its record (see [`Tx::held`]).
    #[inline(always)]
    fn carried_out(&self, wr: &SendWr, len: Option<u32>) {
        let taken_by_peer = matches!(wr.op, SendOp::Send { .. } | SendOp::WriteWithImm { .. });
        if !taken_by_peer && !self.holding.get() {
            // The one-sided requests' path: nothing held, so it completes at once.
            if let Some(len) = len {
                self.complete(&self.scq, self.success(wr, len));
            }
            return;
        }
        self.hold(wr, len, taken_by_peer);
    }

    /// `carried_out` for a completion that waits (see [`Tx::held`]).
    #[inline(never)]
    fn hold(&self, wr: &SendWr, len: Option<u32>, taken_by_peer: bool) {
        {
            let mut tx = self.tx.borrow_mut();
            let end = if taken_by_peer { tx.w.tail() } else { 0 };
            let wc = self.success(wr, len.unwrap_or(0));
            tx.held.push_back((end, wc, len.is_some()));
        }
        self.holding.set(true);
        self.release();
        if self.holding.get() {
            watch_for_stalls();
        }
    }

    /// Completes the held requests the peer has consumed up to, in order. True if any.
    fn release(&self) -> bool {
        let mut any = false;
        loop {
            let wc = {
                let mut tx = self.tx.borrow_mut();
                let tx = &mut *tx;
                match tx.held.front() {
                    Some(&(end, ..)) if end <= tx.w.consumed() => {
                        let (_, wc, signaled) = tx.held.pop_front().unwrap();
                        self.holding.set(!tx.held.is_empty());
                        signaled.then_some(wc)
                    }
                    _ => return any,
                }
            };
            any = true;
            if let Some(wc) = wc {
                self.complete(&self.scq, wc);
            }
        }
    }

    /// True when a held completion can go out.
    fn releasable(&self) -> bool {
        let mut tx = self.tx.borrow_mut();
        let tx = &mut *tx;
        tx.held
            .front()
            .is_some_and(|&(end, ..)| end <= tx.w.consumed())
    }

    /// Ahead of an error or a flush: the held requests the peer consumed complete, and the
    /// rest flush (the queue pair is stopping: whether the peer takes them is unknown).
    fn settle_held(&self) {
        self.release();
        let held: Vec<_> = self.tx.borrow_mut().held.drain(..).collect();
        self.holding.set(false);
        for (_, wc, _) in held.into_iter().filter(|&(.., signaled)| signaled) {
            self.scq
                .push(self.wc(wc.wr_id, WcStatus::WrFlushErr, wc.opcode, 0));
        }
    }

    fn post_send(self: &Rc<Self>, wr: SendWr) -> Result<(), DriverError> {
        if self.state.get() != QpState::Rts {
            // As verbs: a request posted on a queue pair in ERROR completes with a flush.
            let op = wr.op.opcode();
            self.complete(&self.scq, self.wc(wr.wr_id, WcStatus::WrFlushErr, op, 0));
            return Ok(());
        }
        let mut sent = 0;
        let step = {
            let mut tx = self.tx.borrow_mut();
            if !tx.queue.is_empty() {
                tx.queue.push_back(Work::Op { wr, sent: 0 });
                drop(tx);
                self.progress();
                return Ok(());
            }
            // Nothing ahead of it: run it now, without queueing it.
            self.run(&mut tx.w, &wr, &mut sent)
        };
        self.revoke_invalidated();
        match step {
            Ok(Step::Done(len)) => self.carried_out(&wr, len),
            Ok(step @ (Step::Wait | Step::More)) => {
                let mut tx = self.tx.borrow_mut();
                tx.copying = matches!(step, Step::More);
                tx.queue.push_back(Work::Op { wr, sent });
                if matches!(step, Step::Wait) {
                    watch_for_stalls();
                }
            }
            Err((wr_id, opcode, status)) => {
                self.settle_held();
                self.complete(&self.scq, self.wc(wr_id, status, opcode, 0));
                self.fail(WcStatus::WrFlushErr);
            }
        }
        Ok(())
    }

    /// Revokes the grants of keys a local invalidate just killed (outside the send queue's
    /// borrow: the revocation may go into this queue pair's own ring).
    #[inline]
    fn revoke_invalidated(&self) {
        if !self.invalidated.borrow().is_empty() {
            self.revoke_invalidated_now();
        }
    }

    #[cold]
    fn revoke_invalidated_now(&self) {
        let keys: Vec<u32> = self.invalidated.borrow_mut().drain(..).collect();
        for k in keys {
            self.dev().revoke(k);
        }
    }

    fn post_recv(self: &Rc<Self>, wr: RecvWr) -> Result<(), DriverError> {
        if self.state.get() != QpState::Rts {
            self.complete(
                &self.rcq,
                self.wc(wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0),
            );
            return Ok(());
        }
        // Checked now, as the soft provider checks at post time.
        for s in &wr.sges {
            self.local(s, true).map_err(|_| {
                DriverError::Post(format!("receive SGE {s:?} outside a local region"))
            })?;
        }
        self.rx.borrow_mut().recvs.push_back(wr);
        self.deliver();
        Ok(())
    }

    /// Where a local SGE's bytes are, if its key covers them with the rights needed.
    #[inline(always)]
    fn local(&self, s: &Sge, write: bool) -> Result<*mut u8, WcStatus> {
        self.pd
            .dev
            .tables
            .check_local(s.lkey, self.pd.id(), s.addr, s.len as u64, write)
            .map_err(|_| WcStatus::LocProtErr)
    }

    /// Moves to ERROR: what the peer already put in the ring is delivered first (nothing it
    /// was told was sent is lost), then everything outstanding completes with a flush.
    fn fail(&self, _why: WcStatus) {
        if self.state.get() == QpState::Error {
            return;
        }
        self.state.set(QpState::Error);
        self.admission.take();
        // SAFETY: shutdown(2) on our own socket: the peer sees the hang-up.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.task.borrow_mut().take() {
            t.cancel();
        }
        self.settle_held();
        let queued: Vec<Work> = {
            let mut tx = self.tx.borrow_mut();
            tx.copying = false;
            tx.queue.drain(..).collect()
        };
        for w in queued {
            if let Work::Op { wr, .. } = w {
                let op = wr.op.opcode();
                self.scq
                    .push(self.wc(wr.wr_id, WcStatus::WrFlushErr, op, 0));
            }
        }
        let recvs: Vec<RecvWr> = self.rx.borrow_mut().recvs.drain(..).collect();
        for r in recvs {
            self.rcq
                .push(self.wc(r.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0));
        }
        self.grants.change().clear();
    }

    fn disconnect(&self) {
        self.fail(WcStatus::WrFlushErr);
    }
}
