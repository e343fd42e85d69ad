//! The receiving side of the stream: bytes from the socket are framed, checked and placed,
//! and RDMAP messages are carried out (Read Responses, atomics, Terminates, completions).

use super::*;
use barewire_engine::trace;

impl Stream {
    /// Where the next received bytes must be written, and how many are wanted at most.
    /// `None` once the stream is dead.
    pub fn rx_buffer(&mut self) -> Option<(*mut u8, usize)> {
        match self.rx {
            Rx::Framing { .. } => self.framer.scratch().map(|s| (s.as_mut_ptr(), s.len())),
            Rx::Payload { .. } => self.extents.front().copied(),
            Rx::Body { have, need, .. } => Some((self.body[have..].as_mut_ptr(), need - have)),
            Rx::Dead => None,
        }
    }

    /// `n` bytes were written at the pointer `rx_buffer` gave.
    pub fn rx_advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let step = match &mut self.rx {
            Rx::Framing { .. } => self.framer.filled(n),
            Rx::Payload { .. } => match self.payload_in(n, None) {
                Some(step) => step,
                None => return,
            },
            Rx::Body { opcode, have, need } => {
                let (opcode, have, need) = (*opcode, *have, *need);
                let end = (have + n).min(need);
                self.rx = if end < need {
                    Rx::Body {
                        opcode,
                        have: end,
                        need,
                    }
                } else {
                    Rx::Framing {
                        then: Some(Done::Control { opcode }),
                    }
                };
                self.framer.placed(&self.body[have..end])
            }
            Rx::Dead => return,
        };
        self.on_step(step);
    }

    /// `n` payload bytes for the front extent: written there already by the I/O layer
    /// (`from` is `None`), or copied there now from `from` (at least `n` bytes), in the same
    /// pass as their CRC. `None` if no extent is left.
    fn payload_in(&mut self, n: usize, from: Option<&[u8]>) -> Option<Result<Step, WireError>> {
        let (p, left) = self.extents.pop_front()?;
        let n = n.min(left);
        if n < left {
            self.extents.push_front((p.wrapping_add(n), left - n));
        }
        let step = match from {
            // SAFETY: the n bytes at p lie inside an extent checked as writable for this
            // placement; `from` is the caller's buffer, never a region, so they do not overlap.
            Some(src) => self.framer.placed_copy(&src[..n], unsafe {
                std::slice::from_raw_parts_mut(p.cast::<std::mem::MaybeUninit<u8>>(), n)
            }),
            // SAFETY: the I/O layer just wrote these n bytes at p, inside a checked extent;
            // reading them back for the CRC is within bounds.
            None if self.framer.crc() => self
                .framer
                .placed(unsafe { std::slice::from_raw_parts(p, n) }),
            None => self.framer.placed_len(n),
        };
        if self.extents.is_empty() {
            self.rx = match std::mem::replace(&mut self.rx, Rx::Dead) {
                Rx::Payload { then } => Rx::Framing { then: Some(then) },
                other => other,
            };
        }
        Some(step)
    }

    /// What the framer's step completed: a frame's headers, or the frame.
    fn on_step(&mut self, step: Result<Step, WireError>) {
        match step {
            Ok(Step::More) => {}
            Ok(Step::Header) => self.on_header(),
            Ok(Step::Frame) => {
                if let Rx::Framing { then } = &mut self.rx {
                    if let Some(done) = then.take() {
                        self.on_segment_done(done);
                    }
                }
            }
            Err(e) => self.fatal(e.term, false),
        }
    }

    /// For input already read into a buffer of the caller's (the io_uring path's provided and
    /// look buffers, the epoll path's staging buffer, tests): copies `data` where `rx_buffer` points and counts it as
    /// `rx_advance` would, a payload's bytes with their CRC taken in the same pass
    /// ([`crate::wire::crc32c_copy`]). Returns how many bytes were consumed (all, unless the
    /// stream died).
    pub fn rx_feed(&mut self, data: &[u8]) -> usize {
        trace::event(trace::Kind::RECEIVED, data.len() as u64);
        let placed = self.rx_feed_all(data);
        trace::event(trace::Kind::PLACED, placed as u64);
        placed
    }

    // (Always inlined: without the `trace` feature `rx_feed` is this body, as before.)
    #[inline(always)]
    fn rx_feed_all(&mut self, mut data: &[u8]) -> usize {
        let total = data.len();
        while !data.is_empty() {
            if let Rx::Framing { .. } = self.rx {
                // A frame's headers all here: one step rather than two through the scratch.
                if let Some((n, step)) = self.framer.headers_from(data) {
                    self.on_step(step);
                    data = &data[n..];
                    continue;
                }
            }
            let Some((p, want)) = self.rx_buffer() else {
                return total - data.len();
            };
            let n = want.min(data.len());
            if matches!(self.rx, Rx::Payload { .. }) {
                // Into the region, with the CRC taken as the bytes are copied.
                if let Some(step) = self.payload_in(n, Some(data)) {
                    self.on_step(step);
                }
            } else {
                // SAFETY: rx_buffer returned a writable destination of at least `want` bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, n) };
                self.rx_advance(n);
            }
            data = &data[n..];
        }
        total
    }

    /// A frame's headers are in (the framer checked its length): check them, and hand the
    /// segment to the handler of its message kind, which says where its payload goes and what
    /// its frame completes.
    pub(super) fn on_header(&mut self) {
        let mut header = [0u8; UNTAGGED_HEADER_LEN];
        let hlen = self.framer.header().len();
        header[..hlen].copy_from_slice(self.framer.header());
        let seg = match Segment::decode(&header[..hlen]) {
            Ok(s) => s,
            Err(e) => return self.fatal(e.term, false),
        };
        if !self.state.receives() {
            return self.fatal(
                TermCode::rdmap(
                    RdmapErrorType::RemoteOperation,
                    RdmapErrorCode::CatastrophicStream,
                ),
                false,
            );
        }
        let len = self.framer.payload_len();
        if let Err(e) = self
            .reassembly
            .accept_parts(seg.last, seg.header, len as u64)
        {
            return self.fatal(e.term, true);
        }
        self.extents.clear();
        let next = match seg.header {
            DdpHeader::Tagged { stag, to } if seg.opcode == RdmapOpcode::ReadResponse => {
                self.on_read_response(stag, to, len, seg.last)
            }
            DdpHeader::Tagged { stag, to } => self.on_write(stag, to, len, seg.last),
            DdpHeader::Untagged { ulp, qn: q, mo, .. }
                if q == qn::SEND
                    && !matches!(
                        seg.opcode,
                        RdmapOpcode::ImmediateData | RdmapOpcode::ImmediateDataSe
                    ) =>
            {
                self.on_send(seg.opcode, ulp, mo, len, seg.last)
            }
            DdpHeader::Untagged { .. } => self.on_control_header(seg.opcode, len),
        };
        self.rx = match next {
            Err(code) => return self.fatal(code, true),
            Ok(body @ Rx::Body { .. }) => body,
            Ok(Rx::Payload { then }) if self.extents.is_empty() => Rx::Framing { then: Some(then) },
            Ok(rx) => rx,
        };
    }

    /// An RDMA Write segment: its payload goes where the peer says, in a region this
    /// connection may write.
    fn on_write(&mut self, stag: u32, to: u64, len: usize, last: bool) -> Result<Rx, TermCode> {
        let p = self
            .dev
            .check(
                Stag(stag),
                self.cfg.pd,
                self.cfg.qp_num,
                to,
                len as u64,
                Access::REMOTE_WRITE,
            )
            .map_err(|v| v.tagged_term())?;
        if len > 0 {
            self.extents.push_back((p, len));
        }
        self.write_run += len as u64;
        if last {
            self.last_write_len = std::mem::take(&mut self.write_run);
        }
        Ok(Rx::Payload { then: Done::Write })
    }

    /// A Read Response segment: it must continue the sink this side named in its own Read
    /// Request (see `check_read_response`), and lands there as local memory under its local
    /// key, whatever remote use the region allows. A zero-length one (the acknowledgement of
    /// a zero-length Read) moves no byte and names no region.
    fn on_read_response(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        last: bool,
    ) -> Result<Rx, TermCode> {
        self.check_read_response(stag, to, len, last)?;
        if len > 0 {
            let p = self
                .dev
                .check_local(Stag(stag), self.cfg.pd, to, len as u64, true)
                .map_err(|v| v.tagged_term())?;
            self.extents.push_back((p, len));
        }
        Ok(Rx::Payload {
            then: Done::ReadResponse { last },
        })
    }

    /// A Send segment (with or without Invalidate and Solicited Event): its payload goes into
    /// the receive at the head of the queue, at the message offset the peer gives.
    fn on_send(
        &mut self,
        opcode: RdmapOpcode,
        ulp: u32,
        mo: u32,
        len: usize,
        last: bool,
    ) -> Result<Rx, TermCode> {
        let Some(wr) = self.rq.front() else {
            return Err(TermCode::ddp_untagged(DdpUntaggedErrorCode::NoBuffer));
        };
        // Map [mo, mo+len) onto the receive's SGEs.
        let (mut skip, mut left) = (mo as u64, len as u64);
        for s in &wr.sges {
            if left == 0 {
                break;
            }
            if skip >= s.len as u64 {
                skip -= s.len as u64;
                continue;
            }
            let take = (s.len as u64 - skip).min(left);
            self.extents
                .push_back(((s.addr + skip) as usize as *mut u8, take as usize));
            left -= take;
            skip = 0;
        }
        if left > 0 {
            return Err(TermCode::ddp_untagged(DdpUntaggedErrorCode::TooLong));
        }
        let invalidates = matches!(
            opcode,
            RdmapOpcode::SendInvalidate | RdmapOpcode::SendSeInvalidate
        ) && last;
        if invalidates && self.dev.invalidate(Stag(ulp), self.cfg.pd).is_err() {
            return Err(TermCode::rdmap(
                RdmapErrorType::RemoteOperation,
                RdmapErrorCode::CannotInvalidate,
            ));
        }
        Ok(Rx::Payload {
            then: Done::Send {
                last,
                len: (mo as u64 + len as u64) as u32,
                solicited: matches!(opcode, RdmapOpcode::SendSe | RdmapOpcode::SendSeInvalidate),
                invalidated: invalidates.then_some(ulp),
            },
        })
    }

    /// A control message's header: its body (bounded, whatever the peer claims) is read
    /// whole before `on_control` carries it out.
    fn on_control_header(&mut self, opcode: RdmapOpcode, len: usize) -> Result<Rx, TermCode> {
        if len > self.body.len() {
            return Err(TermCode::rdmap(
                RdmapErrorType::RemoteOperation,
                RdmapErrorCode::Opcode,
            ));
        }
        Ok(if len == 0 {
            Rx::Framing {
                then: Some(Done::Control { opcode }),
            }
        } else {
            Rx::Body {
                opcode,
                have: 0,
                need: len,
            }
        })
    }

    /// A segment's frame is in and checked: complete what it finished.
    fn on_segment_done(&mut self, done: Done) {
        match done {
            Done::Write | Done::ReadResponse { last: false } => {}
            Done::ReadResponse { last: true } => {
                // The header was checked against this very entry, and only this handler
                // removes it while receiving lives.
                let Some(r) = self.orq.pop_front() else {
                    return self.fatal(TermCode::RDMAP_OPCODE, false);
                };
                let wc = self.wc(r.wr_id, WcStatus::Success, r.opcode, r.len);
                self.sq_complete(r.seq, r.signaled.then_some(wc));
                self.unblock();
            }
            Done::Send {
                last,
                len,
                solicited,
                invalidated,
            } => {
                self.recv_placed = len;
                if last {
                    // Checked at the header; receives are only ever appended meanwhile.
                    let Some(wr) = self.rq.pop_front() else {
                        return self.fatal(
                            TermCode::ddp_untagged(DdpUntaggedErrorCode::NoBuffer),
                            false,
                        );
                    };
                    self.report(
                        Queue::Recv,
                        WorkCompletion {
                            wr_id: wr.wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::Recv,
                            byte_len: self.recv_placed,
                            imm: None,
                            invalidated,
                            solicited,
                            qp_num: self.cfg.qp_num,
                        },
                    );
                    self.recv_placed = 0;
                }
            }
            Done::Control { opcode } => {
                let body_len = self.framer.payload_len();
                let body = self.body;
                self.on_control(opcode, &body[..body_len]);
            }
        }
    }

    /// A Read Response segment must answer the oldest outstanding Read (not an atomic) and
    /// continue its sink exactly where the last segment stopped: same STag, next offset,
    /// within the length asked for, and the last segment ends the sink. So a peer can only
    /// ever write where this side asked it to, never into other memory of the domain.
    fn check_read_response(
        &mut self,
        stag: u32,
        to: u64,
        len: usize,
        last: bool,
    ) -> Result<(), TermCode> {
        let Some(r) = self.orq.front_mut().filter(|r| r.atomic.is_none()) else {
            return Err(TermCode::rdmap(
                RdmapErrorType::RemoteOperation,
                RdmapErrorCode::Opcode,
            ));
        };
        let (sink_stag, sink_to, size) = r.sink;
        let end = r.placed + len as u64;
        if len > 0 && stag != sink_stag {
            return Err(TermCode::ddp_tagged(DdpTaggedErrorCode::InvalidStag));
        }
        if (len > 0 && to != sink_to.wrapping_add(r.placed))
            || end > size as u64
            || (last && end != size as u64)
        {
            return Err(TermCode::ddp_tagged(DdpTaggedErrorCode::BaseBounds));
        }
        r.placed = end;
        Ok(())
    }

    /// True, after answering with a Terminate, when the peer exceeds the IRD it negotiated.
    pub(super) fn over_ird(&mut self) -> bool {
        if self.inbound_reads < self.cfg.ird as usize {
            return false;
        }
        let code = TermCode::rdmap(
            RdmapErrorType::RemoteOperation,
            RdmapErrorCode::CatastrophicStream,
        );
        self.fatal(code, false);
        true
    }

    pub(super) fn on_control(&mut self, opcode: RdmapOpcode, body: &[u8]) {
        match opcode {
            RdmapOpcode::ReadRequest => {
                let rr = match ReadRequest::decode(body) {
                    Ok(r) => r,
                    Err(e) => return self.fatal(e.term, false),
                };
                if self.over_ird() {
                    return;
                }
                // A zero-length Read names no region (RFC 5040 §4.4 leaves its STag unused):
                // it is answered in order, which is what makes it an acknowledgement.
                // The responses' tagged offsets run from sink_to to sink_to + size: a range
                // that wraps cannot be described on the wire.
                let checked = if rr.sink_to.checked_add(rr.size as u64).is_none() {
                    Err(Violation::ToWrap)
                } else if rr.size == 0 {
                    Ok(std::ptr::null_mut())
                } else {
                    self.dev.check(
                        Stag(rr.source_stag),
                        self.cfg.pd,
                        self.cfg.qp_num,
                        rr.source_to,
                        rr.size as u64,
                        Access::REMOTE_READ,
                    )
                };
                match checked {
                    Ok(p) => {
                        self.inbound_reads += 1;
                        self.queue_message(
                            RdmapOpcode::ReadResponse,
                            &[(p as *const u8, rr.size as usize)],
                            |off| DdpHeader::Tagged {
                                stag: rr.sink_stag,
                                to: rr.sink_to + off as u64,
                            },
                            TAGGED_HEADER_LEN,
                            (rr.size > 0).then_some((rr.source_stag, rr.source_to)),
                        );
                        self.marks.push_back(TxMark {
                            until: self.tx_queued,
                            sq: None,
                            inbound_read: true,
                        });
                    }
                    Err(v) => {
                        let mut copy = [0u8; ReadRequest::LEN];
                        copy.copy_from_slice(body);
                        self.send_terminate(Terminate {
                            code: v.rdmap_term(),
                            m: true,
                            ddp: None,
                            rdmap: Some(copy),
                        });
                    }
                }
            }
            RdmapOpcode::Terminate => {
                let code = Terminate::decode(body)
                    .map(|t| t.code)
                    .unwrap_or(TermCode::RDMAP_OPCODE);
                self.last_terminate = Some(code);
                self.peer_terminated = true;
                self.enter_error(status_for(code));
                self.rx = Rx::Dead;
            }
            RdmapOpcode::ImmediateData | RdmapOpcode::ImmediateDataSe => {
                let imm = match ImmediateData::decode(body) {
                    Ok(v) => v.0 as u32,
                    Err(e) => return self.fatal(e.term, false),
                };
                let Some(wr) = self.rq.pop_front() else {
                    return self.fatal(
                        TermCode::ddp_untagged(DdpUntaggedErrorCode::NoBuffer),
                        false,
                    );
                };
                let write_len = std::mem::take(&mut self.last_write_len) as u32;
                self.report(
                    Queue::Recv,
                    WorkCompletion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: write_len,
                        imm: Some(imm),
                        invalidated: None,
                        solicited: opcode == RdmapOpcode::ImmediateDataSe,
                        qp_num: self.cfg.qp_num,
                    },
                );
            }
            RdmapOpcode::AtomicRequest => {
                let req = match AtomicRequest::decode(body) {
                    Ok(r) => r,
                    Err(e) => return self.fatal(e.term, false),
                };
                if self.over_ird() {
                    return;
                }
                if req.to % 8 != 0 {
                    return self.fatal(Violation::BaseBounds.rdmap_term(), false);
                }
                if req.op == AtomicOp::FetchAdd && req.data_mask != !0 {
                    // Masked (field-wise) FetchAdd is not supported: refuse rather than guess.
                    return self.fatal(
                        TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                        false,
                    );
                }
                let p = match self.dev.check(
                    Stag(req.stag),
                    self.cfg.pd,
                    self.cfg.qp_num,
                    req.to,
                    8,
                    Access::REMOTE_ATOMIC,
                ) {
                    Ok(p) => p,
                    Err(v) => return self.fatal(v.rdmap_term(), false),
                };
                // SAFETY: the check proved 8 bytes at p lie in a live region granting remote
                // atomics, and p is 8-byte aligned; other writers of that word (local CPU
                // atomics, this same code for another connection) also use atomic accesses.
                let word = unsafe { &*(p as *const std::sync::atomic::AtomicU64) };
                let original = execute_atomic(word, &req);
                let resp = AtomicResponse {
                    request_id: req.request_id,
                    original,
                };
                let mut b = [0u8; AtomicResponse::LEN];
                resp.encode(&mut b);
                let msn = self.next_msn(qn::ATOMIC_RESPONSE);
                self.inbound_reads += 1;
                self.queue_control(RdmapOpcode::AtomicResponse, qn::ATOMIC_RESPONSE, msn, &b);
                self.marks.push_back(TxMark {
                    until: self.tx_queued,
                    sq: None,
                    inbound_read: true,
                });
            }
            RdmapOpcode::AtomicResponse => {
                let resp = match AtomicResponse::decode(body) {
                    Ok(r) => r,
                    Err(e) => return self.fatal(e.term, false),
                };
                let matches = self
                    .orq
                    .front()
                    .and_then(|r| r.atomic)
                    .is_some_and(|(id, _, _)| id == resp.request_id);
                if !matches {
                    return self.fatal(
                        TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                        false,
                    );
                }
                let Some((r, (_, sink, opcode))) =
                    self.orq.pop_front().and_then(|r| r.atomic.map(|a| (r, a)))
                else {
                    return; // `matches` above saw exactly this entry
                };
                // SAFETY: the sink is the 8-byte local SGE checked (LOCAL_WRITE) at post time;
                // it need not be aligned.
                unsafe { std::ptr::write_unaligned(sink as *mut u64, resp.original) };
                let wc = self.wc(r.wr_id, WcStatus::Success, opcode, 8);
                self.sq_complete(r.seq, r.signaled.then_some(wc));
                self.unblock();
            }
            _ => self.fatal(
                TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                false,
            ),
        }
    }
}

/// Runs an atomic on the target word as a CPU atomic, so it is atomic with local CPU atomics
/// and with other connections' atomics on the same word. Returns the original value.
fn execute_atomic(word: &std::sync::atomic::AtomicU64, req: &AtomicRequest) -> u64 {
    use std::sync::atomic::Ordering::SeqCst;
    match req.op {
        AtomicOp::FetchAdd => word.fetch_add(req.data, SeqCst),
        AtomicOp::Swap => {
            let m = req.data_mask;
            word.fetch_update(SeqCst, SeqCst, |old| Some((old & !m) | (req.data & m)))
                .expect("always Some")
        }
        AtomicOp::CmpSwap => {
            let (m, cm) = (req.data_mask, req.compare_mask);
            let mut old = word.load(SeqCst);
            loop {
                if old & cm != req.compare & cm {
                    return old;
                }
                match word.compare_exchange_weak(old, (old & !m) | (req.data & m), SeqCst, SeqCst) {
                    Ok(v) => return v,
                    Err(v) => old = v,
                }
            }
        }
    }
}
