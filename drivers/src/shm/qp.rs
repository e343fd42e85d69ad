//! Queue pairs, their setup, and the per-core poller that delivers incoming Sends.

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

    /// Runs the send queue from its front until an entry waits, a large copy has taken this
    /// pass's step, or the queue is empty. True if anything moved.
    fn progress(self: &Rc<Self>) -> bool {
        let mut moved = false;
        loop {
            if self.state.get() != QpState::Rts {
                return moved;
            }
            let step = {
                let mut tx = self.tx.borrow_mut();
                let tx = &mut *tx;
                let Some(front) = tx.queue.front_mut() else {
                    return moved;
                };
                let step = match front {
                    Work::Revoke(stag) => {
                        if tx.w.push(ring::REVOKE, 0, 0, 0, *stag, |_| {}) {
                            self.wake_peer_if(&tx.w);
                            Ok(Step::Done(None))
                        } else {
                            Ok(Step::Wait)
                        }
                    }
                    Work::Op { wr, sent } => self.execute(&mut tx.w, wr, sent),
                };
                tx.copying = matches!(step, Ok(Step::More));
                step
            };
            self.revoke_invalidated();
            match step {
                Ok(Step::Wait) => {
                    watch_for_stalls();
                    return moved;
                }
                Ok(Step::More) => return true,
                Ok(Step::Done(len)) => {
                    moved = true;
                    self.popped.set(self.popped.get() + 1);
                    let work = self.tx.borrow_mut().queue.pop_front();
                    if let Some(Work::Op { wr, .. }) = work {
                        self.carried_out(&wr, len);
                    }
                }
                Err((wr_id, opcode, status)) => {
                    self.tx.borrow_mut().queue.pop_front();
                    self.settle_held();
                    self.complete(&self.scq, self.wc(wr_id, status, opcode, 0));
                    self.fail(WcStatus::WrFlushErr);
                    return true;
                }
            }
        }
    }

    fn wake_peer_if(&self, w: &Writer) {
        if w.reader_asleep() {
            sock::poke(self.peer_wake.as_raw_fd());
        }
    }

    /// The mapping of the peer's key `rkey`, asking for it on first use. `Ok(None)`: wait.
    #[inline(always)]
    fn mapping(&self, rkey: Stag) -> Result<Option<*const Mapping>, WcStatus> {
        match self.grants.mapped(rkey.0) {
            Some(m) => Ok(Some(m.as_ptr())),
            None => self.mapping_slow(rkey),
        }
    }

    /// `mapping` for a key not mapped: waiting for it, refused, or to be asked for now.
    fn mapping_slow(&self, rkey: Stag) -> Result<Option<*const Mapping>, WcStatus> {
        let mut g = self.grants.change();
        match g.get(&rkey.0) {
            Some(Grant::Mapped(m)) => Ok(Some(Rc::as_ptr(m))),
            Some(Grant::Asked) => Ok(None),
            Some(Grant::Refused) => Err(WcStatus::RemAccessErr),
            None => {
                let mut msg = [0u8; 8];
                msg[0] = M_ASK;
                msg[4..8].copy_from_slice(&rkey.0.to_le_bytes());
                if sock::send(self.sock.as_raw_fd(), &msg, &[]).is_err() {
                    return Err(WcStatus::RetryExcErr);
                }
                g.insert(rkey.0, Grant::Asked);
                self.asked.set(self.asked.get() + 1);
                Ok(None)
            }
        }
    }

    /// Runs one work request from the send queue, or says it must wait (see [`Self::run`]).
    #[inline(never)]
    fn execute(
        &self,
        w: &mut Writer,
        wr: &SendWr,
        sent: &mut usize,
    ) -> Result<Step, (u64, WcOpcode, WcStatus)> {
        self.run(w, wr, sent)
    }

    /// Runs one work request, or says it must wait. Errors carry what to complete it with.
    /// Inlined into `post_send`, where a request with nothing ahead of it (every latency-bound
    /// one) runs at once: no call, and no result passed back through memory.
    #[inline(always)]
    fn run(
        &self,
        w: &mut Writer,
        wr: &SendWr,
        sent: &mut usize,
    ) -> Result<Step, (u64, WcOpcode, WcStatus)> {
        // (The opcode is looked up only for an error's completion.)
        let fail = |s: WcStatus| (wr.wr_id, wr.op.opcode(), s);
        let done = |len: usize| Ok(Step::Done(wr.signaled.then_some(len as u32)));
        // The list looked at once (each look at a `SmallVec` asks where it is stored).
        let sges: &[Sge] = &wr.sges;
        // (Counted in the arms that move bytes: an atomic names its one 8-byte SGE.)
        let bytes = || -> usize {
            match sges {
                [s] => s.len as usize,
                _ => sges.iter().map(|s| s.len as usize).sum(),
            }
        };
        match wr.op {
            SendOp::Send {
                solicited,
                invalidate,
            } => {
                let total = bytes();
                let flags_base = if solicited { ring::SOLICITED } else { 0 };
                for s in sges {
                    self.local(s, false).map_err(fail)?;
                }
                loop {
                    let n = (total - *sent).min(w.max_fragment());
                    let last = *sent + n == total;
                    let mut flags = flags_base | if last { ring::LAST } else { 0 };
                    let mut value = 0;
                    if let (true, Some(stag)) = (last, invalidate) {
                        flags |= ring::INVALIDATE;
                        value = stag.0;
                    }
                    let from = *sent;
                    let ok = w.push(ring::SEND, flags, n, n as u32, value, |dst| {
                        // Every SGE was checked above, in this same call.
                        let copied = self.copy_sges(sges, from, dst, n, CopyDir::OutOfSges);
                        debug_assert!(copied.is_ok());
                    });
                    if !ok {
                        return Ok(Step::Wait);
                    }
                    self.wake_peer_if(w);
                    *sent += n;
                    if last {
                        if let Some(stag) = invalidate {
                            // The peer invalidates the key when it takes this Send; this side
                            // stops using its mapping now, so a Write posted after the Send
                            // fails as it would arriving after it on the wire.
                            self.grants.change().insert(stag.0, Grant::Refused);
                        }
                        return done(total);
                    }
                }
            }
            SendOp::Write { remote_addr, rkey }
            | SendOp::WriteWithImm {
                remote_addr, rkey, ..
            } => {
                let total = bytes();
                let Some(m) = self.mapping(rkey).map_err(fail)? else {
                    return Ok(Step::Wait);
                };
                // SAFETY: grants are removed only by this queue pair's own code, never while
                // an operation runs (operations are synchronous).
                let m = unsafe { &*m };
                // A plain Write the reader asked to watch lands in ascending order and is
                // followed by a look at whether the reader sleeps; Writes with immediate data
                // are announced by their notice in the ring instead.
                let watched = !matches!(wr.op, SendOp::WriteWithImm { .. }) && w.reader_watches();
                if *sent < total {
                    let n = (total - *sent).min(COPY_STEP);
                    self.write_remote(m, sges, remote_addr, total, *sent, n, watched)
                        .map_err(fail)?;
                    *sent += n;
                    if watched {
                        // The fence in `reader_asleep` orders the look after the copy.
                        self.wake_peer_if(w);
                    }
                    if *sent < total {
                        return Ok(Step::More);
                    }
                }
                if let SendOp::WriteWithImm { imm, .. } = wr.op {
                    // The data is all in (this pass or earlier ones); the notice may wait for
                    // ring room.
                    if !w.push(ring::IMM, ring::LAST, 0, total as u32, imm, |_| {}) {
                        return Ok(Step::Wait);
                    }
                    self.wake_peer_if(w);
                }
                done(total)
            }
            SendOp::Read { remote_addr, rkey } => {
                let total = bytes();
                if total == 0 {
                    // As RFC 5040 §4.4 and the software provider: a zero-length Read names no
                    // region (its key is not checked); it completes in order with what was
                    // posted before it, which on shm has all been carried out.
                    return done(0);
                }
                let Some(m) = self.mapping(rkey).map_err(fail)? else {
                    return Ok(Step::Wait);
                };
                // SAFETY: as for Write.
                let m = unsafe { &*m };
                if !m.readable {
                    return Err(fail(WcStatus::RemAccessErr));
                }
                let src = m
                    .at(remote_addr, total as u64)
                    .ok_or(fail(WcStatus::RemAccessErr))?;
                if total <= COPY_STEP {
                    // In one step (every small READ): SGE by SGE, each copy inline.
                    let mut off = 0;
                    for s in sges {
                        let dst = self.local(s, true).map_err(fail)?;
                        // SAFETY: src covers `total` bytes of the mapping (checked), dst the
                        // SGE's bytes of a local region (checked); plain copies of shared
                        // memory. The ranges are disjoint: src lies in this queue pair's own
                        // mmap of the peer's file, which no local region overlaps.
                        unsafe { crate::ops::copy_small(src.add(off), dst, s.len as usize) };
                        off += s.len as usize;
                    }
                    return done(total);
                }
                let n = (total - *sent).min(COPY_STEP);
                // SAFETY: src covers `total` bytes of the mapping (checked), so `sent + n` of
                // them; it lies in this queue pair's own mmap of the peer's file, which no local
                // region overlaps (see `write_remote`).
                let from = unsafe { src.add(*sent) };
                self.copy_sges(sges, *sent, from, n, CopyDir::IntoSges)
                    .map_err(fail)?;
                *sent += n;
                if *sent < total {
                    return Ok(Step::More);
                }
                done(total)
            }
            SendOp::FetchAdd {
                remote_addr, rkey, ..
            }
            | SendOp::CmpSwap {
                remote_addr, rkey, ..
            }
            | SendOp::Swap {
                remote_addr, rkey, ..
            } => {
                let Some(m) = self.mapping(rkey).map_err(fail)? else {
                    return Ok(Step::Wait);
                };
                // SAFETY: as for Write.
                let m = unsafe { &*m };
                let [sink] = sges else {
                    return Err(fail(WcStatus::LocLenErr));
                };
                if sink.len != 8 {
                    return Err(fail(WcStatus::LocLenErr));
                }
                let sink = self.local(sink, true).map_err(fail)?;
                if !m.atomic || remote_addr % 8 != 0 {
                    return Err(fail(WcStatus::RemAccessErr));
                }
                let p = m.at(remote_addr, 8).ok_or(fail(WcStatus::RemAccessErr))?;
                // SAFETY: an 8-byte aligned word inside a writable shared mapping (checked);
                // AtomicU64 has u64's layout.
                let word = unsafe { AtomicU64::from_ptr(p as *mut u64) };
                let old = match wr.op {
                    SendOp::FetchAdd { add, .. } => word.fetch_add(add, Ordering::SeqCst),
                    SendOp::CmpSwap { compare, swap, .. } => {
                        match word.compare_exchange(
                            compare,
                            swap,
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                        ) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    SendOp::Swap { swap, .. } => word.swap(swap, Ordering::SeqCst),
                    _ => unreachable!(),
                };
                // SAFETY: the local sink's 8 bytes (checked); possibly unaligned.
                unsafe { std::ptr::write_unaligned(sink as *mut u64, old) };
                done(8)
            }
            SendOp::LocalInvalidate { stag } => {
                self.pd
                    .dev
                    .tables
                    .invalidate(stag, self.pd.id())
                    .map_err(|_| fail(WcStatus::LocProtErr))?;
                self.invalidated.borrow_mut().push(stag.0);
                done(0)
            }
        }
    }

    /// Copies `n` bytes between `other` and the SGEs' concatenation, starting `skip` bytes
    /// into it, the way `how` says. Each SGE's key is checked as it is reached (with
    /// LOCAL_WRITE when the SGEs are written); fails if one's region is gone.
    #[inline]
    fn copy_sges(
        &self,
        sges: &[Sge],
        mut skip: usize,
        mut other: *mut u8,
        mut n: usize,
        how: CopyDir,
    ) -> Result<(), WcStatus> {
        for s in sges {
            if n == 0 {
                break;
            }
            let len = s.len as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = (len - skip).min(n);
            let at = self.local(s, how == CopyDir::IntoSges)?;
            // SAFETY: `take` bytes from `skip` lie within the SGE (its key checked just now) and
            // within `other`, which the caller sized for `n` (a ring record's payload, checked
            // by the ring's writer or reader, or a range of a mapping, checked by `Mapping::at`).
            // The ranges are disjoint: no local region overlaps a ring or this queue pair's own
            // mmap of the peer's file (even when the peer is this process, the pages are mapped
            // twice).
            unsafe {
                let sge = at.add(skip);
                match how {
                    CopyDir::IntoSges => crate::ops::copy_small(other, sge, take),
                    CopyDir::OutOfSges => crate::ops::copy_small(sge, other, take),
                    CopyDir::OutOfSgesAscending => crate::ops::copy_ascending(sge, other, take),
                }
                other = other.add(take);
            }
            n -= take;
            skip = 0;
        }
        Ok(())
    }

    /// Bytes `from..from + n` of a Write of `total` bytes to the peer's `to`: checks the
    /// grant's rights and the whole Write's bounds, then copies (in ascending order when the
    /// peer watches its memory).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn write_remote(
        &self,
        m: &Mapping,
        sges: &[Sge],
        to: u64,
        total: usize,
        from: usize,
        n: usize,
        ascending: bool,
    ) -> Result<(), WcStatus> {
        if !m.writable {
            return Err(WcStatus::RemAccessErr);
        }
        let dst = m.at(to, total as u64).ok_or(WcStatus::RemAccessErr)?;
        if n == total {
            // In one step (every small Write): SGE by SGE, each copy inline.
            let mut off = 0;
            for s in sges {
                let src = self.local(s, false)?;
                // SAFETY: dst covers `total` bytes of a writable mapping (checked), src the
                // SGE (checked); disjoint, as in `copy_sges`.
                unsafe {
                    if ascending {
                        crate::ops::copy_ascending(src, dst.add(off), s.len as usize)
                    } else {
                        crate::ops::copy_small(src, dst.add(off), s.len as usize)
                    }
                };
                off += s.len as usize;
            }
            return Ok(());
        }
        let how = if ascending {
            CopyDir::OutOfSgesAscending
        } else {
            CopyDir::OutOfSges
        };
        // SAFETY: dst covers `total` bytes of a writable mapping (checked), and from + n <= total.
        self.copy_sges(sges, from, unsafe { dst.add(from) }, n, how)
    }

    /// Delivers what the peer put in the ring to the posted receives, in order. Returns
    /// whether anything was consumed.
    fn deliver(self: &Rc<Self>) -> bool {
        let mut any = false;
        loop {
            let (wc, wake) = match self.take_one() {
                Ok(Some(x)) => x,
                Ok(None) => return any,
                Err(ring::Corrupt(why)) => {
                    eprintln!(
                        "barewire shm: queue pair {}: {why}; disconnecting",
                        self.num
                    );
                    self.fail(WcStatus::RetryExcErr);
                    return any;
                }
            };
            any = true;
            if wake {
                sock::poke(self.peer_wake.as_raw_fd());
            }
            self.revoke_invalidated();
            if let Some(wc) = wc {
                let status = wc.status;
                self.complete(&self.rcq, wc);
                if status != WcStatus::Success {
                    // As verbs: a receive too small for the Send is a local length error (one
                    // whose memory is gone, a protection error), the sender's Send fails with
                    // the responder's error, and both queue pairs go to ERROR.
                    let msg = [M_BROKE, status as u8, 0, 0, 0, 0, 0, 0];
                    let _ = sock::send(self.sock.as_raw_fd(), &msg, &[]);
                    self.fail(WcStatus::WrFlushErr);
                    return any;
                }
            }
        }
    }

    /// Consumes the next record if it can be delivered now: the completion it finishes (if
    /// any), and whether the writer waits to be woken. `None`: nothing to deliver now.
    #[allow(clippy::type_complexity)]
    fn take_one(&self) -> Result<Option<(Option<WorkCompletion>, bool)>, ring::Corrupt> {
        let mut guard = self.rx.borrow_mut();
        let rx = &mut *guard;
        let Some((rec, body)) = rx.r.peek()? else {
            return Ok(None);
        };
        let mut wc = None;
        match rec.kind {
            ring::REVOKE => {
                self.grants.change().remove(&rec.value);
            }
            ring::IMM => {
                let Some(r) = rx.recvs.pop_front() else {
                    rx.r.waits();
                    return Ok(None);
                };
                let mut c = self.wc(
                    r.wr_id,
                    WcStatus::Success,
                    WcOpcode::RecvRdmaWithImm,
                    rec.len,
                );
                c.imm = Some(rec.value);
                c.solicited = rec.flags & ring::SOLICITED != 0;
                wc = Some(c);
            }
            _ => {
                // A Send fragment into the front receive.
                let Some(r) = rx.recvs.front() else {
                    rx.r.waits();
                    return Ok(None);
                };
                let n = rec.len as usize;
                if rx.error.is_none() {
                    let room: usize = r.sges.iter().map(|s| s.len as usize).sum();
                    if rx.placed + n > room {
                        rx.error = Some(WcStatus::LocLenErr);
                    } else if self
                        .copy_sges(&r.sges, rx.placed, body as *mut u8, n, CopyDir::IntoSges)
                        .is_err()
                    {
                        rx.error = Some(WcStatus::LocProtErr);
                    }
                }
                rx.placed += n;
                if rec.flags & ring::LAST != 0 {
                    let mut invalidated = None;
                    if rec.flags & ring::INVALIDATE != 0 {
                        // As RDMAP's Send with Invalidate: the key must be live and of this
                        // queue pair's protection domain; otherwise the peer broke the
                        // protocol (soft answers with a Terminate), and the connection ends.
                        if self
                            .pd
                            .dev
                            .tables
                            .invalidate(Stag(rec.value), self.pd.id())
                            .is_err()
                        {
                            return Err(ring::Corrupt(
                                "a Send with Invalidate names a key this side cannot invalidate",
                            ));
                        }
                        // Its grants to peers are revoked once the ring is free (`deliver`).
                        self.invalidated.borrow_mut().push(rec.value);
                        invalidated = Some(rec.value);
                    }
                    let r = rx.recvs.pop_front().expect("front checked");
                    let status = rx.error.take().unwrap_or(WcStatus::Success);
                    let mut c = self.wc(r.wr_id, status, WcOpcode::Recv, rx.placed as u32);
                    c.invalidated = invalidated;
                    c.solicited = rec.flags & ring::SOLICITED != 0;
                    wc = Some(c);
                    rx.placed = 0;
                }
            }
        }
        if wc.as_ref().is_some_and(|c| c.status != WcStatus::Success) {
            // A Send this side could not place: its record stays unconsumed, so the sender
            // never sees it taken (it learns why from `M_BROKE`, which `deliver` sends).
            return Ok(Some((wc, false)));
        }
        let wake = rx.r.consume(&rec);
        Ok(Some((wc, wake)))
    }

    /// Queues a revocation of `stag` for the peer, in order with what was posted before.
    pub(super) fn revoke(self: &Rc<Self>, stag: u32) {
        if self.state.get() == QpState::Rts {
            self.tx.borrow_mut().queue.push_back(Work::Revoke(stag));
            self.progress();
        }
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

    /// Handles one control message from the peer.
    fn control(self: &Rc<Self>, msg: &[u8], mut fds: Vec<OwnedFd>) -> Result<(), String> {
        let kind = *msg.first().ok_or("an empty control message")?;
        let stag = msg
            .get(4..8)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .ok_or("a short control message")?;
        match kind {
            M_ASK => self.answer(stag),
            M_GRANT => {
                if msg.len() < 36 || fds.len() != 1 {
                    return Err("a malformed grant".into());
                }
                let base = u64::from_le_bytes(msg[8..16].try_into().unwrap());
                let len = u64::from_le_bytes(msg[16..24].try_into().unwrap());
                let offset = u64::from_le_bytes(msg[24..32].try_into().unwrap());
                let rights = msg[32];
                if !matches!(self.grants.read().get(&stag), Some(Grant::Asked)) {
                    return Err("a grant nobody asked for".into());
                }
                self.asked.set(self.asked.get() - 1);
                let writable = rights & (G_WRITE | G_ATOMIC) != 0;
                let fd = fds.pop().expect("one");
                let g = match Mapping::new(&fd, offset, len, base, writable) {
                    Ok(mut m) => {
                        m.readable = rights & G_READ != 0;
                        m.writable = rights & G_WRITE != 0;
                        m.atomic = rights & G_ATOMIC != 0;
                        Grant::Mapped(Rc::new(m))
                    }
                    Err(e) => {
                        eprintln!("barewire shm: a grant could not be mapped: {e}");
                        Grant::Refused
                    }
                };
                self.grants.change().insert(stag, g);
                self.progress();
                Ok(())
            }
            M_REFUSE => {
                if !matches!(self.grants.read().get(&stag), Some(Grant::Asked)) {
                    return Err("a refusal nobody asked for".into());
                }
                self.asked.set(self.asked.get() - 1);
                self.grants.change().insert(stag, Grant::Refused);
                self.progress();
                Ok(())
            }
            M_BROKE => {
                // The Send the peer could not place is the first one it has not taken: it
                // fails with the responder's error, as verbs reports one.
                let status = if msg[1] == WcStatus::LocLenErr as u8 {
                    WcStatus::RemInvReqErr
                } else {
                    WcStatus::RemOpErr
                };
                self.settle_front(status);
                // (This runs in the control task: it ends at the hang-up that follows.)
                self.task.borrow_mut().take();
                self.fail(WcStatus::WrFlushErr);
                Ok(())
            }
            _ => Err(format!("unknown control message {kind}")),
        }
    }

    /// Answers a peer's request for key `stag`: the memory, or a refusal.
    fn answer(self: &Rc<Self>, stag: u32) -> Result<(), String> {
        let grant = self
            .pd
            .dev
            .tables
            .lookup(Stag(stag), self.pd.id(), self.num)
            .ok()
            .and_then(|(addr, len, access)| {
                let Some((file, offset)) = super::mem::find(addr as usize, len as usize) else {
                    // Possible only under `auto`, which lets raw memory be registered for
                    // peers of the software provider.
                    eprintln!(
                        "barewire shm: a peer on this host asked for a region of {len} bytes \
                         that is not inside a buffer barewire allocated, so it cannot be mapped; \
                         refused (allocate remotely accessible memory with Buffer::new)"
                    );
                    return None;
                };
                let mut rights = 0;
                if access.contains(Access::REMOTE_READ) {
                    rights |= G_READ;
                }
                if access.contains(Access::REMOTE_WRITE) {
                    rights |= G_WRITE;
                }
                if access.contains(Access::REMOTE_ATOMIC) {
                    rights |= G_ATOMIC;
                }
                let fd = file.descriptor(rights & (G_WRITE | G_ATOMIC) != 0).ok()?;
                Some((addr, len, offset, rights, fd, file))
            });
        let refused = grant.is_none();
        let sent = match grant {
            Some((addr, len, offset, rights, fd, _file)) => {
                let mut m = [0u8; 36];
                m[0] = M_GRANT;
                m[4..8].copy_from_slice(&stag.to_le_bytes());
                m[8..16].copy_from_slice(&addr.to_le_bytes());
                m[16..24].copy_from_slice(&len.to_le_bytes());
                m[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
                m[32] = rights;
                let r = sock::send(self.sock.as_raw_fd(), &m, &[fd]);
                if r.is_ok() {
                    self.dev().granted(stag, self);
                }
                r
            }
            None => {
                let mut m = [0u8; 8];
                m[0] = M_REFUSE;
                m[4..8].copy_from_slice(&stag.to_le_bytes());
                sock::send(self.sock.as_raw_fd(), &m, &[])
            }
        };
        match sent {
            // The peer hung up meanwhile (it is shutting down): not this side's error, and the
            // next receive on the socket sees the hang-up and fails the queue pair as gone.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => Ok(()),
            Err(e) => Err(format!("answering a grant request: {e}")),
            // A key this peer may not use is a protection violation, as an access with one is on
            // verbs and soft: the refusal tells the peer (whose request fails with a remote
            // access error, and whose queue pair then ends anyway), and the connection ends
            // here too, so a peer cannot guess keys on one connection.
            Ok(()) if refused => {
                if let Some(a) = self.admission.take() {
                    if let Some(i) = a.intake.upgrade() {
                        i.count(|n| n.violations += 1);
                        i.strikes.strike(*a.open.source(), Instant::now());
                    }
                }
                Err(format!(
                    "the peer asked for key {stag:#010x}, which it may not use (a protection \
                     violation)"
                ))
            }
            Ok(()) => Ok(()),
        }
    }
}

/// Reads the queue pair's control socket until the peer hangs up (or the queue pair ends).
async fn serve_control(qp: Weak<QpInner>, fd: RawFd) {
    let mut buf = [0u8; 256];
    loop {
        let Some(q) = qp.upgrade() else { return };
        match sock::recv(fd, &mut buf) {
            Ok(Some(r)) if r.len > 0 => {
                if let Err(why) = q.control(&buf[..r.len], r.fds) {
                    eprintln!("barewire shm: queue pair {}: {why}; disconnecting", q.num);
                    q.task.borrow_mut().take();
                    q.fail(WcStatus::RetryExcErr);
                    return;
                }
            }
            // A control message (a grant asked for, a hang-up) can wait some microseconds on a
            // busy core: a relaxed wait spares an epoll core a system call per pass.
            Ok(None) => {
                drop(q);
                let _ = poll_readable_relaxed(fd).await;
            }
            // The peer hung up or the socket broke: the peer is gone. (A message too long or
            // with too many descriptors breaks the protocol, and ends the connection the same.)
            other => {
                if let Err(e) = other {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        eprintln!("barewire shm: queue pair {}: {e}; disconnecting", q.num);
                    }
                }
                q.task.borrow_mut().take();
                q.deliver();
                q.fail(WcStatus::RetryExcErr);
                return;
            }
        }
    }
}

