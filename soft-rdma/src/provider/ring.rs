//! Progress on the core's io_uring: every queue pair's bytes move through operations on the
//! core's one ring, next to all its other I/O, with no epoll set of our own.
//!
//! Per queue pair, at most one receive and one send are outstanding:
//! - **Headers and small FPDUs** arrive through a multishot `RECV` that picks buffers from the
//!   core's provided-buffer ring ([`BufRing`]); each completion is fed to the stream and its
//!   buffer given straight back. The armed multishot is also what tells the core that bytes
//!   came in: there is no readiness step.
//! - **A core with few queue pairs** ([`DIRECT_POLL_MAX`] or fewer) that is spinning receives
//!   instead with one `RECV` (`MSG_DONTWAIT`, into one of the core's look buffers, and further
//!   ones into provided buffers while the socket fills them, or into more look buffers while
//!   the queue pair is behind, as under a stream of large Writes or Read Responses) per queue
//!   pair per pass, inside the pass's one submission: the bytes are copied in that call, rather
//!   than by the kernel's deferred work for a multishot, which measured about 1 µs slower per
//!   message. On the way to sleep each gets its multishot armed, which wakes the core; the
//!   first bytes it brings switch it back.
//! - **Large payloads** (at least [`DIRECT_SWITCH`] bytes still to come for one placement) are
//!   received straight into the target region: the multishot is cancelled, and once its last
//!   completion is in, a `RECV` with `MSG_DONTWAIT` names the region's extent. When the socket
//!   has nothing, a one-shot `POLL_ADD` waits for it.
//! - **Sends** are one gather `SENDMSG` with `MSG_DONTWAIT` over the stream's queued chunks;
//!   when the socket is full, a `POLL_ADD` for `POLLOUT` waits for room. Not `SENDMSG_ZC`:
//!   measured as this path would use it (`bench/src/bin/send_zc.rs`), the kernel copied every
//!   zero-copy send over loopback all the same, and waiting for each one's notification made
//!   16 KiB–1 MiB sends 0.3–0.7× as fast. It would also break the rule below: the kernel
//!   keeps a zero-copy send's pages until the peer has acknowledged them and reads them again
//!   to retransmit, so a Read Response could carry bytes its owner wrote after revoking the
//!   region. Where a NIC makes zero copy pay, it fits a requester's own WRITE or SEND payload
//!   only, with the completion held until the notification. On a core with few queue pairs, a
//!   task's first post of a poll is sent at once, in a submission of its own, and the posts it
//!   makes after that go together when it yields (`post_now`).
//!
//! Operations name a queue pair's socket by its slot in the core's registered file table where
//! it got one (`RawQueue::register_file`; given back when the queue pair is dropped), so the
//! kernel neither looks the file up nor counts a reference on it for each of them: an idle
//! look costs 5-6% less (`recv-floor`, `bench/RESULTS.md`, twenty-ninth session).
//!
//! Every operation that names queue-pair memory (a send's chunks, a receive's region extent) is
//! queued from [`Poller::prepare_submit`] with `MSG_DONTWAIT`, so it is carried out inside the
//! pass's one `io_uring_enter` and is complete when that call returns: the kernel touches the
//! memory only while nothing else runs, exactly as the raw-syscall path does, and the region
//! checks made when the operation was built still hold. Nothing is ever in flight into a
//! region the owner could deregister meanwhile. The multishot receive names only the ring's
//! own buffers. Completions come back in bulk ([`RawQueue::drain`]) to the poller's `poll`,
//! which runs right after that submission in the same pass.
//!
//! All queue pairs' operations of one pass therefore go out in one `io_uring_enter`, and a
//! loaded core makes one such call per pass (`CoreStats::submit_calls`). The exception is the
//! core with few queue pairs (polling mode), where latency matters more than batching: there a
//! task's post, and what received bytes produce (a Read Response, an atomic's answer, an
//! acknowledgement), go out at once in an `io_uring_enter` of their own rather than waiting
//! for the next pass. Nothing else runs between building those operations and submitting
//! them, and their completions are applied to the streams before the call returns, so no
//! stream ever has bytes on the wire that it still counts as queued.
//!
//! Under SQPOLL none of that holds (a kernel thread submits on its own time): there the queue
//! pairs send from copies and receive into provided buffers only (`sqpoll.rs`).

