//! dsm-bench: distributed shared memory against raw RDMA READ and against redis, on two pinned
//! cores, reps interleaved (each rep runs every barewire measurement, then redis's).
//!
//! ```text
//! dsm-bench [--reps 5] [--iters 20000] [--cpus 0,1] [--no-redis]
//! ```
//!
//! barewire: this process (rank 0, first CPU) and a copy of it (rank 1, second CPU) form a
//! two-member mesh over the driver `BAREWIRE_DRIVER` picks (the software provider here); every
//! object measured lives on rank 1. Latencies are one operation at a time from one task, p50
//! and p99 over `--iters`; "read throughput" is 64 tasks on one core reading for 0.5 s;
//! "contended update" is 4 tasks updating one 64-byte object, 2,000 updates each.
//!
//! redis: Debian's `redis-server` on the second CPU, `redis-benchmark` on the first, GET and
//! INCR with one client (p50), GET with 50 clients (requests/s).

use clap::Parser;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire::dsm::{SharedArray, SharedOptions};
use barewire::engine::{spawn_local, time};
use barewire::{Align, Mesh, Node};
use barewire_bench::perf::peers::{self, redis::Redis, Params, Peer};
use barewire_bench::reps::{self, histogram, latency, spinning_runtime, Row};

type Wide = [u64; 8];

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "dsm-bench",
    about = "Distributed shared memory against raw RDMA READ and against redis"
)]
struct Cli {
    /// Reps, interleaved (each runs every barewire measurement, then redis's).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Operations per latency figure.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// The CPUs of rank 0 (and redis-benchmark) and rank 1 (and redis-server).
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpus: [usize; 2],
    /// Leave redis out.
    #[arg(long)]
    no_redis: bool,
    /// Rank 1, which this program starts itself: CPU and the leader's address.
    #[arg(long, num_args = 2, value_names = ["CPU", "LEAD"], hide = true)]
    serve: Option<Vec<String>>,
}

fn main() {
    let cli = Cli::parse();
    if let Some(args) = cli.serve.as_deref() {
        return barewire_bench::serve_rank1(args, serve);
    }
    let rows = spinning_runtime(cli.cpus[0]).block_on(lead(
        cli.reps as usize,
        cli.iters,
        cli.cpus,
        !cli.no_redis,
    ));
    report(&rows);
}

/// Two members: rank 0 here, rank 1 in the child. The objects measured are homed on rank 1.
struct Objects {
    mesh: Mesh,
    words: SharedArray<u64>,
    wides: SharedArray<Wide>,
    raw8: barewire::RemoteRegion<u64>,
    raw64: barewire::RemoteRegion<u64>,
}

async fn setup(node: &Node, rank: usize, addrs: &[std::net::SocketAddr]) -> Objects {
    let mesh = Mesh::join(node, rank, addrs).await.unwrap();
    let opts = SharedOptions::default();
    // Two elements over two members: element 1 lives on rank 1.
    let words = SharedArray::<u64>::create(node, &mesh, 2, 0, opts)
        .await
        .unwrap();
    let wides = SharedArray::<Wide>::create(node, &mesh, 2, [0; 8], opts)
        .await
        .unwrap();
    let other = mesh.endpoint(1 - rank);
    let raw = node.region::<u64>(16, Align::CacheLine).unwrap();
    other.send_region(&raw).await.unwrap();
    other.send_region(&raw).await.unwrap();
    let raw8 = other.recv_region::<u64>().await.unwrap();
    let raw64 = other.recv_region::<u64>().await.unwrap();
    std::mem::forget(raw); // lives as long as the process
    Objects {
        mesh,
        words,
        wides,
        raw8,
        raw64,
    }
}

