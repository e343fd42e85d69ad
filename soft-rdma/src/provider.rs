//! The software provider on the engine: connection setup with the MPA handshake, and the
//! progress engine that moves every queue pair's bytes.
//!
//! Progress runs inside the core's reactor as a registered [`Poller`]: all of a core's queue
//! pair sockets sit in one epoll set (edge-triggered), and each pass of the core's loop asks it
//! which are ready and services them — receive straight into the target memory, transmit with
//! one `sendmsg` over the gather list. No application task runs for the target side of a WRITE,
//! READ or Terminate, as on a NIC. While the core sleeps, a POLL_ADD on the epoll fd wakes it.
//!
//! Small pieces (headers, short payloads) are read through a 64 KiB staging buffer, one per
//! core, so one `recv` can bring several FPDUs; a payload of at least [`DIRECT_PLACEMENT`]
//! bytes is received straight into its region with no staging copy.
//!
//! A peer that dies, is cut off or stalls is detected two ways: the socket reports EOF or an
//! error, or a queue pair that is owed bytes (unsent data, or Read Responses) makes no progress
//! for the configured timeout (default 1 s). Either way its outstanding work completes with
//! `RETRY_EXC_ERR` (Reads) and `WR_FLUSH_ERR` (the rest).

use std::cell::{Cell, RefCell};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

use barewire_engine::net::{TcpListener, TcpStream};
use barewire_engine::Poller;

use crate::stream::{PostError, RecvWr, SendWr, Stream, StreamConfig};
use crate::verbs::{CompletionQueue, ProtectionDomain, QpState, WcStatus};
use crate::wire::{
    negotiate, MpaFrame, MpaKind, MpaSettings, Negotiated, Reject, Rev2Params, WireError,
    MPA_HEADER_LEN, MPA_MAX_PRIVATE_DATA,
};

/// Payloads at least this long are received straight into their target region.
pub const DIRECT_PLACEMENT: usize = 2048;

/// Connection settings.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// MPA settings (CRC, revision, IRD/ORD).
    pub mpa: MpaSettings,
    /// Sent in the MPA Request (or Reply): how applications exchange region descriptors.
    pub private_data: Vec<u8>,
    /// Largest ULPDU to send.
    pub mulpdu: usize,
    /// How long a queue pair that is owed bytes may go without progress before it fails.
    pub timeout: Duration,
    /// Complete signaled Sends and Writes once the peer processed them (on by default), so a
    /// request the peer refuses completes with its error; off gives plain iWARP's local
    /// completion. See [`StreamConfig::remote_completion`].
    pub remote_completion: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mpa: MpaSettings::default(),
            private_data: Vec::new(),
            mulpdu: 16 * 1024,
            timeout: Duration::from_secs(1),
            remote_completion: true,
        }
    }
}

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The TCP connection failed.
    #[error("connection failed: {0}")]
    Io(#[from] io::Error),
    /// The peer's MPA frame was malformed.
    #[error("bad MPA frame from the peer: {0}")]
    Wire(#[from] WireError),
    /// The peer rejected us (its private data says why), or asked for markers.
    #[error("connection rejected: {reason}")]
    Rejected {
        /// Why.
        reason: Reject,
        /// The peer's private data.
        private_data: Vec<u8>,
    },
    /// Private data over 512 bytes (less the 4 IRD/ORD bytes in revision 2).
    #[error("private data too long: {0} bytes")]
    PrivateDataTooLong(usize),
}

async fn read_mpa(s: &TcpStream, kind: MpaKind) -> Result<(Negotiable, usize), CmError> {
    let (r, head) = s.read_exact(vec![0u8; MPA_HEADER_LEN]).await;
    r?;
    let pd_len = u16::from_be_bytes([head[18], head[19]]) as usize;
    if pd_len > MPA_MAX_PRIVATE_DATA {
        MpaFrame::decode(&head, kind)?; // reports the length error with its field
    }
    let (r, pd) = s.read_exact(vec![0u8; pd_len]).await;
    r?;
    let all = [head, pd].concat();
    let (f, used) = MpaFrame::decode(&all, kind)?.expect("complete frame");
    Ok((Negotiable::from(&f), used))
}

/// An owned copy of a peer's MPA frame.
struct Negotiable {
    markers: bool,
    crc: bool,
    reject: bool,
    revision: u8,
    rev2: Option<Rev2Params>,
    private_data: Vec<u8>,
}

impl Negotiable {
    fn from(f: &MpaFrame<'_>) -> Self {
        Negotiable {
            markers: f.markers,
            crc: f.crc,
            reject: f.reject,
            revision: f.revision,
            rev2: f.rev2,
            private_data: f.private_data.to_vec(),
        }
    }
    fn frame(&self, kind: MpaKind) -> MpaFrame<'_> {
        MpaFrame {
            kind,
            markers: self.markers,
            crc: self.crc,
            reject: self.reject,
            revision: self.revision,
            rev2: self.rev2,
            private_data: &self.private_data,
        }
    }
}

