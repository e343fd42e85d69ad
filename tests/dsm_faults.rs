//! A home that is killed or stopped: this test process is rank 0 of a mesh with two
//! `barewire-dsm-node` processes, and checks what its operations on the failed member's objects
//! report, and how soon. A gone home gives `PeerGone` within the provider's fault bound; a
//! commit in flight when the home stopped is `Indeterminate`, never a success or a failure.

mod common;

use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire::dsm::{SharedArray, SharedMemory, SharedOptions};
use barewire::engine::{time, Runtime};
use barewire::{Error, Mesh, Node};
use common::Member;

/// The provider fails a stalled connection within 1 s; this leaves room for a loaded machine.
const BOUND: Duration = Duration::from_secs(3);
const KEYS: u64 = 6;

fn worker(rank: usize) -> Member {
    let out = std::env::temp_dir().join(format!(
        "barewire-dsm-faults-{}-{rank}.hist",
        std::process::id()
    ));
    let args = [
        "--rank".to_string(),
        rank.to_string(),
        "--ops".into(),
        "0".into(),
        "--keys".into(),
        KEYS.to_string(),
        "--out".into(),
        out.to_string_lossy().into_owned(),
    ];
    Member::spawn(env!("CARGO_BIN_EXE_barewire-dsm-node"), &args, None)
}

/// Rank 0 here, ranks 1 and 2 as processes, the same shared objects as the workload makes
/// (a barrier counter, six 64-byte keys, six word keys; keys 4 and 5 live on rank 2).
fn with_mesh<F, Fut>(body: F)
where
    F: FnOnce(Rc<[Member; 2]>, Rc<SharedArray<[u64; 8]>>, Rc<SharedArray<u64>>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let Some(cfg) = common::driver() else { return };
    let _one_at_a_time = common::serial();
    let mut workers = [worker(1), worker(2)];
    Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .unwrap()
        .block_on(async {
            let node = Node::with_config(&cfg).unwrap();
            let port = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
            let mut addrs = vec![format!("127.0.0.1:{port}")];
            for w in &workers {
                addrs.push(format!("127.0.0.1:{}", w.port()));
            }
            for w in &mut workers {
                w.say(&format!("ADDRS {}", addrs.join(" ")));
            }
            let addrs: Vec<_> = addrs.iter().map(|a| a.parse().unwrap()).collect();
            let mesh = Mesh::join(&node, 0, &addrs).await.unwrap();
            let opts = SharedOptions::default();
            let bar = SharedMemory::<u64>::create(&node, &mesh, 0, opts)
                .await
                .unwrap();
            let wide = SharedArray::<[u64; 8]>::create(&node, &mesh, KEYS, [0; 8], opts)
                .await
                .unwrap();
            let word = SharedArray::<u64>::create(&node, &mesh, KEYS, 0, opts)
                .await
                .unwrap();
            bar.fetch_add(0, 1).await.unwrap();
            while bar.read_from(0).await.unwrap() < 3 {
                time::sleep(Duration::from_millis(1)).await;
            }
            assert_eq!(wide.home_of(4), 2);
            // Everything works before the fault.
            wide.update(4, |v| [v[0] + 1; 8]).await.unwrap();
            word.fetch_add(4, 1).await.unwrap();
            body(Rc::new(workers), Rc::new(wide), Rc::new(word)).await;
        });
}

#[test]
fn a_killed_home_fails_its_objects_with_peer_gone_within_the_bound() {
    with_mesh(|workers, wide, word| async move {
        workers[1].signal(libc::SIGKILL);
        let t0 = Instant::now();
        // Where the home's memory is served without its CPU (shm, a NIC), reads right after
        // the kill may still be answered, with the last committed value, until the transport
        // sees the process gone; within the bound they fail.
        let e = loop {
            match wide.get(4).await {
                Ok(v) => assert_eq!(v, [1; 8], "a dying home serves its last value"),
                Err(e) => break e,
            }
            assert!(
                t0.elapsed() < BOUND,
                "still served after {:?}",
                t0.elapsed()
            );
            time::sleep(Duration::from_millis(1)).await;
        };
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        assert!(t0.elapsed() < BOUND, "took {:?}", t0.elapsed());
        // Known gone before anything is posted: a definite failure, not an unknown outcome.
        let e = word.fetch_add(5, 1).await.unwrap_err();
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        let e = wide.update(5, |v| *v).await.unwrap_err();
        assert!(matches!(e, Error::PeerGone(_)), "{e}");
        // The survivors' objects still work.
        assert_eq!(wide.update(0, |v| [v[0] + 1; 8]).await.unwrap(), [1; 8]);
        assert_eq!(word.fetch_add(2, 5).await.unwrap(), 0);
    });
}

#[test]
fn a_commit_to_a_home_stopped_mid_update_is_indeterminate() {
    with_mesh(|workers, wide, _| async move {
        let t0 = Instant::now();
        // The home stops after this node took the lock and before its commit arrives.
        let r = wide
            .update(4, |v| {
                workers[1].signal(libc::SIGSTOP);
                [v[0] + 1; 8]
            })
            .await;
        let took = t0.elapsed();
        workers[1].signal(libc::SIGCONT);
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Indeterminate(_)), "{e}");
        assert!(took < BOUND, "took {took:?}");
        assert!(
            took >= Duration::from_millis(500),
            "failed after only {took:?}"
        );
        // Afterwards: where the transport gave up on the stopped home (the software provider
        // fails a peer that does not answer within its bound), its objects are gone; where it
        // serves a stopped home's memory (shm), the connection survives the pause, and the
        // element holds the value from before the commit or the committed one.
        match wide.get(4).await {
            Err(e) => assert!(matches!(e, Error::PeerGone(_)), "{e}"),
            Ok(v) => assert!(
                v == [1; 8] || v == [2; 8],
                "an indeterminate commit left {v:?}"
            ),
        }
    });
}
