//! One core: its run queue, its reactor, its timers, its mesh rings, and the loop that drives
//! them. A `Core` lives on one thread and is reached through a thread-local pointer while that
//! thread runs it; `CoreShared` is the part other threads may touch (inbox, sleep flag, doorbell).

use std::alloc::Layout;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use crate::driver::Driver;
use crate::mesh::Mesh;
use crate::poller::Poller;
use crate::stats::{bump, Stats};
use crate::task::cache::CellCache;
use crate::task::cells::SharedCells;
use crate::task::raw::{Header, RawJoin, RawTask, RemoteRef, RunQueue, CANCELLED, COMPLETE};
use crate::task::{JoinError, JoinHandle};
use crate::time::Timers;
use crate::wake::{Doorbell, WakeState};

/// What other threads hand a core.
pub(crate) enum InboxItem {
    /// A task of this core woken from another thread (the entry holds a remote reference).
    Task(RemoteRef),
    /// A slot of this core's registered file table whose socket was dropped on another thread
    /// (see `op::SharedFd`): only this core's thread may touch its ring.
    ReleaseSlot(u32),
}

/// The core's doorbell: an eventfd the reactor keeps a read (io_uring) or interest (epoll) on.
pub(crate) struct EventFd(pub(crate) OwnedFd);

impl EventFd {
    pub(crate) fn new() -> std::io::Result<EventFd> {
        // SAFETY: plain syscall; the fd is owned from here on.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl Doorbell for EventFd {
    fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd; EAGAIN (counter saturated) still
        // leaves the fd readable, which is all the sleeper needs.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            )
        };
    }
}

pub(crate) struct CoreShared {
    pub(crate) index: usize,
    /// Task cells freed off the core, and the count the core hands over when it goes (see
    /// `task/cells.rs`): the cells point here without an `Arc`.
    pub(crate) cells: SharedCells,
    pub(crate) wake: WakeState<InboxItem, EventFd>,
    pub(crate) stop: AtomicBool,
}

impl CoreShared {
    pub(crate) fn new(index: usize) -> std::io::Result<Arc<Self>> {
        Ok(Arc::new(CoreShared {
            index,
            cells: SharedCells::new(),
            wake: WakeState::new(EventFd::new()?),
            stop: AtomicBool::new(false),
        }))
    }

    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake.doorbell.ring();
    }
}

impl Drop for CoreShared {
    fn drop(&mut self) {
        // Tasks still referenced from the inbox are only freed here; their futures were dropped
        // by the core's shutdown.
        let mut v = Vec::new();
        self.wake.drain_into(&mut v);
    }
}

pub(crate) struct CoreConfig {
    pub(crate) budget: usize,
    pub(crate) idle_spin: Duration,
    /// How long a freed task cell stays cached (`Builder::task_cache`).
    pub(crate) task_cache: Duration,
}

pub(crate) struct Core {
    /// Unique over the process's life: tells state kept per thread whether it belongs to this
    /// core or to an earlier runtime that ran on the same thread.
    pub(crate) token: u64,
    pub(crate) shared: Arc<CoreShared>,
    pub(crate) cpu: Option<usize>,
    run_queue: RunQueue,
    /// Task cells spawned here, less those freed on this thread while it ran the core (the
    /// owner side of the count in `task/cells.rs`).
    cells: Cell<isize>,
    /// Freed cells kept for the next spawns (see `task/cache.rs`). Dropped after every task
    /// (the core's shutdown freed them into it).
    pub(crate) cache: CellCache,
    tasks_head: Cell<Option<NonNull<Header>>>,
    pub(crate) driver: Driver,
    pub(crate) timers: Timers,
    pollers: RefCell<Vec<Box<dyn Poller>>>,
    pub(crate) mesh: Mesh,
    pub(crate) stats: Stats,
    config: CoreConfig,
    inbox_spare: RefCell<Vec<InboxItem>>,
    /// Tasks that yielded: woken after the next pass over the completion sources, not in the
    /// same run of ready tasks (a task that yields in a loop would otherwise run `budget` times
    /// before any I/O moved).
    deferred: RefCell<Vec<Waker>>,
    /// The vector `deferred` is swapped with while its wakers are woken (keeps both
    /// allocations, so a task yielding in a loop costs no allocation).
    deferred_spare: RefCell<Vec<Waker>>,
    /// The main future's waker while `run` drives one, and whether it yielded since the last
    /// pass: its yields are deferred as a flag, without cloning it (an atomic reference count)
    /// into `deferred`.
    main: RefCell<Option<Waker>>,
    main_deferred: Cell<bool>,
    /// Hooks to run when the task (or main future) being polled returns (see
    /// [`crate::at_yield`]), the vector they are swapped with while they run, and whether any
    /// is waiting: one flag test per poll when none is.
    at_yield: RefCell<Vec<fn()>>,
    at_yield_spare: RefCell<Vec<fn()>>,
    at_yield_armed: Cell<bool>,
    /// Polls of tasks and of the main future so far (see [`crate::poll_count`]).
    pub(crate) polls: Cell<u64>,
}

