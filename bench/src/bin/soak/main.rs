//! barewire-soak: a mixed workload across three processes on loopback for a given time, with
//! random faults, checking that nothing acknowledged is lost, nothing is delivered twice, and
//! memory and descriptors stay flat.
//!
//! ```text
//! barewire-soak [--seconds 120] [--seed N] [--fault-every-ms 4000] [--net netns|loopback|auto]
//!               [--driver soft|shm|auto] [--faults kill,stop,cut,long-cut] [--break WHAT]
//! ```
//!
//! `--driver` picks the workers' transport: the software provider (the default), shm (all
//! three through shared memory; needs `--net loopback`, since shm does not cross network
//! namespaces), or `auto` (shm between workers in one namespace, soft across the link).
//!
//! `--break` runs a deliberately broken worker, to show that each check catches what it is
//! for (`tests/soak.rs`): `dup` (a client sends one message twice), `lost-write` (every server
//! loses an acknowledged write before the dump), `leak` (every worker leaks 2 MiB a second),
//! `resume-zero` (a restarted server forgets where to resume), `fake-cut` (a link cut that
//! leaves the link up), `no-keepalive` (workers without a keepalive), `dsm-no-lock` (shared
//! objects updated without the lock protocol: `Broken::NoLock`), `actor-double` (the counter
//! actor applies each message twice).
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
//! and shorter cuts are ridden out by TCP), or, one cut in three, for 4 to 5.5 s: longer than
//! the workers' 2 s keepalive, so that a server waiting on a stream across the link, which
//! has nothing outstanding, must hear that its connection is gone before the link comes back
//! (`--break no-keepalive` shows the check catches a worker without it). Faults stop 8 s
//! before the end. It samples each worker's RSS and open descriptors every second; for every
//! incarnation that lived through the whole second half, the last sample may exceed the one
//! at the half-way point by at most 25% + 4 MiB of RSS and 8 descriptors. Exit status 0 only when every check
//! held; the summary says what ran and what held.
//!
//! **Distributed shared memory and actors, in rounds.** A mesh cannot take back a member
//! that was killed, so these run in rounds of up to 5 s, each on a mesh made for it (a fresh
//! `Node` and port on every worker, dropped after the round, so the RSS and descriptor check
//! also sees whether dropping them frees everything). In a round every worker runs random
//! operations on every member's objects, one at a time: `fetch_add(h, 1)` on a `u64`
//! `SharedMemory`, `update(h, +1)` on a 64-byte one (its words derive from the counter, so a
//! torn value shows), and `ask(+1)` to the counter actor registered on each member's
//! `ActorSystem`. A client announces each operation (in blocks of 16) before issuing it and
//! reports those that succeeded; it stops at the first failure, as faults make them. When the
//! round ends and every member has stopped, each reads its own three values. For every
//! member that lived through the round, each value must be at least the number of its
//! operations that succeeded (nothing acknowledged lost) and at most the number announced
//! (nothing applied twice); a failed operation may or may not have taken effect. A round in
//! which some member did not stop in time is not judged; the summary counts both.

mod net;
mod rounds;
mod worker;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};

use net::Net;
use rounds::{Phase, Round, RoundSeen, RoundsSummary, ROUND_TIME};

/// A link cut is checked to be a partition from this long after it began (what was past the
/// link when it went down, at most a channel ring of 256 messages, may still arrive) ...
const CUT_SETTLE: Duration = Duration::from_millis(500);
/// ... by how many messages a stream crossing the link delivered from then until the link came
/// up, as its server reported them with its own clock: at most this many (two rings).
const CUT_SLACK: u64 = 512;

/// The workers' keepalive (`DriverConfig::keepalive`): a connection that hears nothing from
/// the peer's host for this long fails, idle or not.
const KEEPALIVE: Duration = Duration::from_secs(2);
/// A server whose stream crossed the link, and that was delivering when the link went down,
/// must hear that its connection is gone within this long of the cut (the keepalive, plus one
/// probe interval of the kernel's, 1 s, plus the report's own way), not when the link comes
/// back up. Only cuts that outlast it by half a second are judged: a third of the cuts are
/// long ones, 4 to 5.5 s.
const HEARD_WITHIN: Duration = Duration::from_millis(3500);
/// ... and "delivering" means a report this recent before the cut.
const LIVE_BEFORE: Duration = Duration::from_millis(300);

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

/// Kinds of operation in the rounds: 0 DSM `fetch_add` on a word, 1 DSM `update` (+1) of a
/// wide object, 2 actor `ask` (+1) of a counter.
const KINDS: usize = 3;

/// A wide shared object whose every word derives from one counter, so that a torn one shows.
type Wide = [u64; 8];

