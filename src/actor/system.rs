//! Actors across nodes: an `ActorSystem` per node of a [`Mesh`](crate::Mesh) carries tells,
//! asks, lookups, remote spawns, monitors and exit signals over one ordered channel per peer,
//! and declares a peer down when it has heard nothing from it for `misses` heartbeat periods.
//!
//! Every message to a peer, and every heartbeat, travels on the same channel, so messages from
//! one sender to one actor keep their order, and any message is as good as a heartbeat.
//! Node-down is decided by deadlines, never by a connection closing alone: a peer that is
//! stopped, cut off or killed stops answering, and after `heartbeat × misses` (50 ms by
//! default) with nothing from it this node treats it as down for good: its pending asks fail,
//! monitors of its actors fire with `NoConnection`, and [`ActorSystem::next_down`] reports it.
//! A connection that fails is also taken as down at once. The price of a short deadline: a
//! core that blocks (a long synchronous computation in a handler, a blocking system call) for
//! longer than the deadline stops its heartbeats, and its peers will take its node for dead.
//! Long work belongs on another core, or needs a longer `SystemOptions::misses`.
//!
//! A peer cannot make this node hold without bound what it sends or what waits for it: an
//! actor's mailbox takes at most `SystemOptions::max_mailbox` messages from other nodes (a
//! tell beyond that is dropped and counted in [`ActorSystem::refused`], an ask is answered
//! with [`Error::Overloaded`]), and while `max_backlog` bytes wait for a peer that does not
//! read them, tells and asks to it fail at once with `Overloaded` and replies and heartbeats
//! to it are dropped. A tell that returned `Ok` is never dropped by either bound. Monitors
//! another node holds here are a list entry each (served by the one task each exported actor
//! has), dropped when that node goes down, and at most `max_monitors` per node: beyond it a monitor
//! is answered at once with a `Down` saying it was refused. An actor other nodes could reach
//! is forgotten when it exits (its exit reason is kept among the last 4,096, for a monitor or
//! ask already on its way), so starting and restarting actors for peers leaves nothing behind.
//!
//! A moved actor ([`ActorSystem::migrate`]) is reached at its old address until each sender
//! switches: the old home forwards a sender's messages in arrival order and tells that sender
//! where the actor went; the sender holds its further messages for it, sends a fence through
//! the old home, and once the new home has seen the fence (so everything forwarded for that
//! sender has arrived) it sends there directly, held messages first. Every message is
//! delivered once, and each sender's messages in the order it sent them.
//!
//! The code: this file holds the options, [`ActorSystem`]'s calls and the node's tables;
//! `wire` the messages between nodes and their encoding; `dispatch` frames out and in, moves'
//! forwarding, heartbeats and node-down; `remote` a reference to an actor on another node.

use std::any::type_name;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use barewire_engine::sync::oneshot;
use barewire_engine::{spawn_local, time, JoinHandle};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::cell::{ActorRef, Exit};
use super::{spawn, Actor, ExitReason};
use crate::channel::{Bytes, ChannelOptions, Sender};
use crate::error::{Error, Result};
use crate::mesh::Mesh;

mod dispatch;
mod remote;
mod wire;

use dispatch::{heartbeats, pump};
pub(crate) use remote::RemoteRef;
pub(crate) use wire::{decode, encode};
use wire::{fingerprint, parse_tell, put_uint, Wire, TELL};

/// An actor whose messages and replies can cross nodes (any actor whose types are serde).
///
/// ```
/// use barewire::actor::{Actor, Context, RemoteActor};
/// use std::collections::HashMap;
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// enum Cmd {
///     Put(String, u64),
///     Get(String),
/// }
/// struct Store(HashMap<String, u64>);
/// impl Actor for Store {
///     type Msg = Cmd;
///     type Reply = Option<u64>;
///     async fn handle(&mut self, cmd: Cmd, _: &Context<Self>) -> Option<u64> {
///         match cmd {
///             Cmd::Put(k, v) => self.0.insert(k, v),
///             Cmd::Get(k) => self.0.get(&k).copied(),
///         }
///     }
/// }
/// // Its message and reply are serde, so other nodes can tell and ask it.
/// fn reachable_from_other_nodes<A: RemoteActor>() {}
/// reachable_from_other_nodes::<Store>();
/// ```
pub trait RemoteActor:
    Actor<Msg: Serialize + DeserializeOwned, Reply: Serialize + DeserializeOwned>
{
}

