//! Positional file I/O: `IORING_OP_READ`/`WRITE`, and `READ_FIXED`/`WRITE_FIXED` on buffers of
//! the registered pool. Regular files never report `EAGAIN`, so on epoll cores these are plain
//! `pread`/`pwrite`.

use std::os::fd::RawFd;

use io_uring::{opcode, types};

use super::{cvt, cvt_sys, is_uring, Op};
use crate::buf::{BufResult, IoBuf, IoBufMut};
use crate::pool::FixedBuf;

pub(crate) async fn read_at<B: IoBufMut>(fd: RawFd, mut buf: B, pos: u64) -> BufResult<usize, B> {
    let r = if is_uring() {
        let op = Op::submit(buf, |b| {
            opcode::Read::new(types::Fd(fd), b.stable_mut_ptr(), b.bytes_total() as u32)
                .offset(pos)
                .build()
        });
        let (res, _, b) = op.await;
        buf = b;
        cvt(res).map(|n| n as usize)
    } else {
        // SAFETY: the buffer's writable memory, owned by this future.
        cvt_sys(unsafe {
            libc::pread(
                fd,
                buf.stable_mut_ptr() as *mut libc::c_void,
                buf.bytes_total(),
                pos as libc::off_t,
            )
        })
    };
    if let Ok(n) = r {
        // SAFETY: n bytes were written at the start of the buffer.
        unsafe { buf.set_init(n) };
    }
    (r, buf)
}

pub(crate) async fn write_at<B: IoBuf>(fd: RawFd, buf: B, pos: u64) -> BufResult<usize, B> {
    if is_uring() {
        let op = Op::submit(buf, |b| {
            opcode::Write::new(types::Fd(fd), b.stable_ptr(), b.bytes_init() as u32)
                .offset(pos)
                .build()
        });
        let (res, _, b) = op.await;
        (cvt(res).map(|n| n as usize), b)
    } else {
        // SAFETY: the buffer's initialised memory, owned by this future.
        let r = cvt_sys(unsafe {
            libc::pwrite(
                fd,
                buf.stable_ptr() as *const libc::c_void,
                buf.bytes_init(),
                pos as libc::off_t,
            )
        });
        (r, buf)
    }
}

pub(crate) async fn read_fixed_at(
    fd: RawFd,
    mut buf: FixedBuf,
    pos: u64,
) -> BufResult<usize, FixedBuf> {
    let r = match buf.uring_index() {
        Some(index) if is_uring() => {
            let op = Op::submit(buf, |b| {
                opcode::ReadFixed::new(
                    types::Fd(fd),
                    b.stable_mut_ptr(),
                    b.bytes_total() as u32,
                    index,
                )
                .offset(pos)
                .build()
            });
            let (res, _, b) = op.await;
            buf = b;
            cvt(res).map(|n| n as usize)
        }
        _ => return read_at(fd, buf, pos).await,
    };
    if let Ok(n) = r {
        // SAFETY: n bytes were written at the start of the buffer.
        unsafe { buf.set_init(n) };
    }
    (r, buf)
}

pub(crate) async fn write_fixed_at(
    fd: RawFd,
    buf: FixedBuf,
    pos: u64,
) -> BufResult<usize, FixedBuf> {
    match buf.uring_index() {
        Some(index) if is_uring() => {
            let op = Op::submit(buf, |b| {
                opcode::WriteFixed::new(types::Fd(fd), b.stable_ptr(), b.bytes_init() as u32, index)
                    .offset(pos)
                    .build()
            });
            let (res, _, b) = op.await;
            (cvt(res).map(|n| n as usize), b)
        }
        _ => write_at(fd, buf, pos).await,
    }
}
