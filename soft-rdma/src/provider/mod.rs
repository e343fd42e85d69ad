//! The software provider on the engine: connection setup with the MPA handshake, and the
//! progress engine that moves every queue pair's bytes.
//!
//! Progress runs inside the core's reactor as a registered [`Poller`](barewire_engine::Poller),
//! so no application task runs for the target side of a WRITE, READ or Terminate, as on a NIC.
//! It has two forms, chosen by the core's reactor:
//!
//! - **io_uring** (the default; `ring.rs`): every queue pair's receives and sends are operations
//!   on the core's one ring, queued just before each pass's submission so that all of them go
//!   out in the pass's one `io_uring_enter`. Headers and small FPDUs arrive through a multishot
//!   receive into a provided-buffer ring (or, on a core with at most [`DIRECT_POLL_MAX`] queue
//!   pairs, a receive polled inside each pass); payloads of at least [`DIRECT_SWITCH`] bytes
//!   ([`DIRECT_PLACEMENT`] when polled) are received straight into their region.
//! - **epoll** (the fallback, `BAREWIRE_REACTOR=epoll`; `progress.rs`): the queue pair sockets
//!   sit in one epoll set per core (edge-triggered) and are served with `sendmsg` and `recv`;
//!   small pieces are read through a 64 KiB staging buffer per core, payloads of at least
//!   [`DIRECT_PLACEMENT`] bytes straight into their region. While the core sleeps, a POLL_ADD on
//!   the epoll fd wakes it.
//!
//! On both, a task's first post of a poll goes out at once, and the posts it makes after that
//! before yielding go together when it yields (`progress::joins_burst`); [`send_stats`] counts
//! what the core sent.
//!
//! Both run the same sans-I/O [`Stream`], and pass the same tests.
//!
//! A peer that dies, is cut off or stalls is detected two ways: the socket reports EOF or an
//! error, or a queue pair that is owed bytes (unsent data, or Read Responses) makes no progress
//! for the configured timeout (default 1 s). Either way its outstanding work completes with
//! `RETRY_EXC_ERR` (Reads) and `WR_FLUSH_ERR` (the rest). What the peer sent before its end is
//! taken in first, even when this side learns of the end from a send that failed: a message
//! the peer sent just before hanging up (its last WRITE, say) lands and completes.

mod progress;
mod ring;
mod sqpoll;

use std::cell::RefCell;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire_engine::net::{TcpListener, TcpStream};

use crate::stream::{PostError, RecvWr, SendWr, Stream, StreamConfig};
use crate::verbs::{CompletionQueue, ProtectionDomain, QpState, WcStatus};
use crate::wire::{
    negotiate, MpaFrame, MpaKind, MpaSettings, Negotiated, Reject, Rev2Params, WireError,
    MPA_HEADER_LEN, MPA_MAX_PRIVATE_DATA,
};
use progress::{close, service, PROVIDER};
pub use progress::{send_stats, SendStats, DIRECT_POLL_MAX};
pub use ring::DIRECT_SWITCH;

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
    /// Listener: how long a connected peer may take to send its whole MPA Request before the
    /// connection is dropped (a port scanner, a stuck client or an attacker holds nothing
    /// longer than this). [`connect`]: how long the TCP connection, the Request and the peer's
    /// Reply may take together (a listener that is stopped, overloaded, slow to accept or not
    /// an iWARP one fails the connect after this, with [`CmError::TimedOut`]).
    pub handshake_timeout: Duration,
    /// Listener: handshakes in progress at once; a new connection beyond it evicts the oldest.
    pub max_pending_handshakes: usize,
    /// Listener: handshakes in progress at once from one source address; beyond it the oldest
    /// from that address is evicted (so one address cannot fill the listener).
    pub max_pending_per_source: usize,
    /// Listener: protection violations (Terminates this side sent for an invalid STag, a
    /// bounds or rights violation) one source address may cause within
    /// [`violation_window`](Self::violation_window); the next connection from it is refused
    /// for [`ban`](Self::ban). Guessing STags by reconnecting is then as slow as this allows.
    pub violation_budget: usize,
    /// See [`violation_budget`](Self::violation_budget).
    pub violation_window: Duration,
    /// See [`violation_budget`](Self::violation_budget).
    pub ban: Duration,
    /// Listener: connections it keeps open at once (accepted and alive); a new one beyond it
    /// is closed at once, and its [`connect`] fails with [`CmError::Closed`].
    pub max_connections: usize,
    /// Listener: connections open at once from one source address; beyond it, as
    /// [`max_connections`](Self::max_connections).
    pub max_connections_per_source: usize,
    /// How long a connection may go without a sign of the peer's host before it fails, idle
    /// or not (`None`: without limit). The kernel probes an idle connection and the peer's
    /// kernel answers, so a peer that is stopped or busy keeps its connection; a cut link or
    /// a host that is gone fails it, and the queue pair's posted receives then complete with
    /// errors. Without it, a queue pair with nothing outstanding waits on such a peer for
    /// ever. See [`TcpStream::set_keepalive`](barewire_engine::net::TcpStream::set_keepalive)
    /// for how it is kept; at least 1 s.
    pub keepalive: Option<Duration>,
}

