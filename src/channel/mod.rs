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
mod ring;
mod send;
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
pub(crate) use ring::RxState;
pub(crate) use send::{ensure_flusher, TxState};

use crate::control::imm;
use crate::endpoint::{Inner, Link, Retired};
use crate::error::{Error, Result};
use ring::{extent, length, watch, Look, LEN_SET, MARK, MARK_LEN, PREFIX};
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
    _t: PhantomData<(fn() -> T, C)>,
}

impl<T, C: Codec<T>> Sender<T, C> {
    fn inner(&self) -> &Inner {
        &self.link.inner
    }

    /// The receiver's credit word: its consumed count, with `GONE` once it is gone.
    fn credits(&self) -> u64 {
        self.st.credit.load_u64(0)
    }

    /// True if the receiver has said it consumed everything sent so far.
    fn all_consumed(&self) -> bool {
        self.credits() & !GONE >= self.st.seq.get()
    }

    /// Sends one message: in order, exactly once, unless the connection fails. Returns once
    /// the message is in its slot of the outgoing run (it goes out when this task yields, or
    /// sooner; see the module docs); waits while the ring is full, for as long as the receiver
    /// runs (a receiver that is stopped, hung or cut off makes it fail with
    /// [`Error::PeerGone`] within about two seconds; see the module docs).
    ///
    /// A message that finds room is placed by the first poll of the returned future, inlined
    /// where it is awaited, with no state machine of its own.
    ///
    /// ```no_run
    /// # async fn demo(tx: barewire::Sender<[u8; 64]>) -> barewire::Result<()> {
    /// for i in 0..1000u32 {
    ///     let mut msg = [0u8; 64];
    ///     msg[..4].copy_from_slice(&i.to_le_bytes());
    ///     tx.send(&msg).await?; // waits only while the receiver's ring is full
    /// }
    /// tx.flush().await?; // every message is in the receiver's ring
    /// # Ok(())
    /// # }
    /// ```
    pub fn send<'a>(&'a self, item: &'a T) -> Sending<'a, T, C> {
        Sending {
            tx: self,
            item,
            encoded: None,
            waiting: false,
        }
    }

    /// Sends `bytes` as one message, as `send` does with an item's encoding (tests send
    /// what no codec would).
    #[cfg(test)]
    async fn send_bytes(&self, bytes: &[u8]) -> Result<()> {
        let mut waiting = false;
        poll_fn(|cx| self.poll_place(bytes, &mut waiting, cx)).await
    }

