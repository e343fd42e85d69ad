//! Distributed shared memory between nodes of one test process (over `BAREWIRE_DRIVER`: the
//! software provider by default; on verbs where a device exists, else the tests say SKIP) (each node its own thread and
//! core, meshed over the software provider on loopback): exact counting under concurrency from
//! every node, lease breaking and fencing, bulk ranges, bounds. The multi-process
//! linearizability checks with faults are in `dsm_linearizability.rs`.

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use barewire::dsm::{SharedArray, SharedMemory, SharedOptions};
use barewire::engine::{spawn_local, time};
use barewire::{Align, Error, Mesh, Node};

/// Runs `body(rank, node, mesh)` on `n` nodes, one thread each, meshed on loopback.
fn cluster<F, Fut>(n: usize, body: F)
where
    F: Fn(usize, Node, Mesh) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + 'static,
{
    common::meshed(n, body)
}

/// The last barrier of a test: every member arrived, then a pause before anyone drops its
/// objects and connections (dropping a shared object is collective: the others may still be
/// reading the barrier counter).
async fn finish(b: &SharedMemory<u64>, n: usize, round: u64) {
    barrier(b, n, round).await;
    time::sleep(Duration::from_millis(300)).await;
}

/// Waits until every member arrived (a counter on rank 0 reaching `n * round`).
async fn barrier(b: &SharedMemory<u64>, n: usize, round: u64) {
    b.fetch_add(0, 1).await.unwrap();
    let t0 = Instant::now();
    while b.read_from(0).await.unwrap() < n as u64 * round {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "barrier {round} timed out"
        );
        time::sleep(Duration::from_millis(1)).await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Wide {
    count: u64,
    /// Every update writes `count * 3` here and `!count` below: a reader that saw parts of two
    /// versions would find them disagreeing.
    triple: u64,
    pad: [u32; 6],
    inverse: u64,
}

impl Wide {
    fn of(count: u64) -> Wide {
        Wide {
            count,
            triple: count * 3,
            pad: [count as u32; 6],
            inverse: !count,
        }
    }
    fn consistent(&self) -> bool {
        *self == Wide::of(self.count)
    }
}

#[test]
fn counters_updated_from_every_node_end_exact() {
    const TASKS: u64 = 4;
    const EACH: u64 = 150;
    cluster(3, |rank, node, mesh| async move {
        let bar = SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default())
            .await
            .unwrap();
        let wide = std::rc::Rc::new(
            SharedMemory::create(&node, &mesh, Wide::of(0), SharedOptions::default())
                .await
                .unwrap(),
        );
        let word = std::rc::Rc::new(
            SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default())
                .await
                .unwrap(),
        );
        barrier(&bar, 3, 1).await;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (wide, word) = (wide.clone(), word.clone());
            tasks.push(spawn_local(async move {
                for k in 0..EACH {
                    // Every task hits node 1's objects; spread the rest over all nodes.
                    let target = if k % 2 == 0 {
                        1
                    } else {
                        (t as usize + k as usize) % 3
                    };
                    let w = wide
                        .update(target, |v| Wide::of(v.count + 1))
                        .await
                        .unwrap();
                    assert!(w.consistent());
                    word.update(target, |v| v + 1).await.unwrap();
                    word.fetch_add(target, 1).await.unwrap();
                    let seen = wide.read_from(target).await.unwrap();
                    assert!(seen.consistent(), "torn read {seen:?}");
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        barrier(&bar, 3, 2).await;
        if rank == 0 {
            let mut total_wide = 0;
            let mut total_word = 0;
            for j in 0..3 {
                total_wide += wide.read_from(j).await.unwrap().count;
                total_word += word.read_from(j).await.unwrap();
            }
            assert_eq!(total_wide, 3 * TASKS * EACH);
            assert_eq!(total_word, 2 * 3 * TASKS * EACH);
        }
        finish(&bar, 3, 3).await;
    });
}

#[test]
fn a_stopped_holder_is_broken_after_its_lease_and_its_late_commit_is_fenced() {
    let lease = Duration::from_millis(30);
    cluster(2, move |rank, node, mesh| async move {
        let bar = SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default())
            .await
            .unwrap();
        let obj = SharedArray::create(
            &node,
            &mesh,
            2,
            Wide::of(5),
            SharedOptions::with_lease(lease),
        )
        .await
        .unwrap();
        if rank == 1 {
            // Play a holder of element 0's lock (homed on rank 0) that stops.
            let lock = obj.hold_lock_for_test(0).await.unwrap();
            barrier(&bar, 2, 1).await;
            // Rank 0 broke the lease and committed; this holder comes back late.
            barrier(&bar, 2, 2).await;
            assert!(!obj.commit_for_test(0, lock, Wide::of(1000)).await.unwrap());
            assert_eq!(obj.get(0).await.unwrap(), Wide::of(6));
            finish(&bar, 2, 3).await;
        } else {
            barrier(&bar, 2, 1).await;
            let t0 = Instant::now();
            let v = obj.update(0, |v| Wide::of(v.count + 1)).await.unwrap();
            let waited = t0.elapsed();
            assert_eq!(v, Wide::of(6));
            assert!(
                waited >= lease,
                "took the lock after {waited:?}, before the lease ran out"
            );
            assert!(
                waited < lease * 20,
                "waited {waited:?} for a {lease:?} lease"
            );
            assert_eq!(obj.lease_breaks(), 1);
            barrier(&bar, 2, 2).await;
            finish(&bar, 2, 3).await;
            assert_eq!(obj.get(0).await.unwrap(), Wide::of(6));
        }
    });
}

#[test]
fn ranges_move_between_regions_and_homes() {
    cluster(3, |rank, node, mesh| async move {
        let bar = SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default())
            .await
            .unwrap();
        // 10 elements over 3 nodes: blocks of 4, 4 and 2.
        let words = SharedArray::<u64>::create(&node, &mesh, 10, 7, SharedOptions::default())
            .await
            .unwrap();
        let wide = SharedArray::create(&node, &mesh, 10, Wide::of(0), SharedOptions::default())
            .await
            .unwrap();
        assert_eq!(
            (0..10).map(|i| words.home_of(i)).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
        );
        barrier(&bar, 3, 1).await;
        if rank == 2 {
            let src = node.region::<u64>(12, Align::CacheLine).unwrap();
            src.copy_from(0, &(100..112).collect::<Vec<u64>>());
            words.put_range(1, &src, 2, 8).await.unwrap();
            let wsrc = node.region::<Wide>(10, Align::CacheLine).unwrap();
            wsrc.copy_from(0, &(0..10).map(Wide::of).collect::<Vec<_>>());
            wide.put_range(0, &wsrc, 0, 10).await.unwrap();
        }
        barrier(&bar, 3, 2).await;
        let dst = node.region::<u64>(10, Align::Natural).unwrap();
        words.get_range(0, &dst, 0, 10).await.unwrap();
        assert_eq!(dst.to_vec(), [7, 102, 103, 104, 105, 106, 107, 108, 109, 7]);
        let wdst = node.region::<Wide>(10, Align::Natural).unwrap();
        wide.get_range(3, &wdst, 1, 6).await.unwrap();
        assert_eq!(wdst.get(1), Wide::of(3));
        assert_eq!(wdst.get(6), Wide::of(8));
        assert!(matches!(
            words.get_range(5, &dst, 0, 6).await,
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            words.get_range(0, &dst, 5, 6).await,
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            words.get(10).await,
            Err(Error::OutOfBounds { .. })
        ));
        finish(&bar, 3, 3).await;
    });
}
