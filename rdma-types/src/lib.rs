//! barewire-rdma-types: the verbs vocabulary every backend shares, below all of them.
//!
//! - Access flags ([`Access`]) and keys ([`Stag`]).
//! - Software key tables with rdma-core's protection semantics ([`Device`],
//!   [`ProtectionDomain`], [`MemoryRegion`], [`Window`]): unpredictable keys, domains, windows
//!   bound to one queue pair, and the check every tagged access passes. The software provider
//!   and the shared-memory backend keep their keys here.
//! - Work requests ([`SendWr`], [`RecvWr`], [`SendOp`], [`Sge`]) and completions
//!   ([`WorkCompletion`], [`WcStatus`], [`WcOpcode`]), and the completion queue applications
//!   poll and await ([`CompletionQueue`]).
//! - The queue-pair state machine ([`QpState`]) and [`RegionDescriptor`], what a peer needs
//!   to address a region.
//! - What a listener refused, and why ([`ListenerCounters`]).
//!
//! Objects belong to one core (`!Send`), like everything the engine runs.
//!
//! ```
//! use barewire_rdma_types::*;
//! let dev = Device::new();
//! let pd = dev.alloc_pd();
//! let mut mem = vec![0u8; 64];
//! // SAFETY: `mem` outlives the region.
//! let mr = unsafe { pd.register(mem.as_mut_ptr(), 64, Access::LOCAL_WRITE | Access::REMOTE_READ) }.unwrap();
//! let d = RegionDescriptor::of(&mr);
//! assert_eq!(RegionDescriptor::from_bytes(&d.to_bytes()), Some(d));
//! ```

#![warn(missing_docs)]

mod cm;
mod cq;
mod mr;
mod qp;
mod region;
mod wr;

pub use cm::ListenerCounters;
pub use cq::{CompletionQueue, Next, WcOpcode, WcStatus, WorkCompletion};
pub use mr::{
    Access, Device, MemoryRegion, ProtectionDomain, Stag, StagHasher, StagMap, Violation, Window,
};
pub use qp::{QpState, QpTransitionError};
pub use region::RegionDescriptor;
pub use wr::{RecvWr, SendOp, SendWr, Sge, Sges};
