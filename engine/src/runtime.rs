//! Building, entering and stopping a runtime: one pinned thread per core.

use std::future::Future;
use std::sync::{mpsc, Arc, Once};
use std::thread;
use std::time::Duration;

use crate::core::{with_core, Core, CoreConfig, CoreShared};
use crate::driver::{epoll::Epoll, uring::Uring, Driver, Reactor, ReactorKind};
use crate::error::Error;
use crate::mesh::{MeshBuilder, Msg};
use crate::stats::CoreStats;
use crate::task::{JoinError, JoinHandle, RemoteJoin, RemoteTask};

/// Which cores a runtime runs on.
#[derive(Debug, Clone)]
enum Cores {
    Count(usize),
    Ids(Vec<usize>),
}

/// Configures a [`Runtime`].
///
/// ```
/// use std::time::Duration;
/// let rt = barewire_engine::Runtime::builder()
///     .cores(2)                       // or .core_ids(&[2, 3])
///     .pin(false)                     // pinning is on by default
///     .idle_spin(Duration::ZERO)      // sleep as soon as idle (what tests want)
///     .ring_entries(256)
///     .build()
///     .unwrap();
/// assert_eq!(rt.num_cores(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    cores: Cores,
    pin: bool,
    idle_spin: Duration,
    ring_entries: u32,
    reactor: Reactor,
    budget: usize,
    mesh_capacity: usize,
    sqpoll: Option<Duration>,
    fixed_files: Option<u32>,
    task_cache: Duration,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            cores: Cores::Count(1),
            pin: true,
            idle_spin: Duration::from_micros(100),
            ring_entries: 256,
            reactor: Reactor::Auto,
            budget: 64,
            mesh_capacity: 1024,
            sqpoll: None,
            fixed_files: None,
            task_cache: Duration::from_secs(1),
        }
    }
}

impl Builder {
    /// Runs on the first `n` cores this process may use. Core 0 of the runtime is the thread
    /// that calls `build` and `block_on`.
    pub fn cores(mut self, n: usize) -> Self {
        self.cores = Cores::Count(n);
        self
    }

    /// Runs on exactly these CPU ids (as numbered by the OS), in this order.
    pub fn core_ids(mut self, ids: &[usize]) -> Self {
        self.cores = Cores::Ids(ids.to_vec());
        self
    }

    /// Pins each core's thread to its CPU (default true).
    pub fn pin(mut self, pin: bool) -> Self {
        self.pin = pin;
        self
    }

    /// How long an idle core keeps polling before it sleeps (default 100 µs). Spinning buys
    /// latency with CPU; zero sleeps at once, which is what shared machines and tests want.
    pub fn idle_spin(mut self, d: Duration) -> Self {
        self.idle_spin = d;
        self
    }

    /// For a machine the runtime shares (tests run in parallel, tools beside a benchmark): no
    /// pinning, and a core sleeps as soon as it is idle. The same as `.pin(false)` and
    /// `.idle_spin(Duration::ZERO)`.
    ///
    /// ```
    /// let rt = barewire_engine::Runtime::builder().cores(1).sleeping().build().unwrap();
    /// assert_eq!(rt.block_on(async { 6 * 7 }), 42);
    /// ```
    pub fn sleeping(self) -> Self {
        self.pin(false).idle_spin(Duration::ZERO)
    }

    /// io_uring submission queue size per core (default 256; the CQ is four times that).
    pub fn ring_entries(mut self, n: u32) -> Self {
        self.ring_entries = n;
        self
    }

    /// Which reactor to use (default `Auto`).
    pub fn reactor(mut self, r: Reactor) -> Self {
        self.reactor = r;
        self
    }

