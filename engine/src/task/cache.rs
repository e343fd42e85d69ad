//! A core's cache of freed task cells, so a spawn after a completion reuses memory instead of
//! going to the allocator.
//!
//! A cell freed on its owner's thread while that thread runs the core goes onto a free list
//! of its size (cells are grouped by size alone; every cached size has the alignment of a
//! pointer), and the next spawn of a task of that size pops it. Spawning and freeing then cost
//! a pointer swap each, where the system allocator takes tens of nanoseconds and, after a
//! burst, hands the pages back to the kernel only to fault them in again on the next one.
//! Cells freed anywhere else (a waker dropped on another thread, after the core went) go to the
//! allocator as before: the lists are the owner thread's alone, with no atomics.
//!
//! **What it keeps.** Never more than the core had live at its peak, and cells that nobody
//! needed for a whole `keep` interval (one second unless [`Builder::task_cache`] says
//! otherwise) go back to the allocator: at each interval's end the core frees as many cells of
//! each size as stayed cached throughout it (its low-water mark), at most [`TRIM_BUDGET`] per
//! look so a large release never stalls the loop. A core looks when it is about to sleep (and
//! then sleeps no longer than the next interval's end while anything is cached) and every
//! [`TRIM_EVERY`] passes while busy. So a burst of a million tasks leaves its cells cached for
//! the next burst, and an idle core is back to none within about two intervals.
//!
//! [`Builder::task_cache`]: crate::Builder::task_cache

use std::alloc::Layout;
use std::cell::Cell;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Cached sizes: every multiple of a pointer up to this many bytes.
const MAX_SIZE: usize = 1024;
const WORD: usize = std::mem::size_of::<usize>();
const CLASSES: usize = MAX_SIZE / WORD + 1;
/// Most cells given back in one look.
pub(crate) const TRIM_BUDGET: usize = 4096;
/// A busy core looks every this many passes.
pub(crate) const TRIM_EVERY: u32 = 1024;

/// A cached cell's first word links it to the next.
struct Free {
    next: Option<NonNull<Free>>,
}

#[derive(Default)]
struct Class {
    head: Cell<Option<NonNull<Free>>>,
    len: Cell<usize>,
    /// The fewest cached since the interval began.
    low: Cell<usize>,
    /// Cells found unused over the last interval and not yet given back.
    surplus: Cell<usize>,
}

impl Class {
    fn pop(&self) -> Option<NonNull<Free>> {
        let cell = self.head.get()?;
        // SAFETY: a cached cell is memory this cache owns, its first word a `Free`.
        self.head.set(unsafe { cell.as_ref() }.next);
        self.len.set(self.len.get() - 1);
        Some(cell)
    }

    /// # Safety
    /// `cell` is dead memory of this class (at least a word, aligned to one), owned by the
    /// cache from now on.
    unsafe fn push(&self, cell: NonNull<Free>) {
        // SAFETY: forwarded contract.
        unsafe {
            cell.as_ptr().write(Free {
                next: self.head.get(),
            })
        };
        self.head.set(Some(cell));
        self.len.set(self.len.get() + 1);
    }
}

/// Owner thread only (a field of `Core`, which never leaves its thread).
pub(crate) struct CellCache {
    classes: Box<[Class]>,
    /// Zero: nothing is cached.
    keep: Duration,
    /// When the next look is due; `None` while nothing is cached.
    due: Cell<Option<Instant>>,
    passes: Cell<u32>,
    reused: Cell<u64>,
}

/// The class of a cell with `layout`, or `None` for one that is never cached.
const fn class_of(layout: Layout) -> Option<usize> {
    if layout.align() == WORD && layout.size() <= MAX_SIZE {
        Some(layout.size() / WORD)
    } else {
        None
    }
}

impl CellCache {
    pub(crate) fn new(keep: Duration) -> CellCache {
        CellCache {
            classes: (0..CLASSES).map(|_| Class::default()).collect(),
            keep,
            due: Cell::new(None),
            passes: Cell::new(0),
            reused: Cell::new(0),
        }
    }

