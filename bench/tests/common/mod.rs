//! What the bench binaries' tests share.

/// A timeline written by `barewire_engine::trace::write` (`--trace`): how many events of each
/// kind asked it holds, in the order asked. Panics (failing the test) if the file is missing or
/// its first record is not the clock rate.
pub fn timeline_counts(path: &str, kinds: &[u64]) -> Vec<usize> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let words: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(
        words.len() >= 2 && words[0] >= 100_000_000 && words[1] == 0,
        "{path}: no clock rate first"
    );
    let kind_of = |w: &u64| *w >> 48;
    kinds
        .iter()
        .map(|&k| {
            words[3..]
                .iter()
                .step_by(2)
                .filter(|w| kind_of(w) == k)
                .count()
        })
        .collect()
}
