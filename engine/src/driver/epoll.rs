//! The epoll reactor (through mio), for hosts where io_uring cannot be set up
//! (`kernel.io_uring_disabled`, seccomp profiles in containers) or when
//! `BAREWIRE_REACTOR=epoll` asks for it.
//!
//! Operations are readiness-based here: try the syscall, and on `EAGAIN` wait for the fd to be
//! readable or writable. mio registers fds edge-triggered, so a readiness bit stays set until an
//! operation sees `EAGAIN` and clears it; no event can be lost between the two because events are
//! only processed by this core's loop, never while a task runs.

use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Token};
use slab::Slab;

use crate::stats::Stats;

const WAKE_TOKEN: Token = Token(usize::MAX);

#[derive(Default)]
struct IoState {
    readable: bool,
    writable: bool,
    error: bool,
    read_waker: Option<Waker>,
    write_waker: Option<Waker>,
}

pub(crate) struct Epoll {
    poll: RefCell<mio::Poll>,
    events: RefCell<Events>,
    ios: RefCell<Slab<IoState>>,
    wake_fd: RawFd,
}

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
            poll: RefCell::new(poll),
            events: RefCell::new(Events::with_capacity(256)),
            ios: RefCell::new(Slab::new()),
            wake_fd,
        })
    }

    /// Registers an fd for both directions; returns its token.
    pub(crate) fn register(&self, fd: RawFd) -> io::Result<usize> {
        let key = self.ios.borrow_mut().insert(IoState::default());
        let res = self.poll.borrow().registry().register(
            &mut SourceFd(&fd),
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        );
        if let Err(e) = res {
            self.ios.borrow_mut().remove(key);
            return Err(e);
        }
        Ok(key)
    }

    pub(crate) fn deregister(&self, fd: RawFd, key: usize) {
        let _ = self.poll.borrow().registry().deregister(&mut SourceFd(&fd));
        let state = self.ios.borrow_mut().try_remove(key);
        drop(state);
    }

    /// Ready when the fd was reported ready in `dir` (or errored) since the last `clear`.
    pub(crate) fn poll_ready(&self, key: usize, dir: Direction, cx: &mut Context<'_>) -> Poll<()> {
        let mut ios = self.ios.borrow_mut();
        let Some(s) = ios.get_mut(key) else {
            return Poll::Ready(());
        };
        let (ready, slot) = match dir {
            Direction::Read => (s.readable || s.error, &mut s.read_waker),
            Direction::Write => (s.writable || s.error, &mut s.write_waker),
        };
        if ready {
            return Poll::Ready(());
        }
        match slot {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => *slot = Some(cx.waker().clone()),
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

    pub(crate) fn poll(&self, stats: &Stats) -> bool {
        self.wait(Some(Duration::ZERO), stats)
    }

    pub(crate) fn park(&self, timeout: Option<Duration>, stats: &Stats) {
        self.wait(timeout, stats);
    }

    fn wait(&self, timeout: Option<Duration>, stats: &Stats) -> bool {
        let mut events = self.events.borrow_mut();
        match self.poll.borrow_mut().poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return false,
            Err(e) => panic!("epoll_wait failed: {e}"),
        }
        let mut wakers = Vec::new();
        let mut n = 0;
        for ev in events.iter() {
            n += 1;
            if ev.token() == WAKE_TOKEN {
                let mut buf = 0u64;
                // SAFETY: reading 8 bytes from an eventfd into a u64 we own.
                unsafe { libc::read(self.wake_fd, &mut buf as *mut u64 as *mut libc::c_void, 8) };
                continue;
            }
            let mut ios = self.ios.borrow_mut();
            let Some(s) = ios.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_error() {
                s.error = true;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                s.readable = true;
                wakers.extend(s.read_waker.take());
            }
            if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                s.writable = true;
                wakers.extend(s.write_waker.take());
            }
        }
        drop(events);
        stats.ops_completed.set(stats.ops_completed.get() + n);
        for w in wakers {
            w.wake();
        }
        n > 0
    }
}
