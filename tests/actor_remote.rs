//! Actors across processes: this test process is rank 0 of a three-member actor system whose
//! ranks 1 and 2 are `barewire-actor-node` processes. Remote ask, tell (in order), lookup with a
//! type check, remote spawn, remote monitors; node-down by heartbeat deadline when a member is
//! stopped, and when one is killed.

mod common;

use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire::actor::{
    link, Actor, ActorSystem, ChildSpec, Context, Detector, ExitReason, Strategy, Supervisor,
    SupervisorSpec, SystemOptions,
};
use barewire::cluster::{Member as ClusterMember, Membership, MembershipOptions};
use barewire::engine::{time, Runtime};
use barewire::{Error, Mesh, Node};
use common::{Member, Netns};

const ASK: Duration = Duration::from_secs(2);

struct Echo;
impl Actor for Echo {
    type Msg = String;
    type Reply = String;
    async fn handle(&mut self, s: String, _: &Context<Self>) -> String {
        s
    }
}

struct Counter;
impl Actor for Counter {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, _: u64, _: &Context<Self>) -> u64 {
        unreachable!("only ever a reference to the members' counters")
    }
}

/// How the system decides that a node is down.
#[derive(Clone, Copy, PartialEq)]
enum Detection {
    /// The default heartbeat deadline (5 x 10 ms): the tests of that deadline.
    Deadline,
    /// A deadline of 100 x 10 ms, for tests about something else: a debug-build process on a
    /// loaded 2-core machine can miss 50 ms of heartbeats (a member once declared rank 0 down
    /// in the middle of the migration test, and its sender's tells failed).
    Patient,
    /// SWIM membership on UDP, the heartbeat deadline off.
    Swim,
}

/// The patient deadline's number of missed heartbeats.
const PATIENT_MISSES: u32 = 100;

fn member(rank: usize, bind: &str, netns: Option<&str>, detection: Detection) -> Member {
    let mut args = vec![
        "--rank".to_string(),
        rank.to_string(),
        "--bind".into(),
        bind.into(),
    ];
    match detection {
        Detection::Deadline => {}
        Detection::Patient => args.extend(["--misses".into(), PATIENT_MISSES.to_string()]),
        Detection::Swim => args.push("--swim".into()),
    }
    Member::spawn(env!("CARGO_BIN_EXE_barewire-actor-node"), &args, netns)
}

fn with_system<F, Fut>(detection: Detection, body: F)
where
    F: FnOnce(Rc<[Member; 2]>, ActorSystem) -> Fut,
    Fut: Future<Output = ()>,
{
    with_system_in(None, detection, body)
}

/// As `with_system`; with a namespace, rank 2 runs inside it and everyone talks over its veth
/// pair (so setting the link down cuts rank 2 off). Every member (this one included) takes
/// node-down as `detection` says (with SWIM, from membership on UDP at its mesh address).
fn with_system_in<F, Fut>(netns: Option<&(Netns, String, String)>, detection: Detection, body: F)
where
    F: FnOnce(Rc<[Member; 2]>, ActorSystem) -> Fut,
    Fut: Future<Output = ()>,
{
    let _one_at_a_time = common::serial();
    // This process is rank 0 on the same driver as the members it starts.
    let Some(driver) = common::driver() else {
        return;
    };
    let (host, inner) = match netns {
        Some((_, h, p)) => (h.clone(), p.clone()),
        None => ("127.0.0.1".to_string(), "127.0.0.1".to_string()),
    };
    let mut members = [
        member(1, &host, None, detection),
        member(2, &inner, netns.map(|n| n.0.name.as_str()), detection),
    ];
    Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .unwrap()
        .block_on(async {
            let node = Node::with_config(&driver).unwrap();
            let port = node.listen(format!("{host}:0").parse().unwrap()).unwrap();
            let mut addrs = vec![format!("{host}:{port}")];
            addrs.push(format!("{host}:{}", members[0].port()));
            addrs.push(format!("{inner}:{}", members[1].port()));
            for m in &mut members {
                m.say(&format!("ADDRS {}", addrs.join(" ")));
            }
            let addrs: Vec<_> = addrs.iter().map(|a| a.parse().unwrap()).collect();
            let mesh = Mesh::join(&node, 0, &addrs).await.unwrap();
            let swim = detection == Detection::Swim;
            let mut opts = SystemOptions::default();
            match detection {
                Detection::Deadline => {}
                Detection::Patient => opts.misses = PATIENT_MISSES,
                Detection::Swim => opts.detector = Detector::Membership,
            }
            let sys = ActorSystem::start(&mesh, opts).await.unwrap();
            if swim {
                let me = ClusterMember {
                    rank: 0,
                    addr: addrs[0],
                    incarnation: 0,
                };
                sys.follow(Membership::start(me, &addrs, MembershipOptions::default()).unwrap());
            }
            for m in &members {
                m.expect_async("STARTED", Duration::from_secs(20)).await;
            }
            body(Rc::new(members), sys).await;
        });
}

