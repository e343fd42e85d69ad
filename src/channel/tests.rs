//! Unit tests of the ring layout, of buffer lifetimes, and of what a connection takes from its
//! peer.

use super::*;
use barewire_drivers::{Access, Device, DriverConfig};

/// Runs `f` on a one-core runtime that sleeps when idle (these tests share CI's two CPUs).
fn on_a_sleeping_core<F: std::future::Future>(f: F) -> F::Output {
    barewire_engine::Runtime::builder()
        .cores(1)
        .sleeping()
        .build()
        .unwrap()
        .block_on(f)
}

/// Channels opened and dropped over and over on one long-lived connection: each dropped
/// half's buffer goes once the peer's last word for it has arrived, so nothing piles up.
#[test]
fn dropped_channels_release_their_buffers_once_the_peer_is_done() {
    use std::time::Duration;
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(&DriverConfig::parse("soft", None).unwrap()).await;
        for round in 0..50u64 {
            let ea2 = ea.clone();
            let side_a = barewire_engine::spawn_local(async move {
                let (tx, rx) = ea2
                    .open_channel::<u64>(ChannelOptions::new(8, 8))
                    .await
                    .unwrap();
                tx.send(&round).await.unwrap();
                assert_eq!(rx.recv().await.unwrap(), round + 1);
                // This side drops its halves first in even rounds, last in odd ones.
                if round % 2 == 1 {
                    barewire_engine::time::sleep(Duration::from_millis(2)).await;
                }
            });
            let (tx, rx) = eb
                .open_channel::<u64>(ChannelOptions::new(8, 8))
                .await
                .unwrap();
            assert_eq!(rx.recv().await.unwrap(), round);
            tx.send(&(round + 1)).await.unwrap();
            tx.flush().await.unwrap();
            if round % 2 == 0 {
                barewire_engine::time::sleep(Duration::from_millis(2)).await;
            }
            drop((tx, rx));
            side_a.await.unwrap();
        }
        // Let the last notices land.
        barewire_engine::time::sleep(Duration::from_millis(20)).await;
        for ep in [&ea, &eb] {
            let left = ep.inner().retired.borrow().len();
            assert_eq!(left, 0, "{left} buffers of dropped halves still held");
        }
        still_serves(&ea, &eb).await;
    });
}

/// The connection of `ea` and `eb` still opens a channel, and a message crosses it.
async fn still_serves(ea: &crate::Endpoint, eb: &crate::Endpoint) {
    let ea2 = ea.clone();
    let side_a = barewire_engine::spawn_local(async move {
        let (tx, _rx) = ea2
            .open_channel::<u64>(ChannelOptions::new(8, 8))
            .await
            .unwrap();
        tx.send(&7).await.unwrap();
        tx.flush().await.unwrap();
    });
    let (_tx, rx) = eb
        .open_channel::<u64>(ChannelOptions::new(8, 8))
        .await
        .unwrap();
    assert_eq!(rx.recv().await.unwrap(), 7);
    side_a.await.unwrap();
}

/// A long-lived connection opens and closes more channels over its life than it has ids (1,024
/// per side, for the immediate's 11 bits) or receives (each channel adds some to the
/// connection's pool): an id comes back once its sender is dropped and the receiver's final
/// word for it has arrived, a closed channel's receives serve the next one, and the opens never
/// run out.
#[test]
fn a_connection_opens_more_channels_over_its_life_than_it_has_ids() {
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(&DriverConfig::parse("soft", None).unwrap()).await;
        for round in 0..1500u64 {
            let ea2 = ea.clone();
            let side_a = barewire_engine::spawn_local(async move {
                let (tx, rx) = ea2
                    .open_channel::<u64>(ChannelOptions::new(4, 8))
                    .await
                    .unwrap_or_else(|e| panic!("round {round}: {e}"));
                tx.send(&round).await.unwrap();
                assert_eq!(rx.recv().await.unwrap(), round + 1);
            });
            let (tx, rx) = eb
                .open_channel::<u64>(ChannelOptions::new(4, 8))
                .await
                .unwrap_or_else(|e| panic!("round {round}: {e}"));
            assert_eq!(rx.recv().await.unwrap(), round);
            tx.send(&(round + 1)).await.unwrap();
            tx.flush().await.unwrap();
            drop((tx, rx));
            side_a.await.unwrap();
        }
        barewire_engine::time::sleep(std::time::Duration::from_millis(20)).await;
        for ep in [&ea, &eb] {
            assert!(ep.inner().retired.borrow().is_empty());
            assert!(ep.inner().shared.borrow().inbox.is_empty());
            // Each channel's receives went back to the pool: it holds the control receives
            // and a few channels' worth, not 1,500 channels' (12 each).
            let slots = ep.inner().receive_slots();
            assert!(slots < 200, "{slots} receive slots");
        }
    });
}

