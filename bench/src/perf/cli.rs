//! barewire-perf's command line, in perftest's style.

use std::fmt;
use std::path::PathBuf;

pub use barewire_engine::Reactor;
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser, Subcommand, ValueEnum};

/// A perftest-named test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// `ib_write_lat`: ping-pong through memory with RDMA WRITE; RTT/2.
    WriteLat,
    /// `ib_read_lat`: one RDMA READ at a time; a full round trip.
    ReadLat,
    /// `ib_send_lat`: ping-pong with SEND/RECV; RTT/2.
    SendLat,
    /// `ib_atomic_lat`: one atomic at a time (fetch-add or compare-and-swap); a full round trip.
    AtomicLat,
    /// `ib_write_bw`.
    WriteBw,
    /// `ib_read_bw`.
    ReadBw,
    /// `ib_send_bw`.
    SendBw,
}

impl Test {
    /// Every test, in the order `compare` and the tests run them.
    pub const ALL: [Test; 7] = [
        Test::WriteLat,
        Test::ReadLat,
        Test::SendLat,
        Test::AtomicLat,
        Test::WriteBw,
        Test::ReadBw,
        Test::SendBw,
    ];

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Test::WriteLat => "write_lat",
            Test::ReadLat => "read_lat",
            Test::SendLat => "send_lat",
            Test::AtomicLat => "atomic_lat",
            Test::WriteBw => "write_bw",
            Test::ReadBw => "read_bw",
            Test::SendBw => "send_bw",
        }
    }

    /// A bandwidth test (else a latency test).
    pub fn is_bw(self) -> bool {
        matches!(self, Test::WriteBw | Test::ReadBw | Test::SendBw)
    }

    /// Both sides take turns (ping-pong), so the server must run the same iterations.
    pub fn is_ping_pong(self) -> bool {
        matches!(self, Test::WriteLat | Test::SendLat)
    }

    pub(crate) fn code(self) -> u8 {
        Test::ALL.iter().position(|&t| t == self).unwrap() as u8
    }

    pub(crate) fn from_code(c: u8) -> Option<Test> {
        Test::ALL.get(c as usize).copied()
    }
}

impl fmt::Display for Test {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Test {
    type Err = String;
    fn from_str(s: &str) -> Result<Test, String> {
        Test::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| format!("unknown test {s:?}; expected one of {}", test_names()))
    }
}

fn test_names() -> String {
    Test::ALL.map(Test::name).join(", ")
}

/// Which atomic `atomic_lat` measures (perftest's `-A`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// `FETCH_AND_ADD`.
    FetchAdd,
    /// `CMP_AND_SWAP`.
    CmpSwap,
}

/// The sizes `-a` runs: every power of two from 2 B to 8 MiB, as perftest does.
pub fn all_sizes() -> Vec<usize> {
    (1..=23).map(|p| 1usize << p).collect()
}

/// The largest message barewire-perf sends (the top of `-a`).
pub const MAX_SIZE: usize = 8 << 20;

