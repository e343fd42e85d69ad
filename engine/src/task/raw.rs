//! The task cell: one heap block per task holding a small header and the future (later its
//! output). The block comes from the core's cache of dead cells of its size when there is one
//! (`cache.rs`), else from the allocator, and a cell that dies on its core goes back there.
//!
//! The header's state is split (see `refs.rs`): flags and the references held on the owner
//! thread live in a plain word that only the owner touches, so spawning, running, completing and
//! joining a task on its own core costs no atomic read-modify-write; the references held by
//! wakers (a `Waker` is `Send + Sync`, so any thread may clone, drop or wake it) and by inbox
//! entries are atomic. Everything else in the cell — the future, the output, the join waker,
//! the links of the per-core task list — is touched only by the owning core's thread. Because
//! the future and output are always dropped on the owner (on completion, on cancel, by the
//! `JoinHandle`, or at core shutdown), a last reference released on a foreign thread only frees
//! memory, never runs a `!Send` destructor there.

use std::alloc::Layout;
use std::any::Any;
use std::cell::{Cell as StdCell, UnsafeCell};
use std::future::Future;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

use super::cache::CellCache;
use super::refs::Refs;
pub(crate) use super::refs::{CANCELLED, COMPLETE, JOIN_INTEREST, SCHEDULED};
use super::refs::{STAGE_ERROR, STAGE_FUTURE, STAGE_OUTPUT, STAGE_VACANT};
use crate::core::CoreShared;
use crate::task::JoinError;

pub(crate) struct Header {
    refs: Refs,
    vtable: &'static Vtable,
    /// The owning core's shared half. Not an `Arc`: the core's count of live cells keeps it
    /// alive as long as this cell (see `cells.rs`).
    owner: NonNull<CoreShared>,
    // Owner thread only.
    pub(crate) prev: StdCell<Option<NonNull<Header>>>,
    pub(crate) next: StdCell<Option<NonNull<Header>>>,
    /// The next task in the core's run queue (see `RunQueue`).
    run_next: StdCell<Option<NonNull<Header>>>,
    join: JoinSlot,
}

/// Who waits for a task's output, in one word (a `Waker` takes two, in every task's header).
/// Owner thread only. 0: nobody. A header pointer (low bit clear): a task of this core, polled
/// when it registered, for which the slot holds a local reference: the common case of one task
/// awaiting another, with no allocation and no atomic. With the low bit set: a boxed clone of
/// any other waker (`block_on`'s, a combinator's).
///
/// The slot is empty whenever the task's last reference goes (possibly on another thread): it
/// is emptied on completion and when the `JoinHandle`, the only one that fills it, is dropped,
/// both on the owner thread and before the handle's own reference goes.
struct JoinSlot(StdCell<usize>);

/// The low bit of a `JoinSlot`: the word is a `Box<Waker>`.
const BOXED: usize = 1;

thread_local! {
    /// The task being polled on this thread (null between polls): a `JoinHandle` it awaits
    /// recognises its waker and keeps the task's pointer instead of a clone.
    static POLLING: StdCell<*const Header> = const { StdCell::new(std::ptr::null()) };
}

impl JoinSlot {
    const fn new() -> JoinSlot {
        JoinSlot(StdCell::new(0))
    }

