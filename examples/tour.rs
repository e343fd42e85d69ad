//! The tour: three nodes (three processes) on loopback over barewire's drivers — the software
//! provider where there is no RDMA hardware — showing typed one-sided operations, a channel,
//! and a fan-out, with what each costs.
//!
//!     cargo run --release --example tour
//!
//! The first process starts two more copies of itself (nodes `a` and `b`), connects to both,
//! and then:
//! 1. reads, writes and atomically updates node a's typed regions, which a registered and
//!    described to it (its CPU takes no part);
//! 2. ping-pongs 64-byte messages over a `Channel<[u8; 64]>` with a, then sends a burst;
//! 3. spreads numbers over a and b with a `DistributedChannel<u64>`, broadcasts one, and
//!    gathers each node's sum.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use barewire::engine::{time, Runtime};
use barewire::{Align, ChannelOptions, DistributedChannel, Endpoint, Node, Result};

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Sample {
    sensor: u32,
    celsius: f32,
    at_ns: u64,
}

const PINGS: usize = 10_000;

/// Slots sized for the messages (64 B), so a burst travels as runs of up to 64 per WRITE.
const CHANNEL: ChannelOptions = ChannelOptions::new(1024, 64);
const BURST: usize = 100_000;

fn runtime(cpu: usize) -> Runtime {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Runtime::builder()
        .core_ids(&[cpu % cpus])
        .idle_spin(Duration::from_micros(200))
        .build()
        .expect("runtime")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("node") => {
            let role = args.get(1).cloned().unwrap_or_default();
            runtime(1)
                .block_on(node(role.clone()))
                .map_err(|e| barewire::Error::Invalid(format!("node {role}: {e}")))
        }
        _ => lead(),
    };
    if let Err(e) = r {
        eprintln!("tour: {e}");
        std::process::exit(1);
    }
}

/// Nodes a and b: listen, accept the lead, do their part, exit when it hangs up.
async fn node(role: String) -> Result<()> {
    let node = Node::new()?;
    let port = node.listen("127.0.0.1:0".parse().unwrap())?;
    println!("READY {port}");
    let ep = node.accept().await?;
    if role == "a" {
        // Registered here, described to the lead, then left to it: the lead's reads, writes
        // and atomics below happen without this process doing anything.
        let counters = node.region::<u64>(8, Align::CacheLine)?;
        let samples = node.region::<Sample>(16, Align::Page)?;
        samples.set(
            0,
            Sample {
                sensor: 7,
                celsius: 21.5,
                at_ns: 1,
            },
        );
        ep.send_region(&counters).await?;
        ep.send_region(&samples).await?;
        let (tx, rx) = ep.open_channel::<[u8; 64]>(CHANNEL).await?;
        for _ in 0..PINGS {
            let m = rx.recv().await?;
            tx.send(&m).await?;
        }
        for _ in 0..BURST {
            rx.recv().await?;
        }
        tx.send(&[0; 64]).await?;
        println!(
            "  [node a] my counters after the lead's atomics: {:?}; samples[3] = {:?}",
            &counters.to_vec()[..3],
            samples.get(3)
        );
    }
    let dc = DistributedChannel::<u64>::open(std::slice::from_ref(&ep), Default::default()).await?;
    let mut got = Vec::new();
    loop {
        let v = dc.recv_from(0).await?;
        if v == u64::MAX {
            break;
        }
        got.push(v);
    }
    println!("  [node {role}] received {got:?}");
    dc.write_to_node(0, &got.iter().sum()).await?;
    dc.flush().await?;
    // Wait for the lead to hang up.
    let _ = dc.recv_from(0).await;
    Ok(())
}

