//! Datagrams with an address: `IORING_OP_SENDMSG` / `IORING_OP_RECVMSG` with a `msghdr` that
//! names the peer, or `sendto(2)` / `recvfrom(2)` after readiness on the epoll reactor.
//!
//! On io_uring both first try the system call without waiting (`MSG_DONTWAIT`): a datagram
//! send almost never has to wait, and a receive often finds a datagram queued. Only when it
//! would block does an operation go through the ring. Through the ring, an operation costs a
//! pass of the core's loop to submit and another to reap; on a core busy with long tasks
//! (a compute kernel between yields) that delay adds up over the several datagrams of one
//! failure-detector round trip and was enough to have a healthy member suspected.

use std::net::SocketAddr;

use io_uring::opcode;

use super::{cvt, cvt_sys, is_uring, Op, SharedFd};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::driver::epoll::Direction;
use crate::net::addr::RawAddr;

/// What the kernel reads or fills while the op is in flight, at one heap address.
struct Msg<B> {
    buf: B,
    addr: Box<RawAddr>,
    iov: libc::iovec,
    msg: libc::msghdr,
}

fn msg<B>(buf: B, addr: Box<RawAddr>, ptr: *mut u8, len: usize) -> Box<Msg<B>> {
    // SAFETY: msghdr is plain old data; zero is "no name, no iovecs, no control".
    let hdr: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut m = Box::new(Msg {
        buf,
        addr,
        iov: libc::iovec {
            iov_base: ptr as *mut libc::c_void,
            iov_len: len,
        },
        msg: hdr,
    });
    m.msg.msg_name = m.addr.as_mut_ptr() as *mut libc::c_void;
    m.msg.msg_namelen = m.addr.len;
    m.msg.msg_iov = &mut m.iov;
    m.msg.msg_iovlen = 1;
    m
}

/// Sends the initialised bytes of `buf` as one datagram to `to`.
pub(crate) async fn send_to<B: IoBuf>(
    fd: &SharedFd,
    buf: B,
    to: SocketAddr,
) -> BufResult<usize, B> {
    let (ptr, len) = (buf.stable_ptr() as *mut u8, buf.bytes_init());
    let m = msg(buf, RawAddr::from_addr(&to), ptr, len);
    if is_uring() {
        // SAFETY: the msghdr addresses the buffer and sockaddr `m` owns, alive for the call.
        let now = cvt_sys(unsafe {
            libc::sendmsg(fd.raw(), &m.msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        });
        if !matches!(&now, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
            return (now, m.buf);
        }
        let (target, fixed) = fd.uring_target();
        let op = Op::submit(m, |m| {
            opcode::SendMsg::new(target, &m.msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
                .flags(fixed)
        });
        let (res, _, m) = op.await;
        (cvt(res).map(|n| n as usize), m.buf)
    } else {
        let r = fd
            .retry(Direction::Write, || {
                // SAFETY: msg names an address and an iovec over `m.buf`, all owned by `m`,
                // alive across the await.
                cvt_sys(unsafe { libc::sendmsg(fd.raw(), &m.msg, libc::MSG_NOSIGNAL) })
            })
            .await;
        (r, m.buf)
    }
}

/// Receives one datagram into `buf` (from its start; a longer datagram is cut to the buffer):
/// its length and sender.
pub(crate) async fn recv_from<B: IoBufMut>(
    fd: &SharedFd,
    mut buf: B,
) -> BufResult<(usize, SocketAddr), B> {
    let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
    let mut m = msg(buf, RawAddr::empty(), ptr, len);
    let now = if is_uring() {
        // SAFETY: the msghdr addresses the buffer and sockaddr `m` owns, alive for the call;
        // recvmsg writes only inside them.
        cvt_sys(unsafe { libc::recvmsg(fd.raw(), &mut m.msg, libc::MSG_DONTWAIT) })
    } else {
        Err(std::io::ErrorKind::WouldBlock.into())
    };
    let r = if !matches!(&now, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock) {
        now
    } else if is_uring() {
        let (target, fixed) = fd.uring_target();
        let op = Op::submit(m, |m| {
            opcode::RecvMsg::new(target, &mut m.msg)
                .build()
                .flags(fixed)
        });
        let (res, _, back) = op.await;
        m = back;
        cvt(res).map(|n| n as usize)
    } else {
        let hdr: *mut libc::msghdr = &mut m.msg;
        fd.retry(Direction::Read, || {
            // SAFETY: the msghdr points at an address buffer and an iovec over `m.buf`, all
            // owned by `m` and alive across the await; recvmsg writes only inside them.
            cvt_sys(unsafe { libc::recvmsg(fd.raw(), hdr, 0) })
        })
        .await
    };
    match r {
        Ok(n) => {
            m.addr.len = m.msg.msg_namelen;
            let from = m.addr.to_addr();
            // SAFETY: the kernel wrote n bytes at the start of the buffer.
            unsafe { m.buf.set_init(n) };
            (from.map(|a| (n, a)), m.buf)
        }
        Err(e) => (Err(e), m.buf),
    }
}
