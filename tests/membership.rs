//! SWIM membership (foca over the engine's UDP) among three members, each its own thread and
//! core on loopback: everyone learns of everyone from one seed; a member that stops answering
//! is declared down by the others within the bound; one that comes back with a higher
//! incarnation is up again.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use barewire::cluster::{Event, Member, Membership, MembershipOptions};
use barewire::engine::time;
use common::rt;

mod common;

/// Waits for a message from another thread without blocking this core (which must keep
/// answering probes meanwhile).
async fn take<T>(rx: &mpsc::Receiver<T>) -> T {
    loop {
        if let Ok(v) = rx.try_recv() {
            return v;
        }
        time::sleep(Duration::from_millis(1)).await;
    }
}

fn me(rank: u32, incarnation: u32) -> Member {
    Member {
        rank,
        addr: "127.0.0.1:0".parse().unwrap(),
        incarnation,
    }
}

/// Events until `pred` holds for one of them, within `within`; the time it took.
async fn wait_for(m: &mut Membership, within: Duration, pred: impl Fn(&Event) -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        let e = time::timeout(within.saturating_sub(t0.elapsed()), m.next_event())
            .await
            .unwrap_or_else(|_| panic!("no such event within {within:?}"))
            .expect("membership running");
        if pred(&e) {
            return t0.elapsed();
        }
    }
}

#[test]
fn members_find_each_other_and_see_a_silent_one_down_and_a_restarted_one_up() {
    let (stop2_tx, stop2_rx) = mpsc::channel::<()>();
    let (gone_tx, gone_rx) = mpsc::channel::<()>();
    // Member 0: the seed. It reports how long it took to see 2 down and 2 back.
    let (seen_tx, seen_rx) = mpsc::channel::<(&str, Duration)>();
    let (seed_addr_tx, seed_addr_rx) = mpsc::channel();
    let m0 = std::thread::spawn(move || {
        rt().block_on(async move {
            let mut m = Membership::start(me(0, 0), &[], MembershipOptions::default()).unwrap();
            seed_addr_tx.send(m.local_addr()).unwrap();
            // Both others up, in whatever order they are found.
            let t0 = Instant::now();
            let mut up = std::collections::HashSet::new();
            while up.len() < 2 {
                let e = time::timeout(Duration::from_secs(5), m.next_event())
                    .await
                    .expect("both others up within 5 s")
                    .expect("membership running");
                if let Event::Up(x) = e {
                    up.insert(x.rank);
                }
                assert!(t0.elapsed() < Duration::from_secs(5));
            }
            seen_tx.send(("up", Duration::ZERO)).unwrap();
            // Member 2 goes silent.
            stop2_tx.send(()).unwrap();
            take(&gone_rx).await;
            let took = wait_for(
                &mut m,
                Duration::from_secs(5),
                |e| matches!(e, Event::Down(x) if x.rank == 2),
            )
            .await;
            seen_tx.send(("down", took)).unwrap();
            let took = wait_for(
                &mut m,
                Duration::from_secs(5),
                |e| matches!(e, Event::Up(x) if x.rank == 2 && x.incarnation == 1),
            )
            .await;
            seen_tx.send(("back", took)).unwrap();
            assert!(m.members().iter().any(|x| x.rank == 1));
        })
    });
    let seed: std::net::SocketAddr = seed_addr_rx.recv().unwrap();
    let m1 = std::thread::spawn(move || {
        rt().block_on(async move {
            let m = Membership::start(me(1, 0), &[seed], MembershipOptions::default()).unwrap();
            // Stay up (answering probes) for the whole test.
            time::sleep(Duration::from_secs(4)).await;
            drop(m);
        })
    });
    let m2 = std::thread::spawn(move || {
        rt().block_on(async move {
            let m = Membership::start(me(2, 0), &[seed], MembershipOptions::default()).unwrap();
            take(&stop2_rx).await;
            drop(m); // silent from here: its socket is closed
        });
        let t_gone = Instant::now();
        gone_tx.send(()).unwrap();
        // Back after a while, as a new life.
        std::thread::sleep(Duration::from_millis(1000));
        rt().block_on(async move {
            let _m = Membership::start(me(2, 1), &[seed], MembershipOptions::default()).unwrap();
            time::sleep(Duration::from_secs(2)).await;
        });
        t_gone
    });
    let mut seen = Vec::new();
    for _ in 0..3 {
        seen.push(
            seen_rx
                .recv_timeout(Duration::from_secs(15))
                .expect("progress"),
        );
    }
    eprintln!("{seen:?}");
    m0.join().unwrap();
    m1.join().unwrap();
    m2.join().unwrap();
    assert_eq!(
        seen.iter().map(|s| s.0).collect::<Vec<_>>(),
        ["up", "down", "back"]
    );
    // Probes every 50 ms, 150 ms of suspicion: well under a second on a quiet machine.
    assert!(
        seen[1].1 < Duration::from_millis(1500),
        "down after {:?}",
        seen[1].1
    );
}

