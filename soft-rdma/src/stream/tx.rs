//! The sending side of the stream: work requests become FPDUs in the transmit queue, handed to
//! the socket as one gather list.

use super::*;

impl Stream {
    pub(super) fn start(&mut self, wr: SendWr) {
        // The local extents of each request reuse one list (no allocation per request).
        let mut extents = std::mem::take(&mut self.tx_extents);
        extents.clear();
        self.start_with(wr, &mut extents);
        self.tx_extents = extents;
    }

    pub(super) fn start_with(&mut self, wr: SendWr, extents: &mut Vec<(*const u8, usize)>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let SendOp::LocalInvalidate { stag } = wr.op {
            let status = match self.dev.invalidate(stag, self.cfg.pd) {
                Ok(()) => WcStatus::Success,
                Err(_) => WcStatus::LocProtErr,
            };
            let wc = WorkCompletion {
                wr_id: wr.wr_id,
                status,
                opcode: WcOpcode::LocalInv,
                byte_len: 0,
                imm: None,
                invalidated: Some(stag.0),
                solicited: false,
                qp_num: self.cfg.qp_num,
            };
            // Completes in order, after the requests queued before it.
            let report = wr.signaled || status != WcStatus::Success;
            self.marks.push_back(TxMark {
                until: self.tx_queued,
                sq: Some((seq, wc, report)),
                inbound_read: false,
            });
            if self.tx.is_empty() {
                self.tx_advance(0);
            }
            return;
        }
        let write_local = wr.op.returns_data();
        let mut total: u64 = 0;
        for s in &wr.sges {
            match self
                .dev
                .check_local(s.lkey, self.cfg.pd, s.addr, s.len as u64, write_local)
            {
                Ok(p) => extents.push((p as *const u8, s.len as usize)),
                Err(_) => return self.sq_fail(seq, wr.wr_id, WcStatus::LocProtErr, wr.op.opcode()),
            }
            total += s.len as u64;
        }
        if total > u32::MAX as u64 {
            return self.sq_fail(seq, wr.wr_id, WcStatus::LocLenErr, wr.op.opcode());
        }
        match wr.op {
            SendOp::LocalInvalidate { .. } => unreachable!("handled above"),
            SendOp::Send {
                solicited,
                invalidate,
            } => {
                let op = match (solicited, invalidate.is_some()) {
                    (false, false) => RdmapOpcode::Send,
                    (false, true) => RdmapOpcode::SendInvalidate,
                    (true, false) => RdmapOpcode::SendSe,
                    (true, true) => RdmapOpcode::SendSeInvalidate,
                };
                let msn = self.next_msn(qn::SEND);
                let ulp = invalidate.map_or(0, |s| s.0);
                self.queue_message(
                    op,
                    extents,
                    |off| DdpHeader::Untagged {
                        ulp,
                        qn: qn::SEND,
                        msn,
                        mo: off as u32,
                    },
                    UNTAGGED_HEADER_LEN,
                    None,
                );
            }
            SendOp::Write { remote_addr, rkey } => {
                self.queue_write(extents, remote_addr, rkey);
            }
            SendOp::Read { remote_addr, rkey } => {
                let [sink] = wr.sges[..] else {
                    return self.sq_fail(seq, wr.wr_id, WcStatus::LocLenErr, WcOpcode::RdmaRead);
                };
                let rr = ReadRequest {
                    sink_stag: sink.lkey.0,
                    sink_to: sink.addr,
                    size: sink.len,
                    source_stag: rkey.0,
                    source_to: remote_addr,
                };
                self.queue_read_request(&rr);
                self.orq.push_back(OutstandingRead {
                    seq,
                    wr_id: wr.wr_id,
                    len: sink.len,
                    signaled: wr.signaled,
                    atomic: None,
                    opcode: WcOpcode::RdmaRead,
                    sink: (rr.sink_stag, rr.sink_to, rr.size),
                    placed: 0,
                });
                return;
            }
            SendOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                self.queue_write(extents, remote_addr, rkey);
                let msn = self.next_msn(qn::SEND);
                self.queue_control(
                    RdmapOpcode::ImmediateData,
                    qn::SEND,
                    msn,
                    &(imm as u64).to_be_bytes(),
                );
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
                let ([_], [(sink_ptr, 8)]) = (&wr.sges[..], &extents[..]) else {
                    return self.sq_fail(seq, wr.wr_id, WcStatus::LocLenErr, wr.op.opcode());
                };
                let (op, data, compare) = match wr.op {
                    SendOp::FetchAdd { add, .. } => (AtomicOp::FetchAdd, add, 0),
                    SendOp::CmpSwap { compare, swap, .. } => (AtomicOp::CmpSwap, swap, compare),
                    SendOp::Swap { swap, .. } => (AtomicOp::Swap, swap, 0),
                    _ => unreachable!("matched above"),
                };
                self.atomic_id = self.atomic_id.wrapping_add(1);
                let req = AtomicRequest {
                    op,
                    request_id: self.atomic_id,
                    stag: rkey.0,
                    to: remote_addr,
                    data,
                    data_mask: !0,
                    compare,
                    compare_mask: !0,
                };
                let mut body = [0u8; AtomicRequest::LEN];
                req.encode(&mut body);
                let msn = self.next_msn(qn::ATOMIC_REQUEST);
                self.queue_control(RdmapOpcode::AtomicRequest, qn::ATOMIC_REQUEST, msn, &body);
                self.orq.push_back(OutstandingRead {
                    seq,
                    wr_id: wr.wr_id,
                    len: 8,
                    signaled: wr.signaled,
                    atomic: Some((self.atomic_id, *sink_ptr as *mut u8, wr.op.opcode())),
                    opcode: wr.op.opcode(),
                    sink: (0, 0, 0),
                    placed: 0,
                });
                return;
            }
        }
        if wr.signaled && self.cfg.remote_completion {
            // The acknowledgement: a zero-length Read, answered only after the peer processed
            // everything before it (RDMAP keeps order).
            let rr = ReadRequest {
                sink_stag: 0,
                sink_to: 0,
                size: 0,
                source_stag: 0,
                source_to: 0,
            };
            self.queue_read_request(&rr);
            self.orq.push_back(OutstandingRead {
                seq,
                wr_id: wr.wr_id,
                len: total as u32,
                signaled: true,
                atomic: None,
                opcode: wr.op.opcode(),
                sink: (0, 0, 0),
                placed: 0,
            });
            return;
        }
        let wc = self.wc(wr.wr_id, WcStatus::Success, wr.op.opcode(), total as u32);
        self.marks.push_back(TxMark {
            until: self.tx_queued,
            sq: Some((seq, wc, wr.signaled)),
            inbound_read: false,
        });
    }

    /// Queues an RDMA Write of `extents` to `remote_addr` in the peer's region `rkey`.
    pub(super) fn queue_write(
        &mut self,
        extents: &[(*const u8, usize)],
        remote_addr: u64,
        rkey: Stag,
    ) {
        // A range past 2^64 wraps here, and the peer refuses it (its bounds check sees the
        // first segment cross the end): a bad address is the peer's error to report.
        let header = |off: usize| DdpHeader::Tagged {
            stag: rkey.0,
            to: remote_addr.wrapping_add(off as u64),
        };
        self.queue_message(RdmapOpcode::Write, extents, header, TAGGED_HEADER_LEN, None);
    }

    /// Queues a Read Request (QN 1, the next MSN).
    pub(super) fn queue_read_request(&mut self, rr: &ReadRequest) {
        let mut body = [0u8; ReadRequest::LEN];
        rr.encode(&mut body);
        let msn = self.next_msn(qn::READ_REQUEST);
        self.queue_control(RdmapOpcode::ReadRequest, qn::READ_REQUEST, msn, &body);
    }

    pub(super) fn next_msn(&mut self, q: u32) -> u32 {
        let m = self.tx_msn[q as usize];
        self.tx_msn[q as usize] = m.wrapping_add(1);
        m
    }

    pub(super) fn push(&mut self, c: Chunk) {
        self.tx_queued += c.len() as u64;
        self.tx.push_back(c);
    }

    /// Queues the first `n` bytes of `head`, which begin an FPDU. When the FPDU before it is of
    /// the same message (`joined`), they go into its trailer's chunk where they fit: a stream
    /// of full FPDUs then takes two gather entries per FPDU instead of three (header and
    /// trailer, payload), so each send carries half as many FPDUs again. Bytes queued never
    /// move: the header goes after the trailer, which keeps its place at the chunk's start
    /// (where `prepare` writes a snapshot's CRC). Only within a message, so that a control
    /// message (a Terminate) is always a chunk of its own.
    ///
    /// `open`: only the FPDU's header is in `head`; its payload follows in other chunks.
    fn push_head(&mut self, head: &[u8; INLINE], n: usize, joined: bool, open: bool) {
        if let Some(Chunk::Inline {
            bytes,
            len,
            join,
            open: back_open,
        }) = self.tx.back_mut().filter(|_| joined)
        {
            let at = *len as usize;
            if *join == 0 && at + n <= INLINE {
                bytes[at..at + n].copy_from_slice(&head[..n]);
                (*len, *join, *back_open) = ((at + n) as u8, at as u8, open);
                self.tx_queued += n as u64;
                return;
            }
        }
        self.push(Chunk::Inline {
            bytes: *head,
            len: n as u8,
            join: 0,
            open,
        });
    }

    /// Queues bytes of ours that end an FPDU (a trailer, a whole FPDU).
    fn push_closed(&mut self, bytes: [u8; INLINE], len: usize) {
        self.push(Chunk::Inline {
            bytes,
            len: len as u8,
            join: 0,
            open: false,
        });
    }

    /// Queues a (possibly segmented) message whose payload lies in `extents`. A Read
    /// Response on a stream with CRC is queued as snapshots (see [`Chunk::Snapshot`]); every
    /// other payload is sent from where it is, which the verbs contract keeps unchanged until
    /// the request completes.
    ///
    /// `source` names a Read Response's source (STag, tagged offset): its bytes are checked to
    /// be live again just before they are sent.
    pub(super) fn queue_message(
        &mut self,
        op: RdmapOpcode,
        extents: &[(*const u8, usize)],
        header: impl Fn(usize) -> DdpHeader,
        hlen: usize,
        source: Option<(u32, u64)>,
    ) {
        let snapshot = self.cfg.crc && source.is_some();
        let total: usize = extents.iter().map(|e| e.1).sum();
        let mut pieces = Pieces {
            extents,
            at: 0,
            off: 0,
        };
        for (off, len, last) in split(total, hlen, self.cfg.mulpdu) {
            // After the message's first FPDU, the previous chunk is that FPDU's trailer.
            let joined = off > 0;
            let seg = Segment {
                last,
                opcode: op,
                header: header(off),
                payload: &[],
            };
            let mut head = [0u8; INLINE];
            let ulpdu_len = hlen + len;
            head[..2].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
            seg.encode_header(&mut head[2..])
                .expect("sized for the header");
            let head_len = FPDU_HEADER_LEN + hlen;
            let mut crc = if self.cfg.crc {
                crate::wire::crc32c_append(0, &head[..head_len])
            } else {
                0
            };
            if !snapshot && head_len + len + 7 <= INLINE {
                // A small segment goes out as one copied chunk: one iovec instead of three,
                // and its bytes (and CRC) are those of the moment it was posted, even if the
                // source is a word its owner keeps updating (a counter written again and
                // again).
                let mut at = head_len;
                let mut left = len;
                while left > 0 {
                    let (p, take) = pieces.next(left);
                    // SAFETY: the SGE was checked against a live local region when posted.
                    let src = unsafe { std::slice::from_raw_parts(p, take) };
                    head[at..at + take].copy_from_slice(src);
                    at += take;
                    left -= take;
                }
                if self.cfg.crc {
                    crc = crate::wire::crc32c_append(crc, &head[head_len..at]);
                }
                let mut tail = [0u8; 8];
                let t = fpdu_trailer_after(crc, ulpdu_len, self.cfg.crc, &mut tail);
                head[at..at + t].copy_from_slice(&tail[..t]);
                self.push_head(&head, at + t, joined, false);
                continue;
            }
            self.push_head(&head, head_len, joined, true);
            // A Read Response segment's own source: the message's, `off` bytes on.
            let here = source.map(|(stag, to)| (stag, to.wrapping_add(off as u64)));
            if let Some(here) = here.filter(|_| snapshot && len > 0) {
                // One extent: a Read Response's source is one checked range of one region.
                let (src, take) = pieces.next(len);
                debug_assert_eq!(take, len, "a Read Response has one source extent");
                self.push(Chunk::Snapshot {
                    src,
                    len,
                    head_crc: crc,
                    ulpdu_len,
                    source: here,
                });
                // The trailer's pad and CRC are written when the snapshot is taken.
                let pad_and_crc = (4 - (FPDU_HEADER_LEN + ulpdu_len) % 4) % 4 + 4;
                self.push_closed([0; INLINE], pad_and_crc);
                continue;
            }
            let mut left = len;
            while left > 0 {
                let (ptr, take) = pieces.next(left);
                if let Some((stag, to)) = here {
                    // Without CRC (with CRC it was a snapshot above).
                    let done = (len - left) as u64;
                    self.push(Chunk::Served {
                        src: ptr,
                        len: take,
                        source: (stag, to.wrapping_add(done)),
                    });
                    left -= take;
                    continue;
                }
                if self.cfg.crc {
                    // SAFETY: the SGE was checked against a live local region; the verbs
                    // contract keeps it untouched until the work request completes.
                    crc = crate::wire::crc32c_append(crc, unsafe {
                        std::slice::from_raw_parts(ptr, take)
                    });
                }
                self.push(Chunk::Raw(ptr, take));
                left -= take;
            }
            let mut tail = [0u8; 8];
            let n = fpdu_trailer_after(crc, ulpdu_len, self.cfg.crc, &mut tail);
            let mut inline = [0u8; INLINE];
            inline[..n].copy_from_slice(&tail[..n]);
            self.push_closed(inline, n);
        }
    }

    /// Queues a single-segment untagged control message.
    pub(super) fn queue_control(&mut self, op: RdmapOpcode, q: u32, msn: u32, body: &[u8]) {
        let seg = Segment {
            last: true,
            opcode: op,
            header: DdpHeader::Untagged {
                ulp: 0,
                qn: q,
                msn,
                mo: 0,
            },
            payload: body,
        };
        let mut b = [0u8; INLINE];
        let ulpdu_len = UNTAGGED_HEADER_LEN + body.len();
        b[..2].copy_from_slice(&(ulpdu_len as u16).to_be_bytes());
        seg.encode_header(&mut b[2..])
            .expect("sized for the header");
        let at = FPDU_HEADER_LEN + UNTAGGED_HEADER_LEN;
        b[at..at + body.len()].copy_from_slice(body);
        let end = at + body.len();
        let crc = if self.cfg.crc {
            crate::wire::crc32c_append(0, &b[..end])
        } else {
            0
        };
        let mut tail = [0u8; 8];
        let n = fpdu_trailer_after(crc, ulpdu_len, self.cfg.crc, &mut tail);
        b[end..end + n].copy_from_slice(&tail[..n]);
        self.push_closed(b, end + n);
    }

    /// Bytes handed to the transport so far.
    pub fn tx_sent(&self) -> u64 {
        self.tx_sent
    }

    /// True if bytes wait to be sent.
    pub fn wants_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// How many bytes wait to be sent.
    pub fn tx_unsent(&self) -> u64 {
        self.tx_queued - self.tx_sent
    }

    /// True while the Read Response source `(stag, to)` of `len` bytes is still registered
    /// where it was.
    fn source_live(&self, (stag, to): (u32, u64), len: usize, src: *const u8) -> bool {
        self.dev
            .check(
                Stag(stag),
                self.cfg.pd,
                self.cfg.qp_num,
                to,
                len as u64,
                Access::REMOTE_READ,
            )
            .is_ok_and(|p| std::ptr::eq(p, src))
    }

    /// Prepares the first `chunks` chunks to be read: checks that every Read Response source
    /// among them is still registered, and takes the snapshots (copies each payload and writes
    /// its CRC into the trailer chunk after it). False if a source is gone.
    fn prepare(&mut self, chunks: usize) -> bool {
        let end = chunks.min(self.tx.len());
        for i in 0..end {
            match self.tx[i] {
                Chunk::Served { src, len, source } if !self.source_live(source, len, src) => {
                    return false;
                }
                Chunk::Snapshot {
                    src,
                    len,
                    head_crc,
                    ulpdu_len,
                    source,
                } => {
                    if !self.source_live(source, len, src) {
                        return false;
                    }
                    // SAFETY: just checked: len bytes at src lie in a live region granting
                    // remote reads.
                    let (copy, crc) = super::spare::snapshot(head_crc, unsafe {
                        std::slice::from_raw_parts(src, len)
                    });
                    let mut tail = [0u8; 8];
                    let n = fpdu_trailer_after(crc, ulpdu_len, true, &mut tail);
                    if let Some(Chunk::Inline {
                        bytes: b,
                        len,
                        join,
                        ..
                    }) = self.tx.get_mut(i + 1)
                    {
                        // The chunk starts with the trailer (the next FPDU's header may follow).
                        debug_assert_eq!(
                            if *join > 0 { *join } else { *len } as usize,
                            n,
                            "the trailer chunk was sized for it"
                        );
                        b[..n].copy_from_slice(&tail[..n]);
                    }
                    self.tx[i] = Chunk::Owned(copy);
                }
                _ => {}
            }
        }
        true
    }

    /// The memory a queued Read Response comes from was deregistered: nothing more can be sent
    /// on this stream (a frame may be half out), so it stops, as a cut connection would.
    fn source_gone(&mut self) {
        self.enter_error(WcStatus::WrFlushErr);
        self.tx.clear();
        self.tx_front_off = 0;
        self.tx_queued = self.tx_sent;
        self.rx = Rx::Dead;
    }

    /// Fills `out` with the bytes to send next, in order, and returns how many slices it
    /// filled. A caller-owned array keeps the transmit path free of allocations (but for the
    /// snapshots of Read Responses on a stream with CRC, taken here, just before they go).
    /// Zero with bytes still queued never happens, except when a Read Response's source was
    /// deregistered: then the stream has stopped (see [`Stream::rx_dead`]) and the connection
    /// should be closed.
    pub fn tx_iovecs<'a>(&'a mut self, out: &mut [IoSlice<'a>]) -> usize {
        // Snapshots worth at most `spare::BUDGET` per send, so that they all go back to be kept.
        let mut snapshots = 0;
        let n = self
            .tx
            .iter()
            .take(out.len())
            .take_while(|c| {
                snapshots += c.snapshot_charge();
                snapshots <= super::spare::BUDGET
            })
            .count();
        if !self.prepare(n) {
            self.source_gone();
            return 0;
        }
        for (i, c) in self.tx.iter().enumerate().take(n) {
            let skip = if i == 0 { self.tx_front_off } else { 0 };
            out[i] = IoSlice::new(c.prepared(skip));
        }
        n
    }

    /// Copies every byte queued to send into `out` when they all fit there, and returns how
    /// many: a small send (a latency-bound message, an acknowledgement) then goes out as one
    /// buffer, with no gather list built and read back. `None` when more is queued than `out`
    /// holds, or more snapshots than one send takes (see [`Stream::tx_iovecs`], which lists
    /// them then). As with `tx_iovecs`, 0 with bytes queued means the stream has stopped (a
    /// Read Response's source was deregistered); nothing is taken until the caller says so
    /// (`tx_advance`, or `tx_take` and `tx_settle`).
    ///
    /// ```
    /// use barewire_soft_rdma::stream::*;
    /// use barewire_soft_rdma::verbs::*;
    ///
    /// let cfg = |qp, pd| StreamConfig { qp_num: qp, pd, crc: false, mulpdu: 1024, ird: 4, ord: 4, remote_completion: false };
    /// let (da, db) = (Device::new(), Device::new());
    /// let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
    /// let (acq, bcq) = (CompletionQueue::new(8), CompletionQueue::new(8));
    /// let mut a = Stream::new(da.clone(), cfg(1, pa.id()), acq.clone(), acq.clone());
    /// let mut b = Stream::new(db.clone(), cfg(2, pb.id()), bcq.clone(), bcq.clone());
    /// let mut src = 42u64.to_le_bytes();
    /// let mut dst = [0u8; 8];
    /// // SAFETY: both buffers outlive their regions.
    /// let smr = unsafe { pa.register(src.as_mut_ptr(), 8, Access::LOCAL_WRITE) }.unwrap();
    /// let dmr = unsafe { pb.register(dst.as_mut_ptr(), 8, Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.unwrap();
    /// a.post_send(SendWr {
    ///     wr_id: 1,
    ///     op: SendOp::Write { remote_addr: dmr.addr() as u64, rkey: dmr.stag() },
    ///     sges: [Sge { addr: smr.addr() as u64, len: 8, lkey: smr.stag() }].into(),
    ///     signaled: false,
    ///     fence: false,
    /// }).unwrap();
    ///
    /// // An 8-byte Write is one 28-byte FPDU: more than 16 bytes, less than 512.
    /// assert_eq!(a.tx_copy(&mut [0u8; 16]), None);
    /// let mut small = [0u8; 512];
    /// let n = a.tx_copy(&mut small).unwrap();
    /// assert_eq!(n, 28);
    /// a.tx_advance(n); // the socket took them all
    /// assert_eq!(b.rx_feed(&small[..n]), n);
    /// assert_eq!(u64::from_le_bytes(dst), 42);
    /// ```
    pub fn tx_copy(&mut self, out: &mut [u8]) -> Option<usize> {
        let queued = self.tx_unsent();
        if queued > out.len() as u64 {
            return None;
        }
        if self
            .tx
            .iter()
            .any(|c| matches!(c, Chunk::Served { .. } | Chunk::Snapshot { .. }))
        {
            // Read Response payloads: their sources are checked again, and snapshots taken,
            // no more of them than one send takes.
            let snapshots: usize = self.tx.iter().map(Chunk::snapshot_charge).sum();
            if snapshots > super::spare::BUDGET {
                return None;
            }
            if !self.prepare(self.tx.len()) {
                self.source_gone();
                return Some(0);
            }
        }
        let (mut at, mut skip) = (0, self.tx_front_off);
        for c in &self.tx {
            let b = c.prepared(skip);
            out[at..at + b.len()].copy_from_slice(b);
            at += b.len();
            skip = 0;
        }
        debug_assert_eq!(at as u64, queued, "tx_queued counts what the chunks hold");
        Some(at)
    }

    /// An asynchronous send took the first `n` bytes of `tx_iovecs` (its completion reports
    /// how many went: `tx_settle`). Until then `enter_error` keeps the chunks holding them.
    pub fn tx_take(&mut self, n: usize) {
        self.tx_taken = n;
    }

    /// The asynchronous send that took bytes completed: `sent` of them went (0 if none).
    pub fn tx_settle(&mut self, sent: usize) {
        self.tx_taken = 0;
        if sent > 0 {
            self.tx_advance(sent);
        }
    }

    /// `n` bytes from the front of `tx_iovecs` were sent: releases them and completes the work
    /// requests (and inbound Reads) they finished.
    pub fn tx_advance(&mut self, mut n: usize) {
        self.tx_sent += n as u64;
        while n > 0 {
            let Some(front) = self.tx.front() else {
                // Sending more than was queued is a bug of the caller's; fail loudly in tests,
                // and never take a node down for it.
                debug_assert!(false, "advanced past the queued bytes");
                break;
            };
            let left = front.len() - self.tx_front_off;
            if n >= left {
                n -= left;
                let sent = self.tx.pop_front().expect("checked");
                self.tx_open = !sent.ends_fpdu();
                if let Chunk::Owned(buf) = sent {
                    super::spare::give_back(buf);
                }
                self.tx_front_off = 0;
            } else {
                self.tx_front_off += n;
                n = 0;
            }
        }
        while self.marks.front().is_some_and(|m| m.until <= self.tx_sent) {
            let m = self.marks.pop_front().expect("checked");
            if m.inbound_read {
                self.inbound_reads -= 1;
            }
            if let Some((seq, wc, report)) = m.sq {
                let report = report || wc.status != WcStatus::Success;
                self.sq_complete(seq, report.then_some(wc));
            }
        }
    }
}

/// Walks a message's payload extents, a piece at a time.
struct Pieces<'a> {
    extents: &'a [(*const u8, usize)],
    /// The extent being walked, and how far into it.
    at: usize,
    off: usize,
}

impl Pieces<'_> {
    /// The next piece: where it starts and its length (at most `max`, and within one extent).
    /// Empty extents (gather entries of length 0) are passed over, so no piece is empty; called
    /// only while bytes remain, so a non-empty extent follows.
    fn next(&mut self, max: usize) -> (*const u8, usize) {
        while self.extents[self.at].1 == 0 {
            self.at += 1;
        }
        let (p, n) = self.extents[self.at];
        let take = (n - self.off).min(max);
        let piece = (p.wrapping_add(self.off), take);
        self.off += take;
        if self.off == n {
            self.at += 1;
            self.off = 0;
        }
        piece
    }
}
