use std::cell::{Cell, RefCell};
use std::collections::VecDeque;

use crate::JoinHandle;

/// A listener's handshakes in progress, oldest first, each a task under the key of the source
/// it serves (an address, a process), capped in all and per source.
///
/// Making room for a new handshake cancels the oldest one of its source when that source is
/// at its cap, and then the oldest of all when the listener is at its cap. A flood from one
/// source therefore pushes out only its own stale connections, and never holds more than
/// `per_source` tasks and their sockets; what a handshake task owns is dropped when it is
/// cancelled. Belongs to one core, as the tasks do.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::net::Handshakes;
/// rt.block_on(async {
///     let h = Handshakes::new(3, 2); // three in all, two per source
///     let start = |source| {
///         let evicted = h.make_room(&source);
///         let id = h.next_id();
///         h.push(id, source, barewire_engine::spawn_local(std::future::pending()));
///         evicted
///     };
///     // The third from one source pushes out that source's first.
///     assert_eq!([start("10.0.0.1"), start("10.0.0.1"), start("10.0.0.1")], [0, 0, 1]);
///     assert_eq!(start("10.0.0.2"), 0);
///     // At the listener's cap, a newcomer pushes out the oldest of all.
///     assert_eq!(start("10.0.0.3"), 1);
///     assert_eq!(h.len(), 3);
/// });
/// /// ```
pub struct Handshakes<K> {
    tasks: RefCell<VecDeque<(u64, K, JoinHandle<()>)>>,
    next: Cell<u64>,
    total: usize,
    per_source: usize,
}

impl<K: PartialEq> Handshakes<K> {
    /// At most `total` handshakes at once, and `per_source` from one source (each at least 1).
    pub fn new(total: usize, per_source: usize) -> Handshakes<K> {
        Handshakes {
            tasks: RefCell::new(VecDeque::new()),
            next: Cell::new(0),
            total: total.max(1),
            per_source: per_source.max(1),
        }
    }

    /// Cancels what must go for one more handshake from `source`; returns how many went.
    pub fn make_room(&self, source: &K) -> usize {
        let mut tasks = self.tasks.borrow_mut();
        let mut evicted = 0;
        if tasks.iter().filter(|t| t.1 == *source).count() >= self.per_source {
            if let Some(i) = tasks.iter().position(|t| t.1 == *source) {
                tasks.remove(i).expect("found").2.cancel();
                evicted += 1;
            }
        }
        if tasks.len() >= self.total {
            if let Some(t) = tasks.pop_front() {
                t.2.cancel();
                evicted += 1;
            }
        }
        evicted
    }

    /// A fresh id for the next handshake (for [`done`](Self::done)).
    pub fn next_id(&self) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        id
    }

    /// Adds handshake `id` from `source`, running as `task`.
    pub fn push(&self, id: u64, source: K, task: JoinHandle<()>) {
        self.tasks.borrow_mut().push_back((id, source, task));
    }

    /// Handshake `id` finished (its task calls this last).
    pub fn done(&self, id: u64) {
        self.tasks.borrow_mut().retain(|t| t.0 != id);
    }

    /// Cancels every handshake in progress (the listener is closing).
    pub fn cancel_all(&self) {
        for (_, _, task) in self.tasks.borrow_mut().drain(..) {
            task.cancel();
        }
    }

    /// Handshakes in progress.
    pub fn len(&self) -> usize {
        self.tasks.borrow().len()
    }

    /// True when none is in progress.
    pub fn is_empty(&self) -> bool {
        self.tasks.borrow().is_empty()
    }
}
