//! The epoll reactor (through mio), for hosts where io_uring cannot be set up
//! (`kernel.io_uring_disabled`, seccomp profiles in containers) or when
//! `BAREWIRE_REACTOR=epoll` asks for it.
//!
//! Operations are readiness-based here: try the syscall, and on `EAGAIN` wait for the fd to be
//! readable or writable. mio registers fds edge-triggered, so a readiness bit stays set until an
//! operation sees `EAGAIN` and clears it; no event can be lost between the two because events are
//! only processed by this core's loop, never while a task runs.
//!
//! The core waits with `epoll_pwait2` (Linux 5.11), whose timeout is a `timespec`: a timer due
//! in 200 µs wakes a sleeping core after 200 µs, as under io_uring, where `epoll_wait` (and mio's
//! `Poll::poll` over it) counts in whole milliseconds and would round it up to one. Kernels
//! without it (or a seccomp profile that refuses it) get `epoll_wait`, with the timeout rounded
//! up to the next millisecond, never down: a timer may then fire up to a millisecond late, never
//! early.

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Interest, Token};
use slab::Slab;

use crate::stats::Stats;

const WAKE_TOKEN: Token = Token(usize::MAX);

#[derive(Default)]
struct IoState {
    /// Registered for relaxed waits (`register_waits`): its wakers count in `relaxed`, not
    /// in `waiting`.
    relaxed: bool,
    readable: bool,
    writable: bool,
    error: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

pub(crate) struct Epoll {
    /// The epoll instance: fds are registered through mio, and waited on directly (see the
    /// module's docs), which mio's events would not let us do with a finer timeout.
    poll: mio::Poll,
    events: RefCell<Vec<libc::epoll_event>>,
    ios: RefCell<Slab<IoState>>,
    /// Wakers held in `ios`: tasks waiting for an event. While there are none, a pass of the
    /// core's loop asks the kernel nothing (`poll`): the events wait in the kernel's ready list
    /// for the next wait that has a task to wake, or for the core's sleep, which they end.
    waiting: Cell<usize>,
    /// Wakers of relaxed waits (`register_waits`): while these are the only ones, a pass asks
    /// the kernel once every `RELAXED_EVERY` passes.
    relaxed: Cell<usize>,
    /// Passes since the last one that asked for relaxed waits' sake.
    relaxed_passes: Cell<u32>,
    wake_fd: RawFd,
    /// `epoll_pwait2` failed with `ENOSYS` or `EPERM`: wait with `epoll_wait` from now on.
    no_pwait2: Cell<bool>,
}

/// Events taken per wait.
const EVENTS: usize = 256;

/// While only relaxed waits are pending, a busy core asks the kernel for events once every this
/// many passes (a sleeping core's wait takes them at once). An idle pass of a spinning core is
/// a few hundred nanoseconds, so this is some microseconds there; it grows with the tasks that
/// a pass runs.
pub(crate) const RELAXED_EVERY: u32 = 64;

/// Which direction an operation waits for.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Direction {
    Read,
    Write,
}

