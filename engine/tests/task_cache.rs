//! The per-core cache of finished tasks' cells (`Builder::task_cache`): a spawn reuses a cell
//! of its size, every task still gets its own future and output intact, and cells that stay
//! unused for the keep interval go back to the allocator, on a core that sleeps and on one that
//! never does.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use barewire_engine::time::sleep;
use barewire_engine::{spawn_local, stats, yield_now, Runtime};

fn rt(keep: Duration) -> Runtime {
    Runtime::builder()
        .cores(1)
        .sleeping()
        .task_cache(keep)
        .build()
        .expect("runtime")
}

#[test]
fn a_finished_tasks_cell_serves_the_next_spawn_of_its_size() {
    rt(Duration::from_secs(60)).block_on(async {
        let s0 = stats();
        assert_eq!(spawn_local(async { 1u64 }).await.unwrap(), 1);
        let s1 = stats();
        assert_eq!(s1.task_cells_cached, s0.task_cells_cached + 1);
        assert_eq!(s1.task_cells_reused, s0.task_cells_reused);
        // Same size: the cell comes back.
        assert_eq!(spawn_local(async { 2u64 }).await.unwrap(), 2);
        let s2 = stats();
        assert_eq!(s2.task_cells_reused, s1.task_cells_reused + 1);
        assert_eq!(s2.task_cells_cached, s1.task_cells_cached);
        // Another size: a cell of its own.
        let big = [7u8; 200];
        let sum = spawn_local(async move { big.iter().map(|&b| b as u64).sum::<u64>() });
        assert_eq!(sum.await.unwrap(), 1400);
        let s3 = stats();
        assert_eq!(s3.task_cells_reused, s2.task_cells_reused);
        assert_eq!(s3.task_cells_cached, s2.task_cells_cached + 1);
    });
}

/// Tasks of several sizes, each carrying a pattern of its own, spawned and finished in an order
/// that hands every cell from one task to the next many times over: each must see exactly its
/// own bytes, and each future and output is dropped once.
#[test]
fn reused_cells_carry_each_tasks_own_future_and_output() {
    struct Counted(Rc<Cell<u64>>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
    fn task<const N: usize>(
        tag: u8,
        drops: Rc<Cell<u64>>,
    ) -> impl std::future::Future<Output = (Vec<u8>, Counted)> {
        let bytes = [tag; N];
        let c = Counted(drops.clone());
        async move {
            yield_now().await;
            let _c = c;
            (bytes.to_vec(), Counted(drops))
        }
    }
    rt(Duration::from_secs(60)).block_on(async {
        let drops = Rc::new(Cell::new(0));
        let mut spawned = 0u64;
        for round in 0..200u32 {
            let tag = round as u8;
            let a = spawn_local(task::<8>(tag, drops.clone()));
            let b = spawn_local(task::<40>(tag.wrapping_add(1), drops.clone()));
            let c = spawn_local(task::<8>(tag.wrapping_add(2), drops.clone()));
            let d = spawn_local(task::<300>(tag.wrapping_add(3), drops.clone()));
            spawned += 4;
            // Finish them out of spawn order, so the free lists' order changes every round.
            for (h, n, t) in [(c, 8, 2u8), (a, 8, 0), (d, 300, 3), (b, 40, 1)] {
                let (bytes, out) = h.await.unwrap();
                assert_eq!(bytes, vec![tag.wrapping_add(t); n], "round {round}");
                drop(out);
            }
        }
        assert_eq!(
            drops.get(),
            2 * spawned,
            "each future and output dropped once"
        );
        assert!(
            stats().task_cells_reused >= spawned - 8,
            "after the first round every spawn finds a cell: {:?}",
            stats()
        );
    });
}

/// Spawns and joins `n` tasks; returns how many cells the core caches afterwards.
async fn burst(n: u64) -> u64 {
    let hs: Vec<_> = (0..n).map(|i| spawn_local(async move { i })).collect();
    let mut sum = 0;
    for h in hs {
        sum += h.await.unwrap();
    }
    assert_eq!(sum, n * (n - 1) / 2);
    stats().task_cells_cached
}

/// More cells than one look gives back, so the release takes several looks.
const BURST: u64 = 10_000;

#[test]
fn a_sleeping_core_gives_back_cells_unused_for_the_keep_interval() {
    rt(Duration::from_millis(50)).block_on(async {
        let cached = burst(BURST).await;
        assert!(cached >= BURST, "the burst's cells are cached: {cached}");
        // The next burst runs on them.
        let reused = stats().task_cells_reused;
        burst(BURST).await;
        assert!(stats().task_cells_reused >= reused + BURST);
        // Idle: the core sleeps on a timer far off, waking only for the cache.
        let t0 = Instant::now();
        let mut seen = Vec::new();
        while stats().task_cells_cached > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "cells still cached 10 s after the last use: {seen:?}"
            );
            sleep(Duration::from_millis(20)).await;
            seen.push(stats().task_cells_cached);
        }
        // Not given back within the first interval: the cells were used in it.
        assert!(
            t0.elapsed() >= Duration::from_millis(50),
            "released after {:?}",
            t0.elapsed()
        );
    });
}

#[test]
fn a_busy_core_gives_back_cells_unused_for_the_keep_interval() {
    rt(Duration::from_millis(50)).block_on(async {
        assert!(burst(BURST).await >= BURST);
        let sleeps = stats().sleeps;
        let t0 = Instant::now();
        while stats().task_cells_cached > 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "cells still cached 10 s after the last use: {:?}",
                stats()
            );
            yield_now().await;
        }
        assert_eq!(stats().sleeps, sleeps, "the core never slept");
    });
}

#[test]
fn a_zero_keep_caches_nothing() {
    rt(Duration::ZERO).block_on(async {
        assert_eq!(burst(1000).await, 0);
        burst(1000).await;
        assert_eq!(stats().task_cells_reused, 0);
    });
}

/// A task whose last reference goes on another thread (a waker it handed out) is freed there,
/// to the allocator: the owner's cache, which only its thread touches, does not change.
#[test]
fn a_cell_freed_on_another_thread_bypasses_the_cache() {
    rt(Duration::from_secs(60)).block_on(async {
        let slot: Arc<Mutex<Option<Waker>>> = Arc::default();
        let s = slot.clone();
        let h = spawn_local(std::future::poll_fn(move |cx| {
            *s.lock().unwrap() = Some(cx.waker().clone());
            Poll::Ready(5u32)
        }));
        assert_eq!(h.await.unwrap(), 5);
        // The handle is gone, the task finished; the waker keeps the cell alive.
        let before = stats();
        let w = slot.lock().unwrap().take().expect("the task's waker");
        std::thread::spawn(move || drop(w)).join().unwrap();
        let after = stats();
        assert_eq!(after.task_cells_cached, before.task_cells_cached);
    });
}
