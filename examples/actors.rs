//! A supervision tree across three processes: the first process (rank 0) supervises two
//! workers that run on the other two nodes; it kills the process of one of them, notices the
//! node is gone by its missing heartbeats or its failed connection, and the supervisor restarts
//! that worker on the surviving node.
//!
//!     cargo run --release --example actors
//!
//! Each worker is a `Tally` (messages: numbers to add; reply: the total so far), a kind every
//! node registers so that any node can start one elsewhere with `spawn_on`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use barewire::actor::{
    Actor, ActorSystem, ChildSpec, Context, Strategy, Supervisor, SupervisorSpec, SystemOptions,
};
use barewire::engine::{time, Runtime};
use barewire::{Error, Mesh, Node, Result};

/// Adds what it is sent; answers with the total.
struct Tally(u64);

impl Actor for Tally {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
        self.0 += n;
        self.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match (args.first().map(String::as_str), args.get(1)) {
        (Some("member"), Some(rank)) => member(rank.parse().unwrap_or(usize::MAX)),
        _ => lead(),
    };
    if let Err(e) = r {
        eprintln!("actors: {e}");
        std::process::exit(1);
    }
}

fn runtime() -> Result<Runtime> {
    Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .map_err(|e| Error::Invalid(e.to_string()))
}

/// A member joins the mesh from the address list on its standard input (after printing
/// `READY <port>`).
async fn join(node: &Node, rank: usize) -> Result<Mesh> {
    let port = node.listen("127.0.0.1:0".parse().unwrap())?;
    println!("READY {port}");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let addrs = line
        .split_whitespace()
        .map(|a| a.parse().map_err(|e| Error::Invalid(format!("{a}: {e}"))))
        .collect::<Result<Vec<std::net::SocketAddr>>>()?;
    Mesh::join(node, rank, &addrs).await
}

/// Ranks 1 and 2: offer the `tally` kind and serve until killed or told to leave.
fn member(rank: usize) -> Result<()> {
    runtime()?.block_on(async move {
        let node = Node::new()?;
        let mesh = join(&node, rank).await?;
        let sys = ActorSystem::start(&mesh, SystemOptions::default()).await?;
        sys.register_kind("tally", Tally);
        // The lead tells every member to leave by hanging up: its node going down.
        let mut seen = 0;
        while sys.next_down(&mut seen).await != 0 {}
        Ok(())
    })
}

fn lead() -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Invalid(e.to_string()))?;
    let mut members: Vec<Child> = (1..3)
        .map(|r| {
            Command::new(&exe)
                .args(["member", &r.to_string()])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a member")
        })
        .collect();
    let mut ports = Vec::new();
    for m in &mut members {
        let mut line = String::new();
        BufReader::new(m.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        ports.push(format!(
            "127.0.0.1:{}",
            line.trim().trim_start_matches("READY ")
        ));
    }
    let r = runtime()?.block_on(async {
        let node = Node::new()?;
        let all = ports.join(" ");
        // Rank 0 listens, then tells the members the whole list.
        let port = node.listen("127.0.0.1:0".parse().unwrap())?;
        let list = format!("127.0.0.1:{port} {all}");
        for m in &mut members {
            writeln!(m.stdin.as_mut().unwrap(), "{list}")
                .map_err(|e| Error::Invalid(e.to_string()))?;
        }
        let addrs = list
            .split_whitespace()
            .map(|a| a.parse().unwrap())
            .collect::<Vec<std::net::SocketAddr>>();
        let mesh = Mesh::join(&node, 0, &addrs).await?;
        let sys = ActorSystem::start(&mesh, SystemOptions::default()).await?;
        sys.register_kind("tally", Tally);

        let sup = Supervisor::start(
            SupervisorSpec::new(
                Strategy::OneForOne,
                vec![
                    ChildSpec::remote::<Tally, u64>("north", &sys, "tally", 0, vec![1, 2]),
                    ChildSpec::remote::<Tally, u64>("south", &sys, "tally", 0, vec![2, 1]),
                ],
            )
            .intensity(3, Duration::from_secs(5)),
        )
        .await;
        for name in ["north", "south"] {
            println!(
                "{name:>5}: running on node {}",
                sup.node_of(name).flatten().unwrap_or(0)
            );
        }

        println!("killing node 2 (pid {})", members[1].id());
        let _ = members[1].kill();
        let t0 = Instant::now();
        let mut seen = 0;
        let down = sys.next_down(&mut seen).await;
        println!("node {down} declared down after {:.1?}", t0.elapsed());
        while sup.node_of("south") != Some(Some(1)) {
            time::sleep(Duration::from_micros(200)).await;
        }
        println!(
            "south: restarted on node 1, {:.1?} after the kill ({} starts, {} restart)",
            t0.elapsed(),
            sup.starts("south").unwrap_or(0),
            sup.restarts()
        );
        let north = sup.node_of("north").flatten();
        println!("north: still on node {}", north.unwrap_or(0));
        if north != Some(1) || sup.starts("north") != Some(1) {
            return Err(Error::Invalid("north should not have moved".into()));
        }
        sup.stop();
        sup.wait().await;
        Ok(())
    });
    for mut m in members {
        let _ = m.kill();
        let _ = m.wait();
    }
    r
}
