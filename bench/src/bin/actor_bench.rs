//! actor-bench: barewire's distributed actors against a raw `Channel` on the same connection,
//! and against Erlang/OTP distribution, on two pinned cores, reps interleaved; and node-down
//! detection times.
//!
//! ```text
//! actor-bench [--reps 5] [--iters 20000] [--msgs 200000] [--cpus 0,1] [--no-erlang] [--no-ractor]
//! actor-bench nodedown [--rounds 20]
//! actor-bench soak [--minutes 10] [--swim]
//! ```
//!
//! `soak`: three `barewire-actor-node` processes (built beside this binary) with default
//! node-down settings (or SWIM membership with `--swim`), while two busy loops hog both CPUs for the whole run; every `DOWN` line
//! any member prints is a false node-down (nobody failed).
//!
//! The first form: this process (rank 0, first CPU) and a copy of it (rank 1, second CPU) form a
//! two-member mesh with an actor system; rank 1 runs an `echo` actor (`u64 -> u64`) and a
//! `count` actor (adds one per message, answers the count). Per rep: remote `ask` round trip
//! p50 and a `Channel<u64>` round trip p50 over the same connection; remote `tell` throughput
//! (`--msgs` tells, then one ask that returns the count) and the same number of `Channel`
//! sends; then Erlang (Debian's erlang-nox): `gen_server:call` p50 between two nodes on
//! loopback, and `--msgs` remote sends to a registered process; then ractor with
//! ractor_cluster (bench/peers/ractor-peer, built on first use): `call` p50 to a remote actor
//! and `--msgs` remote `cast`s, each node one pinned single-threaded tokio runtime.
//!
//! `nodedown`: per round a member process is started, meshed, then killed (SIGKILL) or stopped
//! (SIGSTOP) alternately; the time until this node declares it down is recorded, and p50/p99
//! printed per fault kind.

use std::io::Write;
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use barewire::actor::{spawn, Actor, ActorRef, ActorSystem, Context, SystemOptions};
use barewire::engine::time;
use barewire::{ChannelOptions, Mesh, Node};
use barewire_bench::perf::compare::client_server;
use barewire_bench::perf::peers::erlang::{parse_erlang, Erlang};
use barewire_bench::perf::peers::{Params, Peer};
use barewire_bench::reps::{self, latency, spinning_runtime, Row};

struct Echo;
impl Actor for Echo {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
        n
    }
}

struct Count(u64);
impl Actor for Count {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, _: u64, _: &Context<Self>) -> u64 {
        self.0 += 1;
        self.0
    }
}

const CHANNEL: ChannelOptions = ChannelOptions::new(1024, 8);