    /// Places `bytes` as the next message, or waits for room (`waiting`: this send has found
    /// the ring full before, and posted what was pending then).
    #[inline(always)]
    fn poll_place(
        &self,
        bytes: &[u8],
        waiting: &mut bool,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        loop {
            match self.try_place(bytes) {
                Ok(true) => return Poll::Ready(Ok(())),
                Ok(false) => {}
                Err(e) => return Poll::Ready(Err(*e)),
            }
            match self.poll_room(waiting, cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
    }

    /// Ready once the next message has a free slot in the ring (`Ok`), or the channel has
    /// failed or the receiver gone (`Err`); otherwise registers to be woken by the receiver's
    /// next credits. The first time a send finds the ring full it posts what is pending: the
    /// receiver cannot free slots it has not seen.
    #[inline(never)]
    fn poll_room(&self, waiting: &mut bool, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let st = &self.st;
        if !std::mem::replace(waiting, true) && st.full() {
            st.post_run()?;
        }
        if let Some(e) = &self.inner().shared.borrow().error {
            return Poll::Ready(Err(e.clone()));
        }
        let c = self.credits();
        if c & GONE != 0 {
            return Poll::Ready(Err(Error::Closed));
        }
        if st.seq.get() - c < st.capacity {
            *waiting = false;
            return Poll::Ready(Ok(()));
        }
        st.waker.register(cx.waker());
        if !st.watching.replace(true) {
            barewire_engine::spawn_local(send::watch_receiver(Rc::downgrade(&self.st)));
        }
        Poll::Pending
    }

    /// Places `bytes` as the next message if the ring has room for it (`false`: it has not,
    /// or the channel has failed; `send_bytes` then waits and reports). The error is boxed:
    /// this runs once per message, and a `Result<(), Error>` is four words that every caller
    /// would copy on the way back, `Ok` or not. Inlined into `send`, where a plain-data
    /// message's length is a constant and its copies need no call.
    #[inline(always)]
    fn try_place(&self, bytes: &[u8]) -> std::result::Result<bool, Box<Error>> {
        let st = &self.st;
        let max = (st.slot - extent(0)).min(imm::MAX_MESSAGE);
        if bytes.len() > max {
            return Err(Box::new(Error::TooLarge {
                len: bytes.len(),
                max,
            }));
        }
        if C::FIXED_LEN.is_some_and(|n| n != bytes.len()) {
            // The receiver relies on the length (see `Codec::FIXED_LEN`).
            return Err(Box::new(Error::Invalid(format!(
                "the codec gave {} bytes where all its messages are {:?} bytes",
                bytes.len(),
                C::FIXED_LEN
            ))));
        }
        let seq = st.seq.get();
        // Room in the ring: fewer than `capacity` messages unconsumed. The credit word is read
        // again only once the room it showed is used up, and at least every credit step (a
        // quarter of the ring), which is also how soon a receiver that has gone is noticed.
        if seq >= st.room_until.get() {
            let c = self.credits();
            if c & GONE != 0 || seq - c.min(seq) >= st.capacity {
                return Ok(false);
            }
            st.room_until.set((c + st.capacity).min(seq + st.step));
        }
        if self.failed() {
            return Ok(false);
        }
        let head = st.head.get();
        let at = head * st.slot;
        let wrapped = head + 1 == st.capacity as usize;
        let next = if wrapped { 0 } else { head + 1 };
        if let Some(m) = st.direct.get() {
            // Straight into the receiver's slot, which is free (the credit check above): the
            // message, its mark, then its length word. The first message since this task last
            // yielded (no run pending, none went straight in since the flush poller ran) is
            // published at once: its length word has `LEN_SET`, and the receiver, which reads
            // that word first, finds the rest in. The rest of a burst is stored unpublished
            // (`LEN_SET` clear, which the receiver reads as not yet written) and published as a
            // run (`TxState::publish`): each message is written once, where a staged run was
            // written twice, and the receiver does not chase the sender through the lines it is
            // writing.
            let len = bytes.len();
            // One checked span for the slot's three stores.
            let slot = m.span(at, st.slot);
            slot.write(PREFIX, bytes);
            slot.store_u32_le(extent(len) - MARK_LEN, MARK);
            st.seq.set(seq + 1);
            st.head.set(next);
            if st.posted.get() == seq && !st.wake_due.get() {
                slot.store_u32_le(0, len as u32 | LEN_SET);
                st.posted.set(seq + 1);
                st.run_at.set(next);
                // The receiver sees it at once unless it sleeps; the flush poller looks at
                // that once this task yields.
                st.wake_due.set(true);
                schedule(st);
                return Ok(true);
            }
            slot.store_u32_le(0, len as u32);
            if wrapped || seq + 1 - st.posted.get() >= st.run_limit {
                st.post_run().map_err(Box::new)?;
            } else {
                schedule(st);
            }
            return Ok(true);
        }
        // The staging slot is free: it last held message `seq - capacity`, which the receiver
        // has consumed (the credit check above), so it was placed, so it was sent.
        // One checked span for the slot's three stores (see `Buffer::span`).
        let slot = st.staging.span(at, st.slot);
        slot.store_u32_le(0, bytes.len() as u32 | LEN_SET);
        slot.write(PREFIX, bytes);
        slot.store_u32_le(extent(bytes.len()) - MARK_LEN, MARK);
        st.last_len.set(bytes.len());
        st.seq.set(seq + 1);
        st.head.set(next);
        // A run ends at the ring's end (a WRITE covers contiguous slots), at RUN_BYTES, or at
        // once when slots are large (a run would carry each slot's unused tail).
        if wrapped || seq + 1 - st.posted.get() >= st.run_limit {
            // Batched: a sender in a burst posts many of these before it yields, and they
            // leave together in one system call; a ring in halves sends each half at once.
            st.post_run_with(!st.halves()).map_err(Box::new)?;
        } else {
            schedule(st);
        }
        Ok(true)
    }

    /// The connection has failed.
    fn failed(&self) -> bool {
        self.inner().failed.get()
    }

    /// Waits until every message sent so far has been placed in the receiver's ring. If the
    /// connection closes first, succeeds only when the receiver had taken every message (a
    /// dropped receiver tells the sender how many it took, ahead of the hang-up), and fails
    /// with [`Error::PeerGone`] otherwise.
    pub async fn flush(&self) -> Result<()> {
        let Some(ring) = self.st.ring.get() else {
            return Ok(());
        };
        self.st.post_run()?;
        // A zero-length READ completes only after everything posted before it has been
        // carried out at the peer.
        let probe = self
            .inner()
            .ops
            .read(&self.st.staging, 0, 0, Remote::at(ring, 0));
        let mut done = Ok(());
        loop {
            // (The borrow ends here: the flush poller may post while this waits.)
            let Some(op) = self.st.inflight.borrow_mut().pop_front() else {
                break;
            };
            if let Err(e) = op.await {
                done = Err(e);
            }
        }
        match done.and(probe.await.map(|_| ())) {
            Ok(()) => Ok(()),
            // The connection went, but the receiver had taken every message first (its last
            // word travels before the hang-up): nothing was lost.
            Err(_) if self.all_consumed() => Ok(()),
            Err(e) => Err(self.inner().driver_error(e)),
        }
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.st.seq.get()
    }
}

impl<T, C: Codec<T>> Drop for Sender<T, C> {
    fn drop(&mut self) {
        // Post what is pending, then tell the receiver no more is coming (it drains what
        // already arrived first). The close notice holds the staging buffer until it
        // completes, so the pending run's bytes stay valid too.
        let _ = self.st.post_run();
        if let Some(ring) = self.st.ring.get() {
            if self.inner().shared.borrow().error.is_none() {
                drop(self.inner().ops.write_with_imm(
                    &self.st.staging,
                    0,
                    0,
                    Remote::at(ring, 0),
                    imm::data(self.st.id, None),
                ));
            }
        }
        self.inner().shared.borrow_mut().chans.remove(&self.st.id);
        // The receiver may still write its credit word, until its final one; after that the
        // id is free for another channel.
        self.inner().half_dropped(
            Retired {
                id: self.st.id,
                buf: self.st.credit.clone(),
                recvs: self.st.recvs(),
            },
            credit_word_final(&self.st.credit),
        );
    }
}

impl<T, C: Codec<T>> Receiver<T, C> {
    fn inner(&self) -> &Inner {
        &self.link.inner
    }

    /// The next message, in the order sent. Waits for one; [`Error::Closed`] once the sender
    /// is gone and everything it sent has been received; [`Error::PeerGone`] if the connection
    /// failed.
    ///
    /// A message already here is taken and returned by the first poll, with no state machine
    /// of its own around it (see [`Recv`]). A receiver that keeps up with a stream of small
    /// messages can take each into one buffer of its own with [`recv_into`](Self::recv_into),
    /// or take them in batches with [`recv_many`](Self::recv_many).
    pub fn recv(&self) -> Recv<'_, T, C> {
        Recv { rx: self }
    }

    /// The next message, into `out`, which keeps it until the next call: what `read_exact`
    /// into a buffer is to a byte stream. Waits and fails as [`recv`](Self::recv) does; on an
    /// error `out` is left as it was.
    ///
    /// Nothing is moved on the way: plain-old-data is copied out of the ring straight into
    /// `out` (where `recv` hands the value back through its `Result`, a copy per move), and a
    /// [`Bytes`] channel reuses `out`'s allocation message after message.
    ///
    /// ```
    /// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
    /// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
    /// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
    /// use barewire::{engine::spawn_local, ChannelOptions};
    /// let opts = ChannelOptions::new(64, 64);
    /// let far = spawn_local(async move { a.open_channel::<[u8; 64]>(opts).await.unwrap() });
    /// let (_tx, rx) = b.open_channel::<[u8; 64]>(opts).await.unwrap();
    /// let (tx, _rx) = far.await.unwrap();
    /// for i in 0..3u8 {
    ///     tx.send(&[i; 64]).await.unwrap();
    /// }
    /// let mut msg = [0u8; 64]; // one buffer for every message
    /// let mut sum = 0u32;
    /// for _ in 0..3 {
    ///     rx.recv_into(&mut msg).await.unwrap();
    ///     sum += msg[0] as u32;
    /// }
    /// assert_eq!(sum, 0 + 1 + 2);
    /// # });
    /// ```
    pub fn recv_into<'a>(&'a self, out: &'a mut T) -> RecvInto<'a, T, C> {
        RecvInto { rx: self, out }
    }

    /// Waits for the next message, then appends it and every further message already here,
    /// up to `limit` in all, to `out`, in the order sent; returns how many it appended (0 only
    /// when `limit` is 0). Errors as [`recv`](Self::recv) does; an error met after some messages
    /// were appended leaves them in `out`.
    ///
    /// For a receiver that keeps up with a stream of messages: one wait covers a batch, and
    /// plain-old-data is copied out of the ring straight into `out`, where `recv` hands each
    /// message back through its own `Result`.
    ///
    /// ```no_run
    /// # async fn demo(rx: barewire::Receiver<[u8; 64]>) -> barewire::Result<()> {
    /// let mut batch = Vec::with_capacity(256);
    /// loop {
    ///     batch.clear();
    ///     match rx.recv_many(&mut batch, 256).await {
    ///         Ok(_) => {}
    ///         Err(barewire::Error::Closed) => return Ok(()),
    ///         Err(e) => return Err(e),
    ///     }
    ///     for msg in &batch {
    ///         // ... use msg
    ///         # let _ = msg;
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn recv_many(&self, out: &mut Vec<T>, limit: usize) -> Result<usize> {
        if limit == 0 {
            return Ok(0);
        }
        let mut taken = 0;
        while taken < limit {
            // A decode error is kept aside, and `take_next` builds its own result (see there).
            let mut failed = None;
            let took = self.take_next(|len, slot| {
                // Only an error is stored: an `Ok` moved into `failed` is a copy of stale
                // stack words per message, from stores of other widths.
                if let Err(e) = C::decode_push(len, |b| slot.read(PREFIX, b), out) {
                    failed = Some(e);
                }
            });
            match took {
                Some(r) => r?,
                // Nothing here: wait for the first message, return with any later one.
                None if taken == 0 => {
                    self.wait().await?;
                    continue;
                }
                None => break,
            }
            if let Some(e) = failed {
                return Err(e);
            }
            taken += 1;
        }
        Ok(taken)
    }

    /// Whether the next message is here.
    #[inline(always)]
    fn ready(&self) -> bool {
        if self.st.polled {
            self.st.landed(self.tail.get() * self.st.slot)
        } else {
            self.st.arrived.get() > self.consumed.get()
        }
    }

    /// Waits until the next message is here, or the channel is closed or failed.
    async fn wait(&self) -> Result<()> {
        poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// Ready once the next message is here (`Ok`), or the channel is closed or failed (`Err`);
    /// otherwise registers to be woken when that changes.
    #[inline(always)]
    fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.ready() {
            return Poll::Ready(Ok(()));
        }
        self.poll_arrival(cx)
    }

    /// `poll_ready` once the next message was not there: out of line, so that a receiver
    /// keeping up with a stream takes each message with no call.
    #[inline(never)]
    fn poll_arrival(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        if self.ready() {
            return Poll::Ready(Ok(()));
        }
        if self.st.closed.get() {
            return Poll::Ready(Err(Error::Closed));
        }
        if let Some(e) = &self.inner().shared.borrow().error {
            return Poll::Ready(Err(e.clone()));
        }
        self.st.waker.register(cx.waker());
        if self.st.polled {
            watch(&self.st, self.tail.get() * self.st.slot);
        }
        Poll::Pending
    }

    /// Takes the next message if it is here: `None` when it is not (a polled ring's slot has
    /// not fully landed, see [`RxState::look`]; an announced ring has no arrival counted for
    /// it). Otherwise `decode` gets its length and its slot (the message starts `PREFIX` bytes
    /// in), and is called exactly once when this returns `Some(Ok)` (never when the length word
    /// is bad); then the slot is freed (also when `decode` fails: the message was the peer's,
    /// and is gone).
    ///
    /// A polled ring's slot is looked at once (`RxState::look`): one checked span and one load
    /// of the length word, then the mark, the message and the clearing stores all through that
    /// span. Before, `recv` asked whether the message had landed and then took it, each finding
    /// the slot and loading its length on its own: 164 instructions per `recv` of a 64-byte
    /// message over shm against 119 now (callgrind), and 1.07x the messages per second
    /// (bench/RESULTS.md, forty-fourth session).
    ///
    /// `decode` keeps its own result, so what this returns is built here, never moved from the
    /// closure. (A `Result` the closure returned, moved out after the bookkeeping below, is
    /// copied whole, payload bytes included, from stores of other widths: a failed store
    /// forwarding per message, about a tenth of the receiver's time in channel-bench's
    /// `recv_many`, and a sixth in `recv`'s.)
    #[inline(always)]
    fn take_next(&self, decode: impl FnOnce(usize, Span<'_>)) -> Option<Result<()>> {
        let n = self.consumed.get();
        let tail = self.tail.get();
        let at = tail * self.st.slot;
        if self.st.polled {
            let (len, slot) = match self.st.look(at) {
                Look::Landed(len, slot) => (len, slot),
                Look::Landing => return None,
                Look::Oversized => return Some(Err(self.malformed_length(at))),
            };
            decode(len, slot);
            self.st
                .clear_taken(&slot, at, len, C::FIXED_LEN == Some(len));
        } else {
            if self.st.arrived.get() <= n {
                return None;
            }
            let slot = self.st.slot_at(at);
            // Announced, so written: a zero word or a length the slot cannot hold is the
            // peer's fault.
            let max = self.st.slot - extent(0);
            let Some(len) = length(slot.load_u32_le(0)).filter(|&len| len <= max) else {
                return Some(Err(self.malformed_length(at)));
            };
            decode(len, slot);
        }
        self.consumed.set(n + 1);
        self.tail.set(if tail + 1 == self.st.capacity as usize {
            0
        } else {
            tail + 1
        });
        if n + 1 - self.credited.get() >= self.step {
            self.return_credits(n + 1);
        }
        Some(Ok(()))
    }

    /// `take_next` for a future's poll: ready once the next message was taken (`decode` called
    /// once with it, as by `take_next`), or the channel is closed or failed; otherwise
    /// registered to be woken when that changes.
    #[inline(always)]
    fn poll_take(
        &self,
        cx: &mut Context<'_>,
        mut decode: impl FnMut(usize, Span<'_>),
    ) -> Poll<Result<()>> {
        loop {
            match self.take_next(&mut decode) {
                Some(r) => return Poll::Ready(r),
                // Not here: closed, failed, or registered to be woken; here after all (it
                // landed meanwhile): taken on the next turn.
                None => match self.poll_arrival(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                },
            }
        }
    }

    /// The error for a slot at `at` whose length word is zero or more than the slot holds.
    #[cold]
    #[inline(never)]
    fn malformed_length(&self, at: usize) -> Error {
        Error::Malformed(format!(
            "length word {:#x} in a {}-byte slot",
            self.st.ring.load_u32_le(at),
            self.st.slot
        ))
    }

    fn return_credits(&self, count: u64) {
        self.credited.set(count);
        self.credit_src.write_at(0, &count.to_ne_bytes());
        let op = SendOp::WriteWithImm {
            remote_addr: self.sender_credit.addr,
            rkey: self.sender_credit.rkey,
            imm: imm::credit(self.st.id),
        };
        let sge = self.credit_src.sge(0, 8);
        let ops = &self.inner().ops;
        // Not awaited: credits only grow, and a failure shows up on the next recv. One in 16
        // (and the last) is signaled, so the send queue drains on verbs too.
        let returns = self.returns.get() + 1;
        self.returns.set(returns);
        if returns % 16 == 0 || count & GONE != 0 {
            drop(ops.execute(op, sge, [self.credit_src.clone()], false));
        } else if let Err(e) = ops.post_unsignaled_with(
            op,
            sge,
            &self.credit_src,
            // A ring in halves has its credits sent at once.
            !halves(self.st.capacity, self.st.slot),
        ) {
            self.inner().driver_error(e);
        }
    }

    /// Messages received so far.
    pub fn received(&self) -> u64 {
        self.consumed.get()
    }
}

/// The future of [`Receiver::recv`]. A message already here is taken by the first poll.
///
/// Dropping it before it completes takes nothing: a wait for a message can be given a
/// deadline, and the next `recv` gets the message the abandoned one would have.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{engine::{spawn_local, time}, ChannelOptions};
/// use std::time::Duration;
/// let opts = ChannelOptions::new(8, 8);
/// let far = spawn_local(async move { a.open_channel::<u64>(opts).await.unwrap() });
/// let (_tx, rx) = b.open_channel::<u64>(opts).await.unwrap();
/// let (tx, _rx) = far.await.unwrap();
/// // Nothing was sent: the wait ends at its deadline.
/// assert!(time::timeout(Duration::from_millis(10), rx.recv()).await.is_err());
/// tx.send(&5).await.unwrap();
/// assert_eq!(time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap(), 5);
/// # });
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct Recv<'a, T, C: Codec<T>> {
    rx: &'a Receiver<T, C>,
}

impl<T, C: Codec<T>> Future for Recv<'_, T, C> {
    type Output = Result<T>;

    // Out of line: the message then reaches the caller's `Poll<Result<T>>` through its return
    // pointer, and the caller reads it from there. Inlined, the compiler moved that value
    // (a 64-byte message sits at offset 1 of a 72-byte `Result`) from stack slot to stack slot
    // in pieces that straddled the stores before them, and each such load waited for its
    // stores to drain instead of being forwarded from them: `Channel<[u8; 64]>` over shm took
    // 35 M msg/s inlined and 58 out of line, with each message handed to `black_box`; 49 and
    // 59 with a receiver that adds up every word (bench/RESULTS.md, forty-second session).
    #[inline(never)]
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let rx = self.rx;
        // Decoded in place and returned from there (see `Codec::decode_into`).
        let mut value = std::mem::MaybeUninit::uninit();
        let mut failed = None;
        let took = rx.poll_take(cx, |len, slot| {
            if let Err(e) = C::decode_into(len, |out| slot.read(PREFIX, out), &mut value) {
                failed = Some(e);
            }
        });
        match took {
            Poll::Ready(Ok(())) => Poll::Ready(match failed {
                Some(e) => Err(e),
                // SAFETY: `poll_take` called the closure once with the message it took, since
                // it returned `Ready(Ok)`, and `decode_into` initialized `value` (it returned
                // `Ok`: `failed` is `None`).
                None => Ok(unsafe { value.assume_init() }),
            }),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The future of [`Receiver::recv_into`]. A message already here is taken by the first poll.
///
/// Dropping it before it completes takes nothing, and leaves `out` as it was.
#[must_use = "futures do nothing unless awaited"]
pub struct RecvInto<'a, T, C: Codec<T>> {
    rx: &'a Receiver<T, C>,
    out: &'a mut T,
}

impl<T, C: Codec<T>> Future for RecvInto<'_, T, C> {
    type Output = Result<()>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let out = &mut *this.out;
        let mut failed = None;
        let took = this.rx.poll_take(cx, |len, slot| {
            if let Err(e) = C::decode_replace(len, |b| slot.read(PREFIX, b), out) {
                failed = Some(e);
            }
        });
        // (Matched on `took` alone: a match on the pair `(took, failed)` made `recv_into` over
        // shm 0.65-0.75x as fast in channel-bench, alternated.)
        match took {
            Poll::Ready(Ok(())) => Poll::Ready(match failed {
                Some(e) => Err(e),
                None => Ok(()),
            }),
            took => took,
        }
    }
}

