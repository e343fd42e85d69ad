//! `Channel<T>` against its peers, in one session on two pinned CPUs:
//!
//! - 64 B ping-pong p50 (half the round trip) over `Channel<[u8; 64]>`, beside a raw 64 B RDMA
//!   WRITE ping-pong of the same provider (`barewire-perf write_lat -s 64`);
//! - 64 B one-way throughput over `Channel<[u8; 64]>`, taken three ways (`recv`, which returns
//!   each message; `recv_into` one buffer, as tokio's receiver reads each message into its
//!   buffer; `recv_many` in batches), beside tokio TCP with length-prefixed
//!   framing, three ways: buffered (a u32 length before each message into a 64 KiB
//!   `BufWriter`, flushed once at the end: the fair peer, and the headline), fed
//!   (`FramedWrite` + `LengthDelimitedCodec`, `feed` per message and one `flush`) and
//!   flushing (the same codec, `send` per message, which flushes each: what much code writes,
//!   but no batching at all); and UCX active messages (`ucx_perftest -t ucp_am_bw`: over TCP
//!   beside `--driver soft`, over shared memory, `UCX_TLS=posix,sysv,cma,self`, beside
//!   `--driver shm`);
//! - with `--driver shm --versus-soft`, the same channel's throughput over shm beside soft,
//!   each rep running soft right after shm, the ratio taken per rep.
//!
//! tokio's buffered program runs right after the channel in each rep, and the channel's ratio
//! to it is taken per rep too: the figure to quote is the median of those ratios, since this
//! host changes pace within a run and a ratio of medians can pair a fast channel run with a
//! slow tokio one. (Until the forty-fourth session only the ratio of the medians was printed.)
//!
//! barewire's connections run with MPA CRC32c off unless `--crc` is given, the channel's and the
//! raw WRITE's alike, as `barewire-perf` and its report do. (Until the forty-third session the
//! channel ran with the library's default, CRC on, beside a raw WRITE without it.)
//!
//! Every receiving loop hands each message it takes to `std::hint::black_box`, barewire's and
//! tokio's alike, so the compiler cannot drop a copy out of the ring or out of tokio's buffer
//! whose result nothing reads. (Until the forty-second session the `recv` loop discarded its
//! messages, and the copy out of the ring was compiled away: bench/RESULTS.md.)
//!
//! Usage (`--help` says more):
//!
//! ```text
//! channel-bench [--reps N] [-n MESSAGES] [--cpu A,B] [--capacity SLOTS] [--channel-only]
//!               [--driver soft|shm] [--versus-soft] [--consume keep|sum] [--crc]
//! ```

use std::io::Write;

