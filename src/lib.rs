//! barewire: a userspace RDMA I/O engine — typed registered memory, one-sided operations and
//! zero-copy channels over RDMA hardware or barewire's software provider.
//!
//! A [`Node`] per core opens the device (`BAREWIRE_DRIVER`: the software provider where there
//! is no RDMA hardware), registers typed [`Region`]s, and accepts or connects [`Endpoint`]s.
//! Peers exchange region descriptors ([`Endpoint::send_region`] / [`Endpoint::recv_region`],
//! which checks the element type), then read, write and update each other's memory with
//! typed one-sided operations, or talk through ordered channels ([`Endpoint::open_channel`],
//! [`DistributedChannel`]).
//!
//! ```no_run
//! use barewire::{Align, Node};
//! barewire::engine::Runtime::builder().cores(1).build().unwrap().block_on(async {
//!     let node = Node::new()?;
//!     let ep = node.connect("127.0.0.1:7471".parse().unwrap()).await?;
//!     let counters = ep.recv_region::<u64>().await?;       // the peer sent a Region<u64>
//!     let before = ep.fetch_add(&counters, 0, 1).await?;   // RDMA atomic on slot 0
//!     ep.write(&counters, 1, before + 100).await?;         // RDMA WRITE of slot 1
//!     let (tx, rx) = ep.open_channel::<[u8; 64]>(Default::default()).await?;
//!     tx.send(&[7; 64]).await?;
//!     let echo = rx.recv().await?;
//!     # let _ = echo;
//!     Ok::<_, barewire::Error>(())
//! }).unwrap();
//! ```

#![warn(missing_docs)]

pub mod actor;
mod channel;
pub mod cluster;
mod control;
mod distributed;
pub mod dsm;
mod endpoint;
mod error;
#[doc(hidden)]
pub mod fuzz;
mod join;
mod mesh;
mod node;
mod region;

pub use barewire_drivers as drivers;
pub use barewire_engine as engine;
pub use barewire_soft_rdma as soft_rdma;

pub use channel::{
    Bare, Bytes, ChannelOptions, Codec, Raw, Receiver, Recv, RecvInto, Sender, Sending,
};
pub use distributed::DistributedChannel;
pub use endpoint::{Endpoint, DEFAULT_CHANNEL_RING_LIMIT, DEFAULT_HANDSHAKE_TIMEOUT};
pub use error::{Error, Mismatch, Result};
pub use mesh::{Mesh, JOIN_WAIT};
pub use node::Node;
pub use region::{Align, Fingerprint, Region, RemoteRegion};