// ---- setup ----------------------------------------------------------------------------------

/// What one side says at setup.
struct Hello {
    kind: u8,
    qp_num: u32,
    ring_cap: u32,
    netns: u64,
    boot: [u8; 36],
    private: Vec<u8>,
}

impl Hello {
    fn ours(kind: u8, qp_num: u32, private: &[u8]) -> Hello {
        let (boot, netns) = super::identity();
        Hello {
            kind,
            qp_num,
            ring_cap: RING as u32,
            netns,
            boot,
            private: private.to_vec(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HELLO];
        b[0] = self.kind;
        b[2..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.qp_num.to_le_bytes());
        b[12..16].copy_from_slice(&self.ring_cap.to_le_bytes());
        b[16..24].copy_from_slice(&self.netns.to_le_bytes());
        b[24..60].copy_from_slice(&self.boot);
        b.extend_from_slice(&self.private);
        b
    }

    fn decode(b: &[u8]) -> Result<Hello, String> {
        if b.len() < HELLO || b[2..8] != MAGIC {
            return Err("the peer does not speak barewire's shm setup".into());
        }
        if b.len() - HELLO > MAX_PRIVATE {
            return Err("the peer's private data is too long".into());
        }
        Ok(Hello {
            kind: b[0],
            qp_num: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            ring_cap: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            netns: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            boot: b[24..60].try_into().unwrap(),
            private: b[HELLO..].to_vec(),
        })
    }

    /// Checks that the peer shares this host and namespace.
    fn check(&self) -> Result<(), String> {
        let (boot, netns) = super::identity();
        if self.boot != boot || self.netns != netns {
            return Err("the peer is not on this host and network namespace".into());
        }
        let cap = self.ring_cap as usize;
        if !cap.is_power_of_two() || !(ring::MIN_CAP..=ring::MAX_CAP).contains(&cap) {
            return Err(format!("the peer offers a ring of {cap} bytes"));
        }
        Ok(())
    }
}

/// This core's wake-up eventfd, its waiter, and its queue pairs.
struct CoreShm {
    core: Cell<u64>,
    /// The wake-up eventfd, registered with the engine's reactor for the core's life: a peer's
    /// poke ends the core's sleep. Made the first time the core goes to sleep. (Declared
    /// before `wake`, so dropped before the eventfd closes.)
    irq: RefCell<Option<barewire_engine::WakeSource>>,
    wake: RefCell<Option<Rc<OwnedFd>>>,
    qps: RefCell<Vec<Weak<QpInner>>>,
    registered: Cell<bool>,
    /// Where `irq` cannot be made or armed: a task waiting on the eventfd for this sleep alone.
    waiter: RefCell<Option<JoinHandle<()>>>,
    /// The stall watch is on ([`watch_for_stalls`]).
    watching: Cell<bool>,
    /// Its timer for a sleeping core is pending.
    watch_timer: Cell<bool>,
    /// Passes of the poller since the watch last read the clock, and when it looks next.
    passes: Cell<u32>,
    next_look: Cell<Option<Instant>>,
}

thread_local! {
    static CORE: CoreShm = const {
        CoreShm {
            core: Cell::new(0),
            wake: RefCell::new(None),
            qps: RefCell::new(Vec::new()),
            registered: Cell::new(false),
            irq: RefCell::new(None),
            waiter: RefCell::new(None),
            watching: Cell::new(false),
            watch_timer: Cell::new(false),
            passes: Cell::new(0),
            next_look: Cell::new(None),
        }
    };
}

impl CoreShm {
    /// Forgets the core this state was made for: its queue pairs, its wake-up eventfd (closed
    /// here unless a queue pair still holds it), its registration with the reactor and its
    /// waiter.
    fn reset(&self) {
        self.qps.borrow_mut().clear();
        self.registered.set(false);
        self.irq.take();
        self.wake.take();
        self.waiter.take();
        self.watching.set(false);
        self.watch_timer.set(false);
        self.passes.set(0);
        self.next_look.set(None);
    }
}

/// This core's wake-up eventfd (made, and the poller registered, on first use).
fn core_wake() -> Result<Rc<OwnedFd>, DriverError> {
    CORE.with(|c| {
        let token = barewire_engine::core_token();
        if c.core.replace(token) != token {
            c.reset();
        }
        if c.wake.borrow().is_none() {
            let fd = sock::eventfd().map_err(|e| connect_error(format!("eventfd: {e}")))?;
            *c.wake.borrow_mut() = Some(Rc::new(fd));
        }
        if !c.registered.replace(true) {
            barewire_engine::register_poller(Box::new(ShmPoller { registered: true }));
        }
        Ok(c.wake.borrow().clone().expect("made above"))
    })
}

/// A peer's setup message, heard and checked: the socket, what it said, its ring and its
/// core's wake-up descriptor.
pub(crate) struct Heard {
    fd: OwnedFd,
    peer: Hello,
    ring: OwnedFd,
    wake: OwnedFd,
}

/// Waits (until `deadline`) for the peer's setup message of kind `want` on a connected socket,
/// and checks it and the peer (same user, host and namespace; a sane ring). A listener answers
/// a peer it refuses with a Reject that says why.
async fn hear(fd: OwnedFd, want: u8, deadline: Instant) -> Result<Heard, DriverError> {
    // Only processes of this user: see the module docs.
    let me = sock::uid();
    match sock::peer_cred(&fd).map(|c| c.uid) {
        Ok(uid) if uid == me => {}
        Ok(uid) => {
            return Err(connect_error(format!(
                "the peer runs as user {uid}, not {me}; shm connects only processes of one user"
            )))
        }
        Err(e) => return Err(connect_error(format!("SO_PEERCRED: {e}"))),
    }
    let raw = fd.as_raw_fd();
    let mut buf = vec![0u8; HELLO + MAX_PRIVATE + 1];
    // A listener closes a connection over its limits at once (its hello unread: a reset).
    let closed = || {
        if want == M_ACCEPT {
            closed_by_listener()
        } else {
            connect_error("the peer hung up during setup")
        }
    };
    let got = match sock::recv_by(raw, &mut buf, deadline).await {
        Ok(got) if got.len == 0 => return Err(closed()),
        Ok(got) => got,
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => return Err(closed()),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut && want == M_ACCEPT => {
            return Err(connect_error(
                "no answer from the listener within the setup timeout \
                 (ConnectOptions::timeout): is it stopped, overloaded, or slow to accept?",
            ))
        }
        Err(e) => return Err(connect_error(format!("waiting for the peer's setup: {e}"))),
    };
    if buf[0] == M_REJECT {
        return Err(DriverError::Rejected {
            private_data: buf[1..got.len].to_vec(),
        });
    }
    let peer = Hello::decode(&buf[..got.len]).map_err(connect_error)?;
    let checked = if peer.kind != want {
        Err("an unexpected setup message".to_string())
    } else if got.fds.len() != 2 {
        Err("the peer sent no ring".to_string())
    } else {
        peer.check()
    };
    if let Err(why) = checked {
        if want == M_HELLO {
            let mut r = vec![M_REJECT];
            r.extend_from_slice(why.as_bytes());
            let _ = sock::send(raw, &r, &[]);
        }
        return Err(connect_error(why));
    }
    let mut fds = got.fds;
    let wake = fds.pop().expect("two");
    let ring = fds.pop().expect("two");
    sock::check_eventfd(&wake).map_err(|e| connect_error(format!("setup: {e}")))?;
    Ok(Heard {
        fd,
        peer,
        ring,
        wake,
    })
}

/// What a connect says when the listener closes the connection before accepting it.
fn closed_by_listener() -> DriverError {
    connect_error(
        "the listener closed the connection before accepting it; a barewire listener does so \
         when it closes, to a process over its connection limits or banned for protection \
         violations, and to a setup that newer ones pushed out (see its counters)",
    )
}

/// This side's half of the setup: its ring, queue pair number and core wake-up descriptor.
struct Ours {
    ring: Ring,
    num: u32,
    wake: Rc<OwnedFd>,
}

impl Ours {
    fn new() -> Result<Ours, DriverError> {
        Ok(Ours {
            wake: core_wake()?,
            ring: Ring::create(RING)?,
            num: next_qp_num(),
        })
    }

