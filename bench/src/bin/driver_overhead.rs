//! What barewire-drivers' one API costs over the software provider called directly: 8 B RDMA
//! WRITE latency (ping-pong through memory, RTT/2, as `ib_write_lat`), the same loop once over
//! `barewire_soft_rdma` and once over `barewire_drivers` (soft backend), in alternating runs of
//! two pinned processes.
//!
//!     driver-overhead [--reps N] [-n ITERS] [--cpu A,B]   (--help says more)
//!
//! Prints each run's p50 and the medians, and the ratio drivers ÷ direct.

use std::io::Write;

use clap::Parser;
use std::time::{Duration, Instant};

use barewire_bench::reps::median;
use barewire_engine::{yield_now, Runtime};
use barewire_soft_rdma::provider as soft;
use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{Access, Stag};
use hdrhistogram::Histogram;

const LEN: usize = 8;
const REGION: usize = 4096;

/// The one thing the loop needs from a queue pair.
trait Wire {
    fn write(&self, wr: SendWr);
}

impl Wire for soft::QueuePair {
    fn write(&self, wr: SendWr) {
        self.post_send(wr).expect("post");
    }
}

impl Wire for barewire_drivers::QueuePair {
    fn write(&self, wr: SendWr) {
        self.post_send(wr).expect("post");
    }
}

/// The shared ping-pong: the client writes byte `v` into the peer's region and waits for the
/// peer to write it back into ours. Returns the client's histogram of RTT/2 in ns.
async fn pingpong<W: Wire>(
    w: &W,
    mem: *mut u8,
    lkey: Stag,
    remote: soft::RegionDescriptor,
    iters: u64,
    client: bool,
) -> Option<Histogram<u64>> {
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
    let (recv, send) = (mem, mem.wrapping_add(REGION / 2));
    let warm = 1000;
    for i in 0..warm + iters {
        let v = (i % 255 + 1) as u8;
        let t = Instant::now();
        let go = |w: &W| {
            // SAFETY: our own registered send area.
            unsafe { std::ptr::write_volatile(send.add(LEN - 1), v) };
            w.write(SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_addr: remote.addr,
                    rkey: remote.rkey,
                },
                sges: [Sge {
                    addr: send as u64,
                    len: LEN as u32,
                    lkey,
                }]
                .into(),
                signaled: false,
                fence: false,
            });
        };
        if client {
            go(w);
        }
        // SAFETY: our registered receive area, written by the peer's WRITE.
        while unsafe { std::ptr::read_volatile(recv.add(LEN - 1)) } != v {
            yield_now().await;
        }
        if client {
            if i >= warm {
                h.record(t.elapsed().as_nanos() as u64 / 2).unwrap();
            }
        } else {
            go(w);
        }
    }
    client.then_some(h)
}

fn runtime(cpu: usize) -> Runtime {
    Runtime::builder()
        .core_ids(&[cpu])
        .idle_spin(Duration::from_millis(1))
        .build()
        .expect("runtime")
}

