//! Gather `SENDMSG` against `SENDMSG_ZC` for large sends, the way the soft provider sends
//! (issue 16, item 1: "gather SENDMSG, or SEND_ZC where it measures faster").
//!
//!     send-zc [--secs S] [--reps R] [--cpu A,B] [--sizes 16384,65536,...]
//!
//! The sender, on CPU A, builds each send as the provider does: a gather list of a 16-byte
//! header, the payload and a 4-byte trailer, on the engine's raw queue, with one send
//! outstanding at a time.
//! - `copy`: `SENDMSG` with `MSG_DONTWAIT`, submitted and reaped in one `io_uring_enter` (the
//!   provider's send); a full socket waits for `POLLOUT`.
//! - `zc`: `SENDMSG_ZC`: the kernel takes the payload's pages instead of copying them, and the
//!   payload may be reused only once the send's notification has come (the network stack has
//!   let go of the pages), so the next send waits for it. Asked to report its usage: the
//!   notification says when the kernel copied after all (loopback delivery does).
//!
//! The receiver, a plain thread on CPU B, reads into a 1 MiB buffer until the sender shuts the
//! connection down and counts the bytes, which must equal what the sender counted. Each figure
//! is the median over the reps of the bytes sent per second; the two ways alternate rep by rep.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use barewire_bench::reps::median;
use barewire_engine::uring::{opcode, types, Completion, RawQueue, CQE_F_MORE};
use clap::Parser;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "send-zc",
    about = "Gather SENDMSG against SENDMSG_ZC for large sends"
)]
struct Opts {
    /// Seconds per run.
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Reps of each way and size, alternated.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// The CPUs of the sender and the receiver.
    #[arg(long, default_value = "0,1", value_parser = barewire_bench::cpu_pair_arg)]
    cpu: [usize; 2],
    /// Payload bytes per send.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16384,65536,262144,1048576"
    )]
    sizes: Vec<usize>,
}

