//! Channels and a semaphore.
//!
//! [`mpsc`], [`oneshot`] and [`Semaphore`] are for tasks on one core: `Rc` and `RefCell`
//! inside, no atomics, `!Send`. [`cross`] is the one channel that crosses cores, over an SPSC
//! ring.

pub mod cross;
pub mod mpsc;
pub mod oneshot;
mod semaphore;

pub use semaphore::{Permit, Semaphore};
