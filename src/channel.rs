//! `Channel<T>`: ordered, exactly-once messages written by RDMA WRITE into a ring in the
//! receiver's memory, with credits returned by WRITE.
//!
//! Each direction is a ring of `capacity` slots of `slot` bytes in the receiver's registered
//! memory. Message `n` goes to slot `n % capacity` as its length, its bytes and a mark, written
//! from the sender's staging slot; a burst of small messages goes as one WRITE covering
//! several slots. How the receiver learns that a message is there depends on who places the
//! data:
//!
//! - over the software provider, which places data in stream order from the receiving core's
//!   own poller, the receiver watches its ring (a per-core poller looks at the next slot of
//!   each waiting receiver after the provider has run) and sees a message once its mark is in,
//!   exactly as a NIC user polls memory: the WRITE is one wire message and needs no receive;
//! - over verbs, where the NIC places data with no event, each WRITE carries immediate data
//!   (channel, message count) that completes a receive the receiver posted in advance.
//!
//! The receiver copies each message out, then tells the sender how many it has consumed by
//! writing that count into a word of the sender's memory (with immediate data, so a sender
//! waiting for room is woken rather than spinning). The sender never has more than `capacity`
//! messages unconsumed, so it never overwrites one the receiver has not read: a full ring is
//! backpressure, not loss.
//!
//! Plain-old-data `T` travels as its bytes ([`Raw`]); other types are encoded in the BARE
//! message format ([`Bare`], via serde).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::marker::PhantomData;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

use barewire_drivers::{Access, Buffer, Op, Remote, SendOp};
use bytemuck::Pod;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::control::{imm, Control};
use crate::endpoint::{Arrival, ChanRef, Endpoint, Inner, Link};
use crate::error::{Error, Result};
use crate::region::Fingerprint;

/// How a channel turns `T` into bytes and back.
pub trait Codec<T> {
    /// Identifies the codec in the channel handshake (both sides must agree).
    const ID: u8;
    /// Appends the encoding of `item` to `out`.
    fn encode(item: &T, out: &mut Vec<u8>) -> Result<()>;
    /// Decodes one message.
    fn decode(bytes: &[u8]) -> Result<T>;
    /// The encoding of `item` where it is `item`'s own bytes (no copy needed to send it).
    fn as_bytes(_item: &T) -> Option<&[u8]> {
        None
    }
    /// Decodes a `len`-byte message that `fill` copies out of the ring into the slice it is
    /// given (of exactly `len` bytes).
    fn decode_from(len: usize, fill: impl FnOnce(&mut [u8])) -> Result<T> {
        // Small messages are copied out onto the stack, larger ones into a fresh buffer.
        let mut small = [0u8; 256];
        let mut large = Vec::new();
        let bytes: &mut [u8] = if len <= small.len() {
            &mut small[..len]
        } else {
            large.resize(len, 0);
            &mut large
        };
        fill(bytes);
        Self::decode(bytes)
    }
}

/// Plain-old-data as its own bytes: no encoding step at all.
pub struct Raw;

impl<T: Pod> Codec<T> for Raw {
    const ID: u8 = 0;
    fn encode(item: &T, out: &mut Vec<u8>) -> Result<()> {
        out.extend_from_slice(bytemuck::bytes_of(item));
        Ok(())
    }
    fn as_bytes(item: &T) -> Option<&[u8]> {
        Some(bytemuck::bytes_of(item))
    }
    fn decode_from(len: usize, fill: impl FnOnce(&mut [u8])) -> Result<T> {
        if len != std::mem::size_of::<T>() {
            return Err(Error::Malformed(format!(
                "{len} bytes for a {}",
                std::any::type_name::<T>()
            )));
        }
        // Straight into the value: one copy out of the ring.
        let mut v = T::zeroed();
        fill(bytemuck::bytes_of_mut(&mut v));
        Ok(v)
    }
    fn decode(bytes: &[u8]) -> Result<T> {
        bytemuck::try_pod_read_unaligned(bytes).map_err(|e| {
            Error::Malformed(format!(
                "{} bytes for a {}: {e}",
                bytes.len(),
                std::any::type_name::<T>()
            ))
        })
    }
}

