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
/// bytes after the source modulo 4 KiB: those go in blocks of 128 bytes, each loaded whole
/// before it is stored (with 256-bit moves where the CPU has AVX2). On the host where `memcpy`
/// crawled, an earlier form of the blocks (which went through the stack) ran at 22–27 GiB/s;
/// from about 1 MiB there, glibc's `memcpy` switches to non-temporal stores, no longer crawls,
/// and ran about 1.3× that form's speed. The blocks still take those copies, since on a
/// machine with a larger cache that switch comes later and the crawl lasts longer. On an Intel
/// host where `memcpy` does not crawl, the blocks run within 6% of it (8 KiB to 1 MiB).
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
        // SAFETY: the caller's promise, and the CPU has AVX2 (just asked).
        return unsafe { blocks_avx2(src, dst, len) };
    }
    // SAFETY: the caller's promise.
    unsafe { blocks(src, dst, len) }
}

/// Copies 128 bytes at a time, each block loaded whole (four 32-byte loads into registers)
/// before any of it is stored, then the tail with `copy_nonoverlapping` (under 128 bytes: no
/// string copy). The first 32 bytes go in one unaligned move, and the blocks start at the
/// destination's next 32-byte boundary, so that no store is split across two cache lines.
///
/// Written with AVX2's intrinsics. The loop this replaced, over `[u128; 2]` pieces left to the
/// compiler, passed every piece through the stack (load, store to the stack, load back, store)
/// and stored at the destination's own misalignment: on an Intel host where `memcpy` does not
/// crawl, a 64 KiB shm WRITE at a 16-byte offset ran at 0.64 of an aligned one against 0.94
/// now (`bench/RESULTS.md`, sixty-second session).
///
/// # Safety
/// As [`copy_bulk`]; the CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn blocks_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let mut off = 0;
    // SAFETY: every access is within the first `len` bytes of its range (the head move only
    // when 32 bytes are there, a block only while 128 bytes are left); the unaligned forms of
    // the moves are used; the ranges do not overlap, so the bytes the head move and the first
    // block both write get the same value.
    unsafe {
        let head = (dst as usize).wrapping_neg() & 31;
        if head != 0 && len >= 32 {
            _mm256_storeu_si256(
                dst as *mut __m256i,
                _mm256_loadu_si256(src as *const __m256i),
            );
            off = head;
        }
        while len - off >= 128 {
            let (s, d) = (src.add(off) as *const __m256i, dst.add(off) as *mut __m256i);
            let a = _mm256_loadu_si256(s);
            let b = _mm256_loadu_si256(s.add(1));
            let c = _mm256_loadu_si256(s.add(2));
            let e = _mm256_loadu_si256(s.add(3));
            _mm256_storeu_si256(d, a);
            _mm256_storeu_si256(d.add(1), b);
            _mm256_storeu_si256(d.add(2), c);
            _mm256_storeu_si256(d.add(3), e);
            off += 128;
        }
        std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
    }
}

/// As [`blocks_avx2`], in eight 16-byte pieces a block from the destination's next 16-byte
/// boundary, for CPUs without AVX2.
///
/// # Safety
/// As [`copy_bulk`].
unsafe fn blocks(src: *const u8, dst: *mut u8, len: usize) {
    let mut off = 0;
    // SAFETY: as in `blocks_avx2`, with 16-byte moves.
    unsafe {
        let head = (dst as usize).wrapping_neg() & 15;
        if head != 0 && len >= 16 {
            let piece = std::ptr::read_unaligned(src as *const u128);
            std::ptr::write_unaligned(dst as *mut u128, piece);
            off = head;
        }
        while len - off >= 128 {
            let (s, d) = (src.add(off) as *const u128, dst.add(off) as *mut u128);
            let mut block = [0u128; 8];
            for (i, piece) in block.iter_mut().enumerate() {
                *piece = std::ptr::read_unaligned(s.add(i));
            }
            for (i, piece) in block.iter().enumerate() {
                std::ptr::write_unaligned(d.add(i), *piece);
            }
            off += 128;
        }
        std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the destination holds around and before each copy.
    const GUARD: u8 = 0xEE;

    /// `copy_bulk` copies exactly the bytes asked, and nothing around them, at every relative
    /// offset near a 4 KiB multiple (the aliased ones go through the blocks) and lengths around
    /// the threshold and the block size.
    #[test]
    fn bulk_copies_are_exact_at_every_offset_and_length() {
        let src: Vec<u8> = (0..12_288u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut dst = vec![GUARD; 16_384];
        let lens = [
            0,
            17,
            31,
            33,
            200,
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
                exact(&mut dst, &src, at, len, format!("copy_bulk, skew {skew}"));
                // The blocks themselves at every skew and length: with AVX2 where this CPU
                // has it, and without.
                let out = &mut dst[at..at + len];
                // SAFETY: as above.
                unsafe { copy_blocks(src.as_ptr(), out.as_mut_ptr(), len) };
                exact(&mut dst, &src, at, len, format!("copy_blocks, skew {skew}"));
                let out = &mut dst[at..at + len];
                // SAFETY: as above.
                unsafe { blocks(src.as_ptr(), out.as_mut_ptr(), len) };
                exact(&mut dst, &src, at, len, format!("blocks, skew {skew}"));
            }
        }
        // The skews 1..=63 and 4097..=4099, with the lengths from the threshold on.
        assert_eq!(
            through_blocks,
            (63 + 3) * lens.iter().filter(|&&l| l >= BULK_FROM).count()
        );
    }

    /// Asserts that `dst[at..at + len]` holds `src[..len]` and every other byte of `dst` is
    /// still the guard, then puts the guard back.
    fn exact(dst: &mut [u8], src: &[u8], at: usize, len: usize, what: String) {
        assert_eq!(&dst[at..at + len], &src[..len], "{what}, {len} bytes");
        assert!(
            dst[..at].iter().all(|&b| b == GUARD),
            "before: {what}, {len}"
        );
        assert!(
            dst[at + len..].iter().all(|&b| b == GUARD),
            "after: {what}, {len}"
        );
        dst[at..at + len].fill(GUARD);
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
