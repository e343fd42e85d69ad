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
//!
//! The TCP floor ([`tcp_ping_pong`]): a small message from one thread to the other and back
//! over a loopback TCP connection, each end moving it the way the soft provider can: by system
//! calls (`send`, then `recv(MSG_DONTWAIT)` looks; sockperf's `--nonblocked` loop) or through an
//! io_uring set up as barewire's cores set theirs up (one issuer, deferred task work, the ring
//! entered by its registered index, the socket named by its slot in the registered file table),
//! with one `RECV` look (`MSG_DONTWAIT`) per `io_uring_enter` and the answer a `SEND` in an
//! `io_uring_enter` of its own, as a polling core moves it. The io_uring way is the floor under
//! the soft provider's latency on its default reactor.

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use io_uring::{opcode, types, CompletionQueue, IoUring, SubmissionQueue, Submitter};

use barewire_engine::trace::{self, Kind};

use super::run::{Cycles, SAW_BYTE};

/// One round trip's figures, half the round trip, in nanoseconds.
#[derive(Debug, Clone, Copy)]
pub struct HalfRoundTrip {
    /// The median.
    pub p50: f64,
    /// The mean.
    pub mean: f64,
    /// The 99th percentile.
    pub p99: f64,
    /// The 99.9th percentile.
    pub p999: f64,
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
    if !pinned {
        return None;
    }
    half_round_trip(&clock, ticks)
}

/// How both ends of a [`tcp_ping_pong`] move the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TcpWay {
    /// `send`, then `recv(MSG_DONTWAIT)` until the answer is in.
    Syscalls,
    /// A `SEND` in an `io_uring_enter` of its own, then `RECV` looks, one per enter.
    Ring,
    /// As `Ring`, with the `SEND` and the first look after it in one enter.
    RingTogether,
}

impl TcpWay {
    /// Every way, the system calls first.
    pub const ALL: [TcpWay; 3] = [TcpWay::Syscalls, TcpWay::Ring, TcpWay::RingTogether];

    /// What it does, in a few words.
    pub fn name(self) -> &'static str {
        match self {
            TcpWay::Syscalls => "syscalls: send, recv(MSG_DONTWAIT) looks",
            TcpWay::Ring => "ring: SEND in its own enter, RECV looks",
            TcpWay::RingTogether => "ring, SEND and the first look in one enter",
        }
    }
}

/// One end of the connection.
enum End<'a> {
    Sys(RawFd),
    /// The ring, split once: its submitter remembers the ring's registered index.
    Ring {
        submitter: Submitter<'a>,
        sq: SubmissionQueue<'a>,
        cq: CompletionQueue<'a>,
    },
}

/// A ring set up as barewire's cores set theirs up (see `engine/src/driver/uring.rs`).
fn ring() -> Option<IoUring> {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(8)
        .ok()
}

