//! The `Poller` contract: how a completion source plugs into a core's loop.
//!
//! Each pass of a core's loop runs ready tasks (up to a budget), then calls
//! [`Poller::prepare_submit`] on every registered poller, submits and reaps the reactor, and then
//! calls [`Poller::poll`] on every poller: the built-in ones (io_uring or epoll completions, timers, the cross-core mesh)
//! and the ones other crates register with [`register_poller`](crate::register_poller) — the
//! drivers register one per verbs completion queue, the software RDMA provider one for its
//! progress engine.
//!
//! When a pass finds nothing to do, the core spins for the configured idle time, calling `poll`
//! and [`Poller::pure_poll`]; between two such passes it polls, up to [`MEMORY_LOOKS`] times,
//! just the pollers that say they [watch memory](Poller::watches_memory), and runs a full pass
//! at once when one of them finds work. Then it asks every poller to [`Poller::try_enter_interrupt_mode`]:
//! a poller arms whatever will wake the core (for a verbs CQ, `ibv_req_notify_cq` with the
//! completion channel's fd watched by an io_uring `POLL_ADD`; for an fd the poller owns, a
//! [`WakeSource`](crate::WakeSource) registered once) and returns `true`, or returns
//! `false` if work is already pending and sleeping would miss it. If every poller agreed the core
//! sleeps in the reactor until an fd, a timer or a cross-core wake; then every poller that entered
//! interrupt mode gets [`Poller::exit_interrupt_mode`], whether or not the core slept.
//!
//! A registered poller lives as long as its core. When the core shuts down, after it has
//! dropped every task, it drops its pollers while it is still the current core: a poller's
//! `Drop` can let go of what it holds on the core (a [`WakeSource`](crate::WakeSource), buffers
//! registered with the ring, per-core state in a thread-local) before the reactor drains what
//! is still in flight. The software provider and the shm driver release their per-core state
//! that way.

/// A completion source polled by a core's loop. Runs on that core only.
///
/// A source of work the core cannot see through its reactor (a verbs completion queue, a
/// region a peer writes into, a flag another library sets) is polled on every pass, and wakes
/// the task waiting on it:
///
/// ```
/// use barewire_engine::{register_poller, spawn_local, Poller, Runtime};
/// use std::cell::Cell;
/// use std::future::poll_fn;
/// use std::rc::Rc;
/// use std::task::{Poll, Waker};
///
/// /// Something that fills in a value on its own time, and the task waiting for it.
/// #[derive(Default)]
/// struct Source {
///     value: Cell<Option<u64>>,
///     waiter: Cell<Option<Waker>>,
/// }
/// struct SourcePoller(Rc<Source>);
/// impl Poller for SourcePoller {
///     fn poll(&mut self) -> bool {
///         // Work found: wake whoever waits on it (and say so, which keeps the core busy).
///         match (self.0.value.get(), self.0.waiter.take()) {
///             (Some(_), Some(w)) => {
///                 w.wake();
///                 true
///             }
///             (_, w) => {
///                 self.0.waiter.set(w);
///                 false
///             }
///         }
///     }
///     fn pure_poll(&mut self) -> bool {
///         self.0.value.get().is_some()
///     }
///     fn try_enter_interrupt_mode(&mut self) -> bool {
///         // Only tasks of this core fill it in, and none runs while the core sleeps: it may
///         // sleep unless a value is already waiting.
///         !self.pure_poll()
///     }
/// }
///
/// # let rt = Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let source = Rc::new(Source::default());
///     register_poller(Box::new(SourcePoller(source.clone())));
///     let s = source.clone();
///     spawn_local(async move { s.value.set(Some(42)) });
///     let got = poll_fn(|cx| match source.value.get() {
///         Some(v) => Poll::Ready(v),
///         None => {
///             source.waiter.set(Some(cx.waker().clone()));
///             Poll::Pending
///         }
///     })
///     .await;
///     assert_eq!(got, 42);
/// });
/// ```
pub trait Poller {
    /// Makes progress: reap completions, wake the tasks waiting on them. Returns `true` if it
    /// did any work, which keeps the core from going idle.
    fn poll(&mut self) -> bool;

    /// Called on every pass just before the reactor submits: a source that queues its own
    /// io_uring operations (see [`crate::uring::RawQueue`]) queues them here, so they go out in
    /// the same `io_uring_enter` as everything else the pass submits, and their completions are
    /// there for the `poll` that follows in the same pass. Nothing runs between this call and
    /// that submission, so memory it points the kernel at cannot change in between.
    fn prepare_submit(&mut self) {}

    /// Reports whether `poll` would find work, without doing it or changing state. Called while
    /// spinning before sleep; should be cheap.
    fn pure_poll(&mut self) -> bool;

    /// Arms the interrupt source so the core can sleep. Returns `false` if work is pending and
    /// the core must not sleep; `exit_interrupt_mode` is then not called for this poller.
    fn try_enter_interrupt_mode(&mut self) -> bool {
        true
    }

    /// Leaves interrupt mode after the core woke up (or decided not to sleep).
    fn exit_interrupt_mode(&mut self) {}

    /// Whether `poll` now looks only at memory another CPU stores into (a queue in shared
    /// memory, a ring a peer process writes, a completion queue a device writes): a few loads,
    /// no system call, nothing another source must have done first. While the core is idle it
    /// polls such pollers several times between two full passes ([`MEMORY_LOOKS`]), so a store
    /// from another process is seen within a look rather than within a whole pass over every
    /// source. Asked on every idle pass, so it should be cheap. The default is `false`: a
    /// source whose work arrives through the reactor (a socket the core itself reads) gains
    /// nothing from being looked at more often.
    fn watches_memory(&self) -> bool {
        false
    }
}

/// How many times an idle core looks at its memory-watching pollers
/// ([`Poller::watches_memory`]) between two full passes. A full pass (tasks, the mesh,
/// timers, the reactor's submit and reap, every poller: about 850 instructions on a core with
/// one shm connection and a channel) takes several times as long as a look, and a store that
/// lands just after a pass looked waited, on average, half a pass to be seen.
///
/// On the development host (2 vCPUs, whose cross-core latency changes phase every few
/// minutes) the shm channel's 64-byte ping-pong took 0.105–0.110 µs one way with 4 looks
/// against 0.14 without, 0.126–0.131 with 1, in the phase the host spends most of its time
/// in; in one slower phase it took 0.34 against 0.30–0.32, and in another about the same
/// (bench/RESULTS.md, forty-sixth session). The other sources are seen up to that many looks
/// later than they would be, and only where a poller watches memory.
pub const MEMORY_LOOKS: u32 = 4;
