//! The task cell: one heap block per task holding a small header and the future (later its
//! output).
//!
//! Only the reference count and the `SCHEDULED` bit are touched from other threads (a `Waker`
//! is `Send + Sync`, so any thread may clone, drop or wake it). Everything else in the cell —
//! the future, the output, the join waker, the links of the per-core task list — is touched
//! only by the owning core's thread. Because the future and output are always dropped on the
//! owner (on completion, on cancel, by the `JoinHandle`, or at core shutdown), a last reference
//! released on a foreign thread only frees memory, never runs a `!Send` destructor there.

use std::any::Any;
use std::cell::{Cell as StdCell, UnsafeCell};
use std::future::Future;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

use crate::core::CoreShared;
use crate::task::JoinError;

/// Queued on a run queue or an inbox and not yet polled.
pub(crate) const SCHEDULED: usize = 1 << 0;
/// The future has finished (output stored or dropped); it is never polled again.
pub(crate) const COMPLETE: usize = 1 << 1;
/// `JoinHandle::cancel` was called.
pub(crate) const CANCELLED: usize = 1 << 2;
/// A `JoinHandle` still exists, so the output must be kept.
pub(crate) const JOIN_INTEREST: usize = 1 << 3;
const REF_ONE: usize = 1 << 4;

pub(crate) struct Header {
    state: AtomicUsize,
    vtable: &'static Vtable,
    pub(crate) owner: Arc<CoreShared>,
    // Owner thread only.
    pub(crate) prev: StdCell<Option<NonNull<Header>>>,
    pub(crate) next: StdCell<Option<NonNull<Header>>>,
    join_waker: UnsafeCell<Option<Waker>>,
}

struct Vtable {
    /// Polls the future; true when the task has finished (output stored).
    poll: unsafe fn(NonNull<Header>) -> bool,
    /// Drops the future and stores `Err(e)` as the output.
    abort: unsafe fn(NonNull<Header>, JoinError),
    /// Drops whatever the stage holds (future or output).
    drop_stage: unsafe fn(NonNull<Header>),
    /// Moves the output into `*mut Option<Result<T, JoinError>>`.
    take_output: unsafe fn(NonNull<Header>, *mut ()),
    dealloc: unsafe fn(NonNull<Header>),
}

enum Stage<F: Future> {
    Running(F),
    Finished(Result<F::Output, JoinError>),
    Consumed,
}

#[repr(C)]
struct TaskCell<F: Future> {
    header: Header,
    stage: UnsafeCell<Stage<F>>,
}

/// Bytes a task costs beyond its future and output: the header plus the stage tag.
pub fn task_overhead_bytes<F: Future>() -> usize {
    std::mem::size_of::<TaskCell<F>>()
        - std::mem::size_of::<F>().max(std::mem::size_of::<F::Output>())
}

/// An owned reference to a task.
pub(crate) struct RawTask {
    ptr: NonNull<Header>,
}

impl RawTask {
    /// Allocates a task. The returned references are: one for the per-core task list, one for
    /// the `JoinHandle`, and one for the first run-queue entry.
    pub(crate) fn allocate<F: Future + 'static>(
        future: F,
        owner: Arc<CoreShared>,
    ) -> NonNull<Header> {
        let cell = Box::new(TaskCell {
            header: Header {
                state: AtomicUsize::new(SCHEDULED | JOIN_INTEREST | (3 * REF_ONE)),
                vtable: vtable::<F>(),
                owner,
                prev: StdCell::new(None),
                next: StdCell::new(None),
                join_waker: UnsafeCell::new(None),
            },
            stage: UnsafeCell::new(Stage::Running(future)),
        });
        NonNull::from(Box::leak(cell)).cast()
    }

    /// Adopts one reference that the caller owns.
    ///
    /// # Safety
    /// `ptr` is a live task and the caller transfers one reference.
    pub(crate) unsafe fn from_raw(ptr: NonNull<Header>) -> RawTask {
        RawTask { ptr }
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: we hold a reference, so the cell is alive.
        unsafe { self.ptr.as_ref() }
    }

    pub(crate) fn state(&self) -> usize {
        self.header().state.load(Ordering::Acquire)
    }

    /// Clears `SCHEDULED` before a poll, so a wake during the poll queues the task again.
    pub(crate) fn clear_scheduled(&self) -> usize {
        self.header().state.fetch_and(!SCHEDULED, Ordering::AcqRel)
    }

    /// Polls the future. Owner thread only. True when it finished.
    pub(crate) fn poll(&self) -> bool {
        // SAFETY: called on the owner thread (the executor only polls its own tasks), and the
        // task is not complete (the caller checked), so the stage holds the future.
        unsafe { (self.header().vtable.poll)(self.ptr) }
    }

    /// Drops the future and stores `err` as the output. Owner thread only.
    pub(crate) fn abort(&self, err: JoinError) {
        // SAFETY: owner thread; the stage is only touched here.
        unsafe { (self.header().vtable.abort)(self.ptr, err) }
    }

    /// Marks the task complete, drops an output nobody will read, and wakes the joiner.
    /// Owner thread only.
    pub(crate) fn complete(&self) {
        let prev = self.header().state.fetch_or(COMPLETE, Ordering::AcqRel);
        if prev & JOIN_INTEREST == 0 {
            // SAFETY: owner thread, and no JoinHandle can read the output any more.
            unsafe { (self.header().vtable.drop_stage)(self.ptr) };
        }
        // SAFETY: the join waker is only touched on the owner thread.
        let waker = unsafe { (*self.header().join_waker.get()).take() };
        if let Some(w) = waker {
            w.wake();
        }
    }

    fn ref_inc(header: &Header) {
        let prev = header.state.fetch_add(REF_ONE, Ordering::Relaxed);
        if prev > usize::MAX / 2 {
            std::process::abort();
        }
    }
}

