//! Pinned two-core TCP echo: barewire beside tokio and monoio in the same session.
//!
//!     echo-bench compare [--mode tput|pingpong] [--conns 64] [--size 1024] [--secs 5] [--reps 3]
//!     echo-bench run <barewire|barewire-nospin|tokio|monoio> [same flags]
//!
//! `compare` runs every runtime `--reps` times, interleaved (A B C A B C ...) so drift on a
//! noisy machine hits them alike, each run in its own process, and prints the medians with
//! ratios against barewire.

use std::process::Command;
use std::time::Duration;

use barewire_bench::echo::{self, Config, Mode};

const RUNTIMES: [&str; 4] = ["barewire", "barewire-nospin", "tokio", "monoio"];

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(args: &[String]) -> Config {
    let mode = match arg(args, "--mode", "tput".to_string()).as_str() {
        "pingpong" => Mode::PingPong,
        _ => Mode::Throughput,
    };
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    Config {
        mode,
        conns: arg(args, "--conns", 64),
        size: arg(
            args,
            "--size",
            if mode == Mode::PingPong { 64 } else { 1024 },
        ),
        secs: arg(args, "--secs", 5),
        server_cpu: arg(args, "--server-cpu", 1.min(n - 1)),
        client_cpu: arg(args, "--client-cpu", 0),
        spin: Duration::from_micros(100),
    }
}

fn run(which: &str, mut cfg: Config) {
    let report = match which {
        "barewire" => echo::barewire(cfg),
        "barewire-nospin" => {
            cfg.spin = Duration::ZERO;
            echo::barewire(cfg)
        }
        "tokio" => echo::tokio(cfg),
        "monoio" => echo::monoio(cfg),
        other => panic!("unknown runtime {other}; one of {RUNTIMES:?}"),
    };
    let (p50, p99) = report.hist.as_ref().map_or((0, 0), |h| {
        (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
    });
    // One machine-readable line for `compare`.
    println!(
        "RESULT {which} rate={:.0} p50_ns={p50} p99_ns={p99}",
        report.rate()
    );
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn compare(args: &[String]) {
    let cfg = config(args);
    let reps: usize = arg(args, "--reps", 3);
    let exe = std::env::current_exe().unwrap();
    let mut results: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> =
        RUNTIMES.iter().map(|_| (vec![], vec![], vec![])).collect();
    for rep in 0..reps {
        for (i, rt) in RUNTIMES.iter().enumerate() {
            let mut child_args = vec!["run".to_string(), rt.to_string()];
            child_args.extend(args.iter().cloned());
            let out = Command::new(&exe).args(&child_args).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let line = stdout
                .lines()
                .find(|l| l.starts_with("RESULT"))
                .unwrap_or_else(|| {
                    panic!(
                        "{rt} failed: {}\n{}",
                        stdout,
                        String::from_utf8_lossy(&out.stderr)
                    )
                });
            let field = |k: &str| -> f64 {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            results[i].0.push(field("rate="));
            results[i].1.push(field("p50_ns="));
            results[i].2.push(field("p99_ns="));
            eprintln!("rep {rep}: {line}");
        }
    }
    let mut med: Vec<(f64, f64, f64)> = results
        .iter_mut()
        .map(|(r, a, b)| (median(r), median(a), median(b)))
        .collect();
    let base = med[0];
    println!(
        "\nmode={:?} conns={} size={} secs={} reps={} server_cpu={} client_cpu={}",
        cfg.mode, cfg.conns, cfg.size, cfg.secs, reps, cfg.server_cpu, cfg.client_cpu
    );
    println!("| runtime | round trips/s (median) | barewire ÷ this | p50 µs | p99 µs | this p50 ÷ barewire p50 |");
    println!("|---|---|---|---|---|---|");
    for (rt, m) in RUNTIMES.iter().zip(med.iter_mut()) {
        println!(
            "| {rt} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
            m.0,
            base.0 / m.0,
            m.1 / 1000.0,
            m.2 / 1000.0,
            if base.1 > 0.0 {
                format!("{:.2}", m.1 / base.1)
            } else {
                "-".into()
            }
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => {
            let which = args.get(1).cloned().unwrap_or_default();
            run(&which, config(&args[2..]));
        }
        Some("compare") => compare(&args[1..]),
        _ => {
            eprintln!("usage: echo-bench compare [--mode tput|pingpong] [--conns N] [--size B] [--secs S] [--reps R]");
            eprintln!("       echo-bench run <{}> [flags]", RUNTIMES.join("|"));
            std::process::exit(2);
        }
    }
}
