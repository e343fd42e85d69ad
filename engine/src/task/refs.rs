//! A task's state and reference counts, split so that what stays on its core costs no atomic
//! read-modify-write.
//!
//! - **Local** (a `Cell`, owner thread only): the flags (`SCHEDULED`, `COMPLETE`, `CANCELLED`,
//!   `JOIN_INTEREST`), which field of the task's stage is live (`STAGE_*`), and the
//!   references held on the owner thread: the per-core task list, each
//!   run-queue entry, the `JoinHandle` (which is `!Send`). Spawning, running, completing and
//!   joining a task touch only this word.
//! - **Remote** (atomic, any thread): the references held by wakers (a `Waker` is `Send`, so it
//!   may be cloned, dropped or woken anywhere) and by inbox entries, plus **one anchor for all
//!   local references together**, held while any exists; and the `QUEUED` bit, so a task woken
//!   from other threads sits in its owner's inbox at most once.
//!
//! The memory is freed by whoever drops the last remote reference: the anchor goes when the last
//! local reference does, so the count reaches zero exactly once, after every local and remote
//! holder is done, whichever thread comes last. A wake on the owner thread schedules through the
//! local word; a wake elsewhere sets `QUEUED` and hands a remote reference to the inbox, where
//! the owner clears `QUEUED` and schedules locally. `loom_tests` below check both halves.

use std::cell::Cell;

use crate::shim::{AtomicU32, Ordering};

/// Queued on the run queue and not yet polled.
pub(crate) const SCHEDULED: u32 = 1 << 0;
/// The future has finished (output stored or dropped); it is never polled again.
pub(crate) const COMPLETE: u32 = 1 << 1;
/// `JoinHandle::cancel` was called.
pub(crate) const CANCELLED: u32 = 1 << 2;
/// A `JoinHandle` still exists, so the output must be kept.
pub(crate) const JOIN_INTEREST: u32 = 1 << 3;
/// Two bits of the local word: which field of the task's stage (`raw::Stage`) is live.
pub(crate) const STAGE: u32 = 0b11 << 4;
/// The stage holds the future.
pub(crate) const STAGE_FUTURE: u32 = 0;
/// The stage holds the output.
pub(crate) const STAGE_OUTPUT: u32 = 1 << 4;
/// The stage holds why there is no output (a panic or a cancel).
pub(crate) const STAGE_ERROR: u32 = 2 << 4;
/// The stage holds nothing: taken by the `JoinHandle`, or dropped.
pub(crate) const STAGE_VACANT: u32 = 3 << 4;
const LOCAL_ONE: u32 = 1 << 6;
const FLAGS: u32 = LOCAL_ONE - 1;

/// In the remote word: an inbox entry for the task exists (or is being made).
const QUEUED: u32 = 1 << 0;
const REMOTE_ONE: u32 = 1 << 1;

pub(crate) struct Refs {
    local: Cell<u32>,
    remote: AtomicU32,
}

impl Refs {
    /// `local` references on the owner thread, with `flags`; the remote word starts with the
    /// anchor only.
    pub(crate) fn new(flags: u32, local: u32) -> Refs {
        debug_assert!(local > 0 && flags & !FLAGS == 0);
        Refs {
            local: Cell::new(flags | (local * LOCAL_ONE)),
            remote: AtomicU32::new(REMOTE_ONE),
        }
    }

    /// The flags. Owner thread only (as every method touching the local word).
    pub(crate) fn flags(&self) -> u32 {
        self.local.get() & FLAGS
    }

    /// Which field of the stage is live (`STAGE_*`).
    pub(crate) fn stage(&self) -> u32 {
        self.local.get() & STAGE
    }

    /// Records which field of the stage is live.
    pub(crate) fn set_stage(&self, stage: u32) {
        debug_assert!(stage & !STAGE == 0);
        self.local.set(self.local.get() & !STAGE | stage);
    }