/// The future of [`Sender::send`]. A named type whose `poll` inlines into the awaiting code:
/// a message that finds room in the ring is placed by the first poll, with no state machine
/// of its own around it.
///
/// Dropping it while the ring is full places nothing: the message is not sent, and the
/// sender can carry on (or give up) with nothing half-written.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let (_nodes, a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{engine::{spawn_local, time}, ChannelOptions};
/// use std::time::Duration;
/// let opts = ChannelOptions::new(2, 8); // room for two messages in flight
/// let far = spawn_local(async move { a.open_channel::<u64>(opts).await.unwrap() });
/// let (tx, _rx) = b.open_channel::<u64>(opts).await.unwrap();
/// let (_tx, rx) = far.await.unwrap();
/// tx.send(&1).await.unwrap();
/// tx.send(&2).await.unwrap();
/// // Full, and nobody reads: the third send gives up at its deadline...
/// assert!(time::timeout(Duration::from_millis(10), tx.send(&3)).await.is_err());
/// assert_eq!(tx.sent(), 2); // ...and was never sent.
/// assert_eq!(rx.recv().await.unwrap(), 1);
/// assert_eq!(rx.recv().await.unwrap(), 2);
/// # });
/// ```
#[must_use = "futures do nothing unless awaited"]
pub struct Sending<'a, T, C: Codec<T>> {
    tx: &'a Sender<T, C>,
    item: &'a T,
    /// The item's encoding, for a codec that encodes (the sender's scratch buffer, taken by
    /// the first poll and given back once the message is placed).
    encoded: Option<Vec<u8>>,
    /// The ring was full, and the run pending then was posted.
    waiting: bool,
}