/// One run of one test, as a side (client or server) sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunArgs {
    /// The test.
    pub test: Test,
    /// The server to connect to; `None` makes this the server (or, with `loopback`, both).
    pub server: Option<String>,
    /// TCP port (perftest's `-p`), 18515 by default; 0 picks a free one.
    pub port: u16,
    /// Message sizes to run, in order (`-s`, or all of them with `-a`).
    pub sizes: Vec<usize>,
    /// Iterations per size (`-n`); perftest's defaults, 1000 for latency and 5000 for bandwidth.
    pub iters: u64,
    /// Requests in flight for bandwidth tests (`-t`), 128 by default.
    pub tx_depth: u32,
    /// Run each bandwidth size for this long instead of `iters` (`-D`, seconds).
    pub duration: Option<f64>,
    /// CPUs to pin to (`--cpu A[,B]`): this side on the first, a loopback server on the second.
    pub cpus: Option<Vec<usize>>,
    /// Driver name (`--driver soft|auto|verbs|...`), as `BAREWIRE_DRIVER` takes it.
    pub driver: String,
    /// The engine's reactor (`--reactor io_uring|epoll|auto`), as `BAREWIRE_REACTOR` takes it.
    pub reactor: Reactor,
    /// SQPOLL with this idle time in milliseconds (`--sqpoll MS`); `None`: as
    /// `BAREWIRE_SQPOLL` says (off when unset).
    pub sqpoll: Option<u64>,
    /// How long an idle core polls before it sleeps (`--idle-spin-us`, default 1000).
    pub idle_spin_us: u64,
    /// Latency tests: an untimed pause before each iteration (`--gap-us`, default 0). With a
    /// gap longer than `idle_spin_us` a core with nothing to do sleeps between messages, so
    /// each message times the wake-up of an idle peer: both sides of `send_lat`, and the
    /// responder of `read_lat` and `atomic_lat`, whose requester waits for its completion
    /// after its own sleep. `write_lat`'s sides watch their buffers from a task, as perftest
    /// spins on its buffer, so only the client's core sleeps (through the gap) and the server
    /// keeps polling.
    pub gap_us: u64,
    /// Queue pairs (connections) a bandwidth test spreads its requests over (`--qps`), each
    /// with `tx_depth` in flight.
    pub qps: u16,
    /// Bandwidth tests: bytes past the start of the server's page-aligned receive area that each
    /// WRITE lands at or each READ reads from (`--remote-offset`, 0–4095). The client's own
    /// areas stay where they are (page-aligned for sizes that are multiples of 4 KiB), so this
    /// sets where the two ranges lie relative to each other modulo 4 KiB, which some CPUs'
    /// string copies are sensitive to (bench/RESULTS.md, fifty-fourth session).
    pub remote_offset: u16,
    /// `write_lat` over a backend that maps the peer's memory (shm): alternate slices of this
    /// many iterations between the WRITE and a bare store into the peer's mapped buffer, and
    /// set them side by side pair by pair (`--floor-slices`, 0: off; see `perf::slices`).
    pub floor_slices: u16,
    /// JSON lines instead of perftest's table.
    pub json: bool,
    /// Run the server as a child process and the client here.
    pub loopback: bool,
    /// Ask for MPA CRC (off by default, as siw).
    pub crc: bool,
    /// The atomic for `atomic_lat`.
    pub atomic: AtomicOp,
    /// Write an HDR percentile plot of the latency distribution here.
    pub plot: Option<PathBuf>,
    /// Write this side's timeline (`barewire_engine::trace`) to `<prefix>.client` or
    /// `<prefix>.server` after the run; needs a build with the `trace` feature.
    pub trace: Option<PathBuf>,
    /// Print `READY <port>` once listening (used by `--loopback`).
    pub announce: bool,
    /// Print no rows (the caller reads the returned outcome).
    pub quiet: bool,
}

/// Options of `compare`.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareArgs {
    /// Runs of each figure; the median is reported.
    pub reps: usize,
    /// Iterations for latency runs.
    pub iters: u64,
    /// Seconds per bandwidth run.
    pub secs: f64,
    /// Where to write the HDR plot.
    pub plot: Option<PathBuf>,
    /// Where to write the generated results section (`report`).
    pub results: Option<PathBuf>,
    /// CPUs for the client and the server side of every tool.
    pub cpus: [usize; 2],
}

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Run one test (as server, client, or both with `--loopback`).
    Run(RunArgs),
    /// Run barewire and the peers installed here side by side.
    Compare(CompareArgs),
    /// Print this text (the usage, generated from the definitions below) and succeed.
    Help(String),
}

