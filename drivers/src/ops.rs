//! Async one-sided and two-sided operations whose futures complete on their own work
//! completion, over registered memory that barewire owns.
//!
//! A future that is dropped before its completion does not free anything the device may still
//! touch: the buffers it names stay alive in the endpoint's table until the completion arrives
//! (as a dropped io_uring operation parks its buffer until its CQE).
//!
//! The memory these operations name, and the copies into memory a peer reads, are in `buffer`
//! and `copy`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use barewire_engine::{copy_bulk, spawn_local, JoinHandle};

use crate::api::{
    Access, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, RegionDescriptor,
    SendOp, SendWr, Sge, Sges, WcStatus, WorkCompletion,
};
use crate::transport::DriverError;
use barewire_rdma_types::StagHasher;

mod buffer;
mod copy;

pub(crate) use buffer::{BackendMemory, SharedMemory};
pub use buffer::{Buffer, MappedRemote, MappedSpan, Span};
pub(crate) use copy::{copy_ascending, copy_chunks, copy_small, prefetch_lines};

/// Where a one-sided operation lands: a peer's region and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// The region.
    pub region: RegionDescriptor,
    /// Byte offset into it.
    pub offset: u64,
}

impl Remote {
    /// `offset` bytes into `region`.
    pub fn at(region: RegionDescriptor, offset: u64) -> Remote {
        Remote { region, offset }
    }
    fn addr(&self) -> u64 {
        self.region.addr + self.offset
    }
}

/// The buffers an operation holds: one or two, inline (an operation allocates nothing).
type Hold = smallvec::SmallVec<[Rc<Buffer>; 2]>;

struct Pending {
    done: Option<WorkCompletion>,
    waker: Option<Waker>,
    /// What the device may still touch until the completion arrives.
    hold: Hold,
    /// The future was dropped: forget the entry when the completion comes.
    abandoned: bool,
    /// A receive (counted in `Table::recvs`).
    recv: bool,
}

#[derive(Default)]
struct Table {
    next: u64,
    pending: HashMap<u64, Pending, BuildHasherDefault<StagHasher>>,
    closed: bool,
    /// Receives posted and not yet completed.
    recvs: usize,
    /// The tasks that route completions into this table (one per completion queue).
    routes: Vec<JoinHandle<()>>,
}

impl Table {
    /// Once the endpoint is gone and nothing it posted is outstanding, no completion will
    /// come to wake the routing tasks: they are ended here (by whoever empties the table, a
    /// routing task included, at the top of its loop). One left waiting would keep its
    /// completion queue and this table for the life of the core.
    fn end_routes_if_done(&mut self) {
        if self.closed && self.pending.is_empty() {
            for task in self.routes.drain(..) {
                task.cancel();
            }
        }
    }

    fn complete(&mut self, wc: WorkCompletion) {
        let Some(p) = self.pending.get_mut(&wc.wr_id) else {
            return;
        };
        if std::mem::take(&mut p.recv) {
            self.recvs -= 1;
        }
        if p.abandoned {
            self.pending.remove(&wc.wr_id); // drops the held buffers: the device is done
            return;
        }
        p.done = Some(wc);
        p.hold.clear();
        if let Some(w) = p.waker.take() {
            w.wake();
        }
    }
}

