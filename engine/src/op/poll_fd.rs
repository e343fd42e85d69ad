//! Readiness of a foreign fd: `IORING_OP_POLL_ADD`, or an epoll registration. This is how a
//! verbs completion channel (or any fd another library owns) wakes a sleeping core: once, by a
//! task that awaits [`poll_readable`], or for as long as the source lives ([`WakeSource`]).

use std::io;
use std::marker::PhantomData;
use std::os::fd::RawFd;

use io_uring::{opcode, types};

use super::{cvt, is_uring, Op};
use crate::core::with_core;
use crate::driver::epoll::Direction;
use crate::driver::Driver;

async fn poll_fd(fd: RawFd, dir: Direction, relaxed: bool) -> io::Result<()> {
    if is_uring() {
        let mask = match dir {
            Direction::Read => libc::POLLIN,
            Direction::Write => libc::POLLOUT,
        } as u32;
        let (res, _, ()) =
            Op::submit((), |_| opcode::PollAdd::new(types::Fd(fd), mask).build()).await;
        return cvt(res).map(drop);
    }
    // The fd belongs to someone else: register it for this wait only.
    let key = with_core(|c| match &c.driver {
        Driver::Epoll(e) => e.register_waits(fd, relaxed),
        Driver::Uring(_) => unreachable!(),
    })?;
    struct Dereg(RawFd, usize);
    impl Drop for Dereg {
        fn drop(&mut self) {
            crate::core::try_with_core(|c| {
                if let Driver::Epoll(e) = &c.driver {
                    e.deregister(self.0, self.1);
                }
            });
        }
    }
    let _dereg = Dereg(fd, key);
    std::future::poll_fn(|cx| {
        with_core(|c| match &c.driver {
            Driver::Epoll(e) => e.poll_ready(key, dir, cx),
            Driver::Uring(_) => unreachable!(),
        })
    })
    .await;
    Ok(())
}

/// Waits until `fd` is readable. The fd stays owned by the caller and must stay open until the
/// future completes or is dropped.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
///     use std::io::Write;
///     (&b).write_all(b"x").unwrap();
///     barewire_engine::poll_readable(std::os::fd::AsRawFd::as_raw_fd(&a)).await.unwrap();
/// });
/// ```
pub async fn poll_readable(fd: RawFd) -> io::Result<()> {
    poll_fd(fd, Direction::Read, false).await
}

/// Waits until `fd` is readable, where the wait need not end on the core's next pass: for a
/// control-plane fd (a connection's setup or control socket, whose messages are rare and whose
/// readers can wait some microseconds).
///
/// Under io_uring it is [`poll_readable`]: the poll sits in the ring and costs nothing per
/// pass. Under the epoll reactor a pass asks the kernel for events only while a task waits for
/// one, so a task in [`poll_readable`] costs a busy core an `epoll_wait` on every pass. A
/// relaxed wait does not: while only relaxed waits are pending, a busy core asks once every 64
/// passes (some microseconds on a spinning core with nothing else to do, longer when its
/// tasks run long), and a sleeping core wakes for the fd at once, as for any other.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
///     use std::io::Write;
///     (&b).write_all(b"hello").unwrap();
///     barewire_engine::poll_readable_relaxed(std::os::fd::AsRawFd::as_raw_fd(&a)).await.unwrap();
/// });
/// ```
pub async fn poll_readable_relaxed(fd: RawFd) -> io::Result<()> {
    poll_fd(fd, Direction::Read, true).await
}

/// Waits until `fd` is writable. See [`poll_readable`].
pub async fn poll_writable(fd: RawFd) -> io::Result<()> {
    poll_fd(fd, Direction::Write, false).await
}

