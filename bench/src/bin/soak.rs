//! barewire-soak: a mixed workload across three processes on loopback for a given time, with
//! random faults, checking that nothing acknowledged is lost, nothing is delivered twice, and
//! memory and descriptors stay flat.
//!
//! ```text
//! barewire-soak [--seconds 120] [--seed N] [--fault-every-ms 4000] [--net netns|loopback|auto]
//!               [--break WHAT]
//! ```
//!
//! `--break` runs a deliberately broken worker, to show that each check catches what it is
//! for (`tests/soak.rs`): `dup` (a client sends one message twice), `lost-write` (every server
//! loses an acknowledged write before the dump), `leak` (every worker leaks 2 MiB a second),
//! `resume-zero` (a restarted server forgets where to resume), `fake-cut` (a link cut that
//! leaves the link up).
//!
//! Three worker processes (this binary, `worker` mode) form a ring: each connects to the
//! next and serves the one before it. Over each connection the serving side sends a
//! `Region<u64>` (bound to that connection) and both open a `Channel<[u64; 2]>`:
//!
//! - **Messages.** The client sends sequence numbers with a checksum. The server delivers a
//!   message only if it is exactly the next one expected (anything else, a gap, a repeat or a
//!   bad checksum, is a violation and ends the run) and reports `DELIVERED` to the supervisor:
//!   what it reported is delivered. After a reconnect the server tells the client where to
//!   resume; a restarted server resumes from what it last reported (the supervisor passes it
//!   on), so every message is delivered exactly once across the whole run.
//! - **One-sided writes.** After each batch of messages the client RDMA WRITEs a value into
//!   the next slot of the server's region, round robin; values only grow (the client's
//!   incarnation in the high bits, a counter below), and it reports each acknowledged write.
//!   At the end each server dumps its region: every slot must hold at least the last value
//!   acknowledged into it (a later write may have landed unacknowledged; writes to an
//!   earlier incarnation of a restarted server are not expected to survive).
//!
//! **The network** (`--net netns`, the default): two network namespaces made for the run,
//! joined by a veth pair. Ranks 0 and 1 live in the first and talk over its loopback; rank 2
//! lives in the second, so the connections 1 → 2 and 2 → 0 cross the veth link, and setting
//! the link down is a real partition: packets stop, nothing is told. The namespaces are
//! removed at the end (and, at the next start, any left by a soak that was killed).
//! `--net loopback` runs all three on 127.0.0.1 without link cuts (no privilege needed);
//! `auto` takes netns where it can be made and says so.
//!
//! The supervisor injects a fault every `--fault-every-ms` on average (seeded): SIGKILL and a
//! restart (never rank 0, which therefore lives through the whole run), SIGSTOP for up to
//! 2 s and SIGCONT, or the link cut for 0.3 to 3 s (longer than the provider's 1 s stall
//! timeout about half the time, so connections with work in flight fail and are made again,
//! and shorter cuts are ridden out by TCP). Faults stop 8 s before the end. It samples
//! each worker's RSS and open descriptors every second; for every incarnation that lived
//! through the whole second half, the last sample may exceed the one at the half-way point
//! by at most 25% + 4 MiB of RSS and 8 descriptors. Exit status 0 only when every check
//! held; the summary says what ran and what held.
//!
//! Not yet in the mix: DSM and actors (see the issue).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A link cut is checked to be a partition from this long after it began (what was past the
/// link when it went down, at most a channel ring of 256 messages, may still arrive) ...
const CUT_SETTLE: Duration = Duration::from_millis(500);
/// ... by how many messages a stream crossing the link delivered from then until the link came
/// up, as its server reported them with its own clock: at most this many (two rings).
const CUT_SLACK: u64 = 512;

/// CLOCK_MONOTONIC in nanoseconds: one clock for the supervisor and every worker.
fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Slots of each server's region.
const SLOTS: usize = 64;
/// Workers in the ring.
const PROCS: usize = 3;