/// The command line, as clap reads it: one subcommand per perftest test, plus `compare` and
/// `report`.
#[derive(Debug, Parser)]
#[command(
    name = "barewire-perf",
    about = "perftest-style RDMA microbenchmarks over barewire's drivers",
    long_about = "perftest-style RDMA microbenchmarks over barewire's drivers.\n\n\
                  barewire-perf TEST [options]             server: wait for one client\n\
                  barewire-perf TEST [options] HOST        client: connect to HOST and measure\n\
                  barewire-perf TEST --loopback [options]  both, as two pinned processes",
    arg_required_else_help = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Sub,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// ib_write_lat: ping-pong through memory with RDMA WRITE; RTT/2
    #[command(name = "write_lat")]
    WriteLat(RunOpts),
    /// ib_read_lat: one RDMA READ at a time; a full round trip
    #[command(name = "read_lat")]
    ReadLat(RunOpts),
    /// ib_send_lat: ping-pong with SEND/RECV; RTT/2
    #[command(name = "send_lat")]
    SendLat(RunOpts),
    /// ib_atomic_lat: one atomic at a time (-A); a full round trip
    #[command(name = "atomic_lat")]
    AtomicLat(RunOpts),
    /// ib_write_bw
    #[command(name = "write_bw")]
    WriteBw(RunOpts),
    /// ib_read_bw
    #[command(name = "read_bw")]
    ReadBw(RunOpts),
    /// ib_send_bw
    #[command(name = "send_bw")]
    SendBw(RunOpts),
    /// Run barewire and the peers installed here (UCX, libfabric, qperf, sockperf) side by side
    Compare(CompareOpts),
    /// As compare, and write the results section (bench/RESULTS.md by default)
    Report {
        #[command(flatten)]
        opts: CompareOpts,
        /// Where to write the results section.
        #[arg(long, value_name = "FILE", default_value = "bench/RESULTS.md")]
        out: PathBuf,
    },
}

/// The options of one test, with perftest's flag names.
#[derive(Debug, Args)]
struct RunOpts {
    /// The server to connect to; none makes this side the server.
    #[arg(value_name = "HOST")]
    host: Option<String>,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", value_name = "BYTES",
          value_parser = clap::value_parser!(u64).range(1..=MAX_SIZE as u64))]
    size: Option<u64>,
    /// All sizes, 2 B to 8 MiB.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Iterations per size [default: 1000 for latency, 5000 for bandwidth].
    #[arg(short = 'n', long = "iters", value_name = "ITERS",
          value_parser = clap::value_parser!(u64).range(1..))]
    iters: Option<u64>,
    /// Requests in flight for bandwidth tests.
    #[arg(short = 't', long = "tx-depth", value_name = "DEPTH", default_value_t = 128,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    tx_depth: u32,
    /// Bandwidth tests: spread requests over N queue pairs (connections), each with -t in
    /// flight.
    #[arg(long = "qps", value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..=1024))]
    qps: u16,
    /// Bandwidth tests: WRITE to (or READ from) the server's buffer this many bytes past its
    /// page-aligned start; the client's areas do not move.
    #[arg(long = "remote-offset", value_name = "BYTES", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=4095))]
    remote_offset: u16,
    /// write_lat over shm: alternate slices of N iterations between the WRITE and a bare
    /// store into the peer's mapped buffer, and print WRITE ÷ store pair by pair (both
    /// measured by the same two processes on the same pages, a fraction of a millisecond
    /// apart).
    #[arg(long = "floor-slices", value_name = "N", default_value_t = 0)]
    floor_slices: u16,
    /// Run each bandwidth size for SECS seconds instead of -n.
    #[arg(short = 'D', long = "duration", value_name = "SECS", value_parser = seconds)]
    duration: Option<f64>,
    /// TCP port.
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// atomic_lat: the atomic to measure.
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD"
    )]
    atomic: AtomicName,
    /// Pin this side to CPU A (a --loopback server to B).
    #[arg(long = "cpu", value_name = "A[,B]", value_delimiter = ',', value_parser = crate::cpu_arg)]
    cpu: Option<Vec<usize>>,
    /// soft, shm, auto, verbs, ib, roce, roce2 or iwarp.
    #[arg(
        long,
        value_name = "NAME",
        env = "BAREWIRE_DRIVER",
        default_value = "soft"
    )]
    driver: String,
    /// The engine's reactor: io_uring, epoll (the fallback), or auto (io_uring where the
    /// kernel has it).
    #[arg(
        long,
        value_enum,
        value_name = "NAME",
        env = "BAREWIRE_REACTOR",
        default_value = "auto"
    )]
    reactor: ReactorName,
    /// io_uring submission polling with this idle time (ms): a kernel thread per core submits,
    /// so a busy core makes no system call per message, at the cost of a second CPU per core.
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(1..))]
    sqpoll: Option<u64>,
    /// How long an idle core keeps polling before it sleeps, in microseconds.
    #[arg(long, value_name = "US", default_value_t = 1000)]
    idle_spin_us: u64,
    /// Latency tests: pause this long (untimed) before each iteration. Longer than
    /// `--idle-spin-us`, an idle core sleeps between messages, so each times an idle peer's
    /// wake-up: both sides of send_lat, the responder of read_lat and atomic_lat. write_lat's
    /// server watches its buffer from a task (as perftest spins) and never sleeps.
    #[arg(long, value_name = "US", default_value_t = 0)]
    gap_us: u64,
    /// Ask for MPA CRC32c (off by default, as Linux siw).
    #[arg(long)]
    crc: bool,
    /// One JSON object per result instead of the table (schema: `table::Record`).
    #[arg(long)]
    json: bool,
    /// Run the server as a child process and the client here.
    #[arg(long)]
    loopback: bool,
    /// HDR percentile plot (PNG) of a latency test.
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Write each side's timeline of engine steps (io_uring enters, reaps, bytes placed,
    /// posts, the latency loop seeing its byte) to PREFIX.client and PREFIX.server, for
    /// bench/tools/hop-trace.py. Needs a build with `--features trace`.
    #[arg(long, value_name = "PREFIX")]
    trace: Option<PathBuf>,
    /// Print READY <port> once listening (what --loopback's server does).
    #[arg(long, hide = true)]
    announce: bool,
}