/// A connection refuses any number of channel opens over its life: each refused open gives
/// back the receives it added and, once the peer's answer to it has come, its id. 1,100
/// rounds (more than the 1,024 ids a side has) of the two ways an open is refused: a type
/// mismatch, which both sides refuse, and a ring beyond a's limit, which only a refuses (b
/// accepts a's half, so b's Accept reaches a after a gave its half up), with either side
/// opening first.
#[test]
fn refused_channels_give_back_their_receives_and_ids() {
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(&DriverConfig::parse("soft", None).unwrap()).await;
        ea.set_channel_ring_limit(16 << 10);
        for round in 0..1100 {
            let mismatch = round % 2 == 0;
            let ea2 = ea.clone();
            let side_a = barewire_engine::spawn_local(async move {
                if round % 4 >= 2 {
                    barewire_engine::yield_now().await;
                }
                ea2.open_channel::<u64>(ChannelOptions::new(4, 8))
                    .await
                    .map(|_| ())
            });
            let at_b = if mismatch {
                eb.open_channel::<u32>(ChannelOptions::new(4, 8))
                    .await
                    .map(|_| ())
            } else {
                eb.open_channel::<u64>(ChannelOptions::new(1025, 8))
                    .await
                    .map(|_| ())
            };
            let at_a = side_a.await.unwrap();
            let why = if mismatch {
                "type"
            } else {
                "set_channel_ring_limit"
            };
            for (side, r) in [("a", at_a), ("b", at_b)] {
                match r {
                    Err(e) => assert!(e.to_string().contains(why), "round {round}, {side}: {e}"),
                    Ok(()) => panic!("round {round}, {side}: a refused channel opened"),
                }
            }
        }
        still_serves(&ea, &eb).await;
        for ep in [&ea, &eb] {
            let slots = ep.inner().receive_slots();
            assert!(slots < 200, "{slots} receive slots");
            let s = ep.inner().shared.borrow();
            assert!(
                s.unanswered.len() <= 1,
                "{} ids await answers",
                s.unanswered.len()
            );
        }
    });
}

/// A channel whose announced direction would keep more receives posted than the connection's
/// completion queue holds is refused on both sides with the reason, before anything is
/// posted for it, and the connection goes on serving channels that fit.
#[test]
fn a_channel_needing_more_receives_than_the_queue_holds_is_refused_on_both_sides() {
    // Completion queues of 16 × 64 = 1,024.
    let cfg = DriverConfig::parse("soft", None).unwrap().queue_depth(64);
    let announced = ChannelOptions {
        announce: true,
        ..ChannelOptions::new(8, 8)
    };
    // a's direction is announced: a receive for each of b's 1,024 slots, and a few.
    refused_on_both_sides(
        &cfg,
        |_| {},
        announced,
        ChannelOptions::new(1024, 8),
        "BAREWIRE_QUEUE_DEPTH",
    );
}

/// A peer's channel whose ring would exceed what this side allocates for one
/// (`Endpoint::set_channel_ring_limit`) is refused on both sides with the reason, nothing
/// allocated, and the connection goes on serving channels that fit.
#[test]
fn a_channel_ring_beyond_the_receivers_limit_is_refused_on_both_sides() {
    let cfg = DriverConfig::parse("soft", None).unwrap();
    // b's direction: 1,024 slots of 16 bytes (a u64 with its length and mark) into a's ring.
    refused_on_both_sides(
        &cfg,
        |a| {
            assert_eq!(a.channel_ring_limit(), crate::DEFAULT_CHANNEL_RING_LIMIT);
            a.set_channel_ring_limit(16 << 10);
        },
        ChannelOptions::new(8, 8),
        ChannelOptions::new(1025, 8),
        "set_channel_ring_limit",
    );
}

/// Two soft nodes made with `cfg` (a accepting, set up by `limit_a`) open a channel of `u64`
/// with `at_a` and `at_b`; a's side must refuse with `why` in its error, and b's open fail
/// with the refusal. The connection then serves a channel of `at_a` against 64 slots.
fn refused_on_both_sides(
    cfg: &DriverConfig,
    limit_a: impl FnOnce(&crate::Endpoint),
    at_a: ChannelOptions,
    at_b: ChannelOptions,
    why: &'static str,
) {
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(cfg).await;
        limit_a(&ea);
        // Twice: a opening first; then b, so that b's answer to a's Open reaches a after a has
        // refused and given up its half.
        for b_first in [false, true] {
            let eb2 = eb.clone();
            let side_b = barewire_engine::spawn_local(async move {
                eb2.open_channel::<u64>(at_b).await.map(|_| ())
            });
            if b_first {
                barewire_engine::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            match ea.open_channel::<u64>(at_a).await.map(|_| ()) {
                Err(Error::Invalid(e)) => assert!(e.contains(why), "{e}"),
                other => panic!("a: expected the channel refused, got {other:?}"),
            }
            match side_b.await.unwrap() {
                Err(e) => assert!(
                    e.to_string().contains("refused") && e.to_string().contains(why),
                    "{e}"
                ),
                Ok(()) => panic!("b: the peer refused the channel, yet it opened"),
            }
        }
        // The connection still works.
        let ea2 = ea.clone();
        let side_a = barewire_engine::spawn_local(async move {
            let (tx, rx) = ea2.open_channel::<u64>(at_a).await.unwrap();
            tx.send(&41).await.unwrap();
            assert_eq!(rx.recv().await.unwrap(), 42);
        });
        let (tx, rx) = eb
            .open_channel::<u64>(ChannelOptions::new(64, 8))
            .await
            .unwrap();
        assert_eq!(rx.recv().await.unwrap(), 41);
        tx.send(&42).await.unwrap();
        tx.flush().await.unwrap();
        side_a.await.unwrap();
        // Nothing is left waiting: b's answers to a's Opens, which a gave up on when it refused
        // b's halves, were dropped, not kept for ever.
        for ep in [&ea, &eb] {
            let inbox = &ep.inner().shared.borrow().inbox;
            assert!(inbox.is_empty(), "{inbox:?}");
        }
    });
}

