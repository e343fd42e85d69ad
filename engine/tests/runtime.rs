//! Spawning, joining, cancelling, panics, cross-core spawns and wake-ups, configuration errors.

mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use barewire_engine::time::{sleep, timeout};
use barewire_engine::{spawn_local, spawn_on, yield_now, Error, Runtime};
use common::rt;

#[test]
fn spawned_tasks_join_with_their_outputs() {
    let rt = rt(1);
    common::expect_reactor(&rt);
    let total = rt.block_on(async {
        let handles: Vec<_> = (0..1000u64)
            .map(|i| spawn_local(async move { i * 2 }))
            .collect();
        let mut sum = 0;
        for h in handles {
            sum += h.await.unwrap();
        }
        sum
    });
    assert_eq!(total, 999 * 1000);
}

#[test]
fn tasks_awaiting_tasks_are_woken_and_a_cancelled_waiter_is_let_go() {
    let rt = rt(1);
    rt.block_on(async {
        // A chain: each task awaits the one it spawned (the join slot keeps the awaiting task).
        fn chain(depth: u32) -> std::pin::Pin<Box<dyn std::future::Future<Output = u32>>> {
            Box::pin(async move {
                if depth == 0 {
                    yield_now().await;
                    return 0;
                }
                spawn_local(chain(depth - 1)).await.unwrap() + 1
            })
        }
        assert_eq!(spawn_local(chain(500)).await.unwrap(), 500);
        // A waiter cancelled while it waits: the awaited task still completes, and waking the
        // (gone) waiter is harmless.
        let gate = std::rc::Rc::new(std::cell::Cell::new(false));
        let g = gate.clone();
        let slow = spawn_local(async move {
            while !g.get() {
                yield_now().await;
            }
            7
        });
        let waiter = spawn_local(async move { slow.await.unwrap() });
        yield_now().await;
        yield_now().await;
        waiter.cancel();
        assert!(waiter.await.unwrap_err().is_cancelled());
        gate.set(true);
        for _ in 0..4 {
            yield_now().await;
        }
        // One task awaiting through a combinator (another waker than its own): select-like.
        let a = spawn_local(async {
            yield_now().await;
            1
        });
        let b = spawn_local(async move {
            let mut a = a;
            std::future::poll_fn(|cx| {
                // A waker of our own making, not the task's: it is boxed in the slot.
                let w = std::task::Waker::from(std::sync::Arc::new(Forward(cx.waker().clone())));
                std::future::Future::poll(
                    std::pin::Pin::new(&mut a),
                    &mut std::task::Context::from_waker(&w),
                )
            })
            .await
            .unwrap()
                + 1
        });
        assert_eq!(b.await.unwrap(), 2);
    });
}

/// A waker that wakes another.
struct Forward(std::task::Waker);

impl std::task::Wake for Forward {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.wake_by_ref();
    }
}

