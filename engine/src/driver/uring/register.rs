//! Registering the ring's own descriptor, so that each enter names it by index.

use std::os::fd::RawFd;

use io_uring::IoUring;

/// io_uring_register(2) opcodes that register and unregister ring descriptors (5.18).
pub(super) const IORING_REGISTER_RING_FDS: libc::c_uint = 20;
pub(super) const IORING_UNREGISTER_RING_FDS: libc::c_uint = 21;

/// `struct io_uring_rsrc_update`.
#[repr(C)]
pub(super) struct RsrcUpdate {
    pub(super) offset: u32,
    pub(super) resv: u32,
    pub(super) data: u64,
}

/// Registers `ring`'s descriptor among the calling thread's registered rings; its index, or
/// `None` where the kernel refuses (before 5.18, or a table full of them).
pub(super) fn register_ring_fd(ring: &IoUring) -> Option<u32> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(ring);
    // Any free index (`offset` u32::MAX); the kernel writes the one it took back.
    let mut up = RsrcUpdate {
        offset: u32::MAX,
        resv: 0,
        data: fd as u64,
    };
    (ring_fds_update(fd, IORING_REGISTER_RING_FDS, &mut up) == 1).then_some(up.offset)
}

/// One `io_uring_register` call of `opcode` (registering or unregistering ring descriptors)
/// with the single update `up`, which the kernel may write back; its result.
pub(super) fn ring_fds_update(
    fd: RawFd,
    opcode: libc::c_uint,
    up: &mut RsrcUpdate,
) -> libc::c_long {
    // SAFETY: io_uring_register on a live ring descriptor with one valid, writable update.
    // (Every argument widened to a full register: the call reads each as a `long`.)
    unsafe {
        libc::syscall(
            libc::SYS_io_uring_register,
            fd as libc::c_long,
            opcode as libc::c_long,
            up as *mut RsrcUpdate,
            1 as libc::c_long,
        )
    }
}
