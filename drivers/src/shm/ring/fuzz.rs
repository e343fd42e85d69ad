//! The checks the cargo-fuzz target `shm_ring` runs on the shared message ring, here so that
//! `cargo test` replays its corpus on stable Rust (`drivers/tests/fuzz_corpus.rs`).
//!
//! Both of this process's ends are honest; the input is a script that interleaves their steps
//! with what a hostile peer can do to the memory they share: a writer that forges record
//! headers, scribbles over the area and publishes any tail, and a reader that claims any head
//! or look. What must hold:
//! - nothing panics, and nothing outside the ring's memory changes (guard bytes either side);
//! - every record the reader hands out lies inside the area and inside what the tail published,
//!   and a corrupt ring is an error, after which the reader takes nothing more;
//! - what the writer believes consumed never goes back, never passes what it sent, and never
//!   leaves more than a ring's worth outstanding;
//! - while no hostile step has run, the reader takes exactly the records the writer put in, in
//!   order, with their bytes, and a ring with nothing published reads as empty.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use super::{Heap, Reader, Record, HEAD, HEADER, IMM, MIN_CAP, REC, REVOKE, SEEN, SEND, TAIL};

/// A record the honest writer put in: kind, flags, length, value and the payload's fill byte.
type Sent = (u8, u8, u32, u32, u8);

/// Runs one script (see the module docs).
pub fn shm_ring(data: &[u8]) {
    let mut input = data.iter().copied();
    let mut byte = move || input.next();
    let cap = MIN_CAP;
    let (mut w, mut r, heap) = Heap::pair(cap);
    let mut sent: VecDeque<Sent> = VecDeque::new();
    // No hostile step yet: the reader must see exactly what was sent.
    let mut honest = true;
    let mut reader_failed = false;
    let mut believed = 0u64;
    let mut fill = 0u8;
    while let Some(op) = byte() {
        let arg = byte().unwrap_or(0);
        let arg2 = byte().unwrap_or(0);
        let word = u16::from_le_bytes([arg, arg2]) as u64;
        match op % 8 {
            // The honest writer appends a record (most often a Send).
            0 | 1 => {
                let kind = [SEND, SEND, IMM, REVOKE][(arg & 3) as usize];
                let flags = (arg >> 2) & 7;
                let body = if kind == SEND {
                    word as usize % (w.max_fragment() + 1)
                } else {
                    0
                };
                let len = if kind == SEND {
                    body as u32
                } else {
                    word as u32
                };
                fill = fill.wrapping_add(1);
                let value = u32::from(fill) << 8 | u32::from(op);
                let f = fill;
                // SAFETY: `push` hands over the record's payload area of `body` bytes.
                let pushed = w.push(kind, flags, body, len, value, |p| unsafe {
                    std::ptr::write_bytes(p, f, body)
                });
                if pushed {
                    sent.push_back((kind, flags, len, value, f));
                }
            }
            // A hostile writer forges a record header at a 16-byte slot.
            2 => {
                let at = (word << 4) & (cap as u64 - 1);
                let len = match byte().unwrap_or(0) % 4 {
                    0 => u32::from(arg2),
                    1 => (word * 7) as u32 % (cap as u32 / 3),
                    2 => (cap as u64 - at - REC as u64) as u32,
                    _ => u32::from_le_bytes([arg, arg2, arg, arg2]),
                };
                w.write_header(at, arg % 6, arg2 % 8, len, u32::from(arg));
                honest = false;
            }
            // ...or scribbles a few bytes anywhere in the area.
            3 => {
                let at = word as usize % cap;
                for i in 0..(arg2 % 9) as usize {
                    let at = (at + i) % cap;
                    // SAFETY: `at` lies inside the record area of the ring.
                    unsafe { *r.ring.base.add(HEADER + at) = byte().unwrap_or(arg) };
                }
                honest = false;
            }
            // ...or publishes a tail of its choosing.
            4 => {
                let tail = match arg % 5 {
                    0 => u64::from_le_bytes([arg2; 8]).wrapping_mul(word | 1),
                    1 => r.head.wrapping_sub(word),
                    2 => r.head + word,
                    3 => (r.head + cap as u64).wrapping_sub(word % 256),
                    _ => w.tail(),
                };
                r.ring.word(TAIL).store(tail, Ordering::Release);
                honest &= tail == w.tail();
            }
            // The honest reader takes up to `arg % 8 + 1` records.
            5 if !reader_failed => {
                for _ in 0..arg % 8 + 1 {
                    match r.peek() {
                        Ok(None) => {
                            assert!(
                                !honest || sent.is_empty(),
                                "published records were not seen"
                            );
                            break;
                        }
                        Ok(Some((rec, body))) => {
                            let n = assert_inside(&r, &rec, body);
                            if honest {
                                let (kind, flags, len, value, f) =
                                    sent.pop_front().expect("a record nobody sent");
                                assert_eq!(
                                    (rec.kind, rec.flags, rec.len, rec.value),
                                    (kind, flags, len, value)
                                );
                                // SAFETY: the record's payload, inside the area (above).
                                let payload = unsafe { std::slice::from_raw_parts(body, n) };
                                assert!(payload.iter().all(|&b| b == f), "a payload changed");
                            }
                            r.consume(&rec);
                        }
                        Err(why) => {
                            assert!(!honest, "an honest ring read as corrupt: {}", why.0);
                            reader_failed = true;
                            break;
                        }
                    }
                }
            }
            // A hostile reader claims any head, or any look.
            6 => {
                let tail = w.tail();
                let claim = match arg % 4 {
                    0 => u64::from_le_bytes([arg2; 8]),
                    1 => tail.wrapping_sub(word),
                    2 => tail + word,
                    _ => believed + word % (tail - believed + 1),
                };
                let at = if arg2 & 1 == 0 { HEAD } else { SEEN };
                r.ring.word(at).store(claim, Ordering::Release);
                // A head claimed past what was read lets the writer overwrite unread records.
                honest = false;
            }
            // The honest reader's other steps: it waits for a receive, or goes to sleep.
            _ => {
                if arg & 1 == 0 {
                    r.waits();
                } else if r.sleep() {
                    r.wake();
                }
                let _ = r.has_data();
            }
        }
        let c = w.consumed();
        assert!(
            c >= believed && c <= w.tail(),
            "the writer believes {c} consumed, after {believed}, with {} sent",
            w.tail()
        );
        believed = c;
        let a = w.acknowledged();
        assert!(a >= c && a <= w.tail(), "acknowledged {a} of {}", w.tail());
        assert!(w.tail() - c <= cap as u64, "more than a ring outstanding");
    }
    assert!(heap.guards_intact(), "a byte outside the ring changed");
}