thread_local! {
    static CURRENT: Cell<*const Core> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` with this thread's core. Panics outside a barewire core, like tokio's `spawn`
/// outside a runtime: that is a programming error, not a runtime condition.
pub(crate) fn with_core<R>(f: impl FnOnce(&Core) -> R) -> R {
    try_with_core(f).expect(
        "not inside a barewire runtime: call this from Runtime::block_on or a task it spawned",
    )
}

/// Like `with_core`, or `None` when the thread runs no core.
pub(crate) fn try_with_core<R>(f: impl FnOnce(&Core) -> R) -> Option<R> {
    let ptr = CURRENT.with(|c| c.get());
    if ptr.is_null() {
        return None;
    }
    // SAFETY: CURRENT is set only by `Core::enter`, whose guard clears it before the Core can be
    // dropped or moved; the Core is only used from this thread.
    Some(f(unsafe { &*ptr }))
}

/// A task cell of `owner` died: its memory goes to the owner's cache when this thread runs
/// that core, else to the allocator, and the cell is counted freed on the same side (see
/// `task/cells.rs`); the free that leaves no cell after the core's handover releases the `Arc`
/// the handover kept.
///
/// # Safety
/// `owner` is the dead cell's owner, which its count kept alive until now; `mem` is the cell,
/// allocated with `layout` and no longer used; called once per cell.
pub(crate) unsafe fn free_cell(owner: NonNull<CoreShared>, mem: NonNull<u8>, layout: Layout) {
    let counted_here = try_with_core(|c| {
        let mine = std::ptr::eq(Arc::as_ptr(&c.shared), owner.as_ptr());
        if mine {
            c.cells.set(c.cells.get() - 1);
            // SAFETY: forwarded contract.
            unsafe { c.cache.free(mem, layout) };
        }
        mine
    })
    .unwrap_or(false);
    if counted_here {
        return;
    }
    // SAFETY: forwarded contract.
    unsafe { std::alloc::dealloc(mem.as_ptr(), layout) };
    // SAFETY: not counted yet, so the shared half is alive (caller's contract).
    if unsafe { owner.as_ref() }.cells.freed() {
        // SAFETY: the last cell after the handover: the Arc the handover kept is ours to drop.
        unsafe { Arc::decrement_strong_count(owner.as_ptr()) };
    }
}

/// Spawns a `!Send` future on the current core.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let data = std::rc::Rc::new(5); // !Send is fine: the task never leaves this core
///     let d = data.clone();
///     let h = barewire_engine::spawn_local(async move { *d * 2 });
///     assert_eq!(h.await.unwrap(), 10);
/// });
/// ```
pub fn spawn_local<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + 'static,
    F::Output: 'static,
{
    with_core(|core| core.spawn(future))
}

struct MainWaker {
    woken: AtomicBool,
    shared: Arc<CoreShared>,
}

impl Wake for MainWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        // A wake on the core's own thread comes from code the core is running (a task, a
        // poller, the main future yielding), so the core is awake and reads the flag before
        // it may sleep: it needs no doorbell, nor the fence that looking for one costs.
        if try_with_core(|c| Arc::ptr_eq(&c.shared, &self.shared)) != Some(true) {
            self.shared.wake.notify();
        }
    }
}