use std::cell::{Cell, RefCell};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use barewire_engine::buf::BufRing;
use barewire_engine::uring::{buffer_id, opcode, squeue, types, Completion, RawQueue, CQE_F_MORE};
use barewire_engine::Poller;

use super::progress::{
    close, joins_burst, send_failed, sweep_active, Provider, DIRECT_POLL_MAX, PROVIDER, STAGE_LEN,
};
use super::sqpoll::Wires;
use super::*;
use crate::stream::Stream;

mod complete;
mod poller;
mod send;

use complete::complete;
pub(super) use poller::{RingPoller, STALL_TICK};
use send::{arm_send, send_now, sent_done};
pub(super) use send::{post_now, send_burst, send_outstanding};

/// A payload at least this long still to come for one placement is received straight into its
/// region; shorter ones are copied out of the provided buffers they arrived in. Switching costs
/// a cancel of the multishot receive and a pass, which a copy of a few KiB does not.
pub const DIRECT_SWITCH: usize = 16 * 1024;

/// Provided buffers per core, and their size.
const RING_ENTRIES: u16 = 256;
const RING_BUF: usize = 16 * 1024;

/// The size of the core's look buffers (see `arm`): the epoll path's staging read, larger than
/// a provided buffer, so that a stream of full FPDUs takes one receive per several of them.
const LOOK_BUF: usize = STAGE_LEN;

/// Polled receives one queue pair may queue in one pass (each up to one provided buffer).
const MAX_BURST: u8 = 16;

/// Receives one queue pair makes per pass while it is behind (see `RingOps::bulk`), each
/// into a 64 KiB look buffer of the core's: 256 KiB a pass, in receives as large as the epoll
/// path's. A stream of 1 MiB Writes moved 1.15-1.2x as fast as with one look and fifteen
/// 16 KiB provided buffers a pass; two to eight looks measured alike, and sixteen (1 MiB a
/// pass) gained 3% (`bench/RESULTS.md`, thirty-fifth session). A core hands out at most
/// `DIRECT_POLL_MAX` times this many looks per pass, 1 MiB.
const MAX_LOOKS: u8 = 4;

/// A queue pair in the middle of a Write that has brought fewer bytes than this so far is not
/// behind in the sense of `RingOps::bulk`, however full its buffers came back.
const LONG_WRITE: u64 = 128 * 1024;

/// Bytes one queue pair may receive directly per pass (its sends are bounded by the socket).
const BUDGET: usize = 1 << 20;

/// The core's ring state, shared by every queue pair on it.
pub(super) struct Ring {
    pub(super) raw: RawQueue,
    pub(super) bufs: BufRing,
    /// Queue pairs whose operations must be (re)considered at the next `prepare_submit`.
    pub(super) pending: RefCell<Vec<usize>>,
    /// Queue pairs whose polled receive found nothing: polled again next pass, or given their
    /// multishot receive if the core goes to sleep first.
    polling: RefCell<Vec<usize>>,
    /// Completions reaped by an immediate send (see `post_now`) for the next `poll`.
    backlog: RefCell<Vec<Completion>>,
    /// `send_now`'s scratch (kept, so no send allocates): the queue pairs it sends for, and
    /// the completions it reaps.
    send_keys: RefCell<Vec<usize>>,
    send_reaped: RefCell<Vec<Completion>>,
    /// The buffers a pass's first polled receive of each queue pair reads into (see `arm`),
    /// handed out in order from the start of each pass, and the next one to hand out.
    looks: RefCell<Vec<Box<[u8]>>>,
    next_look: Cell<usize>,
    /// The ring is SQPOLL: sends go from copies, receives into provided buffers only, through
    /// the queue pairs' wires (`sqpoll.rs`).
    pub(super) copy: bool,
    pub(super) wires: RefCell<Wires>,
}

