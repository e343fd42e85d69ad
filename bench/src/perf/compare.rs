//! `barewire-perf compare`: barewire beside the peers installed here, run in the same session
//! on the same two pinned CPUs, reps interleaved, figures paired into rows with ratios. The
//! peers themselves (how to start each, run a test, read its output) are in `peers`; the table
//! and the RESULTS section are written by `report`.
//!
//! A peer that is not installed is installed first (`crate::apt`); one that cannot be is reported
//! by name with the package that provides it.

use std::process::{Command as Process, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::cli::{AtomicOp, CompareArgs, RunArgs, Test};
use super::peers::{self, Ours, Params, PeerRun};
use super::run;
use super::table::LatRow;
use crate::reps::median;

/// What a figure measures, and so which way a ratio is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds (lower is better).
    Micros,
    /// MiB/s (higher is better).
    MibPerSec,
    /// Thousands per second: operations, messages (higher is better).
    KPerSec,
}

/// One figure from one tool.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The tool and test, e.g. `ucx_perftest ucp_put_lat`.
    pub tool: String,
    /// What the number is, e.g. `p50, RTT/2`.
    pub what: String,
    /// The value (median over reps).
    pub value: f64,
    /// Its unit.
    pub unit: Unit,
    /// The command line that produced it.
    pub command: String,
    /// Latency percentiles the tool reported, (percentile, µs), for the plot.
    pub percentiles: Vec<(f64, f64)>,
    /// The latency tail, (p99, p99.9) in µs, medians over reps: barewire's, or that of a peer
    /// barewire-perf measures itself (the floors, and barewire on the epoll fallback).
    pub tail: Option<(f64, f64)>,
    /// barewire's same figure with MPA CRC32c negotiated on (the figure itself is CRC off).
    pub crc_on: Option<f64>,
}

/// A peer tool that is not installed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The binary.
    pub tool: &'static str,
    /// The Debian package that provides it.
    pub package: &'static str,
}

/// One row of the comparison: a barewire figure beside a peer's.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// barewire's figure.
    pub ours: Figure,
    /// The peer's.
    pub peer: Figure,
    /// barewire ÷ peer in each rep (both measured within minutes of each other).
    pub ratios: Vec<f64>,
}

impl Row {
    /// barewire ÷ peer (below 1 is better for latency, above 1 for bandwidth): the median of
    /// the per-rep ratios when there are several (robust to the machine changing pace
    /// between reps), else the ratio of the figures.
    pub fn ratio(&self) -> f64 {
        if self.ratios.is_empty() {
            self.ours.value / self.peer.value
        } else {
            median(&mut self.ratios.clone())
        }
    }
}

/// Everything `compare` measured.
#[derive(Debug, Default)]
pub struct Comparison {
    /// The side-by-side rows.
    pub rows: Vec<Row>,
    /// Peers that could not be run.
    pub missing: Vec<Missing>,
    /// Peer runs that failed or printed nothing we could read: (command, what happened).
    pub failed: Vec<(String, String)>,
    /// barewire's 8 B WRITE latency distribution (nanoseconds), for the plot.
    pub write_lat: Option<Histogram<u64>>,
    /// Per rep, the client's CPU and the server's probed just before it ([`super::host`]):
    /// the share of samples that ran in the host's slow state (`None`: not probed).
    pub host: Vec<[Option<f64>; 2]>,
}

