//! The smallest cluster program: every process finds its rank and every peer's address in the
//! environment its launcher left and starts its part of the cluster (full mesh, actor system,
//! workers). Each adds `rank + 1` to a counter shared on rank 0; rank 0 then submits a
//! workflow (the squares of 1..=2N as tasks spread over the cluster, then their sum as a task
//! that depends on them all) and prints both totals.
//!
//!     cargo build --release --example cluster_hello --bin barewire
//!     target/release/barewire run -n 3 -- target/release/examples/cluster_hello
//!     srun -O -n 3 target/release/examples/cluster_hello          # under Slurm
//!     mpirun -n 3 target/release/examples/cluster_hello           # under Open MPI

use std::time::Duration;

use barewire::cluster::{Cluster, ClusterOptions, Launch, Task, Workflow};
use barewire::dsm::{SharedMemory, SharedOptions};
use barewire::engine::{time, Runtime};
use barewire::Result;

fn main() {
    let r: Result<()> = Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .expect("runtime")
        .block_on(async {
            let me = Launch::from_env()?;
            let cluster = Cluster::start(&me, ClusterOptions::default()).await?;
            cluster.register_task("square", |x: u64, ctx| async move {
                Ok((x * x, ctx.rank() as u64))
            });
            cluster.register_task("sum", |(): (), ctx| async move {
                let parts: Vec<(u64, u64)> = ctx.inputs().map_err(|e| e.to_string())?;
                Ok(parts.iter().map(|p| p.0).sum::<u64>())
            });
            let (node, mesh) = (cluster.node(), cluster.mesh());
            let total = SharedMemory::<u64>::create(node, mesh, 0, SharedOptions::default()).await?;
            let arrived =
                SharedMemory::<u64>::create(node, mesh, 0, SharedOptions::default()).await?;
            total.fetch_add(0, me.rank as u64 + 1).await?;
            arrived.fetch_add(0, 1).await?;
            while arrived.read_from(0).await? < me.size as u64 {
                time::sleep(Duration::from_millis(1)).await;
            }
            if me.rank == 0 {
                let n = 2 * me.size as u64;
                let mut wf = Workflow::new();
                let squares: Vec<_> = (1..=n)
                    .map(|x| wf.add(Task::<(u64, u64)>::new("square", &x).idempotent()))
                    .collect();
                let sum = wf.add(Task::<u64>::new("sum", &()).after_all(&squares));
                let done = cluster.submit_work(wf).await?;
                let mut ranks: Vec<u64> = squares
                    .iter()
                    .filter_map(|s| done.get(*s).ok().map(|r| r.1))
                    .collect();
                ranks.sort();
                ranks.dedup();
                match done.get(sum) {
                    Ok(s) => println!(
                        "{} processes ({:?}): total {}, sum of squares 1..{n} = {s} (on ranks {ranks:?})",
                        me.size,
                        me.launcher,
                        total.read_from(0).await?
                    ),
                    Err(e) => println!("the workflow failed: {e}"),
                }
            }
            // Everyone leaves once rank 0 is done (the last one to arrive bumps it again).
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
