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

#[derive(Debug, Serialize, Deserialize)]
enum Wire {
    Heartbeat,
    Tell {
        to: u64,
        msg: Vec<u8>,
    },
    Ask {
        to: u64,
        req: u64,
        msg: Vec<u8>,
    },
    Reply {
        req: u64,
        result: std::result::Result<Vec<u8>, String>,
    },
    Lookup {
        req: u64,
        name: String,
        fp: String,
    },
    Spawn {
        req: u64,
        kind: String,
        fp: String,
        args: Vec<u8>,
    },
    Monitor {
        target: u64,
        mref: u64,
    },
    Down {
        mref: u64,
        reason: ExitReason,
    },
    Exit {
        to: u64,
        reason: ExitReason,
        kill: bool,
    },
    /// "The actor you sent to at `old` here now lives at (`node`, `id`)."
    Moved {
        old: u64,
        node: u64,
        id: u64,
    },
    /// "Everything I sent to `old` before this is with you": passed on to the new home.
    Fence {
        old: u64,
        token: u64,
    },
    /// A fence from `origin`, passed on by the old home after everything it forwarded.
    FenceFwd {
        origin: u64,
        token: u64,
    },
    /// "Your fence arrived here": the sender may now send to the new home directly.
    FenceAck {
        token: u64,
    },
    /// "Take over this actor": its kind and its state; reply with its new id.
    Adopt {
        req: u64,
        kind: String,
        fp: String,
        state: Vec<u8>,
    },
}

/// `Wire::Tell`'s variant index in BARE (the order of `Wire`'s variants).
const TELL: u8 = 1;

/// Exit reasons of exported actors kept after their exit (see `Sys::export`).
const TOMBSTONES: usize = 4096;

/// How a reply's error says the receiver was overloaded (`Error::Overloaded`'s display).
const OVERLOADED: &str = "overloaded: ";

/// Appends a BARE `uint` (LEB128).
fn put_uint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A BARE `uint` from the front of `b`, and the rest.
fn take_uint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

/// A frame that is a `Wire::Tell`: its target and the message's bytes, without copying them.
fn parse_tell(payload: &[u8]) -> Option<(u64, &[u8])> {
    let (&kind, rest) = payload.split_first()?;
    if kind != TELL || rest.len() < 8 {
        return None;
    }
    let to = u64::from_le_bytes(rest[..8].try_into().ok()?);
    let (len, msg) = take_uint(&rest[8..])?;
    (msg.len() as u64 == len).then_some((to, msg))
}

/// The pump: this node's frames to `node`, in order, as few channel messages as fit.
async fn pump(sys: Weak<Sys>, node: usize, tx: Sender<Vec<u8>, Bytes>, max: usize) {
    let mut spare = Vec::new();
    loop {
        let batch = std::future::poll_fn(|cx| {
            let Some(sys) = sys.upgrade() else {
                return Poll::Ready(None);
            };
            let Some(Some(p)) = sys.peers.get(node) else {
                return Poll::Ready(None);
            };
            let mut out = p.out.borrow_mut();
            if out.is_empty() {
                *p.pump.borrow_mut() = Some(cx.waker().clone());
                return Poll::Pending;
            }
            spare.clear();
            Poll::Ready(Some(std::mem::replace(
                &mut *out,
                std::mem::take(&mut spare),
            )))
        })
        .await;
        let Some(batch) = batch else { break };
        // Split at frame boundaries into channel messages of at most `max` bytes.
        let mut start = 0;
        while start < batch.len() {
            let mut end = start;
            while end < batch.len() {
                let len = u32::from_le_bytes(batch[end..end + 4].try_into().unwrap()) as usize;
                if end > start && end + 4 + len - start > max {
                    break;
                }
                end += 4 + len;
            }
            let sent = if start == 0 && end == batch.len() {
                tx.send(&batch).await
            } else {
                tx.send(&batch[start..end].to_vec()).await
            };
            if sent.is_err() {
                return;
            }
            start = end;
        }
        spare = batch;
    }
}

