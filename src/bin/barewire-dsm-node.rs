//! barewire-dsm-node: one member of a distributed-shared-memory workload, for the
//! linearizability tests and for trying faults by hand. Clients run a random mix of reads,
//! writes, updates, fetch-adds and compare-and-swaps on a few keys and record every operation's
//! invocation and return, with CLOCK_MONOTONIC timestamps, in a history file.
//!
//! ```text
//! barewire-dsm-node --rank R --out FILE [--bind IP] [--clients 4] [--ops 850] [--keys 6]
//!                   [--lease-ms 20] [--hold-us 0 (per wide update, lock held)] [--pace-us 0] [--seed S] [--broken VARIANT]
//!                   [--stop-in-updates N]
//! ```
//!
//! It listens on IP (127.0.0.1) port 0 and prints `READY <port>`; then it reads one line
//! `ADDRS <addr> <addr> ...` (every member's address, by rank) from standard input, joins the
//! mesh, creates the shared arrays, waits for every member, prints `STARTED`, runs its clients,
//! prints `DONE breaks=<leases it broke> fenced=<its commits fenced>` and stays (serving the others) until standard input says `EXIT` or closes.
//!
//! History lines (one `write` each, so a killed process leaves whole lines):
//!
//! ```text
//! I <thread> <w|u> <key> <R|W|U|F|C> <a> <b> <ns>   invoked (W: value a; F: add a; C: a -> b)
//! R <thread> <ns> <V value | OK | TORN>              returned
//! X <thread> <ns>                                    failed without effect (e.g. PeerGone on a read)
//! ```
//!
//! An operation with no R or X line never finished, or its outcome is unknown
//! (`Error::Indeterminate`); the client then continues under a new thread number. `w` keys are
//! wide objects (64 bytes), `u` keys `u64` words.
//!
//! `--stop-in-updates N` is a fault for the lease tests: once the clients have invoked 16 calls,
//! each of the next N wide updates prints `HOLDING <key>` and stops the whole process with
//! SIGSTOP from inside its update, where it holds the key's lock. Whoever watches the process
//! sends SIGCONT when it likes; the update then goes on to its commit.

use std::cell::RefCell;
use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::rc::Rc;
use std::time::Duration;

use barewire::dsm::{Broken, SharedArray, SharedMemory, SharedOptions};
use barewire::engine::{spawn_local, time};
use barewire::{Error, Mesh, Node, Result};

mod member;
use member::say;

/// A 64-byte value whose every word derives from one number: a read that mixed two versions
/// shows words that disagree. A plain `[u64; 8]`, so any program can join the same arrays.
type Wide = [u64; 8];

fn wide_of(v: u64) -> Wide {
    let mut w = [0u64; 8];
    for (i, x) in w.iter_mut().enumerate() {
        *x = v.wrapping_mul(2 * i as u64 + 1) ^ (i as u64) << 56;
    }
    w[7] = !v;
    w
}

fn wide_value(w: &Wide) -> Option<u64> {
    (*w == wide_of(w[0])).then_some(w[0])
}

struct Args {
    rank: usize,
    out: String,
    bind: String,
    clients: usize,
    ops: u64,
    keys: u64,
    lease: Duration,
    hold: Duration,
    pace: Duration,
    seed: u64,
    broken: Option<Broken>,
    /// Leave alone the keys homed on this rank.
    skip_home: Option<usize>,
    /// Wide updates that stop the process while they hold their lock.
    stop_in_updates: u64,
}

/// The `--stop-in-updates` fault: how many calls before it is armed, and how many stops are left.
struct SelfStop {
    calls_before: std::cell::Cell<u64>,
    left: std::cell::Cell<u64>,
}

impl SelfStop {
    /// Counts one invoked call.
    fn invoked(&self) {
        self.calls_before
            .set(self.calls_before.get().saturating_sub(1));
    }