/// `--reactor` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum ReactorName {
    #[value(name = "auto")]
    Auto,
    #[value(name = "io_uring")]
    IoUring,
    #[value(name = "epoll")]
    Epoll,
}

/// The `--reactor` (and `BAREWIRE_REACTOR`) spelling of a reactor.
pub fn reactor_name(r: Reactor) -> &'static str {
    match r {
        Reactor::Auto => "auto",
        Reactor::IoUring => "io_uring",
        Reactor::Epoll => "epoll",
    }
}

/// perftest's `-A` values (and short forms).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum AtomicName {
    #[value(name = "FETCH_AND_ADD", alias = "fadd")]
    FetchAdd,
    #[value(name = "CMP_AND_SWAP", alias = "cas")]
    CmpSwap,
}

#[derive(Debug, Args)]
struct CompareOpts {
    /// Runs of each figure; the median is reported [default: 1, report: 3].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    reps: Option<u64>,
    /// Iterations for latency runs.
    #[arg(short = 'n', value_name = "ITERS", default_value_t = 20_000,
          value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Seconds per bandwidth run.
    #[arg(short = 'D', value_name = "SECS", default_value_t = 3.0, value_parser = seconds)]
    secs: f64,
    /// Where to write the HDR plot (PNG).
    #[arg(long, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// CPUs for the client and the server side of every tool.
    #[arg(long = "cpu", value_name = "A,B", value_delimiter = ',',
          value_parser = crate::cpu_arg, default_values_t = [0usize, 1])]
    cpus: Vec<usize>,
}

/// A duration in seconds, in (0, 3600].
fn seconds(s: &str) -> Result<f64, String> {
    let d: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if d.is_nan() || d <= 0.0 || d > 3600.0 {
        return Err(format!("{d} is not in (0, 3600] seconds"));
    }
    Ok(d)
}

/// The usage text (clap's, from the definitions above).
pub fn usage() -> String {
    Cli::command().render_long_help().to_string()
}

