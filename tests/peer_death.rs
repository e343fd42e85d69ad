//! A channel's peer process killed (SIGKILL) on either side: the survivor's channel halves
//! fail with `PeerGone` within a bounded time, instead of hanging.

use barewire_test_support::{rt, ReadyChild};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use barewire::engine::time;
use barewire::{Error, Node};

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
