//! Results in perftest's columns and units (MiB = 2^20 bytes), or as JSON lines.

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// One line of `barewire-perf --json`: the test's name and one row, flattened into one
/// object.
///
/// Latency rows (`*_lat`): `{"test", "bytes", "iterations", "t_min_us", "t_max_us",
/// "t_typical_us" (the median), "t_avg_us", "t_stdev_us", "p99_us", "p99_9_us"}`, times in
/// microseconds (RTT/2 for `write_lat` and `send_lat`, as perftest). Bandwidth rows (`*_bw`):
/// `{"test", "bytes", "iterations", "bw_peak_mib_s", "bw_avg_mib_s", "msg_rate_mpps"}`, MiB =
/// 2^20 bytes.
///
/// ```
/// use barewire_bench::perf::table::{BwRow, Record};
/// let row = BwRow { bytes: 65536, iters: 5000, peak: 4000.5, avg: 3500.25, mpps: 0.056 };
/// let line = row.json("write_bw");
/// let back: Record<BwRow> = serde_json::from_str(&line).unwrap();
/// assert_eq!((back.test.as_str(), back.row), ("write_bw", row));
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record<R> {
    /// The test's name (`write_lat`, ...).
    pub test: String,
    /// Its figures.
    #[serde(flatten)]
    pub row: R,
}

fn record<R: Serialize + Clone>(test: &str, row: &R) -> String {
    serde_json::to_string(&Record {
        test: test.to_string(),
        row: row.clone(),
    })
    .expect("a row of numbers serializes")
}

/// perftest's latency header.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// perftest's bandwidth header.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";

/// The rule perftest prints around its tables.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// One latency result: a histogram of nanoseconds per iteration (already halved for RTT/2
/// tests). Its JSON names are [`Record`]'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LatRow {
    /// Message size.
    pub bytes: usize,
    /// Iterations measured.
    #[serde(rename = "iterations")]
    pub iters: u64,
    /// Fastest, in µs.
    #[serde(rename = "t_min_us")]
    pub min: f64,
    /// Slowest, in µs.
    #[serde(rename = "t_max_us")]
    pub max: f64,
    /// The median (perftest's "typical"), in µs.
    #[serde(rename = "t_typical_us")]
    pub typical: f64,
    /// Mean, in µs.
    #[serde(rename = "t_avg_us")]
    pub avg: f64,
    /// Standard deviation, in µs.
    #[serde(rename = "t_stdev_us")]
    pub stdev: f64,
    /// 99th percentile, in µs.
    #[serde(rename = "p99_us")]
    pub p99: f64,
    /// 99.9th percentile, in µs.
    #[serde(rename = "p99_9_us")]
    pub p999: f64,
}

impl LatRow {
    /// Summarises a histogram of nanoseconds.
    pub fn from_histogram(bytes: usize, h: &Histogram<u64>) -> LatRow {
        let us = |ns: f64| ns / 1000.0;
        LatRow {
            bytes,
            iters: h.len(),
            min: us(h.min() as f64),
            max: us(h.max() as f64),
            typical: us(h.value_at_quantile(0.5) as f64),
            avg: us(h.mean()),
            stdev: us(h.stdev()),
            p99: us(h.value_at_quantile(0.99) as f64),
            p999: us(h.value_at_quantile(0.999) as f64),
        }
    }

    /// The row under [`LAT_HEADER`].
    pub fn line(&self) -> String {
        format!(
            " {:<7} {:<10}    {:<7.2}        {:<7.2}      {:<7.2}          {:<7.2}        {:<7.2}          {:<7.2}                {:<7.2}",
            self.bytes, self.iters, self.min, self.max, self.typical, self.avg, self.stdev, self.p99, self.p999
        )
    }

    /// One JSON object (a [`Record`]).
    pub fn json(&self, test: &str) -> String {
        record(test, self)
    }
}

