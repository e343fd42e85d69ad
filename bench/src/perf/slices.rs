//! `write_lat --floor-slices N` over shm: barewire's WRITE and a bare store into the peer's
//! mapped buffer, in alternating slices of `N` iterations of one ping-pong, set side by side
//! slice pair by slice pair.
//!
//! On some hosts a cache line's trip between two CPUs has two speeds, and the host switches
//! between them every second or so (bench/RESULTS.md, fifty-fifth session: 0.07 or 0.25 µs one
//! way). A WRITE's p50 and a floor's measured in runs seconds apart then mostly say which
//! speed each run drew. Slices a fraction of a millisecond long, taken turn about by the same
//! two processes on the same pages, almost always share one: the ratio of each pair's p50s is
//! what barewire's post costs over a store, in the mode the pair ran in. The median over pairs
//! is the run's figure; the pairs split by mode (the store's p50 against the midpoint between
//! the fastest and slowest pair, when they differ by more than [`MODE_GAP`]) say whether the
//! cost differs between modes.
//!
//! Both sides follow the same schedule ([`stored`]) from the iteration's index: the warm-up
//! alternates too, and the measured iterations start on a WRITE slice.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::table::LatRow;

/// Pairs whose stores' p50s differ by more than this factor between fastest and slowest are
/// split into two modes.
pub const MODE_GAP: f64 = 1.8;

/// Whether iteration `i` (of `warm` warm-up ones, then the measured ones) of a run with
/// slices of `slice` iterations is a bare store (odd slices) rather than a WRITE (even ones).
/// Counting restarts where the measured iterations start, so they open with a WRITE slice.
#[inline]
pub fn stored(i: u64, warm: u64, slice: u16) -> bool {
    let k = if i < warm { i } else { i - warm };
    (k / u64::from(slice)) % 2 == 1
}

/// One mode's pairs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Mode {
    /// Slice pairs in it.
    pub pairs: usize,
    /// The median of their stores' p50s, µs (half a round trip).
    pub store_p50_us: f64,
    /// The median of their WRITE p50 ÷ store p50.
    pub ratio: f64,
}

/// What a sliced run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Iterations per slice.
    pub slice: u16,
    /// Every WRITE iteration.
    pub write: LatRow,
    /// Every bare-store iteration.
    pub store: LatRow,
    /// The median over slice pairs of WRITE p50 ÷ store p50.
    pub ratio: f64,
    /// The pairs of the faster mode, or all of them when there is one mode.
    pub fast: Mode,
    /// The pairs of the slower mode, if the run saw two.
    pub slow: Option<Mode>,
}

impl Summary {
    /// Sorts `ns` (half round trips in nanoseconds, the measured iterations in order) into
    /// WRITE and store slices of `slice` iterations and pairs each WRITE slice with the store
    /// slice after it. `None` if not one pair is complete.
    pub fn of(ns: &[u64], slice: u16, bytes: usize) -> Option<Summary> {
        let s = usize::from(slice);
        let (mut write, mut store) = (histogram(), histogram());
        for (j, &v) in ns.iter().enumerate() {
            let h = if stored(j as u64, 0, slice) {
                &mut store
            } else {
                &mut write
            };
            h.record(v.max(1)).ok()?;
        }
        // (WRITE p50, store p50) of each complete pair, in ns.
        let pairs: Vec<(f64, f64)> = ns
            .chunks_exact(2 * s)
            .map(|pair| (p50(&pair[..s]), p50(&pair[s..])))
            .collect();
        if pairs.is_empty() {
            return None;
        }
        let ratios = |ps: &[(f64, f64)]| median(ps.iter().map(|(w, st)| w / st).collect());
        let mode = |ps: &[(f64, f64)]| Mode {
            pairs: ps.len(),
            store_p50_us: median(ps.iter().map(|p| p.1).collect()) / 1000.0,
            ratio: ratios(ps),
        };
        let lo = pairs.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
        let hi = pairs.iter().map(|p| p.1).fold(0.0, f64::max);
        let (fast, slow) = if hi > lo * MODE_GAP {
            let mid = (lo + hi) / 2.0;
            let (f, sl): (Vec<_>, Vec<_>) = pairs.iter().partition(|p| p.1 < mid);
            (mode(&f), Some(mode(&sl)))
        } else {
            (mode(&pairs), None)
        };
        Some(Summary {
            slice,
            write: LatRow::from_histogram(bytes, &write),
            store: LatRow::from_histogram(bytes, &store),
            ratio: ratios(&pairs),
            fast,
            slow,
        })
    }

