use super::*;

/// Many scripts, each a few hundred random bytes: together they must have exercised every
/// kind of request, the closes, the altered streams and the Terminates they drew, or the
/// checks above checked nothing.
#[test]
fn random_scripts_keep_every_promise() {
    let mut total = Tally::default();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..300 {
        let input: Vec<u8> = (0..600)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        let t = stream_pair_with(&input, |_, _| {});
        total.writes += t.writes;
        total.sends += t.sends;
        total.reads += t.reads;
        total.atomics += t.atomics;
        total.flushed += t.flushed;
        total.invalidations += t.invalidations;
        total.corrupted += t.corrupted;
        total.terminates += t.terminates;
        total.closes += t.closes;
        total.fpdus += t.fpdus;
    }
    eprintln!("{total:?}");
    assert!(
        total.writes > 100 && total.sends > 100 && total.reads > 100,
        "{total:?}"
    );
    assert!(
        total.atomics > 100 && total.flushed > 10 && total.closes > 10,
        "{total:?}"
    );
    assert!(total.invalidations > 10, "{total:?}");
    assert!(total.corrupted > 10 && total.terminates > 10, "{total:?}");
}

/// A script with no close: a Write then enough pumping to complete it.
fn one_write() -> Vec<u8> {
    // ctl 0 (no CRC, MULPDU 128); side 0 posts a 600-byte Write at offset 8 of the peer's
    // region from one source piece; then both sides send and deliver everything, twice.
    let mut s = vec![0, 0x00, 0x02, 0x58, 0x00, 0x08, 0x00, 0x00, 0x10];
    for _ in 0..2 {
        s.extend([0x08, 63, 255, 0x0D, 200, 0x18, 63, 255, 0x1D, 200]);
    }
    s
}

#[test]
fn a_write_lands_and_completes() {
    let t = stream_pair_with(&one_write(), |_, _| {});
    assert_eq!(t.writes, 1, "{t:?}");
    assert!(t.fpdus >= 5, "segmented at MULPDU 128: {t:?}");
}

#[test]
#[should_panic(expected = "did not leave the peer's region")]
fn the_check_catches_a_lost_byte_of_a_write() {
    // SAFETY: DST + 8 lies in side 1's live memory; nothing else runs.
    stream_pair_with(&one_write(), |_, b| unsafe { *b.add(DST + 8) ^= 1 });
}

#[test]
#[should_panic(expected = "outside any area a peer may write")]
fn the_check_catches_a_stray_write() {
    // SAFETY: the guard byte before side 1's sink, in its live memory.
    stream_pair_with(&one_write(), |_, b| unsafe { *b.add(SINK - 1) ^= 1 });
}

#[test]
fn the_seeds_and_the_corpus_replay() {
    for (_, bytes) in seeds() {
        stream_pair(&bytes);
    }
    crate::wire::fuzz::replay_corpus("stream_pair", stream_pair);
}