/// [`ConnectOptions::keepalive`]'s default: long enough that no healthy link trips it, short
/// enough that a receiver learns of a cut within seconds.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(10);

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            mpa: MpaSettings::default(),
            private_data: Vec::new(),
            mulpdu: 16 * 1024,
            timeout: Duration::from_secs(1),
            remote_completion: true,
            handshake_timeout: Duration::from_secs(2),
            max_pending_handshakes: 128,
            max_pending_per_source: 16,
            violation_budget: 8,
            violation_window: Duration::from_secs(10),
            ban: Duration::from_secs(60),
            max_connections: 4096,
            max_connections_per_source: 256,
            keepalive: Some(DEFAULT_KEEPALIVE),
        }
    }
}

/// Why a connection could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CmError {
    /// The TCP connection failed.
    #[error("TCP: {0}")]
    Io(#[from] io::Error),
    /// [`connect`] took longer than [`ConnectOptions::handshake_timeout`].
    #[error("no connection within {after:?}: waiting for {waiting}")]
    TimedOut {
        /// The deadline.
        after: Duration,
        /// The step that did not finish.
        waiting: &'static str,
    },
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
    /// The peer closed the connection before its MPA Reply. A barewire listener closes a new
    /// connection at once when its source address is over the listener's limits
    /// ([`ConnectOptions::max_connections_per_source`], [`ConnectOptions::max_connections`]) or
    /// banned for protection violations, and drops a pending handshake that newer ones evict;
    /// [`Listener::counters`] on that side says which.
    #[error(
        "the peer closed the connection before its MPA Reply ({0}); a barewire listener does so \
         to an address over its connection limits or banned (see its counters)"
    )]
    Closed(io::Error),
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

