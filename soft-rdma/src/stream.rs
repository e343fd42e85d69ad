//! The RDMAP stream of one reliable-connected queue pair, without I/O: work requests go in,
//! bytes to send come out as a gather list, received bytes go straight to where they belong,
//! and completions land in the completion queues.
//!
//! Receive is zero-copy: [`Stream::rx_buffer`] says where the next bytes must be written —
//! a small scratch buffer while a header is read, then the target region itself once the
//! header has been checked (tagged: the STag's region; untagged: the posted receive's buffers).
//! The I/O layer `recv`s directly into that pointer. Nothing is written into a region before
//! its STag, domain, bounds and rights have been checked; a violation answers with a
//! Terminate and moves only this queue pair to ERROR.
//!
//! Send is zero-copy too: [`Stream::tx_iovecs`] lists headers (small owned buffers) and
//! payloads (pointers into the registered source memory) for one `sendmsg`.
//!
//! A connection that presents an invalid STag — or breaks any other protection rule — is cut at
//! the first offence: the Terminate goes out and the queue pair moves to ERROR. The threshold is
//! one, so a peer gets a single guess before it must reconnect (and every STag is random, see
//! [`crate::verbs`]): probing STags one connection at a time is as slow as reconnecting.
//!
//! Completion semantics follow iWARP (and Linux siw): a Send or RDMA Write completes when its
//! last byte has been handed to TCP; an RDMA Read completes when the last Read Response
//! segment has been placed. A Terminate from the peer fails the outstanding Reads with the
//! status its code maps to and flushes everything else.

use std::collections::VecDeque;
use std::io::IoSlice;

use crate::verbs::{
    Access, CompletionQueue, Device, QpState, Stag, Violation, WcOpcode, WcStatus, WorkCompletion,
};
use crate::wire::{
    fpdu_trailer_after, qn, split, AtomicOp, AtomicRequest, AtomicResponse, DdpHeader,
    DdpUntaggedErrorCode, ImmediateData, Layer, RdmapErrorCode, RdmapErrorType, RdmapOpcode,
    ReadRequest, Reassembly, Segment, TermCode, Terminate, FPDU_HEADER_LEN, TAGGED_HEADER_LEN,
    UNTAGGED_HEADER_LEN,
};

/// One scatter/gather element: `len` bytes at `addr` in the local region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// The local region's STag.
    pub lkey: Stag,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// A Send into the peer's next posted receive; `invalidate` names a peer STag to invalidate.
    Send {
        /// Ask for a solicited event at the receiver.
        solicited: bool,
        /// Send with Invalidate.
        invalidate: Option<Stag>,
    },
    /// An RDMA Write to `remote_addr` in the peer's region `rkey`.
    Write {
        /// Target address.
        remote_addr: u64,
        /// Target region.
        rkey: Stag,
    },
    /// An RDMA Read from `remote_addr` in the peer's region `rkey` into the (single) local SGE.
    Read {
        /// Source address.
        remote_addr: u64,
        /// Source region.
        rkey: Stag,
    },
    /// An RDMA Write followed by RFC 7306 Immediate Data: the peer's next receive completes
    /// with `imm` (as `RecvRdmaWithImm`) once the written data is in place.
    WriteWithImm {
        /// Target address.
        remote_addr: u64,
        /// Target region.
        rkey: Stag,
        /// Delivered in the receiver's completion.
        imm: u32,
    },
    /// Adds `add` to the 8-byte word at `remote_addr`; the original value lands in the single
    /// 8-byte local SGE.
    FetchAdd {
        /// Target word (8-byte aligned).
        remote_addr: u64,
        /// Target region (needs REMOTE_ATOMIC).
        rkey: Stag,
        /// Addend.
        add: u64,
    },
    /// Replaces the word with `swap` if it equals `compare`; the original lands locally.
    CmpSwap {
        /// Target word (8-byte aligned).
        remote_addr: u64,
        /// Target region (needs REMOTE_ATOMIC).
        rkey: Stag,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Invalidates one of this side's own STags (ibv_post_send(3) `IBV_WR_LOCAL_INV`), in
    /// order with the requests before it: later remote accesses with it fail.
    LocalInvalidate {
        /// The STag to invalidate.
        stag: Stag,
    },
    /// Replaces the word with `swap` unconditionally; the original lands locally.
    Swap {
        /// Target word (8-byte aligned).
        remote_addr: u64,
        /// Target region (needs REMOTE_ATOMIC).
        rkey: Stag,
        /// New value.
        swap: u64,
    },
}

