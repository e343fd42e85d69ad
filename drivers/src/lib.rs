//! barewire-drivers: one verbs-shaped API over three backends — RDMA hardware through rdma-core
//! (`verbs`: InfiniBand, RoCE v1/v2, iWARP NICs, and Linux rxe/siw), barewire's software
//! provider (`soft`, iWARP over TCP), and shared memory between processes on one host (`shm`,
//! see the module `shm`'s docs in the source: memfd grants, CPU atomics, shared rings).
//!
//! [`Device`] opens what `BAREWIRE_DRIVER` / [`DriverConfig`] select; its protection domains,
//! memory regions, completion queues and queue pairs behave the same on every backend, and
//! [`Endpoint`] gives async operations that complete on their own work completion. Transport
//! selection: `Transport::Auto` takes the first usable verbs device and otherwise the software
//! provider, and an explicit request for an absent transport is an error that says what to
//! install or set.
//!
//! ```
//! use barewire_drivers::{select, Transport};
//! // On a machine without RDMA hardware, Auto falls back to the software provider...
//! let chosen = select(Transport::Auto, None).unwrap();
//! println!("using {} ({:?})", chosen.device, chosen.transport);
//! // ...and asking for InfiniBand explicitly is a clear error, not a silent fallback.
//! if barewire_drivers::verbs_devices().is_empty() {
//!     let err = select(Transport::InfiniBand, None).unwrap_err();
//!     assert!(err.to_string().contains("BAREWIRE_DRIVER=soft"));
//! }
//! ```

#![warn(missing_docs)]

mod api;
mod backend;
mod ops;
mod shm;
mod soft;
mod transport;
mod verbs;

/// The checks the drivers' cargo-fuzz targets run (`fuzz/fuzz_targets/shm_ring.rs`), exported
/// so that the fuzz crate and the corpus replay (`tests/fuzz_corpus.rs`) call the same code.
#[doc(hidden)]
pub mod fuzz {
    pub use crate::shm::ring::fuzz::{seeds as shm_ring_seeds, shm_ring};
}

pub use api::{
    connect, Access, CompletionQueue, ConnectOptions, Device, Listener, ListenerCounters,
    ListenerLimits, MemoryRegion, ProtectionDomain, QpState, QueuePair, RecvWr, RegionDescriptor,
    SendOp, SendWr, Sge, Sges, Stag, WcOpcode, WcStatus, Window, WorkCompletion,
};
pub use ops::{Buffer, Endpoint, MappedRemote, MappedSpan, Op, Remote, Span};
pub use transport::{
    select, Chosen, DriverConfig, DriverError, Overrides, Transport, TransportDefaults,
    DEFAULT_KEEPALIVE,
};
pub use verbs::{verbs_devices, DeviceInfo};
