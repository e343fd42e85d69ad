//! An endpoint: one connection to one peer, with typed one-sided operations, region exchange,
//! and the receive side that every channel on the connection shares.
//!
//! Every message that arrives consumes one posted receive, in order: control messages (SEND)
//! land in the receive's slot; channel data and credits (WRITE with immediate) only use the
//! receive to announce themselves. Each receive completion is handled as it arrives: control
//! messages go to whoever waits for them, arrivals to their channel, and the slot is posted
//! again. Each channel posts enough receives for everything it can have in flight, before
//! the peer may send it anything.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

use barewire_drivers::{
    Access, Buffer, CompletionQueue, DriverError, Endpoint as Ops, Op, ProtectionDomain, QueuePair,
    RecvWr, Remote, SendOp, WcOpcode, WcStatus, WorkCompletion,
};
use bytemuck::Pod;

use crate::channel::{RxState, TxState};
use crate::control::{imm, Control, MAX as CONTROL_MAX};
use crate::error::{Error, Result};
use crate::region::{Fingerprint, Region, RemoteRegion};

/// Receives posted when an endpoint starts, for control messages.
const CONTROL_RECVS: usize = 32;

/// A channel's half on this side, as the receive task sees it.
pub(crate) enum ChanRef {
    Tx(Weak<TxState>),
    Rx(Weak<RxState>),
}

/// Channel halves by id (ids are below 2048), looked up on every arrival.
#[derive(Default)]
pub(crate) struct ChanTable {
    by_id: Vec<Option<ChanRef>>,
}

impl ChanTable {
    pub(crate) fn insert(&mut self, id: u16, c: ChanRef) {
        let i = id as usize;
        if self.by_id.len() <= i {
            self.by_id.resize_with(i + 1, || None);
        }
        self.by_id[i] = Some(c);
    }

    pub(crate) fn remove(&mut self, id: &u16) {
        if let Some(c) = self.by_id.get_mut(*id as usize) {
            *c = None;
        }
    }

    fn get(&self, id: &u16) -> Option<&ChanRef> {
        self.by_id.get(*id as usize).and_then(Option::as_ref)
    }

    fn values(&self) -> impl Iterator<Item = &ChanRef> {
        self.by_id.iter().flatten()
    }
}

pub(crate) struct Shared {
    /// Control messages not yet taken, each with its ordinal among the peer's channel Opens
    /// (channels pair up in the order both sides open them).
    inbox: VecDeque<(usize, Control)>,
    opens_arrived: usize,
    waiters: Vec<Waker>,
    pub(crate) chans: ChanTable,
    next_chan: u16,
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
    /// The receive slots (shared with the receive handler, which outlives this).
    recv: Rc<RecvSide>,
    scratch: RefCell<Vec<Rc<Buffer>>>,
    /// Buffers of dropped channel halves that the peer may still write, by channel id (a ring
    /// whose sender has not yet sent its close notice, a credit word whose receiver has not yet
    /// said it is gone): they stay registered until that last word arrives, so a late write
    /// lands harmlessly instead of meeting a dead STag and a Terminate.
    pub(crate) retired: RefCell<Vec<(u16, Rc<Buffer>)>>,
    /// Which channel ids this side opens: even on the connecting side, odd on the accepting.
    parity: u16,
}

/// Receive slots, by work request id, and how many are posted.
#[derive(Default)]
pub(crate) struct RecvSide {
    slots: RefCell<Vec<(Rc<Buffer>, usize)>>,
    posted: Cell<usize>,
}

impl RecvSide {
    /// One posted receive has completed.
    fn taken(&self) {
        self.posted.set(self.posted.get().saturating_sub(1));
    }
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

    /// Adds and posts `n` receive slots of `CONTROL_MAX` bytes.
    pub(crate) fn add_recvs(&self, n: usize) -> Result<()> {
        let buf = Buffer::new(&self.pd, n * CONTROL_MAX, 64, Access::LOCAL_WRITE)?;
        for i in 0..n {
            let id = {
                let mut slots = self.recv.slots.borrow_mut();
                slots.push((buf.clone(), i * CONTROL_MAX));
                slots.len() - 1
            };
            self.post_slot(id)?;
        }
        Ok(())
    }

    fn post_slot(&self, id: usize) -> Result<()> {
        let sge = {
            let slots = self.recv.slots.borrow();
            let (buf, off) = &slots[id];
            buf.sge(*off, CONTROL_MAX)
        };
        self.ops
            .qp()
            .post_recv(RecvWr {
                wr_id: id as u64,
                sges: vec![sge],
            })
            .map_err(Error::Driver)?;
        self.recv.posted.set(self.recv.posted.get() + 1);
        Ok(())
    }

