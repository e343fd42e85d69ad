//! The live-stream fuzz check: arbitrary bytes, split at arbitrary points, fed to a real
//! [`Stream`] that holds registered regions surrounded by guard bytes, posted receives, an
//! outstanding RDMA Read and an outstanding atomic. It is the receive path the provider runs
//! (the one [`Framer`], then placement and the RDMAP handlers), with nothing mocked.
//!
//! Promises checked on every input (a broken one panics, which the fuzzer reports):
//! - no panic, including arithmetic overflow (fuzz and test builds check overflow);
//! - no byte changes outside the memory a peer may change: the remotely writable region, the
//!   posted receives' buffers, and the sinks of the outstanding Read and atomic (guard bytes,
//!   the read-only region, the gap between two receive buffers and the rest of the sink region
//!   stay as they were);
//! - every violation is answered: a stream that stopped receiving without the peer's own
//!   Terminate has queued a Terminate, and it is on the wire it sends.
//!
//! Inputs name memory through a fixed layout ([`layout`]): the arena is mapped at [`ARENA`]
//! when that address is free, and the device hands out STags 1, 2, 3, 4 in order.
//!
//! The first input byte is control: bit 0 turns CRC on; the rest seeds the split points.

use super::*;
use crate::verbs::{Access, CompletionQueue, Device, MemoryRegion};
use crate::wire::Deframer;

pub mod pair;
pub use pair::stream_pair;

/// Where the arena is mapped, when that address is free.
pub const ARENA: u64 = 0x10_0000_0000;
const SIZE: usize = 4096;
const FILL: u8 = 0xa5;

/// The arena's layout: `(offset, length)` pairs, and the STags the regions get.
pub mod layout {
    /// Remote read, write and atomics; STag 1.
    pub const RW: (usize, usize) = (64, 256);
    /// Remote read only; STag 2.
    pub const RO: (usize, usize) = (384, 128);
    /// Local only, holding the receive buffers; STag 3.
    pub const RECV: (usize, usize) = (576, 256);
    /// The first posted receive: two buffers with a gap between them that no Send may touch.
    pub const RECV0: [(usize, usize); 2] = [(576, 64), (704, 64)];
    /// The second posted receive.
    pub const RECV1: (usize, usize) = (768, 64);
    /// Local only, holding the sinks of the outstanding Read and atomic; STag 4.
    pub const SINK: (usize, usize) = (896, 256);
    /// Where the outstanding Read's data goes.
    pub const READ_SINK: (usize, usize) = (896, 64);
    /// Where the outstanding atomic's original value goes.
    pub const ATOMIC_SINK: (usize, usize) = (1024, 8);
    /// The STags, in the order the regions are registered.
    pub const STAG_RW: u32 = 1;
    /// See [`RO`].
    pub const STAG_RO: u32 = 2;
    /// See [`RECV`].
    pub const STAG_RECV: u32 = 3;
    /// See [`SINK`].
    pub const STAG_SINK: u32 = 4;
}

/// The arena: one page, at [`ARENA`] when possible. One at a time per process (test threads
/// take turns), so the fixed address is free whenever nothing else took it.
struct Arena {
    base: *mut u8,
    _turn: std::sync::MutexGuard<'static, ()>,
}