/// A send work request (`struct ibv_send_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local memory: the payload of a Send/Write, the sink of a Read.
    pub sges: Vec<Sge>,
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
    /// `IBV_SEND_FENCE`: start only after every earlier RDMA Read and atomic has completed
    /// (so this request sees their effects, e.g. a Send that announces data just read).
    pub fence: bool,
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send lands, in order.
    pub sges: Vec<Sge>,
}

/// Negotiated parameters of the stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
    /// This queue pair's number.
    pub qp_num: u32,
    /// The protection domain.
    pub pd: u32,
    /// CRC32c on every FPDU.
    pub crc: bool,
    /// Largest ULPDU to send (the MULPDU, from the TCP MSS).
    pub mulpdu: usize,
    /// Inbound Reads the peer may have outstanding.
    pub ird: u16,
    /// Outbound Reads we may have outstanding.
    pub ord: u16,
    /// Complete signaled Sends and Writes only once the peer has processed them, as InfiniBand
    /// RC does, instead of when the bytes reach TCP (plain iWARP). A zero-length RDMA Read
    /// follows each such request; its response is the acknowledgement, so a request the peer
    /// refuses completes with the peer's error (`REM_ACCESS_ERR`, ...) rather than `SUCCESS`.
    /// Costs a round trip per signaled request and an ORD slot while it waits.
    pub remote_completion: bool,
}

/// Why a post was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The queue pair's state does not accept this post.
    #[error("queue pair in state {0:?} does not accept this work request")]
    State(QpState),
}

/// Room for any header, trailer or whole control FPDU (the largest, an Atomic Request, is
/// 2 + 18 + 56 + 7 = 83 bytes), so queuing one never allocates.
const INLINE: usize = 96;

enum Chunk {
    /// Bytes of ours: a header, a trailer, a control message.
    Inline([u8; INLINE], u8),
    /// Payload bytes in a registered region, sent from where they are.
    Raw(*const u8, usize),
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Inline(_, n) => *n as usize,
            Chunk::Raw(_, n) => *n,
        }
    }
}

/// A completion due once the transmit stream has sent `until` bytes.
struct TxMark {
    until: u64,
    /// The send-queue request it completes: its sequence number, its completion, and whether
    /// that completion is reported on success (errors always are).
    sq: Option<(u64, WorkCompletion, bool)>,
    inbound_read: bool,
}

struct OutstandingRead {
    /// The request's place in the send queue's completion order.
    seq: u64,
    wr_id: u64,
    len: u32,
    signaled: bool,
    /// For an atomic: the request id, where the original value goes, and the opcode.
    atomic: Option<(u32, *mut u8, WcOpcode)>,
    /// The completion's opcode (a Read, or the Send/Write a zero-length Read acknowledges).
    opcode: WcOpcode,
}

enum Rx {
    /// Reading the 2-byte length and the 2 control bytes into `hdr`.
    Start { have: usize },
    /// Reading the rest of the header into `hdr`.
    Header { have: usize, need: usize },
    /// Payload straight into memory, extent by extent.
    Payload,
    /// A control message's body into `body`.
    Body { have: usize, need: usize },
    /// Pad and CRC field.
    Trailer { have: usize, need: usize },
    /// After a fatal error: nothing more is accepted.
    Dead,
}

/// Where the current segment's payload goes.
enum Place {
    Tagged {
        last: bool,
        read_response: bool,
    },
    Untagged {
        last: bool,
        len: u32,
        solicited: bool,
        invalidated: Option<u32>,
    },
    Control {
        opcode: RdmapOpcode,
    },
}

