//! A minimal perftest-style benchmark of the software RDMA provider: two processes on loopback,
//! pinned to two cores, following perftest's conventions (write latency is half the round trip
//! of a ping-pong through memory, as `ib_write_lat` measures it; read and atomic latency are a
//! full round trip).
//!
//!     softrdma-perf write_lat|read_lat|fadd_lat|cas_lat|write_bw|read_bw [-s BYTES] [-n ITERS] [-D SECS] [--crc]
//!
//! Prints one `RESULT` line: latencies in microseconds (p50 p99 p99.9) or bandwidth in MiB/s.
//! The full perftest-compatible CLI (`barewire-perf`) is a later piece of work.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire_engine::{yield_now, Runtime};
use barewire_soft_rdma::provider::{
    connect, ConnectOptions, Listener, QueuePair, RegionDescriptor,
};
use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device, MemoryRegion, WcStatus};
use barewire_soft_rdma::wire::MpaSettings;
use hdrhistogram::Histogram;

struct Opts {
    test: String,
    size: usize,
    iters: u64,
    secs: f64,
    crc: bool,
    local_completion: bool,
}

fn opts(args: &[String]) -> Opts {
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    Opts {
        test: args.first().cloned().unwrap_or_else(|| "write_lat".into()),
        size: get("-s").and_then(|v| v.parse().ok()).unwrap_or(8),
        iters: get("-n").and_then(|v| v.parse().ok()).unwrap_or(20_000),
        secs: get("-D").and_then(|v| v.parse().ok()).unwrap_or(3.0),
        crc: args.iter().any(|a| a == "--crc"),
        local_completion: args.iter().any(|a| a == "--local-completion"),
    }
}

fn runtime(cpu: usize) -> Runtime {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    Runtime::builder()
        .core_ids(&[cpu % n])
        .idle_spin(Duration::from_millis(1))
        .build()
        .expect("runtime")
}

const REGION: usize = 64 << 20;

fn conn_opts(o: &Opts, desc: &RegionDescriptor) -> ConnectOptions {
    ConnectOptions {
        mpa: MpaSettings {
            crc: o.crc,
            ..MpaSettings::default()
        },
        private_data: desc.to_bytes().to_vec(),
        mulpdu: 16 * 1024,
        remote_completion: !o.local_completion,
        ..ConnectOptions::default()
    }
}

fn region(pd: &barewire_soft_rdma::verbs::ProtectionDomain, mem: &mut [u8]) -> MemoryRegion {
    let all =
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    // SAFETY: every buffer here lives until the process exits.
    unsafe { pd.register(mem.as_mut_ptr(), mem.len(), all) }.expect("register")
}

/// Waits (yielding to the provider's poller) until the byte at `p` equals `v`.
async fn wait_byte(p: *const u8, v: u8) {
    // SAFETY: p points into a live registered buffer; read volatile since the provider writes it.
    while unsafe { std::ptr::read_volatile(p) } != v {
        yield_now().await;
    }
}

fn write_wr(mr: &MemoryRegion, len: usize, remote: &RegionDescriptor) -> SendWr {
    SendWr {
        wr_id: 0,
        op: SendOp::Write {
            remote_addr: remote.addr,
            rkey: remote.rkey,
        },
        sges: vec![Sge {
            addr: mr.addr() as u64,
            len: len as u32,
            lkey: mr.stag(),
        }],
        signaled: false,
        fence: false,
    }
}

