//! The receiving side of the stream: bytes from the socket are framed, checked and placed,
//! and RDMAP messages are carried out (Read Responses, atomics, Terminates, completions).

use super::*;

impl Stream {
    /// Where the next received bytes must be written, and how many are wanted at most.
    /// `None` once the stream is dead.
    pub fn rx_buffer(&mut self) -> Option<(*mut u8, usize)> {
        Some(match self.rx {
            Rx::Start { have } => (self.hdr[have..].as_mut_ptr(), 4 - have),
            Rx::Header { have, need } => (self.hdr[have..].as_mut_ptr(), need - have),
            Rx::Payload => *self.extents.front().expect("payload state has extents"),
            Rx::Body { have, need } => (self.body[have..].as_mut_ptr(), need - have),
            Rx::Trailer { have, need } => (self.trailer[have..].as_mut_ptr(), need - have),
            Rx::Dead => return None,
        })
    }

    /// `n` bytes were written at the pointer `rx_buffer` gave.
    pub fn rx_advance(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        match self.rx {
            Rx::Start { have } => {
                self.crc = crc32c::crc32c_append(self.crc, &self.hdr[have..have + n]);
                let have = have + n;
                if have < 4 {
                    self.rx = Rx::Start { have };
                    return;
                }
                self.ulpdu_len = u16::from_be_bytes([self.hdr[0], self.hdr[1]]) as usize;
                let hlen = if self.hdr[2] & 0x80 != 0 {
                    TAGGED_HEADER_LEN
                } else {
                    UNTAGGED_HEADER_LEN
                };
                if self.ulpdu_len < hlen || self.ulpdu_len > self.cfg.mulpdu.max(65535) {
                    return self.fatal(
                        TermCode::mpa(crate::wire::MpaErrorCode::InvalidRequestReply),
                        None,
                    );
                }
                self.rx = Rx::Header {
                    have,
                    need: FPDU_HEADER_LEN + hlen,
                };
            }
            Rx::Header { have, need } => {
                self.crc = crc32c::crc32c_append(self.crc, &self.hdr[have..have + n]);
                let have = have + n;
                if have < need {
                    self.rx = Rx::Header { have, need };
                    return;
                }
                self.on_header(need);
            }
            Rx::Payload => {
                let (p, left) = self.extents.pop_front().expect("payload extent");
                if self.cfg.crc {
                    // SAFETY: the I/O layer just wrote these n bytes at p, inside a checked
                    // region; reading them back for the CRC is within bounds.
                    self.crc = crc32c::crc32c_append(self.crc, unsafe {
                        std::slice::from_raw_parts(p, n)
                    });
                }
                if n < left {
                    self.extents.push_front((p.wrapping_add(n), left - n));
                } else if self.extents.is_empty() {
                    self.begin_trailer();
                }
            }
            Rx::Body { have, need } => {
                self.crc = crc32c::crc32c_append(self.crc, &self.body[have..have + n]);
                let have = have + n;
                if have < need {
                    self.rx = Rx::Body { have, need };
                } else {
                    self.begin_trailer();
                }
            }
            Rx::Trailer { have, need } => {
                let have = have + n;
                if have < need {
                    self.rx = Rx::Trailer { have, need };
                    return;
                }
                let pad = need - 4;
                self.crc = crc32c::crc32c_append(self.crc, &self.trailer[..pad]);
                let got = u32::from_le_bytes(self.trailer[pad..need].try_into().expect("4 bytes"));
                if self.cfg.crc && got != self.crc {
                    return self.fatal(TermCode::MPA_CRC, None);
                }
                self.on_segment_done();
                self.crc = 0;
                if !matches!(self.rx, Rx::Dead) {
                    self.rx = Rx::Start { have: 0 };
                }
            }
            Rx::Dead => {}
        }
    }

    /// Convenience for buffered input (tests, or a reactor that already read the bytes): copies
    /// `data` through `rx_buffer`/`rx_advance`. Returns how many bytes were consumed (all, unless
    /// the stream died).
    pub fn rx_feed(&mut self, mut data: &[u8]) -> usize {
        let total = data.len();
        while !data.is_empty() {
            let Some((p, want)) = self.rx_buffer() else {
                return total - data.len();
            };
            let n = want.min(data.len());
            // SAFETY: rx_buffer returned a writable destination of at least `want` bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, n) };
            self.rx_advance(n);
            data = &data[n..];
        }
        total
    }

    pub(super) fn begin_trailer(&mut self) {
        let need = (4 - (FPDU_HEADER_LEN + self.ulpdu_len) % 4) % 4 + 4;
        self.rx = Rx::Trailer { have: 0, need };
    }

