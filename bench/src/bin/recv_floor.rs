//! What one look at an idle TCP socket costs, by each way the soft provider can look: the floor
//! under its polling pass on a core with few queue pairs (`soft-rdma/src/provider/ring.rs`).
//!
//!     recv-floor [--iters N] [--reps R] [--cpu C] [--threads T]
//!
//! On a connected loopback socket with nothing to read, per look:
//! - `recv`: one `recv(MSG_DONTWAIT)` system call (the raw path's receive);
//! - `epoll + recv`: `epoll_wait` with a zero timeout, then that `recv` (the raw path's pass under
//!   `BAREWIRE_REACTOR=epoll`, whose engine asks epoll every pass);
//! - `ring RECV`: one `RECV` with `MSG_DONTWAIT` into a provided buffer, pushed on the core's
//!   ring and submitted and reaped in one `io_uring_enter` (the io_uring path's pass), through
//!   the engine's own raw queue, as the provider does;
//! - `ring RECV, own buffer`: the same naming a plain buffer (no provided-buffer selection).
//! - `ring RECV, own buffer, registered file`: that look naming the socket by its slot in the
//!   core's registered file table (`RawQueue::register_file`), as the provider's queue pairs do.
//! - `own ring, by descriptor` / `own ring, by registered index`: that look on a ring of the
//!   bench's own (the io-uring crate's, outside the engine), entered by its descriptor or, after
//!   `IORING_REGISTER_RING_FDS`, by its index (`IORING_ENTER_REGISTERED_RING`), as the engine's
//!   rings are. The difference is the kernel's lookup of the ring's file, which in a process
//!   whose file table is shared also takes and drops a reference on it: `--threads 2` (an idle
//!   second thread, as a node with two cores has) measures that case.
//!
//! And with 8 bytes waiting each time (the peer writes them just before; that write is
//! timed too and reported alone): `recv` and both `ring RECV`s again. Each figure is the median over
//! the reps of nanoseconds per look; the reps of each way alternate with the others'.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Instant;

use barewire_bench::reps::median;
use barewire_engine::buf::BufRing;
use barewire_engine::uring::{opcode, squeue, types, RawQueue};
use clap::Parser;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "recv-floor",
    about = "What one look at an idle TCP socket costs"
)]
struct Opts {
    /// Looks per rep.
    #[arg(long, default_value_t = 500_000)]
    iters: u32,
    /// Reps of each way, alternated.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The CPU to pin to.
    #[arg(long, default_value_t = 0, value_parser = barewire_bench::cpu_arg)]
    cpu: usize,
    /// Threads in the process (the others sleep): with more than one the file table is shared.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// A ring of the bench's own, entered by descriptor or by registered index.
fn own_ring_looks(fd: i32, iters: u32, registered: bool) -> f64 {
    let mut ring = io_uring::IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .build(8)
        .expect("an io_uring");
    let (mut submitter, mut sq, mut cq) = ring.split();
    if registered {
        submitter
            .register_ring_fd()
            .expect("IORING_REGISTER_RING_FDS");
    }
    let mut buf = vec![0u8; BUF];
    let ns = per_op(iters, || {
        let e = opcode::Recv::new(types::Fd(fd), buf.as_mut_ptr(), BUF as u32)
            .flags(libc::MSG_DONTWAIT)
            .build();
        // SAFETY: the receive names `buf`, live across the submission that completes it
        // (MSG_DONTWAIT).
        unsafe { sq.push(&e).expect("a free submission slot") };
        sq.sync();
        submitter.submit().expect("io_uring_enter");
        cq.sync();
        let c: io_uring::cqueue::Entry = cq.next().expect("completed in its submission");
        assert_eq!(c.result(), -libc::EAGAIN);
    });
    if registered {
        // The thread's table holds 16: give the slot back for the next rep.
        submitter
            .unregister_ring_fd()
            .expect("IORING_UNREGISTER_RING_FDS");
    }
    ns
}

/// Bytes one look may take (the provider's receive buffers are this size).
const BUF: usize = 16 * 1024;

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (s, _) = l.accept().expect("accept");
    c.set_nodelay(true).unwrap();
    s.set_nodelay(true).unwrap();
    (c, s)
}

fn sys_recv(fd: i32, buf: &mut [u8]) -> isize {
    // SAFETY: `buf` is a live, writable buffer of its length.
    unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) }
}