impl Ring {
    /// The core's ring state, or `None` if the core does not run io_uring (or the ring could
    /// not get its buffers: then the raw-syscall path serves, as under epoll).
    pub(super) fn for_core() -> Option<Ring> {
        if !matches!(
            barewire_engine::reactor(),
            barewire_engine::ReactorKind::IoUring(_)
        ) {
            return None;
        }
        let raw = RawQueue::new()?;
        let bufs = match BufRing::new(RING_ENTRIES, RING_BUF) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("barewire-soft-rdma: no provided-buffer ring ({e}); using system calls");
                return None;
            }
        };
        Some(Ring {
            bufs,
            pending: RefCell::new(Vec::new()),
            polling: RefCell::new(Vec::new()),
            backlog: RefCell::new(Vec::new()),
            send_keys: RefCell::new(Vec::new()),
            send_reaped: RefCell::new(Vec::new()),
            looks: RefCell::new(Vec::new()),
            next_look: Cell::new(0),
            copy: !raw.completes_in_submit(),
            wires: RefCell::new(Wires::default()),
            raw,
        })
    }
}

/// What a queue pair has outstanding on the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RxOp {
    /// Nothing: the next `prepare_submit` arms what the stream needs.
    Idle,
    /// The multishot receive into provided buffers.
    Multi,
    /// The multishot receive was asked to stop, for a direct receive; its last completion is
    /// still to come.
    Cancelling,
    /// A direct `MSG_DONTWAIT` receive into a region (done within this pass's submission).
    Direct,
    /// A polled `MSG_DONTWAIT` receive into a provided buffer (likewise).
    Polled,
    /// A one-shot poll for input, after a direct receive found nothing.
    Polling,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TxOp {
    Idle,
    /// A `MSG_DONTWAIT` gather send (done within this pass's submission).
    Sending,
    /// A one-shot poll for room, after a send found the socket full.
    Polling,
}

/// Per queue pair: its outstanding operations, and the gather list of its send (at a stable
/// address: the kernel reads it during the submission).
pub(super) struct RingOps {
    pub(super) rx: RxOp,
    pub(super) tx: TxOp,
    /// On the ring's pending list.
    queued: bool,
    /// Polled receives to queue per pass (grows while each fills its buffer).
    burst: u8,
    /// Polled receives of this pass still to complete, whether any brought bytes, and whether
    /// every one so far filled its buffer.
    polled: (u8, bool, bool),
    /// The look buffer the next of this pass's look receives reads into (one queue pair's
    /// are consecutive, and complete in order).
    look: usize,
    /// Behind: every receive of the last pass filled its buffer, the burst has grown to
    /// `MAX_BURST`, and the stream is not in the middle of a Write shorter than `LONG_WRITE`
    /// so far. Bytes then arrive faster than passes take them, and the next pass reads
    /// `MAX_LOOKS` looks, and so on while they come back full. Otherwise a pass reads one look
    /// and then provided buffers. The Write rule is measured, not derived: 64 KiB Writes,
    /// whose receiving core mostly waits on its peer and falls behind now and then, moved
    /// 0.86-0.89x as fast when those passes read 2, 4 or 5 looks instead, and as fast when
    /// they did not (the same section). 64 KiB Read Responses gained 1.2x.
    bulk: bool,
    /// The send's gather list: `SEND_IOV_FEW` entries, or `SEND_IOV` once a send had more
    /// chunks queued than that (see `arm_send`).
    iov: Box<[libc::iovec]>,
    msg: Box<libc::msghdr>,
    /// A send of at most `SMALL_SEND` bytes is copied here and goes as one plain `SEND` (see
    /// `arm_send`).
    small: Box<[u8; SMALL_SEND]>,
    /// The socket's slot in the core's registered file table, if it got one (see `target`).
    file: Option<u32>,
}