    /// Sends this side's setup message of `kind` with `private` data, the ring and the wake-up
    /// descriptor.
    fn send(&self, fd: &OwnedFd, kind: u8, private: &[u8]) -> Result<(), DriverError> {
        let ring_fd = self
            .ring
            .file()
            .expect("our own")
            .descriptor(true)
            .map_err(|e| connect_error(e.to_string()))?;
        let msg = Hello::ours(kind, self.num, private).encode();
        sock::send(fd.as_raw_fd(), &msg, &[ring_fd, self.wake.as_raw_fd()]).map_err(|e| {
            if kind == M_HELLO && matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) {
                closed_by_listener()
            } else {
                connect_error(format!("sending setup: {e}"))
            }
        })
    }
}

/// Builds the queue pair from both halves of the setup (`admission`: an accepted one's place
/// among its listener's connections). No waiting: a listener's accept stays cancel-safe.
fn finish(
    heard: Heard,
    ours: Ours,
    admission: Option<Admission>,
    pd: &Pd,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    timeout: Duration,
) -> Result<(QueuePair, Vec<u8>), DriverError> {
    let Heard {
        fd,
        peer,
        ring: peer_ring,
        wake: peer_wake,
    } = heard;
    let Ours { ring, num, .. } = ours;
    let raw = fd.as_raw_fd();
    let cap = peer.ring_cap as usize;
    let map = Mapping::new(&peer_ring, 0, (ring::HEADER + cap) as u64, 0, true)
        .map_err(|e| connect_error(format!("mapping the peer's ring: {e}")))?;
    let inner = Rc::new(QpInner {
        num,
        pd: Pd {
            pd: pd.pd.clone_handle(),
            dev: pd.dev.clone(),
        },
        scq: scq.clone(),
        rcq: rcq.clone(),
        sock: fd,
        peer_wake,
        state: Cell::new(QpState::Rts),
        tx: RefCell::new(Tx {
            w: Writer::new(Ring::from_mapping(map, cap)),
            queue: VecDeque::new(),
            held: VecDeque::new(),
            copying: false,
        }),
        holding: Cell::new(false),
        rx: RefCell::new(Rx {
            r: Reader::new(ring),
            recvs: VecDeque::new(),
            placed: 0,
            error: None,
        }),
        grants: PeerKeys::new(),
        invalidated: RefCell::new(Vec::new()),
        task: RefCell::new(None),
        timeout,
        asked: Cell::new(0),
        popped: Cell::new(0),
        stall: Cell::new(None),
        admission: Cell::new(admission),
    });
    let task = spawn_local(serve_control(Rc::downgrade(&inner), raw));
    *inner.task.borrow_mut() = Some(task);
    CORE.with(|c| c.qps.borrow_mut().push(Rc::downgrade(&inner)));
    Ok((QueuePair::new(Qp(inner)), peer.private))
}

