//! `Cluster`: one process's part of a running cluster — its node, the full mesh, the actor
//! system, membership, and what every member offers.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use barewire_engine::time;

use super::resources::Resources;
use super::work::{Registry, WorkMsg, WorkReply, Worker};
use super::{Launch, Member, Membership, MembershipOptions};
use crate::actor::{spawn, ActorRef, ActorSystem, Detector, SystemOptions};
use crate::error::{Error, Result};
use crate::mesh::{Mesh, JOIN_WAIT};
use crate::Node;

/// How a cluster starts.
///
/// ```no_run
/// # async fn demo() -> barewire::Result<()> {
/// use barewire::cluster::{Cluster, ClusterOptions, Launch};
/// // Node-down by the actor system's own heartbeats instead of SWIM, on ports from 9000.
/// let opts = ClusterOptions {
///     base_port: Some(9000),
///     membership: None,
///     ..ClusterOptions::default()
/// };
/// let cluster = Cluster::start(&Launch::from_env()?, opts).await?;
/// # let _ = cluster; Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// First port: rank `r` listens on `base_port + its index among its host's ranks` (TCP
    /// for the mesh, UDP for membership). Default: what the launcher chose
    /// (`BAREWIRE_BASE_PORT`), otherwise 7600.
    pub base_port: Option<u16>,
    /// The actor system's options (node-down deadline, message size).
    pub system: SystemOptions,
    /// SWIM membership (foca) with these settings, and node-down taken from it alone: the
    /// one source of truth for every layer (default). `None`: the actor system's heartbeat
    /// deadline decides (faster, 50 ms, but each node judges alone).
    pub membership: Option<MembershipOptions>,
    /// What this node offers; `None`: [`Resources::detect`].
    pub resources: Option<Resources>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            base_port: None,
            system: SystemOptions::default(),
            membership: Some(MembershipOptions::default()),
            resources: None,
        }
    }
}

/// One process's part of a cluster: started from the launcher's environment, fully meshed,
/// with an actor system, optional SWIM membership, and a worker pool that runs the tasks of
/// [`submit_work`](Cluster::submit_work) (see [`Workflow`](super::Workflow)).
///
/// ```no_run
/// # async fn demo() -> barewire::Result<()> {
/// use barewire::cluster::{Cluster, ClusterOptions, Launch, Task, Workflow};
/// let cluster = Cluster::start(&Launch::from_env()?, ClusterOptions::default()).await?;
/// cluster.register_task("square", |x: u64, _ctx| async move { Ok(x * x) });
/// if cluster.rank() == 0 {
///     let mut wf = Workflow::new();
///     let sq = wf.add(Task::<u64>::new("square", &7u64));
///     assert_eq!(cluster.submit_work(wf).await?.get(sq), Ok(49));
/// }
/// # Ok(()) }
/// ```
pub struct Cluster {
    pub(super) node: Node,
    pub(super) mesh: Mesh,
    pub(super) system: ActorSystem,
    pub(super) offers: Vec<Resources>,
    pub(super) registry: Rc<Registry>,
    pub(super) workers: Rc<RefCell<Workers>>,
    pub(super) cursor: Cell<usize>,
}

/// The workers known, by (node, slot).
pub(super) type Workers = HashMap<(usize, usize), ActorRef<Worker>>;

/// The name the worker of slot `k` is registered under on every node.
pub(super) fn worker_name(k: usize) -> String {
    format!("barewire.work.{k}")
}

