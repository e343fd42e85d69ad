//! An endpoint: one connection to one peer, with typed one-sided operations, region exchange,
//! and the receive side that every channel on the connection shares.
//!
//! Every message that arrives consumes one posted receive, in order: control messages (SEND)
//! land in the receive's slot; channel data and credits (WRITE with immediate) only use the
//! receive to announce themselves. One task per endpoint takes receives as they complete,
//! reposts them, and hands control messages to whoever waits for them and arrivals to their
//! channel. Each channel posts enough receives for everything it can have in flight, before
//! the peer may send it anything.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};

use barewire_drivers::{
    Access, Buffer, DriverError, Endpoint as Ops, Op, ProtectionDomain, Remote, SendOp, WcOpcode,
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

pub(crate) struct Shared {
    /// Control messages not yet taken, each with its ordinal among the peer's channel Opens
    /// (channels pair up in the order both sides open them).
    inbox: VecDeque<(usize, Control)>,
    opens_arrived: usize,
    waiters: Vec<Waker>,
    pub(crate) chans: HashMap<u16, ChanRef>,
    next_chan: u16,
    pub(crate) error: Option<Error>,
    /// Channels opened so far (pairs the k-th open on each side).
    opened: usize,
}

pub(crate) struct Inner {
    pub(crate) ops: Ops,
    pub(crate) pd: Rc<ProtectionDomain>,
    pub(crate) shared: RefCell<Shared>,
    /// Receive slots to be posted by the receive task (channels add theirs here).
    more_recvs: RefCell<Vec<(Rc<Buffer>, usize)>>,
    recv_task_waker: RefCell<Option<Waker>>,
    scratch: RefCell<Vec<Rc<Buffer>>>,
    /// Which channel ids this side opens: even on the connecting side, odd on the accepting.
    parity: u16,
    /// Posted receives, in the order they complete: the slot each one fills, and its future.
    posted: RefCell<VecDeque<(Rc<Buffer>, usize, Op)>>,
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

    /// Adds `n` receive slots of `CONTROL_MAX` bytes for the receive task to post.
    pub(crate) fn add_recvs(&self, n: usize) -> Result<()> {
        let buf = Buffer::new(&self.pd, n * CONTROL_MAX, 64, Access::LOCAL_WRITE)?;
        let mut more = self.more_recvs.borrow_mut();
        for i in 0..n {
            more.push((buf.clone(), i * CONTROL_MAX));
        }
        drop(more);
        // Post them now, so they are in place before this side tells the peer to send.
        self.post_pending();
        Ok(())
    }

    fn post_pending(&self) {
        let more: Vec<_> = self.more_recvs.borrow_mut().drain(..).collect();
        if more.is_empty() {
            return;
        }
        let mut posted = self.posted.borrow_mut();
        for (buf, off) in more {
            let op = self.ops.recv(&buf, off, CONTROL_MAX);
            posted.push_back((buf, off, op));
        }
        drop(posted);
        if let Some(w) = self.recv_task_waker.borrow_mut().take() {
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

/// The receive task: takes completed receives in order, dispatches them, reposts them.
async fn receive_loop(inner: Rc<Inner>) {
    loop {
        inner.post_pending();
        let next = poll_fn(|cx| {
            let mut posted = inner.posted.borrow_mut();
            match posted.front_mut() {
                Some((_, _, op)) => match std::pin::Pin::new(op).poll(cx) {
                    Poll::Ready(r) => {
                        let (buf, off, _) = posted.pop_front().unwrap();
                        Poll::Ready(Some((buf, off, r)))
                    }
                    Poll::Pending => {
                        *inner.recv_task_waker.borrow_mut() = Some(cx.waker().clone());
                        Poll::Pending
                    }
                },
                None => Poll::Ready(None),
            }
        })
        .await;
        let Some((buf, off, result)) = next else {
            return;
        };
        let wc = match result {
            Ok(wc) => wc,
            Err(e) => {
                // The connection is gone: every waiter hears it; receives flush.
                inner.fail_with(Error::PeerGone(e.to_string()));
                return;
            }
        };
        match wc.opcode {
            WcOpcode::RecvRdmaWithImm => {
                let (credit, id, len) = imm::parse(wc.imm.unwrap_or(0));
                let chan = inner.shared.borrow().chans.get(&id).map(|c| match c {
                    ChanRef::Tx(t) => (t.upgrade().map(|t| t as Rc<dyn Arrival>), credit),
                    ChanRef::Rx(r) => (r.upgrade().map(|r| r as Rc<dyn Arrival>), credit),
                });
                if let Some((Some(c), credit)) = chan {
                    c.arrived(credit, len);
                }
            }
            _ => {
                let mut bytes = vec![0u8; wc.byte_len as usize];
                buf.read_at(off, &mut bytes);
                match Control::decode(&bytes) {
                    Ok(c) => {
                        let mut s = inner.shared.borrow_mut();
                        let ord = s.opens_arrived;
                        if matches!(c, Control::Open { .. }) {
                            s.opens_arrived += 1;
                        }
                        s.inbox.push_back((ord, c));
                        drop(s);
                        inner.wake_all();
                    }
                    Err(e) => {
                        inner.fail_with(e);
                        inner.ops.qp().disconnect();
                        return;
                    }
                }
            }
        }
        // Repost the slot.
        let op = inner.ops.recv(&buf, off, CONTROL_MAX);
        inner.posted.borrow_mut().push_back((buf, off, op));
    }
}

/// What a channel half does when the receive task sees a WRITE with immediate for it.
pub(crate) trait Arrival {
    fn arrived(&self, credit: bool, len: Option<usize>);
}

use std::future::Future;

impl Endpoint {
    pub(crate) fn new(ops: Ops, pd: Rc<ProtectionDomain>, accepting: bool) -> Result<Endpoint> {
        let inner = Rc::new(Inner {
            ops,
            pd,
            shared: RefCell::new(Shared {
                inbox: VecDeque::new(),
                opens_arrived: 0,
                waiters: Vec::new(),
                chans: HashMap::new(),
                next_chan: 0,
                error: None,
                opened: 0,
            }),
            more_recvs: RefCell::new(Vec::new()),
            recv_task_waker: RefCell::new(None),
            scratch: RefCell::new(Vec::new()),
            parity: accepting as u16,
            posted: RefCell::new(VecDeque::new()),
        });
        inner.add_recvs(CONTROL_RECVS)?;
        barewire_engine::spawn_local(receive_loop(inner.clone()));
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