fn our_frame<'a>(
    kind: MpaKind,
    opts: &'a ConnectOptions,
    crc: bool,
    reject: bool,
    revision: u8,
) -> MpaFrame<'a> {
    let rev2 = (revision == 2).then_some(Rev2Params {
        ird: opts.mpa.ird,
        ord: opts.mpa.ord,
        ..Rev2Params::default()
    });
    MpaFrame {
        kind,
        markers: false,
        crc,
        reject,
        revision,
        rev2,
        private_data: &opts.private_data,
    }
}

async fn write_frame(s: &TcpStream, f: &MpaFrame<'_>) -> Result<(), CmError> {
    let mut buf = vec![0u8; f.encoded_len()];
    let n = f.encode(&mut buf)?;
    buf.truncate(n);
    s.write_all(buf).await.0?;
    Ok(())
}

fn check_private_data(opts: &ConnectOptions) -> Result<(), CmError> {
    let room = MPA_MAX_PRIVATE_DATA - if opts.mpa.revision == 2 { 4 } else { 0 };
    if opts.private_data.len() > room {
        return Err(CmError::PrivateDataTooLong(opts.private_data.len()));
    }
    Ok(())
}

/// Connects to a listening peer: TCP, then the MPA Request/Reply exchange. Returns the queue
/// pair (in RTS) and the peer's private data.
///
/// ```no_run
/// # async fn demo() -> Result<(), barewire_soft_rdma::provider::CmError> {
/// use barewire_soft_rdma::{provider::*, verbs::*};
/// let dev = Device::new();
/// let pd = dev.alloc_pd();
/// let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
/// let (qp, peer_data) = connect("127.0.0.1:9999".parse().unwrap(), &pd, &scq, &rcq, ConnectOptions::default()).await?;
/// # Ok(()) }
/// ```
pub async fn connect(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    opts: ConnectOptions,
) -> Result<(QueuePair, Vec<u8>), CmError> {
    check_private_data(&opts)?;
    let s = TcpStream::connect(addr).await?;
    write_frame(
        &s,
        &our_frame(
            MpaKind::Request,
            &opts,
            opts.mpa.crc,
            false,
            opts.mpa.revision,
        ),
    )
    .await?;
    let (peer, _) = read_mpa(&s, MpaKind::Reply).await?;
    let neg =
        negotiate(&opts.mpa, &peer.frame(MpaKind::Reply)).map_err(|reason| CmError::Rejected {
            reason,
            private_data: peer.private_data.clone(),
        })?;
    let qp = QueuePair::start(s.into_fd(), pd, scq, rcq, &opts, neg);
    Ok((qp, peer.private_data))
}

/// Accepts connections with the MPA handshake.
pub struct Listener {
    inner: TcpListener,
    opts: ConnectOptions,
}

