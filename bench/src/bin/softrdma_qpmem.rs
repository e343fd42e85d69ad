//! Memory per connected queue pair: connects N queue pairs (default 1000) from this process to
//! a second one, and reports the growth of each process's resident set per QP. No memory is
//! registered on the client, so the figure excludes registered user memory; the server
//! registers one 1 MiB region before it is measured.
//!
//!     softrdma-qpmem [N]   (--help says more)

use std::io::{BufRead, BufReader, Write};

use clap::Parser;
use std::process::{Command, Stdio};
use std::time::Duration;

use barewire_engine::Runtime;
use barewire_soft_rdma::provider::{connect, serve, ConnectOptions, Listener, RegionDescriptor};
use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device, WcStatus};

fn rss_kib(pid: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn raise_nofile() {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: get/set our own limit.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
    }
}

fn rt() -> Runtime {
    Runtime::builder()
        .cores(1)
        .pin(false)
        .idle_spin(Duration::from_millis(1))
        .build()
        .unwrap()
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "softrdma-qpmem",
    about = "Resident memory per connected soft-provider queue pair, on both sides"
)]
struct Cli {
    /// Queue pairs to connect.
    #[arg(default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    n: u64,
    /// The listening side this program starts itself.
    #[arg(long, hide = true)]
    server: bool,
}

fn main() {
    raise_nofile();
    let cli = Cli::parse();
    if cli.server {
        rt().block_on(async {
            let pd = Device::new().alloc_pd();
            let mut mem = vec![0u8; 1 << 20];
            // SAFETY: lives until the process is killed.
            let mr = unsafe {
                pd.register(
                    mem.as_mut_ptr(),
                    mem.len(),
                    Access::LOCAL_WRITE | Access::REMOTE_READ,
                )
            }
            .unwrap();
            // Every queue pair comes from this one address: the listener's limits on open
            // connections (there against floods) are raised to let all of them in.
            let open = cli.n as usize + 1;
            let opts = ConnectOptions {
                private_data: RegionDescriptor::of(&mr).to_bytes().to_vec(),
                max_connections: open,
                max_connections_per_source: open,
                ..ConnectOptions::default()
            };
            let l = Listener::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
            println!("READY {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            serve(l, pd, CompletionQueue::new(64), CompletionQueue::new(64)).await
        });
        return;
    }
    let n = cli.n as usize;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--server")
        .arg(cli.n.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    out.read_line(&mut line).unwrap();
    let port: u16 = line.trim().strip_prefix("READY ").unwrap().parse().unwrap();
    let server = child.id().to_string();
    rt().block_on(async {
        let pd = Device::new().alloc_pd();
        let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
        let addr = format!("127.0.0.1:{port}").parse().unwrap();
        // Warm up one connection so one-time allocations (staging buffer, epoll set) are out.
        let (first, desc) = connect(addr, &pd, &scq, &rcq, ConnectOptions::default())
            .await
            .unwrap();
        let remote = RegionDescriptor::from_bytes(&desc).unwrap();
        let mut local = vec![0u8; 64];
        // SAFETY: `local` outlives the region (dropped at the end of this block).
        let lmr =
            unsafe { pd.register(local.as_mut_ptr(), local.len(), Access::LOCAL_WRITE) }.unwrap();
        // 8 B READ round trips on the first connection; the median tells whether the idle
        // connections cost the progress engine anything.
        let read_p50 = |n: u64| {
            let (first, scq, lmr) = (&first, &scq, &lmr);
            async move {
                let mut v = Vec::with_capacity(n as usize);
                for i in 0..n {
                    let t = std::time::Instant::now();
                    let sge = Sge {
                        addr: lmr.addr() as u64,
                        len: 8,
                        lkey: lmr.stag(),
                    };
                    let op = SendOp::Read {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    };
                    first
                        .post_send(SendWr {
                            wr_id: i,
                            op,
                            sges: [sge].into(),
                            signaled: true,
                            fence: false,
                        })
                        .unwrap();
                    assert_eq!(scq.next().await.status, WcStatus::Success);
                    v.push(t.elapsed());
                }
                v.sort();
                v[v.len() / 2]
            }
        };
        let alone = read_p50(5000).await;
        barewire_engine::time::sleep(Duration::from_millis(100)).await;
        let (c0, s0) = (rss_kib("self"), rss_kib(&server));
        let mut qps = Vec::with_capacity(n);
        for _ in 0..n {
            qps.push(
                connect(addr, &pd, &scq, &rcq, ConnectOptions::default())
                    .await
                    .unwrap()
                    .0,
            );
        }
        barewire_engine::time::sleep(Duration::from_millis(200)).await;
        let (c1, s1) = (rss_kib("self"), rss_kib(&server));
        let crowded = read_p50(5000).await;
        println!("READ p50 on one connection: {alone:?} alone, {crowded:?} beside {n} idle ones");
        println!(
            "RESULT qps={n} client_rss_per_qp_bytes={} server_rss_per_qp_bytes={}",
            (c1 - c0) * 1024 / n as u64,
            (s1 - s0) * 1024 / n as u64
        );
        drop((qps, first, lmr));
    });
    let _ = child.kill();
    let _ = child.wait();
}