impl<A> RemoteActor for A
where
    A: Actor,
    A::Msg: Serialize + DeserializeOwned,
    A::Reply: Serialize + DeserializeOwned,
{
}

/// An actor whose state can move to another node ([`ActorSystem::migrate`]): its state is
/// serde. A type that should never move simply does not implement this.
///
/// ```no_run
/// use barewire::actor::{spawn, Actor, ActorSystem, Context, Migratable};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Tally(u64);
/// impl Actor for Tally {
///     type Msg = u64;
///     type Reply = u64;
///     async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
///         self.0 += n;
///         self.0
///     }
/// }
/// impl Migratable for Tally {}
///
/// # async fn demo(sys: ActorSystem) -> barewire::Result<()> {
/// // Every node that may receive one says so, under one name:
/// sys.register_migratable::<Tally>("tally");
/// // The node running it moves it to node 1, state and queued messages included.
/// let here = spawn(Tally(0));
/// here.tell(5)?;
/// let there = sys.migrate(&here, 1, "tally").await?;
/// assert_eq!(there.node(), Some(1));
/// # Ok(()) }
/// ```
pub trait Migratable: RemoteActor + Serialize + DeserializeOwned {}

/// Node-down detection and the peer channels' shape.
///
/// ```
/// use barewire::actor::{Detector, SystemOptions};
/// use std::time::Duration;
/// // A slower, steadier failure detector (a node is down after 5 × 50 ms of silence) and a
/// // smaller bound on what a flooding peer can queue for one actor.
/// let opts = SystemOptions {
///     heartbeat: Duration::from_millis(50),
///     max_mailbox: 1024,
///     ..SystemOptions::default()
/// };
/// assert_eq!(opts.heartbeat * opts.misses, Duration::from_millis(250));
/// assert_eq!(opts.detector, Detector::Heartbeats);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct SystemOptions {
    /// How often this node tells each peer it is alive. Default 10 ms.
    pub heartbeat: Duration,
    /// Heartbeat periods without a word from a peer before it is declared down. Default 5.
    pub misses: u32,
    /// Largest channel message between two nodes, in bytes (a batch of frames; one actor
    /// message, encoded, must fit in it with a few bytes to spare). Default 16 KiB; at least
    /// [`MIN_MESSAGE`](Self::MIN_MESSAGE), at most 1 MiB - 2.
    pub max_message: usize,
    /// Who decides that a node is down. Default: this system's own heartbeat deadline.
    pub detector: Detector,
    /// Messages that may wait in one actor's mailbox before this node refuses more from other
    /// nodes: a tell beyond it is dropped and counted ([`ActorSystem::refused`]), an ask is
    /// answered with [`Error::Overloaded`]. Messages from this node are not held to it. So a
    /// peer that floods a slow actor costs this node at most this many messages of that
    /// actor's memory, where Erlang would queue them until the node runs out. (For an actor of
    /// another core, `spawn_on_core`, what counts is what waits on this core to cross to it:
    /// that core takes messages only while the actor's own mailbox is short.) Default 65,536.
    pub max_mailbox: usize,
    /// Bytes that may wait for one peer (queued here, not yet taken by its channel) before a
    /// tell, ask, lookup or spawn toward it fails at once with [`Error::Overloaded`], and
    /// replies and heartbeats to it are dropped. Only a peer that stops reading while this
    /// node keeps sending reaches it: the channel takes frames as fast as the peer consumes
    /// them. Protocol frames this node's own actions need (monitors, exits, migration fences)
    /// are never refused. With the batch the channel is writing out, a stalled peer holds at
    /// most about twice this here. Default 64 MiB.
    pub max_backlog: usize,
    /// Monitors one other node may hold on this node's actors at once. Each is an entry here
    /// until its actor exits or that node goes down; beyond the bound a monitor is answered at
    /// once with a `Down` of `ExitReason::Error("monitor refused: ...")`, as a monitor of an
    /// actor that does not exist is answered with `noproc`. Default 65,536.
    pub max_monitors: usize,
}

