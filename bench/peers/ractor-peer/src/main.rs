//! The ractor side of `actor-bench`: two ractor_cluster nodes on loopback, each a
//! single-threaded tokio runtime (pinned by the caller with `taskset`), the same shape as
//! barewire's one core per node.
//!
//! ```text
//! ractor-peer serve PORT                    # hosts `echo` and `count`, until killed
//! ractor-peer lead PORT SERVER_PORT ITERS MSGS
//! ```
//!
//! `lead` connects to the server's node, waits until both actors show up in the process group
//! `bench`, then measures ITERS `call`s to `echo` (p50 round trip, microseconds) and MSGS
//! `cast`s to `count` followed by one `call` that returns the count (messages per second). It
//! prints `RESULT <call p50 us> <casts per second>`.

use std::time::{Duration, Instant};

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use ractor_cluster::{NodeServer, RactorClusterMessage};

const GROUP: &str = "bench";

#[derive(RactorClusterMessage)]
enum EchoMsg {
    #[rpc]
    Echo(u64, RpcReplyPort<u64>),
}

#[derive(RactorClusterMessage)]
enum CountMsg {
    Add(u64),
    #[rpc]
    Total(RpcReplyPort<u64>),
}

struct Echo;
impl Actor for Echo {
    type Msg = EchoMsg;
    type State = ();
    type Arguments = ();
    async fn pre_start(&self, me: ActorRef<EchoMsg>, _: ()) -> Result<(), ActorProcessingErr> {
        ractor::pg::join(format!("{GROUP}-echo"), vec![me.get_cell()]);
        Ok(())
    }
    async fn handle(
        &self,
        _: ActorRef<EchoMsg>,
        msg: EchoMsg,
        _: &mut (),
    ) -> Result<(), ActorProcessingErr> {
        let EchoMsg::Echo(n, reply) = msg;
        let _ = reply.send(n);
        Ok(())
    }
}

struct Count;
impl Actor for Count {
    type Msg = CountMsg;
    type State = u64;
    type Arguments = ();
    async fn pre_start(&self, me: ActorRef<CountMsg>, _: ()) -> Result<u64, ActorProcessingErr> {
        ractor::pg::join(format!("{GROUP}-count"), vec![me.get_cell()]);
        Ok(0)
    }
    async fn handle(
        &self,
        _: ActorRef<CountMsg>,
        msg: CountMsg,
        total: &mut u64,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            CountMsg::Add(n) => *total += n,
            CountMsg::Total(reply) => {
                let _ = reply.send(*total);
            }
        }
        Ok(())
    }
}

async fn node(port: u16, name: &str) -> ActorRef<ractor_cluster::NodeServerMessage> {
    let server = NodeServer::new(
        port,
        "bwbench".to_string(),
        name.to_string(),
        "127.0.0.1".to_string(),
        None,
        None,
    );
    let (node, _) = Actor::spawn(None, server, ()).await.expect("node server");
    node
}

/// The first member of `group` that lives on another node, once the groups have synced.
fn remote_member(group: &str) -> Option<ractor::ActorCell> {
    ractor::pg::get_members(&group.to_string())
        .into_iter()
        .find(|a| !a.get_id().is_local())
}

async fn wait_remote(group: &str) -> ractor::ActorCell {
    let t0 = Instant::now();
    loop {
        if let Some(a) = remote_member(group) {
            return a;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "ractor-peer: {group} never appeared from the server node"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn main() {
    // RACTOR_PEER_THREADS=N: a multi-threaded tokio runtime of N workers instead of one
    // thread (to check the single-threaded shape is not what makes ractor slow).
    let threads: usize = std::env::var("RACTOR_PEER_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let rt = if threads > 0 {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    rt.expect("tokio runtime").block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize| -> u64 {
        args.get(i)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("ractor-peer: argument {i} missing or not a number"))
    };
    match args.first().map(String::as_str) {
        Some("serve") => {
            let _node = node(num(1) as u16, "bwsrv").await;
            let _ = Actor::spawn(None, Echo, ()).await.expect("echo");
            let _ = Actor::spawn(None, Count, ()).await.expect("count");
            println!("READY");
            loop {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
        }
        Some("lead") => {
            let node = node(num(1) as u16, "bwcli").await;
            ractor_cluster::client_connect(&node, format!("127.0.0.1:{}", num(2)))
                .await
                .expect("connect to the server node");
            let echo: ActorRef<EchoMsg> = wait_remote(&format!("{GROUP}-echo")).await.into();
            let count: ActorRef<CountMsg> = wait_remote(&format!("{GROUP}-count")).await.into();
            let (iters, msgs) = (num(3), num(4));
            let timeout = Some(Duration::from_secs(5));
            for i in 0..iters.min(1000) {
                let r = echo.call(|p| EchoMsg::Echo(i, p), timeout).await;
                assert!(
                    matches!(r, Ok(CallResult::Success(n)) if n == i),
                    "warm-up call"
                );
            }
            let mut lat = Vec::with_capacity(iters as usize);
            for i in 0..iters {
                let t = Instant::now();
                let r = echo.call(|p| EchoMsg::Echo(i, p), timeout).await;
                lat.push(t.elapsed().as_nanos() as f64 / 1e3);
                assert!(matches!(r, Ok(CallResult::Success(n)) if n == i), "call");
            }
            lat.sort_by(f64::total_cmp);
            let p50 = lat[lat.len() / 2];
            let total = |count: ActorRef<CountMsg>| async move {
                match count
                    .call(CountMsg::Total, Some(Duration::from_secs(60)))
                    .await
                {
                    Ok(CallResult::Success(n)) => n,
                    other => panic!("ractor-peer: count total: {other:?}"),
                }
            };
            let base = total(count.clone()).await;
            let t = Instant::now();
            for _ in 0..msgs {
                count.cast(CountMsg::Add(1)).expect("cast");
            }
            let counted = total(count.clone()).await - base;
            let rate = msgs as f64 / t.elapsed().as_secs_f64();
            assert_eq!(counted, msgs, "every cast counted");
            println!("RESULT {p50:.2} {rate:.0}");
        }
        _ => {
            eprintln!("usage: ractor-peer serve PORT | lead PORT SERVER_PORT ITERS MSGS");
            std::process::exit(2);
        }
    }
}
