//! recv into an owned buffer: `IORING_OP_RECV`, or `recv(2)` after readability.

use io_uring::opcode;

use super::{cvt, cvt_sys, is_uring, Op, SharedFd};
use crate::buf::{BufResult, IoBufMut};
use crate::driver::epoll::Direction;

/// Reads into `buf[offset..bytes_total]`; on success the first `offset + n` bytes are
/// initialised (the caller guarantees the first `offset` already were).
pub(crate) async fn recv<B: IoBufMut>(
    fd: &SharedFd,
    mut buf: B,
    offset: usize,
) -> BufResult<usize, B> {
    let len = buf.bytes_total().saturating_sub(offset);
    let r = if is_uring() {
        let (target, fixed) = fd.uring_target();
        let op = Op::submit(buf, |b| {
            let ptr = b.stable_mut_ptr().wrapping_add(offset);
            opcode::Recv::new(target, ptr, len as u32)
                .build()
                .flags(fixed)
        });
        let (res, _, b) = op.await;
        buf = b;
        cvt(res).map(|n| n as usize)
    } else {
        let ptr = buf.stable_mut_ptr().wrapping_add(offset);
        fd.retry(Direction::Read, || {
            // SAFETY: ptr/len describe the buffer's writable memory past the offset, alive
            // across the await because `buf` is owned by this future.
            cvt_sys(unsafe { libc::recv(fd.raw(), ptr as *mut libc::c_void, len, 0) })
        })
        .await
    };
    if let Ok(n) = r {
        // SAFETY: n bytes were written after the offset; the caller vouches for the rest.
        unsafe { buf.set_init(offset + n) };
    }
    (r, buf)
}
