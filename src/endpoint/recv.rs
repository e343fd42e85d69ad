//! The receive side every channel on a connection shares: the receive slots, the table of
//! channel halves an arrival is for, and the per-core poller that takes every receive
//! completion as the provider delivers it.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use barewire_drivers::{
    Access, Buffer, CompletionQueue, RecvWr, WcOpcode, WcStatus, WorkCompletion,
};

use super::{Inner, Retired, MAX_QUEUED_CONTROLS};
use crate::channel::{RxState, TxState};
use crate::control::{imm, Control, MAX as CONTROL_MAX};
use crate::error::{Error, Result};

/// A channel's half on this side, as the receive task sees it.
pub(crate) enum ChanRef {
    Tx(Weak<TxState>),
    Rx(Weak<RxState>),
}

/// Channel halves by id (ids are below 2048), looked up on every arrival.
#[derive(Default)]
pub(crate) struct ChanTable {
    by_id: Vec<Option<ChanRef>>,
}

impl ChanTable {
    pub(crate) fn insert(&mut self, id: u16, c: ChanRef) {
        let i = id as usize;
        if self.by_id.len() <= i {
            self.by_id.resize_with(i + 1, || None);
        }
        self.by_id[i] = Some(c);
    }

    pub(crate) fn remove(&mut self, id: &u16) {
        if let Some(c) = self.by_id.get_mut(*id as usize) {
            *c = None;
        }
    }

    fn get(&self, id: &u16) -> Option<&ChanRef> {
        self.by_id.get(*id as usize).and_then(Option::as_ref)
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &ChanRef> {
        self.by_id.iter().flatten()
    }
}

/// Receive slots, by work request id, and how many are posted.
#[derive(Default)]
pub(crate) struct RecvSide {
    pub(super) slots: RefCell<Vec<(Rc<Buffer>, usize)>>,
    pub(super) posted: Cell<usize>,
    /// Posted receives no channel counts on any more (their channels closed): the next
    /// `add_recvs` takes them over, or each is retired when it completes.
    surplus: Cell<usize>,
    /// Slots of retired receives, posted again by a later `add_recvs`.
    free_slots: RefCell<Vec<usize>>,
}

impl RecvSide {
    /// One posted receive has completed.
    fn taken(&self) {
        self.posted.set(self.posted.get().saturating_sub(1));
    }
}

impl Inner {
    /// Adds and posts `n` receive slots of `CONTROL_MAX` bytes.
    ///
    /// Refused, with nothing posted, when the connection would then keep more receives posted
    /// than its receive completion queue holds: a burst that completed them all at once could
    /// overflow the queue, which stops the queue pair.
    pub(crate) fn add_recvs(&self, n: usize) -> Result<()> {
        // Receives closed channels left posted serve first.
        let taken_over = n.min(self.recv.surplus.get());
        let n = n - taken_over;
        let (posted, holds) = (self.recv.posted.get(), self.rcq.capacity());
        if posted + n > holds {
            return Err(Error::Invalid(format!(
                "this connection keeps {posted} receives posted and would need {n} more, beyond \
                 the {holds} its completion queue holds: open fewer or smaller announced channels \
                 on it, or raise BAREWIRE_QUEUE_DEPTH (the queues are 16 times it)"
            )));
        }
        self.recv.surplus.set(self.recv.surplus.get() - taken_over);
        // Then slots of retired receives, then new ones.
        let reused: Vec<usize> = {
            let mut free = self.recv.free_slots.borrow_mut();
            let keep = free.len().saturating_sub(n);
            free.split_off(keep)
        };
        let fresh = n - reused.len();
        if fresh > 0 {
            let buf = Buffer::new(&self.pd, fresh * CONTROL_MAX, 64, Access::LOCAL_WRITE)?;
            let mut slots = self.recv.slots.borrow_mut();
            for i in 0..fresh {
                slots.push((buf.clone(), i * CONTROL_MAX));
            }
        }
        let first_fresh = self.recv.slots.borrow().len() - fresh;
        for id in reused.into_iter().chain(first_fresh..first_fresh + fresh) {
            self.post_slot(id)?;
        }
        Ok(())
    }

    /// How many receive slots the connection has made (posted or not).
    #[cfg(test)]
    pub(crate) fn receive_slots(&self) -> usize {
        self.recv.slots.borrow().len()
    }

    /// A closed channel's `n` receives are no longer needed: the pool keeps them posted for
    /// the next channel, or retires them as they complete.
    pub(crate) fn give_back_recvs(&self, n: usize) {
        self.recv.surplus.set(self.recv.surplus.get() + n);
    }

