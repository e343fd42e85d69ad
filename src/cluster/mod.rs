//! The cluster layer: a program started by the cluster managers users already run (Slurm's
//! `srun`, Open MPI's `mpirun`, Kubernetes indexed Jobs and StatefulSets, or barewire's own
//! `barewire run`) finds its place in the job from the environment they leave ([`Launch`]),
//! and [`Cluster::start`] builds the rest: the full mesh, the actor system, SWIM membership
//! ([`Membership`], the one source of node-down for every layer) and a pool of workers that
//! advertise what the node offers ([`Resources`]) and run the tasks of
//! [`submit_work`](Cluster::submit_work).
//!
//! ```no_run
//! # async fn demo() -> barewire::Result<()> {
//! use barewire::cluster::{Cluster, ClusterOptions, Launch, Task, Workflow};
//! let cluster = Cluster::start(&Launch::from_env()?, ClusterOptions::default()).await?;
//! cluster.register_task("square", |x: u64, _ctx| async move { Ok(x * x) });
//! cluster.register_task("sum", |(): (), ctx| async move {
//!     Ok(ctx.inputs::<u64>().map_err(|e| e.to_string())?.iter().sum::<u64>())
//! });
//! if cluster.rank() == 0 {
//!     let mut wf = Workflow::new();
//!     let parts: Vec<_> = (1..=6u64)
//!         .map(|x| wf.add(Task::<u64>::new("square", &x).idempotent()))
//!         .collect();
//!     let total = wf.add(Task::<u64>::new("sum", &()).after_all(&parts));
//!     assert_eq!(cluster.submit_work(wf).await?.get(total), Ok(91));
//! }
//! # Ok(()) }
//! ```
//!
//! # Workflows
//!
//! A task is registered by name on every node ([`Cluster::register_task`]): an async function
//! from serde arguments (and the results of the tasks it depends on) to a serde result. A
//! [`Workflow`] is a set of task invocations, each naming what it depends on, what it needs of
//! a node ([`Needs`]) and where its data lives ([`Task::near`]). The submitting node plans and
//! supervises the run: a task becomes ready when everything it depends on has succeeded, and
//! goes to a node that is up, offers what it needs, and has a free worker (one per advertised
//! core): the node near its data if that one is up and fits, otherwise the least busy. Its
//! result comes back over the actor system.
//!
//! Invariants, for every task of a workflow:
//!
//! - its result is taken once: the first answer of its current attempt; an answer from an
//!   attempt given up on (its node declared down) is ignored;
//! - it is re-run only when the node running it is declared down (or its connection failed),
//!   only if it was declared [`idempotent`](Task::idempotent), and never on that node again;
//!   a task that is not idempotent ends [`TaskError::Lost`] instead (its effect may or may
//!   not have happened; the caller decides);
//! - its dependents never start unless it succeeded; they end [`TaskError::Dependency`].
//!
//! This is OTP's supervision applied to tasks: idempotent tasks are `transient` children
//! restarted elsewhere, the others `temporary`. A task's own error or panic is its result, not
//! a reason to run it again. `tests/workflow_faults.rs` checks them on real multi-process runs
//! with a node killed mid-workflow (every result right, every task's effect applied once), and
//! shows that the check catches a task whose effect is not idempotent.
//!
//! # Without `Cluster::start`
//!
//! The pieces work alone: [`Launch::addrs`] gives every rank's address for a
//! [`Mesh`](crate::Mesh) made by hand, [`Membership`] runs SWIM by itself, and
//! [`Cluster::over`] adds workers and `submit_work` to a mesh and actor system built
//! elsewhere.

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
