//! The shared-memory floor: a byte from one CPU to the other and back, with nothing else in the
//! loop. One thread pinned to each CPU; the first stores a sequence byte into a line the second
//! watches and spins on a line the second writes (a page away, so no prefetcher pairs them);
//! the second answers each byte with the same value. Timed per iteration with the TSC as
//! `write_lat` is, and reported as half the round trip.
//!
//! `gap` is how long each side waits between two looks at the line it spins on, in turns of an
//! empty loop ([`turn_ns`] says how long one is): 0 spins flat out, as `report` measures it. A
//! look at a line the other CPU is about to write pulls the line back; whether spacing the
//! looks helps depends on the machine (on this project's host it helped in some stretches and
//! not in others: bench/RESULTS.md, sixteenth session).

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use super::run::Cycles;

/// One round trip's figures, half the round trip, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct HalfRoundTrip {
    /// The median.
    pub p50: f64,
    /// The mean.
    pub mean: f64,
}

/// Two lines a page apart.
#[repr(C, align(4096))]
struct Lines {
    ping: AtomicU8,
    _pad: [u8; 4095],
    pong: AtomicU8,
}

/// `n` round trips between CPUs `cpus[0]` (the initiator) and `cpus[1]`, with `gap` empty-loop
/// turns between looks; `None` if a thread could not be pinned.
pub fn shm_ping_pong(cpus: [usize; 2], n: usize, gap: u32) -> Option<HalfRoundTrip> {
    let lines = Box::new(Lines {
        ping: AtomicU8::new(0),
        _pad: [0; 4095],
        pong: AtomicU8::new(0),
    });
    let (ping, pong) = (&lines.ping, &lines.pong);
    let clock = Cycles::calibrate();
    let mut ticks = Vec::with_capacity(n);
    let pinned = std::thread::scope(|s| {
        let responder = s.spawn(|| {
            // Answers every byte even when unpinned, so the initiator always finishes.
            let pinned = pin(cpus[1]);
            for i in 0..n {
                let v = seq(i);
                while ping.load(Ordering::Relaxed) != v {
                    spin(gap);
                }
                pong.store(v, Ordering::Relaxed);
            }
            pinned
        });
        // The initiator on a thread of its own too: pinning the caller's thread would pin
        // every process it starts afterwards.
        let initiator = s.spawn(|| {
            let pinned = pin(cpus[0]);
            let mut t = Cycles::now();
            for i in 0..n {
                let v = seq(i);
                ping.store(v, Ordering::Relaxed);
                while pong.load(Ordering::Relaxed) != v {
                    spin(gap);
                }
                let now = Cycles::now();
                ticks.push(now.wrapping_sub(t));
                t = now;
            }
            pinned
        });
        let mine = initiator.join().unwrap_or(false);
        responder.join().unwrap_or(false) && mine
    });
    if !pinned || n == 0 {
        return None;
    }
    let half = |t: u64| clock.ns(t) as f64 / 2.0;
    let mean = ticks.iter().map(|&t| half(t)).sum::<f64>() / n as f64;
    ticks.sort_unstable();
    Some(HalfRoundTrip {
        p50: half(ticks[n / 2]),
        mean,
    })
}

/// Nanoseconds one empty-loop turn of `gap` takes on this CPU.
pub fn turn_ns() -> f64 {
    const TURNS: u32 = 20_000_000;
    let t0 = Instant::now();
    spin(TURNS);
    t0.elapsed().as_nanos() as f64 / TURNS as f64
}

/// The byte of round trip `i`: never 0, the lines' value before the first.
fn seq(i: usize) -> u8 {
    (i % 255 + 1) as u8
}

/// `n` turns of an empty loop that the optimiser keeps.
#[inline(always)]
fn spin(n: u32) {
    for k in 0..n {
        std::hint::black_box(k);
    }
}

/// Pins this thread to `cpu`; false if there is no such CPU (libc's CPU sets hold 1024).
fn pin(cpu: usize) -> bool {
    cpu < libc::CPU_SETSIZE as usize
        && core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ping_pong_is_timed_leaves_the_caller_unpinned_and_refuses_an_unknown_cpu() {
        let cpus = || std::thread::available_parallelism().map_or(1, |n| n.get());
        let before = cpus();
        let f = shm_ping_pong([0, before - 1], 200, 0).expect("pinned");
        assert!(f.p50 > 0.0 && f.mean > 0.0, "{f:?}");
        // `report` starts processes after it: they must not inherit a pinned thread.
        assert_eq!(cpus(), before);
        let last = before - 1;
        assert!(shm_ping_pong([0, 1000], 10, 0).is_none());
        assert!(shm_ping_pong([1 << 20, last], 10, 0).is_none());
        assert!(turn_ns() > 0.0);
    }
}