/// Runs a server and a client of a peer tool, each pinned and bounded by `timeout`; returns the
/// client's output.
pub fn client_server(
    cpus: [usize; 2],
    env: &[(&str, &str)],
    server: &[&str],
    client: &[&str],
) -> Result<String, String> {
    // taskset execs the tool, so the server's pid is the tool's own and kill() stops it (a
    // `timeout` wrapper would outlive a SIGKILL and leave the server holding its port).
    let pinned = |cpu: usize, argv: &[&str]| {
        let mut c = Process::new("taskset");
        c.args(["-c", &cpu.to_string()])
            .args(argv)
            .envs(env.iter().copied());
        c
    };
    // The server's errors go to a file, to be shown if the client never reaches it: one file
    // per call (the process id and a count), so calls from several threads keep their own.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log_path = std::env::temp_dir().join(format!(
        "barewire-perf-peer-server-{}-{call}.log",
        std::process::id()
    ));
    let log = std::fs::File::create(&log_path).map_err(|e| format!("server log: {e}"))?;
    let mut srv = pinned(cpus[1], server)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("start: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let mut argv = vec!["timeout", "60"];
    argv.extend_from_slice(client);
    // A server slower to start than the wait above (a loaded host) refuses the client's
    // connection; the client runs again while the server is still up, a few times.
    let refused = |out: &std::io::Result<std::process::Output>| {
        out.as_ref().is_ok_and(|o| {
            [&o.stdout, &o.stderr].iter().any(|text| {
                String::from_utf8_lossy(text)
                    .to_lowercase()
                    .contains("connection refused")
            })
        })
    };
    let mut out = pinned(cpus[0], &argv).output();
    let mut tries = 1;
    while tries < 4 && refused(&out) && matches!(srv.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(500));
        out = pinned(cpus[0], &argv).output();
        tries += 1;
    }
    // Servers that serve forever (qperf, sockperf) are stopped here; others have exited.
    std::thread::sleep(Duration::from_millis(100));
    let ended = srv.try_wait().ok().flatten();
    let _ = srv.kill();
    let _ = srv.wait();
    let server_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    let _ = std::fs::remove_file(&log_path);
    if refused(&out) {
        // Say why: a server that had exited (its port taken, say) or one still starting.
        let server = match ended {
            Some(status) => format!("the server had exited ({status})"),
            None => "the server was still running".to_string(),
        };
        let said: Vec<&str> = server_log.lines().rev().take(3).collect();
        return Err(format!(
            "the client's connection was refused {tries} times; {server}; its last words: {}",
            if said.is_empty() {
                "none".to_string()
            } else {
                said.into_iter().rev().collect::<Vec<_>>().join(" / ")
            }
        ));
    }
    let out = out.map_err(|e| format!("run: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok(text)
}

/// How a barewire figure is run beyond the defaults.
#[derive(Debug, Clone, Copy)]
struct Variant {
    reactor: super::cli::Reactor,
    qps: u16,
    /// The driver (`--driver`).
    driver: &'static str,
    /// It has a CRC-on run too (the `crc_on` column): the soft provider's tests.
    crc_too: bool,
    /// `--remote-offset`.
    remote_offset: u16,
    /// Both cores asleep between messages: `--idle-spin-us 0 --gap-us` [`SLEEP_GAP_US`], at
    /// most [`SLEEPING_ITERS`] iterations (each takes the gap).
    sleeping: bool,
}

/// The untimed pause before each message of a sleeping row, µs: far longer than an idle core
/// polls (none, there) and than a round trip, so every message finds both cores asleep.
const SLEEP_GAP_US: u64 = 200;

/// Iterations of a sleeping row at most: about half a second of gaps.
const SLEEPING_ITERS: u64 = 2000;

impl Variant {
    const DEFAULT: Variant = Variant {
        reactor: super::cli::Reactor::Auto,
        qps: 1,
        driver: "soft",
        crc_too: true,
        remote_offset: 0,
        sleeping: false,
    };

    fn on(reactor: super::cli::Reactor, qps: u16) -> Variant {
        Variant {
            reactor,
            qps,
            driver: "soft",
            crc_too: false,
            remote_offset: 0,
            sleeping: false,
        }
    }

    /// On the shm backend (no CRC column: there is no wire).
    const SHM: Variant = Variant {
        reactor: super::cli::Reactor::Auto,
        qps: 1,
        driver: "shm",
        crc_too: false,
        remote_offset: 0,
        sleeping: false,
    };

    /// What the tool's name says about it.
    fn suffix(&self) -> String {
        let mut s = String::new();
        if self.driver != "soft" {
            s += &format!(" --driver {}", self.driver);
        }
        if self.qps > 1 {
            s += &format!(" --qps {}", self.qps);
        }
        if self.reactor != super::cli::Reactor::Auto {
            s += &format!(" --reactor {}", super::cli::reactor_name(self.reactor));
        }
        if self.remote_offset > 0 {
            s += &format!(" --remote-offset {}", self.remote_offset);
        }
        if self.sleeping {
            s += &format!(" --idle-spin-us 0 --gap-us {SLEEP_GAP_US}");
        }
        s
    }

    fn flags(&self) -> String {
        self.suffix()
    }
}

struct Runner<'a> {
    a: &'a CompareArgs,
    cmp: Comparison,
    /// Progress on stderr: the rep, what runs now, and an ETA.
    bar: &'a indicatif::ProgressBar,
}

