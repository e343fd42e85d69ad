//! Progress: the per-core poller that moves every queue pair's bytes (epoll, or direct
//! receives for a few queue pairs), the staging buffer small pieces are read through, the
//! stall timeout, and the burst rule both reactors' posts follow (`joins_burst`).

use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::rc::Weak;
use std::time::{Duration, Instant};

use barewire_engine::Poller;

use super::*;

pub(super) fn close(i: &mut QpInner, read_status: WcStatus) {
    i.stream.enter_error(read_status);
    if !i.closed {
        i.closed = true;
        // A connection cut for a protection violation counts against its address.
        // It no longer counts against its listener's limits (the application may hold the
        // queue pair for a while yet).
        if let Some(a) = i.admission.take() {
            let ours = i.stream.terminate_sent() && !i.stream.peer_terminated();
            if ours && i.stream.last_terminate().is_some_and(is_protection) {
                if let Some(intake) = a.intake.upgrade() {
                    intake.violation(*a.open.source());
                }
            }
        }
        // Under SQPOLL the socket shuts down once the copies the stream handed over are sent.
        if !super::ring::hang_up(i) {
            // SAFETY: shutting down our own socket.
            unsafe { libc::shutdown(i.fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
        super::ring::cancel_armed(i);
    }
    mark_active(i);
}

/// The socket refused this queue pair's bytes: the peer hung up or reset, or the link timed
/// out. Sending stops, but what the peer sent before its end is still in the socket, in order
/// ahead of that end (a channel receiver's last credit word, written just before it hangs up,
/// is such a message), so the queue pair fails (`RetryExcErr`) only once it has taken that in:
/// at once here on the raw-syscall path, where nothing is outstanding on the socket; on a ring
/// core when its receive in flight reaches the end, which a failed socket reports at once
/// (where the failed bytes are still queued in the stream, the stall timeout bounds that wait
/// too; under SQPOLL the wire had already taken them).
pub(super) fn send_failed(i: &mut QpInner) {
    if i.closed || std::mem::replace(&mut i.tx_failed, true) {
        return;
    }
    if i.ring.is_none() {
        receive(i, i.fd.as_raw_fd());
    } else if i.stream.rx_buffer().is_some() {
        mark_active(i);
        return;
    }
    if !i.closed {
        close(i, WcStatus::RetryExcErr);
    }
}

/// Terminates for a protection violation: an invalid or foreign STag, a base/bounds or rights
/// violation, a wrapping offset (RDMAP remote protection errors, DDP tagged buffer errors).
fn is_protection(code: crate::wire::TermCode) -> bool {
    use crate::wire::Layer;
    matches!(
        (code.layer, code.etype),
        (Layer::Rdmap, 1) | (Layer::Ddp, 1)
    )
}

/// Moves bytes for one queue pair. True if anything moved.
pub(super) fn service(i: &mut QpInner, readable: bool) -> bool {
    if i.closed {
        return false;
    }
    let fd = i.fd.as_raw_fd();
    let mut moved = flush(i);
    if i.closed {
        return true;
    }
    // After a Terminate went out (or came in) and nothing is left to send, hang up.
    if i.stream.rx_dead() && !i.stream.wants_tx() {
        close(i, WcStatus::WrFlushErr);
        return true;
    }
    if readable {
        moved |= receive(i, fd);
    }
    i.moved |= moved;
    mark_active(i);
    moved
}

/// Sends what the stream has queued with `sendmsg`, up to the budget: one queue pair moving a
/// large message must not hold the core (its other queue pairs, its tasks, its membership
/// probes) for the whole transfer. True if bytes went out; closes the queue pair on a socket
/// error.
pub(super) fn flush(i: &mut QpInner) -> bool {
    // A ring send outstanding has taken bytes the stream still counts as queued: sending from
    // the stream now would send them twice. (It completes at the ring's next poll.)
    if i.closed || i.tx_failed || super::ring::send_outstanding(i) {
        return false;
    }
    if let Some(moved) = super::ring::flush_copy(i) {
        return moved;
    }
    let fd = i.fd.as_raw_fd();
    let mut moved = false;
    let mut sent = 0;
    i.tx_more = false;
    while i.stream.wants_tx() {
        if sent >= BUDGET {
            i.tx_more = true;
            break;
        }
        let mut iov = [std::io::IoSlice::new(&[]); 64];
        let count = i.stream.tx_iovecs(&mut iov);
        if count == 0 {
            break; // the stream stopped (a Read Response's source was deregistered)
        }
        // SAFETY: msghdr over iovecs (IoSlice is ABI-compatible with iovec on Unix) that borrow
        // live memory for the duration of the call.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = count;
            libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        let _ = PROVIDER.try_with(|p| p.count_send(n));
        if n > 0 {
            i.stream.tx_advance(n as usize);
            sent += n as usize;
            moved = true;
        } else if n == 0 {
            // Only a list of no bytes sends none, and the stream lists none (`Pieces` skips
            // empty extents). `errno` would be stale here; fail the queue pair as the ring's
            // path does on a send that moved nothing, rather than wait for ever.
            send_failed(i);
            return true;
        } else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                send_failed(i);
                return true;
            }
            break;
        }
    }
    moved
}

/// A post in a burst (see `joins_burst`) that leaves this many bytes queued on its queue pair
/// goes at once all the same: a send that large gains nothing from waiting for more, and a
/// stream of 1 MiB WRITEs keeps sending each as it is posted.
const BURST_FULL: u64 = 1 << 20;

/// The burst rule, for a post on a core that would send it at once: true if it is not the
/// first post of the task's current poll (and leaves less than [`BURST_FULL`] queued). Then it
/// waits in its stream, and goes when the task yields, with the rest of the burst
/// (`send_burst`, queued here): a bandwidth loop's batch, or a request and its fence, leaves
/// in one system call (on a ring core, every queue pair's in one submission; on an epoll core,
/// one `sendmsg` per queue pair) rather than one each. A stream of 64 KiB WRITEs went one
/// system call per WRITE, where a batch of sixteen can take one. A latency loop, which posts
/// once per poll, never waits.
pub(super) fn joins_burst(p: &Provider, i: &mut QpInner) -> bool {
    let now = barewire_engine::poll_count();
    if p.last_post.replace(now) != now || i.stream.tx_unsent() >= BURST_FULL {
        return false;
    }
    if !p.burst_waits.get() {
        if !barewire_engine::at_yield(send_burst) {
            return false; // outside the runtime nothing would send it later
        }
        p.burst_waits.set(true);
    }
    if i.ring.is_none() && !std::mem::replace(&mut i.in_burst, true) {
        p.burst.borrow_mut().push(i.key);
    }
    true
}

/// A task that posted more than once in one poll yielded: what waited (see `joins_burst`) goes
/// out now.
fn send_burst() {
    let _ = PROVIDER.try_with(|p| {
        p.burst_waits.set(false);
        if super::ring::send_burst(p) {
            return;
        }
        let mut keys = std::mem::take(&mut *p.burst.borrow_mut());
        for &key in &keys {
            if let Some(qp) = p.get(key) {
                let mut i = qp.borrow_mut();
                i.in_burst = false;
                service(&mut i, false);
            }
        }
        // The list's allocation is kept for the next burst.
        keys.clear();
        let mut burst = p.burst.borrow_mut();
        if burst.is_empty() {
            *burst = keys;
        }
    });
}

/// Bytes one queue pair may move in each direction per service call; past it the poller
/// comes back on its next pass (see `QpInner::rx_more` and the active list).
const BUDGET: usize = 1 << 20;

fn receive(i: &mut QpInner, fd: RawFd) -> bool {
    let mut moved = false;
    let mut got = 0;
    i.rx_more = false;
    while let Some((dst, want)) = i.stream.rx_buffer() {
        if got >= BUDGET {
            i.rx_more = true;
            break;
        }
        let asked = if want >= DIRECT_PLACEMENT {
            want
        } else {
            STAGE_LEN
        };
        let n = if want >= DIRECT_PLACEMENT {
            // SAFETY: the stream handed out a checked target extent of `want` bytes.
            let n = unsafe { libc::recv(fd, dst as *mut libc::c_void, want, libc::MSG_DONTWAIT) };
            if n > 0 {
                i.stream.rx_advance(n as usize);
            }
            n
        } else {
            // Small pieces go through the core's staging buffer, so one recv can bring several
            // FPDUs; everything read is fed at once, so the buffer is free again on return.
            STAGE.with(|stage| {
                let mut stage = stage.borrow_mut();
                // SAFETY: recv writes at most stage.len() bytes into our buffer.
                let n = unsafe {
                    libc::recv(
                        fd,
                        stage.as_mut_ptr() as *mut libc::c_void,
                        stage.len(),
                        libc::MSG_DONTWAIT,
                    )
                };
                if n > 0 {
                    // Bytes after a fatal error are dropped with the stream, as a closed socket would.
                    i.stream.rx_feed(&stage[..n as usize]);
                }
                n
            })
        };
        if n > 0 {
            moved = true;
            got += n as usize;
            // A TCP socket returns less than asked only when it has no more bytes right now;
            // with edge-triggered epoll the next arrival raises a new event, so stop here
            // instead of paying a recv just to hear EAGAIN.
            if (n as usize) < asked {
                break;
            }
            continue;
        }
        if n == 0 {
            close(i, WcStatus::RetryExcErr);
            return true;
        }
        if io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock {
            close(i, WcStatus::RetryExcErr);
            return true;
        }
        break;
    }
    // A Terminate may have been queued by what arrived.
    if i.stream.wants_tx() {
        moved |= service(i, false);
    }
    moved
}

/// How much one staging read takes: enough for several full FPDUs (16 KiB payloads by
/// default) per system call. The io_uring path's look buffers are this size too.
pub(super) const STAGE_LEN: usize = 64 * 1024;

thread_local! {
    /// One staging buffer per core: queue pairs are serviced one at a time and each empties it.
    static STAGE: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; STAGE_LEN].into_boxed_slice());
}

