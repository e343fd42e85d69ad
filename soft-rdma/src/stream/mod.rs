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

#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzz;
mod rx;
mod tx;

use std::collections::VecDeque;
use std::io::IoSlice;

use crate::verbs::{
    Access, CompletionQueue, Device, QpState, Stag, Violation, ViolationTerm, WcOpcode, WcStatus,
    WorkCompletion,
};
use crate::wire::{
    fpdu_trailer_after, qn, split, AtomicOp, AtomicRequest, AtomicResponse, DdpHeader,
    DdpTaggedErrorCode, DdpUntaggedErrorCode, Framer, ImmediateData, Layer, RdmapErrorCode,
    RdmapErrorType, RdmapOpcode, ReadRequest, Reassembly, Segment, Step, TermCode, Terminate,
    WireError, FPDU_HEADER_LEN, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};

pub use barewire_rdma_types::{RecvWr, SendOp, SendWr, Sge, Sges};

/// Which of the queue pair's two completion queues a completion goes to.
#[derive(Clone, Copy)]
enum Queue {
    Send,
    Recv,
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
    /// Bytes of ours: a header, a trailer, a whole small FPDU, a control message.
    Inline {
        bytes: [u8; INLINE],
        /// How many.
        len: u8,
        /// Where the FPDU they begin starts when they also end the one before (an FPDU's
        /// trailer with the next FPDU's header: see `Stream::push_head`), else 0.
        join: u8,
        /// They end inside an FPDU (a header whose payload follows in other chunks).
        open: bool,
    },
    /// Payload bytes in a registered region, sent from where they are.
    Raw(*const u8, usize),
    /// A Read Response segment's payload on a stream with CRC, still in the region: copied
    /// (and its CRC computed into the trailer chunk that follows) just before its first byte
    /// is sent. The responder's region may change after the Read Request (a later Write on
    /// any stream, the owner's CPU), so the CRC must cover exactly the bytes that leave; and
    /// copying one segment at a time keeps the memory bounded whatever size a peer reads.
    Snapshot {
        src: *const u8,
        len: usize,
        /// CRC32c of the segment's length field and headers.
        head_crc: u32,
        ulpdu_len: usize,
        /// Where the bytes come from, re-checked before they are read.
        source: (u32, u64),
    },
    /// A Read Response payload piece on a stream without CRC, sent from where it is once its
    /// source (STag, tagged offset) has been checked again: the owner may have deregistered
    /// the region since the Read Request arrived, and its memory may be gone.
    Served {
        src: *const u8,
        len: usize,
        source: (u32, u64),
    },
    /// A snapshot taken, in a buffer from the thread's [`spare`] ones.
    Owned(Vec<u8>),
}

impl Chunk {
    /// The chunk's bytes from `skip` on, once `Stream::prepare` has run over it (which
    /// checked a Served source and took a Snapshot's copy).
    fn prepared(&self, skip: usize) -> &[u8] {
        match self {
            Chunk::Inline { bytes, len, .. } => &bytes[skip..*len as usize],
            // SAFETY: Raw chunks point into checked local regions that the verbs contract
            // keeps alive and unchanged until the work request completes; Served ones were
            // checked to be live in `prepare` just before, and nothing runs between there and
            // the send that could deregister them.
            Chunk::Raw(p, n) | Chunk::Served { src: p, len: n, .. } => unsafe {
                std::slice::from_raw_parts(p.add(skip), n - skip)
            },
            Chunk::Owned(b) => &b[skip..],
            Chunk::Snapshot { .. } => unreachable!("taken in prepare"),
        }
    }
}