impl Runner<'_> {
    /// barewire's figure: the median over reps of the spec's `pick` applied to one loopback run
    /// of its test (with `crc_only`, of its CRC-on runs alone: then only `crc_on` is a figure,
    /// and `value` is NaN).
    fn ours_on(&mut self, spec: Spec, crc_only: bool) -> Option<Figure> {
        let Spec {
            test,
            size,
            what,
            pick,
            v,
            ..
        } = spec;
        self.bar
            .set_message(format!("barewire {test} {size} B ({what}){}", v.suffix()));
        let mut args = self.args(&spec);
        let (mut vals, mut p99s, mut p999s, mut crc_vals) = (vec![], vec![], vec![], vec![]);
        let crcs: &[bool] = match (v.crc_too, crc_only) {
            (true, true) => &[true],
            (true, false) => &[false, true],
            (false, _) => &[false],
        };
        for &crc in crcs {
            args.crc = crc;
            for _ in 0..self.a.reps {
                match run::run(&args) {
                    Ok(out) => {
                        if crc {
                            crc_vals.push(pick(&out));
                            continue;
                        }
                        if test == Test::WriteLat && size == 8 && self.cmp.write_lat.is_none() {
                            self.cmp.write_lat = out.lat.first().map(|(_, h)| h.clone());
                        }
                        if let Some((row, _)) = out.lat.first() {
                            p99s.push(row.p99);
                            p999s.push(row.p999);
                        }
                        vals.push(pick(&out));
                    }
                    Err(e) => self.cmp.failed.push((format!("barewire-perf {test}"), e)),
                }
            }
        }
        (!vals.is_empty() || !crc_vals.is_empty()).then(|| Figure {
            tool: format!("barewire-perf {test}{}", v.suffix()),
            what: what.into(),
            value: if vals.is_empty() {
                f64::NAN
            } else {
                median(&mut vals)
            },
            unit: if test.is_bw() {
                Unit::MibPerSec
            } else {
                Unit::Micros
            },
            command: self.command(&spec),
            percentiles: Vec::new(),
            tail: (!p99s.is_empty()).then(|| (median(&mut p99s), median(&mut p999s))),
            crc_on: (!crc_vals.is_empty()).then(|| median(&mut crc_vals)),
        })
    }

    /// The shm 8 B WRITE beside a bare store into the peer's mapping, made by the same two
    /// processes in the slices between its own (`write_lat --floor-slices`, with
    /// [`floor_slice`] iterations a slice): each rep's ratio is the median over its slice
    /// pairs, each pair in one mode of the host's line trip (see `perf::slices`).
    fn sliced(&mut self) -> Option<Row> {
        let spec = spec(Ours::ShmWriteLat);
        self.bar
            .set_message("barewire write_lat --driver shm, slices with bare stores");
        let slice = floor_slice(self.a.iters);
        let args = RunArgs {
            floor_slices: slice,
            ..self.args(&spec)
        };
        let command = format!("{} --floor-slices {slice}", self.command(&spec));
        let mut rows = Vec::new();
        for _ in 0..self.a.reps {
            let summary = run::run(&args)
                .and_then(|mut o| o.slices.pop().ok_or_else(|| "no slice pairs".to_string()));
            match summary {
                Ok(s) => rows.push(s),
                Err(e) => self.cmp.failed.push((command.clone(), e)),
            }
        }
        let fig = |tool: String, what: &str, rows: Vec<&LatRow>, command: String| {
            let col =
                |get: fn(&LatRow) -> f64| median(rows.iter().map(|r| get(r)).collect::<Vec<_>>());
            Figure {
                tool,
                what: what.into(),
                value: col(|r| r.typical),
                unit: Unit::Micros,
                command,
                percentiles: Vec::new(),
                tail: Some((col(|r| r.p99), col(|r| r.p999))),
                crc_on: None,
            }
        };
        (!rows.is_empty()).then(|| Row {
            ours: fig(
                format!("barewire-perf write_lat --driver shm --floor-slices {slice}"),
                "p50 of its WRITE slices, RTT/2",
                rows.iter().map(|s| &s.write).collect(),
                command.clone(),
            ),
            peer: fig(
                "a bare store into the peer's mapped buffer, in the slices between (same \
                 processes, pages and wait)"
                    .into(),
                "p50, RTT/2",
                rows.iter().map(|s| &s.store).collect(),
                format!("{command} (its store slices)"),
            ),
            ratios: rows.iter().map(|s| s.ratio).collect(),
        })
    }

    /// The run behind `spec` (CRC off).
    fn args(&self, spec: &Spec) -> RunArgs {
        let Spec {
            test,
            size,
            atomic,
            v,
            ..
        } = *spec;
        let mut args = RunArgs {
            test,
            server: None,
            port: 0,
            sizes: vec![size],
            iters: self.a.iters,
            tx_depth: 128,
            duration: test.is_bw().then_some(self.a.secs),
            cpus: Some(self.a.cpus.to_vec()),
            driver: v.driver.into(),
            reactor: v.reactor,
            sqpoll: None,
            idle_spin_us: if v.sleeping { 0 } else { 1000 },
            gap_us: if v.sleeping { SLEEP_GAP_US } else { 0 },
            qps: v.qps,
            remote_offset: v.remote_offset,
            floor_slices: 0,
            json: true,
            loopback: true,
            crc: false,
            atomic,
            plot: None,
            trace: None,
            announce: false,
            quiet: true,
        };
        if test.is_bw() {
            args.iters = 1;
        }
        if v.sleeping {
            args.iters = args.iters.min(SLEEPING_ITERS);
        }
        args
    }

    /// `spec`'s command line, as the table lists it.
    fn command(&self, spec: &Spec) -> String {
        let test = spec.test;
        format!(
            "barewire-perf {test} --loopback -s {} {} --cpu {},{}",
            spec.size,
            if test.is_bw() {
                format!("-D {}", self.a.secs)
            } else {
                format!("-n {}", self.args(spec).iters)
            },
            self.a.cpus[0],
            self.a.cpus[1]
        ) + if spec.atomic == AtomicOp::CmpSwap && test == Test::AtomicLat {
            " -A CMP_AND_SWAP"
        } else {
            ""
        } + &spec.v.flags()
    }

    /// A peer's figure: the median over reps of what its parser reads from the client's
    /// output.
    fn peer(&mut self, tool: &str, env: &[(&str, &str)], run: &PeerRun) -> Option<Figure> {
        self.bar
            .set_message(format!("{tool} {} ({})", run.label, run.what));
        let server: Vec<&str> = run.server.iter().map(String::as_str).collect();
        let client: Vec<&str> = run.client.iter().map(String::as_str).collect();
        let command = env
            .iter()
            .map(|(k, v)| format!("{k}={v} "))
            .collect::<String>()
            + &client.join(" ");
        let mut vals = Vec::new();
        let mut pct = Vec::new();
        for _ in 0..self.a.reps {
            match client_server(self.a.cpus, env, &server, &client)
                .and_then(|out| read_figure(run.parse, &out))
            {
                Ok((v, p)) => {
                    vals.push(v);
                    if pct.is_empty() {
                        pct = p;
                    }
                }
                Err(e) => self.cmp.failed.push((command.clone(), e)),
            }
        }
        (!vals.is_empty()).then(|| Figure {
            tool: format!("{tool} {}", run.label),
            what: run.what.into(),
            value: median(&mut vals),
            unit: run.unit,
            command,
            percentiles: pct,
            tail: None,
            crc_on: None,
        })
    }

    fn pair(&mut self, ours: &Option<Figure>, peer: Option<Figure>) {
        if let (Some(o), Some(p)) = (ours, peer) {
            self.cmp.rows.push(Row {
                ratios: vec![o.value / p.value],
                ours: o.clone(),
                peer: p,
            });
        }
    }
}

