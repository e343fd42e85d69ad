//! A multi-producer, single-consumer channel for tasks on one core, bounded or unbounded.
//!
//! ```
//! # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
//! rt.block_on(async {
//!     let (tx, mut rx) = barewire_engine::sync::mpsc::channel::<u32>(2);
//!     let tx2 = tx.clone();
//!     barewire_engine::spawn_local(async move {
//!         for i in 0..3 { tx2.send(i).await.unwrap(); } // waits while 2 are queued
//!     });
//!     drop(tx);
//!     let mut got = vec![];
//!     while let Some(v) = rx.recv().await { got.push(v); }
//!     assert_eq!(got, vec![0, 1, 2]);
//! });
//! ```

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};

struct Chan<T> {
    queue: VecDeque<T>,
    cap: Option<usize>,
    senders: usize,
    rx_alive: bool,
    rx_waker: Option<Waker>,
    tx_waiters: VecDeque<Waker>,
}

/// The sending half; clone it for more producers.
pub struct Sender<T> {
    chan: Rc<RefCell<Chan<T>>>,
}

/// The receiving half.
pub struct Receiver<T> {
    chan: Rc<RefCell<Chan<T>>>,
}

/// The receiver is gone; the value comes back.
#[derive(PartialEq, Eq)]
pub struct SendError<T>(pub T);

impl<T> fmt::Debug for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SendError(..)")
    }
}

impl<T> fmt::Display for SendError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("channel closed: the receiver was dropped")
    }
}

impl<T> std::error::Error for SendError<T> {}

/// Why `try_send` failed.
///
/// ```
/// use barewire_engine::sync::mpsc::{channel, TrySendError};
/// let (tx, rx) = channel::<u8>(1);
/// assert_eq!(tx.try_send(1), Ok(()));
/// assert_eq!(tx.try_send(2), Err(TrySendError::Full(2))); // the value comes back
/// drop(rx);
/// assert_eq!(tx.try_send(3), Err(TrySendError::Closed(3)));
/// ```
#[derive(Debug, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// At capacity.
    Full(T),
    /// The receiver is gone.
    Closed(T),
}

fn new<T>(cap: Option<usize>) -> (Sender<T>, Receiver<T>) {
    let chan = Rc::new(RefCell::new(Chan {
        queue: VecDeque::new(),
        cap,
        senders: 1,
        rx_alive: true,
        rx_waker: None,
        tx_waiters: VecDeque::new(),
    }));
    (Sender { chan: chan.clone() }, Receiver { chan })
}

/// A channel holding at most `cap` messages (`cap` ≥ 1); `send` waits when full.
pub fn channel<T>(cap: usize) -> (Sender<T>, Receiver<T>) {
    assert!(cap > 0, "mpsc::channel capacity must be at least 1");
    new(Some(cap))
}

/// A channel without a bound.
///
/// ```
/// let (tx, mut rx) = barewire_engine::sync::mpsc::unbounded::<u32>();
/// for i in 0..10_000 {
///     tx.try_send(i).unwrap(); // never full
/// }
/// assert_eq!(tx.len(), 10_000);
/// assert_eq!(rx.try_recv(), Some(0));
/// ```
pub fn unbounded<T>() -> (Sender<T>, Receiver<T>) {
    new(None)
}

impl<T> Sender<T> {
    /// Messages queued and not yet received.
    pub fn len(&self) -> usize {
        self.chan.borrow().queue.len()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until fewer than `below` messages are queued, or the receiver is gone: a
    /// producer's own backpressure on a channel without a bound (or a lower one than the
    /// channel's).
    ///
    /// ```
    /// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
    /// rt.block_on(async {
    ///     let (tx, mut rx) = barewire_engine::sync::mpsc::unbounded::<u32>();
    ///     for i in 0..4 { tx.try_send(i).unwrap(); }
    ///     barewire_engine::spawn_local(async move { while rx.recv().await.is_some() {} });
    ///     tx.room(2).await; // the receiver took at least three
    ///     assert!(tx.len() < 2);
    /// });
    /// ```
    pub async fn room(&self, below: usize) {
        poll_fn(|cx| {
            let mut c = self.chan.borrow_mut();
            if c.queue.len() < below || !c.rx_alive {
                return Poll::Ready(());
            }
            // Woken by the receiver's next take (or its drop), then looked at again.
            c.tx_waiters.push_back(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Queues `v` now, or says why not.
    pub fn try_send(&self, v: T) -> Result<(), TrySendError<T>> {
        let mut c = self.chan.borrow_mut();
        if !c.rx_alive {
            return Err(TrySendError::Closed(v));
        }
        if c.cap.is_some_and(|cap| c.queue.len() >= cap) {
            return Err(TrySendError::Full(v));
        }
        c.queue.push_back(v);
        let w = c.rx_waker.take();
        drop(c);
        if let Some(w) = w {
            w.wake();
        }
        Ok(())
    }

    /// Queues `v`, waiting for room if the channel is bounded and full.
    pub async fn send(&self, v: T) -> Result<(), SendError<T>> {
        let mut v = Some(v);
        poll_fn(
            |cx| match self.try_send(v.take().expect("polled after completion")) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TrySendError::Closed(x)) => Poll::Ready(Err(SendError(x))),
                Err(TrySendError::Full(x)) => {
                    v = Some(x);
                    self.chan
                        .borrow_mut()
                        .tx_waiters
                        .push_back(cx.waker().clone());
                    Poll::Pending
                }
            },
        )
        .await
    }

    /// True once the receiver is gone.
    pub fn is_closed(&self) -> bool {
        !self.chan.borrow().rx_alive
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.chan.borrow_mut().senders += 1;
        Sender {
            chan: self.chan.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut c = self.chan.borrow_mut();
        c.senders -= 1;
        let w = if c.senders == 0 {
            c.rx_waker.take()
        } else {
            None
        };
        drop(c);
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Receiver<T> {
    /// The next message, or `None` once every sender is gone and the queue is empty.
    pub async fn recv(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let mut c = self.chan.borrow_mut();
            if let Some(v) = c.queue.pop_front() {
                let w = c.tx_waiters.pop_front();
                drop(c);
                if let Some(w) = w {
                    w.wake();
                }
                return Poll::Ready(Some(v));
            }
            if c.senders == 0 {
                return Poll::Ready(None);
            }
            c.rx_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// A message if one is queued.
    pub fn try_recv(&mut self) -> Option<T> {
        let mut c = self.chan.borrow_mut();
        let v = c.queue.pop_front();
        let w = if v.is_some() {
            c.tx_waiters.pop_front()
        } else {
            None
        };
        drop(c);
        if let Some(w) = w {
            w.wake();
        }
        v
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.chan.borrow().queue.len()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut c = self.chan.borrow_mut();
        c.rx_alive = false;
        let waiters: Vec<Waker> = c.tx_waiters.drain(..).collect();
        let queued = std::mem::take(&mut c.queue);
        drop(c);
        drop(queued);
        for w in waiters {
            w.wake();
        }
    }
}
