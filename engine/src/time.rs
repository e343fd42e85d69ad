//! Timers: `sleep`, `sleep_until`, `timeout`, `interval`.
//!
//! Each core keeps its pending deadlines in an ordered map. The loop fires every deadline that
//! has passed on each pass, and when it goes to sleep it tells the reactor the earliest one, so a
//! sleeping core wakes on time without a timer thread. Resolution is the reactor's wait
//! resolution: both reactors wait with a `timespec` (io_uring's, and `epoll_pwait2`'s), so it is
//! the kernel's timer slack, 50 µs by default. Only the epoll reactor on a kernel before 5.11
//! (or under a seccomp profile that refuses `epoll_pwait2`) counts in milliseconds, rounded up:
//! there a timer may fire up to a millisecond late. None fires early.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::core::with_core;

#[derive(Default)]
pub(crate) struct Timers {
    map: RefCell<BTreeMap<(Instant, u64), Waker>>,
    seq: std::cell::Cell<u64>,
    /// Scratch for `fire`, kept so that firing a timer does not allocate.
    fired: RefCell<Vec<Waker>>,
}

impl Timers {
    fn insert(&self, deadline: Instant, waker: Waker) -> (Instant, u64) {
        let id = self.seq.get();
        self.seq.set(id + 1);
        self.map.borrow_mut().insert((deadline, id), waker);
        (deadline, id)
    }

    fn update(&self, key: (Instant, u64), waker: &Waker) -> bool {
        let mut map = self.map.borrow_mut();
        match map.get_mut(&key) {
            Some(w) => {
                if !w.will_wake(waker) {
                    *w = waker.clone();
                }
                true
            }
            None => false,
        }
    }

    fn remove(&self, key: (Instant, u64)) {
        let w = self.map.borrow_mut().remove(&key);
        drop(w);
    }

    /// Wakes every timer whose deadline has passed. True if any fired. Reads the clock only
    /// when a timer exists: a busy core with no timers pays nothing here.
    pub(crate) fn fire_due(&self) -> bool {
        if self.map.borrow().is_empty() {
            return false;
        }
        self.fire(Instant::now())
    }

    /// Whether a deadline has passed, reading the clock only when a timer exists.
    pub(crate) fn any_due(&self) -> bool {
        !self.map.borrow().is_empty() && self.pure_poll(Instant::now())
    }

    fn fire(&self, now: Instant) -> bool {
        // Taken out while the wakers run: a wake may reach back into the timers.
        let mut fired = std::mem::take(&mut *self.fired.borrow_mut());
        {
            let mut map = self.map.borrow_mut();
            while let Some(entry) = map.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                fired.push(entry.remove());
            }
        }
        let any = !fired.is_empty();
        for w in fired.drain(..) {
            w.wake();
        }
        *self.fired.borrow_mut() = fired;
        any
    }

    fn pure_poll(&self, now: Instant) -> bool {
        self.map
            .borrow()
            .first_key_value()
            .is_some_and(|(k, _)| k.0 <= now)
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.map.borrow().first_key_value().map(|(k, _)| k.0)
    }
}

/// Completes at `deadline`. Made by [`sleep`] and [`sleep_until`].
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use std::time::{Duration, Instant};
/// rt.block_on(async {
///     let mut s = barewire_engine::time::sleep(Duration::from_secs(60));
///     let sooner = Instant::now() + Duration::from_millis(2);
///     s.reset(sooner); // a deadline that moved: no new timer to make
///     assert_eq!(s.deadline(), sooner);
///     s.await;
///     assert!(Instant::now() >= sooner);
/// });
/// ```
#[must_use = "futures do nothing unless awaited"]
#[derive(Debug)]
pub struct Sleep {
    deadline: Instant,
    key: Option<(Instant, u64)>,
}

/// Waits for `dur`.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let t0 = std::time::Instant::now();
///     barewire_engine::time::sleep(std::time::Duration::from_millis(5)).await;
///     assert!(t0.elapsed() >= std::time::Duration::from_millis(5));
/// });
/// ```
pub fn sleep(dur: Duration) -> Sleep {
    sleep_until(Instant::now() + dur)
}

/// Waits until `deadline`.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use std::time::{Duration, Instant};
/// rt.block_on(async {
///     // Steps on a fixed schedule, however long each step's own work takes.
///     let start = Instant::now();
///     for step in 1..=3u32 {
///         barewire_engine::time::sleep_until(start + Duration::from_millis(2) * step).await;
///     }
///     assert!(start.elapsed() >= Duration::from_millis(6));
/// });
/// ```
pub fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        key: None,
    }
}