/// A queue pair with async operations. It owns the queue pair's two completion queues: a task
/// on the current core routes each completion to the future waiting for it.
///
/// ```no_run
/// # async fn demo() -> Result<(), barewire_drivers::DriverError> {
/// use barewire_drivers::*;
/// let dev = Device::from_env()?;
/// let pd = dev.alloc_pd()?;
/// let (scq, rcq) = (dev.create_cq(256)?, dev.create_cq(256)?);
/// let (qp, peer) = connect("127.0.0.1:7471".parse().unwrap(), &pd, &scq, &rcq,
///                          &ConnectOptions::default()).await?;
/// let remote = RegionDescriptor::from_bytes(&peer).unwrap();
/// let ep = Endpoint::new(qp, scq, rcq);
/// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE)?;
/// buf.write_at(0, b"hello, remote memory");
/// ep.write(&buf, 0, 20, Remote::at(remote, 0)).await?;
/// ep.read(&buf, 100, 20, Remote::at(remote, 0)).await?;
/// let old = ep.fetch_add(&buf, 200, Remote::at(remote, 64), 1).await?;
/// # let _ = old; Ok(()) }
/// ```
pub struct Endpoint {
    qp: QueuePair,
    table: Rc<RefCell<Table>>,
    /// Held by each routing task while it lives (see `routing_probe`).
    routing: Rc<()>,
    /// Buffers named by unsignaled requests since the last signaled send: the next signaled
    /// send holds them, because its completion implies theirs (the send queue completes in
    /// order).
    unsignaled: RefCell<Vec<Rc<Buffer>>>,
    /// Unsignaled requests posted since the last signaled one.
    unsignaled_run: Cell<usize>,
    /// The most unsignaled requests in a row: the next is signaled (see `post_unsignaled`).
    unsignaled_limit: usize,
    /// The send completion queue, also routed by a task: a signaled send drains it first once
    /// it is half full (see `drain_sends_if_full`).
    scq: CompletionQueue,
    /// How many completions the receive queue holds: the most receives `recv` keeps
    /// outstanding (`None` for `sends_only`, whose owner takes receive completions itself).
    rcq_capacity: Option<usize>,
}

impl Endpoint {
    /// Wraps a connected queue pair and its completion queues (which it then owns).
    pub fn new(qp: QueuePair, scq: CompletionQueue, rcq: CompletionQueue) -> Endpoint {
        let mut ep = Endpoint::sends_only(qp, scq);
        ep.rcq_capacity = Some(rcq.capacity());
        ep.route(rcq);
        ep
    }

    /// As [`new`](Self::new), for owners that post their own receives with `qp().post_recv`,
    /// keep their buffers, and take receive completions themselves with
    /// [`CompletionQueue::poll`] (from a [`Poller`](barewire_engine::Poller), say, which then
    /// sees each one in the same pass the provider delivers it, with no task woken).
    pub fn sends_only(qp: QueuePair, scq: CompletionQueue) -> Endpoint {
        let slots = scq
            .capacity()
            .min(qp.send_queue_depth().unwrap_or(usize::MAX));
        let ep = Endpoint {
            qp,
            table: Rc::new(RefCell::new(Table::default())),
            routing: Rc::new(()),
            unsignaled: RefCell::new(Vec::new()),
            unsignaled_run: Cell::new(0),
            unsignaled_limit: (slots / 2).max(1),
            scq: scq.clone(),
            rcq_capacity: None,
        };
        ep.route(scq);
        ep
    }

    /// A task that hands each completion of `cq` to the future waiting for it, until the
    /// endpoint is gone and nothing it posted is outstanding (see `Drop`).
    fn route(&self, cq: CompletionQueue) {
        let t = self.table.clone();
        let alive = self.routing.clone();
        let task = spawn_local(async move {
            let _alive = alive;
            loop {
                {
                    let mut t = t.borrow_mut();
                    if t.closed && t.pending.is_empty() {
                        // The others too (this one among them: it returns now anyway).
                        t.end_routes_if_done();
                        return;
                    }
                }
                let wc = cq.next().await;
                t.borrow_mut().complete(wc);
            }
        });
        self.table.borrow_mut().routes.push(task);
    }

    /// Upgradable while any of this endpoint's routing tasks lives, which is until the
    /// endpoint is dropped and nothing it posted is outstanding: for tests that check an
    /// endpoint leaves nothing behind.
    #[doc(hidden)]
    pub fn routing_probe(&self) -> std::rc::Weak<()> {
        Rc::downgrade(&self.routing)
    }

    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// Posts a send work request without a completion of its own (perftest's moderation):
    /// cheaper, and on the software provider no remote-completion round trip; it is
    /// transmitted with the next progress pass, batched with others (see
    /// [`QueuePair::post_send_batched`]). `hold` stays
    /// alive until a later signaled send on this endpoint completes.
    ///
    /// An unsignaled request keeps its send-queue slot (on verbs) until a later signaled one
    /// completes, so a queue given only unsignaled requests would fill and refuse the next
    /// post. The endpoint signals one itself when half the smaller of the send queue
    /// ([`QueuePair::send_queue_depth`]) and the send completion queue has gone unsignaled
    /// in a row, on every transport alike; its completion is routed like any other and
    /// releases the buffers held so far.
    pub fn post_unsignaled(
        &self,
        op: SendOp,
        sges: impl Into<Sges>,
        hold: &Rc<Buffer>,
    ) -> Result<(), DriverError> {
        self.post_unsignaled_with(op, sges, hold, true)
    }

