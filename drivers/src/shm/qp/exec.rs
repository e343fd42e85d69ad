//! The send queue: each work request carried out on the peer's mapping (READ, WRITE and
//! atomics as the initiator's own copies and CPU atomics) or put in the peer's ring.

use super::*;

impl QpInner {
    /// Runs the send queue from its front until an entry waits, a large copy has taken this
    /// pass's step, or the queue is empty. True if anything moved.
    pub(super) fn progress(self: &Rc<Self>) -> bool {
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

    pub(super) fn wake_peer_if(&self, w: &Writer) {
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
    pub(super) fn run(
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
    pub(super) fn copy_sges(
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
}
