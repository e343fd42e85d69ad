use std::hint::black_box;
use std::time::Instant;

type Block = [u128; 2];

/// Forward, blocks of 4 x 32 bytes loaded before they are stored.
#[target_feature(enable = "avx2")]
unsafe fn fwd_block(src: *const u8, dst: *mut u8, len: usize) {
    let mut off = 0;
    while len - off >= 128 {
        let a = std::ptr::read_unaligned(src.add(off) as *const Block);
        let b = std::ptr::read_unaligned(src.add(off + 32) as *const Block);
        let c = std::ptr::read_unaligned(src.add(off + 64) as *const Block);
        let d = std::ptr::read_unaligned(src.add(off + 96) as *const Block);
        std::ptr::write_unaligned(dst.add(off) as *mut Block, a);
        std::ptr::write_unaligned(dst.add(off + 32) as *mut Block, b);
        std::ptr::write_unaligned(dst.add(off + 64) as *mut Block, c);
        std::ptr::write_unaligned(dst.add(off + 96) as *mut Block, d);
        off += 128;
    }
    std::ptr::copy_nonoverlapping(src.add(off), dst.add(off), len - off);
}

/// Backward, 4 x 32 bytes a step.
#[target_feature(enable = "avx2")]
unsafe fn bwd_block(src: *const u8, dst: *mut u8, len: usize) {
    let mut end = len;
    while end >= 128 {
        let o = end - 128;
        let a = std::ptr::read_unaligned(src.add(o) as *const Block);
        let b = std::ptr::read_unaligned(src.add(o + 32) as *const Block);
        let c = std::ptr::read_unaligned(src.add(o + 64) as *const Block);
        let d = std::ptr::read_unaligned(src.add(o + 96) as *const Block);
        std::ptr::write_unaligned(dst.add(o + 96) as *mut Block, d);
        std::ptr::write_unaligned(dst.add(o + 64) as *mut Block, c);
        std::ptr::write_unaligned(dst.add(o + 32) as *mut Block, b);
        std::ptr::write_unaligned(dst.add(o) as *mut Block, a);
        end = o;
    }
    std::ptr::copy_nonoverlapping(src, dst, end);
}

fn main() {
    let sizes = [2048usize, 4096, 16384, 65536, 262144, 1 << 20];
    let mut mem = vec![0u8; 4 << 20];
    let base = ((mem.as_mut_ptr() as usize + 4095) & !4095) as *mut u8;
    for &n in &sizes {
        for skew in [0usize, 8, 16, 32, 48, 63, 64, 4080] {
            let src = base;
            let dst = unsafe { base.add(((n + 8191) & !4095) + skew) };
            let reps = (200_000_000 / n).max(10);
            let mut best = [f64::MAX; 3];
            for round in 0..5 {
                for w in 0..3 {
                    let w = (w + round) % 3;
                    let t = Instant::now();
                    for _ in 0..reps {
                        unsafe {
                            match w {
                                0 => std::ptr::copy_nonoverlapping(black_box(src), black_box(dst), n),
                                1 => fwd_block(black_box(src), black_box(dst), n),
                                _ => bwd_block(black_box(src), black_box(dst), n),
                            }
                        }
                        black_box(dst);
                    }
                    best[w] = best[w].min(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            let g = |t: f64| n as f64 / t / 1073741824.0;
            println!("{n:8} skew {skew:4}: memcpy {:6.1}  fwd {:6.1}  bwd {:6.1} GiB/s", g(best[0]), g(best[1]), g(best[2]));
        }
    }
}
