//! The echo workload: a server on one pinned core, a client on another.
//!
//! - `Mode::Throughput`: `conns` connections, each a closed loop of write `size` bytes / read
//!   them back, for `secs` seconds. Reports round trips per second.
//! - `Mode::PingPong`: one connection, one message in flight, every round trip timed into an
//!   HDR histogram after a warm-up.
//! - `Mode::Churn`: as throughput, with a new connection for every round trip (connect, write,
//!   read back, close).

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Round trips per second over many connections.
    Throughput,
    /// Latency of one connection.
    PingPong,
    /// As `Throughput`, but every round trip opens a connection of its own and closes it
    /// after: connection set-up and teardown, which per-socket costs (registered files) weigh
    /// on.
    Churn,
}

/// One run's settings.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// What to measure.
    pub mode: Mode,
    /// Connections (throughput mode).
    pub conns: usize,
    /// Message size in bytes.
    pub size: usize,
    /// Measured seconds (after one second of warm-up in ping-pong mode).
    pub secs: u64,
    /// Core of the server thread.
    pub server_cpu: usize,
    /// Core of the client thread.
    pub client_cpu: usize,
    /// barewire only: idle spin before sleeping.
    pub spin: Duration,
    /// barewire only: registered file table slots per core (0: off; `None`: the engine's
    /// default).
    pub fixed_files: Option<u32>,
    /// barewire only: receive through multishot receives into provided-buffer rings (one per
    /// core), the server echoing from the ring's buffer, instead of a receive per read.
    pub multishot: bool,
}

/// Buffers in each core's ring (multishot mode): one message per connection is in flight.
const RING_ENTRIES: u16 = 1024;

/// One run's figures.
#[derive(Debug)]
pub struct Report {
    /// Round trips completed in the measured window.
    pub round_trips: u64,
    /// Length of the measured window.
    pub elapsed: Duration,
    /// Round-trip times in nanoseconds (ping-pong mode).
    pub hist: Option<Histogram<u64>>,
    /// barewire only: each core's counters at the end (client core 0, server core 1).
    pub stats: Vec<barewire_engine::CoreStats>,
}

impl Report {
    /// Round trips per second.
    pub fn rate(&self) -> f64 {
        self.round_trips as f64 / self.elapsed.as_secs_f64()
    }
}

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// Times one round trip at a time for `secs` seconds after a one-second warm-up. `state` is
/// whatever the round trip needs (the connection and its buffer); it is threaded through so
/// owned-buffer APIs fit.
async fn ping_pong<S, F, Fut>(mut state: S, secs: u64, mut round_trip: F) -> Report
where
    F: FnMut(S) -> Fut,
    Fut: std::future::Future<Output = S>,
{
    let mut hist = new_hist();
    let warm = Instant::now() + Duration::from_secs(1);
    while Instant::now() < warm {
        state = round_trip(state).await;
    }
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let mut n = 0;
    loop {
        let t0 = Instant::now();
        if t0 >= end {
            break;
        }
        state = round_trip(state).await;
        hist.record(t0.elapsed().as_nanos() as u64).unwrap();
        n += 1;
    }
    Report {
        round_trips: n,
        elapsed: start.elapsed(),
        hist: Some(hist),
        stats: Vec::new(),
    }
}

/// Round trips until `end`, one connection's closed loop.
async fn closed_loop<S, F, Fut>(mut state: S, end: Instant, mut round_trip: F) -> u64
where
    F: FnMut(S) -> Fut,
    Fut: std::future::Future<Output = S>,
{
    let mut n = 0;
    while Instant::now() < end {
        state = round_trip(state).await;
        n += 1;
    }
    n
}