use clap::Parser;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use barewire::{ChannelOptions, Node};
use barewire_bench::perf::peers::parse_ucx;
use barewire_bench::reps::median;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "channel-bench",
    about = "Channel<[u8; 64]> against a raw WRITE, tokio TCP and UCX active messages"
)]
struct Cli {
    /// Reps; each runs every contender once, back to back.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Messages per throughput run.
    #[arg(short = 'n', default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    n: u64,
    /// The CPUs of the client and the server processes.
    #[arg(long, value_name = "A,B", value_parser = barewire_bench::cpu_pair_arg, default_value = "0,1")]
    cpu: [usize; 2],
    /// Only barewire's own figures (the channel and the raw WRITE), for quick comparisons.
    #[arg(long)]
    channel_only: bool,
    /// barewire's driver for the channel and the raw WRITE: soft (the default), or shm for
    /// two processes on one host through shared memory.
    #[arg(long, default_value = "soft")]
    driver: String,
    /// With `--driver shm`: each rep also runs the channel over soft, right after the shm
    /// run, and prints shm ÷ soft for the rep and as the median of the reps' ratios.
    #[arg(long)]
    versus_soft: bool,
    /// Slots in each direction's ring (each 72 bytes for a 64-byte message): how many
    /// messages may be in flight before the sender waits for credits.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(4..))]
    capacity: u32,
    /// What barewire's `recv` and `recv_into` loops do with each message: `keep` hands it
    /// whole to `std::hint::black_box` (the default, as the other receivers do); `sum` adds up
    /// its eight 8-byte words, a receiver that reads every byte and keeps only a total.
    #[arg(long, default_value = "keep", value_parser = ["keep", "sum"])]
    consume: String,
    /// MPA CRC32c on barewire's connections, the channel's and the raw WRITE's alike. Off by
    /// default, as in `barewire-perf` and its report (the benchmark targets' setting; tokio's
    /// programs check nothing beyond TCP either); the library's own default is on.
    #[arg(long)]
    crc: bool,
    /// Only tokio's buffered program, `--reps` times (to profile it alone).
    #[arg(long, hide = true)]
    tokio_only: bool,
    #[arg(long, num_args = 2, value_names = ["CPU", "N"], hide = true)]
    serve_barewire: Option<Vec<usize>>,
    /// The driver of the `--serve-barewire` half.
    #[arg(long, hide = true, default_value = "soft")]
    serve_driver: String,
    #[arg(long, num_args = 2, value_names = ["CPU", "N"], hide = true)]
    serve_tokio: Option<Vec<usize>>,
    #[arg(long, num_args = 2, value_names = ["CPU", "N"], hide = true)]
    serve_tokio_framed: Option<Vec<usize>>,
}

/// Ping-pong round trips per rep (`CHANNEL_BENCH_PINGS` overrides, e.g. to profile them).
fn pings() -> usize {
    std::env::var("CHANNEL_BENCH_PINGS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn node(driver: &str) -> Node {
    let cfg = barewire::drivers::DriverConfig::parse(driver, None)
        .unwrap()
        .crc(crc());
    Node::with_config(&cfg).unwrap()
}

/// `--crc` (passed to the server half through the environment).
fn crc() -> bool {
    std::env::var("CHANNEL_BENCH_CRC").as_deref() == Ok("on")
}

/// `--consume sum` (passed to the server half through the environment).
fn consume_sum() -> bool {
    std::env::var("CHANNEL_BENCH_CONSUME").as_deref() == Ok("sum")
}

/// Slots sized for the message (64 B + the 4-byte length), in a ring of `--capacity` (passed
/// to the server half through the environment).
fn opts() -> ChannelOptions {
    let capacity = std::env::var("CHANNEL_BENCH_CAPACITY")
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("main sets CHANNEL_BENCH_CAPACITY from --capacity before either half starts");
    ChannelOptions::new(capacity, 64)
}

fn runtime(cpu: usize) -> barewire::engine::Runtime {
    barewire::engine::Runtime::builder()
        .core_ids(&[cpu])
        .idle_spin(Duration::from_millis(1))
        .build()
        .expect("runtime")
}

/// Messages a `recv_many` call may take at once in the batched run.
const BATCH: usize = 1024;

/// The far side of a barewire run: echo `pings()` messages, then count `n` taken one `recv` at
/// a time and acknowledge, then `n` more taken one `recv_into` at a time into one buffer (as
/// tokio's receiver reads each into its buffer) and acknowledge, then `n` more taken with
/// `recv_many` and acknowledge.
fn serve_barewire(cpu: usize, n: usize, driver: &str) {
    runtime(cpu).block_on(async move {
        let node = node(driver);
        let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        println!("READY {port}");
        std::io::stdout().flush().unwrap();
        let ep = node.accept().await.unwrap();
        let (tx, rx) = ep.open_channel::<[u8; 64]>(opts()).await.unwrap();
        for _ in 0..pings() {
            let m = rx.recv().await.unwrap();
            tx.send(&m).await.unwrap();
        }
        if consume_sum() {
            let mut total = 0u64;
            for _ in 0..n {
                let m = rx.recv().await.unwrap();
                for w in m.chunks_exact(8) {
                    total = total.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()));
                }
            }
            std::hint::black_box(total);
        } else {
            for _ in 0..n {
                std::hint::black_box(rx.recv().await.unwrap());
            }
        }
        tx.send(&[1; 64]).await.unwrap();
        let mut buf = [0u8; 64];
        if consume_sum() {
            let mut total = 0u64;
            for _ in 0..n {
                rx.recv_into(&mut buf).await.unwrap();
                for w in buf.chunks_exact(8) {
                    total = total.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()));
                }
            }
            std::hint::black_box(total);
        } else {
            for _ in 0..n {
                rx.recv_into(&mut buf).await.unwrap();
                std::hint::black_box(&buf);
            }
        }
        tx.send(&[1; 64]).await.unwrap();
        let (mut got, mut batch) = (0, Vec::with_capacity(BATCH));
        while got < n {
            batch.clear();
            got += rx.recv_many(&mut batch, BATCH).await.unwrap();
            std::hint::black_box(&batch);
        }
        tx.send(&[1; 64]).await.unwrap();
        // The client hangs up once it has this; a flush that loses that race is fine.
        let _ = tx.flush().await;
    });
}

