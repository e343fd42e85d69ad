//! Running one test: the server side, the client side that measures, and `--loopback`, which
//! runs the server as a child process.
//!
//! The client describes the run (test, sizes, iterations, depth) and its region in the MPA
//! private data, so a server started with just the test name follows whatever the client asks.
//! Both sides lay out their registered buffer the same way:
//!
//! ```text
//! [ control: 4 KiB ][ receive area: max size ][ send area: max size ]
//!   0..8    send_bw credits (written by the server)
//!   8..16   the atomic target
//!   16..24  the server's credit counter (the source of its credit WRITEs)
//!   24..32  "server ready" flag (written by the server once its receives are posted)
//!   32..40  the local atomic result
//!   40..48  the value the server writes as the ready flag
//!   48..56  where `--floor-slices` reads 8 bytes of the peer's buffer, for its grant
//! ```

use std::cell::Cell;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{Command as Process, Stdio};
use std::time::{Duration, Instant};

use barewire_drivers::{
    connect, Access, CompletionQueue, ConnectOptions, Device, DriverConfig, Listener,
    ListenerLimits, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, RegionDescriptor, SendOp,
    SendWr, Sge, Sges, Transport, WcStatus, WorkCompletion,
};
use barewire_engine::{yield_now, Runtime};
use hdrhistogram::Histogram;

use super::cli::{AtomicOp, RunArgs, Test};
use super::table::{BwRow, LatRow, BW_HEADER, LAT_HEADER, RULE};

mod client;
mod server;

use client::client;
use server::server;

const CTRL: usize = 4096;
const CREDITS: usize = 0;
const ATOMIC: usize = 8;
const CREDIT_SRC: usize = 16;
const READY: usize = 24;
const ATOMIC_RESULT: usize = 32;
const READY_SRC: usize = 40;
const FLOOR_SCRATCH: usize = 48;
/// Receives the server keeps posted for `send_bw`; the client never has more unanswered sends.
const RX_DEPTH: u64 = 512;
/// The server returns credits every this many receives.
const CREDIT_EVERY: u64 = 16;
const MAGIC: &[u8; 4] = b"BWPF";

/// What one run measured.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Latency rows with their histograms (nanoseconds), one per size.
    pub lat: Vec<(LatRow, Histogram<u64>)>,
    /// Bandwidth rows, one per size.
    pub bw: Vec<BwRow>,
    /// `--floor-slices`: each size's WRITE and bare-store slices, paired (`lat` then holds
    /// the WRITE iterations alone).
    pub slices: Vec<super::slices::Summary>,
}

/// Uncounted warm-up iterations before each latency size (both sides of a ping-pong agree).
pub fn warmup(iters: u64) -> u64 {
    (iters / 10).clamp(10, 1000)
}

/// Runs what `args` asks: a server, a client, or both (`--loopback`). The client prints its
/// rows as they are measured (a table or JSON lines) and returns them.
pub fn run(args: &RunArgs) -> Result<Outcome, String> {
    if args.trace.is_some() && !barewire_engine::trace::ENABLED {
        return Err(TRACE_NEEDS_FEATURE.into());
    }
    if args.loopback {
        // Say why the driver cannot be used here, before starting a server that would fail.
        drop(open_device(&args.driver)?);
        return loopback(args);
    }
    match &args.server {
        None => server(args).map(|()| Outcome::default()),
        Some(host) => {
            let addr = (host.as_str(), args.port)
                .to_socket_addrs()
                .map_err(|e| format!("{host}: {e}"))?
                .next()
                .ok_or_else(|| format!("{host}: no address"))?;
            client(args, addr)
        }
    }
}

/// Opens the device `--driver` names (as `BAREWIRE_DRIVER` would; `BAREWIRE_DEVICE` picks
/// one by name), so an absent device is the drivers' clear error.
fn open_device(name: &str) -> Result<Device, String> {
    let cfg = DriverConfig::parse(name, std::env::var("BAREWIRE_DEVICE").ok())
        .map_err(|e| e.to_string())?;
    Device::open(&cfg).map_err(|e| format!("--driver {name}: {e}"))
}