    /// Memory for a cell with `layout`: a cached one, else from the allocator.
    #[inline]
    pub(crate) fn alloc(&self, layout: Layout) -> NonNull<u8> {
        if let Some(c) = class_of(layout) {
            let class = &self.classes[c];
            if let Some(cell) = class.pop() {
                class.low.set(class.low.get().min(class.len.get()));
                self.reused.set(self.reused.get() + 1);
                return cell.cast();
            }
        }
        // SAFETY: a task cell is never zero-sized (it has a header).
        let p = unsafe { std::alloc::alloc(layout) };
        NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
    }

    /// Takes back the memory of a dead cell allocated with `layout` (by any cache or by the
    /// allocator: a cached class is the same layout either way).
    ///
    /// # Safety
    /// `mem` was allocated by the global allocator with `layout`, and nothing uses it any more.
    #[inline]
    pub(crate) unsafe fn free(&self, mem: NonNull<u8>, layout: Layout) {
        match class_of(layout) {
            Some(c) if !self.keep.is_zero() => {
                // SAFETY: the cell is dead, of class `c` (at least a word, aligned to one), and
                // the cache owns it now (caller's contract).
                unsafe { self.classes[c].push(mem.cast()) };
                if self.due.get().is_none() {
                    self.due.set(Some(Instant::now() + self.keep));
                }
            }
            // SAFETY: forwarded contract.
            _ => unsafe { std::alloc::dealloc(mem.as_ptr(), layout) },
        }
    }

    /// A busy core's pass: looks at the clock every [`TRIM_EVERY`] passes while cells are
    /// cached.
    #[inline]
    pub(crate) fn pass(&self) {
        if self.due.get().is_none() {
            return;
        }
        let n = self.passes.get().wrapping_add(1);
        self.passes.set(n);
        if n % TRIM_EVERY == 0 {
            self.trim(Instant::now());
        }
    }

    /// Gives back what went unused, if a look is due at `now`. Returns when the next look is
    /// due (`None`: nothing is cached), for a core about to sleep.
    pub(crate) fn trim(&self, now: Instant) -> Option<Instant> {
        let due = self.due.get()?;
        if now < due {
            return Some(due);
        }
        // An interval ended, unless this look goes on giving back the last one's surplus.
        if self.classes.iter().all(|c| c.surplus.get() == 0) {
            for class in self.classes.iter() {
                class.surplus.set(class.low.get());
                class.low.set(class.len.get());
            }
        }
        let mut budget = TRIM_BUDGET;
        for (c, class) in self.classes.iter().enumerate() {
            let surplus = class.surplus.get().min(class.len.get());
            let n = surplus.min(budget);
            for _ in 0..n {
                let cell = class.pop().expect("a class holds len cells");
                // SAFETY: cached cells came from the allocator with their class's layout, and
                // nothing else holds them.
                unsafe { std::alloc::dealloc(cell.as_ptr().cast(), layout_of(c)) };
            }
            class.low.set(class.low.get().min(class.len.get()));
            class.surplus.set(surplus - n);
            budget -= n;
        }
        let next = if self.cached() == 0 {
            for class in self.classes.iter() {
                class.surplus.set(0);
                class.low.set(0);
            }
            None
        } else if self.classes.iter().any(|c| c.surplus.get() > 0) {
            // More to give back: soon, in slices, so the loop never stalls long.
            Some(now + Duration::from_millis(1))
        } else {
            Some(now + self.keep)
        };
        self.due.set(next);
        next
    }

    /// Cells cached now.
    pub(crate) fn cached(&self) -> usize {
        self.classes.iter().map(|c| c.len.get()).sum()
    }

    /// Spawns served from the cache so far.
    pub(crate) fn reused(&self) -> u64 {
        self.reused.get()
    }
}

impl Drop for CellCache {
    fn drop(&mut self) {
        for (c, class) in self.classes.iter().enumerate() {
            while let Some(cell) = class.pop() {
                // SAFETY: as in `trim`.
                unsafe { std::alloc::dealloc(cell.as_ptr().cast(), layout_of(c)) };
            }
        }
    }
}

