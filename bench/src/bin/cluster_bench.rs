//! cluster-bench: the cluster layer's figures.
//!
//! ```text
//! cluster-bench work [--reps 5] [--iters 5000] [--batch 2000] [--cpus 0,1]
//! cluster-bench start [--procs 8] [--reps 5]
//! cluster-bench detect [--rounds 20]
//! cluster-bench --help
//! ```
//!
//! `work`: this process (rank 0, first CPU) and a copy of it (rank 1, second CPU), both
//! spinning, form a two-member cluster. Per rep: the p50 round trip of a remote actor `ask` to
//! an echo actor on rank 1; the p50 of `submit_work` of a one-task workflow whose trivial
//! task (`u64 -> u64`) runs on rank 1 (`near(1)`); and the time per task of one workflow of
//! `--batch` such tasks (rank 1 offers 4 workers). Reps interleave; ratios are medians of
//! per-rep ratios.
//!
//! `start`: per rep, `--procs` processes on this host (unpinned, cores that sleep when idle,
//! as `barewire run --no-pin` starts them), each `Cluster::start` (full mesh, actor system,
//! SWIM, workers and every member's offer); the figure is the time from spawning the first
//! until the last says it is meshed; beside it the floor of spawning as many processes that
//! exit at once.
//!
//! `detect`: per round three `barewire-swim-node` members (built beside this binary: `cargo
//! build --release --bins`) with the default membership settings see each other; then rank 2
//! is killed (SIGKILL) or stopped (SIGSTOP), alternately, and the time until both others say
//! it is down is recorded.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};

use barewire::actor::{spawn, Actor, ActorRef, ActorSystem, Context, SystemOptions};
use barewire::cluster::{Cluster, ClusterOptions, Launch, Resources, Task, Workflow};
use barewire::{Mesh, Node};
use barewire_bench::reps::{self, latency, median, spinning_runtime, Row};

struct Echo;
impl Actor for Echo {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
        n
    }
}

