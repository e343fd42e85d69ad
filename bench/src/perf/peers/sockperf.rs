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

/// The whole round trip (sockperf reports half of it): the floor for a request and its
/// answer, which is what a READ or an atomic is.
fn round_trip(out: &str) -> Parsed {
    let (med, p) = median_and_percentiles(out)?;
    Some((
        2.0 * med,
        p.into_iter().map(|(q, v)| (q, 2.0 * v)).collect(),
    ))
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
        // Blocking, busy-polling, and the busy-polling run's whole round trip.
        [(false, false), (true, false), (true, true)]
            .into_iter()
            .map(|(nonblocked, whole)| {
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
                let (label, what, parse, pairs): (String, _, fn(&str) -> Parsed, &[Ours]) =
                    match (nonblocked, whole) {
                        (false, _) => (
                            "ping-pong --tcp".into(),
                            "14 B p50, RTT/2",
                            median_and_percentiles,
                            &[Ours::WriteLat],
                        ),
                        (true, false) => (
                            "ping-pong --tcp --nonblocked (busy-poll: the kernel TCP floor)".into(),
                            "14 B p50, RTT/2",
                            median_and_percentiles,
                            &[Ours::WriteLat],
                        ),
                        (true, true) => (
                            "ping-pong --tcp --nonblocked, whole round trip (the TCP floor \
                             under a request and its answer)"
                                .into(),
                            "14 B p50 × 2, RTT",
                            round_trip,
                            &[Ours::ReadLat, Ours::FetchAddLat, Ours::CasLat],
                        ),
                    };
                PeerRun {
                    label,
                    what,
                    unit: Unit::Micros,
                    server,
                    client,
                    parse,
                    pairs,
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
        let (rtt, p) = round_trip(out).unwrap();
        assert_eq!(rtt, 2.0 * 10.495);
        assert!(p.contains(&(50.0, 2.0 * 10.495)), "{p:?}");
    }
}
