//! A bulk memory copy that keeps clear of one slow case of glibc's `memcpy`.
//!
//! [`copy_bulk`] is `copy_nonoverlapping`, except where the destination lies 1 to 63 bytes
//! after the source modulo 4 KiB and the copy is long: there glibc's `memcpy` (2.36) on AMD Zen
//! 3 runs several times slower than otherwise, and the copy goes in blocks instead. The shm
//! backend's READs and WRITEs and the soft provider's receive copies (a payload moved out of the
//! buffer the kernel received it into) go through it. In a stream of 1 MiB soft WRITEs with CRC
//! off, about 2% of the receiver's bytes were copied at such offsets, at 7× the time per byte of
//! the rest, and took 13% of its copy time (`bench/RESULTS.md`, fifty-seventh session).

/// From this many bytes on, [`copy_bulk`] avoids `memcpy` where the two ranges are
/// [`aliased`]. Below it `memcpy`'s own vector loops run, at least as fast as the blocks.
const BULK_FROM: usize = 1024;

/// True when `dst` lies 1 to 63 bytes after `src` modulo 4 KiB. There a forward copy's loads
/// look to the CPU as if they read what its recent stores wrote (the two share their low 12
/// address bits), and glibc's `memcpy` (2.36) on AMD Zen 3, whose `rep movsb` handles such
/// copies from 2–4 KiB on, ran at 1.3–2.5 GiB/s where it makes 25–40 GiB/s otherwise
/// (`bench/RESULTS.md`, fifty-fourth session). 1 to 31 bytes on is the crawl; 32 to 63 runs
/// at about half speed.
#[inline(always)]
fn aliased(src: *const u8, dst: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..64).contains(&d)
}

/// `copy_nonoverlapping`, except for copies of 1 KiB or more whose destination lies 1 to 63
/// bytes after the source modulo 4 KiB: those go in blocks of 128 bytes, each loaded whole before it is stored (with
/// 256-bit moves where the CPU has AVX2), at 22–27 GiB/s on the host where `memcpy` crawled.
/// From about 1 MiB there, glibc's `memcpy` switches to non-temporal stores, no longer crawls,
/// and runs about 1.3× the blocks' speed; the blocks still take those copies, since on a
/// machine with a larger cache that switch comes later and the crawl lasts longer.
///
/// # Example
///
/// ```
/// let src = vec![3u8; 5000];
/// let mut dst = vec![0u8; 5000 + 16];
/// // SAFETY: `src` holds 5000 readable bytes, `dst` 5000 writable ones from byte 16 on, and
/// // the two vectors do not overlap.
/// unsafe { barewire_engine::copy_bulk(src.as_ptr(), dst.as_mut_ptr().add(16), 5000) };
/// assert!(dst[16..] == src[..] && dst[..16] == [0; 16]);
/// ```
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline]
pub unsafe fn copy_bulk(src: *const u8, dst: *mut u8, len: usize) {
    if len >= BULK_FROM && aliased(src, dst) {
        // SAFETY: the caller's promise.
        return unsafe { copy_blocks(src, dst, len) };
    }
    // SAFETY: the caller's promise.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) }
}

/// The blocks of [`copy_bulk`], with AVX2's moves where the CPU has them.
///
/// # Safety
/// As [`copy_bulk`].
#[cold]
unsafe fn copy_blocks(src: *const u8, dst: *mut u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        /// # Safety
        /// As [`copy_bulk`]; the CPU must have AVX2.
        #[target_feature(enable = "avx2")]
        unsafe fn wide(src: *const u8, dst: *mut u8, len: usize) {
            // SAFETY: the caller's promise.
            unsafe { blocks(src, dst, len) }
        }
        // SAFETY: the caller's promise, and the CPU has AVX2 (just asked).
        return unsafe { wide(src, dst, len) };
    }
    // SAFETY: the caller's promise.
    unsafe { blocks(src, dst, len) }
}

