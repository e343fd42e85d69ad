//! Distributed shared memory: typed objects and a partitioned global array that any member of a
//! [`Mesh`](crate::Mesh) reads, writes and updates with one-sided operations, linearizably.
//!
//! [`SharedMemory<T>`] is one object per node (`read_from(node)`, `write_to(node, v)`,
//! `update(node, f)`); [`SharedArray<T>`] is a global array block-distributed over the nodes
//! (Grappa and UPC's shape). Both are the same protocol over the same slots; `SharedMemory` is
//! an array of one element per node.
//!
//! # The protocol
//!
//! Every object has a *home*: the node whose registered memory holds it. Every access, the
//! home's own included, goes through the home's connection to itself or another node's
//! connection to it, with the same one-sided operations; nothing writes an object with a plain
//! store.
//!
//! **Word objects** (`T` of exactly 8 bytes: `u64`, `f64`, `[u8; 8]`, ...) are their value and
//! nothing else, and change only by RDMA atomics: `get` is one 8-byte READ, `put` a swap,
//! `update` a compare-and-swap loop on the value itself, `fetch_add` and `compare_and_swap` one
//! atomic each. An aligned 8-byte word changed only by atomics never reads torn, and each
//! operation takes effect at the instant the home executes it. No lock is needed, so none can
//! be left held: a lock would only add a round trip and a lease to wait out.
//!
//! **Wide objects** (any other `T`) are a slot in the home's block: a lock word `W` =
//! (version, epoch, owner), the version the data holds, the data, and a check (a 64-bit hash
//! of the data seeded with that version; layout in `layout.rs`).
//!
//! - *Read*: one RDMA READ of the whole slot. It is accepted when the data's version equals
//!   `W`'s and the check matches; otherwise (a commit was landing) it is read again. A lock
//!   held by an updater does not block readers: until its commit is applied the slot still
//!   holds the version `W` names.
//! - *Update* (`update`, and `put` of a wide value): read the slot; take the lock by
//!   compare-and-swap of `W` from the word just read (free) to (same version, epoch + 1, me);
//!   compute `f(value)`; send the new data as a *commit* to the home, naming the lock word it
//!   installed. The home applies the commit only if `W` still equals that word, by a
//!   compare-and-swap of `W` to `APPLYING`; it then writes the data, its version and its check,
//!   and stores (version + 1, epoch, free). Otherwise it answers `Fenced` and writes nothing.
//! - *Leases*: a lock word that stays the same, held, for a whole lease (`SharedOptions::lease`,
//!   20 ms by default, on the waiter's own clock) is broken: the waiter compare-and-swaps it to
//!   (same version, epoch + 1, itself). A holder that was killed blocks others for one lease; a
//!   holder that was paused and comes back finds its commit fenced, and starts its update
//!   again on the value as it is then.
//!
//! # The invariant, and why it holds
//!
//! *Every wide object's history is a sequence of versions 1, 2, 3, ...; version `v + 1` is
//! `f(value of version v)` for the one update whose commit was applied at version `v`, and a
//! read returns the value of the version that was current at some instant during the read.*
//!
//! - Only the home writes a slot's data, and only between a successful compare-and-swap of `W`
//!   from the committer's lock word to `APPLYING` and the store of the next version. While `W`
//!   says `APPLYING` no compare-and-swap from anyone else can succeed (waiters never break
//!   `APPLYING`, and every other change of `W` is a compare-and-swap from a word that is not
//!   `APPLYING`), so applications of commits to one slot never overlap.
//! - A commit carries the exact word its sender installed: (v, e, c). It applies only while `W`
//!   equals that word. Any other node's acquisition in between (a broken lease included)
//!   raised the epoch, and any applied commit raised the version, and versions never go back,
//!   so `W` cannot equal (v, e, c) again later. Owner ids are held by one operation at a time,
//!   so no other operation of this node can install (v, e, c) either. So an applied commit's
//!   sender held the lock, unbroken, from its compare-and-swap at version `v` to the home's
//!   application: nobody else's commit was applied in between, the value it computed `f` from
//!   was version `v`'s, and its result becomes version `v + 1`. That is fencing: once a lock
//!   changed hands, its old holder cannot make a write visible, however late its commit
//!   arrives. No update is lost, because an update returns only when its commit was applied.
//! - A read's READ sees `W` at some instant `t` during the READ, saying version `v` is
//!   current. The data it accepts has version `v` and `v`'s check, so it is `v`'s data (a mix of
//!   two versions fails the check with probability 1 − 2⁻⁶⁴: the check is what makes a torn
//!   READ detectable on hardware that places and fetches bytes in any order). The read
//!   linearizes at `t`; an update linearizes at the home's store of its version.
//!
//! # Errors
//!
//! A home that is gone fails operations with [`Error::PeerGone`](crate::Error::PeerGone)
//! within the provider's fault bound (1 s on the software provider). An operation that changes
//! memory and lost its connection while in flight (a commit sent but not answered, an atomic
//! posted but not completed) fails with [`Error::Indeterminate`](crate::Error::Indeterminate):
//! it may have taken effect; so does a commit its home leaves unanswered for 1 s (a stopped or
//! cut-off home whose memory is still served, as on shm or a NIC, answers every READ, so only
//! the missing answer shows it). Reads and lock acquisitions that fail never changed a value,
//! and fail with `PeerGone`.
//!
//! ```no_run
//! # async fn demo(node: &barewire::Node, mesh: &barewire::Mesh) -> barewire::Result<()> {
//! use barewire::dsm::{SharedMemory, SharedOptions};
//! #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
//! #[repr(C)]
//! struct Stats { count: u64, sum: f64, max: f64 }
//!
//! let stats = SharedMemory::create(node, mesh, Stats { count: 0, sum: 0.0, max: 0.0 },
//!     SharedOptions::default()).await?;
//! let x = 3.5;
//! stats.update(0, |s| Stats { count: s.count + 1, sum: s.sum + x, max: s.max.max(x) }).await?;
//! let on_node_0 = stats.read_from(0).await?;
//! # let _ = on_node_0; Ok(()) }
//! ```