fn runtime(cpu: Option<usize>, args: &RunArgs) -> Result<Runtime, String> {
    let mut b = Runtime::builder()
        .idle_spin(Duration::from_micros(args.idle_spin_us))
        .reactor(args.reactor);
    if let Some(ms) = args.sqpoll {
        b = b.sqpoll(Duration::from_millis(ms));
    }
    let b = match cpu {
        Some(c) => b.core_ids(&[c]),
        None => b.cores(1).pin(false),
    };
    b.build().map_err(|e| format!("runtime: {e}"))
}

/// The registered buffer: control area, receive area, send area; 8-byte aligned. Allocated by
/// the drivers (so on shm it is memory a peer process can map).
struct Buffer {
    mem: std::rc::Rc<barewire_drivers::Buffer>,
    max: usize,
    /// The region's address and key, read once (as perftest fills its SGE once), not through
    /// the backend's region object on every request.
    base: u64,
    lkey: barewire_drivers::Stag,
}

impl Buffer {
    fn new(pd: &ProtectionDomain, max: usize) -> Result<Buffer, String> {
        let len = CTRL + 2 * max;
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let mem = barewire_drivers::Buffer::new(pd, len, 4096, all)
            .map_err(|e| format!("register: {e}"))?;
        let (base, lkey) = (mem.region().addr() as u64, mem.region().lkey());
        Ok(Buffer {
            mem,
            max,
            base,
            lkey,
        })
    }
    fn mr(&self) -> &MemoryRegion {
        self.mem.region()
    }
    fn at(&self, off: usize) -> u64 {
        self.base + off as u64
    }
    fn recv_area(&self) -> u64 {
        self.at(CTRL)
    }
    fn send_area(&self) -> u64 {
        self.at(CTRL + self.max)
    }
    fn sge(&self, addr: u64, len: usize) -> Sges {
        Sges::from(Sge {
            addr,
            len: len as u32,
            lkey: self.lkey,
        })
    }
    fn read_u64(&self, off: usize) -> u64 {
        // SAFETY: an aligned slot of the control area, written by the provider on the peer's
        // behalf; read volatile because that happens outside this task.
        unsafe { std::ptr::read_volatile(self.at(off) as *const u64) }
    }
    fn write_u64(&self, off: usize, v: u64) {
        // SAFETY: an aligned slot of our own control area.
        unsafe { std::ptr::write_volatile(self.at(off) as *mut u64, v) }
    }
    fn byte(&self, addr: u64) -> u8 {
        // SAFETY: addr lies in the registered buffer; the peer's WRITE lands there.
        unsafe { std::ptr::read_volatile(addr as *const u8) }
    }
    fn set_byte(&self, addr: u64, v: u8) {
        // SAFETY: addr lies in our send area.
        unsafe { std::ptr::write_volatile(addr as *mut u8, v) }
    }
    /// The first `len` bytes of the send area, which only this side writes.
    fn send_bytes(&self, len: usize) -> &[u8] {
        assert!(
            len <= self.max,
            "{len} bytes in a send area of {}",
            self.max
        );
        // SAFETY: the send area holds `max` bytes of the registered buffer, which lives as
        // long as `self`; only this task writes it (`set_byte`), never while the slice lives.
        unsafe { std::slice::from_raw_parts(self.send_area() as *const u8, len) }
    }
}

/// `--floor-slices`: the peer's buffer mapped into this process, for the bare stores (`None`
/// when slices are off). A key is granted to a queue pair on its first use, so this first
/// reads 8 bytes of the peer's buffer (into [`FLOOR_SCRATCH`]) and waits for the grant.
async fn floor_map(
    qp: &QueuePair,
    buf: &Buffer,
    remote: &RegionDescriptor,
    slices: u16,
) -> Result<Option<barewire_drivers::MappedRemote>, String> {
    if slices == 0 {
        return Ok(None);
    }
    if qp.transport() != Transport::Shm {
        return Err(format!(
            "--floor-slices needs a backend that maps the peer's memory (--driver shm); \
             this queue pair runs over {:?}",
            qp.transport()
        ));
    }
    let read = SendOp::Read {
        remote_addr: remote.addr,
        rkey: remote.rkey,
    };
    post_send(qp, wr(0, read, buf.sge(buf.at(FLOOR_SCRATCH), 8), false))?;
    let t0 = Instant::now();
    loop {
        if let Some(m) = qp.map_remote(remote) {
            return Ok(Some(m));
        }
        if t0.elapsed() > Duration::from_secs(5) {
            return Err(
                "--floor-slices: the peer granted no writable mapping of its buffer \
                        within 5 s"
                    .into(),
            );
        }
        yield_now().await;
    }
}