/// The figure a peer's parser reads from its output, if it is one: a run that printed none,
/// or printed zero or less (a bandwidth of 0.00 from a run that went wrong), failed; its rep
/// then has no ratio rather than an infinite one.
fn read_figure(
    parse: fn(&str) -> crate::perf::peers::Parsed,
    out: &str,
) -> Result<(f64, Vec<(f64, f64)>), String> {
    let last = out.lines().last().unwrap_or("");
    match parse(out) {
        Some((v, p)) if v.is_finite() && v > 0.0 => Ok((v, p)),
        Some((v, _)) => Err(format!("a figure of {v} in its output: {last}")),
        None => Err(format!("no figure in its output: {last}")),
    }
}

/// Which number of a run a figure is.
type Pick = fn(&run::Outcome) -> f64;

fn p50(o: &run::Outcome) -> f64 {
    o.lat[0].0.typical
}

fn bw(o: &run::Outcome) -> f64 {
    o.bw[0].avg
}

/// Runs barewire and every installed peer `reps` times and pairs the figures. Reps are
/// interleaved (each rep runs barewire's tests, then every peer's, once), and within a rep each
/// row's barewire test runs again right before the figure it is set beside, so the two of a
/// ratio are seconds apart (this host's pace changes by up to 1.4x on a TCP round trip from
/// one minute to the next). Figures are medians over reps and each ratio is the median of the
/// per-rep ratios.
pub fn compare(a: &CompareArgs) -> Comparison {
    warn_if_busy(a.cpus);
    let once = CompareArgs {
        reps: 1,
        ..a.clone()
    };
    // On stderr, and only where that is a terminal (indicatif hides itself otherwise).
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(a.reps.max(1) as u64),
        indicatif::ProgressDrawTarget::stderr_with_hz(4),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "rep {pos}/{len} done, now: {msg} [{elapsed}, ETA {eta}]",
    ) {
        bar.set_style(style);
    }
    let reps: Vec<Comparison> = (0..a.reps.max(1))
        .map(|_| {
            let probed = a.cpus.map(super::host::probe);
            let mut c = compare_once(&once, &bar);
            c.host.push(probed);
            bar.inc(1);
            c
        })
        .collect();
    bar.finish_and_clear();
    merge(reps)
}

/// Says on stderr if either of the two CPUs is busy before anything runs: a process left
/// spinning there (a peer's server from an earlier run, say) would slow every figure.
fn warn_if_busy(cpus: [usize; 2]) {
    let sample = || std::fs::read_to_string("/proc/stat").ok();
    let Some(before) = sample() else { return };
    std::thread::sleep(Duration::from_millis(300));
    let Some(after) = sample() else { return };
    for cpu in cpus {
        if let Some(busy) = busy_fraction(&before, &after, cpu) {
            if busy > 0.25 {
                eprintln!(
                    "warning: CPU {cpu} was {:.0}% busy before the comparison started; \
                     another process there would slow every figure (see `top -1`)",
                    busy * 100.0
                );
            }
        }
    }
}

/// The share of time `cpu` was not idle between two readings of `/proc/stat`.
fn busy_fraction(before: &str, after: &str, cpu: usize) -> Option<f64> {
    let ticks = |stat: &str| -> Option<(u64, u64)> {
        let name = format!("cpu{cpu}");
        let line = stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        let v: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal ...: idle and iowait are not busy.
        let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
        Some((v.iter().sum(), idle))
    };
    let (t0, i0) = ticks(before)?;
    let (t1, i1) = ticks(after)?;
    let total = t1.checked_sub(t0)?;
    (total > 0).then(|| 1.0 - i1.saturating_sub(i0) as f64 / total as f64)
}