/// Read Response snapshots reuse buffers kept per thread (a core's streams take turns with
/// them). A fresh allocation for every snapshot met memory the allocator had just given back to
/// the system, so each one faulted its pages in again: 2.5-4 page faults per 64 KiB READ served
/// with CRC, and half the bandwidth of a run whose allocator kept its memory.
///
/// The buffers are counted in bytes: a thread keeps at most [`spare::BUDGET`] (1 MiB, whatever
/// its queue pairs do), and one send takes snapshots worth at most that much
/// ([`spare::charge`], [`Stream::tx_iovecs`]), so in a steady stream of responses every
/// snapshot finds a kept buffer. Counting buffers instead (eight a send) capped a send at eight
/// segments, 128 KiB at the default MULPDU of 16 KiB, where the same READs without CRC went out
/// 256 KiB-1 MiB at a time; the kernel's TCP costs more per byte in small sends
/// (`bench/RESULTS.md`, fifty-eighth session).
mod spare {
    use std::cell::RefCell;

    /// Bytes of buffers kept per thread, and of snapshots one send takes.
    pub(super) const BUDGET: usize = 1 << 20;
    /// The smallest buffer: a segment at the default MULPDU fits, so that in a stream of
    /// full segments and short last ones every kept buffer serves any of them.
    const SMALLEST: usize = 16 << 10;
    /// The largest buffer kept (a ULPDU is at most 65,535 bytes).
    const LARGEST: usize = 128 << 10;

    thread_local! {
        /// The kept buffers, and the sum of their capacities.
        static SPARE: RefCell<(Vec<Vec<u8>>, usize)> = const { RefCell::new((Vec::new(), 0)) };
    }

    /// What a snapshot of `len` bytes counts against [`BUDGET`]: the capacity it gets.
    pub(super) fn charge(len: usize) -> usize {
        len.max(SMALLEST)
    }

    /// A copy of `bytes`, in a kept buffer where one is large enough (the most recently kept
    /// of those; smaller ones stay kept, for queue pairs with a smaller MULPDU on this thread),
    /// and the CRC32c of `crc`'s message followed by them, taken in the same pass
    /// ([`crate::wire::crc32c_copy`]).
    pub(super) fn snapshot(crc: u32, bytes: &[u8]) -> (Vec<u8>, u32) {
        let mut buf = SPARE
            .try_with(|s| {
                let (kept, sum) = &mut *s.borrow_mut();
                let at = kept.iter().rposition(|b| b.capacity() >= bytes.len())?;
                let b = kept.swap_remove(at);
                *sum -= b.capacity();
                Some(b)
            })
            .ok()
            .flatten()
            .unwrap_or_else(|| Vec::with_capacity(charge(bytes.len())));
        buf.clear();
        let crc =
            crate::wire::crc32c_copy(crc, bytes, &mut buf.spare_capacity_mut()[..bytes.len()]);
        // SAFETY: `crc32c_copy` initialized the first `bytes.len()` bytes, within capacity.
        unsafe { buf.set_len(bytes.len()) };
        (buf, crc)
    }

    /// `buf` is sent: keep it for the next snapshot, or free it.
    pub(super) fn give_back(buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap > LARGEST {
            return;
        }
        let _ = SPARE.try_with(|s| {
            let (kept, sum) = &mut *s.borrow_mut();
            if *sum + cap <= BUDGET {
                *sum += cap;
                kept.push(buf);
            }
        });
    }

