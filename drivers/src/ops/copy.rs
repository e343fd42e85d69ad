//! The copies that move a message's bytes into memory a peer reads: in chunks, in
//! ascending aligned pieces (for a reader that polls the memory), or small and inline.

use super::*;

/// Copies `len` bytes from `src` to `dst` inline, 16 bytes a store, in no promised order: a
/// message published afterwards by a release store (a channel's slot, whose length word is
/// stored last). Four stores for a 64-byte message wherever it lies, where
/// [`copy_ascending`], whose stores are aligned pieces, needs five or six when the message
/// does not start on a 16-byte boundary.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline]
pub(crate) unsafe fn copy_chunks(src: *const u8, dst: *mut u8, len: usize) {
    let mut off = 0;
    while len - off >= 16 {
        // SAFETY: within both ranges (the caller's promise); unaligned access is allowed.
        unsafe {
            let v = std::ptr::read_unaligned(src.add(off) as *const u128);
            std::ptr::write_unaligned(dst.add(off) as *mut u128, v);
        }
        off += 16;
    }
    // SAFETY: the last `len - off` (< 16) bytes of both ranges.
    unsafe { copy_small(src.add(off), dst.add(off), len - off) }
}

/// Copies `len` bytes from `src` to `dst` so that another CPU sees them land in ascending
/// address order: one that reads a byte of `dst` (with acquire ordering) and finds it written
/// will find every earlier byte written too. `memcpy` promises no such order (string stores
/// and non-temporal stores may become visible out of order), and a peer that watches its
/// memory for the last word of a message relies on it.
///
/// Every store is of a naturally aligned piece (1, 2, 4, 8 or 16 bytes at an address that is a
/// multiple of its size), so none is split across two cache lines, whose halves could land in
/// either order; an aligned 8-byte message lands in one store, not eight. Each store is
/// followed by a release fence: on x86 (whose stores are seen in program order) that only keeps
/// the compiler from reordering or merging them, and costs nothing; on weaker machines it
/// orders them.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline]
pub(crate) unsafe fn copy_ascending(src: *const u8, dst: *mut u8, len: usize) {
    use std::sync::atomic::{fence, Ordering};
    /// Copies one `T`-sized piece at `off` (aligned at `dst`) and fences.
    ///
    /// # Safety
    /// As `copy_ascending`, for `off..off + size_of::<T>()`; `dst + off` aligned to `T`'s size.
    #[inline(always)]
    unsafe fn piece<T: Copy>(src: *const u8, dst: *mut u8, off: usize) -> usize {
        // SAFETY: within both ranges (the caller's promise); the source may be unaligned,
        // the destination is aligned to the piece's size.
        unsafe {
            let v = std::ptr::read_unaligned(src.add(off) as *const T);
            std::ptr::write_unaligned(dst.add(off) as *mut T, v);
        }
        fence(Ordering::Release);
        off + std::mem::size_of::<T>()
    }
    let mut off = 0;
    // SAFETY: every `piece` below copies bytes below `len` (each is taken only when that many
    // are left), at a destination address aligned to its size (the head checks the address;
    // the body and tail start at a 16-byte boundary and go in decreasing sizes).
    unsafe {
        // Up to a 16-byte boundary of dst, each piece as large as the address allows...
        while off < len && (dst as usize + off) % 16 != 0 {
            let (at, left) = (dst as usize + off, len - off);
            off = if at % 8 == 0 && left >= 8 {
                piece::<u64>(src, dst, off)
            } else if at % 4 == 0 && left >= 4 {
                piece::<u32>(src, dst, off)
            } else if at % 2 == 0 && left >= 2 {
                piece::<u16>(src, dst, off)
            } else {
                piece::<u8>(src, dst, off)
            };
        }
        // ...then aligned 16-byte pieces...
        while len - off >= 16 {
            off = piece::<u128>(src, dst, off);
        }
        // ...and the tail, from a 16-byte boundary: at most 8, 4, 2 and 1 bytes, in that order.
        if len - off >= 8 {
            off = piece::<u64>(src, dst, off);
        }
        if len - off >= 4 {
            off = piece::<u32>(src, dst, off);
        }
        if len - off >= 2 {
            off = piece::<u16>(src, dst, off);
        }
        if len - off >= 1 {
            piece::<u8>(src, dst, off);
        }
    }
}

/// Copies `len` bytes from `src` to `dst`: inline for up to 16 bytes (an 8-byte READ or
/// atomic result is one load and one store, not a call to `memcpy` with a length it must
/// examine), [`copy_bulk`] otherwise.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_small(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: every read and write stays within the `len` bytes of its range (the caller's
    // promise); unaligned access is allowed.
    unsafe {
        match len {
            8..=16 => {
                // The first and the last eight bytes (overlapping below 16).
                let a = std::ptr::read_unaligned(src as *const u64);
                let b = std::ptr::read_unaligned(src.add(len - 8) as *const u64);
                std::ptr::write_unaligned(dst as *mut u64, a);
                std::ptr::write_unaligned(dst.add(len - 8) as *mut u64, b);
            }
            4..=7 => {
                let a = std::ptr::read_unaligned(src as *const u32);
                let b = std::ptr::read_unaligned(src.add(len - 4) as *const u32);
                std::ptr::write_unaligned(dst as *mut u32, a);
                std::ptr::write_unaligned(dst.add(len - 4) as *mut u32, b);
            }
            0..=3 => {
                for i in 0..len {
                    *dst.add(i) = *src.add(i);
                }
            }
            _ => copy_bulk(src, dst, len),
        }
    }
}

/// Asks the CPU to bring the cache lines of `len` bytes from `p` into this core's cache now,
/// for reading, or for writing (`write`: fetched exclusive, as a store would take them), so
/// that a later access that would have missed finds them there. A hint only: it reads and
/// writes nothing a program can see, and cannot fault, whatever the address. A no-op where the
/// CPU has no such hint.
#[inline(always)]
pub(crate) fn prefetch_lines(p: *const u8, len: usize, write: bool) {
    let mut line = p as usize & !63;
    let end = (p as usize).saturating_add(len);
    while line < end {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: PREFETCHT0 and PREFETCHW are hints: they access no memory architecturally,
        // never fault, and leave registers and flags alone (PREFETCHW is a no-op on the few
        // x86-64 CPUs without it).
        unsafe {
            if write {
                std::arch::asm!("prefetchw [{0}]", in(reg) line, options(nostack, preserves_flags, readonly));
            } else {
                std::arch::asm!("prefetcht0 [{0}]", in(reg) line, options(nostack, preserves_flags, readonly));
            }
        }
        #[cfg(target_arch = "aarch64")]
        // SAFETY: PRFM is a hint: it accesses no memory architecturally and never faults.
        unsafe {
            if write {
                std::arch::asm!("prfm pstl1keep, [{0}]", in(reg) line, options(nostack, preserves_flags, readonly));
            } else {
                std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) line, options(nostack, preserves_flags, readonly));
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let _ = write;
        line += 64;
    }
}
