//! The typed API end to end over the software provider: two nodes (each its own core, in its
//! own thread) on loopback.

mod common;

use barewire_test_support::rt;
use common::listening;
use std::future::Future;
use std::time::Duration;

use barewire::engine::time;
use barewire::{Align, ChannelOptions, DistributedChannel, Endpoint, Error, Node};

/// Stays connected a moment after the last receive, so the peer's flush of its last message
/// completes before this side hangs up (closing drops whatever is still in flight).
async fn linger() {
    time::sleep(Duration::from_millis(100)).await;
}

/// Runs `server` on an accepting node in a thread and `client` on a connecting node here.
fn pair<S, SF, C, CF>(server: S, client: C)
where
    S: FnOnce(Node, Endpoint) -> SF + Send + 'static,
    SF: Future<Output = ()> + 'static,
    C: FnOnce(Node, Endpoint) -> CF,
    CF: Future<Output = ()>,
{
    let (t, port) = listening(|node| async move {
        let ep = node.accept().await.unwrap();
        server(node, ep).await;
    });
    rt().block_on(async move {
        let node = Node::soft().unwrap();
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        client(node, ep).await;
    });
    t.join().unwrap();
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Point {
    x: f32,
    y: f32,
    id: u32,
    tag: u32,
}

#[test]
fn typed_reads_writes_and_atomics_land_in_the_remote_region() {
    pair(
        |node, ep| async move {
            let points = node.region::<Point>(16, Align::CacheLine).unwrap();
            assert_eq!(points.as_ptr() as usize % 64, 0);
            let counters = node.region::<u64>(8, Align::Page).unwrap();
            assert_eq!(counters.as_ptr() as usize % 4096, 0);
            points.set(
                2,
                Point {
                    x: 1.5,
                    y: -2.0,
                    id: 7,
                    tag: 0,
                },
            );
            counters.set(5, 100);
            ep.send_region(&points).await.unwrap();
            ep.send_region(&counters).await.unwrap();
            let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), 1, "the client is done");
            // What the client did, seen from the owner's side.
            let p = points.to_vec();
            assert_eq!(
                p[3],
                Point {
                    x: 3.0,
                    y: 4.0,
                    id: 3,
                    tag: 9
                }
            );
            assert_eq!(
                &p[10..13],
                &[Point {
                    x: 0.5,
                    y: 0.5,
                    id: 10,
                    tag: 1
                }; 3]
            );
            assert_eq!(counters.get(0), 2 + 40);
            assert_eq!(counters.get(1), 77, "compare_and_swap took");
            assert_eq!(counters.get(5), 100, "untouched");
            assert_eq!(counters.get(7), 5, "swap");
            tx.send(&2).await.unwrap();
            tx.flush().await.unwrap();
        },
        |_node, ep| async move {
            let points = ep.recv_region::<Point>().await.unwrap();
            let counters = ep.recv_region::<u64>().await.unwrap();
            assert_eq!((points.len(), counters.len()), (16, 8));
            assert_eq!(
                ep.read(&points, 2).await.unwrap(),
                Point {
                    x: 1.5,
                    y: -2.0,
                    id: 7,
                    tag: 0
                }
            );
            ep.write(
                &points,
                3,
                Point {
                    x: 3.0,
                    y: 4.0,
                    id: 3,
                    tag: 9,
                },
            )
            .await
            .unwrap();
            ep.write_slice(
                &points,
                10,
                &[Point {
                    x: 0.5,
                    y: 0.5,
                    id: 10,
                    tag: 1,
                }; 3],
            )
            .await
            .unwrap();
            let back = ep.read_slice(&points, 9, 5).await.unwrap();
            assert_eq!(
                back[1..4],
                [Point {
                    x: 0.5,
                    y: 0.5,
                    id: 10,
                    tag: 1
                }; 3]
            );
            assert_eq!(ep.read(&counters, 5).await.unwrap(), 100);
            assert_eq!(ep.fetch_add(&counters, 0, 2).await.unwrap(), 0);
            assert_eq!(ep.fetch_add(&counters, 0, 40).await.unwrap(), 2);
            assert_eq!(ep.compare_and_swap(&counters, 1, 0, 77).await.unwrap(), 0);
            assert_eq!(
                ep.compare_and_swap(&counters, 1, 0, 99).await.unwrap(),
                77,
                "no swap"
            );
            ep.write(&counters, 7, 4).await.unwrap();
            assert_eq!(ep.swap(&counters, 7, 5).await.unwrap(), 4);
            // Out of bounds is refused here, before anything is posted.
            assert!(matches!(
                ep.read(&counters, 8).await,
                Err(Error::OutOfBounds { .. })
            ));
            assert!(matches!(
                ep.write_slice(
                    &points,
                    15,
                    &[Point {
                        x: 0.0,
                        y: 0.0,
                        id: 0,
                        tag: 0
                    }; 2]
                )
                .await,
                Err(Error::OutOfBounds { .. })
            ));
            let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            tx.send(&1).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), 2);
            linger().await;
        },
    );
}