impl<T, C: Codec<T>> Future for Sending<'_, T, C> {
    type Output = Result<()>;

    #[inline(always)]
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        if let Some(bytes) = C::as_bytes(this.item) {
            return this.tx.poll_place(bytes, &mut this.waiting, cx);
        }
        this.poll_encoded(cx)
    }
}

impl<T, C: Codec<T>> Sending<'_, T, C> {
    /// `poll` for a codec that encodes: once into the scratch buffer, then placed from there.
    fn poll_encoded(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let tx = self.tx;
        let bytes = match &mut self.encoded {
            Some(bytes) => bytes,
            None => {
                let mut bytes = std::mem::take(&mut *tx.scratch.borrow_mut());
                bytes.clear();
                if let Err(e) = C::encode(self.item, &mut bytes) {
                    *tx.scratch.borrow_mut() = bytes;
                    return Poll::Ready(Err(e));
                }
                self.encoded.insert(bytes)
            }
        };
        let r = tx.poll_place(bytes, &mut self.waiting, cx);
        if r.is_ready() {
            if let Some(bytes) = self.encoded.take() {
                *tx.scratch.borrow_mut() = bytes;
            }
        }
        r
    }
}

impl<T, C: Codec<T>> Drop for Receiver<T, C> {
    fn drop(&mut self) {
        // Tell the sender how many it took, and that it is gone: its next send fails, and its
        // flush knows whether everything arrived.
        if self.inner().shared.borrow().error.is_none() {
            self.return_credits(self.consumed.get() | GONE);
        }
        self.inner().shared.borrow_mut().chans.remove(&self.st.id);
        // The sender may still write into the ring, until its close notice.
        self.inner().half_dropped(
            Retired {
                id: self.st.id,
                buf: self.st.ring.clone(),
                recvs: self.st.recvs(),
            },
            self.st.closed.get(),
        );
    }
}