/// Asserts that a record the reader handed out lies inside the ring's area and inside what
/// the tail published, and that its payload is no longer than a fragment; returns the payload's
/// length.
pub(crate) fn assert_inside(r: &Reader, rec: &Record, body: *const u8) -> usize {
    let n = if rec.kind == SEND {
        rec.len as usize
    } else {
        0
    };
    let area = r.ring.base as usize + HEADER..r.ring.base as usize + HEADER + r.ring.cap;
    let tail = r.ring.word(TAIL).load(Ordering::Acquire);
    let at = body as usize;
    assert!(area.contains(&at), "{rec:?} starts outside the area");
    assert!(at + n <= area.end, "{rec:?} runs past the area");
    assert!(
        r.head + (REC + n.div_ceil(REC) * REC) as u64 <= tail,
        "{rec:?} lies past what was published"
    );
    assert!(
        n <= r.ring.max_fragment(),
        "{rec:?} is longer than a fragment"
    );
    n
}

/// Inputs to start the corpus from: honest traffic across the wrap (Sends of many lengths,
/// taken as they come), then the same with each hostile step added. A step is its operation
/// byte and two argument bytes (see `shm_ring`).
pub fn seeds() -> Vec<Vec<u8>> {
    let mut honest = Vec::new();
    for i in 0..40u32 {
        let len = (i * 1931 % 16_000) as u16;
        // A Send (kind bits 0) of `len` bytes (its low two bits dropped), then a take of 4.
        let [lo, hi] = len.to_le_bytes();
        honest.extend([0, lo & !3, hi]);
        honest.extend([5, 3, 0]);
    }
    let mut v = vec![honest.clone()];
    let hostile: [&[u8]; 4] = [
        &[2, 0, 0, 1],
        &[3, 16, 4, 1, 2, 3, 4],
        &[4, 2, 0],
        &[6, 1, 0],
    ];
    for step in hostile {
        let mut s = honest[..72].to_vec();
        s.extend_from_slice(step);
        s.extend([0, 0, 1, 5, 7, 0]);
        v.push(s);
    }
    v
}
