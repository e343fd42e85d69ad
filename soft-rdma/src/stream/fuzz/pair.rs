//! The stream-pair fuzz check: two real [`Stream`]s back to back through an in-memory pipe,
//! each the other's honest peer. The input is a script. It says which side posts what (Writes
//! with up to three gather entries, empty ones included, Writes with immediate data, Sends with
//! or without an event and one with Invalidate, Reads and the three atomics, at offsets and
//! lengths it picks), how many bytes each send hands over, whether a send is synchronous
//! (`tx_advance`, the epoll path) or asynchronous (`tx_take`, other work, then `tx_settle` of
//! part of it, the io_uring path), how the receiver's reads split the bytes, when a side closes
//! (`enter_error`), and when a byte of side 0's stream is altered on the way. Where
//! [`super::live_stream`] is the hostile peer's check, this one is mostly the honest peer's:
//! every byte an honest stream sends must be taken, placed and completed exactly.
//!
//! Promises checked on every input (a broken one panics, which the fuzzer reports):
//! - no panic, including arithmetic overflow;
//! - each side's wire is whole FPDUs, a close anywhere included, and its peer takes every byte
//!   of it unaltered, without a Terminate;
//! - nothing outside the memory the peer may change changes: guard bytes, the source buffers,
//!   the gap between a receive's two buffers, sink slots and receives nothing used (with an
//!   altered stream, the sinks and receives may take anything; the rest still holds);
//! - a Terminate reaches the peer intact, with its code, unless the peer closed or stopped at
//!   a violation of its own first;
//! - every request completes at most once, in posting order, with its own opcode; with no
//!   close and nothing altered, every one completes, successfully;
//! - what completed successfully took effect (nothing acknowledged is lost): a Send's bytes,
//!   event flag and invalidated STag are in the receive it completed, a Read's sink holds the
//!   peer's bytes as they were at some point at or after the Read reached it, an atomic's
//!   original value is the word's value when it arrived, and the peer's region holds every
//!   Write that completed;
//! - the peer's region ends as the requests, applied in posting order, leave it: all of them
//!   with no close, a prefix of them (the last perhaps in part) with one.
//!
//! With a side's stream altered, its own requests' effects are not checked (the peer acted on
//! what arrived), nor the results of the other side's Reads and atomics (their responses came
//! in the altered stream).

mod check;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io::IoSlice;

use super::super::{RecvWr, SendOp, SendWr, Sge, Stream, StreamConfig};
use crate::verbs::{
    Access, CompletionQueue, Device, MemoryRegion, QpState, Stag, WcOpcode, WcStatus,
    WorkCompletion,
};
use crate::wire::Deframer;

use check::check;

/// Guard bytes around each area.
const GUARD: usize = 64;
const SRC_LEN: usize = 8192;
const DST_LEN: usize = 4096;
const SINK_LEN: usize = 8192;
/// Receives each side posts before the script starts, one slot each.
const RECVS: usize = 16;
const RSLOT: usize = 1024;
/// Where each area starts in a side's memory.
const SRC: usize = GUARD;
const DST: usize = SRC + SRC_LEN + GUARD;
const SINK: usize = DST + DST_LEN + GUARD;
const RBUF: usize = SINK + SINK_LEN + GUARD;
const MEM: usize = RBUF + RECVS * RSLOT + GUARD;
/// The longest Send: what the smaller (two-buffer) receives hold.
const SEND_MAX: usize = 924;
const WRITE_MAX: usize = 3000;
const READ_MAX: usize = 2048;
/// Requests per side, so the completion queues never overflow.
const MAX_OPS: usize = 48;
const CQ_DEPTH: usize = 256;
const GUARD_BYTE: u8 = 0xEE;
const BLANK: u8 = 0xCC;

/// A side's source and initial target bytes: different on each side and at each offset.
fn pattern(side: usize, i: usize, salt: u32) -> u8 {
    let x = (i as u32 ^ salt.wrapping_mul(0x85EB_CA6B)).wrapping_mul(0x9E37_79B1);
    (x >> 24) as u8 ^ (side as u8).wrapping_mul(0x5B)
}

/// Receive `j`'s buffers, as offsets into the side's memory: one buffer for even `j`, two with
/// a gap between them for odd `j`.
fn recv_buffers(j: usize) -> Vec<(usize, usize)> {
    let at = RBUF + j * RSLOT;
    if j % 2 == 0 {
        vec![(at, RSLOT)]
    } else {
        vec![(at, 300), (at + 400, 624)]
    }
}

