//! Linearizability of distributed shared memory, checked on histories of real multi-process
//! runs: three `barewire-dsm-node` processes on loopback (the software provider), four
//! concurrent clients each, a mix of reads, writes, updates, fetch-adds and compare-and-swaps
//! on six wide (64-byte) and six word keys, over 10,000 operations per run. Each key's history
//! is checked against a sequential register by a linearizability search of our own (below):
//! a just-in-time search over configurations (Lowe, "Testing for linearizability", 2017),
//! memoized, so its cost follows the configurations the history allows, not the orders it tries.
//! stateright's tester, used before, searches orders without memoizing; on histories of the
//! shared-memory backend (short calls, several overlapping on each key) it ran for minutes on
//! histories that are linearizable.
//!
//! The same runs with faults: a process SIGKILLed while its clients hold locks, one SIGSTOPped
//! for several leases and resumed, and one whose network-namespace link is cut. The faulty
//! process first stops itself inside a wide update, holding its lock (`barewire-dsm-node
//! --stop-in-updates`), and the fault lands there: a signal sent at a moment of the test's
//! choosing could find it between two calls, holding nothing. Operations
//! whose outcome is unknown (a killed process's last ones, `Indeterminate` ones) stay in flight
//! in the history: the checker may place them anywhere after their invocation, or nowhere.
//!
//! These run in release (`scripts/test.sh`), one at a time: the checker's search is slow
//! unoptimized, and each test runs three busy processes.
//!
//! And the checker itself: the same workload on two deliberately broken variants (updates
//! without a lock; writes in place with no version or check) must be reported as violations.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Member, Netns};
use std::collections::HashSet;

const MEMBERS: usize = 3;

// ---------------------------------------------------------------- the sequential specification

/// One key: a `u64` register with read, write, increment (returns the new value), fetch-add
/// (returns the old) and compare-and-swap (returns the old).
#[derive(Clone, Debug, Default, Hash, PartialEq, Eq)]
struct Register(u64);

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Op {
    Read,
    Write(u64),
    Increment,
    FetchAdd(u64),
    Cas(u64, u64),
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
enum Ret {
    Value(u64),
    Ok,
    /// A read that saw fields of two different values: no sequential register returns this.
    Torn,
}

impl Register {
    /// Applies `op` and returns what a sequential register returns for it.
    fn invoke(&mut self, op: &Op) -> Ret {
        match *op {
            Op::Read => Ret::Value(self.0),
            Op::Write(v) => {
                self.0 = v;
                Ret::Ok
            }
            Op::Increment => {
                self.0 = self.0.wrapping_add(1);
                Ret::Value(self.0)
            }
            Op::FetchAdd(d) => {
                let old = self.0;
                self.0 = old.wrapping_add(d);
                Ret::Value(old)
            }
            Op::Cas(expected, new) => {
                let old = self.0;
                if old == expected {
                    self.0 = new;
                }
                Ret::Value(old)
            }
        }
    }
}

// ---------------------------------------------------------------- histories

/// One operation as recorded: who, on which key, what, when invoked, and how it returned (none:
/// still in flight when its process died, or its outcome is unknown).
#[derive(Debug, Clone)]
struct Call {
    thread: u64,
    key: (char, u64),
    op: Op,
    invoked: u64,
    returned: Option<(u64, Ret)>,
}

/// Reads every member's history file. Calls that failed without effect (`X`) are left out.
fn read_histories(files: &[PathBuf]) -> Vec<Call> {
    let mut calls = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let mut open: HashMap<u64, Call> = HashMap::new();
        for line in text.lines() {
            let w: Vec<&str> = line.split(' ').collect();
            let num = |i: usize| -> u64 { w[i].parse().unwrap_or_else(|_| panic!("{line:?}")) };
            match w[0] {
                "I" => {
                    let op = match w[4] {
                        "R" => Op::Read,
                        "W" => Op::Write(num(5)),
                        "U" => Op::Increment,
                        "F" => Op::FetchAdd(num(5)),
                        "C" => Op::Cas(num(5), num(6)),
                        o => panic!("op {o}"),
                    };
                    let call = Call {
                        thread: num(1),
                        key: (w[2].chars().next().unwrap(), num(3)),
                        op,
                        invoked: num(7),
                        returned: None,
                    };
                    // A thread with a call still open was a client that went on as a new
                    // thread; the open call stays in flight.
                    if let Some(prev) = open.insert(num(1), call) {
                        calls.push(prev);
                    }
                }
                "R" => {
                    let mut call = open.remove(&num(1)).expect("a return has its invocation");
                    let ret = match w[3] {
                        "V" => Ret::Value(num(4)),
                        "OK" => Ret::Ok,
                        "TORN" => Ret::Torn,
                        r => panic!("ret {r}"),
                    };
                    call.returned = Some((num(2), ret));
                    calls.push(call);
                }
                "X" => {
                    open.remove(&num(1));
                }
                _ if line.is_empty() => {}
                _ => panic!("history line {line:?}"),
            }
        }
        calls.extend(open.into_values());
    }
    calls
}