async fn serve(lead: std::net::SocketAddr) {
    let node = Node::new().unwrap();
    let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    println!("READY {port}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let me = format!("127.0.0.1:{port}").parse().unwrap();
    let _objs = setup(&node, 1, &[lead, me]).await;
    // Serve (the provider's poller answers every operation) until the lead kills this process.
    loop {
        time::sleep(Duration::from_secs(1)).await;
    }
}

async fn lead(reps: usize, iters: u64, cpus: [usize; 2], redis: bool) -> Vec<Row> {
    let (node, addrs, mut child) = barewire_bench::lead_pair(cpus[1]);
    let objs = Rc::new(setup(&node, 0, &addrs).await);
    let mut rows = Row::named(&[
        ("raw READ 8 B p50", "us"),
        ("read_from 8 B (word) p50", "us"),
        ("raw READ 64 B p50", "us"),
        ("read_from 64 B (wide) p50", "us"),
        ("update 64 B p50", "us"),
        ("update 8 B (word) p50", "us"),
        ("fetch_add p50", "us"),
        ("read throughput, 64 tasks on one core", "k ops/s"),
        ("contended update, 4 writers on one 64 B key", "k ops/s"),
        ("redis GET p50, 1 client", "us"),
        ("redis INCR p50, 1 client", "us"),
        ("redis GET, 50 clients", "k ops/s"),
    ]);
    // redis (bench/src/perf/peers/redis.rs): GET and INCR p50 with one client, GET with 50.
    let redis_runs = if !redis {
        None
    } else if let Err(how) = barewire_bench::apt::tool("redis-server", "redis-server")
        .and_then(|()| barewire_bench::apt::tool("redis-benchmark", "redis-tools"))
    {
        eprintln!(
            "dsm-bench: redis-server or redis-benchmark not found ({how}); redis rows skipped"
        );
        None
    } else {
        Some(Redis.runs(&Params { iters, secs: 0 }))
    };
    for rep in 0..reps {
        let o = objs.clone();
        let mut put = |i: usize, v: (f64, f64)| rows[i].reps.push(v);
        put(
            0,
            latency(iters, |_| async {
                o.mesh
                    .endpoint(1)
                    .read(&o.raw8, 0)
                    .await
                    .map(|_| ())
                    .unwrap()
            })
            .await,
        );
        put(
            1,
            latency(iters, |_| async {
                o.words.get(1).await.map(|_| ()).unwrap()
            })
            .await,
        );
        put(
            2,
            latency(iters, |_| async {
                o.mesh
                    .endpoint(1)
                    .read_slice(&o.raw64, 0, 8)
                    .await
                    .map(|_| ())
                    .unwrap()
            })
            .await,
        );
        put(
            3,
            latency(iters, |_| async {
                o.wides.get(1).await.map(|_| ()).unwrap()
            })
            .await,
        );
        put(
            4,
            latency(iters, |_| async {
                o.wides
                    .update(1, |v| [v[0] + 1; 8])
                    .await
                    .map(|_| ())
                    .unwrap()
            })
            .await,
        );
        put(
            5,
            latency(iters, |_| async {
                o.words.update(1, |v| v + 1).await.map(|_| ()).unwrap()
            })
            .await,
        );
        put(
            6,
            latency(iters, |_| async {
                o.words.fetch_add(1, 1).await.map(|_| ()).unwrap()
            })
            .await,
        );
        put(7, (read_throughput(&o).await, 0.0));
        put(8, contended(&o).await);
        for (i, run) in redis_runs.iter().flatten().enumerate() {
            match peers::measure(cpus, &[], run) {
                Ok(v) => put(9 + i, (v, 0.0)),
                Err(e) => eprintln!("dsm-bench: redis {e}"),
            }
        }
        eprintln!("rep {} of {reps} done", rep + 1);
    }
    drop(objs);
    let _ = child.kill();
    let _ = child.wait();
    rows
}

async fn read_throughput(o: &Rc<Objects>) -> f64 {
    let stop = Instant::now() + Duration::from_millis(500);
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let o = o.clone();
        tasks.push(spawn_local(async move {
            let mut n = 0u64;
            while Instant::now() < stop {
                o.words.get(1).await.unwrap();
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total as f64 / 0.5 / 1e3
}

async fn contended(o: &Rc<Objects>) -> (f64, f64) {
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let o = o.clone();
        tasks.push(spawn_local(async move {
            let mut h = histogram();
            for _ in 0..2_000 {
                let t = Instant::now();
                o.wides.update(1, |v| [v[0] + 1; 8]).await.unwrap();
                h.record(t.elapsed().as_nanos() as u64).unwrap();
            }
            h
        }));
    }
    let mut all = histogram();
    for t in tasks {
        all.add(t.await.unwrap()).unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    (
        8_000.0 / secs / 1e3,
        all.value_at_quantile(0.99) as f64 / 1e3,
    )
}

fn report(rows: &[Row]) {
    reps::report(
        rows,
        &[
            ("read_from 8 B / raw READ 8 B", 1, 0, "<= 1.15x"),
            ("read_from 64 B / raw READ 64 B", 3, 2, "<= 1.15x"),
            ("update 64 B / raw READ 8 B", 4, 0, "<= 3.5x"),
            ("read_from 8 B / redis GET, 1 client", 1, 9, "<= 0.2x"),
            ("fetch_add / redis INCR, 1 client", 6, 10, "<= 0.2x"),
            (
                "read throughput, one core / redis GET, 50 clients",
                7,
                11,
                ">= 2x",
            ),
        ],
    );
}