#[test]
fn a_mismatched_type_is_refused_at_exchange() {
    pair(
        |node, ep| async move {
            let r = node.region::<u64>(4, Align::Natural).unwrap();
            ep.send_region(&r).await.unwrap();
            // Same size, other type: the channel is refused on both sides.
            let e = ep
                .open_channel::<u64>(Default::default())
                .await
                .err()
                .unwrap();
            assert!(matches!(e, Error::TypeMismatch(_)), "{e}");
            // The endpoint still works for a matching channel afterwards.
            let (tx, _rx) = ep.open_channel::<u32>(Default::default()).await.unwrap();
            tx.send(&5).await.unwrap();
            tx.flush().await.unwrap();
            time::sleep(Duration::from_millis(50)).await;
        },
        |_node, ep| async move {
            let e = ep.recv_region::<u32>().await.unwrap_err();
            assert_eq!(
                e.to_string(),
                "type mismatch: expected u32 (size 4, align 4), the peer offered u64 (size 8, align 8)"
            );
            let e = ep
                .open_channel::<[u8; 8]>(Default::default())
                .await
                .err()
                .unwrap();
            assert!(
                matches!(&e, Error::TypeMismatch(m) if m.expected.contains("[u8; 8]")),
                "{e}"
            );
            let (_tx, rx) = ep.open_channel::<u32>(Default::default()).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), 5);
            linger().await;
        },
    );
}

#[test]
fn typed_atomics_from_several_endpoints_give_the_exact_count() {
    const CLIENTS: usize = 4;
    const EACH: u64 = 200;
    let (tx, rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        rt().block_on(async move {
            let node = Node::soft().unwrap();
            tx.send(node.listen("127.0.0.1:0".parse().unwrap()).unwrap())
                .unwrap();
            let counter = node.region::<u64>(1, Align::CacheLine).unwrap();
            let mut eps = Vec::new();
            for _ in 0..CLIENTS {
                let ep = node.accept().await.unwrap();
                ep.send_region(&counter).await.unwrap();
                eps.push(ep);
            }
            for ep in &eps {
                let (_t, r) = ep.open_channel::<u64>(Default::default()).await.unwrap();
                assert_eq!(r.recv().await.unwrap(), 0);
            }
            assert_eq!(counter.get(0), CLIENTS as u64 * EACH);
            linger().await;
        })
    });
    let port: u16 = rx.recv().unwrap();
    rt().block_on(async move {
        let node = Node::soft().unwrap();
        let mut eps = Vec::new();
        for _ in 0..CLIENTS {
            let ep = node
                .connect(format!("127.0.0.1:{port}").parse().unwrap())
                .await
                .unwrap();
            let r = ep.recv_region::<u64>().await.unwrap();
            eps.push((ep, r));
        }
        // All endpoints race on the one counter, interleaved.
        let tasks: Vec<_> = eps
            .iter()
            .map(|(ep, r)| {
                let (ep, r) = (ep.clone(), *r);
                barewire::engine::spawn_local(async move {
                    let mut olds = Vec::new();
                    for _ in 0..EACH {
                        olds.push(ep.fetch_add(&r, 0, 1).await.unwrap());
                    }
                    olds
                })
            })
            .collect();
        let mut olds = Vec::new();
        for t in tasks {
            olds.extend(t.await.unwrap());
        }
        olds.sort_unstable();
        assert_eq!(olds, (0..CLIENTS as u64 * EACH).collect::<Vec<_>>());
        for (ep, _) in &eps {
            let (t, _r) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            t.send(&0).await.unwrap();
            t.flush().await.unwrap();
        }
    });
    server.join().unwrap();
}