    /// Makes `waker` the one woken on completion.
    ///
    /// # Safety
    /// Owner thread.
    unsafe fn register(&self, waker: &Waker) {
        let word = self.0.get();
        let polling = POLLING.with(|p| p.get());
        if !polling.is_null() {
            // A borrowed waker of the task being polled: it owns no reference.
            // SAFETY: the vtable's functions uphold RawWaker's contract for a header pointer.
            let mine = ManuallyDrop::new(unsafe {
                Waker::from_raw(RawWaker::new(polling as *const (), &WAKER_VTABLE))
            });
            if mine.will_wake(waker) {
                if word == polling as usize {
                    return;
                }
                // SAFETY: owner thread (forwarded).
                unsafe { self.clear() };
                // SAFETY: the task being polled on this thread is alive and of this core (a
                // task is polled only by its owner).
                unsafe { (*polling).refs.local_inc() };
                self.0.set(polling as usize);
                return;
            }
        }
        if word & BOXED != 0 {
            // SAFETY: a boxed word is a live Box<Waker> the slot owns.
            if unsafe { &*((word & !BOXED) as *const Waker) }.will_wake(waker) {
                return;
            }
        }
        // SAFETY: owner thread (forwarded).
        unsafe { self.clear() };
        let boxed = Box::into_raw(Box::new(waker.clone()));
        self.0.set(boxed as usize | BOXED);
    }

    /// Empties the slot and wakes whoever was in it.
    ///
    /// # Safety
    /// Owner thread.
    unsafe fn wake(&self) {
        match self.0.replace(0) {
            0 => {}
            w if w & BOXED != 0 => {
                // SAFETY: a boxed word is a Box<Waker> the slot owned; taken once, here.
                unsafe { Box::from_raw((w & !BOXED) as *mut Waker) }.wake();
            }
            w => {
                // SAFETY: a header word is a live task of this core with the slot's local
                // reference, adopted here and dropped after the wake.
                let ptr = unsafe { NonNull::new_unchecked(w as *mut Header) };
                schedule(ptr);
                // SAFETY: as above.
                drop(unsafe { RawTask::from_raw(ptr) });
            }
        }
    }

    /// Empties the slot without waking.
    ///
    /// # Safety
    /// Owner thread.
    unsafe fn clear(&self) {
        match self.0.replace(0) {
            0 => {}
            // SAFETY: as in `wake`.
            w if w & BOXED != 0 => drop(unsafe { Box::from_raw((w & !BOXED) as *mut Waker) }),
            // SAFETY: as in `wake`.
            w => drop(unsafe { RawTask::from_raw(NonNull::new_unchecked(w as *mut Header)) }),
        }
    }
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
    /// Drops whatever the stage still holds before the cell's memory goes.
    finish: unsafe fn(NonNull<Header>),
    /// The cell's layout, to free (or cache) its memory.
    layout: Layout,
}

/// What a task's cell holds after its header: the future while it runs, then its output or why
/// it has none, then nothing. Which field is live is recorded in the header's local word
/// (`STAGE_*`, owner thread only), not in a tag of its own: beside an output, a tag would cost
/// most tasks a word (the future's own niches rarely have room for it), and an error stored as
/// half of a `Result` would cost another. So the stage is as large as the larger of the future
/// and the output, and at least one word (the error).
union Stage<F: Future> {
    future: ManuallyDrop<F>,
    output: ManuallyDrop<F::Output>,
    error: ManuallyDrop<StoredError>,
}

/// A [`JoinError`] as a finished task's stage keeps it, in one word: a panic's payload (a fat
/// pointer) boxed once more, `None` for a cancel. `JoinError` itself is two words, so a task
/// whose future and output are one word each would otherwise grow by one for it.
struct StoredError(Option<Box<Panic>>);

impl From<JoinError> for StoredError {
    fn from(e: JoinError) -> Self {
        match e {
            JoinError::Cancelled => StoredError(None),
            JoinError::Panicked(p) => StoredError(Some(Box::new(p))),
        }
    }
}

impl From<StoredError> for JoinError {
    fn from(e: StoredError) -> Self {
        match e.0 {
            None => JoinError::Cancelled,
            Some(p) => JoinError::Panicked(*p),
        }
    }
}

#[repr(C)]
struct TaskCell<F: Future> {
    header: Header,
    stage: UnsafeCell<Stage<F>>,
}

/// Bytes a task costs beyond its future and output: the header (and, where both the future and
/// the output are smaller than a word, the stage's room for an error).
pub fn task_overhead_bytes<F: Future>() -> usize {
    std::mem::size_of::<TaskCell<F>>()
        - std::mem::size_of::<F>().max(std::mem::size_of::<F::Output>())
}

