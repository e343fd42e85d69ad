//! `Channel<T>`: ordered, exactly-once messages written by RDMA WRITE into a ring in the
//! receiver's memory, with credits returned by WRITE.
//!
//! Each direction is a ring of `capacity` slots of `slot` bytes in the receiver's registered
//! memory. Message `n` goes to slot `n % capacity` as its length, its bytes and a mark, written
//! from the sender's staging slot; a burst of small messages goes as one WRITE covering
//! several slots. How the receiver learns that a message is there depends on who places the
//! data:
//!
//! - where the transport lets memory be watched ([`QueuePair::watch_memory`]: the software
//!   provider, which places data in stream order from the receiving core's own poller, and
//!   shm, whose sender's CPU then copies in ascending order and wakes a sleeping receiver), the
//!   receiver watches its ring (a per-core poller looks at the next slot of each waiting
//!   receiver in every pass) and sees a message once its length word and the mark at the end
//!   it gives are in, exactly as a NIC user polls memory: the WRITE needs no receive;
//! - over verbs, where the NIC places data with no event, each WRITE carries immediate data
//!   (channel, message count) that completes a receive the receiver posted in advance.
//!
//! Over shm, once the receiver's ring is mapped into the sender (after the first run), there
//! is no staging and no WRITE: `send` stores each message and its mark straight into its slot,
//! its length word without the bit that makes it a message (`LEN_SET`), and a burst is
//! published by setting that bit on each length word, from the last message back to the first.
//! The receiver reads the same slots either way.
//!
//! The receiver copies each message out, then tells the sender how many it has consumed by
//! writing that count into a word of the sender's memory (with immediate data, so a sender
//! waiting for room is woken rather than spinning). The sender never has more than `capacity`
//! messages unconsumed, so it never overwrites one the receiver has not read: a full ring is
//! backpressure, not loss.
//!
//! A sender whose ring stays full for a second asks whether the receiver is alive, and again
//! every second while it stays full (a control Ping, which the receiver's core takes, then a
//! zero-length READ). A receiver that runs but does not read answers and is waited for; one
//! that is stopped, hung or cut off fails the connection within the transport's timeout, so the
//! waiting `send` returns [`Error::PeerGone`] rather than wait for ever. (Over shm, where
//! Writes need nothing from the receiver, nothing else would notice.)
//!
//! A receiver waiting for a sender has nothing outstanding to fail. A sender that dies closes
//! its connection, so `recv` returns `PeerGone` at once; over the software provider, a link
//! cut (or a host gone) under an idle connection is found by the connection's keepalive
//! ([`DriverConfig::keepalive`](barewire_drivers::DriverConfig::keepalive), 10 s by
//! default), after which `recv` returns `PeerGone` too. A sender that is stopped, or merely
//! quiet, is waited for, as a socket waits for its peer.
//!
//! Plain-old-data `T` travels as its bytes ([`Raw`]); other types are encoded in the BARE
//! message format ([`Bare`], via serde).
//!
//! [`QueuePair::watch_memory`]: barewire_drivers::QueuePair::watch_memory

mod codec;
mod open;
mod receiver;
mod ring;
mod send;
mod sender;
#[cfg(test)]
mod tests;

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::future::Future;
use std::marker::PhantomData;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use barewire_drivers::{Buffer, Remote, SendOp, Span};

pub use codec::{Bare, Bytes, Codec, Raw};
pub use receiver::{Recv, RecvInto};
pub(crate) use ring::RxState;
pub(crate) use send::{ensure_flusher, TxState};
pub use sender::Sending;

use crate::control::imm;
use crate::endpoint::{Inner, Link, Retired};
use crate::error::{Error, Result};
use ring::{
    ahead, extent, length, watch, Look, LEN_SET, MARK, MARK_LEN, PREFETCH_BYTES, PREFETCH_SLOTS,
    PREFIX,
};
use send::schedule;

