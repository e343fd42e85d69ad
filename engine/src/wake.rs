//! The cross-thread wake path: an inbox other threads push into, and the sleep handshake that
//! makes sure no wake-up is lost.
//!
//! The owner, before it sleeps, sets `sleeping` and then looks at its inbox (and its mesh
//! rings). A producer pushes and then looks at `sleeping`. A `SeqCst` fence sits between the
//! write and the read on both sides, so at least one side sees the other's write: either the
//! owner finds the item and does not sleep, or the producer finds `sleeping` set and rings the
//! doorbell (an eventfd the reactor always has a read armed on). `swap(false)` makes sure only
//! one producer rings per sleep.
//!
//! When the owner goes away it closes the inbox: what was queued comes back to it, and a later
//! push hands its item back to the producer, so nothing waits forever in an inbox nobody
//! drains.

use crate::shim::{fence, lock, AtomicBool, Mutex};
use std::sync::atomic::Ordering;

/// Something that wakes a sleeping reactor (an eventfd in production, a counter in loom).
pub(crate) trait Doorbell {
    fn ring(&self);
}

pub(crate) struct WakeState<T, D> {
    inbox: Mutex<Inbox<T>>,
    /// Set after every push, so the owner's loop can skip the lock when nothing came.
    pending: AtomicBool,
    sleeping: AtomicBool,
    pub(crate) doorbell: D,
}

struct Inbox<T> {
    items: Vec<T>,
    closed: bool,
}

impl<T, D: Doorbell> WakeState<T, D> {
    pub(crate) fn new(doorbell: D) -> Self {
        WakeState {
            inbox: Mutex::new(Inbox {
                items: Vec::new(),
                closed: false,
            }),
            pending: AtomicBool::new(false),
            sleeping: AtomicBool::new(false),
            doorbell,
        }
    }

    /// Producer side: queue an item for the owner and wake it if it sleeps. `Err` gives the
    /// item back when the owner has gone (`close`); the caller drops it, with no lock held.
    pub(crate) fn push(&self, item: T) -> Result<(), T> {
        {
            let mut inbox = lock(&self.inbox);
            if inbox.closed {
                return Err(item);
            }
            inbox.items.push(item);
        }
        self.pending.store(true, Ordering::Release);
        self.notify();
        Ok(())
    }

    /// Owner side, going away: returns what is queued, and refuses every later push.
    pub(crate) fn close(&self) -> Vec<T> {
        let mut inbox = lock(&self.inbox);
        inbox.closed = true;
        std::mem::take(&mut inbox.items)
    }

    /// Producer side, after publishing work somewhere the owner checks before sleeping.
    pub(crate) fn notify(&self) {
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) && self.sleeping.swap(false, Ordering::SeqCst) {
            self.doorbell.ring();
        }
    }

    /// Owner side: takes everything queued, swapping in `spare` (so the allocation is reused).
    /// False, leaving `spare` as it was, when nothing was pushed since the last call.
    #[inline]
    pub(crate) fn drain_into(&self, spare: &mut Vec<T>) -> bool {
        // A push that lands after this swap sets the flag again and is taken next pass. A
        // plain load first: most passes find nothing, and a load costs no read-modify-write.
        if !self.pending.load(Ordering::Relaxed) || !self.pending.swap(false, Ordering::Acquire) {
            return false;
        }
        let mut inbox = lock(&self.inbox);
        std::mem::swap(&mut inbox.items, spare);
        true
    }

    /// Owner side, first half of going to sleep. After this, check every source that producers
    /// publish to (`has_pending` and the mesh); if any has work, call `cancel_sleep`.
    pub(crate) fn prepare_sleep(&self) {
        self.sleeping.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    pub(crate) fn has_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Owner side: it did not sleep after all, or it woke up.
    pub(crate) fn cancel_sleep(&self) {
        self.sleeping.store(false, Ordering::SeqCst);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicUsize;
    use loom::sync::Arc;

    struct Counter(AtomicUsize);
    impl Doorbell for Counter {
        fn ring(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The owner either sees the item before sleeping, or the doorbell was rung: a sleep that
    /// would miss the wake-up is impossible in every interleaving.
    #[test]
    fn loom_no_lost_wakeup() {
        loom::model(|| {
            let ws = Arc::new(WakeState::new(Counter(AtomicUsize::new(0))));
            let p = ws.clone();
            let producer = loom::thread::spawn(move || p.push(7u32).unwrap());

            ws.prepare_sleep();
            let saw_item = ws.has_pending();
            if saw_item {
                ws.cancel_sleep();
            }
            producer.join().unwrap();
            let rung = ws.doorbell.0.load(Ordering::SeqCst);
            assert!(
                saw_item || rung == 1,
                "owner slept without seeing the item or the doorbell"
            );
            let mut v = Vec::new();
            ws.drain_into(&mut v);
            assert_eq!(v, vec![7]);
        });
    }

    /// Two producers racing against a sleeper ring the doorbell at most once per sleep.
    #[test]
    fn loom_two_producers_one_ring() {
        loom::model(|| {
            let ws = Arc::new(WakeState::new(Counter(AtomicUsize::new(0))));
            ws.prepare_sleep();
            let a = ws.clone();
            let b = ws.clone();
            let ta = loom::thread::spawn(move || a.push(1u32).unwrap());
            let tb = loom::thread::spawn(move || b.push(2u32).unwrap());
            ta.join().unwrap();
            tb.join().unwrap();
            assert_eq!(ws.doorbell.0.load(Ordering::SeqCst), 1);
        });
    }

    /// A push racing the owner's close is never lost: either the close returns the item or
    /// the push hands it back.
    #[test]
    fn loom_close_loses_nothing() {
        loom::model(|| {
            let ws = Arc::new(WakeState::new(Counter(AtomicUsize::new(0))));
            let p = ws.clone();
            let producer = loom::thread::spawn(move || p.push(7u32).err());
            let closed = ws.close();
            let returned = producer.join().unwrap();
            let mut seen: Vec<u32> = closed.into_iter().chain(returned).collect();
            let mut later = Vec::new();
            ws.drain_into(&mut later);
            seen.append(&mut later);
            assert_eq!(seen, vec![7], "the item is found exactly once");
        });
    }
}
