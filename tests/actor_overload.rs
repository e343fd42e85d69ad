//! Hostile or broken peers against an actor system's memory: a peer that floods a slow actor
//! fills its mailbox only up to `SystemOptions::max_mailbox` (the rest refused and counted),
//! and a peer that stops reading lets at most `max_backlog` bytes wait for it (further tells
//! fail at once) while every tell that was accepted still arrives once it reads again. Two
//! members, each its own thread and core on loopback.

mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use barewire::actor::{spawn, Actor, ActorRef, ActorSystem, Context, ExitReason, SystemOptions};
use barewire::engine::{time, yield_now};
use barewire::Error;

const ASK: Duration = Duration::from_secs(5);

/// Holds each message until `open`, counting those it handled.
struct Gated {
    open: Rc<Cell<bool>>,
    handled: Rc<Cell<u64>>,
}
impl Actor for Gated {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
        while !self.open.get() {
            time::sleep(Duration::from_millis(1)).await;
        }
        self.handled.set(self.handled.get() + 1);
        n
    }
}

/// Counts the strings it is told; asked `None`, answers how many.
struct Sink(u64);
impl Actor for Sink {
    type Msg = Option<String>;
    type Reply = u64;
    async fn handle(&mut self, m: Option<String>, _: &Context<Self>) -> u64 {
        if m.is_some() {
            self.0 += 1;
        }
        self.0
    }
}

/// Answers at once: an ask to it returns once everything sent before has been dispatched.
struct Ack;
impl Actor for Ack {
    type Msg = ();
    type Reply = ();
    async fn handle(&mut self, _: (), _: &Context<Self>) {}
}

/// A node-down deadline no test reaches (10 s): only the bounds are under test.
fn patient() -> SystemOptions {
    SystemOptions {
        misses: 1000,
        ..SystemOptions::default()
    }
}

async fn find<A: barewire::actor::RemoteActor>(
    sys: &ActorSystem,
    rank: usize,
    name: &str,
) -> ActorRef<A> {
    let t0 = Instant::now();
    loop {
        if let Ok(r) = sys.lookup::<A>(rank, name).await {
            return r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no {name} on {rank}"
        );
        time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs `body(rank, system, checked)` on two members, each an actor system with `opts`; the
/// member that checks sets `checked` when it is done, and neither leaves before that (nor
/// while the last frames are on their way), so neither sees the other go mid-test.
fn two_systems<F, Fut>(opts: SystemOptions, body: F)
where
    F: Fn(usize, ActorSystem, Arc<AtomicBool>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let checked = Arc::new(AtomicBool::new(false));
    let body = Arc::new(body);
    common::meshed(2, move |rank, _node, mesh| {
        let (checked, body) = (checked.clone(), body.clone());
        async move {
            let sys = ActorSystem::start(&mesh, opts).await.unwrap();
            // (A clone: this side's system lives until both are done.)
            body(rank, sys.clone(), checked.clone()).await;
            until("both sides done", Duration::from_secs(40), || {
                checked.load(Ordering::SeqCst)
            })
            .await;
            time::sleep(Duration::from_millis(100)).await;
            drop(sys);
        }
    });
}

async fn until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < within, "{what}: not within {within:?}");
        time::sleep(Duration::from_millis(1)).await;
    }
}

