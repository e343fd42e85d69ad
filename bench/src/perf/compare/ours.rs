//! One rep: barewire's own figures (the variants a test runs under, the runner that starts
//! each run and reads its figure, which run gives each figure) set beside each peer's, row by
//! row.

use super::floors::{floor_slice, memcpy_figure, ring_floor_figure, shm_floor_figure};
use super::*;

/// How a barewire figure is run beyond the defaults.
#[derive(Debug, Clone, Copy)]
struct Variant {
    reactor: crate::perf::cli::Reactor,
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
        reactor: crate::perf::cli::Reactor::Auto,
        qps: 1,
        driver: "soft",
        crc_too: true,
        remote_offset: 0,
        sleeping: false,
    };

    fn on(reactor: crate::perf::cli::Reactor, qps: u16) -> Variant {
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
        reactor: crate::perf::cli::Reactor::Auto,
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
        if self.reactor != crate::perf::cli::Reactor::Auto {
            s += &format!(
                " --reactor {}",
                crate::perf::cli::reactor_name(self.reactor)
            );
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

pub(super) fn compare_once(a: &CompareArgs, bar: &indicatif::ProgressBar) -> Comparison {
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
    use crate::perf::cli::Reactor;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer run that printed a figure of zero failed: it gives no ratio (the report once showed
    /// a rep range ending in "inf" from a UCX bandwidth run that printed 0.00).
    #[test]
    fn a_figure_of_zero_is_a_failed_run_not_a_ratio() {
        fn bw(out: &str) -> crate::perf::peers::Parsed {
            crate::perf::peers::parse_ucx(out).map(|(_, _, bw)| (bw, vec![]))
        }
        let good = include_str!("../peers/samples/ucx_put_bw.txt");
        assert_eq!(read_figure(bw, good).map(|f| f.0), Ok(350.80));
        let zero = "Final:                  2000     16.151   178.162   178.162        0.00       0.00        5613        5613";
        let err = read_figure(bw, zero).unwrap_err();
        assert!(err.contains("a figure of 0"), "{err}");
        assert!(read_figure(bw, "nothing")
            .unwrap_err()
            .contains("no figure"));
    }
}
