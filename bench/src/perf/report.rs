//! `barewire-perf report` and `compare`'s output: the comparison as a Markdown table, the
//! command lines behind it, and the generated section of `bench/RESULTS.md`. Nothing here runs
//! anything.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command as Process;

use super::cli::CompareArgs;
use super::compare::{Comparison, Figure, Unit};

/// A time in µs: two decimals, or three below a microsecond (shared-memory figures are tens of
/// nanoseconds, where the second decimal alone is a step of 10 ns).
fn micros(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.2}")
    }
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
            Unit::Micros => format!("{} µs", micros(v)),
            Unit::MibPerSec => format!("{v:.0} MiB/s"),
            Unit::KPerSec => format!("{v:.1} k/s"),
        };
        let fmt = |f: &Figure| fmt_v(f.value, f.unit);
        // A peer's tail, where barewire-perf measured the peer itself (the floors, and barewire
        // on the epoll fallback).
        let peer_fig = match r.peer.tail {
            Some((a, b)) if r.ours.tail.is_some() => {
                format!(
                    "{} (p99 / p99.9 {} / {} µs)",
                    fmt(&r.peer),
                    micros(a),
                    micros(b)
                )
            }
            _ => fmt(&r.peer),
        };
        let _ = writeln!(
            s,
            "| {} ({}) | {} | {} | {} | {} ({}) | {} | **{:.2}**{} {} |",
            r.ours.tool.trim_start_matches("barewire-perf "),
            r.ours.what,
            fmt(&r.ours),
            r.ours.tail.map_or("–".into(), |(a, b)| format!(
                "{} / {} µs",
                micros(a),
                micros(b)
            )),
            r.ours.crc_on.map_or("–".into(), |v| fmt_v(v, r.ours.unit)),
            r.peer.tool,
            r.peer.what,
            peer_fig,
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
    if !c.host.is_empty() {
        let share = |v: Option<f64>| v.map_or("–".into(), |v| format!("{:.1}%", v * 100.0));
        let reps: Vec<String> = c
            .host
            .iter()
            .enumerate()
            .map(|(i, [a, b])| format!("rep {} {} / {}", i + 1, share(*a), share(*b)))
            .collect();
        let _ = writeln!(
            s,
            "\nThe host's CPUs just before each rep, client's / server's: the share of {} \
             samples of one fixed piece of work that took over {}× the fast state's time \
             (`barewire_bench::perf::host`; a rep whose CPUs ran slow reads slow): {}.",
            super::host::SAMPLES,
            super::host::SLOW_OVER,
            reps.join(", ")
        );
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
         {} reps in this one session, interleaved (each rep runs every peer once, and each row's \
         barewire test again right before the figure it is set beside, seconds apart); every \
         figure is the median over the reps, and each ratio the median of the per-rep ratios, so \
         a change of pace on this shared machine does not pair a fast run with a slow one. \
         barewire's figures are with MPA CRC32c off (as siw's default; the targets' setting), \
         its CRC-on runs beside them (the same command with `--crc`, once per rep), and its \
         latency tails are the medians of each run's p99 and p99.9; so are the tails given \
         beside the peers that barewire-perf measures itself (the floors, the epoll fallback). \
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
        // The section ends with its own line break: the one after the old marker goes.
        (Some(b), Some(e)) if e > b => {
            let rest = &old[e + END.len()..];
            format!(
                "{}{}{}",
                &old[..b],
                sec,
                rest.strip_prefix('\n').unwrap_or(rest)
            )
        }
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
    use crate::perf::compare::{Missing, Row};

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
        let ours = Figure {
            tail: Some((5.5, 20.25)),
            crc_on: Some(4.5),
            ..f("barewire-perf write_lat", 4.0)
        };
        let c = Comparison {
            rows: vec![
                Row {
                    ours: ours.clone(),
                    peer: f("fi_pingpong", 5.0),
                    ratios: vec![],
                },
                // A floor barewire-perf measures itself comes with its tail.
                Row {
                    ours,
                    peer: Figure {
                        tail: Some((4.75, 18.5)),
                        ..f("floor", 3.2)
                    },
                    ratios: vec![],
                },
            ],
            missing: vec![Missing {
                tool: "ucx_perftest",
                package: "ucx-utils",
            }],
            failed: vec![],
            write_lat: None,
            host: vec![[Some(0.004), Some(0.5)], [None, Some(0.0)]],
        };
        let t = table(&c);
        assert!(
            t.contains(
                "| write_lat (p50) | 4.00 µs | 5.50 / 20.25 µs | 4.50 µs | fi_pingpong (p50) | 5.00 µs | **0.80**"
            ),
            "{t}"
        );
        assert!(
            t.contains("| floor (p50) | 3.20 µs (p99 / p99.9 4.75 / 18.50 µs) | **1.25**"),
            "{t}"
        );
        assert!(
            t.contains("MISSING peer: ucx_perftest is not installed (apt-get install ucx-utils)")
        );
        // Each rep's probe of the two CPUs, in order; a CPU not probed is a dash.
        assert!(
            t.contains("200000 samples") && t.contains(": rep 1 0.4% / 50.0%, rep 2 – / 0.0%."),
            "{t}"
        );
        assert!(!table(&Comparison::default()).contains("just before each rep"));
        assert_eq!(
            (micros(0.0156), micros(4.0)),
            ("0.016".into(), "4.00".into())
        );
        assert_eq!(
            commands(&c),
            "    barewire-perf write_lat -x\n    fi_pingpong -x\n    floor -x\n"
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
        let after = &s[s.find(END).unwrap() + END.len()..];
        assert_eq!(
            after, "\n\n## Older\n\nkept\n",
            "rewrites add no blank lines"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}
