//! `Channel<T>` against a model: whatever the interleaving of sends, sends given up while the
//! ring is full, flushes, `recv`, `recv_many` and pauses on either side, the receiver gets
//! exactly the messages whose send succeeded, each once, in the order sent, and then
//! `Closed`. Random schedules (proptest) over soft and shm, watched and announced rings, plain
//! data and BARE-encoded messages of varying length, rings of one to five slots.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use barewire::drivers::DriverConfig;
use barewire::engine::{spawn_local, time};
use barewire::{ChannelOptions, Endpoint, Error, Node};
use barewire_test_support::rt;
use proptest::prelude::*;

/// One step of the sending side.
#[derive(Debug, Clone)]
enum Tx {
    /// Sends this many messages, each waiting for room.
    Send(u8),
    /// One send given up after this many milliseconds (0: after its first poll) if the ring
    /// has no room by then: it must leave nothing behind.
    GiveUp(u8),
    /// Waits until everything sent so far is in the receiver's ring.
    Flush,
    /// Sleeps this many milliseconds (0: yields).
    Pause(u8),
}

/// One step of the receiving side.
#[derive(Debug, Clone)]
enum Rx {
    /// Receives this many messages with `recv`.
    Recv(u8),
    /// One `recv_many` of up to this many.
    RecvMany(u8),
    /// Sleeps this many milliseconds (0: yields).
    Pause(u8),
}

fn tx_step() -> impl Strategy<Value = Tx> {
    prop_oneof![
        4 => (1u8..24).prop_map(Tx::Send),
        2 => (0u8..3).prop_map(Tx::GiveUp),
        1 => Just(Tx::Flush),
        2 => (0u8..3).prop_map(Tx::Pause),
    ]
}

fn rx_step() -> impl Strategy<Value = Rx> {
    prop_oneof![
        3 => (1u8..24).prop_map(Rx::Recv),
        3 => (1u8..24).prop_map(Rx::RecvMany),
        2 => (0u8..4).prop_map(Rx::Pause),
    ]
}

async fn pause(ms: u8) {
    if ms == 0 {
        barewire::engine::yield_now().await;
    } else {
        time::sleep(Duration::from_millis(ms as u64)).await;
    }
}

/// Message `n` of a BARE channel: a string whose length varies with `n` (up to the channel's
/// largest message, with its varint length).
fn text(n: u64) -> String {
    let len = (n as usize * 7) % (MAX_MESSAGE - 2);
    let mut s = format!("{n}:");
    while s.len() < len {
        s.push((b'a' + (s.len() % 26) as u8) as char);
    }
    s
}

/// The number of a received BARE message, checked against the text sent as that number.
fn number(s: String) -> u64 {
    let n = s
        .split(':')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a numbered text");
    assert_eq!(s, text(n), "message {n} arrived changed");
    n
}

const MAX_MESSAGE: usize = 48;

/// Either codec's sending half: message `n` is `n` itself or `text(n)`.
enum Sender {
    Raw(barewire::Sender<u64>),
    Bare(barewire::Sender<String, barewire::Bare>),
}

/// Either codec's receiving half, giving back message numbers.
enum Receiver {
    Raw(barewire::Receiver<u64>),
    Bare(barewire::Receiver<String, barewire::Bare>),
}

async fn open(ep: &Endpoint, bare: bool, opts: ChannelOptions) -> (Sender, Receiver) {
    if bare {
        let (tx, rx) = ep.open_bare_channel::<String>(opts).await.unwrap();
        (Sender::Bare(tx), Receiver::Bare(rx))
    } else {
        let (tx, rx) = ep.open_channel::<u64>(opts).await.unwrap();
        (Sender::Raw(tx), Receiver::Raw(rx))
    }
}

impl Sender {
    /// Sends message `n`; with `limit`, gives up after that long if it has not gone by then
    /// (`None`).
    async fn send(&self, n: u64, limit: Option<Duration>) -> Option<barewire::Result<()>> {
        match self {
            Sender::Raw(tx) => within(limit, tx.send(&n)).await,
            Sender::Bare(tx) => {
                let t = text(n);
                within(limit, tx.send(&t)).await
            }
        }
    }

    async fn flush(&self) -> barewire::Result<()> {
        match self {
            Sender::Raw(tx) => tx.flush().await,
            Sender::Bare(tx) => tx.flush().await,
        }
    }
}

