//! A single value from one task to another on the same core.
//!
//! ```
//! # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
//! rt.block_on(async {
//!     let (tx, rx) = barewire_engine::sync::oneshot::channel();
//!     barewire_engine::spawn_local(async move { tx.send("done").unwrap() });
//!     assert_eq!(rx.await, Ok("done"));
//! });
//! ```

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    tx_alive: bool,
    rx_alive: bool,
    waker: Option<Waker>,
}

/// Sends the value.
pub struct Sender<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

/// Awaits the value.
pub struct Receiver<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

/// The sender was dropped without sending.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::sync::oneshot::{channel, RecvError};
/// rt.block_on(async {
///     let (tx, rx) = channel::<u32>();
///     drop(tx);
///     assert_eq!(rx.await, Err(RecvError));
/// });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("oneshot sender dropped without sending")]
pub struct RecvError;

/// A connected pair.
pub fn channel<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Rc::new(RefCell::new(Slot {
        value: None,
        tx_alive: true,
        rx_alive: true,
        waker: None,
    }));
    (Sender { slot: slot.clone() }, Receiver { slot })
}

impl<T> Sender<T> {
    /// Delivers `v`; gives it back if the receiver is gone.
    pub fn send(self, v: T) -> Result<(), T> {
        let mut s = self.slot.borrow_mut();
        if !s.rx_alive {
            return Err(v);
        }
        s.value = Some(v);
        let w = s.waker.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
        Ok(())
    }

    /// True once the receiver is gone.
    pub fn is_closed(&self) -> bool {
        !self.slot.borrow().rx_alive
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut s = self.slot.borrow_mut();
        s.tx_alive = false;
        let w = s.waker.take();
        drop(s);
        if let Some(w) = w {
            w.wake();
        }
    }
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, RecvError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut s = self.slot.borrow_mut();
        if let Some(v) = s.value.take() {
            return Poll::Ready(Ok(v));
        }
        if !s.tx_alive {
            return Poll::Ready(Err(RecvError));
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let mut s = self.slot.borrow_mut();
        s.rx_alive = false;
        let v = s.value.take();
        drop(s);
        drop(v);
    }
}
