//! The cluster layer (in progress): where a process stands in a job started by the cluster
//! managers users already run (Slurm's `srun`, Open MPI's `mpirun`, Kubernetes indexed Jobs
//! and StatefulSets, or barewire's own launcher), read from the environment they leave.
//!
//! ```no_run
//! # async fn demo() -> barewire::Result<()> {
//! use barewire::cluster::Launch;
//! use barewire::{Mesh, Node};
//! let me = Launch::from_env()?;              // rank, size and every rank's host
//! let addrs = me.addrs(7600)?;               // ports: 7600 + index among the ranks of a host
//! let node = Node::new()?;
//! node.listen(addrs[me.rank])?;
//! let mesh = Mesh::join(&node, me.rank, &addrs).await?;
//! # let _ = mesh; Ok(()) }
//! ```

mod hostlist;
mod launch;
mod membership;
mod resources;
mod start;
mod work;

pub use hostlist::{expand_hostlist, expand_tasks_per_node};
pub use launch::{Launch, Launcher};
pub use membership::{Event, Member, Membership, MembershipOptions};
pub use resources::{parse_labels, Needs, Resources};
pub use start::{Cluster, ClusterOptions};
pub use work::{Task, TaskContext, TaskError, TaskId, WorkResults, Workflow};
