//! A small message from one CPU to the other and back over loopback TCP, with nothing else in
//! the loop, moved each way the soft provider can move it: the floor under its 8 B WRITE
//! ping-pong (`barewire-perf write_lat`), and under the report's rows that set it against the
//! kernel's TCP round trip and against the epoll fallback. The ways are described in
//! `barewire_bench::perf::floor` ([`TcpWay`]); `barewire-perf report` measures the io_uring way
//! beside `write_lat` and `read_lat`.
//!
//!     tcp-floor [-n N] [--reps R] [--cpu A,B] [--size S] [--ways syscalls,ring,ring-together]
//!               [--threads]
//!
//! Each run forks: the parent times round trips on CPU A, the child answers on CPU B, each over
//! its end of one connected loopback socket (`TCP_NODELAY`), as `barewire-perf` and sockperf
//! run in two processes. `--threads` runs both ends as two threads of this process instead, as
//! the report does.
//!
//! `--trace PREFIX` (in a build with `--features trace`, two processes only) writes each end's
//! timeline to `PREFIX.client` and `PREFIX.server`, for `bench/tools/hop-trace.py`: the same
//! steps barewire-perf's `--trace` marks, so the floor's round trips can be cut into the same
//! parts. With several ways or reps, each run overwrites the last run's files.
//!
//! The message is `--size` bytes, 28 by default: an 8-byte tagged Write's FPDU (MPA length, DDP
//! and RDMAP control, STag, tagged offset, payload, CRC field). Each figure is half the round
//! trip (RTT/2), p50, mean, p99 and p99.9 (the tail, to set beside barewire-perf's), each the
//! median over the reps; reps of each way alternate with the others'.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use barewire_bench::perf::floor::{
    half_round_trip, tcp_pair, tcp_ping_pong, tcp_ping_pong_end, HalfRoundTrip, TcpWay,
};
use barewire_bench::perf::run::{write_timeline, Cycles, TRACE_NEEDS_FEATURE};
use barewire_bench::reps::median;
use clap::Parser;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "tcp-floor",
    about = "A small message over loopback TCP and back, by each way the soft provider moves one"
)]
struct Opts {
    /// Round trips per rep (after a warm-up of a tenth as many).
    #[arg(short = 'n', default_value_t = 100_000)]
    iters: usize,
    /// Reps of each way, alternated.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The initiator's CPU and the responder's.
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpu: [usize; 2],
    /// Bytes each way.
    #[arg(long, default_value_t = 28)]
    size: usize,
    /// Only these ways (all three by default).
    #[arg(long, value_delimiter = ',')]
    ways: Vec<TcpWay>,
    /// Both ends as threads of this process, not two processes.
    #[arg(long)]
    threads: bool,
    /// Write each end's timeline to PREFIX.client and PREFIX.server (two processes; needs a
    /// build with `--features trace`).
    #[arg(long, value_name = "PREFIX")]
    trace: Option<PathBuf>,
}

/// Writes this end's timeline where `--trace` asked, and says so if it cannot.
fn write_trace(trace: Option<&Path>, role: &str) -> bool {
    match trace.map(|prefix| write_timeline(prefix, role)) {
        Some(Err(e)) => {
            eprintln!("tcp-floor: {e}");
            false
        }
        _ => true,
    }
}

/// One run in two processes: RTT/2 in µs, (p50, mean), after the warm-up.
fn run_forked(
    way: TcpWay,
    cpu: [usize; 2],
    iters: usize,
    size: usize,
    trace: Option<&Path>,
) -> HalfRoundTrip {
    let warm = iters / 10;
    let (c, s) = tcp_pair().expect("a loopback connection");
    let clock = Cycles::calibrate();
    // SAFETY: the process has one thread here (nothing in this program spawns any), so the
    // child may run ordinary code; it leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        drop(c);
        // (The parent is pinned after its first run, and a child starts with its mask.)
        barewire_bench::unpin();
        barewire_bench::pin(cpu[1]);
        let ok = tcp_ping_pong_end(way, s.as_raw_fd(), size, warm + iters, false).is_some()
            && write_trace(trace, "server");
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    drop(s);
    barewire_bench::pin(cpu[0]);
    let t = tcp_ping_pong_end(way, c.as_raw_fd(), size, warm + iters, true);
    let traced = write_trace(trace, "client");
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the answering process failed ({status:#x})"
    );
    assert!(traced, "--trace: the initiator's timeline was not written");
    let t = t.expect("an io_uring with deferred task work (Linux 6.1)");
    half_round_trip(&clock, t[warm..].to_vec()).expect("round trips after the warm-up")
}

fn main() {
    let o = Opts::parse();
    if o.trace.is_some() && !barewire_engine::trace::ENABLED {
        eprintln!("tcp-floor: {TRACE_NEEDS_FEATURE}");
        std::process::exit(2);
    }
    if o.trace.is_some() && o.threads {
        eprintln!("tcp-floor: --trace writes each process's timeline; run without --threads");
        std::process::exit(2);
    }
    let ways = if o.ways.is_empty() {
        TcpWay::ALL.to_vec()
    } else {
        o.ways.clone()
    };
    println!(
        "tcp-floor: {} B each way, {} round trips per rep, {} reps, CPUs {},{}, {}",
        o.size,
        o.iters,
        o.reps,
        o.cpu[0],
        o.cpu[1],
        if o.threads {
            "two threads"
        } else {
            "two processes"
        }
    );
    // Per way: each rep's p50, mean, p99 and p99.9, in µs.
    let mut figs = vec![[vec![], vec![], vec![], vec![]]; ways.len()];
    for rep in 0..o.reps.max(1) {
        for (w, &way) in ways.iter().enumerate() {
            let (n, size) = (o.iters.max(10), o.size.max(1));
            let f = if o.threads {
                tcp_ping_pong(way, o.cpu, n, size).expect("pinned threads and a ring")
            } else {
                run_forked(way, o.cpu, n, size, o.trace.as_deref())
            };
            let us = [f.p50, f.mean, f.p99, f.p999].map(|ns| ns / 1e3);
            println!(
                "rep {rep}: {}: p50 {:.3} µs, mean {:.3} µs, p99 {:.3} µs, p99.9 {:.3} µs",
                way.name(),
                us[0],
                us[1],
                us[2],
                us[3]
            );
            for (fig, v) in figs[w].iter_mut().zip(us) {
                fig.push(v);
            }
        }
    }
    let first = median(figs[0][0].clone());
    println!(
        "\n| way (RTT/2, medians of reps) | p50 | mean | p99 | p99.9 | p50 ÷ the first row's |\n\
         |---|---|---|---|---|---|"
    );
    for (w, way) in ways.iter().enumerate() {
        let [p, m, t99, t999] = figs[w].clone().map(median);
        println!(
            "| {} | {p:.3} µs | {m:.3} µs | {t99:.3} µs | {t999:.3} µs | {:.2} |",
            way.name(),
            p / first
        );
    }
}
