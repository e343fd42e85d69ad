//! OTP supervision: children started in order, restarted by strategy and restart type, within
//! a restart intensity, and stopped in reverse order. A child whose start panics (its
//! constructor, say) counts as a child that exited with that panic.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use barewire_engine::{spawn_local, time};

use super::cell::{spawn, ActorRef, Exit};
use super::{Actor, ActorSystem, ExitReason, RemoteActor};

/// Which children a restart takes with it.
///
/// ```
/// use barewire::actor::{whereis, Actor, ChildSpec, Context, Strategy, Supervisor, SupervisorSpec};
///
/// /// Panics on any message.
/// struct Part;
/// impl Actor for Part {
///     type Msg = ();
///     type Reply = ();
///     async fn handle(&mut self, _: (), _: &Context<Self>) {
///         panic!("broken part");
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let children = ["a", "b", "c"].map(|name| ChildSpec::actor(name, || Part));
/// let spec = SupervisorSpec::new(Strategy::RestForOne, children.into());
/// let sup = Supervisor::start(spec).await;
/// // `b` fails: rest_for_one restarts it and `c` (started after it), not `a`.
/// whereis::<Part>("b").unwrap().tell(()).unwrap();
/// while sup.starts("c") != Some(2) {
///     barewire::engine::yield_now().await;
/// }
/// let starts = ["a", "b", "c"].map(|name| sup.starts(name).unwrap());
/// assert_eq!(starts, [1, 2, 2]);
/// sup.stop();
/// # });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// Only the child that exited.
    OneForOne,
    /// Every child: the others are stopped (reverse start order), then all start again.
    OneForAll,
    /// The child and those started after it: those are stopped (reverse order), then it and
    /// they start again.
    RestForOne,
}

/// When a child is restarted.
///
/// ```
/// use barewire::actor::{Actor, ChildSpec, Context, ExitReason, Restart};
/// use barewire::actor::{Strategy, Supervisor, SupervisorSpec};
///
/// /// Finishes its job on the first message.
/// struct Job;
/// impl Actor for Job {
///     type Msg = ();
///     type Reply = ();
///     async fn handle(&mut self, _: (), ctx: &Context<Self>) {
///         ctx.stop(ExitReason::Normal);
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// // A transient child that ends normally is not restarted.
/// let job = ChildSpec::actor("job", || Job).restart(Restart::Transient);
/// let sup = Supervisor::start(SupervisorSpec::new(Strategy::OneForOne, vec![job])).await;
/// let first = barewire::actor::whereis::<Job>("job").unwrap();
/// first.tell(()).unwrap();
/// assert_eq!(first.wait().await, ExitReason::Normal);
/// barewire::engine::time::sleep(std::time::Duration::from_millis(10)).await;
/// assert_eq!(sup.starts("job"), Some(1)); // started once, never again
/// sup.stop();
/// # });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// Always.
    Permanent,
    /// Only after an abnormal exit (anything but `Normal` or `Shutdown`).
    Transient,
    /// Never; and when a sibling's restart stops it, it is removed rather than restarted.
    Temporary,
}

/// A running child, whatever it is (an actor here or on another node, or a supervisor).
pub(crate) struct Child {
    exit: Rc<Exit>,
    stop: Box<dyn Fn()>,
    kill: Box<dyn Fn()>,
    /// Where it runs, for reports (`None`: this node).
    node: Option<usize>,
}

impl Child {
    fn of<A: Actor>(r: &ActorRef<A>) -> Child {
        let (s, k) = (r.clone(), r.clone());
        Child {
            exit: r.exit_cell(),
            stop: Box::new(move || s.stop(ExitReason::Shutdown)),
            kill: Box::new(move || k.kill()),
            node: r.node(),
        }
    }

    fn exited(reason: ExitReason) -> Child {
        let exit = Rc::new(Exit::default());
        exit.set(reason);
        Child {
            exit,
            stop: Box::new(|| {}),
            kill: Box::new(|| {}),
            node: None,
        }
    }
}