impl Sleep {
    /// When this sleep completes.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Moves the deadline (used by `interval`).
    pub fn reset(&mut self, deadline: Instant) {
        if let Some(key) = self.key.take() {
            with_core(|c| c.timers.remove(key));
        }
        self.deadline = deadline;
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            if let Some(key) = self.key.take() {
                with_core(|c| c.timers.remove(key));
            }
            return Poll::Ready(());
        }
        let deadline = self.deadline;
        let key = self.key;
        let new_key = with_core(|c| match key {
            Some(k) if c.timers.update(k, cx.waker()) => k,
            _ => c.timers.insert(deadline, cx.waker().clone()),
        });
        self.key = Some(new_key);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            crate::core::try_with_core(|c| c.timers.remove(key));
        }
    }
}

/// The future's deadline passed first.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::time::{sleep, timeout, Elapsed};
/// use std::time::Duration;
/// rt.block_on(async {
///     let r = timeout(Duration::from_millis(1), sleep(Duration::from_secs(9))).await;
///     assert_eq!(r, Err(Elapsed));
/// });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("deadline elapsed")]
pub struct Elapsed;

/// Runs `fut`, giving up after `dur`.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use std::time::Duration;
/// use barewire_engine::time::{sleep, timeout};
/// rt.block_on(async {
///     let r = timeout(Duration::from_millis(5), sleep(Duration::from_secs(60))).await;
///     assert!(r.is_err());
/// });
/// ```
pub fn timeout<F: Future>(dur: Duration, fut: F) -> Timeout<F> {
    Timeout {
        fut,
        sleep: sleep(dur),
    }
}

/// See [`timeout`]. It owns the future: dropping it (or its deadline passing) drops the
/// future, which cancels whatever the future was waiting on.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::{sync::oneshot, time::timeout};
/// use std::time::Duration;
/// rt.block_on(async {
///     let (tx, rx) = oneshot::channel::<u32>();
///     let r = timeout(Duration::from_millis(2), rx).await;
///     assert!(r.is_err()); // nothing was sent in time, and the receiver is gone now:
///     assert_eq!(tx.send(1), Err(1));
/// });
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct Timeout<F> {
    fut: F,
    sleep: Sleep,
}

impl<F: Future> Future for Timeout<F> {
    type Output = Result<F::Output, Elapsed>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // SAFETY: `fut` is structurally pinned (never moved out); `sleep` is Unpin.
        let this = unsafe { self.get_unchecked_mut() };
        // SAFETY: see above.
        if let Poll::Ready(v) = unsafe { Pin::new_unchecked(&mut this.fut) }.poll(cx) {
            return Poll::Ready(Ok(v));
        }
        Pin::new(&mut this.sleep).poll(cx).map(|()| Err(Elapsed))
    }
}

/// Ticks every `period`; a tick that is late does not make the next ones come early in a burst
/// (missed ticks are skipped, as tokio's `MissedTickBehavior::Skip`).
///
/// # Panics
/// If `period` is zero (as tokio's `interval` does): a caller that takes the period from a
/// setting checks it first (`ActorSystem::start` refuses a zero heartbeat).
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use std::time::Duration;
/// rt.block_on(async {
///     let mut every = barewire_engine::time::interval(Duration::from_millis(2));
///     let first = every.tick().await; // at once
///     let second = every.tick().await;
///     assert!(second - first >= Duration::from_millis(2));
/// });
/// ```
pub fn interval(period: Duration) -> Interval {
    assert!(period > Duration::ZERO, "interval period must be non-zero");
    Interval {
        period,
        sleep: sleep_until(Instant::now()),
    }
}

/// See [`interval`].
#[derive(Debug)]
pub struct Interval {
    period: Duration,
    sleep: Sleep,
}

impl Interval {
    /// Waits for the next tick and returns its scheduled time. The first tick is immediate.
    pub async fn tick(&mut self) -> Instant {
        (&mut self.sleep).await;
        let at = self.sleep.deadline();
        let mut next = at + self.period;
        let now = Instant::now();
        if next <= now {
            let behind = (now - at).as_nanos() / self.period.as_nanos();
            next = at + self.period * (behind as u32 + 1);
        }
        self.sleep.reset(next);
        at
    }
}
