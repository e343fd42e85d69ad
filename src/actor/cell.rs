//! One actor: its task, its mailbox, the reference others hold, and how it ends.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use barewire_engine::sync::{mpsc, oneshot};
use barewire_engine::{spawn_local, time, JoinHandle};

use super::core::{CoreRef, Envelope as CoreEnvelope};
use super::system::RemoteRef;
use super::{Actor, ExitReason};
use crate::error::{Error, Result};

pub(crate) enum Envelope<A: Actor> {
    Tell(A::Msg),
    Ask(A::Msg, oneshot::Sender<A::Reply>),
    Stop(ExitReason),
    /// Stop taking messages and hand the actor over (it is moving to another node).
    Freeze(oneshot::Sender<A>),
}

/// Where a local actor's messages go while and after it moves to another node.
pub(crate) enum Moving<A: Actor> {
    /// It is here.
    No,
    /// It is being moved: messages wait here, in order, until it has arrived.
    Holding(Vec<Envelope<A>>),
    /// It lives there now: messages are forwarded.
    Moved(ActorRef<A>),
}

/// How an actor ended, for whoever waits on it (its supervisor, monitors).
#[derive(Default)]
pub(crate) struct Exit {
    reason: RefCell<Option<ExitReason>>,
    waiters: RefCell<Vec<Waker>>,
}

impl Exit {
    pub(crate) fn set(&self, r: ExitReason) {
        if self.reason.borrow().is_some() {
            return;
        }
        *self.reason.borrow_mut() = Some(r);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub(crate) fn get(&self) -> Option<ExitReason> {
        self.reason.borrow().clone()
    }

    pub(crate) fn poll_exit(&self, cx: &mut std::task::Context<'_>) -> Poll<ExitReason> {
        match self.get() {
            Some(r) => Poll::Ready(r),
            None => {
                self.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

pub(crate) struct Shared<A: Actor> {
    tx: mpsc::Sender<Envelope<A>>,
    exit: Rc<Exit>,
    task: RefCell<Option<JoinHandle<()>>>,
    pub(crate) moving: RefCell<Moving<A>>,
}

/// A reference to an actor, wherever it runs: on this core, or on another node of an
/// [`ActorSystem`](super::ActorSystem). Cheap to clone; the same methods either way.
///
/// ```
/// use barewire::actor::{spawn, Actor, Context, ExitReason};
/// use std::time::Duration;
///
/// struct Echo;
/// impl Actor for Echo {
///     type Msg = String;
///     type Reply = String;
///     async fn handle(&mut self, msg: String, _: &Context<Self>) -> String {
///         msg
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let echo = spawn(Echo);
/// let again = echo.clone(); // the same actor
/// assert!(again.same(&echo));
/// let back = again.ask("hi".into(), Duration::from_secs(1)).await.unwrap();
/// assert_eq!(back, "hi");
/// echo.stop(ExitReason::Shutdown);
/// assert_eq!(again.wait().await, ExitReason::Shutdown);
/// assert!(again.tell("late".into()).is_err()); // it is gone
/// # });
/// ```
pub struct ActorRef<A: Actor> {
    kind: Kind<A>,
}

impl<A: Actor> std::fmt::Debug for ActorRef<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Local(s) => write!(
                f,
                "ActorRef<{}>(local {:p})",
                std::any::type_name::<A>(),
                Rc::as_ptr(s)
            ),
            Kind::Core(c) => write!(
                f,
                "ActorRef<{}>(core {})",
                std::any::type_name::<A>(),
                c.core
            ),
            Kind::Remote(r) => write!(
                f,
                "ActorRef<{}>(node {}, id {})",
                std::any::type_name::<A>(),
                r.node,
                r.id
            ),
        }
    }
}

enum Kind<A: Actor> {
    Local(Rc<Shared<A>>),
    Core(Rc<CoreRef<A>>),
    Remote(Rc<RemoteRef<A>>),
}

impl<A: Actor> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef {
            kind: match &self.kind {
                Kind::Local(s) => Kind::Local(s.clone()),
                Kind::Core(c) => Kind::Core(c.clone()),
                Kind::Remote(r) => Kind::Remote(r.clone()),
            },
        }
    }
}