#[test]
fn a_full_ring_holds_the_sender_back_until_the_receiver_reads() {
    pair(
        |_node, ep| async move {
            let opts = ChannelOptions::new(8, 64);
            let (_tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            // Read nothing for a while: the sender must stop at 8.
            time::sleep(Duration::from_millis(300)).await;
            for i in 0..20u64 {
                assert_eq!(rx.recv().await.unwrap(), i);
            }
            // Stay connected while the client's flush completes.
            time::sleep(Duration::from_millis(100)).await;
        },
        |_node, ep| async move {
            let opts = ChannelOptions::new(8, 64);
            let (tx, _rx) = ep.open_channel::<u64>(opts).await.unwrap();
            for i in 0..8u64 {
                tx.send(&i).await.unwrap();
            }
            let blocked = time::timeout(Duration::from_millis(150), tx.send(&8)).await;
            assert!(blocked.is_err(), "the ninth send waited for room");
            for i in 8..20u64 {
                tx.send(&i).await.unwrap();
            }
            tx.flush().await.unwrap();
        },
    );
}

#[test]
fn messages_over_the_maximum_are_refused() {
    pair(
        |_node, ep| async move {
            let _c = ep
                .open_bare_channel::<Vec<u8>>(ChannelOptions::new(4, 100))
                .await
                .unwrap();
            time::sleep(Duration::from_millis(50)).await;
        },
        |_node, ep| async move {
            let (tx, _rx) = ep
                .open_bare_channel::<Vec<u8>>(ChannelOptions::new(4, 100))
                .await
                .unwrap();
            let e = tx.send(&vec![0u8; 200]).await.unwrap_err();
            assert!(matches!(e, Error::TooLarge { len: 202, .. }), "{e}");
        },
    );
}

#[test]
fn a_dropped_receiver_fails_the_sender_and_a_dropped_sender_ends_the_receiver() {
    pair(
        |_node, ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), 1);
            drop(rx);
            // Keep the connection up while the client finds out.
            assert_eq!(
                time::timeout(Duration::from_secs(5), async {
                    let (_t2, r2) = ep.open_channel::<u64>(Default::default()).await.unwrap();
                    r2.recv().await
                })
                .await
                .unwrap()
                .unwrap(),
                9
            );
            drop(tx);
            linger().await;
        },
        |_node, ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            tx.send(&1).await.unwrap();
            let t0 = std::time::Instant::now();
            let e = loop {
                match tx.send(&2).await {
                    Ok(()) => time::sleep(Duration::from_millis(5)).await,
                    Err(e) => break e,
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "the sender never heard"
                );
            };
            assert_eq!(e, Error::Closed);
            let (t2, _r2) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            t2.send(&9).await.unwrap();
            t2.flush().await.unwrap();
            // The server drops its sender: our receiver ends with Closed.
            assert_eq!(rx.recv().await, Err(Error::Closed));
        },
    );
}

