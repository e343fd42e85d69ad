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

mod floors;
mod ours;

pub use floors::memcpy_mib_per_sec;
use ours::compare_once;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::report::table;

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