/// What a handler sees of its own actor.
///
/// ```
/// use barewire::actor::{spawn, Actor, Context, ExitReason};
///
/// /// Counts down, then stops itself.
/// struct Countdown(u32);
/// impl Actor for Countdown {
///     type Msg = ();
///     type Reply = ();
///     async fn handle(&mut self, _: (), ctx: &Context<Self>) {
///         self.0 -= 1;
///         if self.0 == 0 {
///             ctx.stop(ExitReason::Normal); // once this handler returns
///         } else {
///             ctx.myself().tell(()).unwrap(); // a message to itself, after any already queued
///         }
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let c = spawn(Countdown(3));
/// c.tell(()).unwrap();
/// assert_eq!(c.wait().await, ExitReason::Normal);
/// # });
/// ```
pub struct Context<A: Actor> {
    myself: ActorRef<A>,
    stop: RefCell<Option<ExitReason>>,
}

impl<A: Actor> Context<A> {
    /// A reference to this actor.
    pub fn myself(&self) -> &ActorRef<A> {
        &self.myself
    }

    /// Ends this actor with `reason` once the current handler returns.
    pub fn stop(&self, reason: ExitReason) {
        *self.stop.borrow_mut() = Some(reason);
    }
}

/// Starts `actor` as a task of this core.
///
/// ```
/// use barewire::actor::{spawn, Actor, Context};
/// use std::time::Duration;
///
/// struct Sum(u64);
/// impl Actor for Sum {
///     type Msg = u64;
///     type Reply = u64;
///     async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
///         self.0 += n;
///         self.0
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let sum = spawn(Sum(0));
/// for n in 1..=4 {
///     sum.tell(n).unwrap(); // in order, per sender
/// }
/// assert_eq!(sum.ask(0, Duration::from_secs(1)).await.unwrap(), 10);
/// # });
/// ```
pub fn spawn<A: Actor>(actor: A) -> ActorRef<A> {
    let (tx, rx) = mpsc::unbounded();
    let shared = Rc::new(Shared {
        tx,
        exit: Rc::new(Exit::default()),
        task: RefCell::new(None),
        moving: RefCell::new(Moving::No),
    });
    let me = ActorRef {
        kind: Kind::Local(shared.clone()),
    };
    let ctx = Context {
        myself: me.clone(),
        stop: RefCell::new(None),
    };
    let exit = shared.exit.clone();
    let task = spawn_local(async move {
        // Anything else of the actor's that panics (its `Drop`, say) ends it the same way, so
        // its exit is always known.
        let end = catch(run(actor, rx, &ctx)).await.unwrap_or_else(End::Exit);
        // The context holds a reference to this actor: drop the mailbox with it.
        drop(ctx);
        match end {
            End::Exit(reason) => exit.set(reason),
            // Moving: the actor goes to whoever froze it; its exit will be the moved one's.
            End::Frozen(actor, to) => {
                let _ = to.send(actor);
            }
        }
    });
    *shared.task.borrow_mut() = Some(task);
    me
}

enum End<A: Actor> {
    Exit(ExitReason),
    Frozen(A, oneshot::Sender<A>),
}

async fn run<A: Actor>(
    mut actor: A,
    mut rx: mpsc::Receiver<Envelope<A>>,
    ctx: &Context<A>,
) -> End<A> {
    if let Err(p) = catch(actor.started(ctx)).await {
        return End::Exit(p);
    }
    let reason = loop {
        let Some(env) = rx.recv().await else {
            break ExitReason::Normal;
        };
        let outcome = match env {
            Envelope::Tell(m) => catch(actor.handle(m, ctx)).await.map(drop),
            Envelope::Ask(m, reply) => catch(actor.handle(m, ctx)).await.map(|r| {
                let _ = reply.send(r);
            }),
            Envelope::Stop(r) => break r,
            Envelope::Freeze(to) => return End::Frozen(actor, to),
        };
        if let Err(p) = outcome {
            break p;
        }
        if let Some(r) = ctx.stop.borrow_mut().take() {
            break r;
        }
    };
    // A panic in `stopped` is the exit reason, as an exception in an OTP `terminate` is.
    End::Exit(catch_now(|| actor.stopped(&reason)).map_or_else(|panic| panic, |()| reason))
}