/// What an actor's messages and replies are, as the wire checks them.
fn fingerprint<A: Actor>() -> String {
    format!("{} -> {}", type_name::<A::Msg>(), type_name::<A::Reply>())
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_bare::to_vec(v).map_err(|e| Error::Malformed(format!("encoding: {e}")))
}

pub(crate) fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T> {
    serde_bare::from_slice(b).map_err(|e| Error::Malformed(format!("decoding: {e}")))
}

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

    fn remote_ref<A: RemoteActor>(self: &Rc<Self>, node: usize, id: u64) -> ActorRef<A> {
        ActorRef::remote(RemoteRef {
            sys: Rc::downgrade(self),
            node,
            id,
            exit: Rc::new(Exit::default()),
            mref: Cell::new(None),
            tell: Sys::tell_frame::<A::Msg>,
            enc: encode::<A::Msg>,
            dec: decode::<A::Reply>,
            dec_msg: decode::<A::Msg>,
            enc_reply: encode::<A::Reply>,
        })
    }

    /// Queues a frame for `node`; `write` appends its payload. A `bounded` frame is refused
    /// while `max_backlog` bytes or more wait for that node.
    fn frame(
        &self,
        node: usize,
        bounded: bool,
        write: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let Some(Some(p)) = self.peers.get(node) else {
            return Err(Error::Invalid(format!("no node {node}")));
        };
        if p.down.get() {
            return Err(Error::PeerGone(format!("node {node} is down")));
        }
        let mut out = p.out.borrow_mut();
        if bounded && out.len() >= self.max_backlog {
            return Err(Error::Overloaded(format!(
                "{} bytes wait for node {node}, which is not taking them \
                 (SystemOptions::max_backlog)",
                out.len()
            )));
        }
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        let r = write(&mut out);
        let len = out.len() - at - 4;
        if r.is_err() || len > self.max_frame {
            out.truncate(at);
            r?;
            return Err(Error::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        out[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        drop(out);
        if let Some(w) = p.pump.borrow_mut().take() {
            w.wake();
        }
        Ok(())
    }

    /// Queues `w` for `node`. Heartbeats, replies and requests are bounded (dropped, or for
    /// requests refused, while the node's backlog is full: it is not reading them); what this
    /// node's own protocol needs is not.
    fn send(&self, node: usize, w: Wire) {
        let _ = self.send_wire(node, w);
    }

    fn send_wire(&self, node: usize, w: Wire) -> Result<()> {
        // (A `Tell` sent this way is one already accepted, passed on to where its actor
        // moved, and an `Adopt` is a migration under way: neither may be dropped.)
        let bounded = matches!(
            w,
            Wire::Heartbeat
                | Wire::Reply { .. }
                | Wire::Ask { .. }
                | Wire::Lookup { .. }
                | Wire::Spawn { .. }
        );
        self.frame(node, bounded, |out| {
            serde_bare::to_writer(out, &w).map_err(|e| Error::Invalid(format!("encoding: {e}")))
        })
    }

    /// A tell, written straight into the peer's batch in the layout BARE gives
    /// `Wire::Tell { to, msg }` (the message encoded once, into a reused scratch buffer).
    fn tell_frame<M: Serialize>(&self, node: usize, to: u64, msg: &M) -> Result<()> {
        thread_local!(static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) });
        SCRATCH.with(|scratch| {
            let mut m = scratch.borrow_mut();
            m.clear();
            serde_bare::to_writer(&mut *m, msg)
                .map_err(|e| Error::Invalid(format!("encoding: {e}")))?;
            self.frame(node, true, |out| {
                out.push(TELL);
                out.extend_from_slice(&to.to_le_bytes());
                put_uint(out, m.len() as u64);
                out.extend_from_slice(&m);
                Ok(())
            })
        })
    }

    /// Every frame of a batch from `from`, in order.
    fn dispatch_batch(self: &Rc<Self>, from: usize, mut batch: &[u8]) {
        if let Some(Some(p)) = self.peers.get(from) {
            p.last_heard.set(Instant::now());
        }
        // Runs of tells to one actor look it up once.
        let mut last: Option<(u64, Rc<dyn Exported>)> = None;
        while batch.len() >= 4 {
            let len = u32::from_le_bytes(batch[..4].try_into().unwrap()) as usize;
            let Some(payload) = batch.get(4..4 + len) else {
                break; // a truncated frame: nothing else in this batch can be trusted
            };
            batch = &batch[4 + len..];
            if let Some((to, msg)) = parse_tell(payload) {
                if last.as_ref().map(|(id, _)| *id) != Some(to) {
                    last = self.exported.borrow().get(&to).map(|e| (to, e.clone()));
                }
                if let Some((_, e)) = &last {
                    let _ = e.deliver(msg, None, self);
                    self.note_forward(from, to, e.as_ref());
                }
                continue;
            }
            match serde_bare::from_slice::<Wire>(payload) {
                Ok(w) => self.dispatch(from, w),
                Err(_) => break,
            }
        }
    }

    /// Node `from` monitors this node's actor `target` (its exit cell `exit`) as `mref`: an
    /// entry in the actor's list, which the task `export` started sends its `Down` when the
    /// actor exits; a node that goes down is dropped from every list (`node_down`). Refused
    /// beyond `max_monitors` monitors from that node.
    fn monitor(&self, from: usize, target: u64, mref: u64, exit: Rc<Exit>) {
        let Some(Some(p)) = self.peers.get(from) else {
            return;
        };
        if let Some(reason) = exit.get() {
            self.send(from, Wire::Down { mref, reason });
            return;
        }
        if p.monitors.get() >= self.max_monitors {
            let reason = ExitReason::Error(format!(
                "monitor refused: node {from} already holds {} monitors here \
                 (SystemOptions::max_monitors)",
                self.max_monitors
            ));
            self.send(from, Wire::Down { mref, reason });
            return;
        }
        p.monitors.set(p.monitors.get() + 1);
        self.monitored
            .borrow_mut()
            .entry(target)
            .or_default()
            .push((from, mref));
    }

    /// The exit reason of actor `id`, gone from here, if it exited lately (see `export`).
    fn tombstone(&self, id: u64) -> Option<ExitReason> {
        self.tombstones.borrow().0.get(&id).cloned()
    }

    fn is_down(&self, node: usize) -> bool {
        matches!(self.peers.get(node), Some(Some(p)) if p.down.get())
    }

    async fn request(&self, node: usize, make: impl FnOnce(u64) -> Wire) -> Result<Vec<u8>> {
        if self.is_down(node) {
            return Err(Error::PeerGone(format!("node {node} is down")));
        }
        let req = self.id();
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(req, (node, tx));
        if let Err(e) = self.send_wire(node, make(req)) {
            self.pending.borrow_mut().remove(&req);
            return Err(e);
        }
        match rx.await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => Err(match e.strip_prefix(OVERLOADED) {
                Some(m) => Error::Overloaded(m.to_string()),
                None => Error::Refused(e),
            }),
            Err(_) => Err(Error::PeerGone(format!("node {node} is down"))),
        }
    }

    fn dispatch(self: &Rc<Self>, from: usize, w: Wire) {
        match w {
            Wire::Heartbeat => {}
            Wire::Tell { to, msg } => {
                let e = self.exported.borrow().get(&to).cloned();
                if let Some(e) = e {
                    let _ = e.deliver(&msg, None, self);
                    self.note_forward(from, to, e.as_ref());
                }
            }
            Wire::Moved { old, node, id } => {
                let token = self.id();
                self.fences.borrow_mut().insert(token, (from, old));
                self.routes.borrow_mut().insert(
                    (from, old),
                    Route::Switching {
                        to: (node as usize, id),
                        held: Vec::new(),
                    },
                );
                self.send(from, Wire::Fence { old, token });
            }
            Wire::Fence { old, token } => {
                let e = self.exported.borrow().get(&old).cloned();
                if let Some((node, _)) = e.and_then(|e| e.moved()) {
                    let w = Wire::FenceFwd {
                        origin: from as u64,
                        token,
                    };
                    if node == self.rank {
                        self.dispatch(from, w);
                    } else {
                        self.send(node, w);
                    }
                }
            }
            Wire::FenceFwd { origin, token } => {
                if origin as usize == self.rank {
                    self.switched(token);
                } else {
                    self.send(origin as usize, Wire::FenceAck { token });
                }
            }
            Wire::FenceAck { token } => self.switched(token),
            Wire::Ask { to, req, msg } => {
                let e = self.exported.borrow().get(&to).cloned();
                let r = match e {
                    Some(e) => {
                        let r = e.deliver(&msg, Some((from, req)), self);
                        self.note_forward(from, to, e.as_ref());
                        r
                    }
                    None => Err(Error::Exited(
                        self.tombstone(to)
                            .map_or("no such actor (noproc)".into(), |r| r.to_string()),
                    )),
                };
                if let Err(e) = r {
                    self.send(
                        from,
                        Wire::Reply {
                            req,
                            result: Err(e.to_string()),
                        },
                    );
                }
            }
            Wire::Reply { req, result } => {
                if let Some((_, tx)) = self.pending.borrow_mut().remove(&req) {
                    let _ = tx.send(result);
                }
            }
            Wire::Lookup { req, name, fp } => {
                let id = self.names.borrow().get(&name).copied();
                let e = id.and_then(|id| self.exported.borrow().get(&id).cloned());
                let result = match (id, e) {
                    (Some(id), Some(e)) if e.fingerprint() == fp => {
                        encode(&id).map_err(|e| e.to_string())
                    }
                    (Some(_), Some(e)) => {
                        Err(format!("{name:?} takes {}, not {fp}", e.fingerprint()))
                    }
                    _ => Err(format!("no actor {name:?} on node {}", self.rank)),
                };
                self.send(from, Wire::Reply { req, result });
            }
            Wire::Spawn {
                req,
                kind,
                fp,
                args,
            } => {
                let f = self.kinds.borrow().get(&kind).cloned();
                let result = match f {
                    Some((kfp, f)) if kfp == fp => f(self, &args)
                        .and_then(|id| encode(&id))
                        .map_err(|e| e.to_string()),
                    Some((kfp, _)) => Err(format!("kind {kind:?} takes {kfp}, not {fp}")),
                    None => Err(format!("no actor kind {kind:?} on node {}", self.rank)),
                };
                self.send(from, Wire::Reply { req, result });
            }
            Wire::Monitor { target, mref } => {
                let e = self.exported.borrow().get(&target).cloned();
                match e {
                    None => {
                        let reason = self
                            .tombstone(target)
                            .unwrap_or_else(|| ExitReason::Error("noproc".into()));
                        self.send(from, Wire::Down { mref, reason });
                    }
                    Some(e) => self.monitor(from, target, mref, e.exit()),
                }
            }
            Wire::Down { mref, reason } => {
                if let Some((_, exit)) = self.watching.borrow_mut().remove(&mref) {
                    exit.set(reason);
                }
            }
            Wire::Adopt {
                req,
                kind,
                fp,
                state,
            } => {
                let f = self.adopters.borrow().get(&kind).cloned();
                let result = match f {
                    Some((kfp, f)) if kfp == fp => f(self, &state)
                        .and_then(|id| encode(&id))
                        .map_err(|e| e.to_string()),
                    Some((kfp, _)) => Err(format!("kind {kind:?} takes {kfp}, not {fp}")),
                    None => Err(format!("no migratable kind {kind:?} on node {}", self.rank)),
                };
                self.send(from, Wire::Reply { req, result });
            }
            Wire::Exit { to, reason, kill } => {
                let e = self.exported.borrow().get(&to).cloned();
                if let Some(e) = e {
                    e.signal(reason, kill);
                }
            }
        }
    }

    /// A message from `from` to this node's actor `to` was delivered; if that actor moved
    /// away, the message was forwarded: count it, and tell `from` (once) where it went.
    fn note_forward(&self, from: usize, to: u64, e: &dyn Exported) {
        let Some((node, id)) = e.moved() else { return };
        self.forwarded.set(self.forwarded.get() + 1);
        if self.told_moved.borrow_mut().insert((from, to)) {
            self.send(
                from,
                Wire::Moved {
                    old: to,
                    node: node as u64,
                    id,
                },
            );
        }
    }

    /// The fence `token` came back: everything this node sent to the old address has reached
    /// the new home; send there directly from now on, held tells first.
    fn switched(self: &Rc<Self>, token: u64) {
        let Some(old) = self.fences.borrow_mut().remove(&token) else {
            return;
        };
        let route = self.routes.borrow_mut().remove(&old);
        let Some(Route::Switching { to, held }) = route else {
            return;
        };
        self.routes
            .borrow_mut()
            .insert(old, Route::Direct(to.0, to.1));
        for msg in held {
            self.tell_bytes(to, msg);
        }
        for w in self.route_waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// An encoded tell to `(node, id)`, which may be an actor of this node.
    fn tell_bytes(self: &Rc<Self>, (node, id): (usize, u64), msg: Vec<u8>) {
        if node == self.rank {
            let e = self.exported.borrow().get(&id).cloned();
            if let Some(e) = e {
                let _ = e.deliver(&msg, None, self);
            }
        } else {
            self.send(node, Wire::Tell { to: id, msg });
        }
    }

    /// Where a reference to `(node, id)` should send now: its own address, a moved actor's
    /// new one, or `None` while the switch is under way.
    fn route(&self, node: usize, id: u64) -> Option<(usize, u64)> {
        match self.routes.borrow().get(&(node, id)) {
            None => Some((node, id)),
            Some(Route::Direct(n, i)) => Some((*n, *i)),
            Some(Route::Switching { .. }) => None,
        }
    }

    /// `node` is gone: fail what waits on it, once.
    fn node_down(&self, node: usize, _why: &str) {
        let Some(Some(p)) = self.peers.get(node) else {
            return;
        };
        if p.down.replace(true) {
            return;
        }
        self.pending.borrow_mut().retain(|_, (n, _)| *n != node);
        let gone: Vec<Rc<Exit>> = {
            let mut w = self.watching.borrow_mut();
            let keys: Vec<u64> = w
                .iter()
                .filter(|(_, (n, _))| *n == node)
                .map(|(k, _)| *k)
                .collect();
            keys.iter()
                .filter_map(|k| w.remove(k))
                .map(|(_, e)| e)
                .collect()
        };
        for e in gone {
            e.set(ExitReason::NoConnection);
        }
        // Its monitors of this node's actors go: nobody is left to tell.
        for watchers in self.monitored.borrow_mut().values_mut() {
            watchers.retain(|(n, _)| *n != node);
        }
        p.monitors.set(0);
        self.downs.borrow_mut().push(node);
        for w in self.down_waiters.borrow_mut().drain(..) {
            w.wake();
        }
        // Disconnect it: a node this one no longer talks to learns so at once (its side of
        // the connection fails, and it declares this one down in turn), instead of waiting
        // for answers this node would drop. Down stays down for both, as in OTP.
        if let Some(Some(ep)) = self.links.get(node) {
            ep.close();
        }
    }
}

