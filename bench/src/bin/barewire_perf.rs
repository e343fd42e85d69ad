//! barewire-perf: perftest-style RDMA microbenchmarks. See `barewire-perf --help` and
//! `barewire_bench::perf`.

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(barewire_bench::perf::main_with(&args));
}
