//! An endpoint: one connection to one peer, with typed one-sided operations, region exchange,
//! and the receive side that every channel on the connection shares.
//!
//! Every announced message consumes one posted receive, in order: control messages (SEND)
//! land in the receive's slot; channel credits, close notices and (where a ring is not
//! watched, as on verbs) channel data come by WRITE with immediate and only use the receive to
//! announce themselves. Each receive completion is handled as it arrives (see `recv`): control
//! messages go to whoever waits for them, arrivals to their channel, and the slot is posted
//! again. Each channel posts enough receives for everything it can announce in flight, before
//! the peer may send it anything.

mod recv;

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use barewire_drivers::{
    Access, Buffer, CompletionQueue, DriverError, Endpoint as Ops, Op, ProtectionDomain, QueuePair,
    RecvWr, Remote, SendOp,
};
use bytemuck::Pod;

use crate::control::{Control, MAX as CONTROL_MAX};
use crate::error::{Error, Result};
use crate::region::{Fingerprint, Region, RemoteRegion};

use recv::RxPoller;
pub(crate) use recv::{Arrival, ChanRef, ChanTable, RecvSide};

/// Receives posted when an endpoint starts, for control messages.
const CONTROL_RECVS: usize = 32;

pub(crate) struct Shared {
    /// Control messages not yet taken, each with its ordinal among the peer's channel Opens
    /// (channels pair up in the order both sides open them).
    pub(crate) inbox: VecDeque<(usize, Control)>,
    opens_arrived: usize,
    waiters: Vec<Waker>,
    pub(crate) chans: ChanTable,
    next_chan: u16,
    /// Ids of this side's channels that both sides are done with (see `free_chan_id`), taken
    /// again before new ones.
    free_ids: Vec<u16>,
    /// Ids of this side's channels whose open this side gave up (it refused the peer's half)
    /// before the peer's answer to it came: each is freed when that answer arrives, the
    /// peer's last word for it.
    pub(crate) unanswered: Vec<u16>,
    pub(crate) error: Option<Error>,
    /// Channels opened so far (pairs the k-th open on each side).
    opened: usize,
}

pub(crate) struct Inner {
    pub(crate) ops: Ops,
    /// The receive queue (also drained by the receive poller, see `RxPoller`).
    rcq: CompletionQueue,
    pub(crate) pd: Rc<ProtectionDomain>,
    pub(crate) shared: RefCell<Shared>,
    /// `shared.error` is set: what a channel's sender checks for each message, without a
    /// borrow.
    pub(crate) failed: Cell<bool>,
    /// The receive slots (shared with the receive handler, which outlives this).
    recv: Rc<RecvSide>,
    scratch: RefCell<Vec<Rc<Buffer>>>,
    /// Buffers of dropped channel halves that the peer may still write, by channel id (a ring
    /// whose sender has not yet sent its close notice, a credit word whose receiver has not yet
    /// said it is gone): they stay registered until that last word arrives, so a late write
    /// lands harmlessly instead of meeting a dead STag and a Terminate.
    pub(crate) retired: RefCell<Vec<Retired>>,
    /// Which channel ids this side opens: even on the connecting side, odd on the accepting.
    parity: u16,
    /// Windows bound for the peer on this connection (see [`Endpoint::send_region`]); they die
    /// with the connection.
    windows: RefCell<Vec<barewire_drivers::Window>>,
    /// Where the peer's operations after a descriptor sent here arrive, when that is not this
    /// connection's own end: a mesh's connection to its own node is used through its
    /// connecting end, so its accepting end serves the windows.
    pub(crate) serves_windows: RefCell<Option<Rc<Inner>>>,
    /// How long a handshake waits for the peer's part (see [`Endpoint::set_handshake_timeout`]).
    handshake_timeout: std::cell::Cell<Option<Duration>>,
    /// The largest ring this side allocates for one of the peer's channels (see
    /// [`Endpoint::set_channel_ring_limit`]).
    pub(crate) ring_limit: Cell<usize>,
}