/// The BARE message format (draft-devault-bare) through serde.
pub struct Bare;

impl<T: Serialize + DeserializeOwned> Codec<T> for Bare {
    const ID: u8 = 1;
    fn encode(item: &T, out: &mut Vec<u8>) -> Result<()> {
        serde_bare::to_writer(out, item).map_err(|e| Error::Invalid(format!("BARE encoding: {e}")))
    }
    fn decode(bytes: &[u8]) -> Result<T> {
        serde_bare::from_slice(bytes).map_err(|e| Error::Malformed(format!("BARE: {e}")))
    }
}

/// A channel's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelOptions {
    /// Messages that may be in flight (sent, not yet received) per direction.
    pub capacity: u32,
    /// Largest encoded message, in bytes (at most 1 MiB - 2). Each ring slot is this plus a
    /// 4-byte length and a 4-byte mark; keep it close to the real size: slots of up to 512
    /// bytes let a burst go out as runs of up to 64 messages per WRITE.
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

/// Credits are returned after this many messages (a quarter of the ring).
fn credit_step(capacity: u32) -> u64 {
    (capacity as u64 / 4).max(1)
}

/// Most messages one WRITE carries.
const MAX_RUN: u64 = 64;

/// Runs of several messages are written only when slots are at most this large; with larger
/// slots each message goes as its own WRITE (a run would carry every slot's unused tail).
const COALESCE_MAX_SLOT: usize = 512;

/// Each slot starts with the message's length, 4 bytes little-endian.
const PREFIX: usize = 4;

/// After the message (at `PREFIX` + its length rounded up to 4) come these 4 bytes, the last a
/// message's WRITE places: a receiver that watches its ring knows a message has fully landed
/// once they read `MARK` (every byte non-zero, so a partly placed mark never matches).
const MARK_LEN: usize = 4;
const MARK: u32 = 0x5ab1_7e0d;

