//! The main job for now: a TCP echo across two pinned cores, with a latency summary.
//!
//! Core 0 runs the client, core 1 the server, each pinned (when the machine has two cores).
//! The client does a warm-up, then `ROUNDS` ping-pongs of 64 bytes on one connection, then a
//! throughput phase on 16 connections, and prints what happened.
//!
//!     cargo run --release --example echo [-- ROUNDS]

use std::time::{Duration, Instant};

use barewire::engine::net::{TcpListener, TcpStream};
use barewire::engine::sync::cross;
use barewire::engine::{spawn_local, spawn_on, Runtime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rounds: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let cores = std::thread::available_parallelism()?.get().min(2);
    let rt = Runtime::builder()
        .cores(cores)
        .pin(true)
        .idle_spin(Duration::from_micros(50))
        .build()?;
    let server_core = cores - 1;
    println!("barewire echo: {cores} core(s), reactor {:?}, client on core 0, server on core {server_core}", rt.reactor());

    let (lat, tput) = rt.block_on(async move {
        let (mut addr_tx, mut addr_rx) = cross::channel(1);
        let server = spawn_on(server_core, move || async move {
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            addr_tx.send(l.local_addr().unwrap()).await.unwrap();
            let mut incoming = l.incoming();
            for _ in 0..17 {
                let s = incoming.next().await.unwrap();
                spawn_local(async move {
                    let mut buf = vec![0u8; 4096];
                    loop {
                        let (n, b) = s.read(buf).await;
                        match n {
                            Ok(0) | Err(_) => return,
                            Ok(n) => {
                                let (r, b) = s.write_all(b[..n].to_vec()).await;
                                if r.is_err() {
                                    return;
                                }
                                buf = b;
                                buf.resize(4096, 0);
                            }
                        }
                    }
                });
            }
        });
        let addr = addr_rx.recv().await.unwrap();

        // Ping-pong latency on one connection.
        let c = TcpStream::connect(addr).await.unwrap();
        let mut samples = Vec::with_capacity(rounds);
        let mut msg = vec![7u8; 64];
        for i in 0..rounds + 1000 {
            let t0 = Instant::now();
            let (r, m) = c.write_all(msg).await;
            r.unwrap();
            let (r, m) = c.read_exact(m).await;
            r.unwrap();
            msg = m;
            if i >= 1000 {
                samples.push(t0.elapsed());
            }
        }
        drop(c);

        // Throughput: 16 connections, 1 KiB messages, for one second.
        let deadline = Instant::now() + Duration::from_secs(1);
        let workers: Vec<_> = (0..16)
            .map(|_| {
                spawn_local(async move {
                    let c = TcpStream::connect(addr).await.unwrap();
                    let mut n = 0u64;
                    let mut buf = vec![1u8; 1024];
                    while Instant::now() < deadline {
                        let (r, b) = c.write_all(buf).await;
                        r.unwrap();
                        let (r, b) = c.read_exact(b).await;
                        r.unwrap();
                        buf = b;
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut total = 0;
        for w in workers {
            total += w.await.unwrap();
        }
        server.await.unwrap();
        (samples, total)
    });

    let mut lat = lat;
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)];
    println!("ping-pong 64 B, {} round trips:", lat.len());
    println!(
        "  min {:?}  p50 {:?}  p99 {:?}  p99.9 {:?}  max {:?}",
        lat[0],
        pct(0.5),
        pct(0.99),
        pct(0.999),
        lat[lat.len() - 1]
    );
    println!(
        "echo 1 KiB on 16 connections for 1 s: {tput} round trips ({:.1} MiB/s each way)",
        tput as f64 * 1024.0 / (1 << 20) as f64
    );
    for s in rt.stats() {
        println!(
            "  core {}: {} tasks polled, {} poller passes, {} sleeps, {} ops submitted, {} completed",
            s.core, s.tasks_polled, s.poller_passes, s.sleeps, s.ops_submitted, s.ops_completed
        );
    }
    Ok(())
}