/// `IORING_SEND_ZC_REPORT_USAGE` (in the request's `ioprio`).
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED` (in the notification's result).
const NOTIF_USAGE_ZC_COPIED: i32 = 1 << 31;
/// `IORING_CQE_F_NOTIF`.
const CQE_F_NOTIF: u32 = 1 << 3;

const SEND: u64 = 1;
const POLL: u64 = 2;

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Copy,
    Zc,
}

/// What one run moved.
struct Run {
    bytes_per_sec: f64,
    /// Of the zero-copy sends, how many the kernel copied after all.
    copied: u64,
    sends: u64,
}

/// Submits and reaps until the completion of `token` that `want` accepts has come.
fn wait_for(q: &RawQueue, token: u64, want: impl Fn(&Completion) -> bool) -> Completion {
    let mut done = Vec::with_capacity(4);
    loop {
        q.submit();
        done.clear();
        q.drain(&mut done);
        if let Some(c) = done.iter().find(|c| c.token == token && want(c)) {
            return *c;
        }
    }
}

fn run(q: &RawQueue, way: Way, size: usize, secs: f64, receiver_cpu: usize) -> Run {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    let receiver = std::thread::spawn(move || {
        core_affinity::set_for_current(core_affinity::CoreId { id: receiver_cpu });
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) => return total,
                Ok(n) => total += n as u64,
                Err(e) => panic!("receive: {e}"),
            }
        }
    });
    let mut c = TcpStream::connect(addr).expect("connect");
    c.set_nodelay(true).unwrap();
    c.set_nonblocking(true).unwrap();
    let fd = types::Fd(c.as_raw_fd());
    let header = [0x11u8; 16];
    let payload = vec![0x5au8; size];
    let trailer = [0u8; 4];
    let iov = [
        libc::iovec {
            iov_base: header.as_ptr() as *mut _,
            iov_len: header.len(),
        },
        libc::iovec {
            iov_base: payload.as_ptr() as *mut _,
            iov_len: payload.len(),
        },
        libc::iovec {
            iov_base: trailer.as_ptr() as *mut _,
            iov_len: trailer.len(),
        },
    ];
    let whole: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut sent = 0u64;
    let (mut copied, mut sends) = (0u64, 0u64);
    let t = Instant::now();
    let until = Duration::from_secs_f64(secs);
    while t.elapsed() < until {
        // Where the previous send stopped inside the gather list (a full socket takes part).
        let mut at = (sent % whole as u64) as usize;
        let mut v = [iov[0], iov[1], iov[2]];
        let mut first = 0;
        while at >= v[first].iov_len {
            at -= v[first].iov_len;
            first += 1;
        }
        // SAFETY: `at` is inside iovec `first` (the loop above).
        v[first].iov_base = unsafe { (v[first].iov_base as *mut u8).add(at) }.cast();
        v[first].iov_len -= at;
        // SAFETY: msghdr is plain old data; zero is "no name, no control".
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = v[first..].as_mut_ptr();
        msg.msg_iovlen = 3 - first;
        let flags = (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32;
        let e = match way {
            Way::Copy => opcode::SendMsg::new(fd, &msg).flags(flags).build(),
            Way::Zc => opcode::SendMsgZc::new(fd, &msg)
                .flags(flags)
                .ioprio(SEND_ZC_REPORT_USAGE)
                .build(),
        };
        // SAFETY: the gather list, its buffers and `msg` live until the send's completion
        // (copy) or its notification (zc), which this loop waits for before touching them.
        unsafe { q.push(e, SEND) };
        let c = wait_for(q, SEND, |c| c.flags & CQE_F_NOTIF == 0);
        if way == Way::Zc && c.flags & CQE_F_MORE != 0 {
            let n = wait_for(q, SEND, |c| c.flags & CQE_F_NOTIF != 0);
            sends += 1;
            copied += (n.result & NOTIF_USAGE_ZC_COPIED != 0) as u64;
        }
        match c.result {
            n if n > 0 => sent += n as u64,
            n if n == -libc::EAGAIN => {
                let e = opcode::PollAdd::new(fd, libc::POLLOUT as u32).build();
                // SAFETY: a poll names no memory.
                unsafe { q.push(e, POLL) };
                wait_for(q, POLL, |_| true);
            }
            n => panic!("send: {}", std::io::Error::from_raw_os_error(-n)),
        }
    }
    let took = t.elapsed().as_secs_f64();
    c.flush().unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    let got = receiver.join().expect("the receiver");
    assert_eq!(got, sent, "the receiver got every byte sent");
    Run {
        bytes_per_sec: sent as f64 / took,
        copied,
        sends,
    }
}

fn main() {
    let o = Opts::parse();
    let rt = barewire_engine::Runtime::builder()
        .core_ids(&[o.cpu[0]])
        .reactor(barewire_engine::Reactor::IoUring)
        .build()
        .expect("an io_uring runtime");
    rt.block_on(async move {
        let q = RawQueue::new().expect("an io_uring core");
        println!(
            "send-zc: {} reps of {} s per way and size, sender on CPU {}, receiver on CPU {}",
            o.reps, o.secs, o.cpu[0], o.cpu[1]
        );
        println!(
            "{:>9} {:>14} {:>14} {:>9} {:>14}",
            "payload", "SENDMSG MB/s", "ZC MB/s", "ZC÷copy", "ZC copied"
        );
        for &size in &o.sizes {
            let (mut copy, mut zc, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let (mut copied, mut sends) = (0, 0);
            // A throwaway first rep warms both ways.
            for rep in 0..=o.reps {
                let a = run(&q, Way::Copy, size, o.secs, o.cpu[1]);
                let b = run(&q, Way::Zc, size, o.secs, o.cpu[1]);
                if rep > 0 {
                    copy.push(a.bytes_per_sec / 1e6);
                    zc.push(b.bytes_per_sec / 1e6);
                    ratios.push(b.bytes_per_sec / a.bytes_per_sec);
                    copied += b.copied;
                    sends += b.sends;
                }
            }
            println!(
                "{:>9} {:>14.0} {:>14.0} {:>9.2} {:>8}/{}",
                size,
                median(copy),
                median(zc),
                median(ratios),
                copied,
                sends
            );
        }
        let _ = std::io::stdout().flush();
    });
}