/// Runs `f` as an actor's code (see `in_handler`); a panic inside becomes
/// `ExitReason::Panic` with its message.
fn catch_now<R>(f: impl FnOnce() -> R) -> Result<R, ExitReason> {
    IN_HANDLER.with(|n| n.set(n.get() + 1));
    let r = std::panic::catch_unwind(AssertUnwindSafe(f));
    IN_HANDLER.with(|n| n.set(n.get() - 1));
    r.map_err(|p| ExitReason::Panic(panic_message(&*p)))
}

thread_local! {
    /// Handlers being polled on this thread, nested (see `super::panics`).
    static IN_HANDLER: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether a panic now comes from an actor's code (a handler, `started`, `stopped`, or a
/// task run through `catch`).
pub(crate) fn in_handler() -> bool {
    IN_HANDLER.with(|n| n.get() > 0)
}

/// The message a panic was raised with (its payload, when that is a string).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Runs `f` to completion; a panic inside becomes `ExitReason::Panic` with its message.
pub(crate) async fn catch<F: Future>(f: F) -> Result<F::Output, ExitReason> {
    let mut f = std::pin::pin!(f);
    poll_fn(|cx| match catch_now(|| Pin::as_mut(&mut f).poll(cx)) {
        Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
        Ok(Poll::Pending) => Poll::Pending,
        Err(panic) => Poll::Ready(Err(panic)),
    })
    .await
}

impl<A: Actor> ActorRef<A> {
    pub(crate) fn on_core(c: CoreRef<A>) -> ActorRef<A> {
        ActorRef {
            kind: Kind::Core(Rc::new(c)),
        }
    }

    pub(crate) fn remote(r: RemoteRef<A>) -> ActorRef<A> {
        ActorRef {
            kind: Kind::Remote(Rc::new(r)),
        }
    }

    fn send(shared: &Shared<A>, env: Envelope<A>) -> Result<()> {
        if let Some(r) = shared.exit.get() {
            return Err(Error::Exited(r.to_string()));
        }
        match &mut *shared.moving.borrow_mut() {
            Moving::No => {}
            Moving::Holding(held) => {
                held.push(env);
                return Ok(());
            }
            Moving::Moved(there) => return forward(there, env),
        }
        shared
            .tx
            .try_send(env)
            .map_err(|_| Error::Exited("its mailbox is closed".into()))
    }

    /// Sends `msg`; messages from one sender to one actor are handled in the order sent.
    pub fn tell(&self, msg: A::Msg) -> Result<()> {
        match &self.kind {
            Kind::Local(s) => Self::send(s, Envelope::Tell(msg)),
            Kind::Core(c) => c.send(CoreEnvelope::Tell(msg)),
            Kind::Remote(r) => r.tell(&msg),
        }
    }

    /// Sends `msg` and waits for the handler's reply, at most `timeout`.
    pub async fn ask(&self, msg: A::Msg, timeout: Duration) -> Result<A::Reply> {
        let s = match &self.kind {
            Kind::Local(s) => s,
            Kind::Core(c) => return c.ask(msg, timeout).await,
            Kind::Remote(r) => return r.ask(&msg, timeout).await,
        };
        let (tx, rx) = oneshot::channel();
        Self::send(s, Envelope::Ask(msg, tx))?;
        self.await_reply(rx, timeout).await
    }

    pub(crate) async fn await_reply(
        &self,
        rx: oneshot::Receiver<A::Reply>,
        timeout: Duration,
    ) -> Result<A::Reply> {
        match time::timeout(timeout, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(Error::Exited(
                self.exit_reason()
                    .map_or("it exited before replying".into(), |r| r.to_string()),
            )),
            Err(_) => Err(Error::Timeout(format!("no reply within {timeout:?}"))),
        }
    }

    /// For a local actor: queues an ask and hands back where its reply will come.
    pub(crate) fn ask_local(&self, msg: A::Msg) -> Result<oneshot::Receiver<A::Reply>> {
        let Kind::Local(s) = &self.kind else {
            return Err(Error::Invalid("not a local actor".into()));
        };
        let (tx, rx) = oneshot::channel();
        Self::send(s, Envelope::Ask(msg, tx))?;
        Ok(rx)
    }

    /// Asks it to stop with `reason` after the messages already in its mailbox.
    pub fn stop(&self, reason: ExitReason) {
        match &self.kind {
            Kind::Local(s) => {
                let _ = Self::send(s, Envelope::Stop(reason));
            }
            Kind::Core(c) => {
                let _ = c.send(CoreEnvelope::Stop(reason));
            }
            Kind::Remote(r) => r.exit_signal(reason, false),
        }
    }

    /// Ends it now: its task is dropped at its next scheduling point, `stopped` does not run,
    /// and its exit reason is `Killed`.
    pub fn kill(&self) {
        self.exit_with(ExitReason::Killed)
    }

    /// Ends it now with `reason` (an exit signal, as a linked actor's abnormal exit sends):
    /// its task is dropped at its next scheduling point and `stopped` does not run.
    pub fn exit_with(&self, reason: ExitReason) {
        match &self.kind {
            Kind::Local(s) => {
                if let Some(t) = &*s.task.borrow() {
                    t.cancel();
                }
                s.exit.set(reason);
            }
            Kind::Core(c) => {
                let _ = c.send(CoreEnvelope::Exit(reason));
            }
            Kind::Remote(r) => r.exit_signal(reason, true),
        }
    }

    /// How it ended, once it has (for a remote actor: once this node has heard, which
    /// [`wait`](Self::wait) arranges).
    pub fn exit_reason(&self) -> Option<ExitReason> {
        self.exit_cell().get()
    }

    /// Waits until it ends; its exit reason. For a remote actor this monitors it: its node
    /// reports the exit, and a node that goes down gives `NoConnection`.
    pub async fn wait(&self) -> ExitReason {
        let exit = self.exit_cell();
        poll_fn(|cx| exit.poll_exit(cx)).await
    }

    pub(crate) fn exit_cell(&self) -> Rc<Exit> {
        match &self.kind {
            Kind::Local(s) => s.exit.clone(),
            Kind::Core(c) => c.exit.clone(),
            Kind::Remote(r) => r.monitored_exit(),
        }
    }

    /// True when both refer to the same actor.
    pub fn same(&self, other: &ActorRef<A>) -> bool {
        match (&self.kind, &other.kind) {
            (Kind::Local(a), Kind::Local(b)) => Rc::ptr_eq(a, b),
            (Kind::Core(a), Kind::Core(b)) => Rc::ptr_eq(a, b),
            (Kind::Remote(a), Kind::Remote(b)) => a.node == b.node && a.id == b.id,
            _ => false,
        }
    }

    /// Messages waiting in its mailbox (Erlang's `message_queue_len`), for an actor of this
    /// core that has not moved away: the handler's current message is no longer counted, and
    /// messages held while it is being moved are. For an actor of another core of this
    /// process ([`spawn_on_core`](super::spawn_on_core)), the messages waiting on this core to
    /// cross to it (its core takes them only while its mailbox is short). `None` for an actor
    /// on another node.
    ///
    /// ```
    /// use barewire::actor::{spawn, Actor, Context};
    /// struct Idle;
    /// impl Actor for Idle {
    ///     type Msg = u32;
    ///     type Reply = ();
    ///     async fn handle(&mut self, _: u32, _: &Context<Self>) {}
    /// }
    /// # barewire::engine::Runtime::builder().cores(1).pin(false).build().unwrap().block_on(async {
    /// let a = spawn(Idle);
    /// a.tell(1).unwrap();
    /// a.tell(2).unwrap();
    /// assert_eq!(a.queued(), Some(2)); // it has not run yet
    /// # });
    /// ```
    pub fn queued(&self) -> Option<usize> {
        let s = match &self.kind {
            Kind::Local(s) => s,
            Kind::Core(c) => return Some(c.queued()),
            Kind::Remote(_) => return None,
        };
        match &*s.moving.borrow() {
            Moving::No => Some(s.tx.len()),
            Moving::Holding(held) => Some(s.tx.len() + held.len()),
            Moving::Moved(_) => None,
        }
    }

    /// Waits until this core's actor's mailbox holds fewer than `below` messages (at once for
    /// an actor elsewhere, or one that has moved away or exited).
    pub(crate) async fn mailbox_room(&self, below: usize) {
        if let Kind::Local(s) = &self.kind {
            while matches!(*s.moving.borrow(), Moving::No) && s.tx.len() >= below {
                s.tx.room(below).await;
            }
        }
    }

    /// The rank of the node it runs on, for a remote actor; `None` for one of this process.
    pub fn node(&self) -> Option<usize> {
        match &self.kind {
            Kind::Local(_) | Kind::Core(_) => None,
            Kind::Remote(r) => Some(r.node),
        }
    }

    /// The core of this process it runs on, for an actor of another core (`None` otherwise).
    pub fn core(&self) -> Option<usize> {
        match &self.kind {
            Kind::Core(c) => Some(c.core),
            _ => None,
        }
    }
}

/// Links two actors, wherever each runs, as Erlang's `link`: when either exits abnormally
/// (anything but `Normal` or `Shutdown`, `NoConnection` included when its node goes down), the
/// other is made to exit with the same reason.
///
/// ```
/// use barewire::actor::{link, spawn, Actor, Context, ExitReason};
///
/// struct Worker;
/// impl Actor for Worker {
///     type Msg = bool;
///     type Reply = ();
///     async fn handle(&mut self, fail: bool, _: &Context<Self>) {
///         assert!(!fail, "told to fail");
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let (a, b) = (spawn(Worker), spawn(Worker));
/// link(&a, &b);
/// a.tell(true).unwrap(); // a panics...
/// // ...and b exits with the same reason.
/// assert!(matches!(b.wait().await, ExitReason::Panic(m) if m.contains("told to fail")));
/// # });
/// ```
pub fn link<A: Actor, B: Actor>(a: &ActorRef<A>, b: &ActorRef<B>) {
    propagate(a.clone(), b.clone());
    propagate(b.clone(), a.clone());
}

fn propagate<A: Actor, B: Actor>(from: ActorRef<A>, to: ActorRef<B>) {
    // Detached: it ends when `from` does.
    drop(spawn_local(async move {
        let r = from.wait().await;
        if r.is_abnormal() && to.exit_reason().is_none() {
            to.exit_with(r);
        }
    }));
}

/// Sends what was meant for a moved actor to where it lives now (an ask's reply goes back to
/// the asker's oneshot).
pub(crate) fn forward<A: Actor>(there: &ActorRef<A>, env: Envelope<A>) -> Result<()> {
    match env {
        Envelope::Tell(m) => there.tell(m),
        Envelope::Ask(m, reply) => {
            let there = there.clone();
            drop(spawn_local(async move {
                if let Ok(r) = there.ask(m, Duration::from_secs(3600)).await {
                    let _ = reply.send(r);
                }
            }));
            Ok(())
        }
        Envelope::Stop(r) => {
            there.stop(r);
            Ok(())
        }
        Envelope::Freeze(_) => Err(Error::Invalid("it has already moved".into())),
    }
}

impl<A: Actor> ActorRef<A> {
    /// For a local actor: stops it taking messages once those already queued are handled,
    /// holds whatever comes meanwhile, and hands the actor over.
    pub(crate) async fn freeze(&self) -> Result<A> {
        let Kind::Local(s) = &self.kind else {
            return Err(Error::Invalid("only an actor of this node can move".into()));
        };
        let (tx, rx) = oneshot::channel();
        Self::send(s, Envelope::Freeze(tx))?;
        *s.moving.borrow_mut() = Moving::Holding(Vec::new());
        rx.await.map_err(|_| {
            *s.moving.borrow_mut() = Moving::No;
            Error::Exited("it exited before it could move".into())
        })
    }

    /// For a local actor that moved to another node: its address there.
    pub(crate) fn moved_addr(&self) -> Option<(usize, u64)> {
        let Kind::Local(s) = &self.kind else {
            return None;
        };
        match &*s.moving.borrow() {
            Moving::Moved(there) => match &there.kind {
                Kind::Remote(r) => Some((r.node, r.id)),
                _ => None,
            },
            _ => None,
        }
    }

    /// For a local actor that froze: it now lives at `there`; what was held goes there first,
    /// then everything later; its exit becomes the moved actor's.
    pub(crate) fn moved_to(&self, there: ActorRef<A>) {
        let Kind::Local(s) = &self.kind else { return };
        let held =
            match std::mem::replace(&mut *s.moving.borrow_mut(), Moving::Moved(there.clone())) {
                Moving::Holding(h) => h,
                _ => Vec::new(),
            };
        for env in held {
            let _ = forward(&there, env);
        }
        let exit = s.exit.clone();
        drop(spawn_local(async move {
            exit.set(there.wait().await);
        }));
    }
}
