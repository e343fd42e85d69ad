//! In-process channel figures: the engine's task-to-task channel on one core (barewire beside
//! tokio's current_thread mpsc, same machine, same run), and barewire's `Channel<[u8; 64]>`
//! between two cores of one process over the software provider (loopback TCP), both moving
//! 100,000 messages per iteration.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::time::Duration;

const N: u64 = 100_000;

fn local(c: &mut Criterion) {
    let mut g = c.benchmark_group("local_channel_100k");
    g.throughput(Throughput::Elements(N));
    g.sample_size(20);
    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .pin(true)
        .build()
        .unwrap();
    g.bench_function("barewire_mpsc", |b| {
        b.iter(|| {
            rt.block_on(async {
                let (tx, mut rx) = barewire_engine::sync::mpsc::channel::<u64>(1024);
                let p = barewire_engine::spawn_local(async move {
                    for i in 0..N {
                        tx.send(i).await.unwrap();
                    }
                });
                let mut sum = 0;
                while let Some(v) = rx.recv().await {
                    sum += v;
                }
                p.await.unwrap();
                sum
            })
        })
    });
    let trt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    g.bench_function("tokio_mpsc", |b| {
        b.iter(|| {
            trt.block_on(async {
                let (tx, mut rx) = tokio::sync::mpsc::channel::<u64>(1024);
                let p = tokio::spawn(async move {
                    for i in 0..N {
                        tx.send(i).await.unwrap();
                    }
                });
                let mut sum = 0;
                while let Some(v) = rx.recv().await {
                    sum += v;
                }
                p.await.unwrap();
                sum
            })
        })
    });
    g.finish();
}

fn rdma(c: &mut Criterion) {
    use barewire::{ChannelOptions, Node};
    let mut g = c.benchmark_group("rdma_channel_64b_100k");
    g.throughput(Throughput::Elements(N));
    g.sample_size(10);
    let opts = ChannelOptions::new(1024, 64);
    // The one-core group above pinned this thread; the two cores here are CPUs 0 and 1.
    barewire_bench::unpin();
    // A peer core that answers each batch of N messages with one.
    let (ptx, prx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = barewire_engine::Runtime::builder()
            .core_ids(&[1])
            .idle_spin(Duration::from_millis(1))
            .build()
            .unwrap();
        let _ = rt.block_on(async move {
            let node = Node::soft()?;
            ptx.send(node.listen("127.0.0.1:0".parse().unwrap())?)
                .unwrap();
            let ep = node.accept().await?;
            let (tx, rx) = ep.open_channel::<[u8; 64]>(opts).await?;
            loop {
                for _ in 0..N {
                    // Kept, so that the copy out of the ring is not compiled away.
                    std::hint::black_box(rx.recv().await?);
                }
                tx.send(&[1; 64]).await?;
            }
            #[allow(unreachable_code)]
            Ok::<_, barewire::Error>(())
        });
    });
    let port: u16 = prx.recv().unwrap();
    let rt = barewire_engine::Runtime::builder()
        .core_ids(&[0])
        .idle_spin(Duration::from_millis(1))
        .build()
        .unwrap();
    let (tx, rx) = rt.block_on(async {
        let node = Box::leak(Box::new(Node::soft().unwrap()));
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        ep.open_channel::<[u8; 64]>(opts).await.unwrap()
    });
    g.bench_function("barewire_channel", |b| {
        b.iter(|| {
            rt.block_on(async {
                for i in 0..N {
                    tx.send(&[i as u8; 64]).await.unwrap();
                }
                rx.recv().await.unwrap()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, local, rdma);
criterion_main!(benches);