async fn heartbeats(sys: Weak<Sys>, opts: SystemOptions) {
    let deadline = opts.heartbeat * opts.misses;
    let mut tick = time::interval(opts.heartbeat);
    loop {
        tick.tick().await;
        let Some(sys) = sys.upgrade() else { break };
        let now = Instant::now();
        for (j, p) in sys.peers.iter().enumerate() {
            let Some(p) = p else { continue };
            if p.down.get() {
                continue;
            }
            if opts.detector == Detector::Heartbeats
                && now.duration_since(p.last_heard.get()) > deadline
            {
                sys.node_down(j, "no heartbeat");
                continue;
            }
            sys.send(j, Wire::Heartbeat);
        }
    }
}

/// An actor on another node.
pub(crate) struct RemoteRef<A: Actor> {
    sys: Weak<Sys>,
    pub(crate) node: usize,
    pub(crate) id: u64,
    exit: Rc<Exit>,
    mref: Cell<Option<u64>>,
    /// How its messages and replies cross the wire (fixed where `A` is known to be serde).
    tell: fn(&Sys, usize, u64, &A::Msg) -> Result<()>,
    enc: fn(&A::Msg) -> Result<Vec<u8>>,
    dec: fn(&[u8]) -> Result<A::Reply>,
    dec_msg: fn(&[u8]) -> Result<A::Msg>,
    enc_reply: fn(&A::Reply) -> Result<Vec<u8>>,
}