static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Arena {
    fn new() -> Arena {
        // A panicking check (the point of a fuzz run) poisons the lock; the arena is still fine.
        let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let map = |addr: u64, flags: i32| {
            // SAFETY: an anonymous private mapping; with MAP_FIXED_NOREPLACE the kernel refuses
            // (EEXIST) rather than replace anything already mapped there.
            unsafe {
                libc::mmap(
                    addr as *mut libc::c_void,
                    SIZE,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
                    -1,
                    0,
                )
            }
        };
        let mut p = map(ARENA, libc::MAP_FIXED_NOREPLACE);
        if p == libc::MAP_FAILED {
            p = map(0, 0);
        }
        assert!(p != libc::MAP_FAILED, "mmap of the fuzz arena failed");
        let base = p as *mut u8;
        // SAFETY: the mapping is SIZE bytes, writable, and ours alone.
        unsafe { std::ptr::write_bytes(base, FILL, SIZE) };
        Arena { base, _turn: turn }
    }

    fn addr(&self, off: usize) -> u64 {
        self.base as u64 + off as u64
    }

    fn bytes(&self) -> Vec<u8> {
        // SAFETY: SIZE readable bytes; nothing writes them during this copy (the stream runs
        // on this thread).
        unsafe { std::slice::from_raw_parts(self.base, SIZE) }.to_vec()
    }

    /// # Safety
    /// As [`crate::verbs::ProtectionDomain::register`]: the region must be dropped before the
    /// arena is.
    unsafe fn register(
        &self,
        pd: &crate::verbs::ProtectionDomain,
        (off, len): (usize, usize),
        access: Access,
    ) -> MemoryRegion {
        // SAFETY: inside the arena (the caller keeps it alive longer than the region).
        unsafe { pd.register(self.base.add(off), len, access) }.expect("arena region registers")
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referenced (regions are dropped first).
        unsafe { libc::munmap(self.base as *mut libc::c_void, SIZE) };
    }
}

/// The byte ranges a peer may change.
fn writable() -> Vec<(usize, usize)> {
    use layout::*;
    vec![RW, RECV0[0], RECV0[1], RECV1, READ_SINK, ATOMIC_SINK]
}

fn sge(arena: &Arena, (off, len): (usize, usize), lkey: u32) -> Sge {
    Sge {
        addr: arena.addr(off),
        len: len as u32,
        lkey: Stag(lkey),
    }
}

/// Runs the check on one input (see the module doc).
pub fn live_stream(data: &[u8]) {
    live_stream_with(data, |_| {});
}

/// What one input did, for tests that expect a particular effect.
#[derive(Debug)]
pub struct Outcome {
    /// The arena afterwards.
    pub arena: Vec<u8>,
    /// Whether the stream stopped receiving.
    pub dead: bool,
    /// Whether this side sent a Terminate.
    pub terminated: bool,
    /// The completions, in order: (wr_id, status).
    pub completions: Vec<(u64, WcStatus)>,
}