/// Who decides that a node is down.
///
/// ```no_run
/// use barewire::actor::{ActorSystem, Detector, SystemOptions};
/// # async fn demo(mesh: &barewire::Mesh, membership: barewire::cluster::Membership)
/// # -> barewire::Result<()> {
/// // Node-down from the cluster's SWIM membership only, so every layer agrees on who is down.
/// let opts = SystemOptions { detector: Detector::Membership, ..SystemOptions::default() };
/// let sys = ActorSystem::start(mesh, opts).await?;
/// sys.follow(membership);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detector {
    /// This system's heartbeat deadline (`heartbeat × misses`), or a failed connection.
    Heartbeats,
    /// The cluster's membership (see [`ActorSystem::follow`]): the one source of truth, so
    /// every layer agrees on who is down. Heartbeats still flow, as keep-alives; a failed
    /// connection still fails what waits on it at once.
    Membership,
}

impl SystemOptions {
    /// The smallest `max_message`: room for any of the system's own frames, with its header.
    pub const MIN_MESSAGE: usize = 256;

    /// A setting that cannot work, as an error that names it.
    fn check(&self) -> Result<()> {
        let bad = |what: String| Err(Error::Invalid(format!("SystemOptions: {what}")));
        if self.heartbeat.is_zero() {
            return bad("a heartbeat period of zero".into());
        }
        if self.misses == 0 {
            return bad("misses = 0 would declare every node down before it could answer".into());
        }
        if self.heartbeat.checked_mul(self.misses).is_none() {
            return bad(format!(
                "a deadline of {:?} x {} does not fit a Duration",
                self.heartbeat, self.misses
            ));
        }
        let most = crate::control::imm::MAX_MESSAGE;
        if !(Self::MIN_MESSAGE..=most).contains(&self.max_message) {
            return bad(format!(
                "max_message = {} (from {} to {most} bytes)",
                self.max_message,
                Self::MIN_MESSAGE
            ));
        }
        Ok(())
    }
}

impl Default for SystemOptions {
    fn default() -> Self {
        SystemOptions {
            heartbeat: Duration::from_millis(10),
            misses: 5,
            max_message: 16 * 1024,
            detector: Detector::Heartbeats,
            max_mailbox: 65_536,
            max_backlog: 64 << 20,
            max_monitors: 65_536,
        }
    }
}

/// Exit reasons of exported actors kept after their exit (see `Sys::export`).
const TOMBSTONES: usize = 4096;

/// How a reply's error says the receiver was overloaded (`Error::Overloaded`'s display).
const OVERLOADED: &str = "overloaded: ";

/// A local actor reachable from other nodes.
trait Exported {
    fn deliver(&self, msg: &[u8], reply: Option<(usize, u64)>, sys: &Rc<Sys>) -> Result<()>;
    fn exit(&self) -> Rc<Exit>;
    fn fingerprint(&self) -> String;
    fn signal(&self, reason: ExitReason, kill: bool);
    /// Where it lives now, if it moved away.
    fn moved(&self) -> Option<(usize, u64)>;
}

struct Export<A: RemoteActor>(ActorRef<A>);

impl<A: RemoteActor> Exported for Export<A> {
    fn deliver(&self, msg: &[u8], reply: Option<(usize, u64)>, sys: &Rc<Sys>) -> Result<()> {
        if self.0.queued().is_some_and(|n| n >= sys.max_mailbox) {
            sys.refused.set(sys.refused.get() + 1);
            return Err(Error::Overloaded(format!(
                "its mailbox holds {} messages (SystemOptions::max_mailbox)",
                sys.max_mailbox
            )));
        }
        let m: A::Msg = decode(msg)?;
        let Some((node, req)) = reply else {
            return self.0.tell(m);
        };
        let rx = self.0.ask_local(m)?;
        let sys = Rc::downgrade(sys);
        spawn_local(async move {
            let result = match rx.await {
                Ok(r) => encode(&r).map_err(|e| e.to_string()),
                Err(_) => Err("the actor exited before replying".into()),
            };
            if let Some(sys) = sys.upgrade() {
                sys.send(node, Wire::Reply { req, result });
            }
        });
        Ok(())
    }
    fn exit(&self) -> Rc<Exit> {
        self.0.exit_cell()
    }
    fn fingerprint(&self) -> String {
        fingerprint::<A>()
    }
    fn signal(&self, reason: ExitReason, now: bool) {
        if now {
            self.0.exit_with(reason)
        } else {
            self.0.stop(reason)
        }
    }
    fn moved(&self) -> Option<(usize, u64)> {
        self.0.moved_addr()
    }
}

type Factory = Rc<dyn Fn(&Rc<Sys>, &[u8]) -> Result<u64>>;