#[test]
fn a_join_handle_is_one_word() {
    // Local and spawn_on handles share one tagged word; both kinds work (the tests around).
    assert_eq!(
        std::mem::size_of::<barewire_engine::JoinHandle<u64>>(),
        std::mem::size_of::<usize>()
    );
    assert_eq!(
        std::mem::size_of::<barewire_engine::JoinHandle<[u8; 100]>>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn cancel_drops_the_future_and_reports_cancelled() {
    let rt = rt(1);
    rt.block_on(async {
        struct Flag(Rc<Cell<bool>>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.set(true);
            }
        }
        let dropped = Rc::new(Cell::new(false));
        let flag = Flag(dropped.clone());
        let h = spawn_local(async move {
            let _f = flag;
            sleep(Duration::from_secs(3600)).await;
            1
        });
        yield_now().await;
        assert!(!h.is_finished());
        h.cancel();
        let r = h.await;
        assert!(matches!(r, Err(e) if e.is_cancelled()));
        assert!(dropped.get(), "the cancelled future was dropped");
    });
}

/// Counts its drops: a task's future or output that is dropped twice, or never, shows here.
#[derive(Debug)]
struct Counted(Rc<Cell<u32>>);
impl Drop for Counted {
    fn drop(&mut self) {
        self.0.set(self.0.get() + 1);
    }
}

#[test]
fn every_future_and_output_is_dropped_once_on_every_path() {
    let rt = rt(1);
    rt.block_on(async {
        let n = Rc::new(Cell::new(0));
        let counted = || Counted(n.clone());
        // Joined: the output goes to the awaiter, which drops it; the future went at completion.
        let (f, o) = (counted(), counted());
        let out = spawn_local(async move {
            drop(f);
            o
        })
        .await
        .unwrap();
        assert_eq!(n.get(), 1, "the future went at completion");
        drop(out);
        assert_eq!(n.get(), 2, "the output went with the awaiter's value");
        // Detached before it finished: the core drops the output when it completes.
        n.set(0);
        let (f, o) = (counted(), counted());
        drop(spawn_local(async move {
            let _f = f;
            yield_now().await;
            o
        }));
        for _ in 0..4 {
            yield_now().await;
        }
        assert_eq!(
            n.get(),
            2,
            "a detached task's future and output were each dropped once"
        );
        // Finished, then its handle dropped unread: the handle drops the output.
        n.set(0);
        let o = counted();
        let h = spawn_local(async move { o });
        while !h.is_finished() {
            yield_now().await;
        }
        assert_eq!(n.get(), 0, "the output is kept for the handle");
        drop(h);
        assert_eq!(n.get(), 1, "the unread output went with its handle");
        // Cancelled while pending: the future (holding what would have been the output) goes.
        n.set(0);
        let o = counted();
        let h = spawn_local(async move {
            sleep(Duration::from_secs(3600)).await;
            o
        });
        yield_now().await;
        h.cancel();
        assert!(h.await.unwrap_err().is_cancelled());
        assert_eq!(n.get(), 1, "the cancelled future was dropped once");
        // Panicked: the future goes once, and the error is the output.
        n.set(0);
        let f = counted();
        let h = spawn_local(async move {
            let _f = f;
            if true {
                panic!("a counted panic");
            }
            Counted(Rc::new(Cell::new(0)))
        });
        assert!(h.await.unwrap_err().is_panic());
        assert_eq!(n.get(), 1, "the panicked future was dropped once");
    });
}

#[test]
fn a_task_costs_its_header_beyond_the_larger_of_its_future_and_output() {
    fn overhead<F: std::future::Future>(_: &F) -> usize {
        barewire_engine::task_overhead_bytes::<F>()
    }
    // A future and an output of two words and one: no tag beside them (the header's local word
    // says which is live), so a task costs seven words beyond its future.
    let x = 3u64;
    let fut = async move {
        yield_now().await;
        x
    };
    assert!(std::mem::size_of_val(&fut) >= 8);
    assert_eq!(overhead(&fut), 7 * std::mem::size_of::<usize>());
}

#[test]
fn cancel_after_completion_keeps_the_output() {
    let rt = rt(1);
    rt.block_on(async {
        let h = spawn_local(async { 5 });
        yield_now().await;
        yield_now().await;
        assert!(h.is_finished());
        h.cancel();
        assert_eq!(h.await.unwrap(), 5);
    });
}

#[test]
fn dropping_a_handle_detaches_the_task() {
    let rt = rt(1);
    rt.block_on(async {
        let ran = Rc::new(Cell::new(false));
        let r = ran.clone();
        drop(spawn_local(async move {
            sleep(Duration::from_millis(2)).await;
            r.set(true);
        }));
        sleep(Duration::from_millis(20)).await;
        assert!(ran.get(), "a detached task still runs to completion");
    });
}

#[test]
fn a_panicking_task_is_reported_and_the_core_keeps_running() {
    let rt = rt(1);
    rt.block_on(async {
        let h = spawn_local(async {
            if true {
                panic!("boom in a task");
            }
            0
        });
        let err = h.await.unwrap_err();
        assert!(err.is_panic());
        assert_eq!(err.panic_message(), Some("boom in a task"));
        // The executor survived: more work runs.
        assert_eq!(spawn_local(async { 7 }).await.unwrap(), 7);
    });
}

#[test]
fn a_wake_from_another_thread_reaches_a_sleeping_core() {
    let rt = rt(1);
    let slot: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
    let flag = Arc::new(AtomicBool::new(false));
    let (s2, f2) = (slot.clone(), flag.clone());
    let t = std::thread::spawn(move || {
        // Let the core go to sleep first.
        std::thread::sleep(Duration::from_millis(50));
        f2.store(true, Ordering::SeqCst);
        if let Some(w) = s2.lock().unwrap().take() {
            w.wake();
        }
    });
    let t0 = Instant::now();
    rt.block_on(async {
        let h = spawn_local(std::future::poll_fn(move |cx| {
            if flag.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            *slot.lock().unwrap() = Some(cx.waker().clone());
            if flag.load(Ordering::SeqCst) {
                return Poll::Ready(());
            }
            Poll::Pending
        }));
        h.await.unwrap();
    });
    t.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(
        rt.stats()[0].sleeps > 0,
        "the core slept and was woken by the other thread"
    );
}

#[test]
fn spawn_on_runs_on_the_target_core_and_returns_the_output() {
    let rt = rt(2);
    rt.block_on(async {
        let h = spawn_on(1, || async {
            let here = std::rc::Rc::new(barewire_engine::current_core());
            *here
        });
        assert_eq!(h.await.unwrap(), 1);
        let own = spawn_on(0, || async { barewire_engine::current_core() });
        assert_eq!(own.await.unwrap(), 0);
        let bad = spawn_on(9, || async {});
        let e = bad.await.unwrap_err();
        assert!(
            e.is_panic() && e.panic_message().unwrap().contains("does not exist"),
            "{e}"
        );
        let panicky = spawn_on(1, || async { panic!("remote boom") });
        assert_eq!(
            panicky.await.unwrap_err().panic_message(),
            Some("remote boom")
        );
    });
    assert_eq!(rt.run_on_all(|c| async move { c * 100 }), vec![0, 100]);
}

#[test]
fn spawn_on_can_be_cancelled() {
    let rt = rt(2);
    rt.block_on(async {
        let h = spawn_on(1, || async {
            sleep(Duration::from_secs(3600)).await;
            1
        });
        sleep(Duration::from_millis(5)).await;
        h.cancel();
        let r = timeout(Duration::from_secs(5), h)
            .await
            .expect("cancellation is prompt");
        assert!(r.unwrap_err().is_cancelled());
    });
}

#[test]
fn a_busy_task_does_not_starve_timers_or_io() {
    let rt = rt(1);
    rt.block_on(async {
        let stop = Rc::new(Cell::new(false));
        let s = stop.clone();
        let spinner = spawn_local(async move {
            let mut n = 0u64;
            while !s.get() {
                n += 1;
                yield_now().await;
            }
            n
        });
        let t0 = Instant::now();
        sleep(Duration::from_millis(20)).await;
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "the timer fired while a task kept yielding"
        );
        stop.set(true);
        assert!(spinner.await.unwrap() > 0);
    });
}

