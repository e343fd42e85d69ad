use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

struct Waiter {
    need: usize,
    granted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// A counting semaphore for tasks on one core, first come first served: a large request at the
/// head of the queue is not overtaken by smaller ones behind it (no starvation).
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let sem = barewire_engine::sync::Semaphore::new(2);
///     let a = sem.acquire(1).await;
///     let b = sem.acquire(1).await;
///     assert_eq!(sem.available(), 0);
///     drop(a);
///     let _c = sem.acquire(1).await; // a's permit came back
///     drop(b);
/// });
/// ```
pub struct Semaphore {
    permits: Cell<usize>,
    waiters: RefCell<VecDeque<Rc<Waiter>>>,
}

/// Permits held; returned on drop.
pub struct Permit<'a> {
    sem: &'a Semaphore,
    n: usize,
}

impl Semaphore {
    /// A semaphore with `n` permits.
    pub fn new(n: usize) -> Self {
        Semaphore {
            permits: Cell::new(n),
            waiters: RefCell::new(VecDeque::new()),
        }
    }

    /// Permits free now.
    pub fn available(&self) -> usize {
        self.permits.get()
    }

    /// Takes `n` permits now if free and nobody is queued.
    pub fn try_acquire(&self, n: usize) -> Option<Permit<'_>> {
        if self.waiters.borrow().is_empty() && self.permits.get() >= n {
            self.permits.set(self.permits.get() - n);
            Some(Permit { sem: self, n })
        } else {
            None
        }
    }

    /// Waits for `n` permits.
    pub fn acquire(&self, n: usize) -> Acquire<'_> {
        Acquire {
            sem: self,
            n,
            waiter: None,
        }
    }

    /// Adds `n` permits (also how permits come back).
    pub fn release(&self, n: usize) {
        self.permits.set(self.permits.get() + n);
        let mut woken = Vec::new();
        {
            let mut q = self.waiters.borrow_mut();
            while let Some(w) = q.front() {
                if w.need > self.permits.get() {
                    break;
                }
                self.permits.set(self.permits.get() - w.need);
                w.granted.set(true);
                woken.extend(w.waker.borrow_mut().take());
                q.pop_front();
            }
        }
        for w in woken {
            w.wake();
        }
    }
}

/// See [`Semaphore::acquire`].
pub struct Acquire<'a> {
    sem: &'a Semaphore,
    n: usize,
    waiter: Option<Rc<Waiter>>,
}

impl<'a> Future for Acquire<'a> {
    type Output = Permit<'a>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit<'a>> {
        let sem = self.sem;
        match &self.waiter {
            None => {
                if let Some(p) = sem.try_acquire(self.n) {
                    return Poll::Ready(p);
                }
                let w = Rc::new(Waiter {
                    need: self.n,
                    granted: Cell::new(false),
                    waker: RefCell::new(Some(cx.waker().clone())),
                });
                sem.waiters.borrow_mut().push_back(w.clone());
                self.waiter = Some(w);
                Poll::Pending
            }
            Some(w) if w.granted.get() => {
                self.waiter = None;
                Poll::Ready(Permit { sem, n: self.n })
            }
            Some(w) => {
                *w.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        let Some(w) = self.waiter.take() else { return };
        if w.granted.get() {
            // Granted but never taken: give the permits back.
            self.sem.release(w.need);
        } else {
            self.sem.waiters.borrow_mut().retain(|x| !Rc::ptr_eq(x, &w));
            // Removing the head may let the next waiter through.
            self.sem.release(0);
        }
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.sem.release(self.n);
    }
}