/// Checks each key's calls for linearizability. Returns the number of calls checked, or the
/// first key whose history is not linearizable.
fn check(calls: &[Call]) -> Result<usize, String> {
    let mut by_key: BTreeMap<(char, u64), Vec<&Call>> = BTreeMap::new();
    for c in calls {
        by_key.entry(c.key).or_default().push(c);
    }
    for (key, calls) in by_key {
        linearizable(&calls).map_err(|e| format!("key {key:?}: {} calls, {e}", calls.len()))?;
    }
    Ok(calls.len())
}

/// The most configurations the search keeps at once before it gives up (a history this
/// ambiguous would take too long to decide; none of the runs here comes near it).
const MAX_CONFIGURATIONS: usize = 1 << 20;

/// Whether one key's calls are linearizable with respect to [`Register`].
///
/// Events are taken in real-time order (an invocation before a return at the same nanosecond:
/// treated as overlapping, the permissive choice). A configuration is the register's value
/// and the calls already linearized but not yet returned. At each return, every configuration
/// is extended by linearizing pending calls, one at a time and each only if the register
/// returns what the call recorded, until the returning call is linearized; configurations that
/// cannot get there are dropped. The history is linearizable if some configuration survives
/// every return. A call that never returned (its process was killed, or its outcome is
/// unknown) stays pending: it may be linearized at any later point, or never.
fn linearizable(calls: &[&Call]) -> Result<(), String> {
    // Every call gets an index; events refer to it.
    let mut events: Vec<(u64, u8, usize)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        events.push((c.invoked, 0, i));
        if let Some((t, _)) = &c.returned {
            events.push((*t, 1, i));
        }
    }
    events.sort_by_key(|&(t, kind, i)| (t, kind, calls[i].thread));
    // (value, linearized-but-not-returned calls, sorted)
    type Config = (Register, Vec<usize>);
    let mut configs: HashSet<Config> = HashSet::from([(Register(0), Vec::new())]);
    let mut pending: Vec<usize> = Vec::new();
    for &(t, kind, i) in &events {
        if kind == 0 {
            pending.push(i);
            continue;
        }
        let mut next = HashSet::new();
        let mut seen: HashSet<Config> = configs.iter().cloned().collect();
        let mut stack: Vec<Config> = configs.into_iter().collect();
        while let Some((reg, lin)) = stack.pop() {
            if let Ok(at) = lin.binary_search(&i) {
                let mut rest = lin;
                rest.remove(at);
                next.insert((reg, rest));
                continue;
            }
            for &j in &pending {
                let Err(at) = lin.binary_search(&j) else {
                    continue;
                };
                let mut r = reg.clone();
                let got = r.invoke(&calls[j].op);
                if matches!(&calls[j].returned, Some((_, want)) if *want != got) {
                    continue;
                }
                let mut l = lin.clone();
                l.insert(at, j);
                if seen.insert((r.clone(), l.clone())) {
                    if seen.len() > MAX_CONFIGURATIONS {
                        return Err(format!(
                            "undecided: over {MAX_CONFIGURATIONS} configurations at t = {t}"
                        ));
                    }
                    stack.push((r, l));
                }
            }
        }
        pending.retain(|&j| j != i);
        if next.is_empty() {
            let c = calls[i];
            return Err(format!(
                "not linearizable: no order explains {:?} returning {:?} (thread {}, t = {t})",
                c.op,
                c.returned.as_ref().map(|r| &r.1),
                c.thread
            ));
        }
        configs = next;
    }
    Ok(())
}