/// An open that fails on this side before it sends anything (its staging buffer cannot be
/// had) says why, and takes no place in the pairing of opens: the next open on each side pair
/// up and carry messages. (It used to take a place, so the next open here waited for an Open
/// the peer never sent, and after the handshake timeout the connection was closed.)
#[test]
fn an_open_that_fails_here_before_sending_leaves_later_opens_paired() {
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(&DriverConfig::parse("soft", None).unwrap()).await;
        let huge = ChannelOptions::new(u32::MAX, imm::MAX_MESSAGE);
        match ea.open_channel::<u64>(huge).await.map(|_| ()) {
            Err(Error::Invalid(e)) => assert!(e.contains("bytes of staging"), "{e}"),
            other => panic!("expected the open refused here, got {other:?}"),
        }
        let eb2 = eb.clone();
        let side_b = barewire_engine::spawn_local(async move {
            let (tx, rx) = eb2.open_channel::<u64>(ChannelOptions::new(64, 8)).await?;
            tx.send(&7).await?;
            tx.flush().await?;
            rx.recv().await
        });
        let opened = barewire_engine::time::timeout(
            std::time::Duration::from_secs(5),
            ea.open_channel::<u64>(ChannelOptions::new(64, 8)),
        )
        .await
        .expect("the next open pairs with the peer's first");
        let (tx, rx) = opened.unwrap();
        assert_eq!(rx.recv().await.unwrap(), 7);
        tx.send(&8).await.unwrap();
        tx.flush().await.unwrap();
        assert_eq!(side_b.await.unwrap().unwrap(), 8);
    });
}

/// An answer (Accept or Refuse) for a channel this side has no open half of (one it gave up,
/// or never had) is dropped on arrival: nothing would ever take it from the queue.
#[test]
fn an_answer_for_no_open_channel_is_dropped() {
    use crate::control::Control;
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(&DriverConfig::parse("soft", None).unwrap()).await;
        let ring = eb.inner().scratch(64).unwrap().descriptor();
        for c in [
            Control::Accept {
                id: 999,
                ring,
                polled: true,
            },
            Control::Refuse {
                id: 999,
                reason: "no".into(),
            },
            Control::Hello { rank: 0, size: 1 },
        ] {
            eb.inner().send_control(&c).await.unwrap();
        }
        barewire_engine::time::sleep(std::time::Duration::from_millis(20)).await;
        // Only the Hello, which a mesh would take, waits.
        let inbox = &ea.inner().shared.borrow().inbox;
        assert!(
            matches!(
                inbox.iter().map(|(_, c)| c).collect::<Vec<_>>()[..],
                [Control::Hello { .. }]
            ),
            "{inbox:?}"
        );
    });
}