/// A channel's shape.
///
/// ```
/// use barewire::ChannelOptions;
/// // 64-byte messages in a 4,096-slot ring (288 KiB): a window for streams of small
/// // messages over the software provider (see `capacity`).
/// let stream = ChannelOptions::new(4096, 64);
/// assert_eq!((stream.capacity, stream.max_message), (4096, 64));
/// // Every run announced by immediate data, as verbs does, on any transport.
/// let announced = ChannelOptions { announce: true, ..ChannelOptions::default() };
/// assert!(announced.announce);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelOptions {
    /// Messages that may be in flight (sent, not yet received) per direction. The ring's
    /// bytes (`capacity` × the slot) are the channel's window: a sender in a burst waits for
    /// credits, which the receiver earns every quarter of the ring and sends with its core's
    /// next pass. A ring of at most 128 KiB (two runs of small messages) goes in halves
    /// instead: each half leaves as soon as it is full, and its credits as soon as it is read,
    /// so that the two sides overlap rather than take turns. Over TCP (the software provider)
    /// a larger window still goes faster for streams of small messages: keep it at a few
    /// hundred KiB there. 64-byte messages, each kept by the receiver, with MPA CRC on, went
    /// 1.09x (`recv`) and 1.17x (`recv_many`) as fast with 4096 slots (288 KiB) as with 1024
    /// in channel-bench, and 1.20x and 1.31x with 16384 (1.1 MiB); before rings went in halves,
    /// 4096 slots had been 1.3-1.8x as fast as 1024 (bench/RESULTS.md, thirteenth,
    /// thirty-sixth and forty-second sessions). Over shm the window matters little.
    pub capacity: u32,
    /// Largest encoded message, in bytes (at most 1 MiB - 2). Each ring slot is this plus a
    /// 4-byte length and a 4-byte mark; keep it close to the real size: slots of up to 512
    /// bytes let a burst go out as runs of up to 64 KiB per WRITE.
    pub max_message: usize,
    /// Receive this side's direction as verbs does everywhere, announced: every run carries
    /// immediate data that completes a receive, even where the provider places data on this
    /// core and the ring could simply be watched (the default there, one wire message per run
    /// and no receive to post). For tests of the announced protocol, and peers that want it.
    pub announce: bool,
}

impl ChannelOptions {
    /// `capacity` slots for messages of up to `max_message` bytes, not announced.
    pub const fn new(capacity: u32, max_message: usize) -> ChannelOptions {
        ChannelOptions {
            capacity,
            max_message,
            announce: false,
        }
    }
}

impl Default for ChannelOptions {
    fn default() -> Self {
        ChannelOptions::new(256, 4096)
    }
}

/// Set in the credit word once the receiver is gone; the rest is its final consumed count.
const GONE: u64 = 1 << 63;

/// True once a credit word holds its receiver's final value (nothing more will be written).
pub(crate) fn credit_word_final(word: &Buffer) -> bool {
    word.load_u64(0) & GONE != 0
}

/// Whether a peer's channel of `capacity` slots of `slot` bytes is one this side can hold: at
/// least one slot, each a multiple of 8 bytes with room for a length, a 1-byte message and a
/// mark, and none beyond the largest message. (An `Open` that asks for another is malformed:
/// the connection fails on it, see `Control::decode`.)
pub(crate) fn ring_shape_fits(capacity: u32, slot: u32) -> bool {
    capacity > 0
        && slot as usize >= extent(1)
        && slot % 8 == 0
        && slot as usize <= crate::control::imm::MAX_MESSAGE + 64
}

/// Credits are returned after this many messages: half the ring where the ring is a window of
/// at most two runs (see [`halves`]), a quarter otherwise.
fn credit_step(capacity: u64, slot: usize) -> u64 {
    if halves(capacity, slot) {
        capacity / 2
    } else {
        (capacity / 4).max(1)
    }
}

/// Whether a ring of `capacity` slots of `slot` bytes goes in halves: it holds at most two runs
/// of `RUN_BYTES`, so a burst would otherwise fill all of it as one or two runs that leave
/// together once the sender yields, and the receiver drain all of it before its credits go
/// (they go with its core's next pass): the two sides would take turns, a stop-and-wait one
/// window wide. In halves, a run ends at half the ring and goes out at once, and the receiver
/// returns credits at each half, also at once, so one half is in flight or being read while
/// the sender fills the other. (At 1,024 slots of 72 bytes over the software provider, 64-byte
/// messages went 1.03x as fast with `recv`, ahead in 10 of 10 alternated rounds, and 1.21x with
/// `recv_many`; bench/RESULTS.md, thirty-sixth session. Quarters sent at once lost: each credit
/// sent at once costs the receiver a system call, which over loopback also runs the peer's TCP
/// input.)
fn halves(capacity: u64, slot: usize) -> bool {
    capacity >= 2 && slot <= COALESCE_MAX_SLOT && capacity * slot as u64 <= 2 * RUN_BYTES as u64
}

/// Bytes one run (one WRITE) may cover: a burst coalesces up to this, or up to the ring's free
/// space and its end, whichever comes first. 64 KiB, what a buffered TCP writer hands the
/// kernel at once (RESULTS, "2026-12-01 (seventh session)", has the runs-of-64 comparison).
const RUN_BYTES: usize = 64 * 1024;

