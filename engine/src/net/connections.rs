use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::Hash;
use std::rc::{Rc, Weak};

/// The connections a listener has open, in all and per source (an address, a process), with
/// a cap on each: what keeps one source, or all of them together, from holding more than
/// their share of a process's descriptors and memory.
///
/// A listener asks [`full`](Self::full) before it takes a new connection in and closes it at
/// once if so; each connection it hands out holds the [`Admitted`] that
/// [`admit`](Self::admit) gave it, which gives the place back when dropped. Belongs to one
/// core.
///
/// ```
/// use barewire_engine::net::Connections;
/// let open = Connections::new(3, 2); // three in all, two per source
/// let a = open.admit("10.0.0.1");
/// let b = open.admit("10.0.0.1");
/// assert!(open.full(&"10.0.0.1") && !open.full(&"10.0.0.2"));
/// let c = open.admit("10.0.0.2");
/// assert!(open.full(&"10.0.0.3")); // the listener's cap
/// drop(a);
/// assert!(!open.full(&"10.0.0.1") && open.open() == 2);
/// # drop((b, c));
/// ```
pub struct Connections<K> {
    open: Rc<Open<K>>,
}

struct Open<K> {
    per_source: RefCell<HashMap<K, usize>>,
    total: Cell<usize>,
    max_total: usize,
    max_per_source: usize,
}

/// One connection's place among its listener's [`Connections`], given back when dropped
/// (the listener may be gone by then).
pub struct Admitted<K: Eq + Hash> {
    open: Weak<Open<K>>,
    source: K,
}

impl<K: Eq + Hash + Clone> Connections<K> {
    /// At most `max_total` open at once, and `max_per_source` from one source.
    pub fn new(max_total: usize, max_per_source: usize) -> Connections<K> {
        Connections {
            open: Rc::new(Open {
                per_source: RefCell::new(HashMap::new()),
                total: Cell::new(0),
                max_total,
                max_per_source,
            }),
        }
    }

    /// True when the listener, or `source`, has as many connections open as allowed.
    pub fn full(&self, source: &K) -> bool {
        let o = &self.open;
        o.total.get() >= o.max_total
            || o.per_source.borrow().get(source).copied().unwrap_or(0) >= o.max_per_source
    }

    /// Counts a new open connection from `source`, until the result is dropped.
    pub fn admit(&self, source: K) -> Admitted<K> {
        let o = &self.open;
        o.total.set(o.total.get() + 1);
        *o.per_source.borrow_mut().entry(source.clone()).or_default() += 1;
        Admitted {
            open: Rc::downgrade(&self.open),
            source,
        }
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.total.get()
    }
}

impl<K: Eq + Hash> Admitted<K> {
    /// The source it was admitted from.
    pub fn source(&self) -> &K {
        &self.source
    }
}

impl<K: Eq + Hash> Drop for Admitted<K> {
    fn drop(&mut self) {
        let Some(o) = self.open.upgrade() else { return };
        o.total.set(o.total.get().saturating_sub(1));
        let mut per = o.per_source.borrow_mut();
        if let Some(n) = per.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.source);
            }
        }
    }
}
