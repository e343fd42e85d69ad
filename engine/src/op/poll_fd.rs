//! Readiness of a foreign fd: `IORING_OP_POLL_ADD`, or an epoll registration. This is how a
//! verbs completion channel (or any fd another library owns) wakes a sleeping core.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types};

use super::{cvt, is_uring, Op};
use crate::core::with_core;
use crate::driver::epoll::Direction;
use crate::driver::Driver;

async fn poll_fd(fd: RawFd, dir: Direction) -> io::Result<()> {
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
        Driver::Epoll(e) => e.register(fd),
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
    poll_fd(fd, Direction::Read).await
}

/// Waits until `fd` is writable. See [`poll_readable`].
pub async fn poll_writable(fd: RawFd) -> io::Result<()> {
    poll_fd(fd, Direction::Write).await
}