/// The RDMAP stream of one connected queue pair.
///
/// Two streams wired back to back in memory, one Write from A into B's region:
///
/// ```
/// use barewire_soft_rdma::stream::*;
/// use barewire_soft_rdma::verbs::*;
///
/// let cfg = |qp, pd| StreamConfig { qp_num: qp, pd, crc: true, mulpdu: 1024, ird: 4, ord: 4, remote_completion: false };
/// let (da, db) = (Device::new(), Device::new());
/// let (pa, pb) = (da.alloc_pd(), db.alloc_pd());
/// let (acq, bcq) = (CompletionQueue::new(8), CompletionQueue::new(8));
/// let mut a = Stream::new(da.clone(), cfg(1, pa.id()), acq.clone(), acq.clone());
/// let mut b = Stream::new(db.clone(), cfg(2, pb.id()), bcq.clone(), bcq.clone());
///
/// let mut src = vec![7u8; 3000];
/// let mut dst = vec![0u8; 3000];
/// // SAFETY: both buffers outlive their regions.
/// let smr = unsafe { pa.register(src.as_mut_ptr(), src.len(), Access::LOCAL_WRITE) }.unwrap();
/// let dmr = unsafe { pb.register(dst.as_mut_ptr(), dst.len(), Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.unwrap();
/// a.post_send(SendWr {
///     wr_id: 1,
///     op: SendOp::Write { remote_addr: dmr.addr() as u64, rkey: dmr.stag() },
///     sges: vec![Sge { addr: smr.addr() as u64, len: 3000, lkey: smr.stag() }],
///     signaled: true,
///     fence: false,
/// }).unwrap();
///
/// // The I/O layer's job: A's gather list out, into B's receive buffer.
/// let mut wire = Vec::new();
/// let mut iov = [std::io::IoSlice::new(&[]); 64];
/// let n = a.tx_iovecs(&mut iov);
/// iov[..n].iter().for_each(|s| wire.extend_from_slice(s));
/// a.tx_advance(wire.len());
/// b.rx_feed(&wire);
///
/// drop((smr, dmr));
/// assert!(dst.iter().all(|&x| x == 7));
/// ```
pub struct Stream {
    dev: Device,
    cfg: StreamConfig,
    /// Bytes of the RDMA Write message being received, and of the last one completed: a Write
    /// with Immediate's receive completion reports the Write's length (`byte_len`), as verbs
    /// do for `IBV_WC_RECV_RDMA_WITH_IMM`.
    write_run: u64,
    last_write_len: u64,
    state: QpState,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    // Transmit.
    tx: VecDeque<Chunk>,
    tx_front_off: usize,
    tx_queued: u64,
    tx_sent: u64,
    marks: VecDeque<TxMark>,
    /// Send-queue completions are reported in posting order (as verbs requires): each started
    /// request gets a sequence number, and finished ones wait here for those before them.
    next_seq: u64,
    released_seq: u64,
    done: std::collections::BTreeMap<u64, Option<WorkCompletion>>,
    tx_msn: [u32; crate::wire::QUEUES],
    orq: VecDeque<OutstandingRead>,
    blocked: VecDeque<SendWr>,
    inbound_reads: usize,
    atomic_id: u32,
    terminate_sent: bool,
    // Receive.
    rx: Rx,
    hdr: [u8; FPDU_HEADER_LEN + UNTAGGED_HEADER_LEN],
    body: [u8; 64],
    trailer: [u8; 8],
    crc: u32,
    ulpdu_len: usize,
    extents: VecDeque<(*mut u8, usize)>,
    /// Scratch: the local extents of the send request being started.
    tx_extents: Vec<(*const u8, usize)>,
    place: Option<Place>,
    reassembly: Reassembly,
    rq: VecDeque<RecvWr>,
    recv_placed: u32,
    last_terminate: Option<TermCode>,
}

fn status_for(code: TermCode) -> WcStatus {
    match (code.layer, code.etype) {
        (Layer::Rdmap, 1) | (Layer::Ddp, 1) => WcStatus::RemAccessErr,
        (Layer::Ddp, 2) => WcStatus::RemInvReqErr,
        _ => WcStatus::RemOpErr,
    }
}