/// Folds several reps into one comparison: rows matched by their figures' tools and what
/// they measure, values and tails as medians, the per-rep ratios kept.
fn merge(reps: Vec<Comparison>) -> Comparison {
    let mut out = Comparison::default();
    let key = |r: &Row| {
        (
            r.ours.tool.clone(),
            r.ours.what.clone(),
            r.peer.tool.clone(),
            r.peer.what.clone(),
        )
    };
    let mut groups: Vec<Vec<Row>> = Vec::new();
    for c in reps {
        for row in c.rows {
            match groups.iter_mut().find(|g| key(&g[0]) == key(&row)) {
                Some(g) => g.push(row),
                None => groups.push(vec![row]),
            }
        }
        for m in c.missing {
            if !out.missing.contains(&m) {
                out.missing.push(m);
            }
        }
        out.failed.extend(c.failed);
        out.host.extend(c.host);
        if out.write_lat.is_none() {
            out.write_lat = c.write_lat;
        }
    }
    let fold = |figs: Vec<&Figure>| {
        let mut f = figs[0].clone();
        let col = |get: &dyn Fn(&Figure) -> Option<f64>| {
            let mut v: Vec<f64> = figs.iter().filter_map(|f| get(f)).collect();
            (!v.is_empty()).then(|| median(&mut v))
        };
        f.value = col(&|f| Some(f.value)).unwrap_or(f.value);
        f.crc_on = col(&|f| f.crc_on);
        f.tail = col(&|f| f.tail.map(|t| t.0)).zip(col(&|f| f.tail.map(|t| t.1)));
        f
    };
    for g in groups {
        out.rows.push(Row {
            ours: fold(g.iter().map(|r| &r.ours).collect()),
            peer: fold(g.iter().map(|r| &r.peer).collect()),
            ratios: g.iter().flat_map(|r| r.ratios.iter().copied()).collect(),
        });
    }
    out
}

/// One of barewire's figures: the test, the message size, the atomic, what the figure is,
/// which number of the run it is, and where it runs.
#[derive(Clone, Copy)]
struct Spec {
    test: Test,
    size: usize,
    atomic: AtomicOp,
    what: &'static str,
    pick: Pick,
    v: Variant,
}

impl Spec {
    fn new(test: Test, size: usize, what: &'static str, pick: Pick, v: Variant) -> Spec {
        Spec {
            test,
            size,
            atomic: AtomicOp::FetchAdd,
            what,
            pick,
            v,
        }
    }

    /// The same test on the shm backend.
    fn shm(self) -> Spec {
        Spec {
            v: Variant::SHM,
            ..self
        }
    }
}

/// What runs to give each of barewire's figures.
fn spec(k: Ours) -> Spec {
    let soft = Variant::DEFAULT;
    let write_lat = Spec::new(Test::WriteLat, 8, "p50, RTT/2", p50, soft);
    let read_lat = Spec::new(Test::ReadLat, 8, "p50, RTT", p50, soft);
    let fadd = Spec::new(Test::AtomicLat, 8, "fetch-add p50, RTT", p50, soft);
    let write_bw = Spec::new(Test::WriteBw, 1 << 20, "1 MiB average", bw, soft);
    match k {
        Ours::WriteLat => write_lat,
        Ours::SendLat => Spec::new(Test::SendLat, 8, "p50, RTT/2", p50, soft),
        Ours::ReadLat => read_lat,
        Ours::FetchAddLat => fadd,
        Ours::CasLat => Spec {
            atomic: AtomicOp::CmpSwap,
            what: "CAS p50, RTT",
            ..fadd
        },
        Ours::WriteBw1M => write_bw,
        Ours::WriteBw64K => Spec::new(Test::WriteBw, 64 << 10, "64 KiB average", bw, soft),
        Ours::ReadBw64K => Spec::new(Test::ReadBw, 64 << 10, "64 KiB average", bw, soft),
        Ours::ShmWriteLat => write_lat.shm(),
        Ours::ShmReadLat => read_lat.shm(),
        Ours::ShmFetchAddLat => fadd.shm(),
        Ours::ShmWriteBw1M => write_bw.shm(),
    }
}

/// Every figure of barewire's that a row sets beside something.
const ALL_OURS: [Ours; 12] = [
    Ours::WriteLat,
    Ours::SendLat,
    Ours::ReadLat,
    Ours::FetchAddLat,
    Ours::CasLat,
    Ours::WriteBw1M,
    Ours::WriteBw64K,
    Ours::ReadBw64K,
    Ours::ShmWriteLat,
    Ours::ShmReadLat,
    Ours::ShmFetchAddLat,
    Ours::ShmWriteBw1M,
];