/// What trying `addr` over shm found.
pub(crate) enum Reach {
    /// A socket connected to the shm listener of `addr`'s port.
    Listener(OwnedFd),
    /// No shm listener can be there, and why.
    NotHere(String),
}

/// Looks for the shm listener of `addr`'s port on this host (in this network namespace).
pub(crate) async fn reach(addr: SocketAddr, deadline: Instant) -> Result<Reach, DriverError> {
    if !is_local(addr) {
        return Ok(Reach::NotHere(format!(
            "{} is not an address of this host",
            addr.ip()
        )));
    }
    // A listener on this very address, else one on every address of the port.
    let wildcard = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
    // Any local user can bind an abstract name: one held by another user's process is not
    // this user's listener (and setup with it would be refused), so it is passed over, and
    // `auto` goes on to the software provider rather than fail.
    let me = sock::uid();
    let mut foreign = None;
    for name in [sock::name(addr), sock::name(wildcard)] {
        let fd = sock::seqpacket().map_err(|e| connect_error(format!("socket: {e}")))?;
        loop {
            match sock::connect(&fd, &name) {
                Ok(()) => match sock::peer_cred(&fd) {
                    Ok(c) if c.uid != me => {
                        foreign = Some(format!(
                            "the shm name of {name} is held by a process of user {}, not {me}",
                            c.uid
                        ));
                        break;
                    }
                    _ => return Ok(Reach::Listener(fd)),
                },
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline =>
                {
                    barewire_engine::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(connect_error(format!(
                        "the shm listener of {name} had no room for another connection \
                         (its backlog was full) for the whole setup timeout \
                         (ConnectOptions::timeout): is it stopped, overloaded, or slow to accept?"
                    )))
                }
                Err(e) => return Err(connect_error(format!("connecting to {name}: {e}"))),
            }
        }
    }
    Ok(Reach::NotHere(foreign.unwrap_or_else(|| {
        format!("no shm listener on {addr} (connection refused)")
    })))
}