impl Clone for RawTask {
    fn clone(&self) -> Self {
        RawTask::ref_inc(self.header());
        RawTask { ptr: self.ptr }
    }
}

impl Drop for RawTask {
    fn drop(&mut self) {
        // SAFETY: we own one reference.
        unsafe { ref_dec(self.ptr) }
    }
}

/// # Safety
/// The caller gives up one reference to a live task.
unsafe fn ref_dec(ptr: NonNull<Header>) {
    // SAFETY: the caller owns a reference, so the header is alive.
    let header = unsafe { ptr.as_ref() };
    let prev = header.state.fetch_sub(REF_ONE, Ordering::AcqRel);
    if prev & !(REF_ONE - 1) == REF_ONE {
        // SAFETY: that was the last reference. The stage no longer needs dropping on the owner:
        // every path that ends a task's life on its core (completion, abort, JoinHandle drop,
        // core shutdown) left it Consumed or with a Send-safe output... see drop_stage below.
        unsafe { (header.vtable.dealloc)(ptr) }
    }
}

/// Schedules the task on its owner: the local run queue when woken on the owner's thread,
/// otherwise the owner's inbox (which wakes it if it sleeps).
fn schedule(ptr: NonNull<Header>) {
    // SAFETY: the caller (a waker) holds a reference.
    let header = unsafe { ptr.as_ref() };
    let prev = header.state.fetch_or(SCHEDULED, Ordering::AcqRel);
    if prev & (SCHEDULED | COMPLETE) != 0 {
        return;
    }
    RawTask::ref_inc(header);
    // SAFETY: we just took the reference handed over here.
    let task = unsafe { RawTask::from_raw(ptr) };
    crate::core::schedule_task(task);
}

fn vtable<F: Future + 'static>() -> &'static Vtable {
    &Vtable {
        poll: poll::<F>,
        abort: abort::<F>,
        drop_stage: drop_stage::<F>,
        take_output: take_output::<F>,
        dealloc: dealloc::<F>,
    }
}

/// # Safety
/// Owner thread; `ptr` is a live `TaskCell<F>`.
unsafe fn stage<'a, F: Future>(ptr: NonNull<Header>) -> &'a mut Stage<F> {
    // SAFETY: the header is the first field of a repr(C) TaskCell<F>; the stage is only
    // accessed on the owner thread, never re-entrantly.
    unsafe { &mut *ptr.cast::<TaskCell<F>>().as_ref().stage.get() }
}

unsafe fn poll<F: Future + 'static>(ptr: NonNull<Header>) -> bool {
    // SAFETY: forwarded contract.
    let stage = unsafe { stage::<F>(ptr) };
    let Stage::Running(fut) = stage else {
        return true;
    };
    // A borrowed waker: it does not own a reference, so it must not be dropped.
    // SAFETY: the vtable's functions uphold RawWaker's contract for a task header pointer.
    let waker = ManuallyDrop::new(unsafe {
        Waker::from_raw(RawWaker::new(ptr.as_ptr() as *const (), &WAKER_VTABLE))
    });
    let mut cx = Context::from_waker(&waker);
    // SAFETY: the future lives in a heap cell that never moves until it is dropped in place.
    let fut = unsafe { Pin::new_unchecked(fut) };
    let out = match catch_unwind(AssertUnwindSafe(|| fut.poll(&mut cx))) {
        Ok(Poll::Pending) => return false,
        Ok(Poll::Ready(v)) => Ok(v),
        Err(panic) => Err(JoinError::Panicked(panic)),
    };
    replace_stage(stage, Stage::Finished(out));
    true
}

/// Replaces the stage, catching a panic from the old value's destructor.
fn replace_stage<F: Future>(stage: &mut Stage<F>, new: Stage<F>) {
    let _ = catch_unwind(AssertUnwindSafe(|| *stage = Stage::Consumed));
    *stage = new;
}