/// The layout of class `c`'s cells.
fn layout_of(c: usize) -> Layout {
    Layout::from_size_align(c * WORD, WORD).expect("a class's size is a valid layout")
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    const CELL: Layout = match Layout::from_size_align(64, WORD) {
        Ok(l) => l,
        Err(_) => panic!("a valid layout"),
    };

    /// Caches `n` fresh cells of `CELL`'s class.
    fn fill(c: &CellCache, n: usize) {
        let cells: Vec<_> = (0..n).map(|_| c.alloc(CELL)).collect();
        for p in cells {
            // SAFETY: allocated just above with CELL, unused.
            unsafe { c.free(p, CELL) };
        }
    }

    #[test]
    fn cells_in_use_during_an_interval_stay_and_unused_ones_go_at_its_end_in_slices() {
        let keep = Duration::from_secs(1);
        let c = CellCache::new(keep);
        let n = TRIM_BUDGET + 100;
        fill(&c, n);
        assert_eq!(c.cached(), n);
        let first = c.due.get().expect("a look is due once something is cached");
        // Before the look is due nothing goes, and the sleeping core is told when to look.
        assert_eq!(c.trim(first - Duration::from_millis(1)), Some(first));
        assert_eq!(c.cached(), n);
        // The first interval began with nothing cached: its low-water mark is 0, nothing goes.
        let second = c.trim(first).expect("cells still cached");
        assert_eq!(second, first + keep);
        assert_eq!(c.cached(), n);
        // In the second interval all but 10 cells are taken and given back: only those 10
        // stayed cached throughout, and only they go at its end.
        let taken: Vec<_> = (0..n - 10).map(|_| c.alloc(CELL)).collect();
        assert_eq!(c.reused(), (n - 10) as u64);
        for p in taken {
            // SAFETY: cells this cache handed out, unused.
            unsafe { c.free(p, CELL) };
        }
        assert_eq!(c.trim(second), Some(second + keep));
        assert_eq!(c.cached(), n - 10);
        // The third interval nobody spawns: all of them go at its end, TRIM_BUDGET per look,
        // the next look a millisecond later while any of the surplus is left.
        let third = second + keep;
        assert_eq!(c.trim(third), Some(third + Duration::from_millis(1)));
        assert_eq!(c.cached(), n - 10 - TRIM_BUDGET);
        // Nothing left: no look is due, and the next free starts the clock again.
        assert_eq!(c.trim(third + Duration::from_millis(1)), None);
        assert_eq!(c.cached(), 0);
        fill(&c, 1);
        assert!(c.due.get().is_some());
    }

    #[test]
    fn only_cells_of_a_word_aligned_layout_up_to_the_largest_class_are_cached() {
        let c = CellCache::new(Duration::from_secs(1));
        for layout in [
            Layout::from_size_align(MAX_SIZE, WORD).unwrap(),
            Layout::from_size_align(8, WORD).unwrap(),
        ] {
            let p = c.alloc(layout);
            // SAFETY: allocated just above with `layout`, unused.
            unsafe { c.free(p, layout) };
        }
        assert_eq!(c.cached(), 2);
        for layout in [
            Layout::from_size_align(MAX_SIZE + WORD, WORD).unwrap(),
            Layout::from_size_align(64, 2 * WORD).unwrap(),
        ] {
            let p = c.alloc(layout);
            // SAFETY: as above.
            unsafe { c.free(p, layout) };
        }
        assert_eq!(
            c.cached(),
            2,
            "larger or more aligned cells go to the allocator"
        );
        // A cached cell serves only its own size.
        let other = Layout::from_size_align(16, WORD).unwrap();
        let p = c.alloc(other);
        assert_eq!(c.reused(), 0);
        // SAFETY: as above.
        unsafe { c.free(p, other) };
    }

    #[test]
    fn a_zero_keep_caches_nothing() {
        let c = CellCache::new(Duration::ZERO);
        fill(&c, 10);
        assert_eq!(c.cached(), 0);
        assert_eq!(c.trim(Instant::now()), None);
    }
}
