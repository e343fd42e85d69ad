//! `barewire-perf compare` and `report`: barewire beside the peers installed here, run in the
//! same session on the same two pinned CPUs, in one table with ratios.
//!
//! Peers: `ucx_perftest` (UCX_TLS=tcp), `fi_pingpong -p tcp -e msg`, `qperf` tcp_lat/tcp_bw and
//! `sockperf` ping-pong (blocking, and `--nonblocked`, which busy-polls: the kernel TCP floor).
//! A peer that is not installed is reported by name with the package that provides it.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command as Process, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;

use super::cli::{AtomicOp, CompareArgs, RunArgs, Test};
use super::run;

/// What a figure measures, and so which way a ratio is good.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Microseconds (lower is better).
    Micros,
    /// MiB/s (higher is better).
    MibPerSec,
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
    /// barewire's latency tail, (p99, p99.9) in µs, medians over reps.
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
}

const PEERS: [Missing; 4] = [
    Missing {
        tool: "ucx_perftest",
        package: "ucx-utils",
    },
    Missing {
        tool: "fi_pingpong",
        package: "libfabric-bin",
    },
    Missing {
        tool: "qperf",
        package: "qperf",
    },
    Missing {
        tool: "sockperf",
        package: "sockperf",
    },
];

/// True if `tool` is on PATH.
pub fn installed(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(tool);
            f.is_file()
                && std::fs::metadata(&f)
                    .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                    .unwrap_or(false)
        })
    })
}

/// The median of a non-empty list.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs a server and a client of a peer tool, each pinned and bounded by `timeout`; returns the
/// client's output.
fn client_server(
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
    let mut srv = pinned(cpus[1], server)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("start: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let mut argv = vec!["timeout", "60"];
    argv.extend_from_slice(client);
    let out = pinned(cpus[0], &argv).output();
    // Servers that serve forever (qperf, sockperf) are stopped here; others have exited.
    std::thread::sleep(Duration::from_millis(100));
    let _ = srv.kill();
    let _ = srv.wait();
    let out = out.map_err(|e| format!("run: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Ok(text)
}

/// `Final:` line of ucx_perftest: (typical latency µs, average latency µs, average bandwidth
/// MiB/s; UCX's "MB" is 2^20 bytes).
pub fn parse_ucx(out: &str) -> Option<(f64, f64, f64)> {
    let line = out.lines().find(|l| l.contains("Final:"))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    // iterations, typical, average, overall latency, average bw, overall bw, ...
    (v.len() >= 5).then(|| (v[1], v[2], v[4]))
}

/// fi_pingpong's usec/xfer for the row of `size` bytes.
pub fn parse_fi_pingpong(out: &str, size: usize) -> Option<f64> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() >= 8 && w[0] == size.to_string())
        .and_then(|w| w[6].parse().ok())
}

/// qperf's `latency = N us` (µs) or `bw = N GB/sec` (MiB/s; qperf's units are decimal).
pub fn parse_qperf(out: &str) -> Option<f64> {
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("latency") || l.trim_start().starts_with("bw"))?;
    let mut w = line.split('=').nth(1)?.split_whitespace();
    let v: f64 = w.next()?.parse().ok()?;
    Some(match w.next()? {
        "ns" => v / 1000.0,
        "us" => v,
        "ms" => v * 1000.0,
        "sec" => v * 1e6,
        "bytes/sec" => v / 1048576.0,
        "KB/sec" => v * 1e3 / 1048576.0,
        "MB/sec" => v * 1e6 / 1048576.0,
        "GB/sec" => v * 1e9 / 1048576.0,
        _ => return None,
    })
}

/// sockperf's percentile lines: (percentile, µs), with the median among them.
pub fn parse_sockperf(out: &str) -> Vec<(f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let l = l.split("percentile").nth(1)?;
            let mut it = l.split('=');
            let p: f64 = it.next()?.trim().parse().ok()?;
            let v: f64 = it.next()?.trim().parse().ok()?;
            Some((p, v))
        })
        .collect()
}

/// Reads a peer's output: its figure and any percentiles it printed.
type PeerParser = dyn Fn(&str) -> Option<(f64, Vec<(f64, f64)>)>;

struct Runner<'a> {
    a: &'a CompareArgs,
    cmp: Comparison,
    /// Progress on stderr: the rep, what runs now, and an ETA.
    bar: &'a indicatif::ProgressBar,
}