/// Gather-list entries a queue pair starts with: enough for the messages of a latency-bound
/// queue pair, at 1 KiB.
const SEND_IOV_FEW: usize = 64;

/// Gather-list entries of one send at most: 127 full FPDUs (two entries each: the payload, and
/// one holding the trailer of the FPDU before it with this one's header), 2 MiB at the default
/// MULPDU. A stream of large Writes then takes one `SENDMSG` per 2 MiB rather than per 512 KiB
/// (31 FPDUs in 64 entries); each costs a pass, and the kernel's TCP does less per byte in
/// larger sends (`bench/RESULTS.md`, twenty-eighth session: 1 MiB write_bw 1.22x, median of six
/// alternations, when an FPDU still took three entries). The epoll path, which sends in a loop,
/// gained nothing from it.
const SEND_IOV: usize = 256;

/// Sends of at most this many bytes go from a copy, as one plain `SEND` rather than a gathered
/// `SENDMSG`: 8-byte WRITE and READ round trips took 0.985x and 0.99x the time, medians of ten
/// alternated rounds (about 0.97x in the rounds where the host was in its fast phase), atomics
/// 1.00x (bench/RESULTS.md, thirty-sixth session). The copy is a few cache lines.
const SMALL_SEND: usize = 512;

/// A gather list of `n` empty entries.
fn empty_iov(n: usize) -> Box<[libc::iovec]> {
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    vec![empty; n].into_boxed_slice()
}

impl RingOps {
    pub(super) fn new() -> RingOps {
        RingOps {
            rx: RxOp::Idle,
            tx: TxOp::Idle,
            queued: false,
            burst: 1,
            polled: (0, false, false),
            look: 0,
            bulk: false,
            iov: empty_iov(SEND_IOV_FEW),
            // SAFETY: msghdr is plain old data; zero is "no name, no control".
            msg: Box::new(unsafe { std::mem::zeroed() }),
            small: Box::new([0; SMALL_SEND]),
            file: None,
        }
    }
}

/// What an operation was, in the low bits of its token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    RecvMulti = 1,
    RecvDirect = 2,
    PollIn = 3,
    Send = 4,
    PollOut = 5,
    RecvPolled = 6,
    RecvPolledDirect = 7,
    RecvPolledOwn = 8,
}

impl Kind {
    fn from(bits: u64) -> Option<Kind> {
        Some(match bits {
            1 => Kind::RecvMulti,
            2 => Kind::RecvDirect,
            3 => Kind::PollIn,
            4 => Kind::Send,
            5 => Kind::PollOut,
            6 => Kind::RecvPolled,
            7 => Kind::RecvPolledDirect,
            8 => Kind::RecvPolledOwn,
            _ => return None,
        })
    }
}

/// A token: the queue pair's slot (24 bits), the low 20 bits of its number (so a completion
/// for an earlier holder of the slot is recognised), and the kind.
fn token(i: &QpInner, kind: Kind) -> u64 {
    (i.key as u64 & 0xFF_FFFF) << 24 | (i.qp as u64 & 0xF_FFFF) << 4 | kind as u64
}

/// The queue pair part of its tokens (what names its wire under SQPOLL).
fn conn_id(i: &QpInner) -> u64 {
    token(i, Kind::RecvMulti) & !0xF
}

fn untoken(t: u64) -> (usize, u32, Option<Kind>) {
    (
        (t >> 24) as usize,
        (t >> 4) as u32 & 0xF_FFFF,
        Kind::from(t & 0xF),
    )
}

/// How an operation names a socket: a descriptor, or a slot of the core's registered file table
/// with the flag that says so.
type Target = (types::Fd, squeue::Flags);

