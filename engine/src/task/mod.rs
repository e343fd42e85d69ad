//! Tasks: spawning, joining, cancelling.

pub(crate) mod cache;
pub(crate) mod cells;
pub(crate) mod raw;
mod refs;
mod remote;

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

pub use raw::task_overhead_bytes;
pub(crate) use remote::{RemoteJoin, RemoteTask};

/// Why a task produced no output.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::{spawn_local, time, JoinError};
/// use std::time::Duration;
/// rt.block_on(async {
///     let panics = spawn_local(async { panic!("no") });
///     assert!(panics.await.unwrap_err().is_panic()); // the core goes on
///     let slow = spawn_local(time::sleep(Duration::from_secs(60)));
///     slow.cancel();
///     assert!(matches!(slow.await, Err(JoinError::Cancelled)));
/// });
/// ```
pub enum JoinError {
    /// `JoinHandle::cancel` was called, or the runtime shut down first.
    Cancelled,
    /// The task panicked; the payload is what `panic!` was given.
    Panicked(raw::Panic),
}

impl JoinError {
    /// True if the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panicked(_))
    }

    /// True if the task was cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, JoinError::Cancelled)
    }

    /// The panic message, when the payload is a string.
    pub fn panic_message(&self) -> Option<&str> {
        match self {
            JoinError::Panicked(p) => p
                .downcast_ref::<&'static str>()
                .copied()
                .or_else(|| p.downcast_ref::<String>().map(String::as_str)),
            JoinError::Cancelled => None,
        }
    }
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("Cancelled"),
            JoinError::Panicked(_) => write!(
                f,
                "Panicked({:?})",
                self.panic_message().unwrap_or("<non-string payload>")
            ),
        }
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Cancelled => f.write_str("task was cancelled"),
            JoinError::Panicked(_) => write!(
                f,
                "task panicked: {}",
                self.panic_message().unwrap_or("<non-string payload>")
            ),
        }
    }
}

impl std::error::Error for JoinError {}

/// A handle to a spawned task: await it for the output, or `cancel` it.
///
/// Dropping the handle detaches the task: it keeps running and its output is dropped, as with
/// tokio. A handle is `!Send`; it belongs to the core that spawned the task (for
/// [`spawn_on`](crate::spawn_on), the core that asked).
///
/// ```
/// let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let h = barewire_engine::spawn_local(async { 40 + 2 });
///     assert_eq!(h.await.unwrap(), 42);
/// });
/// ```
pub struct JoinHandle<T> {
    /// One word: a local task's header pointer (the handle's reference, from
    /// `RawJoin::into_raw`), or with the low bit set an `Arc<RemoteJoin<T>>` from
    /// `Arc::into_raw`. An enum of the two takes two words, and handles are often kept by the
    /// million (a vector of them per burst of spawns).
    word: std::ptr::NonNull<()>,
    /// `!Send`, and owns a `T` to come.
    _marker: PhantomData<Marker<T>>,
}

/// `JoinHandle`'s marker: a raw pointer (`!Send`, `!Sync`) and the output type.
type Marker<T> = (*const (), fn() -> T);

/// The low bit of `JoinHandle::word`: the handle is a `spawn_on` one.
const REMOTE: usize = 1;

/// What a `JoinHandle`'s word stands for, borrowed.
enum Inner<'a, T> {
    Local(std::mem::ManuallyDrop<raw::RawJoin>),
    Remote(&'a RemoteJoin<T>),
}

impl<T> JoinHandle<T> {
    pub(crate) fn local(raw: raw::RawJoin) -> Self {
        JoinHandle {
            word: raw.into_raw().cast(),
            _marker: PhantomData,
        }
    }

    pub(crate) fn remote(shared: std::sync::Arc<RemoteJoin<T>>) -> Self {
        const { assert!(std::mem::align_of::<RemoteJoin<T>>() > REMOTE) };
        let ptr = std::sync::Arc::into_raw(shared) as *mut u8;
        // The tag goes in the low bit, which the alignment leaves clear; the pointer keeps its
        // provenance.
        let tagged = ptr.wrapping_add(REMOTE) as *mut ();
        JoinHandle {
            // SAFETY: Arc::into_raw is never null, nor is it plus one.
            word: unsafe { std::ptr::NonNull::new_unchecked(tagged) },
            _marker: PhantomData,
        }
    }

    fn inner(&self) -> Inner<'_, T> {
        let p = self.word.as_ptr() as *mut u8;
        if p as usize & REMOTE == 0 {
            // SAFETY: an untagged word is a header pointer from RawJoin::into_raw, whose
            // reference this handle owns; ManuallyDrop leaves it owned by the handle.
            Inner::Local(std::mem::ManuallyDrop::new(unsafe {
                raw::RawJoin::from_raw(self.word.cast())
            }))
        } else {
            // SAFETY: a tagged word is Arc::into_raw plus one; the handle owns that Arc, so the
            // RemoteJoin lives as long as this borrow.
            Inner::Remote(unsafe { &*(p.wrapping_sub(REMOTE) as *const RemoteJoin<T>) })
        }
    }

    /// Asks the task to stop. It is dropped at its next scheduling point, and awaiting the handle
    /// then yields `Err(JoinError::Cancelled)` (unless it had already finished).
    pub fn cancel(&self) {
        match self.inner() {
            Inner::Local(raw) => raw.cancel(),
            Inner::Remote(r) => r.cancel(),
        }
    }

    /// True once the task has finished, successfully or not.
    pub fn is_finished(&self) -> bool {
        match self.inner() {
            Inner::Local(raw) => raw.is_finished(),
            Inner::Remote(r) => r.is_finished(),
        }
    }
}

impl<T> Drop for JoinHandle<T> {
    fn drop(&mut self) {
        let p = self.word.as_ptr() as *mut u8;
        if p as usize & REMOTE == 0 {
            // SAFETY: the handle's reference, taken back once, here.
            drop(unsafe { raw::RawJoin::from_raw(self.word.cast()) });
        } else {
            // SAFETY: the Arc the handle was made from, given back once, here.
            drop(unsafe {
                std::sync::Arc::from_raw(p.wrapping_sub(REMOTE) as *const RemoteJoin<T>)
            });
        }
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.inner() {
            // SAFETY: a local JoinHandle<T> is only made by spawn_local for a future whose
            // output is T, and JoinHandle is !Send, so this runs on the owner thread.
            Inner::Local(raw) => unsafe { raw.poll_join::<T>(cx) },
            Inner::Remote(r) => r.poll_join(cx),
        }
    }
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle")
            .field("finished", &self.is_finished())
            .finish()
    }
}