impl Runner<'_> {
    /// barewire's own figure: the median over reps of `pick` applied to one loopback run.
    fn ours(
        &mut self,
        test: Test,
        size: usize,
        atomic: AtomicOp,
        what: &str,
        pick: fn(&run::Outcome) -> f64,
    ) -> Option<Figure> {
        self.bar
            .set_message(format!("barewire {test} {size} B ({what})"));
        let mut args = RunArgs {
            test,
            server: None,
            port: 0,
            sizes: vec![size],
            iters: self.a.iters,
            tx_depth: 128,
            duration: test.is_bw().then_some(self.a.secs),
            cpus: Some(self.a.cpus.to_vec()),
            driver: "soft".into(),
            json: true,
            loopback: true,
            crc: false,
            atomic,
            plot: None,
            announce: false,
            quiet: true,
        };
        if test.is_bw() {
            args.iters = 1;
        }
        let (mut vals, mut p99s, mut p999s, mut crc_vals) = (vec![], vec![], vec![], vec![]);
        for crc in [false, true] {
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
        (!vals.is_empty()).then(|| Figure {
            tool: format!("barewire-perf {test}"),
            what: what.into(),
            value: median(&mut vals),
            unit: if test.is_bw() {
                Unit::MibPerSec
            } else {
                Unit::Micros
            },
            command: format!(
                "barewire-perf {test} --loopback -s {size} {} --cpu {},{}",
                if test.is_bw() {
                    format!("-D {}", self.a.secs)
                } else {
                    format!("-n {}", self.a.iters)
                },
                self.a.cpus[0],
                self.a.cpus[1]
            ) + if atomic == AtomicOp::CmpSwap && test == Test::AtomicLat {
                " -A CMP_AND_SWAP"
            } else {
                ""
            },
            percentiles: Vec::new(),
            tail: (!p99s.is_empty()).then(|| (median(&mut p99s), median(&mut p999s))),
            crc_on: (!crc_vals.is_empty()).then(|| median(&mut crc_vals)),
        })
    }

    /// A peer's figure: the median over reps of what `parse` reads from the client's output.
    #[allow(clippy::too_many_arguments)]
    fn peer(
        &mut self,
        tool: &str,
        label: &str,
        what: &str,
        unit: Unit,
        env: &[(&str, &str)],
        server: &[&str],
        client: &[&str],
        parse: &PeerParser,
    ) -> Option<Figure> {
        self.bar.set_message(format!("{tool} {label} ({what})"));
        let command = env
            .iter()
            .map(|(k, v)| format!("{k}={v} "))
            .collect::<String>()
            + &client.join(" ");
        let mut vals = Vec::new();
        let mut pct = Vec::new();
        for _ in 0..self.a.reps {
            match client_server(self.a.cpus, env, server, client) {
                Ok(out) => match parse(&out) {
                    Some((v, p)) => {
                        vals.push(v);
                        if pct.is_empty() {
                            pct = p;
                        }
                    }
                    None => self.cmp.failed.push((
                        command.clone(),
                        format!(
                            "no figure in its output: {}",
                            out.lines().last().unwrap_or("")
                        ),
                    )),
                },
                Err(e) => self.cmp.failed.push((command.clone(), e)),
            }
        }
        (!vals.is_empty()).then(|| Figure {
            tool: format!("{tool} {label}"),
            what: what.into(),
            value: median(&mut vals),
            unit,
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

fn p50(o: &run::Outcome) -> f64 {
    o.lat[0].0.typical
}

fn bw(o: &run::Outcome) -> f64 {
    o.bw[0].avg
}

/// Runs barewire and every installed peer `reps` times and pairs the figures. Reps are
/// interleaved (each rep runs barewire's tests, then every peer's, once), so a figure and the
/// peer it is compared with are measured close together; figures are medians over reps and
/// each ratio is the median of the per-rep ratios.
pub fn compare(a: &CompareArgs) -> Comparison {
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
            let c = compare_once(&once, &bar);
            bar.inc(1);
            c
        })
        .collect();
    bar.finish_and_clear();
    merge(reps)
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

fn compare_once(a: &CompareArgs, bar: &indicatif::ProgressBar) -> Comparison {
    let mut r = Runner {
        a,
        cmp: Comparison::default(),
        bar,
    };
    for m in PEERS {
        if !installed(m.tool) {
            r.cmp.missing.push(m);
        }
    }
    let has = |t: &str| installed(t);
    let n = a.iters.to_string();
    let secs = format!("{}", a.secs.ceil() as u64);
    let ucx_env: &[(&str, &str)] = &[("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")];
    let fa = AtomicOp::FetchAdd;

    let write_lat = r.ours(Test::WriteLat, 8, fa, "p50, RTT/2", p50);
    let send_lat = r.ours(Test::SendLat, 8, fa, "p50, RTT/2", p50);
    let read_lat = r.ours(Test::ReadLat, 8, fa, "p50, RTT", p50);
    let fadd_lat = r.ours(Test::AtomicLat, 8, fa, "fetch-add p50, RTT", p50);
    let cas_lat = r.ours(Test::AtomicLat, 8, AtomicOp::CmpSwap, "CAS p50, RTT", p50);
    let bw_1m = r.ours(Test::WriteBw, 1 << 20, fa, "1 MiB average", bw);
    let bw_64k = r.ours(Test::WriteBw, 64 << 10, fa, "64 KiB average", bw);
    let rbw_64k = r.ours(Test::ReadBw, 64 << 10, fa, "64 KiB average", bw);

    if has("fi_pingpong") {
        let argv = |c: bool| {
            let mut v = vec!["fi_pingpong", "-p", "tcp", "-e", "msg", "-S", "8", "-I", &n];
            if c {
                v.push("127.0.0.1");
            }
            v
        };
        let f = r.peer(
            "fi_pingpong",
            "-p tcp -e msg",
            "8 B usec/xfer",
            Unit::Micros,
            &[],
            &argv(false),
            &argv(true),
            &|o| parse_fi_pingpong(o, 8).map(|v| (v, vec![])),
        );
        r.pair(&write_lat, f.clone());
        r.pair(&send_lat, f);
    }
    if has("ucx_perftest") {
        let ucx = |r: &mut Runner, t: &str, size: &str, what: &str, unit: Unit| {
            r.peer(
                "ucx_perftest",
                t,
                what,
                unit,
                ucx_env,
                &["ucx_perftest"],
                &["ucx_perftest", "127.0.0.1", "-t", t, "-s", size, "-n", &n],
                &move |o| {
                    parse_ucx(o)
                        .map(|(typ, _, bw)| (if unit == Unit::Micros { typ } else { bw }, vec![]))
                },
            )
        };
        let put = ucx(&mut r, "ucp_put_lat", "8", "8 B p50", Unit::Micros);
        r.pair(&write_lat, put);
        let get = ucx(&mut r, "ucp_get", "8", "8 B p50", Unit::Micros);
        r.pair(&read_lat, get);
        let add = ucx(&mut r, "ucp_add", "8", "8 B p50", Unit::Micros);
        r.pair(&read_lat, add.clone());
        r.pair(&fadd_lat, add.clone());
        r.pair(&cas_lat, add);
        let fadd = ucx(&mut r, "ucp_fadd", "8", "8 B p50", Unit::Micros);
        r.pair(&fadd_lat, fadd);
        let b1 = ucx(&mut r, "ucp_put_bw", "1048576", "1 MiB", Unit::MibPerSec);
        r.pair(&bw_1m, b1);
        let b64 = ucx(&mut r, "ucp_put_bw", "65536", "64 KiB", Unit::MibPerSec);
        r.pair(&bw_64k, b64.clone());
        r.pair(&rbw_64k, b64);
    }
    if has("qperf") {
        let q = |r: &mut Runner, test: &str, size: &str, what: &str, unit: Unit| {
            r.peer(
                "qperf",
                test,
                what,
                unit,
                &[],
                &["qperf"],
                &["qperf", "127.0.0.1", "-t", &secs, "-m", size, test],
                &|o| parse_qperf(o).map(|v| (v, vec![])),
            )
        };
        let lat = q(&mut r, "tcp_lat", "8", "8 B, RTT/2", Unit::Micros);
        r.pair(&write_lat, lat);
        let b = q(&mut r, "tcp_bw", "1M", "1 MiB", Unit::MibPerSec);
        r.pair(&bw_1m, b);
    }
    if has("sockperf") {
        for nonblocked in [false, true] {
            let mut srv = vec![
                "sockperf",
                "server",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                "11119",
            ];
            let mut cli = vec![
                "sockperf",
                "ping-pong",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                "11119",
                "-m",
                "14",
                "-t",
                &secs,
            ];
            if nonblocked {
                srv.push("--nonblocked");
                cli.push("--nonblocked");
            }
            let label = if nonblocked {
                "ping-pong --tcp --nonblocked (busy-poll: the kernel TCP floor)"
            } else {
                "ping-pong --tcp"
            };
            let f = r.peer(
                "sockperf",
                label,
                "14 B p50, RTT/2",
                Unit::Micros,
                &[],
                &srv,
                &cli,
                &|o| {
                    let p = parse_sockperf(o);
                    let med = p.iter().find(|(q, _)| *q == 50.0)?.1;
                    Some((med, p))
                },
            );
            r.pair(&write_lat, f);
        }
    }
    r.cmp
}

/// The comparison as a Markdown table, with the missing peers and failures after it.
pub fn table(c: &Comparison) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| barewire test | barewire (CRC off) | p99 / p99.9 | CRC on | peer | peer figure | barewire ÷ peer |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for r in &c.rows {
        let fmt_v = |v: f64, u: Unit| match u {
            Unit::Micros => format!("{v:.2} µs"),
            Unit::MibPerSec => format!("{v:.0} MiB/s"),
        };
        let fmt = |f: &Figure| fmt_v(f.value, f.unit);
        let _ = writeln!(
            s,
            "| {} ({}) | {} | {} | {} | {} ({}) | {} | **{:.2}**{} {} |",
            r.ours.tool.trim_start_matches("barewire-perf "),
            r.ours.what,
            fmt(&r.ours),
            r.ours
                .tail
                .map_or("–".into(), |(a, b)| format!("{a:.2} / {b:.2} µs")),
            r.ours.crc_on.map_or("–".into(), |v| fmt_v(v, r.ours.unit)),
            r.peer.tool,
            r.peer.what,
            fmt(&r.peer),
            r.ratio(),
            if r.ratios.len() > 1 {
                let lo = r.ratios.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = r.ratios.iter().copied().fold(0.0, f64::max);
                format!(" (reps {lo:.2}–{hi:.2})")
            } else {
                String::new()
            },
            if r.ours.unit == Unit::Micros {
                "(lower is better)"
            } else {
                "(higher is better)"
            }
        );
    }
    for m in &c.missing {
        let _ = writeln!(
            s,
            "\nMISSING peer: {} is not installed (apt-get install {}); its rows are absent.",
            m.tool, m.package
        );
    }
    for (cmd, why) in &c.failed {
        let _ = writeln!(s, "\nFAILED: `{cmd}`: {why}");
    }
    s
}

/// The command lines behind every figure.
pub fn commands(c: &Comparison) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for r in &c.rows {
        for f in [&r.ours, &r.peer] {
            if !seen.contains(&f.command.as_str()) {
                seen.push(&f.command);
            }
        }
    }
    seen.iter().map(|c| format!("    {c}\n")).collect()
}

const BEGIN: &str = "<!-- barewire-perf report: begin (generated; edit outside the markers) -->";
const END: &str = "<!-- barewire-perf report: end -->";

/// Writes the generated section into `path`, between its markers (or after the first
/// paragraph when it has none), keeping everything else.
pub fn write_report(path: &Path, a: &CompareArgs, c: &Comparison) -> Result<(), String> {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let date = Process::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let mut sec = String::new();
    let _ = writeln!(sec, "{BEGIN}\n");
    let _ = writeln!(sec, "## Latest `barewire-perf report` ({date})\n");
    let _ = writeln!(
        sec,
        "Machine: {cores} CPUs ({cpu}), Linux {kernel}. Client on CPU {}, server on CPU {}; \
         {} reps in this one session, interleaved (each rep runs barewire's tests, then every \
         peer's, once); every figure is the median over the reps, and each ratio the median of \
         the per-rep ratios, so a change of pace on this shared machine between reps does not \
         pair a fast run with a slow one. barewire's figures are with MPA CRC32c off (as siw's default; the targets' \
         setting), its CRC-on runs beside them (the same command with `--crc`), and its latency \
         tails are the medians of each run's p99 and p99.9. \
         Regenerate with:\n\n    cargo run --release -p barewire-bench --bin barewire-perf -- report --reps {} -n {} -D {}{}\n",
        a.cpus[0],
        a.cpus[1],
        a.reps,
        a.reps,
        a.iters,
        a.secs,
        a.plot
            .as_ref()
            .map(|p| format!(" --plot {}", p.display()))
            .unwrap_or_default()
    );
    sec.push_str(&table(c));
    if let Some(plot) = &a.plot {
        // A link relative to the results file when the plot sits beside it.
        let base = path.parent().unwrap_or(Path::new(""));
        let rel = plot.strip_prefix(base).unwrap_or(plot);
        let _ = writeln!(
            sec,
            "\nLatency distributions (HDR percentile plot): ![8 B latency]({})",
            rel.display()
        );
    }
    let _ = writeln!(sec, "\nCommand lines:\n");
    sec.push_str(&commands(c));
    let _ = writeln!(sec, "\n{END}");
    let old = std::fs::read_to_string(path).unwrap_or_else(|_| "# Benchmark results\n".into());
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => format!("{}{}{}", &old[..b], sec, &old[e + END.len()..]),
        _ => {
            // After the title and its first paragraph.
            let at = old
                .match_indices("\n\n")
                .nth(1)
                .map_or(old.len(), |(i, _)| i + 2);
            format!("{}{}\n{}", &old[..at], sec, &old[at..])
        }
    };
    std::fs::write(path, new).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_outputs_parse() {
        let ucx = "+----\n                   20000      5.590     5.700     5.700        1.34       1.34      175439     175439\nFinal:                 20000      5.590     5.712     5.712        1.34       1.34      175074     175074\n";
        assert_eq!(parse_ucx(ucx), Some((5.59, 5.712, 1.34)));
        let fi = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n8       20k     20k      312k        0.22s      1.43       5.48        0.18\n";
        assert_eq!(parse_fi_pingpong(fi, 8), Some(5.48));
        assert_eq!(parse_qperf("tcp_lat:\n    latency  =  41 us\n"), Some(41.0));
        let bw = parse_qperf("tcp_bw:\n    bw  =  4.84 GB/sec\n").unwrap();
        assert!((bw - 4615.8).abs() < 0.1, "{bw}");
        let sp = "sockperf: ---> percentile 99.000 =    5.010\nsockperf: ---> percentile 50.000 =    4.076\n";
        assert_eq!(parse_sockperf(sp), vec![(99.0, 5.01), (50.0, 4.076)]);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn the_table_reports_ratios_and_missing_peers() {
        let f = |tool: &str, v: f64| Figure {
            tool: tool.into(),
            what: "p50".into(),
            value: v,
            unit: Unit::Micros,
            command: format!("{tool} -x"),
            percentiles: vec![],
            tail: None,
            crc_on: None,
        };
        let c = Comparison {
            rows: vec![Row {
                ours: Figure {
                    tail: Some((5.5, 20.25)),
                    crc_on: Some(4.5),
                    ..f("barewire-perf write_lat", 4.0)
                },
                peer: f("fi_pingpong", 5.0),
                ratios: vec![],
            }],
            missing: vec![PEERS[0].clone()],
            failed: vec![],
            write_lat: None,
        };
        let t = table(&c);
        assert!(
            t.contains(
                "| write_lat (p50) | 4.00 µs | 5.50 / 20.25 µs | 4.50 µs | fi_pingpong (p50) | 5.00 µs | **0.80**"
            ),
            "{t}"
        );
        assert!(
            t.contains("MISSING peer: ucx_perftest is not installed (apt-get install ucx-utils)")
        );
        assert_eq!(
            commands(&c),
            "    barewire-perf write_lat -x\n    fi_pingpong -x\n"
        );
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
            c
        };
        // The second rep ran while the machine was slow: both figures moved together.
        let m = merge(vec![rep(4.0, 5.0), rep(8.0, 10.0), rep(4.2, 5.0)]);
        assert_eq!(m.rows.len(), 1);
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

    #[test]
    fn the_report_replaces_only_its_section() {
        let dir = std::env::temp_dir().join(format!("bwperf-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("RESULTS.md");
        std::fs::write(&p, "# Benchmark results\n\nIntro.\n\n## Older\n\nkept\n").unwrap();
        let a = CompareArgs {
            reps: 1,
            iters: 10,
            secs: 1.0,
            plot: None,
            results: Some(p.clone()),
            cpus: [0, 1],
        };
        write_report(&p, &a, &Comparison::default()).unwrap();
        write_report(&p, &a, &Comparison::default()).unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert_eq!(s.matches(BEGIN).count(), 1, "{s}");
        assert!(
            s.starts_with("# Benchmark results\n\nIntro.\n\n<!--"),
            "{s}"
        );
        assert!(s.contains("## Older\n\nkept"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}