/// How the ring's operations name the queue pair's socket: by its registered slot where it got
/// one (the kernel then skips looking the file up and counting a reference for each operation,
/// and a polling core makes one or more per pass), else by its descriptor.
fn target(i: &QpInner) -> Target {
    match i.ring.as_ref().and_then(|o| o.file) {
        Some(slot) => (types::Fd(slot as i32), squeue::Flags::FIXED_FILE),
        None => (types::Fd(i.fd.as_raw_fd()), squeue::Flags::empty()),
    }
}

/// Has the next `prepare_submit` look at this queue pair.
pub(super) fn queue(i: &mut QpInner) {
    let Some(ops) = i.ring.as_mut() else { return };
    if ops.queued || i.closed {
        return;
    }
    ops.queued = true;
    let key = i.key;
    let _ = PROVIDER.try_with(|p| {
        if let Some(r) = p.ring.borrow().as_ref() {
            r.pending.borrow_mut().push(key);
        }
    });
}

/// Asks the kernel to drop whatever the queue pair still has armed (it is closing or gone).
pub(super) fn cancel_armed(i: &QpInner) {
    let Some(ops) = i.ring.as_ref() else { return };
    let _ = PROVIDER.try_with(|p| {
        let ring = p.ring.borrow();
        let Some(r) = ring.as_ref() else { return };
        match ops.rx {
            RxOp::Multi | RxOp::Cancelling => r.raw.cancel(token(i, Kind::RecvMulti)),
            RxOp::Polling => r.raw.cancel(token(i, Kind::PollIn)),
            _ => {}
        }
        if ops.tx == TxOp::Polling {
            r.raw.cancel(token(i, Kind::PollOut));
        }
    });
}

/// True while the core has so few queue pairs that it polls their receives each pass (never
/// under SQPOLL, where a receive is not done within the submission).
fn polling_mode(p: &Provider) -> bool {
    p.live() <= DIRECT_POLL_MAX && !p.ring.borrow().as_ref().is_some_and(|r| r.copy)
}

/// A queue pair joins a ring core: under SQPOLL it gets its wire. False if it could not (no
/// descriptor left for the duplicate); the caller closes it.
pub(super) fn attach(i: &mut QpInner) -> bool {
    PROVIDER.with(|p| match p.ring.borrow().as_ref() {
        Some(r) if r.copy => match r.wires.borrow_mut().open(conn_id(i), &i.fd) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("barewire-soft-rdma: no descriptor for a queue pair's wire ({e})");
                false
            }
        },
        Some(r) => {
            // A full table is no error: the queue pair names its descriptor instead.
            let slot = r.raw.register_file(i.fd.as_raw_fd());
            i.ring.as_mut().expect("a ring queue pair").file = slot;
            true
        }
        None => true,
    })
}

/// The queue pair is being dropped: its slot in the registered file table goes back, so that
/// the table does not keep its socket open once the descriptor closes.
pub(super) fn release_file(i: &mut QpInner) {
    let Some(slot) = i.ring.as_mut().and_then(|o| o.file.take()) else {
        return;
    };
    let _ = PROVIDER.try_with(|p| {
        if let Some(r) = p.ring.borrow().as_ref() {
            r.raw.unregister_file(slot);
        }
    });
}

/// Under SQPOLL, copies what the stream has queued to its wire and starts the send if none is
/// in flight; `None` on other cores. (The raw-syscall path never sends on such a queue pair:
/// the kernel thread's send and ours would race.)
pub(super) fn flush_copy(i: &mut QpInner) -> Option<bool> {
    i.ring.as_ref()?;
    PROVIDER
        .try_with(|p| {
            let ring = p.ring.borrow();
            let r = ring.as_ref().filter(|r| r.copy)?;
            Some(copy_out(i, r))
        })
        .ok()
        .flatten()
}