#[test]
fn a_distributed_channel_spreads_broadcasts_and_gathers() {
    const NODES: usize = 3;
    let mut ports = Vec::new();
    let mut threads = Vec::new();
    for n in 0..NODES as u64 {
        let (tx, rx) = std::sync::mpsc::channel();
        threads.push(std::thread::spawn(move || {
            rt().block_on(async move {
                let node = Node::soft().unwrap();
                tx.send(node.listen("127.0.0.1:0".parse().unwrap()).unwrap())
                    .unwrap();
                let ep = node.accept().await.unwrap();
                let (t, r) = ep.open_channel::<u64>(Default::default()).await.unwrap();
                // Two distributed items, then the broadcast; answer with their sum + node.
                let a = r.recv().await.unwrap();
                let b = r.recv().await.unwrap();
                let c = r.recv().await.unwrap();
                assert_eq!(c, 1000, "broadcast");
                assert_eq!((a, b), (n, n + NODES as u64), "round-robin");
                t.send(&(a + b + c + 100 * n)).await.unwrap();
                t.flush().await.unwrap();
                time::sleep(Duration::from_millis(50)).await;
            })
        }));
        ports.push(rx.recv().unwrap());
    }
    rt().block_on(async move {
        let node = Node::soft().unwrap();
        let mut eps = Vec::new();
        for p in &ports {
            eps.push(
                node.connect(format!("127.0.0.1:{p}").parse().unwrap())
                    .await
                    .unwrap(),
            );
        }
        let dc = DistributedChannel::<u64>::open(&eps, Default::default())
            .await
            .unwrap();
        assert_eq!(dc.len(), NODES);
        dc.distribute(&(0..2 * NODES as u64).collect::<Vec<_>>())
            .await
            .unwrap();
        dc.broadcast(&1000).await.unwrap();
        let got = dc.gather().await.unwrap();
        let want: Vec<u64> = (0..NODES as u64)
            .map(|n| n + (n + NODES as u64) + 1000 + 100 * n)
            .collect();
        assert_eq!(got, want);
        assert!(dc.write_to_node(NODES, &0).await.is_err());
        linger().await;
    });
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn a_million_messages_arrive_in_order_exactly_once_through_wraps_and_backpressure() {
    const N: u64 = 1_000_000;
    pair(
        |_node, ep| async move {
            // A small ring (wraps 15,625 times) and a receiver that stalls now and then, so the
            // sender keeps running into a full ring.
            let opts = ChannelOptions::new(64, 16);
            let (tx, rx) = ep.open_channel::<[u64; 2]>(opts).await.unwrap();
            let mut sum = 0u64;
            for i in 0..N {
                let [seq, check] = rx.recv().await.unwrap();
                assert_eq!(seq, i, "in order, none lost, none twice");
                assert_eq!(check, seq.wrapping_mul(0x9e37_79b9_7f4a_7c15), "intact");
                sum = sum.wrapping_add(seq);
                if i % 200_000 == 199_999 {
                    time::sleep(Duration::from_millis(20)).await;
                }
            }
            assert_eq!(sum, N * (N - 1) / 2);
            assert_eq!(rx.received(), N);
            tx.send(&[N, 0]).await.unwrap();
            tx.flush().await.unwrap();
        },
        |_node, ep| async move {
            let opts = ChannelOptions::new(64, 16);
            let (tx, rx) = ep.open_channel::<[u64; 2]>(opts).await.unwrap();
            for i in 0..N {
                tx.send(&[i, i.wrapping_mul(0x9e37_79b9_7f4a_7c15)])
                    .await
                    .unwrap();
            }
            assert_eq!(tx.sent(), N);
            assert_eq!(rx.recv().await.unwrap(), [N, 0]);
            linger().await;
        },
    );
}

#[test]
fn recv_many_takes_what_is_there_in_order_up_to_its_limit_then_ends_with_closed() {
    const N: u64 = 5_000;
    pair(
        |_node, ep| async move {
            let (_tx, rx) = ep
                .open_channel::<u64>(ChannelOptions::new(64, 8))
                .await
                .unwrap();
            let (_btx, brx) = ep
                .open_bare_channel::<String>(ChannelOptions::new(16, 64))
                .await
                .unwrap();
            // Let the sender fill the ring: a full ring is there at once.
            time::sleep(Duration::from_millis(200)).await;
            let mut got = Vec::new();
            assert_eq!(rx.recv_many(&mut got, 0).await.unwrap(), 0);
            assert_eq!(rx.recv_many(&mut got, 10).await.unwrap(), 10);
            assert_eq!(got, (0..10).collect::<Vec<u64>>());
            let mut largest = 0;
            while (got.len() as u64) < N {
                let before = got.len();
                let n = rx.recv_many(&mut got, 100).await.unwrap();
                assert!((1..=100).contains(&n), "took {n}");
                assert_eq!(got.len(), before + n, "appended what it said");
                largest = largest.max(n);
            }
            assert_eq!(got, (0..N).collect::<Vec<u64>>(), "in order, each once");
            assert!(largest > 1, "some call took a batch");
            // The sender is gone once all was taken: nothing more, and Closed.
            let before = got.len();
            assert_eq!(rx.recv_many(&mut got, 100).await, Err(Error::Closed));
            assert_eq!(got.len(), before);
            // A codec that is not plain data decodes each message the same way.
            let mut words = Vec::new();
            while words.len() < 3 {
                brx.recv_many(&mut words, 8).await.unwrap();
            }
            assert_eq!(words, ["one", "two", "three"]);
        },
        |_node, ep| async move {
            let (tx, _rx) = ep
                .open_channel::<u64>(ChannelOptions::new(64, 8))
                .await
                .unwrap();
            let (btx, _brx) = ep
                .open_bare_channel::<String>(ChannelOptions::new(16, 64))
                .await
                .unwrap();
            for w in ["one", "two", "three"] {
                btx.send(&w.to_string()).await.unwrap();
            }
            btx.flush().await.unwrap();
            for i in 0..N {
                tx.send(&i).await.unwrap();
            }
            tx.flush().await.unwrap();
            drop(tx);
            linger().await;
        },
    );
}

#[test]
fn dropping_a_channel_leaves_the_connection_usable() {
    pair(
        |_node, ep| async move {
            for round in 0..3u64 {
                let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
                assert_eq!(rx.recv().await.unwrap(), round);
                tx.send(&(round + 100)).await.unwrap();
                tx.flush().await.unwrap();
                // Both halves go here while the peer's close notices are still on the way.
            }
            let (_tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), 7);
            linger().await;
        },
        |_node, ep| async move {
            for round in 0..3u64 {
                let (tx, rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
                tx.send(&round).await.unwrap();
                assert_eq!(rx.recv().await.unwrap(), round + 100);
            }
            let (tx, _rx) = ep.open_channel::<u64>(Default::default()).await.unwrap();
            tx.send(&7).await.unwrap();
            tx.flush().await.unwrap();
        },
    );
}

/// A message of length `len` whose bytes say which message it is (so a mix-up shows).
fn varied(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (i as u8).wrapping_add(k as u8) | 1)
        .collect()
}