    /// The summary in words, under the run's table.
    pub fn line(&self) -> String {
        let mode = |m: &Mode| {
            format!(
                "{} pairs, stores' p50 {:.3} µs, WRITE ÷ store {:.2}",
                m.pairs, m.store_p50_us, m.ratio
            )
        };
        let modes = match &self.slow {
            Some(slow) => format!(
                "; fast mode: {}; slow mode: {}",
                mode(&self.fast),
                mode(slow)
            ),
            None => format!("; one mode: {}", mode(&self.fast)),
        };
        format!(
            "slices of {}: WRITE p50 {:.3} µs, a bare store into the peer's mapping p50 {:.3} µs; \
             WRITE ÷ store, median over slice pairs: {:.2}{modes}",
            self.slice, self.write.typical, self.store.typical, self.ratio
        )
    }

    /// One JSON object: `{"test": "write_lat_floor_slices", ...}`.
    pub fn json(&self) -> String {
        #[derive(Serialize)]
        struct Tagged<'a> {
            test: &'static str,
            #[serde(flatten)]
            summary: &'a Summary,
        }
        serde_json::to_string(&Tagged {
            test: "write_lat_floor_slices",
            summary: self,
        })
        .unwrap_or_default()
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static bounds")
}

/// The median of a slice's half round trips, ns (the lower middle one for an even count, as
/// a histogram's 0.5 quantile reads).
fn p50(ns: &[u64]) -> f64 {
    let mut v = ns.to_vec();
    v.sort_unstable();
    v[(v.len() - 1) / 2] as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    crate::reps::median(&mut v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_agree_on_the_schedule_and_the_measured_part_opens_with_writes() {
        let kinds: Vec<bool> = (0..12).map(|i| stored(i, 4, 2)).collect();
        // Warm-up 0..4: W W S S; measured from 4: W W S S W W S S.
        assert_eq!(
            kinds,
            [false, false, true, true, false, false, true, true, false, false, true, true]
        );
        assert!(!stored(1000, 1000, 1000) && stored(2000, 1000, 1000));
    }

    /// A run whose host switches mode halfway: the ratio of the whole run's p50s says little
    /// (both medians land wherever the modes' shares put them), the pairs say what a post
    /// costs in each mode.
    #[test]
    fn pairs_compare_slices_of_one_mode() {
        let slice = 100u16;
        let mut ns = Vec::new();
        for pair in 0..20 {
            // The first 12 pairs in a fast mode (store 70 ns, WRITE 80), then a slow one
            // (250, 270); a little spread within each slice.
            let (w, s) = if pair < 12 { (80, 70) } else { (270, 250) };
            ns.extend((0..u64::from(slice)).map(|k| w + k % 3));
            ns.extend((0..u64::from(slice)).map(|k| s + k % 3));
        }
        // An incomplete pair at the end is left out of the pairs, not of the histograms.
        ns.extend((0..10).map(|_| 5000));
        let sum = Summary::of(&ns, slice, 8).unwrap();
        assert_eq!(sum.write.iters + sum.store.iters, ns.len() as u64);
        assert_eq!(sum.fast.pairs + sum.slow.unwrap().pairs, 20);
        assert_eq!(sum.fast.pairs, 12);
        assert!((sum.fast.ratio - 81.0 / 71.0).abs() < 1e-9, "{sum:?}");
        let slow = sum.slow.unwrap();
        assert!((slow.ratio - 271.0 / 251.0).abs() < 1e-9, "{sum:?}");
        assert!((slow.store_p50_us - 0.251).abs() < 1e-9, "{sum:?}");
        assert!(
            (sum.ratio - 81.0 / 71.0).abs() < 1e-9,
            "12 of 20 pairs fast: {sum:?}"
        );
        assert!(sum.line().contains("fast mode: 12 pairs"), "{}", sum.line());
        let v: serde_json::Value = serde_json::from_str(&sum.json()).unwrap();
        assert_eq!(v["test"], "write_lat_floor_slices");
        assert_eq!(v["fast"]["pairs"], 12);
        assert_eq!(v["slice"], 100);
    }

    #[test]
    fn one_mode_is_one_group_and_no_whole_pair_is_no_summary() {
        let mut ns = Vec::new();
        for _ in 0..4 {
            ns.extend([100u64; 10]);
            ns.extend([90u64; 10]);
        }
        let sum = Summary::of(&ns, 10, 8).unwrap();
        assert!(sum.slow.is_none());
        assert_eq!(sum.fast.pairs, 4);
        assert!((sum.ratio - 100.0 / 90.0).abs() < 1e-9);
        assert!(sum.line().contains("one mode"), "{}", sum.line());
        assert!(Summary::of(&ns[..19], 10, 8).is_none());
    }
}
