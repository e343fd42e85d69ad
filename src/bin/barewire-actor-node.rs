//! barewire-actor-node: one member of a distributed actor system, for tests and for trying
//! node faults by hand.
//!
//! ```text
//! barewire-actor-node --rank R [--bind IP] [--heartbeat-ms 10] [--misses 5] [--swim]
//! ```
//!
//! It listens on IP (127.0.0.1) port 0 and prints `READY <port>`, reads one line
//! `ADDRS <addr> ...` (every member's address, by rank), joins the mesh, starts its actor
//! system, registers an `echo` actor (`String -> String`) and a `counter` actor (`u64 -> u64`:
//! adds, returns the total) and the kind `counter` (argument: the starting total), prints
//! `STARTED`, and then serves (with `--swim`, node-down comes from SWIM membership on UDP at
//! the mesh address, every other member a seed, instead of the heartbeat deadline) until standard input says `EXIT` or closes. A `DOWN <rank>` line
//! is printed for every node it declares down. It accepts moving `Seq` actors (kind `seq`), and
//! `SEND <from> <n>` on standard input makes it tell the `seq` actor of rank 0 `(its rank, i)`
//! for `i` in `from..from + n` (in bursts), then print `SENT`. Its reference keeps pointing at
//! rank 0's address; if the actor moves, it follows.

use std::time::Duration;

use barewire::actor::{spawn, Actor, ActorSystem, Context, SystemOptions};
use barewire::cluster::{Member, Membership, MembershipOptions};
use barewire::engine::{spawn_local, time};
use barewire::{Error, Mesh, Node, Result};

mod member;
use member::{arg, say};

struct Echo;
impl Actor for Echo {
    type Msg = String;
    type Reply = String;
    async fn handle(&mut self, s: String, _: &Context<Self>) -> String {
        s
    }
}

#[path = "member/seq.rs"]
mod seq;
use seq::Seq;

struct Counter(u64);
impl Actor for Counter {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, add: u64, _: &Context<Self>) -> u64 {
        self.0 += add;
        self.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str| arg(&args, k);
    let Some(rank) = get("--rank").and_then(|r| r.parse::<usize>().ok()) else {
        eprintln!(
            "usage: barewire-actor-node --rank R [--bind IP] [--heartbeat-ms N] [--misses N]"
        );
        std::process::exit(2);
    };
    let bind = get("--bind").unwrap_or_else(|| "127.0.0.1".into());
    let mut opts = SystemOptions::default();
    if let Some(ms) = get("--heartbeat-ms").and_then(|v| v.parse().ok()) {
        opts.heartbeat = Duration::from_millis(ms);
    }
    if let Some(m) = get("--misses").and_then(|v| v.parse().ok()) {
        opts.misses = m;
    }
    let swim = args.iter().any(|a| a == "--swim");
    if swim {
        opts.detector = barewire::actor::Detector::Membership;
    }
    if let Err(e) = member::runtime().block_on(run(rank, bind, opts, swim)) {
        eprintln!("barewire-actor-node: {e}");
        std::process::exit(1);
    }
}

async fn run(rank: usize, bind: String, opts: SystemOptions, swim: bool) -> Result<()> {
    let node = Node::new()?;
    let addrs = member::handshake(&node, &bind)?;
    let (cmd_rx, exit) = member::commands();
    let mesh = Mesh::join(&node, rank, &addrs).await?;
    let sys = ActorSystem::start(&mesh, opts).await?;
    sys.register("echo", &spawn(Echo))?;
    sys.register("counter", &spawn(Counter(0)))?;
    sys.register_kind("counter", Counter);
    sys.register_migratable::<Seq>("seq");
    if swim {
        // SWIM on UDP at the same address as the mesh's TCP listener; every other member's
        // is a seed. Its verdicts are the actor system's node-down.
        let me = Member {
            rank: rank as u32,
            addr: addrs[rank],
            incarnation: 0,
        };
        let m = Membership::start(me, &addrs, MembershipOptions::default())?;
        sys.follow(m);
    }
    let _downs = member::print_downs(&sys);
    say("STARTED");
    let mut senders = Vec::new();
    while !member::exiting(&exit) {
        while let Ok(cmd) = cmd_rx.try_recv() {
            let mut words = cmd.split_whitespace();
            let verb = words.next();
            let mut num = || words.next().and_then(|v| v.parse::<u64>().ok());
            if let (Some("SEND"), Some(from), Some(n)) = (verb, num(), num()) {
                let sys = sys.clone();
                senders.push(spawn_local(async move {
                    let r = async {
                        let seq = sys.lookup::<Seq>(0, "seq").await?;
                        for i in from..from + n {
                            seq.tell((rank as u64, i))?;
                            if i % 64 == 63 {
                                time::sleep(Duration::from_micros(100)).await;
                            }
                        }
                        Ok::<_, Error>(())
                    }
                    .await;
                    match r {
                        Ok(()) => say("SENT"),
                        Err(e) => say(&format!("SEND-FAILED {e}")),
                    }
                }));
            }
        }
        time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}