pub(super) struct Provider {
    /// The engine core this state belongs to (see `barewire_engine::core_token`).
    pub(super) core: Cell<u64>,
    /// The epoll fd, registered with the engine's reactor for the core's life: a new event in
    /// the set ends the core's sleep (the interrupt source). Made the first time the core goes
    /// to sleep. (Declared before `epfd`, so dropped before the epoll fd closes.)
    pub(super) irq: RefCell<Option<barewire_engine::WakeSource>>,
    pub(super) epfd: Cell<Option<OwnedFd>>,
    /// Weak: a queue pair lives as long as the application holds it; dropping the last handle
    /// closes its socket (the peer sees the connection end) and frees its slot here.
    pub(super) qps: RefCell<Vec<Option<Weak<RefCell<QpInner>>>>>,
    pub(super) free: RefCell<Vec<usize>>,
    /// Slots the poller must look at each pass; idle queue pairs are not on it, so a core with
    /// a thousand quiet connections pays nothing for them.
    pub(super) active: RefCell<Vec<usize>>,
    /// Slots freed while `active` was borrowed (a queue pair dropped during a pass).
    pub(super) late: RefCell<Vec<usize>>,
    pub(super) next_qp: Cell<u32>,
    pub(super) registered: Cell<bool>,
    pub(super) timer_armed: Cell<bool>,
    /// Where `irq` cannot be made or armed: a task's poll on the epoll fd is in flight through
    /// the engine's reactor, for this sleep alone.
    pub(super) irq_armed: Cell<bool>,
    /// On an io_uring core: the ring's raw queue and provided buffers (see `ring.rs`); `None`
    /// on epoll cores, which use the epoll set above.
    pub(super) ring: RefCell<Option<super::ring::Ring>>,
    /// The engine's poll count at the last post (see `joins_burst`): a post in the same poll
    /// as another waits for the task to yield (`send_burst`).
    pub(super) last_post: Cell<u64>,
    /// `send_burst` is queued to run when the task yields.
    pub(super) burst_waits: Cell<bool>,
    /// On an epoll core: the queue pairs whose posts wait for `send_burst` (each once: see
    /// `QpInner::in_burst`). A ring core keeps them on its pending list.
    pub(super) burst: RefCell<Vec<usize>>,
    /// What the core has sent (see [`send_stats`]).
    pub(super) sends: Cell<u64>,
    pub(super) sent_bytes: Cell<u64>,
}

