//! barewire-soft-rdma: software RDMA over TCP, speaking iWARP (MPA, DDP, RDMAP) so it can talk
//! to Linux siw and iWARP NICs.
//!
//! Today: the [`wire`] codec's MPA connection frames, FPDU framing with CRC32c, and the DDP and
//! RDMAP headers. The provider (verbs semantics over the engine) comes next.

#![warn(missing_docs)]

pub mod wire;