/// The script: bytes read in order, and nothing (the end) once they run out.
struct Script<'a> {
    data: &'a [u8],
    at: usize,
}

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let b = *self.data.get(self.at)?;
        self.at += 1;
        Some(b)
    }
    fn b(&mut self) -> u8 {
        self.byte().unwrap_or(0)
    }
    fn u16(&mut self) -> usize {
        (self.b() as usize) << 8 | self.b() as usize
    }
    /// `len * f / 255` for the next byte `f`: a share of `len`, all of it at 255.
    fn share(&mut self, len: usize) -> usize {
        len * self.b() as usize / 255
    }
}

#[derive(Debug, Clone, Copy)]
enum Atomic {
    FetchAdd(u64),
    CmpSwap(u64, u64),
    Swap(u64),
}

impl Atomic {
    fn apply(self, old: u64) -> u64 {
        match self {
            Atomic::FetchAdd(add) => old.wrapping_add(add),
            Atomic::CmpSwap(compare, swap) => {
                if old == compare {
                    swap
                } else {
                    old
                }
            }
            Atomic::Swap(swap) => swap,
        }
    }
}

/// A posted request and what it should do at the peer.
#[derive(Debug)]
enum Effect {
    /// Bytes written at an offset of the peer's region (a Write, or a Write with immediate
    /// data, which also takes one of the peer's receives).
    Write {
        off: usize,
        bytes: Vec<u8>,
        imm: Option<u32>,
    },
    /// Bytes into the peer's next receive, perhaps invalidating one of the peer's STags.
    Send {
        bytes: Vec<u8>,
        solicited: bool,
        invalidate: Option<u32>,
    },
    /// `len` bytes of the peer's region at `off` into the sink at `sink`; `versions` are that
    /// range as the requests leave it, from this Read's arrival on.
    Read {
        off: usize,
        len: usize,
        sink: usize,
        versions: Vec<Vec<u8>>,
    },
    /// An atomic on a word of the peer's region; its original value (`original`) lands at
    /// `sink`.
    Atomic { sink: usize, original: u64 },
}

impl Effect {
    /// Takes one of the peer's receives.
    fn takes_receive(&self) -> bool {
        matches!(
            self,
            Effect::Send { .. } | Effect::Write { imm: Some(_), .. }
        )
    }
}

#[derive(Debug)]
struct Op {
    effect: Effect,
    opcode: WcOpcode,
    /// The peer's region as the requests before this one leave it.
    before: Vec<u8>,
}

/// One end: a stream, its memory, and what the script did with it.
struct Side {
    /// Dropped first: its queued chunks name the memory below.
    stream: Stream,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    /// Source (local), target (remote read, write and atomics), sink and receive buffers
    /// (local write), and a spare region over the source that no request names, for the
    /// peer's one Send with Invalidate; dropped before the memory.
    regions: Vec<MemoryRegion>,
    /// This side sent its Send with Invalidate (the peer's spare STag is then gone).
    invalidated: bool,
    /// The memory, read and written only through `base` once the regions exist.
    base: *mut u8,
    _mem: Vec<u64>,
    closed: bool,
    /// Bytes of this side's pipe were altered on the way (side 0 only).
    corrupted: bool,
    /// The bytes an asynchronous send took and has not settled.
    taken: Option<Vec<u8>>,
    /// Every byte handed over, and those the peer has not read yet.
    wire: Vec<u8>,
    pipe: VecDeque<u8>,
    ops: Vec<Op>,
    /// The peer's target region as every request posted so far leaves it.
    model: Vec<u8>,
    sink_used: usize,
    wcs: Vec<WorkCompletion>,
    rwcs: Vec<WorkCompletion>,
}

