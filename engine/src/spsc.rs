//! A bounded single-producer single-consumer ring: the building block of the cross-core mesh and
//! of the cross-core channel.
//!
//! Each side keeps its own index in a plain field and a cached copy of the other side's, so a
//! push or pop touches the shared cache lines only when the cache says the ring looks full or
//! empty. The producer may write several slots and publish them with one release store
//! (`flush`), which is how the mesh batches messages.

use crate::shim::{AtomicUsize, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Keeps the two indices on separate cache lines, so producer and consumer do not invalidate
/// each other's line on every operation (false sharing).
#[repr(align(64))]
struct Padded<T>(T);

struct Ring<T> {
    slots: Box<[UnsafeCell<MaybeUninit<T>>]>,
    mask: usize,
    head: Padded<AtomicUsize>,
    tail: Padded<AtomicUsize>,
}

// SAFETY: a slot is written only by the producer before it publishes the tail, and read only by
// the consumer after it observes that tail (acquire), then released back with the head store;
// so no slot is accessed by both sides at once. T crosses threads, hence T: Send.
unsafe impl<T: Send> Sync for Ring<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for Ring<T> {}

/// The writing end.
pub(crate) struct Producer<T> {
    ring: Arc<Ring<T>>,
    tail: usize,
    published: usize,
    cached_head: usize,
}

/// The reading end.
pub(crate) struct Consumer<T> {
    ring: Arc<Ring<T>>,
    head: usize,
    cached_tail: usize,
}

/// A ring holding at least `capacity` items (rounded up to a power of two).
pub(crate) fn ring<T>(capacity: usize) -> (Producer<T>, Consumer<T>) {
    let cap = capacity.max(2).next_power_of_two();
    let slots = (0..cap)
        .map(|_| UnsafeCell::new(MaybeUninit::uninit()))
        .collect();
    let ring = Arc::new(Ring {
        slots,
        mask: cap - 1,
        head: Padded(AtomicUsize::new(0)),
        tail: Padded(AtomicUsize::new(0)),
    });
    (
        Producer {
            ring: ring.clone(),
            tail: 0,
            published: 0,
            cached_head: 0,
        },
        Consumer {
            ring,
            head: 0,
            cached_tail: 0,
        },
    )
}

impl<T> Producer<T> {
    /// Writes `v` without publishing it; `Err(v)` if the ring is full.
    pub(crate) fn push(&mut self, v: T) -> Result<(), T> {
        let cap = self.ring.mask + 1;
        if self.tail.wrapping_sub(self.cached_head) == cap {
            self.cached_head = self.ring.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.cached_head) == cap {
                return Err(v);
            }
        }
        let slot = &self.ring.slots[self.tail & self.ring.mask];
        // SAFETY: the slot is between head and tail+cap, so the consumer is done with it (its
        // head store released it) and will not read it before we publish.
        slot.with_mut(|p| unsafe { (*p).write(v) });
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// Publishes everything pushed so far. True if anything was new.
    pub(crate) fn flush(&mut self) -> bool {
        if self.published == self.tail {
            return false;
        }
        self.ring.tail.0.store(self.tail, Ordering::Release);
        self.published = self.tail;
        true
    }

    /// True if the consumer is gone.
    pub(crate) fn is_closed(&self) -> bool {
        Arc::strong_count(&self.ring) == 1
    }
}

impl<T> Consumer<T> {
    /// Takes the next published item.
    pub(crate) fn pop(&mut self) -> Option<T> {
        if self.head == self.cached_tail {
            self.cached_tail = self.ring.tail.0.load(Ordering::Acquire);
            if self.head == self.cached_tail {
                return None;
            }
        }
        let slot = &self.ring.slots[self.head & self.ring.mask];
        // SAFETY: head < published tail (acquired above), so the producer wrote this slot and
        // will not touch it again until we release it with the head store below.
        let v = slot.with(|p| unsafe { (*p).assume_init_read() });
        self.head = self.head.wrapping_add(1);
        self.ring.head.0.store(self.head, Ordering::Release);
        Some(v)
    }

    /// True if something is published and not yet taken (used before sleeping).
    pub(crate) fn has_pending(&self) -> bool {
        self.ring.tail.0.load(Ordering::Acquire) != self.head
    }
}

impl<T> Drop for Ring<T> {
    fn drop(&mut self) {
        let head = self.head.0.load(Ordering::Acquire);
        let tail = self.tail.0.load(Ordering::Acquire);
        let mut i = head;
        while i != tail {
            // SAFETY: slots in [head, tail) were published and never consumed; both ends are
            // gone, so we are the only owner.
            self.slots[i & self.mask].with_mut(|p| unsafe { (*p).assume_init_drop() });
            i = i.wrapping_add(1);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wraps_and_reports_full() {
        let (mut p, mut c) = ring::<u32>(4);
        for round in 0..10u32 {
            for i in 0..4 {
                p.push(round * 4 + i).unwrap();
            }
            assert_eq!(p.push(99), Err(99), "a full ring refuses");
            assert!(c.pop().is_none(), "nothing is visible before flush");
            assert!(p.flush());
            for i in 0..4 {
                assert_eq!(c.pop(), Some(round * 4 + i));
            }
            assert_eq!(c.pop(), None);
        }
    }

    #[test]
    fn unconsumed_items_are_dropped_once() {
        let item = Arc::new(());
        let (mut p, c) = ring(8);
        for _ in 0..5 {
            p.push(item.clone()).unwrap();
        }
        p.flush();
        drop(p);
        drop(c);
        assert_eq!(Arc::strong_count(&item), 1);
    }

    #[test]
    fn threads_see_every_item_in_order() {
        let (mut p, mut c) = ring::<u64>(64);
        const N: u64 = 200_000;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                if p.push(i).is_ok() {
                    i += 1;
                    if i % 7 == 0 {
                        p.flush();
                    }
                } else {
                    p.flush();
                    std::thread::yield_now();
                }
            }
            p.flush();
        });
        let mut expect = 0;
        while expect < N {
            match c.pop() {
                Some(v) => {
                    assert_eq!(v, expect);
                    expect += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        t.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Every item arrives exactly once and in order, across wrap-around, in every interleaving.
    #[test]
    fn loom_spsc_fifo_with_wraparound() {
        loom::model(|| {
            let (mut p, mut c) = ring::<usize>(2);
            let t = loom::thread::spawn(move || {
                let mut i = 0;
                while i < 3 {
                    if p.push(i).is_ok() {
                        p.flush();
                        i += 1;
                    } else {
                        loom::thread::yield_now();
                    }
                }
            });
            let mut next = 0;
            while next < 3 {
                match c.pop() {
                    Some(v) => {
                        assert_eq!(v, next);
                        next += 1;
                    }
                    None => loom::thread::yield_now(),
                }
            }
            t.join().unwrap();
        });
    }
}