/// The check, with `meddle` run on the arena before the comparison (for the test that shows
/// the check catches a stray write).
fn live_stream_with(data: &[u8], meddle: impl FnOnce(*mut u8)) -> Option<Outcome> {
    let (&ctl, input) = data.split_first()?;
    let crc = ctl & 1 != 0;
    let arena = Arena::new();
    let before = arena.bytes();
    let dev = Device::with_predictable_stags();
    let pd = dev.alloc_pd();
    let cq = CompletionQueue::new(64);
    let cfg = StreamConfig {
        qp_num: 1,
        pd: pd.id(),
        crc,
        mulpdu: 1024,
        ird: 4,
        ord: 4,
        remote_completion: false,
    };
    let local = Access::LOCAL_WRITE;
    // SAFETY: the regions are dropped at the end of this function, before the arena.
    let regions = unsafe {
        [
            arena.register(
                &pd,
                layout::RW,
                local | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            ),
            arena.register(&pd, layout::RO, Access::REMOTE_READ),
            arena.register(&pd, layout::RECV, local),
            arena.register(&pd, layout::SINK, local),
        ]
    };
    assert_eq!(
        regions.iter().map(|r| r.stag().0).collect::<Vec<_>>(),
        [
            layout::STAG_RW,
            layout::STAG_RO,
            layout::STAG_RECV,
            layout::STAG_SINK
        ]
    );
    let mut s = Stream::new(dev.clone(), cfg, cq.clone(), cq.clone());
    s.post_recv(RecvWr {
        wr_id: 10,
        sges: layout::RECV0
            .iter()
            .map(|&r| sge(&arena, r, layout::STAG_RECV))
            .collect(),
    })
    .expect("receive posts");
    s.post_recv(RecvWr {
        wr_id: 11,
        sges: [sge(&arena, layout::RECV1, layout::STAG_RECV)].into(),
    })
    .expect("receive posts");
    s.post_send(SendWr {
        wr_id: 20,
        op: SendOp::Read {
            remote_addr: 0x2000,
            rkey: Stag(0x77),
        },
        sges: [sge(&arena, layout::READ_SINK, layout::STAG_SINK)].into(),
        signaled: true,
        fence: false,
    })
    .expect("read posts");
    s.post_send(SendWr {
        wr_id: 21,
        op: SendOp::FetchAdd {
            remote_addr: 0x3000,
            rkey: Stag(0x78),
            add: 1,
        },
        sges: [sge(&arena, layout::ATOMIC_SINK, layout::STAG_SINK)].into(),
        signaled: true,
        fence: false,
    })
    .expect("atomic posts");

    // What this side sends: drained as it goes, as a socket would.
    let mut wire = Vec::new();
    let drain = |s: &mut Stream, wire: &mut Vec<u8>| {
        while s.wants_tx() {
            let mut iov = [std::io::IoSlice::new(&[]); 16];
            let n = s.tx_iovecs(&mut iov);
            let before = wire.len();
            iov[..n].iter().for_each(|v| wire.extend_from_slice(v));
            s.tx_advance(wire.len() - before);
        }
    };
    drain(&mut s, &mut wire);
    let mut completions = Vec::new();
    let poll = |cq: &CompletionQueue, out: &mut Vec<(u64, WcStatus)>| {
        let mut wcs = [WorkCompletion::BLANK; 8];
        loop {
            let n = cq.poll(&mut wcs);
            out.extend(wcs[..n].iter().map(|w| (w.wr_id, w.status)));
            if n == 0 {
                break;
            }
        }
    };
    let mut x = u64::from(ctl) << 32 | 0x9e37_79b9;
    let mut rest = input;
    while !rest.is_empty() && !s.rx_dead() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = ((x % 97) as usize + 1).min(rest.len());
        let used = s.rx_feed(&rest[..n]);
        assert!(used <= n);
        rest = &rest[n..];
        drain(&mut s, &mut wire);
        poll(&cq, &mut completions);
    }
    drain(&mut s, &mut wire);
    poll(&cq, &mut completions);
    meddle(arena.base);

    // Nothing outside what a peer may change has changed.
    let after = arena.bytes();
    let open = writable();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if b != a && !open.iter().any(|&(o, l)| (o..o + l).contains(&i)) {
            panic!("byte {i} of the arena changed ({b:#04x} -> {a:#04x}) outside any region or buffer a peer may write");
        }
    }
    // Every violation was answered with a Terminate that reached the wire.
    if s.rx_dead() && !s.peer_terminated() {
        assert!(s.terminate_sent(), "the stream stopped without a Terminate");
        let mut d = Deframer::new(crc, u16::MAX as usize);
        let mut terminates = 0;
        d.feed(&wire, |u| {
            if Segment::decode(u).is_ok_and(|seg| seg.opcode == RdmapOpcode::Terminate) {
                terminates += 1;
            }
            Ok(())
        })
        .expect("what this side sends frames correctly");
        assert_eq!(terminates, 1, "one Terminate on the wire");
    }
    drop(regions);
    Some(Outcome {
        arena: after,
        dead: s.rx_dead(),
        terminated: s.terminate_sent(),
        completions,
    })
}