impl Stream {
    /// A stream in RTS, with completions going to `scq` (sends) and `rcq` (receives).
    pub fn new(
        dev: Device,
        cfg: StreamConfig,
        scq: CompletionQueue,
        rcq: CompletionQueue,
    ) -> Stream {
        Stream {
            dev,
            cfg,
            state: QpState::Rts,
            scq,
            rcq,
            tx: VecDeque::new(),
            tx_front_off: 0,
            tx_queued: 0,
            tx_sent: 0,
            marks: VecDeque::new(),
            next_seq: 0,
            released_seq: 0,
            done: std::collections::BTreeMap::new(),
            tx_msn: [1; crate::wire::QUEUES],
            orq: VecDeque::new(),
            blocked: VecDeque::new(),
            inbound_reads: 0,
            atomic_id: 0,
            terminate_sent: false,
            rx: Rx::Start { have: 0 },
            hdr: [0; FPDU_HEADER_LEN + UNTAGGED_HEADER_LEN],
            body: [0; 64],
            trailer: [0; 8],
            crc: 0,
            ulpdu_len: 0,
            extents: VecDeque::new(),
            tx_extents: Vec::new(),
            place: None,
            reassembly: Reassembly::default(),
            rq: VecDeque::new(),
            recv_placed: 0,
            last_terminate: None,
            write_run: 0,
            last_write_len: 0,
        }
    }

    /// The queue pair's state.
    pub fn state(&self) -> QpState {
        self.state
    }

    /// True while the peer owes us something: bytes still queued to send, or Read Responses.
    /// A stalled or vanished peer shows up as this staying true without progress.
    pub fn awaiting_peer(&self) -> bool {
        !self.orq.is_empty() || self.wants_tx()
    }

    /// True once receiving has stopped (a Terminate was sent or received).
    pub fn rx_dead(&self) -> bool {
        matches!(self.rx, Rx::Dead)
    }

    /// The Terminate code that broke the stream, sent or received.
    pub fn last_terminate(&self) -> Option<TermCode> {
        self.last_terminate
    }