unsafe fn abort<F: Future + 'static>(ptr: NonNull<Header>, err: JoinError) {
    // SAFETY: forwarded contract.
    let stage = unsafe { stage::<F>(ptr) };
    replace_stage(stage, Stage::Finished(Err(err)));
}

unsafe fn drop_stage<F: Future + 'static>(ptr: NonNull<Header>) {
    // SAFETY: forwarded contract.
    let stage = unsafe { stage::<F>(ptr) };
    replace_stage(stage, Stage::Consumed);
}

unsafe fn take_output<F: Future + 'static>(ptr: NonNull<Header>, dst: *mut ()) {
    // SAFETY: forwarded contract.
    let stage = unsafe { stage::<F>(ptr) };
    let out = match std::mem::replace(stage, Stage::Consumed) {
        Stage::Finished(out) => out,
        _ => panic!("JoinHandle polled after it returned its output"),
    };
    // SAFETY: the JoinHandle<F::Output> passes a pointer to its Option<Result<F::Output, _>>.
    unsafe { *(dst as *mut Option<Result<F::Output, JoinError>>) = Some(out) };
}

unsafe fn dealloc<F: Future + 'static>(ptr: NonNull<Header>) {
    // SAFETY: last reference; the cell was allocated as a Box<TaskCell<F>>. Its stage is
    // Consumed or holds an output whose JoinHandle already dropped it (see drop_stage), except
    // at process teardown when a core vanished without shutdown, where dropping here is the
    // only choice left.
    drop(unsafe { Box::from_raw(ptr.cast::<TaskCell<F>>().as_ptr()) });
}

static WAKER_VTABLE: RawWakerVTable =
    RawWakerVTable::new(waker_clone, waker_wake, waker_wake_by_ref, waker_drop);

unsafe fn waker_clone(data: *const ()) -> RawWaker {
    // SAFETY: data is a live task header (the waker holds or borrows a reference).
    let header = unsafe { &*(data as *const Header) };
    RawTask::ref_inc(header);
    RawWaker::new(data, &WAKER_VTABLE)
}

unsafe fn waker_wake(data: *const ()) {
    // SAFETY: RawWaker data is a non-null header pointer.
    let ptr = unsafe { NonNull::new_unchecked(data as *mut Header) };
    schedule(ptr);
    // SAFETY: wake consumes the waker's reference.
    unsafe { ref_dec(ptr) };
}

unsafe fn waker_wake_by_ref(data: *const ()) {
    // SAFETY: RawWaker data is a non-null header pointer.
    schedule(unsafe { NonNull::new_unchecked(data as *mut Header) });
}

unsafe fn waker_drop(data: *const ()) {
    // SAFETY: dropping the waker releases its reference.
    unsafe { ref_dec(NonNull::new_unchecked(data as *mut Header)) }
}

/// The local side of a `JoinHandle`: one reference plus typed access to the output.
pub(crate) struct RawJoin {
    task: RawTask,
}

impl RawJoin {
    /// # Safety
    /// `ptr` is a live task whose output type the caller will name in `poll_join`, and the
    /// caller hands over the JoinHandle's reference.
    pub(crate) unsafe fn new(ptr: NonNull<Header>) -> RawJoin {
        // SAFETY: forwarded contract.
        let task = unsafe { RawTask::from_raw(ptr) };
        RawJoin { task }
    }

    /// # Safety
    /// `T` is the task's output type; called on the owner thread.
    pub(crate) unsafe fn poll_join<T>(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>> {
        let header = self.task.header();
        if header.state.load(Ordering::Acquire) & COMPLETE != 0 {
            let mut out: Option<Result<T, JoinError>> = None;
            // SAFETY: T is the output type (caller's contract); owner thread.
            unsafe { (header.vtable.take_output)(self.task.ptr, &mut out as *mut _ as *mut ()) };
            return Poll::Ready(out.expect("take_output fills the slot"));
        }
        // SAFETY: the join waker is only touched on the owner thread.
        let slot = unsafe { &mut *header.join_waker.get() };
        match slot {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.task.state() & COMPLETE != 0
    }

    pub(crate) fn cancel(&self) {
        let header = self.task.header();
        let prev = header.state.fetch_or(CANCELLED, Ordering::AcqRel);
        if prev & COMPLETE == 0 {
            schedule(self.task.ptr);
        }
    }
}

impl Drop for RawJoin {
    fn drop(&mut self) {
        let header = self.task.header();
        let prev = header.state.fetch_and(!JOIN_INTEREST, Ordering::AcqRel);
        if prev & COMPLETE != 0 {
            // SAFETY: JoinHandles are !Send, so this is the owner thread; the output (if still
            // there) has no other reader.
            unsafe { (header.vtable.drop_stage)(self.task.ptr) };
        }
        // SAFETY: owner thread; the join waker is no longer needed.
        unsafe { *header.join_waker.get() = None };
    }
}

/// Boxed panic payload alias.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;