/// The run as the client describes it to the server.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    test: Test,
    atomic: AtomicOp,
    sizes: Vec<usize>,
    iters: u64,
    tx_depth: u32,
    duration_ms: u32,
    /// Queue pairs (connections) the client opens (`--qps`).
    qps: u16,
    /// `--floor-slices` (0: off): both sides alternate WRITE and bare-store slices.
    floor_slices: u16,
}

impl Plan {
    fn of(a: &RunArgs) -> Plan {
        Plan {
            test: a.test,
            atomic: a.atomic,
            sizes: a.sizes.clone(),
            iters: a.iters,
            tx_depth: a.tx_depth,
            duration_ms: a.duration.map_or(0, |d| (d * 1000.0) as u32),
            qps: a.qps,
            floor_slices: a.floor_slices,
        }
    }

    fn encode(&self, desc: &RegionDescriptor) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.push(self.test.code());
        b.push((self.atomic == AtomicOp::CmpSwap) as u8);
        // `-a` travels as a count of zero, so the plan fits rdma_cm's 56 bytes of private data
        // on InfiniBand and RoCE.
        if self.sizes == super::cli::all_sizes() {
            b.push(0);
        } else {
            b.push(self.sizes.len() as u8);
            for s in &self.sizes {
                b.extend_from_slice(&(*s as u32).to_be_bytes());
            }
        }
        b.extend_from_slice(&self.iters.to_be_bytes());
        b.extend_from_slice(&self.tx_depth.to_be_bytes());
        b.extend_from_slice(&self.duration_ms.to_be_bytes());
        b.extend_from_slice(&self.qps.to_be_bytes());
        b.extend_from_slice(&self.floor_slices.to_be_bytes());
        b.extend_from_slice(&desc.to_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<(Plan, RegionDescriptor), String> {
        let bad = || "the client's private data is not a barewire-perf plan".to_string();
        let rest = b.strip_prefix(MAGIC).ok_or_else(bad)?;
        let (&[test, atomic, n], rest) = rest.split_first_chunk::<3>().ok_or_else(bad)?;
        let n = n as usize;
        if rest.len() != n * 4 + 20 + RegionDescriptor::LEN {
            return Err(bad());
        }
        let u32_at = |o: usize| u32::from_be_bytes(rest[o..o + 4].try_into().unwrap());
        let sizes: Vec<usize> = if n == 0 {
            super::cli::all_sizes()
        } else {
            (0..n).map(|i| u32_at(i * 4) as usize).collect()
        };
        if sizes.iter().any(|&s| s == 0 || s > super::cli::MAX_SIZE) {
            return Err(bad());
        }
        let o = n * 4;
        let plan = Plan {
            test: Test::from_code(test).ok_or_else(bad)?,
            atomic: if atomic == 1 {
                AtomicOp::CmpSwap
            } else {
                AtomicOp::FetchAdd
            },
            sizes,
            iters: u64::from_be_bytes(rest[o..o + 8].try_into().unwrap()),
            tx_depth: u32_at(o + 8),
            duration_ms: u32_at(o + 12),
            qps: u16::from_be_bytes([rest[o + 16], rest[o + 17]]),
            floor_slices: u16::from_be_bytes([rest[o + 18], rest[o + 19]]),
        };
        if plan.qps == 0 {
            return Err(bad());
        }
        let desc = RegionDescriptor::from_bytes(&rest[o + 20..]).ok_or_else(bad)?;
        Ok((plan, desc))
    }
}

fn options(dev: &Device, crc: bool, private_data: Vec<u8>) -> ConnectOptions {
    ConnectOptions {
        crc,
        private_data,
        ..dev.connect_options()
    }
}

fn cqs(dev: &Device) -> Result<(CompletionQueue, CompletionQueue), String> {
    let cq = |n| dev.create_cq(n).map_err(|e| format!("create_cq: {e}"));
    Ok((cq(1 << 16)?, cq(4096)?))
}

fn wr(wr_id: u64, op: SendOp, sges: Sges, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges,
        signaled,
        fence: false,
    }
}