thread_local! {
    pub(super) static PROVIDER: Provider = const {
        Provider {
            core: Cell::new(0),
            epfd: Cell::new(None),
            qps: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            active: RefCell::new(Vec::new()),
            late: RefCell::new(Vec::new()),
            next_qp: Cell::new(1),
            registered: Cell::new(false),
            timer_armed: Cell::new(false),
            irq: RefCell::new(None),
            irq_armed: Cell::new(false),
            ring: RefCell::new(None),
            last_post: Cell::new(u64::MAX),
            burst_waits: Cell::new(false),
            burst: RefCell::new(Vec::new()),
            sends: Cell::new(0),
            sent_bytes: Cell::new(0),
        }
    };
}

impl Provider {
    pub(super) fn epfd(&self) -> RawFd {
        let fd = self.epfd.take().unwrap_or_else(|| {
            // SAFETY: plain syscall; the fd is owned from here on.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            assert!(fd >= 0, "epoll_create1: {}", io::Error::last_os_error());
            // SAFETY: fresh fd.
            unsafe { OwnedFd::from_raw_fd(fd) }
        });
        let raw = fd.as_raw_fd();
        self.epfd.set(Some(fd));
        raw
    }

    /// Forgets the state of an earlier runtime that ran on this thread.
    pub(super) fn bind_to_current_core(&self) {
        let token = barewire_engine::core_token();
        if self.core.replace(token) != token {
            self.reset();
        }
    }

