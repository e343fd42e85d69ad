//! accept: one-shot (`IORING_OP_ACCEPT`) and multishot (`IORING_ACCEPT_MULTISHOT`, 5.19).

use std::any::Any;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd};

use io_uring::{opcode, types};

use super::{cvt, is_uring, MultiOp, Op, SharedFd};
use crate::driver::epoll::Direction;
use crate::net::addr::{socket_addr, RawAddr};

const FLAGS: i32 = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;

/// An fd accepted for a future that was dropped is closed, not leaked.
fn close_orphan(_: &mut dyn Any, res: i32, _: u32) {
    if res >= 0 {
        // SAFETY: the kernel handed us this new fd and nobody else knows it.
        unsafe { libc::close(res) };
    }
}

fn owned(res: i32) -> io::Result<OwnedFd> {
    let fd = cvt(res)? as i32;
    // SAFETY: a successful accept returns a fresh fd that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) async fn accept(listener: &SharedFd) -> io::Result<(OwnedFd, SocketAddr)> {
    if is_uring() {
        let op = Op::submit(RawAddr::empty(), |a| {
            opcode::Accept::new(types::Fd(listener.raw()), a.as_mut_ptr(), &mut a.len)
                .flags(FLAGS)
                .build()
        })
        .on_orphan(close_orphan);
        let (res, _, addr) = op.await;
        let fd = owned(res)?;
        Ok((fd, addr.to_addr()?))
    } else {
        listener
            .retry(Direction::Read, || {
                let mut addr = RawAddr::empty();
                // SAFETY: addr is a valid sockaddr buffer with its length.
                let fd = unsafe {
                    libc::accept4(listener.raw(), addr.as_mut_ptr(), &mut addr.len, FLAGS)
                };
                let fd = if fd < 0 {
                    return Err(io::Error::last_os_error());
                } else {
                    fd
                };
                // SAFETY: fresh fd from accept4.
                Ok((unsafe { OwnedFd::from_raw_fd(fd) }, addr.to_addr()?))
            })
            .await
    }
}

/// A stream of accepted connections: one multishot SQE serves them all on io_uring.
pub(crate) struct Incoming {
    multi: Option<MultiOp>,
}

impl Incoming {
    pub(crate) fn new() -> Self {
        Incoming { multi: None }
    }

    pub(crate) async fn next(&mut self, listener: &SharedFd) -> io::Result<(OwnedFd, SocketAddr)> {
        if !is_uring() {
            return accept(listener).await;
        }
        loop {
            let multi = self.multi.get_or_insert_with(|| {
                MultiOp::submit(
                    opcode::AcceptMulti::new(types::Fd(listener.raw()))
                        .flags(FLAGS)
                        .build(),
                    Some(close_orphan),
                )
            });
            match std::future::poll_fn(|cx| multi.poll_next(cx)).await {
                Some((res, _)) => {
                    let fd = owned(res)?;
                    let peer = socket_addr(std::os::fd::AsRawFd::as_raw_fd(&fd), true)?;
                    return Ok((fd, peer));
                }
                // The kernel ended the multishot (an error CQE was already returned, or the
                // CQ overflowed): arm a new one.
                None => self.multi = None,
            }
        }
    }
}
