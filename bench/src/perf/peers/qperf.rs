//! `qperf` tcp_lat and tcp_bw on loopback.

use super::{argv, Ours, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// `qperf`.
pub struct Qperf;

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

fn figure(out: &str) -> Parsed {
    parse_qperf(out).map(|v| (v, vec![]))
}

impl Peer for Qperf {
    fn tool(&self) -> &'static str {
        "qperf"
    }
    fn package(&self) -> &'static str {
        "qperf"
    }
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let secs = p.secs.to_string();
        let run = |test: &str, size: &str, what, unit, pairs| PeerRun {
            label: test.to_string(),
            what,
            unit,
            server: argv(&["qperf"]),
            client: argv(&["qperf", "127.0.0.1", "-t", &secs, "-m", size, test]),
            parse: figure,
            pairs,
        };
        vec![
            run(
                "tcp_lat",
                "8",
                "8 B, RTT/2",
                Unit::Micros,
                &[Ours::WriteLat],
            ),
            run("tcp_bw", "1M", "1 MiB", Unit::MibPerSec, &[Ours::WriteBw1M]),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_real_latency_and_bandwidth_output() {
        // qperf 0.4.11 (Debian 12) on loopback, -t 1, under load.
        assert_eq!(
            parse_qperf(include_str!("samples/qperf_lat.txt")),
            Some(13.5)
        );
        let bw = parse_qperf(include_str!("samples/qperf_bw.txt")).unwrap();
        assert!((bw - 2.07e9 / 1048576.0).abs() < 0.01, "{bw}");
        assert_eq!(parse_qperf("tcp_lat:\n    latency  =  41 parsecs\n"), None);
    }
}