    /// Submission-queue polling (`IORING_SETUP_SQPOLL`): a kernel thread per core reads the
    /// submission queue, so a busy core submits without a system call; the thread sleeps after
    /// `idle` without submissions, and the next submission wakes it (one `io_uring_enter`).
    ///
    /// The cost is CPU: each core's kernel thread spins for as long as the core keeps
    /// submitting, and `idle` after, so a busy core uses two CPUs' time. Worth it where a core
    /// is busy and a CPU is spare beside it; on a machine with as many busy threads as CPUs it
    /// competes with them. Operations that name memory must then keep it alive until their
    /// completion (the engine's own do; [`crate::uring::RawQueue::completes_in_submit`] says
    /// whether raw ones may rely on the submitting call). `BAREWIRE_SQPOLL` sets it from the
    /// environment where the program does not: `on` (an idle time of 10 ms) or the idle time in
    /// milliseconds; `off`, `0` or empty leave it off. Needs the io_uring reactor: the build
    /// fails with [`Error::SqPollUnavailable`] where the kernel refuses it, and with
    /// [`Error::InvalidConfig`] under the epoll reactor.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// let rt = barewire_engine::Runtime::builder()
    ///     .sqpoll(Duration::from_millis(10))
    ///     .build()
    ///     .unwrap();
    /// assert!(matches!(
    ///     rt.reactor(),
    ///     barewire_engine::ReactorKind::IoUring(barewire_engine::UringFlags::SqPoll)
    /// ));
    /// ```
    pub fn sqpoll(mut self, idle: Duration) -> Self {
        self.sqpoll = Some(idle);
        self
    }

    /// Registers up to `n` sockets per core in its ring's file table (`IORING_REGISTER_FILES`,
    /// sparse; 0 turns it off): a TCP stream or UDP socket takes a slot on its first operation
    /// through the ring (a raw queue's owner, such as a software-RDMA queue pair, takes one
    /// with [`RawQueue::register_file`](crate::uring::RawQueue::register_file)), and its
    /// operations name the slot (`IOSQE_FIXED_FILE`), so the kernel
    /// skips the per-operation file lookup and reference count. A socket finding the table
    /// full, used on another core, or on an epoll core, uses its descriptor as usual. Dropping
    /// the socket frees its slot (one `io_uring_register` call) before the descriptor closes;
    /// dropped on another thread, its core empties the slot on its next pass (until then the
    /// table keeps the socket open).
    ///
    /// Default: [`DEFAULT_FIXED_FILES`] (no more than the process's open-file limit), or
    /// `BAREWIRE_FIXED_FILES` from the environment where the program does not call this. It
    /// measured 5-7% more TCP echo throughput and no loss when every round trip opens and
    /// closes a connection (`bench/RESULTS.md`, eleventh session).
    ///
    /// ```
    /// use barewire_engine::net::{TcpListener, TcpStream};
    /// let rt = barewire_engine::Runtime::builder().pin(false).fixed_files(64).build().unwrap();
    /// rt.block_on(async {
    ///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    ///     let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    ///     let (s, _) = l.accept().await.unwrap();
    ///     c.write_all(b"fixed".to_vec()).await.0.unwrap();
    ///     let (r, buf) = s.read_exact(vec![0u8; 5]).await;
    ///     r.unwrap();
    ///     assert_eq!(&buf, b"fixed");
    /// });
    /// ```
    pub fn fixed_files(mut self, n: u32) -> Self {
        self.fixed_files = Some(n);
        self
    }