    /// As [`post_unsignaled`](Self::post_unsignaled), transmitted at once (`batched: false`)
    /// or with the next progress pass (`batched: true`).
    pub fn post_unsignaled_with(
        &self,
        op: SendOp,
        sges: impl Into<Sges>,
        hold: &Rc<Buffer>,
        batched: bool,
    ) -> Result<(), DriverError> {
        let post = |wr: SendWr| {
            if batched {
                self.qp.post_send_batched(wr)
            } else {
                self.qp.post_send(wr)
            }
        };
        let sges = sges.into();
        let run = self.unsignaled_run.get() + 1;
        if run >= self.unsignaled_limit {
            // Signaled after all, and not awaited: the routing task takes its completion.
            let op = self.start_send(smallvec::smallvec![hold.clone()], |id| {
                post(SendWr {
                    wr_id: id,
                    op,
                    sges,
                    signaled: true,
                    fence: false,
                })
            });
            return op.posted.clone();
        }
        post(SendWr {
            wr_id: 0,
            op,
            sges,
            signaled: false,
            fence: false,
        })?;
        self.unsignaled_run.set(run);
        let mut h = self.unsignaled.borrow_mut();
        if !h.iter().any(|b| Rc::ptr_eq(b, hold)) {
            h.push(hold.clone());
        }
        Ok(())
    }

    fn start_send(&self, mut hold: Hold, post: impl FnOnce(u64) -> Result<(), DriverError>) -> Op {
        hold.extend(self.unsignaled.borrow_mut().drain(..));
        self.unsignaled_run.set(0);
        self.drain_sends_if_full();
        self.start(hold, false, post)
    }

    /// Routes the send completions waiting in the queue here, if it is half full. Its routing
    /// task runs only when the core gets to it: a task that posts signaled sends in a loop
    /// without ever waiting (a channel's sender while the receiver keeps up; shm completes a
    /// WRITE inside its post) would otherwise fill the queue, and an overflowed completion
    /// queue puts the queue pair in ERROR, as verbs' `IBV_EVENT_CQ_ERR` does.
    #[inline]
    fn drain_sends_if_full(&self) {
        if self.scq.len() * 2 >= self.scq.capacity() {
            self.drain_sends();
        }
    }

    #[cold]
    fn drain_sends(&self) {
        let mut wcs = [WorkCompletion::BLANK; 32];
        loop {
            let n = self.scq.poll(&mut wcs);
            let mut t = self.table.borrow_mut();
            for wc in &wcs[..n] {
                t.complete(*wc);
            }
            if n < wcs.len() {
                return;
            }
        }
    }

    fn start(
        &self,
        hold: Hold,
        recv: bool,
        post: impl FnOnce(u64) -> Result<(), DriverError>,
    ) -> Op {
        let id = {
            let mut t = self.table.borrow_mut();
            t.next += 1;
            t.next
        };
        self.table.borrow_mut().pending.insert(
            id,
            Pending {
                done: None,
                waker: None,
                hold,
                abandoned: false,
                recv,
            },
        );
        let posted = post(id);
        let mut t = self.table.borrow_mut();
        if posted.is_err() {
            t.pending.remove(&id);
        } else if recv {
            t.recvs += 1;
        }
        drop(t);
        Op {
            table: self.table.clone(),
            id,
            posted,
        }
    }