/// A checksum of a message's sequence number (splitmix64 finaliser).
fn mix(s: u64) -> u64 {
    let mut z = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("worker") {
        worker::main(&args[1..]);
        return;
    }
    let flag = |k: &str, d: u64| -> u64 {
        barewire_bench::flag(&args, k).map_or(d, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{k} takes a number, got {v:?}"))
        })
    };
    let seconds = flag("--seconds", 120);
    let seed = flag("--seed", 1);
    let every = flag("--fault-every-ms", 4000);
    let net = match barewire_bench::flag(&args, "--net").unwrap_or("netns") {
        "loopback" => Net::loopback(),
        want @ ("netns" | "auto") => match Net::namespaces() {
            Ok(net) => net,
            Err(e) if want == "auto" => {
                println!("soak: no network namespaces ({e}); on loopback, without link cuts");
                Net::loopback()
            }
            Err(e) => {
                eprintln!(
                    "barewire-soak: cannot make the network namespaces for link cuts: {e}\n\
                     (run as root, or pass --net loopback to run without link cuts)"
                );
                std::process::exit(2);
            }
        },
        other => {
            eprintln!("barewire-soak: --net takes netns, loopback or auto, not {other:?}");
            std::process::exit(2);
        }
    };
    if let Some(b) = barewire_bench::flag(&args, "--break") {
        assert!(
            ["dup", "lost-write", "leak", "resume-zero", "fake-cut"].contains(&b),
            "--break dup, lost-write, leak, resume-zero or fake-cut"
        );
        // Read by the workers this process starts.
        std::env::set_var("BAREWIRE_SOAK_BREAK", b);
    }
    let status = supervise(&net, seconds, seed, every);
    drop(net);
    std::process::exit(status);
}

/// Where the workers live and how they reach each other (see the crate docs).
struct Net {
    /// Per rank: the network namespace it enters (none on loopback).
    netns: [Option<String>; PROCS],
    /// Per rank: the address it listens on.
    listen: [SocketAddr; PROCS],
    /// Per rank: the address through which the previous rank reaches it.
    reach: [SocketAddr; PROCS],
    /// The namespace holding the end of the veth pair that `cut` sets down, and that end.
    link: Option<(String, String)>,
    /// Namespaces made for this run, removed on drop.
    made: Vec<String>,
}

/// Namespaces of one soak are named `bwsoak-<supervisor pid>-{a,b}`.
const NETNS_PREFIX: &str = "bwsoak-";

impl Net {
    fn loopback() -> Net {
        let base = free_ports();
        let at = |r: usize| SocketAddr::from(([127, 0, 0, 1], base + r as u16));
        Net {
            netns: Default::default(),
            listen: std::array::from_fn(at),
            reach: std::array::from_fn(at),
            link: None,
            made: Vec::new(),
        }
    }