impl Listener {
    /// Listens on `addr`.
    pub fn bind(addr: SocketAddr, opts: ConnectOptions) -> Result<Listener, CmError> {
        check_private_data(&opts)?;
        Ok(Listener {
            inner: TcpListener::bind(addr)?,
            opts,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Accepts one peer. A peer asking for markers gets a Reply with R set and is refused.
    pub async fn accept(
        &self,
        pd: &ProtectionDomain,
        scq: &CompletionQueue,
        rcq: &CompletionQueue,
    ) -> Result<(QueuePair, Vec<u8>), CmError> {
        let (s, _) = self.inner.accept().await?;
        let (peer, _) = read_mpa(&s, MpaKind::Request).await?;
        let f = peer.frame(MpaKind::Request);
        match negotiate(&self.opts.mpa, &f) {
            Ok(neg) => {
                write_frame(
                    &s,
                    &our_frame(MpaKind::Reply, &self.opts, neg.crc, false, neg.revision),
                )
                .await?;
                Ok((
                    QueuePair::start(s.into_fd(), pd, scq, rcq, &self.opts, neg),
                    peer.private_data,
                ))
            }
            Err(reason) => {
                let rev = self.opts.mpa.revision.min(peer.revision);
                write_frame(&s, &our_frame(MpaKind::Reply, &self.opts, false, true, rev)).await?;
                Err(CmError::Rejected {
                    reason,
                    private_data: peer.private_data,
                })
            }
        }
    }
}

struct QpInner {
    qp: u32,
    stream: Stream,
    fd: OwnedFd,
    timeout: Duration,
    last_progress: Instant,
    closed: bool,
    /// Its slot in the core's provider.
    key: usize,
    /// On the provider's active list (owed bytes, or closed and waiting to be forgotten).
    listed: bool,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        // Have the poller free the slot; the fd leaves the epoll set as it closes.
        let key = self.key;
        let _ = PROVIDER.try_with(|p| {
            if let Ok(mut active) = p.active.try_borrow_mut() {
                active.push(key);
            } else {
                p.late.borrow_mut().push(key);
            }
        });
    }
}

/// Puts a queue pair on the active list if it needs the poller's attention beyond epoll events:
/// bytes owed (for the stall timeout and send-space retries), or a closed socket to forget.
fn mark_active(i: &mut QpInner) {
    if !i.listed && (i.closed || i.stream.awaiting_peer()) {
        i.listed = true;
        let key = i.key;
        PROVIDER.with(|p| p.active.borrow_mut().push(key));
    }
}

/// A connected reliable queue pair of the software provider.
#[derive(Clone)]
pub struct QueuePair {
    inner: Rc<RefCell<QpInner>>,
}

impl QueuePair {
    fn start(
        fd: OwnedFd,
        pd: &ProtectionDomain,
        scq: &CompletionQueue,
        rcq: &CompletionQueue,
        opts: &ConnectOptions,
        neg: Negotiated,
    ) -> QueuePair {
        let qp_num = PROVIDER.with(|p| {
            p.bind_to_current_core();
            p.next_qp.replace(p.next_qp.get() + 1)
        });
        let cfg = StreamConfig {
            qp_num,
            pd: pd.id(),
            crc: neg.crc,
            mulpdu: opts.mulpdu,
            ird: neg.ird.max(1),
            ord: neg.ord.max(1),
            remote_completion: opts.remote_completion,
        };
        let stream = Stream::new(pd.device().clone(), cfg, scq.clone(), rcq.clone());
        let inner = Rc::new(RefCell::new(QpInner {
            qp: qp_num,
            stream,
            fd,
            timeout: opts.timeout,
            last_progress: Instant::now(),
            closed: false,
            key: usize::MAX,
            listed: false,
        }));
        let qp = QueuePair { inner };
        PROVIDER.with(|p| p.add(&qp));
        qp
    }

    /// The queue pair's number.
    pub fn qp_num(&self) -> u32 {
        self.inner.borrow().qp
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        self.inner.borrow().stream.state()
    }

    /// The Terminate that broke it, if one did.
    pub fn last_terminate(&self) -> Option<crate::wire::TermCode> {
        self.inner.borrow().stream.last_terminate()
    }

    /// Posts a send work request; transmission starts at once.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        let mut i = self.inner.borrow_mut();
        i.stream.post_send(wr)?;
        service(&mut i, false);
        Ok(())
    }

    /// Posts a send work request that goes out with the core's next progress pass (once the
    /// current task yields), together with whatever else was posted meanwhile: one system call
    /// for a burst of small messages instead of one each. Ordering with `post_send` is kept
    /// (both append to the same send queue).
    pub fn post_send_batched(&self, wr: SendWr) -> Result<(), PostError> {
        let mut i = self.inner.borrow_mut();
        i.stream.post_send(wr)?;
        if !i.listed && !i.closed {
            i.listed = true;
            let key = i.key;
            PROVIDER.with(|p| p.active.borrow_mut().push(key));
        }
        Ok(())
    }

    /// Posts a receive.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        self.inner.borrow_mut().stream.post_recv(wr)
    }

    /// Disconnects: outstanding work flushes, and the peer sees the connection close.
    pub fn disconnect(&self) {
        let mut i = self.inner.borrow_mut();
        // Hand what is already posted (batched sends included) to the socket first: the kernel
        // delivers it before the FIN, so a message posted just before hanging up is not lost.
        // Whatever the socket cannot take right now is flushed with the rest.
        service(&mut i, false);
        close(&mut i, WcStatus::WrFlushErr);
    }
}

