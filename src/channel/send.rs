//! The sending half's state: staging slots, runs, and the per-core flush poller that posts
//! them.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use barewire_drivers::{Buffer, MappedRemote, Op, SendOp};

use super::ring::{extent, LEN_SET};
use super::Waiters;
use crate::control::imm;
use crate::endpoint::{Arrival, Inner};
use crate::error::Result;

/// The sender's half: what `send` fills, and what the core's flush poller posts.
///
/// `send` copies a message into the staging slot it will occupy in the receiver's ring and
/// returns; consecutive messages form a run, and the run goes out as one RDMA WRITE (on verbs
/// with one immediate announcing how many messages it carries) when the task that sent them
/// yields (the flush poller runs before the core polls the network again), when it reaches
/// `RUN_BYTES` (64 KiB) or the end of the ring, or on `flush`; a ring of at most two runs goes
/// in halves, each sent as soon as it is full (see `halves`). A burst of small messages
/// therefore costs one work request and one wire message per run, not per message; a lone
/// message goes out as soon as its sender waits for anything. (Runs need small slots: with a
/// `max_message` over ~500 bytes each message is its own WRITE.) Over shm, once the receiver's
/// ring is mapped, `send` stores the message straight into its slot instead, and a run is
/// published rather than posted (see `direct`).
pub(crate) struct TxState {
    pub(super) id: u16,
    pub(super) capacity: u64,
    pub(super) slot: usize,
    /// The word the receiver writes its consumed count into (with `GONE` once it is gone).
    pub(super) credit: Rc<Buffer>,
    pub(super) ring: Cell<Option<barewire_drivers::RegionDescriptor>>,
    pub(super) waker: Waiters,
    pub(super) link: Weak<Inner>,
    pub(super) staging: Rc<Buffer>,
    /// Messages written into staging so far.
    pub(super) seq: Cell<u64>,
    /// The slot message `seq` goes into (`seq % capacity`).
    pub(super) head: Cell<usize>,
    /// The first message not yet posted.
    pub(super) posted: Cell<u64>,
    /// The slot of message `posted`.
    pub(super) run_at: Cell<usize>,
    /// The next message count that is a multiple of the credit step: the run that reaches
    /// it is signaled.
    pub(super) signal_at: Cell<u64>,
    /// A run this many messages long is posted at once (see `run_limit`).
    pub(super) run_limit: u64,
    /// Credits come back every this many messages (see `credit_step`).
    pub(super) step: u64,
    /// Length of the last message written (the run's WRITE ends there).
    pub(super) last_len: Cell<usize>,
    /// On the core's flush list.
    pub(super) listed: Cell<bool>,
    pub(super) inflight: RefCell<VecDeque<Op>>,
    /// The receiver watches its ring: runs go as plain WRITEs (see `RxState::landed`).
    pub(super) polled: Cell<bool>,
    /// The receiver's ring mapped into this process (shm, once granted, and only for a
    /// receiver that watches): every message is then stored straight into its slot, with no
    /// staging copy and no work request, and published at once if no run is pending, or
    /// otherwise with its run (see `publish`).
    pub(super) direct: OnceCell<MappedRemote>,
    /// A message went straight into the ring since the receiver was last woken (if asleep).
    pub(super) wake_due: Cell<bool>,
    /// Messages below this count have room in the ring, as the credit word last read showed
    /// (see `Sender::try_place`).
    pub(super) room_until: Cell<u64>,
    /// A task watches the receiver while the ring stays full (see [`watch_receiver`]).
    pub(super) watching: Cell<bool>,
}