/// Copies 128 bytes at a time, each block loaded (four 32-byte loads) before any of it is
/// stored, then the tail with `copy_nonoverlapping` (under 128 bytes: no string copy).
///
/// # Safety
/// As [`copy_bulk`].
#[inline(always)]
unsafe fn blocks(src: *const u8, dst: *mut u8, len: usize) {
    type Piece = [u128; 2];
    const PIECE: usize = std::mem::size_of::<Piece>();
    let mut off = 0;
    // SAFETY: every access is within the first `len` bytes of its range (a block is taken only
    // while 128 bytes are left); unaligned access is allowed; the ranges do not overlap.
    unsafe {
        while len - off >= 4 * PIECE {
            let (s, d) = (src.add(off), dst.add(off));
            let a = std::ptr::read_unaligned(s as *const Piece);
            let b = std::ptr::read_unaligned(s.add(PIECE) as *const Piece);
            let c = std::ptr::read_unaligned(s.add(2 * PIECE) as *const Piece);
            let e = std::ptr::read_unaligned(s.add(3 * PIECE) as *const Piece);
            std::ptr::write_unaligned(d as *mut Piece, a);
            std::ptr::write_unaligned(d.add(PIECE) as *mut Piece, b);
            std::ptr::write_unaligned(d.add(2 * PIECE) as *mut Piece, c);
            std::ptr::write_unaligned(d.add(3 * PIECE) as *mut Piece, e);
            off += 4 * PIECE;
        }
        std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `copy_bulk` copies exactly the bytes asked, and nothing around them, at every relative
    /// offset near a 4 KiB multiple (the aliased ones go through the blocks) and lengths around
    /// the threshold and the block size.
    #[test]
    fn bulk_copies_are_exact_at_every_offset_and_length() {
        const GUARD: u8 = 0xEE;
        let src: Vec<u8> = (0..12_288u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst = vec![GUARD; 16_384];
        let lens = [
            BULK_FROM - 1,
            BULK_FROM,
            BULK_FROM + 1,
            1151,
            1152,
            1153,
            4096,
            5000,
        ];
        let mut through_blocks = 0;
        for skew in (0..70).chain(4090..4100) {
            // dst - src ≡ skew (mod 4096), whatever the allocations' own addresses.
            let base = (src.as_ptr() as usize).wrapping_sub(dst.as_ptr() as usize) & 4095;
            let at = (base + skew) % 4096 + 4096;
            for &len in &lens {
                let out = &mut dst[at..at + len];
                // SAFETY: `src` holds at least `len` bytes and `out` exactly `len`; two
                // separate vectors.
                unsafe { copy_bulk(src.as_ptr(), out.as_mut_ptr(), len) };
                if aliased(src.as_ptr(), out.as_ptr()) && len >= BULK_FROM {
                    through_blocks += 1;
                }
                assert_eq!(&dst[at..at + len], &src[..len], "skew {skew}, {len} bytes");
                assert!(
                    dst[..at].iter().all(|&b| b == GUARD),
                    "before: skew {skew}, {len}"
                );
                assert!(
                    dst[at + len..].iter().all(|&b| b == GUARD),
                    "after: skew {skew}, {len}"
                );
                dst[at..at + len].fill(GUARD);
            }
        }
        // The skews 1..=63 and 4097..=4099, with the lengths from the threshold on.
        assert_eq!(through_blocks, (63 + 3) * (lens.len() - 1));
    }

    #[test]
    fn aliased_means_one_to_63_bytes_on_modulo_4_kib() {
        let p = 0x10_0000 as *const u8;
        let at = |d: usize| aliased(p, p.wrapping_add(d));
        assert!(!at(0) && at(1) && at(16) && at(63) && !at(64) && !at(4095));
        assert!(!at(4096) && at(4096 + 16) && at(1 << 20 | 31) && !at(4096 - 16));
        // dst before src: no.
        assert!(!aliased(p.wrapping_add(16), p));
    }
}
