// 2026-12-07, sixtieth session: a 1 MiB copy on this host, four ways (issue 18's shm 1 MiB WRITE row).
// Built as a scratch crate (release, edition 2021), run pinned: taskset -c 0 ./cpb
// Output (MiB/s, three rounds each) in 2026-12-07-s60-copy.log.
// The code is as it ran; the SAFETY comments were added afterwards.
use std::arch::x86_64::*;
use std::time::Instant;

/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
unsafe fn rep_movsb(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: the caller's promise; `rep movsb` touches exactly `len` bytes of each range.
    std::arch::asm!("rep movsb", inout("rcx") len => _, inout("rsi") src => _, inout("rdi") dst => _, options(nostack, preserves_flags));
}
/// # Safety
/// As `rep_movsb`, `len` a multiple of 128; the CPU must have AVX2.
#[target_feature(enable = "avx2")]
unsafe fn avx_temporal(src: *const u8, dst: *mut u8, len: usize) {
    let mut o = 0;
    while o + 128 <= len {
        let a = _mm256_loadu_si256(src.add(o) as *const __m256i);
        let b = _mm256_loadu_si256(src.add(o + 32) as *const __m256i);
        let c = _mm256_loadu_si256(src.add(o + 64) as *const __m256i);
        let d = _mm256_loadu_si256(src.add(o + 96) as *const __m256i);
        _mm256_storeu_si256(dst.add(o) as *mut __m256i, a);
        _mm256_storeu_si256(dst.add(o + 32) as *mut __m256i, b);
        _mm256_storeu_si256(dst.add(o + 64) as *mut __m256i, c);
        _mm256_storeu_si256(dst.add(o + 96) as *mut __m256i, d);
        o += 128;
    }
}
/// # Safety
/// As `avx_temporal`, and `dst` 32-byte aligned (streaming stores).
#[target_feature(enable = "avx2")]
unsafe fn avx_nt(src: *const u8, dst: *mut u8, len: usize) {
    let mut o = 0;
    while o + 128 <= len {
        let a = _mm256_loadu_si256(src.add(o) as *const __m256i);
        let b = _mm256_loadu_si256(src.add(o + 32) as *const __m256i);
        let c = _mm256_loadu_si256(src.add(o + 64) as *const __m256i);
        let d = _mm256_loadu_si256(src.add(o + 96) as *const __m256i);
        _mm256_stream_si256(dst.add(o) as *mut __m256i, a);
        _mm256_stream_si256(dst.add(o + 32) as *mut __m256i, b);
        _mm256_stream_si256(dst.add(o + 64) as *mut __m256i, c);
        _mm256_stream_si256(dst.add(o + 96) as *mut __m256i, d);
        o += 128;
    }
    _mm_sfence();
}

fn main() {
    let sizes: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let sizes = if sizes.is_empty() { vec![65536, 262144, 1 << 20, 4 << 20] } else { sizes };
    for &len in &sizes {
        let src: Vec<u8> = (0..len + 4096).map(|i| i as u8).collect();
        let mut dst = vec![0u8; len + 8192];
        // page-aligned-ish, non-aliased offsets
        // SAFETY: both vectors have 4 KiB (and 8 KiB) beyond `len`, so the offsets stay inside.
        let s = unsafe { src.as_ptr().add(4096 - (src.as_ptr() as usize & 4095)) };
        let d = unsafe { dst.as_mut_ptr().add(4096 - (dst.as_ptr() as usize & 4095) + 2048) };
        let names = ["memcpy", "rep_movsb", "avx_temporal", "avx_nt"];
        let total = 3usize << 30;
        let iters = (total / len).max(10);
        for round in 0..3 {
            let mut line = format!("{len:>8} r{round}");
            for (k, n) in names.iter().enumerate() {
                let t = Instant::now();
                for _ in 0..iters {
                    // SAFETY: `s` and `d` name `len` bytes inside two separate vectors; the
                    // sizes are multiples of 128 and `d` is page-aligned + 2 KiB; AVX2 is
                    // present on the host measured.
                    unsafe {
                        match k {
                            0 => std::ptr::copy_nonoverlapping(s, d, len),
                            1 => rep_movsb(s, d, len),
                            2 => avx_temporal(s, d, len),
                            _ => avx_nt(s, d, len),
                        }
                    }
                    std::hint::black_box(d);
                }
                let gbs = (iters * len) as f64 / t.elapsed().as_secs_f64() / (1u64 << 20) as f64;
                line += &format!("  {n} {gbs:.0}");
            }
            println!("{line}");
        }
    }
}
