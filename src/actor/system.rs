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
//! A connection that fails is also taken as down at once.

use std::any::type_name;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use barewire_engine::sync::{mpsc, oneshot};
use barewire_engine::{spawn_local, time, JoinHandle};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::cell::{ActorRef, Exit};
use super::{spawn, Actor, ExitReason};
use crate::channel::ChannelOptions;
use crate::error::{Error, Result};
use crate::mesh::Mesh;

/// An actor whose messages and replies can cross nodes (any actor whose types are serde).
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

/// Node-down detection and the peer channels' shape.
#[derive(Debug, Clone, Copy)]
pub struct SystemOptions {
    /// How often this node tells each peer it is alive. Default 10 ms.
    pub heartbeat: Duration,
    /// Heartbeat periods without a word from a peer before it is declared down. Default 5.
    pub misses: u32,
    /// Largest encoded message, in bytes. Default 4096.
    pub max_message: usize,
}

impl Default for SystemOptions {
    fn default() -> Self {
        SystemOptions {
            heartbeat: Duration::from_millis(10),
            misses: 5,
            max_message: 4096,
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
}

/// What an actor's messages and replies are, as the wire checks them.
fn fingerprint<A: Actor>() -> String {
    format!("{} -> {}", type_name::<A::Msg>(), type_name::<A::Reply>())
}

fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_bare::to_vec(v).map_err(|e| Error::Malformed(format!("encoding: {e}")))
}

fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T> {
    serde_bare::from_slice(b).map_err(|e| Error::Malformed(format!("decoding: {e}")))
}

/// A local actor reachable from other nodes.
trait Exported {
    fn deliver(&self, msg: &[u8], reply: Option<(usize, u64)>, sys: &Rc<Sys>) -> Result<()>;
    fn exit(&self) -> Rc<Exit>;
    fn fingerprint(&self) -> String;
    fn signal(&self, reason: ExitReason, kill: bool);
}

struct Export<A: RemoteActor>(ActorRef<A>);

impl<A: RemoteActor> Exported for Export<A> {
    fn deliver(&self, msg: &[u8], reply: Option<(usize, u64)>, sys: &Rc<Sys>) -> Result<()> {
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
}

type Factory = Rc<dyn Fn(&Rc<Sys>, &[u8]) -> Result<u64>>;
type ReplyTo = oneshot::Sender<std::result::Result<Vec<u8>, String>>;

struct Peer {
    out: mpsc::Sender<Wire>,
    last_heard: Cell<Instant>,
    down: Cell<bool>,
}

pub(crate) struct Sys {
    rank: usize,
    peers: Vec<Option<Peer>>,
    /// Actors of this node that others may reach, by id: the wire side, and the `ActorRef`
    /// itself (for handing back refs to this node's own actors).
    exported: RefCell<HashMap<u64, Rc<dyn Exported>>>,
    refs: RefCell<HashMap<u64, Rc<dyn std::any::Any>>>,
    names: RefCell<HashMap<String, u64>>,
    kinds: RefCell<HashMap<String, (String, Factory)>>,
    /// Requests waiting for their reply: id -> (node asked, where the reply goes).
    pending: RefCell<HashMap<u64, (usize, ReplyTo)>>,
    /// Monitors this node placed on other nodes' actors: monitor ref -> (node, exit cell).
    watching: RefCell<HashMap<u64, (usize, Rc<Exit>)>>,
    next: Cell<u64>,
    downs: RefCell<Vec<usize>>,
    down_waiters: RefCell<Vec<Waker>>,
    tasks: RefCell<Vec<JoinHandle<()>>>,
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
        let rank = mesh.rank();
        let copts = ChannelOptions::new(256, opts.max_message);
        let mut chans = Vec::new();
        let opens: Vec<_> = (0..mesh.size())
            .filter(|j| *j != rank)
            .map(|j| mesh.endpoint(j).open_bare_channel::<Wire>(copts))
            .collect();
        for c in crate::join::try_join_all(opens).await? {
            chans.push(Some(c));
        }
        chans.insert(rank, None);
        let mut peers = Vec::new();
        let mut outs = Vec::new();
        for c in &chans {
            if c.is_some() {
                let (tx, rx) = mpsc::unbounded();
                peers.push(Some(Peer {
                    out: tx,
                    last_heard: Cell::new(Instant::now()),
                    down: Cell::new(false),
                }));
                outs.push(Some(rx));
            } else {
                peers.push(None);
                outs.push(None);
            }
        }
        let sys = Rc::new(Sys {
            rank,
            peers,
            exported: RefCell::default(),
            refs: RefCell::default(),
            names: RefCell::default(),
            kinds: RefCell::default(),
            pending: RefCell::default(),
            watching: RefCell::default(),
            next: Cell::new(1),
            downs: RefCell::default(),
            down_waiters: RefCell::default(),
            tasks: RefCell::default(),
        });
        let mut tasks = Vec::new();
        for (j, (c, out)) in chans.into_iter().zip(outs).enumerate() {
            let (Some((tx, rx)), Some(mut out)) = (c, out) else {
                continue;
            };
            // The pump: this node's messages to `j`, in order.
            tasks.push(spawn_local(async move {
                while let Some(w) = out.recv().await {
                    if tx.send(&w).await.is_err() {
                        break;
                    }
                }
            }));
            let weak = Rc::downgrade(&sys);
            tasks.push(spawn_local(async move {
                loop {
                    let r = rx.recv().await;
                    let Some(sys) = weak.upgrade() else { break };
                    match r {
                        Ok(w) => sys.dispatch(j, w),
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

    fn export<A: RemoteActor>(&self, actor: &ActorRef<A>) -> Result<u64> {
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
        Ok(id)
    }

    fn kind<A: RemoteActor>(&self, kind: &str) -> Result<Factory> {
        let kinds = self.kinds.borrow();
        let (fp, f) = kinds
            .get(kind)
            .ok_or_else(|| Error::Invalid(format!("no actor kind {kind:?} registered")))?;
        if *fp != fingerprint::<A>() {
            return Err(Error::TypeMismatch {
                expected: fingerprint::<A>(),
                found: fp.clone(),
            });
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
            enc: encode::<A::Msg>,
            dec: decode::<A::Reply>,
        })
    }

    fn send(&self, node: usize, w: Wire) {
        if let Some(Some(p)) = self.peers.get(node) {
            if !p.down.get() {
                let _ = p.out.try_send(w);
            }
        }
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
        self.send(node, make(req));
        match rx.await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => Err(Error::Refused(e)),
            Err(_) => Err(Error::PeerGone(format!("node {node} is down"))),
        }
    }

    fn dispatch(self: &Rc<Self>, from: usize, w: Wire) {
        if let Some(Some(p)) = self.peers.get(from) {
            p.last_heard.set(Instant::now());
        }
        match w {
            Wire::Heartbeat => {}
            Wire::Tell { to, msg } => {
                let e = self.exported.borrow().get(&to).cloned();
                if let Some(e) = e {
                    let _ = e.deliver(&msg, None, self);
                }
            }
            Wire::Ask { to, req, msg } => {
                let e = self.exported.borrow().get(&to).cloned();
                let r = match e {
                    Some(e) => e.deliver(&msg, Some((from, req)), self),
                    None => Err(Error::Exited("no such actor (noproc)".into())),
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
                    None => self.send(
                        from,
                        Wire::Down {
                            mref,
                            reason: ExitReason::Error("noproc".into()),
                        },
                    ),
                    Some(e) => {
                        let exit = e.exit();
                        let sys = Rc::downgrade(self);
                        spawn_local(async move {
                            let reason = std::future::poll_fn(|cx| exit.poll_exit(cx)).await;
                            if let Some(sys) = sys.upgrade() {
                                sys.send(from, Wire::Down { mref, reason });
                            }
                        });
                    }
                }
            }
            Wire::Down { mref, reason } => {
                if let Some((_, exit)) = self.watching.borrow_mut().remove(&mref) {
                    exit.set(reason);
                }
            }
            Wire::Exit { to, reason, kill } => {
                let e = self.exported.borrow().get(&to).cloned();
                if let Some(e) = e {
                    e.signal(reason, kill);
                }
            }
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
        self.downs.borrow_mut().push(node);
        for w in self.down_waiters.borrow_mut().drain(..) {
            w.wake();
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
            if now.duration_since(p.last_heard.get()) > deadline {
                sys.node_down(j, "no heartbeat");
                continue;
            }
            let _ = p.out.try_send(Wire::Heartbeat);
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
    enc: fn(&A::Msg) -> Result<Vec<u8>>,
    dec: fn(&[u8]) -> Result<A::Reply>,
}

impl<A: Actor> RemoteRef<A> {
    fn sys(&self) -> Result<Rc<Sys>> {
        self.sys
            .upgrade()
            .ok_or_else(|| Error::Invalid("the actor system was dropped".into()))
    }

    pub(crate) fn tell(&self, msg: &A::Msg) -> Result<()> {
        let sys = self.sys()?;
        if sys.is_down(self.node) {
            return Err(Error::PeerGone(format!("node {} is down", self.node)));
        }
        sys.send(
            self.node,
            Wire::Tell {
                to: self.id,
                msg: (self.enc)(msg)?,
            },
        );
        Ok(())
    }

    pub(crate) async fn ask(&self, msg: &A::Msg, timeout: Duration) -> Result<A::Reply> {
        let sys = self.sys()?;
        let (to, msg) = (self.id, (self.enc)(msg)?);
        match time::timeout(
            timeout,
            sys.request(self.node, |req| Wire::Ask { to, req, msg }),
        )
        .await
        {
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
