//! A small message from one CPU to the other and back over loopback TCP, with nothing else in
//! the loop, moved each way the soft provider can move it: the floor under its 8 B WRITE
//! ping-pong (`barewire-perf write_lat`), and under the report's rows that set it against the
//! kernel's TCP round trip and against the epoll fallback.
//!
//!     tcp-floor [-n N] [--reps R] [--cpu A,B] [--size S] [--ways syscalls,ring,ring-together]
//!
//! Each run forks: the parent times round trips on CPU A, the child answers on CPU B, each
//! over its end of one connected loopback socket (`TCP_NODELAY`). Both sides move the message
//! the same way:
//! - `syscalls`: `send`, then `recv(MSG_DONTWAIT)` until the answer is in (sockperf's
//!   `ping-pong --tcp --nonblocked` loop, the report's floor; the epoll fallback's receive on a
//!   core with few queue pairs);
//! - `ring`: on an io_uring set up as barewire's cores set theirs up (one issuer, deferred task
//!   work, the ring entered by its registered index, the socket named by its slot in the
//!   registered file table). A look is one `RECV` with `MSG_DONTWAIT`, submitted and reaped in
//!   one `io_uring_enter`, as a polling core looks once per pass; the answer is one `SEND` in an
//!   `io_uring_enter` of its own, as such a core sends a task's post at once;
//! - `ring, send and look together`: the same, with the `SEND` and the first look after it in
//!   one `io_uring_enter`.
//!
//! The message is `--size` bytes, 28 by default: an 8-byte tagged Write's FPDU (MPA length, DDP
//! and RDMAP control, STag, tagged offset, payload, CRC field). Each figure is half the round
//! trip (RTT/2), p50 and mean, the median over the reps; reps of each way alternate with the
//! others'.

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use barewire_bench::reps::median;
use clap::Parser;
use io_uring::{opcode, types, CompletionQueue, IoUring, SubmissionQueue, Submitter};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "tcp-floor",
    about = "A small message over loopback TCP and back, by each way the soft provider moves one"
)]
struct Opts {
    /// Round trips per rep (after a warm-up of a tenth as many).
    #[arg(short = 'n', default_value_t = 100_000)]
    iters: usize,
    /// Reps of each way, alternated.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The initiator's CPU and the responder's.
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpu: [usize; 2],
    /// Bytes each way.
    #[arg(long, default_value_t = 28)]
    size: usize,
    /// Only these ways (all three by default).
    #[arg(long, value_delimiter = ',')]
    ways: Vec<Way>,
}

/// How both sides move the message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Way {
    Syscalls,
    Ring,
    RingTogether,
}

impl Way {
    const ALL: [Way; 3] = [Way::Syscalls, Way::Ring, Way::RingTogether];

    fn name(self) -> &'static str {
        match self {
            Way::Syscalls => "syscalls: send, recv(MSG_DONTWAIT) looks",
            Way::Ring => "ring: SEND in its own enter, RECV looks",
            Way::RingTogether => "ring, SEND and the first look in one enter",
        }
    }
}

/// One end of the connection, moving bytes one way.
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
fn ring() -> IoUring {
    IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(8)
        .expect("an io_uring with deferred task work (Linux 6.1)")
}