    /// Handles every receive completion already in the queue; true if there was any.
    fn drain(&self) -> bool {
        let mut any = false;
        let mut wcs = [NO_WC; 8];
        loop {
            let n = self.rcq.poll(&mut wcs);
            for wc in &wcs[..n] {
                self.recv.taken();
                self.handle(*wc);
                any = true;
            }
            if n < wcs.len() {
                return any;
            }
        }
    }

    fn handle(&self, wc: WorkCompletion) {
        if wc.status != WcStatus::Success {
            self.fail_with(Error::PeerGone(format!(
                "the connection failed (receive completed with {:?})",
                wc.status
            )));
            return;
        }
        self.dispatch(&wc);
        if self.shared.borrow().error.is_none() {
            let _ = self.post_slot(wc.wr_id as usize);
        }
    }

    /// One receive completion: a control message or a channel arrival.
    fn dispatch(&self, wc: &WorkCompletion) {
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                let (credit, id, len) = imm::parse(wc.imm.unwrap_or(0));
                let chan: Option<Rc<dyn Arrival>> =
                    self.shared.borrow().chans.get(&id).and_then(|c| match c {
                        ChanRef::Tx(t) => t.upgrade().map(|t| t as Rc<dyn Arrival>),
                        ChanRef::Rx(r) => r.upgrade().map(|r| r as Rc<dyn Arrival>),
                    });
                match chan {
                    Some(c) => c.arrived(credit, len),
                    None => self.last_word(id, credit, len),
                }
            }
            _ => {
                let mut bytes = vec![0u8; wc.byte_len as usize];
                {
                    let slots = self.recv.slots.borrow();
                    let (buf, off) = &slots[wc.wr_id as usize];
                    buf.read_at(*off, &mut bytes);
                }
                match Control::decode(&bytes) {
                    Ok(c) => {
                        let mut s = self.shared.borrow_mut();
                        let ord = s.opens_arrived;
                        if matches!(c, Control::Open { .. }) {
                            s.opens_arrived += 1;
                        }
                        s.inbox.push_back((ord, c));
                        drop(s);
                        self.wake_all();
                    }
                    Err(e) => {
                        // A peer that sends garbage loses the connection.
                        self.fail_with(e);
                        self.ops.qp().disconnect();
                    }
                }
            }
        }
    }

    /// A channel arrival for a half already dropped here: when it is the peer's last write into
    /// that half's buffer (a sender's close notice into our ring, or a receiver's final credit
    /// word, marked gone, into ours), the buffer can go.
    fn last_word(&self, id: u16, credit: bool, len: Option<usize>) {
        let mut retired = self.retired.borrow_mut();
        let Some(i) = retired.iter().position(|(r, _)| *r == id) else {
            return;
        };
        let done = if credit {
            crate::channel::credit_word_final(&retired[i].1)
        } else {
            len.is_none()
        };
        if done {
            retired.swap_remove(i);
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
            e => Error::Driver(e),
        }
    }

    fn fail_with(&self, e: Error) -> Error {
        let mut s = self.shared.borrow_mut();
        let e = s.error.get_or_insert(e).clone();
        drop(s);
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
        let id = s.next_chan * 2 + self.parity;
        if id > 0x7ff {
            return Err(Error::Invalid(
                "more than 1024 channels on one endpoint".into(),
            ));
        }
        s.next_chan += 1;
        Ok(id)
    }

    pub(crate) fn next_open_index(&self) -> usize {
        let mut s = self.shared.borrow_mut();
        s.opened += 1;
        s.opened - 1
    }
}

/// A placeholder to poll completions into.
const NO_WC: WorkCompletion = WorkCompletion {
    wr_id: 0,
    status: WcStatus::Success,
    opcode: WcOpcode::Recv,
    byte_len: 0,
    imm: None,
    invalidated: None,
    solicited: false,
    qp_num: 0,
};

/// One endpoint's receive side, as the core's `RxPoller` sees it.
struct Watched {
    inner: Weak<Inner>,
    rcq: CompletionQueue,
    /// The receive slots, kept past the endpoint until every posted receive has flushed (the
    /// queue pair may write into them until then).
    recv: Rc<RecvSide>,
}

thread_local! {
    /// This core's endpoints, whose receive queues the `RxPoller` drains.
    static ENDPOINTS: RefCell<Vec<Watched>> = const { RefCell::new(Vec::new()) };
    static RX_POLLER: Cell<u64> = const { Cell::new(0) };
    /// An endpoint has gone since the last pass: look for the ones to forget.
    static REAP: Cell<bool> = const { Cell::new(false) };
}

impl Drop for Inner {
    fn drop(&mut self) {
        REAP.with(|r| r.set(true));
    }
}

