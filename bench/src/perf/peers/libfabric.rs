//! libfabric's `fi_pingpong` over its TCP provider (`-p tcp -e msg`): 8 B ping-pong.

use super::{argv, Ours, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// `fi_pingpong`.
pub struct FiPingpong;

/// fi_pingpong's usec/xfer for the row of `size` bytes.
pub fn parse_fi_pingpong(out: &str, size: usize) -> Option<f64> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() >= 8 && w[0] == size.to_string())
        .and_then(|w| w[6].parse().ok())
}

fn eight_bytes(out: &str) -> Parsed {
    parse_fi_pingpong(out, 8).map(|v| (v, vec![]))
}

impl Peer for FiPingpong {
    fn tool(&self) -> &'static str {
        "fi_pingpong"
    }
    fn package(&self) -> &'static str {
        "libfabric-bin"
    }
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let n = p.iters.to_string();
        let server = argv(&["fi_pingpong", "-p", "tcp", "-e", "msg", "-S", "8", "-I", &n]);
        let mut client = server.clone();
        client.push("127.0.0.1".into());
        vec![PeerRun {
            label: "-p tcp -e msg".into(),
            what: "8 B usec/xfer",
            unit: Unit::Micros,
            server,
            client,
            parse: eight_bytes,
            pairs: &[Ours::WriteLat, Ours::SendLat],
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_row_of_real_output() {
        // fi_pingpong (libfabric 1.17, Debian 12), -p tcp -e msg -S 8 on loopback, under load.
        let out = include_str!("samples/fi_pingpong.txt");
        assert_eq!(parse_fi_pingpong(out, 8), Some(166.81));
        assert_eq!(eight_bytes(out), Some((166.81, vec![])));
        assert_eq!(parse_fi_pingpong(out, 64), None, "no row for another size");
    }
}
