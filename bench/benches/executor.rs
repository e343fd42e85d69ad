//! Spawn + join throughput: barewire beside tokio's current_thread runtime, same machine, same
//! run. Each iteration spawns 1,000,000 trivial tasks and then joins them all.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const TASKS: u64 = 1_000_000;

fn spawn_join(c: &mut Criterion) {
    let mut g = c.benchmark_group("spawn_join_1m");
    g.throughput(Throughput::Elements(TASKS));
    g.sample_size(10);

    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .pin(true)
        .build()
        .unwrap();
    g.bench_function("barewire", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut hs = Vec::with_capacity(TASKS as usize);
                for i in 0..TASKS {
                    hs.push(barewire_engine::spawn_local(async move { i }));
                }
                let mut sum = 0;
                for h in hs {
                    sum += h.await.unwrap();
                }
                sum
            })
        })
    });

    let trt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    g.bench_function("tokio_current_thread", |b| {
        b.iter(|| {
            trt.block_on(async {
                let mut hs = Vec::with_capacity(TASKS as usize);
                for i in 0..TASKS {
                    hs.push(tokio::spawn(async move { i }));
                }
                let mut sum = 0;
                for h in hs {
                    sum += h.await.unwrap();
                }
                sum
            })
        })
    });

    let local = tokio::task::LocalSet::new();
    g.bench_function("tokio_current_thread_localset", |b| {
        b.iter(|| {
            local.block_on(&trt, async {
                let mut hs = Vec::with_capacity(TASKS as usize);
                for i in 0..TASKS {
                    hs.push(tokio::task::spawn_local(async move { i }));
                }
                let mut sum = 0;
                for h in hs {
                    sum += h.await.unwrap();
                }
                sum
            })
        })
    });

    let mut mrt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .build()
        .unwrap();
    g.bench_function("monoio", |b| {
        b.iter(|| {
            mrt.block_on(async {
                let mut hs = Vec::with_capacity(TASKS as usize);
                for i in 0..TASKS {
                    hs.push(monoio::spawn(async move { i }));
                }
                let mut sum = 0;
                for h in hs {
                    sum += h.await;
                }
                sum
            })
        })
    });
    g.finish();
}

criterion_group!(benches, spawn_join);
criterion_main!(benches);