    /// The core's poller is being dropped, which happens when the core shuts down: the state
    /// kept for that core goes now, while the core still runs, rather than when the thread
    /// ends or the next runtime on it binds. Its provided buffers are unregistered from the
    /// core's own ring and freed; dropped with no core, or under another core, they could only
    /// be leaked, since the kernel might still pick them (4 MiB a core for every runtime that
    /// had a soft queue pair on io_uring). Queue pairs still held close, as the next runtime
    /// would close them.
    pub(super) fn release(&self) {
        if barewire_engine::in_runtime() && self.core.get() == barewire_engine::core_token() {
            self.reset();
            self.core.set(0);
        }
    }

    /// Drops the state of the core this provider was bound to.
    fn reset(&self) {
        // The core's ring goes first (closed, or about to close with its core), so the
        // queue pairs close without it.
        self.ring.take();
        for qp in self
            .qps
            .take()
            .into_iter()
            .flatten()
            .filter_map(|w| w.upgrade())
        {
            close(&mut qp.borrow_mut(), WcStatus::WrFlushErr);
        }
        self.free.take();
        self.active.take();
        self.late.take();
        self.irq.take();
        self.epfd.set(None);
        self.registered.set(false);
        self.timer_armed.set(false);
        self.irq_armed.set(false);
        self.last_post.set(u64::MAX);
        self.burst_waits.set(false);
        self.burst.take();
    }