impl Runner<'_> {
    /// barewire's figure `k` with MPA CRC on, at the start of the rep: the `crc_on` column of
    /// every row that shows `k` (`None` where there is no wire to check: shm).
    fn battery(&mut self, k: Ours) -> Option<f64> {
        let spec = spec(k);
        spec.v
            .crc_too
            .then(|| self.ours_on(spec, true)?.crc_on)
            .flatten()
    }

    /// barewire's figure `k` measured again now, right before what it is set beside (CRC off
    /// only; the CRC-on column comes from `battery`): on a host whose pace changes from one
    /// minute to the next, a pair measured minutes apart would compare two paces.
    fn adjacent(&mut self, k: Ours, battery: &[(Ours, Option<f64>)]) -> Option<Figure> {
        let mut spec = spec(k);
        spec.v.crc_too = false;
        let mut fig = self.ours_on(spec, false)?;
        fig.crc_on = battery.iter().find(|(o, _)| *o == k).and_then(|(_, c)| *c);
        Some(fig)
    }
}

fn compare_once(a: &CompareArgs, bar: &indicatif::ProgressBar) -> Comparison {
    let mut r = Runner {
        a,
        cmp: Comparison::default(),
        bar,
    };
    // The CRC-on runs first (a column, not a ratio); every row below then measures its own
    // barewire figure right before the figure it is set beside (`adjacent`).
    let battery: Vec<(Ours, Option<f64>)> = ALL_OURS.iter().map(|&k| (k, r.battery(k))).collect();
    // The io_uring data path against the raw-syscall fallback (`--reactor epoll`), back to
    // back: 8 B WRITE and READ latency, 1 MiB WRITE bandwidth, and 64 queue pairs at once
    // on 4 KiB WRITEs, where batching every queue pair into one submission should tell.
    use super::cli::Reactor;
    for k in [Ours::WriteLat, Ours::ReadLat, Ours::WriteBw1M] {
        let uring = r.adjacent(k, &battery);
        let epoll = r.ours_on(
            Spec {
                v: Variant::on(Reactor::Epoll, 1),
                ..spec(k)
            },
            false,
        );
        r.pair(&uring, epoll);
    }
    // The same with both cores asleep between messages: each Send times the wake-up of an idle
    // core on each side, through the ring and through epoll.
    let sleeping = |r: &mut Runner, reactor| {
        let v = Variant {
            sleeping: true,
            ..Variant::on(reactor, 1)
        };
        let what = "p50, RTT/2, both cores asleep between messages";
        r.ours_on(Spec::new(Test::SendLat, 8, what, p50, v), false)
    };
    let uring = sleeping(&mut r, Reactor::Auto);
    let epoll = sleeping(&mut r, Reactor::Epoll);
    r.pair(&uring, epoll);
    // The same latencies beside the floor of their own mechanism: a message over loopback TCP
    // and back with nothing else in the loop, through an io_uring as the provider uses it
    // (`floor::tcp_ping_pong`). What io_uring itself adds over the kernel's TCP round trip is
    // in that floor; what barewire adds is the rest.
    for (k, whole) in [(Ours::WriteLat, false), (Ours::ReadLat, true)] {
        let ours = r.adjacent(k, &battery);
        if ours.is_some() {
            r.bar.set_message("the io_uring TCP floor");
            let floor = ring_floor_figure(a.cpus, a.iters, whole);
            r.pair(&ours, floor);
        }
    }
    let many = |r: &mut Runner, reactor| {
        let spec = Spec::new(
            Test::WriteBw,
            4096,
            "4 KiB average, 64 queue pairs",
            bw,
            Variant::on(reactor, 64),
        );
        r.ours_on(spec, false)
    };
    let uring = many(&mut r, Reactor::Auto);
    let epoll = many(&mut r, Reactor::Epoll);
    r.pair(&uring, epoll);
    // The shm backend's 1 MiB WRITE beside a plain memcpy on one core, and its 8 B WRITE
    // beside the shared-memory floor; UCX's shared-memory transports come with the peers.
    let w = r.adjacent(Ours::ShmWriteBw1M, &battery);
    if w.is_some() {
        let copy = memcpy_figure(a.cpus[0], a.secs);
        r.pair(&w, Some(copy));
    }
    // A 64 KiB shm WRITE landing 16 bytes past its source's offset modulo 4 KiB, beside the
    // same WRITE at offset 0: where some CPUs' string copy crawls (`drivers::ops::copy_bulk`).
    let shm_64k = |remote_offset| {
        let v = Variant {
            remote_offset,
            ..Variant::SHM
        };
        Spec::new(Test::WriteBw, 64 << 10, "64 KiB average", bw, v)
    };
    let skewed = r.ours_on(shm_64k(16), false);
    let aligned = r.ours_on(shm_64k(0), false);
    r.pair(&skewed, aligned);
    let w = r.adjacent(Ours::ShmWriteLat, &battery);
    if w.is_some() {
        r.bar.set_message("the shared-memory floor");
        let floor = shm_floor_figure(a.cpus, a.iters);
        r.pair(&w, floor);
    }
    // The same WRITE beside a bare store made by the same two processes into the same pages,
    // slice about slice: both of a pair ran in one mode of the host's line trip.
    if let Some(row) = r.sliced() {
        r.cmp.rows.push(row);
    }
    let params = Params {
        iters: a.iters,
        secs: a.secs.ceil() as u64,
    };
    for tool in peers::all() {
        if crate::apt::tool(tool.tool(), tool.package()).is_err() {
            r.cmp.missing.push(Missing {
                tool: tool.tool(),
                package: tool.package(),
            });
            continue;
        }
        for run in tool.runs(&params) {
            let ours: Vec<Option<Figure>> =
                run.pairs.iter().map(|&k| r.adjacent(k, &battery)).collect();
            let fig = r.peer(tool.tool(), tool.env(), &run);
            for o in &ours {
                r.pair(o, fig.clone());
            }
        }
    }
    r.cmp
}