    fn fixed_files_choice(&self) -> Result<u32, Error> {
        let n = match self.fixed_files {
            Some(n) => n,
            None => match std::env::var("BAREWIRE_FIXED_FILES").ok().as_deref() {
                None | Some("") => DEFAULT_FIXED_FILES,
                Some(v) => v.parse::<u32>().map_err(|_| {
                    Error::InvalidConfig(format!(
                        "BAREWIRE_FIXED_FILES={v}: expected a number of slots (0: off)"
                    ))
                })?,
            },
        };
        if n == 0 {
            return Ok(0);
        }
        // The kernel refuses a table larger than the open-file limit.
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct we pass.
        let cap = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            lim.rlim_cur.min(u32::MAX as libc::rlim_t) as u32
        } else {
            n
        };
        Ok(n.min(cap))
    }

    /// Tasks run per pass before the pollers get their turn (default 64), so one busy task
    /// cannot starve I/O completions.
    pub fn task_budget(mut self, n: usize) -> Self {
        self.budget = n;
        self
    }

    /// How long a core keeps the memory of finished tasks for its next spawns (default one
    /// second; `Duration::ZERO` turns the cache off).
    ///
    /// A task's cell freed on its own core goes onto a free list of its size, and a later
    /// spawn of a task that size takes it back without calling the allocator. The cache never
    /// holds more cells than the core had live at once, and at the end of each `keep` interval
    /// the core gives back as many of each size as went unused throughout it, a few thousand
    /// per look so the loop never stalls; an idle core wakes for that while anything is cached.
    /// `CoreStats::task_cells_cached` says how many a core holds now.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = barewire_engine::Runtime::builder()
    ///     .cores(1)
    ///     .pin(false)
    ///     .task_cache(Duration::from_millis(100))
    ///     .build()
    ///     .unwrap();
    /// rt.block_on(async {
    ///     barewire_engine::spawn_local(async { 1 }).await.unwrap();
    ///     barewire_engine::spawn_local(async { 2 }).await.unwrap(); // the first task's cell
    ///     assert_eq!(barewire_engine::stats().task_cells_reused, 1);
    /// });
    /// ```
    pub fn task_cache(mut self, keep: Duration) -> Self {
        self.task_cache = keep;
        self
    }

    /// Slots in each cross-core ring (default 1024).
    pub fn mesh_capacity(mut self, n: usize) -> Self {
        self.mesh_capacity = n;
        self
    }

    fn resolve_cores(&self) -> Result<Vec<Option<usize>>, Error> {
        let available: Vec<usize> = match core_affinity::get_core_ids() {
            Some(ids) => ids.into_iter().map(|c| c.id).collect(),
            None => (0..thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1))
                .collect(),
        };
        let ids = match &self.cores {
            Cores::Count(0) => {
                return Err(Error::InvalidConfig(
                    "a runtime needs at least one core".into(),
                ))
            }
            Cores::Count(n) if *n > available.len() => {
                return Err(Error::TooManyCores {
                    requested: *n,
                    available: available.len(),
                })
            }
            Cores::Count(n) => available[..*n].to_vec(),
            Cores::Ids(ids) if ids.is_empty() => {
                return Err(Error::InvalidConfig("core_ids is empty".into()))
            }
            Cores::Ids(ids) => {
                for (i, id) in ids.iter().enumerate() {
                    if !available.contains(id) {
                        return Err(Error::UnknownCore { id: *id, available });
                    }
                    if ids[..i].contains(id) {
                        return Err(Error::InvalidConfig(format!("core {id} listed twice")));
                    }
                }
                ids.clone()
            }
        };
        Ok(ids.into_iter().map(|id| self.pin.then_some(id)).collect())
    }

    fn reactor_choice(&self) -> Result<Reactor, Error> {
        if self.reactor != Reactor::Auto {
            return Ok(self.reactor);
        }
        match std::env::var("BAREWIRE_REACTOR").ok().as_deref() {
            None | Some("") | Some("auto") => Ok(Reactor::Auto),
            Some("io_uring") | Some("uring") => Ok(Reactor::IoUring),
            Some("epoll") => Ok(Reactor::Epoll),
            Some(other) => Err(Error::InvalidConfig(format!(
                "BAREWIRE_REACTOR={other}: expected io_uring, epoll or auto"
            ))),
        }
    }

    /// The SQPOLL idle time asked for, by the builder or else by `BAREWIRE_SQPOLL`.
    fn sqpoll_choice(&self, reactor: Reactor) -> Result<Option<Duration>, Error> {
        let idle = match self.sqpoll {
            Some(d) => Some(d),
            None => match std::env::var("BAREWIRE_SQPOLL").ok().as_deref() {
                None | Some("") | Some("off") | Some("0") => None,
                Some("on") => Some(Duration::from_millis(10)),
                Some(ms) => match ms.parse::<u64>() {
                    Ok(ms) => Some(Duration::from_millis(ms)),
                    Err(_) => {
                        return Err(Error::InvalidConfig(format!(
                            "BAREWIRE_SQPOLL={ms}: expected on, off or an idle time in milliseconds"
                        )))
                    }
                },
            },
        };
        if idle.is_some() && reactor == Reactor::Epoll {
            return Err(Error::InvalidConfig(
                "SQPOLL needs the io_uring reactor, and epoll was asked for".into(),
            ));
        }
        Ok(idle)
    }

    /// Builds the runtime: the calling thread becomes core 0, and one thread is started (and
    /// pinned) for each other core.
    pub fn build(self) -> Result<Runtime, Error> {
        if self.ring_entries == 0 || self.budget == 0 || self.mesh_capacity == 0 {
            return Err(Error::InvalidConfig(
                "ring_entries, task_budget and mesh_capacity must be non-zero".into(),
            ));
        }
        let cpus = self.resolve_cores()?;
        let reactor = self.reactor_choice()?;
        let sqpoll = self.sqpoll_choice(reactor)?;
        let n = cpus.len();
        let shared: Vec<Arc<CoreShared>> = (0..n)
            .map(CoreShared::new)
            .collect::<Result<_, _>>()
            .map_err(|e| Error::io("eventfd", e))?;
        let mut mesh = MeshBuilder::new(n, self.mesh_capacity);
        let cfg = |b: &Builder| CoreConfig {
            budget: b.budget,
            idle_spin: b.idle_spin,
            task_cache: b.task_cache,
        };
        let ring = RingConfig {
            entries: self.ring_entries,
            sqpoll,
            fixed_files: self.fixed_files_choice()?,
        };

        let mut threads = Vec::with_capacity(n.saturating_sub(1));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), Error>>();
        for i in 1..n {
            let sh = shared[i].clone();
            let peers = shared.clone();
            let core_mesh = mesh.take(i, peers);
            let cpu = cpus[i];
            let config = cfg(&self);
            let tx = ready_tx.clone();
            let t = thread::Builder::new()
                .name(format!("barewire-core-{i}"))
                .spawn(move || {
                    let core = match make_core(sh, cpu, reactor, ring, core_mesh, config) {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = tx.send(Ok(()));
                    drop(tx);
                    core.run::<std::future::Pending<()>>(None);
                    core.shutdown();
                })
                .map_err(|e| Error::io("spawning a core thread", e))?;
            threads.push(t);
        }
        drop(ready_tx);
        let core0 = make_core(
            shared[0].clone(),
            cpus[0],
            reactor,
            ring,
            mesh.take(0, shared.clone()),
            cfg(&self),
        );
        let mut first_err = core0
            .as_ref()
            .err()
            .map(|e| Error::InvalidConfig(e.to_string()));
        for _ in 1..n {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => first_err = first_err.or(Some(e)),
                Err(_) => {
                    first_err = first_err.or(Some(Error::InvalidConfig(
                        "a core thread died during setup".into(),
                    )))
                }
            }
        }
        if let Some(e) = first_err {
            for s in &shared {
                s.request_stop();
            }
            for t in threads {
                let _ = t.join();
            }
            return Err(match core0 {
                Err(e0) => e0,
                Ok(_) => e,
            });
        }
        let core0 = Box::new(core0.expect("checked above"));
        Ok(Runtime {
            core0: Some(core0),
            shared,
            threads,
        })
    }
}