/// Sets up a queue pair over a socket [`reach`] connected.
pub(crate) async fn connect(
    fd: OwnedFd,
    pd: &Pd,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    private: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<(QueuePair, Vec<u8>), DriverError> {
    if private.len() > MAX_PRIVATE {
        return Err(connect_error(format!(
            "{} bytes of private data (at most {MAX_PRIVATE})",
            private.len()
        )));
    }
    let ours = Ours::new()?;
    ours.send(&fd, M_HELLO, private)?;
    let heard = hear(fd, M_ACCEPT, deadline).await?;
    finish(heard, ours, None, pd, scq, rcq, timeout)
}

/// True if `addr`'s IP is one of this host's (in this network namespace).
fn is_local(addr: SocketAddr) -> bool {
    let ip = addr.ip().to_canonical();
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}

/// Ports [`Listener::name_a_port`] tries for a listener on port 0.
const NAME_TRIES: usize = 8;

/// Accepts shm queue pairs on a TCP port's abstract name. The TCP port itself is held, so the
/// number is this listener's in the namespace, and `port 0` picks a free one.
///
/// Any local process can connect to an abstract name, so a listener defends itself as the
/// software provider's does, under the same [`ListenerLimits`](crate::ListenerLimits), with
/// the peer's process (`SO_PEERCRED`) as its source. Each connection is heard by a task of its
/// own, with the setup's deadline. Setups in progress are capped in all and per process; a new
/// connection over a cap evicts the oldest it competes with, so a process that floods the name
/// pushes out only its own stale connections and holds a bounded number of this process's
/// descriptors. A peer whose setup fails (malformed, another user, another host, gone before
/// the answer, a ring that cannot be mapped) is counted and dropped: `accept` goes on to the
/// next, and fails only for this side's own errors. As many complete setups as may be in
/// progress wait for `accept`; beyond that, new ones are dropped. Accepted connections open at
/// once are capped in all and per process; a connection beyond them is closed at once (one
/// that failed no longer counts, even while the application still holds its queue pair). A
/// peer that asks for a key it may not use ends its connection, and a process whose peers do
/// that past the violation budget is refused for the ban.
pub(crate) struct Listener {
    /// The shm name's socket; `None` under `auto` when another user's process holds the name
    /// (see [`Listener::bind`]): every peer then comes through the software provider.
    fd: Option<OwnedFd>,
    /// Peers heard by their setup tasks, waiting for an accept to finish them.
    heard: RefCell<Option<barewire_engine::sync::mpsc::Receiver<(libc::pid_t, Heard)>>>,
    heard_tx: barewire_engine::sync::mpsc::Sender<(libc::pid_t, Heard)>,
    /// Setups in progress, and what was refused.
    intake: Rc<Intake>,
    port_of: Port,
    port: u16,
    private: Vec<u8>,
    timeout: Duration,
}

/// A listener's setups in progress (by the peer's process) and its counts, shared with the
/// tasks that hear peers.
struct Intake {
    setups: barewire_engine::net::Handshakes<libc::pid_t>,
    open: barewire_engine::net::Connections<libc::pid_t>,
    /// Processes whose peers asked for keys they may not use, and their bans.
    strikes: barewire_engine::net::Strikes<libc::pid_t>,
    /// Complete setups that may wait for `accept`.
    max_waiting: usize,
    counters: Cell<barewire_rdma_types::ListenerCounters>,
}

impl Intake {
    fn count(&self, f: impl FnOnce(&mut barewire_rdma_types::ListenerCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Every connection still in its setup is dropped with the listener.
        self.intake.setups.cancel_all();
    }
}

impl crate::backend::ListenerOps for Listener {
    fn port(&self) -> u16 {
        self.port
    }

    fn counters(&self) -> barewire_rdma_types::ListenerCounters {
        let shm = self.intake.counters.get();
        match &self.port_of {
            Port::Reserved(_) => shm,
            Port::Soft(l) => shm + l.counters(),
        }
    }

    fn accept<'a>(
        &'a self,
        pd: &'a dyn crate::backend::PdOps,
        scq: &'a crate::api::CompletionQueue,
        rcq: &'a crate::api::CompletionQueue,
        recvs: Vec<RecvWr>,
    ) -> crate::backend::LocalBoxFuture<'a, crate::backend::Connected> {
        Box::pin(async move {
            let pd = crate::backend::ours::<Pd>(pd.as_any())?;
            if scq.device().is_some() || rcq.device().is_some() {
                return Err(crate::backend::mixed());
            }
            // Peers are heard by tasks of their own (`heard`); what they heard is finished here
            // without waiting, so a dropped accept loses no connection.
            let Some(taken) = self.heard.borrow_mut().take() else {
                return Err(connect_error("accept from two tasks at once"));
            };
            // Puts the queue back however this future ends.
            struct Back<'a, T>(&'a RefCell<Option<T>>, Option<T>);
            impl<T> Drop for Back<'_, T> {
                fn drop(&mut self) {
                    *self.0.borrow_mut() = self.1.take();
                }
            }
            let mut back = Back(&self.heard, Some(taken));
            let queue = back.1.as_mut().expect("held until dropped");
            let (qp, data) = loop {
                let heard = loop {
                    if let Some(h) = queue.try_recv() {
                        break h;
                    }
                    let backoff = match self.fd.as_ref().map(sock::accept) {
                        Some(Ok(Some(c))) => {
                            self.take_in(c);
                            continue;
                        }
                        Some(Ok(None)) | None => false,
                        // Out of descriptors or memory for a moment: wait rather than spin (the
                        // connection stays in the backlog) and rather than fail the accept.
                        Some(Err(e)) if barewire_engine::net::accept_error_is_transient(&e) => true,
                        Some(Err(e)) => return Err(connect_error(format!("accept: {e}"))),
                    };
                    // Whichever comes first; each is cancel-safe (a heard peer waits in the
                    // queue, a new one in the backlog, and the provider's accept keeps what it
                    // accepted).
                    let fd = self.fd.as_ref().map(|f| f.as_raw_fd());
                    let more = async move {
                        match fd {
                            None => std::future::pending().await,
                            Some(_) if backoff => {
                                barewire_engine::time::sleep(Duration::from_millis(10)).await
                            }
                            Some(fd) => drop(poll_readable_relaxed(fd).await),
                        }
                    };
                    let shm = crate::backend::first(queue.recv(), more);
                    let shm = match &self.port_of {
                        Port::Reserved(_) => shm.await,
                        Port::Soft(l) => {
                            let soft = crate::soft::accept(l, &pd.pd, scq, rcq, &recvs);
                            match crate::backend::first(soft, shm).await {
                                Ok(r) => return r,
                                Err(shm) => shm,
                            }
                        }
                    };
                    if let Ok(Some(h)) = shm {
                        break h;
                    }
                };
                // A peer that hung up meanwhile, or whose ring cannot be mapped, is its own
                // failure: counted, and the next peer is taken.
                let ours = Ours::new()?;
                let (pid, heard) = heard;
                let admitted = Some(Admission {
                    open: self.intake.open.admit(pid),
                    intake: Rc::downgrade(&self.intake),
                });
                let (scq, rcq, timeout) = (scq.queue(), rcq.queue(), self.timeout);
                let answered = ours
                    .send(&heard.fd, M_ACCEPT, &self.private)
                    .and_then(|()| finish(heard, ours, admitted, pd, scq, rcq, timeout));
                match answered {
                    Ok(r) => break r,
                    Err(_) => self.intake.count(|n| n.bad_requests += 1),
                }
            };
            drop(back);
            for wr in recvs {
                qp.post_recv(wr)?;
            }
            Ok((qp, data))
        })
    }
}

/// What holds the listener's TCP port.
enum Port {
    /// A plain TCP listener, never accepted on: the number is this listener's.
    Reserved(#[allow(dead_code)] std::net::TcpListener),
    /// The software provider's listener (`auto`): peers that do not reach the shm name (other
    /// hosts, other namespaces, explicit `soft`) connect there.
    Soft(Box<barewire_soft_rdma::provider::Listener>),
}

impl Listener {
    /// Listens on `addr`: on the shm name of its port, and (`auto`) through the software
    /// provider on the port itself.
    ///
    /// Any local user can bind an abstract name. A name that another user's process holds is
    /// not this listener's to take: under `auto` the listener then serves every peer through
    /// the software provider (same-host peers pass such a name over too, see [`reach`]), and
    /// says so; an explicit shm listener fails, naming the user.
    pub(crate) fn bind(
        addr: SocketAddr,
        opts: &crate::api::ConnectOptions,
        auto: bool,
    ) -> Result<Listener, DriverError> {
        let (private, timeout, limits) = (&opts.private_data, opts.timeout, opts.limits);
        if private.len() > MAX_PRIVATE {
            return Err(connect_error(format!(
                "{} bytes of private data (at most {MAX_PRIVATE})",
                private.len()
            )));
        }
        let reserve = |addr: SocketAddr| -> Result<(Port, SocketAddr), DriverError> {
            if auto {
                let l =
                    barewire_soft_rdma::provider::Listener::bind(addr, crate::soft::options(opts))
                        .map_err(|e| DriverError::Connect(e.to_string()))?;
                let bound = l.local_addr().map_err(|e| connect_error(e.to_string()))?;
                Ok((Port::Soft(Box::new(l)), bound))
            } else {
                let tcp = std::net::TcpListener::bind(addr)
                    .map_err(|e| connect_error(format!("reserving its TCP port: {e}")))?;
                let bound = tcp.local_addr().map_err(|e| connect_error(e.to_string()))?;
                Ok((Port::Reserved(tcp), bound))
            }
        };
        let (port_of, bound, fd) = Self::name_a_port(addr, reserve)?;
        let port = bound.port();
        let (heard_tx, heard) = barewire_engine::sync::mpsc::unbounded();
        Ok(Listener {
            fd,
            heard: RefCell::new(Some(heard)),
            heard_tx,
            intake: Rc::new(Intake {
                setups: barewire_engine::net::Handshakes::new(
                    limits.max_setups,
                    limits.max_setups_per_source,
                ),
                open: barewire_engine::net::Connections::new(
                    limits.max_connections,
                    limits.max_connections_per_source,
                ),
                strikes: barewire_engine::net::Strikes::new(
                    limits.violation_budget,
                    limits.violation_window,
                    limits.ban,
                ),
                max_waiting: limits.max_setups.max(1),
                counters: Cell::new(Default::default()),
            }),
            port_of,
            port,
            private: private.to_vec(),
            timeout,
        })
    }