    pub(super) fn on_header(&mut self, hend: usize) {
        let seg = match Segment::decode(&self.hdr[FPDU_HEADER_LEN..hend]) {
            Ok(s) => s,
            Err(e) => return self.fatal(e.term, None),
        };
        if !self.state.receives() {
            return self.fatal(
                TermCode::rdmap(
                    RdmapErrorType::RemoteOperation,
                    RdmapErrorCode::CatastrophicStream,
                ),
                None,
            );
        }
        let payload_len = self.ulpdu_len - (hend - FPDU_HEADER_LEN);
        if let Err(e) = self
            .reassembly
            .accept_parts(seg.last, seg.header, payload_len as u64)
        {
            return self.fatal(e.term, Some(hend));
        }
        match seg.header {
            DdpHeader::Tagged { stag, to } => {
                let read_response = seg.opcode == RdmapOpcode::ReadResponse;
                let need = if read_response {
                    Access::LOCAL_WRITE
                } else {
                    Access::REMOTE_WRITE
                };
                if read_response && !self.orq.front().is_some_and(|r| r.atomic.is_none()) {
                    return self.fatal(
                        TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                        Some(hend),
                    );
                }
                // A zero-length Read Response (the acknowledgement of a zero-length Read) moves
                // no byte and names no region.
                let checked = if read_response && payload_len == 0 {
                    Ok(std::ptr::null_mut())
                } else {
                    self.dev.check(
                        Stag(stag),
                        self.cfg.pd,
                        self.cfg.qp_num,
                        to,
                        payload_len as u64,
                        need,
                    )
                };
                match checked {
                    Ok(p) => {
                        self.extents.clear();
                        if payload_len > 0 {
                            self.extents.push_back((p, payload_len));
                        }
                        if !read_response {
                            self.write_run += payload_len as u64;
                            if seg.last {
                                self.last_write_len = std::mem::take(&mut self.write_run);
                            }
                        }
                        self.place = Some(Place::Tagged {
                            last: seg.last,
                            read_response,
                        });
                    }
                    Err(v) => return self.fatal(v.tagged_term(), Some(hend)),
                }
            }
            DdpHeader::Untagged { ulp, qn: q, mo, .. }
                if q == qn::SEND
                    && !matches!(
                        seg.opcode,
                        RdmapOpcode::ImmediateData | RdmapOpcode::ImmediateDataSe
                    ) =>
            {
                let Some(wr) = self.rq.front() else {
                    return self.fatal(
                        TermCode::ddp_untagged(DdpUntaggedErrorCode::NoBuffer),
                        Some(hend),
                    );
                };
                // Map [mo, mo+len) onto the receive's SGEs.
                let mut extents = VecDeque::new();
                let (mut skip, mut left) = (mo as u64, payload_len as u64);
                for s in &wr.sges {
                    if left == 0 {
                        break;
                    }
                    if skip >= s.len as u64 {
                        skip -= s.len as u64;
                        continue;
                    }
                    let take = (s.len as u64 - skip).min(left);
                    extents.push_back(((s.addr + skip) as usize as *mut u8, take as usize));
                    left -= take;
                    skip = 0;
                }
                if left > 0 {
                    return self.fatal(
                        TermCode::ddp_untagged(DdpUntaggedErrorCode::TooLong),
                        Some(hend),
                    );
                }
                let invalidates = matches!(
                    seg.opcode,
                    RdmapOpcode::SendInvalidate | RdmapOpcode::SendSeInvalidate
                ) && seg.last;
                if invalidates && self.dev.invalidate(Stag(ulp), self.cfg.pd).is_err() {
                    return self.fatal(
                        TermCode::rdmap(
                            RdmapErrorType::RemoteOperation,
                            RdmapErrorCode::CannotInvalidate,
                        ),
                        Some(hend),
                    );
                }
                self.extents = extents;
                self.place = Some(Place::Untagged {
                    last: seg.last,
                    len: (mo as u64 + payload_len as u64) as u32,
                    solicited: matches!(
                        seg.opcode,
                        RdmapOpcode::SendSe | RdmapOpcode::SendSeInvalidate
                    ),
                    invalidated: invalidates.then_some(ulp),
                });
            }
            DdpHeader::Untagged { .. } => {
                if payload_len > self.body.len() {
                    return self.fatal(
                        TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                        Some(hend),
                    );
                }
                self.place = Some(Place::Control { opcode: seg.opcode });
                self.rx = Rx::Body {
                    have: 0,
                    need: payload_len,
                };
                if payload_len == 0 {
                    self.begin_trailer();
                }
                return;
            }
        }
        if self.extents.is_empty() {
            self.begin_trailer();
        } else {
            self.rx = Rx::Payload;
        }
    }