/// Parses the arguments after the program name. `Err` holds clap's message (what is wrong and
/// what is allowed) or one of the checks that span several options.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let cli = match Cli::try_parse_from(
        std::iter::once("barewire-perf").chain(args.iter().map(String::as_str)),
    ) {
        Ok(c) => c,
        Err(e) => {
            return match e.kind() {
                ErrorKind::DisplayHelp
                | ErrorKind::DisplayVersion
                | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    Ok(Command::Help(e.render().to_string()))
                }
                _ => Err(e.render().to_string()),
            }
        }
    };
    let (test, o) = match cli.sub {
        Sub::WriteLat(o) => (Test::WriteLat, o),
        Sub::ReadLat(o) => (Test::ReadLat, o),
        Sub::SendLat(o) => (Test::SendLat, o),
        Sub::AtomicLat(o) => (Test::AtomicLat, o),
        Sub::WriteBw(o) => (Test::WriteBw, o),
        Sub::ReadBw(o) => (Test::ReadBw, o),
        Sub::SendBw(o) => (Test::SendBw, o),
        Sub::Compare(o) => return compare_args(o, None),
        Sub::Report { opts, out } => return compare_args(opts, Some(out)),
    };
    let sizes = if test == Test::AtomicLat {
        vec![8]
    } else if o.all {
        all_sizes()
    } else {
        vec![o.size.unwrap_or(2) as usize]
    };
    let r = RunArgs {
        test,
        server: o.host,
        port: o.port,
        sizes,
        iters: o.iters.unwrap_or(if test.is_bw() { 5000 } else { 1000 }),
        tx_depth: o.tx_depth,
        duration: o.duration,
        cpus: o.cpu,
        driver: o.driver,
        qps: o.qps,
        remote_offset: o.remote_offset,
        floor_slices: o.floor_slices,
        reactor: match o.reactor {
            ReactorName::Auto => Reactor::Auto,
            ReactorName::IoUring => Reactor::IoUring,
            ReactorName::Epoll => Reactor::Epoll,
        },
        sqpoll: o.sqpoll,
        idle_spin_us: o.idle_spin_us,
        gap_us: o.gap_us,
        json: o.json,
        loopback: o.loopback,
        crc: o.crc,
        atomic: match o.atomic {
            AtomicName::FetchAdd => AtomicOp::FetchAdd,
            AtomicName::CmpSwap => AtomicOp::CmpSwap,
        },
        plot: o.plot,
        trace: o.trace,
        announce: o.announce,
        quiet: false,
    };
    if r.cpus.as_ref().is_some_and(|c| c.len() > 2) {
        return Err("--cpu: one or two CPU numbers, as A or A,B".into());
    }
    if r.qps > 1 && !matches!(r.test, Test::WriteBw | Test::ReadBw) {
        return Err(format!(
            "--qps is for write_bw and read_bw; {} runs on one queue pair",
            r.test
        ));
    }
    if r.remote_offset > 0 && !matches!(r.test, Test::WriteBw | Test::ReadBw) {
        return Err(format!(
            "--remote-offset is for write_bw and read_bw; {} uses fixed places",
            r.test
        ));
    }
    if r.floor_slices > 0 && r.test != Test::WriteLat {
        return Err(format!(
            "--floor-slices is for write_lat (a store is the floor under a WRITE); {} has none",
            r.test
        ));
    }
    if r.floor_slices > 0 && r.iters < 2 * u64::from(r.floor_slices) {
        return Err(format!(
            "--floor-slices {}: -n {} iterations make not one WRITE slice and one store slice",
            r.floor_slices, r.iters
        ));
    }
    if r.duration.is_some() && !r.test.is_bw() {
        return Err(format!(
            "-D is for bandwidth tests; {} counts iterations (-n)",
            r.test
        ));
    }
    if r.loopback && r.server.is_some() {
        return Err("--loopback runs both sides here; give no server address".into());
    }
    if r.plot.is_some() && r.test.is_bw() {
        return Err("--plot draws a latency distribution; use it with a *_lat test".into());
    }
    Ok(Command::Run(r))
}

