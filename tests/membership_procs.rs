//! SWIM membership across processes (`barewire-swim-node`, three members): a member killed,
//! paused, or cut off by its link (network namespace) is declared down by the others within
//! the bound, and comes back (restarted with a higher incarnation, resumed, or healed) as up;
//! a member that joins late is seen by all, and one that leaves is down at once.
//! One test at a time: each has deadlines of a few hundred milliseconds.

mod common;

use std::time::{Duration, Instant};

use common::{Member, Netns};

/// Failure detection bound in these tests: the target is 200 ms (measured by actor-bench and
/// recorded in RESULTS); a loaded 2-core CI machine gets some slack here.
const DETECT: Duration = Duration::from_millis(1500);

fn free_port(ip: &str) -> u16 {
    std::net::UdpSocket::bind(format!("{ip}:0"))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn swim(rank: usize, bind: &str, seeds: &[String], incarnation: u32, ns: Option<&str>) -> Member {
    let args = vec![
        "--rank".to_string(),
        rank.to_string(),
        "--bind".into(),
        bind.into(),
        "--seeds".into(),
        seeds.join(","),
        "--incarnation".into(),
        incarnation.to_string(),
    ];
    let m = Member::spawn(env!("CARGO_BIN_EXE_barewire-swim-node"), &args, ns);
    m.expect("STARTED", Duration::from_secs(20));
    m
}

/// Three members (rank 2 at `far`, inside `ns` if given), each seeing the other two up.
fn three(near: &str, far: &str, ns: Option<&str>) -> (Vec<Member>, Vec<String>) {
    let addrs = vec![
        format!("{near}:{}", free_port(near)),
        format!("{near}:{}", free_port(near)),
        format!("{far}:{}", if ns.is_some() { 7990 } else { free_port(far) }),
    ];
    let ms: Vec<Member> = (0..3)
        .map(|r| swim(r, &addrs[r], &addrs, 0, if r == 2 { ns } else { None }))
        .collect();
    for (r, m) in ms.iter().enumerate() {
        let others: Vec<String> = (0..3)
            .filter(|o| *o != r)
            .map(|o| format!("UP {o} "))
            .collect();
        let others: Vec<&str> = others.iter().map(String::as_str).collect();
        m.expect_each(&others, Duration::from_secs(10));
    }
    (ms, addrs)
}

/// Time until both survivors said `line`.
fn both(ms: &[Member], line: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    ms[0].expect(line, within);
    ms[1].expect(line, within);
    t0.elapsed()
}

#[test]
fn a_killed_member_is_declared_down_and_a_restarted_one_rejoins() {
    let _one_at_a_time = common::serial();
    let (mut ms, addrs) = three("127.0.0.1", "127.0.0.1", None);
    ms[2].signal(libc::SIGKILL);
    let took = both(&ms, "DOWN 2 0", DETECT);
    eprintln!("killed: declared down by both survivors after {took:?}");
    // The same address, a new life.
    ms[2] = swim(2, &addrs[2], &addrs, 1, None);
    let took = both(&ms, "UP 2 1", Duration::from_secs(5));
    eprintln!("restarted: up again after {took:?}");
    ms[2].expect_each(&["UP 0 ", "UP 1 "], Duration::from_secs(5));
}

#[test]
fn a_paused_member_is_declared_down_and_rejoins_when_it_resumes() {
    let _one_at_a_time = common::serial();
    let (ms, _) = three("127.0.0.1", "127.0.0.1", None);
    ms[2].signal(libc::SIGSTOP);
    let took = both(&ms, "DOWN 2 0", DETECT);
    eprintln!("paused: declared down after {took:?}");
    ms[2].signal(libc::SIGCONT);
    // It learns it was declared down and comes back with a higher incarnation.
    let took = both(&ms, "UP 2 ", Duration::from_secs(5));
    eprintln!("resumed: up again after {took:?}");
}

#[test]
fn a_partitioned_member_is_declared_down_on_both_sides_and_rejoins_when_healed() {
    let _one_at_a_time = common::serial();
    let Some((ns, host, inner)) = Netns::create() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI runs as root: the network namespace must be created");
        }
        eprintln!("SKIP: creating a network namespace needs root");
        return;
    };
    let (ms, _) = three(&host, &inner, Some(&ns.name));
    assert!(Netns::ip(&["link", "set", &ns.veth, "down"]));
    let took = both(&ms, "DOWN 2 ", DETECT);
    ms[2].expect_each(&["DOWN 0 ", "DOWN 1 "], DETECT);
    eprintln!("cut off: declared down on both sides after {took:?}");
    assert!(Netns::ip(&["link", "set", &ns.veth, "up"]));
    let took = both(&ms, "UP 2 ", Duration::from_secs(10));
    ms[2].expect_each(&["UP 0 ", "UP 1 "], Duration::from_secs(10));
    eprintln!("healed: up again on both sides after {took:?}");
}

#[test]
fn a_member_joins_after_start_and_one_that_leaves_is_down_at_once() {
    let _one_at_a_time = common::serial();
    let (ms, mut addrs) = three("127.0.0.1", "127.0.0.1", None);
    // A fourth member, started later, knowing only rank 0.
    addrs.push(format!("127.0.0.1:{}", free_port("127.0.0.1")));
    let mut late = swim(3, &addrs[3], &addrs[..1], 0, None);
    for m in &ms {
        m.expect("UP 3 0", Duration::from_secs(5));
    }
    late.expect_each(&["UP 0 ", "UP 1 ", "UP 2 "], Duration::from_secs(5));
    // It leaves: the others learn from it, without waiting out a suspicion.
    let t0 = Instant::now();
    late.say("EXIT");
    for m in &ms {
        m.expect("DOWN 3 0", DETECT);
    }
    let took = t0.elapsed();
    late.expect("LEFT", Duration::from_secs(1));
    eprintln!("left: everyone knew after {took:?}");
    assert!(
        took < Duration::from_millis(150),
        "a leave is not a failure: {took:?}"
    );
}