/// Where this node sends what it meant for an actor that moved.
enum Route {
    /// Told it moved; its fence is on the way: tells wait here (encoded), asks wait.
    Switching {
        to: (usize, u64),
        held: Vec<Vec<u8>>,
    },
    /// Straight to its new address.
    Direct(usize, u64),
}
type ReplyTo = oneshot::Sender<std::result::Result<Vec<u8>, String>>;

/// One peer: the frames waiting to go to it, and what this node has heard from it.
///
/// Everything to a peer travels as frames (`u32` little-endian length, then a BARE-encoded
/// `Wire`) packed into as few channel messages as fit: whatever accumulated while the pump
/// was sending the previous batch goes in the next one.
struct Peer {
    out: RefCell<Vec<u8>>,
    /// The pump, when it waits for frames.
    pump: RefCell<Option<Waker>>,
    last_heard: Cell<Instant>,
    down: Cell<bool>,
    /// Monitors it holds on this node's actors (see `SystemOptions::max_monitors`).
    monitors: Cell<usize>,
}

pub(crate) struct Sys {
    rank: usize,
    /// Largest frame that fits in one channel message.
    max_frame: usize,
    /// `SystemOptions::max_mailbox`, `max_backlog` and `max_monitors`.
    max_mailbox: usize,
    max_backlog: usize,
    max_monitors: usize,
    /// Messages from other nodes refused because their actor's mailbox was full.
    refused: Cell<u64>,
    peers: Vec<Option<Peer>>,
    /// Actors of this node that others may reach, by id: the wire side, and the `ActorRef`
    /// itself (for handing back refs to this node's own actors).
    exported: RefCell<HashMap<u64, Rc<dyn Exported>>>,
    refs: RefCell<HashMap<u64, Rc<dyn std::any::Any>>>,
    names: RefCell<HashMap<String, u64>>,
    kinds: RefCell<HashMap<String, (String, Factory)>>,
    /// How to rebuild a moving actor from its state, by kind.
    adopters: RefCell<HashMap<String, (String, Factory)>>,
    /// Requests waiting for their reply: id -> (node asked, where the reply goes).
    pending: RefCell<HashMap<u64, (usize, ReplyTo)>>,
    /// Monitors this node placed on other nodes' actors: monitor ref -> (node, exit cell).
    watching: RefCell<HashMap<u64, (usize, Rc<Exit>)>>,
    /// Monitors other nodes hold on this node's actors: actor id -> (node, monitor ref).
    monitored: RefCell<HashMap<u64, Vec<(usize, u64)>>>,
    /// The exit reasons of the last `TOMBSTONES` exported actors to exit, by id, oldest first
    /// in the queue: a monitor or ask that set out before the exit still gets the reason.
    tombstones: RefCell<(HashMap<u64, ExitReason>, std::collections::VecDeque<u64>)>,
    next: Cell<u64>,
    /// Moved actors' new addresses, as this node learned them: (old node, old id) -> route.
    routes: RefCell<HashMap<(usize, u64), Route>>,
    route_waiters: RefCell<Vec<Waker>>,
    /// This node's fences in flight: token -> the old address they close.
    fences: RefCell<HashMap<u64, (usize, u64)>>,
    /// (sender, old id) pairs already told where a moved actor went.
    told_moved: RefCell<std::collections::HashSet<(usize, u64)>>,
    /// Messages this node forwarded to actors that moved away from it.
    forwarded: Cell<u64>,
    downs: RefCell<Vec<usize>>,
    down_waiters: RefCell<Vec<Waker>>,
    tasks: RefCell<Vec<JoinHandle<()>>>,
    /// The connection to each other node, closed when it is declared down.
    links: Vec<Option<crate::Endpoint>>,
}

/// This node's part of a distributed actor system over a [`Mesh`]: one per node, made by every
/// member (collectively, like shared memory).
///
/// ```no_run
/// # async fn demo(mesh: &barewire::Mesh) -> barewire::Result<()> {
/// use barewire::actor::{spawn, Actor, ActorSystem, Context};
/// use std::time::Duration;
/// struct Echo;
/// impl Actor for Echo {
///     type Msg = String;
///     type Reply = String;
///     async fn handle(&mut self, s: String, _: &Context<Self>) -> String { s }
/// }
/// let sys = ActorSystem::start(mesh, Default::default()).await?;
/// sys.register("echo", &spawn(Echo))?;                      // visible to every node
/// let there = sys.lookup::<Echo>((mesh.rank() + 1) % mesh.size(), "echo").await?;
/// let back = there.ask("hi".into(), Duration::from_millis(100)).await?;
/// # let _ = back; Ok(()) }
/// ```
#[derive(Clone)]
pub struct ActorSystem {
    sys: Rc<Sys>,
}

