//! A byte from one CPU to the other and back through shared memory, with nothing else in the
//! loop: the floor under the shm backend's 8 B WRITE ping-pong (`barewire-perf write_lat
//! --driver shm`) and UCX's `ucp_put_lat` over its shared-memory transports. `barewire-perf
//! report` measures the flat-out figure beside them; this runs it alone, at several gaps
//! between looks (see `barewire_bench::perf::floor`).
//!
//!     shm-floor [-n N] [--reps R] [--cpu A,B] [--gaps 0,10,20,40,80]
//!
//! Each figure is half the round trip (RTT/2), p50 and mean, the median over the reps; reps of
//! each gap alternate with the others'.

use barewire_bench::perf::floor::{shm_ping_pong, turn_ns};
use barewire_bench::reps::median;
use clap::Parser;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "shm-floor",
    about = "A byte through shared memory and back, with nothing else in the loop"
)]
struct Opts {
    /// Round trips per rep.
    #[arg(short = 'n', default_value_t = 1_000_000)]
    iters: usize,
    /// Reps of each gap, alternated.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The initiator's CPU and the responder's.
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpu: [usize; 2],
    /// Empty-loop turns between two looks, one run per value.
    #[arg(long, value_delimiter = ',', default_value = "0,10,20,40,80")]
    gaps: Vec<u32>,
}

fn main() {
    let o = Opts::parse();
    let turn = turn_ns();
    println!(
        "shm-floor: {} round trips per rep, {} reps, CPUs {},{}; an empty-loop turn takes {turn:.2} ns",
        o.iters, o.reps, o.cpu[0], o.cpu[1]
    );
    let mut figs: Vec<(Vec<f64>, Vec<f64>)> = vec![(vec![], vec![]); o.gaps.len()];
    for _ in 0..o.reps.max(1) {
        for (g, &gap) in o.gaps.iter().enumerate() {
            let Some(f) = shm_ping_pong(o.cpu, o.iters.max(1), gap) else {
                eprintln!("shm-floor: could not pin to CPUs {},{}", o.cpu[0], o.cpu[1]);
                std::process::exit(2);
            };
            figs[g].0.push(f.p50);
            figs[g].1.push(f.mean);
        }
    }
    println!("\n| gap between looks | p50, RTT/2 | mean, RTT/2 |\n|---|---|---|");
    for (g, &gap) in o.gaps.iter().enumerate() {
        let (p, m) = &mut figs[g];
        println!(
            "| {gap} turns ({:.0} ns) | {:.3} µs | {:.3} µs |",
            gap as f64 * turn,
            median(p) / 1000.0,
            median(m) / 1000.0
        );
    }
}