/// Registered file table slots per core unless the program or `BAREWIRE_FIXED_FILES` says
/// otherwise (see [`Builder::fixed_files`]).
pub const DEFAULT_FIXED_FILES: u32 = 1024;

/// How each core's ring is set up.
#[derive(Debug, Clone, Copy)]
struct RingConfig {
    entries: u32,
    sqpoll: Option<Duration>,
    fixed_files: u32,
}

fn make_core(
    shared: Arc<CoreShared>,
    cpu: Option<usize>,
    reactor: Reactor,
    ring: RingConfig,
    mesh: crate::mesh::Mesh,
    config: CoreConfig,
) -> Result<Core, Error> {
    if let Some(id) = cpu {
        if !core_affinity::set_for_current(core_affinity::CoreId { id }) {
            return Err(Error::Pin(id));
        }
    }
    let wake_fd = std::os::fd::AsRawFd::as_raw_fd(&shared.wake.doorbell.0);
    let driver = match reactor {
        Reactor::Epoll => {
            Driver::Epoll(Epoll::new(wake_fd).map_err(|e| Error::io("epoll setup", e))?)
        }
        _ if ring.sqpoll.is_some() => Driver::Uring(
            Uring::new(ring.entries, wake_fd, ring.sqpoll, ring.fixed_files)
                .map_err(Error::SqPollUnavailable)?,
        ),
        Reactor::IoUring => Driver::Uring(
            Uring::new(ring.entries, wake_fd, None, ring.fixed_files)
                .map_err(Error::IoUringUnavailable)?,
        ),
        Reactor::Auto => match Uring::new(ring.entries, wake_fd, None, ring.fixed_files) {
            Ok(u) => Driver::Uring(u),
            Err(e) => {
                static WARN: Once = Once::new();
                WARN.call_once(|| {
                    eprintln!(
                        "barewire: io_uring is unavailable ({e}); the epoll reactor is active"
                    )
                });
                Driver::Epoll(Epoll::new(wake_fd).map_err(|e| Error::io("epoll setup", e))?)
            }
        },
    };
    Ok(Core::new(shared, cpu, driver, mesh, config))
}