/// A foreign fd that wakes this core from its sleep whenever the fd becomes readable, for as
/// long as the `WakeSource` lives: one registration with the core's reactor, where a task
/// awaiting [`poll_readable`] registers and deregisters (two `epoll_ctl` calls under the epoll
/// reactor) and is spawned anew each time the core goes to sleep.
///
/// It wakes the core and no task: a [`Poller`](crate::Poller) that owns the fd looks at it on
/// the pass after the wake-up, as on every pass. Each readiness event the fd's kernel object
/// signals (a write to an eventfd, a new event in an epoll set, bytes on a socket) ends a
/// sleep, whether or not the fd was drained since the last: the registration is edge-triggered
/// under epoll, and a multishot poll under io_uring. An event that comes while the core is
/// awake at most shortens its next sleep to nothing.
///
/// Call [`arm`](Self::arm) on the way to each sleep (from
/// [`Poller::try_enter_interrupt_mode`](crate::Poller::try_enter_interrupt_mode)): under
/// io_uring the kernel may end a multishot poll (when the completion queue overflows, say),
/// and `arm` puts it back. It fails if the kernel ended the poll with an error (a kernel before
/// 5.13 has no multishot poll); the caller then waits some other way, such as a task that
/// awaits [`poll_readable`].
///
/// The fd stays owned by the caller and must stay open while the `WakeSource` lives. A
/// `WakeSource` belongs to the core that made it and is dropped there; one dropped after its
/// core ended does nothing.
///
/// ```
/// use barewire_engine::WakeSource;
/// use std::os::fd::AsRawFd;
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
///     let wake = WakeSource::readable(a.as_raw_fd()).unwrap();
///     wake.arm().unwrap();
///     // A sleeping core now wakes when `b` writes to `a`.
///     # drop(b);
/// });
/// ```
pub struct WakeSource {
    key: usize,
    fd: RawFd,
    /// The core it was registered with (`core_token`).
    core: u64,
    /// A core's registration: it stays on that core's thread.
    _core_bound: PhantomData<*const ()>,
}

impl WakeSource {
    /// Registers `fd` with the current core's reactor. Fails under epoll if the fd cannot be
    /// registered: it is closed, of a kind epoll refuses (a regular file), or already in the
    /// core's epoll set (another `WakeSource` on it, or a task awaiting [`poll_readable`] on it).
    ///
    /// # Panics
    ///
    /// Outside a barewire runtime, as [`poll_readable`] does.
    pub fn readable(fd: RawFd) -> io::Result<WakeSource> {
        with_core(|c| {
            let key = match &c.driver {
                Driver::Epoll(e) => e.watch(fd)?,
                Driver::Uring(u) => u.watch(fd),
            };
            Ok(WakeSource {
                key,
                fd,
                core: c.token,
                _core_bound: PhantomData,
            })
        })
    }

    /// Arms the source kept in `slot`, making it for `fd` first where the slot is empty: the
    /// usual call from [`Poller::try_enter_interrupt_mode`](crate::Poller::try_enter_interrupt_mode)
    /// of a poller that keeps its source beside its other state. False where it cannot be made
    /// or armed; the caller then waits some other way (a task that awaits [`poll_readable`]).
    pub fn arm_in(slot: &mut Option<WakeSource>, fd: RawFd) -> bool {
        if slot.is_none() {
            *slot = WakeSource::readable(fd).ok();
        }
        slot.as_ref().is_some_and(|w| w.arm().is_ok())
    }

    /// Makes sure the registration will end the core's next sleep when the fd becomes readable
    /// (see the type's docs). Call it on the way to each sleep, from the core that made it;
    /// from another core it fails, and outside a runtime it panics.
    pub fn arm(&self) -> io::Result<()> {
        with_core(|c| match &c.driver {
            _ if c.token != self.core => Err(io::Error::other(
                "a WakeSource is armed only on the core that made it",
            )),
            Driver::Epoll(_) => Ok(()),
            Driver::Uring(u) => u.arm_watch(self.key),
        })
    }
}

impl Drop for WakeSource {
    fn drop(&mut self) {
        crate::core::try_with_core(|c| {
            if c.token != self.core {
                return; // its core ended, and took the registration with it
            }
            match &c.driver {
                Driver::Epoll(e) => e.deregister(self.fd, self.key),
                Driver::Uring(u) => u.unwatch(self.key),
            }
        });
    }
}

impl std::fmt::Debug for WakeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WakeSource").field("fd", &self.fd).finish()
    }
}
