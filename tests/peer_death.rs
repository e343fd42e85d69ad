//! A channel's peer process killed (SIGKILL) on either side: the survivor's channel halves
//! fail with `PeerGone` within a bounded time, instead of hanging. A receiver that stops
//! (SIGSTOP) fails a sender that waits on its full ring, on every transport, while one that
//! runs but does not read is waited for.

use barewire_test_support::{rt, ReadyChild};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use barewire::drivers::DriverConfig;
use barewire::engine::time;
use barewire::{ChannelOptions, Error, Node};

fn node_process(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_barewire-node"))
        .args(args)
        .env("BAREWIRE_DRIVER", "soft")
        .stdout(Stdio::piped())
        .spawn()
        .expect("barewire-node starts")
}

fn kill(child: &mut Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
}

const BOUND: Duration = Duration::from_secs(3);

#[test]
fn a_killed_receiver_fails_the_sender() {
    let mut peer = ReadyChild::spawn(
        Command::new(env!("CARGO_BIN_EXE_barewire-node"))
            .arg("echo")
            .env("BAREWIRE_DRIVER", "soft"),
    );
    let port = peer.port();
    rt().block_on(async {
        let node = Node::soft().unwrap();
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
        for n in 0..10 {
            tx.send(&n).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), n + 1);
        }
        peer.signal(libc::SIGKILL);
        peer.wait();
        let t0 = Instant::now();
        let e = loop {
            match tx.send(&1).await {
                Ok(()) => {}
                Err(e) => break e,
            }
            assert!(t0.elapsed() < BOUND, "the sender never heard");
            time::sleep(Duration::from_millis(1)).await;
        };
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        assert!(matches!(rx.recv().await, Err(Error::PeerGone(_))));
        assert!(t0.elapsed() < BOUND, "took {:?}", t0.elapsed());
    });
}