/// A peer that sends control messages faster than anything here takes them (each waits in
/// memory, and each wait for one scans them all) is not served: up to the bound they wait, one
/// more fails the connection with the reason and hangs up, and the peer's side fails too.
#[test]
fn a_peer_flooding_control_messages_loses_the_connection() {
    use crate::control::Control;
    use crate::endpoint::MAX_QUEUED_CONTROLS;
    use std::time::Duration;
    on_a_sleeping_core(async {
        let (_nodes, ea, eb) = connected(&DriverConfig::parse("soft", None).unwrap()).await;
        let hello = Control::Hello { rank: 0, size: 1 };
        for _ in 0..MAX_QUEUED_CONTROLS {
            eb.inner().send_control(&hello).await.unwrap();
        }
        // All of them wait on a's side, taken by nobody, and the connection stands.
        barewire_engine::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(ea.inner().shared.borrow().inbox.len(), MAX_QUEUED_CONTROLS);
        assert!(ea.failed().is_none() && eb.failed().is_none());
        eb.inner().send_control(&hello).await.unwrap();
        let failed = barewire_engine::time::timeout(Duration::from_secs(5), async {
            loop {
                if let (Some(a), Some(b)) = (ea.failed(), eb.failed()) {
                    return (a, b);
                }
                barewire_engine::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("both sides fail within the provider's bound");
        match failed.0 {
            Error::Malformed(why) => assert!(why.contains("flood"), "{why}"),
            other => panic!("a: expected the flood named, got {other:?}"),
        }
        assert!(
            ea.open_channel::<u64>(ChannelOptions::new(8, 8))
                .await
                .is_err(),
            "a failed connection opens no channel"
        );
    });
}

/// A polled ring's slot seen at every stage of its placement, byte by byte in stream order
/// as the provider places a WRITE (TCP may cut anywhere): the message counts as landed only
/// once the last byte of its mark is in, never before, whatever length it has.
#[test]
fn a_polled_slot_lands_only_with_the_last_byte_of_its_mark() {
    with_polled_slot(|ring, st, slot| {
        for len in [0usize, 1, 3, 4, 5, 39, 40] {
            let bytes = slot_bytes(len);
            for placed in 0..=bytes.len() {
                ring.write_at(0, &bytes[..placed]);
                assert_eq!(
                    st.landed(0),
                    placed == bytes.len(),
                    "{len}-byte message with {placed} of {} bytes placed",
                    bytes.len()
                );
                ring.zero(0, slot);
            }
        }
        // A length the slot cannot hold counts as landed, for `recv` to refuse.
        ring.write_at(0, &(slot as u32 | LEN_SET).to_le_bytes());
        assert!(st.landed(0));
        // Another core's copy may be seen mid-way: a length word still zero while later
        // bytes (here, a message whose first word looks like a mark) are already in is not
        // a message, not even an empty one.
        ring.zero(0, slot);
        ring.write_at(PREFIX, &MARK.to_le_bytes());
        ring.write_at(PREFIX + 4, &MARK.to_le_bytes());
        assert!(!st.landed(0));
    });
}

/// What the sender's staging slot holds for a `len`-byte message: length, message (bytes that
/// look like marks, to be nasty), mark.
/// Two nodes made with `cfg` on this core, connected over loopback, and their two endpoints
/// (the accepting node's first).
async fn connected(cfg: &DriverConfig) -> ([crate::Node; 2], crate::Endpoint, crate::Endpoint) {
    crate::Node::loopback_pair(cfg).await.unwrap()
}

fn slot_bytes(len: usize) -> Vec<u8> {
    let mut bytes = (len as u32 | LEN_SET).to_le_bytes().to_vec();
    bytes.extend(MARK.to_le_bytes().iter().cycle().take(len));
    bytes.resize(extent(len) - MARK_LEN, 0);
    bytes.extend_from_slice(&MARK.to_le_bytes());
    bytes
}

/// Runs `f` on a one-core runtime with a polled ring of one slot for messages of up to 40
/// bytes: the ring, its receiving state, the slot's size.
fn with_polled_slot(f: impl FnOnce(&Rc<Buffer>, &RxState, usize)) {
    barewire_engine::Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .unwrap()
        .block_on(async {
            let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
            let pd = dev.alloc_pd().unwrap();
            let slot = extent(40).next_multiple_of(8);
            let ring = Buffer::new(&pd, slot, 64, Access::LOCAL_WRITE).unwrap();
            let st = RxState {
                id: 1,
                capacity: 1,
                slot,
                ring: ring.clone(),
                arrived: Cell::new(0),
                closed: Cell::new(false),
                waker: Waiters::default(),
                polled: true,
                peer_stores: false,
                watch_at: Cell::new(0),
                watched: Cell::new(false),
            };
            f(&ring, &st, slot);
        });
}

/// A taken slot, cleared, never reads as landed while the next message for it is placed byte
/// by byte: with the whole slot zeroed (any length may come next), and with only the length
/// and mark words cleared when every message has one length (`Codec::FIXED_LEN`), the stale
/// message left in it looking like marks throughout.
#[test]
fn a_cleared_slot_lands_again_only_with_the_next_messages_last_byte() {
    with_polled_slot(|ring, st, _| {
        // (taken, next, fixed): one length throughout, or any length after any.
        let cases = [
            (40, 40, true),
            (12, 12, true),
            (40, 12, false),
            (12, 40, false),
        ];
        for (taken, next, fixed) in cases {
            let next_bytes = slot_bytes(next);
            for placed in 0..=next_bytes.len() {
                ring.write_at(0, &slot_bytes(taken));
                assert!(st.landed(0));
                st.clear_taken(&st.slot_at(0), 0, taken, fixed);
                ring.write_at(0, &next_bytes[..placed]);
                assert_eq!(
                    st.landed(0),
                    placed == next_bytes.len(),
                    "{next}-byte message after a {taken}-byte one (fixed: {fixed}), \
                         {placed} of {} bytes placed",
                    next_bytes.len()
                );
            }
        }
    });
}

/// Over shm, once the receiver's ring is granted, a message sent after a pause goes straight
/// into the ring (no work request) and still wakes the receiver's sleeping core. Each receive
/// has a timer 5 s out as the only other thing that could wake its core, and must be done well
/// before it.
#[test]
fn a_message_stored_straight_into_a_sleeping_receivers_ring_wakes_it() {
    use std::time::{Duration, Instant};
    async fn recv_woken(rx: &Receiver<u64>) -> u64 {
        let fallback =
            barewire_engine::spawn_local(barewire_engine::time::sleep(Duration::from_secs(5)));
        let start = Instant::now();
        let got = rx.recv().await.unwrap();
        let waited = start.elapsed();
        drop(fallback);
        assert!(
            waited < Duration::from_secs(3),
            "message {got} seen only after {waited:?}: its sender's wake-up was lost"
        );
        got
    }
    let opts = ChannelOptions::new(16, 8);
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            for i in 0..3 {
                assert_eq!(recv_woken(&rx).await, i);
                tx.send(&i).await.unwrap();
            }
            // The sender pauses; this core sleeps.
            assert_eq!(recv_woken(&rx).await, 99);
            tx.send(&100).await.unwrap();
            // The sender hangs up once it has this; a flush that loses that race is fine.
            let _ = tx.flush().await;
        },
        |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            for i in 0..3 {
                tx.send(&i).await.unwrap();
                assert_eq!(recv_woken(&rx).await, i);
            }
            assert!(
                tx.st.direct.get().is_some(),
                "the receiver's ring is mapped once granted"
            );
            barewire_engine::time::sleep(Duration::from_millis(300)).await;
            tx.send(&99).await.unwrap();
            // Bounded, so that a receiver that failed ends the test rather than hanging it.
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(100))), "no answer from the receiver");
        },
    );
}