/// Holds the main future's waker in the core while `run` drives it, and puts back what was
/// there before when the loop exits, even by unwinding.
struct MainGuard<'a> {
    core: &'a Core,
    before: Option<Waker>,
}

impl<'a> MainGuard<'a> {
    fn set(core: &'a Core, main: Option<Waker>) -> MainGuard<'a> {
        let before = core.main.replace(main);
        MainGuard { core, before }
    }
}

impl Drop for MainGuard<'_> {
    fn drop(&mut self) {
        *self.core.main.borrow_mut() = self.before.take();
        self.core.main_deferred.set(false);
    }
}

/// Clears CURRENT when the loop exits, even by unwinding.
struct EnterGuard(*const Core);

impl Drop for EnterGuard {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // Wakes from other threads that came after the shutdown's last look, and any later
        // ones, release their tasks instead of waiting in an inbox nobody drains.
        drop(self.shared.wake.close());
        // Hand the owner side of the cell count over (see `task/cells.rs`): the extra Arc is
        // taken first, so a concurrent last free always finds one to release.
        let extra = Arc::into_raw(self.shared.clone());
        if !self.shared.cells.hand_over(self.cells.get()) {
            // SAFETY: the Arc taken just above; no cell is left to release it.
            drop(unsafe { Arc::from_raw(extra) });
        }
    }
}

impl Core {
    pub(crate) fn new(
        shared: Arc<CoreShared>,
        cpu: Option<usize>,
        driver: Driver,
        mesh: Mesh,
        config: CoreConfig,
    ) -> Core {
        static NEXT_TOKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Core {
            token: NEXT_TOKEN.fetch_add(1, Ordering::Relaxed),
            shared,
            cpu,
            run_queue: RunQueue::new(),
            cells: Cell::new(0),
            cache: CellCache::new(config.task_cache),
            tasks_head: Cell::new(None),
            driver,
            timers: Timers::default(),
            pollers: RefCell::new(Vec::new()),
            mesh,
            stats: Stats::default(),
            config,
            inbox_spare: RefCell::new(Vec::new()),
            deferred: RefCell::new(Vec::new()),
            deferred_spare: RefCell::new(Vec::new()),
            main: RefCell::new(None),
            main_deferred: Cell::new(false),
            at_yield: RefCell::new(Vec::new()),
            at_yield_spare: RefCell::new(Vec::new()),
            at_yield_armed: Cell::new(false),
            polls: Cell::new(0),
        }
    }

    pub(crate) fn index(&self) -> usize {
        self.shared.index
    }

    /// Queues `hook` for the end of the current poll (see [`crate::at_yield`]).
    pub(crate) fn at_yield(&self, hook: fn()) {
        self.at_yield.borrow_mut().push(hook);
        self.at_yield_armed.set(true);
    }

    /// Runs the hooks queued during the poll that just returned. A hook that queues another
    /// (a post from inside one) runs it at the next check, after the next poll.
    #[inline]
    fn run_at_yield(&self) {
        if !self.at_yield_armed.replace(false) {
            return;
        }
        let mut hooks = std::mem::take(&mut *self.at_yield_spare.borrow_mut());
        std::mem::swap(&mut hooks, &mut *self.at_yield.borrow_mut());
        for hook in hooks.drain(..) {
            hook();
        }
        *self.at_yield_spare.borrow_mut() = hooks;
    }

    fn enter(&self) -> EnterGuard {
        let prev = CURRENT.with(|c| c.replace(self as *const Core));
        assert!(
            prev.is_null() || std::ptr::eq(prev, self),
            "block_on called from inside a barewire runtime"
        );
        EnterGuard(prev)
    }