impl Drop for Sys {
    fn drop(&mut self) {
        for t in self.tasks.borrow().iter() {
            t.cancel();
        }
    }
}

impl ActorSystem {
    /// Starts this node's part: opens a channel to every other member, starts heartbeats.
    pub async fn start(mesh: &Mesh, opts: SystemOptions) -> Result<ActorSystem> {
        opts.check()?;
        let rank = mesh.rank();
        let copts = ChannelOptions::new(64, opts.max_message);
        let opens: Vec<_> = (0..mesh.size())
            .filter(|j| *j != rank)
            .map(|j| mesh.endpoint(j).open_bytes_channel(copts))
            .collect();
        let mut chans: Vec<Option<_>> = crate::join::try_join_all(opens)
            .await?
            .into_iter()
            .map(Some)
            .collect();
        chans.insert(rank, None);
        let peers = chans
            .iter()
            .map(|c| {
                c.as_ref().map(|_| Peer {
                    out: RefCell::default(),
                    pump: RefCell::default(),
                    last_heard: Cell::new(Instant::now()),
                    down: Cell::new(false),
                    monitors: Cell::new(0),
                })
            })
            .collect();
        let sys = Rc::new(Sys {
            rank,
            max_frame: opts.max_message - 4,
            max_mailbox: opts.max_mailbox,
            max_backlog: opts.max_backlog,
            max_monitors: opts.max_monitors,
            refused: Cell::new(0),
            peers,
            exported: RefCell::default(),
            refs: RefCell::default(),
            names: RefCell::default(),
            kinds: RefCell::default(),
            adopters: RefCell::default(),
            pending: RefCell::default(),
            watching: RefCell::default(),
            monitored: RefCell::default(),
            tombstones: RefCell::default(),
            next: Cell::new(1),
            routes: RefCell::default(),
            route_waiters: RefCell::default(),
            fences: RefCell::default(),
            told_moved: RefCell::default(),
            forwarded: Cell::new(0),
            downs: RefCell::default(),
            down_waiters: RefCell::default(),
            tasks: RefCell::default(),
            links: (0..mesh.size())
                .map(|j| (j != rank).then(|| mesh.endpoint(j).clone()))
                .collect(),
        });
        let mut tasks = Vec::new();
        for (j, c) in chans.into_iter().enumerate() {
            let Some((tx, rx)) = c else { continue };
            tasks.push(spawn_local(pump(
                Rc::downgrade(&sys),
                j,
                tx,
                opts.max_message,
            )));
            let weak = Rc::downgrade(&sys);
            tasks.push(spawn_local(async move {
                loop {
                    let r = rx.recv().await;
                    let Some(sys) = weak.upgrade() else { break };
                    match r {
                        Ok(batch) => sys.dispatch_batch(j, &batch),
                        Err(e) => {
                            sys.node_down(j, &format!("the connection failed: {e}"));
                            break;
                        }
                    }
                }
            }));
        }
        let weak = Rc::downgrade(&sys);
        tasks.push(spawn_local(heartbeats(weak, opts)));
        *sys.tasks.borrow_mut() = tasks;
        Ok(ActorSystem { sys })
    }

    /// This node's rank.
    pub fn rank(&self) -> usize {
        self.sys.rank
    }

    /// Makes `actor` reachable from every node under `name` (replacing a previous one).
    pub fn register<A: RemoteActor>(&self, name: &str, actor: &ActorRef<A>) -> Result<()> {
        let id = self.sys.export(actor)?;
        self.sys.names.borrow_mut().insert(name.to_string(), id);
        super::register(name, actor);
        Ok(())
    }

    /// The actor registered as `name` on node `rank` (this node included), checked to take
    /// `A`'s messages.
    pub async fn lookup<A: RemoteActor>(&self, rank: usize, name: &str) -> Result<ActorRef<A>> {
        if rank == self.sys.rank {
            return super::whereis::<A>(name)
                .ok_or_else(|| Error::Invalid(format!("no actor {name:?} on this node")));
        }
        let fp = fingerprint::<A>();
        let id = self
            .sys
            .request(rank, |req| Wire::Lookup {
                req,
                name: name.into(),
                fp,
            })
            .await?;
        Ok(self.sys.remote_ref(rank, decode(&id)?))
    }

