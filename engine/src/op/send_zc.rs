//! Zero-copy send: `IORING_OP_SEND_ZC` (6.0). The kernel pins the pages instead of copying; the
//! buffer is handed back only after the second CQE (`IORING_CQE_F_NOTIF`) says the network stack
//! has released it. On epoll cores this is a plain `send`.

use io_uring::opcode;

use super::{cvt, is_uring, Op, SharedFd};
use crate::buf::{BufResult, IoBuf};

pub(crate) async fn send_zc<B: IoBuf>(fd: &SharedFd, buf: B) -> BufResult<usize, B> {
    if !is_uring() {
        return super::send::send(fd, buf, 0).await;
    }
    let (target, fixed) = fd.uring_target();
    let op = Op::submit(buf, |b| {
        opcode::SendZc::new(target, b.stable_ptr(), b.bytes_init() as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build()
            .flags(fixed)
    });
    let (res, _, buf) = op.await;
    (cvt(res).map(|n| n as usize), buf)
}