/// The most control messages (a region sent with [`Endpoint::send_region`], a channel's
/// opening) that wait on a connection for this side to take them; a peer that sends more is
/// flooding, and the connection fails with [`Error::Malformed`] and closes.
pub(crate) const MAX_QUEUED_CONTROLS: usize = 1024;

/// A dropped channel half's buffer that the peer may still write (see `Inner::retired`).
pub(crate) struct Retired {
    /// The channel's id.
    pub(crate) id: u16,
    /// The ring (a receiver's) or the credit word (a sender's).
    pub(crate) buf: Rc<Buffer>,
    /// The receives the half added to the connection's pool, given back with the buffer.
    pub(crate) recvs: usize,
}

/// What a region or channel handshake waits for the peer by default.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest ring, in bytes, an endpoint allocates for one channel its peer sends on, unless
/// set otherwise ([`Endpoint::set_channel_ring_limit`]): 256 MiB. A default channel's ring is
/// about 1 MiB (256 slots of 4 KiB).
pub const DEFAULT_CHANNEL_RING_LIMIT: usize = 256 << 20;

/// Says once per process that regions are exported with their own keys (a backend without
/// windows).
pub(crate) fn windows_unavailable(e: &barewire_drivers::DriverError) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "barewire: regions are exported unbound, with their own keys valid on every \
             connection ({e})"
        )
    });
}

/// Closes the connection when the last user handle (endpoint or channel half) goes.
pub(crate) struct Link {
    pub(crate) inner: Rc<Inner>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.inner.ops.qp().disconnect();
    }
}

/// A connection to one peer. Cloning gives another handle; the connection closes when the last
/// handle, and the last channel half made from it, are dropped.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let ([home, _], a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{Align, Error};
/// // One side lends a region of eight counters to the other...
/// let counters = home.region::<u64>(8, Align::CacheLine).unwrap();
/// a.send_region(&counters).await.unwrap();
/// // ...which reads, writes and updates it with one-sided operations.
/// let remote = b.recv_region::<u64>().await.unwrap();
/// b.write(&remote, 0, 40).await.unwrap();
/// assert_eq!(b.fetch_add(&remote, 0, 2).await.unwrap(), 40); // the value before
/// assert_eq!(b.compare_and_swap(&remote, 1, 0, 9).await.unwrap(), 0);
/// b.write_slice(&remote, 4, &[1, 2, 3]).await.unwrap();
/// assert_eq!(b.read_slice(&remote, 0, 8).await.unwrap(), [42, 9, 0, 0, 1, 2, 3, 0]);
/// assert_eq!(counters.get(0), 42); // the owner sees the same memory
/// // Indices outside the region are refused before anything moves.
/// assert!(matches!(b.read(&remote, 8).await, Err(Error::OutOfBounds { .. })));
/// # });
/// ```
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) link: Rc<Link>,
}

impl Inner {
    pub(crate) fn wake_all(&self) {
        for w in self.shared.borrow_mut().waiters.drain(..) {
            w.wake();
        }
    }

    pub(crate) async fn send_control(&self, c: &Control) -> Result<()> {
        let bytes = c.encode();
        let buf = self.scratch(bytes.len())?;
        buf.write_at(0, &bytes);
        let r = self.ops.send(&buf, 0, bytes.len()).await;
        self.give_back(buf);
        r.map(|_| ()).map_err(|e| self.driver_error(e))
    }