/// How to start one child, and how to treat it.
///
/// ```
/// use barewire::actor::{Actor, ChildSpec, Context, Restart, Strategy, SupervisorSpec};
/// use std::time::Duration;
///
/// struct Cache;
/// impl Actor for Cache {
///     type Msg = ();
///     type Reply = ();
///     async fn handle(&mut self, _: (), _: &Context<Self>) {}
/// }
///
/// let cache = ChildSpec::actor("cache", || Cache)
///     .restart(Restart::Transient)
///     .shutdown(Duration::from_millis(500)); // then it is killed
/// assert_eq!((cache.name.as_str(), cache.restart), ("cache", Restart::Transient));
/// // A nested supervisor is a child too, built afresh at every restart.
/// let group = ChildSpec::supervisor("group", || {
///     SupervisorSpec::new(Strategy::OneForAll, vec![ChildSpec::actor("c1", || Cache)])
/// });
/// let top = SupervisorSpec::new(Strategy::OneForOne, vec![cache, group]);
/// assert_eq!(top.children.len(), 2);
/// ```
pub struct ChildSpec {
    /// Its name (also the name an actor child is registered under, see [`whereis`]).
    pub name: String,
    /// When it is restarted.
    pub restart: Restart,
    /// How long it has to stop when asked before it is killed.
    pub shutdown: Duration,
    start: Rc<dyn Fn() -> StartFuture>,
}

type StartFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Child>>>;

impl ChildSpec {
    /// A child actor made by `make` at every (re)start, registered under `name` on this core
    /// while it runs (find it with [`whereis`]). Permanent, 5 s to shut down (OTP's defaults).
    pub fn actor<A: Actor>(name: &str, make: impl Fn() -> A + 'static) -> ChildSpec {
        let n = name.to_string();
        ChildSpec {
            name: name.to_string(),
            restart: Restart::Permanent,
            shutdown: Duration::from_secs(5),
            start: Rc::new(move || {
                let r = spawn(make());
                register(&n, &r);
                Box::pin(std::future::ready(Child::of(&r)))
            }),
        }
    }

    /// A child supervisor, built from `spec` at every (re)start. Permanent, and given as long as
    /// it needs to stop its own children (OTP's `infinity`, here an hour).
    pub fn supervisor(name: &str, spec: impl Fn() -> SupervisorSpec + 'static) -> ChildSpec {
        ChildSpec {
            name: name.to_string(),
            restart: Restart::Permanent,
            shutdown: Duration::from_secs(3600),
            start: Rc::new(move || {
                let spec = spec();
                Box::pin(async move {
                    let s = Supervisor::start(spec).await;
                    let (a, b) = (s.clone(), s.clone());
                    Child {
                        exit: s.state.exit.clone(),
                        stop: Box::new(move || a.stop()),
                        kill: Box::new(move || b.kill()),
                        node: None,
                    }
                })
            }),
        }
    }

    /// A child actor of registered kind `kind` (see
    /// [`ActorSystem::register_kind`](super::ActorSystem::register_kind)), started with `args`
    /// on the first node of `nodes` that is up, at every (re)start: when its node goes down it
    /// exits with `NoConnection`, and its restart places it on a surviving node. Permanent, 5 s
    /// to shut down.
    pub fn remote<A, Args>(
        name: &str,
        sys: &ActorSystem,
        kind: &str,
        args: Args,
        nodes: Vec<usize>,
    ) -> ChildSpec
    where
        A: RemoteActor,
        Args: serde::Serialize + 'static,
    {
        let (sys, kind, args, nodes) =
            (sys.clone(), kind.to_string(), Rc::new(args), Rc::new(nodes));
        ChildSpec {
            name: name.to_string(),
            restart: Restart::Permanent,
            shutdown: Duration::from_secs(5),
            start: Rc::new(move || {
                let (sys, kind, args, nodes) =
                    (sys.clone(), kind.clone(), args.clone(), nodes.clone());
                Box::pin(async move {
                    let mut last = None;
                    for &n in nodes.iter().filter(|n| sys.is_up(**n)) {
                        match sys.spawn_on::<A, Args>(n, &kind, &args).await {
                            Ok(r) => return Child::of(&r),
                            Err(e) => last = Some(e),
                        }
                    }
                    // Nowhere to run: an exit the supervisor counts like any other.
                    Child::exited(ExitReason::Error(match last {
                        Some(e) => format!("could not start {kind}: {e}"),
                        None => format!("could not start {kind}: none of {nodes:?} is up"),
                    }))
                })
            }),
        }
    }

