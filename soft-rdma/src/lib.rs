//! barewire-soft-rdma: software RDMA over TCP, speaking iWARP (MPA, DDP, RDMAP) so it can talk
//! to Linux siw and iWARP NICs.
//!
//! Today: the complete [`wire`] codec, and the provider's object model in [`verbs`]
//! (protection domains, memory regions with CSPRNG STags and the access check, completion
//! queues, the queue-pair state machine). The connection and data path over the engine come
//! next.

#![warn(missing_docs)]

pub mod provider;
pub mod stream;
pub mod verbs;
pub mod wire;
