//! UCX's `ucx_perftest` over TCP on loopback (`UCX_TLS=tcp`): put latency, get, the
//! non-fetching and fetching add, and put bandwidth.

use super::{argv, Ours, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// `ucx_perftest`.
pub struct UcxPerftest;

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

fn latency(out: &str) -> Parsed {
    parse_ucx(out).map(|(typical, _, _)| (typical, vec![]))
}

fn bandwidth(out: &str) -> Parsed {
    parse_ucx(out).map(|(_, _, bw)| (bw, vec![]))
}

/// One `ucx_perftest` run: `test` with messages of `size` bytes, named `test` + `label`.
fn run(
    p: &Params,
    test: &str,
    label: &str,
    size: &str,
    what: &'static str,
    unit: Unit,
    pairs: &'static [Ours],
) -> PeerRun {
    PeerRun {
        label: format!("{test}{label}"),
        what,
        unit,
        server: argv(&["ucx_perftest"]),
        client: argv(&[
            "ucx_perftest",
            "127.0.0.1",
            "-t",
            test,
            "-s",
            size,
            "-n",
            &p.iters.to_string(),
        ]),
        parse: if unit == Unit::Micros {
            latency
        } else {
            bandwidth
        },
        pairs,
    }
}

impl Peer for UcxPerftest {
    fn tool(&self) -> &'static str {
        "ucx_perftest"
    }
    fn package(&self) -> &'static str {
        "ucx-utils"
    }
    fn env(&self) -> &'static [(&'static str, &'static str)] {
        &[("UCX_TLS", "tcp"), ("UCX_NET_DEVICES", "lo")]
    }
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let run = |test, size, what, unit, pairs| run(p, test, "", size, what, unit, pairs);
        vec![
            run(
                "ucp_put_lat",
                "8",
                "8 B p50",
                Unit::Micros,
                &[Ours::WriteLat],
            ),
            run("ucp_get", "8", "8 B p50", Unit::Micros, &[Ours::ReadLat]),
            run(
                "ucp_add",
                "8",
                "8 B p50",
                Unit::Micros,
                &[Ours::ReadLat, Ours::FetchAddLat, Ours::CasLat],
            ),
            run(
                "ucp_fadd",
                "8",
                "8 B p50",
                Unit::Micros,
                &[Ours::FetchAddLat],
            ),
            run(
                "ucp_put_bw",
                "1048576",
                "1 MiB",
                Unit::MibPerSec,
                &[Ours::WriteBw1M],
            ),
            run(
                "ucp_put_bw",
                "65536",
                "64 KiB",
                Unit::MibPerSec,
                &[Ours::WriteBw64K, Ours::ReadBw64K],
            ),
        ]
    }
}

/// `ucx_perftest` over UCX's shared-memory transports (`UCX_TLS=posix,sysv,cma,self`), beside
/// barewire's shm backend.
pub struct UcxShm;

impl Peer for UcxShm {
    fn tool(&self) -> &'static str {
        "ucx_perftest"
    }
    fn package(&self) -> &'static str {
        "ucx-utils"
    }
    fn env(&self) -> &'static [(&'static str, &'static str)] {
        &[("UCX_TLS", "posix,sysv,cma,self")]
    }
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let run = |test, size, what, unit, pairs| {
            run(p, test, " (shared memory)", size, what, unit, pairs)
        };
        vec![
            run(
                "ucp_put_lat",
                "8",
                "8 B p50",
                Unit::Micros,
                &[Ours::ShmWriteLat],
            ),
            run("ucp_get", "8", "8 B p50", Unit::Micros, &[Ours::ShmReadLat]),
            run(
                "ucp_fadd",
                "8",
                "8 B p50",
                Unit::Micros,
                &[Ours::ShmFetchAddLat],
            ),
            run(
                "ucp_put_bw",
                "1048576",
                "1 MiB",
                Unit::MibPerSec,
                &[Ours::ShmWriteBw1M],
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_final_line_of_real_output() {
        // ucx_perftest 1.13 (Debian 12), UCX_TLS=tcp on loopback, under load.
        let lat = include_str!("samples/ucx_put_lat.txt");
        assert_eq!(parse_ucx(lat), Some((17.698, 139.708, 0.05)));
        assert_eq!(latency(lat), Some((17.698, vec![])));
        let bw = include_str!("samples/ucx_put_bw.txt");
        let (_, _, mib) = parse_ucx(bw).unwrap();
        assert_eq!(bandwidth(bw), Some((mib, vec![])));
        assert!(mib > 1.0, "{mib}");
        assert_eq!(parse_ucx("no final line\n"), None);
    }
}