/// Lengths that grow and shrink across the slot, so a slot keeps getting a shorter message
/// after a longer one (the staging slot then still holds the longer one's bytes and mark).
fn length_of(i: u64, max: usize) -> usize {
    match i % 5 {
        0 => max,
        1 => 0,
        2 => (i as usize * 7) % (max + 1),
        3 => 1,
        _ => max / 2,
    }
}

/// Variable-length messages through rings of both shapes: small slots, where bursts go out as
/// runs of whole slots, and large ones, one WRITE per message; each watched by the receiving
/// core (the software provider's default) and announced by immediate data (what verbs does).
/// The receiver stalls now and then, so the sender fills the ring and wraps it many times.
#[test]
fn messages_of_every_length_arrive_intact_through_both_ring_shapes() {
    const N: u64 = 20_000;
    const SHAPES: [ChannelOptions; 4] = [
        ChannelOptions::new(8, 100),
        ChannelOptions::new(8, 1500),
        ChannelOptions {
            announce: true,
            ..ChannelOptions::new(8, 100)
        },
        ChannelOptions {
            announce: true,
            ..ChannelOptions::new(8, 1500)
        },
    ];
    // The BARE encoding of a byte list is a length varint plus the bytes.
    let max_body = |o: &ChannelOptions| o.max_message - 2;
    pair(
        move |_node, ep| async move {
            for opts in SHAPES {
                let (tx, rx) = ep.open_bare_channel::<Vec<u8>>(opts).await.unwrap();
                for i in 0..N {
                    let got = rx.recv().await.unwrap();
                    assert_eq!(got, varied(i, length_of(i, max_body(&opts))), "message {i}");
                    if i % 5_000 == 4_999 {
                        time::sleep(Duration::from_millis(5)).await;
                    }
                }
                tx.send(&vec![]).await.unwrap();
                tx.flush().await.unwrap();
            }
            linger().await;
        },
        move |_node, ep| async move {
            for opts in SHAPES {
                let (tx, rx) = ep.open_bare_channel::<Vec<u8>>(opts).await.unwrap();
                for i in 0..N {
                    tx.send(&varied(i, length_of(i, max_body(&opts))))
                        .await
                        .unwrap();
                    if i % 7 == 0 {
                        // Yield now and then: runs of different lengths go out.
                        time::sleep(Duration::ZERO).await;
                    }
                }
                assert!(rx.recv().await.unwrap().is_empty());
            }
        },
    );
}

/// A receiver that takes every message and hangs up at once (no lingering): the sender's
/// flush afterwards still succeeds, because the receiver's last word (how many it took)
/// travels ahead of the hang-up; sending more then fails.
#[test]
fn a_flush_after_the_receiver_took_everything_and_left_succeeds() {
    const N: u64 = 1000;
    pair(
        |_node, ep| async move {
            let (_tx, rx) = ep
                .open_channel::<u64>(ChannelOptions::new(64, 8))
                .await
                .unwrap();
            for i in 0..N {
                assert_eq!(rx.recv().await.unwrap(), i);
            }
            // Everything (receiver, sender, endpoint) goes here, right after the last recv.
        },
        |_node, ep| async move {
            let (tx, _rx) = ep
                .open_channel::<u64>(ChannelOptions::new(64, 8))
                .await
                .unwrap();
            for i in 0..N {
                tx.send(&i).await.unwrap();
            }
            // The peer is gone by the time the flush asks.
            time::sleep(Duration::from_millis(200)).await;
            tx.flush().await.unwrap();
            assert!(tx.send(&N).await.is_err());
        },
    );
}