impl<A: Actor> RemoteRef<A> {
    fn sys(&self) -> Result<Rc<Sys>> {
        self.sys
            .upgrade()
            .ok_or_else(|| Error::Invalid("the actor system was dropped".into()))
    }

    pub(crate) fn tell(&self, msg: &A::Msg) -> Result<()> {
        let sys = self.sys()?;
        if !sys.routes.borrow().is_empty() {
            let mut routes = sys.routes.borrow_mut();
            match routes.get_mut(&(self.node, self.id)) {
                None => {}
                Some(Route::Switching { held, .. }) => {
                    held.push((self.enc)(msg)?);
                    return Ok(());
                }
                Some(Route::Direct(n, i)) => {
                    let to = (*n, *i);
                    drop(routes);
                    if to.0 == sys.rank {
                        sys.tell_bytes(to, (self.enc)(msg)?);
                        return Ok(());
                    }
                    return (self.tell)(&sys, to.0, to.1, msg);
                }
            }
        }
        if sys.is_down(self.node) {
            return Err(Error::PeerGone(format!("node {} is down", self.node)));
        }
        (self.tell)(&sys, self.node, self.id, msg)
    }

    pub(crate) async fn ask(&self, msg: &A::Msg, timeout: Duration) -> Result<A::Reply> {
        let sys = self.sys()?;
        let bytes = (self.enc)(msg)?;
        let asked = async {
            // While this node switches to a moved actor's new address, wait: the tells it
            // holds go first.
            let (node, to) = std::future::poll_fn(|cx| match sys.route(self.node, self.id) {
                Some(r) => Poll::Ready(r),
                None => {
                    sys.route_waiters.borrow_mut().push(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            if node == sys.rank {
                // It moved here.
                let local = sys
                    .refs
                    .borrow()
                    .get(&to)
                    .and_then(|r| r.downcast_ref::<ActorRef<A>>().cloned())
                    .ok_or_else(|| Error::Exited("no such actor (noproc)".into()))?;
                // (Boxed: `ActorRef::ask` is what called this.)
                let asked: std::pin::Pin<Box<dyn std::future::Future<Output = Result<A::Reply>>>> =
                    Box::pin(local.ask((self.dec_msg)(&bytes)?, timeout));
                let reply = asked.await?;
                return (self.enc_reply)(&reply);
            }
            sys.request(node, |req| Wire::Ask {
                to,
                req,
                msg: bytes,
            })
            .await
        };
        match time::timeout(timeout, asked).await {
            Ok(Ok(b)) => (self.dec)(&b),
            Ok(Err(Error::Refused(m))) => Err(Error::Exited(m)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Timeout(format!("no reply within {timeout:?}"))),
        }
    }

    pub(crate) fn exit_signal(&self, reason: ExitReason, kill: bool) {
        if let Ok(sys) = self.sys() {
            sys.send(
                self.node,
                Wire::Exit {
                    to: self.id,
                    reason,
                    kill,
                },
            );
        }
    }

    /// The exit cell, with a monitor on the actor's node placed the first time.
    pub(crate) fn monitored_exit(&self) -> Rc<Exit> {
        if self.mref.get().is_none() {
            if let Ok(sys) = self.sys() {
                let mref = sys.id();
                self.mref.set(Some(mref));
                if sys.is_down(self.node) {
                    self.exit.set(ExitReason::NoConnection);
                } else {
                    sys.watching
                        .borrow_mut()
                        .insert(mref, (self.node, self.exit.clone()));
                    sys.send(
                        self.node,
                        Wire::Monitor {
                            target: self.id,
                            mref,
                        },
                    );
                }
            }
        }
        self.exit.clone()
    }
}

#[cfg(test)]
mod tests {
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