#[test]
fn remote_ask_tell_lookup_spawn_and_monitor() {
    with_system(Detection::Patient, |members, sys| async move {
        let _alive = members; // the member processes live as long as this test body
        let echo = sys.lookup::<Echo>(1, "echo").await.unwrap();
        assert_eq!(echo.node(), Some(1));
        assert_eq!(echo.ask("hello".into(), ASK).await.unwrap(), "hello");

        // Tells from one sender arrive in order, and before a later ask.
        let counter = sys.lookup::<Counter>(2, "counter").await.unwrap();
        for _ in 0..1000 {
            counter.tell(1).unwrap();
        }
        assert_eq!(counter.ask(0, ASK).await.unwrap(), 1000);

        // A name bound to an actor of other message types is refused, naming both.
        let e = sys.lookup::<Counter>(1, "echo").await.unwrap_err();
        assert!(e.to_string().contains("alloc::string::String"), "{e}");
        assert!(sys.lookup::<Echo>(1, "nobody").await.is_err());
        assert!(sys.whereis::<Echo>("echo").await.unwrap().node().is_some());

        // Remote spawn of a registered kind, with its argument.
        let c = sys
            .spawn_on::<Counter, u64>(1, "counter", &100)
            .await
            .unwrap();
        assert_eq!(c.ask(5, ASK).await.unwrap(), 105);
        let e = sys
            .spawn_on::<Echo, u64>(1, "counter", &1)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "{e}");

        // A monitor sees a remote actor's exit with its reason.
        c.stop(ExitReason::Shutdown);
        assert_eq!(c.wait().await, ExitReason::Shutdown);
        assert!(sys.is_up(1) && sys.is_up(2));
    });
}

#[test]
fn a_stopped_node_is_declared_down_by_its_heartbeat_deadline() {
    with_system(Detection::Deadline, |members, sys| async move {
        let counter = sys.lookup::<Counter>(2, "counter").await.unwrap();
        let _ = counter.exit_reason(); // places the monitor
        assert_eq!(counter.ask(1, ASK).await.unwrap(), 1);
        members[1].signal(libc::SIGSTOP);
        let t0 = Instant::now();
        assert_eq!(counter.wait().await, ExitReason::NoConnection);
        let took = t0.elapsed();
        let mut seen = 0;
        assert_eq!(sys.next_down(&mut seen).await, 2);
        assert!(!sys.is_up(2) && sys.is_up(1));
        // Default deadline: 5 heartbeats of 10 ms without a word.
        assert!(
            took >= Duration::from_millis(40) && took < Duration::from_millis(500),
            "declared down after {took:?}"
        );
        let e = counter.ask(1, ASK).await.unwrap_err();
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        // The other survivor reached the same verdict on its own.
        assert_eq!(
            members[0]
                .expect_async("DOWN", Duration::from_secs(5))
                .await,
            "DOWN 2"
        );
        members[1].signal(libc::SIGCONT);
        eprintln!("stopped node declared down after {took:?}");
    });
}

