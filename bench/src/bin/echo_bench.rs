//! Pinned two-core TCP echo: barewire beside tokio and monoio in the same session.
//!
//!     echo-bench compare [--mode tput|pingpong|churn] [--conns 64] [--size 1024] [--secs 5] [--reps 3]
//!                        [--runtimes barewire,barewire-nospin,tokio,monoio]
//!     echo-bench run <barewire|barewire-nospin|barewire-nofixed|barewire-multishot|tokio|
//!                     monoio> [same flags]
//!     echo-bench --help
//!
//! `compare` runs every runtime `--reps` times, interleaved (A B C A B C ...) so drift on a
//! noisy machine hits them alike, each run in its own process, and prints the medians with
//! ratios against the first runtime listed. `barewire` runs with the engine's defaults (which
//! put its sockets in the ring's registered file table, `Builder::fixed_files`);
//! `barewire-nofixed` turns that off; `barewire-multishot` receives through multishot receives
//! into provided-buffer rings (`TcpStream::recv_multi`). barewire runs print each core's
//! counters (passes, `io_uring_enter` calls, SQEs) on standard error.

use std::process::Command;

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::time::Duration;

use barewire_bench::echo::{self, Config, Mode};
use barewire_bench::reps::median;

const RUNTIMES: [&str; 6] = [
    "barewire",
    "barewire-nospin",
    "barewire-nofixed",
    "barewire-multishot",
    "tokio",
    "monoio",
];

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "echo-bench",
    about = "Pinned two-core TCP echo: barewire beside tokio and monoio"
)]
struct Cli {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Every runtime --reps times, interleaved, each run in its own process; medians and ratios.
    Compare {
        #[command(flatten)]
        opts: Opts,
        /// Runs of each runtime.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        reps: u64,
        /// Which runtimes, in order (ratios are against the first).
        #[arg(
            long,
            value_enum,
            value_delimiter = ',',
            default_value = "barewire,barewire-nospin,tokio,monoio"
        )]
        runtimes: Vec<Runtime>,
    },
    /// One runtime, once (what `compare` starts).
    Run {
        /// The runtime.
        #[arg(value_enum)]
        runtime: Runtime,
        #[command(flatten)]
        opts: Opts,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Runtime {
    Barewire,
    BarewireNospin,
    BarewireNofixed,
    BarewireMultishot,
    Tokio,
    Monoio,
}

/// The options both subcommands take (compare hands them to each run).
#[derive(Debug, Clone, Args)]
struct Opts {
    /// Throughput over many connections, ping-pong latency, or churn (a new connection per round
    /// trip).
    #[arg(long, value_enum, default_value = "tput")]
    mode: ModeName,
    /// Connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=65536))]
    conns: u64,
    /// Message size in bytes [default: 1024, or 64 for pingpong].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=(1 << 20)))]
    size: Option<u64>,
    /// Seconds per run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    secs: u64,
    /// The server's CPU [default: 1, or 0 on a one-CPU machine].
    #[arg(long, value_parser = barewire_bench::cpu_arg)]
    server_cpu: Option<usize>,
    /// The client's CPU.
    #[arg(long, default_value_t = 0, value_parser = barewire_bench::cpu_arg)]
    client_cpu: usize,
    /// barewire only: how long an idle core spins before it sleeps, in microseconds
    /// (`barewire-nospin` forces 0).
    #[arg(long, default_value_t = 100)]
    spin_us: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeName {
    Tput,
    Pingpong,
    Churn,
}

impl Opts {
    fn config(&self) -> Config {
        let mode = match self.mode {
            ModeName::Pingpong => Mode::PingPong,
            ModeName::Tput => Mode::Throughput,
            ModeName::Churn => Mode::Churn,
        };
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Config {
            mode,
            conns: self.conns as usize,
            size: self
                .size
                .map_or(if mode == Mode::PingPong { 64 } else { 1024 }, |s| {
                    s as usize
                }),
            secs: self.secs,
            server_cpu: self.server_cpu.unwrap_or(1.min(n - 1)),
            client_cpu: self.client_cpu,
            spin: Duration::from_micros(self.spin_us),
            fixed_files: None,
            multishot: false,
        }
    }
}

fn run(which: Runtime, mut cfg: Config) {
    let report = match which {
        Runtime::Barewire => echo::barewire(cfg),
        Runtime::BarewireNospin => {
            cfg.spin = Duration::ZERO;
            echo::barewire(cfg)
        }
        Runtime::BarewireNofixed => {
            cfg.fixed_files = Some(0);
            echo::barewire(cfg)
        }
        Runtime::BarewireMultishot => {
            cfg.multishot = true;
            echo::barewire(cfg)
        }
        Runtime::Tokio => echo::tokio(cfg),
        Runtime::Monoio => echo::monoio(cfg),
    };
    let which = RUNTIMES[which as usize];
    let (p50, p99) = report.hist.as_ref().map_or((0, 0), |h| {
        (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
    });
    // What each barewire core did: passes over its sources, io_uring_enter calls made to
    // submit (sleeps enter too, counted apart), SQEs, CQEs.
    for c in &report.stats {
        let per = |a: u64, b: u64| a as f64 / b.max(1) as f64;
        eprintln!(
            "STATS {which} core={} passes={} enters={} sleeps={} sqes={} cqes={} polls={} \
             enters/pass={:.3} sqes/enter={:.2} round_trips/pass={:.2}",
            c.core,
            c.poller_passes,
            c.submit_calls,
            c.sleeps,
            c.ops_submitted,
            c.ops_completed,
            c.tasks_polled,
            per(c.submit_calls, c.poller_passes),
            per(c.ops_submitted, c.submit_calls),
            per(report.round_trips, c.poller_passes),
        );
    }
    // One machine-readable line for `compare`.
    println!(
        "RESULT {which} rate={:.0} p50_ns={p50} p99_ns={p99}",
        report.rate()
    );
}

fn compare(opts: &Opts, reps: usize, runtimes: &[Runtime], args: &[String]) {
    let cfg = opts.config();
    let exe = std::env::current_exe().unwrap();
    let names: Vec<&str> = runtimes.iter().map(|r| RUNTIMES[*r as usize]).collect();
    let mut results: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> =
        names.iter().map(|_| (vec![], vec![], vec![])).collect();
    for rep in 0..reps {
        for (i, rt) in names.iter().enumerate() {
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
            // barewire's per-core counters, so a slow rep can be told from a fast one.
            for l in String::from_utf8_lossy(&out.stderr)
                .lines()
                .filter(|l| l.starts_with("STATS"))
            {
                eprintln!("rep {rep}: {l}");
            }
        }
    }
    // Each rep runs every runtime back to back, seconds apart: the ratio within a rep pairs
    // runs that met the same phase of this shared host.
    let per_rep: Vec<Vec<f64>> = results
        .iter()
        .map(|r| {
            r.0.iter()
                .zip(&results[0].0)
                .map(|(this, first)| first / this)
                .collect()
        })
        .collect();
    let mut med: Vec<(f64, f64, f64)> = results
        .iter_mut()
        .map(|(r, a, b)| (median(r), median(a), median(b)))
        .collect();
    let base = med[0];
    println!(
        "\nmode={:?} conns={} size={} secs={} reps={} server_cpu={} client_cpu={}",
        cfg.mode, cfg.conns, cfg.size, cfg.secs, reps, cfg.server_cpu, cfg.client_cpu
    );
    println!(
        "| runtime | round trips/s (median) | {0} ÷ this | per-rep {0} ÷ this: median (range) | p50 µs | p99 µs | this p50 ÷ {0} p50 |",
        names[0]
    );
    println!("|---|---|---|---|---|---|---|");
    for ((rt, m), mut r) in names.iter().zip(med.iter_mut()).zip(per_rep) {
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, 0.0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!(
            "| {rt} | {:.0} | {:.2} | {:.2} ({lo:.2}–{hi:.2}) | {:.2} | {:.2} | {} |",
            m.0,
            base.0 / m.0,
            median(&mut r),
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
    let cli = Cli::parse();
    match cli.sub {
        Sub::Run { runtime, opts } => run(runtime, opts.config()),
        Sub::Compare {
            opts,
            reps,
            runtimes,
        } => {
            // Each run gets the same options, as given (less compare's own).
            let mut args: Vec<String> = std::env::args().skip(2).collect();
            for own in ["--reps", "--runtimes"] {
                if let Some(i) = args.iter().position(|a| a == own) {
                    args.drain(i..(i + 2).min(args.len()));
                }
                args.retain(|a| !a.starts_with(&format!("{own}=")));
            }
            compare(&opts, reps as usize, &runtimes, &args)
        }
    }
}