/// Copies the stream's queued bytes to the wire and starts a send. True if bytes were taken.
/// Outside the runtime (a handle dropped after `block_on` returned) there is no ring to send
/// on: the bytes stay in the stream.
fn copy_out(i: &mut QpInner, r: &Ring) -> bool {
    if i.tx_failed || !barewire_engine::in_runtime() {
        return false;
    }
    let (id, send) = (conn_id(i), token(i, Kind::Send));
    let before = i.stream.tx_sent();
    let mut wires = r.wires.borrow_mut();
    wires.take(id, &mut i.stream);
    wires.kick(id, r, send);
    i.stream.tx_sent() != before
}

/// Under SQPOLL, the queue pair closed: its socket shuts down once its copies went out (the
/// caller shuts it down itself otherwise: false).
pub(super) fn hang_up(i: &mut QpInner) -> bool {
    PROVIDER
        .try_with(|p| {
            let ring = p.ring.borrow();
            let Some(r) = ring.as_ref().filter(|r| r.copy) else {
                return false;
            };
            copy_out(i, r);
            r.wires.borrow_mut().hang_up(conn_id(i));
            true
        })
        .unwrap_or(false)
}

/// Under SQPOLL, the queue pair is being dropped: what it queued goes out from its wire, which
/// outlives it until its operations are done.
pub(super) fn detach(i: &mut QpInner) {
    let _ = PROVIDER.try_with(|p| {
        let ring = p.ring.borrow();
        if let Some(r) = ring.as_ref().filter(|r| r.copy) {
            if !i.closed {
                copy_out(i, r);
            }
            r.wires.borrow_mut().detach(conn_id(i));
        }
    });
}

/// Arms the multishot receive (`token`) of a queue pair with no receive outstanding.
fn arm_multishot((fd, named): Target, token: u64, ops: &mut RingOps, r: &Ring) {
    let e = opcode::RecvMulti::new(fd, r.bufs.group_id())
        .build()
        .flags(named);
    // SAFETY: the multishot receive writes only into the ring's own buffers.
    unsafe { r.raw.push(e, token) };
    ops.rx = RxOp::Multi;
}

/// Under SQPOLL: what a queue pair needs now. Sends go from copies; the receive is always the
/// multishot into provided buffers, on the wire's descriptor.
fn arm_copy(i: &mut QpInner, r: &Ring) {
    let ops = i.ring.as_mut().expect("a ring queue pair");
    ops.queued = false;
    if i.closed {
        return;
    }
    copy_out(i, r);
    let (id, multi) = (conn_id(i), token(i, Kind::RecvMulti));
    let ops = i.ring.as_mut().expect("a ring queue pair");
    if ops.rx == RxOp::Idle && i.stream.rx_buffer().is_some() {
        let mut wires = r.wires.borrow_mut();
        if let Some(fd) = wires.fd(id) {
            arm_multishot((fd, squeue::Flags::empty()), multi, ops, r);
            wires.pushed(id);
        }
    }
}