/// How long a sender waits on a full ring before it asks whether the receiver is alive, and
/// between two such asks.
pub(super) const PROBE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// While the ring of `st` stays full, asks every [`PROBE_AFTER`] whether its receiver is alive
/// (`Inner::probe`). A receiver that is slow, or whose user does not call `recv`, answers
/// from its core's receive poller and is waited for; one that is stopped, hung or cut off
/// fails the connection within the transport's timeout, and the waiting `send` returns
/// `PeerGone` (where memory is written with no work request the receiver could fail, as
/// over shm, a full ring would otherwise wait for a stopped receiver for ever).
pub(super) async fn watch_receiver(st: Weak<TxState>) {
    loop {
        barewire_engine::time::sleep(PROBE_AFTER).await;
        let Some(st) = st.upgrade() else { return };
        let inner = st.link.upgrade();
        let (Some(inner), Some(ring), true) = (inner, st.ring.get(), st.full()) else {
            st.watching.set(false);
            return;
        };
        if inner.failed.get() {
            st.watching.set(false);
            return;
        }
        drop(st);
        // A failure fails the connection, which wakes the sender with it.
        let _ = inner.probe(ring).await;
    }
}

impl TxState {
    /// True while the ring holds `capacity` messages the receiver has not said it consumed
    /// (false once it is gone: its final word has `GONE` set).
    pub(super) fn full(&self) -> bool {
        let seq = self.seq.get();
        seq - self.credit.load_u64(0).min(seq) >= self.capacity
    }

    /// Receives this half keeps in the connection's pool: one per credit notice the ring's
    /// capacity allows in flight, and a few.
    pub(super) fn recvs(&self) -> usize {
        (self.capacity / self.step) as usize + 4
    }

    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// The ring goes in halves (see `halves`): a run that ends at a half is sent at once.
    pub(super) fn halves(&self) -> bool {
        super::halves(self.capacity, self.slot)
    }

    /// Posts the pending run, if any, as one WRITE (with immediate unless the receiver watches
    /// its ring): transmitted at once, or (`batched`) with the provider's next pass together
    /// with whatever else is posted before then. Once the receiver's ring is mapped (`direct`)
    /// the run is already in it, and is published instead (see `publish`); a receiver that
    /// may sleep is woken either way.
    pub(super) fn post_run(&self) -> Result<()> {
        self.post_run_with(false)
    }

    pub(super) fn post_run_with(&self, batched: bool) -> Result<()> {
        let (from, to) = (self.posted.get(), self.seq.get());
        if let Some(m) = self.direct.get() {
            // Every message since the ring was mapped went straight into it.
            if from != to {
                if let Some(inner) = self.link.upgrade() {
                    if let Some(e) = &inner.shared.borrow().error {
                        return Err(e.clone());
                    }
                }
                self.publish(m, to - from);
            }
            // (`wake_due` is set whenever a run is pending: the message before the run's first
            // was published at once, which sets it, and it is cleared only here. A published
            // run wakes the receiver all the same.)
            if self.wake_due.replace(false) || from != to {
                m.wake_peer();
            }
            return Ok(());
        }
        if from == to {
            return Ok(());
        }
        let Some(inner) = self.link.upgrade() else {
            return Ok(());
        };
        if let Some(e) = &inner.shared.borrow().error {
            return Err(e.clone());
        }
        let ring = self.ring.get().expect("accepted channel");
        if self.polled.get() && self.direct.get().is_none() {
            // Once the receiver's ring is granted (the first run asked for it), every later
            // message goes straight into it (see `Sender::try_place`); this run is posted.
            if let Some(m) = inner.ops.qp().map_remote(&ring) {
                let _ = self.direct.set(m);
            }
        }
        let count = to - from;
        let at = self.run_at.get() * self.slot;
        let len = (count as usize - 1) * self.slot + extent(self.last_len.get());
        let op = if self.polled.get() {
            SendOp::Write {
                remote_addr: ring.addr + at as u64,
                rkey: ring.rkey,
            }
        } else {
            SendOp::WriteWithImm {
                remote_addr: ring.addr + at as u64,
                rkey: ring.rkey,
                imm: imm::data(self.id, Some(count as usize)),
            }
        };
        let sge = self.staging.sge(at, len);
        self.posted.set(to);
        self.run_at.set(self.head.get());
        // Runs go unsignaled (no completion to wait for, and on the software provider no
        // remote-completion round trip). An announced ring signals one whenever a credit step
        // has gone by, which surfaces a refused run as its own error. A watched ring signals
        // none: its credits already say the receiver took the runs, a refused run fails the
        // queue pair (and with it the connection's posted receives, so `send` and `flush`
        // see the failure), and over the software provider each signaled run cost the
        // receiver a system call for the zero-length Read that acknowledges it (1.06-1.08x
        // the throughput without, 1,024 x 64 B; bench/RESULTS.md, thirty-sixth session). (The
        // endpoint itself signals one in a long unsignaled run, so a verbs send queue never
        // fills with them whatever the capacity.)
        if !self.polled.get() && to >= self.signal_at.get() {
            let step = self.step;
            self.signal_at.set((to / step + 1) * step);
            let op = inner.ops.execute(op, sge, [self.staging.clone()], false);
            let mut inflight = self.inflight.borrow_mut();
            inflight.push_back(op);
            // Completed ones are dropped; a failure shows on the next `send` or `flush`.
            while inflight.len() > 4 {
                drop(inflight.pop_front());
            }
        } else {
            // At once: a run is already a batch, and the flush poller runs after the provider
            // has polled the network in this pass.
            inner
                .ops
                .post_unsignaled_with(op, sge, &self.staging, batched)
                .map_err(|e| inner.driver_error(e))?;
        }
        Ok(())
    }

