//! The cross-core mesh: one SPSC ring per ordered pair of cores, as in seastar's `smp` queues.
//!
//! A core sends a message (a `Send` closure to run on the target) by writing it into its ring to
//! the target, without publishing. At the end of each pass of its loop it publishes every ring it
//! wrote to with one release store each, and rings the target's doorbell only if the target is
//! asleep. So a burst of messages to one core costs one publish and at most one wake. A full
//! ring spills into a local overflow queue, retried each pass, so sending never blocks.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use crate::core::CoreShared;
use crate::spsc::{Consumer, Producer};
use crate::stats::{bump, Stats};

/// Work sent to another core.
pub(crate) type Msg = Box<dyn FnOnce() + Send>;

pub(crate) struct Mesh {
    me: usize,
    peers: Vec<Arc<CoreShared>>,
    out: Vec<Option<RefCell<Producer<Msg>>>>,
    inc: Vec<Option<RefCell<Consumer<Msg>>>>,
    overflow: RefCell<Vec<VecDeque<Msg>>>,
    dirty: Vec<Cell<bool>>,
    any_dirty: Cell<bool>,
}

/// The rings of every pair, handed out core by core.
pub(crate) struct MeshBuilder {
    out: Vec<Vec<Option<Producer<Msg>>>>,
    inc: Vec<Vec<Option<Consumer<Msg>>>>,
}

impl MeshBuilder {
    pub(crate) fn new(cores: usize, capacity: usize) -> Self {
        let mut out: Vec<Vec<Option<Producer<Msg>>>> = (0..cores)
            .map(|_| (0..cores).map(|_| None).collect())
            .collect();
        let mut inc: Vec<Vec<Option<Consumer<Msg>>>> = (0..cores)
            .map(|_| (0..cores).map(|_| None).collect())
            .collect();
        for from in 0..cores {
            for to in 0..cores {
                if from != to {
                    let (p, c) = crate::spsc::ring(capacity);
                    out[from][to] = Some(p);
                    inc[to][from] = Some(c);
                }
            }
        }
        MeshBuilder { out, inc }
    }

    pub(crate) fn take(&mut self, me: usize, peers: Vec<Arc<CoreShared>>) -> Mesh {
        let n = peers.len();
        Mesh {
            me,
            out: self.out[me]
                .iter_mut()
                .map(|p| p.take().map(RefCell::new))
                .collect(),
            inc: self.inc[me]
                .iter_mut()
                .map(|c| c.take().map(RefCell::new))
                .collect(),
            overflow: RefCell::new((0..n).map(|_| VecDeque::new()).collect()),
            dirty: (0..n).map(|_| Cell::new(false)).collect(),
            any_dirty: Cell::new(false),
            peers,
        }
    }
}

impl Mesh {
    pub(crate) fn peers(&self) -> &[Arc<CoreShared>] {
        &self.peers
    }

    /// Queues `msg` for core `to` (not this core). Published at the end of the pass.
    pub(crate) fn send(&self, to: usize, msg: Msg, stats: &Stats) {
        debug_assert_ne!(to, self.me);
        bump(&stats.mesh_sent);
        let mut overflow = self.overflow.borrow_mut();
        if overflow[to].is_empty() {
            let out = self.out[to].as_ref().expect("a ring to every other core");
            if let Err(msg) = out.borrow_mut().push(msg) {
                overflow[to].push_back(msg);
            }
        } else {
            overflow[to].push_back(msg);
        }
        self.dirty[to].set(true);
        self.any_dirty.set(true);
    }

    /// Publishes what was sent this pass and wakes sleeping targets. True if anything moved.
    pub(crate) fn flush(&self) -> bool {
        if !self.any_dirty.replace(false) {
            return false;
        }
        let mut overflow = self.overflow.borrow_mut();
        for (to, dirty) in self.dirty.iter().enumerate() {
            if !dirty.get() {
                continue;
            }
            let mut out = self.out[to].as_ref().expect("ring").borrow_mut();
            while let Some(msg) = overflow[to].pop_front() {
                if let Err(msg) = out.push(msg) {
                    overflow[to].push_front(msg);
                    break;
                }
            }
            let still_pending = !overflow[to].is_empty();
            dirty.set(still_pending);
            if still_pending {
                self.any_dirty.set(true);
            }
            if out.flush() {
                self.peers[to].wake.notify();
            }
        }
        true
    }

    /// Runs every message other cores published to this one. Returns how many ran.
    pub(crate) fn receive(&self, stats: &Stats) -> usize {
        let mut n = 0;
        for inc in self.inc.iter().flatten() {
            // Pop one at a time so a message that sends (and so borrows `out`) is fine, and so a
            // message may itself receive nothing re-entrantly.
            loop {
                let msg = inc.borrow_mut().pop();
                match msg {
                    Some(m) => {
                        m();
                        n += 1;
                    }
                    None => break,
                }
            }
        }
        stats
            .mesh_received
            .set(stats.mesh_received.get() + n as u64);
        n
    }

    /// True if another core published messages not yet received (checked before sleeping).
    pub(crate) fn has_pending(&self) -> bool {
        self.inc.iter().flatten().any(|c| c.borrow().has_pending())
    }

    /// True if messages wait in overflow (the core must keep retrying, not sleep).
    pub(crate) fn has_backlog(&self) -> bool {
        self.any_dirty.get()
    }
}
