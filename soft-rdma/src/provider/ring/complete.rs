//! What each completion does: the bytes a receive brought to the stream, a send's result,
//! a poll's readiness, each under the queue pair's state.

use super::*;

/// Handles one completion. True if bytes moved.
pub(super) fn complete(c: Completion, r: &Ring, p: &Provider) -> bool {
    let (key, qpn, kind) = untoken(c.token);
    let bid = buffer_id(c.flags);
    let qp = p.get(key).filter(|qp| qp.borrow().qp & 0xF_FFFF == qpn);
    if r.copy {
        let id = c.token & !0xF;
        match kind {
            Some(Kind::Send) => {
                p.count_send(c.result as isize);
                let whole = r.wires.borrow_mut().sent(id, c.result, r, c.token);
                if let Some(qp) = qp {
                    let mut guard = qp.borrow_mut();
                    let i = &mut *guard;
                    if whole {
                        i.moved = true;
                    } else {
                        send_failed(i);
                    }
                    after(i);
                }
                return whole;
            }
            Some(Kind::RecvMulti) if c.flags & CQE_F_MORE == 0 => r.wires.borrow_mut().finished(id),
            _ => {}
        }
    }
    let Some(qp) = qp else {
        if let Some(bid) = bid {
            r.bufs.give_back(bid);
        }
        return false;
    };
    let mut guard = qp.borrow_mut();
    let i = &mut *guard;
    let mut moved = false;
    let res = c.result;
    let fail = |i: &mut QpInner| {
        if !i.closed {
            close(i, WcStatus::RetryExcErr);
        }
    };
    match kind {
        Some(Kind::RecvMulti) => {
            if res > 0 {
                if let Some(bid) = bid {
                    // SAFETY: the completion filled `res` bytes of buffer `bid`, given back
                    // below and not before.
                    let data = unsafe { r.bufs.filled(bid, res as usize) };
                    // Bytes after a fatal error are dropped with the stream.
                    i.stream.rx_feed(data);
                    moved = true;
                }
            } else if res == 0 {
                fail(i); // the peer closed
            } else if res != -libc::ENOBUFS && res != -libc::ECANCELED {
                fail(i);
            }
            if let Some(bid) = bid {
                r.bufs.give_back(bid);
            }
            let ops = i.ring.as_mut().expect("a ring queue pair");
            if c.flags & CQE_F_MORE == 0 {
                // Its last completion (stopped, cancelled, or out of buffers): rearm.
                ops.rx = RxOp::Idle;
            } else if ops.rx == RxOp::Multi
                && !r.copy
                && (polling_mode(p)
                    || i.stream
                        .rx_buffer()
                        .is_some_and(|(_, w)| w >= DIRECT_SWITCH))
            {
                // Back to polling (the core woke and has few queue pairs), or on to a direct
                // receive: the multishot stops first.
                r.raw.cancel(token(i, Kind::RecvMulti));
                i.ring.as_mut().expect("a ring queue pair").rx = RxOp::Cancelling;
            }
        }
        Some(Kind::RecvDirect) => {
            let ops = i.ring.as_mut().expect("a ring queue pair");
            ops.rx = RxOp::Idle;
            if res > 0 {
                i.stream.rx_advance(res as usize);
                moved = true;
            } else if res == -libc::EAGAIN {
                push_poll(i, r, (libc::POLLIN | libc::POLLRDHUP) as u32, Kind::PollIn);
                i.ring.as_mut().expect("a ring queue pair").rx = RxOp::Polling;
            } else {
                fail(i);
            }
        }
        Some(Kind::RecvPolled) | Some(Kind::RecvPolledDirect) | Some(Kind::RecvPolledOwn) => {
            if kind == Some(Kind::RecvPolledDirect) && res > 0 {
                i.stream.rx_advance(res as usize);
                moved = true;
            }
            if kind == Some(Kind::RecvPolledOwn) {
                let ops = i.ring.as_mut().expect("a ring queue pair");
                let look = ops.look;
                ops.look += 1;
                if res > 0 {
                    // The kernel wrote `res` bytes of this pass's look buffer inside the
                    // submission this completion came from; nothing has used it since.
                    i.stream.rx_feed(&r.looks.borrow()[look][..res as usize]);
                    moved = true;
                }
            }
            if let Some(bid) = bid {
                if res > 0 {
                    // SAFETY: as for the multishot: `res` bytes of `bid`, given back below.
                    i.stream
                        .rx_feed(unsafe { r.bufs.filled(bid, res as usize) });
                    moved = true;
                }
                r.bufs.give_back(bid);
            }
            if res == 0 || (res < 0 && res != -libc::EAGAIN && res != -libc::ENOBUFS) {
                fail(i); // the peer closed, or the socket failed
            }
            let ops = i.ring.as_mut().expect("a ring queue pair");
            // A full buffer says more is waiting: ask for more at once next pass.
            ops.burst = if kind == Some(Kind::RecvPolledDirect) {
                ops.burst
            } else if res as usize == RING_BUF
                || (kind == Some(Kind::RecvPolledOwn) && res as usize == LOOK_BUF)
            {
                (ops.burst * 2).min(MAX_BURST)
            } else if res > 0 {
                ops.burst
            } else {
                1
            };
            ops.polled.0 = ops.polled.0.saturating_sub(1);
            ops.polled.1 |= moved;
            let size = if kind == Some(Kind::RecvPolledOwn) {
                LOOK_BUF
            } else {
                RING_BUF
            };
            // (A direct receive is as long as its placement, not a sign of what waits.)
            ops.polled.2 &= kind == Some(Kind::RecvPolledDirect) || res as usize == size;
            if ops.polled.0 > 0 {
                return moved; // the rest of this pass's receives follow
            }
            ops.rx = RxOp::Idle;
            ops.bulk = ops.polled.2
                && ops.burst == MAX_BURST
                && !(1..LONG_WRITE).contains(&i.stream.rx_write_run());
            if !ops.polled.1 && !i.closed {
                // Nothing this pass: poll again next pass, unless the core sleeps first.
                // Nothing else to do for this queue pair now.
                r.polling.borrow_mut().push(key);
                return false;
            }
        }
        Some(Kind::PollIn) => {
            i.ring.as_mut().expect("a ring queue pair").rx = RxOp::Idle;
        }
        Some(Kind::Send) => moved |= sent_done(i, r, p, res),
        Some(Kind::PollOut) => {
            i.ring.as_mut().expect("a ring queue pair").tx = TxOp::Idle;
        }
        None => {}
    }
    i.moved |= moved;
    after(i);
    moved
}