/// Checks that a completion succeeded (`what` names the operation in the error).
#[inline]
fn ok(wc: WorkCompletion, what: &str) -> Result<(), String> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(format!("{what}: work completion {:?}", wc.status))
    }
}

fn post_send(qp: &QueuePair, w: SendWr) -> Result<(), String> {
    qp.post_send(w).map_err(|e| format!("post_send: {e:?}"))
}

fn post_recv(qp: &QueuePair, wr_id: u64, sges: Sges) -> Result<(), String> {
    qp.post_recv(RecvWr { wr_id, sges })
        .map_err(|e| format!("post_recv: {e:?}"))
}

/// A cycle counter, as perftest's `get_cycles` and UCX's perftest use: the TSC on x86-64 (where
/// a read costs a few nanoseconds; `clock_gettime` costs about 20 here, a large part of a
/// shared-memory operation), the monotonic clock in nanoseconds elsewhere. Converted to time by
/// a calibration against the monotonic clock.
pub struct Cycles {
    ns_per_tick: f64,
}

impl Cycles {
    /// The counter now.
    pub fn now() -> u64 {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: RDTSC has no preconditions and every x86-64 CPU has it.
        unsafe {
            core::arch::x86_64::_rdtsc()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
            START.get_or_init(Instant::now).elapsed().as_nanos() as u64
        }
    }

    /// Measures the counter's rate against the monotonic clock over 20 ms.
    pub fn calibrate() -> Cycles {
        let (i0, c0) = (Instant::now(), Cycles::now());
        while i0.elapsed() < Duration::from_millis(20) {
            std::hint::spin_loop();
        }
        let (i1, c1) = (Instant::now(), Cycles::now());
        let ticks = c1.wrapping_sub(c0).max(1);
        Cycles {
            ns_per_tick: (i1 - i0).as_nanos() as f64 / ticks as f64,
        }
    }

    /// A counter of `ns_per_tick` nanoseconds a tick, for tests that need known figures.
    #[cfg(test)]
    pub(crate) fn at_rate(ns_per_tick: f64) -> Cycles {
        Cycles { ns_per_tick }
    }

    /// `ticks` of the counter in nanoseconds.
    pub fn ns(&self, ticks: u64) -> u64 {
        (ticks as f64 * self.ns_per_tick) as u64
    }
}

/// The latency loops' trace kind: `wait_byte` saw the byte it waited for (the argument).
pub const SAW_BYTE: barewire_engine::trace::Kind = barewire_engine::trace::Kind::user(1);

/// Waits until the byte at `addr` is `v`: looks at it in a spin of `looks` looks, as perftest
/// polls its buffer, and yields to the engine between spins (see [`spin_looks`]).
async fn wait_byte(buf: &Buffer, addr: u64, v: u8, looks: u32) {
    loop {
        for _ in 0..looks {
            if buf.byte(addr) == v {
                barewire_engine::trace::event(SAW_BYTE, u64::from(v));
                return;
            }
        }
        yield_now().await;
    }
}

/// Looks at the polled byte per engine pass in `wait_byte`, for a queue pair over `t`. The
/// software provider places the bytes from the core's own loop, so a waiter yields to it after
/// a short spin. Over shm and verbs the bytes land by themselves: a waiter spins longer
/// between passes (still about a microsecond at most, so the engine's other work goes on), as
/// perftest polls its buffer with no engine at all. With 32 looks there, an engine pass that
/// the byte lands during delays its sight by up to a pass: the shm 8 B write_lat p50 was
/// 0.12-0.13 µs against 0.085-0.10 with 256 or more looks (bench/RESULTS.md, thirty-seventh
/// session).
fn spin_looks(t: Transport) -> u32 {
    if t == Transport::Soft {
        32
    } else {
        1024
    }
}

