//! barewire-engine: a thread-per-core, run-to-completion runtime.
//!
//! One executor per core, pinned; tasks are `!Send` and stay on their core. Each core's loop
//! runs ready tasks up to a budget, then polls every [`Poller`]: the io_uring (or epoll)
//! reactor, timers, the cross-core mesh, and whatever other crates register (the RDMA drivers
//! register their completion queues). When nothing is ready it spins for a configurable time,
//! then sleeps in the reactor until an fd, a timer or a cross-core wake.
//!
//! ```
//! use barewire_engine::{Runtime, spawn_local, net::{TcpListener, TcpStream}};
//!
//! let rt = Runtime::builder().cores(1).pin(false).build().unwrap();
//! rt.block_on(async {
//!     let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
//!     let addr = listener.local_addr().unwrap();
//!     let server = spawn_local(async move {
//!         let (stream, _) = listener.accept().await.unwrap();
//!         let (n, buf) = stream.read(vec![0u8; 64]).await;
//!         let (_, _) = stream.write_all(buf[..n.unwrap()].to_vec()).await;
//!     });
//!     let client = TcpStream::connect(addr).await.unwrap();
//!     let (r, _) = client.write_all(b"hello".to_vec()).await;
//!     r.unwrap();
//!     let (n, buf) = client.read(vec![0u8; 64]).await;
//!     assert_eq!(&buf[..n.unwrap()], b"hello");
//!     server.await.unwrap();
//! });
//! ```

#![warn(missing_docs)]

pub mod buf;
mod core;
mod driver;
mod error;
pub mod fs;
#[doc(hidden)]
pub mod fuzz;
mod memcopy;
mod mesh;
pub mod net;
mod op;
mod poller;
pub mod pool;
mod runtime;
mod shim;
mod spsc;
mod stats;
pub mod sync;
mod task;
pub mod time;
pub mod trace;
pub mod uring;
mod wake;

pub use crate::core::spawn_local;
pub use driver::{Reactor, ReactorKind, UringFlags};
pub use error::Error;
pub use memcopy::copy_bulk;
pub use op::poll_fd::{poll_readable, poll_readable_relaxed, poll_writable, WakeSource};
pub use poller::{Poller, MEMORY_LOOKS};
pub use pool::map_anonymous;
pub use runtime::{
    at_yield, core_token, current_core, current_cpu, in_runtime, num_cores, poll_count, reactor,
    register_poller, spawn_on, stats, yield_now, Builder, Runtime, DEFAULT_FIXED_FILES,
};
pub use stats::CoreStats;
pub use task::{task_overhead_bytes, JoinError, JoinHandle};
