//! The floors measured in-process, beside barewire's runs: memcpy, a store and a spin
//! through shared memory, and a message through the io_uring TCP ring.

use super::*;

/// Iterations per slice in the sliced shm row for a run of `iters`: ten pairs, of at most
/// 1,000 iterations a slice (a pair then takes about a millisecond, far less than the host's
/// modes last).
pub(super) fn floor_slice(iters: u64) -> u16 {
    (iters / 20).clamp(1, 1000) as u16
}

/// `memcpy` of one 1 MiB buffer into another on one pinned CPU for `secs`, as `write_bw`
/// writes the same source to the same destination again and again: what a WRITE through
/// shared memory can at best reach, one core copying every byte.
pub(super) fn memcpy_figure(cpu: usize, secs: f64) -> Figure {
    let value = std::thread::scope(|s| {
        s.spawn(|| {
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
            memcpy_mib_per_sec(1 << 20, Duration::from_secs_f64(secs.max(0.2)))
        })
        .join()
        .unwrap_or(0.0)
    });
    Figure {
        tool: "memcpy".into(),
        what: "1 MiB, one core".into(),
        value,
        unit: Unit::MibPerSec,
        command: format!(
            "memcpy of a 1 MiB buffer into another on CPU {cpu} for {secs} s (in barewire-perf)"
        ),
        percentiles: Vec::new(),
        tail: None,
        crc_on: None,
    }
}

/// A byte through shared memory and back between two threads pinned to `cpus`, spinning flat
/// out, nothing else in the loop (`floor`): what the 8 B WRITE ping-pong over shm can at best
/// reach with the same wait.
pub(super) fn shm_floor_figure(cpus: [usize; 2], iters: u64) -> Option<Figure> {
    let f = crate::perf::floor::shm_ping_pong(cpus, iters as usize, 0)?;
    Some(Figure {
        tool: "shm floor".into(),
        what: "a store and a spin, p50, RTT/2".into(),
        value: f.p50 / 1000.0,
        unit: Unit::Micros,
        command: format!(
            "a byte through shared memory and back between two threads on CPUs {},{}, {iters} \
             round trips (in barewire-perf; alone, at several gaps between looks: shm-floor)",
            cpus[0], cpus[1]
        ),
        percentiles: Vec::new(),
        tail: Some((f.p99 / 1000.0, f.p999 / 1000.0)),
        crc_on: None,
    })
}

/// The size of an 8-byte tagged Write's FPDU (MPA length, DDP and RDMAP control, STag,
/// tagged offset, payload, CRC field): what the io_uring TCP floor moves each way.
const FLOOR_FPDU: usize = 28;

/// A [`FLOOR_FPDU`]-byte message over loopback TCP and back between two threads pinned to
/// `cpus`, each moving it through an io_uring as the soft provider does on a polling core
/// (`floor::tcp_ping_pong`, [`TcpWay::Ring`](crate::perf::floor::TcpWay)): half the round trip, or
/// (`whole`) all of it, the floor under a request and its answer.
pub(super) fn ring_floor_figure(cpus: [usize; 2], iters: u64, whole: bool) -> Option<Figure> {
    use crate::perf::floor::{tcp_ping_pong, TcpWay};
    let f = tcp_ping_pong(TcpWay::Ring, cpus, iters as usize, FLOOR_FPDU)?;
    // A half round trip's figures, or (`whole`) the round trip's: twice each.
    let times = if whole { 2.0 } else { 1.0 };
    let what = if whole {
        "28 B, p50 × 2, RTT"
    } else {
        "28 B, p50, RTT/2"
    };
    Some(Figure {
        tool: "io_uring TCP floor (a SEND and RECV looks through the ring, nothing else)".into(),
        what: what.into(),
        value: times * f.p50 / 1000.0,
        unit: Unit::Micros,
        command: format!(
            "a {FLOOR_FPDU}-byte message over loopback TCP and back between two threads on CPUs \
             {},{}, each with an io_uring set up as barewire's cores set theirs up, {iters} round \
             trips (in barewire-perf; by system calls and in two processes too: tcp-floor)",
            cpus[0], cpus[1]
        ),
        percentiles: Vec::new(),
        tail: Some((times * f.p99 / 1000.0, times * f.p999 / 1000.0)),
        crc_on: None,
    })
}

/// Copies one `block`-byte buffer into another again and again for `how_long`; MiB/s.
pub fn memcpy_mib_per_sec(block: usize, how_long: Duration) -> f64 {
    let src = vec![0x5au8; block];
    let mut dst = vec![0u8; block];
    let t = std::time::Instant::now();
    let mut bytes = 0u64;
    while t.elapsed() < how_long {
        for _ in 0..16 {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
            bytes += block as u64;
        }
    }
    bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}