    /// Sets `bits`; returns the flags before.
    pub(crate) fn set(&self, bits: u32) -> u32 {
        let v = self.local.get();
        self.local.set(v | bits);
        v & FLAGS
    }

    /// Clears `bits`; returns the flags before.
    pub(crate) fn clear(&self, bits: u32) -> u32 {
        let v = self.local.get();
        self.local.set(v & !bits);
        v & FLAGS
    }

    pub(crate) fn local_inc(&self) {
        let v = self.local.get();
        if v > u32::MAX - LOCAL_ONE {
            std::process::abort();
        }
        self.local.set(v + LOCAL_ONE);
    }

    /// Drops a local reference. True if the caller must free the task.
    pub(crate) fn local_dec(&self) -> bool {
        let v = self.local.get() - LOCAL_ONE;
        self.local.set(v);
        // The last local reference takes the anchor with it.
        v < LOCAL_ONE && self.anchor_dec()
    }

    /// Drops the anchor (the last local reference went). True if the caller must free the task.
    fn anchor_dec(&self) -> bool {
        // Only the anchor left: no other thread holds a reference, and none can take one (that
        // takes a reference already held), so this thread is the last and frees without a
        // read-modify-write. Acquire: whoever dropped the last other reference did so with
        // release, so its writes are visible to the free.
        if self.remote.load(Ordering::Acquire) == REMOTE_ONE {
            return true;
        }
        self.remote_dec()
    }

    /// Takes a remote reference (any thread; the caller holds one already, remote or local).
    pub(crate) fn remote_inc(&self) {
        let prev = self.remote.fetch_add(REMOTE_ONE, Ordering::Relaxed);
        if prev > u32::MAX / 2 {
            std::process::abort();
        }
    }

    /// Drops a remote reference (any thread). True if the caller must free the task: this was
    /// the last reference of either kind. Release publishes this holder's writes; acquire makes
    /// every other holder's visible to the one that frees.
    pub(crate) fn remote_dec(&self) -> bool {
        let prev = self.remote.fetch_sub(REMOTE_ONE, Ordering::AcqRel);
        prev & !QUEUED == REMOTE_ONE
    }

    /// A wake from a thread other than the owner's: true if the caller must put the task in
    /// the owner's inbox, with the remote reference taken here for that entry; false if an entry
    /// is already there (it will schedule the task after this wake).
    pub(crate) fn queue_remote(&self) -> bool {
        let prev = self.remote.fetch_or(QUEUED, Ordering::AcqRel);
        if prev & QUEUED != 0 {
            return false;
        }
        self.remote_inc();
        true
    }

