//! The smallest cluster program: every process finds its rank and every peer's address in the
//! environment its launcher left, joins the full mesh, adds `rank + 1` to a counter shared on
//! rank 0, and rank 0 prints the total once all have.
//!
//!     cargo build --release --example cluster_hello --bin barewire
//!     target/release/barewire run -n 3 -- target/release/examples/cluster_hello
//!     srun -O -n 3 target/release/examples/cluster_hello          # under Slurm
//!     mpirun -n 3 target/release/examples/cluster_hello           # under Open MPI

use std::time::Duration;

use barewire::cluster::Launch;
use barewire::dsm::{SharedMemory, SharedOptions};
use barewire::engine::{time, Runtime};
use barewire::{Mesh, Node, Result};

fn main() {
    let r: Result<()> = Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .expect("runtime")
        .block_on(async {
            let me = Launch::from_env()?;
            let addrs = me.addrs(7600)?;
            let node = Node::new()?;
            node.listen(addrs[me.rank])?;
            let mesh = Mesh::join(&node, me.rank, &addrs).await?;
            let total =
                SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default()).await?;
            let arrived =
                SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default()).await?;
            total.fetch_add(0, me.rank as u64 + 1).await?;
            arrived.fetch_add(0, 1).await?;
            while arrived.read_from(0).await? < me.size as u64 {
                time::sleep(Duration::from_millis(1)).await;
            }
            if me.rank == 0 {
                println!(
                    "{} processes ({:?}): total {}",
                    me.size,
                    me.launcher,
                    total.read_from(0).await?
                );
            }
            // Everyone leaves once rank 0 has read (the last one to arrive bumps it again).
            arrived.fetch_add(0, 1).await?;
            while arrived.read_from(0).await? < 2 * me.size as u64 {
                time::sleep(Duration::from_millis(1)).await;
            }
            time::sleep(Duration::from_millis(100)).await;
            Ok(())
        });
    if let Err(e) = r {
        eprintln!("cluster_hello: {e}");
        std::process::exit(1);
    }
}
