//! The core's progress poller over the ring: it arms what queue pairs need before the pass's
//! submission, takes the completions after it, and lets go of the ring's state when the core
//! ends.

use super::*;

/// The io_uring progress poller: queues operations before the pass's submission and handles
/// their completions after it.
pub(in crate::provider) struct RingPoller {
    completions: Vec<Completion>,
    /// Scratch: the queue pairs `prepare_submit` (or a core going to sleep) arms, kept (as
    /// `Ring::send_keys` is): taking the ring's list instead left it without capacity, and
    /// every pass allocated it again.
    arming: Vec<usize>,
    last_timeout_check: Instant,
    gone: Vec<usize>,
}

impl RingPoller {
    pub(in crate::provider) fn new() -> RingPoller {
        RingPoller {
            completions: Vec::with_capacity(64),
            arming: Vec::new(),
            last_timeout_check: Instant::now(),
            gone: Vec::new(),
        }
    }
}

impl Poller for RingPoller {
    fn prepare_submit(&mut self) {
        PROVIDER.with(|p| {
            let ring = p.ring.borrow();
            let Some(r) = ring.as_ref() else { return };
            let poll = polling_mode(p);
            // Every look buffer handed out last pass was read in that pass's poll.
            r.next_look.set(0);
            // (Moved out first: arming a queue pair may queue it again, for the next pass.)
            self.arming.append(&mut r.pending.borrow_mut());
            self.arming.append(&mut r.polling.borrow_mut());
            for key in self.arming.drain(..) {
                if let Some(qp) = p.get(key) {
                    arm(&mut qp.borrow_mut(), r, poll);
                }
            }
        })
    }

    fn poll(&mut self) -> bool {
        PROVIDER.with(|p| {
            let mut moved = false;
            {
                let ring = p.ring.borrow();
                let Some(r) = ring.as_ref() else {
                    return false;
                };
                self.completions.append(&mut r.backlog.borrow_mut());
                r.raw.drain(&mut self.completions);
                for c in self.completions.drain(..) {
                    moved |= complete(c, r, p);
                }
                if polling_mode(p) && moved {
                    // What the bytes just received produced (responses, acknowledgements)
                    // goes out now; the rest of each queue pair's needs wait for the pass.
                    send_now(p, r);
                }
            }
            moved |= sweep_active(
                p,
                &mut self.last_timeout_check,
                &mut self.gone,
                |i: &mut QpInner| {
                    if i.stream.wants_tx() {
                        queue(i);
                    }
                    false
                },
            );
            for key in self.gone.drain(..) {
                p.forget(key);
            }
            moved
        })
    }

    fn pure_poll(&mut self) -> bool {
        PROVIDER.with(|p| {
            p.ring
                .borrow()
                .as_ref()
                .is_some_and(|r| !r.pending.borrow().is_empty() || !r.backlog.borrow().is_empty())
        })
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        // The armed receives and polls are the interrupt sources; what must not sleep is a
        // queue pair with operations still to queue, and one owed bytes needs its stall timer.
        PROVIDER.with(|p| {
            if self.pure_poll_inner(p) {
                return false;
            }
            // Polled queue pairs get the multishot receive that will wake the core; it goes
            // out with the sleep's own submission.
            if let Some(r) = p.ring.borrow().as_ref() {
                self.arming.append(&mut r.polling.borrow_mut());
                for key in self.arming.drain(..) {
                    if let Some(qp) = p.get(key) {
                        let mut guard = qp.borrow_mut();
                        let i = &mut *guard;
                        let (fd, multi) = (target(i), token(i, Kind::RecvMulti));
                        if let Some(ops) = i.ring.as_mut().filter(|o| o.rx == RxOp::Idle) {
                            if !i.closed {
                                arm_multishot(fd, multi, ops, r);
                            }
                        }
                    }
                }
            }
            p.stall_timer()
        })
    }
}

impl Drop for RingPoller {
    /// The core is shutting down: under SQPOLL, copies the queue pairs handed over (their
    /// requests completed) may still wait for the kernel thread; they go out before the ring
    /// does, within a bound, as the raw-syscall path's last sends do when a queue pair drops.
    /// Then the provider lets go of the core's ring state (`Provider::release`): its provided
    /// buffers leave the core's ring and are freed while the core still runs.
    fn drop(&mut self) {
        let _ = PROVIDER.try_with(|p| {
            self.send_last_copies(p);
            p.release();
        });
    }
}

impl RingPoller {
    /// Under SQPOLL, waits (bounded) until the wires have sent what they hold.
    fn send_last_copies(&mut self, p: &Provider) {
        let ring = p.ring.borrow();
        let Some(r) = ring.as_ref().filter(|r| r.copy) else {
            return;
        };
        let deadline = Instant::now() + SHUTDOWN_DRAIN;
        while r.wires.borrow().sending() && Instant::now() < deadline {
            r.raw.submit();
            r.raw.drain(&mut self.completions);
            for c in self.completions.drain(..) {
                complete(c, r, p);
            }
            std::thread::yield_now();
        }
    }
}

/// How long a core's shutdown waits for its queue pairs' last copies to be sent (SQPOLL).
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(1);

impl RingPoller {
    fn pure_poll_inner(&self, p: &Provider) -> bool {
        p.ring
            .borrow()
            .as_ref()
            .is_some_and(|r| !r.pending.borrow().is_empty() || !r.backlog.borrow().is_empty())
    }
}

/// How long the stall timer's task sleeps while a queue pair is owed bytes.
pub(in crate::provider) const STALL_TICK: Duration = Duration::from_millis(5);