// ---------------------------------------------------------------- runs

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    None,
    /// SIGKILL the last member while it holds a lock.
    Kill,
    /// Three times: the last member stops while it holds a lock, and is sent SIGCONT after this
    /// long.
    Stop(Duration),
    /// Cut the last member's link (it runs in its own network namespace) while it holds a lock.
    Cut,
}

struct Run {
    broken: Option<&'static str>,
    fault: Fault,
    ops: u64,
    hold_us: u64,
    /// Keys homed on the last member are left alone by everyone.
    isolate_victim_home: bool,
    pace_us: u64,
    lease_ms: u64,
}

impl Default for Run {
    fn default() -> Self {
        Run {
            broken: None,
            fault: Fault::None,
            ops: 850,
            hold_us: 0,
            isolate_victim_home: false,
            pace_us: 0,
            lease_ms: 20,
        }
    }
}

/// Times the victim of `Fault::Stop` is stopped.
const STOPS: u64 = 3;

fn spawn(rank: usize, run: &Run, out: &Path, bind: &str, netns: Option<&str>) -> Member {
    let mut args: Vec<String> = [
        ("--rank", rank.to_string()),
        ("--out", out.to_string_lossy().into_owned()),
        ("--bind", bind.to_string()),
        ("--ops", run.ops.to_string()),
        ("--hold-us", run.hold_us.to_string()),
        ("--pace-us", run.pace_us.to_string()),
        ("--lease-ms", run.lease_ms.to_string()),
        ("--seed", std::process::id().to_string()),
    ]
    .into_iter()
    .flat_map(|(k, v)| [k.to_string(), v])
    .collect();
    if let Some(b) = run.broken {
        args.extend(["--broken".into(), b.into()]);
    }
    if run.isolate_victim_home {
        // Nobody touches the faulty member's own keys: its locks are all on the survivors'
        // keys, which the survivors keep working on.
        args.extend(["--skip-home".into(), (MEMBERS - 1).to_string()]);
    }
    // The victim stops itself from inside its wide updates, where it holds a lock (a signal
    // sent from here could land between two calls, where it holds none).
    let stops = match run.fault {
        Fault::Kill | Fault::Cut => 1,
        Fault::Stop(_) => STOPS,
        Fault::None => 0,
    };
    if rank == MEMBERS - 1 && stops > 0 {
        args.extend(["--stop-in-updates".into(), stops.to_string()]);
    }
    Member::spawn(env!("CARGO_BIN_EXE_barewire-dsm-node"), &args, netns)
}

/// What a run left: every call recorded, and per surviving member its `DONE` counters
/// (leases it broke, its commits fenced).
struct Outcome {
    calls: Vec<Call>,
    breaks: Vec<u64>,
    fenced: Vec<u64>,
}

fn counter(line: &str, name: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {line:?}"))
}