fn wide_of(v: u64) -> Wide {
    std::array::from_fn(|i| if i == 0 { v } else { mix(v ^ (i as u64) << 56) })
}

/// The counter a wide object holds, if it is whole.
fn wide_value(w: &Wide) -> Option<u64> {
    (*w == wide_of(w[0])).then_some(w[0])
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

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "barewire-soak",
    about = "Three processes, channels, one-sided writes, DSM and actors under random faults"
)]
struct Cli {
    /// How long to run.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    /// The seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Mean time between faults.
    #[arg(long, default_value_t = 4000, value_parser = clap::value_parser!(u64).range(1..))]
    fault_every_ms: u64,
    /// Where the workers talk: two network namespaces joined by a veth pair (link cuts
    /// possible; needs root), plain loopback, or namespaces where they can be made.
    #[arg(long, value_enum, default_value = "netns")]
    net: NetName,
    /// The workers' transport (shm needs `--net loopback`).
    #[arg(long, value_enum, default_value = "soft")]
    driver: DriverName,
    /// The kinds of fault to draw from, each equally likely: `kill` (SIGKILL and a restart),
    /// `stop` (SIGSTOP, then SIGCONT), `cut` (the link down for 0.3 to 3 s, or one in three
    /// for 4 to 5.5 s), `long-cut` (always 4 to 5.5 s). Cuts need `--net netns`.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values = ["kill", "stop", "cut"]
    )]
    faults: Vec<FaultKind>,
    /// Run a deliberately broken worker (each check must catch its own).
    #[arg(long = "break", value_enum, value_name = "WHAT")]
    broken: Option<BreakName>,
    #[command(subcommand)]
    sub: Option<Sub>,
}