mod array;
mod home;
mod layout;
mod memory;

use std::time::Duration;

pub use array::SharedArray;
pub use memory::SharedMemory;

/// How shared objects behave.
///
/// ```
/// use barewire::dsm::SharedOptions;
/// use std::time::Duration;
/// // Updates whose critical section may take longer (a slow `f`, a far peer): a longer lease.
/// let opts = SharedOptions::with_lease(Duration::from_millis(200));
/// assert_eq!(opts.lease, Duration::from_millis(200));
/// assert_eq!(SharedOptions::default().lease, Duration::from_millis(20));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedOptions {
    /// How long a lock may stay held, unchanged, before a waiter breaks it. Longer than any
    /// update's critical section (a read, `f`, and a commit's round trip), shorter than what a
    /// stopped holder may cost everyone else. Default 20 ms.
    pub lease: Duration,
    #[doc(hidden)]
    pub broken: Option<Broken>,
}

impl Default for SharedOptions {
    fn default() -> Self {
        SharedOptions {
            lease: Duration::from_millis(20),
            broken: None,
        }
    }
}

impl SharedOptions {
    /// The defaults with another lease.
    pub fn with_lease(lease: Duration) -> SharedOptions {
        SharedOptions {
            lease,
            ..SharedOptions::default()
        }
    }
}

/// Deliberately broken variants, for showing that the tests' linearizability checker catches
/// what they break. Not for use.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// Updates take no lock and the home applies every commit: lost updates.
    NoLock,
    /// Updates write wide values in place with two RDMA WRITEs and reads skip the version
    /// and check: torn reads (and lost updates).
    TornWrites,
}

impl std::str::FromStr for Broken {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Broken> {
        match s {
            "no-lock" => Ok(Broken::NoLock),
            "torn-writes" => Ok(Broken::TornWrites),
            _ => Err(crate::Error::Invalid(format!(
                "broken variant {s:?} (no-lock | torn-writes)"
            ))),
        }
    }
}