/// One bandwidth result. Its JSON names are [`Record`]'s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BwRow {
    /// Message size.
    pub bytes: usize,
    /// Messages completed.
    #[serde(rename = "iterations")]
    pub iters: u64,
    /// The best 10 ms window, MiB/s.
    #[serde(rename = "bw_peak_mib_s")]
    pub peak: f64,
    /// Over the whole run, MiB/s.
    #[serde(rename = "bw_avg_mib_s")]
    pub avg: f64,
    /// Millions of messages per second over the whole run.
    #[serde(rename = "msg_rate_mpps")]
    pub mpps: f64,
}

impl BwRow {
    /// The row under [`BW_HEADER`].
    pub fn line(&self) -> String {
        format!(
            " {:<10} {:<10}       {:<10.2}          {:<10.2}            {:.6}",
            self.bytes, self.iters, self.peak, self.avg, self.mpps
        )
    }

    /// One JSON object (a [`Record`]).
    pub fn json(&self, test: &str) -> String {
        record(test, self)
    }
}

/// Parses a row printed by [`LatRow::line`] (nine numeric columns) or [`BwRow::line`] (five).
/// Used by the tests and by anything that reads barewire-perf's output back.
pub fn parse_row(line: &str) -> Option<Vec<f64>> {
    let v: Vec<f64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (v.len() == 9 || v.len() == 5).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_rows_follow_perftest_columns() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        for ns in [1000, 2000, 3000, 4000, 100_000] {
            h.record(ns).unwrap();
        }
        let r = LatRow::from_histogram(8, &h);
        assert_eq!((r.bytes, r.iters), (8, 5));
        assert_eq!(r.min, 1.0);
        assert!((r.typical - 3.0).abs() < 0.01, "{r:?}");
        assert!((r.max - 100.0).abs() < 0.1, "{r:?}");
        assert!((r.avg - 22.0).abs() < 0.1, "{r:?}");
        let v = parse_row(&r.line()).unwrap();
        assert_eq!(v.len(), 9);
        assert_eq!(
            (v[0], v[1], v[2], v[4]),
            (8.0, 5.0, 1.0, 3.0),
            "two decimals"
        );
        assert_eq!(LAT_HEADER.split("[usec]").count(), 8, "seven µs columns");
        let back: Record<LatRow> = serde_json::from_str(&r.json("write_lat")).unwrap();
        assert_eq!((back.test.as_str(), &back.row), ("write_lat", &r));
        let v: serde_json::Value = serde_json::from_str(&r.json("write_lat")).unwrap();
        for k in [
            "test",
            "bytes",
            "iterations",
            "t_min_us",
            "t_max_us",
            "t_typical_us",
            "t_avg_us",
            "t_stdev_us",
            "p99_us",
            "p99_9_us",
        ] {
            assert!(v.get(k).is_some(), "{k} missing from {v}");
        }
        // A name that needs escaping stays a string.
        let odd: Record<LatRow> = serde_json::from_str(&r.json("a\"b\\c")).unwrap();
        assert_eq!(odd.test, "a\"b\\c");
    }

    #[test]
    fn bandwidth_rows_follow_perftest_columns() {
        let r = BwRow {
            bytes: 65536,
            iters: 5000,
            peak: 4000.5,
            avg: 3500.25,
            mpps: 0.056004,
        };
        let v = parse_row(&r.line()).unwrap();
        assert_eq!(v, vec![65536.0, 5000.0, 4000.5, 3500.25, 0.056004]);
        assert!(BW_HEADER.contains("BW peak[MiB/sec]") && BW_HEADER.contains("MsgRate[Mpps]"));
        assert!(parse_row(BW_HEADER).is_none());
        let v: serde_json::Value = serde_json::from_str(&r.json("write_bw")).unwrap();
        assert_eq!(v["bw_avg_mib_s"], 3500.25);
        assert_eq!(v["msg_rate_mpps"], 0.056004);
        let back: Record<BwRow> = serde_json::from_str(&r.json("write_bw")).unwrap();
        assert_eq!(back.row, r);
    }
}