/// Queues the operations one queue pair needs now.
fn arm(i: &mut QpInner, r: &Ring, poll: bool) {
    if r.copy {
        return arm_copy(i, r);
    }
    let t = target(i);
    let (fd, named) = t;
    let send = token(i, Kind::Send);
    let direct = token(i, Kind::RecvDirect);
    let multi = token(i, Kind::RecvMulti);
    let polled = token(i, Kind::RecvPolled);
    let polled_direct = token(i, Kind::RecvPolledDirect);
    let own = token(i, Kind::RecvPolledOwn);
    let QpInner {
        stream,
        ring,
        closed,
        tx_failed,
        ..
    } = i;
    let ops = ring.as_mut().expect("a ring queue pair");
    ops.queued = false;
    if *closed {
        return;
    }
    if !*tx_failed {
        arm_send(t, send, stream, ops, r);
    }
    if ops.rx == RxOp::Idle {
        match stream.rx_buffer() {
            Some((dst, want)) if want >= DIRECT_SWITCH => {
                let e = opcode::Recv::new(fd, dst, want.min(BUDGET) as u32)
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .flags(named);
                // SAFETY: the stream handed out a checked extent of `want` bytes; with
                // MSG_DONTWAIT the kernel writes it inside this pass's submission only.
                unsafe { r.raw.push(e, direct) };
                ops.rx = RxOp::Direct;
            }
            Some((dst, want)) if poll => {
                // A payload of DIRECT_PLACEMENT bytes or more goes straight into its region,
                // and the receives after it (into provided buffers) take what follows: they
                // all run in order within the submission, each taking what the socket has
                // then. Several in a row when the last pass filled every buffer it asked for.
                let mut n = 0;
                if want >= DIRECT_PLACEMENT {
                    let e = opcode::Recv::new(fd, dst, want.min(BUDGET) as u32)
                        .flags(libc::MSG_DONTWAIT)
                        .build()
                        .flags(named);
                    // SAFETY: a checked extent of `want` bytes, written by the kernel inside
                    // this pass's submission only (MSG_DONTWAIT).
                    unsafe { r.raw.push(e, polled_direct) };
                    n += 1;
                }
                // The first reads into a look buffer of the core's (handed out in order
                // this pass): an idle socket's look then costs no provided-buffer selection
                // (`recv-floor`: 3-10% cheaper), and bytes that come are fed from there.
                // The rest of a burst take more looks in a bulk pass, otherwise provided
                // buffers, as many as the socket fills.
                let (looks, provided) = if ops.bulk {
                    (MAX_LOOKS, 0)
                } else {
                    (1, ops.burst - 1)
                };
                ops.look = r.next_look.get();
                for _ in 0..looks {
                    let k = r.next_look.get();
                    r.next_look.set(k + 1);
                    let mut looks = r.looks.borrow_mut();
                    if looks.len() <= k {
                        looks.push(vec![0u8; LOOK_BUF].into_boxed_slice());
                    }
                    let e = opcode::Recv::new(fd, looks[k].as_mut_ptr(), LOOK_BUF as u32)
                        .flags(libc::MSG_DONTWAIT)
                        .build()
                        .flags(named);
                    // SAFETY: the core's look buffer `k`, handed to this receive alone in this
                    // pass and written by the kernel inside its submission only (MSG_DONTWAIT).
                    unsafe { r.raw.push(e, own) };
                    n += 1;
                }
                for _ in 0..provided {
                    let e = opcode::Recv::new(fd, std::ptr::null_mut(), RING_BUF as u32)
                        .buf_group(r.bufs.group_id())
                        .flags(libc::MSG_DONTWAIT)
                        .build()
                        .flags(squeue::Flags::BUFFER_SELECT | named);
                    // SAFETY: the receive writes only into a buffer of the ring's own.
                    unsafe { r.raw.push(e, polled) };
                    n += 1;
                }
                ops.rx = RxOp::Polled;
                ops.polled = (n, false, true);
            }
            Some(_) => arm_multishot(t, multi, ops, r),
            None => {} // receiving has stopped
        }
    }
}

/// Waits for the socket to be ready for `events` (a one-shot poll, completing as `kind`).
fn push_poll(i: &QpInner, r: &Ring, events: u32, kind: Kind) {
    let (fd, named) = target(i);
    let e = opcode::PollAdd::new(fd, events).build().flags(named);
    // SAFETY: a poll names no memory.
    unsafe { r.raw.push(e, token(i, kind)) };
}

/// After bytes moved either way: hang up once a Terminate went out (or came in) and nothing
/// is left to send, and have the next submission arm what is now needed.
fn after(i: &mut QpInner) {
    if i.closed {
        return;
    }
    let stopped = i.stream.rx_dead() && !i.stream.wants_tx();
    // A stream with nothing queued but stopped receiving had its source deregistered, or
    // traded Terminates: it closes as the raw-syscall path does.
    if stopped {
        close(i, WcStatus::WrFlushErr);
        return;
    }
    queue(i);
    mark_active(i);
}