fn encode_frame(f: &MpaFrame<'_>) -> Result<Vec<u8>, CmError> {
    let mut buf = vec![0u8; f.encoded_len()];
    let n = f.encode(&mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

async fn write_frame(s: &TcpStream, f: &MpaFrame<'_>) -> Result<(), CmError> {
    s.write_all(encode_frame(f)?).await.0?;
    Ok(())
}

/// Refuses options no connection could be made with, before any is.
fn check_options(opts: &ConnectOptions) -> Result<(), CmError> {
    let room = MPA_MAX_PRIVATE_DATA - if opts.mpa.revision == 2 { 4 } else { 0 };
    if opts.private_data.len() > room {
        return Err(CmError::PrivateDataTooLong(opts.private_data.len()));
    }
    if let Some(k) = opts.keepalive {
        barewire_engine::net::check_keepalive(k)?;
    }
    Ok(())
}

/// What a connect that timed out waiting for the peer's MPA Reply says it waited for.
const NO_REPLY: &str = "the peer's MPA Reply (is the listener stopped, overloaded, slow to \
                        accept, or not an iWARP one?)";

/// Connects to a listening peer: TCP, then the MPA Request/Reply exchange, all within
/// [`ConnectOptions::handshake_timeout`]. Returns the queue pair (in RTS) and the peer's
/// private data.
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
    check_options(&opts)?;
    let after = opts.handshake_timeout;
    let deadline = Instant::now() + after;
    let within = |waiting| move |_| CmError::TimedOut { after, waiting };
    let s = barewire_engine::time::timeout(after, TcpStream::connect(addr))
        .await
        .map_err(within("the TCP connection"))??;
    let request = our_frame(
        MpaKind::Request,
        &opts,
        opts.mpa.crc,
        false,
        opts.mpa.revision,
    );
    let reply = async {
        write_frame(&s, &request).await?;
        read_mpa(&s, MpaKind::Reply).await
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let (peer, _) = barewire_engine::time::timeout(left, reply)
        .await
        .map_err(within(NO_REPLY))?
        .map_err(closed_early)?;
    let neg =
        negotiate(&opts.mpa, &peer.frame(MpaKind::Reply)).map_err(|reason| CmError::Rejected {
            reason,
            private_data: peer.private_data.clone(),
        })?;
    s.set_keepalive(opts.keepalive)?;
    let qp = QueuePair::start(s.into_fd(), pd, scq, rcq, &opts, neg);
    Ok((qp, peer.private_data))
}

/// A handshake's I/O error that says the peer hung up, as [`CmError::Closed`].
fn closed_early(e: CmError) -> CmError {
    use io::ErrorKind::*;
    match e {
        CmError::Io(io)
            if matches!(
                io.kind(),
                UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe
            ) =>
        {
            CmError::Closed(io)
        }
        e => e,
    }
}

/// Accepts connections with the MPA handshake.
///
/// Handshakes run concurrently, each in its own task on the listener's core, so a peer that
/// connects and then sends nothing (or half a Request) delays nobody else. Each has a
/// deadline ([`ConnectOptions::handshake_timeout`]); the number in progress is capped per
/// listener and per source address, and a new connection over a cap evicts the oldest
/// pending handshake it competes with, so a flood can only push out its own stale
/// connections. Requests that arrived completely wait, at most
/// [`ConnectOptions::max_pending_handshakes`] of them, for [`Listener::accept`], which answers
/// them in arrival order. [`Listener::counters`] says what was refused and why.
///
/// ```no_run
/// # async fn demo() -> Result<(), barewire_soft_rdma::provider::CmError> {
/// use std::time::Duration;
/// use barewire_soft_rdma::{provider::*, verbs::*};
/// let dev = Device::new();
/// let pd = dev.alloc_pd();
/// let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
/// let opts = ConnectOptions {
///     handshake_timeout: Duration::from_secs(1),
///     max_pending_per_source: 4,
///     ..ConnectOptions::default()
/// };
/// let l = Listener::bind("0.0.0.0:9999".parse().unwrap(), opts)?;
/// loop {
///     let (qp, private_data) = l.accept(&pd, &scq, &rcq).await?;
///     // ... serve qp ...
///     # drop((qp, private_data));
///     let c = l.counters();
///     eprintln!("timed out {}, evicted {}, banned {}", c.timed_out, c.evicted, c.banned);
/// }
/// # }
/// ```
pub struct Listener {
    local: SocketAddr,
    opts: ConnectOptions,
    shared: Rc<Intake>,
    acceptor: barewire_engine::JoinHandle<()>,
}

pub use barewire_rdma_types::ListenerCounters;

/// A complete MPA Request waiting for `accept`.
struct Arrived {
    stream: TcpStream,
    request: Negotiable,
    from: std::net::IpAddr,
}

/// A peer whose Request was accepted and whose Reply has gone out: what `accept` starts the
/// queue pair from.
struct Answered {
    stream: TcpStream,
    private_data: Vec<u8>,
    from: std::net::IpAddr,
    neg: Negotiated,
}

/// The listener's state shared with its acceptor and handshake tasks.
struct Intake {
    opts: ConnectOptions,
    ready: RefCell<std::collections::VecDeque<Arrived>>,
    /// Replies sent by tasks that `accept` started, for the next `accept` to start.
    answered: RefCell<std::collections::VecDeque<Answered>>,
    waiter: RefCell<Option<std::task::Waker>>,
    /// Handshakes in progress, by source address.
    pending: barewire_engine::net::Handshakes<std::net::IpAddr>,
    /// A failure of TCP accept itself (the listener is unusable).
    failed: RefCell<Option<io::Error>>,
    counters: std::cell::Cell<ListenerCounters>,
    /// Per source address: when its recent violations happened, and until when it is refused.
    strikes: barewire_engine::net::Strikes<std::net::IpAddr>,
    /// Accepted connections still open, per source address and in all.
    open: barewire_engine::net::Connections<std::net::IpAddr>,
}

/// One accepted connection, counted against its listener's limits while it lives; also
/// where its protection violations are reported.
struct Admission {
    intake: std::rc::Weak<Intake>,
    open: barewire_engine::net::Admitted<std::net::IpAddr>,
}

impl Intake {
    fn count(&self, f: impl FnOnce(&mut ListenerCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }

    fn wake(&self) {
        if let Some(w) = self.waiter.borrow_mut().take() {
            w.wake();
        }
    }

    /// A peer from `ip` broke a protection rule; past its budget, `ip` is banned.
    fn violation(&self, ip: std::net::IpAddr) {
        self.count(|c| c.violations += 1);
        self.strikes.strike(ip, Instant::now());
    }

    /// Counts a new open connection from `ip`.
    fn admit(self: &Rc<Self>, ip: std::net::IpAddr) -> Admission {
        Admission {
            intake: Rc::downgrade(self),
            open: self.open.admit(ip),
        }
    }

    /// True while `ip` is serving a ban.
    fn banned(&self, ip: std::net::IpAddr) -> bool {
        self.strikes.banned(&ip, Instant::now())
    }
}

/// Accepts TCP connections for as long as the listener lives, each into a handshake task.
async fn acceptor(inner: TcpListener, shared: Rc<Intake>) {
    loop {
        let (stream, peer) = match inner.accept().await {
            Ok(c) => c,
            Err(e) if barewire_engine::net::accept_error_is_transient(&e) => {
                // Out of descriptors or memory for a moment: back off rather than spin; the
                // connection stays in the kernel's backlog.
                barewire_engine::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => {
                *shared.failed.borrow_mut() = Some(e);
                shared.wake();
                return;
            }
        };
        shared.count(|c| c.connections += 1);
        if shared.banned(peer.ip()) {
            shared.count(|c| c.banned += 1);
            continue; // dropped: closed at once
        }
        if shared.open.full(&peer.ip()) {
            shared.count(|c| c.over_limit += 1);
            continue;
        }
        let evicted = shared.pending.make_room(&peer.ip());
        shared.count(|c| c.evicted += evicted as u64);
        let id = shared.pending.next_id();
        let s = shared.clone();
        let task = barewire_engine::spawn_local(async move {
            let deadline = s.opts.handshake_timeout;
            match barewire_engine::time::timeout(deadline, read_mpa(&stream, MpaKind::Request))
                .await
            {
                Ok(Ok((request, _))) => {
                    let mut ready = s.ready.borrow_mut();
                    if ready.len() >= s.opts.max_pending_handshakes.max(1) {
                        s.count(|c| c.overflowed += 1);
                    } else {
                        ready.push_back(Arrived {
                            stream,
                            request,
                            from: peer.ip(),
                        });
                        drop(ready);
                        s.wake();
                    }
                }
                Ok(Err(_)) => s.count(|c| c.bad_requests += 1),
                Err(_) => s.count(|c| c.timed_out += 1),
            }
            s.pending.done(id);
        });
        shared.pending.push(id, peer.ip(), task);
    }
}

impl Listener {
    /// Listens on `addr`. Call it on the core that will accept: the handshakes run there.
    pub fn bind(addr: SocketAddr, opts: ConnectOptions) -> Result<Listener, CmError> {
        check_options(&opts)?;
        let inner = TcpListener::bind(addr)?;
        let local = inner.local_addr()?;
        let shared = Rc::new(Intake {
            opts: opts.clone(),
            ready: RefCell::new(Default::default()),
            answered: RefCell::new(Default::default()),
            waiter: RefCell::new(None),
            pending: barewire_engine::net::Handshakes::new(
                opts.max_pending_handshakes,
                opts.max_pending_per_source,
            ),
            failed: RefCell::new(None),
            counters: Default::default(),
            strikes: barewire_engine::net::Strikes::new(
                opts.violation_budget,
                opts.violation_window,
                opts.ban,
            ),
            open: barewire_engine::net::Connections::new(
                opts.max_connections,
                opts.max_connections_per_source,
            ),
        });
        let acceptor = barewire_engine::spawn_local(acceptor(inner, shared.clone()));
        Ok(Listener {
            local,
            opts,
            shared,
            acceptor,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// What the listener has refused so far, and why.
    pub fn counters(&self) -> ListenerCounters {
        self.shared.counters.get()
    }

    /// Accepts one peer: the next complete MPA Request, answered now. A peer asking for
    /// markers gets a Reply with R set and is refused.
    ///
    /// Cancel-safe: the Reply to an accepted Request is written by a task of its own, so a
    /// future dropped meanwhile (under a timeout, say) loses nothing; the connection goes to the
    /// next `accept`, which starts its queue pair with its own protection domain and queues.
    pub async fn accept(
        &self,
        pd: &ProtectionDomain,
        scq: &CompletionQueue,
        rcq: &CompletionQueue,
    ) -> Result<(QueuePair, Vec<u8>), CmError> {
        enum Next {
            Answered(Answered),
            Arrived(Arrived),
        }
        loop {
            let next = std::future::poll_fn(|cx| {
                if let Some(a) = self.shared.answered.borrow_mut().pop_front() {
                    return std::task::Poll::Ready(Ok(Next::Answered(a)));
                }
                if let Some(a) = self.shared.ready.borrow_mut().pop_front() {
                    return std::task::Poll::Ready(Ok(Next::Arrived(a)));
                }
                if let Some(e) = self.shared.failed.borrow().as_ref() {
                    return std::task::Poll::Ready(Err(io::Error::new(e.kind(), e.to_string())));
                }
                *self.shared.waiter.borrow_mut() = Some(cx.waker().clone());
                std::task::Poll::Pending
            })
            .await?;
            let Arrived {
                stream,
                request,
                from,
            } = match next {
                Next::Answered(a) => {
                    if a.stream.set_keepalive(self.opts.keepalive).is_err() {
                        // A socket that takes no options is one already gone: dropped, as a
                        // peer that hung up before `accept` would be, and the next one served.
                        continue;
                    }
                    let qp = QueuePair::start(a.stream.into_fd(), pd, scq, rcq, &self.opts, a.neg);
                    qp.inner.borrow_mut().admission = Some(self.shared.admit(a.from));
                    return Ok((qp, a.private_data));
                }
                Next::Arrived(a) => a,
            };
            let f = request.frame(MpaKind::Request);
            match negotiate(&self.opts.mpa, &f) {
                Ok(neg) => {
                    let buf = encode_frame(&our_frame(
                        MpaKind::Reply,
                        &self.opts,
                        neg.crc,
                        false,
                        neg.revision,
                    ))?;
                    let shared = self.shared.clone();
                    barewire_engine::spawn_local(async move {
                        // A peer gone before its Reply is simply not accepted.
                        if stream.write_all(buf).await.0.is_ok() {
                            shared.answered.borrow_mut().push_back(Answered {
                                stream,
                                private_data: request.private_data,
                                from,
                                neg,
                            });
                            shared.wake();
                        }
                    });
                }
                Err(reason) => {
                    // Refused: if this future is dropped meanwhile, only the refusal's report
                    // is lost.
                    let rev = self.opts.mpa.revision.min(request.revision);
                    write_frame(
                        &stream,
                        &our_frame(MpaKind::Reply, &self.opts, false, true, rev),
                    )
                    .await?;
                    return Err(CmError::Rejected {
                        reason,
                        private_data: request.private_data,
                    });
                }
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Stop accepting and drop every connection still in its handshake.
        self.acceptor.cancel();
        self.shared.pending.cancel_all();
        self.shared.ready.borrow_mut().clear();
    }
}

struct QpInner {
    qp: u32,
    stream: Stream,
    fd: OwnedFd,
    timeout: Duration,
    /// When the poller last saw bytes move (for the stall timeout; read from the clock only
    /// while the queue pair is on the active list, not per message).
    last_progress: Instant,
    /// Bytes moved since the poller last looked.
    moved: bool,
    closed: bool,
    /// Its slot in the core's provider.
    key: usize,
    /// On the provider's active list (owed bytes, or closed and waiting to be forgotten).
    listed: bool,
    /// The last receive stopped at its byte budget with bytes still in the socket: no new
    /// epoll edge will announce them, so the poller comes back to it on its next pass.
    rx_more: bool,
    /// The last transmit stopped at its byte budget with the socket still writable (so no
    /// EPOLLOUT edge will come either).
    tx_more: bool,
    /// A send failed: nothing more is sent, and the queue pair closes once its receive side
    /// has taken what the peer sent before its end (see `progress::send_failed`).
    tx_failed: bool,
    /// On an epoll core: its posts wait for the task to yield, on the provider's burst list
    /// (see `progress::joins_burst`).
    in_burst: bool,
    /// For an accepted queue pair, until it closes: its place in its listener's limits, and
    /// where a protection violation it ends on is reported.
    admission: Option<Admission>,
    /// On an io_uring core: what it has outstanding on the ring (see `ring.rs`).
    ring: Option<ring::RingOps>,
}

impl Drop for QpInner {
    fn drop(&mut self) {
        if self.ring.is_some() && !self.closed {
            // On a ring core what the last pass produced (an acknowledgement, a Read Response)
            // goes out at the next submission; hand it to the socket now, as the raw-syscall
            // path would have within the pass.
            progress::flush(self);
            // An armed receive holds the socket open: cancel it so the socket really closes.
            ring::cancel_armed(self);
        }
        if self.in_burst && !self.closed {
            // On an epoll core a burst of posts waits for the task to yield; what it queued goes
            // to the socket before the socket closes, as a ring core's does just above.
            progress::flush(self);
        }
        if self.ring.is_some() {
            // Under SQPOLL its wire sends what it still holds and goes after its operations.
            ring::detach(self);
            // The registered file table lets go of the socket, which closes with `fd`.
            ring::release_file(self);
        }
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
    if !i.listed && (i.closed || i.rx_more || i.stream.awaiting_peer()) {
        i.listed = true;
        // Its stall clock starts now (at the poller's next look).
        i.moved = true;
        let key = i.key;
        PROVIDER.with(|p| p.active.borrow_mut().push(key));
    }
}

/// A connected reliable queue pair of the software provider.
#[derive(Clone)]
pub struct QueuePair {
    inner: Rc<RefCell<QpInner>>,
    /// Its protection domain (what windows bound to it must belong to).
    pd: Rc<ProtectionDomain>,
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
            moved: false,
            closed: false,
            key: usize::MAX,
            listed: false,
            rx_more: false,
            tx_more: false,
            tx_failed: false,
            in_burst: false,
            admission: None,
            ring: None,
        }));
        let qp = QueuePair {
            inner,
            pd: Rc::new(pd.clone_handle()),
        };
        PROVIDER.with(|p| p.add(&qp));
        qp
    }

    /// Its protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
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

    /// Posts a send work request. Transmission starts at once for a task's first post in a
    /// poll; the posts it makes after that before yielding (a burst) start when it yields, all
    /// in one system call (on the epoll fallback, one `sendmsg` per queue pair), unless one
    /// leaves 1 MiB or more queued: that one goes at once too. On an io_uring core with many
    /// queue pairs, every post goes with the core's next submission, which comes as soon as
    /// the task yields. So a task that posts twice and then computes for long before yielding
    /// delays its second post until it yields.
    pub fn post_send(&self, wr: SendWr) -> Result<(), PostError> {
        barewire_engine::trace::event(barewire_engine::trace::Kind::POSTED, wr.wr_id);
        let mut i = self.inner.borrow_mut();
        i.stream.post_send(wr)?;
        if i.ring.is_some() {
            // Out now on a core with few queue pairs (the poll's first post; the rest of a
            // burst when the task yields), else with the core's next submission, which comes
            // as soon as this task yields.
            if !ring::post_now(&mut i) {
                ring::queue(&mut i);
            }
            mark_active(&mut i);
        } else if !(barewire_engine::in_runtime()
            && PROVIDER.with(|p| {
                p.core.get() == barewire_engine::core_token() && progress::joins_burst(p, &mut i)
            }))
        {
            service(&mut i, false);
        }
        Ok(())
    }

    /// Posts a send work request that goes out with the core's next progress pass (once the
    /// current task yields), together with whatever else was posted meanwhile: one system call
    /// for a burst of small messages instead of one each. Ordering with `post_send` is kept
    /// (both append to the same send queue).
    pub fn post_send_batched(&self, wr: SendWr) -> Result<(), PostError> {
        let mut i = self.inner.borrow_mut();
        i.stream.post_send(wr)?;
        if i.ring.is_some() {
            ring::queue(&mut i);
            mark_active(&mut i);
        } else if !i.listed && !i.closed {
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
        // Whatever the socket cannot take right now is flushed with the rest. (On a ring core
        // no send is ever outstanding between passes, so a direct one keeps the order.)
        progress::flush(&mut i);
        close(&mut i, WcStatus::WrFlushErr);
    }
}

pub use barewire_rdma_types::RegionDescriptor;

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
