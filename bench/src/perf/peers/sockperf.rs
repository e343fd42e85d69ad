//! `sockperf` ping-pong over TCP on loopback, blocking and `--nonblocked` (which busy-polls:
//! the kernel's TCP floor).

use super::{argv, Ours, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// `sockperf`.
pub struct Sockperf;

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

fn median_and_percentiles(out: &str) -> Parsed {
    let p = parse_sockperf(out);
    let med = p.iter().find(|(q, _)| *q == 50.0)?.1;
    Some((med, p))
}

impl Peer for Sockperf {
    fn tool(&self) -> &'static str {
        "sockperf"
    }
    fn package(&self) -> &'static str {
        "sockperf"
    }
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let secs = p.secs.to_string();
        [false, true]
            .into_iter()
            .map(|nonblocked| {
                let common = ["--tcp", "-i", "127.0.0.1", "-p", "11119"];
                let mut server = argv(&["sockperf", "server"]);
                server.extend(argv(&common));
                let mut client = argv(&["sockperf", "ping-pong"]);
                client.extend(argv(&common));
                client.extend(argv(&["-m", "14", "-t", &secs]));
                if nonblocked {
                    server.push("--nonblocked".into());
                    client.push("--nonblocked".into());
                }
                PeerRun {
                    label: if nonblocked {
                        "ping-pong --tcp --nonblocked (busy-poll: the kernel TCP floor)".into()
                    } else {
                        "ping-pong --tcp".into()
                    },
                    what: "14 B p50, RTT/2",
                    unit: Unit::Micros,
                    server,
                    client,
                    parse: median_and_percentiles,
                    pairs: &[Ours::WriteLat],
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_percentiles_of_real_output() {
        // sockperf 3.7 (Debian 12), ping-pong --tcp -m 14 -t 1 on loopback, under load.
        let out = include_str!("samples/sockperf.txt");
        let p = parse_sockperf(out);
        assert_eq!(p.first(), Some(&(99.999, 875.569)));
        assert!(p.contains(&(50.0, 10.495)), "{p:?}");
        assert_eq!(p.len(), 8, "{p:?}");
        assert_eq!(median_and_percentiles(out).map(|m| m.0), Some(10.495));
        assert_eq!(median_and_percentiles("sockperf: no figures\n"), None);
    }
}