/// What one barewire run measured.
struct Run {
    /// Ping-pong p50, µs (half the round trip).
    p50: f64,
    /// Messages per second taken one `recv` at a time, one `recv_into` at a time, and by
    /// `recv_many`.
    recv: f64,
    into: f64,
    many: f64,
}

fn run_barewire(cpus: [usize; 2], n: usize, driver: &str) -> Run {
    let (port, mut child) = barewire_bench::spawn_ready(&[
        "--serve-barewire",
        &cpus[1].to_string(),
        &n.to_string(),
        "--serve-driver",
        driver,
    ]);
    let driver = driver.to_string();
    let r = std::thread::spawn(move || {
        runtime(cpus[0]).block_on(async move {
            let node = node(&driver);
            let ep = node
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
                .unwrap();
            let (tx, rx) = ep.open_channel::<[u8; 64]>(opts()).await.unwrap();
            let pings = pings();
            let s0 = barewire::engine::stats();
            let t0 = Instant::now();
            let mut lat = Vec::with_capacity(pings);
            for i in 0..pings {
                let t = Instant::now();
                tx.send(&[i as u8; 64]).await.unwrap();
                rx.recv().await.unwrap();
                lat.push(t.elapsed().as_nanos() as f64 / 2.0 / 1000.0);
            }
            let warm = pings / 10;
            let s1 = barewire::engine::stats();
            // Where the client's core spent the round trips (to stderr, beside the figures).
            let per = |a: u64, b: u64| (b - a) as f64 / pings as f64;
            eprintln!(
                "client core per round trip: {:.2} passes, {:.2} looks at memory, {:.0} ns",
                per(s0.poller_passes, s1.poller_passes),
                per(s0.memory_looks, s1.memory_looks),
                t0.elapsed().as_nanos() as f64 / pings as f64
            );
            let p50 = median(&mut lat[warm..]);
            // The same sender each time; the server takes the first n with `recv`, the
            // second with `recv_into`, the third with `recv_many`.
            let mut rates = [0.0; 3];
            for rate in &mut rates {
                let t = Instant::now();
                for i in 0..n {
                    tx.send(&[i as u8; 64]).await.unwrap();
                }
                rx.recv().await.unwrap(); // everything arrived
                *rate = n as f64 / t.elapsed().as_secs_f64();
            }
            Run {
                p50,
                recv: rates[0],
                into: rates[1],
                many: rates[2],
            }
        })
    })
    .join()
    .unwrap();
    let _ = child.wait();
    r
}

/// The tokio servers' start: listen on loopback, announce the port to the parent
/// (`READY <port>`), take one connection with Nagle off.
async fn tokio_accept_ready() -> (OwnedReadHalf, OwnedWriteHalf) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("READY {}", l.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (s, _) = l.accept().await.unwrap();
    s.set_nodelay(true).unwrap();
    s.into_split()
}

