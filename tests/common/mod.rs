//! A member process (`barewire-dsm-node`, `barewire-actor-node`) driven over its standard
//! input and output, shared by the multi-process tests.

#![allow(dead_code)] // each test crate uses its own part of it

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The example program `name`, built beside the test binaries (`cargo build --examples`:
/// `cargo test --all-targets` builds examples only as test harnesses).
pub fn example(name: &str) -> std::path::PathBuf {
    let p = std::path::PathBuf::from(env!("CARGO_BIN_EXE_barewire"))
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is not built: run `cargo build --examples` first (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A single core that sleeps when idle (test members share two CPUs).
pub use barewire_test_support::rt;

/// Runs `server` on a listening node (soft provider, loopback, a port of its choosing) in a
/// thread of its own; returns the thread, which yields what `server` returned, and the port.
pub fn listening<S, SF, R>(server: S) -> (std::thread::JoinHandle<R>, u16)
where
    S: FnOnce(barewire::Node) -> SF + Send + 'static,
    SF: std::future::Future<Output = R> + 'static,
    R: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        rt().block_on(async move {
            let node = barewire::Node::soft().unwrap();
            tx.send(node.listen("127.0.0.1:0".parse().unwrap()).unwrap())
                .unwrap();
            server(node).await
        })
    });
    (t, rx.recv().unwrap())
}