/// The command line: the comparison (no subcommand), or `nodedown`, or `soak`.
#[derive(Debug, Parser)]
#[command(
    name = "actor-bench",
    about = "Distributed actors against a raw Channel, Erlang/OTP and ractor; node-down times",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    sub: Option<Sub>,
    /// Reps, interleaved.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Round trips per latency figure.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Messages per throughput figure.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    msgs: u64,
    /// The CPUs of rank 0 and rank 1 (and of each peer's two nodes).
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpus: [usize; 2],
    /// Leave Erlang/OTP out.
    #[arg(long)]
    no_erlang: bool,
    /// Leave ractor out.
    #[arg(long)]
    no_ractor: bool,
    /// Rank 1, which this program starts itself: CPU and the leader's address.
    #[arg(long, num_args = 2, value_names = ["CPU", "LEAD"], hide = true)]
    serve: Option<Vec<String>>,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Time to declare a killed or stopped member down.
    Nodedown {
        /// Rounds (kill and stop alternate).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
    /// Three members under CPU hogs; every DOWN is a false node-down.
    Soak {
        /// How long.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
        minutes: u64,
        /// SWIM membership instead of the default node-down settings.
        #[arg(long)]
        swim: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Some(args) = cli.serve.as_deref() {
        return barewire_bench::serve_rank1(args, serve);
    }
    match cli.sub {
        Some(Sub::Soak { minutes, swim }) => soak(minutes, swim),
        Some(Sub::Nodedown { rounds }) => nodedown(rounds as usize),
        None => {
            let rows = lead(
                cli.reps as usize,
                cli.iters,
                cli.msgs,
                cli.cpus,
                !cli.no_erlang,
                !cli.no_ractor,
            );
            report(&rows);
        }
    }
}

async fn setup(node: &Node, rank: usize, addrs: &[std::net::SocketAddr]) -> (Mesh, ActorSystem) {
    let mesh = Mesh::join(node, rank, addrs).await.unwrap();
    let sys = ActorSystem::start(&mesh, SystemOptions::default())
        .await
        .unwrap();
    (mesh, sys)
}

async fn serve(lead: std::net::SocketAddr) {
    let node = Node::new().unwrap();
    let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    println!("READY {port}");
    let _ = std::io::stdout().flush();
    let me = format!("127.0.0.1:{port}").parse().unwrap();
    let (mesh, sys) = setup(&node, 1, &[lead, me]).await;
    sys.register("echo", &spawn(Echo)).unwrap();
    sys.register("count", &spawn(Count(0))).unwrap();
    // The raw channel beside the actors: echo every number; for the throughput run, answer
    // the count once every message has arrived (the lead sends u64::MAX to ask for it).
    let (tx, rx) = mesh.endpoint(0).open_channel::<u64>(CHANNEL).await.unwrap();
    let mut got = 0u64;
    while let Ok(n) = rx.recv().await {
        match n {
            u64::MAX => {
                tx.send(&got).await.unwrap();
                got = 0;
            }
            n if n & 1 << 63 != 0 => got += 1,
            n => tx.send(&n).await.unwrap(),
        }
    }
}

/// One rep of barewire's four measurements, on a fresh pair of members (so that nothing of
/// barewire runs while the Erlang peer is measured).
async fn barewire_rep(iters: u64, msgs: u64, cpus: [usize; 2]) -> [f64; 4] {
    let (node, addrs, mut child) = barewire_bench::lead_pair(cpus[1]);
    let (mesh, sys) = setup(&node, 0, &addrs).await;
    let echo: ActorRef<Echo> = sys.lookup(1, "echo").await.unwrap();
    let count: ActorRef<Count> = sys.lookup(1, "count").await.unwrap();
    let (tx, rx) = mesh.endpoint(1).open_channel::<u64>(CHANNEL).await.unwrap();
    let (tx, rx) = (Rc::new(tx), Rc::new(rx));
    let ask = Duration::from_secs(5);
    let (ask_p50, _) = latency(iters, |i| {
        let e = echo.clone();
        async move {
            e.ask(i, ask).await.unwrap();
        }
    })
    .await;
    let (chan_p50, _) = latency(iters, |i| {
        let (tx, rx) = (tx.clone(), rx.clone());
        async move {
            tx.send(&i).await.unwrap();
            rx.recv().await.unwrap();
        }
    })
    .await;
    let before = count.ask(0, ask).await.unwrap();
    let t0 = Instant::now();
    for _ in 0..msgs {
        count.tell(0).unwrap();
        if count_backlog() {
            barewire::engine::yield_now().await;
        }
    }
    let after = count.ask(0, ask).await.unwrap();
    assert_eq!(after - before, msgs + 1, "every tell arrived");
    let tell = msgs as f64 / t0.elapsed().as_secs_f64() / 1e3;
    let t0 = Instant::now();
    for _ in 0..msgs {
        tx.send(&(1 << 63)).await.unwrap();
    }
    tx.send(&u64::MAX).await.unwrap();
    assert_eq!(rx.recv().await.unwrap(), msgs, "every message arrived");
    let chan = msgs as f64 / t0.elapsed().as_secs_f64() / 1e3;
    let _ = child.kill();
    let _ = child.wait();
    [ask_p50, chan_p50, tell, chan]
}

fn lead(
    reps: usize,
    iters: u64,
    msgs: u64,
    cpus: [usize; 2],
    erlang: bool,
    ractor: bool,
) -> Vec<Row> {
    // Erlang/OTP (bench/src/perf/peers/erlang.rs): one client run per rep measures both the
    // call round trip and the remote sends.
    let erl = if erlang {
        Erlang::prepare(msgs).or_else(|| {
            eprintln!("actor-bench: Erlang rows skipped");
            None
        })
    } else {
        None
    };
    let erl_run = erl
        .as_ref()
        .map(|e| e.runs(&Params { iters, secs: 0 }).remove(0));
    let rac = if ractor { Ractor::start(cpus) } else { None };
    let mut rows = Row::named(&[
        ("remote ask round trip p50", "us"),
        ("Channel<u64> round trip p50", "us"),
        ("remote tell throughput", "k msg/s"),
        ("Channel<u64> send throughput", "k msg/s"),
        ("Erlang gen_server:call p50, two nodes", "us"),
        ("Erlang remote send throughput", "k msg/s"),
        ("ractor_cluster call p50, two nodes", "us"),
        ("ractor_cluster remote cast throughput", "k msg/s"),
    ]);
    for rep in 0..reps {
        let r = spinning_runtime(cpus[0]).block_on(barewire_rep(iters, msgs, cpus));
        Row::push_rep(&mut rows, &r);
        if let Some(run) = &erl_run {
            let server: Vec<&str> = run.server.iter().map(String::as_str).collect();
            let client: Vec<&str> = run.client.iter().map(String::as_str).collect();
            match client_server(cpus, &[], &server, &client).map(|o| parse_erlang(&o)) {
                Ok(Some((call, send))) => {
                    rows[4].reps.push((call, 0.0));
                    rows[5].reps.push((send / 1e3, 0.0));
                }
                other => eprintln!("actor-bench: the Erlang run gave no figures: {other:?}"),
            }
        }
        if let Some(r) = &rac {
            if let Some((call, cast)) = r.run(iters, msgs) {
                rows[6].reps.push((call, 0.0));
                rows[7].reps.push((cast / 1e3, 0.0));
            }
        }
        eprintln!("rep {} of {reps} done", rep + 1);
    }
    rows
}

/// Yield now and then so the pump can move queued tells onto the wire.
fn count_backlog() -> bool {
    thread_local!(static N: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
    N.with(|n| {
        n.set(n.get() + 1);
        n.get() % 256 == 0
    })
}

/// ractor + ractor_cluster (bench/peers/ractor-peer, built here on first use): the same echo
/// and count actors on two single-threaded tokio nodes over ractor_cluster's TCP sessions,
/// pinned to the same two CPUs.
struct Ractor {
    bin: std::path::PathBuf,
    server: std::process::Child,
    cpus: [usize; 2],
}

const RACTOR_PORT: u16 = 7831;

impl Ractor {
    fn start(cpus: [usize; 2]) -> Option<Ractor> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/ractor-peer");
        eprintln!(
            "actor-bench: building the ractor peer (cargo build --release in {})",
            dir.display()
        );
        let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(dir.join("Cargo.toml"))
            .status()
            .ok()?;
        if !st.success() {
            eprintln!("actor-bench: the ractor peer did not build; its rows skipped");
            return None;
        }
        let bin = dir.join("target/release/ractor-peer");
        let mut server = Command::new("taskset")
            .args(["-c", &cpus[1].to_string()])
            .arg(&bin)
            .args(["serve", &RACTOR_PORT.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let mut ready = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(server.stdout.take()?),
            &mut ready,
        )
        .ok()?;
        if ready.trim() != "READY" {
            eprintln!("actor-bench: the ractor server did not start; its rows skipped");
            return None;
        }
        Some(Ractor { bin, server, cpus })
    }

    /// (call p50 in us, casts per second)
    fn run(&self, iters: u64, msgs: u64) -> Option<(f64, f64)> {
        let out = Command::new("taskset")
            .args(["-c", &self.cpus[0].to_string()])
            .arg(&self.bin)
            .args([
                "lead",
                &(RACTOR_PORT + 1).to_string(),
                &RACTOR_PORT.to_string(),
            ])
            .args([iters.to_string(), msgs.to_string()])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text.lines().find(|l| l.starts_with("RESULT "))?;
        let mut f = line
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse::<f64>().ok());
        Some((f.next()?, f.next()?))
    }
}

impl Drop for Ractor {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

fn report(rows: &[Row]) {
    reps::report(
        rows,
        &[
            (
                "remote ask p50 / Erlang gen_server:call p50",
                0,
                4,
                "<= 0.1x",
            ),
            ("remote ask p50 / Channel round trip p50", 0, 1, "<= 1.3x"),
            ("remote ask p50 / ractor_cluster call p50", 0, 6, "<= 0.5x"),
            (
                "remote tell throughput / Erlang remote send",
                2,
                5,
                ">= 10x",
            ),
            (
                "remote tell throughput / ractor_cluster cast",
                2,
                7,
                ">= 2x",
            ),
            (
                "remote tell throughput / Channel throughput",
                2,
                3,
                ">= 0.8x",
            ),
        ],
    );
}

/// Node-down detection: a member started, meshed, then killed or stopped; time to DOWN.
fn nodedown(rounds: usize) {
    let mut kill = Vec::new();
    let mut stop = Vec::new();
    for round in 0..rounds * 2 {
        let sig = if round % 2 == 0 {
            libc::SIGKILL
        } else {
            libc::SIGSTOP
        };
        let took = spinning_runtime(0).block_on(async move {
            let node = Node::new().unwrap();
            let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            let me: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let (peer_port, mut child) =
                barewire_bench::spawn_ready(&["--serve", "1", &me.to_string()]);
            let peer = format!("127.0.0.1:{peer_port}").parse().unwrap();
            let (_mesh, sys) = setup(&node, 0, &[me, peer]).await;
            let echo: ActorRef<Echo> = sys.lookup(1, "echo").await.unwrap();
            echo.ask(1, Duration::from_secs(5)).await.unwrap();
            time::sleep(Duration::from_millis(30)).await;
            // SAFETY: signalling our own child.
            unsafe { libc::kill(child.id() as i32, sig) };
            let t0 = Instant::now();
            let mut seen = 0;
            sys.next_down(&mut seen).await;
            let took = t0.elapsed();
            let _ = child.kill();
            let _ = child.wait();
            took
        });
        let ms = took.as_secs_f64() * 1e3;
        if sig == libc::SIGKILL {
            kill.push(ms)
        } else {
            stop.push(ms)
        }
    }
    for (name, v) in [
        ("SIGKILL (connection fails)", kill),
        ("SIGSTOP (heartbeat deadline only)", stop),
    ] {
        let mut s = v.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let p = |q: f64| s[((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1];
        println!(
            "| {name} | {} rounds | p50 {:.1} ms | p99 {:.1} ms | max {:.1} ms |",
            s.len(),
            p(0.5),
            p(0.99),
            s[s.len() - 1]
        );
    }
}

/// Three members under a CPU hog on both cores for `minutes`: counts false node-downs.
fn soak(minutes: u64, swim: bool) {
    use std::io::{BufRead, BufReader};
    let exe = std::env::current_exe().unwrap();
    let bin = exe.with_file_name("barewire-actor-node");
    assert!(
        bin.exists(),
        "build it first: cargo build --release --bin barewire-actor-node"
    );
    let mut members: Vec<std::process::Child> = (0..3)
        .map(|r| {
            Command::new(&bin)
                .args(["--rank", &r.to_string()])
                .args(swim.then_some("--swim"))
                .env("BAREWIRE_DRIVER", "soft")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel::<(usize, String)>();
    let mut ports = Vec::new();
    for (r, m) in members.iter_mut().enumerate() {
        let mut out = BufReader::new(m.stdout.take().unwrap());
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        ports.push(l.trim().trim_start_matches("READY ").to_string());
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                let _ = tx.send((r, l));
            }
        });
    }
    let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    for m in &mut members {
        writeln!(m.stdin.as_mut().unwrap(), "ADDRS {}", addrs.join(" ")).unwrap();
    }
    let mut started = 0;
    while started < 3 {
        if rx.recv().unwrap().1 == "STARTED" {
            started += 1;
        }
    }
    let mut hogs: Vec<std::process::Child> = (0..2)
        .map(|_| {
            Command::new("sh")
                .args(["-c", "while :; do :; done"])
                .spawn()
                .unwrap()
        })
        .collect();
    eprintln!("soak: 3 members, 2 CPU hogs, {minutes} min");
    let end = Instant::now() + Duration::from_secs(minutes * 60);
    let mut downs = Vec::new();
    while Instant::now() < end {
        if let Ok((r, l)) = rx.recv_timeout(Duration::from_secs(1)) {
            if l.starts_with("DOWN") {
                eprintln!("soak: member {r} said {l}");
                downs.push((r, l));
            }
        }
    }
    for h in &mut hogs {
        let _ = h.kill();
        let _ = h.wait();
    }
    for m in &mut members {
        let _ = writeln!(m.stdin.as_mut().unwrap(), "EXIT");
        let _ = m.wait();
    }
    println!(
        "| soak: 3 members{}, both CPUs hogged, {minutes} min | false node-downs: {} |",
        if swim { " on SWIM" } else { "" },
        downs.len()
    );
}