#[derive(Debug, Subcommand)]
enum Sub {
    /// One worker, as the supervisor starts it.
    #[command(hide = true)]
    Worker(worker::Args),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NetName {
    Netns,
    Loopback,
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DriverName {
    Soft,
    Shm,
    Auto,
}

/// One kind of fault the supervisor injects (see `--faults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FaultKind {
    Kill,
    Stop,
    Cut,
    LongCut,
}

impl FaultKind {
    /// The link goes down (needs the network namespaces).
    fn is_cut(self) -> bool {
        matches!(self, FaultKind::Cut | FaultKind::LongCut)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BreakName {
    Dup,
    LostWrite,
    Leak,
    ResumeZero,
    FakeCut,
    NoKeepalive,
    DsmNoLock,
    ActorDouble,
}

fn main() {
    let cli = Cli::parse();
    if let Some(Sub::Worker(args)) = cli.sub {
        worker::main(args);
        return;
    }
    let (seconds, seed, every) = (cli.seconds, cli.seed, cli.fault_every_ms);
    if cli.driver == DriverName::Shm && cli.net != NetName::Loopback {
        eprintln!(
            "barewire-soak: --driver shm needs --net loopback (shm does not cross network \
             namespaces; --driver auto uses it where it can)"
        );
        std::process::exit(2);
    }
    let driver = cli
        .driver
        .to_possible_value()
        .expect("every variant has a name")
        .get_name()
        .to_string();
    // Read by the workers this process starts.
    std::env::set_var("BAREWIRE_SOAK_DRIVER", &driver);
    println!("soak: driver {driver}");
    let net = match cli.net {
        NetName::Loopback => Net::loopback(),
        want => match Net::namespaces() {
            Ok(net) => net,
            Err(e) if want == NetName::Auto => {
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
    };
    if let Some(b) = cli.broken {
        let b = b
            .to_possible_value()
            .expect("every variant has a name")
            .get_name()
            .to_string();
        // Read by the workers this process starts.
        std::env::set_var("BAREWIRE_SOAK_BREAK", &b);
    }
    if net.link.is_none() && cli.faults.iter().all(|f| f.is_cut()) {
        eprintln!(
            "barewire-soak: --faults names only link cuts, and on loopback there is no link \
             to cut (--net netns makes one; it needs root)"
        );
        std::process::exit(2);
    }
    let status = supervise(&net, seconds, seed, every, &cli.faults);
    drop(net);
    std::process::exit(status);
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
fn supervise(net: &Net, seconds: u64, seed: u64, every_ms: u64, kinds: &[FaultKind]) -> i32 {
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
    // Every stop, as (rank, from, to), and every kill, as (rank, when), in `mono_ns`.
    let mut stops: Vec<(usize, u64, u64)> = Vec::new();
    let mut kills: Vec<(usize, u64)> = Vec::new();
    let mut faults: HashMap<&str, u32> = HashMap::new();
    let mut t = Tally::default();
    let mut finishing = false;
    let mut final_sent = false;
    let mut round: Option<Round> = None;
    let mut next_round = start + Duration::from_secs(1);
    let mut rounds = RoundsSummary::default();
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
            // The cut is judged from after the link went down to before it comes up.
            if let Some(c) = cuts.last_mut() {
                c.1 = mono_ns();
            }
            net.cut(false);
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
            let kind = kinds[rand(kinds.len() as u64) as usize];
            if kind.is_cut() && net.link.is_some() {
                if cut_until.is_none() && net.cut(true) {
                    let ms = if kind == FaultKind::LongCut || rand(3) == 0 {
                        4000 + rand(1500)
                    } else {
                        300 + rand(2700)
                    };
                    cut_until = Some(now + Duration::from_millis(ms));
                    cuts.push((mono_ns(), u64::MAX));
                    *faults.entry("link cut").or_default() += 1;
                }
            } else if stopped.iter().all(|s| s.0 != r) {
                // Rank 0 is only ever stopped, so that one process lives through the whole run
                // for the RSS and descriptor check.
                if kind == FaultKind::Kill && r != 0 {
                    kills.push((r, mono_ns()));
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
                    let ms = 300 + rand(1700);
                    stopped.push((r, now + Duration::from_millis(ms)));
                    let at = mono_ns();
                    stops.push((r, at, at + ms * 1_000_000));
                    *faults.entry("stop and continue").or_default() += 1;
                }
            }
        }
        // The DSM and actor rounds (see the crate docs).
        let alive = |ws: &[Worker], incs: &[u64; PROCS], rank: usize| ws[rank].inc == incs[rank];
        match &mut round {
            None if now >= next_round && now + ROUND_TIME * 3 < end => {
                let r = rounds.started + 1;
                rounds.started = r;
                let addrs = net.mesh_addrs(r);
                for w in ws.iter_mut() {
                    let _ = writeln!(w.stdin, "ROUND START {r} {addrs}");
                }
                round = Some(Round {
                    r,
                    phase: Phase::Running,
                    since: now,
                    incs: std::array::from_fn(|i| ws[i].inc),
                });
            }
            Some(rd) => {
                let seen = t.rounds.entry(rd.r).or_default();
                let all = |f: &dyn Fn(usize) -> bool| (0..PROCS).all(f);
                match rd.phase {
                    Phase::Running => {
                        let over = all(&|i| !alive(&ws, &rd.incs, i) || seen.stopped[i]);
                        if over || now >= rd.since + ROUND_TIME {
                            for w in ws.iter_mut() {
                                let _ = writeln!(w.stdin, "ROUND END {}", rd.r);
                            }
                            rd.phase = Phase::Ending;
                            rd.since = now;
                        }
                    }
                    Phase::Ending => {
                        let stopped = all(&|i| !alive(&ws, &rd.incs, i) || seen.stopped[i]);
                        if stopped || now >= rd.since + ROUND_TIME * 2 {
                            // Values are read only once no operation can still be issued: a
                            // round where some member did not stop in time is not judged.
                            seen.judged = stopped;
                            for w in ws.iter_mut() {
                                let _ = writeln!(w.stdin, "ROUND READ {}", rd.r);
                            }
                            rd.phase = Phase::Reading;
                            rd.since = now;
                        }
                    }
                    Phase::Reading => {
                        let read = all(&|i| !alive(&ws, &rd.incs, i) || seen.values[i].is_some());
                        if read || now >= rd.since + ROUND_TIME {
                            let seen = t.rounds.remove(&rd.r).unwrap_or_default();
                            let alive: [bool; PROCS] =
                                std::array::from_fn(|i| alive(&ws, &rd.incs, i));
                            rounds.judge(rd.r, &seen, alive, &mut t.violations);
                            round = None;
                            next_round = now + Duration::from_millis(200);
                        }
                    }
                }
            }
            None => {}
        }
        if now >= end && !finishing {
            if cut_until.take().is_some() {
                if let Some(c) = cuts.last_mut() {
                    c.1 = mono_ns();
                }
                net.cut(false);
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
                let when: Vec<String> = reports
                    .iter()
                    .filter(|r| r.0 + 2_000_000_000 > from && r.0 < to + 1_000_000_000)
                    .map(|r| format!("{:+}ms:{}", (r.0 as i64 - from as i64) / 1_000_000, r.1))
                    .collect();
                t.violations.push(format!(
                    "stream {stream} delivered {} messages during a {} ms link cut \
                     (reports by time since the cut: {})",
                    top - base,
                    (to - from) / 1_000_000,
                    when.join(" ")
                ));
            }
        }
    }
    // Long cuts: each server of a stream across the link that was delivering when the link
    // went down (and was neither stopped nor killed around then) heard that its connection
    // was gone within HEARD_WITHIN, before the link came back.
    let (heard, live) = (
        HEARD_WITHIN.as_nanos() as u64,
        LIVE_BEFORE.as_nanos() as u64,
    );
    let mut long_cuts_checked = 0;
    for &(from, to) in &cuts {
        if to == u64::MAX || to < from + heard + settle {
            continue; // still cut when the run stopped, or not long enough to judge
        }
        for stream in [1, 2] {
            let server = (stream + 1) % PROCS;
            let Some(last) = t.reports[stream]
                .iter()
                .map(|r| r.0)
                .filter(|&at| at <= from && at + live >= from)
                .max()
            else {
                continue; // not delivering when the link went down
            };
            let around = |a: u64, b: u64| a < from + heard && b + live >= from;
            if stops.iter().any(|&(r, a, b)| r == server && around(a, b))
                || kills.iter().any(|&(r, at)| r == server && around(at, at))
            {
                continue; // its server was stopped or killed meanwhile
            }
            long_cuts_checked += 1;
            if !t.failed[stream]
                .iter()
                .any(|&at| at > last && at <= from + heard)
            {
                let said: Vec<String> = t.failed[stream]
                    .iter()
                    .filter(|&&at| at + 2_000_000_000 > from && at < to + 2_000_000_000)
                    .map(|&at| format!("{:+}ms", (at as i64 - from as i64) / 1_000_000))
                    .collect();
                t.violations.push(format!(
                    "stream {stream}: its server (rank {server}) was delivering when the link \
                     went down for {} ms, and did not hear that its connection was gone within \
                     {} ms (keepalive {KEEPALIVE:?}; failures it reported, by time since the \
                     cut: [{}])",
                    (to - from) / 1_000_000,
                    heard / 1_000_000,
                    said.join(" ")
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
    if seconds >= 60 && rounds.judged == 0 {
        t.violations
            .push("no DSM and actor round could be judged".to_string());
    }
    println!("{}", rounds.line());
    let total: u64 = t.delivered.iter().sum();
    let mut f: Vec<_> = faults.into_iter().collect();
    f.sort();
    println!(
        "soak: {seconds} s, seed {seed}, {}; faults {f:?}; messages delivered exactly once: {total} \
         (per stream {:?}); acknowledged writes checked: {writes_checked}; \
         incarnations checked for flat RSS/fds: {flat_checked}; \
         link cuts checked to partition: {cuts_checked}; \
         waiting servers checked to hear of a long cut: {long_cuts_checked}",
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
    /// Per stream: when its server said the connection it served failed (`mono_ns`).
    failed: [Vec<u64>; PROCS],
    /// Per (client rank, server incarnation): the largest value acknowledged into each slot.
    acked: HashMap<(usize, u64), [u64; SLOTS]>,
    /// Per server rank: its incarnation and its region at the dump.
    regions: HashMap<usize, (u64, Vec<u64>)>,
    /// Per rank: its client side stopped sending.
    done: [bool; PROCS],
    /// What the workers said about each DSM and actor round not yet judged.
    rounds: HashMap<u64, RoundSeen>,
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
            // RECV-FAILED <mono_ns>: rank's server side saw its connection fail.
            Some("RECV-FAILED") => {
                let stream = (rank + PROCS - 1) % PROCS;
                self.failed[stream].push(num(1));
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
            Some("ROUND") => {
                let seen = self.rounds.entry(num(2)).or_default();
                match w.get(1).copied() {
                    Some("UP") => seen.up[rank] = true,
                    Some("NOTFORMED") => {
                        let why = w.get(3..).map_or(String::new(), |r| r.join(" "));
                        seen.why.push(format!("rank {rank}: not formed: {why}"));
                    }
                    Some("STOPPED") => {
                        seen.stopped[rank] = true;
                        seen.why.push(format!("rank {rank}: {}", w[3..].join(" ")));
                    }
                    // ANNOUNCED r home kind n: this client issues at most n of those.
                    Some("ANNOUNCED") => {
                        let (h, k) = (num(3) as usize % PROCS, num(4) as usize % KINDS);
                        let a = &mut seen.announced[rank][h][k];
                        *a = (*a).max(num(5));
                    }
                    // ACKED r home a0 a1 a2: this many of each kind succeeded.
                    Some("ACKED") => {
                        let h = num(3) as usize % PROCS;
                        for k in 0..KINDS {
                            let a = &mut seen.acked[rank][h][k];
                            *a = (*a).max(num(4 + k));
                        }
                    }
                    // VALUES r word wide count | VALUES r none ...
                    Some("VALUES") => {
                        seen.values[rank] = Some(
                            (w.get(3) != Some(&"none"))
                                .then(|| std::array::from_fn(|k| num(3 + k))),
                        );
                    }
                    _ => {}
                }
            }
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