#[test]
fn a_killed_node_fails_asks_and_fires_monitors_with_noconnection() {
    with_system(Detection::Deadline, |members, sys| async move {
        let echo = sys.lookup::<Echo>(1, "echo").await.unwrap();
        let _ = echo.exit_reason();
        members[0].signal(libc::SIGKILL);
        let t0 = Instant::now();
        assert_eq!(echo.wait().await, ExitReason::NoConnection);
        assert!(
            t0.elapsed() < Duration::from_millis(500),
            "{:?}",
            t0.elapsed()
        );
        assert!(echo.ask("x".into(), ASK).await.is_err());
        // Rank 2 is unaffected.
        let other = sys.lookup::<Echo>(2, "echo").await.unwrap();
        assert_eq!(other.ask("still".into(), ASK).await.unwrap(), "still");
    });
}

/// A one-for-one supervisor on this node with a counter on each member: w1 prefers node 1,
/// w2 node 2, each the other node next.
async fn two_counters(sys: &ActorSystem) -> Supervisor {
    Supervisor::start(
        SupervisorSpec::new(
            Strategy::OneForOne,
            vec![
                ChildSpec::remote::<Counter, u64>("w1", sys, "counter", 10, vec![1, 2]),
                ChildSpec::remote::<Counter, u64>("w2", sys, "counter", 20, vec![2, 1]),
            ],
        )
        .intensity(3, Duration::from_secs(5)),
    )
    .await
}

#[test]
fn a_distributed_supervisor_restarts_a_dead_nodes_children_on_a_survivor() {
    with_system(Detection::Deadline, |members, sys| async move {
        let sup = two_counters(&sys).await;
        assert_eq!(sup.node_of("w1"), Some(Some(1)));
        assert_eq!(sup.node_of("w2"), Some(Some(2)));
        // A local actor linked to one on node 2 goes down with it.
        let local = barewire::actor::spawn(Echo);
        let there = sys.lookup::<Echo>(2, "echo").await.unwrap();
        link(&local, &there);

        members[1].signal(libc::SIGKILL);
        let t0 = Instant::now();
        while sup.node_of("w2") != Some(Some(1)) {
            assert!(t0.elapsed() < Duration::from_secs(3), "w2 never came back");
            time::sleep(Duration::from_millis(1)).await;
        }
        eprintln!("w2 running again on node 1 after {:?}", t0.elapsed());
        assert_eq!(sup.starts("w2"), Some(2));
        assert_eq!(sup.starts("w1"), Some(1), "one_for_one leaves w1 alone");
        assert_eq!(sup.node_of("w1"), Some(Some(1)));
        assert_eq!(local.wait().await, ExitReason::NoConnection);
        sup.stop();
        assert_eq!(sup.wait().await, ExitReason::Shutdown);
        let _alive = members;
    });
}

/// A supervisor on rank 0 with a child on each other node; `fault` makes node 2 unreachable.
/// The child that ran there must be restarted on node 1 once node 2 is declared down.
fn supervised_child_restarts_elsewhere(fault: &str) {
    if fault == "cut" && !common::reaches_other_netns("a cut-off node's child") {
        return;
    }
    let netns = if fault == "cut" {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("this test needs root for a network namespace, and CI runs as root");
            }
            eprintln!("SKIP: needs root to create a network namespace");
            return;
        }
        Some(Netns::create().expect("a network namespace"))
    } else {
        None
    };
    let veth = netns.as_ref().map(|n| n.0.veth.clone());
    with_system_in(
        netns.as_ref(),
        Detection::Deadline,
        |members, sys| async move {
            let sup = two_counters(&sys).await;
            assert_eq!(sup.node_of("w2"), Some(Some(2)));
            let t0 = Instant::now();
            match fault {
                "stop" => members[1].signal(libc::SIGSTOP),
                _ => {
                    // `ip` runs on a thread of its own: started from this core, its fork and
                    // wait would hold the core (and the heartbeats it reads and sends) for as
                    // long as a loaded host takes, which can pass node 1's deadline too.
                    let veth = veth.clone().unwrap();
                    let ip = std::thread::spawn(move || Netns::ip(&["link", "set", &veth, "down"]));
                    while !ip.is_finished() {
                        time::sleep(Duration::from_millis(1)).await;
                    }
                    assert!(ip.join().unwrap());
                }
            }
            let mut seen = 0;
            assert_eq!(sys.next_down(&mut seen).await, 2);
            let detected = t0.elapsed();
            while sup.node_of("w2") != Some(Some(1)) {
                assert!(t0.elapsed() < Duration::from_secs(3), "w2 never came back");
                time::sleep(Duration::from_millis(1)).await;
            }
            let restarted = t0.elapsed();
            eprintln!(
                "{fault}: node 2 down after {detected:?}, w2 running on node 1 after {restarted:?}"
            );
            // Detection by the heartbeat deadline (5 x 10 ms): neither fault closes a connection.
            assert!(
                detected >= Duration::from_millis(40) && detected < Duration::from_millis(500),
                "{detected:?}"
            );
            assert!(
                restarted - detected < Duration::from_millis(100),
                "{restarted:?}"
            );
            assert_eq!(sup.starts("w1"), Some(1));
            sup.stop();
            sup.wait().await;
            if fault == "stop" {
                members[1].signal(libc::SIGCONT);
            }
        },
    );
}