/// barewire: one runtime, server on core 1 of the runtime, client on core 0.
pub fn barewire(cfg: Config) -> Report {
    use barewire_engine::buf::BufRing;
    use barewire_engine::net::{TcpListener, TcpStream};
    use barewire_engine::sync::cross;
    use barewire_engine::{spawn_local, spawn_on, Runtime};

    let mut builder = Runtime::builder()
        .core_ids(&[cfg.client_cpu, cfg.server_cpu])
        .idle_spin(cfg.spin);
    if let Some(n) = cfg.fixed_files {
        builder = builder.fixed_files(n);
    }
    let rt = builder.build().expect("runtime");
    let mut report = rt.block_on(async move {
        let (mut tx, mut rx) = cross::channel::<SocketAddr>(1);
        let size = cfg.size;
        let multishot = cfg.multishot;
        let new_ring = move || {
            multishot.then(|| BufRing::new(RING_ENTRIES, size.next_power_of_two()).unwrap())
        };
        spawn_on(1, move || async move {
            let ring = new_ring();
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
            tx.send(l.local_addr().unwrap()).await.unwrap();
            let mut incoming = l.incoming();
            loop {
                let Ok(s) = incoming.next().await else { return };
                let ring = ring.clone();
                spawn_local(async move {
                    if let Some(ring) = ring {
                        let mut rx = s.recv_multi(&ring);
                        while let Some(Ok(buf)) = rx.next().await {
                            if buf.is_empty() || s.write_all(buf).await.0.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    let mut buf = vec![0u8; size];
                    loop {
                        let (r, b) = s.read_exact(buf).await;
                        if r.is_err() {
                            return;
                        }
                        let (r, b) = s.write_all(b).await;
                        if r.is_err() {
                            return;
                        }
                        buf = b;
                    }
                });
            }
        });
        let addr = rx.recv().await.unwrap();
        match cfg.mode {
            Mode::PingPong => {
                let c = Rc::new(TcpStream::connect(addr).await.unwrap());
                ping_pong(vec![1u8; size], cfg.secs, |buf| {
                    let c = c.clone();
                    async move {
                        let buf = c.write_all(buf).await.1;
                        let (r, buf) = c.read_exact(buf).await;
                        r.unwrap();
                        buf
                    }
                })
                .await
            }
            Mode::Throughput | Mode::Churn => {
                let start = Instant::now();
                let end = start + Duration::from_secs(cfg.secs);
                let ring = new_ring();
                let churn = cfg.mode == Mode::Churn;
                let workers: Vec<_> = (0..cfg.conns)
                    .map(|_| {
                        let ring = ring.clone();
                        spawn_local(async move {
                            if churn {
                                return closed_loop(vec![1u8; size], end, |buf| async move {
                                    let c = TcpStream::connect(addr).await.unwrap();
                                    let buf = c.write_all(buf).await.1;
                                    let (r, buf) = c.read_exact(buf).await;
                                    r.unwrap();
                                    buf
                                })
                                .await;
                            }
                            if let Some(ring) = ring {
                                let c = TcpStream::connect(addr).await.unwrap();
                                return multishot_loop(&c, &ring, size, end).await;
                            }
                            let c = Rc::new(TcpStream::connect(addr).await.unwrap());
                            closed_loop(vec![1u8; size], end, |buf| {
                                let c = c.clone();
                                async move {
                                    let buf = c.write_all(buf).await.1;
                                    let (r, buf) = c.read_exact(buf).await;
                                    r.unwrap();
                                    buf
                                }
                            })
                            .await
                        })
                    })
                    .collect();
                let mut total = 0;
                for w in workers {
                    total += w.await.unwrap();
                }
                Report {
                    round_trips: total,
                    elapsed: start.elapsed(),
                    hist: None,
                    stats: Vec::new(),
                }
            }
        }
    });
    report.stats = rt.stats();
    report
}

/// A barewire client connection's closed loop in multishot mode: write the message, then take
/// buffers from the connection's multishot receive until all of it came back.
async fn multishot_loop(
    c: &barewire_engine::net::TcpStream,
    ring: &barewire_engine::buf::BufRing,
    size: usize,
    end: Instant,
) -> u64 {
    let mut rx = c.recv_multi(ring);
    let mut buf = vec![1u8; size];
    let mut n = 0;
    while Instant::now() < end {
        let (r, b) = c.write_all(buf).await;
        r.unwrap();
        buf = b;
        let mut got = 0;
        while got < size {
            got += rx
                .next()
                .await
                .expect("echo open")
                .expect("echo data")
                .len();
        }
        n += 1;
    }
    n
}

/// tokio: one current_thread runtime per core, each on its own pinned thread.
pub fn tokio(cfg: Config) -> Report {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (atx, arx) = std::sync::mpsc::channel();
    let size = cfg.size;
    let server_cpu = cfg.server_cpu;
    std::thread::spawn(move || {
        let rt = crate::tokio_on(server_cpu);
        rt.block_on(async move {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            atx.send(l.local_addr().unwrap()).unwrap();
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                s.set_nodelay(true).unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; size];
                    loop {
                        if s.read_exact(&mut buf).await.is_err() || s.write_all(&buf).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
    });
    let addr = arx.recv().unwrap();
    let rt = crate::tokio_on(cfg.client_cpu);
    rt.block_on(async move {
        let connect = move || async move {
            let c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.set_nodelay(true).unwrap();
            c
        };
        match cfg.mode {
            Mode::PingPong => {
                let c = connect().await;
                ping_pong((c, vec![1u8; size]), cfg.secs, tokio_round_trip).await
            }
            Mode::Throughput | Mode::Churn => {
                let start = Instant::now();
                let end = start + Duration::from_secs(cfg.secs);
                let churn = cfg.mode == Mode::Churn;
                let workers: Vec<_> = (0..cfg.conns)
                    .map(|_| {
                        tokio::spawn(async move {
                            if churn {
                                return closed_loop(vec![1u8; size], end, |buf| async move {
                                    tokio_round_trip((connect().await, buf)).await.1
                                })
                                .await;
                            }
                            let c = connect().await;
                            closed_loop((c, vec![1u8; size]), end, tokio_round_trip).await
                        })
                    })
                    .collect();
                let mut total = 0;
                for w in workers {
                    total += w.await.unwrap();
                }
                Report {
                    round_trips: total,
                    elapsed: start.elapsed(),
                    hist: None,
                    stats: Vec::new(),
                }
            }
        }
    })
}

/// monoio: one io_uring runtime per core, each on its own pinned thread.
pub fn monoio(cfg: Config) -> Report {
    use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
    let (atx, arx) = std::sync::mpsc::channel();
    let size = cfg.size;
    let server_cpu = cfg.server_cpu;
    std::thread::spawn(move || {
        crate::pin(server_cpu);
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .enable_timer()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = monoio::net::TcpListener::bind("127.0.0.1:0").unwrap();
            atx.send(l.local_addr().unwrap()).unwrap();
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    return;
                };
                s.set_nodelay(true).unwrap();
                monoio::spawn(async move {
                    let mut buf = vec![0u8; size];
                    loop {
                        let (r, b) = s.read_exact(buf).await;
                        if r.is_err() {
                            return;
                        }
                        let (r, b) = s.write_all(b).await;
                        if r.is_err() {
                            return;
                        }
                        buf = b;
                    }
                });
            }
        });
    });
    let addr = arx.recv().unwrap();
    crate::pin(cfg.client_cpu);
    let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .build()
        .unwrap();
    rt.block_on(async move {
        let connect = move || async move {
            let c = monoio::net::TcpStream::connect(addr).await.unwrap();
            c.set_nodelay(true).unwrap();
            c
        };
        match cfg.mode {
            Mode::PingPong => {
                let c = connect().await;
                ping_pong((c, vec![1u8; size]), cfg.secs, monoio_round_trip).await
            }
            Mode::Throughput | Mode::Churn => {
                let start = Instant::now();
                let end = start + Duration::from_secs(cfg.secs);
                let churn = cfg.mode == Mode::Churn;
                let workers: Vec<_> = (0..cfg.conns)
                    .map(|_| {
                        monoio::spawn(async move {
                            if churn {
                                return closed_loop(vec![1u8; size], end, |buf| async move {
                                    monoio_round_trip((connect().await, buf)).await.1
                                })
                                .await;
                            }
                            let c = connect().await;
                            closed_loop((c, vec![1u8; size]), end, monoio_round_trip).await
                        })
                    })
                    .collect();
                let mut total = 0;
                for w in workers {
                    total += w.await;
                }
                Report {
                    round_trips: total,
                    elapsed: start.elapsed(),
                    hist: None,
                    stats: Vec::new(),
                }
            }
        }
    })
}

async fn tokio_round_trip(
    (mut c, mut buf): (tokio::net::TcpStream, Vec<u8>),
) -> (tokio::net::TcpStream, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(&buf).await.unwrap();
    c.read_exact(&mut buf).await.unwrap();
    (c, buf)
}

async fn monoio_round_trip(
    (mut c, buf): (monoio::net::TcpStream, Vec<u8>),
) -> (monoio::net::TcpStream, Vec<u8>) {
    use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
    let (r, buf) = c.write_all(buf).await;
    r.unwrap();
    let (r, buf) = c.read_exact(buf).await;
    r.unwrap();
    (c, buf)
}