/// With `Detector::Membership`, the actor systems take node-down from SWIM alone: a node whose
/// membership goes silent is declared down by the others although its connections and
/// heartbeats are fine.
#[test]
fn actor_systems_take_node_down_from_membership() {
    use barewire::actor::{ActorSystem, Detector, SystemOptions};
    let (seed_tx, seed_rx) = mpsc::channel::<std::net::SocketAddr>();
    let seed_rx = std::sync::Arc::new(std::sync::Mutex::new(seed_rx));
    let (down_tx, down_rx) = mpsc::channel::<(usize, usize, Duration)>();
    common::meshed(3, move |rank, _node, mesh| {
        let (seed_tx, seed_rx, down_tx) = (seed_tx.clone(), seed_rx.clone(), down_tx.clone());
        async move {
            let opts = SystemOptions {
                detector: Detector::Membership,
                ..SystemOptions::default()
            };
            let sys = ActorSystem::start(&mesh, opts).await.unwrap();
            let seeds = if rank == 0 {
                vec![]
            } else {
                loop {
                    let got = seed_rx.lock().unwrap().try_recv();
                    if let Ok(s) = got {
                        break vec![s];
                    }
                    time::sleep(Duration::from_millis(1)).await;
                }
            };
            let m = Membership::start(me(rank as u32, 0), &seeds, MembershipOptions::default())
                .unwrap();
            if rank == 0 {
                seed_tx.send(m.local_addr()).unwrap();
                seed_tx.send(m.local_addr()).unwrap();
            }
            if rank == 2 {
                // Let everyone see it, then silence its membership only.
                time::sleep(Duration::from_millis(700)).await;
                drop(m);
                // Stay connected (heartbeats keep flowing) while the others decide.
                time::sleep(Duration::from_secs(3)).await;
                drop(sys);
                return;
            }
            sys.follow(m);
            let t0 = Instant::now();
            let mut seen = 0;
            let down = time::timeout(Duration::from_secs(5), sys.next_down(&mut seen))
                .await
                .expect("node 2 declared down");
            down_tx.send((rank, down, t0.elapsed())).unwrap();
            time::sleep(Duration::from_millis(300)).await;
        }
    });
    let mut downs = Vec::new();
    for _ in 0..2 {
        downs.push(
            down_rx
                .recv_timeout(Duration::from_secs(20))
                .expect("a verdict"),
        );
    }
    downs.sort();
    eprintln!("{downs:?}");
    assert_eq!(
        downs.iter().map(|d| (d.0, d.1)).collect::<Vec<_>>(),
        [(0, 2), (1, 2)]
    );
}

/// Timings SWIM cannot run with are refused at start, naming them: with a zero period or
/// round trip, or a round trip as long as the period, members started and then never saw one
/// another (or probed in a busy loop).
#[test]
fn timings_swim_cannot_run_with_are_refused_at_start() {
    let ms = Duration::from_millis;
    let d = MembershipOptions::default();
    let bad = [
        MembershipOptions {
            probe_period: Duration::ZERO,
            ..d
        },
        MembershipOptions {
            probe_rtt: Duration::ZERO,
            ..d
        },
        MembershipOptions {
            suspect_to_down_after: Duration::ZERO,
            ..d
        },
        MembershipOptions {
            probe_period: ms(40),
            probe_rtt: ms(40),
            ..d
        },
    ];
    rt().block_on(async {
        for opts in bad {
            let e = Membership::start(me(0, 0), &[], opts).err().unwrap();
            assert!(
                e.to_string()
                    .contains("probe_rtt shorter than probe_period"),
                "{e}"
            );
        }
        assert!(Membership::start(me(0, 0), &[], d).is_ok());
    });
}