    /// Looks `name` up on every node, this one first; the first found.
    pub async fn whereis<A: RemoteActor>(&self, name: &str) -> Result<ActorRef<A>> {
        let n = self.sys.peers.len();
        for k in 0..n {
            let rank = (self.sys.rank + k) % n;
            if k > 0 && !self.is_up(rank) {
                continue;
            }
            if let Ok(r) = self.lookup::<A>(rank, name).await {
                return Ok(r);
            }
        }
        Err(Error::Invalid(format!("no actor {name:?} on any node")))
    }

    /// Lets other nodes start actors of this kind here with [`spawn_on`](Self::spawn_on):
    /// `make` builds one from the arguments they send.
    pub fn register_kind<A, Args>(&self, kind: &str, make: impl Fn(Args) -> A + 'static)
    where
        A: RemoteActor,
        Args: DeserializeOwned,
    {
        let f: Factory = Rc::new(move |sys: &Rc<Sys>, args: &[u8]| {
            let a = spawn(make(decode(args)?));
            sys.export(&a)
        });
        self.sys
            .kinds
            .borrow_mut()
            .insert(kind.to_string(), (fingerprint::<A>(), f));
    }

    /// Starts an actor of registered kind `kind` on node `rank` with `args`.
    pub async fn spawn_on<A: RemoteActor, Args: Serialize>(
        &self,
        rank: usize,
        kind: &str,
        args: &Args,
    ) -> Result<ActorRef<A>> {
        let args = encode(args)?;
        if rank == self.sys.rank {
            let f = self.sys.kind::<A>(kind)?;
            let id = f(&self.sys, &args)?;
            return self.sys.local_ref(id);
        }
        let fp = fingerprint::<A>();
        let id = self
            .sys
            .request(rank, |req| Wire::Spawn {
                req,
                kind: kind.into(),
                fp,
                args,
            })
            .await?;
        Ok(self.sys.remote_ref(rank, decode(&id)?))
    }

    /// Lets actors of type `A` move to this node under the name `kind` (every node that may
    /// receive one registers it).
    pub fn register_migratable<A: Migratable>(&self, kind: &str) {
        let f: Factory = Rc::new(|sys: &Rc<Sys>, state: &[u8]| {
            let a: A = decode(state)?;
            sys.export(&spawn(a))
        });
        self.sys
            .adopters
            .borrow_mut()
            .insert(kind.to_string(), (fingerprint::<A>(), f));
    }

    /// Moves `actor`, which runs on this node, to node `to`, where `A` is registered as `kind`
    /// ([`register_migratable`](Self::register_migratable)); returns its new reference.
    ///
    /// The actor handles everything already in its mailbox, then its state travels; what is
    /// sent to it meanwhile waits here and follows, in order. From then on this node forwards
    /// whatever still comes to the old address, in the order it arrives, and each other node's
    /// references switch to the new address after their first forwarded message (see the
    /// module doc), so every message is delivered once and in per-sender order. References on
    /// this node keep forwarding. Its monitors and supervisor see the moved actor's exit as its
    /// own.
    pub async fn migrate<A: Migratable>(
        &self,
        actor: &ActorRef<A>,
        to: usize,
        kind: &str,
    ) -> Result<ActorRef<A>> {
        if to == self.sys.rank {
            return Err(Error::Invalid("it already runs on this node".into()));
        }
        let state = actor.freeze().await?;
        let bytes = encode(&state);
        let fp = fingerprint::<A>();
        let moved = match bytes {
            Ok(state) => {
                let kind = kind.to_string();
                self.sys
                    .request(to, |req| Wire::Adopt {
                        req,
                        kind,
                        fp,
                        state,
                    })
                    .await
            }
            Err(e) => Err(e),
        };
        match moved.and_then(|id| decode::<u64>(&id)) {
            Ok(id) => {
                let there = self.sys.remote_ref(to, id);
                actor.moved_to(there.clone());
                Ok(there)
            }
            Err(e) => {
                // It could not move: it starts again here, from the state it froze with, and
                // takes what was held for it.
                let here = spawn(state);
                actor.moved_to(here);
                Err(e)
            }
        }
    }

    /// Messages this node has forwarded to actors that moved away from it (a reference
    /// elsewhere switches to the new address after its first forwarded message).
    pub fn forwarded(&self) -> u64 {
        self.sys.forwarded.get()
    }

    /// Messages from other nodes this node refused because their actor's mailbox held
    /// `SystemOptions::max_mailbox` already: tells dropped, asks answered with
    /// [`Error::Overloaded`].
    pub fn refused(&self) -> u64 {
        self.sys.refused.get()
    }

    /// Actors of this node that other nodes can reach (registered, started for a peer, or moved
    /// here) and that have not exited. An actor's entry goes when it exits.
    pub fn exported(&self) -> usize {
        self.sys.exported.borrow().len()
    }

    /// Bytes waiting to go to node `rank` (queued here, not yet taken by its channel's sender):
    /// at most `SystemOptions::max_backlog` plus one frame. The batch the sender is writing
    /// out meanwhile, at most as much again, is not counted. 0 for this node or one not in
    /// the mesh.
    pub fn backlog(&self, rank: usize) -> usize {
        match self.sys.peers.get(rank) {
            Some(Some(p)) => p.out.borrow().len(),
            _ => 0,
        }
    }

    /// Declares node `rank` down, as the cluster's membership decided: its pending asks fail,
    /// monitors and links of its actors fire with `NoConnection`, supervisors restart its
    /// children elsewhere, [`next_down`](Self::next_down) reports it, and the connection to it
    /// is closed (so it declares this node down too, if it is alive). Once only.
    pub fn declare_down(&self, rank: usize) {
        self.sys.node_down(rank, "the cluster's membership says so");
    }

    /// Takes node-down from `membership` (with [`Detector::Membership`] in the options, the
    /// only source): every member it reports down is declared down here, by rank.
    pub fn follow(&self, mut membership: crate::cluster::Membership) {
        let sys = Rc::downgrade(&self.sys);
        let task = spawn_local(async move {
            while let Some(e) = membership.next_event().await {
                if let crate::cluster::Event::Down(m) = e {
                    match sys.upgrade() {
                        Some(sys) => sys.node_down(m.rank as usize, "membership"),
                        None => break,
                    }
                }
            }
        });
        self.sys.tasks.borrow_mut().push(task);
    }

    /// Whether node `rank` is still considered up.
    pub fn is_up(&self, rank: usize) -> bool {
        match self.sys.peers.get(rank) {
            Some(Some(p)) => !p.down.get(),
            Some(None) => true,
            None => false,
        }
    }

    /// The next node declared down (each is reported once, in order).
    pub async fn next_down(&self, seen: &mut usize) -> usize {
        std::future::poll_fn(|cx| {
            let downs = self.sys.downs.borrow();
            if let Some(r) = downs.get(*seen) {
                *seen += 1;
                return Poll::Ready(*r);
            }
            self.sys.down_waiters.borrow_mut().push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}

impl Sys {
    fn id(&self) -> u64 {
        let id = self.next.get();
        self.next.set(id + 1);
        id
    }

    /// Makes `actor` reachable from other nodes under a new id, until it exits: then a task
    /// sends its monitors their `Down` and forgets the id (and any name for it), keeping only
    /// its exit reason among the last `TOMBSTONES` (for a monitor or ask already on its way).
    /// Later ones find no actor (`noproc`), as in OTP, and a node that keeps starting and
    /// restarting actors for its peers keeps no more than that of the dead ones.
    fn export<A: RemoteActor>(self: &Rc<Self>, actor: &ActorRef<A>) -> Result<u64> {
        if actor.node().is_some() {
            return Err(Error::Invalid(
                "only an actor of this node can be exported".into(),
            ));
        }
        let id = self.id();
        self.exported
            .borrow_mut()
            .insert(id, Rc::new(Export(actor.clone())));
        self.refs.borrow_mut().insert(id, Rc::new(actor.clone()));
        let exit = actor.exit_cell();
        let sys = Rc::downgrade(self);
        spawn_local(async move {
            let reason = std::future::poll_fn(|cx| exit.poll_exit(cx)).await;
            let Some(sys) = sys.upgrade() else { return };
            sys.exported.borrow_mut().remove(&id);
            sys.refs.borrow_mut().remove(&id);
            sys.names.borrow_mut().retain(|_, v| *v != id);
            {
                let (reasons, order) = &mut *sys.tombstones.borrow_mut();
                reasons.insert(id, reason.clone());
                order.push_back(id);
                if order.len() > TOMBSTONES {
                    if let Some(old) = order.pop_front() {
                        reasons.remove(&old);
                    }
                }
            }
            let watchers = sys.monitored.borrow_mut().remove(&id);
            for (node, mref) in watchers.into_iter().flatten() {
                if let Some(Some(p)) = sys.peers.get(node) {
                    p.monitors.set(p.monitors.get() - 1);
                }
                let reason = reason.clone();
                sys.send(node, Wire::Down { mref, reason });
            }
        });
        Ok(id)
    }

    fn kind<A: RemoteActor>(&self, kind: &str) -> Result<Factory> {
        let kinds = self.kinds.borrow();
        let (fp, f) = kinds
            .get(kind)
            .ok_or_else(|| Error::Invalid(format!("no actor kind {kind:?} registered")))?;
        if *fp != fingerprint::<A>() {
            return Err(Error::type_mismatch(fingerprint::<A>(), fp.clone()));
        }
        Ok(f.clone())
    }

    fn local_ref<A: RemoteActor>(&self, id: u64) -> Result<ActorRef<A>> {
        self.refs
            .borrow()
            .get(&id)
            .and_then(|r| r.downcast_ref::<ActorRef<A>>())
            .cloned()
            .ok_or_else(|| Error::Invalid(format!("no local actor {id} of this type")))
    }
}

#[cfg(test)]
mod tests {
    use super::wire::take_uint;
    use super::*;

    #[test]
    fn a_hand_written_tell_frame_is_what_bare_makes_of_wire_tell() {
        let msg = serde_bare::to_vec(&("hello".to_string(), 7u64)).unwrap();
        let mut by_hand = vec![TELL];
        by_hand.extend_from_slice(&42u64.to_le_bytes());
        put_uint(&mut by_hand, msg.len() as u64);
        by_hand.extend_from_slice(&msg);
        let by_serde = serde_bare::to_vec(&Wire::Tell {
            to: 42,
            msg: msg.clone(),
        })
        .unwrap();
        assert_eq!(by_hand, by_serde);
        assert_eq!(parse_tell(&by_hand), Some((42, &msg[..])));
        // Truncated or other frames are not tells.
        assert_eq!(parse_tell(&by_hand[..by_hand.len() - 1]), None);
        assert_eq!(
            parse_tell(&serde_bare::to_vec(&Wire::Heartbeat).unwrap()),
            None
        );
        for cut in 0..by_hand.len() {
            let _ = parse_tell(&by_hand[..cut]);
        }
        let mut big = Vec::new();
        put_uint(&mut big, 300);
        assert_eq!(take_uint(&big), Some((300, &[][..])));
        assert_eq!(take_uint(&[0x80; 11]), None);
    }

    /// Options that cannot work are refused by `start`, naming the setting, rather than
    /// starting a system whose heartbeat task then panics (a zero period) or whose frame bound
    /// underflows (a `max_message` under 4 bytes).
    #[test]
    fn options_that_cannot_work_are_refused_at_start() {
        barewire_test_support::rt().block_on(async {
            let node = crate::Node::soft().unwrap();
            let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            let at = [format!("127.0.0.1:{port}").parse().unwrap()];
            let mesh = Mesh::join(&node, 0, &at).await.unwrap();
            let d = SystemOptions::default();
            let bad = [
                (
                    SystemOptions {
                        heartbeat: Duration::ZERO,
                        ..d
                    },
                    "heartbeat period of zero",
                ),
                (SystemOptions { misses: 0, ..d }, "misses = 0"),
                (
                    SystemOptions {
                        heartbeat: Duration::MAX,
                        ..d
                    },
                    "does not fit a Duration",
                ),
                (
                    SystemOptions {
                        max_message: 3,
                        ..d
                    },
                    "max_message = 3",
                ),
                (
                    SystemOptions {
                        max_message: 2 << 20,
                        ..d
                    },
                    "max_message = 2097152",
                ),
            ];
            for (opts, says) in bad {
                let e = ActorSystem::start(&mesh, opts).await.err().unwrap();
                assert!(matches!(&e, Error::Invalid(m) if m.contains(says)), "{e}");
            }
            let min = SystemOptions {
                max_message: SystemOptions::MIN_MESSAGE,
                ..d
            };
            assert!(ActorSystem::start(&mesh, min).await.is_ok());
        });
    }
}