    /// The owner took the task's inbox entry: later remote wakes queue it again. Acquire: what
    /// the waker wrote before waking is visible to the poll that follows.
    pub(crate) fn unqueue(&self) {
        self.remote.fetch_and(!QUEUED, Ordering::AcqRel);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::{Arc, Mutex};

    /// A task's refs in a model: freed is counted, never twice. `cell` stands for the task's
    /// memory: a holder on another thread writes it before dropping its reference, and the free
    /// writes it, so a free not ordered after that holder's last access is a data race loom
    /// reports.
    struct Task {
        refs: Refs,
        freed: AtomicUsize,
        cell: loom::cell::UnsafeCell<usize>,
    }
    // SAFETY: the model touches the local word only on the owner thread (the main model
    // thread), as the engine does.
    unsafe impl Sync for Task {}
    // SAFETY: as above.
    unsafe impl Send for Task {}

    impl Task {
        /// A holder about to touch the task: it must not have been freed.
        fn alive(&self) {
            assert_eq!(self.freed.load(Ordering::SeqCst), 0, "used after free");
        }

        fn free_if(&self, last: bool) {
            if last {
                // SAFETY: a model cell; loom checks the accesses' ordering.
                self.cell.with_mut(|p| unsafe { *p = 0 });
                assert_eq!(self.freed.fetch_add(1, Ordering::SeqCst), 0, "freed twice");
            }
        }

        /// A holder's access to the task's memory (a waker reading its header).
        fn touch(&self) {
            // SAFETY: a model cell; loom checks the accesses' ordering.
            self.cell.with(|p| unsafe { *p });
        }
    }

    /// The owner runs, completes and drops every local reference while another thread wakes
    /// the task (through the inbox) and drops its waker: the task is freed exactly once, after
    /// everyone is done, whichever side finishes last; and the inbox entry the waker made is
    /// taken by the owner with `QUEUED` cleared.
    #[test]
    fn loom_freed_once_whoever_is_last() {
        loom::model(|| {
            let t = Arc::new(Task {
                refs: Refs::new(SCHEDULED | JOIN_INTEREST, 3),
                freed: AtomicUsize::new(0),
                cell: loom::cell::UnsafeCell::new(1),
            });
            let inbox = Arc::new(Mutex::new(0usize));
            t.refs.remote_inc(); // a waker, cloned on the owner, sent away
            let (t2, inbox2) = (t.clone(), inbox.clone());
            let waker = loom::thread::spawn(move || {
                t2.alive();
                if t2.refs.queue_remote() {
                    *inbox2.lock().unwrap() += 1;
                }
                t2.alive();
                t2.touch();
                t2.free_if(t2.refs.remote_dec());
            });
            // The owner: run (clear SCHEDULED), complete, drop the list's and the run queue's
            // references, take whatever reached the inbox, drop the JoinHandle's.
            t.refs.clear(SCHEDULED);
            t.refs.set(COMPLETE);
            t.free_if(t.refs.local_dec());
            t.free_if(t.refs.local_dec());
            let entries = std::mem::take(&mut *inbox.lock().unwrap());
            for _ in 0..entries {
                t.alive();
                t.refs.unqueue();
                assert_ne!(t.refs.flags() & COMPLETE, 0);
                t.free_if(t.refs.remote_dec());
            }
            t.refs.clear(JOIN_INTEREST);
            t.free_if(t.refs.local_dec());
            waker.join().unwrap();
            // An entry made after the owner looked is dropped unprocessed (the core's shutdown
            // or the inbox's owner drop does that).
            let late = std::mem::take(&mut *inbox.lock().unwrap());
            for _ in 0..late {
                t.free_if(t.refs.remote_dec());
            }
            assert_eq!(t.freed.load(Ordering::SeqCst), 1);
        });
    }

    /// Two threads wake the same task at once: at most one inbox entry exists at a time, and
    /// after the owner takes it a later wake queues the task again.
    #[test]
    fn loom_remote_wakes_queue_once() {
        loom::model(|| {
            let t = Arc::new(Task {
                refs: Refs::new(0, 1),
                freed: AtomicUsize::new(0),
                cell: loom::cell::UnsafeCell::new(1),
            });
            let inbox = Arc::new(Mutex::new(0usize));
            let wakers: Vec<_> = (0..2)
                .map(|_| {
                    t.refs.remote_inc();
                    let (t, inbox) = (t.clone(), inbox.clone());
                    loom::thread::spawn(move || {
                        if t.refs.queue_remote() {
                            *inbox.lock().unwrap() += 1;
                        }
                        t.free_if(t.refs.remote_dec());
                    })
                })
                .collect();
            for w in wakers {
                w.join().unwrap();
            }
            let entries = std::mem::take(&mut *inbox.lock().unwrap());
            assert_eq!(entries, 1, "two wakes before the owner looked: one entry");
            t.refs.unqueue();
            t.free_if(t.refs.remote_dec());
            t.refs.remote_inc();
            assert!(
                t.refs.queue_remote(),
                "queued again after the owner took it"
            );
            t.refs.unqueue();
            t.free_if(t.refs.remote_dec());
            t.free_if(t.refs.remote_dec());
            assert_eq!(
                t.freed.load(Ordering::SeqCst),
                0,
                "the local reference remains"
            );
            t.free_if(t.refs.local_dec());
            assert_eq!(t.freed.load(Ordering::SeqCst), 1);
        });
    }
}