impl<'a> End<'a> {
    /// This end of `fd`: on `ring` (entered by its registered index, the socket in its file
    /// table), or by system calls without one.
    fn new(fd: RawFd, ring: Option<&'a mut IoUring>) -> End<'a> {
        let Some(ring) = ring else {
            return End::Sys(fd);
        };
        let (mut submitter, sq, cq) = ring.split();
        submitter
            .register_ring_fd()
            .expect("IORING_REGISTER_RING_FDS");
        submitter
            .register_files(&[fd])
            .expect("IORING_REGISTER_FILES");
        End::Ring { submitter, sq, cq }
    }

    /// Sends `msg` whole; with `look`, queues a first look into `into` in the same enter and
    /// returns what it took (0 if nothing had come).
    fn send(&mut self, msg: &[u8], look: Option<&mut [u8]>) -> usize {
        match self {
            End::Sys(fd) => {
                // SAFETY: `msg` is a live buffer of its length.
                let n = unsafe { libc::send(*fd, msg.as_ptr().cast(), msg.len(), 0) };
                assert_eq!(n, msg.len() as isize, "send");
                0
            }
            End::Ring { submitter, sq, cq } => {
                let e = opcode::Send::new(types::Fixed(0), msg.as_ptr(), msg.len() as u32)
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .user_data(1);
                // SAFETY: `msg` outlives the enter below, which carries the send out
                // (MSG_DONTWAIT, deferred task work: it completes within the call).
                unsafe { sq.push(&e).expect("a free submission slot") };
                let looked = look.map(|into| {
                    let r = recv_entry(into);
                    // SAFETY: `into` outlives the same enter, as `msg` does.
                    unsafe { sq.push(&r).expect("a free submission slot") };
                });
                sq.sync();
                submitter.submit().expect("io_uring_enter");
                cq.sync();
                let mut took = 0;
                for c in &mut *cq {
                    match c.user_data() {
                        1 => assert_eq!(c.result(), msg.len() as i32, "SEND"),
                        _ if c.result() > 0 => took = c.result() as usize,
                        _ => assert_eq!(c.result(), -libc::EAGAIN, "RECV"),
                    }
                }
                debug_assert!(looked.is_some() || took == 0);
                took
            }
        }
    }

    /// Looks until `buf` is full, starting `have` bytes in.
    fn recv(&mut self, buf: &mut [u8], mut have: usize) {
        while have < buf.len() {
            let rest = &mut buf[have..];
            let n = match self {
                End::Sys(fd) => {
                    // SAFETY: `rest` is a live, writable buffer of its length.
                    let n = unsafe {
                        libc::recv(
                            *fd,
                            rest.as_mut_ptr().cast(),
                            rest.len(),
                            libc::MSG_DONTWAIT,
                        )
                    };
                    // (As the ring reports a failure: the negated errno.)
                    match n {
                        -1 => -std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                        n => n as i32,
                    }
                }
                End::Ring { submitter, sq, cq } => {
                    let r = recv_entry(rest);
                    // SAFETY: `rest` outlives the enter that carries the receive out.
                    unsafe { sq.push(&r).expect("a free submission slot") };
                    sq.sync();
                    submitter.submit().expect("io_uring_enter");
                    cq.sync();
                    cq.next().expect("completed in its submission").result()
                }
            };
            match n {
                n if n > 0 => have += n as usize,
                0 => panic!("the peer closed the connection"),
                n if n == -libc::EAGAIN => {}
                e => panic!("receive failed: errno {}", -e),
            }
        }
    }
}

/// A receive of up to `into.len()` bytes that fails at once when nothing waits.
fn recv_entry(into: &mut [u8]) -> io_uring::squeue::Entry {
    opcode::Recv::new(types::Fixed(0), into.as_mut_ptr(), into.len() as u32)
        .flags(libc::MSG_DONTWAIT)
        .build()
        .user_data(2)
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (s, _) = l.accept().expect("accept");
    c.set_nodelay(true).unwrap();
    s.set_nodelay(true).unwrap();
    (c, s)
}

/// Ping-pongs `rounds` times; the initiator returns each round trip's nanoseconds.
fn ping_pong(way: Way, fd: RawFd, size: usize, rounds: usize, initiator: bool) -> Vec<u64> {
    let mut ring = (way != Way::Syscalls).then(ring);
    let mut end = End::new(fd, ring.as_mut());
    let msg = vec![0x5au8; size];
    let mut buf = vec![0u8; size];
    let mut times = Vec::with_capacity(if initiator { rounds } else { 0 });
    let together = way == Way::RingTogether;
    let mut pending = 0;
    for _ in 0..rounds {
        if initiator {
            let t = Instant::now();
            let have = end.send(&msg, together.then_some(&mut buf[..]));
            end.recv(&mut buf, have);
            times.push(t.elapsed().as_nanos() as u64);
        } else {
            end.recv(&mut buf, pending);
            pending = end.send(&msg, together.then_some(&mut buf[..]));
        }
    }
    times
}

/// One run: fork, ping-pong, and give back RTT/2 in µs as (p50, mean) after the warm-up.
fn run(way: Way, cpu: [usize; 2], iters: usize, size: usize) -> (f64, f64) {
    let warm = iters / 10;
    let (c, s) = pair();
    // SAFETY: the process has one thread here (nothing before spawns any), so the child may
    // run ordinary code; it leaves with `_exit`.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        drop(c);
        // (The parent is pinned already, and a child starts with its mask.)
        barewire_bench::unpin();
        barewire_bench::pin(cpu[1]);
        ping_pong(way, s.as_raw_fd(), size, warm + iters, false);
        // SAFETY: ends the child without running the parent's exit handlers.
        unsafe { libc::_exit(0) };
    }
    drop(s);
    barewire_bench::pin(cpu[0]);
    let mut t = ping_pong(way, c.as_raw_fd(), size, warm + iters, true);
    let mut status = 0;
    // SAFETY: waits for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the answering process failed ({status:#x})"
    );
    let mut t = t.split_off(warm);
    t.sort_unstable();
    let p50 = t[t.len() / 2] as f64 / 2e3;
    let mean = t.iter().sum::<u64>() as f64 / t.len() as f64 / 2e3;
    (p50, mean)
}

fn main() {
    let o = Opts::parse();
    println!(
        "tcp-floor: {} B each way, {} round trips per rep, {} reps, CPUs {},{}",
        o.size, o.iters, o.reps, o.cpu[0], o.cpu[1]
    );
    let ways = if o.ways.is_empty() {
        Way::ALL.to_vec()
    } else {
        o.ways.clone()
    };
    let mut figs = vec![(vec![], vec![]); ways.len()];
    for rep in 0..o.reps.max(1) {
        for (w, &way) in ways.iter().enumerate() {
            let (p50, mean) = run(way, o.cpu, o.iters.max(10), o.size.max(1));
            println!(
                "rep {rep}: {}: p50 {p50:.3} µs, mean {mean:.3} µs",
                way.name()
            );
            figs[w].0.push(p50);
            figs[w].1.push(mean);
        }
    }
    let sys = median(figs[0].0.clone());
    println!("\n| way (RTT/2) | p50 | mean | p50 ÷ the first row's |\n|---|---|---|---|");
    for (w, way) in ways.iter().enumerate() {
        let p = median(figs[w].0.clone());
        let m = median(figs[w].1.clone());
        println!(
            "| {} | {p:.3} µs | {m:.3} µs | {:.2} |",
            way.name(),
            p / sys
        );
    }
}