impl Epoll {
    pub(crate) fn new(wake_fd: RawFd) -> io::Result<Epoll> {
        let poll = mio::Poll::new()?;
        poll.registry()
            .register(&mut SourceFd(&wake_fd), WAKE_TOKEN, Interest::READABLE)?;
        Ok(Epoll {
            poll,
            events: RefCell::new(vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS]),
            ios: RefCell::new(Slab::new()),
            waiting: Cell::new(0),
            relaxed: Cell::new(0),
            relaxed_passes: Cell::new(0),
            wake_fd,
            no_pwait2: Cell::new(false),
        })
    }

    /// Registers an fd for both directions; returns its token.
    pub(crate) fn register(&self, fd: RawFd) -> io::Result<usize> {
        self.register_for(fd, Interest::READABLE | Interest::WRITABLE)
    }

    /// Registers an fd for both directions, for ordinary waits or (`relaxed`) for waits that
    /// need not be seen on the pass after the event: while the only tasks waiting are on
    /// relaxed fds, a busy core asks the kernel once every [`RELAXED_EVERY`] passes instead of
    /// on each (see `poll`). A sleeping core wakes for them at once.
    pub(crate) fn register_waits(&self, fd: RawFd, relaxed: bool) -> io::Result<usize> {
        let key = self.register(fd)?;
        self.ios.borrow_mut()[key].relaxed = relaxed;
        Ok(key)
    }

    /// Tasks waiting now: (ordinary waits, relaxed waits).
    #[cfg(test)]
    pub(crate) fn waiter_counts(&self) -> (usize, usize) {
        (self.waiting.get(), self.relaxed.get())
    }

    /// [`waiter_counts`](Self::waiter_counts) of the current core, which runs this reactor.
    #[cfg(test)]
    pub(crate) fn waiters_here() -> (usize, usize) {
        crate::core::with_core(|c| match &c.driver {
            super::Driver::Epoll(e) => e.waiter_counts(),
            super::Driver::Uring(_) => unreachable!("an epoll runtime"),
        })
    }

    /// A one-core runtime on this reactor, for tests of its waits.
    #[cfg(test)]
    pub(crate) fn test_runtime() -> crate::Runtime {
        crate::Runtime::builder()
            .cores(1)
            .pin(false)
            .reactor(crate::Reactor::Epoll)
            .build()
            .unwrap()
    }

    /// The waiter count a waker of `s` belongs to.
    fn count_of(&self, s: &IoState) -> &Cell<usize> {
        if s.relaxed {
            &self.relaxed
        } else {
            &self.waiting
        }
    }

    /// Registers an fd for readability alone, for as long as its owner keeps it: each new
    /// event (the registration is edge-triggered) makes a sleeping core's wait return, and
    /// wakes no task, as nothing polls its state. See `op::poll_fd::WakeSource`.
    pub(crate) fn watch(&self, fd: RawFd) -> io::Result<usize> {
        self.register_for(fd, Interest::READABLE)
    }

    fn register_for(&self, fd: RawFd, interest: Interest) -> io::Result<usize> {
        let key = self.ios.borrow_mut().insert(IoState::default());
        let res = self
            .poll
            .registry()
            .register(&mut SourceFd(&fd), Token(key), interest);
        if let Err(e) = res {
            self.ios.borrow_mut().remove(key);
            return Err(e);
        }
        Ok(key)
    }

    pub(crate) fn deregister(&self, fd: RawFd, key: usize) {
        let _ = self.poll.registry().deregister(&mut SourceFd(&fd));
        let state = self.ios.borrow_mut().try_remove(key);
        if let Some(s) = &state {
            let held = s.read_waker.is_some() as usize + s.write_waker.is_some() as usize;
            let count = self.count_of(s);
            count.set(count.get() - held);
        }
        drop(state);
    }

    /// Ready when the fd was reported ready in `dir` (or errored) since the last `clear`.
    pub(crate) fn poll_ready(&self, key: usize, dir: Direction, cx: &mut Context<'_>) -> Poll<()> {
        let mut ios = self.ios.borrow_mut();
        let Some(s) = ios.get_mut(key) else {
            return Poll::Ready(());
        };
        let count = self.count_of(s);
        let (ready, slot) = match dir {
            Direction::Read => (s.readable || s.error, &mut s.read_waker),
            Direction::Write => (s.writable || s.error, &mut s.write_waker),
        };
        if ready {
            return Poll::Ready(());
        }
        match slot {
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => w.clone_from(cx.waker()),
            None => {
                *slot = Some(cx.waker().clone());
                count.set(count.get() + 1);
            }
        }
        Poll::Pending
    }

    /// An operation saw EAGAIN: forget the readiness until the next event.
    pub(crate) fn clear(&self, key: usize, dir: Direction) {
        if let Some(s) = self.ios.borrow_mut().get_mut(key) {
            match dir {
                Direction::Read => s.readable = false,
                Direction::Write => s.writable = false,
            }
        }
    }

    /// A pass's look at the kernel's events: none while no task waits for one (see
    /// `waiting`), which spares an idle or spinning core a system call per pass; one every
    /// [`RELAXED_EVERY`] passes while only relaxed waits are pending.
    pub(crate) fn poll(&self, stats: &Stats) -> bool {
        if self.waiting.get() == 0 {
            if self.relaxed.get() == 0 {
                return false;
            }
            let n = self.relaxed_passes.get() + 1;
            if n < RELAXED_EVERY {
                self.relaxed_passes.set(n);
                return false;
            }
        }
        self.wait(Some(Duration::ZERO), stats)
    }

    pub(crate) fn park(&self, timeout: Option<Duration>, stats: &Stats) {
        self.wait(timeout, stats);
    }

    fn wait(&self, timeout: Option<Duration>, stats: &Stats) -> bool {
        let mut events = self.events.borrow_mut();
        let n = match self.epoll_wait(&mut events, timeout) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return false,
            Err(e) => panic!("epoll_wait failed: {e}"),
        };
        self.relaxed_passes.set(0);
        let mut wakers = Vec::new();
        // Wakers taken from relaxed registrations (the rest are counted in `waiting`).
        let mut relaxed = 0;
        for ev in &events[..n] {
            // (Copied out: the kernel's struct is packed on x86-64.)
            let (bits, token) = (ev.events as libc::c_int, ev.u64 as usize);
            if token == WAKE_TOKEN.0 {
                let mut buf = 0u64;
                // SAFETY: reading 8 bytes from an eventfd into a u64 we own.
                unsafe { libc::read(self.wake_fd, &mut buf as *mut u64 as *mut libc::c_void, 8) };
                continue;
            }
            let mut ios = self.ios.borrow_mut();
            let Some(s) = ios.get_mut(token) else {
                continue;
            };
            // A hang-up or an error wakes both directions: the operation then sees it.
            let (hup, err) = (bits & libc::EPOLLHUP != 0, bits & libc::EPOLLERR != 0);
            if err {
                s.error = true;
            }
            let before = wakers.len();
            if bits & (libc::EPOLLIN | libc::EPOLLPRI) != 0 || hup || err {
                s.readable = true;
                wakers.extend(s.read_waker.take());
            }
            if bits & libc::EPOLLOUT != 0 || hup || err {
                s.writable = true;
                wakers.extend(s.write_waker.take());
            }
            if s.relaxed {
                relaxed += wakers.len() - before;
            }
        }
        drop(events);
        // Each waker taken above left its slot empty.
        self.waiting
            .set(self.waiting.get() - (wakers.len() - relaxed));
        self.relaxed.set(self.relaxed.get() - relaxed);
        stats
            .ops_completed
            .set(stats.ops_completed.get() + n as u64);
        for w in wakers {
            w.wake();
        }
        n > 0
    }

    /// Waits up to `timeout` (for ever with `None`) for events into `events`; returns how many
    /// came. To the nanosecond with `epoll_pwait2`, else in milliseconds rounded up.
    fn epoll_wait(
        &self,
        events: &mut [libc::epoll_event],
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let fd = self.poll.as_raw_fd();
        let max = events.len() as libc::c_int;
        let sub_ms = timeout.filter(|t| t.subsec_nanos() % 1_000_000 != 0);
        if let Some(t) = sub_ms.filter(|_| !self.no_pwait2.get()) {
            let ts = libc::timespec {
                tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
                tv_nsec: t.subsec_nanos() as libc::c_long,
            };
            // SAFETY: `fd` is this core's epoll instance, `events` holds `max` entries the
            // kernel may write, `ts` outlives the call, and no signal mask is passed.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_epoll_pwait2,
                    fd,
                    events.as_mut_ptr(),
                    max,
                    &ts as *const libc::timespec,
                    std::ptr::null::<libc::sigset_t>(),
                    0usize,
                )
            };
            if r >= 0 {
                return Ok(r as usize);
            }
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) {
                return Err(e);
            }
            self.no_pwait2.set(true);
        }
        let ms = match timeout {
            None => -1,
            // Rounded up: a timer never fires early.
            Some(t) => t
                .as_nanos()
                .div_ceil(1_000_000)
                .min(libc::c_int::MAX as u128) as libc::c_int,
        };
        // SAFETY: as above, with a timeout in milliseconds.
        let r = unsafe { libc::epoll_wait(fd, events.as_mut_ptr(), max, ms) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(r as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Both ways of waiting honour a sub-millisecond timeout and never return early with
    /// nothing to report: `epoll_pwait2` to the nanosecond, and the `epoll_wait` fallback
    /// rounded up to a whole millisecond (the fallback's lower bound shows the rounding goes
    /// up, not down to zero, which would make an idle core spin).
    #[test]
    fn a_wait_lasts_its_timeout_on_either_path() {
        // SAFETY: eventfd with valid flags; closed below.
        let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        assert!(wake >= 0);
        let ep = Epoll::new(wake).unwrap();
        let stats = Stats::default();
        let waited = |ep: &Epoll| {
            let t0 = Instant::now();
            assert!(!ep.wait(Some(Duration::from_micros(300)), &stats));
            t0.elapsed()
        };
        let fine = waited(&ep);
        assert!(fine >= Duration::from_micros(300), "{fine:?}");
        if !ep.no_pwait2.get() {
            ep.no_pwait2.set(true);
            let coarse = waited(&ep);
            assert!(coarse >= Duration::from_millis(1), "{coarse:?}");
        }
        // SAFETY: our own eventfd, closed once.
        unsafe { libc::close(wake) };
    }

    /// A reactor on an eventfd of its own (closed on drop), and a waker that counts its wakes.
    struct Fixture {
        ep: Epoll,
        wake: RawFd,
        count: std::sync::Arc<Count>,
        waker: Waker,
    }

    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Fixture {
        fn new() -> Fixture {
            // SAFETY: eventfd with valid flags; closed on drop.
            let wake = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            assert!(wake >= 0);
            let count = std::sync::Arc::new(Count(Default::default()));
            Fixture {
                ep: Epoll::new(wake).unwrap(),
                wake,
                waker: Waker::from(count.clone()),
                count,
            }
        }

        /// Wakes so far.
        fn woken(&self) -> usize {
            self.count.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            // SAFETY: our own eventfd, closed once.
            unsafe { libc::close(self.wake) };
        }
    }

    /// A pass asks the kernel for events only while a task waits for one, and the count of
    /// waiting tasks follows the wakers: up when one is stored, down when an event takes it or
    /// its fd is deregistered. (Counted wrongly, a pass would either ask for nothing while a
    /// task waits, and the task would hang, or ask on every pass, as before.)
    #[test]
    fn a_pass_asks_for_events_only_while_a_task_waits() {
        use std::io::Write;

        let f = Fixture::new();
        let ep = &f.ep;
        let stats = Stats::default();
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let key = ep.register(a.as_raw_fd()).unwrap();
        let mut cx = Context::from_waker(&f.waker);

        b.write_all(b"x").unwrap();
        assert!(!ep.poll(&stats), "no task waits: the pass asks for nothing");
        assert!(!ep.ios.borrow()[key].readable);

        // Polled twice by the same task: one waiter.
        assert!(ep.poll_ready(key, Direction::Read, &mut cx).is_pending());
        assert!(ep.poll_ready(key, Direction::Read, &mut cx).is_pending());
        assert_eq!(ep.waiting.get(), 1);
        assert!(ep.poll(&stats), "a task waits: the pass takes the event");
        assert_eq!(f.woken(), 1, "and wakes the task");
        assert_eq!(ep.waiting.get(), 0);
        assert!(ep.poll_ready(key, Direction::Read, &mut cx).is_ready());

        // A waiter whose fd goes away is no longer counted.
        ep.clear(key, Direction::Read);
        assert!(ep.poll_ready(key, Direction::Read, &mut cx).is_pending());
        assert!(ep.poll_ready(key, Direction::Write, &mut cx).is_ready());
        assert_eq!(ep.waiting.get(), 1);
        ep.deregister(a.as_raw_fd(), key);
        assert_eq!(ep.waiting.get(), 0);
        assert!(!ep.poll(&stats));
    }

    /// While only relaxed waits are pending, a pass asks the kernel once every `RELAXED_EVERY`
    /// passes, and that ask wakes the relaxed waiter; a waiter of the ordinary kind makes every
    /// pass ask again; a sleep's wait takes a relaxed event at once; and the relaxed count
    /// follows its wakers as `waiting` does. (Counted into `waiting`, a relaxed wait would make
    /// every pass ask; never asked for, it would wait for the core's next sleep.)
    #[test]
    fn relaxed_waits_are_asked_for_once_every_few_passes_and_at_each_sleep() {
        use std::io::Write;

        let f = Fixture::new();
        let ep = &f.ep;
        let stats = Stats::default();
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let (c, mut d) = std::os::unix::net::UnixStream::pair().unwrap();
        let relaxed = ep.register_waits(a.as_raw_fd(), true).unwrap();
        let eager = ep.register(c.as_raw_fd()).unwrap();
        let mut cx = Context::from_waker(&f.waker);
        let woken = || f.woken();
        // The relaxed waiter, after its event was taken, waits for the next one.
        let wait_again = |cx: &mut Context<'_>| {
            ep.clear(relaxed, Direction::Read);
            assert!(ep.poll_ready(relaxed, Direction::Read, cx).is_pending());
        };

        assert!(ep
            .poll_ready(relaxed, Direction::Read, &mut cx)
            .is_pending());
        assert!(ep
            .poll_ready(relaxed, Direction::Read, &mut cx)
            .is_pending());
        assert_eq!((ep.waiting.get(), ep.relaxed.get()), (0, 1));
        b.write_all(b"x").unwrap();
        for pass in 1..RELAXED_EVERY {
            assert!(!ep.poll(&stats), "pass {pass} asked the kernel");
        }
        assert_eq!(woken(), 0);
        assert!(ep.poll(&stats), "the {RELAXED_EVERY}th pass asks");
        assert_eq!(woken(), 1, "and wakes the relaxed waiter");
        assert_eq!(ep.relaxed.get(), 0);
        assert!(!ep.poll(&stats), "no waiter left: no ask");

        // With an ordinary waiter as well, every pass asks, and the relaxed one is woken by the
        // first pass after its event.
        wait_again(&mut cx);
        assert!(ep.poll_ready(eager, Direction::Read, &mut cx).is_pending());
        assert_eq!((ep.waiting.get(), ep.relaxed.get()), (1, 1));
        b.write_all(b"y").unwrap();
        assert!(ep.poll(&stats));
        assert_eq!(woken(), 2);
        assert_eq!((ep.waiting.get(), ep.relaxed.get()), (1, 0));
        d.write_all(b"z").unwrap();
        assert!(ep.poll(&stats));
        assert_eq!((woken(), ep.waiting.get()), (3, 0));

        // A sleep takes a relaxed event at once.
        wait_again(&mut cx);
        b.write_all(b"w").unwrap();
        ep.park(Some(Duration::from_secs(5)), &stats);
        assert_eq!((woken(), ep.relaxed.get()), (4, 0));

        // A relaxed waiter whose fd goes away is no longer counted.
        wait_again(&mut cx);
        assert_eq!(ep.relaxed.get(), 1);
        ep.deregister(a.as_raw_fd(), relaxed);
        assert_eq!(ep.relaxed.get(), 0);
        for _ in 0..2 * RELAXED_EVERY {
            assert!(!ep.poll(&stats));
        }
        ep.deregister(c.as_raw_fd(), eager);
    }
}
