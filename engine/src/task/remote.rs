//! The join state of a task spawned on another core with `spawn_on`.
//!
//! The task itself is an ordinary local task on the target core that wraps the user's future in
//! a [`RemoteTask`]; the output crosses back through a small mutex-protected slot. This path is
//! taken once per `spawn_on`, never per poll, so the lock is off the hot path.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::JoinError;

pub(crate) struct RemoteJoin<T> {
    slot: Mutex<Slot<T>>,
}

struct Slot<T> {
    output: Option<Result<T, JoinError>>,
    finished: bool,
    cancel: bool,
    join_waker: Option<Waker>,
    task_waker: Option<Waker>,
}

impl<T> RemoteJoin<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(RemoteJoin {
            slot: Mutex::new(Slot {
                output: None,
                finished: false,
                cancel: false,
                join_waker: None,
                task_waker: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Slot<T>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn cancel(&self) {
        let waker = {
            let mut s = self.lock();
            s.cancel = true;
            s.task_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.lock().finished
    }

    pub(crate) fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>> {
        let mut s = self.lock();
        if let Some(out) = s.output.take() {
            return Poll::Ready(out);
        }
        if s.finished {
            panic!("JoinHandle polled after it returned its output");
        }
        s.join_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Delivers the output (called on the target core, or by the mesh when the target is gone).
    pub(crate) fn finish(&self, out: Result<T, JoinError>) {
        let waker = {
            let mut s = self.lock();
            if s.finished {
                return;
            }
            s.finished = true;
            s.output = Some(out);
            s.join_waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// Runs on the target core: polls the user's future, watches for cancellation and hands the
/// output (or the panic) back to the joiner.
pub(crate) struct RemoteTask<F: Future> {
    pub(crate) future: Option<F>,
    pub(crate) shared: Arc<RemoteJoin<F::Output>>,
}

impl<F: Future> Future for RemoteTask<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // SAFETY: `future` is never moved out while pinned; it is only dropped in place by
        // assigning None.
        let this = unsafe { self.get_unchecked_mut() };
        {
            let mut s = this.shared.lock();
            if s.cancel {
                drop(s);
                this.future = None;
                this.shared.finish(Err(JoinError::Cancelled));
                return Poll::Ready(());
            }
            match &s.task_waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => s.task_waker = Some(cx.waker().clone()),
            }
        }
        let Some(fut) = this.future.as_mut() else {
            return Poll::Ready(());
        };
        // SAFETY: the future is structurally pinned inside this pinned wrapper.
        let fut = unsafe { Pin::new_unchecked(fut) };
        let out = match catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(v)) => Ok(v),
            Err(p) => Err(JoinError::Panicked(p)),
        };
        this.future = None;
        this.shared.finish(out);
        Poll::Ready(())
    }
}

impl<F: Future> Drop for RemoteTask<F> {
    fn drop(&mut self) {
        // Dropped before finishing (core shutdown): tell the joiner.
        self.future = None;
        self.shared.finish(Err(JoinError::Cancelled));
    }
}