    /// With restart type `r`.
    pub fn restart(mut self, r: Restart) -> ChildSpec {
        self.restart = r;
        self
    }

    /// With `d` to shut down.
    pub fn shutdown(mut self, d: Duration) -> ChildSpec {
        self.shutdown = d;
        self
    }
}

/// A supervisor's shape: its strategy, its restart intensity, and its children in start order.
///
/// ```
/// use barewire::actor::{Actor, ChildSpec, Context, ExitReason, Strategy};
/// use barewire::actor::{Supervisor, SupervisorSpec};
/// use std::time::Duration;
///
/// struct Flaky;
/// impl Actor for Flaky {
///     type Msg = ();
///     type Reply = ();
///     async fn handle(&mut self, _: (), _: &Context<Self>) {
///         panic!("flaky");
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// // At most 2 restarts in a second: the third failure stops the supervisor.
/// let spec = SupervisorSpec::new(Strategy::OneForOne, vec![ChildSpec::actor("f", || Flaky)])
///     .intensity(2, Duration::from_secs(1));
/// let sup = Supervisor::start(spec).await;
/// for _ in 0..3 {
///     let child = loop {
///         if let Some(c) = barewire::actor::whereis::<Flaky>("f") {
///             break c;
///         }
///         barewire::engine::yield_now().await;
///     };
///     child.tell(()).unwrap();
///     child.wait().await;
/// }
/// assert_eq!(sup.wait().await, ExitReason::Shutdown);
/// # });
/// ```
pub struct SupervisorSpec {
    /// Which children a restart takes with it.
    pub strategy: Strategy,
    /// More than this many restarts within `period`...
    pub intensity: u32,
    /// ...and the supervisor gives up: it stops every child and exits with `Shutdown`.
    pub period: Duration,
    /// Started in this order, stopped in the reverse.
    pub children: Vec<ChildSpec>,
}

impl SupervisorSpec {
    /// `strategy` with OTP's default intensity (1 restart in 5 s).
    pub fn new(strategy: Strategy, children: Vec<ChildSpec>) -> SupervisorSpec {
        SupervisorSpec {
            strategy,
            intensity: 1,
            period: Duration::from_secs(5),
            children,
        }
    }

    /// With at most `intensity` restarts in `period`.
    pub fn intensity(mut self, intensity: u32, period: Duration) -> SupervisorSpec {
        self.intensity = intensity;
        self.period = period;
        self
    }
}

struct Slot {
    spec: ChildSpec,
    running: Option<Child>,
    /// A temporary child that exited, or was stopped by a sibling's restart: gone for good.
    removed: bool,
    starts: u64,
}

struct State {
    exit: Rc<Exit>,
    stop: Cell<bool>,
    kill: Cell<bool>,
    waker: RefCell<Option<Waker>>,
    slots: RefCell<Vec<Slot>>,
    restarts: Cell<u64>,
}

/// A running supervisor (a handle: clone it freely).
///
/// ```
/// use barewire::actor::{Actor, ChildSpec, Context, Strategy, Supervisor, SupervisorSpec};
/// struct Worker;
/// impl Actor for Worker {
///     type Msg = ();
///     type Reply = ();
///     async fn handle(&mut self, _: (), _: &Context<Self>) { panic!("boom") }
/// }
/// # barewire::engine::Runtime::builder().cores(1).pin(false).build().unwrap().block_on(async {
/// let sup = Supervisor::start(SupervisorSpec::new(Strategy::OneForOne, vec![
///     ChildSpec::actor("worker", || Worker),
/// ])).await;
/// barewire::actor::whereis::<Worker>("worker").unwrap().tell(()).unwrap(); // it panics...
/// barewire::engine::time::sleep(std::time::Duration::from_millis(5)).await;
/// assert_eq!(sup.starts("worker"), Some(2));                               // ...and is restarted
/// sup.stop();
/// sup.wait().await;
/// # });
/// ```
#[derive(Clone)]
pub struct Supervisor {
    state: Rc<State>,
}