/// Iterations per slice in the sliced shm row for a run of `iters`: ten pairs, of at most
/// 1,000 iterations a slice (a pair then takes about a millisecond, far less than the host's
/// modes last).
fn floor_slice(iters: u64) -> u16 {
    (iters / 20).clamp(1, 1000) as u16
}

/// `memcpy` of one 1 MiB buffer into another on one pinned CPU for `secs`, as `write_bw`
/// writes the same source to the same destination again and again: what a WRITE through
/// shared memory can at best reach, one core copying every byte.
fn memcpy_figure(cpu: usize, secs: f64) -> Figure {
    let value = std::thread::scope(|s| {
        s.spawn(|| {
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
            memcpy_mib_per_sec(1 << 20, Duration::from_secs_f64(secs.max(0.2)))
        })
        .join()
        .unwrap_or(0.0)
    });
    Figure {
        tool: "memcpy".into(),
        what: "1 MiB, one core".into(),
        value,
        unit: Unit::MibPerSec,
        command: format!(
            "memcpy of a 1 MiB buffer into another on CPU {cpu} for {secs} s (in barewire-perf)"
        ),
        percentiles: Vec::new(),
        tail: None,
        crc_on: None,
    }
}

/// A byte through shared memory and back between two threads pinned to `cpus`, spinning flat
/// out, nothing else in the loop (`floor`): what the 8 B WRITE ping-pong over shm can at best
/// reach with the same wait.
fn shm_floor_figure(cpus: [usize; 2], iters: u64) -> Option<Figure> {
    let f = super::floor::shm_ping_pong(cpus, iters as usize, 0)?;
    Some(Figure {
        tool: "shm floor".into(),
        what: "a store and a spin, p50, RTT/2".into(),
        value: f.p50 / 1000.0,
        unit: Unit::Micros,
        command: format!(
            "a byte through shared memory and back between two threads on CPUs {},{}, {iters} \
             round trips (in barewire-perf; alone, at several gaps between looks: shm-floor)",
            cpus[0], cpus[1]
        ),
        percentiles: Vec::new(),
        tail: Some((f.p99 / 1000.0, f.p999 / 1000.0)),
        crc_on: None,
    })
}

/// The size of an 8-byte tagged Write's FPDU (MPA length, DDP and RDMAP control, STag,
/// tagged offset, payload, CRC field): what the io_uring TCP floor moves each way.
const FLOOR_FPDU: usize = 28;

/// A [`FLOOR_FPDU`]-byte message over loopback TCP and back between two threads pinned to
/// `cpus`, each moving it through an io_uring as the soft provider does on a polling core
/// (`floor::tcp_ping_pong`, [`TcpWay::Ring`](super::floor::TcpWay)): half the round trip, or
/// (`whole`) all of it, the floor under a request and its answer.
fn ring_floor_figure(cpus: [usize; 2], iters: u64, whole: bool) -> Option<Figure> {
    use super::floor::{tcp_ping_pong, TcpWay};
    let f = tcp_ping_pong(TcpWay::Ring, cpus, iters as usize, FLOOR_FPDU)?;
    // A half round trip's figures, or (`whole`) the round trip's: twice each.
    let times = if whole { 2.0 } else { 1.0 };
    let what = if whole {
        "28 B, p50 × 2, RTT"
    } else {
        "28 B, p50, RTT/2"
    };
    Some(Figure {
        tool: "io_uring TCP floor (a SEND and RECV looks through the ring, nothing else)".into(),
        what: what.into(),
        value: times * f.p50 / 1000.0,
        unit: Unit::Micros,
        command: format!(
            "a {FLOOR_FPDU}-byte message over loopback TCP and back between two threads on CPUs \
             {},{}, each with an io_uring set up as barewire's cores set theirs up, {iters} round \
             trips (in barewire-perf; by system calls and in two processes too: tcp-floor)",
            cpus[0], cpus[1]
        ),
        percentiles: Vec::new(),
        tail: Some((times * f.p99 / 1000.0, times * f.p999 / 1000.0)),
        crc_on: None,
    })
}