    /// Posts any send work request, signaled, with the given SGEs; `hold` names the buffers
    /// they point into, kept alive until the completion even if the future is dropped.
    pub fn execute(
        &self,
        op: SendOp,
        sges: impl Into<Sges>,
        hold: impl IntoIterator<Item = Rc<Buffer>>,
        fence: bool,
    ) -> Op {
        let sges = sges.into();
        self.start_send(hold.into_iter().collect(), |id| {
            self.qp.post_send(SendWr {
                wr_id: id,
                op,
                sges,
                signaled: true,
                fence,
            })
        })
    }

    fn send_op(&self, op: SendOp, buf: &Rc<Buffer>, sge: Sge) -> Op {
        self.start_send(smallvec::smallvec![buf.clone()], |id| {
            self.qp.post_send(SendWr {
                wr_id: id,
                op,
                sges: sge.into(),
                signaled: true,
                fence: false,
            })
        })
    }

    /// RDMA WRITE of `len` bytes at `offset` of `src` to `remote`.
    pub fn write(&self, src: &Rc<Buffer>, offset: usize, len: usize, remote: Remote) -> Op {
        let op = SendOp::Write {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
        };
        self.send_op(op, src, src.sge(offset, len))
    }

    /// RDMA WRITE with immediate data (the peer's receive completes with `imm`).
    pub fn write_with_imm(
        &self,
        src: &Rc<Buffer>,
        offset: usize,
        len: usize,
        remote: Remote,
        imm: u32,
    ) -> Op {
        let op = SendOp::WriteWithImm {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
            imm,
        };
        self.send_op(op, src, src.sge(offset, len))
    }

    /// RDMA READ of `len` bytes from `remote` into `dst` at `offset`.
    pub fn read(&self, dst: &Rc<Buffer>, offset: usize, len: usize, remote: Remote) -> Op {
        let op = SendOp::Read {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
        };
        self.send_op(op, dst, dst.sge(offset, len))
    }

    /// SEND of `len` bytes at `offset` of `src`.
    pub fn send(&self, src: &Rc<Buffer>, offset: usize, len: usize) -> Op {
        let op = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        self.send_op(op, src, src.sge(offset, len))
    }

    /// Posts a receive of up to `len` bytes into `dst` at `offset`; completes when a Send (or
    /// a Write with immediate) consumes it. Fails at once with [`DriverError::Post`] while as
    /// many receives are outstanding as the receive completion queue holds: one more could
    /// overflow the queue, which stops the queue pair (as verbs' CQ overrun) and loses the
    /// completions that would end the receives still waiting.
    pub fn recv(&self, dst: &Rc<Buffer>, offset: usize, len: usize) -> Op {
        let sge = dst.sge(offset, len);
        let outstanding = self.table.borrow().recvs;
        if self.rcq_capacity.is_some_and(|cap| outstanding >= cap) {
            // One more could overflow the queue, which stops the queue pair and loses the
            // completions that would have ended the waiting receives.
            return Op {
                table: self.table.clone(),
                id: 0, // never posted: no entry, and ids start at 1
                posted: Err(DriverError::Post(format!(
                    "{outstanding} receives are outstanding already, as many as the receive \
                     completion queue holds: await one first, or create the queue deeper"
                ))),
            };
        }
        self.start(smallvec::smallvec![dst.clone()], true, |id| {
            self.qp.post_recv(RecvWr {
                wr_id: id,
                sges: sge.into(),
            })
        })
    }

    /// Atomic fetch-and-add on the 8-byte word at `remote`; the old value lands in `result` at
    /// `offset` and is returned.
    pub async fn fetch_add(
        &self,
        result: &Rc<Buffer>,
        offset: usize,
        remote: Remote,
        add: u64,
    ) -> Result<u64, DriverError> {
        let op = SendOp::FetchAdd {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
            add,
        };
        self.send_op(op, result, result.sge(offset, 8)).await?;
        Ok(result.load_u64(offset))
    }

    /// Atomic compare-and-swap on the 8-byte word at `remote`; returns the old value (the swap
    /// happened if it equals `compare`).
    pub async fn compare_swap(
        &self,
        result: &Rc<Buffer>,
        offset: usize,
        remote: Remote,
        compare: u64,
        swap: u64,
    ) -> Result<u64, DriverError> {
        let op = SendOp::CmpSwap {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
            compare,
            swap,
        };
        self.send_op(op, result, result.sge(offset, 8)).await?;
        Ok(result.load_u64(offset))
    }