/// The tokio clients' start: connect to the server's port with Nagle off.
async fn tokio_connect(port: u16) -> (OwnedReadHalf, OwnedWriteHalf) {
    let s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.set_nodelay(true).unwrap();
    s.into_split()
}

/// The far side of the idiomatic tokio run: `FramedRead` with `LengthDelimitedCodec`.
fn serve_tokio_framed(cpu: usize, n: usize) {
    let rt = barewire_bench::tokio_on(cpu);
    rt.block_on(async move {
        use futures_util::StreamExt;
        use tokio::io::AsyncWriteExt;
        let (r, mut w) = tokio_accept_ready().await;
        let mut frames =
            tokio_util::codec::FramedRead::new(r, tokio_util::codec::LengthDelimitedCodec::new());
        for _ in 0..n {
            let f = frames.next().await.unwrap().unwrap();
            assert_eq!(f.len(), 64);
            std::hint::black_box(&f);
        }
        w.write_all(&[1]).await.unwrap();
    });
}

/// Idiomatic tokio: `FramedWrite` + `LengthDelimitedCodec`, one `send` per message (which
/// flushes each message, as `SinkExt::send` does), or (`fed`) one `feed` per message, which
/// leaves the framed bytes in the writer's buffer until it passes its backpressure boundary
/// (128 KiB), and one `flush` at the end: tokio-util's own batching.
fn run_tokio_framed(cpus: [usize; 2], n: usize, fed: bool) -> f64 {
    let (port, mut child) = barewire_bench::spawn_ready(&[
        "--serve-tokio-framed",
        &cpus[1].to_string(),
        &n.to_string(),
    ]);
    let rate = std::thread::spawn(move || {
        let rt = barewire_bench::tokio_on(cpus[0]);
        rt.block_on(async move {
            use futures_util::SinkExt;
            use tokio::io::AsyncReadExt;
            let (mut r, w) = tokio_connect(port).await;
            let mut frames = tokio_util::codec::FramedWrite::new(
                w,
                tokio_util::codec::LengthDelimitedCodec::new(),
            );
            let t = Instant::now();
            for i in 0..n {
                let m = bytes::Bytes::copy_from_slice(&[i as u8; 64]);
                if fed {
                    frames.feed(m).await.unwrap();
                } else {
                    frames.send(m).await.unwrap();
                }
            }
            SinkExt::<bytes::Bytes>::flush(&mut frames).await.unwrap();
            let mut ack = [0u8; 1];
            r.read_exact(&mut ack).await.unwrap();
            n as f64 / t.elapsed().as_secs_f64()
        })
    })
    .join()
    .unwrap();
    let _ = child.wait();
    rate
}

fn serve_tokio(cpu: usize, n: usize) {
    let rt = barewire_bench::tokio_on(cpu);
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
        let (r, mut w) = tokio_accept_ready().await;
        let mut r = BufReader::with_capacity(64 * 1024, r);
        let mut buf = [0u8; 64];
        for _ in 0..n {
            let len = r.read_u32().await.unwrap() as usize;
            r.read_exact(&mut buf[..len]).await.unwrap();
            std::hint::black_box(&buf);
        }
        w.write_all(&[1]).await.unwrap();
    });
}

fn run_tokio(cpus: [usize; 2], n: usize) -> f64 {
    let (port, mut child) =
        barewire_bench::spawn_ready(&["--serve-tokio", &cpus[1].to_string(), &n.to_string()]);
    let rate = std::thread::spawn(move || {
        let rt = barewire_bench::tokio_on(cpus[0]);
        rt.block_on(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
            let (mut r, w) = tokio_connect(port).await;
            let mut w = BufWriter::with_capacity(64 * 1024, w);
            let t = Instant::now();
            for i in 0..n {
                w.write_u32(64).await.unwrap();
                w.write_all(&[i as u8; 64]).await.unwrap();
            }
            w.flush().await.unwrap();
            let mut ack = [0u8; 1];
            r.read_exact(&mut ack).await.unwrap();
            n as f64 / t.elapsed().as_secs_f64()
        })
    })
    .join()
    .unwrap();
    let _ = child.wait();
    rate
}