    /// Asks whether the peer is alive, in a way every transport answers only with the peer's
    /// own CPU or fails within its timeout: a [`Control::Ping`], which the peer's receive side
    /// takes and drops (a shm Send completes only once the peer has taken it), then a
    /// zero-length READ (which the software provider serves on the peer's core) of `at`, a
    /// region of the peer's (a zero-length READ names no bytes of it). A peer that is stopped,
    /// hung or cut off fails the connection, as any work request to it would; a NIC answers
    /// both for a stopped process, so over verbs this sees only a dead or cut-off peer.
    pub(crate) async fn probe(&self, at: barewire_drivers::RegionDescriptor) -> Result<()> {
        self.send_control(&Control::Ping).await?;
        let buf = self.scratch(8)?;
        let r = self.ops.read(&buf, 0, 0, Remote::at(at, 0)).await;
        self.give_back(buf);
        r.map(|_| ()).map_err(|e| self.driver_error(e))
    }

    /// The next control message `pick` accepts (others stay queued, in order).
    pub(crate) async fn wait_control<T>(
        &self,
        pick: impl Fn(usize, &Control) -> Option<T>,
    ) -> Result<T> {
        poll_fn(|cx| {
            let mut s = self.shared.borrow_mut();
            let found = s
                .inbox
                .iter()
                .enumerate()
                .find_map(|(i, (ord, c))| pick(*ord, c).map(|v| (i, v)));
            if let Some((i, v)) = found {
                s.inbox.remove(i);
                return Poll::Ready(Ok(v));
            }
            if let Some(e) = &s.error {
                return Poll::Ready(Err(e.clone()));
            }
            s.waiters.push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// [`wait_control`](Self::wait_control) within the handshake timeout: past it, a
    /// [`Error::Timeout`] naming `what` was awaited.
    pub(crate) async fn handshake<T>(
        &self,
        what: &str,
        pick: impl Fn(usize, &Control) -> Option<T>,
    ) -> Result<T> {
        match self.handshake_timeout.get() {
            None => self.wait_control(pick).await,
            Some(limit) => barewire_engine::time::timeout(limit, self.wait_control(pick))
                .await
                .unwrap_or_else(|_| {
                    Err(Error::Timeout(format!(
                        "no {what} from the peer within {limit:?}"
                    )))
                }),
        }
    }

    /// Fails the connection with `e` (every waiter and later call gets it) and hangs up: for a
    /// peer that left a handshake half done, after which the two sides no longer agree.
    pub(crate) fn abandon(&self, e: Error) -> Error {
        let e = self.fail_with(e);
        self.ops.qp().disconnect();
        e
    }

    /// A registered staging buffer of at least `len` bytes (pooled when small).
    pub(crate) fn scratch(&self, len: usize) -> Result<Rc<Buffer>> {
        if len <= 4096 {
            if let Some(b) = self.scratch.borrow_mut().pop() {
                return Ok(b);
            }
        }
        Ok(Buffer::new(
            &self.pd,
            len.max(4096),
            64,
            Access::LOCAL_WRITE,
        )?)
    }

    pub(crate) fn give_back(&self, b: Rc<Buffer>) {
        // Only a buffer no operation still holds goes back to the pool.
        if b.len() == 4096 && Rc::strong_count(&b) == 1 {
            self.scratch.borrow_mut().push(b);
        }
    }

    /// A failed work request means the connection is gone (or the peer refused an access).
    pub(crate) fn driver_error(&self, e: DriverError) -> Error {
        match e {
            DriverError::Completion {
                status:
                    barewire_drivers::WcStatus::WrFlushErr | barewire_drivers::WcStatus::RetryExcErr,
                ..
            } => self.fail_with(Error::PeerGone(e.to_string())),
            e => Error::from(e),
        }
    }

    fn fail_with(&self, e: Error) -> Error {
        let mut s = self.shared.borrow_mut();
        let e = s.error.get_or_insert(e).clone();
        drop(s);
        self.failed.set(true);
        self.wake_all();
        self.wake_channels();
        e
    }

    fn wake_channels(&self) {
        let chans: Vec<_> = self
            .shared
            .borrow()
            .chans
            .values()
            .filter_map(|c| match c {
                ChanRef::Tx(t) => t.upgrade().map(|t| t.wake()),
                ChanRef::Rx(r) => r.upgrade().map(|r| r.wake()),
            })
            .collect();
        drop(chans);
    }

    pub(crate) fn next_chan_id(&self) -> Result<u16> {
        let mut s = self.shared.borrow_mut();
        if let Some(id) = s.free_ids.pop() {
            return Ok(id);
        }
        let id = s.next_chan * 2 + self.parity;
        if id > 0x7ff {
            return Err(Error::Invalid(
                "more than 1024 channels open (or closing) on one endpoint".into(),
            ));
        }
        s.next_chan += 1;
        Ok(id)
    }

    /// This side's channel `id` may be given to a new channel: its sender has been dropped
    /// (and sent its close notice, which reaches the peer before any later Open) and the
    /// receiver's final credit word, its last word for `id`, has arrived; or its open failed
    /// and the peer's answer to it (Accept or Refuse, exactly one per Open) has arrived, or it
    /// never reached the peer. (Ids go into an immediate's 11 bits, so each side has 1,024.)
    pub(crate) fn free_chan_id(&self, id: u16) {
        if id & 1 == self.parity {
            self.shared.borrow_mut().free_ids.push(id);
        }
    }

    pub(crate) fn next_open_index(&self) -> usize {
        let mut s = self.shared.borrow_mut();
        s.opened += 1;
        s.opened - 1
    }
}

impl Endpoint {
    /// The control receives a new connection starts with: made before it is connected and
    /// posted by the drivers as the queue pair is created, so a peer that sends at once finds
    /// them.
    pub(crate) fn initial_recvs(pd: &ProtectionDomain) -> Result<(Rc<RecvSide>, Vec<RecvWr>)> {
        let buf = Buffer::new(pd, CONTROL_RECVS * CONTROL_MAX, 64, Access::LOCAL_WRITE)?;
        let side = Rc::new(RecvSide::default());
        let mut wrs = Vec::with_capacity(CONTROL_RECVS);
        for i in 0..CONTROL_RECVS {
            wrs.push(RecvWr {
                wr_id: i as u64,
                sges: buf.sge(i * CONTROL_MAX, CONTROL_MAX).into(),
            });
            side.slots.borrow_mut().push((buf.clone(), i * CONTROL_MAX));
        }
        side.posted.set(CONTROL_RECVS);
        Ok((side, wrs))
    }

    pub(crate) fn new(
        qp: QueuePair,
        scq: CompletionQueue,
        rcq: CompletionQueue,
        pd: Rc<ProtectionDomain>,
        accepting: bool,
        recv: Rc<RecvSide>,
    ) -> Result<Endpoint> {
        let inner = Rc::new(Inner {
            ops: Ops::sends_only(qp, scq),
            rcq,
            pd,
            failed: Cell::new(false),
            shared: RefCell::new(Shared {
                inbox: VecDeque::new(),
                opens_arrived: 0,
                waiters: Vec::new(),
                chans: ChanTable::default(),
                next_chan: 0,
                free_ids: Vec::new(),
                unanswered: Vec::new(),
                error: None,
                opened: 0,
            }),
            recv,
            scratch: RefCell::new(Vec::new()),
            retired: RefCell::new(Vec::new()),
            parity: accepting as u16,
            windows: RefCell::new(Vec::new()),
            serves_windows: RefCell::new(None),
            handshake_timeout: std::cell::Cell::new(Some(DEFAULT_HANDSHAKE_TIMEOUT)),
            ring_limit: Cell::new(DEFAULT_CHANNEL_RING_LIMIT),
        });
        RxPoller::add(&inner);
        Ok(Endpoint {
            link: Rc::new(Link { inner }),
        })
    }

    pub(crate) fn inner(&self) -> &Rc<Inner> {
        &self.link.inner
    }

    /// Sets how long [`recv_region`](Self::recv_region) and
    /// [`open_channel`](Self::open_channel) wait for the peer's part of the exchange
    /// ([`DEFAULT_HANDSHAKE_TIMEOUT`] unless set; `None` waits for ever). A peer that stalls
    /// or never answers then costs a [`Error::Timeout`] instead of a task stuck for good.
    /// A region that did not come may still come later and be taken by the next
    /// `recv_region`; a channel whose opening timed out leaves the two sides disagreeing on
    /// which channel is which, so the connection is failed and closed.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # fn demo(ep: &barewire::Endpoint) {
    /// ep.set_handshake_timeout(Some(Duration::from_secs(2)));
    /// assert_eq!(ep.handshake_timeout(), Some(Duration::from_secs(2)));
    /// # }
    /// ```
    pub fn set_handshake_timeout(&self, limit: Option<Duration>) {
        self.inner().handshake_timeout.set(limit);
    }

    /// How long handshakes wait for the peer (see
    /// [`set_handshake_timeout`](Self::set_handshake_timeout)).
    pub fn handshake_timeout(&self) -> Option<Duration> {
        self.inner().handshake_timeout.get()
    }

    /// Sets the largest ring, in bytes, this side allocates for one channel the peer sends on
    /// ([`DEFAULT_CHANNEL_RING_LIMIT`] unless set). Each direction's ring lives in its
    /// receiver's memory and is as large as the sender asked (its capacity times its slot), so
    /// without a limit a peer could make this side map, and then fill, as much memory as it
    /// liked with one [`open_channel`](Self::open_channel). A larger ring is refused on both
    /// sides with the reason, nothing allocated, and the connection serves channels that fit.
    ///
    /// ```
    /// # fn demo(ep: &barewire::Endpoint) {
    /// ep.set_channel_ring_limit(1 << 30); // rings of up to 1 GiB
    /// assert_eq!(ep.channel_ring_limit(), 1 << 30);
    /// # }
    /// ```
    pub fn set_channel_ring_limit(&self, bytes: usize) {
        self.inner().ring_limit.set(bytes);
    }

    /// The largest ring this side allocates for a channel of the peer's (see
    /// [`set_channel_ring_limit`](Self::set_channel_ring_limit)).
    pub fn channel_ring_limit(&self) -> usize {
        self.inner().ring_limit.get()
    }

    /// The transport this connection runs over. The node's device says what was asked for;
    /// under `auto` (the default, and where there is no RDMA device) a peer on this host and
    /// network namespace is reached through shared memory ([`Transport::Shm`]), others through
    /// the device's transport or the software provider.
    ///
    /// ```
    /// # fn demo(ep: &barewire::Endpoint) {
    /// println!("connected over {}", ep.transport()); // "shm", "soft", "roce2", ...
    /// # }
    /// ```
    ///
    /// [`Transport::Shm`]: barewire_drivers::Transport::Shm
    pub fn transport(&self) -> barewire_drivers::Transport {
        self.inner().ops.qp().transport()
    }

    /// The error this connection already failed with, if it did: an operation posted now
    /// would certainly not reach the peer.
    pub(crate) fn failed(&self) -> Option<Error> {
        self.inner().shared.borrow().error.clone()
    }

    /// Sends `region`'s descriptor, with `T`'s fingerprint, to the peer (who takes it with
    /// [`recv_region`](Self::recv_region)). Up to 1,024 control messages (regions sent and
    /// channel opens) may wait at the peer for it to take them; one more, and the peer takes
    /// the connection for a flood and closes it.
    ///
    /// The descriptor names a window bound to this connection alone (iWARP type 2 memory
    /// window semantics): the peer may read, write and update the region through this
    /// connection, and the same key presented on any other connection (a second connection
    /// of the same peer, another peer that saw or guessed it) is refused with a protection
    /// error, which ends that connection. The window lasts as long as the connection and the
    /// region both do.
    ///
    /// ```
    /// use barewire::{Align, Node};
    /// # barewire::engine::Runtime::builder().cores(1).pin(false).build().unwrap().block_on(async {
    /// let a = Node::soft().unwrap();
    /// let b = Node::soft().unwrap();
    /// let port = a.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    /// let to_a = barewire::engine::spawn_local(async move {
    ///     b.connect(([127, 0, 0, 1], port).into()).await.map(|e| (b, e))
    /// });
    /// let at_a = a.accept().await.unwrap();
    /// let (_b, to_a) = to_a.await.unwrap().unwrap();
    /// let counters = a.region::<u64>(4, Align::CacheLine).unwrap();
    /// at_a.send_region(&counters).await.unwrap();
    /// let remote = to_a.recv_region::<u64>().await.unwrap();
    /// to_a.write(&remote, 2, 7).await.unwrap();
    /// assert_eq!(counters.get(2), 7);
    /// # });
    /// ```
    pub async fn send_region<T: Pod>(&self, region: &Region<T>) -> Result<()> {
        let desc = self.window_for(&region.buf)?;
        self.send_described(desc, Fingerprint::of::<T>(), region.len() as u64)
            .await
    }

    /// The descriptor to send the peer on this connection for memory registered as `buf`: a
    /// window bound to where the peer's operations arrive, or the region's own where the
    /// backend has no windows (then the region kept its remote rights: `Region::new`). Any
    /// other failure to bind is an error: the region's own key would not serve.
    pub(crate) fn window_for(
        &self,
        buf: &barewire_drivers::Buffer,
    ) -> Result<barewire_drivers::RegionDescriptor> {
        let inner = self.inner();
        let serving = inner.serves_windows.borrow().clone();
        let at = serving.as_ref().unwrap_or(inner);
        let rights = Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
        match buf.region().bind_window(at.ops.qp(), rights) {
            Ok(w) => {
                let desc = w.descriptor();
                let mut ws = at.windows.borrow_mut();
                // Windows of regions dropped since are dead: forget them now and then.
                if ws.len() >= 64 && ws.len().is_power_of_two() {
                    ws.retain(barewire_drivers::Window::is_live);
                }
                ws.push(w);
                Ok(desc)
            }
            Err(e @ barewire_drivers::DriverError::Unsupported(_)) => {
                windows_unavailable(&e);
                Ok(buf.descriptor())
            }
            Err(e) => Err(inner.driver_error(e)),
        }
    }

    /// The next region descriptor the peer sent, checked to hold `T`s: a mismatch of type name,
    /// size or alignment is an error naming both, and the descriptor is dropped.
    pub async fn recv_region<T: Pod>(&self) -> Result<RemoteRegion<T>> {
        let (desc, len) = self
            .recv_described(&Fingerprint::of::<T>(), std::mem::size_of::<T>() as u64)
            .await?;
        Ok(RemoteRegion::from_parts(desc, len))
    }

    /// Sends a descriptor of memory that holds `len` elements described by `fp` (for
    /// structures whose memory is laid out in words of their own, as shared arrays are).
    pub(crate) async fn send_described(
        &self,
        desc: barewire_drivers::RegionDescriptor,
        fp: Fingerprint,
        len: u64,
    ) -> Result<()> {
        self.inner()
            .send_control(&Control::Region { fp, desc, len })
            .await
    }

    /// The next descriptor the peer sent, checked against `fp` and to span at least `len`
    /// elements of `element_bytes`; returns it and `len`.
    pub(crate) async fn recv_described(
        &self,
        expected: &Fingerprint,
        element_bytes: u64,
    ) -> Result<(barewire_drivers::RegionDescriptor, u64)> {
        let (fp, desc, len) = self
            .inner()
            .handshake("region descriptor", |_, c| match c {
                Control::Region { fp, desc, len } => Some((fp.clone(), *desc, *len)),
                _ => None,
            })
            .await?;
        expected.check(&fp)?;
        if desc.len < len.saturating_mul(element_bytes) {
            return Err(Error::Malformed(format!(
                "a region of {len} elements described with only {} bytes",
                desc.len
            )));
        }
        Ok((desc, len))
    }

    async fn run(&self, op: Op) -> Result<()> {
        op.await
            .map(|_| ())
            .map_err(|e| self.inner().driver_error(e))
    }

    /// Reads element `i` of the peer's region (RDMA READ).
    pub async fn read<T: Pod>(&self, r: &RemoteRegion<T>, i: u64) -> Result<T> {
        let mut v = self.read_slice(r, i, 1).await?;
        Ok(v.pop().unwrap())
    }

    /// Reads `count` elements from `start` (one RDMA READ).
    pub async fn read_slice<T: Pod>(
        &self,
        r: &RemoteRegion<T>,
        start: u64,
        count: u64,
    ) -> Result<Vec<T>> {
        let off = r.check(start, count)?;
        let bytes = count as usize * std::mem::size_of::<T>();
        let buf = self.inner().scratch(bytes)?;
        let res = self
            .run(
                self.inner()
                    .ops
                    .read(&buf, 0, bytes, Remote::at(r.desc, off)),
            )
            .await;
        let mut out = vec![T::zeroed(); count as usize];
        if res.is_ok() {
            buf.read_at(0, bytemuck::cast_slice_mut(&mut out));
        }
        self.inner().give_back(buf);
        res.map(|()| out)
    }

    /// Reads `len` bytes from element `start` of `r` straight into `dst` at byte `at` (one
    /// RDMA READ, no staging copy).
    pub(crate) async fn read_into<T: Pod>(
        &self,
        r: &RemoteRegion<T>,
        start: u64,
        dst: &Rc<Buffer>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let off = r.check(start, (len / std::mem::size_of::<T>().max(1)) as u64)?;
        self.run(self.inner().ops.read(dst, at, len, Remote::at(r.desc, off)))
            .await
    }

    /// Writes `len` bytes of `src` from byte `at` to element `start` of `r` (one RDMA WRITE
    /// straight from `src`).
    pub(crate) async fn write_from<T: Pod>(
        &self,
        r: &RemoteRegion<T>,
        start: u64,
        src: &Rc<Buffer>,
        at: usize,
        len: usize,
    ) -> Result<()> {
        let off = r.check(start, (len / std::mem::size_of::<T>().max(1)) as u64)?;
        self.run(
            self.inner()
                .ops
                .write(src, at, len, Remote::at(r.desc, off)),
        )
        .await
    }

    /// Reads `count` elements from element `start` of `r` into `dst`, from its element `at`:
    /// one RDMA READ placed straight into the registered region, no staging copy.
    ///
    /// ```no_run
    /// # async fn demo(ep: &barewire::Endpoint, node: &barewire::Node) -> barewire::Result<()> {
    /// use barewire::Align;
    /// let theirs = ep.recv_region::<f64>().await?;
    /// let mine = node.region::<f64>(1024, Align::Page)?;
    /// ep.read_to_region(&theirs, 0, &mine, 0, 1024).await?;     // their first 1024 elements
    /// ep.write_from_region(&theirs, 1024, &mine, 0, 1024).await?; // ... back, further on
    /// # Ok(()) }
    /// ```
    pub async fn read_to_region<T: Pod>(
        &self,
        r: &RemoteRegion<T>,
        start: u64,
        dst: &Region<T>,
        at: usize,
        count: usize,
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        local_range(dst, at, count)?;
        self.read_into(r, start, &dst.buf, at * size, count * size)
            .await
    }

    /// Writes `count` elements of `src`, from its element `at`, to element `start` of `r`: one
    /// RDMA WRITE straight from the registered region, no staging copy.
    pub async fn write_from_region<T: Pod>(
        &self,
        r: &RemoteRegion<T>,
        start: u64,
        src: &Region<T>,
        at: usize,
        count: usize,
    ) -> Result<()> {
        let size = std::mem::size_of::<T>();
        local_range(src, at, count)?;
        self.write_from(r, start, &src.buf, at * size, count * size)
            .await
    }

    /// Writes element `i` of the peer's region (RDMA WRITE); returns once it is placed.
    pub async fn write<T: Pod>(&self, r: &RemoteRegion<T>, i: u64, v: T) -> Result<()> {
        self.write_slice(r, i, std::slice::from_ref(&v)).await
    }

    /// Writes `src` from element `start` (one RDMA WRITE).
    pub async fn write_slice<T: Pod>(
        &self,
        r: &RemoteRegion<T>,
        start: u64,
        src: &[T],
    ) -> Result<()> {
        let off = r.check(start, src.len() as u64)?;
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let buf = self.inner().scratch(bytes.len())?;
        buf.write_at(0, bytes);
        let res = self
            .run(
                self.inner()
                    .ops
                    .write(&buf, 0, bytes.len(), Remote::at(r.desc, off)),
            )
            .await;
        self.inner().give_back(buf);
        res
    }

    async fn atomic(
        &self,
        r: &RemoteRegion<u64>,
        i: u64,
        op: impl FnOnce(u64) -> SendOp,
    ) -> Result<u64> {
        let off = r.check(i, 1)?;
        let buf = self.inner().scratch(8)?;
        let o =
            self.inner()
                .ops
                .execute(op(r.desc.addr + off), buf.sge(0, 8), [buf.clone()], false);
        let res = self.run(o).await.map(|()| buf.load_u64(0));
        self.inner().give_back(buf);
        res
    }

    /// Atomically adds `add` to slot `i` of the peer's `u64` region; returns the old value.
    pub async fn fetch_add(&self, r: &RemoteRegion<u64>, i: u64, add: u64) -> Result<u64> {
        let rkey = r.desc.rkey;
        self.atomic(r, i, |remote_addr| SendOp::FetchAdd {
            remote_addr,
            rkey,
            add,
        })
        .await
    }

    /// Atomically replaces slot `i` with `new` if it holds `expected`; returns the old value
    /// (the swap happened if it equals `expected`).
    pub async fn compare_and_swap(
        &self,
        r: &RemoteRegion<u64>,
        i: u64,
        expected: u64,
        new: u64,
    ) -> Result<u64> {
        let rkey = r.desc.rkey;
        self.atomic(r, i, |remote_addr| SendOp::CmpSwap {
            remote_addr,
            rkey,
            compare: expected,
            swap: new,
        })
        .await
    }

    /// Atomically replaces slot `i` with `new`; returns the old value. (On verbs, which has no
    /// swap work request, this is a compare-and-swap loop.)
    pub async fn swap(&self, r: &RemoteRegion<u64>, i: u64, new: u64) -> Result<u64> {
        let rkey = r.desc.rkey;
        match self
            .atomic(r, i, |remote_addr| SendOp::Swap {
                remote_addr,
                rkey,
                swap: new,
            })
            .await
        {
            Err(Error::Driver(e)) if matches!(*e, DriverError::Unsupported(_)) => {
                let mut seen = self.read(r, i).await?;
                loop {
                    let old = self.compare_and_swap(r, i, seen, new).await?;
                    if old == seen {
                        return Ok(old);
                    }
                    seen = old;
                }
            }
            other => other,
        }
    }

    /// Closes the connection now (channel halves made from it fail from here on).
    pub fn close(&self) {
        self.inner().ops.qp().disconnect();
    }
}

/// Checks that `count` elements from `at` lie inside the local region `r`.
fn local_range<T: Pod>(r: &Region<T>, at: usize, count: usize) -> Result<()> {
    if at.checked_add(count).is_none_or(|end| end > r.len()) {
        return Err(Error::OutOfBounds {
            index: at as u64,
            count: count as u64,
            len: r.len() as u64,
        });
    }
    Ok(())
}