/// Over shm, `recv_many` takes messages that came every way a sender places them: staged
/// runs (before the receiver's ring is mapped), then stored straight into the ring, published
/// at once (the first after each pause) or as a run (the rest of each burst), through many
/// wraps of a small ring, in order and each once.
#[test]
fn recv_many_over_shm_takes_direct_stores_and_runs_in_order() {
    use std::time::Duration;
    const N: u64 = 20_000;
    let opts = ChannelOptions::new(64, 8);
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            let (mut got, mut batches) = (Vec::new(), 0u64);
            while (got.len() as u64) < N {
                let wait = Duration::from_secs(20);
                let Ok(n) = barewire_engine::time::timeout(wait, rx.recv_many(&mut got, 50)).await
                else {
                    panic!("message {} never came", got.len());
                };
                let n = n.unwrap();
                assert!((1..=50).contains(&n), "took {n}");
                batches += 1;
            }
            assert_eq!(got, (0..N).collect::<Vec<u64>>(), "in order, each once");
            assert!(batches < N, "some call took more than one message");
            tx.send(&N).await.unwrap();
            let _ = tx.flush().await;
        },
        |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            let (mut i, mut burst) = (0u64, 1u64);
            while i < N {
                for _ in 0..burst.min(N - i) {
                    tx.send(&i).await.unwrap();
                    i += 1;
                }
                // A pause: the next message goes straight into the ring once it is mapped.
                barewire_engine::time::sleep(Duration::from_micros(100)).await;
                burst = burst % 150 + 7;
            }
            assert!(
                tx.st.direct.get().is_some(),
                "the receiver's ring was mapped, so the direct path ran"
            );
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(N))), "no answer from the receiver");
        },
    );
}

/// Over shm, bursts of messages of every length from 2 to 62 encoded bytes (the slot holds
/// 64), sent once the receiver's ring is mapped (so stored straight into it, unpublished, then
/// published as a run), each arrive whole and in order, through wraps of a small ring: a
/// slot's length word is read only once its run is published, whatever the length.
#[test]
fn bursts_of_varied_lengths_over_shm_arrive_whole_and_in_order() {
    use std::time::Duration;
    const N: usize = 3_000;
    let opts = ChannelOptions::new(32, 64);
    let message = |i: usize| "x".repeat(i % 61) + &i.to_string()[..1];
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
            for i in 0..N {
                let wait = Duration::from_secs(20);
                let Ok(got) = barewire_engine::time::timeout(wait, rx.recv()).await else {
                    panic!("message {i} never came");
                };
                assert_eq!(got.unwrap(), message(i), "message {i}");
            }
            tx.send(&"done".to_string()).await.unwrap();
            let _ = tx.flush().await;
        },
        move |ep| async move {
            let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
            let (mut i, mut burst) = (0, 1);
            while i < N {
                for _ in 0..burst.min(N - i) {
                    tx.send(&message(i)).await.unwrap();
                    i += 1;
                }
                barewire_engine::time::sleep(Duration::from_micros(200)).await;
                burst = burst % 40 + 3;
            }
            assert!(
                tx.st.direct.get().is_some(),
                "the receiver's ring was mapped, so the direct path ran"
            );
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(ref s)) if s == "done"), "{answer:?}");
        },
    );
}