/// The only consumer of every endpoint's receive queue on this core. It runs in each pass over
/// the sources right after the provider's poller (it is registered after it), so an arrival
/// reaches its channel or control inbox in the pass that delivered it, and no task is woken
/// just to look at the queue. Before the core sleeps it drains once more and keeps the core
/// awake if it found anything (a completion a task caused, a flush). Once an endpoint is gone,
/// its receive slots stay here until every posted receive has completed (flushed by the
/// disconnect), then go.
struct RxPoller {
    /// The live endpoints of the current pass (kept to reuse its allocation).
    live: Vec<Rc<Inner>>,
}

impl RxPoller {
    fn add(inner: &Rc<Inner>) {
        ENDPOINTS.with(|e| {
            e.borrow_mut().push(Watched {
                inner: Rc::downgrade(inner),
                rcq: inner.rcq.clone(),
                recv: inner.recv.clone(),
            })
        });
        let token = barewire_engine::core_token();
        if RX_POLLER.with(|t| t.replace(token)) != token {
            barewire_engine::register_poller(Box::new(RxPoller { live: Vec::new() }));
        }
    }
}

impl barewire_engine::Poller for RxPoller {
    fn poll(&mut self) -> bool {
        let mut any = false;
        ENDPOINTS.with(|e| {
            let mut reap = REAP.take();
            for w in e.borrow().iter().filter(|w| !w.rcq.is_empty()) {
                match w.inner.upgrade() {
                    Some(inner) => self.live.push(inner),
                    None => reap = true,
                }
            }
            if reap {
                // Endpoints that are gone: count their receives out as they flush, and
                // forget each once none is left.
                e.borrow_mut().retain(|w| {
                    if w.inner.strong_count() > 0 {
                        return true;
                    }
                    let mut wcs = [NO_WC; 8];
                    loop {
                        let n = w.rcq.poll(&mut wcs);
                        for _ in 0..n {
                            w.recv.taken();
                        }
                        any |= n > 0;
                        if n < wcs.len() {
                            break;
                        }
                    }
                    w.recv.posted.get() > 0
                });
            }
        });
        for inner in self.live.drain(..) {
            any |= inner.drain();
        }
        any
    }

    fn pure_poll(&mut self) -> bool {
        ENDPOINTS.with(|e| e.borrow().iter().any(|w| !w.rcq.is_empty()))
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        !self.poll()
    }
}

/// What a channel half does when the receive task sees a WRITE with immediate for it.
pub(crate) trait Arrival {
    fn arrived(&self, credit: bool, len: Option<usize>);
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
                sges: vec![buf.sge(i * CONTROL_MAX, CONTROL_MAX)],
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
            shared: RefCell::new(Shared {
                inbox: VecDeque::new(),
                opens_arrived: 0,
                waiters: Vec::new(),
                chans: ChanTable::default(),
                next_chan: 0,
                error: None,
                opened: 0,
            }),
            recv,
            scratch: RefCell::new(Vec::new()),
            retired: RefCell::new(Vec::new()),
            parity: accepting as u16,
        });
        RxPoller::add(&inner);
        Ok(Endpoint {
            link: Rc::new(Link { inner }),
        })
    }

    pub(crate) fn inner(&self) -> &Rc<Inner> {
        &self.link.inner
    }

    /// Sends `region`'s descriptor, with `T`'s fingerprint, to the peer (who takes it with
    /// [`recv_region`](Self::recv_region)).
    pub async fn send_region<T: Pod>(&self, region: &Region<T>) -> Result<()> {
        let r = region.remote();
        self.inner()
            .send_control(&Control::Region {
                fp: Fingerprint::of::<T>(),
                desc: r.desc,
                len: r.len,
            })
            .await
    }

    /// The next region descriptor the peer sent, checked to hold `T`s: a mismatch of type name,
    /// size or alignment is an error naming both, and the descriptor is dropped.
    pub async fn recv_region<T: Pod>(&self) -> Result<RemoteRegion<T>> {
        let (fp, desc, len) = self
            .inner()
            .wait_control(|_, c| match c {
                Control::Region { fp, desc, len } => Some((fp.clone(), *desc, *len)),
                _ => None,
            })
            .await?;
        Fingerprint::of::<T>().check(&fp)?;
        if desc.len < len.saturating_mul(std::mem::size_of::<T>() as u64) {
            return Err(Error::Malformed(format!(
                "a region of {len} elements described with only {} bytes",
                desc.len
            )));
        }
        Ok(RemoteRegion::from_parts(desc, len))
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
        let o = self.inner().ops.execute(
            op(r.desc.addr + off),
            vec![buf.sge(0, 8)],
            vec![buf.clone()],
            false,
        );
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
            Err(Error::Driver(DriverError::Unsupported(_))) => {
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