impl Supervisor {
    /// Starts every child, in order (returning once all have started), and supervises them
    /// from a task of this core.
    pub async fn start(spec: SupervisorSpec) -> Supervisor {
        let state = Rc::new(State {
            exit: Rc::new(Exit::default()),
            stop: Cell::new(false),
            kill: Cell::new(false),
            waker: RefCell::new(None),
            slots: RefCell::new(
                spec.children
                    .into_iter()
                    .map(|spec| Slot {
                        spec,
                        running: None,
                        removed: false,
                        starts: 0,
                    })
                    .collect(),
            ),
            restarts: Cell::new(0),
        });
        let n = state.slots.borrow().len();
        for i in 0..n {
            start_child(&state, i).await;
        }
        let s = state.clone();
        spawn_local(async move {
            let reason = supervise(&s, spec.strategy, spec.intensity, spec.period).await;
            s.exit.set(reason);
        });
        Supervisor { state }
    }

    /// Stops every child in reverse start order, then itself (`Shutdown`).
    pub fn stop(&self) {
        self.state.stop.set(true);
        self.wake();
    }

    fn kill(&self) {
        self.state.kill.set(true);
        self.stop();
    }

    fn wake(&self) {
        if let Some(w) = self.state.waker.borrow_mut().take() {
            w.wake();
        }
    }

    /// Waits until it has ended; why.
    pub async fn wait(&self) -> ExitReason {
        poll_fn(|cx| self.state.exit.poll_exit(cx)).await
    }

    /// How it ended, once it has.
    pub fn exit_reason(&self) -> Option<ExitReason> {
        self.state.exit.get()
    }

    /// How many times the child `name` has been started (None: no such child).
    pub fn starts(&self, name: &str) -> Option<u64> {
        self.state
            .slots
            .borrow()
            .iter()
            .find(|s| s.spec.name == name)
            .map(|s| s.starts)
    }

    /// The node child `name` runs on now (`Some(None)`: this node; `None`: not running).
    pub fn node_of(&self, name: &str) -> Option<Option<usize>> {
        self.state
            .slots
            .borrow()
            .iter()
            .find(|s| s.spec.name == name)
            .and_then(|s| s.running.as_ref().map(|c| c.node))
    }

    /// Whether child `name` is running now.
    pub fn is_running(&self, name: &str) -> bool {
        self.state
            .slots
            .borrow()
            .iter()
            .any(|s| s.spec.name == name && s.running.is_some())
    }

    /// Restarts so far (a group restart counts once).
    pub fn restarts(&self) -> u64 {
        self.state.restarts.get()
    }
}

/// Starts child `i`. A start that panics (a constructor, say) gives a child that exited with
/// that panic, which the supervisor treats as any other exit (OTP counts a failed restart the
/// same way): the supervisor itself goes on.
async fn start_child(state: &State, i: usize) {
    let start = state.slots.borrow()[i].spec.start.clone();
    let child = super::cell::catch(async move { start().await })
        .await
        .unwrap_or_else(Child::exited);
    let mut slots = state.slots.borrow_mut();
    slots[i].running = Some(child);
    slots[i].starts += 1;
}

/// Stops running child `i` (asked, then killed after its shutdown time); returns once it has
/// ended.
async fn terminate(state: &State, i: usize) {
    let (exit, grace) = {
        let slots = state.slots.borrow();
        let Some(c) = &slots[i].running else { return };
        if state.kill.get() {
            (c.kill)();
        } else {
            (c.stop)();
        }
        (c.exit.clone(), slots[i].spec.shutdown)
    };
    if time::timeout(grace, poll_fn(|cx| exit.poll_exit(cx)))
        .await
        .is_err()
    {
        if let Some(c) = &state.slots.borrow()[i].running {
            (c.kill)();
        }
    }
    let mut slots = state.slots.borrow_mut();
    slots[i].running = None;
    if slots[i].spec.restart == Restart::Temporary {
        slots[i].removed = true;
    }
}

async fn terminate_all(state: &State, from: usize) {
    let n = state.slots.borrow().len();
    for i in (from..n).rev() {
        terminate(state, i).await;
    }
}