async fn within<F: std::future::Future>(limit: Option<Duration>, f: F) -> Option<F::Output> {
    match limit {
        None => Some(f.await),
        Some(d) => time::timeout(d, f).await.ok(),
    }
}

impl Receiver {
    async fn recv(&self) -> barewire::Result<u64> {
        match self {
            Receiver::Raw(rx) => rx.recv().await,
            Receiver::Bare(rx) => rx.recv().await.map(number),
        }
    }

    async fn recv_many(&self, out: &mut Vec<u64>, limit: usize) -> barewire::Result<usize> {
        match self {
            Receiver::Raw(rx) => rx.recv_many(out, limit).await,
            Receiver::Bare(rx) => {
                let mut got = Vec::new();
                let r = rx.recv_many(&mut got, limit).await;
                out.extend(got.into_iter().map(number));
                r
            }
        }
    }
}

/// Runs one schedule: `b` sends by `txs`, `a` receives by `rxs` (then drains until `Closed`).
/// Returns (messages whose send succeeded, messages received).
fn run(
    driver: &str,
    bare: bool,
    opts: ChannelOptions,
    txs: Vec<Tx>,
    rxs: Vec<Rx>,
) -> (Vec<u64>, Vec<u64>) {
    let cfg = DriverConfig::parse(driver, None).unwrap();
    rt().block_on(async move {
        let (_nodes, ea, eb) = Node::loopback_pair(&cfg).await.unwrap();

        let sent = Rc::new(RefCell::new(Vec::new()));
        let sent2 = sent.clone();
        let sender = spawn_local(async move {
            let (tx, _rx) = open(&eb, bare, opts).await;
            let mut n = 0u64;
            for step in txs {
                match step {
                    Tx::Send(k) => {
                        for _ in 0..k {
                            tx.send(n, None).await.unwrap().unwrap();
                            sent2.borrow_mut().push(n);
                            n += 1;
                        }
                    }
                    Tx::GiveUp(ms) => {
                        let limit = Duration::from_millis(ms as u64);
                        if let Some(r) = tx.send(n, Some(limit)).await {
                            r.unwrap();
                            sent2.borrow_mut().push(n);
                        }
                        n += 1;
                    }
                    Tx::Flush => tx.flush().await.unwrap(),
                    Tx::Pause(ms) => pause(ms).await,
                }
            }
            tx.flush().await.unwrap();
            // The close notice: the receiver gets `Closed` once it has taken everything. The
            // endpoint stays until the receiver is done (dropping it hangs up).
            drop(tx);
            eb
        });

        let (_tx, rx) = open(&ea, bare, opts).await;
        let mut got = Vec::new();
        // The schedule, then `recv_many` until the sender's close notice ends the stream.
        for step in rxs.into_iter().chain(std::iter::repeat(Rx::RecvMany(64))) {
            let r = match step {
                Rx::Recv(k) => {
                    let mut r = Ok(());
                    for _ in 0..k {
                        match rx.recv().await {
                            Ok(m) => got.push(m),
                            Err(e) => {
                                r = Err(e);
                                break;
                            }
                        }
                    }
                    r
                }
                Rx::RecvMany(limit) => rx.recv_many(&mut got, limit as usize).await.map(|_| ()),
                Rx::Pause(ms) => {
                    pause(ms).await;
                    Ok(())
                }
            };
            match r {
                Ok(()) => {}
                Err(Error::Closed) => break,
                Err(e) => panic!("receiver: {e}"),
            }
        }
        drop(sender.await.unwrap());
        let sent = sent.borrow().clone();
        (sent, got)
    })
}

fn options(announce: bool, capacity: u32) -> ChannelOptions {
    ChannelOptions {
        announce,
        ..ChannelOptions::new(capacity, MAX_MESSAGE)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn the_receiver_gets_exactly_the_sends_that_succeeded_in_order(
        driver in prop::sample::select(vec!["soft", "shm"]),
        announce in any::<bool>(),
        bare in any::<bool>(),
        capacity in 1u32..6,
        txs in prop::collection::vec(tx_step(), 1..24),
        rxs in prop::collection::vec(rx_step(), 0..24),
    ) {
        let (sent, got) = run(driver, bare, options(announce, capacity), txs, rxs);
        prop_assert_eq!(got, sent);
    }
}
