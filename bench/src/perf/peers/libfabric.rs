//! libfabric's `fi_pingpong` over its TCP provider (`-p tcp -e msg`): 8 B ping-pong.

use super::{argv, Ours, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// `fi_pingpong`.
pub struct FiPingpong;

/// The control port the server listens on and the client connects to. fi_pingpong's own default
/// (47592) lies in Linux's default ephemeral range (32768-60999): a connection of the tests run
/// just before, still in TIME_WAIT on that local port, made the server's bind fail ("Address
/// already in use") and cost the report that rep's figure. This one lies below the range, as
/// sockperf's, qperf's and ucx_perftest's ports do.
const PORT: &str = "18519";

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
        let common = ["fi_pingpong", "-p", "tcp", "-e", "msg", "-S", "8", "-I", &n];
        let mut server = argv(&common);
        server.extend(argv(&["-B", PORT]));
        let mut client = argv(&common);
        client.extend(argv(&["-P", PORT, "127.0.0.1"]));
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

    #[test]
    fn server_and_client_meet_on_a_port_below_the_ephemeral_range() {
        let run = &FiPingpong.runs(&Params { iters: 5, secs: 1 })[0];
        let port: u16 = PORT.parse().unwrap();
        assert!(port < 32768);
        let after = |argv: &[String], flag: &str| {
            let at = argv.iter().position(|a| a == flag).expect(flag);
            argv[at + 1].clone()
        };
        assert_eq!(after(&run.server, "-B"), PORT);
        assert_eq!(after(&run.client, "-P"), PORT);
        assert_eq!(run.client.last().map(String::as_str), Some("127.0.0.1"));
        assert!(!run.server.iter().any(|a| a == "127.0.0.1" || a == "-P"));
    }
}
