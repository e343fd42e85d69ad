//! Sends: a queue pair's queued chunks as one gather `SENDMSG`, at once or with the pass's
//! submission, and what its completion does to the stream.

use super::*;

/// Queues the gather send of what the stream has queued, if no send is outstanding. True if
/// it queued one.
pub(super) fn arm_send(
    (fd, named): Target,
    send: u64,
    stream: &mut Stream,
    ops: &mut RingOps,
    r: &Ring,
) -> bool {
    if ops.tx == TxOp::Idle && stream.wants_tx() {
        let (e, taken) = if let Some(taken) = stream.tx_copy(&mut ops.small[..]) {
            // A small send (a latency-bound message, an acknowledgement, a Read Response's
            // header): the stream copies it into one buffer, which goes as a plain SEND; the
            // kernel takes it without reading a message header and importing a gather list.
            let e = opcode::Send::new(fd, ops.small.as_ptr(), taken as u32)
                .flags(libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
                .build();
            (e, taken)
        } else {
            let (mut count, mut taken) = if ops.iov.len() < SEND_IOV {
                // One entry more than the list holds tells whether more chunks are queued.
                gather::<{ SEND_IOV_FEW + 1 }>(stream, &mut ops.iov)
            } else {
                gather::<SEND_IOV>(stream, &mut ops.iov)
            };
            if count > ops.iov.len() {
                // A burst of large messages: this queue pair keeps the long gather list.
                ops.iov = empty_iov(SEND_IOV);
                (count, taken) = gather::<SEND_IOV>(stream, &mut ops.iov);
            }
            ops.msg.msg_iov = ops.iov.as_mut_ptr();
            ops.msg.msg_iovlen = count;
            let e = opcode::SendMsg::new(fd, &*ops.msg)
                .flags((libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32)
                .build();
            (e, taken)
        };
        if taken > 0 {
            // SAFETY: the copy, or the gather list and the chunks it names (which the stream
            // just checked), live in `ops` (boxed) or the stream, and nothing changes them
            // before this send completes (`ops.tx` is `Sending` until then); with MSG_DONTWAIT
            // the kernel reads them inside this pass's submission, which follows
            // `prepare_submit` with nothing in between.
            unsafe { r.raw.push(e.flags(named), send) };
            ops.tx = TxOp::Sending;
            // Until its completion is applied, a close keeps the chunks this send took.
            stream.tx_take(taken);
            return true;
        }
        // Nothing taken: a Read Response's source is gone and the stream stopped; the poll
        // after this submission closes the connection.
    }
    false
}

/// Fills `iov` with the chunks the stream has queued, through `N` slices: how many the stream
/// offered (more than `iov` holds when `N` is larger: then `iov` holds none of them) and the
/// bytes in those `iov` took. `N` is a constant so that the slices live on the stack, sized to
/// the list: a queue pair that never needed the long list fills 65 of them, not 256. (A send
/// small enough to copy never comes here: `Stream::tx_copy` takes it whole.)
fn gather<const N: usize>(stream: &mut Stream, iov: &mut [libc::iovec]) -> (usize, usize) {
    let mut slices = [std::io::IoSlice::new(&[]); N];
    let count = stream.tx_iovecs(&mut slices);
    if count > iov.len() {
        return (count, 0);
    }
    let mut taken = 0;
    for (v, s) in iov.iter_mut().zip(&slices[..count]) {
        v.iov_base = s.as_ptr() as *mut libc::c_void;
        v.iov_len = s.len();
        taken += s.len();
    }
    (count, taken)
}

/// On a core with few queue pairs (where latency matters more than batching: see
/// `polling_mode`), sends what the queue pairs waiting for the pass (`Ring::pending`) have
/// queued at once, through the ring, in one `io_uring_enter` of its own, instead of at the
/// next pass: a Read Response, an atomic's answer or an acknowledgement then leaves as soon as
/// its request is processed, and the rest of a task's burst of posts when the task yields
/// (`send_burst`). With more queue pairs everything waits for the pass and shares its one
/// submission. Nothing runs between the pushes and this submission.
pub(super) fn send_now(p: &Provider, r: &Ring) {
    let mut keys = r.send_keys.borrow_mut();
    keys.clear();
    keys.extend_from_slice(&r.pending.borrow());
    let mut any = false;
    for &key in keys.iter() {
        let Some(qp) = p.get(key) else { continue };
        let mut guard = qp.borrow_mut();
        let i = &mut *guard;
        if i.closed || i.tx_failed {
            continue;
        }
        let (fd, send) = (target(i), token(i, Kind::Send));
        let QpInner { stream, ring, .. } = i;
        if let Some(ops) = ring.as_mut() {
            any |= arm_send(fd, send, stream, ops, r);
        }
    }
    drop(keys);
    if any {
        r.raw.submit();
        // The sends are done (MSG_DONTWAIT, inside that call): apply them now, before any
        // task runs, so no stream ever has bytes on the wire that it still counts as queued.
        let reaped = &mut *r.send_reaped.borrow_mut();
        reaped.append(&mut r.backlog.borrow_mut());
        r.raw.drain(reaped);
        for c in reaped.drain(..) {
            complete(c, r, p);
        }
    }
}

/// A task posted on `i`: on a core in polling mode, out now (see `send_now`), unless it joins
/// a burst (`progress::joins_burst`): then it waits, and goes with the rest of the burst when
/// the task yields, every queue pair's in one submission (`send_burst`). False if the post
/// waits (the caller queues the queue pair for the pass).
pub(in crate::provider) fn post_now(i: &mut QpInner) -> bool {
    // Outside the runtime (a handle dropped after `block_on` returned) there is no ring to
    // submit on: the post waits in the stream, as any other.
    if i.closed || i.tx_failed || !barewire_engine::in_runtime() {
        return false;
    }
    PROVIDER.with(|p| {
        if p.core.get() != barewire_engine::core_token() {
            return false;
        }
        if let Some(r) = p.ring.borrow().as_ref().filter(|r| r.copy) {
            // The kernel thread picks the send up without a system call of ours.
            copy_out(i, r);
            return true;
        }
        if !polling_mode(p) || joins_burst(p, i) {
            return false;
        }
        let ring = p.ring.borrow();
        let Some(r) = ring.as_ref() else {
            return false;
        };
        let (fd, send) = (target(i), token(i, Kind::Send));
        let QpInner { stream, ring, .. } = i;
        let Some(ops) = ring.as_mut() else {
            return false;
        };
        let sent = arm_send(fd, send, stream, ops, r);
        if sent {
            r.raw.submit();
            // Apply this send's completion before returning (the task may disconnect next,
            // and must not send these bytes again); the rest wait for the poll.
            let mut backlog = r.backlog.borrow_mut();
            r.raw.drain(&mut backlog);
            if let Some(at) = backlog.iter().position(|c| c.token == send) {
                let c = backlog.remove(at);
                drop(backlog);
                sent_done(i, r, p, c.result);
                after(i);
            }
        }
        sent
    })
}

/// A task that posted more than once in one poll yielded (see `progress::joins_burst`): on a
/// ring core, what waited goes out now, in one submission for every queue pair waiting for the
/// pass, as `poll` sends what received bytes produced. False on a core without a ring.
pub(in crate::provider) fn send_burst(p: &Provider) -> bool {
    let ring = p.ring.borrow();
    let Some(r) = ring.as_ref() else {
        return false;
    };
    if polling_mode(p) {
        send_now(p, r);
    }
    true
}

/// A send's completion: `res` bytes went out (or why none did).
pub(super) fn sent_done(i: &mut QpInner, r: &Ring, p: &Provider, res: i32) -> bool {
    p.count_send(res as isize);
    let ops = i.ring.as_mut().expect("a ring queue pair");
    ops.tx = TxOp::Idle;
    i.stream.tx_settle(res.max(0) as usize);
    if res > 0 {
        i.moved = true;
        true
    } else if res == -libc::EAGAIN {
        push_poll(i, r, libc::POLLOUT as u32, Kind::PollOut);
        i.ring.as_mut().expect("a ring queue pair").tx = TxOp::Polling;
        false
    } else {
        send_failed(i);
        false
    }
}

/// True while a send of this queue pair is outstanding on the ring (its bytes are, or may be,
/// on the wire already): nothing else may send from the stream meanwhile.
pub(in crate::provider) fn send_outstanding(i: &QpInner) -> bool {
    i.ring.as_ref().is_some_and(|o| o.tx != TxOp::Idle)
}
