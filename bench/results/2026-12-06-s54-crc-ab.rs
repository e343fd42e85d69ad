use std::hint::black_box;
use std::time::Instant;
fn main() {
    let sizes = [512usize, 1024, 2048, 4096, 16384, 65536];
    let data: Vec<u8> = (0..65536u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    for &n in &sizes {
        let d = &data[..n];
        let reps = (4_000_000 / n).max(20);
        let mut ratios = Vec::new();
        let (mut ours_best, mut crate_best) = (f64::MAX, f64::MAX);
        for round in 0..41 {
            let mut t = [0f64; 2];
            for k in 0..2 {
                let which = (k + round) % 2;
                let s = Instant::now();
                for _ in 0..reps {
                    if which == 0 { black_box(barewire_soft_rdma::wire::crc32c_append(0, black_box(d))); }
                    else { black_box(crc32c::crc32c_append(0, black_box(d))); }
                }
                t[which] = s.elapsed().as_secs_f64() / reps as f64;
            }
            ratios.push(t[1] / t[0]);
            ours_best = ours_best.min(t[0]);
            crate_best = crate_best.min(t[1]);
        }
        ratios.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("{n:6} B: crate time / ours, median of 41 paired rounds {:.2} (p10 {:.2}, p90 {:.2}); best GiB/s ours {:.1}, crate {:.1}",
            ratios[20], ratios[4], ratios[36], n as f64 / ours_best / 1073741824.0, n as f64 / crate_best / 1073741824.0);
    }
}