/// barewire-perf's 64 B WRITE ping-pong p50, from its JSON line; `None` (said once, with
/// why) when it cannot run.
fn raw_write(cpus: [usize; 2], driver: &str) -> Option<f64> {
    let r = raw_write_p50(cpus, driver);
    if let Err(why) = &r {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| println!("raw WRITE not measured: {why}"));
    }
    r.ok()
}

fn raw_write_p50(cpus: [usize; 2], driver: &str) -> Result<f64, String> {
    let exe = std::env::current_exe()
        .map_err(|e| e.to_string())?
        .with_file_name("barewire-perf");
    if !exe.exists() {
        return Err(format!(
            "{} is missing (cargo build --release -p barewire-bench builds it beside this one)",
            exe.display()
        ));
    }
    let out = Command::new(&exe)
        .args([
            "write_lat",
            "--loopback",
            "-s",
            "64",
            "-n",
            &pings().to_string(),
            "--json",
            "--driver",
            driver,
        ])
        .args(["--cpu", &format!("{},{}", cpus[0], cpus[1])])
        .args(crc().then_some("--crc"))
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    let s = String::from_utf8_lossy(&out.stdout);
    s.split("\"t_typical_us\":")
        .nth(1)
        .and_then(|v| v.split(',').next()?.parse().ok())
        .ok_or_else(|| {
            format!(
                "barewire-perf gave no figure (exit {}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}

fn ucx_am_bw(cpus: [usize; 2], driver: &str) -> Option<f64> {
    if let Err(how) = barewire_bench::apt::tool("ucx_perftest", "ucx-utils") {
        println!("MISSING peer: ucx_perftest ({how})");
        return None;
    }
    // The same medium as barewire's run: loopback TCP beside soft, shared memory beside shm.
    let tls = if driver == "shm" {
        "posix,sysv,cma,self"
    } else {
        "tcp"
    };
    let env = [("UCX_TLS", tls), ("UCX_NET_DEVICES", "lo")];
    let mut srv = Command::new("taskset")
        .args(["-c", &cpus[1].to_string(), "ucx_perftest"])
        .envs(env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new("taskset")
        .args([
            "-c",
            &cpus[0].to_string(),
            "timeout",
            "60",
            "ucx_perftest",
            "127.0.0.1",
        ])
        .args(["-t", "ucp_am_bw", "-s", "64", "-n", "1000000"])
        .envs(env)
        .output()
        .ok()?;
    let _ = srv.kill();
    let _ = srv.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    // The message rate (msg/s, overall) is the last number of the Final line.
    let line = text.lines().find(|l| l.contains("Final:"))?;
    let _ = parse_ucx(&text)?;
    line.split_whitespace().last()?.parse().ok()
}

fn main() {
    let cli = Cli::parse();
    // The server halves this program starts itself, pinned to the second CPU.
    if let Some([cpu, n]) = cli.serve_barewire.as_deref() {
        return serve_barewire(*cpu, *n, &cli.serve_driver);
    }
    if let Some([cpu, n]) = cli.serve_tokio.as_deref() {
        return serve_tokio(*cpu, *n);
    }
    if let Some([cpu, n]) = cli.serve_tokio_framed.as_deref() {
        return serve_tokio_framed(*cpu, *n);
    }
    if cli.versus_soft && cli.driver != "shm" {
        eprintln!("--versus-soft sets shm beside soft: it needs --driver shm");
        std::process::exit(2);
    }
    // Before any thread or child starts: the server halves read it (they are started with
    // their own arguments only).
    std::env::set_var("CHANNEL_BENCH_CAPACITY", cli.capacity.to_string());
    std::env::set_var("CHANNEL_BENCH_CONSUME", &cli.consume);
    std::env::set_var("CHANNEL_BENCH_CRC", if cli.crc { "on" } else { "off" });
    if cli.tokio_only {
        for rep in 0..cli.reps {
            let rate = run_tokio(cli.cpu, cli.n as usize);
            println!("rep {rep}: tokio buffered {:.3} M msg/s", rate / 1e6);
        }
        return;
    }
    let (channel_only, reps, n, cpus) = (cli.channel_only, cli.reps, cli.n as usize, cli.cpu);
    let (mut chan_lat, mut raw_lat, mut chan_rate, mut tokio_rate, mut ucx_rate) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut framed_rate, mut fed_rate, mut many_rate, mut into_rate) =
        (vec![], vec![], vec![], vec![]);
    let (mut vs_recv, mut vs_into, mut vs_many) = (vec![], vec![], vec![]);
    let (mut vs_tok_recv, mut vs_tok_into, mut vs_tok_many) = (vec![], vec![], vec![]);
    let driver = cli.driver.as_str();
    // Said once, before the figures: the CRC setting moves the soft figures by about a tenth.
    let crc = if cli.crc { "on" } else { "off" };
    match (driver, cli.versus_soft) {
        ("shm", false) => {
            println!("barewire over shm: no MPA framing, so no CRC (--crc is for soft)")
        }
        ("shm", true) => {
            println!("barewire over shm, and over soft with MPA CRC32c {crc} (--crc turns it on)")
        }
        _ => println!("barewire over {driver}: MPA CRC32c {crc} (--crc turns it on)"),
    }
    for rep in 0..reps {
        let Run {
            p50: lat,
            recv: rate,
            into,
            many,
        } = run_barewire(cpus, n, driver);
        if cli.versus_soft {
            // Right after, so that both halves of the ratio see the host at the same pace.
            let soft = run_barewire(cpus, n, "soft");
            println!(
                "rep {rep}: shm {:.3} / soft {:.3} M msg/s = {:.2}x with recv, shm {:.3} / soft {:.3} = {:.2}x with recv_into, shm {:.3} / soft {:.3} = {:.2}x with recv_many",
                rate / 1e6,
                soft.recv / 1e6,
                rate / soft.recv,
                into / 1e6,
                soft.into / 1e6,
                into / soft.into,
                many / 1e6,
                soft.many / 1e6,
                many / soft.many
            );
            vs_recv.push(rate / soft.recv);
            vs_into.push(into / soft.into);
            vs_many.push(many / soft.many);
        }
        many_rate.push(many);
        into_rate.push(into);
        // tokio's buffered program right after the channel, as shm's soft run above, so that
        // the rep's ratio pairs two runs at the same pace of this host.
        let tok = (!channel_only).then(|| run_tokio(cpus, n));
        let raw = raw_write(cpus, driver);
        if channel_only {
            println!(
                "rep {rep}: channel p50 {lat:.3} us, raw WRITE p50 {}, channel {:.3} M msg/s, with recv_into {:.3} M msg/s, with recv_many {:.3} M msg/s",
                raw.map_or("-".into(), |v| format!("{v:.2} us")),
                rate / 1e6,
                into / 1e6,
                many / 1e6
            );
            chan_lat.push(lat);
            chan_rate.push(rate);
            raw_lat.extend(raw);
            continue;
        }
        let tok = tok.expect("measured unless --channel-only");
        vs_tok_recv.push(rate / tok);
        vs_tok_into.push(into / tok);
        vs_tok_many.push(many / tok);
        // A flush per message is slow: fewer of them keep the rep short (the rate is steady).
        let framed = run_tokio_framed(cpus, n.min(200_000), false);
        let fed = run_tokio_framed(cpus, n, true);
        let ucx = ucx_am_bw(cpus, driver);
        println!(
            "rep {rep}: channel p50 {lat:.3} us, raw WRITE p50 {}, channel {:.3} M msg/s, with recv_into {:.3} M msg/s, with recv_many {:.3} M msg/s, tokio framed {:.3} M msg/s, tokio framed fed {:.3} M msg/s, tokio buffered {:.3} M msg/s (channel / tokio buffered {:.2}x with recv, {:.2}x with recv_into, {:.2}x with recv_many), ucx am_bw {}",
            raw.map_or("-".into(), |v| format!("{v:.2} us")),
            rate / 1e6,
            into / 1e6,
            many / 1e6,
            framed / 1e6,
            fed / 1e6,
            tok / 1e6,
            rate / tok,
            into / tok,
            many / tok,
            ucx.map_or("-".into(), |v| format!("{:.3} M msg/s", v / 1e6))
        );
        framed_rate.push(framed);
        fed_rate.push(fed);
        chan_lat.push(lat);
        chan_rate.push(rate);
        tokio_rate.push(tok);
        raw_lat.extend(raw);
        ucx_rate.extend(ucx);
    }
    let m = |v: &mut Vec<f64>| if v.is_empty() { f64::NAN } else { median(v) };
    if cli.versus_soft {
        println!(
            "medians of the per-rep ratios: shm / soft {:.2}x with recv, {:.2}x with recv_into, {:.2}x with recv_many",
            m(&mut vs_recv),
            m(&mut vs_into),
            m(&mut vs_many)
        );
    }
    if !channel_only {
        // The figure to quote: each rep's ratio pairs runs seconds apart, where the medians
        // below may pair a fast rep's channel with a slow rep's tokio.
        println!(
            "medians of the per-rep ratios: channel / tokio buffered {:.2}x with recv, {:.2}x with recv_into, {:.2}x with recv_many",
            m(&mut vs_tok_recv),
            m(&mut vs_tok_into),
            m(&mut vs_tok_many)
        );
    }
    let (cl, rl, cr, tr, ur) = (
        m(&mut chan_lat),
        m(&mut raw_lat),
        m(&mut chan_rate),
        m(&mut tokio_rate),
        m(&mut ucx_rate),
    );
    let fr = m(&mut framed_rate);
    let fd = m(&mut fed_rate);
    let mr = m(&mut many_rate);
    let ir = m(&mut into_rate);
    // A figure that was not measured reads "-", not NaN.
    let raw = if rl.is_nan() {
        "raw WRITE - (not measured)".to_string()
    } else {
        format!("raw WRITE {rl:.2} us = {:.2}x", cl / rl)
    };
    if channel_only {
        println!(
            "medians: channel 64 B p50 {cl:.3} us vs {raw}; channel {:.3} M msg/s, with recv_into {:.3} M msg/s, with recv_many {:.3} M msg/s",
            cr / 1e6,
            ir / 1e6,
            mr / 1e6
        );
        return;
    }
    // The headline is the fair peer: tokio batching as well as it can (a hand-written
    // BufWriter, then tokio-util's own batching); the flush-per-message program comes last and
    // says what it is.
    let ucx = if ur.is_nan() {
        "UCX am_bw - (not measured)".to_string()
    } else {
        format!("UCX am_bw {:.3} = {:.2}x", ur / 1e6, cr / ur)
    };
    println!(
        "medians: channel 64 B p50 {cl:.3} us vs {raw}; channel {:.3} M msg/s vs tokio buffered (64 KiB BufWriter) {:.3} = {:.2}x, vs tokio framed fed {:.3} = {:.2}x, vs {ucx}, vs tokio framed flushing every message {:.3} = {:.2}x",
        cr / 1e6,
        tr / 1e6,
        cr / tr,
        fd / 1e6,
        cr / fd,
        fr / 1e6,
        cr / fr
    );
    println!(
        "medians, the receiver taking batches (recv_many): channel {:.3} M msg/s vs tokio buffered {:.2}x, vs {}",
        mr / 1e6,
        mr / tr,
        if ur.is_nan() {
            "UCX am_bw - (not measured)".to_string()
        } else {
            format!("UCX am_bw {:.2}x", mr / ur)
        }
    );
}