    fn complete(
        &self,
        cq: &CompletionQueue,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
    ) {
        cq.push(WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm: None,
            invalidated: None,
            solicited: false,
            qp_num: self.cfg.qp_num,
        });
    }

    /// Records the end of send-queue request `seq` and reports, in order, every completion no
    /// longer waiting for an earlier one.
    fn sq_complete(&mut self, seq: u64, wc: Option<WorkCompletion>) {
        self.done.insert(seq, wc);
        while let Some(wc) = self.done.remove(&self.released_seq) {
            if let Some(wc) = wc {
                self.scq.push(wc);
            }
            self.released_seq += 1;
        }
    }

    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm: None,
            invalidated: None,
            solicited: false,
            qp_num: self.cfg.qp_num,
        }
    }

    /// Fails a started request, in order.
    fn sq_fail(&mut self, seq: u64, wr_id: u64, status: WcStatus, opcode: WcOpcode) {
        let wc = self.wc(wr_id, status, opcode, 0);
        self.sq_complete(seq, Some(wc));
    }

    /// Posts a receive.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state == QpState::Error {
            self.complete(&self.rcq, wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
            return Ok(());
        }
        if !self.state.can_post_recv() {
            return Err(PostError::State(self.state));
        }
        for s in &wr.sges {
            if self
                .dev
                .check_local(s.lkey, self.cfg.pd, s.addr, s.len as u64, true)
                .is_err()
            {
                self.complete(&self.rcq, wr.wr_id, WcStatus::LocProtErr, WcOpcode::Recv, 0);
                return Ok(());
            }
        }
        self.rq.push_back(wr);
        Ok(())
    }

    /// Posts a send work request.
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        if self.state == QpState::Error {
            self.complete(
                &self.scq,
                wr.wr_id,
                WcStatus::WrFlushErr,
                opcode_of(&wr.op),
                0,
            );
            return Ok(());
        }
        if !self.state.can_post_send() {
            return Err(PostError::State(self.state));
        }
        if !self.blocked.is_empty() || self.must_wait(&wr) {
            // RDMAP ordering: nothing overtakes a Read waiting for an ORD slot or a fenced
            // request waiting for earlier Reads and atomics.
            self.blocked.push_back(wr);
            return Ok(());
        }
        self.start(wr);
        Ok(())
    }

    fn start(&mut self, wr: SendWr) {
        // The local extents of each request reuse one list (no allocation per request).
        let mut extents = std::mem::take(&mut self.tx_extents);
        extents.clear();
        self.start_with(wr, &mut extents);
        self.tx_extents = extents;
    }

    fn start_with(&mut self, wr: SendWr, extents: &mut Vec<(*const u8, usize)>) {
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
        let write_local = wr.op.needs_ord();
        let mut total: u64 = 0;
        for s in &wr.sges {
            match self
                .dev
                .check_local(s.lkey, self.cfg.pd, s.addr, s.len as u64, write_local)
            {
                Ok(p) => extents.push((p as *const u8, s.len as usize)),
                Err(_) => {
                    return self.sq_fail(seq, wr.wr_id, WcStatus::LocProtErr, opcode_of(&wr.op))
                }
            }
            total += s.len as u64;
        }
        if total > u32::MAX as u64 {
            return self.sq_fail(seq, wr.wr_id, WcStatus::LocLenErr, opcode_of(&wr.op));
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
                    return self.sq_fail(seq, wr.wr_id, WcStatus::LocLenErr, opcode_of(&wr.op));
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
                    atomic: Some((self.atomic_id, *sink_ptr as *mut u8, opcode_of(&wr.op))),
                    opcode: opcode_of(&wr.op),
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
                opcode: opcode_of(&wr.op),
            });
            return;
        }
        let wc = self.wc(wr.wr_id, WcStatus::Success, opcode_of(&wr.op), total as u32);
        self.marks.push_back(TxMark {
            until: self.tx_queued,
            sq: Some((seq, wc, wr.signaled)),
            inbound_read: false,
        });
    }

    /// Queues an RDMA Write of `extents` to `remote_addr` in the peer's region `rkey`.
    fn queue_write(&mut self, extents: &[(*const u8, usize)], remote_addr: u64, rkey: Stag) {
        let header = |off: usize| DdpHeader::Tagged {
            stag: rkey.0,
            to: remote_addr + off as u64,
        };
        self.queue_message(RdmapOpcode::Write, extents, header, TAGGED_HEADER_LEN);
    }

    /// Queues a Read Request (QN 1, the next MSN).
    fn queue_read_request(&mut self, rr: &ReadRequest) {
        let mut body = [0u8; ReadRequest::LEN];
        rr.encode(&mut body);
        let msn = self.next_msn(qn::READ_REQUEST);
        self.queue_control(RdmapOpcode::ReadRequest, qn::READ_REQUEST, msn, &body);
    }

    fn next_msn(&mut self, q: u32) -> u32 {
        let m = self.tx_msn[q as usize];
        self.tx_msn[q as usize] = m.wrapping_add(1);
        m
    }

    fn push(&mut self, c: Chunk) {
        self.tx_queued += c.len() as u64;
        self.tx.push_back(c);
    }

    /// Queues a (possibly segmented) message whose payload lies in `extents`.
    fn queue_message(
        &mut self,
        op: RdmapOpcode,
        extents: &[(*const u8, usize)],
        header: impl Fn(usize) -> DdpHeader,
        hlen: usize,
    ) {
        let total: usize = extents.iter().map(|e| e.1).sum();
        let mut ext = 0;
        let mut ext_off = 0;
        for (off, len, last) in split(total, hlen, self.cfg.mulpdu) {
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
                crc32c::crc32c(&head[..head_len])
            } else {
                0
            };
            self.push(Chunk::Inline(head, head_len as u8));
            let mut left = len;
            while left > 0 {
                let (p, n) = extents[ext];
                let take = (n - ext_off).min(left);
                let ptr = p.wrapping_add(ext_off);
                if self.cfg.crc {
                    // SAFETY: the SGE was checked against a live local region; the verbs
                    // contract keeps it untouched until the work request completes.
                    crc = crc32c::crc32c_append(crc, unsafe {
                        std::slice::from_raw_parts(ptr, take)
                    });
                }
                self.push(Chunk::Raw(ptr, take));
                left -= take;
                ext_off += take;
                if ext_off == n {
                    ext += 1;
                    ext_off = 0;
                }
            }
            let mut tail = [0u8; 8];
            let n = fpdu_trailer_after(crc, ulpdu_len, self.cfg.crc, &mut tail);
            let mut inline = [0u8; INLINE];
            inline[..n].copy_from_slice(&tail[..n]);
            self.push(Chunk::Inline(inline, n as u8));
        }
    }

    /// Queues a single-segment untagged control message.
    fn queue_control(&mut self, op: RdmapOpcode, q: u32, msn: u32, body: &[u8]) {
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
            crc32c::crc32c(&b[..end])
        } else {
            0
        };
        let mut tail = [0u8; 8];
        let n = fpdu_trailer_after(crc, ulpdu_len, self.cfg.crc, &mut tail);
        b[end..end + n].copy_from_slice(&tail[..n]);
        self.push(Chunk::Inline(b, (end + n) as u8));
    }

    /// True if bytes wait to be sent.
    pub fn wants_tx(&self) -> bool {
        !self.tx.is_empty()
    }

    /// Fills `out` with the bytes to send next, in order, and returns how many slices it
    /// filled. A caller-owned array keeps the transmit path free of allocations.
    pub fn tx_iovecs<'a>(&'a self, out: &mut [IoSlice<'a>]) -> usize {
        let n = out.len().min(self.tx.len());
        for (i, c) in self.tx.iter().enumerate().take(n) {
            let skip = if i == 0 { self.tx_front_off } else { 0 };
            let s: &'a [u8] = match c {
                Chunk::Inline(b, n) => &b[skip..*n as usize],
                // SAFETY: Raw chunks point into checked local regions that the verbs contract
                // keeps alive and unchanged until the work request completes.
                Chunk::Raw(p, n) => unsafe { std::slice::from_raw_parts(p.add(skip), n - skip) },
            };
            out[i] = IoSlice::new(s);
        }
        n
    }

    /// `n` bytes from the front of `tx_iovecs` were sent: releases them and completes the work
    /// requests (and inbound Reads) they finished.
    pub fn tx_advance(&mut self, mut n: usize) {
        self.tx_sent += n as u64;
        while n > 0 {
            let front = self.tx.front().expect("advanced past the queued bytes");
            let left = front.len() - self.tx_front_off;
            if n >= left {
                n -= left;
                self.tx.pop_front();
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

    fn begin_trailer(&mut self) {
        let need = (4 - (FPDU_HEADER_LEN + self.ulpdu_len) % 4) % 4 + 4;
        self.rx = Rx::Trailer { have: 0, need };
    }

    fn on_header(&mut self, hend: usize) {
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

    fn on_segment_done(&mut self) {
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
    fn over_ird(&mut self) -> bool {
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

    fn on_control(&mut self, opcode: RdmapOpcode, body: &[u8]) {
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

    /// Whether the request will occupy an ORD slot: Reads, atomics, and acknowledged requests.
    fn takes_ord(&self, wr: &SendWr) -> bool {
        wr.op.needs_ord()
            || (self.cfg.remote_completion
                && wr.signaled
                && matches!(
                    wr.op,
                    SendOp::Send { .. } | SendOp::Write { .. } | SendOp::WriteWithImm { .. }
                ))
    }

    fn must_wait(&self, wr: &SendWr) -> bool {
        (self.takes_ord(wr) && self.orq.len() >= self.cfg.ord as usize)
            || (wr.fence && !self.orq.is_empty())
    }

    fn unblock(&mut self) {
        while let Some(wr) = self.blocked.front() {
            if self.must_wait(wr) {
                return;
            }
            let wr = self.blocked.pop_front().expect("peeked");
            self.start(wr);
        }
    }

    /// A received violation: answer with a Terminate (quoting the failing header when `hend`
    /// says where it is) and stop receiving.
    fn fatal(&mut self, code: TermCode, hend: Option<usize>) {
        let ddp = hend.map(|e| {
            let mut h = [0u8; UNTAGGED_HEADER_LEN];
            let n = e - FPDU_HEADER_LEN;
            h[..n].copy_from_slice(&self.hdr[FPDU_HEADER_LEN..e]);
            (self.ulpdu_len as u16, h, n)
        });
        self.send_terminate(Terminate {
            code,
            m: true,
            ddp,
            rdmap: None,
        });
        self.rx = Rx::Dead;
    }

    fn send_terminate(&mut self, t: Terminate) {
        self.last_terminate = Some(t.code);
        if !self.terminate_sent {
            self.terminate_sent = true;
            let mut body = [0u8; 80];
            let n = t.encode(&mut body).expect("fits");
            let msn = self.next_msn(qn::TERMINATE);
            self.queue_control(RdmapOpcode::Terminate, qn::TERMINATE, msn, &body[..n]);
        }
        self.enter_error(WcStatus::WrFlushErr);
        self.rx = Rx::Dead;
    }

    /// Moves to ERROR: outstanding Reads complete with `read_status`, everything else flushes.
    /// Bytes already queued (a Terminate among them) may still be sent.
    pub fn enter_error(&mut self, read_status: WcStatus) {
        if self.state == QpState::Error {
            return;
        }
        self.state = QpState::Error;
        // Started requests fail in their order: Reads and atomics (and acknowledged requests)
        // with the peer's verdict, the rest flushed. Then the ones that never started.
        for r in std::mem::take(&mut self.orq) {
            let wc = self.wc(r.wr_id, read_status, r.opcode, 0);
            self.sq_complete(r.seq, Some(wc));
        }
        // Sends and Writes not yet fully handed to TCP will not be: flush them, and keep only
        // a Terminate that is still queued.
        for m in std::mem::take(&mut self.marks) {
            if let Some((seq, wc, _)) = m.sq {
                self.sq_complete(
                    seq,
                    Some(WorkCompletion {
                        status: WcStatus::WrFlushErr,
                        byte_len: 0,
                        ..wc
                    }),
                );
            }
        }
        for wr in std::mem::take(&mut self.blocked) {
            let wc = self.wc(wr.wr_id, WcStatus::WrFlushErr, opcode_of(&wr.op), 0);
            self.scq.push(wc);
        }
        for wr in std::mem::take(&mut self.rq) {
            self.complete(&self.rcq, wr.wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
        }
        if self.terminate_sent {
            // The Terminate is the last chunk queued; drop everything before it that was not
            // started, so it goes out promptly.
            if let Some(last) = self.tx.pop_back() {
                let started = self.tx_front_off > 0;
                let front = if started { self.tx.pop_front() } else { None };
                self.tx.clear();
                if let Some(f) = front {
                    self.tx.push_back(f);
                } else {
                    self.tx_front_off = 0;
                }
                self.tx.push_back(last);
            }
        } else {
            let started = self.tx_front_off > 0;
            let front = if started { self.tx.pop_front() } else { None };
            self.tx.clear();
            if let Some(f) = front {
                self.tx.push_back(f);
            } else {
                self.tx_front_off = 0;
            }
        }
        self.tx_queued = self.tx_sent + self.tx.iter().map(|c| c.len() as u64).sum::<u64>()
            - self.tx_front_off as u64;
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

fn opcode_of(op: &SendOp) -> WcOpcode {
    match op {
        SendOp::Send { .. } => WcOpcode::Send,
        SendOp::Write { .. } => WcOpcode::RdmaWrite,
        SendOp::Read { .. } => WcOpcode::RdmaRead,
        SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::CmpSwap { .. } | SendOp::Swap { .. } => WcOpcode::CompSwap,
        SendOp::LocalInvalidate { .. } => WcOpcode::LocalInv,
    }
}

impl SendOp {
    /// Reads and atomics take an ORD slot and write into local memory.
    fn needs_ord(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::CmpSwap { .. }
                | SendOp::Swap { .. }
        )
    }
}
