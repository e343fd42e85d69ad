//! barewire-perf's command line, in perftest's style.

use std::fmt;
use std::path::PathBuf;

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
    /// Print the usage.
    Help,
}

/// The usage text.
pub const USAGE: &str = "\
barewire-perf: perftest-style RDMA microbenchmarks over barewire's drivers

usage:
  barewire-perf TEST [options]              server: wait for one client
  barewire-perf TEST [options] HOST         client: connect to HOST and measure
  barewire-perf TEST --loopback [options]   both, as two pinned processes
  barewire-perf compare [--reps N] [-n ITERS] [-D SECS] [--plot FILE.png]
  barewire-perf report [--reps N] [--out bench/RESULTS.md]

tests: write_lat read_lat send_lat atomic_lat write_bw read_bw send_bw

options:
  -s BYTES        message size (default 2)
  -a              all sizes, 2 B to 8 MiB
  -n ITERS        iterations per size (default 1000 latency, 5000 bandwidth)
  -t DEPTH        requests in flight for bandwidth tests (default 128)
  -D SECS         run each bandwidth size for SECS seconds instead of -n
  -p PORT         TCP port (default 18515)
  -A OP           atomic_lat: FETCH_AND_ADD (default) or CMP_AND_SWAP
  --cpu A[,B]     pin this side to CPU A (a --loopback server to B)
  --driver NAME   soft (default), auto, verbs, ib, roce, roce2, iwarp
  --crc           ask for MPA CRC32c (off by default, as Linux siw)
  --json          one JSON object per result instead of the table
  --plot FILE     HDR percentile plot (PNG) of a latency test
";

fn value<'a>(it: &mut impl Iterator<Item = &'a String>, flag: &str) -> Result<&'a String, String> {
    it.next().ok_or_else(|| format!("{flag} needs a value"))
}