impl Cluster {
    /// Starts this process's part of the cluster `launch` describes: opens its device, listens,
    /// joins the full mesh, starts the actor system (and membership, if asked), starts its
    /// workers, and learns what every member offers. Collective: every rank calls it.
    pub async fn start(launch: &Launch, opts: ClusterOptions) -> Result<Cluster> {
        let base = opts.base_port.or(launch.base_port).unwrap_or(7600);
        // A peer's name may not resolve yet (a Kubernetes pod still being scheduled): try
        // again for up to JOIN_WAIT.
        let t0 = Instant::now();
        let addrs = loop {
            match launch.addrs(base) {
                Ok(a) => break a,
                Err(e) if t0.elapsed() >= JOIN_WAIT => return Err(e),
                Err(_) => time::sleep(Duration::from_millis(200)).await,
            }
        };
        let node = Node::new()?;
        node.listen(addrs[launch.rank])?;
        let mesh = Mesh::join(&node, launch.rank, &addrs).await?;
        let mut sys_opts = opts.system;
        if opts.membership.is_some() {
            sys_opts.detector = Detector::Membership;
        }
        let system = ActorSystem::start(&mesh, sys_opts).await?;
        if let Some(m) = opts.membership {
            // A restarted process comes back with a higher incarnation: seconds since the epoch.
            let life = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as u32);
            let me = Member {
                rank: launch.rank as u32,
                addr: addrs[launch.rank],
                incarnation: life,
            };
            let seeds: Vec<_> = addrs
                .iter()
                .enumerate()
                .filter(|(r, _)| *r != launch.rank)
                .map(|(_, a)| *a)
                .collect();
            system.follow(Membership::start(me, &seeds, m)?);
        }
        let resources = match opts.resources {
            Some(r) => r,
            None => Resources::detect(&node)?,
        };
        Cluster::over(node, mesh, system, resources).await
    }

    /// Builds the cluster layer over a mesh and actor system made by hand (collective): starts
    /// this node's workers (one per advertised core) and waits until every member's have
    /// started, so work can be submitted from any member as soon as this returns.
    pub async fn over(
        node: Node,
        mesh: Mesh,
        system: ActorSystem,
        resources: Resources,
    ) -> Result<Cluster> {
        if resources.cores == 0 {
            return Err(Error::Invalid("a node must offer at least one core".into()));
        }
        let registry = Rc::new(Registry::default());
        let mut workers = HashMap::new();
        let rank = mesh.rank();
        for k in 0..resources.cores {
            let w = spawn(Worker::new(registry.clone(), rank, resources.clone()));
            system.register(&worker_name(k), &w)?;
            workers.insert((rank, k), w);
        }
        let mut offers = Vec::with_capacity(mesh.size());
        for r in 0..mesh.size() {
            if r == rank {
                offers.push(resources.clone());
                continue;
            }
            let w = lookup_when_there(&system, r, &worker_name(0)).await?;
            match w.ask(WorkMsg::Offer, JOIN_WAIT).await? {
                WorkReply::Offer(o) => offers.push(o),
                WorkReply::Ran(_) => {
                    return Err(Error::Malformed(format!(
                        "node {r} answered an offer request with a result"
                    )))
                }
            }
            workers.insert((r, 0), w);
        }
        Ok(Cluster {
            node,
            mesh,
            system,
            offers,
            registry,
            workers: Rc::new(RefCell::new(workers)),
            cursor: Cell::new(rank),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.mesh.rank()
    }

    /// Members in the cluster.
    pub fn size(&self) -> usize {
        self.mesh.size()
    }

    /// This process's node (its device and registered memory).
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The full mesh (for shared memory and channels).
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The actor system (remote actors, supervision, node-down).
    pub fn system(&self) -> &ActorSystem {
        &self.system
    }

    /// What member `rank` offered when the cluster started.
    pub fn resources(&self, rank: usize) -> Option<&Resources> {
        self.offers.get(rank)
    }

    /// Whether member `rank` is up, as far as the cluster's failure detector knows.
    pub fn is_up(&self, rank: usize) -> bool {
        self.system.is_up(rank)
    }
}

/// Looks `name` up on `rank` until it is there (the member may still be starting), for up to
/// [`JOIN_WAIT`].
async fn lookup_when_there(
    system: &ActorSystem,
    rank: usize,
    name: &str,
) -> Result<ActorRef<Worker>> {
    let t0 = Instant::now();
    loop {
        match system.lookup::<Worker>(rank, name).await {
            Ok(w) => return Ok(w),
            Err(Error::Refused(_)) if t0.elapsed() < JOIN_WAIT => {
                time::sleep(Duration::from_millis(2)).await
            }
            Err(e) => {
                return Err(Error::Invalid(format!(
                    "member {rank} never started its workers: {e}"
                )))
            }
        }
    }
}
