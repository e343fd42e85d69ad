//! Verbs objects with rdma-core's semantics: protection domains, memory regions with access
//! flags and unpredictable STags, completion queues with `ibv_wc_status`-style statuses, and
//! the queue-pair state machine. Objects belong to one core (`!Send`), like everything the
//! engine runs.
//!
//! This is the provider's object model and protection core; the connection and data path that
//! drive it over the engine's sockets build on it.

mod cq;
mod mr;
mod qp;

pub use cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
pub use mr::{
    Access, Device, MemoryRegion, ProtectionDomain, Stag, StagHasher, StagMap, Violation, Window,
};
pub use qp::{QpState, QpTransitionError};