#[test]
fn a_stopped_nodes_supervised_child_restarts_on_the_survivor() {
    supervised_child_restarts_elsewhere("stop");
}

#[test]
fn a_cut_off_nodes_supervised_child_restarts_on_the_survivor() {
    supervised_child_restarts_elsewhere("cut");
}

#[path = "../src/bin/member/seq.rs"]
mod seq;
use seq::Seq;

/// Tells both members to send `n` messages to `seq` from sequence number `from`, and waits
/// until each says it sent them.
async fn members_send(members: &mut Rc<[Member; 2]>, from: u64, n: u64) {
    for m in Rc::get_mut(members).expect("one owner").iter_mut() {
        m.say(&format!("SEND {from} {n}"));
    }
    for m in members.iter() {
        // "SENT", or "SEND-FAILED <why>" (a tell refused, e.g. its node declared down).
        let line = m.expect_async("SEN", Duration::from_secs(30)).await;
        assert_eq!(line, "SENT", "a member's sender failed");
    }
}

/// Waits (up to 20 s) until `seq` has taken `n` messages; `what` names them if they never do.
async fn taken(seq: &barewire::actor::ActorRef<Seq>, n: u64, what: &str) {
    let t0 = Instant::now();
    while seq.ask((u64::MAX, 0), ASK).await.unwrap().0 < n {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "{what} never arrived"
        );
        time::sleep(Duration::from_millis(5)).await;
    }
}