fn close(i: &mut QpInner, read_status: WcStatus) {
    i.stream.enter_error(read_status);
    if !i.closed {
        i.closed = true;
        // SAFETY: shutting down our own socket.
        unsafe { libc::shutdown(i.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }
    mark_active(i);
}

/// Moves bytes for one queue pair. True if anything moved.
fn service(i: &mut QpInner, readable: bool) -> bool {
    if i.closed {
        return false;
    }
    let fd = i.fd.as_raw_fd();
    let mut moved = false;
    // Transmit.
    while i.stream.wants_tx() {
        let mut iov = [std::io::IoSlice::new(&[]); 64];
        let count = i.stream.tx_iovecs(&mut iov);
        // SAFETY: msghdr over iovecs (IoSlice is ABI-compatible with iovec on Unix) that borrow
        // live memory for the duration of the call.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = count;
            libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n > 0 {
            i.stream.tx_advance(n as usize);
            moved = true;
        } else {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                close(i, WcStatus::RetryExcErr);
                return true;
            }
            break;
        }
    }
    // After a Terminate went out (or came in) and nothing is left to send, hang up.
    if i.stream.rx_dead() && !i.stream.wants_tx() {
        close(i, WcStatus::WrFlushErr);
        return true;
    }
    if readable {
        moved |= receive(i, fd);
    }
    if moved {
        i.last_progress = Instant::now();
    }
    mark_active(i);
    moved
}

fn receive(i: &mut QpInner, fd: RawFd) -> bool {
    let mut moved = false;
    while let Some((dst, want)) = i.stream.rx_buffer() {
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

const STAGE_LEN: usize = 64 * 1024;

thread_local! {
    /// One staging buffer per core: queue pairs are serviced one at a time and each empties it.
    static STAGE: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; STAGE_LEN].into_boxed_slice());
}

struct Provider {
    /// The engine core this state belongs to (see `barewire_engine::core_token`).
    core: Cell<u64>,
    epfd: Cell<Option<OwnedFd>>,
    /// Weak: a queue pair lives as long as the application holds it; dropping the last handle
    /// closes its socket (the peer sees the connection end) and frees its slot here.
    qps: RefCell<Vec<Option<Weak<RefCell<QpInner>>>>>,
    free: RefCell<Vec<usize>>,
    /// Slots the poller must look at each pass; idle queue pairs are not on it, so a core with
    /// a thousand quiet connections pays nothing for them.
    active: RefCell<Vec<usize>>,
    /// Slots freed while `active` was borrowed (a queue pair dropped during a pass).
    late: RefCell<Vec<usize>>,
    next_qp: Cell<u32>,
    registered: Cell<bool>,
    timer_armed: Cell<bool>,
    /// A poll on the epoll fd is in flight through the engine's reactor (the interrupt source).
    /// It is armed only when the core is about to sleep: while the core spins, the poller's own
    /// `epoll_wait` sees every event and an armed poll would only cost a completion per message.
    irq_armed: Cell<bool>,
}

thread_local! {
    static PROVIDER: Provider = const {
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
            irq_armed: Cell::new(false),
        }
    };
}

