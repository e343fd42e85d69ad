//! Distributed shared memory across three processes: a shared counter, a shared histogram
//! (a `SharedArray<u64>` spread over the three nodes) and a shared 64-byte record, all updated
//! concurrently from every node, with the totals checked at the end.
//!
//!     cargo run --release --example dsm
//!
//! The first process (rank 0) starts two copies of itself (ranks 1 and 2); each listens on a
//! loopback port, they form a full mesh, create the same shared objects, and then four tasks
//! per node each record 2,000 samples: `fetch_add` on the histogram bucket the sample falls
//! in, `update` of the counter on node 0 (a compare-and-swap loop on one word) and `update` of
//! a summary record homed on node 1 (lock, compute, fenced commit). Rank 0 then checks that no
//! update was lost.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire::dsm::{SharedArray, SharedMemory, SharedOptions};
use barewire::engine::{spawn_local, time, Runtime};
use barewire::{Error, Mesh, Node, Result};

const NODES: usize = 3;
const TASKS: u64 = 4;
const SAMPLES: u64 = 2_000;
const BUCKETS: u64 = 30;

/// A summary that must stay consistent: its fields change together or not at all.
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Summary {
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match (args.first().map(String::as_str), args.get(1)) {
        (Some("member"), Some(rank)) => member(rank.parse().unwrap_or(usize::MAX), None),
        _ => lead(),
    };
    if let Err(e) = r {
        eprintln!("dsm: {e}");
        std::process::exit(1);
    }
}

/// Rank 0: starts ranks 1 and 2, hands everyone the address list, and takes part itself.
fn lead() -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error::Invalid(e.to_string()))?;
    let mut children: Vec<Child> = (1..NODES)
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
    for c in &mut children {
        let mut line = String::new();
        BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .map_err(|e| Error::Invalid(e.to_string()))?;
        ports.push(
            line.trim()
                .strip_prefix("READY ")
                .ok_or_else(|| Error::Invalid(format!("a member said {line:?}")))?
                .to_string(),
        );
    }
    let r = member(0, Some((children.as_mut_slice(), ports)));
    for mut c in children {
        let _ = c.wait();
    }
    r
}

fn member(rank: usize, lead: Option<(&mut [Child], Vec<String>)>) -> Result<()> {
    // Three processes on what may be two CPUs: cores that sleep when idle instead of spinning
    // leave the CPU to the node whose turn it is.
    Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .map_err(|e| Error::Invalid(e.to_string()))?
        .block_on(async move {
            let node = Node::new()?;
            let port = node.listen("127.0.0.1:0".parse().unwrap())?;
            let addrs: Vec<String> = match lead {
                Some((children, ports)) => {
                    let mut all = vec![format!("127.0.0.1:{port}")];
                    all.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
                    for c in children.iter_mut() {
                        let stdin = c.stdin.as_mut().unwrap();
                        writeln!(stdin, "{}", all.join(" "))
                            .map_err(|e| Error::Invalid(e.to_string()))?;
                    }
                    all
                }
                None => {
                    println!("READY {port}");
                    let _ = std::io::stdout().flush();
                    let mut line = String::new();
                    std::io::stdin()
                        .read_line(&mut line)
                        .map_err(|e| Error::Invalid(e.to_string()))?;
                    line.split_whitespace().map(String::from).collect()
                }
            };
            let addrs = addrs
                .iter()
                .map(|a| a.parse().map_err(|e| Error::Invalid(format!("{a}: {e}"))))
                .collect::<Result<Vec<std::net::SocketAddr>>>()?;
            let mesh = Mesh::join(&node, rank, &addrs).await?;
            run(rank, &node, &mesh).await
        })
}

async fn run(rank: usize, node: &Node, mesh: &Mesh) -> Result<()> {
    let opts = SharedOptions::default();
    let counter = Rc::new(SharedMemory::<u64>::create(node, mesh, 0, opts).await?);
    let histogram = Rc::new(SharedArray::<u64>::create(node, mesh, BUCKETS, 0, opts).await?);
    let empty = Summary {
        count: 0,
        sum: 0,
        min: u64::MAX,
        max: 0,
    };
    let summary = Rc::new(SharedMemory::create(node, mesh, empty, opts).await?);
    let gate = SharedMemory::<u64>::create(node, mesh, 0, opts).await?;
    barrier(&gate, 1).await?;

    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let (counter, histogram, summary) = (counter.clone(), histogram.clone(), summary.clone());
        tasks.push(spawn_local(async move {
            let mut x = (rank as u64 * TASKS + t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for _ in 0..SAMPLES {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let sample = x % 1000;
                histogram.fetch_add(sample * BUCKETS / 1000, 1).await?;
                counter.update(0, |c| c + 1).await?;
                summary
                    .update(1, |s| Summary {
                        count: s.count + 1,
                        sum: s.sum + sample,
                        min: s.min.min(sample),
                        max: s.max.max(sample),
                    })
                    .await?;
            }
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await
            .map_err(|e| Error::Invalid(format!("a task failed: {e:?}")))??;
    }
    let took = t0.elapsed();
    let ops = TASKS * SAMPLES * 3;
    eprintln!(
        "node {rank}: {ops} shared-memory operations in {took:.2?} ({:.1} us each, {} tasks)",
        took.as_secs_f64() * 1e6 / ops as f64 * TASKS as f64,
        TASKS
    );
    barrier(&gate, 2).await?;

    if rank == 0 {
        let expected = NODES as u64 * TASKS * SAMPLES;
        let count = counter.read_from(0).await?;
        let scratch = node.region::<u64>(BUCKETS as usize, barewire::Align::Natural)?;
        histogram.get_range(0, &scratch, 0, BUCKETS).await?;
        let binned: u64 = scratch.to_vec().iter().sum();
        let s = summary.read_from(1).await?;
        println!("counter on node 0:     {count} (expected {expected})");
        println!(
            "histogram ({BUCKETS} buckets over 3 nodes): {binned} samples; buckets 0..5: {:?}",
            &scratch.to_vec()[..5]
        );
        println!(
            "summary on node 1:     count {} mean {:.1} min {} max {}",
            s.count,
            s.sum as f64 / s.count as f64,
            s.min,
            s.max
        );
        if count != expected || binned != expected || s.count != expected {
            return Err(Error::Invalid("an update was lost".into()));
        }
        println!("no update lost");
    }
    // Everyone stays until rank 0 has read what it needed.
    barrier(&gate, 3).await?;
    time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

/// Every node waits here until all have arrived (a counter on node 0).
async fn barrier(gate: &SharedMemory<u64>, round: u64) -> Result<()> {
    gate.fetch_add(0, 1).await?;
    while gate.read_from(0).await? < NODES as u64 * round {
        time::sleep(Duration::from_micros(200)).await;
    }
    Ok(())
}