    /// Work requests whose futures were dropped and whose completions have not come yet.
    pub fn abandoned_in_flight(&self) -> usize {
        self.table
            .borrow()
            .pending
            .values()
            .filter(|p| p.abandoned)
            .count()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Disconnecting flushes everything outstanding; the routing tasks stay until the last
        // held buffer's completion has come, then end. With nothing outstanding no completion
        // will come to wake them, so they are ended here: a routing task left waiting would
        // keep its completion queue, and this endpoint's table, for the life of the core.
        self.table.borrow_mut().closed = true;
        self.qp.disconnect();
        self.table.borrow_mut().end_routes_if_done();
    }
}

/// One operation in flight. Resolves to its work completion; an error status is an
/// `Err(DriverError::Completion { .. })`.
pub struct Op {
    table: Rc<RefCell<Table>>,
    id: u64,
    posted: Result<(), DriverError>,
}

impl Future for Op {
    type Output = Result<WorkCompletion, DriverError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Err(e) = &this.posted {
            return Poll::Ready(Err(e.clone()));
        }
        let mut t = this.table.borrow_mut();
        let Some(p) = t.pending.get_mut(&this.id) else {
            return Poll::Ready(Err(DriverError::Unsupported(
                "operation polled after completion".into(),
            )));
        };
        match p.done.take() {
            Some(wc) => {
                t.pending.remove(&this.id);
                t.end_routes_if_done();
                Poll::Ready(if wc.status == WcStatus::Success {
                    Ok(wc)
                } else {
                    Err(DriverError::Completion {
                        status: wc.status,
                        wr_id: wc.wr_id,
                    })
                })
            }
            None => {
                p.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let mut t = self.table.borrow_mut();
        if let Some(p) = t.pending.get_mut(&self.id) {
            if p.done.is_some() {
                t.pending.remove(&self.id);
                t.end_routes_if_done();
            } else {
                // Still owned by the device: keep the buffers until the completion.
                p.abandoned = true;
                p.waker = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer() -> Rc<Buffer> {
        let dev = crate::Device::open(&crate::DriverConfig::parse("soft", None).unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        Buffer::new(&pd, 64, 64, Access::LOCAL_WRITE).unwrap()
    }

    /// What `f` panicked with (empty if it did not).
    fn panics(f: &dyn Fn()) -> String {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .err()
            .and_then(|p| p.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    }

    /// The bounds and alignment checks (out of line since their panics moved to cold
    /// functions) still stop every access that leaves the buffer, and say why.
    #[test]
    fn a_buffer_refuses_every_access_outside_it_or_unaligned() {
        let b = buffer();
        b.write_at(60, &[1, 2, 3, 4]);
        assert_eq!(b.load_u32_le(60), u32::from_le_bytes([1, 2, 3, 4]));
        assert_eq!(
            panics(&|| b.write_at(61, &[0; 4])),
            "4 bytes at 61 overrun a 64-byte buffer"
        );
        assert!(panics(&|| b.read_at(usize::MAX, &mut [0; 2])).contains("overrun"));
        assert!(panics(&|| b.zero(0, 65)).contains("overrun"));
        assert!(panics(&|| b.store_u32_le(62, 0)).contains("overrun"));
        assert!(panics(&|| {
            b.load_u32_le(64);
        })
        .contains("overrun"));
        assert_eq!(
            panics(&|| {
                b.load_u32_le(2);
            }),
            "unaligned 4-byte word at 2"
        );
        assert_eq!(
            panics(&|| {
                b.load_u64(4);
            }),
            "unaligned 8-byte word at 4"
        );
        // Nothing outside [60, 64) changed.
        let mut all = [0u8; 64];
        b.read_at(0, &mut all);
        assert!(all[..60].iter().all(|&x| x == 0));
    }

    /// A span is checked against the buffer when it is made, and each access through it
    /// against the span, so no access through one leaves the range it was given.
    #[test]
    fn a_span_refuses_every_access_outside_it() {
        let b = buffer();
        assert_eq!(
            panics(&|| {
                b.span(60, 8);
            }),
            "8 bytes at 60 overrun a 64-byte buffer"
        );
        let s = b.span(16, 8);
        s.store_u32_le(4, 7);
        s.write(0, &[9, 9]);
        assert_eq!(s.load_u32_le(4), 7);
        assert_eq!(
            panics(&|| s.store_u32_le(5, 0)),
            "4 bytes at 5 overrun a 8-byte span"
        );
        assert!(panics(&|| s.write(8, &[1])).contains("overrun a 8-byte span"));
        assert!(panics(&|| s.read(usize::MAX, &mut [0; 2])).contains("overrun"));
        // (An unaligned word is named by its offset in the buffer.)
        assert_eq!(
            panics(&|| {
                s.load_u32_le(2);
            }),
            "unaligned 4-byte word at 18"
        );
        // Only what the span's accesses wrote, inside it, changed.
        let mut all = [0u8; 64];
        b.read_at(0, &mut all);
        let mut want = [0u8; 64];
        want[16..18].copy_from_slice(&[9, 9]);
        want[20..24].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(all, want);
    }

    /// A mapped span is checked against the mapping, and its start for alignment, when it is
    /// made; each access through it against the span, and a word for its offset's alignment.
    #[test]
    fn a_mapped_span_refuses_every_access_outside_it() {
        struct Awake;
        impl crate::backend::MappedPeer for Awake {
            fn wake_if_asleep(&self) {}
        }
        let mut memory = vec![0u32; 16];
        let m = MappedRemote::new(memory.as_mut_ptr() as *mut u8, 64, Box::new(Awake));
        assert_eq!(
            panics(&|| {
                m.span(60, 8);
            }),
            "8 bytes at 60 overrun a 64-byte mapped region"
        );
        assert_eq!(
            panics(&|| {
                m.span(18, 8);
            }),
            "unaligned 4-byte word at 18"
        );
        let s = m.span(16, 12);
        s.write(0, &[9, 9]);
        s.store_u32_le(8, 7);
        assert_eq!(s.load_u32_le(8), 7);
        assert_eq!(
            panics(&|| s.store_u32_le(12, 0)),
            "4 bytes at 12 overrun a 12-byte span"
        );
        assert!(panics(&|| s.write(11, &[1, 1])).contains("overrun a 12-byte span"));
        // (An unaligned word is named by its offset in the region.)
        assert_eq!(
            panics(&|| {
                s.load_u32_le(2);
            }),
            "unaligned 4-byte word at 18"
        );
        // A one-word span at the region's end.
        m.span(60, 4).store_u32_le(0, 5);
        assert_eq!(m.span(60, 4).load_u32_le(0), 5);
        assert_eq!(
            panics(&|| {
                m.span(62, 4);
            }),
            "4 bytes at 62 overrun a 64-byte mapped region"
        );
        drop(m);
        // Only what the accesses wrote, inside the span or the word, changed.
        let mut want = vec![0u32; 16];
        want[4] = u32::from_le_bytes([9, 9, 0, 0]);
        want[6] = 7u32.to_le();
        want[15] = 5u32.to_le();
        assert_eq!(memory, want);
    }

    #[test]
    fn the_inline_copies_copy_every_length_and_alignment() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 1) as u8).collect();
        for from in 0..17 {
            for to in 0..17 {
                for len in [0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 255] {
                    let mut dst = vec![0u8; 300];
                    // SAFETY: both ranges lie within their vectors; distinct allocations.
                    unsafe { copy_ascending(src[from..].as_ptr(), dst[to..].as_mut_ptr(), len) };
                    assert_eq!(&dst[to..to + len], &src[from..from + len]);
                    assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0));
                    let mut dst = vec![0u8; 300];
                    // SAFETY: as above.
                    unsafe { copy_chunks(src[from..].as_ptr(), dst[to..].as_mut_ptr(), len) };
                    assert_eq!(&dst[to..to + len], &src[from..from + len]);
                    assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0));
                }
            }
        }
    }
}
