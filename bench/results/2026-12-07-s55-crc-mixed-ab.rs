//! Paired A/B: CRC32c with the mixed loop (new) against the 256-bit loop alone (old, the
//! previous commit) and the crc32c crate, alternating which runs first each round.
use std::hint::black_box;
use std::time::Instant;
fn main() {
    let sizes = [4096usize, 6144, 8192, 12288, 16368, 65536, 1 << 20];
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for &n in &sizes {
        let d = &data[..n];
        let reps = (4_000_000 / n).max(8);
        let mut r_old = Vec::new();
        let mut r_crate = Vec::new();
        let mut best = [f64::MAX; 3];
        for round in 0..41 {
            let mut t = [0f64; 3];
            for k in 0..3 {
                let which = (k + round) % 3;
                let s = Instant::now();
                for _ in 0..reps {
                    match which {
                        0 => black_box(new::wire::crc32c_append(0, black_box(d))),
                        1 => black_box(old::wire::crc32c_append(0, black_box(d))),
                        _ => black_box(crc32c::crc32c_append(0, black_box(d))),
                    };
                }
                t[which] = s.elapsed().as_secs_f64() / reps as f64;
                best[which] = best[which].min(t[which]);
            }
            r_old.push(t[1] / t[0]);
            r_crate.push(t[2] / t[0]);
        }
        r_old.sort_by(|a, b| a.partial_cmp(b).unwrap());
        r_crate.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let g = |t: f64| n as f64 / t / 1e9;
        println!("{n:8} B: old time / new, median of 41 paired rounds {:.2} (p10 {:.2}, p90 {:.2}); crate / new {:.2}; best GB/s new {:.1}, old {:.1}, crate {:.1}",
            r_old[20], r_old[4], r_old[36], r_crate[20], g(best[0]), g(best[1]), g(best[2]));
    }
}