/// Two tasks share one sender (by reference) and both find the ring full: when the receiver
/// frees slots, both are woken and everything arrives, each task's messages in its order.
#[test]
fn every_task_waiting_on_a_shared_sender_is_woken() {
    const EACH: u32 = 300;
    pair(
        |_node, ep| async move {
            let (_tx, rx) = ep
                .open_channel::<[u32; 2]>(ChannelOptions::new(4, 8))
                .await
                .unwrap();
            // Let both senders run into the full ring first.
            time::sleep(Duration::from_millis(50)).await;
            let mut next = [0u32; 2];
            for _ in 0..2 * EACH {
                let [task, seq] = rx.recv().await.unwrap();
                assert_eq!(seq, next[task as usize], "task {task} in order");
                next[task as usize] += 1;
            }
            assert_eq!(next, [EACH, EACH]);
        },
        |_node, ep| async move {
            let (tx, _rx) = ep
                .open_channel::<[u32; 2]>(ChannelOptions::new(4, 8))
                .await
                .unwrap();
            let tx = std::rc::Rc::new(tx);
            let tasks: Vec<_> = (0..2u32)
                .map(|task| {
                    let tx = tx.clone();
                    barewire::engine::spawn_local(async move {
                        for seq in 0..EACH {
                            tx.send(&[task, seq]).await.unwrap();
                        }
                    })
                })
                .collect();
            for t in tasks {
                time::timeout(Duration::from_secs(20), t)
                    .await
                    .expect("a sender task was never woken")
                    .unwrap();
            }
            tx.flush().await.unwrap();
        },
    );
}

/// A region sent over one connection is reachable through that connection only: the same key
/// presented on another connection to the same node (another node's, or a second one of the
/// same peer) is refused, and nothing in the region changes.
#[test]
fn a_region_key_works_only_on_the_connection_it_was_sent_over() {
    let (server, port) = listening(|node| async move {
        let to_a = node.accept().await.unwrap();
        let to_b = node.accept().await.unwrap();
        let to_a2 = node.accept().await.unwrap();
        let counters = node.region::<u64>(8, Align::CacheLine).unwrap();
        counters.set(1, 5);
        to_a.send_region(&counters).await.unwrap();
        // A says it is done; then nothing but A's write may have landed.
        let (_tx, done) = to_a.open_channel::<u64>(Default::default()).await.unwrap();
        assert_eq!(done.recv().await.unwrap(), 1);
        assert_eq!(counters.to_vec(), vec![0, 5, 0, 0, 0, 0, 7, 0]);
        linger().await;
        drop((to_b, to_a2));
    });
    rt().block_on(async move {
        let at = format!("127.0.0.1:{port}").parse().unwrap();
        let (a, b) = (Node::soft().unwrap(), Node::soft().unwrap());
        let ep_a = a.connect(at).await.unwrap();
        let ep_b = b.connect(at).await.unwrap();
        let ep_a2 = a.connect(at).await.unwrap();
        let r = ep_a.recv_region::<u64>().await.unwrap();
        // B holds A's key (it leaked, or was guessed): refused, on read and on write.
        assert!(
            ep_b.write(&r, 1, 99).await.is_err(),
            "B's write was refused"
        );
        assert!(ep_b.read(&r, 1).await.is_err(), "B's read was refused");
        // A's own connection still works.
        assert_eq!(ep_a.read(&r, 1).await.unwrap(), 5);
        ep_a.write(&r, 6, 7).await.unwrap();
        // A second connection of A's own node holds no valid key either.
        assert!(
            ep_a2.write(&r, 2, 99).await.is_err(),
            "A's second connection was refused"
        );
        let (done, _rx) = ep_a.open_channel::<u64>(Default::default()).await.unwrap();
        done.send(&1).await.unwrap();
        done.flush().await.unwrap();
        linger().await;
        linger().await;
    });
    server.join().unwrap();
}