/// One side of one run. `port` None: serve (print READY) else connect. Returns the client's p50.
fn side(mode: &str, cpu: usize, port: Option<u16>, iters: u64) -> Option<f64> {
    runtime(cpu).block_on(async move {
        let mut mem = vec![0u64; REGION / 8];
        let ptr = mem.as_mut_ptr() as *mut u8;
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let h = if mode == "direct" {
            let pd = barewire_soft_rdma::verbs::Device::new().alloc_pd();
            // SAFETY: `mem` outlives the region (both live to the end of this block).
            let mr = unsafe { pd.register(ptr, REGION, all) }.unwrap();
            let (scq, rcq) = (
                barewire_soft_rdma::verbs::CompletionQueue::new(64),
                barewire_soft_rdma::verbs::CompletionQueue::new(64),
            );
            // The same settings the drivers' soft backend uses (CRC off, IRD/ORD 16, MULPDU
            // 16 KiB), so only the layer differs.
            let opts = soft::ConnectOptions {
                mpa: barewire_soft_rdma::wire::MpaSettings {
                    crc: false,
                    ird: 16,
                    ord: 16,
                    ..Default::default()
                },
                private_data: soft::RegionDescriptor::of(&mr).to_bytes().to_vec(),
                mulpdu: 16 * 1024,
                ..Default::default()
            };
            let (qp, data) = match port {
                None => {
                    let l = soft::Listener::bind(([127, 0, 0, 1], 0).into(), opts).unwrap();
                    println!("READY {}", l.local_addr().unwrap().port());
                    std::io::stdout().flush().unwrap();
                    l.accept(&pd, &scq, &rcq).await.unwrap()
                }
                Some(p) => soft::connect(([127, 0, 0, 1], p).into(), &pd, &scq, &rcq, opts)
                    .await
                    .unwrap(),
            };
            let remote = soft::RegionDescriptor::from_bytes(&data).unwrap();
            pingpong(&qp, ptr, mr.stag(), remote, iters, port.is_some()).await
        } else {
            use barewire_drivers as d;
            let dev = d::Device::open(&d::DriverConfig::parse("soft", None).unwrap()).unwrap();
            let pd = dev.alloc_pd().unwrap();
            // SAFETY: as above.
            let mr = unsafe { pd.register(ptr, REGION, all) }.unwrap();
            let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
            let opts = d::ConnectOptions {
                private_data: mr.descriptor().to_bytes().to_vec(),
                ..dev.connect_options()
            };
            let (qp, data) = match port {
                None => {
                    let l = d::Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &opts).unwrap();
                    println!("READY {}", l.port());
                    std::io::stdout().flush().unwrap();
                    l.accept(&pd, &scq, &rcq).await.unwrap()
                }
                Some(p) => d::connect(([127, 0, 0, 1], p).into(), &pd, &scq, &rcq, &opts)
                    .await
                    .unwrap(),
            };
            let remote = d::RegionDescriptor::from_bytes(&data).unwrap();
            pingpong(&qp, ptr, mr.lkey(), remote, iters, port.is_some()).await
        };
        drop(mem);
        h.map(|h| h.value_at_quantile(0.5) as f64 / 1000.0)
    })
}

fn one_run(mode: &str, cpus: [usize; 2], iters: u64) -> f64 {
    let (port, mut child) =
        barewire_bench::spawn_ready(&["--serve", mode, &cpus[1].to_string(), &iters.to_string()]);
    let mode2 = mode.to_string();
    let p50 = std::thread::spawn(move || side(&mode2, cpus[0], Some(port), iters).unwrap())
        .join()
        .unwrap();
    let _ = child.wait();
    p50
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "driver-overhead",
    about = "8 B WRITE latency over barewire-drivers against the soft provider called directly"
)]
struct Cli {
    /// Runs of each (alternating which goes first).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Ping-pong iterations per run.
    #[arg(short = 'n', default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// The CPUs of the client and the server processes.
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpu: [usize; 2],
    /// The server side this program starts itself: MODE CPU ITERS.
    #[arg(long, num_args = 3, value_names = ["MODE", "CPU", "ITERS"], hide = true)]
    serve: Option<Vec<String>>,
}

fn main() {
    let cli = Cli::parse();
    if let Some([mode, cpu, iters]) = cli.serve.as_deref() {
        let num = |v: &str| {
            v.parse()
                .unwrap_or_else(|_| panic!("--serve: {v:?} is not a number"))
        };
        side(mode, num(cpu) as usize, None, num(iters));
        return;
    }
    let (reps, iters, cpus) = (cli.reps as usize, cli.iters, cli.cpu);
    let (mut direct, mut drivers) = (Vec::new(), Vec::new());
    for r in 0..reps {
        // Alternate which goes first, so drift over the session hits both alike.
        let order = if r % 2 == 0 {
            ["direct", "drivers"]
        } else {
            ["drivers", "direct"]
        };
        for mode in order {
            let p50 = one_run(mode, cpus, iters);
            println!("rep {r} {mode:>7}: 8 B WRITE p50 {p50:.3} us");
            if mode == "direct" {
                direct.push(p50)
            } else {
                drivers.push(p50)
            }
        }
    }
    let (a, b) = (median(&mut direct), median(&mut drivers));
    println!(
        "median p50: direct {a:.3} us, drivers {b:.3} us; drivers / direct = {:.3}",
        b / a
    );
}
