//! A software RDMA peer process: registers a region, listens, and serves one-sided operations
//! until it is killed. Tests use it to kill (SIGKILL) or pause (SIGSTOP) a real peer process.
//!
//!     softrdma-peer [SIZE_MIB] [BIND_IP]
//!
//! Prints `READY <port>` once it listens; the region's descriptor travels in the MPA private
//! data of every connection it accepts.

use std::io::Write;

use barewire_engine::Runtime;
use barewire_soft_rdma::provider::{serve, ConnectOptions, Listener, RegionDescriptor};
use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device};

fn main() {
    let mib: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(32);
    let ip: std::net::IpAddr = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or([127, 0, 0, 1].into());
    let rt = Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let mut mem: Vec<u8> = (0..mib << 20).map(|i| (i % 251) as u8).collect();
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // SAFETY: `mem` lives until the process ends (`serve` never returns).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), mem.len(), all) }.expect("register");
        let opts = ConnectOptions {
            private_data: RegionDescriptor::of(&mr).to_bytes().to_vec(),
            ..ConnectOptions::default()
        };
        let l = Listener::bind((ip, 0).into(), opts).expect("listen");
        println!("READY {}", l.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        serve(
            l,
            pd,
            CompletionQueue::new(1024),
            CompletionQueue::new(1024),
        )
        .await
    });
}
