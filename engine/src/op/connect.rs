//! connect: `IORING_OP_CONNECT`, or a non-blocking connect that waits for writability.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd};

use io_uring::{opcode, types};

use super::{cvt, is_uring, Op, SharedFd};
use crate::driver::epoll::Direction;
use crate::net::addr::RawAddr;

pub(crate) fn socket(addr: &SocketAddr) -> io::Result<OwnedFd> {
    let domain = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall.
    let fd = unsafe {
        libc::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) async fn connect(fd: &SharedFd, addr: SocketAddr) -> io::Result<()> {
    if is_uring() {
        let op = Op::submit(RawAddr::from_addr(&addr), |a| {
            opcode::Connect::new(types::Fd(fd.raw()), a.as_ptr(), a.len).build()
        });
        let (res, _, _) = op.await;
        cvt(res).map(drop)
    } else {
        let raw = RawAddr::from_addr(&addr);
        // SAFETY: raw is a valid sockaddr of raw.len bytes.
        let rc = unsafe { libc::connect(fd.raw(), raw.as_ptr(), raw.len) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(err);
        }
        fd.retry(Direction::Write, || {
            let so_err = crate::net::getsockopt_int(fd.raw(), libc::SOL_SOCKET, libc::SO_ERROR)?;
            if so_err != 0 {
                return Err(io::Error::from_raw_os_error(so_err));
            }
            // Not yet writable means not yet connected; getpeername tells.
            let mut raw = RawAddr::empty();
            let mut l = raw.len;
            // SAFETY: valid sockaddr buffer.
            if unsafe { libc::getpeername(fd.raw(), raw.as_mut_ptr(), &mut l) } < 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            Ok(())
        })
        .await
    }
}
