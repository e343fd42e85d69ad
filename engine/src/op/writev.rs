//! Gather send: `IORING_OP_SENDMSG` with an iovec per buffer, or `sendmsg(2)` after
//! writability. One syscall (or one SQE) sends a header and a payload from separate memory.

use io_uring::opcode;

use super::{cvt, cvt_sys, is_uring, Op, SharedFd};
use crate::buf::{BufResult, IoBuf};
use crate::driver::epoll::Direction;

struct Gather<B> {
    bufs: Vec<B>,
    iovecs: Vec<libc::iovec>,
    msg: libc::msghdr,
}

fn gather<B: IoBuf>(bufs: Vec<B>) -> Box<Gather<B>> {
    let iovecs = bufs
        .iter()
        .map(|b| libc::iovec {
            iov_base: b.stable_ptr() as *mut libc::c_void,
            iov_len: b.bytes_init(),
        })
        .collect();
    // SAFETY: msghdr is plain old data; zero is "no name, no control".
    let msg: libc::msghdr = unsafe { std::mem::zeroed() };
    let mut g = Box::new(Gather { bufs, iovecs, msg });
    g.msg.msg_iov = g.iovecs.as_mut_ptr();
    g.msg.msg_iovlen = g.iovecs.len();
    g
}

/// Sends the initialised bytes of every buffer, in order, with one gather call (a short send is
/// possible; the count says how far it got).
pub(crate) async fn writev<B: IoBuf>(fd: &SharedFd, bufs: Vec<B>) -> BufResult<usize, Vec<B>> {
    let g = gather(bufs);
    if is_uring() {
        let (target, fixed) = fd.uring_target();
        let op = Op::submit(g, |g| {
            opcode::SendMsg::new(target, &g.msg)
                .flags(libc::MSG_NOSIGNAL as u32)
                .build()
                .flags(fixed)
        });
        let (res, _, g) = op.await;
        (cvt(res).map(|n| n as usize), g.bufs)
    } else {
        let r = fd
            .retry(Direction::Write, || {
                // SAFETY: msg points at iovecs over buffers owned by `g`, alive across the await.
                cvt_sys(unsafe { libc::sendmsg(fd.raw(), &g.msg, libc::MSG_NOSIGNAL) })
            })
            .await;
        (r, g.bufs)
    }
}
