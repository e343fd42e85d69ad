//! A registered `Poller` shaped like a verbs completion queue: completions appear in memory from
//! another thread, and while the core sleeps they announce themselves through an fd only if the
//! poller armed it (as `ibv_req_notify_cq` + a completion channel do).

mod common;

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use barewire_engine::time::timeout;
use barewire_engine::{poll_readable, register_poller, spawn_local, Poller, WakeSource};
use common::rt;

/// The "device" side, written by another thread.
struct FakeCq {
    produced: AtomicU64,
    armed: AtomicBool,
    channel: OwnedFd,
}

impl FakeCq {
    /// A queue with nothing produced, not armed, and a fresh eventfd for its channel.
    fn new() -> Arc<FakeCq> {
        // SAFETY: plain eventfd creation; ownership passes to OwnedFd.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(efd >= 0);
        Arc::new(FakeCq {
            produced: AtomicU64::new(0),
            armed: AtomicBool::new(false),
            // SAFETY: fresh fd.
            channel: unsafe { OwnedFd::from_raw_fd(efd) },
        })
    }

    fn complete_one(&self) {
        self.produced.fetch_add(1, Ordering::SeqCst);
        // A notification fires only when armed, and disarms, like a CQ event.
        if self.armed.swap(false, Ordering::SeqCst) {
            let one = 1u64;
            // SAFETY: 8-byte write to our eventfd.
            unsafe {
                libc::write(
                    self.channel.as_raw_fd(),
                    &one as *const u64 as *const libc::c_void,
                    8,
                )
            };
        }
    }
}

#[derive(Default)]
struct Counts {
    polls: Cell<u64>,
    enters: Cell<u64>,
    refusals: Cell<u64>,
    exits: Cell<u64>,
}

struct CqPoller {
    cq: Arc<FakeCq>,
    seen: Rc<Cell<u64>>,
    waiter: Rc<RefCell<Option<Waker>>>,
    counts: Rc<Counts>,
}

impl Poller for CqPoller {
    fn poll(&mut self) -> bool {
        self.counts.polls.set(self.counts.polls.get() + 1);
        let now = self.cq.produced.load(Ordering::SeqCst);
        if now == self.seen.get() {
            return false;
        }
        self.seen.set(now);
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
        true
    }

    fn pure_poll(&mut self) -> bool {
        self.cq.produced.load(Ordering::SeqCst) != self.seen.get()
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        self.cq.armed.store(true, Ordering::SeqCst);
        // Re-check after arming, as one must after ibv_req_notify_cq.
        if self.pure_poll() {
            self.cq.armed.store(false, Ordering::SeqCst);
            self.counts.refusals.set(self.counts.refusals.get() + 1);
            return false;
        }
        self.counts.enters.set(self.counts.enters.get() + 1);
        true
    }

    fn exit_interrupt_mode(&mut self) {
        self.counts.exits.set(self.counts.exits.get() + 1);
        self.cq.armed.store(false, Ordering::SeqCst);
    }
}

#[test]
fn a_registered_poller_delivers_completions_and_wakes_a_sleeping_core() {
    const N: u64 = 2000;
    let cq = FakeCq::new();
    let rt = rt(1);
    let counts = Rc::new(Counts::default());
    let device = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            for i in 0..N {
                if i % 50 == 0 {
                    // Pauses long enough for the core to fall asleep.
                    std::thread::sleep(Duration::from_millis(2));
                }
                cq.complete_one();
            }
        })
    };
    rt.block_on(async {
        let seen = Rc::new(Cell::new(0));
        let waiter = Rc::new(RefCell::new(None));
        register_poller(Box::new(CqPoller {
            cq: cq.clone(),
            seen: seen.clone(),
            waiter: waiter.clone(),
            counts: counts.clone(),
        }));
        // The completion channel's fd in the reactor: it only wakes the core; the poller reaps.
        let fd = cq.channel.as_raw_fd();
        spawn_local(async move {
            loop {
                if poll_readable(fd).await.is_err() {
                    return;
                }
                let mut v = 0u64;
                // SAFETY: 8-byte read from our eventfd into a u64.
                unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
            }
        });
        let done = std::future::poll_fn(|cx| {
            if seen.get() >= N {
                return Poll::Ready(());
            }
            *waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        });
        timeout(Duration::from_secs(30), done)
            .await
            .expect("a completion was never delivered");
    });
    device.join().unwrap();
    let stats = rt.stats()[0];
    assert!(counts.polls.get() > 0);
    assert!(
        counts.enters.get() > 0,
        "the poller was asked to arm before sleeping"
    );
    assert!(
        counts.exits.get() >= counts.enters.get(),
        "every entered interrupt mode was left"
    );
    assert!(stats.sleeps > 0, "the core slept between bursts: {stats:?}");
}