/// A peer that stores a length word too large for its slot into a polled ring (over shm, where
/// the sender holds a mapping of the ring): `recv` reports it as malformed, after taking every
/// message before it in order, and touches nothing beyond the slot.
#[test]
fn recv_refuses_a_length_word_larger_than_its_slot() {
    use std::time::Duration;
    let opts = ChannelOptions::new(16, 8);
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            assert_eq!(rx.recv().await, Ok(1));
            assert_eq!(rx.recv().await, Ok(2));
            let r = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(
                matches!(&r, Ok(Err(Error::Malformed(m))) if m.contains("length word")),
                "{r:?}"
            );
            // The slot after the bad one was never written, and is still zero.
            let next = 3 * rx.st.slot;
            assert_eq!(rx.st.ring.load_u32_le(next), 0);
            tx.send(&3).await.unwrap();
            let _ = tx.flush().await;
        },
        |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            tx.send(&1).await.unwrap();
            tx.flush().await.unwrap();
            // After a pause the next message goes straight into the mapped ring.
            barewire_engine::time::sleep(Duration::from_millis(100)).await;
            tx.send(&2).await.unwrap();
            tx.flush().await.unwrap();
            let m = tx.st.direct.get().expect("the receiver's ring is mapped");
            // Slot 2 (the third message's): a length one byte more than the slot holds.
            let slot = tx.st.slot;
            let bad = (slot - extent(0) + 1) as u32 | LEN_SET;
            m.span(2 * slot, 4).store_u32_le(0, bad);
            m.wake_peer();
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(3))), "{answer:?}");
        },
    );
}

/// `recv_many` stops at a message that does not decode: what it took before stays in `out`,
/// it returns the decode error, and the bad message is gone (the next call goes on after it).
#[test]
fn recv_many_keeps_what_it_took_before_a_message_that_does_not_decode() {
    use std::time::Duration;
    let opts = ChannelOptions::new(16, 64);
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
            // Let all four land, so one call meets them together.
            barewire_engine::time::sleep(Duration::from_millis(100)).await;
            let mut got = Vec::new();
            let r = rx.recv_many(&mut got, 10).await;
            assert!(matches!(r, Err(Error::Malformed(_))), "{r:?}");
            assert_eq!(
                got,
                ["a", "b"],
                "the messages before the bad one stay taken"
            );
            assert_eq!(rx.recv_many(&mut got, 10).await, Ok(1));
            assert_eq!(
                got,
                ["a", "b", "c"],
                "the bad message was consumed, the next follows"
            );
            tx.send(&"done".to_string()).await.unwrap();
            let _ = tx.flush().await;
        },
        |ep| async move {
            let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
            tx.send(&"a".to_string()).await.unwrap();
            tx.send(&"b".to_string()).await.unwrap();
            // A BARE string of two bytes that are not UTF-8.
            tx.send_bytes(&[2, 0xff, 0xfe]).await.unwrap();
            tx.send(&"c".to_string()).await.unwrap();
            tx.flush().await.unwrap();
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(ref s)) if s == "done"), "{answer:?}");
        },
    );
}

/// `recv_into` fills the caller's value: a message that does not decode is an error that
/// leaves the value as it was (and is consumed: the next call goes on after it), and a bytes
/// channel fills the caller's vector in its own allocation.
#[test]
fn recv_into_fills_the_callers_value_and_leaves_it_on_an_error() {
    use std::time::Duration;
    let opts = ChannelOptions::new(16, 64);
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
            let mut s = String::new();
            rx.recv_into(&mut s).await.unwrap();
            assert_eq!(s, "a");
            let r = rx.recv_into(&mut s).await;
            assert!(matches!(r, Err(Error::Malformed(_))), "{r:?}");
            assert_eq!(s, "a", "a message that does not decode leaves the value");
            rx.recv_into(&mut s).await.unwrap();
            assert_eq!(s, "c", "the bad message was consumed, the next follows");
            let (btx, brx) = ep.open_bytes_channel(opts).await.unwrap();
            let mut v = Vec::with_capacity(64);
            let at = v.as_ptr();
            for want in [&b"twelve bytes"[..], b"", &[7u8; 64], b"xy"] {
                brx.recv_into(&mut v).await.unwrap();
                assert_eq!(v, want);
                assert_eq!(v.as_ptr(), at, "the vector's own allocation");
            }
            tx.send(&"done".to_string()).await.unwrap();
            let _ = tx.flush().await;
            drop(btx);
        },
        |ep| async move {
            let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
            tx.send(&"a".to_string()).await.unwrap();
            // A BARE string of two bytes that are not UTF-8.
            tx.send_bytes(&[2, 0xff, 0xfe]).await.unwrap();
            tx.send(&"c".to_string()).await.unwrap();
            tx.flush().await.unwrap();
            let (btx, _brx) = ep.open_bytes_channel(opts).await.unwrap();
            for m in [&b"twelve bytes"[..], b"", &[7u8; 64], b"xy"] {
                btx.send(&m.to_vec()).await.unwrap();
            }
            btx.flush().await.unwrap();
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(ref s)) if s == "done"), "{answer:?}");
        },
    );
}