/// A reference to a task held on its owner thread (the task list, a run-queue entry, the
/// `JoinHandle`): counted without atomics, so it must never leave that thread.
pub(crate) struct RawTask {
    ptr: NonNull<Header>,
}

/// A reference to a task held by an inbox entry: counted atomically, so any thread may hold and
/// drop it; only the owner looks inside.
pub(crate) struct RemoteRef {
    ptr: NonNull<Header>,
}

// SAFETY: a RemoteRef touches only the atomic half of the header from wherever it is dropped;
// it reaches the task's cell otherwise only on the owner thread (`Core::drain_inbox`).
unsafe impl Send for RemoteRef {}

impl RemoteRef {
    /// The owner took this entry: clears `QUEUED` and returns a run-queue reference if the
    /// task is to run (neither scheduled already nor complete).
    ///
    /// # Safety
    /// Called on the task's owner thread.
    pub(crate) unsafe fn take(self) -> Option<RawTask> {
        // SAFETY: we hold a reference, so the cell is alive.
        let header = unsafe { self.ptr.as_ref() };
        header.refs.unqueue();
        // SAFETY: forwarded contract.
        unsafe { RawTask::schedule_local(self.ptr) }
    }
}

impl Drop for RemoteRef {
    fn drop(&mut self) {
        // SAFETY: we own one remote reference to a live task.
        unsafe { remote_dec(self.ptr) }
    }
}

impl RawTask {
    /// Allocates a task. The returned references are: one for the per-core task list, one for
    /// the `JoinHandle`, and one for the first run-queue entry.
    ///
    /// The caller (the owning core) counts the new cell among its live ones (see `cells.rs`).
    pub(crate) fn allocate<F: Future + 'static>(
        future: F,
        owner: &Arc<CoreShared>,
        cache: &CellCache,
    ) -> NonNull<Header> {
        let mem = cache
            .alloc(Layout::new::<TaskCell<F>>())
            .cast::<TaskCell<F>>();
        // SAFETY: fresh memory (or a dead cell's) with TaskCell<F>'s layout, written whole.
        unsafe {
            mem.as_ptr().write(TaskCell {
                header: Header {
                    refs: Refs::new(SCHEDULED | JOIN_INTEREST, 3),
                    vtable: vtable::<F>(),
                    // From the Arc's own pointer, not `&**owner`: the last cell's free gives
                    // the handover's `Arc` back through this pointer, which must reach the
                    // whole allocation (counts included; Miri's borrow checks flag one made
                    // from a reference).
                    owner: NonNull::new(Arc::as_ptr(owner).cast_mut())
                        .expect("an Arc's pointer is not null"),
                    prev: StdCell::new(None),
                    next: StdCell::new(None),
                    run_next: StdCell::new(None),
                    join: JoinSlot::new(),
                },
                // `Refs::new` starts the stage at STAGE_FUTURE.
                stage: UnsafeCell::new(Stage {
                    future: ManuallyDrop::new(future),
                }),
            })
        };
        mem.cast()
    }

    /// Adopts one reference that the caller owns.
    ///
    /// # Safety
    /// `ptr` is a live task and the caller transfers one reference.
    pub(crate) unsafe fn from_raw(ptr: NonNull<Header>) -> RawTask {
        RawTask { ptr }
    }

    /// The task's pointer, which reaches its whole cell (a `&Header` reaches the header only).
    pub(crate) fn as_ptr(&self) -> NonNull<Header> {
        self.ptr
    }

    pub(crate) fn header(&self) -> &Header {
        // SAFETY: we hold a reference, so the cell is alive.
        unsafe { self.ptr.as_ref() }
    }

    /// Clears `SCHEDULED` before a poll, so a wake during the poll queues the task again.
    /// Returns the flags before.
    pub(crate) fn clear_scheduled(&self) -> u32 {
        self.header().refs.clear(SCHEDULED)
    }

    /// A wake on the owner thread: marks the task scheduled and returns the run-queue reference,
    /// unless it is scheduled already or complete.
    ///
    /// # Safety
    /// `ptr` is a live task (the caller holds a reference) and this is its owner thread.
    pub(crate) unsafe fn schedule_local(ptr: NonNull<Header>) -> Option<RawTask> {
        // SAFETY: the caller holds a reference.
        let refs = unsafe { &ptr.as_ref().refs };
        if refs.set(SCHEDULED) & (SCHEDULED | COMPLETE) != 0 {
            return None;
        }
        refs.local_inc();
        Some(RawTask { ptr })
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
        let prev = self.header().refs.set(COMPLETE);
        if prev & JOIN_INTEREST == 0 {
            // SAFETY: owner thread, and no JoinHandle can read the output any more.
            unsafe { (self.header().vtable.drop_stage)(self.ptr) };
        }
        // SAFETY: owner thread.
        unsafe { self.header().join.wake() };
    }
}