/// Bytes a message of `len` bytes occupies in its slot: length, message, mark.
fn extent(len: usize) -> usize {
    PREFIX + len.next_multiple_of(4) + MARK_LEN
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

/// The sender's half: what `send` fills, and what the core's flush poller posts.
///
/// `send` copies a message into the staging slot it will occupy in the receiver's ring and
/// returns; consecutive messages form a run, and the run goes out as one RDMA WRITE (on verbs
/// with one immediate announcing how many messages it carries) when the task that sent them
/// yields (the flush poller runs before the core polls the network again), when it reaches
/// `MAX_RUN` messages or the end of the ring, or on `flush`. A burst of small messages
/// therefore costs one work request and one wire message per run, not per message; a lone
/// message goes out as soon as its sender waits for anything. (Runs need small slots: with a
/// `max_message` over ~500 bytes each message is its own WRITE.)
pub(crate) struct TxState {
    id: u16,
    capacity: u64,
    slot: usize,
    /// The word the receiver writes its consumed count into (with `GONE` once it is gone).
    credit: Rc<Buffer>,
    ring: Cell<Option<barewire_drivers::RegionDescriptor>>,
    waker: Waiters,
    link: Weak<Inner>,
    staging: Rc<Buffer>,
    /// Messages written into staging so far.
    seq: Cell<u64>,
    /// The slot message `seq` goes into (`seq % capacity`).
    head: Cell<usize>,
    /// The first message not yet posted.
    posted: Cell<u64>,
    /// The slot of message `posted`.
    run_at: Cell<usize>,
    /// The next message count that is a multiple of the credit step: the run that reaches
    /// it is signaled.
    signal_at: Cell<u64>,
    /// Length of the last message written (the run's WRITE ends there).
    last_len: Cell<usize>,
    /// On the core's flush list.
    listed: Cell<bool>,
    inflight: RefCell<VecDeque<Op>>,
    /// The receiver watches its ring: runs go as plain WRITEs (see `RxState::landed`).
    polled: Cell<bool>,
}

impl TxState {
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// Posts the pending run, if any, as one WRITE (with immediate unless the receiver watches
    /// its ring): transmitted at once, or
    /// (`batched`) with the provider's next pass together with whatever else is posted before
    /// then.
    fn post_run(&self) -> Result<()> {
        self.post_run_with(false)
    }

    fn post_run_with(&self, batched: bool) -> Result<()> {
        let (from, to) = (self.posted.get(), self.seq.get());
        if from == to {
            return Ok(());
        }
        let Some(inner) = self.link.upgrade() else {
            return Ok(());
        };
        if let Some(e) = &inner.shared.borrow().error {
            return Err(e.clone());
        }
        let ring = self.ring.get().expect("accepted channel");
        let count = to - from;
        let at = self.run_at.get() * self.slot;
        let len = (count as usize - 1) * self.slot + extent(self.last_len.get());
        let op = if self.polled.get() {
            SendOp::Write {
                remote_addr: ring.addr + at as u64,
                rkey: ring.rkey,
            }
        } else {
            SendOp::WriteWithImm {
                remote_addr: ring.addr + at as u64,
                rkey: ring.rkey,
                imm: imm::data(self.id, Some(count as usize)),
            }
        };
        let sge = self.staging.sge(at, len);
        self.posted.set(to);
        self.run_at.set(self.head.get());
        // Runs go unsignaled (no completion to wait for, and on the software provider no
        // remote-completion round trip), except one whenever a quarter of the ring has gone
        // by, which keeps a verbs send queue from filling with unsignaled requests and
        // surfaces errors.
        if to >= self.signal_at.get() {
            let step = credit_step(self.capacity as u32);
            self.signal_at.set((to / step + 1) * step);
            let op = inner
                .ops
                .execute(op, vec![sge], vec![self.staging.clone()], false);
            let mut inflight = self.inflight.borrow_mut();
            inflight.push_back(op);
            // Completed ones are dropped; a failure shows on the next `send` or `flush`.
            while inflight.len() > 4 {
                drop(inflight.pop_front());
            }
        } else {
            // At once: a run is already a batch, and the flush poller runs after the provider
            // has polled the network in this pass.
            inner
                .ops
                .post_unsignaled_with(op, vec![sge], &self.staging, batched)
                .map_err(|e| inner.driver_error(e))?;
        }
        Ok(())
    }
}

thread_local! {
    /// This core's senders with a run to post.
    static PENDING: RefCell<Vec<Weak<TxState>>> = const { RefCell::new(Vec::new()) };
    static FLUSHER: Cell<u64> = const { Cell::new(0) };
}

fn schedule(st: &Rc<TxState>) {
    if st.listed.replace(true) {
        return;
    }
    PENDING.with(|p| p.borrow_mut().push(Rc::downgrade(st)));
    ensure_flusher();
}

/// Registers this core's flush poller. A `Node` does it when it is made, so the flusher comes
/// before the provider's poller in each pass: a run posted by it goes out before the core
/// spends a system call looking for input.
pub(crate) fn ensure_flusher() {
    let token = barewire_engine::core_token();
    if FLUSHER.with(|f| f.replace(token)) != token {
        barewire_engine::register_poller(Box::new(Flusher { batch: Vec::new() }));
    }
}

/// Posts every pending run on this core, once per loop pass, before the core sleeps.
struct Flusher {
    /// The list being flushed, swapped with `PENDING` so neither allocates once warm.
    batch: Vec<Weak<TxState>>,
}

impl Flusher {
    fn flush_all(&mut self) -> bool {
        PENDING.with(|p| std::mem::swap(&mut *p.borrow_mut(), &mut self.batch));
        let any = !self.batch.is_empty();
        for st in self.batch.drain(..).filter_map(|w| w.upgrade()) {
            st.listed.set(false);
            // An error here is the connection's; the sender sees it on its next call.
            let _ = st.post_run();
        }
        any
    }
}

impl barewire_engine::Poller for Flusher {
    fn poll(&mut self) -> bool {
        self.flush_all()
    }

    fn pure_poll(&mut self) -> bool {
        PENDING.with(|p| !p.borrow().is_empty())
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        !self.flush_all()
    }
}

impl Arrival for TxState {
    fn arrived(&self, _credit: bool, _len: Option<usize>) {
        self.wake();
    }
}

/// The receiver's half, as the receive task sees it.
pub(crate) struct RxState {
    id: u16,
    capacity: u64,
    slot: usize,
    ring: Rc<Buffer>,
    /// Messages that have arrived (the ring holds them in order from `consumed`).
    arrived: Cell<u64>,
    /// The sender's close notice has come.
    closed: Cell<bool>,
    waker: Waiters,
    /// This side watches the ring's memory for arrivals (the sender writes plain WRITEs);
    /// otherwise each run's immediate counts them (`arrived`).
    polled: bool,
    /// Where the waited-for message starts, while on the core's watch list.
    watch_at: Cell<usize>,
    watched: Cell<bool>,
}

impl RxState {
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    fn word_at(&self, at: usize) -> u32 {
        let mut w = [0u8; 4];
        self.ring.read_at(at, &mut w);
        u32::from_le_bytes(w)
    }

    /// Polled rings: whether the message whose slot starts at `at` has fully landed. The
    /// provider places a WRITE's bytes in order, so its length comes before the message and
    /// the mark after; a consumed slot is zeroed, so a mark can only be this message's. A
    /// length too large for the slot counts as landed, for `recv` to report.
    fn landed(&self, at: usize) -> bool {
        let len = self.word_at(at) as usize;
        len > self.slot - extent(0) || self.word_at(at + extent(len) - MARK_LEN) == MARK
    }
}

thread_local! {
    /// This core's receivers of polled rings that wait for a message.
    static WATCHED: RefCell<Vec<Weak<RxState>>> = const { RefCell::new(Vec::new()) };
    static WATCHER: Cell<u64> = const { Cell::new(0) };
}

/// Puts a receiver that waits for the message at `at` on the core's watch list.
fn watch(st: &Rc<RxState>, at: usize) {
    st.watch_at.set(at);
    if st.watched.replace(true) {
        return;
    }
    WATCHED.with(|w| w.borrow_mut().push(Rc::downgrade(st)));
    let token = barewire_engine::core_token();
    if WATCHER.with(|t| t.replace(token)) != token {
        barewire_engine::register_poller(Box::new(RingWatcher));
    }
}

/// Looks, in every pass, at the next slot of each polled ring whose receiver waits, and wakes
/// the receiver once its message has landed. It is registered after the provider's poller
/// (a ring exists only once a connection does), so a message is seen in the pass that placed
/// it, as a NIC user polling memory would; before the core sleeps it looks once more, and the
/// next arrival wakes the core through the provider's socket.
struct RingWatcher;

impl RingWatcher {
    fn scan(&self) -> bool {
        WATCHED.with(|w| {
            let mut any = false;
            w.borrow_mut().retain(|st| {
                let Some(st) = st.upgrade() else {
                    return false;
                };
                let waiting = st.waker.any();
                if waiting && !st.landed(st.watch_at.get()) {
                    return true;
                }
                st.watched.set(false);
                if waiting {
                    any = true;
                    st.wake();
                }
                false
            });
            any
        })
    }
}

impl barewire_engine::Poller for RingWatcher {
    fn poll(&mut self) -> bool {
        self.scan()
    }

    fn pure_poll(&mut self) -> bool {
        WATCHED.with(|w| {
            w.borrow()
                .iter()
                .any(|st| st.upgrade().is_some_and(|st| st.landed(st.watch_at.get())))
        })
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        !self.scan()
    }
}

impl Arrival for RxState {
    fn arrived(&self, _credit: bool, count: Option<usize>) {
        match count {
            Some(n) => self.arrived.set(self.arrived.get() + n as u64),
            None => self.closed.set(true),
        }
        self.wake();
    }
}

/// The sending half of a channel.
pub struct Sender<T, C: Codec<T> = Raw> {
    link: Rc<Link>,
    st: Rc<TxState>,
    scratch: RefCell<Vec<u8>>,
    _t: PhantomData<(fn(T), C)>,
}

/// The receiving half of a channel.
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

impl Endpoint {
    /// Opens a duplex channel of plain-old-data `T` with the peer, who calls this too: each
    /// side gets the sender of its direction and the receiver of the other. Channels pair up in
    /// the order both sides open them; a peer that opens a channel of another type (or codec)
    /// makes both calls fail with [`Error::TypeMismatch`].
    ///
    /// ```no_run
    /// # async fn demo(ep: barewire::Endpoint) -> barewire::Result<()> {
    /// let (tx, rx) = ep.open_channel::<[u64; 8]>(Default::default()).await?;
    /// tx.send(&[1; 8]).await?;
    /// let got: [u64; 8] = rx.recv().await?;
    /// # let _ = got; Ok(()) }
    /// ```
    pub async fn open_channel<T: Pod>(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<T, Raw>, Receiver<T, Raw>)> {
        self.open::<T, Raw>(opts).await
    }

    /// As [`open_channel`](Self::open_channel), for any serde type, BARE-encoded.
    pub async fn open_bare_channel<T: Serialize + DeserializeOwned>(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<T, Bare>, Receiver<T, Bare>)> {
        self.open::<T, Bare>(opts).await
    }

    async fn open<T, C: Codec<T>>(
        &self,
        opts: ChannelOptions,
    ) -> Result<(Sender<T, C>, Receiver<T, C>)> {
        if opts.capacity == 0 || opts.max_message == 0 || opts.max_message > imm::MAX_MESSAGE {
            return Err(Error::Invalid(format!(
                "channel capacity {} and max_message {} (1..={})",
                opts.capacity,
                opts.max_message,
                imm::MAX_MESSAGE
            )));
        }
        let inner: &Rc<Inner> = self.inner();
        let fp = Fingerprint::of::<T>();
        let slot = extent(opts.max_message).next_multiple_of(8);
        let cap = opts.capacity as u64;
        let index = inner.next_open_index();

        // Our direction: a credit word the peer may write, receives for its credit notices.
        let id = inner.next_chan_id()?;
        let credit = Buffer::new(
            &inner.pd,
            64,
            64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        let tx = Rc::new(TxState {
            id,
            capacity: cap,
            slot,
            credit: credit.clone(),
            ring: Cell::new(None),
            waker: Waiters::default(),
            link: Rc::downgrade(inner),
            staging: Buffer::new(&inner.pd, cap as usize * slot, 64, Access::LOCAL_WRITE)?,
            seq: Cell::new(0),
            head: Cell::new(0),
            posted: Cell::new(0),
            run_at: Cell::new(0),
            signal_at: Cell::new(credit_step(opts.capacity)),
            last_len: Cell::new(0),
            listed: Cell::new(false),
            inflight: RefCell::new(VecDeque::new()),
            polled: Cell::new(false),
        });
        inner.add_recvs((cap / credit_step(opts.capacity)) as usize + 4)?;
        inner
            .shared
            .borrow_mut()
            .chans
            .insert(id, ChanRef::Tx(Rc::downgrade(&tx)));
        inner
            .send_control(&Control::Open {
                id,
                fp: fp.clone(),
                codec: C::ID,
                capacity: opts.capacity,
                slot: slot as u32,
                credit: credit.descriptor(),
            })
            .await?;

        // Their direction: the index-th Open the peer sent.
        let (pid, pfp, pcodec, pcap, pslot, pcredit) = inner
            .wait_control(|ord, c| match c {
                Control::Open {
                    id,
                    fp,
                    codec,
                    capacity,
                    slot,
                    credit,
                } if ord == index => Some((*id, fp.clone(), *codec, *capacity, *slot, *credit)),
                _ => None,
            })
            .await?;
        let mismatch = fp.check(&pfp).err().or_else(|| {
            (pcodec != C::ID).then(|| Error::TypeMismatch {
                expected: format!("{fp} with codec {}", C::ID),
                found: format!("{pfp} with codec {pcodec}"),
            })
        });
        if let Some(e) = mismatch {
            let _ = inner
                .send_control(&Control::Refuse {
                    id: pid,
                    reason: e.to_string(),
                })
                .await;
            inner.shared.borrow_mut().chans.remove(&id);
            return Err(e);
        }
        if pcap == 0
            || (pslot as usize) < extent(1)
            || pslot % 8 != 0
            || pslot as usize > imm::MAX_MESSAGE + 64
        {
            return Err(Error::Malformed(format!(
                "channel of {pcap} slots of {pslot} bytes"
            )));
        }
        let ring = Buffer::new(
            &inner.pd,
            pcap as usize * pslot as usize,
            64,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )?;
        // Watch the ring where the provider places data on this core (it is zeroed).
        let polled = inner.ops.qp().places_on_this_core() && !opts.announce;
        let rx = Rc::new(RxState {
            id: pid,
            capacity: pcap as u64,
            slot: pslot as usize,
            ring: ring.clone(),
            arrived: Cell::new(0),
            closed: Cell::new(false),
            waker: Waiters::default(),
            polled,
            watch_at: Cell::new(0),
            watched: Cell::new(false),
        });
        // Announced runs need a receive posted for every message the peer may have in flight
        // before it may send; a polled ring only for the close notice.
        inner.add_recvs(if polled { 4 } else { pcap as usize + 4 })?;
        inner
            .shared
            .borrow_mut()
            .chans
            .insert(pid, ChanRef::Rx(Rc::downgrade(&rx)));
        inner
            .send_control(&Control::Accept {
                id: pid,
                ring: ring.descriptor(),
                polled,
            })
            .await?;

        // The peer's answer to ours.
        let answer = inner
            .wait_control(|_, c| match c {
                Control::Accept {
                    id: a,
                    ring,
                    polled,
                } if *a == id => Some(Ok((*ring, *polled))),
                Control::Refuse { id: a, reason } if *a == id => Some(Err(reason.clone())),
                _ => None,
            })
            .await?;
        match answer {
            Ok((r, polled)) => {
                tx.ring.set(Some(r));
                tx.polled.set(polled);
            }
            Err(reason) => {
                inner.shared.borrow_mut().chans.remove(&id);
                return Err(Error::TypeMismatch {
                    expected: format!("{fp} with codec {}", C::ID),
                    found: format!("a channel the peer refused: {reason}"),
                });
            }
        }
        let credit_src = Buffer::new(&inner.pd, 64, 64, Access::LOCAL_WRITE)?;
        Ok((
            Sender {
                link: self.link.clone(),
                st: tx,
                scratch: RefCell::new(Vec::with_capacity(opts.max_message)),
                _t: PhantomData,
            },
            Receiver {
                link: self.link.clone(),
                st: rx,
                sender_credit: pcredit,
                credit_src,
                consumed: Cell::new(0),
                tail: Cell::new(0),
                credited: Cell::new(0),
                step: credit_step(pcap),
                returns: Cell::new(0),
                _t: PhantomData,
            },
        ))
    }
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
    /// sooner; see the module docs); waits while the ring is full.
    pub async fn send(&self, item: &T) -> Result<()> {
        if let Some(bytes) = C::as_bytes(item) {
            // Room in the ring is the common case: placed without a future of its own.
            if let Some(done) = self.try_place(bytes) {
                return done;
            }
            return self.send_bytes(bytes).await;
        }
        let mut bytes = std::mem::take(&mut *self.scratch.borrow_mut());
        bytes.clear();
        C::encode(item, &mut bytes)?;
        let r = self.send_bytes(&bytes).await;
        *self.scratch.borrow_mut() = bytes;
        r
    }

    async fn send_bytes(&self, bytes: &[u8]) -> Result<()> {
        loop {
            if let Some(done) = self.try_place(bytes) {
                return done;
            }
            self.wait_room(self.st.seq.get()).await?;
        }
    }

    /// Places `bytes` as the next message if the ring has room for it (`None`: it has not,
    /// or the channel has failed; `send_bytes` then waits and reports).
    fn try_place(&self, bytes: &[u8]) -> Option<Result<()>> {
        let st = &self.st;
        let max = (st.slot - extent(0)).min(imm::MAX_MESSAGE);
        if bytes.len() > max {
            return Some(Err(Error::TooLarge {
                len: bytes.len(),
                max,
            }));
        }
        let seq = st.seq.get();
        // Room in the ring: fewer than `capacity` messages unconsumed.
        let c = self.credits();
        if c & GONE != 0 || seq - c.min(seq) >= st.capacity || self.failed() {
            return None;
        }
        // The staging slot is free: it last held message `seq - capacity`, which the receiver
        // has consumed (the credit check above), so it was placed, so it was sent.
        let head = st.head.get();
        let at = head * st.slot;
        st.staging.write_at(at, &(bytes.len() as u32).to_le_bytes());
        st.staging.write_at(at + PREFIX, bytes);
        st.staging
            .write_at(at + extent(bytes.len()) - MARK_LEN, &MARK.to_le_bytes());
        st.last_len.set(bytes.len());
        st.seq.set(seq + 1);
        let wrapped = head + 1 == st.capacity as usize;
        st.head.set(if wrapped { 0 } else { head + 1 });
        // A run ends at the ring's end (a WRITE covers contiguous slots), at MAX_RUN, or at
        // once when slots are large (a run would carry each slot's unused tail).
        if wrapped || seq + 1 - st.posted.get() >= MAX_RUN || st.slot > COALESCE_MAX_SLOT {
            // Batched: a sender in a burst posts many of these before it yields, and they
            // leave together in one system call.
            Some(st.post_run_with(true))
        } else {
            schedule(st);
            Some(Ok(()))
        }
    }

    /// The connection has failed.
    fn failed(&self) -> bool {
        self.inner().shared.borrow().error.is_some()
    }

    /// Waits until message `seq` has a free slot in the ring (or the channel fails).
    async fn wait_room(&self, seq: u64) -> Result<()> {
        let st = &self.st;
        if seq - self.credits().min(seq) >= st.capacity {
            // Post what is pending first: the receiver cannot free slots it has not seen.
            st.post_run()?;
        }
        poll_fn(|cx| {
            if let Some(e) = &self.inner().shared.borrow().error {
                return Poll::Ready(Err(e.clone()));
            }
            let c = self.credits();
            if c & GONE != 0 {
                return Poll::Ready(Err(Error::Closed));
            }
            if seq - c < st.capacity {
                return Poll::Ready(Ok(()));
            }
            st.waker.register(cx.waker());
            Poll::Pending
        })
        .await
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
        // The receiver may still write its credit word, until its final one.
        if !credit_word_final(&self.st.credit) {
            self.inner()
                .retired
                .borrow_mut()
                .push((self.st.id, self.st.credit.clone()));
        }
    }
}

impl<T, C: Codec<T>> Receiver<T, C> {
    fn inner(&self) -> &Inner {
        &self.link.inner
    }

    /// The next message, in the order sent. Waits for one; [`Error::Closed`] once the sender
    /// is gone and everything it sent has been received; [`Error::PeerGone`] if the connection
    /// failed.
    pub async fn recv(&self) -> Result<T> {
        loop {
            // A message already here is taken without a future of its own.
            if let Some(item) = self.try_take() {
                return item;
            }
            self.wait().await?;
        }
    }

    /// Whether the next message is here.
    fn ready(&self) -> bool {
        if self.st.polled {
            self.st.landed(self.tail.get() * self.st.slot)
        } else {
            self.st.arrived.get() > self.consumed.get()
        }
    }

    /// Waits until the next message is here, or the channel is closed or failed.
    async fn wait(&self) -> Result<()> {
        poll_fn(|cx| {
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
        })
        .await
    }

    /// Takes the next message if it is here (`None`: it is not).
    fn try_take(&self) -> Option<Result<T>> {
        if !self.ready() {
            return None;
        }
        let n = self.consumed.get();
        let tail = self.tail.get();
        let at = tail * self.st.slot;
        let len = self.st.word_at(at) as usize;
        if len > self.st.slot - extent(0) {
            return Some(Err(Error::Malformed(format!(
                "a {len}-byte message in a {}-byte slot",
                self.st.slot
            ))));
        }
        let item = C::decode_from(len, |out| self.st.ring.read_at(at + PREFIX, out));
        if self.st.polled {
            // Zero what the sender may have written into the slot (a run carries whole slots,
            // a lone large-slot message only its extent), so the next mark seen here is new.
            let written = if self.st.slot <= COALESCE_MAX_SLOT {
                self.st.slot
            } else {
                extent(len)
            };
            self.st.ring.zero(at, written);
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
        Some(item)
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
            drop(ops.execute(op, vec![sge], vec![self.credit_src.clone()], false));
        } else if let Err(e) = ops.post_unsignaled(op, vec![sge], &self.credit_src) {
            self.inner().driver_error(e);
        }
    }

    /// Messages received so far.
    pub fn received(&self) -> u64 {
        self.consumed.get()
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
        if !self.st.closed.get() {
            self.inner()
                .retired
                .borrow_mut()
                .push((self.st.id, self.st.ring.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use barewire_drivers::{Device, DriverConfig};

    /// Channels opened and dropped over and over on one long-lived connection: each dropped
    /// half's buffer goes once the peer's last word for it has arrived, so nothing piles up.
    #[test]
    fn dropped_channels_release_their_buffers_once_the_peer_is_done() {
        use crate::Node;
        use std::time::Duration;
        barewire_engine::Runtime::builder()
            .cores(1)
            .pin(false)
            .idle_spin(Duration::ZERO)
            .build()
            .unwrap()
            .block_on(async {
                let a = Node::soft().unwrap();
                let b = Node::soft().unwrap();
                let port = a.listen("127.0.0.1:0".parse().unwrap()).unwrap();
                let accepted = barewire_engine::spawn_local(async move {
                    let ep = a.accept().await.unwrap();
                    (a, ep)
                });
                let eb = b
                    .connect(format!("127.0.0.1:{port}").parse().unwrap())
                    .await
                    .unwrap();
                let (_a, ea) = accepted.await.unwrap();
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
                // The connection still works.
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
            });
    }

    /// A polled ring's slot seen at every stage of its placement, byte by byte in stream order
    /// as the provider places a WRITE (TCP may cut anywhere): the message counts as landed only
    /// once the last byte of its mark is in, never before, whatever length it has.
    #[test]
    fn a_polled_slot_lands_only_with_the_last_byte_of_its_mark() {
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
                    watch_at: Cell::new(0),
                    watched: Cell::new(false),
                };
                for len in [0usize, 1, 3, 4, 5, 39, 40] {
                    // What the sender's staging slot holds: length, message (bytes that look
                    // like marks, to be nasty), mark.
                    let mut bytes = (len as u32).to_le_bytes().to_vec();
                    bytes.extend(MARK.to_le_bytes().iter().cycle().take(len));
                    bytes.resize(extent(len) - MARK_LEN, 0);
                    bytes.extend_from_slice(&MARK.to_le_bytes());
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
                ring.write_at(0, &(slot as u32).to_le_bytes());
                assert!(st.landed(0));
            });
    }
}