/// A channel whose codec gives every message one length (`Raw`: the type's size) refuses
/// bytes of any other length at the sender, since its receiver clears only the length and
/// mark words of a slot it took (`Codec::FIXED_LEN`); the channel goes on working.
#[test]
fn a_fixed_length_channel_refuses_a_message_of_another_length() {
    use std::time::Duration;
    let opts = ChannelOptions::new(16, 8);
    over_shm(
        move |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            assert_eq!(rx.recv().await, Ok(7), "the refused bytes never arrived");
            tx.send(&8).await.unwrap();
            let _ = tx.flush().await;
        },
        |ep| async move {
            let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
            for wrong in [&[][..], &[1u8, 2, 3], &[9; 7]] {
                let r = tx.send_bytes(wrong).await;
                assert!(
                    matches!(&r, Err(Error::Invalid(m)) if m.contains("all its messages")),
                    "{} bytes on a u64 channel: {r:?}",
                    wrong.len()
                );
            }
            tx.send(&7).await.unwrap();
            tx.flush().await.unwrap();
            let answer = barewire_engine::time::timeout(Duration::from_secs(20), rx.recv()).await;
            assert!(matches!(answer, Ok(Ok(8))), "{answer:?}");
        },
    );
}

/// Two shm nodes, each on a one-core runtime that sleeps when idle: `server` runs on the
/// accepting one in its own thread, `client` on the connecting one here.
fn over_shm<S, SF, C, CF>(server: S, client: C)
where
    S: FnOnce(crate::Endpoint) -> SF + Send + 'static,
    SF: std::future::Future<Output = ()> + 'static,
    C: FnOnce(crate::Endpoint) -> CF,
    CF: std::future::Future<Output = ()>,
{
    use crate::Node;
    let shm = || Node::with_config(&DriverConfig::parse("shm", None).unwrap()).unwrap();
    let rt = || {
        barewire_engine::Runtime::builder()
            .cores(1)
            .sleeping()
            .build()
            .unwrap()
    };
    let (port_tx, port_rx) = std::sync::mpsc::channel();
    let accepting = std::thread::spawn(move || {
        rt().block_on(async move {
            let node = shm();
            port_tx
                .send(node.listen("127.0.0.1:0".parse().unwrap()).unwrap())
                .unwrap();
            let ep = node.accept().await.unwrap();
            server(ep).await;
        })
    });
    let port = port_rx.recv().unwrap();
    rt().block_on(async move {
        let node = shm();
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        client(ep).await;
    });
    accepting.join().unwrap();
}