    fn post_slot(&self, id: usize) -> Result<()> {
        let sge = {
            let slots = self.recv.slots.borrow();
            let (buf, off) = &slots[id];
            buf.sge(*off, CONTROL_MAX)
        };
        self.ops
            .qp()
            .post_recv(RecvWr {
                wr_id: id as u64,
                sges: sge.into(),
            })
            .map_err(Error::from)?;
        self.recv.posted.set(self.recv.posted.get() + 1);
        Ok(())
    }

    /// Handles every receive completion already in the queue; true if there was any.
    fn drain(&self) -> bool {
        let mut any = false;
        let mut wcs = [WorkCompletion::BLANK; 8];
        loop {
            let n = self.rcq.poll(&mut wcs);
            for wc in &wcs[..n] {
                self.recv.taken();
                self.handle(*wc);
                any = true;
            }
            if n < wcs.len() {
                return any;
            }
        }
    }

    fn handle(&self, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.fail_with(Error::PeerGone(format!(
                "the connection failed (receive completed with {:?})",
                wc.status
            )));
            return;
        }
        self.dispatch(&wc);
        if self.shared.borrow().error.is_none() {
            if self.recv.surplus.get() > 0 {
                // One fewer needed (a closed channel's): retired, its slot kept for later.
                self.recv.surplus.set(self.recv.surplus.get() - 1);
                self.recv.free_slots.borrow_mut().push(wc.wr_id as usize);
            } else if let Err(e) = self.post_slot(wc.wr_id as usize) {
                // A slot that cannot be posted again would leave the peer's next control
                // message without a receive: the connection is failed now, with the reason.
                self.fail_with(e);
            }
        }
    }

    /// One receive completion: a control message or a channel arrival.
    fn dispatch(&self, wc: &WorkCompletion) {
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                let (credit, id, len) = imm::parse(wc.imm.unwrap_or(0));
                let chan: Option<Rc<dyn Arrival>> =
                    self.shared.borrow().chans.get(&id).and_then(|c| match c {
                        ChanRef::Tx(t) => t.upgrade().map(|t| t as Rc<dyn Arrival>),
                        ChanRef::Rx(r) => r.upgrade().map(|r| r as Rc<dyn Arrival>),
                    });
                match chan {
                    Some(c) => c.arrived(credit, len),
                    None => self.last_word(id, credit, len),
                }
            }
            _ => {
                let mut bytes = vec![0u8; wc.byte_len as usize];
                {
                    let slots = self.recv.slots.borrow();
                    let (buf, off) = &slots[wc.wr_id as usize];
                    buf.read_at(*off, &mut bytes);
                }
                match Control::decode(&bytes) {
                    // A liveness probe: taking it was the answer.
                    Ok(Control::Ping) => {}
                    Ok(_) if self.shared.borrow().inbox.len() >= MAX_QUEUED_CONTROLS => {
                        // Each waits in memory, and each wait scans them all: a peer sending
                        // faster than anything here takes them is not served.
                        self.fail_with(Error::Malformed(format!(
                            "the peer sent more than {MAX_QUEUED_CONTROLS} control messages \
                             (regions, channel opens) that nothing here has taken: a flood, \
                             so the connection is closed"
                        )));
                        self.ops.qp().disconnect();
                    }
                    Ok(Control::Accept { id, .. } | Control::Refuse { id, .. })
                        if self.shared.borrow().chans.get(&id).is_none() =>
                    {
                        // The answer to an Open of ours that this side gave up on (it refused
                        // the peer's half first): nobody will take it, and it was the peer's
                        // last word for the id.
                        let mut s = self.shared.borrow_mut();
                        if let Some(i) = s.unanswered.iter().position(|&u| u == id) {
                            s.unanswered.swap_remove(i);
                            drop(s);
                            self.free_chan_id(id);
                        }
                    }
                    Ok(c) => {
                        let mut s = self.shared.borrow_mut();
                        let ord = s.opens_arrived;
                        if matches!(c, Control::Open { .. }) {
                            s.opens_arrived += 1;
                        }
                        s.inbox.push_back((ord, c));
                        drop(s);
                        self.wake_all();
                    }
                    Err(e) => {
                        // A peer that sends garbage loses the connection.
                        self.fail_with(e);
                        self.ops.qp().disconnect();
                    }
                }
            }
        }
    }

    /// A channel arrival for a half already dropped here: when it is the peer's last write into
    /// that half's buffer (a sender's close notice into our ring, or a receiver's final credit
    /// word, marked gone, into ours), the buffer can go.
    fn last_word(&self, id: u16, credit: bool, len: Option<usize>) {
        let mut retired = self.retired.borrow_mut();
        let Some(i) = retired.iter().position(|r| r.id == id) else {
            return;
        };
        let done = if credit {
            crate::channel::credit_word_final(&retired[i].buf)
        } else {
            len.is_none()
        };
        if done {
            let gone = retired.swap_remove(i);
            drop(retired);
            self.release(gone);
        }
    }

    /// A channel half was dropped here. With `peer_done` (the peer's last word for it has
    /// come) it is released now, otherwise its buffer stays registered until that word comes.
    pub(crate) fn half_dropped(&self, half: Retired, peer_done: bool) {
        if peer_done {
            self.release(half);
        } else {
            self.retired.borrow_mut().push(half);
        }
    }

    /// Both sides are done with a dropped half: its buffer goes, its receives go back to the
    /// pool, and (a sender's) its id may serve a new channel.
    fn release(&self, half: Retired) {
        self.give_back_recvs(half.recvs);
        self.free_chan_id(half.id);
    }
}

