//! The home side of wide objects: the block of slots this node hosts, and the commits other
//! nodes (and this one, through its connection to itself) send it.
//!
//! A commit names a slot, the lock word its sender installed, and the new data. The home applies
//! it only if the slot's lock word still equals that word, by a compare-and-swap to `APPLYING`;
//! then it writes the data, its version and its check, and stores the next version, free. A
//! commit whose lock was broken meanwhile finds another word there and is answered `Fenced`:
//! nothing of it becomes visible.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use barewire_engine::sync::oneshot;
use serde::{Deserialize, Serialize};

use super::layout::{Layout, LockWord, APPLYING, FREE};
use super::Broken;
use crate::channel::{Bare, Receiver, Sender};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::region::{Region, RemoteRegion};

/// What travels on a DSM connection's channel.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Msg {
    /// "Make `data` the value of your slot `slot` if its lock word is still `lock`."
    Commit {
        req: u64,
        slot: u64,
        lock: u64,
        data: Vec<u8>,
    },
    /// The answer to commit `req`.
    Done { req: u64, outcome: Outcome },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// Visible from now on.
    Applied,
    /// The lock word had changed (the sender's lease was broken): nothing was written.
    Fenced,
    /// The request itself was wrong (a slot out of range, data of the wrong size).
    Refused(String),
}

/// How the home changes its slots' lock words: where the provider's atomics are the CPU's own
/// (the software provider executes them on this core), by CPU atomics; otherwise through this
/// node's connection to itself, so every change of a lock word is an atomic of the same kind.
pub(crate) enum Words {
    Cpu,
    Rdma(Endpoint, RemoteRegion<u64>),
}

/// The slots this node hosts.
pub(crate) struct Home {
    pub(crate) block: Region<u64>,
    pub(crate) layout: Layout,
    pub(crate) slots: u64,
    pub(crate) words: Words,
    pub(crate) broken: Option<Broken>,
}

impl Home {
    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < self.block.len());
        // SAFETY: the block is registered memory of `len` u64 words, 8-byte aligned
        // (Align::CacheLine), alive as long as `self`; peers change it only by RDMA atomics,
        // which the software provider executes as CPU atomics on this core and shm as CPU
        // atomics on the mapped word, so an AtomicU64 view is the right way to share it.
        unsafe { &*(self.block.as_ptr().add(i) as *const AtomicU64) }
    }

    async fn cas(&self, i: usize, expect: u64, new: u64) -> Result<u64> {
        match &self.words {
            Words::Cpu => Ok(self
                .word(i)
                .compare_exchange(expect, new, Ordering::AcqRel, Ordering::Acquire)
                .unwrap_or_else(|v| v)),
            Words::Rdma(ep, r) => ep.compare_and_swap(r, i as u64, expect, new).await,
        }
    }

    /// Applies a commit (see the module doc).
    pub(crate) async fn apply(&self, slot: u64, lock: u64, data: &[u8]) -> Outcome {
        let l = self.layout;
        if slot >= self.slots || data.len() != l.size {
            return Outcome::Refused(format!(
                "slot {slot} of {} with {} bytes of data (objects here are {} bytes)",
                self.slots,
                data.len(),
                l.size
            ));
        }
        let lock = LockWord(lock);
        let base = slot as usize * l.stride;
        let held = if self.broken == Some(Broken::NoLock) {
            // The broken variant applies whatever it is sent, on top of whatever is there.
            LockWord(self.word(base).load(Ordering::Acquire))
        } else {
            if lock.owner() == FREE || lock.owner() == APPLYING {
                return Outcome::Refused("a commit without a lock".into());
            }
            match self.cas(base, lock.0, lock.applying().0).await {
                Ok(old) if old == lock.0 => lock,
                Ok(_) => return Outcome::Fenced,
                Err(e) => return Outcome::Refused(e.to_string()),
            }
        };
        let next = held.committed();
        let mut words = vec![next.version() as u64];
        words.extend(l.data_and_check(next.version(), data));
        self.block.copy_from(base + 1, &words);
        match &self.words {
            Words::Cpu => self.word(base).store(next.0, Ordering::Release),
            Words::Rdma(..) => {
                // Nobody else changes a word that says APPLYING.
                let _ = self.cas(base, held.applying().0, next.0).await;
            }
        }
        Outcome::Applied
    }
}

/// Commits in flight from this node to one home, by request number.
#[derive(Default)]
pub(crate) struct Pending {
    next: std::cell::Cell<u64>,
    waiting: RefCell<HashMap<u64, oneshot::Sender<Outcome>>>,
    gone: RefCell<Option<Error>>,
}

impl Pending {
    pub(crate) fn start(&self) -> Result<(u64, oneshot::Receiver<Outcome>)> {
        if let Some(e) = &*self.gone.borrow() {
            return Err(e.clone());
        }
        let req = self.next.get();
        self.next.set(req + 1);
        let (tx, rx) = oneshot::channel();
        self.waiting.borrow_mut().insert(req, tx);
        Ok((req, rx))
    }

    pub(crate) fn forget(&self, req: u64) {
        self.waiting.borrow_mut().remove(&req);
    }

    fn finish(&self, req: u64, outcome: Outcome) {
        if let Some(tx) = self.waiting.borrow_mut().remove(&req) {
            let _ = tx.send(outcome);
        }
    }

    /// The connection failed: every commit still waiting learns that (its receiver closes).
    fn fail(&self, e: Error) {
        *self.gone.borrow_mut() = Some(e);
        self.waiting.borrow_mut().clear();
    }
}

/// Serves one DSM channel: commits that arrive are applied to `home` and answered; answers
/// to this node's own commits complete them (`pending` is this node's table for the home at
/// the other end; `None` on the accepting end of the connection to itself, where only
/// commits arrive).
pub(crate) async fn serve(
    home: Rc<Home>,
    tx: Rc<Sender<Msg, Bare>>,
    rx: Receiver<Msg, Bare>,
    pending: Option<Rc<Pending>>,
) {
    loop {
        match rx.recv().await {
            Ok(Msg::Commit {
                req,
                slot,
                lock,
                data,
            }) => {
                let outcome = home.apply(slot, lock, &data).await;
                if tx.send(&Msg::Done { req, outcome }).await.is_err() {
                    break;
                }
            }
            Ok(Msg::Done { req, outcome }) => {
                if let Some(p) = &pending {
                    p.finish(req, outcome);
                }
            }
            Err(e) => {
                if let Some(p) = &pending {
                    p.fail(e);
                }
                break;
            }
        }
    }
}