impl Side {
    fn new(id: usize, cfg: StreamConfig) -> Side {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let (scq, rcq) = (
            CompletionQueue::new(CQ_DEPTH),
            CompletionQueue::new(CQ_DEPTH),
        );
        let mut mem = vec![0u64; MEM / 8];
        let base = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `mem` is MEM bytes, ours alone, and never reallocated.
        let bytes = unsafe { std::slice::from_raw_parts_mut(base, MEM) };
        bytes.fill(GUARD_BYTE);
        for i in 0..SRC_LEN {
            bytes[SRC + i] = pattern(id, i, 1);
        }
        for i in 0..DST_LEN {
            bytes[DST + i] = pattern(id, i, 2);
        }
        bytes[SINK..SINK + SINK_LEN].fill(BLANK);
        bytes[RBUF..RBUF + RECVS * RSLOT].fill(BLANK);
        let local = Access::LOCAL_WRITE;
        let areas = [
            (SRC, SRC_LEN, Access::default()),
            (
                DST,
                DST_LEN,
                local | Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            ),
            (SINK, SINK_LEN, local),
            (RBUF, RECVS * RSLOT, local),
            (SRC, SRC_LEN, Access::REMOTE_READ),
        ];
        let regions = areas
            .iter()
            .map(|&(off, len, access)| {
                // SAFETY: inside `mem`, which outlives the region (the field order drops the
                // regions first).
                unsafe { pd.register(base.add(off), len, access) }.expect("a region registers")
            })
            .collect();
        let stream = Stream::new(
            dev,
            StreamConfig {
                qp_num: id as u32 + 1,
                pd: pd.id(),
                ..cfg
            },
            scq.clone(),
            rcq.clone(),
        );
        let mut side = Side {
            stream,
            scq,
            rcq,
            regions,
            invalidated: false,
            base,
            _mem: mem,
            closed: false,
            corrupted: false,
            taken: None,
            wire: Vec::new(),
            pipe: VecDeque::new(),
            ops: Vec::new(),
            model: Vec::new(),
            sink_used: 0,
            wcs: Vec::new(),
            rwcs: Vec::new(),
        };
        for j in 0..RECVS {
            let sges = recv_buffers(j)
                .into_iter()
                .map(|(off, len)| side.sge(3, off, len))
                .collect();
            side.stream
                .post_recv(RecvWr {
                    wr_id: j as u64,
                    sges,
                })
                .expect("a receive posts");
        }
        side
    }

    /// This side's memory, read between steps (nothing writes it meanwhile: the streams run
    /// on this thread, inside the steps).
    fn mem(&self) -> &[u8] {
        // SAFETY: MEM bytes owned by `_mem`; see above for why nothing writes them now.
        unsafe { std::slice::from_raw_parts(self.base, MEM) }
    }

    fn sge(&self, region: usize, off: usize, len: usize) -> Sge {
        Sge {
            addr: self.base as u64 + off as u64,
            len: len as u32,
            lkey: self.regions[region].stag(),
        }
    }

    fn target(&self) -> (u64, Stag) {
        (self.base as u64 + DST as u64, self.regions[1].stag())
    }

    fn poll(&mut self) {
        let mut buf = [WorkCompletion::BLANK; 16];
        for (cq, out) in [(&self.scq, &mut self.wcs), (&self.rcq, &mut self.rwcs)] {
            loop {
                let n = cq.poll(&mut buf);
                out.extend_from_slice(&buf[..n]);
                if n == 0 {
                    break;
                }
            }
        }
    }