impl Drop for RawTask {
    fn drop(&mut self) {
        // SAFETY: a RawTask lives on its owner thread (it is !Send) and owns one local
        // reference.
        if unsafe { self.ptr.as_ref() }.refs.local_dec() {
            // SAFETY: that was the last reference of either kind.
            unsafe { dealloc_task(self.ptr) }
        }
    }
}

/// # Safety
/// The caller gives up one remote reference to a live task.
unsafe fn remote_dec(ptr: NonNull<Header>) {
    // SAFETY: the caller owns a reference, so the header is alive.
    if unsafe { ptr.as_ref() }.refs.remote_dec() {
        // SAFETY: that was the last reference of either kind.
        unsafe { dealloc_task(ptr) }
    }
}

/// # Safety
/// No reference to the task is left.
unsafe fn dealloc_task(ptr: NonNull<Header>) {
    // SAFETY: the caller's last reference keeps the header alive until the free below.
    let (owner, vtable) = unsafe { (ptr.as_ref().owner, ptr.as_ref().vtable) };
    // SAFETY: the stage no longer needs dropping on the owner: every path that ends a task's
    // life on its core (completion, abort, JoinHandle drop, core shutdown) left it vacant or
    // with an output its JoinHandle already dropped; see `finish`.
    unsafe { (vtable.finish)(ptr) }
    // SAFETY: the cell is dead, allocated with its vtable's layout, and counted live by its
    // owner, which kept `owner` alive.
    unsafe { crate::core::free_cell(owner, ptr.cast(), vtable.layout) }
}

/// A core's run queue, linked through the tasks' headers: a queued task costs no slot in a
/// separate buffer (a `VecDeque` of 8-byte entries grows to the largest burst and keeps that
/// memory), and pushing or popping touches only the task's own header, which polling it reads
/// anyway. Owner thread only. Each entry holds a local reference, as a `RawTask` would. A task
/// is queued at most once at a time: every push follows `SCHEDULED` going from clear to set,
/// and the flag is cleared only after the pop.
pub(crate) struct RunQueue {
    head: StdCell<Option<NonNull<Header>>>,
    tail: StdCell<Option<NonNull<Header>>>,
}

impl RunQueue {
    pub(crate) const fn new() -> RunQueue {
        RunQueue {
            head: StdCell::new(None),
            tail: StdCell::new(None),
        }
    }

    pub(crate) fn push_back(&self, task: RawTask) {
        let ptr = task.ptr;
        std::mem::forget(task);
        // SAFETY: the entry's reference keeps the task alive; links are owner-thread only.
        debug_assert!(unsafe { ptr.as_ref() }.run_next.get().is_none());
        match self.tail.replace(Some(ptr)) {
            // SAFETY: the old tail is queued, so alive (its entry holds a reference).
            Some(t) => unsafe { t.as_ref() }.run_next.set(Some(ptr)),
            None => self.head.set(Some(ptr)),
        }
    }

