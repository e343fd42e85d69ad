//! The main job: two nodes on loopback, talking RDMA over barewire's software provider (iWARP
//! over TCP, so the same bytes a Linux siw node would send).
//!
//! The example starts a second copy of itself as the passive node, which registers 64 MiB and
//! hands its descriptor over in the MPA private data. The active node then writes, reads back,
//! runs atomics and measures what each costs.
//!
//!     cargo run --release --example rdma_demo

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use barewire::engine::Runtime;
use barewire::soft_rdma::provider::{connect, serve, ConnectOptions, Listener, RegionDescriptor};
use barewire::soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire::soft_rdma::verbs::{Access, CompletionQueue, Device, MemoryRegion, WcStatus};
use barewire::soft_rdma::wire::MpaSettings;

const REGION: usize = 64 << 20;

fn runtime(cpu: usize) -> Runtime {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    Runtime::builder()
        .core_ids(&[cpu % cores])
        .idle_spin(Duration::from_micros(50))
        .build()
        .expect("runtime")
}

fn serve_node() {
    runtime(1).block_on(async {
        let pd = Device::new().alloc_pd();
        let mut mem = vec![0u8; REGION];
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        // SAFETY: `mem` lives until the process is killed (`serve` never returns).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), mem.len(), all) }.expect("register");
        let opts = ConnectOptions {
            mpa: MpaSettings {
                crc: false,
                ..MpaSettings::default()
            },
            private_data: RegionDescriptor::of(&mr).to_bytes().to_vec(),
            ..ConnectOptions::default()
        };
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), opts).expect("listen");
        println!("READY {}", l.local_addr().unwrap().port());
        std::io::stdout().flush().unwrap();
        serve(
            l,
            pd,
            CompletionQueue::new(4096),
            CompletionQueue::new(4096),
        )
        .await
    })
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 * p) as usize).min(v.len() - 1)]
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return serve_node();
    }
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("serve")
        .stdout(Stdio::piped())
        .spawn()
        .expect("second node");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let port: u16 = line
        .trim()
        .strip_prefix("READY ")
        .expect("READY line")
        .parse()
        .unwrap();
    println!(
        "barewire RDMA demo: node B (pid {}) listens on 127.0.0.1:{port}; node A connects",
        child.id()
    );

    runtime(0).block_on(async move {
        let pd = Device::new().alloc_pd();
        let (scq, rcq) = (CompletionQueue::new(4096), CompletionQueue::new(64));
        let opts = ConnectOptions {
            mpa: MpaSettings {
                crc: false,
                ..MpaSettings::default()
            },
            ..ConnectOptions::default()
        };
        let (qp, desc) = connect(
            format!("127.0.0.1:{port}").parse().unwrap(),
            &pd,
            &scq,
            &rcq,
            opts,
        )
        .await
        .expect("connect");
        let remote =
            RegionDescriptor::from_bytes(&desc).expect("region descriptor in the private data");
        println!(
            "connected (MPA rev 2, CRC off); B's region: rkey {:#010x}, {} MiB",
            remote.rkey.0,
            remote.len >> 20
        );

        let mut buf = vec![0u8; 4 << 20];
        // SAFETY: `buf` outlives the region (dropped at the end of this block).
        let mr = unsafe { pd.register(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }
            .expect("register");
        let sge = |mr: &MemoryRegion, off: u64, len: u32| Sge {
            addr: mr.addr() as u64 + off,
            len,
            lkey: mr.stag(),
        };
        let op = |wr_id, op, sge| SendWr {
            wr_id,
            op,
            sges: [sge].into(),
            signaled: true,
            fence: false,
        };

        // 1. Write 1 MiB, read it back.
        for (i, x) in buf[..1 << 20].iter_mut().enumerate() {
            *x = (i * 7 % 256) as u8;
        }
        let t0 = Instant::now();
        qp.post_send(op(
            1,
            SendOp::Write {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            sge(&mr, 0, 1 << 20),
        ))
        .unwrap();
        qp.post_send(op(
            2,
            SendOp::Read {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            sge(&mr, 2 << 20, 1 << 20),
        ))
        .unwrap();
        for _ in 0..2 {
            assert_eq!(scq.next().await.status, WcStatus::Success);
        }
        let same = buf[..1 << 20] == buf[2 << 20..3 << 20];
        println!(
            "1 MiB WRITE then READ back: {:?}, bytes {}",
            t0.elapsed(),
            if same { "identical" } else { "DIFFER" }
        );

        // 2. 8 B READ latency (a full round trip, as ib_read_lat reports it).
        let mut lat = Vec::with_capacity(20_000);
        for i in 0..21_000u64 {
            let t = Instant::now();
            qp.post_send(op(
                i,
                SendOp::Read {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                sge(&mr, 0, 8),
            ))
            .unwrap();
            assert_eq!(scq.next().await.status, WcStatus::Success);
            if i >= 1000 {
                lat.push(t.elapsed());
            }
        }
        println!(
            "8 B READ latency (RTT):      p50 {:?}  p99 {:?}",
            percentile(&mut lat, 0.5),
            percentile(&mut lat, 0.99)
        );

        // 3. 8 B fetch-and-add latency; the final value proves every add landed once.
        let counter = remote.addr + (REGION as u64 - 8);
        lat.clear();
        for i in 0..20_000u64 {
            let t = Instant::now();
            qp.post_send(op(
                i,
                SendOp::FetchAdd {
                    remote_addr: counter,
                    rkey: remote.rkey,
                    add: 1,
                },
                sge(&mr, 8, 8),
            ))
            .unwrap();
            assert_eq!(scq.next().await.status, WcStatus::Success);
            lat.push(t.elapsed());
        }
        qp.post_send(op(
            0,
            SendOp::Read {
                remote_addr: counter,
                rkey: remote.rkey,
            },
            sge(&mr, 16, 8),
        ))
        .unwrap();
        assert_eq!(scq.next().await.status, WcStatus::Success);
        let total = u64::from_ne_bytes(buf[16..24].try_into().unwrap());
        println!(
            "8 B FETCH_ADD latency (RTT): p50 {:?}  p99 {:?}  (counter now {total})",
            percentile(&mut lat, 0.5),
            percentile(&mut lat, 0.99)
        );

        // 4. 64 KiB WRITE bandwidth, 16 in flight, for one second.
        let (t0, mut done, mut posted) = (Instant::now(), 0u64, 0u64);
        while t0.elapsed() < Duration::from_secs(1) || done < posted {
            while posted - done < 16 && t0.elapsed() < Duration::from_secs(1) {
                qp.post_send(op(
                    posted,
                    SendOp::Write {
                        remote_addr: remote.addr + (posted % 512) * 65536,
                        rkey: remote.rkey,
                    },
                    sge(&mr, 0, 65536),
                ))
                .unwrap();
                posted += 1;
            }
            assert_eq!(scq.next().await.status, WcStatus::Success);
            done += 1;
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "64 KiB WRITE bandwidth: {:.0} MiB/s ({done} writes in {secs:.2} s)",
            done as f64 * 65536.0 / (1 << 20) as f64 / secs
        );
        drop(mr);
        drop(buf);
    });
    let _ = child.kill();
    let _ = child.wait();
}