    pub(super) fn on_segment_done(&mut self) {
        match self.place.take() {
            Some(Place::Tagged {
                last: true,
                read_response: true,
            }) => {
                let r = self.orq.pop_front().expect("checked at the header");
                let wc = self.wc(r.wr_id, WcStatus::Success, r.opcode, r.len);
                self.sq_complete(r.seq, r.signaled.then_some(wc));
                self.unblock();
            }
            Some(Place::Tagged { .. }) => {}
            Some(Place::Untagged {
                last,
                len,
                solicited,
                invalidated,
            }) => {
                self.recv_placed = len;
                if last {
                    let wr = self.rq.pop_front().expect("checked at the header");
                    self.rcq.push(WorkCompletion {
                        wr_id: wr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Recv,
                        byte_len: self.recv_placed,
                        imm: None,
                        invalidated,
                        solicited,
                        qp_num: self.cfg.qp_num,
                    });
                    self.recv_placed = 0;
                }
            }
            Some(Place::Control { opcode }) => {
                let body_len = self.ulpdu_len - UNTAGGED_HEADER_LEN;
                let body = self.body;
                self.on_control(opcode, &body[..body_len]);
            }
            None => {}
        }
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
        self.fatal(code, None);
        true
    }

    pub(super) fn on_control(&mut self, opcode: RdmapOpcode, body: &[u8]) {
        match opcode {
            RdmapOpcode::ReadRequest => {
                let rr = match ReadRequest::decode(body) {
                    Ok(r) => r,
                    Err(e) => return self.fatal(e.term, None),
                };
                if self.over_ird() {
                    return;
                }
                // A zero-length Read names no region (RFC 5040 §4.4 leaves its STag unused):
                // it is answered in order, which is what makes it an acknowledgement.
                let checked = if rr.size == 0 {
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
                self.enter_error(status_for(code));
                self.rx = Rx::Dead;
            }
            RdmapOpcode::ImmediateData | RdmapOpcode::ImmediateDataSe => {
                let imm = match ImmediateData::decode(body) {
                    Ok(v) => v.0 as u32,
                    Err(e) => return self.fatal(e.term, None),
                };
                let Some(wr) = self.rq.pop_front() else {
                    return self
                        .fatal(TermCode::ddp_untagged(DdpUntaggedErrorCode::NoBuffer), None);
                };
                self.rcq.push(WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::Success,
                    opcode: WcOpcode::RecvRdmaWithImm,
                    byte_len: std::mem::take(&mut self.last_write_len) as u32,
                    imm: Some(imm),
                    invalidated: None,
                    solicited: opcode == RdmapOpcode::ImmediateDataSe,
                    qp_num: self.cfg.qp_num,
                });
            }
            RdmapOpcode::AtomicRequest => {
                let req = match AtomicRequest::decode(body) {
                    Ok(r) => r,
                    Err(e) => return self.fatal(e.term, None),
                };
                if self.over_ird() {
                    return;
                }
                if req.to % 8 != 0 {
                    return self.fatal(Violation::BaseBounds.rdmap_term(), None);
                }
                if req.op == AtomicOp::FetchAdd && req.data_mask != !0 {
                    // Masked (field-wise) FetchAdd is not supported: refuse rather than guess.
                    return self.fatal(
                        TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                        None,
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
                    Err(v) => return self.fatal(v.rdmap_term(), None),
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
                    Err(e) => return self.fatal(e.term, None),
                };
                let matches = self
                    .orq
                    .front()
                    .and_then(|r| r.atomic)
                    .is_some_and(|(id, _, _)| id == resp.request_id);
                if !matches {
                    return self.fatal(
                        TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                        None,
                    );
                }
                let r = self.orq.pop_front().expect("checked");
                let (_, sink, opcode) = r.atomic.expect("checked");
                // SAFETY: the sink is the 8-byte local SGE checked (LOCAL_WRITE) at post time;
                // it need not be aligned.
                unsafe { std::ptr::write_unaligned(sink as *mut u64, resp.original) };
                let wc = self.wc(r.wr_id, WcStatus::Success, opcode, 8);
                self.sq_complete(r.seq, r.signaled.then_some(wc));
                self.unblock();
            }
            _ => self.fatal(
                TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode),
                None,
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