    /// From inside a wide update on `key`: stops the process if a stop is due.
    fn maybe_stop(&self, key: u64) {
        if self.calls_before.get() > 0 || self.left.get() == 0 {
            return;
        }
        self.left.set(self.left.get() - 1);
        say(&format!("HOLDING {key}"));
        // SAFETY: raise only sends a signal to this process; SIGSTOP stops it until SIGCONT.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

fn parse() -> std::result::Result<Args, String> {
    let mut a = Args {
        rank: usize::MAX,
        out: String::new(),
        bind: "127.0.0.1".into(),
        clients: 4,
        ops: 850,
        keys: 6,
        lease: Duration::from_millis(20),
        hold: Duration::ZERO,
        pace: Duration::ZERO,
        seed: 1,
        broken: None,
        skip_home: None,
        stop_in_updates: 0,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = || v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--rank" => a.rank = num()? as usize,
            "--out" => a.out = v.clone(),
            "--bind" => a.bind = v.clone(),
            "--clients" => a.clients = num()? as usize,
            "--ops" => a.ops = num()?,
            "--keys" => a.keys = num()?,
            "--lease-ms" => a.lease = Duration::from_millis(num()?),
            "--hold-us" => a.hold = Duration::from_micros(num()?),
            "--pace-us" => a.pace = Duration::from_micros(num()?),
            "--seed" => a.seed = num()?,
            "--skip-home" => a.skip_home = Some(num()? as usize),
            "--stop-in-updates" => a.stop_in_updates = num()?,
            "--broken" => a.broken = Some(v.parse().map_err(|e: Error| e.to_string())?),
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.rank == usize::MAX || a.out.is_empty() {
        return Err("usage: barewire-dsm-node --rank R --out FILE [options]".into());
    }
    Ok(a)
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// xorshift64*: enough randomness to pick operations.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Log(RefCell<std::fs::File>);
impl Log {
    fn line(&self, s: String) {
        let _ = self.0.borrow_mut().write_all(s.as_bytes());
    }
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("barewire-dsm-node: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = member::runtime().block_on(run(args)) {
        eprintln!("barewire-dsm-node: {e}");
        std::process::exit(1);
    }
}

async fn run(a: Args) -> Result<()> {
    let node = Node::new()?;
    let addrs = member::handshake(&node, &a.bind)?;
    // Standard input now only says when to leave.
    let (_, exit) = member::commands();

    let mesh = Mesh::join(&node, a.rank, &addrs).await?;
    let n = mesh.size();
    let mut opts = SharedOptions::with_lease(a.lease);
    opts.broken = a.broken;
    let bar = SharedMemory::<u64>::create(&node, &mesh, 0, SharedOptions::default()).await?;
    let wide = Rc::new(SharedArray::create(&node, &mesh, a.keys, wide_of(0), opts).await?);
    let word = Rc::new(SharedArray::<u64>::create(&node, &mesh, a.keys, 0, opts).await?);
    bar.fetch_add(0, 1).await?;
    while bar.read_from(0).await? < n as u64 {
        time::sleep(Duration::from_millis(1)).await;
    }
    say("STARTED");

    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o644)
        .open(&a.out)
        .map_err(|e| Error::Invalid(format!("{}: {e}", a.out)))?;
    let log = Rc::new(Log(RefCell::new(file)));
    let dead = Rc::new(RefCell::new(HashSet::new()));
    let stop = Rc::new(SelfStop {
        calls_before: 16.into(),
        left: a.stop_in_updates.into(),
    });
    let a = Rc::new(a);
    let mut clients = Vec::new();
    for c in 0..a.clients {
        let (a, log, dead, stop, wide, word) = (
            a.clone(),
            log.clone(),
            dead.clone(),
            stop.clone(),
            wide.clone(),
            word.clone(),
        );
        clients.push(spawn_local(async move {
            client(&a, c, &log, &dead, &stop, &wide, &word).await;
        }));
    }
    for c in clients {
        let _ = c.await;
    }
    say(&format!(
        "DONE breaks={} fenced={}",
        wide.lease_breaks(),
        wide.fenced_commits()
    ));
    while !member::exiting(&exit) {
        time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn client(
    a: &Args,
    c: usize,
    log: &Log,
    dead: &RefCell<HashSet<usize>>,
    stop: &SelfStop,
    wide: &SharedArray<Wide>,
    word: &SharedArray<u64>,
) {
    let mut rng = Rng(a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (a.rank * 64 + c + 1) as u64);
    let mut generation = 0u64;
    let mut unique = 0u64;
    for _ in 0..a.ops {
        if !a.pace.is_zero() {
            time::sleep(a.pace).await;
        }
        let thread = (a.rank as u64 * 64 + c as u64) * 1000 + generation;
        let is_wide = rng.below(2) == 0;
        let key = rng.below(a.keys);
        let home = if is_wide {
            wide.home_of(key)
        } else {
            word.home_of(key)
        };
        if dead.borrow().contains(&home) || a.skip_home == Some(home) {
            continue;
        }
        unique += 1;
        let fresh = (a.rank as u64 + 1) << 48 | (c as u64) << 40 | unique;
        let pick = rng.below(100);
        let (op, x, y) = match (is_wide, pick) {
            (_, 0..=44) => ('R', 0, 0),
            (_, 45..=59) => ('W', fresh, 0),
            (true, _) | (false, 60..=79) => ('U', 0, 0),
            (false, 80..=89) => ('F', rng.below(5) + 1, 0),
            (false, _) => ('C', rng.below(4), fresh),
        };
        let kind = if is_wide { 'w' } else { 'u' };
        log.line(format!(
            "I {thread} {kind} {key} {op} {x} {y} {}\n",
            now_ns()
        ));
        stop.invoked();
        let hold = a.hold;
        let spin = move || {
            let t = std::time::Instant::now();
            while t.elapsed() < hold {
                std::hint::spin_loop();
            }
        };
        let r: Result<String> = if is_wide {
            match op {
                'R' => wide.get(key).await.map(|v| match wide_value(&v) {
                    Some(v) => format!("V {v}"),
                    None => "TORN".into(),
                }),
                'W' => wide.put(key, wide_of(x)).await.map(|_| "OK".into()),
                _ => wide
                    .update(key, |v| {
                        stop.maybe_stop(key);
                        spin();
                        wide_of(v[0].wrapping_add(1))
                    })
                    .await
                    .map(|v| format!("V {}", v[0])),
            }
        } else {
            match op {
                'R' => word.get(key).await.map(|v| format!("V {v}")),
                'W' => word.put(key, x).await.map(|_| "OK".into()),
                'U' => word
                    .update(key, |v| v.wrapping_add(1))
                    .await
                    .map(|v| format!("V {v}")),
                'F' => word.fetch_add(key, x).await.map(|v| format!("V {v}")),
                _ => word
                    .compare_and_swap(key, x, y)
                    .await
                    .map(|v| format!("V {v}")),
            }
        };
        match r {
            Ok(ret) => log.line(format!("R {thread} {} {ret}\n", now_ns())),
            Err(Error::PeerGone(_)) | Err(Error::OutOfBounds { .. }) => {
                log.line(format!("X {thread} {}\n", now_ns()));
                dead.borrow_mut().insert(home);
            }
            Err(_) => {
                // Outcome unknown: it stays in flight in the history; go on as a new thread.
                generation += 1;
                dead.borrow_mut().insert(home);
            }
        }
    }
}