    /// Buffers kept on this thread now, and their bytes.
    #[cfg(test)]
    pub(super) fn kept() -> (usize, usize) {
        SPARE.with(|s| {
            let (kept, sum) = &*s.borrow();
            assert_eq!(*sum, kept.iter().map(Vec::capacity).sum::<usize>());
            (kept.len(), *sum)
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn buffers_are_kept_up_to_the_budget_in_bytes() {
            let fit = BUDGET / SMALLEST;
            let bufs: Vec<_> = (0..fit + 3)
                .map(|i| {
                    let bytes = vec![i as u8; 1000];
                    let (copy, crc) = snapshot(7, &bytes);
                    assert_eq!(crc, crate::wire::crc32c_append(7, &bytes));
                    assert_eq!(copy.capacity(), charge(1000), "charged what it holds");
                    copy
                })
                .collect();
            assert!(bufs
                .iter()
                .enumerate()
                .all(|(i, b)| b == &vec![i as u8; 1000]));
            bufs.into_iter().for_each(give_back);
            assert_eq!(
                kept(),
                (fit, BUDGET),
                "the three over the budget were freed"
            );
            // A kept buffer is handed out again, holding only the new bytes.
            let (again, _) = snapshot(0, b"abc");
            assert_eq!(again, b"abc");
            assert_eq!(again.capacity(), SMALLEST, "a kept buffer");
            assert_eq!(kept(), (fit - 1, BUDGET - SMALLEST));
            give_back(vec![0; LARGEST + 1]);
            assert_eq!(
                kept(),
                (fit - 1, BUDGET - SMALLEST),
                "the oversized one was freed"
            );
            // A segment larger than every kept buffer gets a buffer of its own size, and the
            // kept ones stay kept.
            let big = vec![5u8; 40_000];
            let (copy, crc) = snapshot(0, &big);
            assert_eq!(
                (copy.as_slice(), crc),
                (&big[..], crate::wire::crc32c_append(0, &big))
            );
            assert_eq!(copy.capacity(), 40_000);
            assert_eq!(kept(), (fit - 1, BUDGET - SMALLEST), "none was freed");
            give_back(copy);
            assert_eq!(
                kept(),
                (fit - 1, BUDGET - SMALLEST),
                "it is over the budget"
            );
            give_back(again);
            assert_eq!(kept(), (fit, BUDGET));
            // With room, a large buffer is kept, and a large segment finds it below small ones.
            let smalls: Vec<_> = (0..4).map(|_| snapshot(0, b"x").0).collect();
            let (large, _) = snapshot(0, &big);
            give_back(large);
            smalls.into_iter().for_each(give_back);
            // (The fourth small one was over the budget.)
            assert_eq!(kept(), (fit - 2, BUDGET - 3 * SMALLEST + 40_000));
            let (copy, _) = snapshot(0, &big);
            assert_eq!(copy.capacity(), 40_000, "the kept large buffer");
            assert_eq!(kept(), (fit - 3, BUDGET - 3 * SMALLEST));
            let (small, _) = snapshot(0, b"y");
            assert_eq!(small.capacity(), SMALLEST, "a kept small buffer");
        }
    }
}

impl Chunk {
    fn len(&self) -> usize {
        match self {
            Chunk::Inline { len, .. } => *len as usize,
            Chunk::Raw(_, n) => *n,
            Chunk::Snapshot { len, .. } | Chunk::Served { len, .. } => *len,
            Chunk::Owned(b) => b.len(),
        }
    }

    /// What the chunk counts against the bytes of snapshots one send may take
    /// ([`spare::BUDGET`]): a snapshot's buffer, taken or still to take; nothing for the rest.
    fn snapshot_charge(&self) -> usize {
        match self {
            Chunk::Snapshot { len, .. } => spare::charge(*len),
            Chunk::Owned(b) => b.capacity(),
            _ => 0,
        }
    }

    /// The chunk's last byte ends an FPDU (payload never does: a trailer follows it).
    fn ends_fpdu(&self) -> bool {
        matches!(self, Chunk::Inline { open: false, .. })
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
    /// For a Read: the sink it named (STag, tagged offset, length). Its Read Responses must
    /// fill exactly that range, in order; `placed` says how far they got.
    sink: (u32, u64, u32),
    placed: u64,
}

/// What the receiving side is doing. Each state carries what finishing the current segment
/// takes, so nothing outside it can disagree with it.
enum Rx {
    /// The framer reads into its own scratch buffer: a segment's headers (`then` is `None`),
    /// or the trailer of one whose payload is in (`then` is what its frame completes, once
    /// its CRC checks out).
    Framing { then: Option<Done> },
    /// Payload straight into memory, extent by extent (`extents`), then the trailer.
    Payload { then: Done },
    /// A control message's body into `body`, then the trailer.
    Body {
        opcode: RdmapOpcode,
        have: usize,
        need: usize,
    },
    /// After a fatal error: nothing more is accepted.
    Dead,
}

/// What a segment completes once its whole frame is in and checked.
enum Done {
    /// An RDMA Write segment: nothing (a Write completes nothing at its target, unless
    /// Immediate Data follows it).
    Write,
    /// A Read Response segment; the last one completes the oldest outstanding Read.
    ReadResponse { last: bool },
    /// A Send segment; the last one completes the receive at the head of the queue.
    Send {
        last: bool,
        /// Bytes of the message placed so far, this segment included.
        len: u32,
        solicited: bool,
        invalidated: Option<u32>,
    },
    /// A control message (Read Request, Terminate, Immediate Data, atomics), carried out.
    Control { opcode: RdmapOpcode },
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
///     sges: [Sge { addr: smr.addr() as u64, len: 3000, lkey: smr.stag() }].into(),
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
    /// Bytes from the front that an asynchronous send has taken and not yet reported
    /// (`tx_take`): `enter_error` keeps the chunks holding them.
    tx_taken: usize,
    /// The bytes sent so far end inside an FPDU: the front chunk carries on one that a sent
    /// chunk began.
    tx_open: bool,
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
    peer_terminated: bool,
    // Receive.
    rx: Rx,
    framer: Framer,
    body: [u8; 64],
    extents: VecDeque<(*mut u8, usize)>,
    /// Scratch: the local extents of the send request being started.
    tx_extents: Vec<(*const u8, usize)>,
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
            tx_taken: 0,
            tx_open: false,
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
            peer_terminated: false,
            rx: Rx::Framing { then: None },
            // No receive limit below the 16-bit length field: MULPDU is a sender's choice
            // (RFC 5044 §5.1, from its own MSS), and the stream buffers no payload (data
            // lands in checked memory, control bodies are bounded by `body`).
            framer: Framer::new(cfg.crc, u16::MAX as usize),
            body: [0; 64],
            extents: VecDeque::new(),
            tx_extents: Vec::new(),
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

    /// Bytes of the RDMA Write being received so far: 0 between Writes, and while other
    /// messages arrive. A transport may size its reads by it.
    pub fn rx_write_run(&self) -> u64 {
        self.write_run
    }

    /// True once receiving has stopped (a Terminate was sent or received).
    pub fn rx_dead(&self) -> bool {
        matches!(self.rx, Rx::Dead)
    }

    /// True once this side has queued a Terminate (it found a violation, or was told to).
    pub fn terminate_sent(&self) -> bool {
        self.terminate_sent
    }

    /// True once the peer's Terminate has arrived.
    pub fn peer_terminated(&self) -> bool {
        self.peer_terminated
    }

    /// The Terminate code that broke the stream, sent or received.
    pub fn last_terminate(&self) -> Option<TermCode> {
        self.last_terminate
    }

    fn complete(
        &mut self,
        on: Queue,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
    ) {
        let wc = self.wc(wr_id, status, opcode, byte_len);
        self.report(on, wc);
    }

    /// Puts `wc` on the send or the receive completion queue.
    #[inline]
    fn report(&mut self, on: Queue, wc: WorkCompletion) {
        let cq = match on {
            Queue::Send => &self.scq,
            Queue::Recv => &self.rcq,
        };
        if !cq.push(wc) {
            self.overrun();
        }
    }

    /// A completion queue was full, so a completion is lost: as verbs' CQ overrun
    /// (`IBV_EVENT_CQ_ERR`), the queue pair can no longer report its work and stops rather
    /// than carry on with requests that would never complete. The peer is told with a
    /// Terminate (local catastrophic error); the completions the queue still has room for
    /// later are flushes.
    #[cold]
    fn overrun(&mut self) {
        if self.state != QpState::Error {
            self.send_terminate(Terminate {
                code: TermCode::rdmap(
                    RdmapErrorType::LocalCatastrophic,
                    RdmapErrorCode::CatastrophicStream,
                ),
                m: false,
                ddp: None,
                rdmap: None,
            });
        }
    }

    /// Records the end of send-queue request `seq` and reports, in order, every completion no
    /// longer waiting for an earlier one.
    fn sq_complete(&mut self, seq: u64, wc: Option<WorkCompletion>) {
        if seq != self.released_seq {
            // Finished ahead of a request posted before it (a Write behind a Read): it waits.
            self.done.insert(seq, wc);
            return;
        }
        // The oldest request: reported now, without a trip through the map (the usual case,
        // one request at a time), and then whatever had finished behind it.
        self.released_seq += 1;
        if let Some(wc) = wc {
            self.report(Queue::Send, wc);
        }
        while let Some(wc) = self.done.remove(&self.released_seq) {
            // Advanced first: a report that overruns the queue fails the rest, re-entering here.
            self.released_seq += 1;
            if let Some(wc) = wc {
                self.report(Queue::Send, wc);
            }
        }
    }

    fn wc(&self, wr_id: u64, status: WcStatus, opcode: WcOpcode, byte_len: u32) -> WorkCompletion {
        WorkCompletion::new(wr_id, status, opcode, byte_len, self.cfg.qp_num)
    }

    /// Fails a started request, in order.
    fn sq_fail(&mut self, seq: u64, wr_id: u64, status: WcStatus, opcode: WcOpcode) {
        let wc = self.wc(wr_id, status, opcode, 0);
        self.sq_complete(seq, Some(wc));
    }

    /// Posts a receive.
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        if self.state == QpState::Error {
            self.complete(
                Queue::Recv,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            );
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
                self.complete(
                    Queue::Recv,
                    wr.wr_id,
                    WcStatus::LocProtErr,
                    WcOpcode::Recv,
                    0,
                );
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
                Queue::Send,
                wr.wr_id,
                WcStatus::WrFlushErr,
                wr.op.opcode(),
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

    /// Whether the request will occupy an ORD slot: Reads, atomics, and acknowledged requests.
    fn takes_ord(&self, wr: &SendWr) -> bool {
        wr.op.returns_data()
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

    /// A received violation: answer with a Terminate (quoting the failing frame's headers
    /// when `quote`) and stop receiving.
    fn fatal(&mut self, code: TermCode, quote: bool) {
        let ddp = quote.then(|| {
            let header = self.framer.header();
            let mut h = [0u8; UNTAGGED_HEADER_LEN];
            h[..header.len()].copy_from_slice(header);
            (self.framer.ulpdu_len() as u16, h, header.len())
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
            let wc = self.wc(wr.wr_id, WcStatus::WrFlushErr, wr.op.opcode(), 0);
            self.report(Queue::Send, wc);
        }
        for wr in std::mem::take(&mut self.rq) {
            self.complete(
                Queue::Recv,
                wr.wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            );
        }
        // Drop what the socket has not started, except what finishes the FPDU the sent bytes
        // end in: the peer's stream must end on an FPDU boundary, or a Terminate queued behind
        // would not frame. (A Terminate, the last chunk queued, still goes out, promptly; one
        // that is itself started stays where it is.) Chunks an asynchronous send has taken
        // count as started: their bytes are, or will be, on the wire, and its completion
        // advances over them.
        let held = self.tx_front_off + self.tx_taken;
        let (mut start, mut keep, mut boundary) = (0, 0, !self.tx_open);
        for c in self.tx.iter_mut() {
            if start >= held && boundary {
                break;
            }
            keep += 1;
            boundary = c.ends_fpdu();
            // A chunk that ends one FPDU and begins the next ends at the first, if none of the
            // next one's bytes have gone.
            if let Chunk::Inline {
                len, join, open, ..
            } = c
            {
                if *join > 0 && held.saturating_sub(start) <= *join as usize {
                    (*len, *open, boundary) = (*join, false, true);
                }
            }
            start += c.len();
        }
        let terminate = if self.terminate_sent && self.tx.len() > keep {
            self.tx.pop_back()
        } else {
            None
        };
        self.tx.truncate(keep);
        // A front chunk cut back to the bytes already sent is done.
        if self.tx_front_off > 0
            && self
                .tx
                .front()
                .is_some_and(|c| c.len() == self.tx_front_off)
        {
            self.tx.pop_front();
            (self.tx_front_off, self.tx_open) = (0, false);
        }
        self.tx.extend(terminate);
        self.tx_queued = self.tx_sent + self.tx.iter().map(|c| c.len() as u64).sum::<u64>()
            - self.tx_front_off as u64;
    }
}