    pub(crate) fn pop_front(&self) -> Option<RawTask> {
        let ptr = self.head.get()?;
        // SAFETY: queued, so alive; owner thread.
        let next = unsafe { ptr.as_ref() }.run_next.take();
        self.head.set(next);
        if next.is_none() {
            self.tail.set(None);
        }
        // SAFETY: the entry's reference, handed over.
        Some(unsafe { RawTask::from_raw(ptr) })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head.get().is_none()
    }
}

impl Drop for RunQueue {
    fn drop(&mut self) {
        while self.pop_front().is_some() {}
    }
}

/// Schedules the task on its owner: the local run queue when woken on the owner's core, else
/// the owner's inbox (which wakes it if it sleeps), at most one entry at a time.
fn schedule(ptr: NonNull<Header>) {
    // SAFETY: the caller (a waker or the JoinHandle) holds a reference.
    let header = unsafe { ptr.as_ref() };
    let on_owner = crate::core::try_with_core(|c| {
        if !std::ptr::eq(Arc::as_ptr(&c.shared), header.owner.as_ptr()) {
            return false;
        }
        // SAFETY: this thread runs the owner core.
        if let Some(task) = unsafe { RawTask::schedule_local(ptr) } {
            c.push_task(task);
        }
        true
    })
    .unwrap_or(false);
    if !on_owner && header.refs.queue_remote() {
        // `queue_remote` took the entry's reference.
        // SAFETY: the caller's reference keeps the cell, and so its owner's shared half, alive.
        let owner = unsafe { header.owner.as_ref() };
        if let Err(entry) = owner
            .wake
            .push(crate::core::InboxItem::Task(RemoteRef { ptr }))
        {
            // The core has gone: nothing will run the task again. The entry's reference goes
            // (never the last: the caller holds one).
            drop(entry);
        }
    }
}

/// `F`'s vtable, a constant so that a reference to it is promoted to a static.
struct VtableOf<F>(std::marker::PhantomData<F>);

impl<F: Future + 'static> VtableOf<F> {
    const VTABLE: Vtable = Vtable {
        poll: poll::<F>,
        abort: abort::<F>,
        drop_stage: drop_stage::<F>,
        take_output: take_output::<F>,
        finish: finish::<F>,
        layout: Layout::new::<TaskCell<F>>(),
    };
}

fn vtable<F: Future + 'static>() -> &'static Vtable {
    &VtableOf::<F>::VTABLE
}

/// # Safety
/// Owner thread (or the holder of the last reference, in `finish`); `ptr` is a live
/// `TaskCell<F>`.
unsafe fn stage<'a, F: Future>(ptr: NonNull<Header>) -> &'a mut Stage<F> {
    // SAFETY: the header is the first field of a repr(C) TaskCell<F>; the stage is only
    // accessed on the owner thread, never re-entrantly.
    unsafe { &mut *ptr.cast::<TaskCell<F>>().as_ref().stage.get() }
}

/// # Safety
/// As for [`stage`].
unsafe fn refs<'a>(ptr: NonNull<Header>) -> &'a Refs {
    // SAFETY: the caller holds a reference, so the header is alive.
    unsafe { &ptr.as_ref().refs }
}

/// Drops what the stage holds, catching a panic from its destructor, and leaves it vacant.
///
/// # Safety
/// As for [`stage`].
unsafe fn vacate<F: Future>(ptr: NonNull<Header>) {
    // SAFETY: forwarded contract.
    let (refs, stage) = unsafe { (refs(ptr), stage::<F>(ptr)) };
    let held = refs.stage();
    // Vacant before the drop: a destructor that panics leaves nothing to drop a second time.
    refs.set_stage(STAGE_VACANT);
    // SAFETY: the stage bits named the live field, dropped once, here (vacant now).
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        match held {
            STAGE_FUTURE => ManuallyDrop::drop(&mut stage.future),
            STAGE_OUTPUT => ManuallyDrop::drop(&mut stage.output),
            STAGE_ERROR => ManuallyDrop::drop(&mut stage.error),
            _ => {}
        }
    }));
}

