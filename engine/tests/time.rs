//! Timers: ordering, timeouts, intervals, and cancellation by drop.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire_engine::spawn_local;
use barewire_engine::time::{interval, sleep, sleep_until, timeout, Elapsed};
use common::rt;

#[test]
fn timers_fire_in_deadline_order_and_never_early() {
    let rt = rt(1);
    rt.block_on(async {
        let order = Rc::new(RefCell::new(Vec::new()));
        let start = Instant::now();
        let delays = [30u64, 5, 20, 1, 15, 10, 25, 0];
        let handles: Vec<_> = delays
            .iter()
            .map(|&ms| {
                let order = order.clone();
                spawn_local(async move {
                    sleep(Duration::from_millis(ms)).await;
                    assert!(
                        start.elapsed() >= Duration::from_millis(ms),
                        "a {ms} ms sleep woke early"
                    );
                    order.borrow_mut().push(ms);
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        let mut sorted = delays.to_vec();
        sorted.sort();
        assert_eq!(*order.borrow(), sorted);
    });
}

#[test]
fn timeout_fires_and_drops_the_inner_future() {
    let rt = rt(1);
    rt.block_on(async {
        let t0 = Instant::now();
        let r = timeout(Duration::from_millis(10), sleep(Duration::from_secs(3600))).await;
        assert_eq!(r, Err(Elapsed));
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(10) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let ok = timeout(Duration::from_secs(5), async { 3 }).await;
        assert_eq!(ok, Ok(3));
    });
}

#[test]
fn interval_ticks_on_schedule_and_skips_missed_ticks() {
    let rt = rt(1);
    rt.block_on(async {
        let mut iv = interval(Duration::from_millis(5));
        let first = iv.tick().await;
        let second = iv.tick().await;
        assert_eq!(second - first, Duration::from_millis(5));
        // Fall behind by several periods: the next tick is not a burst of catch-ups.
        std::thread::sleep(Duration::from_millis(23));
        let late = iv.tick().await;
        let next = iv.tick().await;
        assert!(next > late);
        assert!(next >= Instant::now() - Duration::from_millis(5));
    });
}

#[test]
fn a_dropped_sleep_is_removed() {
    let rt = rt(1);
    rt.block_on(async {
        for _ in 0..1000 {
            let s = sleep(Duration::from_secs(3600));
            // Poll once so it registers, then drop it.
            let _ = timeout(Duration::ZERO, s).await;
        }
        // If the 1000 one-hour timers were still registered the core would still work, but a
        // sleep_until in the past must complete at once either way:
        sleep_until(Instant::now() - Duration::from_secs(1)).await;
    });
    let s = rt.stats()[0];
    assert!(
        s.sleeps < 50,
        "dropped timers do not make the core wake: {s:?}"
    );
}

/// A sleep shorter than a millisecond on a core that sleeps while it waits wakes near its
/// deadline under either reactor: the epoll reactor's wait takes its timeout in nanoseconds
/// (`epoll_pwait2`), not rounded up to the millisecond `epoll_wait` counts in. Judged by the
/// median of 21 sleeps, so a few late wake-ups on a busy machine do not decide it; rounded up,
/// every one of them would take at least a millisecond.
#[test]
fn a_sub_millisecond_sleep_is_not_rounded_up_to_a_millisecond() {
    let rt = rt(1);
    common::expect_reactor(&rt);
    let mut took = rt.block_on(async {
        let mut took = Vec::new();
        for _ in 0..21 {
            let t0 = Instant::now();
            sleep(Duration::from_micros(200)).await;
            took.push(t0.elapsed());
        }
        took
    });
    took.sort();
    assert!(
        took[0] >= Duration::from_micros(200),
        "woke early: {took:?}"
    );
    assert!(
        took[10] < Duration::from_micros(900),
        "median of 21 sleeps of 200 µs: {:?} (all: {took:?})",
        took[10]
    );
}
