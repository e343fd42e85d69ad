//! What the peer put in this side's ring, delivered to the posted receives in order.

use super::*;

impl QpInner {
    /// Delivers what the peer put in the ring to the posted receives, in order. Returns
    /// whether anything was consumed.
    pub(super) fn deliver(self: &Rc<Self>) -> bool {
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
}
