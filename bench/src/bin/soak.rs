//! barewire-soak: a mixed workload across three processes on loopback for a given time, with
//! random faults, checking that nothing acknowledged is lost, nothing is delivered twice, and
//! memory and descriptors stay flat.
//!
//! ```text
//! barewire-soak [--seconds 120] [--seed N] [--fault-every-ms 4000] [--break WHAT]
//! ```
//!
//! `--break` runs a deliberately broken worker, to show that each check catches what it is
//! for (`tests/soak.rs`): `dup` (a client sends one message twice), `lost-write` (every server
//! loses an acknowledged write before the dump), `leak` (every worker leaks 2 MiB a second),
//! `resume-zero` (a restarted server forgets where to resume).
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
//! The supervisor injects a fault every `--fault-every-ms` on average (seeded): SIGKILL and a
//! restart (never rank 0, which therefore lives through the whole run), or SIGSTOP for up to
//! 2 s and SIGCONT. Faults stop 8 s before the end. It samples
//! each worker's RSS and open descriptors every second; for every incarnation that lived
//! through the whole second half, the last sample may exceed the one at the half-way point
//! by at most 25% + 4 MiB of RSS and 8 descriptors. Exit status 0 only when every check
//! held; the summary says what ran and what held.
//!
//! Not yet in the mix: DSM, actors, and link cuts in a network namespace (see the issue).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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
    if let Some(b) = barewire_bench::flag(&args, "--break") {
        assert!(
            ["dup", "lost-write", "leak", "resume-zero"].contains(&b),
            "--break dup, lost-write, leak or resume-zero"
        );
        // Read by the workers this process starts.
        std::env::set_var("BAREWIRE_SOAK_BREAK", b);
    }
    std::process::exit(supervise(seconds, seed, every));
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
fn supervise(seconds: u64, seed: u64, every_ms: u64) -> i32 {
    let base = free_ports();
    let (tx, rx) = mpsc::channel::<Event>();
    let exe = std::env::current_exe().expect("own path");
    // Per stream (client rank r → server r+1): where the server resumes after a restart.
    let mut resume = [0u64; PROCS];
    let spawn = |rank: usize, inc: u64, resume: u64, tx: &mpsc::Sender<Event>| -> Worker {
        let mut child = Command::new(&exe)
            .args([
                "worker",
                &rank.to_string(),
                &base.to_string(),
                &inc.to_string(),
            ])
            .arg(resume.to_string())
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
            if stopped.iter().all(|s| s.0 != r) {
                // Rank 0 is only ever stopped, so that one process lives through the whole run
                // for the RSS and descriptor check.
                if rand(2) == 0 && r != 0 {
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
        "soak: {seconds} s, seed {seed}; faults {f:?}; messages delivered exactly once: {total} \
         (per stream {:?}); acknowledged writes checked: {writes_checked}; \
         incarnations checked for flat RSS/fds: {flat_checked}",
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
            // DELIVERED <next>: rank's server side holds every message below next.
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
        let n = |i: usize| -> u64 { args[i].parse().expect("worker RANK BASE INC RESUME") };
        let (rank, base, inc, resume) = (n(0) as usize, n(1) as u16, n(2), n(3));
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
            node.listen(([127, 0, 0, 1], base + rank as u16).into())
                .expect("listen");
            let region = Rc::new(node.region::<u64>(SLOTS, Align::CacheLine).unwrap());
            let next = Rc::new(Cell::new(resume));
            spawn_local(serve(node.clone(), region.clone(), next.clone(), inc));
            let to = ([127, 0, 0, 1], base + ((rank + 1) % PROCS) as u16).into();
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
            say(&format!("DELIVERED {}", next.get()));
            say(&format!("REGION {}", values.join(" ")));
        });
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
                say(&format!("DELIVERED {reported}"));
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