/// One endpoint's receive side, as the core's `RxPoller` sees it.
struct Watched {
    inner: Weak<Inner>,
    rcq: CompletionQueue,
    /// The receive slots, kept past the endpoint until every posted receive has flushed (the
    /// queue pair may write into them until then).
    recv: Rc<RecvSide>,
}

thread_local! {
    /// This core's endpoints, whose receive queues the `RxPoller` drains.
    static ENDPOINTS: RefCell<Vec<Watched>> = const { RefCell::new(Vec::new()) };
    static RX_POLLER: Cell<u64> = const { Cell::new(0) };
    /// An endpoint has gone since the last pass: look for the ones to forget.
    static REAP: Cell<bool> = const { Cell::new(false) };
}

impl Drop for Inner {
    fn drop(&mut self) {
        REAP.with(|r| r.set(true));
    }
}

/// The only consumer of every endpoint's receive queue on this core. It runs in each pass over
/// the sources right after the provider's poller (it is registered after it), so an arrival
/// reaches its channel or control inbox in the pass that delivered it, and no task is woken
/// just to look at the queue. Before the core sleeps it drains once more and keeps the core
/// awake if it found anything (a completion a task caused, a flush). Once an endpoint is gone,
/// its receive slots stay here until every posted receive has completed (flushed by the
/// disconnect), then go.
pub(super) struct RxPoller {
    /// The live endpoints of the current pass (kept to reuse its allocation).
    live: Vec<Rc<Inner>>,
}

impl RxPoller {
    pub(super) fn add(inner: &Rc<Inner>) {
        ENDPOINTS.with(|e| {
            e.borrow_mut().push(Watched {
                inner: Rc::downgrade(inner),
                rcq: inner.rcq.clone(),
                recv: inner.recv.clone(),
            })
        });
        let token = barewire_engine::core_token();
        if RX_POLLER.with(|t| t.replace(token)) != token {
            barewire_engine::register_poller(Box::new(RxPoller { live: Vec::new() }));
        }
    }
}

impl barewire_engine::Poller for RxPoller {
    fn poll(&mut self) -> bool {
        let mut any = false;
        ENDPOINTS.with(|e| {
            let mut reap = REAP.take();
            for w in e.borrow().iter().filter(|w| !w.rcq.is_empty()) {
                match w.inner.upgrade() {
                    Some(inner) => self.live.push(inner),
                    None => reap = true,
                }
            }
            if reap {
                // Endpoints that are gone: count their receives out as they flush, and
                // forget each once none is left.
                e.borrow_mut().retain(|w| {
                    if w.inner.strong_count() > 0 {
                        return true;
                    }
                    let mut wcs = [WorkCompletion::BLANK; 8];
                    loop {
                        let n = w.rcq.poll(&mut wcs);
                        for _ in 0..n {
                            w.recv.taken();
                        }
                        any |= n > 0;
                        if n < wcs.len() {
                            break;
                        }
                    }
                    w.recv.posted.get() > 0
                });
            }
        });
        // (Most passes find every queue empty: nothing to drain, nor a drain to set up.)
        if !self.live.is_empty() {
            for inner in self.live.drain(..) {
                any |= inner.drain();
            }
        }
        any
    }

    fn pure_poll(&mut self) -> bool {
        ENDPOINTS.with(|e| e.borrow().iter().any(|w| !w.rcq.is_empty()))
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        !self.poll()
    }
}

/// What a channel half does when the receive task sees a WRITE with immediate for it.
pub(crate) trait Arrival {
    fn arrived(&self, credit: bool, len: Option<usize>);
}