/// Copies one `block`-byte buffer into another again and again for `how_long`; MiB/s.
pub fn memcpy_mib_per_sec(block: usize, how_long: Duration) -> f64 {
    let src = vec![0x5au8; block];
    let mut dst = vec![0u8; block];
    let t = std::time::Instant::now();
    let mut bytes = 0u64;
    while t.elapsed() < how_long {
        for _ in 0..16 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            bytes += block as u64;
        }
    }
    bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::report::table;

    /// A peer run that printed a figure of zero failed: it gives no ratio (the report once showed
    /// a rep range ending in "inf" from a UCX bandwidth run that printed 0.00).
    #[test]
    fn a_figure_of_zero_is_a_failed_run_not_a_ratio() {
        fn bw(out: &str) -> crate::perf::peers::Parsed {
            crate::perf::peers::parse_ucx(out).map(|(_, _, bw)| (bw, vec![]))
        }
        let good = include_str!("peers/samples/ucx_put_bw.txt");
        assert_eq!(read_figure(bw, good).map(|f| f.0), Ok(350.80));
        let zero = "Final:                  2000     16.151   178.162   178.162        0.00       0.00        5613        5613";
        let err = read_figure(bw, zero).unwrap_err();
        assert!(err.contains("a figure of 0"), "{err}");
        assert!(read_figure(bw, "nothing")
            .unwrap_err()
            .contains("no figure"));
    }

    /// A peer whose server dies at once (its port taken, say) is reported with the server's own
    /// words, not as a client with "no figure".
    #[test]
    fn a_refused_client_says_what_its_server_said() {
        let server = [
            "sh",
            "-c",
            "echo 'bind: address already in use' >&2; exit 3",
        ];
        let client = ["sh", "-c", "echo 'connect: Connection refused'"];
        let e = client_server([0, 0], &[], &server, &client).unwrap_err();
        assert!(e.contains("refused 1 times"), "{e}");
        assert!(e.contains("exited"), "{e}");
        assert!(e.contains("address already in use"), "{e}");
        // A client that is not refused gets its output back.
        let ok = ["sh", "-c", "echo 8 1000 x x x x 5.0 y"];
        let out = client_server([0, 0], &[], &["sleep", "5"], &ok).unwrap();
        assert!(out.contains("5.0"), "{out}");
    }

    #[test]
    fn a_cpu_is_busy_by_the_share_of_its_ticks_that_were_not_idle() {
        let before = "cpu  10 0 10 100 0 0 0 0\ncpu0 5 0 5 50 0 0 0 0\ncpu1 5 0 5 50 0 0 0 0\n";
        let after = "cpu  10 0 10 100 0 0 0 0\ncpu0 95 0 5 60 0 0 0 0\ncpu1 5 0 5 140 10 0 0 0\n";
        let cpu0 = busy_fraction(before, after, 0).unwrap();
        assert!((cpu0 - 0.9).abs() < 1e-9, "{cpu0}");
        let cpu1 = busy_fraction(before, after, 1).unwrap();
        assert!(cpu1.abs() < 1e-9, "{cpu1}");
        assert_eq!(busy_fraction(before, after, 7), None, "no such CPU");
        assert_eq!(busy_fraction(before, before, 0), None, "no time passed");
    }

    #[test]
    fn reps_merge_into_medians_and_per_rep_ratios() {
        let f = |tool: &str, v: f64, tail: Option<(f64, f64)>| Figure {
            tool: tool.into(),
            what: "p50".into(),
            value: v,
            unit: Unit::Micros,
            command: String::new(),
            percentiles: vec![],
            tail,
            crc_on: None,
        };
        let rep = |ours: f64, peer: f64| {
            let mut c = Comparison::default();
            c.rows.push(Row {
                ours: f(
                    "barewire-perf write_lat",
                    ours,
                    Some((ours + 1.0, ours + 10.0)),
                ),
                peer: f("fi_pingpong", peer, None),
                ratios: vec![ours / peer],
            });
            // Its CPUs' probe: slow in proportion to the figures, for the test.
            c.host.push([Some(ours / 10.0), None]);
            c
        };
        // The second rep ran while the machine was slow: both figures moved together.
        let m = merge(vec![rep(4.0, 5.0), rep(8.0, 10.0), rep(4.2, 5.0)]);
        assert_eq!(m.rows.len(), 1);
        // Each rep's probe stays with it, in order.
        assert_eq!(
            m.host,
            [4.0, 8.0, 4.2].map(|v| [Some(v / 10.0), None]).to_vec()
        );
        let r = &m.rows[0];
        assert_eq!(r.ours.value, 4.2);
        assert_eq!(r.peer.value, 5.0);
        assert_eq!(r.ours.tail, Some((5.2, 14.2)));
        assert_eq!(r.ratios.len(), 3);
        assert!((r.ratio() - 0.8).abs() < 1e-9, "{}", r.ratio());
        assert!(
            table(&m).contains("**0.80** (reps 0.80–0.84)"),
            "{}",
            table(&m)
        );
    }
}