impl Provider {
    fn epfd(&self) -> RawFd {
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
    fn bind_to_current_core(&self) {
        let token = barewire_engine::core_token();
        if self.core.replace(token) != token {
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
            self.epfd.set(None);
            self.registered.set(false);
            self.timer_armed.set(false);
            self.irq_armed.set(false);
        }
    }

    fn add(&self, qp: &QueuePair) {
        self.bind_to_current_core();
        let epfd = self.epfd();
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

    fn get(&self, key: usize) -> Option<Rc<RefCell<QpInner>>> {
        self.qps.borrow().get(key)?.as_ref()?.upgrade()
    }
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

impl Poller for ProgressPoller {
    fn poll(&mut self) -> bool {
        PROVIDER.with(|p| {
            let epfd = p.epfd();
            let mut moved = false;
            self.passes = self.passes.wrapping_add(1);
            let live = p.qps.borrow().len() - p.free.borrow().len();
            if live <= DIRECT_POLL_MAX && self.passes % EPOLL_EVERY != 0 {
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
            // Queue pairs with bytes waiting for socket space, the stall timeout, and slots of
            // queue pairs that were dropped or closed.
            let mut list = std::mem::take(&mut *p.active.borrow_mut());
            list.append(&mut p.late.borrow_mut());
            if list.is_empty() {
                return moved; // nothing owed: no clock read, no list work
            }
            let now = Instant::now();
            let check_timeouts =
                now.duration_since(self.last_timeout_check) >= Duration::from_millis(1);
            if check_timeouts {
                self.last_timeout_check = now;
            }
            list.retain(|&key| {
                let Some(qp) = p.get(key) else {
                    // Dropped: free the slot (its fd already left the epoll set on close).
                    if p.qps.borrow().get(key).is_some_and(Option::is_some) {
                        p.qps.borrow_mut()[key] = None;
                        p.free.borrow_mut().push(key);
                    }
                    return false;
                };
                let mut i = qp.borrow_mut();
                if i.closed {
                    self.gone.push(key);
                    i.listed = false;
                    return false;
                }
                if i.stream.wants_tx() {
                    moved |= service(&mut i, false);
                }
                if check_timeouts
                    && i.stream.awaiting_peer()
                    && now.duration_since(i.last_progress) > i.timeout
                {
                    close(&mut i, WcStatus::RetryExcErr);
                    moved = true;
                }
                let keep = i.closed || i.stream.awaiting_peer();
                i.listed = keep;
                keep
            });
            // Entries added during the pass (by service or close) join the kept ones.
            let mut active = p.active.borrow_mut();
            list.append(&mut active);
            list.sort_unstable();
            list.dedup();
            *active = list;
            drop(active);
            for key in self.gone.drain(..) {
                if let Some(qp) = p.get(key) {
                    let fd = qp.borrow().fd.as_raw_fd();
                    // SAFETY: removing our own socket from our epoll set.
                    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
                }
                if p.qps.borrow().get(key).is_some_and(Option::is_some) {
                    p.qps.borrow_mut()[key] = None;
                    p.free.borrow_mut().push(key);
                }
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
            let waiting = p
                .active
                .borrow()
                .iter()
                .filter_map(|&k| p.get(k))
                .any(|qp| {
                    let i = qp.borrow();
                    !i.closed && i.stream.awaiting_peer()
                });
            if waiting && !p.timer_armed.replace(true) {
                barewire_engine::spawn_local(async {
                    barewire_engine::time::sleep(Duration::from_millis(5)).await;
                    PROVIDER.with(|p| p.timer_armed.set(false));
                });
                return false; // run the new timer task before sleeping
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

/// Where a peer may access a region: what applications put in the MPA private data (or a
/// message) so the other side can address its one-sided operations. 20 bytes on the wire,
/// big-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDescriptor {
    /// The region's STag.
    pub rkey: crate::verbs::Stag,
    /// The address of its first byte (the tagged offset).
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl RegionDescriptor {
    /// Bytes of the encoding.
    pub const LEN: usize = 20;

    /// Describes a registered region.
    pub fn of(mr: &crate::verbs::MemoryRegion) -> RegionDescriptor {
        RegionDescriptor {
            rkey: mr.stag(),
            addr: mr.addr() as u64,
            len: mr.len() as u64,
        }
    }

    /// The 20-byte encoding.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[4..12].copy_from_slice(&self.addr.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes the first 20 bytes of `b`; `None` if it is shorter.
    pub fn from_bytes(b: &[u8]) -> Option<RegionDescriptor> {
        let b: &[u8; Self::LEN] = b.get(..Self::LEN)?.try_into().ok()?;
        Some(RegionDescriptor {
            rkey: crate::verbs::Stag(u32::from_be_bytes(b[..4].try_into().ok()?)),
            addr: u64::from_be_bytes(b[4..12].try_into().ok()?),
            len: u64::from_be_bytes(b[12..].try_into().ok()?),
        })
    }
}

/// Accepts peers forever, keeping their queue pairs alive: the passive side of one-sided
/// operations needs no more than this (the provider's poller does the work).
pub async fn serve(
    listener: Listener,
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
) -> ! {
    let mut qps = Vec::new();
    loop {
        match listener.accept(&pd, &scq, &rcq).await {
            Ok((qp, _)) => qps.push(qp),
            Err(e) => eprintln!("barewire-soft-rdma: refused a peer: {e}"),
        }
    }
}