#[test]
fn a_killed_sender_fails_the_receiver() {
    rt().block_on(async {
        let node = Node::soft().unwrap();
        let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut peer = node_process(&["send", &format!("127.0.0.1:{port}")]);
        let ep = node.accept().await.unwrap();
        let (_tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
        for n in 0..5 {
            assert_eq!(rx.recv().await.unwrap(), n);
        }
        kill(&mut peer);
        let t0 = Instant::now();
        let e = loop {
            match time::timeout(BOUND, rx.recv())
                .await
                .expect("recv did not hang")
            {
                Ok(_) => {} // messages already in the ring before the kill
                Err(e) => break e,
            }
        };
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        assert!(t0.elapsed() < BOUND, "took {:?}", t0.elapsed());
    });
}

/// A receiver process stopped (SIGSTOP) with the sender's ring full: the waiting `send` fails
/// with `PeerGone` within a bounded time, over soft and shm alike. Over shm, whose Writes need
/// no work from the receiver, it used to wait for ever; the sender's liveness probe finds the
/// stopped receiver.
#[test]
fn a_stopped_receiver_fails_a_sender_waiting_on_its_full_ring() {
    for driver in ["soft", "shm"] {
        let peer = ReadyChild::spawn(
            Command::new(env!("CARGO_BIN_EXE_barewire-node"))
                .arg("echo")
                .env("BAREWIRE_DRIVER", driver),
        );
        let port = peer.port();
        rt().block_on(async {
            let node = Node::with_config(&DriverConfig::parse(driver, None).unwrap()).unwrap();
            let ep = node
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
                .unwrap();
            let (tx, rx) = ep
                .open_channel::<u64>(ChannelOptions::new(64, 8))
                .await
                .unwrap();
            for n in 0..10 {
                tx.send(&n).await.unwrap();
                assert_eq!(rx.recv().await.unwrap(), n + 1);
            }
            peer.signal(libc::SIGSTOP);
            let t0 = Instant::now();
            let mut sent = 0;
            let e = loop {
                match time::timeout(3 * BOUND, tx.send(&1))
                    .await
                    .unwrap_or_else(|_| panic!("{driver}: send still waits after {sent} sends"))
                {
                    Ok(()) => sent += 1,
                    Err(e) => break e,
                }
            };
            let took = t0.elapsed();
            assert!(matches!(e, Error::PeerGone(_)), "{driver}: {e}");
            // The probe waits a second of full ring, then the transport's timeout (1 s) runs.
            assert!(
                took < BOUND + Duration::from_secs(2),
                "{driver}: took {took:?}"
            );
            // (Credits come back every quarter of the ring: the first 10 may still count.)
            assert!(
                sent + 10 >= 64,
                "{driver}: failed after {sent} sends, before the ring was full"
            );
        });
        peer.signal(libc::SIGKILL);
    }
}

/// A receiver that runs but does not read for several probe intervals is waited for: the
/// sender's probes are answered by its core, and every message arrives once it reads.
#[test]
fn a_receiver_that_runs_but_does_not_read_is_waited_for() {
    for driver in ["soft", "shm"] {
        let cfg = DriverConfig::parse(driver, None).unwrap();
        let (tx_port, rx_port) = std::sync::mpsc::channel();
        let server = std::thread::spawn({
            let cfg = cfg.clone();
            move || {
                rt().block_on(async move {
                    let node = Node::with_config(&cfg).unwrap();
                    tx_port
                        .send(node.listen("127.0.0.1:0".parse().unwrap()).unwrap())
                        .unwrap();
                    let ep = node.accept().await.unwrap();
                    let (_tx, rx) = ep
                        .open_channel::<u64>(ChannelOptions::new(64, 8))
                        .await
                        .unwrap();
                    // Busy elsewhere, with its core running, for three probe intervals.
                    time::sleep(Duration::from_secs(3)).await;
                    for n in 0..200u64 {
                        assert_eq!(rx.recv().await.unwrap(), n);
                    }
                })
            }
        });
        let port = rx_port.recv().unwrap();
        rt().block_on(async {
            let node = Node::with_config(&cfg).unwrap();
            let ep = node
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
                .unwrap();
            let (tx, _rx) = ep
                .open_channel::<u64>(ChannelOptions::new(64, 8))
                .await
                .unwrap();
            let t0 = Instant::now();
            for n in 0..200u64 {
                tx.send(&n).await.unwrap_or_else(|e| {
                    panic!("{driver}: message {n} failed after {:?}: {e}", t0.elapsed())
                });
            }
            tx.flush()
                .await
                .unwrap_or_else(|e| panic!("{driver}: flush failed after {:?}: {e}", t0.elapsed()));
            assert!(
                t0.elapsed() >= Duration::from_secs(2),
                "{driver}: the ring never filled"
            );
        });
        server.join().unwrap();
    }
}

/// A receiver waiting in `recv` on a sender in another network namespace whose link is then
/// cut: no message, no hang-up, nothing outstanding. Before the keepalive it waited for ever;
/// now `recv` fails with `PeerGone` once the keepalive (2 s here) runs out.
#[test]
fn a_receiver_whose_senders_link_is_cut_fails_within_the_keepalive() {
    let Some((ns, host, _)) = barewire_test_support::Netns::for_test(234) else {
        return;
    };
    const KEEPALIVE: Duration = Duration::from_secs(2);
    let cfg = DriverConfig::parse("soft", None)
        .unwrap()
        .keepalive(Some(KEEPALIVE));
    rt().block_on(async {
        let node = Node::with_config(&cfg).unwrap();
        let port = node.listen(format!("{host}:0").parse().unwrap()).unwrap();
        let mut peer = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                env!("CARGO_BIN_EXE_barewire-node"),
            ])
            .args(["send", &format!("{host}:{port}")])
            .env("BAREWIRE_DRIVER", "soft")
            .stdout(Stdio::null())
            .spawn()
            .expect("barewire-node starts");
        let ep = node.accept().await.unwrap();
        let (_tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
        for n in 0..5 {
            assert_eq!(rx.recv().await.unwrap(), n);
        }
        assert!(
            barewire_test_support::Netns::ip(&["link", "set", &ns.veth, "down"]),
            "link down"
        );
        let t0 = Instant::now();
        let e = loop {
            match time::timeout(3 * KEEPALIVE, rx.recv())
                .await
                .expect("recv still waits on the cut-off sender")
            {
                Ok(_) => {} // sent before the cut
                Err(e) => break e,
            }
        };
        let took = t0.elapsed();
        kill(&mut peer);
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        assert!(
            took < KEEPALIVE + Duration::from_millis(1500),
            "recv failed {took:?} after the cut, with a keepalive of {KEEPALIVE:?}"
        );
        eprintln!("link cut under a waiting recv: PeerGone after {took:?}");
    });
    drop(ns);
}