/// The completion channel watched by a `WakeSource` instead of a task: the core sleeps between
/// bursts and each burst wakes it, with the eventfd never read. So the registration lasts
/// across sleeps and counts each write as an event (edge-triggered under epoll, a multishot
/// poll under io_uring), rather than reporting a level once. Without the source, or with the
/// source watching another eventfd, the first burst after a sleep waits for the timeout's
/// timer, 10 s away.
#[test]
fn a_wake_source_wakes_a_sleeping_core_at_each_event_without_being_drained() {
    const BURSTS: u64 = 40;
    let cq = FakeCq::new();
    let rt = rt(1);
    common::expect_reactor(&rt);
    let counts = Rc::new(Counts::default());
    let device = {
        let cq = cq.clone();
        std::thread::spawn(move || {
            let mut notified = 0;
            for _ in 0..BURSTS {
                // Long enough for the core to fall asleep.
                std::thread::sleep(Duration::from_millis(5));
                let armed = cq.armed.load(Ordering::SeqCst);
                cq.complete_one();
                notified += armed as u64;
            }
            notified
        })
    };
    rt.block_on(async {
        let seen = Rc::new(Cell::new(0));
        let waiter = Rc::new(RefCell::new(None));
        let wake = WakeSource::readable(cq.channel.as_raw_fd()).expect("registered");
        /// The CQ poller, arming the wake source before each sleep.
        struct Watched(CqPoller, WakeSource);
        impl Poller for Watched {
            fn poll(&mut self) -> bool {
                self.0.poll()
            }
            fn pure_poll(&mut self) -> bool {
                self.0.pure_poll()
            }
            fn try_enter_interrupt_mode(&mut self) -> bool {
                self.1.arm().expect("the watch is armed");
                self.0.try_enter_interrupt_mode()
            }
            fn exit_interrupt_mode(&mut self) {
                self.0.exit_interrupt_mode()
            }
        }
        register_poller(Box::new(Watched(
            CqPoller {
                cq: cq.clone(),
                seen: seen.clone(),
                waiter: waiter.clone(),
                counts: counts.clone(),
            },
            wake,
        )));
        let done = std::future::poll_fn(|cx| {
            if seen.get() >= BURSTS {
                return Poll::Ready(());
            }
            *waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        });
        // The bursts take 0.2 s. A burst that found the core asleep and did not wake it waits
        // for the next timer, which is this timeout's: then all are seen at once, 10 s in.
        let t0 = std::time::Instant::now();
        timeout(Duration::from_secs(10), done)
            .await
            .expect("every burst was seen");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "a burst that came while the core slept did not wake it ({:?})",
            t0.elapsed()
        );
    });
    let notified = device.join().unwrap();
    let stats = rt.stats()[0];
    assert!(
        stats.sleeps >= BURSTS / 2,
        "the core slept between bursts: {stats:?}"
    );
    assert!(
        notified >= BURSTS / 2,
        "most bursts found the core asleep: {notified}"
    );
    let mut count = 0u64;
    // SAFETY: 8-byte read from our eventfd into a u64.
    let n = unsafe {
        libc::read(
            cq.channel.as_raw_fd(),
            &mut count as *mut u64 as *mut libc::c_void,
            8,
        )
    };
    assert_eq!(n, 8);
    assert_eq!(count, notified, "nothing read the eventfd before now");
}

/// Counts its passes; never has work of its own.
struct PassCounter(Rc<Cell<u64>>);

impl Poller for PassCounter {
    fn poll(&mut self) -> bool {
        self.0.set(self.0.get() + 1);
        false
    }
    fn pure_poll(&mut self) -> bool {
        false
    }
    fn try_enter_interrupt_mode(&mut self) -> bool {
        true
    }
    fn exit_interrupt_mode(&mut self) {}
}

/// A task that computes in slices and yields between them lets the completion sources run at
/// every yield, not after a whole task budget of its own slices (the matmul example's panel
/// READs were served only every 64 tiles).
#[test]
fn each_yield_lets_every_poller_run() {
    let rt = rt(1);
    rt.block_on(async {
        let passes = Rc::new(Cell::new(0));
        register_poller(Box::new(PassCounter(passes.clone())));
        let p = passes.clone();
        let worker = spawn_local(async move {
            let mut seen = Vec::new();
            for _ in 0..200 {
                let before = p.get();
                barewire_engine::yield_now().await;
                seen.push(p.get() - before);
            }
            seen
        });
        let seen = worker.await.unwrap();
        assert!(
            seen.iter().all(|&n| n >= 1),
            "a yield went by without a pass over the pollers: {seen:?}"
        );
    });
}

