//! `redis-server` and `redis-benchmark`: the key-value peer of distributed shared memory
//! (`dsm-bench`). GET and INCR from one client (p50), GET from 50 clients (requests/s).

use super::{argv, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// `redis-benchmark` against a `redis-server` started for the run.
pub struct Redis;

/// The port the runs' server listens on (one server at a time).
const PORT: &str = "16379";

/// `redis-benchmark --csv` rows: (test, requests/s, p50 in µs).
pub fn parse_redis_csv(out: &str) -> Vec<(String, f64, f64)> {
    out.lines()
        .filter_map(|l| {
            let mut cols = l.split(',').map(|c| c.trim().trim_matches('"'));
            let test = cols.next()?.to_string();
            // "rps","avg_latency_ms","min_latency_ms","p50_latency_ms",...
            let f: Vec<f64> = cols.filter_map(|c| c.parse().ok()).collect();
            (f.len() >= 4).then(|| (test, f[0], f[3] * 1e3))
        })
        .collect()
}

fn p50(out: &str) -> Parsed {
    let (_, _, p50) = parse_redis_csv(out).into_iter().next()?;
    Some((p50, Vec::new()))
}

fn k_per_sec(out: &str) -> Parsed {
    let (_, rps, _) = parse_redis_csv(out).into_iter().next()?;
    Some((rps / 1e3, Vec::new()))
}

impl Peer for Redis {
    fn tool(&self) -> &'static str {
        "redis-benchmark"
    }
    fn package(&self) -> &'static str {
        "redis-server redis-tools"
    }
    /// GET p50 and INCR p50 with one client (`p.iters` requests), GET with 50 clients (ten
    /// times as many requests).
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let server = argv(&[
            "redis-server",
            "--port",
            PORT,
            "--save",
            "",
            "--appendonly",
            "no",
            "--bind",
            "127.0.0.1",
        ]);
        let client = |clients: u32, n: u64, test: &str| {
            argv(&[
                "redis-benchmark",
                "-p",
                PORT,
                "-c",
                &clients.to_string(),
                "-n",
                &n.to_string(),
                "-t",
                test,
                "--csv",
            ])
        };
        let run = |label: &str, what, unit, client, parse: fn(&str) -> Parsed| PeerRun {
            label: label.into(),
            what,
            unit,
            server: server.clone(),
            client,
            parse,
            pairs: &[],
        };
        vec![
            run(
                "GET, 1 client",
                "p50",
                Unit::Micros,
                client(1, p.iters, "get"),
                p50,
            ),
            run(
                "INCR, 1 client",
                "p50",
                Unit::Micros,
                client(1, p.iters, "incr"),
                p50,
            ),
            run(
                "GET, 50 clients",
                "requests",
                Unit::KPerSec,
                client(50, 10 * p.iters, "get"),
                k_per_sec,
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_real_redis_benchmark_csv() {
        // redis-benchmark 7.0.15 (Debian 12), --csv, on loopback.
        let one = include_str!("samples/redis_benchmark_c1.csv");
        assert_eq!(
            parse_redis_csv(one),
            vec![
                ("GET".to_string(), 7843.14, 71.0),
                ("INCR".to_string(), 6993.01, 71.0)
            ]
        );
        assert_eq!(p50(one).map(|p| p.0), Some(71.0));
        let fifty = include_str!("samples/redis_benchmark_c50.csv");
        assert_eq!(k_per_sec(fifty).map(|p| p.0), Some(31.69572));
        assert_eq!(p50("Could not connect to Redis at 127.0.0.1:16379\n"), None);
    }

    #[test]
    fn runs_name_their_commands() {
        let runs = Redis.runs(&Params {
            iters: 100,
            secs: 1,
        });
        assert_eq!(runs.len(), 3);
        assert!(runs[2]
            .client
            .join(" ")
            .contains("-c 50 -n 1000 -t get --csv"));
        assert!(runs.iter().all(|r| r.server[0] == "redis-server"));
    }
}
