//! How long a core's shared half lives: as long as the core, or any of its task cells.
//!
//! A task's header points at its owner's `CoreShared` without holding an `Arc` (a reference
//! count per task would cost every spawn an atomic increment and every cell 8 bytes): a wake from
//! another thread reaches the owner's inbox through that pointer. The pointer stays valid because
//! the core counts its live cells, split like a task's references:
//!
//! - **owner side** (a `Cell` in `Core`, no atomics): +1 per spawn, -1 per cell freed on the
//!   owner's thread while that thread runs the core;
//! - **shared side** ([`SharedCells`], atomic, in `CoreShared`): -1 per cell freed anywhere else
//!   (another thread, or the owner's thread outside the core).
//!
//! While the core lives, its `Arc<CoreShared>` keeps the shared half alive, and the atomic only
//! goes down, so it stays at or below zero. When the core is dropped it **hands over**: it takes
//! one more `Arc`, then adds its owner-side count to the atomic. The sum is the number of cells
//! still alive; if it is zero the extra `Arc` goes at once, otherwise it stays until the free
//! that brings the atomic from one to zero releases it. That free is the last one, and there is
//! exactly one such free: the atomic is positive only after the handover, and after it every
//! free takes the atomic path. `loom_tests` below check the handover racing the last free.

use crate::shim::{AtomicIsize, Ordering};

/// The shared side of a core's live-cell count.
pub(crate) struct SharedCells(AtomicIsize);

impl SharedCells {
    pub(crate) fn new() -> SharedCells {
        SharedCells(AtomicIsize::new(0))
    }

    /// A cell was freed off its core. True if it was the last cell after the handover: the
    /// caller then releases the `Arc` that [`hand_over`](Self::hand_over) kept.
    ///
    /// AcqRel: the release orders this thread's use of the cell and the shared half before the
    /// decrement; the acquire makes every other free's visible to the one that releases.
    pub(crate) fn freed(&self) -> bool {
        self.0.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// The core is going away with `local` as its owner-side count; the caller already holds
    /// the extra `Arc`. True if cells are still alive: the extra `Arc` must stay (the last free
    /// releases it). False: the caller releases it now.
    pub(crate) fn hand_over(&self, local: isize) -> bool {
        self.0.fetch_add(local, Ordering::AcqRel) + local != 0
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    /// A core's shared half in a model, with its `Arc` count spelled out (loom's own `Arc` does
    /// not branch on its count, so an order bug around it would go unseen): `data` stands for
    /// its memory (a remote waker reads it to reach the inbox before its cell goes), and the
    /// count reaching zero "drops" it, once.
    struct Shared {
        cells: SharedCells,
        strong: AtomicUsize,
        data: loom::cell::UnsafeCell<usize>,
        dropped: AtomicUsize,
    }

    impl Shared {
        fn clone_arc(&self) {
            let before = self.strong.fetch_add(1, Ordering::Relaxed);
            assert!(before > 0, "an Arc cloned after its value was dropped");
        }

        fn drop_arc(&self) {
            if self.strong.fetch_sub(1, Ordering::AcqRel) == 1 {
                // SAFETY: a model cell; loom checks the accesses' ordering.
                self.data.with_mut(|p| unsafe { *p = 0 });
                assert_eq!(
                    self.dropped.fetch_add(1, Ordering::SeqCst),
                    0,
                    "dropped twice"
                );
            }
        }

        /// A cell freed off the core (the engine's `cell_freed`), after a last look at the
        /// shared half.
        fn free_cell(&self) {
            // SAFETY: a model cell; loom checks the accesses' ordering.
            self.data
                .with(|p| assert_eq!(unsafe { *p }, 1, "used after drop"));
            if self.cells.freed() {
                self.drop_arc();
            }
        }
    }

    /// A cell freed on another thread races the core's handover. With `late`, a second cell
    /// outlives the core and its free, on the owner's thread after the handover, takes the
    /// atomic path too. The shared half is dropped exactly once, after every holder's last
    /// touch (else an assertion fails or loom reports a data race).
    fn model(late: bool) {
        loom::model(move || {
            let shared = Arc::new(Shared {
                cells: SharedCells::new(),
                strong: AtomicUsize::new(1), // the core's own Arc
                data: loom::cell::UnsafeCell::new(1),
                dropped: AtomicUsize::new(0),
            });
            // Spawned on the owner: the cell another thread frees, the late one, and one freed
            // on the owner while the core runs (owner side only).
            let mut local: isize = 2 + late as isize;
            local -= 1;
            let remote = {
                let s = shared.clone();
                loom::thread::spawn(move || s.free_cell())
            };
            // The core goes (`Core::drop`): one more Arc, then the handover; then the core's
            // own Arc goes with the core.
            shared.clone_arc();
            if !shared.cells.hand_over(local) {
                shared.drop_arc();
            }
            shared.drop_arc();
            if late {
                shared.free_cell();
            }
            remote.join().unwrap();
            assert_eq!(shared.dropped.load(Ordering::SeqCst), 1, "dropped, once");
        });
    }

    #[test]
    fn loom_handover_races_the_last_remote_free() {
        model(false);
    }

    #[test]
    fn loom_a_cell_outlives_its_core() {
        model(true);
    }
}