/// Runs of several messages are written only when slots are at most this large; with larger
/// slots each message goes as its own WRITE (a run would carry every slot's unused tail).
const COALESCE_MAX_SLOT: usize = 512;

/// Most messages one WRITE carries, for a ring of `capacity` slots of `slot` bytes: up to
/// `RUN_BYTES` of them, or half the ring where it goes in halves ([`halves`]), or one when
/// slots are large.
fn run_limit(capacity: u64, slot: usize) -> u64 {
    if slot > COALESCE_MAX_SLOT {
        1
    } else if halves(capacity, slot) {
        capacity.div_ceil(2)
    } else {
        (RUN_BYTES / slot.max(1)).max(1) as u64
    }
}

/// The tasks waiting on a channel half: usually one, but tasks may share a half by reference,
/// and each must be woken.
#[derive(Default)]
pub(crate) struct Waiters(RefCell<Vec<Waker>>);

impl Waiters {
    fn register(&self, w: &Waker) {
        let mut v = self.0.borrow_mut();
        if !v.iter().any(|x| x.will_wake(w)) {
            v.push(w.clone());
        }
    }

    /// Wakes every waiting task (keeping the list's allocation for the next wait).
    pub(crate) fn wake(&self) {
        loop {
            let Some(w) = self.0.borrow_mut().pop() else {
                return;
            };
            w.wake();
        }
    }

    fn any(&self) -> bool {
        !self.0.borrow().is_empty()
    }
}

/// The sending half of a channel. Messages arrive in order, exactly once; a full ring holds the
/// sender back (see [`ChannelOptions::capacity`]); dropping it ends the receiver's stream with
/// [`Error::Closed`] once everything sent was received.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{engine::spawn_local, ChannelOptions};
/// let opts = ChannelOptions::new(64, 8);
/// // Both ends open the channel; each gets a sender and a receiver.
/// let far = spawn_local(async move {
///     let (_tx, rx) = a.open_channel::<u64>(opts).await.unwrap();
///     let mut got = Vec::new();
///     while let Ok(v) = rx.recv().await {
///         got.push(v);
///     }
///     got // ended by Closed when the sender went
/// });
/// let (tx, _rx) = b.open_channel::<u64>(opts).await.unwrap();
/// for v in 0..1000u64 {
///     tx.send(&v).await.unwrap(); // waits whenever the 64 slots are full
/// }
/// tx.flush().await.unwrap(); // all 1,000 are in the receiver's ring
/// assert_eq!(tx.sent(), 1000);
/// drop(tx);
/// assert_eq!(far.await.unwrap(), (0..1000).collect::<Vec<_>>());
/// # });
/// ```
pub struct Sender<T, C: Codec<T> = Raw> {
    link: Rc<Link>,
    st: Rc<TxState>,
    scratch: RefCell<Vec<u8>>,
    _t: PhantomData<(fn(T), C)>,
}

/// The receiving half of a channel: [`recv`](Receiver::recv) one message at a time,
/// [`recv_into`](Receiver::recv_into) one at a time into a value the caller keeps, or
/// [`recv_many`](Receiver::recv_many) every message already there.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{engine::spawn_local, ChannelOptions, Error};
/// let opts = ChannelOptions::new(16, 32);
/// let far = spawn_local(async move {
///     let (tx, _rx) = a.open_bare_channel::<String>(opts).await.unwrap();
///     for word in ["one", "two", "three"] {
///         tx.send(&word.to_string()).await.unwrap();
///     }
///     tx.flush().await.unwrap();
/// });
/// let (_tx, rx) = b.open_bare_channel::<String>(opts).await.unwrap();
/// assert_eq!(rx.recv().await.unwrap(), "one");
/// far.await.unwrap(); // the sender is gone now
/// let mut rest = Vec::new();
/// rx.recv_many(&mut rest, 10).await.unwrap();
/// assert_eq!(rest, ["two", "three"]);
/// assert_eq!(rx.recv().await, Err(Error::Closed));
/// assert_eq!(rx.received(), 3);
/// # });
/// ```
pub struct Receiver<T, C: Codec<T> = Raw> {
    link: Rc<Link>,
    st: Rc<RxState>,
    /// Where the sender's credit word is.
    sender_credit: barewire_drivers::RegionDescriptor,
    credit_src: Rc<Buffer>,
    consumed: Cell<u64>,
    /// The slot of message `consumed` (`consumed % capacity`).
    tail: Cell<usize>,
    credited: Cell<u64>,
    /// Credits go back every this many messages.
    step: u64,
    returns: Cell<u64>,
    /// The last look found no message and the receiver waited (see `PREFETCH_SLOTS`).
    waited: Cell<bool>,
    _t: PhantomData<(fn() -> T, C)>,
}