/// Stores the task's result in its vacant stage.
///
/// # Safety
/// As for [`stage`], and the stage is vacant.
unsafe fn store<F: Future>(ptr: NonNull<Header>, out: Result<F::Output, StoredError>) {
    // SAFETY: forwarded contract.
    let (refs, stage) = unsafe { (refs(ptr), stage::<F>(ptr)) };
    debug_assert_eq!(refs.stage(), STAGE_VACANT);
    match out {
        Ok(v) => {
            stage.output = ManuallyDrop::new(v);
            refs.set_stage(STAGE_OUTPUT);
        }
        Err(e) => {
            stage.error = ManuallyDrop::new(e);
            refs.set_stage(STAGE_ERROR);
        }
    }
}

unsafe fn poll<F: Future + 'static>(ptr: NonNull<Header>) -> bool {
    // SAFETY: forwarded contract.
    if unsafe { refs(ptr) }.stage() != STAGE_FUTURE {
        return true;
    }
    // A borrowed waker: it does not own a reference, so it must not be dropped.
    // SAFETY: the vtable's functions uphold RawWaker's contract for a task header pointer.
    let waker = ManuallyDrop::new(unsafe {
        Waker::from_raw(RawWaker::new(ptr.as_ptr() as *const (), &WAKER_VTABLE))
    });
    let mut cx = Context::from_waker(&waker);
    // SAFETY: the stage holds the future (checked above), in a heap cell that never moves
    // until the future is dropped in place.
    let fut = unsafe { Pin::new_unchecked(&mut *stage::<F>(ptr).future) };
    let outer = POLLING.with(|p| p.replace(ptr.as_ptr()));
    let polled = catch_unwind(AssertUnwindSafe(|| fut.poll(&mut cx)));
    POLLING.with(|p| p.set(outer));
    let out = match polled {
        Ok(Poll::Pending) => return false,
        Ok(Poll::Ready(v)) => Ok(v),
        Err(panic) => Err(StoredError::from(JoinError::Panicked(panic))),
    };
    // SAFETY: forwarded contract; `vacate` leaves the stage vacant for `store`.
    unsafe {
        vacate::<F>(ptr);
        store::<F>(ptr, out);
    }
    true
}

unsafe fn abort<F: Future + 'static>(ptr: NonNull<Header>, err: JoinError) {
    // SAFETY: forwarded contract; `vacate` leaves the stage vacant for `store`.
    unsafe {
        vacate::<F>(ptr);
        store::<F>(ptr, Err(err.into()));
    }
}

unsafe fn drop_stage<F: Future + 'static>(ptr: NonNull<Header>) {
    // SAFETY: forwarded contract.
    unsafe { vacate::<F>(ptr) }
}

unsafe fn take_output<F: Future + 'static>(ptr: NonNull<Header>, dst: *mut ()) {
    // SAFETY: forwarded contract.
    let (refs, stage) = unsafe { (refs(ptr), stage::<F>(ptr)) };
    let out = match refs.stage() {
        // SAFETY: the stage bits name the live field; it is taken once (vacant below).
        STAGE_OUTPUT => Ok(unsafe { ManuallyDrop::take(&mut stage.output) }),
        // SAFETY: as above.
        STAGE_ERROR => Err(JoinError::from(unsafe {
            ManuallyDrop::take(&mut stage.error)
        })),
        _ => panic!("JoinHandle polled after it returned its output"),
    };
    refs.set_stage(STAGE_VACANT);
    // SAFETY: the JoinHandle<F::Output> passes a pointer to its Option<Result<F::Output, _>>.
    unsafe { *(dst as *mut Option<Result<F::Output, JoinError>>) = Some(out) };
}