    pub(super) fn add(&self, qp: &QueuePair) {
        self.bind_to_current_core();
        if !self.registered.get() {
            *self.ring.borrow_mut() = super::ring::Ring::for_core();
        }
        let key = {
            let mut qps = self.qps.borrow_mut();
            let key = self.free.borrow_mut().pop().unwrap_or_else(|| {
                qps.push(None);
                qps.len() - 1
            });
            qps[key] = Some(Rc::downgrade(&qp.inner));
            key
        };
        qp.inner.borrow_mut().key = key;
        if self.ring.borrow().is_some() {
            if !self.registered.replace(true) {
                barewire_engine::register_poller(Box::new(super::ring::RingPoller::new()));
            }
            let mut i = qp.inner.borrow_mut();
            i.ring = Some(super::ring::RingOps::new());
            if !super::ring::attach(&mut i) {
                close(&mut i, WcStatus::RetryExcErr);
                return;
            }
            super::ring::queue(&mut i);
            return;
        }
        let epfd = self.epfd();
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
            u64: key as u64,
        };
        let fd = qp.inner.borrow().fd.as_raw_fd();
        // SAFETY: registering a socket we own with our epoll set.
        unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if !self.registered.replace(true) {
            barewire_engine::register_poller(Box::new(ProgressPoller {
                events: vec![libc::epoll_event { events: 0, u64: 0 }; 64],
                last_timeout_check: Instant::now(),
                gone: Vec::new(),
                passes: 0,
                skipped_epoll: false,
            }));
        }
    }

    pub(super) fn get(&self, key: usize) -> Option<Rc<RefCell<QpInner>>> {
        self.qps.borrow().get(key)?.as_ref()?.upgrade()
    }

    /// Counts one send operation that moved `res` bytes (or failed: `res` ≤ 0).
    pub(super) fn count_send(&self, res: isize) {
        self.sends.set(self.sends.get() + 1);
        self.sent_bytes
            .set(self.sent_bytes.get() + res.max(0) as u64);
    }

    /// Queue pairs alive on this core.
    pub(super) fn live(&self) -> usize {
        self.qps.borrow().len() - self.free.borrow().len()
    }

    /// Frees the slot of a queue pair that closed or was dropped.
    pub(super) fn forget(&self, key: usize) {
        if self.qps.borrow().get(key).is_some_and(Option::is_some) {
            self.qps.borrow_mut()[key] = None;
            self.free.borrow_mut().push(key);
        }
    }

    /// True if a live queue pair on the active list satisfies `f`.
    fn any_live(&self, f: impl Fn(&QpInner) -> bool) -> bool {
        self.active
            .borrow()
            .iter()
            .filter_map(|&k| self.get(k))
            .any(|qp| {
                let i = qp.borrow();
                !i.closed && f(&i)
            })
    }

    /// Before the core sleeps: registers the epoll fd with the engine's reactor if it is not
    /// yet, so that the set's next event ends the sleep. A registration lasts the core's life
    /// (one `epoll_ctl` in all, where a task awaiting `poll_readable` would register and
    /// deregister at every sleep). The registration is edge-triggered, and every new event on
    /// a socket in the set signals the epoll fd anew, drained or not, so events already served
    /// (or left stale by direct receives, which `try_enter_interrupt_mode` drains first) do
    /// not wake the core. False where it cannot be made or armed.
    fn arm_irq(&self) -> bool {
        barewire_engine::WakeSource::arm_in(&mut self.irq.borrow_mut(), self.epfd())
    }

    /// Before the core sleeps: a queue pair that is owed bytes needs its stall timeout to run,
    /// so a short timer keeps the core coming back. False if a timer task was just spawned
    /// (it must run before the core sleeps).
    pub(super) fn stall_timer(&self) -> bool {
        let waiting = self.any_live(|i| i.stream.awaiting_peer());
        if waiting && !self.timer_armed.replace(true) {
            barewire_engine::spawn_local(async {
                barewire_engine::time::sleep(super::ring::STALL_TICK).await;
                PROVIDER.with(|p| p.timer_armed.set(false));
            });
            return false;
        }
        true
    }
}

/// What the soft provider on this thread's core has handed the kernel to send, since the
/// thread first used it: a way to see how well posts are batched (bytes per send).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SendStats {
    /// Send operations: `sendmsg` calls on the epoll fallback; `SEND`/`SENDMSG` operations
    /// completed on an io_uring core (under SQPOLL, sends of the queue pairs' copies). One
    /// that found the socket full or broken counts too.
    pub sends: u64,
    /// The bytes they carried.
    pub bytes: u64,
}

