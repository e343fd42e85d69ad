//! recv into an owned buffer: `IORING_OP_RECV`, or `recv(2)` after readability.

use io_uring::{opcode, types};

use super::{cvt, cvt_sys, is_uring, Op, SharedFd};
use crate::buf::{BufResult, IoBufMut};
use crate::driver::epoll::Direction;

/// Reads into `buf[0..bytes_total]`; on success the first `n` bytes are initialised.
pub(crate) async fn recv<B: IoBufMut>(fd: &SharedFd, mut buf: B) -> BufResult<usize, B> {
    if is_uring() {
        let op = Op::submit(buf, |b| {
            opcode::Recv::new(
                types::Fd(fd.raw()),
                b.stable_mut_ptr(),
                b.bytes_total() as u32,
            )
            .build()
        });
        let (res, _, mut buf) = op.await;
        let r = cvt(res).map(|n| n as usize);
        if let Ok(n) = r {
            // SAFETY: the kernel wrote n bytes at the start of the buffer.
            unsafe { buf.set_init(n) };
        }
        (r, buf)
    } else {
        let (ptr, len) = (buf.stable_mut_ptr(), buf.bytes_total());
        let r = fd
            .retry(Direction::Read, || {
                // SAFETY: ptr/len describe the buffer's writable memory, alive across the await
                // because `buf` is owned by this future.
                cvt_sys(unsafe { libc::recv(fd.raw(), ptr as *mut libc::c_void, len, 0) })
            })
            .await;
        if let Ok(n) = r {
            // SAFETY: recv wrote n bytes.
            unsafe { buf.set_init(n) };
        }
        (r, buf)
    }
}