/// Nanoseconds per call of `f` over `iters` calls.
fn per_op(iters: u32, mut f: impl FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn main() {
    let o = Opts::parse();
    for _ in 1..o.threads {
        std::thread::spawn(|| loop {
            std::thread::park();
        });
    }
    let rt = barewire_engine::Runtime::builder()
        .core_ids(&[o.cpu])
        .reactor(barewire_engine::Reactor::IoUring)
        .build()
        .expect("an io_uring runtime");
    rt.block_on(async move {
        let (mine, mut peer) = pair();
        let fd = mine.as_raw_fd();
        let mut buf = [0u8; BUF];
        let q = RawQueue::new().expect("an io_uring core");
        let ring = BufRing::new(64, BUF).expect("a provided-buffer ring");
        // SAFETY: epoll_create1 with valid flags.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1");
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: 1,
        };
        // SAFETY: registering a live descriptor with a valid event.
        let added = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(added, 0, "epoll_ctl");
        let mut done = Vec::with_capacity(4);
        let slot = q.register_file(fd).expect("a slot in the core's file table");
        // A look: own buffer or provided, the socket named by its descriptor or its slot.
        let mut ring_look = |own: bool, fixed: bool, buf: &mut [u8]| -> i32 {
            let (target, named) = if fixed {
                (types::Fd(slot as i32), squeue::Flags::FIXED_FILE)
            } else {
                (types::Fd(fd), squeue::Flags::empty())
            };
            let e = if own {
                opcode::Recv::new(target, buf.as_mut_ptr(), buf.len() as u32)
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .flags(named)
            } else {
                opcode::Recv::new(target, std::ptr::null_mut(), BUF as u32)
                    .buf_group(ring.group_id())
                    .flags(libc::MSG_DONTWAIT)
                    .build()
                    .flags(squeue::Flags::BUFFER_SELECT | named)
            };
            // SAFETY: the receive names `buf` (live across the submission, which completes it:
            // MSG_DONTWAIT) or a buffer of the ring's own.
            unsafe { q.push(e, 1) };
            q.submit();
            done.clear();
            q.drain(&mut done);
            let c = done.first().expect("the receive completed in its submission");
            if let Some(bid) = barewire_engine::uring::buffer_id(c.flags) {
                ring.give_back(bid);
            }
            c.result
        };
        let names = [
            "recv (MSG_DONTWAIT)",
            "epoll_wait(0) + recv",
            "ring RECV, provided buffer",
            "ring RECV, own buffer",
            "8 B waiting: peer write alone",
            "8 B waiting: write + recv",
            "8 B waiting: write + ring RECV, provided buffer",
            "8 B waiting: write + ring RECV, own buffer",
            "own ring, by descriptor",
            "own ring, by registered index",
            "ring RECV, own buffer, registered file",
            "8 B waiting: write + ring RECV, own, registered file",
        ];
        let mut res: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // A throwaway first rep warms every path.
        for rep in 0..=o.reps {
            let n = o.iters;
            // The two own-ring ways, in alternating order rep by rep.
            let (by_fd, by_index) = if rep % 2 == 0 {
                let by_fd = own_ring_looks(fd, n, false);
                (by_fd, own_ring_looks(fd, n, true))
            } else {
                let by_index = own_ring_looks(fd, n, true);
                (own_ring_looks(fd, n, false), by_index)
            };
            let r = [
                per_op(n, || {
                    assert_eq!(sys_recv(fd, &mut buf), -1);
                }),
                per_op(n, || {
                    // SAFETY: a live epoll descriptor and a buffer of 8 events.
                    unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 8, 0) };
                    assert_eq!(sys_recv(fd, &mut buf), -1);
                }),
                per_op(n, || {
                    assert_eq!(ring_look(false, false, &mut buf), -libc::EAGAIN);
                }),
                per_op(n, || {
                    assert_eq!(ring_look(true, false, &mut buf), -libc::EAGAIN);
                }),
                {
                    let t = per_op(n / 4, || {
                        peer.write_all(&[7u8; 8]).unwrap();
                    });
                    // Drain what it left before the next way runs.
                    while sys_recv(fd, &mut buf) > 0 {}
                    t
                },
                per_op(n / 4, || {
                    peer.write_all(&[7u8; 8]).unwrap();
                    assert_eq!(sys_recv(fd, &mut buf), 8);
                }),
                per_op(n / 4, || {
                    peer.write_all(&[7u8; 8]).unwrap();
                    assert_eq!(ring_look(false, false, &mut buf), 8);
                }),
                per_op(n / 4, || {
                    peer.write_all(&[7u8; 8]).unwrap();
                    assert_eq!(ring_look(true, false, &mut buf), 8);
                }),
                by_fd,
                by_index,
                per_op(n, || {
                    assert_eq!(ring_look(true, true, &mut buf), -libc::EAGAIN);
                }),
                per_op(n / 4, || {
                    peer.write_all(&[7u8; 8]).unwrap();
                    assert_eq!(ring_look(true, true, &mut buf), 8);
                }),
            ];
            if rep > 0 {
                for (v, x) in res.iter_mut().zip(r) {
                    v.push(x);
                }
            }
        }
        println!(
            "recv-floor: {} looks x {} reps, pinned to CPU {}, {} thread(s); ns per look, median of the reps",
            o.iters, o.reps, o.cpu, o.threads
        );
        // The two own-ring ways ran back to back in each rep: their ratio is taken per rep.
        let own_ratio = median(res[9].iter().zip(&res[8]).map(|(r, d)| r / d).collect::<Vec<_>>());
        // The registered-file look against the same look by descriptor, per rep.
        let file_ratio = median(res[10].iter().zip(&res[3]).map(|(f, d)| f / d).collect::<Vec<_>>());
        let med: Vec<f64> = res.into_iter().map(median).collect();
        for (name, m) in names.iter().zip(&med) {
            println!("  {name:<48} {m:>8.0}");
        }
        for (what, idle, busy) in [("provided buffer", 2, 6), ("own buffer", 3, 7)] {
            println!(
                "  ring RECV, {what}: idle look {:.2}x the epoll pass; with 8 B waiting (less the write) {:.2}x a recv",
                med[idle] / med[1],
                (med[busy] - med[4]) / (med[5] - med[4])
            );
        }
        println!("  own ring: by registered index {own_ratio:.2}x by descriptor (median of the reps' ratios)");
        println!("  ring RECV, own buffer: idle look by registered file {file_ratio:.2}x by descriptor (median of the reps' ratios)");
        let _ = std::io::stdout().flush();
    });
}