#[test]
fn a_flooded_actor_holds_at_most_its_bound_and_the_rest_is_refused_and_counted() {
    const BOUND: usize = 100;
    const SENT: u64 = 5_000;
    let flooded = Arc::new(AtomicBool::new(false));
    let opts = SystemOptions {
        max_mailbox: BOUND,
        ..patient()
    };
    two_systems(opts, move |rank, sys, checked| {
        let flooded = flooded.clone();
        async move {
            if rank == 1 {
                let open = Rc::new(Cell::new(false));
                let handled = Rc::new(Cell::new(0));
                let gated = spawn(Gated {
                    open: open.clone(),
                    handled: handled.clone(),
                });
                sys.register("gated", &gated).unwrap();
                sys.register("ack", &spawn(Ack)).unwrap();
                until("the flood", Duration::from_secs(20), || {
                    flooded.load(Ordering::SeqCst)
                })
                .await;
                // The gated handler holds its first message and takes no other, so the mailbox
                // only grew during the flood: what it holds now is the most it ever held.
                let queued = gated.queued().unwrap();
                assert!(queued <= BOUND, "the mailbox holds {queued} > {BOUND}");
                let accepted = SENT + 1 - sys.refused();
                assert_eq!(
                    accepted,
                    queued as u64 + 1,
                    "{SENT} tells and an ask, {} refused",
                    sys.refused()
                );
                open.set(true);
                until("the accepted tells handled", ASK, || {
                    handled.get() == accepted
                })
                .await;
                // Nothing more arrives: what was refused is gone, and counted.
                time::sleep(Duration::from_millis(50)).await;
                assert_eq!(handled.get() + sys.refused(), SENT + 1);
                eprintln!("accepted {accepted}, refused {}", sys.refused());
                checked.store(true, Ordering::SeqCst);
            } else {
                let gated = find::<Gated>(&sys, 1, "gated").await;
                let ack = find::<Ack>(&sys, 1, "ack").await;
                for i in 0..SENT {
                    // The bound is the receiver's: every tell leaves this node.
                    gated.tell(i).unwrap();
                    if i % 64 == 0 {
                        yield_now().await;
                    }
                }
                // An ask to the full mailbox is answered at once, with the reason.
                match gated.ask(0, ASK).await {
                    Err(Error::Overloaded(m)) => assert!(m.contains("mailbox"), "{m}"),
                    other => panic!("an ask to a full mailbox: {other:?}"),
                }
                // Everything before this ask has been dispatched there.
                ack.ask((), ASK).await.unwrap();
                flooded.store(true, Ordering::SeqCst);
            }
        }
    });
}

#[test]
fn a_peer_that_stops_reading_holds_the_backlog_to_its_bound_and_loses_no_accepted_tell() {
    const BACKLOG: usize = 256 << 10;
    const STALL: Duration = Duration::from_millis(700);
    let stall = Arc::new(AtomicBool::new(false));
    let stalled = Arc::new(AtomicBool::new(false));
    let opts = SystemOptions {
        max_backlog: BACKLOG,
        ..patient()
    };
    two_systems(opts, move |rank, sys, checked| {
        let (stall, stalled) = (stall.clone(), stalled.clone());
        async move {
            if rank == 1 {
                sys.register("sink", &spawn(Sink(0))).unwrap();
                until("asked to stall", Duration::from_secs(20), || {
                    stall.load(Ordering::SeqCst)
                })
                .await;
                // This member stops reading: its whole core blocks, as a hung process would
                // (for less than the transport's 1 s stall timeout, after which the connection
                // would fail and the node be declared down).
                stalled.store(true, Ordering::SeqCst);
                std::thread::sleep(STALL);
            } else {
                let sink = find::<Sink>(&sys, 1, "sink").await;
                assert_eq!(sink.ask(None, ASK).await.unwrap(), 0);
                stall.store(true, Ordering::SeqCst);
                until("the peer stalled", Duration::from_secs(20), || {
                    stalled.load(Ordering::SeqCst)
                })
                .await;
                let msg = "x".repeat(1000);
                let t0 = Instant::now();
                let mut ok = 0u64;
                let refusal = loop {
                    match sink.tell(Some(msg.clone())) {
                        Ok(()) => ok += 1,
                        Err(e) => break e,
                    }
                    // Room for the pump (the channel takes what the peer has room for).
                    if ok % 64 == 0 {
                        yield_now().await;
                    }
                    assert!(
                        t0.elapsed() < STALL - Duration::from_millis(100),
                        "{ok} tells accepted and no refusal while the peer stalls"
                    );
                };
                assert!(matches!(refusal, Error::Overloaded(_)), "{refusal}");
                let waiting = sys.backlog(1);
                assert!(
                    (BACKLOG..BACKLOG + 2048).contains(&waiting),
                    "{waiting} bytes wait for the stalled peer (bound {BACKLOG})"
                );
                // Asks are refused too, at once, while it stalls.
                match sink.ask(None, ASK).await {
                    Err(Error::Overloaded(_)) => {}
                    other => panic!("an ask to a stalled peer: {other:?}"),
                }
                eprintln!("{ok} tells accepted, then refused after {:?}", t0.elapsed());
                // Once it reads again, every accepted tell is there.
                let t1 = Instant::now();
                loop {
                    match sink.ask(None, ASK).await {
                        Ok(n) if n == ok => break,
                        Ok(n) => assert!(n < ok, "{n} arrived, {ok} accepted"),
                        Err(Error::Overloaded(_) | Error::Timeout(_)) => {}
                        Err(e) => panic!("{e}"),
                    }
                    assert!(t1.elapsed() < Duration::from_secs(20), "not all arrived");
                    time::sleep(Duration::from_millis(10)).await;
                }
                assert_eq!(sys.backlog(1), 0);
                checked.store(true, Ordering::SeqCst);
            }
        }
    });
}

