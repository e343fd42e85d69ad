//! Cross-core wake-up stress. Both tests keep both cores busy, so they hold a lock to run one at
//! a time and are in their own test binary, which cargo runs alone.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use barewire_engine::spawn_on;
use barewire_engine::time::timeout;
use common::rt;

static SERIAL: Mutex<()> = Mutex::new(());

/// Two cores ping-pong through atomics and wakers. Every step needs the other core's wake to be
/// delivered, and both cores sleep whenever idle, so a single lost wake-up hangs the test
/// (caught by the deadline).
#[test]
fn cross_core_ping_pong_loses_no_wakeup() {
    // Fast turns: mostly the wake finds the other core still polling.
    let sleeps = ping_pong(500_000, Duration::ZERO);
    assert!(sleeps > 0);
}

#[test]
fn ping_pong_against_sleeping_cores_loses_no_wakeup() {
    // Each turn waits a little first, so the other core has gone to sleep (or is halfway into
    // it) when the wake comes: this exercises the sleep handshake and the eventfd doorbell.
    let rounds = 50_000;
    let sleeps = ping_pong(rounds, Duration::from_micros(20));
    assert!(
        sleeps > rounds / 2,
        "the cores really slept between turns ({sleeps} sleeps)"
    );
}

fn ping_pong(rounds: u64, think: Duration) -> u64 {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = rt(2);
    let counter = Arc::new(AtomicU64::new(0));
    let wakers: Arc<[Mutex<Option<Waker>>; 2]> = Arc::new([Mutex::new(None), Mutex::new(None)]);

    type Wakers = Arc<[Mutex<Option<Waker>>; 2]>;
    async fn player(
        me: usize,
        rounds: u64,
        think: Duration,
        counter: Arc<AtomicU64>,
        wakers: Wakers,
    ) -> u64 {
        {
            let mut moves = 0;
            loop {
                // My turn when the counter's parity is mine.
                std::future::poll_fn(|cx| {
                    let v = counter.load(Ordering::SeqCst);
                    if v >= 2 * rounds || v % 2 == me as u64 {
                        return Poll::Ready(());
                    }
                    *wakers[me].lock().unwrap() = Some(cx.waker().clone());
                    let v = counter.load(Ordering::SeqCst);
                    if v >= 2 * rounds || v % 2 == me as u64 {
                        return Poll::Ready(());
                    }
                    Poll::Pending
                })
                .await;
                if counter.load(Ordering::SeqCst) >= 2 * rounds {
                    return moves;
                }
                let t = Instant::now();
                while t.elapsed() < think {
                    std::hint::spin_loop();
                }
                counter.fetch_add(1, Ordering::SeqCst);
                moves += 1;
                if let Some(w) = wakers[1 - me].lock().unwrap().take() {
                    w.wake();
                }
            }
        }
    }

    let t0 = Instant::now();
    let (c, w) = (counter.clone(), wakers.clone());
    let moves = rt.block_on(async move {
        let other = spawn_on(1, move || player(1, rounds, think, c, w));
        let mine = timeout(
            Duration::from_secs(120),
            player(0, rounds, think, counter, wakers),
        )
        .await
        .expect("a wake-up was lost");
        mine + other.await.unwrap()
    });
    assert_eq!(moves, 2 * rounds);
    let sleeps: u64 = rt.stats().iter().map(|s| s.sleeps).sum();
    eprintln!(
        "{} cross-core wakes in {:?}, {sleeps} sleeps",
        2 * rounds,
        t0.elapsed()
    );
    sleeps
}

/// Millions of messages across cores through the cross-core channel, with the receiver sleeping
/// whenever it runs dry: the sum proves none was lost or duplicated.
#[test]
fn two_million_cross_core_messages_arrive_exactly_once() {
    const N: u64 = 2_000_000;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let rt = rt(2);
    let sum = rt.block_on(async {
        let (mut tx, mut rx) = barewire_engine::sync::cross::channel::<u64>(256);
        spawn_on(1, move || async move {
            for i in 0..N {
                tx.send(i).await.unwrap();
            }
        });
        let mut sum = 0u64;
        let mut count = 0u64;
        let mut last = None;
        while let Some(v) = rx.recv().await {
            if let Some(l) = last {
                assert_eq!(v, l + 1, "in order");
            }
            last = Some(v);
            sum += v;
            count += 1;
        }
        assert_eq!(count, N);
        sum
    });
    assert_eq!(sum, N * (N - 1) / 2);
}