    /// Two fresh namespaces and a veth pair between them: ranks 0 and 1 in `a`, rank 2 in `b`.
    fn namespaces() -> Result<Net, String> {
        remove_stale_namespaces();
        let pid = std::process::id();
        let (a, b) = (
            format!("{NETNS_PREFIX}{pid}-a"),
            format!("{NETNS_PREFIX}{pid}-b"),
        );
        let (va, vb) = (format!("bws{pid}a"), format!("bws{pid}b"));
        let mut net = Net {
            netns: [Some(a.clone()), Some(a.clone()), Some(b.clone())],
            listen: std::array::from_fn(|r| SocketAddr::from(([0, 0, 0, 0], 7000 + r as u16))),
            reach: [
                SocketAddr::from(([10, 213, 0, 1], 7000)),
                SocketAddr::from(([127, 0, 0, 1], 7001)),
                SocketAddr::from(([10, 213, 0, 2], 7002)),
            ],
            link: Some((a.clone(), va.clone())),
            made: Vec::new(),
        };
        // What is made goes on `made` at once: Drop removes it, on success or not.
        for ns in [&a, &b] {
            ip(&["netns", "add", ns])?;
            net.made.push(ns.clone());
        }
        ip(&[
            "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ])?;
        for (ns, dev, addr) in [(&a, &va, "10.213.0.1/24"), (&b, &vb, "10.213.0.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(net)
    }

    /// Sets the veth link down (a partition) or up again. False on loopback.
    fn cut(&self, down: bool) -> bool {
        let Some((ns, dev)) = &self.link else {
            return false;
        };
        if std::env::var("BAREWIRE_SOAK_BREAK").is_ok_and(|b| b == "fake-cut") {
            return true; // the deliberate defect: a cut that cuts nothing
        }
        let state = if down { "down" } else { "up" };
        if let Err(e) = ip(&["-n", ns, "link", "set", dev, state]) {
            eprintln!("barewire-soak: setting the link {state}: {e}");
        }
        true
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for ns in &self.made {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Runs `ip` with these arguments.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (iproute2 installed?)", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Removes the namespaces of soaks whose supervisor no longer runs (killed before its Drop).
fn remove_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NETNS_PREFIX)
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// What a worker says on stdout, one line each (see `worker`).
enum Event {
    Line(usize, u64, String),
    Gone(usize, u64),
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    inc: u64,
    born: Instant,
    samples: Vec<(Instant, u64, usize)>,
}

/// Runs the soak; returns the exit status.
fn supervise(net: &Net, seconds: u64, seed: u64, every_ms: u64) -> i32 {
    let (tx, rx) = mpsc::channel::<Event>();
    let exe = std::env::current_exe().expect("own path");
    // Per stream (client rank r → server r+1): where the server resumes after a restart.
    let mut resume = [0u64; PROCS];
    let spawn = |rank: usize, inc: u64, resume: u64, tx: &mpsc::Sender<Event>| -> Worker {
        let mut child = Command::new(&exe)
            .args(["worker", &rank.to_string(), &inc.to_string()])
            .arg(resume.to_string())
            .arg(net.listen[rank].to_string())
            .arg(net.reach[(rank + 1) % PROCS].to_string())
            .args(net.netns[rank].as_deref())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("a worker starts");
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(Event::Line(rank, inc, line)).is_err() {
                    return;
                }
            }
            let _ = tx.send(Event::Gone(rank, inc));
        });
        let stdin = child.stdin.take().unwrap();
        Worker {
            child,
            stdin,
            inc,
            born: Instant::now(),
            samples: Vec::new(),
        }
    };
    let mut ws: Vec<Worker> = (0..PROCS).map(|r| spawn(r, 0, 0, &tx)).collect();
    let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rand = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let quiet = end.checked_sub(Duration::from_secs(8)).unwrap_or(start);
    let mut next_fault = start + Duration::from_millis(every_ms / 2 + rand(every_ms));
    let mut next_sample = start;
    let mut stopped: Vec<(usize, Instant)> = Vec::new();
    // While the link is cut: when it goes up again. Every cut, as (from, to) in `mono_ns`.
    let mut cut_until: Option<Instant> = None;
    let mut cuts: Vec<(u64, u64)> = Vec::new();
    let mut faults: HashMap<&str, u32> = HashMap::new();
    let mut t = Tally::default();
    let mut finishing = false;
    let mut final_sent = false;
    loop {
        let now = Instant::now();
        while let Ok(ev) = rx.try_recv() {
            if let Event::Gone(rank, inc) = ev {
                if ws[rank].inc == inc && !final_sent {
                    t.violations.push(format!("rank {rank} exited on its own"));
                }
                continue;
            }
            t.take(ev, &ws);
        }
        if !t.violations.is_empty() {
            break;
        }
        stopped.retain(|&(r, until)| {
            if now >= until {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(ws[r].child.id() as i32, libc::SIGCONT) };
                false
            } else {
                true
            }
        });
        if cut_until.is_some_and(|u| now >= u) {
            cut_until = None;
            net.cut(false);
            if let Some(c) = cuts.last_mut() {
                c.1 = mono_ns();
            }
        }
        if now >= next_sample {
            next_sample = now + Duration::from_secs(1);
            for w in ws.iter_mut() {
                if let Some(s) = sample(w.child.id()) {
                    w.samples.push((now, s.0, s.1));
                }
            }
        }
        if now >= next_fault && now < quiet {
            next_fault = now + Duration::from_millis(every_ms / 2 + rand(every_ms));
            let r = rand(PROCS as u64) as usize;
            let kind = rand(3);
            if kind == 2 && net.link.is_some() {
                if cut_until.is_none() && net.cut(true) {
                    cut_until = Some(now + Duration::from_millis(300 + rand(2700)));
                    cuts.push((mono_ns(), u64::MAX));
                    *faults.entry("link cut").or_default() += 1;
                }
            } else if stopped.iter().all(|s| s.0 != r) {
                // Rank 0 is only ever stopped, so that one process lives through the whole run
                // for the RSS and descriptor check.
                if kind == 0 && r != 0 {
                    let _ = ws[r].child.kill();
                    let _ = ws[r].child.wait();
                    // Take in everything it said before it died, then the server resumes from
                    // what it last reported delivered.
                    let old = ws[r].inc;
                    while let Ok(ev) = rx.recv_timeout(Duration::from_secs(5)) {
                        if matches!(ev, Event::Gone(g, i) if g == r && i == old) {
                            break;
                        }
                        t.take(ev, &ws);
                    }
                    let stream = (r + PROCS - 1) % PROCS;
                    resume[stream] = t.delivered[stream];
                    std::thread::sleep(Duration::from_millis(200 + rand(600)));
                    let inc = ws[r].inc + 1;
                    ws[r] = spawn(r, inc, resume[stream], &tx);
                    *faults.entry("kill and restart").or_default() += 1;
                } else {
                    // SAFETY: signalling our own child.
                    unsafe { libc::kill(ws[r].child.id() as i32, libc::SIGSTOP) };
                    stopped.push((r, now + Duration::from_millis(300 + rand(1700))));
                    *faults.entry("stop and continue").or_default() += 1;
                }
            }
        }
        if now >= end && !finishing {
            if cut_until.take().is_some() {
                net.cut(false);
                if let Some(c) = cuts.last_mut() {
                    c.1 = mono_ns();
                }
            }
            finishing = true;
            for w in ws.iter_mut() {
                let _ = writeln!(w.stdin, "final");
            }
        }
        if finishing
            && !final_sent
            && (t.done.iter().all(|&d| d) || now >= end + Duration::from_secs(20))
        {
            final_sent = true;
            for w in ws.iter_mut() {
                let _ = writeln!(w.stdin, "dump");
            }
        }
        if final_sent && (t.regions.len() == PROCS || now >= end + Duration::from_secs(40)) {
            // Let the last DELIVERED lines in.
            std::thread::sleep(Duration::from_millis(300));
            while let Ok(ev) = rx.try_recv() {
                t.take(ev, &ws);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for w in ws.iter_mut() {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(w.child.id() as i32, libc::SIGCONT) };
        let _ = w.child.kill();
        let _ = w.child.wait();
    }

    // Writes: each server's final region against the acknowledged writes to that incarnation.
    let mut writes_checked = 0u64;
    for (server, (inc, values)) in &t.regions {
        let client = (server + PROCS - 1) % PROCS;
        let Some(want) = t.acked.get(&(client, *inc)) else {
            continue;
        };
        if values.len() != SLOTS {
            t.violations
                .push(format!("rank {server}: a region of {} slots", values.len()));
            continue;
        }
        for (slot, (&v, &w)) in values.iter().zip(want).enumerate() {
            if w == 0 {
                continue; // nothing acknowledged into this slot of this incarnation
            }
            writes_checked += 1;
            if v < w {
                t.violations.push(format!(
                    "rank {server} slot {slot}: {v}, but the write of {w} was acknowledged"
                ));
            }
        }
    }
    if t.regions.len() < PROCS {
        t.violations.push(format!(
            "only {} of {PROCS} regions came back",
            t.regions.len()
        ));
    }
    // Link cuts: from CUT_SETTLE into each cut until its end, the streams crossing the link
    // (1 -> 2 and 2 -> 0) delivered at most CUT_SLACK messages, by their servers' clocks.
    let settle = CUT_SETTLE.as_nanos() as u64;
    let mut cuts_checked = 0;
    for &(from, to) in &cuts {
        let judged_from = from + settle;
        if to == u64::MAX || to < judged_from + settle {
            continue; // still cut when the run stopped, or too short to judge
        }
        cuts_checked += 1;
        for stream in [1, 2] {
            let reports = &t.reports[stream];
            let base = reports
                .iter()
                .filter(|r| r.0 <= judged_from)
                .max_by_key(|r| r.0)
                .map_or(0, |r| r.1);
            let top = reports
                .iter()
                .filter(|r| r.0 > judged_from && r.0 <= to)
                .map(|r| r.1)
                .max()
                .unwrap_or(base);
            if top > base + CUT_SLACK {
                t.violations.push(format!(
                    "stream {stream} delivered {} messages during a {} ms link cut",
                    top - base,
                    (to - from) / 1_000_000
                ));
            }
        }
    }
    // Memory and descriptors, for incarnations that lived through the second half.
    let half = start + Duration::from_secs(seconds / 2);
    let mut flat_checked = 0;
    for (r, w) in ws.iter().enumerate() {
        if w.born > start + Duration::from_secs(seconds / 4) {
            continue;
        }
        let mid = w.samples.iter().find(|s| s.0 >= half);
        let last = w.samples.last();
        if let (Some(m), Some(l)) = (mid, last) {
            flat_checked += 1;
            if l.1 > m.1 + m.1 / 4 + 4096 || l.2 > m.2 + 8 {
                t.violations.push(format!(
                    "rank {r}: RSS {} KiB and {} fds at half time, {} KiB and {} fds at the end",
                    m.1, m.2, l.1, l.2
                ));
            }
            println!(
                "rank {r} (incarnation {}): RSS {} -> {} KiB, fds {} -> {}",
                w.inc, m.1, l.1, m.2, l.2
            );
        }
    }
    let total: u64 = t.delivered.iter().sum();
    let mut f: Vec<_> = faults.into_iter().collect();
    f.sort();
    println!(
        "soak: {seconds} s, seed {seed}, {}; faults {f:?}; messages delivered exactly once: {total} \
         (per stream {:?}); acknowledged writes checked: {writes_checked}; \
         incarnations checked for flat RSS/fds: {flat_checked}; \
         link cuts checked to partition: {cuts_checked}",
        if net.link.is_some() {
            "in two network namespaces joined by a veth pair"
        } else {
            "on loopback"
        },
        t.delivered
    );
    if total < 1000 {
        t.violations
            .push(format!("only {total} messages delivered"));
    }
    if t.violations.is_empty() {
        println!("soak: every check held");
        0
    } else {
        for v in &t.violations {
            println!("soak VIOLATION: {v}");
        }
        1
    }
}

/// What the workers reported.
#[derive(Default)]
struct Tally {
    /// Per stream (client rank r → server r+1): the highest DELIVERED reported.
    delivered: [u64; PROCS],
    /// Per stream: every DELIVERED report, as (the server's `mono_ns`, next).
    reports: [Vec<(u64, u64)>; PROCS],
    /// Per (client rank, server incarnation): the largest value acknowledged into each slot.
    acked: HashMap<(usize, u64), [u64; SLOTS]>,
    /// Per server rank: its incarnation and its region at the dump.
    regions: HashMap<usize, (u64, Vec<u64>)>,
    /// Per rank: its client side stopped sending.
    done: [bool; PROCS],
    violations: Vec<String>,
}

impl Tally {
    /// Takes in one worker's line (see `worker`).
    fn take(&mut self, ev: Event, ws: &[Worker]) {
        let Event::Line(rank, inc, line) = ev else {
            return;
        };
        if ws[rank].inc != inc {
            return; // a killed incarnation's last words
        }
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match w.first().copied() {
            // DELIVERED <next> <mono_ns>: rank's server side held every message below next at
            // that instant.
            Some("DELIVERED") => {
                let stream = (rank + PROCS - 1) % PROCS;
                if num(1) < self.delivered[stream] {
                    self.violations.push(format!(
                        "stream {stream}: delivered went back from {} to {}",
                        self.delivered[stream],
                        num(1)
                    ));
                }
                self.delivered[stream] = self.delivered[stream].max(num(1));
                self.reports[stream].push((num(2), num(1)));
            }
            // ACKED <server incarnation> <slot> <value>: that write completed.
            Some("ACKED") => {
                let e = self.acked.entry((rank, num(1))).or_insert([0; SLOTS]);
                let slot = num(2) as usize % SLOTS;
                e[slot] = e[slot].max(num(3));
            }
            Some("REGION") => {
                let values = w[1..].iter().filter_map(|v| v.parse().ok()).collect();
                self.regions.insert(rank, (inc, values));
            }
            Some("SENDER-DONE") => self.done[rank] = true,
            Some("VIOLATION") => self.violations.push(format!("rank {rank}: {line}")),
            _ => {}
        }
    }
}

/// (RSS in KiB, open descriptors) of a process.
fn sample(pid: u32) -> Option<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    Some((rss, fds))
}

/// PROCS consecutive free TCP ports on 127.0.0.1.
fn free_ports() -> u16 {
    let first = 20_000 + (std::process::id() % 2000) as u16 * 17;
    (0..2000u16)
        .map(|i| 20_000 + (first - 20_000 + i * 17) % 40_000)
        .find(|&b| {
            (0..PROCS as u16).all(|k| std::net::TcpListener::bind(("127.0.0.1", b + k)).is_ok())
        })
        .expect("free ports")
}

mod worker {
    //! One worker: serves the previous rank, drives the next (see the crate docs).

    use std::cell::Cell;
    use std::rc::Rc;

    use barewire::engine::{spawn_local, time, Runtime};
    use barewire::{Align, ChannelOptions, Endpoint, Node, Region};

    use super::*;

    static FINAL: AtomicBool = AtomicBool::new(false);

    /// The deliberate defect this worker has, if any (see `--break`).
    fn broken(what: &str) -> bool {
        std::env::var("BAREWIRE_SOAK_BREAK").is_ok_and(|b| b == what)
    }
    static DUMP: AtomicBool = AtomicBool::new(false);

    const OPTS: ChannelOptions = ChannelOptions::new(256, 16);

    pub fn main(args: &[String]) {
        // RANK only names the process (in `ps`); the addresses say where it stands.
        const USAGE: &str = "worker RANK INC RESUME LISTEN-ADDR NEXT-ADDR [NETNS]";
        if let Some(ns) = args.get(5) {
            enter_netns(ns);
        }
        let n = |i: usize| -> u64 { args[i].parse().expect(USAGE) };
        let (inc, resume) = (n(1), n(2));
        let addr = |i: usize| -> std::net::SocketAddr { args[i].parse().expect(USAGE) };
        let (listen, to) = (addr(3), addr(4));
        let resume = if broken("resume-zero") { 0 } else { resume };
        std::thread::spawn(|| {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref() {
                    Ok("final") => FINAL.store(true, Ordering::SeqCst),
                    Ok("dump") => DUMP.store(true, Ordering::SeqCst),
                    _ => return,
                }
            }
        });
        let rt = Runtime::builder().cores(1).sleeping().build().unwrap();
        rt.block_on(async move {
            let node = Rc::new(Node::soft().unwrap());
            node.listen(listen).expect("listen");
            let region = Rc::new(node.region::<u64>(SLOTS, Align::CacheLine).unwrap());
            let next = Rc::new(Cell::new(resume));
            spawn_local(serve(node.clone(), region.clone(), next.clone(), inc));
            spawn_local(drive(node.clone(), to, inc));
            let mut leaked = Vec::new();
            let mut tick = Instant::now();
            while !DUMP.load(Ordering::SeqCst) {
                time::sleep(Duration::from_millis(20)).await;
                if broken("leak") && tick.elapsed() >= Duration::from_secs(1) {
                    tick = Instant::now();
                    leaked.push(vec![1u8; 2 << 20]);
                }
            }
            if broken("lost-write") {
                region.set(5, 0);
            }
            let values: Vec<String> = region.to_vec().iter().map(u64::to_string).collect();
            say(&format!("DELIVERED {} {}", next.get(), mono_ns()));
            say(&format!("REGION {}", values.join(" ")));
        });
    }

    /// Moves this process into the named network namespace. Called first thing, while the
    /// process has one thread: `setns` moves only the calling thread, and every thread made
    /// later inherits its namespace.
    fn enter_netns(name: &str) {
        use std::os::fd::AsRawFd;
        let ns = std::fs::File::open(format!("/run/netns/{name}"))
            .unwrap_or_else(|e| panic!("network namespace {name}: {e}"));
        // SAFETY: `ns` is an open descriptor of a network namespace, alive for the call.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "entering network namespace {name}: {}",
            std::io::Error::last_os_error()
        );
    }

    fn say(line: &str) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }

