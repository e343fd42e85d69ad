//! The peer tools `compare` runs beside barewire, one module each behind [`Peer`]: how to start
//! it (its server's command line), how to run a test (its client's), and how to read the
//! client's output. Every parser is tested against output captured from the real tool
//! (`samples/`, from this machine's Debian packages).

mod libfabric;
mod qperf;
mod sockperf;
mod ucx;

pub mod erlang;
pub mod redis;

pub use libfabric::parse_fi_pingpong;
pub use qperf::parse_qperf;
pub use sockperf::parse_sockperf;
pub use ucx::parse_ucx;

use super::compare::Unit;

/// barewire's own figures, which each peer run is set beside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ours {
    /// 8 B `write_lat` p50 (RTT/2).
    WriteLat,
    /// 8 B `send_lat` p50 (RTT/2).
    SendLat,
    /// 8 B `read_lat` p50 (RTT).
    ReadLat,
    /// `atomic_lat` fetch-add p50.
    FetchAddLat,
    /// `atomic_lat` compare-and-swap p50.
    CasLat,
    /// 1 MiB `write_bw` average.
    WriteBw1M,
    /// 64 KiB `write_bw` average.
    WriteBw64K,
    /// 64 KiB `read_bw` average.
    ReadBw64K,
    /// 8 B `write_lat` p50 on shm.
    ShmWriteLat,
    /// 8 B `read_lat` p50 on shm.
    ShmReadLat,
    /// `atomic_lat` fetch-add p50 on shm.
    ShmFetchAddLat,
    /// 1 MiB `write_bw` average on shm.
    ShmWriteBw1M,
}

/// What a peer's output gives: its figure and any latency percentiles, (percentile, µs).
pub type Parsed = Option<(f64, Vec<(f64, f64)>)>;

/// One run of a peer tool: a server, a client, and what to read from the client's output.
pub struct PeerRun {
    /// The test, as the rows name it (`ucp_put_lat`, `-p tcp -e msg`, ...).
    pub label: String,
    /// What the figure is (`8 B p50`, `1 MiB`, ...).
    pub what: &'static str,
    /// Its unit.
    pub unit: Unit,
    /// The server's command line.
    pub server: Vec<String>,
    /// The client's command line.
    pub client: Vec<String>,
    /// Reads the figure from the client's output (standard output and error together).
    pub parse: fn(&str) -> Parsed,
    /// barewire's figures this one is set beside.
    pub pairs: &'static [Ours],
}

/// What every peer run takes from `compare`'s options.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Iterations for latency runs.
    pub iters: u64,
    /// Whole seconds for timed runs.
    pub secs: u64,
}

/// A peer tool.
pub trait Peer {
    /// Its executable, looked for on PATH.
    fn tool(&self) -> &'static str;
    /// The Debian package that provides it.
    fn package(&self) -> &'static str;
    /// Environment for both its sides.
    fn env(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// Its runs, in the order the rows list them.
    fn runs(&self, p: &Params) -> Vec<PeerRun>;
}

/// Every peer, in the order `compare` runs them.
pub fn all() -> Vec<Box<dyn Peer>> {
    vec![
        Box::new(libfabric::FiPingpong),
        Box::new(ucx::UcxPerftest),
        Box::new(ucx::UcxShm),
        Box::new(qperf::Qperf),
        Box::new(sockperf::Sockperf),
    ]
}

/// Runs `run` once (its server on the second CPU, its client on the first) and reads its
/// figure: how the benchmarks other than `compare` use a peer.
pub fn measure(cpus: [usize; 2], env: &[(&str, &str)], run: &PeerRun) -> Result<f64, String> {
    let server: Vec<&str> = run.server.iter().map(String::as_str).collect();
    let client: Vec<&str> = run.client.iter().map(String::as_str).collect();
    let out = crate::perf::compare::client_server(cpus, env, &server, &client)?;
    (run.parse)(&out).map(|(v, _)| v).ok_or_else(|| {
        format!(
            "{}: no figure in its output: {}",
            run.label,
            out.lines().last().unwrap_or("")
        )
    })
}

/// `argv` as owned strings.
fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}
