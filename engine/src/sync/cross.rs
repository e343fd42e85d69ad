//! A bounded channel from one core to another, over an SPSC ring.
//!
//! Both ends are `Send`: make the pair on one core and move one end to another with
//! [`spawn_on`](crate::spawn_on). A waiting side registers its waker and the other side wakes it
//! only when it is actually waiting (a flag checked after a `SeqCst` fence), so steady-state
//! traffic costs one release store per message and no lock.
//!
//! ```
//! # let rt = barewire_engine::Runtime::builder().cores(2).pin(false).build().unwrap();
//! rt.block_on(async {
//!     let (mut tx, mut rx) = barewire_engine::sync::cross::channel::<u64>(64);
//!     barewire_engine::spawn_on(1, move || async move {
//!         for i in 0..1000 { tx.send(i).await.unwrap(); }
//!     });
//!     let mut sum = 0;
//!     while let Some(v) = rx.recv().await { sum += v; }
//!     assert_eq!(sum, 999 * 1000 / 2);
//! });
//! ```

use std::future::poll_fn;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use crate::spsc::{Consumer, Producer};

#[derive(Default)]
struct Signal {
    waiting: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Signal {
    fn register(&self, w: &Waker) {
        let mut slot = self.waker.lock().unwrap_or_else(|e| e.into_inner());
        match &*slot {
            Some(old) if old.will_wake(w) => {}
            _ => *slot = Some(w.clone()),
        }
        self.waiting.store(true, Ordering::SeqCst);
    }

    fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.waiting.load(Ordering::Relaxed) && self.waiting.swap(false, Ordering::SeqCst) {
            let w = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(w) = w {
                w.wake();
            }
        }
    }
}

struct Shared {
    rx_signal: Signal,
    tx_signal: Signal,
    closed: AtomicBool,
}

/// The sending end.
pub struct Sender<T> {
    ring: Producer<T>,
    shared: Arc<Shared>,
}

/// The receiving end.
pub struct Receiver<T> {
    ring: Consumer<T>,
    shared: Arc<Shared>,
}

/// A channel with room for at least `capacity` messages.
pub fn channel<T: Send>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let (p, c) = crate::spsc::ring(capacity);
    let shared = Arc::new(Shared {
        rx_signal: Signal::default(),
        tx_signal: Signal::default(),
        closed: AtomicBool::new(false),
    });
    (
        Sender {
            ring: p,
            shared: shared.clone(),
        },
        Receiver { ring: c, shared },
    )
}

/// The receiver is gone; the message comes back.
#[derive(Debug, PartialEq, Eq)]
pub struct Closed<T>(pub T);

impl<T: Send> Sender<T> {
    /// Sends now, or hands the value back if the ring is full (`Ok(Err(v))`) or the receiver is
    /// gone (`Err`).
    pub fn try_send(&mut self, v: T) -> Result<Result<(), T>, Closed<T>> {
        if self.shared.closed.load(Ordering::Acquire) || self.ring.is_closed() {
            return Err(Closed(v));
        }
        match self.ring.push(v) {
            Ok(()) => {
                self.ring.flush();
                self.shared.rx_signal.notify();
                Ok(Ok(()))
            }
            Err(v) => Ok(Err(v)),
        }
    }

    /// Sends, waiting for room.
    pub async fn send(&mut self, v: T) -> Result<(), Closed<T>> {
        let mut v = Some(v);
        poll_fn(|cx| {
            let shared = self.shared.clone();
            let mut attempt = |v: &mut Option<T>| match self
                .try_send(v.take().expect("polled after completion"))
            {
                Ok(Ok(())) => Some(Ok(())),
                Err(c) => Some(Err(c)),
                Ok(Err(back)) => {
                    *v = Some(back);
                    None
                }
            };
            if let Some(r) = attempt(&mut v) {
                return Poll::Ready(r);
            }
            shared.tx_signal.register(cx.waker());
            // Re-check after registering: the receiver may have made room meanwhile.
            fence(Ordering::SeqCst);
            match attempt(&mut v) {
                Some(r) => Poll::Ready(r),
                None => Poll::Pending,
            }
        })
        .await
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.rx_signal.notify();
    }
}

impl<T: Send> Receiver<T> {
    /// The next message; `None` once the sender is gone and everything it sent was received.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            if let Some(v) = self.try_recv() {
                return Poll::Ready(Some(v));
            }
            self.shared.rx_signal.register(cx.waker());
            fence(Ordering::SeqCst);
            if let Some(v) = self.try_recv() {
                return Poll::Ready(Some(v));
            }
            if self.shared.closed.load(Ordering::Acquire) {
                // The sender published everything before closing (release/acquire on `closed`).
                return Poll::Ready(self.try_recv());
            }
            Poll::Pending
        })
        .await
    }

    /// A message if one is ready.
    pub fn try_recv(&mut self) -> Option<T> {
        let v = self.ring.pop();
        if v.is_some() {
            self.shared.tx_signal.notify();
        }
        v
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.tx_signal.notify();
    }
}