    /// Reserves a TCP port for `addr` (`reserve`) and binds the shm name of the port it got.
    ///
    /// A port the kernel picked (`addr`'s port is 0) whose name is taken is set aside and
    /// another is picked, up to [`NAME_TRIES`] times: a listener of this user that is closing
    /// gives its port back before its name (a process's descriptors close in order, and a name
    /// an io_uring request still refers to lives until the request is cancelled), so the next
    /// port 0 can be that one; and any local user can hold any name. A port the caller named is
    /// not changed. Where the name stays taken, another user's name sends an `auto` listener
    /// (`Port::Soft`) to serve local peers through the software provider; otherwise the
    /// holder is an error.
    fn name_a_port(
        addr: SocketAddr,
        mut reserve: impl FnMut(SocketAddr) -> Result<(Port, SocketAddr), DriverError>,
    ) -> Result<(Port, SocketAddr, Option<OwnedFd>), DriverError> {
        // Ports given up on stay reserved until the end, so that the kernel picks others.
        let mut given_up = Vec::new();
        loop {
            let (port_of, bound) = reserve(addr)?;
            let name = sock::name(bound);
            let fd = sock::seqpacket().map_err(|e| connect_error(format!("socket: {e}")))?;
            let Err(e) = sock::listen(&fd, &name) else {
                return Ok((port_of, bound, Some(fd)));
            };
            if addr.port() == 0 && given_up.len() + 1 < NAME_TRIES {
                given_up.push(port_of);
                continue;
            }
            let me = sock::uid();
            match sock::holder_uid(&name) {
                Some(uid) if uid != me && matches!(port_of, Port::Soft(_)) => {
                    eprintln!(
                        "barewire shm: the shm name {name} is held by a process of user {uid}; \
                         this listener serves peers on this host through the software provider"
                    );
                    return Ok((port_of, bound, None));
                }
                Some(uid) if uid != me => {
                    return Err(connect_error(format!(
                        "listening on the shm name {name}: a process of user {uid} holds it"
                    )))
                }
                _ => {
                    return Err(connect_error(format!(
                        "listening on the shm name {name}: {e} (another shm listener has it)"
                    )))
                }
            }
        }
    }

    /// Starts hearing a new local connection, in a task of its own, under the listener's caps.
    fn take_in(&self, c: OwnedFd) {
        let intake = &self.intake;
        intake.count(|n| n.connections += 1);
        // The peer's process is its source (one whose credentials cannot be read counts as 0).
        let pid = sock::peer_cred(&c).map_or(0, |cred| cred.pid);
        if intake.strikes.banned(&pid, Instant::now()) {
            intake.count(|n| n.banned += 1);
            return; // closed at once
        }
        if intake.open.full(&pid) {
            intake.count(|n| n.over_limit += 1);
            return;
        }
        let evicted = intake.setups.make_room(&pid);
        intake.count(|n| n.evicted += evicted as u64);
        let id = intake.setups.next_id();
        let (tx, i) = (self.heard_tx.clone(), intake.clone());
        let deadline = Instant::now() + self.timeout;
        let task = spawn_local(async move {
            match hear(c, M_HELLO, deadline).await {
                Ok(h) if tx.len() < i.max_waiting => {
                    let _ = tx.try_send((pid, h));
                }
                Ok(_) => i.count(|n| n.overflowed += 1),
                Err(_) if Instant::now() >= deadline => i.count(|n| n.timed_out += 1),
                Err(_) => i.count(|n| n.bad_requests += 1),
            }
            i.setups.done(id);
        });
        intake.setups.push(id, pid, task);
    }
}

// ---- the stall watch ------------------------------------------------------------------------

/// How often the stall watch looks while some queue pair waits on its peer.
const STALL_TICK: Duration = Duration::from_millis(50);

/// Loop passes between two looks at the clock while the stall watch is on (a busy core
/// reads the clock only this often; a pending timer would make it read it every pass).
const PASSES_PER_CLOCK: u32 = 64;

/// Turns on this core's stall watch: while it is on, every [`STALL_TICK`] (on a busy core, from
/// the poller; on one about to sleep, from a timer, since a stopped peer never wakes it) each
/// queue pair that waits on its peer is looked at, and those whose peer has shown no sign of
/// life for their timeout fail ([`QpInner::watch`]). It turns itself off once nothing waits.
/// Costs a flag's store.
#[inline]
fn watch_for_stalls() {
    CORE.with(|c| c.watching.set(true));
}

/// One look of the stall watch at every queue pair of this core.
fn look_for_stalls(now: Instant) {
    let qps: Vec<_> = CORE.with(|c| c.qps.borrow().iter().filter_map(Weak::upgrade).collect());
    let mut any = false;
    for q in qps {
        any |= q.watch(now);
    }
    if !any {
        CORE.with(|c| c.watching.set(false));
    }
}

impl QpInner {
    /// One look of the stall watch: true while this queue pair waits on its peer.
    ///
    /// It waits on the peer while it holds a completion or has a request queued (not a copy
    /// part way through), and either the peer has not looked at everything published in its
    /// ring or a key asked of it is unanswered. A peer that has looked at the records and
    /// holds them for want of a receive is running: its Sends wait for it, as verbs' do for a
    /// responder with no receive (RNR, retried without limit). One whose head, look or
    /// answers do not move for `timeout` is stopped, hung, or cut off: the request at the
    /// front fails with `RETRY_EXC_ERR`, as a verbs transport that gives up, and the rest
    /// flush.
    fn watch(&self, now: Instant) -> bool {
        if self.state.get() != QpState::Rts {
            return false;
        }
        let mark = {
            let mut tx = self.tx.borrow_mut();
            let queued = !tx.queue.is_empty() && !tx.copying;
            let ack = tx.w.acknowledged();
            let owed = (self.holding.get() || queued)
                && (tx.w.tail() > ack || (queued && self.asked.get() > 0));
            owed.then(|| ack.wrapping_add(self.popped.get()))
        };
        let Some(mark) = mark else {
            self.stall.set(None);
            return false;
        };
        match self.stall.get() {
            Some((m, since)) if m == mark => {
                if now.duration_since(since) >= self.timeout {
                    self.stalled();
                    return false;
                }
            }
            _ => self.stall.set(Some((mark, now))),
        }
        true
    }

    /// The peer stopped answering: the front request fails with `RETRY_EXC_ERR` (what the
    /// peer had taken completes first), the rest flush.
    #[cold]
    fn stalled(&self) {
        eprintln!(
            "barewire shm: queue pair {}: the peer made no progress for {:?}; disconnecting",
            self.num, self.timeout
        );
        self.settle_front(WcStatus::RetryExcErr);
        self.fail(WcStatus::RetryExcErr);
    }

    /// Completes what the peer has taken, then the first request still outstanding (held or
    /// queued) with `status`; the caller then fails the queue pair, flushing the rest.
    fn settle_front(&self, status: WcStatus) {
        self.release();
        let front = {
            let mut tx = self.tx.borrow_mut();
            match tx.held.pop_front() {
                Some((_, wc, _)) => {
                    // Signaled or not: a request that fails completes, as on verbs.
                    self.holding.set(!tx.held.is_empty());
                    Some((wc.wr_id, wc.opcode))
                }
                None => match tx.queue.pop_front() {
                    Some(Work::Op { wr, .. }) => Some((wr.wr_id, wr.op.opcode())),
                    _ => None,
                },
            }
        };
        if let Some((wr_id, opcode)) = front {
            self.complete(&self.scq, self.wc(wr_id, status, opcode, 0));
        }
    }
}

// ---- the per-core poller ----------------------------------------------------------------------

/// Delivers incoming records to posted receives and resumes send queues that waited for ring
/// room, on every pass; before the core sleeps, marks each inbound ring "reader asleep" so a
/// writer wakes the core through its eventfd.
struct ShmPoller {
    /// The one registered with the core's reactor, which drops it as the core shuts down: it
    /// then lets go of the core's state (the eventfd, its registration), which would otherwise
    /// stay until the thread's next runtime or its end. (Tests make unregistered ones.)
    registered: bool,
}

impl Drop for ShmPoller {
    fn drop(&mut self) {
        if !self.registered || !barewire_engine::in_runtime() {
            return;
        }
        let token = barewire_engine::core_token();
        let _ = CORE.try_with(|c| {
            if c.core.get() == token {
                c.reset();
                c.core.set(0);
            }
        });
    }
}

impl ShmPoller {
    /// Runs `f` on every live queue pair of this core, then forgets the ones that are gone or
    /// no longer in RTS, if it met any. Each is upgraded by its index with no borrow of the
    /// list held while `f` runs, so `f` may open or close queue pairs (an opened one is at the
    /// end, and met in this same walk). This runs on every pass and every look at memory: the
    /// walk touches no list but this core's own, and changes it only when one has gone.
    fn each(&mut self, mut f: impl FnMut(&Rc<QpInner>)) {
        let mut gone = false;
        for i in 0.. {
            let Some(q) = CORE.with(|c| c.qps.borrow().get(i).map(Weak::upgrade)) else {
                break;
            };
            match q {
                Some(q) if q.state.get() == QpState::Rts => f(&q),
                _ => gone = true,
            }
        }
        if gone {
            CORE.with(|c| {
                c.qps
                    .borrow_mut()
                    .retain(|w| w.upgrade().is_some_and(|q| q.state.get() == QpState::Rts))
            });
        }
    }
}

impl Poller for ShmPoller {
    /// While this core has a queue pair: its rings are memory the peer process stores into.
    fn watches_memory(&self) -> bool {
        CORE.with(|c| !c.qps.borrow().is_empty())
    }

    fn poll(&mut self) -> bool {
        let mut any = false;
        self.each(|q| {
            any |= q.deliver();
            let waiting = !q.tx.borrow().queue.is_empty();
            if waiting {
                any |= q.progress();
            }
            if q.holding.get() {
                any |= q.release();
            }
        });
        CORE.with(|c| {
            if c.watching.get() {
                let n = c.passes.get().wrapping_add(1);
                c.passes.set(n);
                if n % PASSES_PER_CLOCK == 0 {
                    let now = Instant::now();
                    match c.next_look.get() {
                        Some(t) if now < t => {}
                        _ => {
                            c.next_look.set(Some(now + STALL_TICK));
                            look_for_stalls(now);
                        }
                    }
                }
            }
        });
        any
    }