#[test]
fn an_actor_moves_under_load_and_every_message_arrives_once_in_order() {
    const EACH: u64 = 20_000;
    with_system(Detection::Patient, |mut members, sys| async move {
        sys.register_migratable::<Seq>("seq");
        let seq = barewire::actor::spawn(Seq::default());
        sys.register("seq", &seq).unwrap();
        // Three senders: this node (through its local reference) and nodes 1 and 2 (through
        // remote references to this node's address).
        for m in Rc::get_mut(&mut members).expect("one owner").iter_mut() {
            m.say(&format!("SEND 0 {EACH}"));
        }
        let local = seq.clone();
        let here = barewire::engine::spawn_local(async move {
            for i in 0..EACH {
                local.tell((0, i)).unwrap();
                if i % 64 == 63 {
                    time::sleep(Duration::from_micros(100)).await;
                }
            }
        });
        time::sleep(Duration::from_millis(20)).await;
        let (before, _) = seq.ask((u64::MAX, 0), ASK).await.unwrap();
        let moved = sys.migrate(&seq, 1, "seq").await.unwrap();
        assert_eq!(moved.node(), Some(1));
        here.await.unwrap();
        for m in members.iter() {
            // "SENT", or "SEND-FAILED <why>" (a tell refused, e.g. its node declared down).
            let line = m.expect_async("SEN", Duration::from_secs(30)).await;
            assert_eq!(line, "SENT", "a member's sender failed");
        }
        // Ask through the old reference: forwarded like everything else.
        let t0 = Instant::now();
        let (total, bad) = loop {
            let (total, bad) = seq.ask((u64::MAX, 0), ASK).await.unwrap();
            if total >= 3 * EACH || t0.elapsed() > Duration::from_secs(20) {
                break (total, bad);
            }
            time::sleep(Duration::from_millis(5)).await;
        };
        eprintln!("moved after {before} messages; {total} arrived, {bad} out of order");
        assert!(
            before > 0 && before < 3 * EACH,
            "the move happened under load ({before})"
        );
        assert_eq!(total, 3 * EACH, "every message arrived exactly once");
        assert_eq!(bad, 0, "in per-sender order");
        assert_eq!(moved.ask((u64::MAX, 0), ASK).await.unwrap(), (3 * EACH, 0));

        // A member learns of the move from the old home when that home forwards one of its
        // messages. One whose first round had all arrived by the move (moved with the mailbox,
        // not forwarded) has not learned yet: small rounds until one goes through with nothing
        // forwarded (each member has switched, or holds its messages while it switches).
        let first = sys.forwarded();
        let mut next = EACH;
        let mut arrived = 3 * EACH;
        let mut forwarded = first;
        for settle in 0.. {
            assert!(settle < 50, "the members never switched to the new home");
            members_send(&mut members, next, 64).await;
            next += 64;
            arrived += 2 * 64;
            taken(&moved, arrived, "a small round").await;
            let now = sys.forwarded();
            let quiet = now == forwarded;
            forwarded = now;
            if quiet {
                break;
            }
        }
        // The other nodes' references have switched to the new address: a second round goes
        // there directly, not through this node.
        members_send(&mut members, next, EACH).await;
        let all = arrived + 2 * EACH;
        taken(&moved, all, "the second round").await;
        assert_eq!(moved.ask((u64::MAX, 0), ASK).await.unwrap(), (all, 0));
        let again = sys.forwarded() - forwarded;
        eprintln!(
            "forwarded by the old home: {first} in the first round, {} in the small rounds \
             after it, {again} in the second",
            forwarded - first
        );
        assert!(first > 0, "the first round went through the old home");
        assert_eq!(again, 0, "the second round went to the new home directly");
    });
}

/// With SWIM as the detector on every node: a stopped node is declared down by membership (no
/// connection closes, and the heartbeat deadline is off), on this node and on the other
/// survivor, and its supervised child moves.
#[test]
fn with_swim_a_stopped_node_is_declared_down_by_membership() {
    with_system_in(None, Detection::Swim, |members, sys| async move {
        let sup = Supervisor::start(
            SupervisorSpec::new(
                Strategy::OneForOne,
                vec![ChildSpec::remote::<Counter, u64>(
                    "w",
                    &sys,
                    "counter",
                    0,
                    vec![2, 1],
                )],
            )
            .intensity(3, Duration::from_secs(5)),
        )
        .await;
        assert_eq!(sup.node_of("w"), Some(Some(2)));
        // Let SWIM see everyone first.
        time::sleep(Duration::from_millis(500)).await;
        members[1].signal(libc::SIGSTOP);
        let t0 = Instant::now();
        let mut seen = 0;
        let down = time::timeout(Duration::from_secs(5), sys.next_down(&mut seen))
            .await
            .expect("declared down");
        let took = t0.elapsed();
        assert_eq!(down, 2);
        assert_eq!(
            members[0]
                .expect_async("DOWN", Duration::from_secs(5))
                .await,
            "DOWN 2"
        );
        while sup.node_of("w") != Some(Some(1)) {
            assert!(t0.elapsed() < Duration::from_secs(5), "w never moved");
            time::sleep(Duration::from_millis(1)).await;
        }
        eprintln!(
            "SWIM: node 2 down after {took:?}, its child on node 1 after {:?}",
            t0.elapsed()
        );
        members[1].signal(libc::SIGCONT);
        sup.stop();
        sup.wait().await;
    });
}