fn spawn_node(role: &str) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["node", role])
        .stdout(Stdio::piped())
        .spawn()
        .expect("node process");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("READY ")
        .expect("READY")
        .parse()
        .unwrap();
    // Pass the node's later lines through.
    std::thread::spawn(move || {
        for l in out.lines().map_while(|l| l.ok()) {
            println!("{l}");
        }
    });
    (child, port)
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn lead() -> Result<()> {
    let (mut a, pa) = spawn_node("a");
    let (mut b, pb) = spawn_node("b");
    let r = runtime(0).block_on(async move {
        let node = Node::new()?;
        println!(
            "barewire tour: 3 nodes on loopback, device {} ({})",
            node.device().name(),
            node.device().transport()
        );
        let ea = node
            .connect(format!("127.0.0.1:{pa}").parse().unwrap())
            .await?;
        let eb = node
            .connect(format!("127.0.0.1:{pb}").parse().unwrap())
            .await?;
        // What each connection runs over: under `auto`, a peer on this host is reached through
        // shared memory; `BAREWIRE_DRIVER=soft` (what scripts/demo.sh sets) keeps the software
        // provider, iWARP over TCP, as on a machine with no RDMA device and peers elsewhere.
        println!(
            "connected to a over {} and to b over {}",
            ea.transport(),
            eb.transport()
        );
        one_sided(&ea).await?;
        channel(&ea).await?;
        fan_out(&[ea.clone(), eb.clone()]).await?;
        time::sleep(Duration::from_millis(100)).await;
        Ok(())
    });
    for c in [&mut a, &mut b] {
        let _ = c.wait();
    }
    r
}

async fn one_sided(ep: &Endpoint) -> Result<()> {
    println!("\n1. typed one-sided operations on node a's memory");
    let counters = ep.recv_region::<u64>().await?;
    let samples = ep.recv_region::<Sample>().await?;
    println!("   got {counters:?}\n   and {samples:?}");
    let s = ep.read(&samples, 0).await?;
    println!("   read samples[0] = {s:?}");
    ep.write(
        &samples,
        3,
        Sample {
            sensor: 9,
            celsius: -4.0,
            at_ns: 42,
        },
    )
    .await?;
    println!("   wrote samples[3]");
    let mut lat = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        ep.fetch_add(&counters, 0, 1).await?;
        lat.push(t.elapsed());
    }
    let old = ep.compare_and_swap(&counters, 1, 0, 99).await?;
    println!(
        "   1000 fetch_add on counters[0]: p50 {:?}, p99 {:?} (a full round trip each); compare_and_swap(counters[1], 0 -> 99) saw {old}",
        percentile(&mut lat, 0.5),
        percentile(&mut lat, 0.99)
    );
    let mut lat = Vec::new();
    for i in 0..1000u64 {
        let t = Instant::now();
        ep.write(&counters, 2, i).await?;
        lat.push(t.elapsed());
    }
    println!(
        "   1000 typed writes (each awaited until placed): p50 {:?}",
        percentile(&mut lat, 0.5)
    );
    Ok(())
}

async fn channel(ep: &Endpoint) -> Result<()> {
    println!("\n2. a Channel<[u8; 64]> with node a");
    let (tx, rx) = ep.open_channel::<[u8; 64]>(CHANNEL).await?;
    let mut lat = Vec::with_capacity(PINGS);
    for i in 0..PINGS {
        let t = Instant::now();
        tx.send(&[i as u8; 64]).await?;
        let m = rx.recv().await?;
        assert_eq!(m[0], i as u8);
        lat.push(t.elapsed() / 2);
    }
    println!(
        "   {PINGS} ping-pongs: p50 {:?}, p99 {:?} (half the round trip)",
        percentile(&mut lat, 0.5),
        percentile(&mut lat, 0.99)
    );
    let t = Instant::now();
    for i in 0..BURST {
        tx.send(&[i as u8; 64]).await?;
    }
    rx.recv().await?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "   a burst of {BURST}: {:.2} M messages/s ({:.0} MiB/s of payload), in order, none lost",
        BURST as f64 / secs / 1e6,
        BURST as f64 * 64.0 / secs / (1 << 20) as f64
    );
    Ok(())
}

async fn fan_out(eps: &[Endpoint]) -> Result<()> {
    println!("\n3. a DistributedChannel<u64> to nodes a and b");
    let dc = DistributedChannel::<u64>::open(eps, Default::default()).await?;
    let items: Vec<u64> = (1..=10).collect();
    dc.distribute(&items).await?;
    println!("   distributed {items:?} round-robin");
    dc.broadcast(&1000).await?;
    println!("   broadcast 1000");
    dc.broadcast(&u64::MAX).await?; // end of input
    let sums = dc.gather().await?;
    println!("   gathered each node's sum: {sums:?} (a: 1+3+5+7+9+1000, b: 2+4+6+8+10+1000)");
    assert_eq!(sums, vec![1025, 1030]);
    Ok(())
}
