//! This core's shared shm state (its wake-up eventfd, its queue pairs), the poller that
//! delivers and resumes their work on every pass, and the stall watch.

use super::*;

/// This core's wake-up eventfd, its waiter, and its queue pairs.
pub(super) struct CoreShm {
    core: Cell<u64>,
    /// The wake-up eventfd, registered with the engine's reactor for the core's life: a peer's
    /// poke ends the core's sleep. Made the first time the core goes to sleep. (Declared
    /// before `wake`, so dropped before the eventfd closes.)
    pub(super) irq: RefCell<Option<barewire_engine::WakeSource>>,
    pub(super) wake: RefCell<Option<Rc<OwnedFd>>>,
    pub(super) qps: RefCell<Vec<Weak<QpInner>>>,
    pub(super) registered: Cell<bool>,
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
    pub(super) static CORE: CoreShm = const {
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
pub(super) fn core_wake() -> Result<Rc<OwnedFd>, DriverError> {
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
pub(super) fn watch_for_stalls() {
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
    pub(super) fn settle_front(&self, status: WcStatus) {
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
pub(super) struct ShmPoller {
    /// The one registered with the core's reactor, which drops it as the core shuts down: it
    /// then lets go of the core's state (the eventfd, its registration), which would otherwise
    /// stay until the thread's next runtime or its end. (Tests make unregistered ones.)
    pub(super) registered: bool,
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