    /// Accepts the previous rank, again after each failure; the newest connection wins.
    async fn serve(node: Rc<Node>, region: Rc<Region<u64>>, next: Rc<Cell<u64>>, inc: u64) {
        let generation = Rc::new(Cell::new(0u64));
        loop {
            let Ok(ep) = node.accept().await else {
                continue;
            };
            let g = generation.get() + 1;
            generation.set(g);
            let (region, next, generation) = (region.clone(), next.clone(), generation.clone());
            spawn_local(async move {
                let _ = receive(ep, &region, &next, inc, || generation.get() == g).await;
            });
        }
    }

    async fn receive(
        ep: Endpoint,
        region: &Region<u64>,
        next: &Cell<u64>,
        inc: u64,
        current: impl Fn() -> bool,
    ) -> barewire::Result<()> {
        ep.send_region(region).await?;
        let (tx, rx) = ep.open_channel::<[u64; 2]>(OPTS).await?;
        tx.send(&[next.get(), inc]).await?;
        tx.flush().await?;
        let mut said = Instant::now();
        let mut reported = u64::MAX;
        loop {
            let got = time::timeout(Duration::from_millis(100), rx.recv()).await;
            if !current() {
                return Ok(()); // a newer connection from the same client took over
            }
            if let Ok(m) = got {
                let [seq, check] = m?;
                if check != mix(seq) || seq != next.get() {
                    say(&format!(
                        "VIOLATION expected message {} got {seq} (checksum {})",
                        next.get(),
                        if check == mix(seq) { "ok" } else { "bad" }
                    ));
                    std::process::exit(3);
                }
                next.set(seq + 1);
            }
            if next.get() != reported && said.elapsed() >= Duration::from_millis(50) {
                reported = next.get();
                said = Instant::now();
                say(&format!("DELIVERED {reported} {}", mono_ns()));
            }
        }
    }