/// A thread-per-core runtime. Core 0 is the thread that built it; [`Runtime::block_on`] runs
/// there. Dropping the runtime (or [`Runtime::shutdown`]) stops every core, drops every task on
/// its own core, and joins the threads.
///
/// ```
/// let rt = barewire_engine::Runtime::builder().cores(2).pin(false).build().unwrap();
/// let squares = rt.block_on(async {
///     let a = barewire_engine::spawn_on(1, || async { barewire_engine::current_core() * 10 });
///     a.await.unwrap()
/// });
/// assert_eq!(squares, 10);
/// ```
pub struct Runtime {
    core0: Option<Box<Core>>,
    shared: Vec<Arc<CoreShared>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Runtime {
    /// A builder with the defaults: one core, pinned, 100 µs idle spin, io_uring if possible.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// How many cores this runtime has.
    pub fn num_cores(&self) -> usize {
        self.shared.len()
    }

    fn core0(&self) -> &Core {
        self.core0.as_ref().expect("runtime is running")
    }

    /// Which reactor core 0 runs (every core makes the same choice).
    pub fn reactor(&self) -> ReactorKind {
        self.core0().driver.kind()
    }

    /// Runs `future` to completion on core 0 (this thread), driving every task of core 0 while
    /// it waits. The future may borrow from the caller and need not be `Send`.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        self.core0()
            .run(Some(future.as_mut()))
            .expect("run returns the main future's output")
    }

    /// Runs `f(core)` on every core at once and returns the outputs in core order.
    ///
    /// ```
    /// let rt = barewire_engine::Runtime::builder().cores(2).pin(false).build().unwrap();
    /// let ids = rt.run_on_all(|core| async move { core });
    /// assert_eq!(ids, vec![0, 1]);
    /// ```
    pub fn run_on_all<F, Fut>(&self, f: F) -> Vec<Fut::Output>
    where
        F: Fn(usize) -> Fut + Send + Clone + 'static,
        Fut: Future + 'static,
        Fut::Output: Send + 'static,
    {
        self.block_on(async {
            let handles: Vec<_> = (0..self.num_cores())
                .map(|i| {
                    let f = f.clone();
                    spawn_on(i, move || f(i))
                })
                .collect();
            let mut out = Vec::with_capacity(handles.len());
            for h in handles {
                match h.await {
                    Ok(v) => out.push(v),
                    Err(JoinError::Panicked(p)) => std::panic::resume_unwind(p),
                    Err(JoinError::Cancelled) => {
                        panic!("run_on_all: a core shut down before its future finished")
                    }
                }
            }
            out
        })
    }