    /// What `tx_iovecs` lists now, through at most `entries` gather entries; for more than 32
    /// entries, what `tx_copy` copies into a ring's 512-byte small-send buffer first, as the
    /// ring does, when all that is queued fits there.
    fn listed(&mut self, entries: usize) -> Vec<u8> {
        if entries > 32 {
            let mut small = [0u8; 512];
            if let Some(n) = self.stream.tx_copy(&mut small) {
                return small[..n].to_vec();
            }
        }
        let mut iov = [IoSlice::new(&[]); 64];
        let n = self.stream.tx_iovecs(&mut iov[..entries.clamp(1, 64)]);
        iov[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    fn hand_over(&mut self, bytes: &[u8]) {
        self.wire.extend_from_slice(bytes);
        self.pipe.extend(bytes);
    }

    /// A synchronous send of `n(listed)` of the `listed` bytes; returns `listed` (0 while an
    /// asynchronous send is outstanding: nothing else may send then).
    fn send(&mut self, entries: usize, n: impl FnOnce(usize) -> usize) -> usize {
        if self.taken.is_some() {
            return 0;
        }
        let bytes = self.listed(entries);
        let n = n(bytes.len());
        self.hand_over(&bytes[..n]);
        self.stream.tx_advance(n);
        bytes.len()
    }

    /// An asynchronous send takes what is listed.
    fn take(&mut self, entries: usize) {
        if self.taken.is_none() {
            let bytes = self.listed(entries);
            if !bytes.is_empty() {
                self.stream.tx_take(bytes.len());
                self.taken = Some(bytes);
            }
        }
    }

    /// The asynchronous send completes, having sent `n` of the bytes it took.
    fn settle(&mut self, n: impl FnOnce(usize) -> usize) {
        if let Some(bytes) = self.taken.take() {
            let n = n(bytes.len());
            self.hand_over(&bytes[..n]);
            self.stream.tx_settle(n);
        }
    }

    fn close(&mut self) {
        self.stream.enter_error(WcStatus::WrFlushErr);
        self.closed = true;
    }

    /// Gather entries for `len` bytes of the source: up to three, each from its own offset.
    fn gather(&self, len: usize, script: &mut Script<'_>) -> (Vec<Sge>, Vec<u8>) {
        let (mut sges, mut bytes) = (Vec::new(), Vec::new());
        let pieces = 1 + script.b() as usize % 3;
        let mut left = len;
        for k in 0..pieces {
            let n = if k + 1 == pieces {
                left
            } else {
                script.share(left)
            };
            // A piece may be empty: an entry of length 0 is a valid one.
            let off = script.u16() % (SRC_LEN - n + 1);
            sges.push(self.sge(0, SRC + off, n));
            bytes.extend_from_slice(&self.mem()[SRC + off..SRC + off + n]);
            left -= n;
        }
        (sges, bytes)
    }

    /// A sink slot of `len` bytes (8-aligned), if there is room.
    fn sink(&mut self, len: usize) -> Option<usize> {
        let at = self.sink_used.next_multiple_of(8);
        (at + len <= SINK_LEN).then(|| {
            self.sink_used = at + len;
            SINK + at
        })
    }

    /// Posts the request the script describes next (`kind` from the action byte), if it fits.
    fn post(&mut self, kind: u8, peer: &Side, script: &mut Script<'_>) {
        let receives = self.ops.iter().filter(|o| o.effect.takes_receive()).count();
        if self.ops.len() >= MAX_OPS {
            return;
        }
        let (remote, rkey) = peer.target();
        let mut sges = Vec::new();
        let (op, effect) = match kind {
            0..=2 => {
                let len = script.u16() % (WRITE_MAX + 1);
                let off = script.u16() % (DST_LEN - len + 1);
                let imm = (kind == 2).then(|| script.u16() as u32);
                if imm.is_some() && receives >= RECVS {
                    return;
                }
                let bytes;
                (sges, bytes) = self.gather(len, script);
                let remote_addr = remote + off as u64;
                let op = match imm {
                    Some(imm) => SendOp::WriteWithImm {
                        remote_addr,
                        rkey,
                        imm,
                    },
                    None => SendOp::Write { remote_addr, rkey },
                };
                (op, Effect::Write { off, bytes, imm })
            }
            3 => {
                if receives >= RECVS {
                    return;
                }
                let len = script.u16() % (SEND_MAX + 1);
                let bytes;
                (sges, bytes) = self.gather(len, script);
                let flags = script.b();
                let solicited = flags & 1 != 0;
                let invalidate = (flags & 2 != 0 && !self.invalidated).then(|| {
                    self.invalidated = true;
                    peer.regions[4].stag()
                });
                let op = SendOp::Send {
                    solicited,
                    invalidate,
                };
                let invalidate = invalidate.map(|s| s.0);
                (
                    op,
                    Effect::Send {
                        bytes,
                        solicited,
                        invalidate,
                    },
                )
            }
            4 => {
                let len = 1 + script.u16() % READ_MAX;
                let off = script.u16() % (DST_LEN - len + 1);
                let Some(sink) = self.sink(len) else { return };
                sges.push(self.sge(2, sink, len));
                let op = SendOp::Read {
                    remote_addr: remote + off as u64,
                    rkey,
                };
                let versions = Vec::new();
                (
                    op,
                    Effect::Read {
                        off,
                        len,
                        sink,
                        versions,
                    },
                )
            }
            _ => {
                let off = script.u16() % (DST_LEN / 8) * 8;
                let Some(sink) = self.sink(8) else { return };
                sges.push(self.sge(2, sink, 8));
                let original = u64::from_ne_bytes(self.model[off..off + 8].try_into().unwrap());
                let value = u64::from(script.u16() as u16) << 16 | script.u16() as u64;
                let (op, atomic) = match kind {
                    5 => (
                        SendOp::FetchAdd {
                            remote_addr: remote + off as u64,
                            rkey,
                            add: value,
                        },
                        Atomic::FetchAdd(value),
                    ),
                    6 => {
                        // Half the time the comparison holds.
                        let compare = if script.b() & 1 != 0 { original } else { value };
                        let swap = value ^ 0x5A5A;
                        (
                            SendOp::CmpSwap {
                                remote_addr: remote + off as u64,
                                rkey,
                                compare,
                                swap,
                            },
                            Atomic::CmpSwap(compare, swap),
                        )
                    }
                    _ => (
                        SendOp::Swap {
                            remote_addr: remote + off as u64,
                            rkey,
                            swap: value,
                        },
                        Atomic::Swap(value),
                    ),
                };
                let after = atomic.apply(original);
                let effect = Effect::Atomic { sink, original };
                self.push_op(op, effect, sges, |m| {
                    m[off..off + 8].copy_from_slice(&after.to_ne_bytes())
                });
                return;
            }
        };
        let write = match &effect {
            Effect::Write { off, bytes, .. } => Some((*off, bytes.clone())),
            _ => None,
        };
        self.push_op(op, effect, sges, |m| {
            if let Some((off, bytes)) = write {
                m[off..off + bytes.len()].copy_from_slice(&bytes);
            }
        });
    }

    /// Posts `op` and records it; `change` is what it does to the peer's region.
    fn push_op(
        &mut self,
        op: SendOp,
        effect: Effect,
        sges: Vec<Sge>,
        change: impl FnOnce(&mut [u8]),
    ) {
        let wr_id = self.ops.len() as u64;
        let opcode = op.opcode();
        self.stream
            .post_send(SendWr {
                wr_id,
                op,
                sges: sges.into_iter().collect(),
                signaled: true,
                fence: false,
            })
            .expect("a valid request posts");
        let before = self.model.clone();
        change(&mut self.model);
        // Every earlier Read may see this request's bytes (one that is not fenced may run
        // before the Read's response is read), so each keeps the range as it is now too.
        for o in &mut self.ops {
            if let Effect::Read {
                off, len, versions, ..
            } = &mut o.effect
            {
                if self.model[*off..*off + *len] != before[*off..*off + *len] {
                    versions.push(self.model[*off..*off + *len].to_vec());
                }
            }
        }
        let mut effect = effect;
        if let Effect::Read {
            off, len, versions, ..
        } = &mut effect
        {
            versions.push(before[*off..*off + *len].to_vec());
        }
        self.ops.push(Op {
            effect,
            opcode,
            before,
        });
    }
}

/// Moves up to `n` bytes of `from`'s pipe into `to`, in pieces of the script's sizes. An honest
/// stream's bytes must all be taken, unless the receiving side closed (its socket is gone) or
/// one of the two streams was altered on the way (then the receiver may stop at a violation,
/// and what is left is dropped, as by a closed socket).
fn deliver(from: &mut Side, to: &mut Side, n: usize, piece: u8) {
    if to.closed {
        from.pipe.clear();
        return;
    }
    let n = n.min(from.pipe.len());
    let bytes: Vec<u8> = from.pipe.drain(..n).collect();
    let mut x = u32::from(piece) | 0x100;
    let mut at = 0;
    while at < bytes.len() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let k = (1 + x as usize % 160).min(bytes.len() - at);
        let used = to.stream.rx_feed(&bytes[at..at + k]);
        if used < k && (from.corrupted || to.corrupted) {
            from.pipe.clear();
            return;
        }
        assert_eq!(
            used,
            k,
            "an honest stream's bytes were refused (Terminate {:?})",
            to.stream.last_terminate()
        );
        at += k;
    }
}

/// What one input did, so tests can see that the checks ran on something.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    /// Requests that completed successfully, by opcode: Write (with immediate data or not),
    /// Send, Read, atomic.
    pub writes: usize,
    /// See [`Tally::writes`].
    pub sends: usize,
    /// See [`Tally::writes`].
    pub reads: usize,
    /// See [`Tally::writes`].
    pub atomics: usize,
    /// Receives that completed with the STag a Send invalidated.
    pub invalidations: usize,
    /// Requests that were flushed by a close.
    pub flushed: usize,
    /// Sides that closed.
    pub closes: usize,
    /// Sides whose stream was altered on the way.
    pub corrupted: usize,
    /// Terminates sent (not in answer to the peer's).
    pub terminates: usize,
    /// FPDUs on the wires, both ways.
    pub fpdus: usize,
}