    /// Connects to the next rank and sends to it until told to stop, reconnecting after
    /// each failure.
    async fn drive(node: Rc<Node>, to: std::net::SocketAddr, inc: u64) {
        // Written values only grow: this incarnation in the high bits, a counter below.
        let written = Cell::new(inc << 40);
        while !FINAL.load(Ordering::SeqCst) {
            if let Ok(Ok(ep)) = time::timeout(Duration::from_secs(2), node.connect(to)).await {
                let _ = send(ep, &written).await;
            }
            time::sleep(Duration::from_millis(50)).await;
        }
        say("SENDER-DONE");
    }

    async fn send(ep: Endpoint, written: &Cell<u64>) -> barewire::Result<()> {
        ep.set_handshake_timeout(Some(Duration::from_secs(2)));
        let remote = ep.recv_region::<u64>().await?;
        let (tx, rx) = ep.open_channel::<[u64; 2]>(OPTS).await?;
        let [mut seq, server_inc] = time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .map_err(|_| barewire::Error::Timeout("the resume point".into()))??;
        while !FINAL.load(Ordering::SeqCst) {
            for _ in 0..64 {
                tx.send(&[seq, mix(seq)]).await?;
                seq += 1;
            }
            if broken("dup") && seq % 100_000 < 64 {
                tx.send(&[seq - 1, mix(seq - 1)]).await?;
            }
            tx.flush().await?;
            // One WRITE per batch, into the next slot round robin.
            let v = written.get() + 1;
            written.set(v);
            let slot = v % SLOTS as u64;
            ep.write(&remote, slot, v).await?;
            say(&format!("ACKED {server_inc} {slot} {v}"));
        }
        Ok(())
    }
}