    fn pure_poll(&mut self) -> bool {
        let mut any = false;
        self.each(|q| {
            any |= q.rx.borrow().r.has_data()
                || q.tx.borrow().copying
                || (q.holding.get() && q.releasable())
        });
        any
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        let mut ready = true;
        self.each(|q| {
            // A large copy part way through goes on at the next pass, with nothing to wake us.
            if q.tx.borrow().copying || !q.rx.borrow().r.sleep() {
                ready = false;
            }
            // Completions held for the peer to take their records: it wakes us when it does,
            // if one of them is signaled (taking an unsignaled Send completes nothing, and the
            // next signaled request asks for the wake-up in its turn).
            if q.holding.get() {
                {
                    let tx = q.tx.borrow();
                    if tx.held.iter().any(|&(.., signaled)| signaled) {
                        tx.w.wake_when_consumed();
                    }
                }
                if q.releasable() {
                    ready = false;
                }
            }
        });
        CORE.with(|c| {
            if c.watching.get() && !c.watch_timer.replace(true) {
                // A stopped peer never wakes this core: a timer does, for the watch's next look.
                spawn_local(async {
                    barewire_engine::time::sleep(STALL_TICK).await;
                    CORE.with(|c| c.watch_timer.set(false));
                    look_for_stalls(Instant::now());
                });
                ready = false; // let the task arm its timer before the core sleeps
            }
            let idle = c
                .waiter
                .borrow()
                .as_ref()
                .is_none_or(JoinHandle::is_finished);
            let wake = c.wake.borrow().clone();
            if let Some(wake) = &wake {
                // One registration for the core's life. The eventfd is never read: each poke
                // signals it anew, read or not (see `WakeSource`).
                if barewire_engine::WakeSource::arm_in(&mut c.irq.borrow_mut(), wake.as_raw_fd()) {
                    return;
                }
            }
            if let (true, Some(wake)) = (idle, wake) {
                *c.waiter.borrow_mut() = Some(spawn_local(async move {
                    let _ = poll_readable(wake.as_raw_fd()).await;
                    sock::drain(wake.as_raw_fd());
                }));
                ready = false; // let the task submit its poll before the core sleeps
            }
        });
        if !ready {
            // The engine calls `exit_interrupt_mode` only after a `true`: a ring left marked
            // asleep would have its writer poke an awake core at every record.
            self.exit_interrupt_mode();
        }
        ready
    }