fn compare_args(o: CompareOpts, results: Option<PathBuf>) -> Result<Command, String> {
    let [a, b] = o.cpus[..] else {
        return Err("--cpu: give two CPUs, as A,B".into());
    };
    Ok(Command::Compare(CompareArgs {
        reps: o.reps.unwrap_or(if results.is_some() { 3 } else { 1 }) as usize,
        iters: o.iters,
        secs: o.secs,
        plot: o.plot,
        results,
        cpus: [a, b],
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    /// Two CPUs this process may use (the same one twice on a one-CPU machine): `--cpu`
    /// refuses others.
    fn two_cpus() -> (usize, usize) {
        let ids = core_affinity::get_core_ids().expect("an affinity mask");
        (ids[0].id, ids[ids.len().min(2) - 1].id)
    }

    fn run(s: &str) -> RunArgs {
        match p(s).unwrap() {
            Command::Run(r) => r,
            c => panic!("{c:?}"),
        }
    }

    #[test]
    fn server_and_client_forms() {
        let s = run("write_lat");
        assert_eq!(
            (s.test, s.server.as_deref(), s.port),
            (Test::WriteLat, None, 18515)
        );
        assert_eq!(s.iters, 1000);
        let c = run("write_bw 127.0.0.1 -s 65536 -t 64 -p 9000");
        assert_eq!(c.server.as_deref(), Some("127.0.0.1"));
        assert_eq!(
            (c.sizes.as_slice(), c.tx_depth, c.port),
            (&[65536][..], 64, 9000)
        );
        assert_eq!(c.iters, 5000);
    }

    #[test]
    fn all_sizes_are_powers_of_two_from_2_b_to_8_mib() {
        let (a, b) = two_cpus();
        let r = run(&format!("read_lat -a --loopback --json --cpu {a},{b}"));
        assert_eq!(r.sizes.first(), Some(&2));
        assert_eq!(r.sizes.last(), Some(&(8 << 20)));
        assert_eq!(r.sizes.len(), 23);
        assert!(r.loopback && r.json);
        assert_eq!(r.cpus, Some(vec![a, b]));
    }

    #[test]
    fn queue_pairs_and_reactor() {
        let r = run("write_bw --qps 64 -s 4096 --reactor epoll --loopback");
        assert_eq!((r.qps, r.reactor), (64, Reactor::Epoll));
        assert_eq!((r.sqpoll, r.idle_spin_us), (None, 1000));
        let r = run("read_lat --sqpoll 10 --idle-spin-us 0");
        assert_eq!((r.sqpoll, r.idle_spin_us), (Some(10), 0));
        assert_eq!(r.gap_us, 0);
        assert_eq!(run("send_lat --idle-spin-us 0 --gap-us 200").gap_us, 200);
        assert!(
            p("read_lat --sqpoll 0").is_err(),
            "an idle time of 0 ms is refused"
        );
        assert_eq!(run("read_bw --reactor io_uring").reactor, Reactor::IoUring);
        assert_eq!(run("write_bw").qps, 1);
        assert_eq!(run("read_bw --remote-offset 4080").remote_offset, 4080);
        assert_eq!(run("write_bw").remote_offset, 0);
        assert_eq!(run("write_lat --floor-slices 500").floor_slices, 500);
        assert_eq!(run("write_lat").floor_slices, 0);
        let e = p("read_lat --floor-slices 500").unwrap_err();
        assert!(e.contains("--floor-slices is for write_lat"), "{e}");
        let e = p("write_lat --floor-slices 600 -n 1000").unwrap_err();
        assert!(e.contains("not one WRITE slice and one store slice"), "{e}");
        let e = p("write_lat --remote-offset 16").unwrap_err();
        assert!(
            e.contains("--remote-offset is for write_bw and read_bw"),
            "{e}"
        );
        assert!(p("write_bw --remote-offset 4096").is_err());
        let e = p("write_lat --qps 4").unwrap_err();
        assert!(e.contains("--qps is for write_bw and read_bw"), "{e}");
        let e = p("write_bw --qps 0").unwrap_err();
        assert!(e.contains("--qps"), "{e}");
        let e = p("write_bw --reactor kqueue").unwrap_err();
        assert!(e.contains("io_uring") && e.contains("epoll"), "{e}");
    }

    #[test]
    fn atomics_are_eight_bytes_and_take_perftest_names() {
        let r = run("atomic_lat -A CMP_AND_SWAP -s 64");
        assert_eq!(
            (r.atomic, r.sizes.as_slice()),
            (AtomicOp::CmpSwap, &[8][..])
        );
        assert_eq!(run("atomic_lat -A cas").atomic, AtomicOp::CmpSwap);
        assert_eq!(run("atomic_lat").atomic, AtomicOp::FetchAdd);
    }

    #[test]
    fn bad_input_says_what_is_wrong_and_what_is_allowed() {
        let e = p("write_lat -s").unwrap_err();
        assert!(
            e.contains("--size <BYTES>") && e.contains("value is required"),
            "{e}"
        );
        let e = p("write_lat -s ten").unwrap_err();
        assert!(e.contains("invalid value 'ten'"), "{e}");
        let e = p("write_lat -s 0").unwrap_err();
        assert!(e.contains("1..=8388608"), "{e}");
        assert!(p("write_lat -s 16777216")
            .unwrap_err()
            .contains("1..=8388608"));
        let e = p("rdma_lat").unwrap_err();
        assert!(e.contains("unrecognized subcommand 'rdma_lat'"), "{e}");
        assert!(p("write_lat -D 3").unwrap_err().contains("bandwidth tests"));
        assert!(p("write_bw -D 0").unwrap_err().contains("(0, 3600]"));
        assert!(p("write_lat --loopback 10.0.0.1")
            .unwrap_err()
            .contains("--loopback"));
        assert!(p("write_bw --plot x.png").unwrap_err().contains("latency"));
        let e = p("write_lat --frobnicate").unwrap_err();
        assert!(e.contains("unexpected argument '--frobnicate'"), "{e}");
        assert!(p("write_lat a b")
            .unwrap_err()
            .contains("unexpected argument 'b'"));
        let e = p("atomic_lat -A XOR").unwrap_err();
        assert!(
            e.contains("FETCH_AND_ADD") && e.contains("CMP_AND_SWAP"),
            "{e}"
        );
        assert!(p("write_lat --cpu 1,2,3").unwrap_err().contains("--cpu"));
        assert!(p("write_lat -t 5000").unwrap_err().contains("1..=4096"));
    }

    #[test]
    fn help_is_generated_and_names_every_test() {
        for args in ["", "--help", "write_bw --help"] {
            let Command::Help(text) = p(args).unwrap() else {
                panic!("{args:?} is not help")
            };
            assert!(text.contains("Usage: barewire-perf"), "{args:?}: {text}");
        }
        let Command::Help(top) = p("--help").unwrap() else {
            panic!()
        };
        for t in Test::ALL {
            assert!(top.contains(t.name()), "{t} missing from\n{top}");
        }
        let Command::Help(run) = p("write_bw --help").unwrap() else {
            panic!()
        };
        for flag in [
            "-s, --size",
            "-n, --iters",
            "-t, --tx-depth",
            "-D, --duration",
            "-A",
        ] {
            assert!(run.contains(flag), "{flag} missing from\n{run}");
        }
    }

    #[test]
    fn compare_and_report_options() {
        let Command::Compare(c) = p("compare --reps 2 -n 500 -D 1.5 --plot out.png").unwrap()
        else {
            panic!()
        };
        assert_eq!((c.reps, c.iters, c.secs), (2, 500, 1.5));
        assert_eq!(c.results, None);
        let Command::Compare(r) = p("report --out /tmp/R.md").unwrap() else {
            panic!()
        };
        assert_eq!(r.results, Some(PathBuf::from("/tmp/R.md")));
        assert_eq!(r.reps, 3);
        assert!(p("compare --out x").is_err());
        let (a, b) = two_cpus();
        let Command::Compare(c) = p(&format!("compare --cpu {a},{b}")).unwrap() else {
            panic!()
        };
        assert_eq!(c.cpus, [a, b]);
        assert!(p("compare --cpu 0,5000").unwrap_err().contains("CPU 5000"));
        assert!(p("compare --cpu 2,3,4").unwrap_err().contains("--cpu"));
    }
}
