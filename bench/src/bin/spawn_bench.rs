//! spawn-bench: spawn and join of a burst of trivial tasks, barewire beside monoio and tokio's
//! current_thread runtime, reps interleaved (one of each per rep), so the three see the same
//! machine state: the criterion bench (`benches/executor.rs`) runs them minutes apart, and on a
//! shared machine the single-core speed drifts by more than the differences measured.
//!
//! ```text
//! spawn-bench [--tasks 1000000] [--reps 15] [--serial]
//! ```
//!
//! `--serial` awaits each task before spawning the next (one live task at a time, as a server
//! spawning a task per request does), instead of spawning the whole burst first.
//!
//! Each rep runs every runtime in a process of its own (this binary with `--one`): runtimes in
//! one process share its heap, and how one leaves it (the allocator's trim and mmap thresholds
//! move with the sizes freed) changed the next one's time by up to 1.5x. A process spawns
//! `tasks` tasks of `async move { i }` on one core, keeps their handles, awaits them all in
//! order; it does that four times and reports the first burst's time and the median of the
//! other three. Prints the median over reps of each runtime and the ratios of medians, for the
//! later bursts (the row the issue names) and, apart, for the first: barewire keeps finished
//! tasks' cells on the core for the next spawns (`Builder::task_cache`), so only its later
//! bursts run on reused memory, and the first says what a spawn costs on a cold core.

use std::process::Command;
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
    /// Await each task before spawning the next.
    #[arg(long)]
    serial: bool,
    /// barewire's `Builder::task_cache`, in ms (0 turns its cache of finished tasks' cells off).
    #[arg(long, default_value_t = 1000)]
    task_cache_ms: u64,
    /// Internal: run one runtime's bursts in this process and print its first burst's time and
    /// the median of the rest, in ms.
    #[arg(long, value_parser = RUNTIMES, hide = true)]
    one: Option<String>,
}

const RUNTIMES: [&str; 3] = ["barewire", "monoio", "tokio"];

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let cli = Cli::parse();
    if let Some(rt) = &cli.one {
        let (first, rest) = one(rt, &cli);
        println!("{first:.3} {rest:.3}");
        return;
    }
    let exe = std::env::current_exe().expect("this binary's path");
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); RUNTIMES.len()];
    let mut firsts: Vec<Vec<f64>> = vec![Vec::new(); RUNTIMES.len()];
    for rep in 0..cli.reps {
        for (i, rt) in RUNTIMES.iter().enumerate() {
            let mut cmd = Command::new(&exe);
            cmd.args(["--one", rt, "--tasks", &cli.tasks.to_string()]);
            cmd.args(["--task-cache-ms", &cli.task_cache_ms.to_string()]);
            if cli.serial {
                cmd.arg("--serial");
            }
            let out = cmd.output().expect("run this binary");
            assert!(
                out.status.success(),
                "{rt}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8_lossy(&out.stdout);
            let t: Vec<f64> = text
                .split_whitespace()
                .map(|v| v.parse().expect("a time in ms"))
                .collect();
            firsts[i].push(t[0]);
            times[i].push(t[1]);
        }
        let r = rep as usize;
        eprintln!(
            "rep {rep}: barewire {:.1} ms, monoio {:.1} ms, tokio {:.1} ms (first bursts {:.1} / {:.1} / {:.1})",
            times[0][r], times[1][r], times[2][r], firsts[0][r], firsts[1][r], firsts[2][r]
        );
    }
    let [b, m, t] = [0, 1, 2].map(|i| median(times[i].clone()));
    let [bf, mf, tf] = [0, 1, 2].map(|i| median(firsts[i].clone()));
    println!(
        "spawn+join of {} tasks{}, median of {} interleaved reps: barewire {b:.1} ms, monoio {m:.1} ms, tokio current_thread {t:.1} ms",
        cli.tasks,
        if cli.serial { " one at a time" } else { "" },
        cli.reps
    );
    println!(
        "barewire time / monoio time: {:.2} (target <= 1.0); tokio time / barewire time: {:.2} (target >= 3)",
        b / m,
        t / b
    );
    println!(
        "first burst of each process (cold): barewire {bf:.1} ms, monoio {mf:.1} ms, tokio {tf:.1} ms; barewire / monoio {:.2}, tokio / barewire {:.2}",
        bf / mf,
        tf / bf
    );
}

/// Four bursts: the first one's time and the median of the other three, in ms. `burst` runs
/// one burst and returns the sum of the outputs, checked here.
fn bursts(n: u64, mut burst: impl FnMut() -> u64) -> (f64, f64) {
    let t: Vec<f64> = (0..4)
        .map(|_| {
            let t0 = Instant::now();
            assert_eq!(burst(), n * (n - 1) / 2, "a burst lost outputs");
            ms(t0)
        })
        .collect();
    (t[0], median(t[1..].to_vec()))
}

/// `rt`'s bursts of `n` tasks: the first's time and the median of the rest. (`cli` gives the
/// count, the pattern and barewire's cache setting.)
fn one(rt: &str, cli: &Cli) -> (f64, f64) {
    let (n, serial) = (cli.tasks, cli.serial);
    match rt {
        "barewire" => {
            let rt = barewire_engine::Runtime::builder()
                .cores(1)
                .pin(false)
                .task_cache(std::time::Duration::from_millis(cli.task_cache_ms))
                .build()
                .expect("a barewire runtime");
            bursts(n, || {
                rt.block_on(spawn_join(
                    n,
                    serial,
                    |i| barewire_engine::spawn_local(async move { i }),
                    |r| r.expect("a task that cannot fail"),
                ))
            })
        }
        "monoio" => {
            let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
                .build()
                .expect("a monoio runtime");
            bursts(n, || {
                rt.block_on(spawn_join(
                    n,
                    serial,
                    |i| monoio::spawn(async move { i }),
                    |v| v,
                ))
            })
        }
        _ => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a tokio runtime");
            bursts(n, || {
                rt.block_on(spawn_join(
                    n,
                    serial,
                    |i| tokio::spawn(async move { i }),
                    |r| r.expect("a task that cannot fail"),
                ))
            })
        }
    }
}

/// One burst: spawns `n` tasks with `spawn`, keeping the handles, then awaits them in order;
/// or, `serial`, awaits each before spawning the next. Returns the sum of the outputs (`out`
/// reads one from what its handle gives).
async fn spawn_join<H: std::future::Future>(
    n: u64,
    serial: bool,
    spawn: impl Fn(u64) -> H,
    out: impl Fn(H::Output) -> u64,
) -> u64 {
    let mut s = 0;
    if serial {
        for i in 0..n {
            s += out(spawn(i).await);
        }
        return s;
    }
    let hs: Vec<_> = (0..n).map(spawn).collect();
    for h in hs {
        s += out(h.await);
    }
    s
}
