//! Erlang/OTP distribution (Debian's erlang-nox): the actors' peer (`actor-bench`). Two nodes
//! on loopback: `bwsrv` runs a gen_server echo and a counting sink, `bwcli` measures
//! `gen_server:call` round trips (p50) and remote sends to a registered process (messages/s).

use std::path::{Path, PathBuf};

use super::{argv, Params, Parsed, Peer, PeerRun};
use crate::perf::compare::Unit;

/// Two `erl` nodes, with the module below compiled into `dir`.
pub struct Erlang {
    dir: PathBuf,
    /// Remote sends per throughput run.
    pub msgs: u64,
}

const BW_ECHO: &str = r#"-module(bw_echo).
-behaviour(gen_server).
-export([start/0, init/1, handle_call/3, handle_cast/2, handle_info/2, bench/3, sink/1]).
start() -> gen_server:start({local, bw_echo}, ?MODULE, [], []),
           register(bw_sink, spawn(fun() -> sink(0) end)).
init([]) -> {ok, 0}.
handle_call(N, _From, S) -> {reply, N, S}.
handle_cast(_, S) -> {noreply, S}.
handle_info(_, S) -> {noreply, S}.
sink(N) -> receive {count, From} -> From ! {count, N}, sink(0); _ -> sink(N + 1) end.
connect(Node, 0) -> net_kernel:connect_node(Node);
connect(Node, Tries) ->
    case net_kernel:connect_node(Node) andalso rpc:call(Node, erlang, whereis, [bw_echo]) of
        Pid when is_pid(Pid) -> true;
        _ -> timer:sleep(100), connect(Node, Tries - 1)
    end.
bench(Node, Iters, Msgs) ->
    true = connect(Node, 100),
    [gen_server:call({bw_echo, Node}, I) || I <- lists:seq(1, Iters div 10)],
    Ts = [begin T0 = erlang:monotonic_time(nanosecond),
                I = gen_server:call({bw_echo, Node}, I),
                erlang:monotonic_time(nanosecond) - T0 end || I <- lists:seq(1, Iters)],
    P50 = lists:nth(Iters div 2, lists:sort(Ts)),
    T1 = erlang:monotonic_time(nanosecond),
    [{bw_sink, Node} ! x || _ <- lists:seq(1, Msgs)],
    {bw_sink, Node} ! {count, self()},
    receive {count, Msgs} -> ok end,
    T2 = erlang:monotonic_time(nanosecond),
    io:format("RESULT ~p ~p~n", [P50 / 1000, Msgs * 1.0e9 / (T2 - T1)]).
"#;

/// The client's `RESULT <call p50 µs> <sends/s>` line.
pub fn parse_erlang(out: &str) -> Option<(f64, f64)> {
    let line = out.lines().find(|l| l.starts_with("RESULT "))?;
    let mut f = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse::<f64>().ok());
    Some((f.next()?, f.next()?))
}

fn call_p50(out: &str) -> Parsed {
    parse_erlang(out).map(|(p50, _)| (p50, Vec::new()))
}

fn sends_k_per_sec(out: &str) -> Parsed {
    parse_erlang(out).map(|(_, rate)| (rate / 1e3, Vec::new()))
}

impl Erlang {
    /// Compiles the benchmark module into a directory of its own. `None` (and why, on
    /// stderr) if `erl`/`erlc` are missing or the module does not compile.
    pub fn prepare(msgs: u64) -> Option<Erlang> {
        let have = |t| crate::apt::on_path(t);
        if !(have("erl") && have("erlc")) {
            if let Err(how) = crate::apt::ensure(&["erlang-nox", "erlang-dev"]) {
                eprintln!("erl/erlc not found ({how})");
                return None;
            }
        }
        let dir = std::env::temp_dir().join(format!("barewire-erl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        std::fs::write(dir.join("bw_echo.erl"), BW_ECHO).ok()?;
        let ok = std::process::Command::new("erlc")
            .arg("bw_echo.erl")
            .current_dir(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("erlc failed on {}", dir.join("bw_echo.erl").display());
            return None;
        }
        Some(Erlang { dir, msgs })
    }

    fn node(&self, name: &str, eval: &str) -> Vec<String> {
        let dir = self.dir.display().to_string();
        argv(&[
            "erl",
            "-noshell",
            "-sname",
            name,
            "-setcookie",
            "bwbench",
            "-pa",
            &dir,
            "-eval",
            eval,
        ])
    }

    /// Where the module was compiled.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Erlang {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Peer for Erlang {
    fn tool(&self) -> &'static str {
        "erl"
    }
    fn package(&self) -> &'static str {
        "erlang-nox erlang-dev"
    }
    /// `gen_server:call` p50 over `p.iters` calls, and `self.msgs` remote sends; each run
    /// measures both and reads one.
    fn runs(&self, p: &Params) -> Vec<PeerRun> {
        let host = std::process::Command::new("hostname")
            .arg("-s")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let server = self.node("bwsrv", "bw_echo:start()");
        let client = self.node(
            "bwcli",
            &format!(
                "bw_echo:bench('bwsrv@{host}', {}, {}), init:stop()",
                p.iters, self.msgs
            ),
        );
        vec![
            PeerRun {
                label: "gen_server:call, two nodes".into(),
                what: "p50",
                unit: Unit::Micros,
                server: server.clone(),
                client: client.clone(),
                parse: call_p50,
                pairs: &[],
            },
            PeerRun {
                label: "remote send to a registered process".into(),
                what: "messages",
                unit: Unit::KPerSec,
                server,
                client,
                parse: sends_k_per_sec,
                pairs: &[],
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_client_result_line() {
        // erl (Debian 12, OTP 25) running bw_echo:bench between two nodes on loopback.
        let out = include_str!("samples/erlang_bw_echo.txt");
        let (p50, rate) = parse_erlang(out).unwrap();
        assert!(p50 > 0.0 && rate > 0.0, "{out}");
        assert_eq!(call_p50(out).map(|p| p.0), Some(p50));
        assert_eq!(sends_k_per_sec(out).map(|p| p.0), Some(rate / 1e3));
        assert_eq!(
            parse_erlang("{\"init terminating in do_boot\",...}\n"),
            None
        );
    }
}
