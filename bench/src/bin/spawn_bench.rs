//! spawn-bench: spawn and join of a burst of trivial tasks, barewire beside monoio and tokio's
//! current_thread runtime, reps interleaved (one of each per rep), so the three see the same
//! machine state: the criterion bench (`benches/executor.rs`) runs them minutes apart, and on a
//! shared machine the single-core speed drifts by more than the differences measured.
//!
//! ```text
//! spawn-bench [--tasks 1000000] [--reps 15]
//! ```
//!
//! Each rep spawns `tasks` tasks of `async move { i }` on one core, keeps their handles, then
//! awaits them all in order. Prints the median time of each runtime and the ratios of medians.

use std::time::Instant;

use barewire_bench::reps::median;
use clap::Parser;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "spawn-bench",
    about = "Spawn and join of a burst of tasks: barewire, monoio, tokio current_thread, interleaved"
)]
struct Cli {
    /// Tasks per burst.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    tasks: u64,
    /// Reps (each runs every runtime once).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let cli = Cli::parse();
    let n = cli.tasks;
    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .expect("a barewire runtime");
    let mut mono = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .build()
        .expect("a monoio runtime");
    let tok = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime");
    let (mut b, mut m, mut t): (Vec<f64>, Vec<f64>, Vec<f64>) =
        (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..cli.reps {
        let t0 = Instant::now();
        let sb = rt.block_on(async {
            let hs: Vec<_> = (0..n)
                .map(|i| barewire_engine::spawn_local(async move { i }))
                .collect();
            let mut s = 0;
            for h in hs {
                s += h.await.expect("a task that cannot fail");
            }
            s
        });
        b.push(ms(t0));
        let t0 = Instant::now();
        let sm = mono.block_on(async {
            let hs: Vec<_> = (0..n).map(|i| monoio::spawn(async move { i })).collect();
            let mut s = 0;
            for h in hs {
                s += h.await;
            }
            s
        });
        m.push(ms(t0));
        let t0 = Instant::now();
        let st = tok.block_on(async {
            let hs: Vec<_> = (0..n).map(|i| tokio::spawn(async move { i })).collect();
            let mut s = 0;
            for h in hs {
                s += h.await.expect("a task that cannot fail");
            }
            s
        });
        t.push(ms(t0));
        assert!(sb == sm && sm == st, "the three sums differ");
        eprintln!(
            "rep {rep}: barewire {:.1} ms, monoio {:.1} ms, tokio {:.1} ms",
            b[b.len() - 1],
            m[m.len() - 1],
            t[t.len() - 1]
        );
    }
    let (b, m, t) = (median(b), median(m), median(t));
    println!(
        "spawn+join of {n} tasks, median of {} interleaved reps: barewire {b:.1} ms, monoio {m:.1} ms, tokio current_thread {t:.1} ms",
        cli.reps
    );
    println!(
        "barewire time / monoio time: {:.2} (target <= 1.0); tokio time / barewire time: {:.2} (target >= 3)",
        b / m,
        t / b
    );
}