fn number<T: std::str::FromStr>(s: &str, flag: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{flag}: {s:?} is not a valid number"))
}

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let Some(first) = args.first() else {
        return Ok(Command::Help);
    };
    match first.as_str() {
        "-h" | "--help" | "help" => return Ok(Command::Help),
        "compare" | "report" => return parse_compare(first == "report", &args[1..]),
        _ => {}
    }
    let test: Test = first.parse()?;
    let mut r = RunArgs {
        test,
        server: None,
        port: 18515,
        sizes: vec![2],
        iters: if test.is_bw() { 5000 } else { 1000 },
        tx_depth: 128,
        duration: None,
        cpus: None,
        driver: std::env::var("BAREWIRE_DRIVER").unwrap_or_else(|_| "soft".into()),
        json: false,
        loopback: false,
        crc: false,
        atomic: AtomicOp::FetchAdd,
        plot: None,
        announce: false,
        quiet: false,
    };
    let mut all = false;
    let mut it = args[1..].iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-s" | "--size" => {
                let s: usize = number(value(&mut it, a)?, a)?;
                if !(1..=MAX_SIZE).contains(&s) {
                    return Err(format!("-s: size must be 1..={MAX_SIZE} bytes, got {s}"));
                }
                r.sizes = vec![s];
            }
            "-a" | "--all" => all = true,
            "-n" | "--iters" => {
                r.iters = number(value(&mut it, a)?, a)?;
                if r.iters == 0 {
                    return Err("-n: at least one iteration".into());
                }
            }
            "-t" | "--tx-depth" => {
                r.tx_depth = number(value(&mut it, a)?, a)?;
                if !(1..=4096).contains(&r.tx_depth) {
                    return Err("-t: tx depth must be 1..=4096".into());
                }
            }
            "-D" | "--duration" => {
                let d: f64 = number(value(&mut it, a)?, a)?;
                if d.is_nan() || d <= 0.0 || d > 3600.0 {
                    return Err("-D: duration must be in (0, 3600] seconds".into());
                }
                r.duration = Some(d);
            }
            "-p" | "--port" => r.port = number(value(&mut it, a)?, a)?,
            "-A" | "--atomic_type" => {
                r.atomic = match value(&mut it, a)?.as_str() {
                    "FETCH_AND_ADD" | "fadd" => AtomicOp::FetchAdd,
                    "CMP_AND_SWAP" | "cas" => AtomicOp::CmpSwap,
                    o => return Err(format!("-A: {o:?}: use FETCH_AND_ADD or CMP_AND_SWAP")),
                }
            }
            "--cpu" => {
                let v = value(&mut it, a)?;
                let cpus = v
                    .split(',')
                    .map(|c| number::<usize>(c, a))
                    .collect::<Result<Vec<_>, _>>()?;
                if cpus.is_empty() || cpus.len() > 2 {
                    return Err("--cpu: one or two CPU numbers, as A or A,B".into());
                }
                r.cpus = Some(cpus);
            }
            "--driver" => r.driver = value(&mut it, a)?.clone(),
            "--json" => r.json = true,
            "--loopback" => r.loopback = true,
            "--crc" => r.crc = true,
            "--plot" => r.plot = Some(value(&mut it, a)?.into()),
            "--announce" => r.announce = true,
            s if s.starts_with('-') => return Err(format!("unknown option {s}\n\n{USAGE}")),
            host => {
                if r.server.replace(host.to_string()).is_some() {
                    return Err(format!("more than one server address given ({host})"));
                }
            }
        }
    }
    if all {
        r.sizes = all_sizes();
    }
    if r.test == Test::AtomicLat {
        r.sizes = vec![8];
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

fn parse_compare(report: bool, args: &[String]) -> Result<Command, String> {
    let mut c = CompareArgs {
        reps: if report { 3 } else { 1 },
        iters: 20_000,
        secs: 3.0,
        plot: None,
        results: report.then(|| PathBuf::from("bench/RESULTS.md")),
        cpus: [0, 1],
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reps" => c.reps = number(value(&mut it, a)?, a)?,
            "-n" => c.iters = number(value(&mut it, a)?, a)?,
            "-D" => c.secs = number(value(&mut it, a)?, a)?,
            "--plot" => c.plot = Some(value(&mut it, a)?.into()),
            "--out" if report => c.results = Some(value(&mut it, a)?.into()),
            "--cpu" => {
                let v = value(&mut it, a)?;
                let mut p = v.split(',').map(|x| number::<usize>(x, a));
                c.cpus = match (p.next(), p.next(), p.next()) {
                    (Some(x), Some(y), None) => [x?, y?],
                    _ => return Err("--cpu: give two CPUs, as A,B".into()),
                };
            }
            o => return Err(format!("unknown option {o} for compare\n\n{USAGE}")),
        }
    }
    if c.reps == 0 || c.iters == 0 || c.secs.is_nan() || c.secs <= 0.0 {
        return Err("--reps, -n and -D must be positive".into());
    }
    Ok(Command::Compare(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Command, String> {
        parse(&s.split_whitespace().map(String::from).collect::<Vec<_>>())
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
        let r = run("read_lat -a --loopback --json --cpu 2,3");
        assert_eq!(r.sizes.first(), Some(&2));
        assert_eq!(r.sizes.last(), Some(&(8 << 20)));
        assert_eq!(r.sizes.len(), 23);
        assert!(r.loopback && r.json);
        assert_eq!(r.cpus, Some(vec![2, 3]));
    }

    #[test]
    fn atomics_are_eight_bytes_and_take_perftest_names() {
        let r = run("atomic_lat -A CMP_AND_SWAP -s 64");
        assert_eq!(
            (r.atomic, r.sizes.as_slice()),
            (AtomicOp::CmpSwap, &[8][..])
        );
        assert!(p("atomic_lat -A XOR").unwrap_err().contains("CMP_AND_SWAP"));
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        assert!(p("write_lat -s").unwrap_err().contains("-s needs a value"));
        assert!(p("write_lat -s ten")
            .unwrap_err()
            .contains("not a valid number"));
        assert!(p("write_lat -s 0").unwrap_err().contains("size must be"));
        assert!(p("write_lat -s 16777216")
            .unwrap_err()
            .contains("size must be"));
        assert!(p("rdma_lat").unwrap_err().contains("write_lat"));
        assert!(p("write_lat -D 3").unwrap_err().contains("bandwidth tests"));
        assert!(p("write_lat --loopback 10.0.0.1")
            .unwrap_err()
            .contains("--loopback"));
        assert!(p("write_bw --plot x.png").unwrap_err().contains("latency"));
        assert!(p("write_lat --frobnicate")
            .unwrap_err()
            .contains("unknown option"));
        assert!(p("write_lat a b").unwrap_err().contains("more than one"));
    }

    #[test]
    fn compare_and_report_options() {
        assert_eq!(p("").unwrap(), Command::Help);
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
    }
}