unsafe fn finish<F: Future + 'static>(ptr: NonNull<Header>) {
    // SAFETY: last reference, so nothing else touches the cell (the references' release and
    // acquire order the owner's last writes to its local word before this read). The stage is
    // vacant, or holds an output whose JoinHandle already dropped it (see drop_stage), except
    // at process teardown when a core vanished without shutdown, where dropping here is the
    // only choice left. The cell's memory is freed by the caller; a union stage and the
    // header drop nothing of their own.
    unsafe {
        if refs(ptr).stage() != STAGE_VACANT {
            vacate::<F>(ptr);
        }
    }
}

static WAKER_VTABLE: RawWakerVTable =
    RawWakerVTable::new(waker_clone, waker_wake, waker_wake_by_ref, waker_drop);

// A waker owns a remote reference (the one `poll` lends out owns none).
unsafe fn waker_clone(data: *const ()) -> RawWaker {
    // SAFETY: data is a live task header (the waker holds or borrows a reference).
    let header = unsafe { &*(data as *const Header) };
    header.refs.remote_inc();
    RawWaker::new(data, &WAKER_VTABLE)
}

unsafe fn waker_wake(data: *const ()) {
    // SAFETY: RawWaker data is a non-null header pointer.
    let ptr = unsafe { NonNull::new_unchecked(data as *mut Header) };
    schedule(ptr);
    // SAFETY: wake consumes the waker's reference.
    unsafe { remote_dec(ptr) };
}

unsafe fn waker_wake_by_ref(data: *const ()) {
    // SAFETY: RawWaker data is a non-null header pointer.
    schedule(unsafe { NonNull::new_unchecked(data as *mut Header) });
}

unsafe fn waker_drop(data: *const ()) {
    // SAFETY: dropping the waker releases its reference.
    unsafe { remote_dec(NonNull::new_unchecked(data as *mut Header)) }
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

    /// The task's header pointer, keeping the handle's reference (see `from_raw`).
    pub(crate) fn into_raw(self) -> NonNull<Header> {
        let ptr = self.task.ptr;
        std::mem::forget(self);
        ptr
    }

    /// Takes back a handle given up with `into_raw`.
    ///
    /// # Safety
    /// `ptr` came from `into_raw` and is taken back once.
    pub(crate) unsafe fn from_raw(ptr: NonNull<Header>) -> RawJoin {
        // SAFETY: forwarded contract (the reference `into_raw` kept).
        unsafe { RawJoin::new(ptr) }
    }

    /// # Safety
    /// `T` is the task's output type; called on the owner thread.
    pub(crate) unsafe fn poll_join<T>(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>> {
        let header = self.task.header();
        if header.refs.flags() & COMPLETE != 0 {
            let mut out: Option<Result<T, JoinError>> = None;
            // SAFETY: T is the output type (caller's contract); owner thread.
            unsafe { (header.vtable.take_output)(self.task.ptr, &mut out as *mut _ as *mut ()) };
            return Poll::Ready(out.expect("take_output fills the slot"));
        }
        // SAFETY: owner thread (caller's contract).
        unsafe { header.join.register(cx.waker()) };
        Poll::Pending
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.task.header().refs.flags() & COMPLETE != 0
    }

    pub(crate) fn cancel(&self) {
        let header = self.task.header();
        let prev = header.refs.set(CANCELLED);
        if prev & COMPLETE == 0 {
            schedule(self.task.ptr);
        }
    }
}

impl Drop for RawJoin {
    fn drop(&mut self) {
        let header = self.task.header();
        let prev = header.refs.clear(JOIN_INTEREST);
        if prev & COMPLETE != 0 {
            // SAFETY: JoinHandles are !Send, so this is the owner thread; the output (if still
            // there) has no other reader.
            unsafe { (header.vtable.drop_stage)(self.task.ptr) };
        }
        // SAFETY: owner thread; nobody waits through this handle any more.
        unsafe { header.join.clear() };
    }
}

/// Boxed panic payload alias.
pub(crate) type Panic = Box<dyn Any + Send + 'static>;