/// Runs `f` once for each way a channel's ring is received: watched over soft, announced over
/// soft, watched over shm. Each time on a fresh sleeping core, with two connected endpoints
/// (the accepting node's first) and `ChannelOptions::new(capacity, max_message)` announced or
/// not.
fn on_each_ring_transport<F>(
    capacity: u32,
    max_message: usize,
    f: impl Fn(&'static str, ChannelOptions, crate::Endpoint, crate::Endpoint) -> F,
) where
    F: std::future::Future<Output = ()>,
{
    for (driver, announce) in [("soft", false), ("soft", true), ("shm", false)] {
        on_a_sleeping_core(async {
            let cfg = DriverConfig::parse(driver, None).unwrap();
            let (_nodes, ea, eb) = connected(&cfg).await;
            let opts = ChannelOptions {
                announce,
                ..ChannelOptions::new(capacity, max_message)
            };
            f(driver, opts, ea, eb).await;
        });
    }
}

/// A send that waits for room and is dropped before it finds any places nothing: the next
/// sends arrive in order, with nothing lost or doubled, for a codec that encodes (whose
/// encoding the waiting future holds) and for plain data (placed from the item itself). On
/// both transports that watch rings and on announced runs.
#[test]
fn a_send_dropped_while_the_ring_is_full_places_nothing() {
    use std::time::Duration;
    on_each_ring_transport(4, 64, |driver, opts, ea, eb| async move {
        let ea2 = ea.clone();
        let sender = barewire_engine::spawn_local(async move {
            let (tx, _rx) = ea2.open_bare_channel::<String>(opts).await.unwrap();
            let (ptx, _prx) = ea2.open_channel::<u64>(opts).await.unwrap();
            for i in 0..4 {
                tx.send(&format!("m{i}")).await.unwrap();
                ptx.send(&i).await.unwrap();
            }
            // Both rings are full (the receiver reads nothing yet): these wait, and go.
            let dropped = "dropped".to_string();
            for _ in 0..3 {
                let t =
                    barewire_engine::time::timeout(Duration::from_millis(20), tx.send(&dropped));
                assert!(t.await.is_err(), "a send into a full ring waited");
                let t = barewire_engine::time::timeout(Duration::from_millis(20), ptx.send(&99));
                assert!(t.await.is_err(), "a send into a full ring waited");
            }
            for i in 4..40 {
                tx.send(&format!("m{i}")).await.unwrap();
                ptx.send(&i).await.unwrap();
            }
            tx.flush().await.unwrap();
            ptx.flush().await.unwrap();
        });
        let (_tx, rx) = eb.open_bare_channel::<String>(opts).await.unwrap();
        let (_ptx, prx) = eb.open_channel::<u64>(opts).await.unwrap();
        barewire_engine::time::sleep(Duration::from_millis(200)).await;
        for i in 0..40 {
            assert_eq!(rx.recv().await.unwrap(), format!("m{i}"), "{driver}");
            assert_eq!(prx.recv().await.unwrap(), i, "{driver}");
        }
        sender.await.unwrap();
    });
}

#[test]
fn a_ring_of_at_most_two_runs_goes_in_halves() {
    use super::{credit_step, halves, run_limit};
    // 1,024 slots of 72 bytes (64-byte messages): 72 KiB, two runs at most.
    assert!(halves(1024, 72));
    assert_eq!((run_limit(1024, 72), credit_step(1024, 72)), (512, 512));
    // An odd capacity: the first half is the larger; credits every half, rounded down.
    assert_eq!((run_limit(7, 16), credit_step(7, 16)), (4, 3));
    // 128 KiB exactly is still two runs; one slot more is not.
    assert!(halves(2048, 64));
    assert!(!halves(2049, 64));
    // Larger rings keep runs of 64 KiB and credits every quarter.
    assert!(!halves(2048, 72));
    assert_eq!((run_limit(2048, 72), credit_step(2048, 72)), (910, 512));
    // Large slots send each message alone, whatever the ring.
    assert!(!halves(16, 4104));
    assert_eq!((run_limit(16, 4104), credit_step(16, 4104)), (1, 4));
    // A ring of one slot has no halves.
    assert!(!halves(1, 16));
    assert_eq!((run_limit(1, 16), credit_step(1, 16)), (4096, 1));
}

/// A run the receiver refuses (here: written with a key that is not its ring's) fails the
/// sender within a bound, whether or not any run was signaled: `flush` returns the failure
/// instead of success or a wait for ever, and later sends fail too. Watched rings signal no
/// runs at all (see `TxState::post_run_with`), so this is how they learn of it; announced
/// rings signal one per credit step. On both transports that watch rings.
#[test]
fn a_run_the_receiver_refuses_fails_the_sender() {
    use std::time::Duration;
    on_each_ring_transport(64, 8, |driver, opts, ea, eb| async move {
        let announce = opts.announce;
        let ea2 = ea.clone();
        let far = barewire_engine::spawn_local(async move {
            let (_tx, rx) = ea2.open_channel::<u64>(opts).await.unwrap();
            // Nothing arrives: the runs land nowhere.
            let got = barewire_engine::time::timeout(Duration::from_secs(5), rx.recv()).await;
            assert!(
                !matches!(got, Ok(Ok(_))),
                "{driver}: a refused run was received"
            );
        });
        let (tx, _rx) = eb.open_channel::<u64>(opts).await.unwrap();
        let ring = tx.st.ring.get().unwrap();
        tx.st.ring.set(Some(barewire_drivers::RegionDescriptor {
            rkey: barewire_drivers::Stag(ring.rkey.0 ^ 0x5a5a_5a00),
            ..ring
        }));
        for i in 0..40u64 {
            // (The first sends may still be placed: the failure comes back later.)
            if tx.send(&i).await.is_err() {
                break;
            }
        }
        let flushed = barewire_engine::time::timeout(Duration::from_secs(5), tx.flush()).await;
        match flushed {
            Ok(Err(_)) => {}
            Ok(Ok(())) => panic!("{driver} announce={announce}: flush succeeded"),
            Err(_) => panic!("{driver} announce={announce}: flush waited past 5 s"),
        }
        assert!(
            tx.send(&99).await.is_err(),
            "{driver}: a send after the failure"
        );
        far.await.unwrap();
    });
}

/// A receiver waiting on a watched ring has its idle core look at memory between passes (see
/// `barewire_engine::Poller::watches_memory`) only where the peer stores into the ring
/// itself (shm), and no longer once its message came: a ring the core's own provider fills
/// (soft), or an announced one, gains nothing from the looks and delays every other source.
#[test]
fn a_waiting_receiver_asks_for_looks_at_memory_only_where_the_peer_stores() {
    use super::ring::RingWatcher;
    use barewire_engine::Poller;
    on_each_ring_transport(4, 8, |driver, opts, ea, eb| async move {
        let far = barewire_engine::spawn_local(async move {
            let (tx, _rx) = ea.open_channel::<u64>(opts).await.unwrap();
            tx
        });
        let (_tx, rx) = eb.open_channel::<u64>(opts).await.unwrap();
        let tx = far.await.unwrap();
        let waiting = barewire_engine::spawn_local(async move { rx.recv().await.unwrap() });
        for _ in 0..4 {
            barewire_engine::yield_now().await;
        }
        let stored_into = driver == "shm" && !opts.announce;
        assert_eq!(
            RingWatcher.watches_memory(),
            stored_into,
            "{driver}, announced: {}",
            opts.announce
        );
        tx.send(&7).await.unwrap();
        assert_eq!(waiting.await.unwrap(), 7);
        assert!(!RingWatcher.watches_memory(), "{driver}: still looking");
    });
}