/// Runs `body(rank, node, mesh)` on `n` members in this process, one thread and core each,
/// meshed on loopback over the driver under test (nothing, after a SKIP line, where it cannot
/// run here).
pub fn meshed<F, Fut>(n: usize, body: F)
where
    F: Fn(usize, barewire::Node, barewire::Mesh) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let Some(cfg) = driver() else { return };
    let body = std::sync::Arc::new(body);
    let (port_tx, port_rx) = mpsc::channel();
    let mut addr_txs = Vec::new();
    let mut threads = Vec::new();
    for rank in 0..n {
        let (addr_tx, addr_rx) = mpsc::channel::<Vec<std::net::SocketAddr>>();
        addr_txs.push(addr_tx);
        let port_tx = port_tx.clone();
        let body = body.clone();
        let cfg = cfg.clone();
        threads.push(std::thread::spawn(move || {
            rt().block_on(async move {
                let node = barewire::Node::with_config(&cfg).unwrap();
                let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
                port_tx.send((rank, port)).unwrap();
                let addrs = addr_rx.recv().unwrap();
                let mesh = barewire::Mesh::join(&node, rank, &addrs).await.unwrap();
                body(rank, node, mesh).await;
            })
        }));
    }
    let mut ports = vec![0u16; n];
    for _ in 0..n {
        let (r, p) = port_rx.recv().unwrap();
        ports[r] = p;
    }
    let addrs: Vec<std::net::SocketAddr> = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
        .collect();
    for tx in addr_txs {
        tx.send(addrs.clone()).unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// Holds the other multi-process tests of this binary off while one runs: each starts its own
/// processes with deadlines of tens of milliseconds, and on a 2-core machine several at once
/// starve each other into false verdicts.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The driver under test: `BAREWIRE_DRIVER`, the software provider by default.
pub fn driver_name() -> String {
    std::env::var("BAREWIRE_DRIVER").unwrap_or_else(|_| "soft".into())
}

/// Whether the driver under test can reach a member in another network namespace. Explicit
/// `BAREWIRE_DRIVER=shm` cannot (shared memory needs the same host and namespace; `auto` takes
/// the software provider there): the caller skips, after this prints why.
pub fn reaches_other_netns(test: &str) -> bool {
    if driver_name() == "shm" {
        eprintln!(
            "SKIP: {test}: BAREWIRE_DRIVER=shm reaches only peers in this network namespace, \
             and this test cuts off a member in another (run it under soft or auto)"
        );
        return false;
    }
    true
}

/// The driver under test, or `None` (after printing why) where it cannot run here, as the
/// drivers' conformance suite does: so the same tests run on verbs wherever a device exists.
pub fn driver() -> Option<barewire::drivers::DriverConfig> {
    let name = driver_name();
    let cfg = barewire::drivers::DriverConfig::parse(&name, std::env::var("BAREWIRE_DEVICE").ok())
        .expect("BAREWIRE_DRIVER names a driver");
    match cfg.select() {
        Ok(_) => Some(cfg),
        Err(e) => {
            eprintln!("SKIP: BAREWIRE_DRIVER={name}: {e}");
            None
        }
    }
}

/// One member process: its lines on standard output arrive through `lines`.
pub struct Member {
    pub child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Member {
    /// Starts program `bin` with `args` on the software provider, inside network namespace
    /// `netns` when given.
    pub fn spawn(bin: &str, args: &[String], netns: Option<&str>) -> Member {
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, bin]);
                c
            }
            None => Command::new(bin),
        };
        let mut child = cmd
            .args(args)
            .env("BAREWIRE_DRIVER", driver_name())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("barewire-dsm-node starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Member {
            stdin: child.stdin.take().unwrap(),
            child,
            lines,
        }
    }

    /// The next line that starts with `what` (earlier lines are skipped).
    pub fn expect(&self, what: &str, within: Duration) -> String {
        loop {
            match self.lines.recv_timeout(within) {
                Ok(l) if l.starts_with(what) => return l,
                Ok(_) => {}
                Err(e) => panic!("waited {within:?} for {what}: {e}"),
            }
        }
    }

    /// Lines until, for each of `whats`, one has started with it (in any order).
    pub fn expect_each(&self, whats: &[&str], within: Duration) {
        let t0 = std::time::Instant::now();
        let mut left: Vec<&str> = whats.to_vec();
        while !left.is_empty() {
            match self.lines.recv_timeout(within.saturating_sub(t0.elapsed())) {
                Ok(l) => left.retain(|w| !l.starts_with(w)),
                Err(e) => panic!("waited {within:?} for {left:?}: {e}"),
            }
        }
    }

    /// Every line up to and including the next that starts with `end`.
    pub fn lines_until(&self, end: &str, within: Duration) -> Vec<String> {
        let t0 = std::time::Instant::now();
        let mut got = Vec::new();
        loop {
            match self.lines.recv_timeout(within.saturating_sub(t0.elapsed())) {
                Ok(l) => {
                    let last = l.starts_with(end);
                    got.push(l);
                    if last {
                        return got;
                    }
                }
                Err(e) => panic!("waited {within:?} for {end}: {e}; got {got:?}"),
            }
        }
    }

    /// As `expect`, from a task of a runtime: waits without blocking the core (whose node must
    /// keep answering and heartbeating meanwhile).
    pub async fn expect_async(&self, what: &str, within: Duration) -> String {
        let t0 = std::time::Instant::now();
        loop {
            match self.lines.try_recv() {
                Ok(l) if l.starts_with(what) => return l,
                Ok(_) => continue,
                Err(mpsc::TryRecvError::Disconnected) => panic!("it exited before {what}"),
                Err(mpsc::TryRecvError::Empty) => {}
            }
            assert!(t0.elapsed() < within, "waited {within:?} for {what}");
            barewire::engine::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The port it printed in `READY <port>`.
    pub fn port(&self) -> u16 {
        let l = self.expect("READY", Duration::from_secs(20));
        l.trim_start_matches("READY ").parse().expect("a port")
    }

    /// Writes one line to its standard input (it may have exited: then nothing happens).
    pub fn say(&mut self, line: &str) {
        let _ = writeln!(self.stdin, "{line}");
    }

    /// Waits until it has said `HOLDING` and stopped itself (a member run with
    /// `--stop-in-updates`), so that it is stopped holding a lock.
    pub fn expect_stopped(&self, within: Duration) {
        let t0 = std::time::Instant::now();
        self.expect("HOLDING", within);
        let stat = format!("/proc/{}/stat", self.child.id());
        loop {
            // The state is the first field after the command's closing parenthesis.
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            let state = s
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            if state == Some('T') {
                return;
            }
            assert!(
                t0.elapsed() < within,
                "it said HOLDING but was not stopped within {within:?} (state {state:?})"
            );
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// Not every test binary that includes this module makes a namespace.
#[allow(unused_imports)]
pub use barewire_test_support::Netns;