/// This core's [`SendStats`]. Here four WRITEs posted in one poll leave in two sends: the
/// first at once, the other three together when the task yields. (Each signaled WRITE is
/// acknowledged by the peer: see `ConnectOptions::remote_completion`.)
///
/// ```
/// use barewire_soft_rdma::provider::*;
/// use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
/// use barewire_soft_rdma::verbs::*;
///
/// let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let pd = Device::new().alloc_pd();
///     let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
///     let opts = ConnectOptions::default();
///     let l = Listener::bind("127.0.0.1:0".parse().unwrap(), opts.clone()).unwrap();
///     let addr = l.local_addr().unwrap();
///     let (pd2, scq2, rcq2) = (pd.clone_handle(), scq.clone(), rcq.clone());
///     let server = barewire_engine::spawn_local(async move {
///         l.accept(&pd2, &scq2, &rcq2).await
///     });
///     let (qp, _) = connect(addr, &pd, &scq, &rcq, opts).await.unwrap();
///     let _peer = server.await.unwrap().unwrap();
///
///     let (mut src, mut dst) = (vec![7u8; 4096], vec![0u8; 4096]);
///     // SAFETY: both buffers outlive their regions.
///     let smr = unsafe { pd.register(src.as_mut_ptr(), 4096, Access::LOCAL_WRITE) }.unwrap();
///     let remote = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
///     let dmr = unsafe { pd.register(dst.as_mut_ptr(), 4096, remote) }.unwrap();
///     let before = send_stats();
///     for k in 0..4u64 {
///         let at = k * 1024;
///         qp.post_send(SendWr {
///             wr_id: k,
///             op: SendOp::Write { remote_addr: dmr.addr() as u64 + at, rkey: dmr.stag() },
///             sges: [Sge { addr: smr.addr() as u64 + at, len: 1024, lkey: smr.stag() }].into(),
///             signaled: true,
///             fence: false,
///         })
///         .unwrap();
///     }
///     for _ in 0..4 {
///         assert_eq!(scq.next().await.status, WcStatus::Success);
///     }
///     let after = send_stats();
///     let (sends, bytes) = (after.sends - before.sends, after.bytes - before.bytes);
///     // The first WRITE at once, the other three together when the task yielded, and the
///     // peer's four acknowledgements in one send (both ends run on this core).
///     assert!(sends <= 3, "{sends} sends, {bytes} bytes");
///     drop((smr, dmr));
///     assert_eq!(dst, src);
/// });
/// ```
pub fn send_stats() -> SendStats {
    PROVIDER.with(|p| SendStats {
        sends: p.sends.get(),
        bytes: p.sent_bytes.get(),
    })
}

/// One pass over the active list: queue pairs owed bytes (served by `serve`, which says
/// whether bytes moved), the stall timeout, and the slots of queue pairs that were dropped or
/// closed (closed ones are pushed onto `gone`, for the caller to forget). True if anything
/// moved.
pub(super) fn sweep_active(
    p: &Provider,
    last_timeout_check: &mut Instant,
    gone: &mut Vec<usize>,
    mut serve: impl FnMut(&mut QpInner) -> bool,
) -> bool {
    let mut moved = false;
    let mut list = std::mem::take(&mut *p.active.borrow_mut());
    list.append(&mut p.late.borrow_mut());
    if list.is_empty() {
        return false; // nothing owed: no clock read, no list work
    }
    let now = Instant::now();
    let check_timeouts = now.duration_since(*last_timeout_check) >= Duration::from_millis(1);
    if check_timeouts {
        *last_timeout_check = now;
    }
    list.retain(|&key| {
        let Some(qp) = p.get(key) else {
            // Dropped: free the slot (its fd already left the epoll set on close).
            p.forget(key);
            return false;
        };
        let mut i = qp.borrow_mut();
        if i.closed {
            gone.push(key);
            i.listed = false;
            return false;
        }
        moved |= serve(&mut i);
        if std::mem::take(&mut i.moved) {
            i.last_progress = now;
        }
        if check_timeouts
            && i.stream.awaiting_peer()
            && now.duration_since(i.last_progress) > i.timeout
        {
            close(&mut i, WcStatus::RetryExcErr);
            moved = true;
        }
        let keep = i.closed || i.rx_more || i.stream.awaiting_peer();
        i.listed = keep;
        keep
    });
    // Entries added during the pass (by serve or close) join the kept ones.
    let mut active = p.active.borrow_mut();
    list.append(&mut active);
    list.sort_unstable();
    list.dedup();
    *active = list;
    moved
}

/// A core with at most this many queue pairs busy-polls them with `recv` directly instead of
/// asking `epoll_wait` first: one system call per pass instead of two when data is there.
pub const DIRECT_POLL_MAX: usize = 4;