/// Says it watches memory (or not), and finds work on its `due`-th poll: it wakes the task
/// waiting for that. Until then it keeps the core from sleeping, as a source about to have
/// work would.
struct Watch {
    memory: bool,
    polls: Rc<Cell<u64>>,
    due: u64,
    waiter: Rc<RefCell<Option<Waker>>>,
}

impl Poller for Watch {
    fn poll(&mut self) -> bool {
        let n = self.polls.get() + 1;
        self.polls.set(n);
        if n != self.due {
            return false;
        }
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
        true
    }
    fn pure_poll(&mut self) -> bool {
        false
    }
    fn try_enter_interrupt_mode(&mut self) -> bool {
        self.polls.get() >= self.due
    }
    fn watches_memory(&self) -> bool {
        self.memory
    }
}

/// Registers a `Watch` (watching memory or not) due on its 2,000th poll beside a
/// `PassCounter`, and waits until it is due. The counts: that watch's polls, the counter's
/// (one per full pass), and the core's `memory_looks`.
fn idle_until_due(memory: bool) -> (u64, u64, u64) {
    let rt = rt(1);
    let (polls, passes) = rt.block_on(async move {
        let polls = Rc::new(Cell::new(0));
        let passes = Rc::new(Cell::new(0));
        let waiter = Rc::new(RefCell::new(None));
        register_poller(Box::new(Watch {
            memory,
            polls: polls.clone(),
            due: 2_000,
            waiter: waiter.clone(),
        }));
        register_poller(Box::new(PassCounter(passes.clone())));
        std::future::poll_fn(|cx| {
            if polls.get() >= 2_000 {
                return Poll::Ready(());
            }
            *waiter.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        (polls.get(), passes.get())
    });
    (polls, passes, rt.stats()[0].memory_looks)
}

/// An idle core looks at the pollers that watch memory between its full passes, and only at
/// them: every poll of the memory watch that was not in a pass was one of the core's counted
/// looks, the poller that does not watch memory was polled once per pass and no more, and
/// there were more looks than passes (up to `MEMORY_LOOKS` a pass).
#[test]
fn an_idle_core_looks_at_memory_between_passes() {
    let (polls, passes, looks) = idle_until_due(true);
    assert_eq!(polls, 2_000);
    assert_eq!(
        polls,
        passes + looks,
        "every poll of the watch was a pass or a look"
    );
    assert!(
        looks > passes && looks <= passes * u64::from(barewire_engine::MEMORY_LOOKS) + 1,
        "{looks} looks in {passes} passes"
    );
}

/// Where no poller watches memory, an idle core makes no looks: its next full pass follows at
/// once.
#[test]
fn a_core_watching_no_memory_makes_no_looks() {
    let (polls, passes, looks) = idle_until_due(false);
    assert_eq!((polls, looks), (2_000, 0));
    assert_eq!(passes, polls, "the watch was polled once per pass");
}

/// Records, as it is dropped, whether its core was still current and whether the core's tasks
/// were already gone; then registers another poller, as a poller's teardown may.
struct DroppedAtShutdown {
    core: u64,
    task: std::rc::Weak<()>,
    seen: Rc<Cell<Option<(bool, bool)>>>,
}

impl Poller for DroppedAtShutdown {
    fn poll(&mut self) -> bool {
        false
    }
    fn pure_poll(&mut self) -> bool {
        false
    }
}

impl Drop for DroppedAtShutdown {
    fn drop(&mut self) {
        let on_core = barewire_engine::in_runtime() && barewire_engine::core_token() == self.core;
        self.seen
            .set(Some((on_core, self.task.upgrade().is_none())));
        struct Idle;
        impl Poller for Idle {
            fn poll(&mut self) -> bool {
                false
            }
            fn pure_poll(&mut self) -> bool {
                false
            }
        }
        register_poller(Box::new(Idle));
    }
}

/// The contract the providers' teardown relies on: a registered poller is dropped when its
/// core shuts down, after the core's tasks, while the core is still current (so its `Drop`
/// may cancel what it registered with the reactor), and its `Drop` may use the core as a task
/// could, registering included.
#[test]
fn a_poller_is_dropped_on_its_core_after_its_tasks_when_the_core_shuts_down() {
    let seen = Rc::new(Cell::new(None));
    let s = seen.clone();
    rt(1).block_on(async move {
        let held = Rc::new(());
        register_poller(Box::new(DroppedAtShutdown {
            core: barewire_engine::core_token(),
            task: Rc::downgrade(&held),
            seen: s,
        }));
        // A task that never ends: it holds `held` until the core drops it.
        spawn_local(async move {
            let _held = held;
            std::future::pending::<()>().await
        });
        barewire_engine::yield_now().await;
    });
    assert_eq!(
        seen.get(),
        Some((true, true)),
        "(on its core, after the tasks)"
    );
}