/// Seeds for the corpus: one well-formed or deliberately bad input per kind of message,
/// naming the arena's regions (`cargo run -p barewire-soft-rdma --features fuzzing --example
/// fuzz_seeds` writes them to `fuzz/corpus/live_stream/`).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    use crate::wire::{qn, AtomicOp, AtomicRequest, AtomicResponse, DdpHeader};
    use layout::*;
    let at = |off: usize| ARENA + off as u64;
    let frame = |seg: Segment<'_>| {
        let mut out = Vec::new();
        seg.encode_fpdu(false, &mut out).expect("a seed encodes");
        out
    };
    let tagged = |opcode, stag, to, last, payload: &[u8]| {
        frame(Segment {
            last,
            opcode,
            header: DdpHeader::Tagged { stag, to },
            payload,
        })
    };
    let untagged = |opcode, qn, msn, mo, last, payload: &[u8]| {
        frame(Segment {
            last,
            opcode,
            header: DdpHeader::Untagged {
                ulp: 0,
                qn,
                msn,
                mo,
            },
            payload,
        })
    };
    let rr = |sink_to: u64, size: u32, source_stag: u32, source_to: u64| {
        let mut b = [0u8; ReadRequest::LEN];
        ReadRequest {
            sink_stag: 0x55,
            sink_to,
            size,
            source_stag,
            source_to,
        }
        .encode(&mut b);
        untagged(RdmapOpcode::ReadRequest, qn::READ_REQUEST, 1, 0, true, &b)
    };
    let mut atomic = [0u8; AtomicRequest::LEN];
    AtomicRequest {
        op: AtomicOp::FetchAdd,
        request_id: 9,
        stag: STAG_RW,
        to: at(RW.0 + 8),
        data: 5,
        data_mask: !0,
        compare: 0,
        compare_mask: !0,
    }
    .encode(&mut atomic);
    let mut answer = [0u8; AtomicResponse::LEN];
    AtomicResponse {
        request_id: 1,
        original: 42,
    }
    .encode(&mut answer);
    let w = RdmapOpcode::Write;
    let response = tagged(
        RdmapOpcode::ReadResponse,
        STAG_SINK,
        at(READ_SINK.0),
        true,
        &[3; 64],
    );
    let list: Vec<(&'static str, Vec<u8>)> = vec![
        ("write", tagged(w, STAG_RW, at(RW.0), true, &[1; 64])),
        (
            "write-past-end",
            tagged(w, STAG_RW, at(RW.0 + 250), true, &[1; 64]),
        ),
        (
            "write-read-only",
            tagged(w, STAG_RO, at(RO.0), true, &[1; 8]),
        ),
        (
            "write-local-only",
            tagged(w, STAG_SINK, at(SINK.0), true, &[1; 8]),
        ),
        ("write-bad-stag", tagged(w, 0x99, at(RW.0), true, &[1; 8])),
        (
            "send-two-buffers",
            untagged(RdmapOpcode::Send, qn::SEND, 1, 0, true, &[2; 100]),
        ),
        (
            "send-too-long",
            untagged(RdmapOpcode::Send, qn::SEND, 1, 0, true, &[2; 200]),
        ),
        ("read-response", response.clone()),
        (
            "read-response-in-two",
            [
                tagged(
                    RdmapOpcode::ReadResponse,
                    STAG_SINK,
                    at(READ_SINK.0),
                    false,
                    &[3; 40],
                ),
                tagged(
                    RdmapOpcode::ReadResponse,
                    STAG_SINK,
                    at(READ_SINK.0 + 40),
                    true,
                    &[3; 24],
                ),
            ]
            .concat(),
        ),
        (
            "read-response-outside-sink",
            tagged(
                RdmapOpcode::ReadResponse,
                STAG_SINK,
                at(READ_SINK.0 + 64),
                true,
                &[3; 64],
            ),
        ),
        ("read-request", rr(0x1000, 64, STAG_RO, at(RO.0))),
        (
            "read-request-wrapping-sink",
            rr(u64::MAX - 8, 64, STAG_RO, at(RO.0)),
        ),
        (
            "read-request-local-only",
            rr(0x1000, 8, STAG_SINK, at(SINK.0)),
        ),
        (
            "atomic-request",
            untagged(
                RdmapOpcode::AtomicRequest,
                qn::ATOMIC_REQUEST,
                1,
                0,
                true,
                &atomic,
            ),
        ),
        (
            "atomic-response",
            [
                response,
                untagged(
                    RdmapOpcode::AtomicResponse,
                    qn::ATOMIC_RESPONSE,
                    1,
                    0,
                    true,
                    &answer,
                ),
            ]
            .concat(),
        ),
        ("short-frame", vec![0x00, 0x04, 0x41, 0x40, 0, 0, 0, 0]),
    ];
    // Control byte 0 (CRC off); the first also with CRC on.
    let mut out: Vec<(&'static str, Vec<u8>)> = list
        .into_iter()
        .map(|(n, b)| (n, [&[0u8][..], &b].concat()))
        .collect();
    let mut crc = Vec::new();
    Segment {
        last: true,
        opcode: w,
        header: DdpHeader::Tagged {
            stag: STAG_RW,
            to: at(RW.0),
        },
        payload: &[1; 64],
    }
    .encode_fpdu(true, &mut crc)
    .expect("encodes");
    out.push(("write-crc", [&[1u8][..], &crc].concat()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds name the arena by its fixed address: only meaningful where it got it.
    fn fixed() -> bool {
        Arena::new().base as u64 == ARENA
    }

    fn run(name: &str) -> Outcome {
        let (_, bytes) = seeds().into_iter().find(|(n, _)| *n == name).expect(name);
        live_stream_with(&bytes, |_| {}).expect("an input")
    }

    fn region(o: &Outcome, (off, len): (usize, usize)) -> &[u8] {
        &o.arena[off..off + len]
    }

    #[test]
    fn seeds_have_the_effects_they_are_named_for() {
        if !fixed() {
            eprintln!("the fixed arena address is taken: skipped");
            return;
        }
        for name in ["write", "write-crc"] {
            let o = run(name);
            assert!(
                !o.dead && region(&o, (layout::RW.0, 64)).iter().all(|&b| b == 1),
                "{name}: {o:?}"
            );
        }
        for name in [
            "write-past-end",
            "write-read-only",
            "write-local-only",
            "write-bad-stag",
            "send-too-long",
            "read-response-outside-sink",
            "read-request-wrapping-sink",
            "short-frame",
        ] {
            let o = run(name);
            assert!(o.dead && o.terminated, "{name}: {o:?}");
            assert!(o.arena.iter().all(|&b| b == FILL), "{name} changed memory");
        }
        let o = run("send-two-buffers");
        assert!(region(&o, layout::RECV0[0]).iter().all(|&b| b == 2));
        assert!(region(&o, (layout::RECV0[1].0, 36)).iter().all(|&b| b == 2));
        assert!(region(&o, (640, 64)).iter().all(|&b| b == FILL), "the gap");
        assert!(o.completions.contains(&(10, WcStatus::Success)));
        for name in ["read-response", "read-response-in-two"] {
            let o = run(name);
            assert!(region(&o, layout::READ_SINK).iter().all(|&b| b == 3));
            assert_eq!(o.completions, [(20, WcStatus::Success)], "{name}");
        }
        let o = run("atomic-response");
        assert_eq!(region(&o, layout::ATOMIC_SINK), 42u64.to_ne_bytes());
        assert_eq!(
            o.completions,
            [(20, WcStatus::Success), (21, WcStatus::Success)]
        );
        let o = run("atomic-request");
        assert_eq!(
            region(&o, (layout::RW.0 + 8, 8)),
            (FILL_WORD + 5).to_ne_bytes()
        );
        let o = run("read-request-local-only");
        assert!(o.terminated, "a Read of a local-only region is refused");
        assert!(!run("read-request").terminated);
    }

    const FILL_WORD: u64 = u64::from_ne_bytes([FILL; 8]);

    #[test]
    #[should_panic(expected = "outside any region or buffer")]
    fn the_check_catches_a_stray_write() {
        // SAFETY: offset 0 is a guard byte of the live arena.
        live_stream_with(&[0, 0, 0], |base| unsafe { *base = 0 });
    }

    #[test]
    fn the_seeds_and_the_corpus_replay() {
        for (_, bytes) in seeds() {
            live_stream(&bytes);
        }
        crate::wire::fuzz::replay_corpus("live_stream", live_stream);
    }
}