fn server(o: Opts) {
    runtime(1).block_on(async move {
        let pd = Device::new().alloc_pd();
        let mut mem = vec![0u8; REGION];
        let mr = region(&pd, &mut mem);
        let l = Listener::bind(
            "127.0.0.1:0".parse().unwrap(),
            conn_opts(&o, &RegionDescriptor::of(&mr)),
        )
        .unwrap();
        println!("READY {}", l.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        let (scq, rcq) = (CompletionQueue::new(1 << 16), CompletionQueue::new(64));
        let (qp, desc) = l.accept(&pd, &scq, &rcq).await.unwrap();
        let remote = RegionDescriptor::from_bytes(&desc).unwrap();
        if o.test == "write_lat" {
            // Ping-pong through memory: wait for the client's byte, answer with ours.
            let last = mr.addr() as usize + o.size - 1;
            for i in 0..o.iters + 1000 {
                let v = (i % 255 + 1) as u8;
                wait_byte(last as *const u8, v).await;
                // SAFETY: our own send buffer's last byte, past the receive area.
                unsafe { *((mr.addr() as usize + REGION / 2 + o.size - 1) as *mut u8) = v };
                let mut wr = write_wr(&mr, o.size, &remote);
                wr.sges[0].addr += (REGION / 2) as u64;
                qp.post_send(wr).unwrap();
            }
        }
        // Stay up (serving one-sided work) until the client is done.
        loop {
            barewire_engine::time::sleep(Duration::from_secs(3600)).await;
            let _ = &qp;
        }
    });
}

async fn latency(
    o: &Opts,
    qp: &QueuePair,
    scq: &CompletionQueue,
    mr: &MemoryRegion,
    remote: &RegionDescriptor,
) -> Histogram<u64> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let n = o.iters + 1000;
    for i in 0..n {
        let t = Instant::now();
        match o.test.as_str() {
            "write_lat" => {
                let v = (i % 255 + 1) as u8;
                // SAFETY: the last byte of our send area (second half of our buffer).
                unsafe { *((mr.addr() as usize + REGION / 2 + o.size - 1) as *mut u8) = v };
                let mut wr = write_wr(mr, o.size, remote);
                wr.sges[0].addr += (REGION / 2) as u64;
                qp.post_send(wr).unwrap();
                wait_byte((mr.addr() as usize + o.size - 1) as *const u8, v).await;
            }
            t => {
                let op = match t {
                    "read_lat" => SendOp::Read {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    },
                    "fadd_lat" => SendOp::FetchAdd {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                        add: 1,
                    },
                    "cas_lat" => SendOp::CmpSwap {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                        compare: i,
                        swap: i + 1,
                    },
                    other => panic!("unknown test {other}"),
                };
                let len = if t == "read_lat" { o.size } else { 8 } as u32;
                qp.post_send(SendWr {
                    wr_id: i,
                    op,
                    sges: vec![Sge {
                        addr: mr.addr() as u64,
                        len,
                        lkey: mr.stag(),
                    }],
                    signaled: true,
                    fence: false,
                })
                .unwrap();
                assert_eq!(scq.next().await.status, WcStatus::Success);
            }
        }
        if i >= 1000 {
            let ns = t.elapsed().as_nanos() as u64;
            h.record(if o.test == "write_lat" { ns / 2 } else { ns })
                .unwrap();
        }
    }
    h
}

async fn bandwidth(
    o: &Opts,
    qp: &QueuePair,
    scq: &CompletionQueue,
    mr: &MemoryRegion,
    remote: &RegionDescriptor,
) -> f64 {
    // perftest's CQ moderation: one signaled request per batch of 16, two batches in flight.
    const BATCH: u64 = 16;
    let slots = (REGION / 2 / o.size).max(1) as u64;
    let (t0, mut batches_done, mut posted) = (Instant::now(), 0u64, 0u64);
    let dur = Duration::from_secs_f64(o.secs);
    loop {
        while posted / BATCH - batches_done < 2 && t0.elapsed() < dur {
            for _ in 0..BATCH {
                let off = (posted % slots) * o.size as u64;
                let op = if o.test == "write_bw" {
                    SendOp::Write {
                        remote_addr: remote.addr + off,
                        rkey: remote.rkey,
                    }
                } else {
                    SendOp::Read {
                        remote_addr: remote.addr + off,
                        rkey: remote.rkey,
                    }
                };
                let signaled = posted % BATCH == BATCH - 1;
                let sges = vec![Sge {
                    addr: mr.addr() as u64 + off,
                    len: o.size as u32,
                    lkey: mr.stag(),
                }];
                qp.post_send(SendWr {
                    wr_id: posted,
                    op,
                    sges,
                    signaled,
                    fence: false,
                })
                .unwrap();
                posted += 1;
            }
        }
        if batches_done == posted / BATCH {
            break;
        }
        assert_eq!(scq.next().await.status, WcStatus::Success);
        batches_done += 1;
    }
    (batches_done * BATCH) as f64 * o.size as f64 / (1 << 20) as f64 / t0.elapsed().as_secs_f64()
}

fn client(o: Opts, port: u16) {
    runtime(0).block_on(async move {
        let pd = Device::new().alloc_pd();
        let mut mem = vec![0u8; REGION];
        let mr = Rc::new(region(&pd, &mut mem));
        let (scq, rcq) = (CompletionQueue::new(1 << 16), CompletionQueue::new(64));
        let (qp, desc) = connect(
            format!("127.0.0.1:{port}").parse().unwrap(),
            &pd,
            &scq,
            &rcq,
            conn_opts(&o, &RegionDescriptor::of(&mr)),
        )
        .await
        .unwrap();
        let remote = RegionDescriptor::from_bytes(&desc).unwrap();
        if o.test.ends_with("_bw") {
            let bw = bandwidth(&o, &qp, &scq, &mr, &remote).await;
            println!(
                "RESULT {} size={} crc={} bw_mib_s={bw:.1}",
                o.test, o.size, o.crc
            );
        } else {
            let h = latency(&o, &qp, &scq, &mr, &remote).await;
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "RESULT {} size={} crc={} iters={} p50_us={:.2} p99_us={:.2} p999_us={:.2}",
                o.test,
                o.size,
                o.crc,
                o.iters,
                us(0.5),
                us(0.99),
                us(0.999)
            );
        }
    });
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--server") {
        return server(opts(&args[1..]));
    }
    let o = opts(&args);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--server")
        .args(&args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("server process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("READY ")
        .expect("READY")
        .parse()
        .unwrap();
    client(o, port);
    let _ = child.kill();
    let _ = child.wait();
}