#[test]
fn monitors_beyond_the_bound_are_refused_at_once_and_the_others_fire() {
    const BOUND: usize = 20;
    let opts = SystemOptions {
        max_monitors: BOUND,
        ..patient()
    };
    two_systems(opts, move |rank, sys, checked| {
        async move {
            if rank == 1 {
                sys.register("a", &spawn(Ack)).unwrap();
                sys.register("b", &spawn(Ack)).unwrap();
            } else {
                // Each lookup is a reference of its own, and places its own monitor.
                let mut refs = Vec::new();
                for _ in 0..BOUND + 5 {
                    let r = find::<Ack>(&sys, 1, "a").await;
                    assert_eq!(r.exit_reason(), None);
                    refs.push(r);
                }
                let b = find::<Ack>(&sys, 1, "b").await;
                // Answered after every monitor above, and after their refusals came back.
                b.ask((), ASK).await.unwrap();
                for (i, r) in refs.iter().enumerate() {
                    match r.exit_reason() {
                        None if i < BOUND => {}
                        Some(ExitReason::Error(m)) if i >= BOUND && m.contains("max_monitors") => {}
                        other => panic!("monitor {i}: {other:?}"),
                    }
                }
                // The bound is per node: one on b is refused too, while a's 20 hold.
                let _ = b.exit_reason();
                b.ask((), ASK).await.unwrap();
                assert!(b.exit_reason().is_some(), "a monitor beyond the bound");
                // a ends: its 20 monitors fire with its reason, and give their places back.
                refs[0].stop(ExitReason::Shutdown);
                for r in &refs[..BOUND] {
                    let reason = time::timeout(ASK, r.wait())
                        .await
                        .expect("a's monitor fired");
                    assert_eq!(reason, ExitReason::Shutdown);
                }
                let b2 = find::<Ack>(&sys, 1, "b").await;
                let _ = b2.exit_reason();
                b2.ask((), ASK).await.unwrap();
                assert_eq!(b2.exit_reason(), None, "a monitor within the bound again");
                checked.store(true, Ordering::SeqCst);
            }
        }
    });
}

/// Stops on its first message.
#[derive(serde::Serialize, serde::Deserialize)]
struct Short;
impl Actor for Short {
    type Msg = ();
    type Reply = ();
    async fn handle(&mut self, _: (), ctx: &Context<Self>) {
        ctx.stop(ExitReason::Normal);
    }
}

#[test]
fn actors_started_for_a_peer_leave_no_trace_once_they_exit() {
    const STARTS: usize = 200;
    let started = Arc::new(AtomicBool::new(false));
    two_systems(patient(), move |rank, sys, checked| {
        let started = started.clone();
        async move {
            sys.register_kind("short", |()| Short);
            sys.register("ack", &spawn(Ack)).unwrap();
            if rank == 1 {
                until("the peer's starts", Duration::from_secs(30), || {
                    started.load(Ordering::SeqCst)
                })
                .await;
                // Only the registered actor is left.
                until("exited actors forgotten", ASK, || sys.exported() == 1).await;
                checked.store(true, Ordering::SeqCst);
            } else {
                find::<Ack>(&sys, 1, "ack").await;
                let mut refs = Vec::new();
                for _ in 0..STARTS {
                    let r = sys.spawn_on::<Short, ()>(1, "short", &()).await.unwrap();
                    r.tell(()).unwrap();
                    refs.push(r);
                }
                for r in &refs {
                    let reason = time::timeout(ASK, r.wait()).await.expect("it exited");
                    assert_eq!(reason, ExitReason::Normal);
                }
                // An exited actor's node is no longer holding it, but still says how it ended.
                match refs[0].ask((), ASK).await {
                    Err(Error::Exited(m)) => assert!(m.contains("normal"), "{m}"),
                    other => panic!("an ask to an exited actor: {other:?}"),
                }
                started.store(true, Ordering::SeqCst);
            }
        }
    });
}
