//! Actors: typed mailboxes on the engine, with Erlang/OTP supervision.
//!
//! An [`Actor`] is state plus an async handler for one message type. [`spawn`] starts it as a
//! task of this core and returns an [`ActorRef`], through which anyone on the core
//! [`tell`](ActorRef::tell)s it (fire and forget, in order per sender) or
//! [`ask`](ActorRef::ask)s it (the handler's result comes back, within a timeout). A handler
//! that panics ends its actor with [`ExitReason::Panic`]; the core and every other actor go
//! on.
//!
//! A panic is an ordinary way for an actor to end, so the standard panic hook's cost matters:
//! with `RUST_BACKTRACE` set it resolves the backtrace on the panicking core, which holds every
//! task there (and, across nodes, the heartbeats) for as long as that takes. Call
//! [`report_panics`] once at start to have actors' panics reported from a thread of their own.
//!
//! A [`Supervisor`] starts children from [`ChildSpec`]s in order and restarts them as OTP's
//! `supervisor` does:
//!
//! - strategies `one_for_one` (restart the child that exited), `one_for_all` (stop the others,
//!   in reverse start order, and start all again), `rest_for_one` (stop those started after
//!   it, in reverse order, and start it and them again);
//! - restart types `Permanent` (always restarted), `Transient` (restarted only after an
//!   abnormal exit, i.e. anything but `Normal` or `Shutdown`) and `Temporary` (never
//!   restarted, and not restarted either when a sibling's exit restarts the group);
//! - restart intensity: more than `intensity` restarts within `period` (OTP's default: 1 in
//!   5 s) and the supervisor stops all its children, in reverse start order, and exits with
//!   `Shutdown`: its own supervisor sees that exit and applies its own policy (escalation);
//! - ordered shutdown: children are stopped in reverse start order, each given its
//!   `shutdown` time to finish before it is killed.
//!
//! ```
//! use barewire::actor::{spawn, Actor, Context};
//! use std::time::Duration;
//!
//! struct Counter(u64);
//! impl Actor for Counter {
//!     type Msg = u64;
//!     type Reply = u64;
//!     async fn handle(&mut self, add: u64, _: &Context<Self>) -> u64 {
//!         self.0 += add;
//!         self.0
//!     }
//! }
//!
//! # barewire::engine::Runtime::builder().cores(1).pin(false).build().unwrap().block_on(async {
//! let c = spawn(Counter(0));
//! c.tell(5).unwrap();
//! assert_eq!(c.ask(2, Duration::from_secs(1)).await.unwrap(), 7);
//! # });
//! ```

mod cell;
mod core;
mod panics;
mod supervisor;
mod system;

pub use self::core::spawn_on_core;
pub(crate) use cell::catch;
pub use cell::{link, spawn, ActorRef, Context};
pub use panics::{report_panics, report_panics_with};
pub use supervisor::{register, whereis, ChildSpec, Restart, Strategy, Supervisor, SupervisorSpec};
pub(crate) use system::{decode, encode};
pub use system::{ActorSystem, Detector, Migratable, RemoteActor, SystemOptions};

use std::future::Future;

/// Why an actor (or a supervisor) ended.
///
/// ```
/// use barewire::actor::ExitReason;
/// // What makes a `Transient` child restart, and what a link passes on:
/// assert!(ExitReason::Panic("index out of bounds".into()).is_abnormal());
/// assert!(ExitReason::NoConnection.is_abnormal());
/// assert!(!ExitReason::Shutdown.is_abnormal());
/// assert_eq!(ExitReason::Killed.to_string(), "killed"); // as OTP writes them
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ExitReason {
    /// It finished its work (`Context::stop` with `Normal`).
    Normal,
    /// Its supervisor (or whoever owned it) stopped it.
    Shutdown,
    /// Its handler panicked; the panic's message.
    Panic(String),
    /// It did not stop within its shutdown time, or was killed outright.
    Killed,
    /// Its node became unreachable.
    NoConnection,
    /// It stopped itself with an error.
    Error(String),
}

impl ExitReason {
    /// Anything but `Normal` and `Shutdown`: what makes a `Transient` child restart.
    pub fn is_abnormal(&self) -> bool {
        !matches!(self, ExitReason::Normal | ExitReason::Shutdown)
    }
}

impl std::fmt::Display for ExitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExitReason::Normal => write!(f, "normal"),
            ExitReason::Shutdown => write!(f, "shutdown"),
            ExitReason::Panic(m) => write!(f, "panic: {m}"),
            ExitReason::Killed => write!(f, "killed"),
            ExitReason::NoConnection => write!(f, "noconnection"),
            ExitReason::Error(m) => write!(f, "error: {m}"),
        }
    }
}

/// State and behaviour: one message type, one reply type, an async handler.
///
/// Handlers run one at a time, in mailbox order. `started` runs before the first message,
/// `stopped` after the last (not when the actor is killed).
///
/// ```
/// use barewire::actor::{spawn, Actor, Context, ExitReason};
/// use std::cell::Cell;
/// use std::rc::Rc;
///
/// /// Keeps a log of its life in a cell its creator holds.
/// struct Logged(Rc<Cell<u32>>);
/// impl Actor for Logged {
///     type Msg = u32;
///     type Reply = ();
///     async fn started(&mut self, _: &Context<Self>) {
///         self.0.set(1);
///     }
///     async fn handle(&mut self, n: u32, _: &Context<Self>) {
///         self.0.set(self.0.get() + n);
///     }
///     fn stopped(&mut self, reason: &ExitReason) {
///         assert_eq!(*reason, ExitReason::Shutdown);
///         self.0.set(self.0.get() * 100);
///     }
/// }
///
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let log = Rc::new(Cell::new(0));
/// let a = spawn(Logged(log.clone()));
/// a.tell(2).unwrap();
/// a.stop(ExitReason::Shutdown); // after the messages already queued
/// a.wait().await;
/// assert_eq!(log.get(), 300); // started, handled 2, stopped
/// # });
/// ```
pub trait Actor: Sized + 'static {
    /// What it is sent.
    type Msg: 'static;
    /// What a handler returns (to an `ask`; dropped for a `tell`).
    type Reply: 'static;

    /// Runs once, before any message.
    fn started(&mut self, _ctx: &Context<Self>) -> impl Future<Output = ()> {
        async {}
    }

    /// Handles one message.
    fn handle(&mut self, msg: Self::Msg, ctx: &Context<Self>) -> impl Future<Output = Self::Reply>;

    /// Runs once, after the last message (whatever the reason, except a kill). A panic here
    /// becomes the actor's exit reason, as an exception in an OTP `terminate` does.
    fn stopped(&mut self, _reason: &ExitReason) {}
}