/// In direct mode, `epoll_wait` still runs every this many passes, to drain stale edges and to
/// see send space and hang-ups.
const EPOLL_EVERY: u32 = 64;

struct ProgressPoller {
    passes: u32,
    /// A direct pass ran since the last `epoll_wait`: the ready list may hold stale edges that
    /// would wake a sleeping core at once, so drain it before sleeping.
    skipped_epoll: bool,
    events: Vec<libc::epoll_event>,
    last_timeout_check: Instant,
    gone: Vec<usize>,
}

impl ProgressPoller {
    /// Serves what `epoll_wait` reports. True if anything moved.
    fn drain_epoll(&mut self, p: &Provider, epfd: RawFd) -> bool {
        self.skipped_epoll = false;
        let mut moved = false;
        loop {
            // SAFETY: events is a valid buffer of len entries.
            let n = unsafe {
                libc::epoll_wait(epfd, self.events.as_mut_ptr(), self.events.len() as i32, 0)
            };
            for ev in self.events.iter().take(n.max(0) as usize) {
                if let Some(qp) = p.get(ev.u64 as usize) {
                    let readable = ev.events
                        & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR)
                            as u32
                        != 0;
                    moved |= service(&mut qp.borrow_mut(), readable);
                }
            }
            if (n.max(0) as usize) < self.events.len() {
                return moved;
            }
        }
    }
}

impl Drop for ProgressPoller {
    /// The core is shutting down: its epoll set and queue pairs go with it.
    fn drop(&mut self) {
        let _ = PROVIDER.try_with(Provider::release);
    }
}

impl Poller for ProgressPoller {
    fn poll(&mut self) -> bool {
        PROVIDER.with(|p| {
            let epfd = p.epfd();
            let mut moved = false;
            self.passes = self.passes.wrapping_add(1);
            if p.live() <= DIRECT_POLL_MAX && self.passes % EPOLL_EVERY != 0 {
                self.skipped_epoll = true;
                let count = p.qps.borrow().len();
                for key in 0..count {
                    if let Some(qp) = p.get(key) {
                        moved |= service(&mut qp.borrow_mut(), true);
                    }
                }
            } else {
                moved |= self.drain_epoll(p, epfd);
            }
            moved |= sweep_active(
                p,
                &mut self.last_timeout_check,
                &mut self.gone,
                |i: &mut QpInner| {
                    if i.stream.wants_tx() || i.rx_more {
                        let more = i.rx_more;
                        service(i, more)
                    } else {
                        false
                    }
                },
            );
            for key in self.gone.drain(..) {
                if let Some(qp) = p.get(key) {
                    let fd = qp.borrow().fd.as_raw_fd();
                    // SAFETY: removing our own socket from our epoll set.
                    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
                }
                p.forget(key);
            }
            moved
        })
    }

    fn pure_poll(&mut self) -> bool {
        false
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        // Bytes waiting for socket space are driven by the EPOLLOUT edge, which wakes the core.
        // A queue pair that is owed bytes needs its stall timer to run: keep a short timer.
        PROVIDER.with(|p| {
            if self.skipped_epoll {
                // Edges consumed by direct receives are still on the ready list; serve what it
                // holds now so the armed poll below does not fire for nothing.
                if self.drain_epoll(p, p.epfd()) {
                    return false;
                }
            }
            // A queue pair that stopped at its budget has bytes to move now: no sleeping.
            if p.any_live(|i| i.rx_more || i.tx_more) {
                return false;
            }
            if !p.stall_timer() {
                return false; // run the new timer task before sleeping
            }
            if p.arm_irq() {
                return true;
            }
            if !p.irq_armed.replace(true) {
                // Wake the core when the epoll set has events. The epoll fd is readable while
                // its ready list is non-empty, so an event that arrived since the last
                // `epoll_wait` completes the poll at once.
                let epfd = p.epfd();
                barewire_engine::spawn_local(async move {
                    let _ = barewire_engine::poll_readable(epfd).await;
                    PROVIDER.with(|p| p.irq_armed.set(false));
                });
                return false; // submit the poll before sleeping
            }
            true
        })
    }
}
