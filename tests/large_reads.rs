//! While large RDMA READs cross a connection both ways and the cores are busy (4 MiB, the
//! panels of examples/matmul.rs at n = 2048, f64),
//! messages on a channel over the same connection keep flowing.
mod common;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire::engine::{spawn_local, time, yield_now};
use barewire::{Align, ChannelOptions};

fn busy(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn reads_and_messages(bytes: usize) {
    common::meshed(2, move |rank, node, mesh| async move {
        let len = bytes / 8;
        let peer = 1 - rank;
        let ep = mesh.endpoint(peer);
        let mine = node.region::<u64>(len, Align::Page).unwrap();
        ep.send_region(&mine).await.unwrap();
        let theirs = ep.recv_region::<u64>().await.unwrap();
        let (tx, rx) = ep
            .open_channel::<u64>(ChannelOptions::new(64, 16 * 1024))
            .await
            .unwrap();
        let got = Rc::new(Cell::new(0u64));
        let g = got.clone();
        let _counter = spawn_local(async move {
            while let Ok(v) = rx.recv().await {
                if v == u64::MAX {
                    g.set(v);
                    break;
                }
            }
        });
        let sent = Rc::new(Cell::new(0u64));
        let (s, stop) = (sent.clone(), Rc::new(Cell::new(false)));
        let st = stop.clone();
        let ticker = spawn_local(async move {
            while !st.get() {
                tx.send(&s.get()).await.unwrap();
                s.set(s.get() + 1);
                time::sleep(Duration::from_millis(1)).await;
            }
            tx
        });
        let local = Rc::new(node.region::<u64>(len, Align::Page).unwrap());
        let (ep, theirs) = (Rc::new(ep.clone()), Rc::new(theirs));
        for _ in 0..8 {
            let (e, t, l) = (ep.clone(), theirs.clone(), local.clone());
            let read = spawn_local(async move { e.read_to_region(&t, 0, &l, 0, len).await });
            for _ in 0..20 {
                busy(Duration::from_millis(1));
                yield_now().await;
            }
            read.await.unwrap().unwrap();
        }
        stop.set(true);
        let tx = ticker.await.unwrap();
        // Then one side idles (its core asleep) while the other sends a last burst, spaced
        // out, and a sentinel: all of it arrives.
        tx.send(&u64::MAX).await.unwrap();
        let t0 = Instant::now();
        while got.get() != u64::MAX && t0.elapsed() < Duration::from_secs(5) {
            time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            got.get(),
            u64::MAX,
            "rank {rank}: the peer's last message never came"
        );
        time::sleep(Duration::from_millis(200)).await;
    });
}

#[test]
fn two_mib_reads() {
    reads_and_messages(2 << 20);
}

#[test]
fn four_mib_reads() {
    reads_and_messages(4 << 20);
}