/// Runs the workload on three processes, with `run.fault` on the last one.
fn workload(run: &Run) -> Outcome {
    assert!(
        common::driver().is_some(),
        "BAREWIRE_DRIVER={} cannot run here",
        common::driver_name()
    );
    let dir = std::env::temp_dir().join(format!(
        "barewire-dsm-{}-{:?}-{}",
        std::process::id(),
        run.fault,
        run.broken.unwrap_or("ok")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let outs: Vec<PathBuf> = (0..MEMBERS)
        .map(|r| dir.join(format!("{r}.hist")))
        .collect();
    let netns = if run.fault == Fault::Cut {
        Some(Netns::create().expect("a network namespace"))
    } else {
        None
    };
    let victim = MEMBERS - 1;
    let mut members: Vec<Member> = (0..MEMBERS)
        .map(|r| match &netns {
            Some((ns, _, peer)) if r == victim => {
                spawn(r, run, &outs[r], peer, Some(ns.name.as_str()))
            }
            Some((_, host, _)) => spawn(r, run, &outs[r], host, None),
            None => spawn(r, run, &outs[r], "127.0.0.1", None),
        })
        .collect();
    let ip = |r: usize| match &netns {
        Some((_, _, peer)) if r == victim => peer.clone(),
        Some((_, host, _)) => host.clone(),
        None => "127.0.0.1".into(),
    };
    let addrs: Vec<String> = members
        .iter()
        .enumerate()
        .map(|(r, m)| format!("{}:{}", ip(r), m.port()))
        .collect();
    for m in &mut members {
        m.say(&format!("ADDRS {}", addrs.join(" ")));
    }
    for m in &members {
        m.expect("STARTED", Duration::from_secs(20));
    }
    let mut alive = [true; MEMBERS];
    match run.fault {
        Fault::None => {}
        Fault::Kill => {
            // Killed inside a wide update, holding its lock: a kill between two calls would
            // leave nothing to test. (It stops itself there, after its 16th call, mid-run.)
            members[victim].expect_stopped(Duration::from_secs(20));
            members[victim].signal(libc::SIGKILL);
            alive[victim] = false;
        }
        Fault::Stop(d) => {
            for _ in 0..STOPS {
                members[victim].expect_stopped(Duration::from_secs(20));
                std::thread::sleep(d);
                members[victim].signal(libc::SIGCONT);
            }
        }
        Fault::Cut => {
            // Cut while it holds a lock (stopped inside a wide update), then let it go on to
            // a commit that cannot arrive.
            members[victim].expect_stopped(Duration::from_secs(20));
            let veth = &netns.as_ref().unwrap().0.veth;
            assert!(Netns::ip(&["link", "set", veth, "down"]), "link down");
            members[victim].signal(libc::SIGCONT);
        }
    }
    let mut breaks = vec![0; MEMBERS];
    let mut fenced = vec![0; MEMBERS];
    for (r, m) in members.iter().enumerate() {
        if alive[r] {
            let done = m.expect("DONE", Duration::from_secs(90));
            breaks[r] = counter(&done, "breaks");
            fenced[r] = counter(&done, "fenced");
        }
    }
    for m in &mut members {
        m.say("EXIT");
    }
    drop(members);
    let calls = read_histories(&outs);
    if std::env::var_os("BAREWIRE_KEEP_HISTORIES").is_some() {
        eprintln!("histories kept in {}", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Outcome {
        calls,
        breaks,
        fenced,
    }
}

fn completed(calls: &[Call]) -> usize {
    calls.iter().filter(|c| c.returned.is_some()).count()
}

fn in_flight(calls: &[Call]) -> usize {
    calls.iter().filter(|c| c.returned.is_none()).count()
}

// ---------------------------------------------------------------- tests

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "unoptimized, the checker takes minutes: scripts/test.sh runs these in release"
)]
fn histories_of_three_processes_are_linearizable() {
    let t0 = std::time::Instant::now();
    let calls = workload(&Run::default()).calls;
    eprintln!("workload took {:?}", t0.elapsed());
    assert!(completed(&calls) >= 10_000, "{} calls", completed(&calls));
    assert_eq!(in_flight(&calls), 0);
    let t0 = std::time::Instant::now();
    let n = check(&calls).unwrap();
    eprintln!(
        "{n} calls on 12 keys: linearizable (checked in {:?})",
        t0.elapsed()
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "unoptimized, the checker takes minutes: scripts/test.sh runs these in release"
)]
fn a_lock_holder_killed_mid_update_leaves_the_history_linearizable() {
    // The victim is killed inside a wide update on one of the survivors' keys (its own are
    // left alone), early in the run, so its lock is left held while the survivors have most of
    // their calls to go: they meet it, and must break its lease to go on.
    let out = workload(&Run {
        fault: Fault::Kill,
        isolate_victim_home: true,
        hold_us: 100,
        pace_us: 400,
        ops: 1500,
        ..Run::default()
    });
    let calls = &out.calls;
    assert!(in_flight(calls) >= 1, "the kill left no call in flight");
    let broken: u64 = out.breaks[..MEMBERS - 1].iter().sum();
    assert!(broken >= 1, "nobody broke the killed holder's lease");
    let n = check(calls).unwrap();
    eprintln!(
        "{n} calls ({} in flight) with a member killed: linearizable; leases of the killed \
         holder broken by the survivors: {broken}",
        in_flight(calls),
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "unoptimized, the checker takes minutes: scripts/test.sh runs these in release"
)]
fn a_holder_stopped_past_its_lease_is_fenced_and_the_history_linearizable() {
    // The member is stopped three times inside a wide update, holding its lock, for 150 ms:
    // several 20 ms leases each time. Its own keys are left alone, so the others keep running
    // (rather than waiting on its memory) and meet its locks.
    let out = workload(&Run {
        fault: Fault::Stop(Duration::from_millis(150)),
        isolate_victim_home: true,
        hold_us: 100,
        pace_us: 400,
        ops: 1500,
        ..Run::default()
    });
    let survivors_broke: u64 = out.breaks[..MEMBERS - 1].iter().sum();
    assert!(
        survivors_broke >= 1,
        "nobody broke the stopped holder's lease"
    );
    assert!(
        out.fenced[MEMBERS - 1] >= 1,
        "the stopped holder's late commit was never fenced"
    );
    let n = check(&out.calls).unwrap();
    eprintln!(
        "{n} calls with a member stopped 3 x 150 ms (lease 20 ms): linearizable; leases broken \
         {survivors_broke}, its commits fenced {}",
        out.fenced[MEMBERS - 1]
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "unoptimized, the checker takes minutes: scripts/test.sh runs these in release"
)]
fn a_member_cut_off_by_its_link_leaves_the_history_linearizable() {
    if !common::reaches_other_netns("a member cut off by its link") {
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("this test needs root for a network namespace, and CI runs as root");
        }
        eprintln!("SKIP: needs root to create a network namespace");
        return;
    }
    let calls = workload(&Run {
        fault: Fault::Cut,
        hold_us: 100,
        pace_us: 400,
        ops: 1500,
        ..Run::default()
    })
    .calls;
    let n = check(&calls).unwrap();
    eprintln!(
        "{n} calls ({} in flight) with a member cut off: linearizable",
        in_flight(&calls)
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "unoptimized, the checker takes minutes: scripts/test.sh runs these in release"
)]
fn the_checker_catches_lost_updates_of_an_unlocked_variant() {
    let calls = workload(&Run {
        broken: Some("no-lock"),
        ..Run::default()
    })
    .calls;
    let e = check(&calls).expect_err("lost updates went unnoticed");
    eprintln!("no-lock variant: {e}");
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "unoptimized, the checker takes minutes: scripts/test.sh runs these in release"
)]
fn the_checker_catches_torn_reads_of_an_in_place_variant() {
    let calls = workload(&Run {
        broken: Some("torn-writes"),
        ..Run::default()
    })
    .calls;
    let torn = calls
        .iter()
        .filter(|c| matches!(c.returned, Some((_, Ret::Torn))))
        .count();
    let e = check(&calls).expect_err("torn reads went unnoticed");
    eprintln!("torn-writes variant: {e} ({torn} torn reads recorded)");
}

