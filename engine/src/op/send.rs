//! send from an owned buffer: `IORING_OP_SEND`, or `send(2)` after writability.

use io_uring::opcode;

use super::{cvt, cvt_sys, is_uring, Op, SharedFd};
use crate::buf::{BufResult, IoBuf};
use crate::driver::epoll::Direction;

/// Sends `buf[offset..bytes_init]` once (a short send is possible).
pub(crate) async fn send<B: IoBuf>(fd: &SharedFd, buf: B, offset: usize) -> BufResult<usize, B> {
    let len = buf.bytes_init().saturating_sub(offset);
    if is_uring() {
        let (target, fixed) = fd.uring_target();
        let op = Op::submit(buf, |b| {
            // SAFETY (pointer arithmetic): offset <= bytes_init, within the buffer.
            let ptr = b.stable_ptr().wrapping_add(offset);
            opcode::Send::new(target, ptr, len as u32)
                .flags(libc::MSG_NOSIGNAL)
                .build()
                .flags(fixed)
        });
        let (res, _, buf) = op.await;
        (cvt(res).map(|n| n as usize), buf)
    } else {
        let ptr = buf.stable_ptr().wrapping_add(offset);
        let r = fd
            .retry(Direction::Write, || {
                // SAFETY: ptr/len lie within the owned buffer, alive across the await.
                cvt_sys(unsafe {
                    libc::send(
                        fd.raw(),
                        ptr as *const libc::c_void,
                        len,
                        libc::MSG_NOSIGNAL,
                    )
                })
            })
            .await;
        (r, buf)
    }
}