    pub(crate) fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let ptr = RawTask::allocate(future, &self.shared, &self.cache);
        self.cells.set(self.cells.get() + 1);
        bump(&self.stats.tasks_spawned);
        // SAFETY: allocate handed out three references: list, JoinHandle, run queue.
        unsafe {
            self.link(ptr);
            self.run_queue.push_back(RawTask::from_raw(ptr));
            JoinHandle::local(RawJoin::new(ptr))
        }
    }

    /// Queues a woken task of this core (see `task::raw::schedule`).
    pub(crate) fn push_task(&self, task: RawTask) {
        self.run_queue.push_back(task);
    }

    pub(crate) fn register_poller(&self, p: Box<dyn Poller>) {
        self.pollers.borrow_mut().push(p);
    }

    /// # Safety
    /// `ptr` is a live task of this core; the list takes over one reference.
    unsafe fn link(&self, ptr: NonNull<Header>) {
        // SAFETY: owner thread; list links are only touched here.
        let h = unsafe { ptr.as_ref() };
        h.next.set(self.tasks_head.get());
        if let Some(old) = self.tasks_head.get() {
            // SAFETY: the old head is alive (the list holds a reference to it).
            unsafe { old.as_ref() }.prev.set(Some(ptr));
        }
        self.tasks_head.set(Some(ptr));
    }

    /// Removes a task from the list and returns the list's reference. Takes the task's own
    /// pointer, not a `&Header`: the reference handed back reaches the whole cell (its stage
    /// too), and a pointer made from a `&Header` may reach the header's bytes only (Miri's
    /// borrow checks flag the stage access through one).
    fn unlink(&self, ptr: NonNull<Header>) -> RawTask {
        // SAFETY: the list holds a reference to the task, so its header is alive.
        let h = unsafe { ptr.as_ref() };
        let (prev, next) = (h.prev.take(), h.next.take());
        match prev {
            // SAFETY: list neighbours are alive (the list holds references to them).
            Some(p) => unsafe { p.as_ref() }.next.set(next),
            None => self.tasks_head.set(next),
        }
        if let Some(n) = next {
            // SAFETY: as above.
            unsafe { n.as_ref() }.prev.set(prev);
        }
        // SAFETY: the list held one reference, handed over here.
        unsafe { RawTask::from_raw(ptr) }
    }

    /// Runs up to `budget` tasks. Returns how many ran.
    fn run_tasks(&self) -> usize {
        let mut ran = 0;
        while ran < self.config.budget {
            let Some(task) = self.run_queue.pop_front() else {
                break;
            };
            let prev = task.clear_scheduled();
            if prev & COMPLETE != 0 {
                continue;
            }
            ran += 1;
            bump(&self.stats.tasks_polled);
            let done = if prev & CANCELLED != 0 {
                task.abort(JoinError::Cancelled);
                true
            } else {
                task.poll()
            };
            self.polls.set(self.polls.get() + 1);
            self.run_at_yield();
            if done {
                task.complete();
                drop(self.unlink(task.as_ptr()));
            }
        }
        ran
    }

    fn drain_inbox(&self) -> bool {
        if !self
            .shared
            .wake
            .drain_into(&mut self.inbox_spare.borrow_mut())
        {
            return false;
        }
        let mut items = std::mem::take(&mut *self.inbox_spare.borrow_mut());
        let any = !items.is_empty();
        for item in items.drain(..) {
            match item {
                InboxItem::Task(r) => {
                    // SAFETY: this is the task's owner thread (only its owner's inbox holds it).
                    if let Some(t) = unsafe { r.take() } {
                        self.run_queue.push_back(t);
                    }
                }
                InboxItem::ReleaseSlot(slot) => {
                    if let Driver::Uring(u) = &self.driver {
                        u.unregister_fixed(slot);
                    }
                }
            }
        }
        *self.inbox_spare.borrow_mut() = items;
        any
    }

    /// One pass over every completion source. True if any made progress.
    fn poll_sources(&self) -> bool {
        bump(&self.stats.poller_passes);
        self.cache.pass();
        let mut did = self.drain_inbox();
        did |= self.mesh.receive(&self.stats) > 0;
        did |= self.timers.fire_due();
        self.prepare_submit();
        did |= self.driver.poll(&self.stats);
        did |= self.poll_user_pollers();
        did |= self.mesh.flush();
        did |= self.wake_deferred();
        did
    }

    /// Wakes the tasks that yielded since the last pass. True if there were any.
    fn wake_deferred(&self) -> bool {
        let mut any = false;
        if self.main_deferred.replace(false) {
            if let Some(main) = &*self.main.borrow() {
                // On the core's own thread: sets the flag, rings no doorbell (`MainWaker`).
                main.wake_by_ref();
            }
            any = true;
        }
        if self.deferred.borrow().is_empty() {
            return any;
        }
        let mut woken = std::mem::take(&mut *self.deferred_spare.borrow_mut());
        std::mem::swap(&mut woken, &mut *self.deferred.borrow_mut());
        for w in woken.drain(..) {
            w.wake();
        }
        *self.deferred_spare.borrow_mut() = woken;
        true
    }

    /// Wakes `waker` after the next pass over the completion sources (see `yield_now`).
    pub(crate) fn defer(&self, waker: &Waker) {
        if let Some(main) = &*self.main.borrow() {
            if main.will_wake(waker) {
                self.main_deferred.set(true);
                return;
            }
        }
        self.deferred.borrow_mut().push(waker.clone());
    }

    fn prepare_submit(&self) {
        let mut pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        for p in pollers.iter_mut() {
            p.prepare_submit();
        }
        let mut slot = self.pollers.borrow_mut();
        pollers.append(&mut slot);
        *slot = pollers;
    }

    /// An idle core's looks between two full passes: up to `MEMORY_LOOKS` times, polls the
    /// pollers that watch memory (`Poller::watches_memory`). True once one found work (the
    /// caller then runs its tasks and a full pass); false at once where no poller watches
    /// memory, so a core with none goes on to its next full pass with no delay.
    fn look_at_memory(&self) -> bool {
        // Asked first with the list in place: most cores (every one with no shm queue pair)
        // have no poller that watches memory, and then go on with nothing moved.
        if !self.pollers.borrow().iter().any(|p| p.watches_memory()) {
            return false;
        }
        // Taken out while polled, as in `poll_user_pollers`.
        let mut pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        let mut did = false;
        for _ in 0..crate::poller::MEMORY_LOOKS {
            let mut watched = false;
            for p in pollers.iter_mut() {
                if p.watches_memory() {
                    watched = true;
                    did |= p.poll();
                }
            }
            if !watched {
                break;
            }
            bump(&self.stats.memory_looks);
            if did {
                break;
            }
            // (No `spin_loop` between looks: a look is a few loads, and a pause that close to
            // the last one may be what a hypervisor's pause-loop filter takes for a vCPU
            // spinning on a lock. Measured, a pause here moved the ping-pong by no more than
            // one 5 ns step either way; bench/RESULTS.md, forty-sixth session. The idle loop
            // pauses after the looks.)
        }
        let mut slot = self.pollers.borrow_mut();
        pollers.append(&mut slot);
        *slot = pollers;
        did
    }

    fn poll_user_pollers(&self) -> bool {
        // Taken out while polled, so a poller may register another one.
        let mut pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        let mut did = false;
        for p in pollers.iter_mut() {
            did |= p.poll();
        }
        let mut slot = self.pollers.borrow_mut();
        pollers.append(&mut slot);
        *slot = pollers;
        did
    }

    fn pure_poll(&self) -> bool {
        !self.run_queue.is_empty()
            || !self.deferred.borrow().is_empty()
            || self.main_deferred.get()
            || self.shared.wake.has_pending()
            || self.mesh.has_pending()
            || self.mesh.has_backlog()
            || self.timers.any_due()
            || self.driver.pure_poll()
            || self.pollers.borrow_mut().iter_mut().any(|p| p.pure_poll())
    }

    /// Sleeps in the reactor unless something is pending. See `wake.rs` for the handshake.
    fn sleep(&self, main_woken: &AtomicBool) {
        self.shared.wake.prepare_sleep();
        let mut pollers = std::mem::take(&mut *self.pollers.borrow_mut());
        let mut entered = 0;
        let mut ok = true;
        for p in pollers.iter_mut() {
            if !p.try_enter_interrupt_mode() {
                ok = false;
                break;
            }
            entered += 1;
        }
        if ok
            && !self.pure_poll()
            && !main_woken.load(Ordering::Acquire)
            && !self.shared.stop.load(Ordering::SeqCst)
        {
            let now = Instant::now();
            // A core with cells cached wakes to give back what stays unused.
            let deadline = match (self.timers.next_deadline(), self.cache.trim(now)) {
                (Some(t), Some(c)) => Some(t.min(c)),
                (t, c) => t.or(c),
            };
            let timeout = deadline.map(|d| d.saturating_duration_since(now));
            bump(&self.stats.sleeps);
            self.driver.park(timeout, &self.stats);
        }
        self.shared.wake.cancel_sleep();
        for p in pollers.iter_mut().take(entered) {
            p.exit_interrupt_mode();
        }
        let mut slot = self.pollers.borrow_mut();
        pollers.append(&mut slot);
        *slot = pollers;
    }

    /// Drives the loop until `main` completes, or (with no main) until a stop is requested.
    pub(crate) fn run<F: Future>(&self, mut main: Option<Pin<&mut F>>) -> Option<F::Output> {
        let _guard = self.enter();
        // Woken at first so a main future is polled once; a core with no main future (cores
        // 1..n) has nothing for this flag to announce, and a flag left set would keep it from
        // ever counting as idle, and so from ever sleeping.
        let main_waker = Arc::new(MainWaker {
            woken: AtomicBool::new(main.is_some()),
            shared: self.shared.clone(),
        });
        let waker = Waker::from(main_waker.clone());
        let mut cx = Context::from_waker(&waker);
        let _main = MainGuard::set(self, main.is_some().then(|| waker.clone()));
        let mut idle_since: Option<Instant> = None;
        // Whether the last pass skipped the completion sources (see below).
        let mut skipped_sources = false;
        let mut idle_passes: u32 = 0;
        loop {
            if let Some(fut) = main.as_mut() {
                if main_waker.woken.swap(false, Ordering::AcqRel) {
                    let polled = fut.as_mut().poll(&mut cx);
                    self.polls.set(self.polls.get() + 1);
                    self.run_at_yield();
                    if let Poll::Ready(v) = polled {
                        self.mesh.flush();
                        return Some(v);
                    }
                }
            } else if self.shared.stop.load(Ordering::Acquire) {
                return None;
            }
            let ran = self.run_tasks();
            // A task just woke the main future (a completion it was waiting for went through
            // a task): poll it straight away rather than after another pass over every
            // completion source. At most every other pass, so sources are never starved.
            if ran > 0 && !skipped_sources && main_waker.woken.load(Ordering::Acquire) {
                skipped_sources = true;
                idle_since = None;
                continue;
            }
            skipped_sources = false;
            let did = self.poll_sources();
            // Hooks a completion source queued (outside any task's poll).
            self.run_at_yield();
            if ran > 0 || did || main_waker.woken.load(Ordering::Acquire) {
                idle_since = None;
                continue;
            }
            // Idle. Memory that other CPUs store into is looked at a few more times before the
            // next full pass (see `Poller::watches_memory`).
            if self.look_at_memory() {
                idle_since = None;
                continue;
            }
            // Idle: spin for `idle_spin`, reading the clock only every 32 passes (a clock read
            // costs as much as a short pass, and every pass shortened is latency saved).
            idle_passes = idle_passes.wrapping_add(1);
            if idle_since.is_some() && idle_passes % 32 != 0 {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if now.duration_since(since) < self.config.idle_spin {
                std::hint::spin_loop();
                continue;
            }
            self.sleep(&main_waker.woken);
            idle_since = None;
        }
    }

    /// Drops every task (on this thread, where their `!Send` state belongs), then waits for the
    /// kernel to hand back every buffer of an operation still in flight.
    pub(crate) fn shutdown(&self) {
        let _guard = self.enter();
        loop {
            // Dropping futures may wake or spawn others; repeat until nothing is left.
            self.drain_inbox();
            let mut progressed = false;
            while let Some(head) = self.tasks_head.get() {
                let task = self.unlink(head);
                task.abort(JoinError::Cancelled);
                task.complete();
                progressed = true;
            }
            while let Some(task) = self.run_queue.pop_front() {
                drop(task);
                progressed = true;
            }
            progressed |= self.mesh.receive(&self.stats) > 0;
            if !progressed {
                break;
            }
        }
        self.deferred.borrow_mut().clear();
        // Dropped outside the borrow, with the core still current: a poller's `Drop` may use
        // the core as a task could (cancel a `WakeSource`, register another poller). Those it
        // registers are dropped in turn, for a few rounds; any left go with the core.
        for _ in 0..4 {
            let pollers = std::mem::take(&mut *self.pollers.borrow_mut());
            if pollers.is_empty() {
                break;
            }
            drop(pollers);
        }
        self.driver.drain(&self.stats);
        self.mesh.flush();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::{Mutex, Weak};

    #[test]
    fn the_main_futures_yields_are_a_flag_and_its_wakes_from_elsewhere_ring_the_doorbell() {
        let rt = crate::Runtime::builder()
            .cores(1)
            .pin(false)
            .idle_spin(Duration::ZERO)
            .build()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<Waker>();
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let waker_thread = std::thread::spawn(move || {
            // Wakes the main future from another thread once the core has gone to sleep.
            let w = rx.recv().unwrap();
            std::thread::sleep(Duration::from_millis(50));
            d.store(true, Ordering::Release);
            w.wake();
        });
        let (yields, sleeps) = rt.block_on(async move {
            // The main future's yields: deferred as a flag, with no waker cloned into the
            // list the tasks' yields go to; and a task yielding beside it keeps its own path.
            let task = spawn_local(async {
                for _ in 0..1000 {
                    crate::yield_now().await;
                }
            });
            let mut yields = 0;
            while !task.is_finished() {
                std::future::poll_fn(|cx| {
                    if yields % 2 == 1 {
                        return Poll::Ready(());
                    }
                    with_core(|c| {
                        c.defer(cx.waker());
                        assert!(c.main_deferred.get(), "the main future's yield is the flag");
                        assert!(
                            c.deferred.borrow().iter().all(|w| !w.will_wake(cx.waker())),
                            "and not a clone of its waker"
                        );
                    });
                    yields += 1;
                    Poll::Pending
                })
                .await;
                yields += 1;
            }
            // A wake from another thread while the core sleeps.
            let sleeps_before = with_core(|c| c.stats.sleeps.get());
            let mut sent = false;
            std::future::poll_fn(|cx| {
                if done.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                if !sent {
                    tx.send(cx.waker().clone()).unwrap();
                    sent = true;
                }
                Poll::Pending
            })
            .await;
            (yields, with_core(|c| c.stats.sleeps.get()) - sleeps_before)
        });
        waker_thread.join().unwrap();
        assert!(
            yields >= 1000,
            "the main future was polled again after each of its yields: {yields}"
        );
        assert!(
            sleeps >= 1,
            "the core slept before the wake, and the wake reached it"
        );
    }

    /// Runs a one-core runtime whose one task stays pending and hands out its waker; returns
    /// the waker (the runtime is gone by then) and a weak reference to the core's shared half.
    fn waker_outliving_its_core() -> (Waker, Weak<CoreShared>) {
        let slot: Arc<Mutex<Option<Waker>>> = Arc::new(Mutex::new(None));
        let rt = crate::Runtime::builder()
            .cores(1)
            .pin(false)
            .build()
            .unwrap();
        let s = slot.clone();
        let weak = rt.block_on(async move {
            let _pending = spawn_local(std::future::poll_fn(move |cx| {
                *s.lock().unwrap() = Some(cx.waker().clone());
                Poll::<()>::Pending
            }));
            crate::yield_now().await;
            with_core(|c| Arc::downgrade(&c.shared))
        });
        drop(rt);
        let waker = slot.lock().unwrap().take().expect("the task ran once");
        (waker, weak)
    }

    #[test]
    fn a_cell_outliving_its_core_keeps_the_shared_half_until_its_last_reference_goes() {
        let (waker, weak) = waker_outliving_its_core();
        assert!(weak.upgrade().is_some(), "the waker's cell points at it");
        std::thread::spawn(move || drop(waker)).join().unwrap();
        assert!(weak.upgrade().is_none(), "freed with the last cell");
    }

    #[test]
    fn a_wake_after_the_core_went_releases_the_task() {
        let (waker, weak) = waker_outliving_its_core();
        // By reference first (the inbox refuses the entry), then by value.
        let w = waker.clone();
        std::thread::spawn(move || {
            w.wake_by_ref();
            w.wake();
        })
        .join()
        .unwrap();
        assert!(
            weak.upgrade().is_some(),
            "the first waker still holds the cell"
        );
        waker.wake();
        assert!(
            weak.upgrade().is_none(),
            "nothing left in a dead core's inbox"
        );
    }
}
