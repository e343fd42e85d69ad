//! Channels between two nodes (two cores): a `Channel<[u8; 64]>` ping-pong with its latency,
//! a burst that shows the throughput, and a BARE-encoded channel of an enum.
//!
//!     cargo run --release --example channels

use std::time::{Duration, Instant};

use barewire::engine::Runtime;
use barewire::{ChannelOptions, Node};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, PartialEq)]
enum Command {
    Put { key: String, value: Vec<u8> },
    Delete { key: String },
    Done,
}

fn rt(cpu: usize) -> Runtime {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    Runtime::builder()
        .core_ids(&[cpu % n])
        .idle_spin(Duration::from_millis(1))
        .build()
        .expect("runtime")
}

const PINGS: u64 = 20_000;
const OPTS: ChannelOptions = ChannelOptions::new(1024, 64);
const BURST: u64 = 200_000;

fn main() -> barewire::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let peer = std::thread::spawn(move || -> barewire::Result<()> {
        rt(1).block_on(async move {
            let node = Node::new()?;
            tx.send(node.listen("127.0.0.1:0".parse().unwrap())?)
                .unwrap();
            let ep = node.accept().await?;
            let (t, r) = ep.open_channel::<[u8; 64]>(OPTS).await?;
            for _ in 0..PINGS {
                let m = r.recv().await?;
                t.send(&m).await?;
            }
            for _ in 0..BURST {
                r.recv().await?;
            }
            t.send(&[0; 64]).await?;
            let (_t, cmds) = ep.open_bare_channel::<Command>(Default::default()).await?;
            loop {
                let c = cmds.recv().await?;
                println!("peer got {c:?}");
                if c == Command::Done {
                    break;
                }
            }
            // Stay connected while the other side's flush completes.
            barewire::engine::time::sleep(Duration::from_millis(100)).await;
            Ok(())
        })
    });
    let port = rx.recv().unwrap();
    rt(0).block_on(async move {
        let node = Node::new()?;
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await?;
        let (t, r) = ep.open_channel::<[u8; 64]>(OPTS).await?;
        let mut lat = Vec::with_capacity(PINGS as usize);
        for i in 0..PINGS {
            let t0 = Instant::now();
            t.send(&[i as u8; 64]).await?;
            let m = r.recv().await?;
            assert_eq!(m[0], i as u8);
            lat.push(t0.elapsed() / 2);
        }
        lat.sort();
        println!(
            "64 B ping-pong: p50 {:?} p99 {:?} (half the round trip)",
            lat[lat.len() / 2],
            lat[lat.len() * 99 / 100]
        );
        let s0 = barewire::engine::stats();
        let t0 = Instant::now();
        for i in 0..BURST {
            t.send(&[i as u8; 64]).await?;
        }
        r.recv().await?; // the peer has everything
        let secs = t0.elapsed().as_secs_f64();
        if std::env::var_os("BAREWIRE_STATS").is_some() {
            let s1 = barewire::engine::stats();
            eprintln!(
                "burst: sleeps {} passes {} polls {}",
                s1.sleeps - s0.sleeps,
                s1.poller_passes - s0.poller_passes,
                s1.tasks_polled - s0.tasks_polled
            );
        }
        println!(
            "64 B burst: {BURST} messages in {:.3} s = {:.2} M msg/s",
            secs,
            BURST as f64 / secs / 1e6
        );
        let (cmds, _r) = ep.open_bare_channel::<Command>(Default::default()).await?;
        cmds.send(&Command::Put {
            key: "k1".into(),
            value: vec![1, 2, 3],
        })
        .await?;
        cmds.send(&Command::Delete { key: "k0".into() }).await?;
        cmds.send(&Command::Done).await?;
        cmds.flush().await?;
        Ok::<_, barewire::Error>(())
    })?;
    peer.join().unwrap()
}