    /// Publishes the `count` messages from `posted` on, which the sender stored straight into
    /// the receiver's ring with their length words unpublished (`LEN_SET` clear; see
    /// `Sender::try_place`): each length word gets `LEN_SET`, from the run's last message back
    /// to its first. The receiver looks at the run's first slot, so it finds the whole run in
    /// once it sees that one, and takes it behind this pass rather than chasing it. A run never
    /// wraps (it ends at the ring's end), so its slots are consecutive.
    fn publish(&self, m: &MappedRemote, count: u64) {
        let run = m.span(self.run_at.get() * self.slot, count as usize * self.slot);
        for k in (0..count as usize).rev() {
            let at = k * self.slot;
            run.store_u32_le(at, run.load_u32_le(at) | LEN_SET);
        }
        self.posted.set(self.seq.get());
        self.run_at.set(self.head.get());
    }
}

thread_local! {
    /// This core's senders with a run to post.
    static PENDING: RefCell<Vec<Weak<TxState>>> = const { RefCell::new(Vec::new()) };
    static FLUSHER: Cell<u64> = const { Cell::new(0) };
}

#[inline]
pub(super) fn schedule(st: &Rc<TxState>) {
    if st.listed.replace(true) {
        return;
    }
    PENDING.with(|p| p.borrow_mut().push(Rc::downgrade(st)));
    ensure_flusher();
}

/// Registers this core's flush poller. A `Node` does it when it is made, so the flusher comes
/// before the provider's poller in each pass: a run posted by it goes out before the core
/// spends a system call looking for input.
pub(crate) fn ensure_flusher() {
    let token = barewire_engine::core_token();
    if FLUSHER.with(|f| f.replace(token)) != token {
        barewire_engine::register_poller(Box::new(Flusher { batch: Vec::new() }));
    }
}

/// Posts every pending run on this core, once per loop pass, before the core sleeps.
struct Flusher {
    /// The list being flushed, swapped with `PENDING` so neither allocates once warm.
    batch: Vec<Weak<TxState>>,
}

impl Flusher {
    pub(super) fn flush_all(&mut self) -> bool {
        PENDING.with(|p| std::mem::swap(&mut *p.borrow_mut(), &mut self.batch));
        let any = !self.batch.is_empty();
        for st in self.batch.drain(..).filter_map(|w| w.upgrade()) {
            st.listed.set(false);
            // An error here is the connection's; the sender sees it on its next call.
            let _ = st.post_run();
        }
        any
    }
}

impl barewire_engine::Poller for Flusher {
    fn poll(&mut self) -> bool {
        self.flush_all()
    }

    fn pure_poll(&mut self) -> bool {
        PENDING.with(|p| !p.borrow().is_empty())
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        !self.flush_all()
    }
}

impl Arrival for TxState {
    fn arrived(&self, _credit: bool, _len: Option<usize>) {
        self.wake();
    }
}
