//! Interleaved repetitions, shared by the benchmark binaries that compare barewire with a
//! peer in the same run: a row of per-rep figures, latency percentiles of an operation, medians,
//! and ratios taken per rep (so a fast phase of the machine is never paired with a slow one).

use std::future::Future;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// One measurement across reps.
#[derive(Debug, Default, Clone)]
pub struct Row {
    /// What was measured.
    pub name: &'static str,
    /// Its unit.
    pub unit: &'static str,
    /// Per rep: (the figure: a p50 or a throughput, and a p99 where there is one, else 0).
    pub reps: Vec<(f64, f64)>,
}

impl Row {
    /// Rows named as given, with no reps yet.
    pub fn named(names: &[(&'static str, &'static str)]) -> Vec<Row> {
        names
            .iter()
            .map(|(name, unit)| Row {
                name,
                unit,
                reps: Vec::new(),
            })
            .collect()
    }

    /// Adds one rep's figures (no p99s) to `rows`, from the first row on.
    pub fn push_rep(rows: &mut [Row], figures: &[f64]) {
        for (row, v) in rows.iter_mut().zip(figures) {
            row.reps.push((*v, 0.0));
        }
    }
}

/// An empty histogram of nanoseconds, up to a minute, 3 significant figures.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Runs `op(i)` `iters / 10` times to warm up, then `iters` times, one at a time: its p50 and
/// p99 in microseconds.
pub async fn latency<F, Fut>(iters: u64, mut op: F) -> (f64, f64)
where
    F: FnMut(u64) -> Fut,
    Fut: Future<Output = ()>,
{
    for i in 0..iters / 10 {
        op(i).await;
    }
    let mut h = histogram();
    for i in 0..iters {
        let t = Instant::now();
        op(i).await;
        h.record(t.elapsed().as_nanos() as u64)
            .expect("a latency under a minute");
    }
    let us = |q| h.value_at_quantile(q) as f64 / 1e3;
    (us(0.5), us(0.99))
}

/// The median of `v` (sorting it): the middle figure, or the mean of the two middle ones of
/// an even count; NaN when empty. Every benchmark here takes its medians from this one; it
/// takes a vector by value or a slice to sort in place.
pub fn median(mut v: impl AsMut<[f64]>) -> f64 {
    let v = v.as_mut();
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// `rows[a] / rows[b]` per rep, as "median (lowest-highest)"; "n/a" without reps of both.
pub fn ratio(rows: &[Row], a: usize, b: usize) -> String {
    let r: Vec<f64> = rows[a]
        .reps
        .iter()
        .zip(&rows[b].reps)
        .map(|(x, y)| x.0 / y.0)
        .collect();
    if r.is_empty() {
        return "n/a".into();
    }
    let (lo, hi) = r
        .iter()
        .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
    format!("{:.3}x ({lo:.3}-{hi:.3})", median(r))
}

/// Prints the rows (median over reps, and the median p99 where there is one) and then each
/// comparison `(label, row a, row b, target)` as the per-rep ratio `a / b`.
pub fn report(rows: &[Row], comparisons: &[(&str, usize, usize, &str)]) {
    println!("| measurement | median over reps | p99 (median) |");
    println!("|---|---|---|");
    for r in rows {
        let p99 = if r.reps.iter().any(|x| x.1 > 0.0) {
            format!(
                "{:.2} us",
                median(r.reps.iter().map(|x| x.1).collect::<Vec<_>>())
            )
        } else {
            "-".into()
        };
        let v = median(r.reps.iter().map(|x| x.0).collect::<Vec<_>>());
        println!("| {} | {v:.2} {} | {p99} |", r.name, r.unit);
    }
    println!();
    println!("| comparison | ratio: median of per-rep ratios (range) | target |");
    println!("|---|---|---|");
    for (label, a, b, target) in comparisons {
        println!("| {label} | {} | {target} |", ratio(rows, *a, *b));
    }
}

/// A one-core barewire runtime on `cpu` that spins 50 ms before it sleeps (latency runs).
pub fn spinning_runtime(cpu: usize) -> barewire_engine::Runtime {
    barewire_engine::Runtime::builder()
        .core_ids(&[cpu])
        .idle_spin(Duration::from_millis(50))
        .build()
        .expect("runtime")
}

/// A one-core barewire runtime, unpinned, that sleeps as soon as it is idle (members that
/// share CPUs with others).
pub fn sleeping_runtime() -> barewire_engine::Runtime {
    barewire_engine::Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .expect("runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_per_rep_ratios() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
        let mut rows = Row::named(&[("a", "us"), ("b", "us")]);
        rows[0].reps = vec![(2.0, 0.0), (6.0, 0.0), (3.0, 0.0)];
        rows[1].reps = vec![(1.0, 0.0), (2.0, 0.0), (3.0, 0.0)];
        assert_eq!(ratio(&rows, 0, 1), "2.000x (1.000-3.000)");
        rows[1].reps.clear();
        assert_eq!(ratio(&rows, 0, 1), "n/a");
    }
}