    /// Every core's counters.
    pub fn stats(&self) -> Vec<CoreStats> {
        self.run_on_all(|_| async { crate::stats() })
    }

    /// Stops every core and joins their threads. Tasks still pending are dropped on their own
    /// core; awaiting their handles gives `JoinError::Cancelled`.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        for s in self.shared.iter().skip(1) {
            s.request_stop();
        }
        let mut panicked = false;
        for t in self.threads.drain(..) {
            panicked |= t.join().is_err();
        }
        if let Some(core0) = self.core0.take() {
            core0.shutdown();
        }
        if panicked && !thread::panicking() {
            panic!("a barewire core thread panicked outside any task");
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Builds a future on core `core` from a `Send` closure and runs it there. The future itself
/// may be `!Send`: it is created on the target core and never leaves it. Only the output
/// crosses back. Works from any core of the runtime; `core` may be the current one.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(2).pin(false).build().unwrap();
/// rt.block_on(async {
///     let h = barewire_engine::spawn_on(1, || async {
///         let local = std::rc::Rc::new(7); // built on core 1, stays there
///         *local + barewire_engine::current_core()
///     });
///     assert_eq!(h.await.unwrap(), 8);
/// });
/// ```
pub fn spawn_on<F, Fut>(core: usize, f: F) -> JoinHandle<Fut::Output>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let shared = RemoteJoin::new();
    let msg = remote_spawn_msg(f, shared.clone());
    with_core(|c| {
        let n = c.mesh.peers().len();
        if core >= n {
            shared.finish(Err(JoinError::Panicked(Box::new(format!(
                "spawn_on: core {core} does not exist; this runtime has {n} cores"
            )))));
        } else if core == c.index() {
            msg();
        } else {
            c.mesh.send(core, msg, &c.stats);
        }
    });
    JoinHandle::remote(shared)
}

/// Finishes the joiner with `Cancelled` if the message is dropped without running (the target
/// core shut down first).
struct Unrun<T>(Option<Arc<RemoteJoin<T>>>);

impl<T> Drop for Unrun<T> {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.finish(Err(JoinError::Cancelled));
        }
    }
}

fn remote_spawn_msg<F, Fut>(f: F, shared: Arc<RemoteJoin<Fut::Output>>) -> Msg
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let mut guard = Unrun(Some(shared));
    Box::new(move || {
        let shared = guard.0.take().expect("message runs once");
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(future) => {
                with_core(|c| {
                    drop(c.spawn(RemoteTask {
                        future: Some(future),
                        shared,
                    }))
                });
            }
            Err(p) => shared.finish(Err(JoinError::Panicked(p))),
        }
    })
}

/// The index of the core running the caller (0-based, in the runtime's core order).
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(2).pin(false).build().unwrap();
/// use barewire_engine::{current_core, num_cores, spawn_on};
/// rt.block_on(async {
///     assert_eq!((current_core(), num_cores()), (0, 2)); // block_on runs on core 0
///     let there = spawn_on(1, || async { current_core() }).await.unwrap();
///     assert_eq!(there, 1);
/// });
/// ```
pub fn current_core() -> usize {
    with_core(|c| c.index())
}

/// True on a thread that is running a barewire core (inside `Runtime::block_on` or a task).
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// assert!(!barewire_engine::in_runtime());
/// rt.block_on(async { assert!(barewire_engine::in_runtime()) });
/// ```
pub fn in_runtime() -> bool {
    crate::core::try_with_core(|_| ()).is_some()
}