    fn exit_interrupt_mode(&mut self) {
        self.each(|q| q.rx.borrow().r.wake());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{DeviceOps, ListenerOps};
    use std::os::fd::FromRawFd;

    /// A pipe: its read end and its write end.
    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: a pipe of our own; both ends are owned below.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: the descriptors pipe just made, each owned once.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    /// A TCP port of `ip`'s, reserved as a plain shm listener reserves one; the listener stays
    /// open for the whole test (a port given back could be taken meanwhile).
    fn a_port_of(ip: impl Into<std::net::IpAddr>) -> (std::net::TcpListener, SocketAddr) {
        let tcp = std::net::TcpListener::bind(SocketAddr::new(ip.into(), 0)).unwrap();
        let bound = tcp.local_addr().unwrap();
        (tcp, bound)
    }

    /// With the shm name of `held`'s port taken: a listener on port 0, whose first pick the
    /// kernel "makes" that port, names another; one on that port itself fails with an error
    /// that contains `says`.
    fn a_held_name(held: &(std::net::TcpListener, SocketAddr), says: &str) {
        let (tcp, at) = held;
        let again = || Ok((Port::Reserved(tcp.try_clone().unwrap()), *at));
        let mut picks = 0;
        let (_port, bound, fd) = Listener::name_a_port(SocketAddr::new(at.ip(), 0), |addr| {
            picks += 1;
            if picks == 1 {
                return again();
            }
            let (tcp, bound) = a_port_of(addr.ip());
            Ok((Port::Reserved(tcp), bound))
        })
        .unwrap();
        assert_eq!(picks, 2);
        assert_ne!(bound.port(), at.port());
        assert!(fd.is_some());
        // Asked for by number, the port is not changed: an error that names the holder.
        let e = Listener::name_a_port(*at, |_| again())
            .err()
            .expect("a named port whose name is held")
            .to_string();
        assert!(e.contains(says), "{e}");
    }

    /// A port the kernel picks for a listener on port 0 whose shm name this user's process
    /// still holds (a listener closing) is set aside for another; a port the caller named is
    /// not, and says why.
    #[test]
    fn a_picked_port_whose_name_is_still_held_gives_way_to_another() {
        // A port whose name is held here, as by a listener whose port went first.
        let held = a_port_of([0, 0, 0, 0]);
        let squatter = sock::seqpacket().unwrap();
        sock::listen(&squatter, &sock::name(held.1)).unwrap();
        a_held_name(&held, "another shm listener has it");
        // The squatter still has its name.
        assert!(sock::listen(&sock::seqpacket().unwrap(), &sock::name(held.1)).is_err());
        drop(squatter);
    }

    /// As above, with the name held by another user's process (any local user can take any
    /// abstract name).
    #[test]
    fn a_picked_port_whose_name_another_user_holds_gives_way_to_another() {
        let held = a_port_of([127, 0, 0, 1]);
        let Some(squatter) = barewire_test_support::squat(held.1.port()) else {
            eprintln!("SKIP: changing users needs root");
            return;
        };
        a_held_name(&held, "a process of user 65534 holds it");
        drop(squatter);
    }

    #[test]
    fn a_wake_up_descriptor_must_be_an_eventfd() {
        assert!(sock::check_eventfd(&sock::eventfd().unwrap()).is_ok());
        let (r, _w) = pipe();
        let e = sock::check_eventfd(&r).unwrap_err().to_string();
        assert!(e.contains("not an eventfd"), "{e}");
    }

    /// What a hostile peer does once its setup is through.
    #[derive(Debug, Clone, Copy)]
    enum Hostile {
        /// Forges a record of an unknown kind at the ring's start and publishes it.
        UnknownRecord,
        /// Publishes a tail a ring and a record past the reader's head.
        TailPastTheRing,
        /// Forges a Send of 4 KiB and publishes only its header.
        SendPastWhatIsPublished,
        /// A well-formed Send of 300 bytes, longer than the receive posted for it.
        SendLongerThanTheReceive,
        /// A control message of a kind nobody defined.
        UnknownControl,
        /// A grant nobody asked for, carrying a pipe.
        UnaskedGrant,
        /// A control message carrying more descriptors than any message may.
        TooManyDescriptors,
        /// Asks for a key nobody registered (guessing).
        GuessedKey,
    }

    /// A device, a listener on a free loopback port, the port, and a protection domain.
    fn listening() -> (
        super::super::Device,
        Listener,
        u16,
        Box<dyn crate::backend::PdOps>,
    ) {
        let dev = super::super::Device::new();
        let opts = crate::api::ConnectOptions::default();
        let l = Listener::bind(([127, 0, 0, 1], 0).into(), &opts, false).unwrap();
        let port = l.port();
        let pd = dev.alloc_pd().unwrap();
        (dev, l, port, pd)
    }

    /// Sets up over the listener on `port` by hand, as barewire's peer does: what the listener
    /// answered, and this side's half.
    async fn set_up(port: u16, deadline: Instant) -> (Heard, Ours) {
        let fd = sock::seqpacket().unwrap();
        sock::connect(&fd, &sock::name(([127, 0, 0, 1], port).into())).unwrap();
        let ours = Ours::new().unwrap();
        ours.send(&fd, M_HELLO, b"").unwrap();
        (hear(fd, M_ACCEPT, deadline).await.unwrap(), ours)
    }

    /// A queue pair the listener accepted from a peer set up by hand ([`set_up`]), with the
    /// peer's halves of the setup, and what the pair needs alive.
    struct Accepted {
        qp: QueuePair,
        heard: Heard,
        ours: Ours,
        pd: Box<dyn crate::backend::PdOps>,
        _cqs: (crate::api::CompletionQueue, crate::api::CompletionQueue),
        _listener: (super::super::Device, Listener),
    }

    async fn accepted() -> Accepted {
        let (dev, l, port, pd) = listening();
        let peer = spawn_local(set_up(port, Instant::now() + Duration::from_secs(5)));
        let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
        let (qp, _) = l.accept(&*pd, &s, &r, Vec::new()).await.unwrap();
        let (heard, ours) = peer.await.unwrap();
        Accepted {
            qp,
            heard,
            ours,
            pd,
            _cqs: (s, r),
            _listener: (dev, l),
        }
    }

    /// A core that may not sleep (a Send waits in a ring for a receive) leaves none of its
    /// rings marked asleep: the engine calls `exit_interrupt_mode` only after a `true`, and a
    /// writer that saw the mark would wake an awake core at every record.
    #[test]
    fn a_core_that_may_not_sleep_leaves_no_ring_marked_asleep() {
        barewire_test_support::rt().block_on(async {
            let a = accepted().await;
            let cap = a.heard.peer.ring_cap as usize;
            let map = Mapping::new(&a.heard.ring, 0, (ring::HEADER + cap) as u64, 0, true);
            let map = map.unwrap();
            let mut w = Writer::new(Ring::from_mapping(map, cap));
            // SAFETY: `push` hands over the record's payload area of 8 bytes.
            let fill = |p| unsafe { std::ptr::write_bytes(p, 0x55, 8) };
            assert!(w.push(ring::SEND, ring::LAST, 8, 8, 0, fill));
            let mut poller = ShmPoller { registered: false };
            assert!(!poller.try_enter_interrupt_mode(), "a record waits");
            assert!(!w.reader_asleep(), "the ring is left marked asleep");
            drop(a);
        });
    }

    /// A core about to sleep asks its peer for a wake-up when the peer takes its records only
    /// if a completion waits on that: taking an unsignaled Send completes nothing, and an idle
    /// peer's wake-up was one poke slower for it.
    #[test]
    fn only_a_signaled_completion_held_for_the_peer_asks_it_for_a_wake_up() {
        barewire_test_support::rt().block_on(async {
            let Accepted { qp, ours, pd, .. } = accepted().await;
            let reader = Reader::new(ours.ring);
            let mut mem = vec![0u8; 64];
            // SAFETY: `mem` outlives the region (both live to the end of this block).
            let mr = unsafe { pd.register(mem.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
            let send = |signaled| SendWr {
                wr_id: 1,
                op: SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                sges: Sge {
                    addr: mem.as_ptr() as u64,
                    len: 8,
                    lkey: mr.lkey(),
                }
                .into(),
                signaled,
                fence: false,
            };
            let mut poller = ShmPoller { registered: false };
            qp.post_send(send(false)).unwrap();
            poller.try_enter_interrupt_mode();
            assert!(
                !reader.writer_waits(),
                "an unsignaled Send asked for a wake-up"
            );
            qp.post_send(send(true)).unwrap();
            poller.try_enter_interrupt_mode();
            assert!(reader.writer_waits(), "a signaled Send did not ask for one");
            drop((qp, mr));
        });
    }

    /// A core's shm state goes with the core: once its runtime has ended, the thread holds no
    /// wake-up eventfd, reactor registration or queue pair of it (they stayed until the
    /// thread's next runtime before).
    #[test]
    fn a_core_that_ends_lets_go_of_its_wake_up_eventfd() {
        std::thread::spawn(|| {
            let wake = barewire_test_support::rt().block_on(async {
                let a = accepted().await;
                // The core sleeps here, so its eventfd is armed with the reactor.
                barewire_engine::time::sleep(Duration::from_millis(20)).await;
                let wake = CORE.with(|c| {
                    assert!(
                        c.irq.borrow().is_some(),
                        "the core slept without its eventfd"
                    );
                    assert_eq!(c.qps.borrow().len(), 1);
                    Rc::downgrade(c.wake.borrow().as_ref().expect("made at setup"))
                });
                drop(a);
                wake
            });
            assert!(wake.upgrade().is_none(), "the eventfd outlived its core");
            CORE.with(|c| {
                assert!(
                    c.irq.borrow().is_none(),
                    "still registered with the ended core"
                );
                assert!(c.qps.borrow().is_empty());
                assert!(!c.registered.get());
            });
        })
        .join()
        .unwrap();
    }

    /// A peer that asks for one key a thousand times (on one connection), and then on ten
    /// connections that end, leaves the owner's list of where the key went as long as the
    /// queue pairs that still hold it: one entry per live queue pair.
    #[test]
    fn a_key_asked_for_over_and_over_is_noted_once_per_live_queue_pair() {
        barewire_test_support::rt().block_on(async {
            let (dev, l, port, pd) = listening();
            let mem = pd.allocate(4096, 64).unwrap().unwrap();
            // SAFETY: `mem` outlives the region (both live to the end of this block).
            let mr = unsafe { pd.register(mem.ptr(), 4096, Access::REMOTE_READ) }.unwrap();
            let stag = mr.rkey().0;
            let noted = || dev.grants.borrow().over.get(&stag).map_or(0, Vec::len);
            let ask = move |times: usize| async move {
                let deadline = Instant::now() + Duration::from_secs(5);
                let (heard, _ours) = set_up(port, deadline).await;
                let raw = heard.fd.as_raw_fd();
                let mut m = [M_ASK, 0, 0, 0, 0, 0, 0, 0];
                m[4..8].copy_from_slice(&stag.to_le_bytes());
                let mut buf = [0u8; 64];
                for _ in 0..times {
                    sock::send(raw, &m, &[]).unwrap();
                    let got = sock::recv_by(raw, &mut buf, deadline).await.unwrap();
                    assert_eq!(buf[0], M_GRANT);
                    assert_eq!(got.fds.len(), 1);
                }
            };
            let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
            let asker = spawn_local(ask(1000));
            let (held, _) = l.accept(&*pd, &s, &r, Vec::new()).await.unwrap();
            asker.await.unwrap();
            assert_eq!(noted(), 1, "a thousand asks on one queue pair");
            for _ in 0..10 {
                let asker = spawn_local(ask(1));
                let (qp, _) = l.accept(&*pd, &s, &r, Vec::new()).await.unwrap();
                asker.await.unwrap();
                drop(qp);
            }
            assert_eq!(noted(), 2, "the last connection's, and the one still held");
            drop((held, mr));
            mem.release();
        });
    }

    /// Sets up over the listener on `port` as barewire's peer would, then does `what` through
    /// the ring it was handed (mapped writable, as every writer maps it) or its control socket,
    /// and wakes the listener's core. Returns whether the listener hung up on it in time.
    async fn hostile_peer(port: u16, what: Hostile) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        let (heard, _ours) = set_up(port, deadline).await;
        let cap = heard.peer.ring_cap as usize;
        let map = Mapping::new(&heard.ring, 0, (ring::HEADER + cap) as u64, 0, true).unwrap();
        let mut w = Writer::new(Ring::from_mapping(map, cap));
        let raw = heard.fd.as_raw_fd();
        match what {
            Hostile::UnknownRecord => {
                w.forge(0, 9, 0, 0, 0);
                w.publish(16);
            }
            Hostile::TailPastTheRing => w.publish(cap as u64 + 16),
            Hostile::SendPastWhatIsPublished => {
                w.forge(0, ring::SEND, ring::LAST, 4096, 0);
                w.publish(16);
            }
            Hostile::SendLongerThanTheReceive => {
                // SAFETY: `push` hands over the record's payload area of 300 bytes.
                let fill = |p| unsafe { std::ptr::write_bytes(p, 0x55, 300) };
                assert!(w.push(ring::SEND, ring::LAST, 300, 300, 0, fill));
            }
            Hostile::UnknownControl => sock::send(raw, &[99, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap(),
            Hostile::UnaskedGrant => {
                let (r, _w) = pipe();
                let mut m = [0u8; 36];
                m[0] = M_GRANT;
                m[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
                m[32] = G_READ | G_WRITE;
                sock::send(raw, &m, &[r.as_raw_fd()]).unwrap();
            }
            Hostile::TooManyDescriptors => {
                let e: Vec<OwnedFd> = (0..4).map(|_| sock::eventfd().unwrap()).collect();
                let mut fds: Vec<RawFd> = e.iter().map(|f| f.as_raw_fd()).collect();
                fds.push(fds[0]);
                sock::send_any(raw, &[M_ASK, 0, 0, 0, 1, 0, 0, 0], &fds).unwrap();
            }
            Hostile::GuessedKey => {
                sock::send(raw, &[M_ASK, 0, 0, 0, 0x78, 0x56, 0x34, 0x12], &[]).unwrap();
            }
        }
        sock::poke(heard.wake.as_raw_fd());
        let mut buf = [0u8; 64];
        loop {
            match sock::recv_by(raw, &mut buf, deadline).await {
                Ok(r) if r.len > 0 => continue,
                Ok(_) => return true,
                Err(e) => return e.kind() != std::io::ErrorKind::TimedOut,
            }
        }
    }

    /// A peer that breaks the protocol on a live connection (through the ring it writes or
    /// its control socket) ends that connection: the listener's posted receive completes with
    /// an error and the peer sees the hang-up, both within a bound; nothing around the receive
    /// changes; and the listener goes on accepting the next peer.
    #[test]
    fn a_hostile_peer_ends_only_its_own_connection_and_reaches_nothing() {
        use Hostile::*;
        barewire_test_support::rt().block_on(async {
            let (dev, l, port, pd) = listening();
            // A receive of 256 bytes between two guards of 64, all registered.
            let mut mem = vec![0xeeu8; 384];
            let base = mem.as_mut_ptr();
            // SAFETY: `mem` outlives the region (both live to the end of this block).
            let mr = unsafe { pd.register(base, 384, Access::LOCAL_WRITE) }.unwrap();
            for what in [
                UnknownRecord,
                TailPastTheRing,
                SendPastWhatIsPublished,
                SendLongerThanTheReceive,
                UnknownControl,
                UnaskedGrant,
                TooManyDescriptors,
                GuessedKey,
            ] {
                let peer = spawn_local(hostile_peer(port, what));
                let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
                let recv = RecvWr {
                    wr_id: 7,
                    sges: Sge {
                        addr: base as u64 + 64,
                        len: 256,
                        lkey: mr.lkey(),
                    }
                    .into(),
                };
                let (qp, _) = l.accept(&*pd, &s, &r, vec![recv]).await.unwrap();
                let wc = barewire_engine::time::timeout(Duration::from_secs(3), r.queue().next())
                    .await
                    .unwrap_or_else(|_| panic!("{what:?}: the receive never completed"));
                assert_eq!(wc.wr_id, 7, "{what:?}");
                assert_ne!(wc.status, WcStatus::Success, "{what:?}");
                assert_eq!(qp.state(), QpState::Error, "{what:?}");
                assert!(peer.await.unwrap(), "{what:?}: the listener never hung up");
                assert!(mem.iter().all(|&b| b == 0xee), "{what:?}: memory changed");
            }
            // The guess is the one protection violation among them.
            assert_eq!(l.counters().violations, 1);
            drop(mr);
        });
    }

    /// A client that connects, waits, and only then says hello: an accept dropped while it
    /// waits must not lose it (the next accept finishes it). Fails when accept waits for the
    /// hello itself.
    #[test]
    fn an_accept_dropped_mid_setup_loses_no_connection() {
        barewire_test_support::rt().block_on(async {
            let dev = super::super::Device::new();
            let l = Listener::bind(
                ([127, 0, 0, 1], 0).into(),
                &crate::api::ConnectOptions::default(),
                false,
            )
            .unwrap();
            let port = l.port();
            let client = spawn_local(async move {
                let fd = sock::seqpacket().unwrap();
                sock::connect(&fd, &sock::name(([127, 0, 0, 1], port).into())).unwrap();
                barewire_engine::time::sleep(Duration::from_millis(20)).await;
                let ours = Ours::new().unwrap();
                ours.send(&fd, M_HELLO, b"").unwrap();
                hear(fd, M_ACCEPT, Instant::now() + Duration::from_secs(5))
                    .await
                    .map(|h| h.peer.kind)
            });
            let pd = dev.alloc_pd().unwrap();
            let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
            let t0 = Instant::now();
            let (_qp, _) = loop {
                assert!(t0.elapsed() < Duration::from_secs(5), "never accepted");
                let accept = l.accept(&*pd, &s, &r, Vec::new());
                if let Ok(done) =
                    barewire_engine::time::timeout(Duration::from_millis(2), accept).await
                {
                    break done.unwrap();
                }
            };
            assert_eq!(client.await.unwrap().unwrap(), M_ACCEPT);
        });
    }
}