/// The command line.
#[derive(Debug, Parser)]
#[command(name = "cluster-bench", about = "The cluster layer's figures")]
struct Cli {
    #[command(subcommand)]
    sub: Option<Sub>,
    /// Rank 1 of `work`, which this program starts itself: CPU and the leader's address.
    #[arg(long, num_args = 2, value_names = ["CPU", "LEAD"], hide = true)]
    serve: Option<Vec<String>>,
    /// One member of `start`, which this program starts itself.
    #[arg(long, hide = true)]
    start_member: bool,
    /// `start`'s floor: a process that exits at once.
    #[arg(long, hide = true)]
    noop: bool,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// Remote ask, submit_work of one task, and time per task of a batch (the default).
    Work {
        /// Reps, interleaved.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        reps: u64,
        /// Round trips per latency figure.
        #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
        iters: u64,
        /// Tasks in the batch workflow.
        #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
        batch: u64,
        /// The CPUs of rank 0 and rank 1.
        #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
        cpus: [usize; 2],
    },
    /// Time for --procs processes to start a cluster and mesh.
    Start {
        /// Processes.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(2..=256))]
        procs: u64,
        /// Reps.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        reps: u64,
    },
    /// Time until a killed or stopped member is declared down.
    Detect {
        /// Rounds (kill and stop alternate).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
        rounds: u64,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Some(args) = cli.serve.as_deref() {
        return barewire_bench::serve_rank1(args, serve);
    }
    if cli.start_member {
        return start_member();
    }
    if cli.noop {
        return;
    }
    match cli.sub.unwrap_or(Sub::Work {
        reps: 5,
        iters: 5000,
        batch: 2000,
        cpus: [0, 1],
    }) {
        Sub::Start { procs, reps } => start(procs as usize, reps as usize),
        Sub::Detect { rounds } => detect(rounds as usize),
        Sub::Work {
            reps,
            iters,
            batch,
            cpus,
        } => work(reps as usize, iters, batch, cpus),
    }
}

fn offer(cores: usize) -> Resources {
    Resources {
        cores,
        memory: 1 << 30,
        transports: vec!["soft".into()],
        labels: Default::default(),
    }
}

async fn cluster(node: Node, rank: usize, addrs: &[std::net::SocketAddr]) -> Cluster {
    let mesh = Mesh::join(&node, rank, addrs).await.unwrap();
    let sys = ActorSystem::start(&mesh, SystemOptions::default())
        .await
        .unwrap();
    let c = Cluster::over(node, mesh, sys, offer(if rank == 0 { 1 } else { 4 }))
        .await
        .unwrap();
    c.register_task("echo", |n: u64, _| async move { Ok(n) });
    c
}

async fn serve(lead: std::net::SocketAddr) {
    let node = Node::new().unwrap();
    let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    println!("READY {port}");
    let _ = std::io::stdout().flush();
    let me = format!("127.0.0.1:{port}").parse().unwrap();
    let c = cluster(node, 1, &[lead, me]).await;
    c.system().register("echo", &spawn(Echo)).unwrap();
    std::future::pending::<()>().await;
}

/// One rep: (ask p50, one-task submit_work p50, batch time per task), in microseconds.
async fn work_rep(iters: u64, batch: u64, cpus: [usize; 2]) -> [f64; 3] {
    let (node, addrs, mut child) = barewire_bench::lead_pair(cpus[1]);
    let c = cluster(node, 0, &addrs).await;
    let echo: ActorRef<Echo> = loop {
        // The far side registers its echo actor right after the cluster forms.
        if let Ok(e) = c.system().lookup(1, "echo").await {
            break e;
        }
        barewire::engine::time::sleep(Duration::from_millis(1)).await;
    };
    let t = Duration::from_secs(5);
    let (ask, _) = latency(iters, |i| {
        let e = echo.clone();
        async move {
            assert_eq!(e.ask(i, t).await.unwrap(), i);
        }
    })
    .await;
    let c = &c;
    let (one, _) = latency(iters, |i| async move {
        let mut wf = Workflow::new();
        let id = wf.add(Task::<u64>::new("echo", &i).near(1));
        let r = c.submit_work(wf).await.unwrap();
        assert_eq!(r.get(id), Ok(i));
        assert_eq!(r.ran_on(id), [1]);
    })
    .await;
    let mut wf = Workflow::new();
    let ids: Vec<_> = (0..batch)
        .map(|i| wf.add(Task::<u64>::new("echo", &i).near(1)))
        .collect();
    let t0 = Instant::now();
    let r = c.submit_work(wf).await.unwrap();
    let per_task = t0.elapsed().as_secs_f64() * 1e6 / batch as f64;
    for (i, id) in ids.into_iter().enumerate() {
        assert_eq!(r.get(id), Ok(i as u64));
    }
    let _ = child.kill();
    let _ = child.wait();
    [ask, one, per_task]
}

fn work(reps: usize, iters: u64, batch: u64, cpus: [usize; 2]) {
    let mut rows = Row::named(&[
        ("remote ask round trip p50", "us"),
        ("submit_work, one trivial remote task, p50", "us"),
        ("submit_work, batch of trivial remote tasks, per task", "us"),
    ]);
    for rep in 0..reps {
        let r = spinning_runtime(cpus[0]).block_on(work_rep(iters, batch, cpus));
        Row::push_rep(&mut rows, &r);
        eprintln!("rep {} of {reps} done", rep + 1);
    }
    reps::report(
        &rows,
        &[
            ("one-task submit_work p50 / ask p50", 1, 0, "<= 2x"),
            ("batched submit_work per task / ask p50", 2, 0, "reported"),
        ],
    );
}

/// A member of `start`: starts its part of the cluster, says when, stays a moment.
fn start_member() {
    let t0: u128 = std::env::var("BENCH_T0").unwrap().parse().unwrap();
    reps::sleeping_runtime().block_on(async {
        let me = Launch::from_env().unwrap();
        let c = Cluster::start(&me, ClusterOptions::default())
            .await
            .unwrap();
        println!("MESHED {}", epoch_ns() - t0);
        let _ = std::io::stdout().flush();
        // Stay until every member has surely asked this one for its offer.
        barewire::engine::time::sleep(Duration::from_secs(2)).await;
        drop(c);
    });
}

fn epoch_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn start(procs: usize, reps: usize) {
    let exe = std::env::current_exe().unwrap();
    let mut rows = Row::named(&[
        ("spawn to fully meshed, last of the processes", "ms"),
        ("spawn and exit of as many processes (floor)", "ms"),
    ]);
    for rep in 0..reps {
        let base = 17_000 + (rep as u16 % 10) * 100;
        let t0 = epoch_ns();
        let kids: Vec<Child> = (0..procs)
            .map(|r| {
                Command::new(&exe)
                    .arg("--start-member")
                    .env("BENCH_T0", t0.to_string())
                    .env("BAREWIRE_RANK", r.to_string())
                    .env("BAREWIRE_SIZE", procs.to_string())
                    .env("BAREWIRE_BASE_PORT", base.to_string())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut last = 0u128;
        for k in kids {
            let out = k.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let ns: u128 = text
                .lines()
                .find_map(|l| l.strip_prefix("MESHED "))
                .unwrap_or_else(|| panic!("a member did not mesh: {text}"))
                .parse()
                .unwrap();
            last = last.max(ns);
        }
        rows[0].reps.push((last as f64 / 1e6, 0.0));
        let t = Instant::now();
        let kids: Vec<Child> = (0..procs)
            .map(|_| Command::new(&exe).arg("--noop").spawn().unwrap())
            .collect();
        for mut k in kids {
            k.wait().unwrap();
        }
        rows[1].reps.push((t.elapsed().as_secs_f64() * 1e3, 0.0));
        eprintln!("rep {} of {reps} done", rep + 1);
    }
    reps::report(&rows, &[("meshed / spawn floor", 0, 1, "reported")]);
}

struct Swim {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Swim {
    fn spawn(bin: &std::path::Path, rank: usize, addrs: &[String]) -> Swim {
        let mut child = Command::new(bin)
            .args(["--rank", &rank.to_string(), "--bind", &addrs[rank]])
            .args(["--seeds", &addrs.join(",")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (cargo build --release --bins)", bin.display()));
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Swim { child, lines }
    }

    fn expect(&self, what: &str, within: Duration) -> bool {
        let t0 = Instant::now();
        while let Ok(l) = self.lines.recv_timeout(within.saturating_sub(t0.elapsed())) {
            if l.starts_with(what) {
                return true;
            }
        }
        false
    }
}

impl Drop for Swim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn detect(rounds: usize) {
    let bin = std::env::current_exe()
        .unwrap()
        .with_file_name("barewire-swim-node");
    let mut kill = Vec::new();
    let mut stop = Vec::new();
    for round in 0..rounds {
        let addrs: Vec<String> = (0..3)
            .map(|_| {
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                s.local_addr().unwrap().to_string()
            })
            .collect();
        let ms: Vec<Swim> = (0..3).map(|r| Swim::spawn(&bin, r, &addrs)).collect();
        for (r, m) in ms.iter().enumerate() {
            let mut left: Vec<String> = (0..3)
                .filter(|o| *o != r)
                .map(|o| format!("UP {o} "))
                .collect();
            while !left.is_empty() {
                let l = m
                    .lines
                    .recv_timeout(Duration::from_secs(10))
                    .expect("members see each other up");
                left.retain(|w| !l.starts_with(w.as_str()));
            }
        }
        // Let probing settle into its rhythm.
        std::thread::sleep(Duration::from_millis(500));
        let sig = if round % 2 == 0 {
            libc::SIGKILL
        } else {
            libc::SIGSTOP
        };
        let t0 = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(ms[2].child.id() as i32, sig) };
        assert!(ms[0].expect("DOWN 2 ", Duration::from_secs(5)));
        let first = t0.elapsed();
        assert!(ms[1].expect("DOWN 2 ", Duration::from_secs(5)));
        let both = t0.elapsed();
        if sig == libc::SIGSTOP {
            // SAFETY: as above; let it die normally on drop.
            unsafe { libc::kill(ms[2].child.id() as i32, libc::SIGCONT) };
        }
        let ms_ = |d: Duration| d.as_secs_f64() * 1e3;
        eprintln!(
            "round {}: {} -> rank 0 after {:.1} ms, both after {:.1} ms",
            round + 1,
            if sig == libc::SIGKILL {
                "SIGKILL"
            } else {
                "SIGSTOP"
            },
            ms_(first),
            ms_(both)
        );
        if sig == libc::SIGKILL {
            kill.push(ms_(both));
        } else {
            stop.push(ms_(both));
        }
    }
    let all: Vec<f64> = kill.iter().chain(&stop).copied().collect();
    let q = |v: &[f64], q: f64| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * q).round() as usize]
    };
    println!("| faults | rounds | p50 | p99 | max | target |");
    println!("|---|---|---|---|---|---|");
    for (name, v) in [("SIGKILL", &kill), ("SIGSTOP", &stop), ("all", &all)] {
        if v.is_empty() {
            continue;
        }
        println!(
            "| {name} | {} | {:.1} ms | {:.1} ms | {:.1} ms | <= 200 ms |",
            v.len(),
            median(v.to_vec()),
            q(v, 0.99),
            q(v, 1.0)
        );
    }
}