impl<'a> End<'a> {
    /// This end of `fd`: on `ring` (entered by its registered index, the socket in its file
    /// table), or by system calls without one. `None` if the ring refused a registration.
    fn new(fd: RawFd, ring: Option<&'a mut IoUring>) -> Option<End<'a>> {
        let Some(ring) = ring else {
            return Some(End::Sys(fd));
        };
        let (mut submitter, sq, cq) = ring.split();
        submitter.register_ring_fd().ok()?;
        submitter.register_files(&[fd]).ok()?;
        Some(End::Ring { submitter, sq, cq })
    }

    /// Sends `msg` whole; with `look`, a first look into it goes in the same enter, and what
    /// it took comes back (0 if nothing had come).
    fn send(&mut self, msg: &[u8], look: Option<&mut [u8]>) -> usize {
        match self {
            End::Sys(fd) => {
                trace::event(Kind::POSTED, 0);
                trace::event(Kind::ENTER, 1 << 1);
                // SAFETY: `msg` is a live buffer of its length.
                let n = unsafe { libc::send(*fd, msg.as_ptr().cast(), msg.len(), 0) };
                trace::event(Kind::ENTERED, n as u64);
                assert_eq!(n, msg.len() as isize, "send");
                0
            }
            End::Ring { submitter, sq, cq } => {
                trace::event(Kind::POSTED, 0);
                let e = opcode::Send::new(types::Fixed(0), msg.as_ptr(), msg.len() as u32)
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .user_data(1);
                // SAFETY: `msg` outlives the enter below, which carries the send out
                // (MSG_DONTWAIT, deferred task work: it completes within the call).
                unsafe { sq.push(&e).expect("a free submission slot") };
                let entries = if let Some(into) = look {
                    // SAFETY: `into` outlives the same enter, as `msg` does.
                    unsafe { sq.push(&recv_entry(into)).expect("a free submission slot") };
                    2
                } else {
                    1
                };
                sq.sync();
                enter(submitter, entries);
                cq.sync();
                let mut took = 0;
                for c in &mut *cq {
                    match (c.user_data(), c.result()) {
                        (1, n) => assert_eq!(n, msg.len() as i32, "SEND"),
                        (_, n) if n > 0 => {
                            trace::event(Kind::RECEIVED, n as u64);
                            took = n as usize;
                        }
                        (_, e) => assert_eq!(e, -libc::EAGAIN, "RECV"),
                    }
                }
                took
            }
        }
    }

    /// Looks until `buf` is full, starting `have` bytes in.
    fn recv(&mut self, buf: &mut [u8], mut have: usize) {
        while have < buf.len() {
            let rest = &mut buf[have..];
            // Bytes taken, or the negated errno (as the ring reports a failure).
            let n = match self {
                End::Sys(fd) => {
                    trace::event(Kind::ENTER, 1 << 1);
                    // SAFETY: `rest` is a live, writable buffer of its length.
                    let n = unsafe {
                        libc::recv(
                            *fd,
                            rest.as_mut_ptr().cast(),
                            rest.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    trace::event(Kind::ENTERED, n as u64);
                    match n {
                        -1 => -std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                        n => n as i32,
                    }
                }
                End::Ring { submitter, sq, cq } => {
                    // SAFETY: `rest` outlives the enter that carries the receive out.
                    unsafe { sq.push(&recv_entry(rest)).expect("a free submission slot") };
                    sq.sync();
                    enter(submitter, 1);
                    cq.sync();
                    cq.next().expect("completed in its submission").result()
                }
            };
            match n {
                n if n > 0 => {
                    trace::event(Kind::RECEIVED, n as u64);
                    have += n as usize;
                }
                0 => panic!("the peer closed the connection"),
                n if n == -libc::EAGAIN => {}
                e => panic!("receive failed: errno {}", -e),
            }
        }
    }
}

/// Submits the `entries` queued, marked in the timeline as barewire's cores mark an enter.
fn enter(submitter: &Submitter<'_>, entries: u64) {
    trace::event(Kind::ENTER, entries << 1);
    let n = submitter.submit().expect("io_uring_enter");
    trace::event(Kind::ENTERED, n as u64);
}

/// A receive of up to `into.len()` bytes that fails at once when nothing waits.
fn recv_entry(into: &mut [u8]) -> io_uring::squeue::Entry {
    opcode::Recv::new(types::Fixed(0), into.as_mut_ptr(), into.len() as u32)
        .flags(libc::MSG_DONTWAIT)
        .build()
        .user_data(2)
}

/// A connected pair of loopback TCP sockets, `TCP_NODELAY` on both.
pub fn tcp_pair() -> std::io::Result<(TcpStream, TcpStream)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let c = TcpStream::connect(l.local_addr()?)?;
    let (s, _) = l.accept()?;
    c.set_nodelay(true)?;
    s.set_nodelay(true)?;
    Ok((c, s))
}

/// One end of a ping-pong of `rounds` round trips of `size` bytes each way on the connected
/// socket `fd`: the initiator sends first and returns each round trip in TSC ticks (see
/// [`Cycles`]); the other end answers each message and returns nothing. `None` if `way`'s ring
/// could not be set up.
///
/// In a build with the engine's `trace` feature, each end marks its steps in its thread's
/// timeline as barewire's cores mark theirs ([`barewire_engine::trace`]): the send
/// ([`Kind::POSTED`]), each `io_uring_enter` or, by system calls, each `send` and `recv`
/// ([`Kind::ENTER`] with one entry or two, [`Kind::ENTERED`]), bytes taken
/// ([`Kind::RECEIVED`]), and at the initiator the whole answer ([`SAW_BYTE`]), so that
/// `bench/tools/hop-trace.py` reads a run of `tcp-floor --trace` as it reads barewire-perf's.
pub fn tcp_ping_pong_end(
    way: TcpWay,
    fd: RawFd,
    size: usize,
    rounds: usize,
    initiator: bool,
) -> Option<Vec<u64>> {
    let mut ring = match way {
        TcpWay::Syscalls => None,
        _ => Some(ring()?),
    };
    let mut end = End::new(fd, ring.as_mut())?;
    let msg = vec![0x5au8; size.max(1)];
    let mut buf = vec![0u8; size.max(1)];
    let mut ticks = Vec::with_capacity(if initiator { rounds } else { 0 });
    let together = way == TcpWay::RingTogether;
    let mut pending = 0;
    let mut t = Cycles::now();
    for _ in 0..rounds {
        if initiator {
            let have = end.send(&msg, together.then_some(&mut buf[..]));
            end.recv(&mut buf, have);
            trace::event(SAW_BYTE, 0);
            let now = Cycles::now();
            ticks.push(now.wrapping_sub(t));
            t = now;
        } else {
            end.recv(&mut buf, pending);
            pending = end.send(&msg, together.then_some(&mut buf[..]));
        }
    }
    Some(ticks)
}

/// `n` round trips (after a warm-up of a tenth as many) of `size` bytes each way over a
/// loopback TCP connection between two threads pinned to `cpus` (the initiator first), both
/// ends moving the message `way`: half the round trip. `None` if a thread could not be pinned
/// or a ring set up.
pub fn tcp_ping_pong(
    way: TcpWay,
    cpus: [usize; 2],
    n: usize,
    size: usize,
) -> Option<HalfRoundTrip> {
    let warm = n / 10;
    let (c, s) = tcp_pair().ok()?;
    let clock = Cycles::calibrate();
    let ticks = std::thread::scope(|sc| {
        let answer = sc.spawn(|| {
            // Answers even when unpinned or without a ring (then by system calls), so the
            // initiator always finishes.
            let pinned = pin(cpus[1]);
            let fd = s.as_raw_fd();
            let done = tcp_ping_pong_end(way, fd, size, warm + n, false).is_some()
                || tcp_ping_pong_end(TcpWay::Syscalls, fd, size, warm + n, false).is_some();
            pinned && done
        });
        // The initiator on a thread of its own too (see `shm_ping_pong`).
        let ask = sc.spawn(|| {
            let fd = c.as_raw_fd();
            let pinned = pin(cpus[0]);
            let t = tcp_ping_pong_end(way, fd, size, warm + n, true)
                .or_else(|| tcp_ping_pong_end(TcpWay::Syscalls, fd, size, warm + n, true));
            t.filter(|_| pinned)
        });
        let t = ask.join().ok().flatten();
        let answered = answer.join().unwrap_or(false);
        t.filter(|_| answered)
    })?;
    half_round_trip(&clock, ticks.get(warm..)?.to_vec())
}

/// The median, mean and tail of round trips given in `clock`'s ticks, halved, in nanoseconds;
/// `None` for no round trips. A percentile is the round trip at that rank (nearest rank), as
/// barewire-perf's histograms give theirs.
pub fn half_round_trip(clock: &Cycles, mut ticks: Vec<u64>) -> Option<HalfRoundTrip> {
    if ticks.is_empty() {
        return None;
    }
    let half = |t: u64| clock.ns(t) as f64 / 2.0;
    let mean = ticks.iter().map(|&t| half(t)).sum::<f64>() / ticks.len() as f64;
    ticks.sort_unstable();
    let at =
        |q: f64| half(ticks[((ticks.len() as f64 * q).ceil() as usize).clamp(1, ticks.len()) - 1]);
    Some(HalfRoundTrip {
        p50: half(ticks[ticks.len() / 2]),
        mean,
        p99: at(0.99),
        p999: at(0.999),
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

    #[test]
    fn round_trips_are_halved_and_their_percentiles_taken_by_nearest_rank() {
        let clock = Cycles::at_rate(1.0);
        // 2,000 round trips of 2, 4, ..., 4,000 ns, shuffled: halves 1..=2,000.
        let mut ticks: Vec<u64> = (1..=2000).map(|i| 2 * i).collect();
        ticks.reverse();
        ticks.swap(3, 1500);
        let f = half_round_trip(&clock, ticks).unwrap();
        assert_eq!((f.p50, f.p99, f.p999), (1001.0, 1980.0, 1998.0), "{f:?}");
        assert_eq!(f.mean, 1000.5);
        // One round trip is every percentile.
        let f = half_round_trip(&clock, vec![10]).unwrap();
        assert_eq!((f.p50, f.p99, f.p999, f.mean), (5.0, 5.0, 5.0, 5.0));
        assert!(half_round_trip(&clock, Vec::new()).is_none());
    }

    #[test]
    fn a_tcp_ping_pong_moves_whole_messages_each_way_and_leaves_the_caller_unpinned() {
        let cpus = || std::thread::available_parallelism().map_or(1, |n| n.get());
        let before = cpus();
        for way in TcpWay::ALL {
            // 3 bytes each way: the answer's first look may take part of it (`RingTogether`),
            // and the rest must still come whole.
            let f = tcp_ping_pong(way, [0, before - 1], 200, 3).expect("pinned, with a ring");
            assert!(f.p50 > 0.0 && f.mean >= f.p50 / 10.0, "{way:?}: {f:?}");
        }
        assert_eq!(cpus(), before);
        assert!(tcp_ping_pong(TcpWay::Ring, [0, 1000], 10, 28).is_none());
        // One end by itself: the initiator's round trips are counted, the answerer's are not.
        let (c, s) = tcp_pair().unwrap();
        let answer = std::thread::spawn(move || {
            tcp_ping_pong_end(TcpWay::Ring, s.as_raw_fd(), 28, 50, false)
        });
        let t = tcp_ping_pong_end(TcpWay::Syscalls, c.as_raw_fd(), 28, 50, true).unwrap();
        assert_eq!(t.len(), 50);
        assert_eq!(answer.join().unwrap(), Some(Vec::new()));
    }
}
