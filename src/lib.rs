//! barewire: a userspace RDMA I/O engine.
//!
//! Today this crate re-exports the engine (the thread-per-core runtime) and the software RDMA
//! provider; typed regions, one-sided operations and channels arrive with the drivers and the
//! typed API.

pub use barewire_engine as engine;
pub use barewire_soft_rdma as soft_rdma;