/// `--trace`: writes the timeline of the thread that ran this side's core to
/// `<prefix>.<role>`.
fn write_trace(args: &RunArgs, role: &str) -> Result<(), String> {
    match &args.trace {
        Some(prefix) => write_timeline(prefix, role),
        None => Ok(()),
    }
}

/// Writes this thread's timeline ([`barewire_engine::trace::write`]) to `<prefix>.<role>`
/// (`client` or `server`, the names `bench/tools/hop-trace.py` reads).
pub fn write_timeline(prefix: &std::path::Path, role: &str) -> Result<(), String> {
    let mut path = prefix.as_os_str().to_owned();
    path.push(format!(".{role}"));
    barewire_engine::trace::write(std::path::Path::new(&path))
        .map(drop)
        .map_err(|e| format!("--trace: {}: {e}", path.to_string_lossy()))
}

/// The error for `--trace` in a build without the timeline.
pub const TRACE_NEEDS_FEATURE: &str = "--trace needs a build with the trace feature \
     (cargo build --release -p barewire-bench --features trace)";

/// Starts the server as a child process (pinned to the second `--cpu`), then runs the client.
fn loopback(args: &RunArgs) -> Result<Outcome, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Process::new(exe);
    cmd.arg(args.test.name())
        .args(["--announce", "-p", "0", "--driver", &args.driver])
        .args(["--reactor", super::cli::reactor_name(args.reactor)])
        .args(["--idle-spin-us", &args.idle_spin_us.to_string()]);
    if let Some(ms) = args.sqpoll {
        cmd.args(["--sqpoll", &ms.to_string()]);
    }
    if args.crc {
        cmd.arg("--crc");
    }
    if let Some(prefix) = &args.trace {
        cmd.arg("--trace").arg(prefix);
    }
    if let Some(cpus) = &args.cpus {
        cmd.args(["--cpu", &cpus.last().unwrap().to_string()]);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting the server process: {e}"))?;
    let mut line = String::new();
    let port = BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .ok()
        .and_then(|_| line.trim().strip_prefix("READY ")?.parse::<u16>().ok());
    let Some(port) = port else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("the server process did not start (said {line:?})"));
    };
    let mut client_args = args.clone();
    client_args.loopback = false;
    client_args.cpus = args.cpus.as_ref().map(|c| vec![c[0]]);
    // The client's runtime pins the thread it runs on; keep that off the caller's thread, so
    // later children (and the caller) keep the affinity they started with.
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let out = std::thread::scope(|s| {
        s.spawn(|| client(&client_args, addr))
            .join()
            .unwrap_or_else(|_| Err("the client panicked".into()))
    });
    // The server exits once the client hangs up; do not wait on it forever.
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() || out.is_err() => break,
            Ok(Some(status)) => return Err(format!("the server process failed: {status}")),
            Ok(None) if t0.elapsed() > Duration::from_secs(10) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the server process did not exit within 10 s".into());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e.to_string()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_round_trips_through_private_data() {
        let plan = Plan {
            test: Test::SendBw,
            atomic: AtomicOp::CmpSwap,
            sizes: super::super::cli::all_sizes(),
            iters: 12345,
            tx_depth: 64,
            duration_ms: 2500,
            qps: 64,
            floor_slices: 1000,
        };
        let desc = RegionDescriptor {
            rkey: barewire_drivers::Stag(0xdead_beef),
            addr: 0x1000,
            len: 4096,
        };
        let b = plan.encode(&desc);
        assert!(
            b.len() <= 56,
            "fits rdma_cm's private data on IB/RoCE: {}",
            b.len()
        );
        assert_eq!(Plan::decode(&b).unwrap(), (plan.clone(), desc));
        assert!(Plan::decode(&b[..b.len() - 1]).is_err());
        assert!(Plan::decode(b"BWPX").is_err());
        let none = Plan { qps: 0, ..plan };
        assert!(
            Plan::decode(&none.encode(&desc)).is_err(),
            "a plan for no queue pairs"
        );
    }
}