/// A peer that never sends the region asked for, or never opens its side of a channel, costs a
/// timeout within the endpoint's handshake limit, not a task stuck for good; the channel case
/// also closes the connection (the two sides no longer agree on which channel is which).
#[test]
fn a_silent_peer_times_out_region_and_channel_handshakes() {
    pair(
        |_node, ep| async move {
            // Says nothing until the client is done.
            let _ = time::timeout(Duration::from_secs(10), ep.recv_region::<u64>()).await;
        },
        |_node, ep| async move {
            assert_eq!(
                ep.handshake_timeout(),
                Some(barewire::DEFAULT_HANDSHAKE_TIMEOUT)
            );
            ep.set_handshake_timeout(Some(Duration::from_millis(300)));
            let t = std::time::Instant::now();
            // An outer limit far above the handshake's, so a missing deadline fails the test
            // instead of hanging it.
            let got = time::timeout(Duration::from_secs(5), ep.recv_region::<u64>())
                .await
                .expect("recv_region returned within 5 s");
            assert!(matches!(got, Err(Error::Timeout(_))), "{:?}", got.err());
            assert!(t.elapsed() >= Duration::from_millis(300));
            let got = time::timeout(
                Duration::from_secs(5),
                ep.open_channel::<u64>(Default::default()),
            )
            .await
            .expect("open_channel returned within 5 s");
            assert!(matches!(got, Err(Error::Timeout(_))), "{:?}", got.err());
            // The abandoned channel handshake failed the connection: the next call says so at
            // once.
            let again = std::time::Instant::now();
            assert!(ep.open_channel::<u64>(Default::default()).await.is_err());
            assert!(again.elapsed() < Duration::from_millis(200));
            assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        },
    );
}

/// A region of another node (another protection domain) sent over a connection is refused at
/// once, saying why, and the connection goes on: it used to be sent as a key that named nothing
/// the peer could use, and the peer's first use of it was a protection error (that, over the
/// software provider, ended the connection).
#[test]
fn a_region_of_another_node_is_refused_when_sent_and_the_connection_goes_on() {
    rt().block_on(async {
        for driver in ["soft", "shm"] {
            let cfg = barewire::drivers::DriverConfig::parse(driver, None).unwrap();
            let (nodes, a, b) = Node::loopback_pair(&cfg).await.unwrap();
            let elsewhere = Node::with_config(&cfg).unwrap();
            let foreign = elsewhere.region::<u64>(8, Align::Natural).unwrap();
            let e = a.send_region(&foreign).await.unwrap_err();
            assert!(e.to_string().contains("protection domain"), "{driver}: {e}");
            let peers = nodes[1].region::<u64>(8, Align::Natural).unwrap();
            assert!(
                a.send_region(&peers).await.is_err(),
                "{driver}: the peer's own region"
            );
            // The connection is as good as before.
            let mine = nodes[0].region::<u64>(8, Align::Natural).unwrap();
            a.send_region(&mine).await.unwrap();
            let remote = b.recv_region::<u64>().await.unwrap();
            b.write(&remote, 3, 33).await.unwrap();
            assert_eq!(mine.get(3), 33, "{driver}");
        }
    });
}

/// Listening again moves a node to the new address: the previous listener closes (after an
/// `accept` that was waiting on it is dropped), and the next `accept` serves the new one. An
/// accept dropped while waiting used to put the previous listener back over the new one.
#[test]
fn listening_again_replaces_the_listener_even_across_a_waiting_accept() {
    rt().block_on(async {
        let node = Node::soft().unwrap();
        let first = node.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let second = {
            // An accept waiting on the first listener...
            let mut waiting = std::pin::pin!(node.accept());
            assert!(poll_once(waiting.as_mut()).await.is_none());
            // ...while the node moves to a second address; then the accept is dropped.
            node.listen("127.0.0.1:0".parse().unwrap()).unwrap()
        };
        assert_ne!(first, second);
        let client = Node::soft().unwrap();
        let to = |p: u16| format!("127.0.0.1:{p}").parse().unwrap();
        assert!(
            client.connect(to(first)).await.is_err(),
            "the first listener is closed"
        );
        let connecting = barewire::engine::spawn_local(async move {
            let ep = client.connect(to(second)).await;
            (client, ep)
        });
        let accepted = node.accept().await.unwrap();
        let (_client, ep) = connecting.await.unwrap();
        drop((accepted, ep.unwrap()));
    });
}

/// Polls `f` once: its output if it is ready at once.
async fn poll_once<F: std::future::Future>(mut f: std::pin::Pin<&mut F>) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match f.as_mut().poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}
