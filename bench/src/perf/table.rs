//! Results in perftest's columns and units (MiB = 2^20 bytes), or as JSON lines.

use hdrhistogram::Histogram;

/// perftest's latency header.
pub const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// perftest's bandwidth header.
pub const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";

/// The rule perftest prints around its tables.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// One latency result: a histogram of nanoseconds per iteration (already halved for RTT/2
/// tests).
#[derive(Debug, Clone, PartialEq)]
pub struct LatRow {
    /// Message size.
    pub bytes: usize,
    /// Iterations measured.
    pub iters: u64,
    /// Fastest, in µs.
    pub min: f64,
    /// Slowest, in µs.
    pub max: f64,
    /// The median (perftest's "typical"), in µs.
    pub typical: f64,
    /// Mean, in µs.
    pub avg: f64,
    /// Standard deviation, in µs.
    pub stdev: f64,
    /// 99th percentile, in µs.
    pub p99: f64,
    /// 99.9th percentile, in µs.
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

    /// One JSON object.
    pub fn json(&self, test: &str) -> String {
        format!(
            "{{\"test\":\"{test}\",\"bytes\":{},\"iterations\":{},\"t_min_us\":{:.3},\"t_max_us\":{:.3},\"t_typical_us\":{:.3},\"t_avg_us\":{:.3},\"t_stdev_us\":{:.3},\"p99_us\":{:.3},\"p99_9_us\":{:.3}}}",
            self.bytes, self.iters, self.min, self.max, self.typical, self.avg, self.stdev, self.p99, self.p999
        )
    }
}

/// One bandwidth result.
#[derive(Debug, Clone, PartialEq)]
pub struct BwRow {
    /// Message size.
    pub bytes: usize,
    /// Messages completed.
    pub iters: u64,
    /// The best 10 ms window, MiB/s.
    pub peak: f64,
    /// Over the whole run, MiB/s.
    pub avg: f64,
    /// Millions of messages per second over the whole run.
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

    /// One JSON object.
    pub fn json(&self, test: &str) -> String {
        format!(
            "{{\"test\":\"{test}\",\"bytes\":{},\"iterations\":{},\"bw_peak_mib_s\":{:.3},\"bw_avg_mib_s\":{:.3},\"msg_rate_mpps\":{:.6}}}",
            self.bytes, self.iters, self.peak, self.avg, self.mpps
        )
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
        assert!(r
            .json("write_lat")
            .starts_with("{\"test\":\"write_lat\",\"bytes\":8,"));
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
        assert!(r.json("write_bw").contains("\"bw_avg_mib_s\":3500.250"));
    }
}
