//! How steadily this host's CPUs run right now: the same short piece of work timed many times
//! on one CPU, and the share of samples that took much longer than the fastest.
//!
//! On a shared virtual machine the same code runs at two speeds, the slow one 1.4–1.9× the
//! fast, in stretches from a fraction of a microsecond to whole minutes, whatever the VM itself
//! is doing (bench/RESULTS.md, fifty-third session). A latency figure is then a mix of the two,
//! and two runs minutes apart can pair a fast one with a slow one. `barewire-perf report` probes
//! both CPUs before each rep and prints the shares, so a reader can tell a rep that ran slow.
//!
//! ```
//! use barewire_bench::perf::host;
//! // Samples of one fast state (100 ticks) with a quarter of them slow (150).
//! let mut t = vec![100u64; 300];
//! t.extend([150; 100]);
//! assert_eq!(host::slow_share(&mut t), 0.25);
//! ```

use std::hint::black_box;

use super::run::Cycles;

/// Samples one probe takes.
pub const SAMPLES: usize = 200_000;

/// A sample is slow when it takes more than this many times the 5th percentile (the fast
/// state's time, as long as at least one sample in twenty is fast).
pub const SLOW_OVER: f64 = 1.4;

/// Loads, branches and adds per sample: about 0.2 µs in the fast state here.
const STEPS: usize = 300;

/// The share of `ticks` (per-sample times, reordered here) over [`SLOW_OVER`] times their 5th
/// percentile; 0 for no samples.
pub fn slow_share(ticks: &mut [u64]) -> f64 {
    if ticks.is_empty() {
        return 0.0;
    }
    ticks.sort_unstable();
    let fast = ticks[ticks.len() / 20] as f64;
    let slow = ticks
        .iter()
        .filter(|&&t| t as f64 > SLOW_OVER * fast)
        .count();
    slow as f64 / ticks.len() as f64
}

/// The times of [`SAMPLES`] runs of the same work on this thread, in TSC ticks.
fn samples() -> Vec<u64> {
    let table: Vec<u32> = (0..8192u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut out = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let t0 = Cycles::now();
        let mut acc = 0u64;
        for k in 0..STEPS {
            let v = black_box(table[(k * 97) & 8191]);
            acc = acc.wrapping_add(if v & 1 == 1 {
                u64::from(v >> 3)
            } else {
                u64::from(v) * 3
            });
        }
        black_box(acc);
        out.push(Cycles::now().wrapping_sub(t0));
    }
    out
}

/// Probes `cpu` from a thread pinned there (about 50 ms): its share of slow samples, or `None`
/// if the thread could not be pinned.
pub fn probe(cpu: usize) -> Option<f64> {
    // (libc's CPU sets hold 1,024 CPUs; core_affinity panics past that.)
    if cpu >= libc::CPU_SETSIZE as usize {
        return None;
    }
    std::thread::spawn(move || {
        core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
            .then(|| slow_share(&mut samples()))
    })
    .join()
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_samples_are_counted_against_the_fast_state() {
        // Half fast (10), a tenth just under the line (14), the rest over it.
        let mut t: Vec<u64> = [vec![10; 50], vec![14; 10], vec![15; 30], vec![40; 10]].concat();
        assert_eq!(slow_share(&mut t), 0.4);
        assert_eq!(slow_share(&mut [7, 7, 7]), 0.0);
        assert_eq!(slow_share(&mut []), 0.0);
    }

    #[test]
    fn a_probe_gives_a_share_and_refuses_a_cpu_that_is_not_there() {
        assert!(probe(0).is_some(), "CPU 0 exists");
        assert_eq!(probe(1 << 20), None);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(probe(cpus + 1), None, "CPU {} is not there", cpus + 1);
    }
}