#[test]
fn unknown_core_ids_and_too_many_cores_are_errors() {
    match Runtime::builder().core_ids(&[100_000]).build() {
        Err(Error::UnknownCore { id, available }) => {
            assert_eq!(id, 100_000);
            assert!(!available.is_empty());
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("core 100000 accepted"),
    }
    match Runtime::builder().cores(100_000).build() {
        Err(Error::TooManyCores { requested, .. }) => assert_eq!(requested, 100_000),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("100000 cores accepted"),
    }
    assert!(matches!(
        Runtime::builder().cores(0).build(),
        Err(Error::InvalidConfig(_))
    ));
    assert!(matches!(
        Runtime::builder().core_ids(&[0, 0]).pin(false).build(),
        Err(Error::InvalidConfig(_))
    ));
}

#[test]
fn pinned_cores_run_on_their_cpu() {
    let ids: Vec<usize> = core_ids();
    let rt = Runtime::builder()
        .core_ids(&ids[..1])
        .idle_spin(Duration::ZERO)
        .build()
        .unwrap();
    let cpu = rt.block_on(async {
        // SAFETY: sched_getcpu has no preconditions.
        unsafe { libc_sched_getcpu() }
    });
    assert_eq!(cpu as usize, ids[0]);
}

fn core_ids() -> Vec<usize> {
    let n = std::thread::available_parallelism().unwrap().get();
    (0..n).collect()
}

extern "C" {
    #[link_name = "sched_getcpu"]
    fn libc_sched_getcpu() -> i32;
}

/// With no timer and no other thread, so that Miri (`scripts/miri.sh`) runs it as it runs
/// here: a task that waits for ever is taken off the core's list and its future dropped when
/// the runtime goes, and the task a finished one leaves behind is freed. (Under Miri this caught
/// the list handing back a task through a pointer that reached its header only.)
#[test]
fn a_task_pending_at_shutdown_has_its_future_dropped() {
    struct Probe(Rc<Cell<u32>>);
    impl Drop for Probe {
        fn drop(&mut self) {
            self.0.set(self.0.get() + 1);
        }
    }
    let dropped = Rc::new(Cell::new(0));
    let rt = rt(1);
    let d = dropped.clone();
    rt.block_on(async move {
        let (waiting, done) = (Probe(d.clone()), Probe(d));
        drop(spawn_local(async move {
            let _p = waiting;
            std::future::pending::<()>().await;
        }));
        let finished = spawn_local(async move {
            let _p = done;
            7u8
        });
        assert_eq!(finished.await.unwrap(), 7);
    });
    assert_eq!(dropped.get(), 1, "only the finished task's future is gone");
    drop(rt);
    assert_eq!(
        dropped.get(),
        2,
        "the pending task's future went with the runtime"
    );
}

#[test]
fn shutdown_drops_pending_tasks_on_their_core() {
    let dropped_on = Arc::new(Mutex::new(Vec::new()));
    let rt = rt(2);
    let d = dropped_on.clone();
    rt.block_on(async move {
        // The Rc makes the future !Send: it must be built and dropped on core 1.
        struct Probe(Arc<Mutex<Vec<usize>>>, #[allow(dead_code)] std::rc::Rc<()>);
        impl Drop for Probe {
            fn drop(&mut self) {
                self.0.lock().unwrap().push(barewire_engine::current_core());
            }
        }
        drop(spawn_on(1, move || async move {
            let _p = Probe(d, std::rc::Rc::new(()));
            sleep(Duration::from_secs(3600)).await;
        }));
        sleep(Duration::from_millis(10)).await;
    });
    rt.shutdown();
    assert_eq!(
        *dropped_on.lock().unwrap(),
        vec![1],
        "the !Send future was dropped on core 1 at shutdown"
    );
}

#[test]
fn counters_count() {
    let rt = rt(1);
    rt.block_on(async {
        for _ in 0..10 {
            spawn_local(async {}).await.unwrap();
        }
    });
    let s = rt.stats()[0];
    assert!(s.tasks_spawned >= 10, "{s:?}");
    assert!(s.tasks_polled >= 10, "{s:?}");
    assert!(s.poller_passes > 0, "{s:?}");
}

#[test]
fn local_channels_and_semaphore_work_together() {
    let rt = rt(1);
    rt.block_on(async {
        let sem = Rc::new(barewire_engine::sync::Semaphore::new(2));
        let live = Rc::new(Cell::new(0));
        let peak = Rc::new(Cell::new(0));
        let (tx, mut rx) = barewire_engine::sync::mpsc::unbounded();
        for i in 0..10 {
            let (sem, live, peak, tx) = (sem.clone(), live.clone(), peak.clone(), tx.clone());
            spawn_local(async move {
                let _p = sem.acquire(1).await;
                live.set(live.get() + 1);
                peak.set(peak.get().max(live.get()));
                sleep(Duration::from_millis(1)).await;
                live.set(live.get() - 1);
                tx.send(i).await.unwrap();
            });
        }
        drop(tx);
        let got = RefCell::new(Vec::new());
        while let Some(v) = rx.recv().await {
            got.borrow_mut().push(v);
        }
        assert_eq!(got.borrow().len(), 10);
        assert_eq!(peak.get(), 2, "the semaphore held concurrency at 2");
        let (otx, orx) = barewire_engine::sync::oneshot::channel::<u8>();
        drop(otx);
        assert!(
            orx.await.is_err(),
            "a dropped oneshot sender is an error, not a hang"
        );
    });
}

/// In the sleeping idle mode every core sleeps when it has nothing to do, not only core 0:
/// cores 1..n once kept polling forever (a flag meant for core 0's main future stayed set),
/// burning a CPU each.
#[test]
fn an_idle_core_other_than_the_first_sleeps() {
    let rt = common::rt(2);
    let before = rt.stats()[1];
    rt.block_on(async {
        // Core 1 has nothing to do for 100 ms but a timer.
        spawn_on(1, || async {
            barewire_engine::time::sleep(Duration::from_millis(100)).await;
        })
        .await
        .unwrap();
    });
    let after = &rt.stats()[1];
    let passes = after.poller_passes - before.poller_passes;
    assert!(after.sleeps > before.sleeps, "core 1 never slept");
    assert!(
        passes < 1_000,
        "core 1 made {passes} passes in 100 ms of idleness: it spun instead of sleeping"
    );
}

thread_local! {
    static YIELD_LOG: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

fn log(what: &'static str) {
    YIELD_LOG.with(|l| l.borrow_mut().push(what));
}

/// `at_yield` hooks run when the poll that queued them returns: after a spawned task's poll and
/// before the next task's, once per call, and a hook queued by a hook runs after the next poll.
#[test]
fn at_yield_hooks_run_when_the_poll_returns() {
    let rt = rt(1);
    common::expect_reactor(&rt);
    rt.block_on(async {
        let a = spawn_local(async {
            log("a polled");
            assert!(barewire_engine::at_yield(|| log("hook")));
            assert!(barewire_engine::at_yield(|| {
                log("hook again");
                barewire_engine::at_yield(|| log("hook from a hook"));
            }));
            log("a still polling");
        });
        let b = spawn_local(async { log("b polled") });
        a.await.unwrap();
        b.await.unwrap();
        yield_now().await;
    });
    let seen = YIELD_LOG.with(|l| l.take());
    assert_eq!(
        seen,
        [
            "a polled",
            "a still polling",
            "hook",
            "hook again",
            "b polled",
            "hook from a hook"
        ]
    );
    assert!(!barewire_engine::at_yield(|| log("outside")));
    assert!(YIELD_LOG.with(|l| l.borrow().is_empty()));
}
