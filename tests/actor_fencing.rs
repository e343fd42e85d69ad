//! A node declared down is disconnected: the other side learns at once and declares the
//! first down in turn, so neither waits on a peer that drops its messages (as a lopsided
//! verdict, one side down and the other not, would leave them).

mod common;

use std::time::{Duration, Instant};

use barewire::actor::{spawn, Actor, ActorSystem, Context, SystemOptions};
use barewire::engine::time;
use barewire::Error;

struct Echo;
impl Actor for Echo {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, n: u64, _: &Context<Self>) -> u64 {
        n
    }
}

#[test]
fn a_node_declared_down_is_disconnected_and_declares_the_other_down_too() {
    common::meshed(2, |rank, _node, mesh| async move {
        // A deadline no one reaches here: only the declaration can take a node down.
        let opts = SystemOptions {
            misses: 1000,
            ..SystemOptions::default()
        };
        let sys = ActorSystem::start(&mesh, opts).await.unwrap();
        sys.register("echo", &spawn(Echo)).unwrap();
        let peer = 1 - rank;
        let echo = loop {
            if let Ok(e) = sys.lookup::<Echo>(peer, "echo").await {
                break e;
            }
            time::sleep(Duration::from_millis(1)).await;
        };
        assert_eq!(echo.ask(5, Duration::from_secs(5)).await.unwrap(), 5);
        time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        if rank == 0 {
            sys.declare_down(1);
        }
        let mut seen = 0;
        // (Both stay up meanwhile: only the disconnection can tell rank 1.)
        let down = time::timeout(Duration::from_secs(1), sys.next_down(&mut seen))
            .await
            .expect("both sides see the other down");
        assert_eq!(down, peer);
        eprintln!("rank {rank}: the other is down after {:?}", t0.elapsed());
        match echo.ask(6, Duration::from_secs(5)).await {
            Err(Error::PeerGone(_)) => {}
            other => panic!("rank {rank}: an ask to a down node: {other:?}"),
        }
        time::sleep(Duration::from_millis(1500)).await;
        drop(sys);
    });
}