/// The next child to exit, with its reason; `None` when asked to stop.
async fn next_exit(state: &State) -> Option<(usize, ExitReason)> {
    poll_fn(|cx| {
        if state.stop.get() {
            return Poll::Ready(None);
        }
        for (i, s) in state.slots.borrow().iter().enumerate() {
            if let Some(c) = &s.running {
                if let Poll::Ready(r) = c.exit.poll_exit(cx) {
                    return Poll::Ready(Some((i, r)));
                }
            }
        }
        *state.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    })
    .await
}

async fn supervise(
    state: &State,
    strategy: Strategy,
    intensity: u32,
    period: Duration,
) -> ExitReason {
    let mut recent: VecDeque<Instant> = VecDeque::new();
    while let Some((i, reason)) = next_exit(state).await {
        let restart = {
            let mut slots = state.slots.borrow_mut();
            let s = &mut slots[i];
            s.running = None;
            let restart = match s.spec.restart {
                Restart::Permanent => true,
                Restart::Transient => reason.is_abnormal(),
                Restart::Temporary => false,
            };
            if s.spec.restart == Restart::Temporary {
                s.removed = true;
            }
            restart
        };
        if !restart {
            continue;
        }
        let now = Instant::now();
        recent.push_back(now);
        while recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > period)
        {
            recent.pop_front();
        }
        if recent.len() > intensity as usize {
            // Too many restarts: give up, and let our own supervisor decide.
            terminate_all(state, 0).await;
            return ExitReason::Shutdown;
        }
        state.restarts.set(state.restarts.get() + 1);
        let from = match strategy {
            Strategy::OneForOne => i,
            Strategy::OneForAll => 0,
            Strategy::RestForOne => i,
        };
        let to = match strategy {
            Strategy::OneForOne => i + 1,
            _ => state.slots.borrow().len(),
        };
        // Stop the others of the group (the one that exited already has), last first...
        for j in (from..to).rev() {
            if j != i {
                terminate(state, j).await;
            }
        }
        // ...then start the group again, first first.
        for j in from..to {
            let removed = state.slots.borrow()[j].removed;
            if !removed {
                start_child(state, j).await;
            }
        }
    }
    terminate_all(state, 0).await;
    ExitReason::Shutdown
}

thread_local! {
    static REGISTRY: RefCell<HashMap<String, Box<dyn Any>>> = RefCell::new(HashMap::new());
}

/// Registers `actor` under `name` on this core (replacing whatever was there).
///
/// ```
/// use barewire::actor::{register, spawn, whereis, Actor, Context, ExitReason};
///
/// struct Logger;
/// impl Actor for Logger {
///     type Msg = String;
///     type Reply = ();
///     async fn handle(&mut self, _line: String, _: &Context<Self>) {}
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let logger = spawn(Logger);
/// register("logger", &logger);
/// // Anywhere on this core, by name and type:
/// whereis::<Logger>("logger").unwrap().tell("hello".into()).unwrap();
/// logger.stop(ExitReason::Shutdown);
/// logger.wait().await;
/// assert!(whereis::<Logger>("logger").is_none()); // it has exited
/// # });
/// ```
pub fn register<A: Actor>(name: &str, actor: &ActorRef<A>) {
    REGISTRY.with(|r| {
        r.borrow_mut()
            .insert(name.to_string(), Box::new(actor.clone()))
    });
}

/// The actor registered under `name` on this core, if it is an `A` and has not exited (see
/// [`register`] for an example).
///
/// ```
/// use barewire::actor::whereis;
/// # struct Nobody;
/// # impl barewire::actor::Actor for Nobody {
/// #     type Msg = ();
/// #     type Reply = ();
/// #     async fn handle(&mut self, _: (), _: &barewire::actor::Context<Self>) {}
/// # }
/// assert!(whereis::<Nobody>("nobody").is_none());
/// ```
pub fn whereis<A: Actor>(name: &str) -> Option<ActorRef<A>> {
    REGISTRY.with(|r| {
        let r = r.borrow();
        let a = r.get(name)?.downcast_ref::<ActorRef<A>>()?;
        a.exit_reason().is_none().then(|| a.clone())
    })
}