/// Runs the check on one input (see the module doc).
pub fn stream_pair(data: &[u8]) {
    stream_pair_with(data, |_, _| {});
}

/// The check, with `meddle` run on the two sides' memory before the comparisons (for the tests
/// that show the check catches what it should).
fn stream_pair_with(data: &[u8], meddle: impl FnOnce(*mut u8, *mut u8)) -> Tally {
    let mut script = Script { data, at: 0 };
    let ctl = script.b();
    let cfg = StreamConfig {
        qp_num: 0,
        pd: 0,
        crc: ctl & 1 != 0,
        mulpdu: [128, 300, 1024, 4096][(ctl >> 1) as usize % 4],
        ird: 4,
        ord: 4,
        remote_completion: ctl & 8 != 0,
    };
    let mut sides = [Side::new(0, cfg), Side::new(1, cfg)];
    for (i, s) in sides.iter_mut().enumerate() {
        // Each side models its peer's target region, which starts as the peer's pattern.
        s.model = (0..DST_LEN).map(|k| pattern(1 - i, k, 2)).collect();
    }
    let mut steps = 0;
    while let Some(action) = script.byte() {
        steps += 1;
        if steps > 2000 {
            break;
        }
        let me = (action >> 4) as usize & 1;
        let [a, b] = &mut sides;
        let (x, y) = if me == 0 { (a, b) } else { (b, a) };
        match action & 0xF {
            k @ 0..=7 => x.post(k, y, &mut script),
            8 | 14 => {
                let entries = 1 + script.b() as usize % 64;
                x.send(entries, |n| script.share(n));
            }
            9 => x.take(1 + script.b() as usize % 64),
            10 => {
                let f = script.b() as usize;
                x.settle(|n| n * f / 255);
            }
            11 | 15 => {
                let n = script.u16();
                let piece = script.b();
                deliver(x, y, n, piece);
            }
            // A close one time in sixteen, so that most scripts run to the end with both
            // sides up and the exact checks apply.
            12 => {
                if script.b() < 16 {
                    x.close();
                }
            }
            _ => {
                let piece = script.b();
                if piece < 48 && me == 0 && !x.pipe.is_empty() {
                    // Now and then, one byte of side 0's stream is altered on the way: side 1
                    // may stop at a violation, and its Terminate must reach side 0 intact.
                    let at = script.u16() % x.pipe.len();
                    x.pipe[at] ^= script.b() | 1;
                    x.corrupted = true;
                } else {
                    deliver(x, y, usize::MAX, piece);
                }
            }
        }
        x.poll();
        y.poll();
    }
    finish(&mut sides);
    let [a, b] = &mut sides;
    meddle(a.base, b.base);
    check(&sides)
}

/// Runs both streams to quiet: the asynchronous sends finish, then everything queued goes and
/// is read.
fn finish(sides: &mut [Side; 2]) {
    for s in sides.iter_mut() {
        s.settle(|n| n);
    }
    for round in 0.. {
        assert!(round < 100_000, "the streams did not go quiet");
        let mut moved = false;
        for me in 0..2 {
            let [a, b] = &mut *sides;
            let (x, y) = if me == 0 { (a, b) } else { (b, a) };
            while x.stream.wants_tx() {
                assert!(x.send(64, |n| n) > 0, "queued bytes that cannot be listed");
                moved = true;
            }
            if !x.pipe.is_empty() {
                deliver(x, y, usize::MAX, round as u8);
                moved = true;
            }
            x.poll();
            y.poll();
        }
        if !moved {
            break;
        }
    }
}

/// Deterministic inputs for the tests and the corpus's seeds.
pub fn seeds() -> Vec<(String, Vec<u8>)> {
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    (0..12)
        .map(|k| {
            let bytes = (0..400)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    (x >> 32) as u8
                })
                .collect();
            (format!("random-{k}"), bytes)
        })
        .collect()
}