/// Runs `hook` once on this core as soon as the task (or the main future) being polled
/// returns from its poll, whether it finished or is waiting; called outside any task's poll
/// (from a [`Poller`](crate::Poller)), at the end of the current pass over the completion
/// sources. False, and nothing queued, outside a barewire runtime.
///
/// It lets a library batch what one poll asks for: the software RDMA provider sends the first
/// work request a task posts at once, and those the task posts after it, before yielding, in
/// one system call when it yields. Each call queues `hook` again, so a caller that needs it
/// once per poll keeps its own flag.
///
/// ```
/// use std::cell::Cell;
/// thread_local! { static BATCH: Cell<u32> = const { Cell::new(0) }; }
/// fn flush() {
///     println!("{} requests at once", BATCH.with(|b| b.replace(0)));
/// }
///
/// let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     for _ in 0..3 {
///         if BATCH.with(|b| b.replace(b.get() + 1)) == 0 {
///             assert!(barewire_engine::at_yield(flush));
///         }
///     }
///     assert_eq!(BATCH.with(|b| b.get()), 3, "not yet: this poll has not returned");
///     barewire_engine::yield_now().await;
///     assert_eq!(BATCH.with(|b| b.get()), 0, "flushed when the poll returned");
/// });
/// assert!(!barewire_engine::at_yield(flush));
/// ```
pub fn at_yield(hook: fn()) -> bool {
    crate::core::try_with_core(|c| c.at_yield(hook)).is_some()
}

/// How many polls of tasks and of the main future this core has finished: two calls that
/// return the same number ran in the same poll (or between the same two, in a
/// [`Poller`](crate::Poller)). With [`at_yield`], it lets a library tell the first request of
/// a poll from the ones after it.
///
/// ```
/// let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let first = barewire_engine::poll_count();
///     assert_eq!(barewire_engine::poll_count(), first, "the same poll");
///     barewire_engine::yield_now().await;
///     assert!(barewire_engine::poll_count() > first);
/// });
/// ```
pub fn poll_count() -> u64 {
    with_core(|c| c.polls.get())
}

/// An id of the current core that is unique over the process's life, for libraries that keep
/// per-core state in thread-locals: a new runtime on the same thread gets a new token.
pub fn core_token() -> u64 {
    with_core(|c| c.token)
}

/// The CPU id the current core is pinned to, if pinning is on.
pub fn current_cpu() -> Option<usize> {
    with_core(|c| c.cpu)
}

/// How many cores the current runtime has (see [`current_core`] for an example).
pub fn num_cores() -> usize {
    with_core(|c| c.mesh.peers().len())
}

/// Which reactor the current core runs.
///
/// ```
/// use barewire_engine::{Reactor, ReactorKind, Runtime};
/// let rt = Runtime::builder().cores(1).pin(false).reactor(Reactor::Epoll).build().unwrap();
/// rt.block_on(async { assert_eq!(barewire_engine::reactor(), ReactorKind::Epoll) });
/// ```
pub fn reactor() -> ReactorKind {
    with_core(|c| c.driver.kind())
}

/// The current core's counters.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let before = barewire_engine::stats();
///     barewire_engine::spawn_local(async {}).await.unwrap();
///     let after = barewire_engine::stats();
///     assert_eq!(after.tasks_spawned, before.tasks_spawned + 1);
///     assert!(after.tasks_polled > before.tasks_polled);
/// });
/// ```
pub fn stats() -> CoreStats {
    with_core(|c| c.stats.snapshot(c.index(), &c.driver, &c.cache))
}

/// Adds a completion source to the current core's loop. See [`Poller`](crate::Poller), whose
/// example registers one.
pub fn register_poller(p: Box<dyn crate::Poller>) {
    with_core(|c| c.register_poller(p))
}

/// Yields once, letting the other ready tasks and every completion source run: the caller is
/// polled again only after the core's next pass over its pollers (its timers, its ring and
/// any [`Poller`](crate::Poller)), so a task computing in slices between yields never holds up
/// the I/O it overlaps with. Outside a runtime it wakes itself at once.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let mut sum = 0u64;
///     for chunk in 0..4u64 {
///         sum += (chunk * 1000..(chunk + 1) * 1000).sum::<u64>();
///         barewire_engine::yield_now().await; // I/O moves between the slices
///     }
///     assert_eq!(sum, (0..4000).sum::<u64>());
/// });
/// ```
pub async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            if crate::core::try_with_core(|c| c.defer(cx.waker())).is_none() {
                cx.waker().wake_by_ref();
            }
            std::task::Poll::Pending
        }
    })
    .await
}