#[test]
fn the_checker_accepts_and_rejects_small_known_histories() {
    let call = |thread, op, invoked, ret: Option<(u64, Ret)>| Call {
        thread,
        key: ('u', 0),
        op,
        invoked,
        returned: ret,
    };
    // Two overlapping increments that both return 1: a lost update.
    let lost = [
        call(1, Op::Increment, 0, Some((10, Ret::Value(1)))),
        call(2, Op::Increment, 1, Some((11, Ret::Value(1)))),
    ];
    assert!(check(&lost).is_err());
    // The same, one after the other returning 1 and 2: fine.
    let fine = [
        call(1, Op::Increment, 0, Some((10, Ret::Value(1)))),
        call(2, Op::Increment, 1, Some((11, Ret::Value(2)))),
    ];
    assert!(check(&fine).is_ok());
    // A read after a completed write that misses it: stale.
    let stale = [
        call(1, Op::Write(5), 0, Some((10, Ret::Ok))),
        call(2, Op::Read, 20, Some((30, Ret::Value(0)))),
    ];
    assert!(check(&stale).is_err());
    // A read that saw two writes' fields at once, however it overlaps them.
    let torn = [
        call(1, Op::Write(5), 0, Some((10, Ret::Ok))),
        call(2, Op::Read, 1, Some((9, Ret::Torn))),
    ];
    assert!(check(&torn).is_err());
    // Overlapping calls whose only explanation is an order other than their invocations':
    // the read sees the later-invoked write's value, then the earlier one's.
    let reordered = [
        call(1, Op::Write(1), 0, Some((50, Ret::Ok))),
        call(2, Op::Write(2), 1, Some((50, Ret::Ok))),
        call(3, Op::Read, 2, Some((20, Ret::Value(2)))),
        call(3, Op::Read, 30, Some((40, Ret::Value(1)))),
    ];
    assert!(check(&reordered).is_ok());
    // A write that never returned may or may not have happened.
    for seen in [0, 5] {
        let unknown = [
            call(1, Op::Write(5), 0, None),
            call(2, Op::Read, 20, Some((30, Ret::Value(seen)))),
        ];
        assert!(check(&unknown).is_ok(), "read {seen}");
    }
}
