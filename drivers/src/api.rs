//! The one API: device, protection domain, memory region, completion queue, queue pair, work
//! requests and completions, and connection setup. Each object holds its backend's object
//! behind the traits of [`crate::backend`], which verbs, soft and shm implement.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

pub use barewire_rdma_types::{
    Access, ListenerCounters, QpState, RecvWr, RegionDescriptor, SendOp, SendWr, Sge, Sges, Stag,
    WcOpcode, WcStatus, WorkCompletion,
};

use crate::backend::{DeviceOps, ListenerOps, MrOps, PdOps, QpOps, WindowOps};
use crate::ops::MappedRemote;
use crate::transport::{Chosen, DriverConfig, DriverError, Transport, TransportDefaults};

/// An opened RDMA device: a verbs device, the software provider, or shared memory.
///
/// ```
/// use barewire_drivers::{Device, DriverConfig};
/// // BAREWIRE_DRIVER=soft (or no RDMA hardware and the default `auto`) opens the software
/// // provider; a verbs request with no device is a clear error.
/// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// assert_eq!(dev.name(), "soft");
/// let pd = dev.alloc_pd().unwrap();
/// let cq = dev.create_cq(64).unwrap();
/// # let _ = (pd, cq);
/// ```
pub struct Device {
    backend: Box<dyn DeviceOps>,
    chosen: Chosen,
}

impl Device {
    /// Opens what `cfg` selects (see [`DriverConfig::select`]).
    pub fn open(cfg: &DriverConfig) -> Result<Device, DriverError> {
        let chosen = cfg.select()?;
        let backend: Box<dyn DeviceOps> = match chosen.transport {
            Transport::Soft if chosen.same_host_shm => Box::new(crate::shm::Device::auto()),
            Transport::Soft => Box::new(crate::soft::Device::new()),
            Transport::Shm => Box::new(crate::shm::Device::new()),
            t => Box::new(crate::verbs::backend::Device::open(&chosen.device, t)?),
        };
        Ok(Device { backend, chosen })
    }

    /// Opens what `BAREWIRE_DRIVER` and `BAREWIRE_DEVICE` ask for (`auto` by default).
    pub fn from_env() -> Result<Device, DriverError> {
        Device::open(&DriverConfig::from_env()?)
    }

    /// The transport in use.
    pub fn transport(&self) -> Transport {
        self.chosen.transport
    }

    /// The device name (`soft` for the software provider, `shm` for shared memory).
    pub fn name(&self) -> &str {
        &self.chosen.device
    }

    /// The transport's defaults.
    pub fn defaults(&self) -> TransportDefaults {
        self.chosen.defaults
    }

    /// Connection settings from this device's transport defaults (and their overrides): queue
    /// depth, the software provider's MULPDU from `mtu`, and RoCE v2's traffic class. Path MTU
    /// and source GID on verbs come from rdma_cm's address and route resolution.
    pub fn connect_options(&self) -> ConnectOptions {
        let d = self.chosen.defaults;
        ConnectOptions {
            depth: d.queue_depth,
            mulpdu: if self.chosen.transport == Transport::Soft {
                d.mtu as usize
            } else {
                16 * 1024
            },
            tos: (self.chosen.transport == Transport::RoCEv2 && d.traffic_class != 0)
                .then_some(d.traffic_class),
            crc: d.crc,
            keepalive: d.keepalive,
            ..ConnectOptions::default()
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, DriverError> {
        Ok(ProtectionDomain {
            ops: self.backend.alloc_pd()?,
        })
    }

    /// Creates a completion queue of `depth` entries, polled by the current core.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue, DriverError> {
        if depth == 0 {
            // verbs refuses one (EINVAL); elsewhere its first completion would overrun it.
            return Err(DriverError::Unsupported(
                "a completion queue of 0 entries".into(),
            ));
        }
        self.backend.create_cq(depth)
    }
}

/// A protection domain: the regions and queue pairs that may be used together. A key of one
/// domain is refused on a queue pair of another.
///
/// ```
/// use barewire_drivers::{Access, Buffer, Device, DriverConfig};
/// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// // Memory barewire allocates and registers in one step...
/// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
/// // ...or the application's own, registered for as long as it lives.
/// let mut mine = vec![0u8; 4096];
/// // SAFETY: `mine` outlives the region (dropped first, below).
/// let mr = unsafe { pd.register(mine.as_mut_ptr(), mine.len(), Access::LOCAL_WRITE) }.unwrap();
/// assert_eq!((mr.len(), buf.len()), (4096, 4096));
/// drop(mr);
/// ```
pub struct ProtectionDomain {
    pub(crate) ops: Box<dyn PdOps>,
}

impl ProtectionDomain {
    /// Registers `len` bytes at `addr` with `access` rights.
    ///
    /// On shm, remote rights need memory a [`crate::Buffer`] of this domain holds (a peer
    /// process maps it); other memory is refused with an error that says so.
    ///
    /// # Safety
    /// The memory must stay valid (not freed, not moved) while the region lives: a peer or a
    /// posted work request may read or write it at any time the access rights allow.
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, DriverError> {
        // SAFETY: the caller's promise, passed on.
        let ops = unsafe { self.ops.register(addr, len, access) }?;
        Ok(MemoryRegion { ops })
    }
}

/// A registered memory region.
///
/// ```
/// use barewire_drivers::{Access, Buffer, Device, DriverConfig};
/// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let buf = Buffer::new(&pd, 8192, 4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
/// let mr = buf.region();
/// // What a peer needs to write into it (sent in private data, or in a message):
/// let desc = mr.descriptor();
/// assert_eq!((desc.addr, desc.len), (mr.addr() as u64, 8192));
/// // What a local work request names: a slice of it.
/// let sge = buf.sge(4096, 100);
/// assert_eq!((sge.len, sge.lkey), (100, mr.lkey()));
/// ```
pub struct MemoryRegion {
    ops: Box<dyn MrOps>,
}

impl MemoryRegion {
    /// First byte.
    pub fn addr(&self) -> *mut u8 {
        self.ops.addr()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key local SGEs name it by.
    pub fn lkey(&self) -> Stag {
        self.ops.lkey()
    }

    /// The key a peer names it by.
    pub fn rkey(&self) -> Stag {
        self.ops.rkey()
    }

    /// Its access rights.
    pub fn access(&self) -> Access {
        self.ops.access()
    }

    /// What a peer needs to address it.
    pub fn descriptor(&self) -> RegionDescriptor {
        RegionDescriptor {
            rkey: self.rkey(),
            addr: self.addr() as u64,
            len: self.len() as u64,
        }
    }

    /// Makes the region's own key useless to every peer, so that remote access goes only
    /// through windows ([`bind_window`](Self::bind_window)). Local use is unchanged.
    ///
    /// On verbs the region is re-registered with local rights only (`ibv_rereg_mr`), so its
    /// keys change: call this before handing out its local key. A device without type 2
    /// memory windows (siw, for one) gives [`DriverError::Unsupported`], and the region keeps
    /// its remote rights.
    pub fn remote_only_through_windows(&self) -> Result<(), DriverError> {
        self.ops.remote_only_through_windows()
    }

    /// A window over the whole region for `qp` alone, granting `access` (remote rights the
    /// region has): iWARP type 2 memory window semantics. Its descriptor is what to send the
    /// peer on that connection; any other connection presenting it is refused with a
    /// protection error. It lasts until dropped or until the region is.
    ///
    /// On verbs it is a type 2 memory window (`ibv_alloc_mw(3)`), bound by a work request on
    /// `qp`'s send queue, so it is in force before anything posted on `qp` after it; a device
    /// without them gives [`DriverError::Unsupported`].
    pub fn bind_window(&self, qp: &QueuePair, access: Access) -> Result<Window, DriverError> {
        let (rkey, inner) = self.ops.bind_window(&*qp.ops, access)?;
        Ok(Window {
            desc: RegionDescriptor {
                rkey,
                addr: self.addr() as u64,
                len: self.len() as u64,
            },
            inner,
        })
    }

    /// An SGE for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        Sge {
            addr: self.addr() as u64 + offset as u64,
            len: len as u32,
            lkey: self.lkey(),
        }
    }
}

/// A window bound in a [`MemoryRegion`] for one queue pair (see
/// [`MemoryRegion::bind_window`]). Dropping it invalidates its key.
///
/// ```
/// # barewire_engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # use barewire_drivers::*;
/// # let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// # let l = Listener::bind(&dev, "127.0.0.1:0".parse().unwrap(), &dev.connect_options()).unwrap();
/// # let at = std::net::SocketAddr::from(([127, 0, 0, 1], l.port()));
/// # let (lcq, lrcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
/// # let pd2 = dev.alloc_pd().unwrap();
/// # let far = barewire_engine::spawn_local(async move {
/// #     let (qp, _) = l.accept(&pd2, &lcq, &lrcq).await.unwrap();
/// #     (qp, lcq, lrcq, pd2, l)
/// # });
/// # let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
/// # let (qp, _) = connect(at, &pd, &scq, &rcq, &dev.connect_options()).await.unwrap();
/// # let (peer_qp, peer_scq, peer_rcq, peer_pd, _l) = far.await.unwrap();
/// let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
/// let buf = Buffer::new(&pd, 4096, 64, all).unwrap();
/// // A key for this one connection; the region's own key stays private.
/// let w = buf.region().bind_window(&qp, Access::REMOTE_READ).unwrap();
/// assert!(w.is_live());
/// assert_ne!(w.descriptor().rkey, buf.descriptor().rkey);
/// drop(w); // the peer's key is dead from here on
/// # drop((peer_qp, peer_scq, peer_rcq, peer_pd));
/// # });
/// ```
pub struct Window {
    desc: RegionDescriptor,
    inner: Box<dyn WindowOps>,
}

impl Window {
    /// What the one peer needs to address it.
    pub fn descriptor(&self) -> RegionDescriptor {
        self.desc
    }

    /// False once its region was deregistered or it was invalidated.
    pub fn is_live(&self) -> bool {
        self.inner.is_live()
    }
}

/// A completion queue. Cloning gives another handle to the same queue.
///
/// ```
/// # barewire_engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # use barewire_drivers::*;
/// # let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// # let l = Listener::bind(&dev, "127.0.0.1:0".parse().unwrap(), &dev.connect_options()).unwrap();
/// # let at = std::net::SocketAddr::from(([127, 0, 0, 1], l.port()));
/// # let (lcq, lrcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
/// # let pd2 = dev.alloc_pd().unwrap();
/// # let far = barewire_engine::spawn_local(async move {
/// #     let (qp, _) = l.accept(&pd2, &lcq, &lrcq).await.unwrap();
/// #     (qp, lcq, lrcq, pd2, l)
/// # });
/// # let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
/// # let (qp, _) = connect(at, &pd, &scq, &rcq, &dev.connect_options()).await.unwrap();
/// # let (peer_qp, peer_scq, peer_rcq, peer_pd, _l) = far.await.unwrap();
/// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
/// let peer_buf = Buffer::new(&peer_pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
/// let sges = [peer_buf.sge(0, 4096)].into_iter().collect();
/// peer_qp.post_recv(RecvWr { wr_id: 9, sges }).unwrap();
/// buf.write_at(0, b"ping");
/// let send = SendOp::Send { solicited: false, invalidate: None };
/// let sges = [buf.sge(0, 4)].into_iter().collect();
/// qp.post_send(SendWr { wr_id: 1, op: send, sges, signaled: true, fence: false }).unwrap();
/// // Wait for one completion on each side (or `poll` for what is there now).
/// let (sent, got) = (scq.next().await, peer_rcq.next().await);
/// assert_eq!((sent.wr_id, sent.status), (1, WcStatus::Success));
/// assert_eq!((got.wr_id, got.byte_len, got.opcode), (9, 4, WcOpcode::Recv));
/// # drop(peer_scq);
/// # });
/// ```
#[derive(Clone)]
pub struct CompletionQueue {
    queue: barewire_rdma_types::CompletionQueue,
    /// The device queue behind it, where there is one (verbs: the core's verbs poller moves
    /// its completions into `queue`).
    device: Option<Rc<dyn std::any::Any>>,
}

impl CompletionQueue {
    /// A queue its backend's poller pushes completions into.
    pub(crate) fn new(queue: barewire_rdma_types::CompletionQueue) -> CompletionQueue {
        CompletionQueue {
            queue,
            device: None,
        }
    }

    /// A queue fed from a device queue.
    pub(crate) fn with_device(
        queue: barewire_rdma_types::CompletionQueue,
        device: Rc<dyn std::any::Any>,
    ) -> CompletionQueue {
        CompletionQueue {
            queue,
            device: Some(device),
        }
    }

    /// The queue completions arrive in.
    pub(crate) fn queue(&self) -> &barewire_rdma_types::CompletionQueue {
        &self.queue
    }

    /// The device queue behind it, if any.
    pub(crate) fn device(&self) -> Option<&Rc<dyn std::any::Any>> {
        self.device.as_ref()
    }

    /// Takes up to `out.len()` completions that have arrived; the number taken.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.queue.poll(out)
    }

    /// True if no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// The most completions it holds; one more overflows it, and the queue pairs using it
    /// go to ERROR.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// The next completion, waiting for it (busy-polled while the core spins, by interrupt
    /// when it sleeps).
    #[inline]
    pub fn next(&self) -> barewire_rdma_types::Next<'_> {
        self.queue.next()
    }
}

/// Connection settings for both backends.
///
/// ```
/// use barewire_drivers::{Access, Buffer, ConnectOptions, Device, DriverConfig};
/// use std::time::Duration;
/// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// let pd = dev.alloc_pd().unwrap();
/// let table = Buffer::new(&pd, 1 << 20, 4096, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
/// let opts = ConnectOptions {
///     // The peer learns where to read in the connection's setup.
///     private_data: table.descriptor().to_bytes().to_vec(),
///     // A peer across a slow link gets longer to answer.
///     timeout: Duration::from_secs(5),
///     ..dev.connect_options() // the transport's defaults for the rest
/// };
/// assert_eq!(opts.private_data.len(), 20);
/// ```
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Private data for the peer: how applications exchange region descriptors. The software
    /// provider carries up to 508 bytes (MPA); rdma_cm fewer (56 on InfiniBand/RoCE).
    pub private_data: Vec<u8>,
    /// How long setup may take before failing: a connect whose peer has not accepted within
    /// it fails (a listener that is stopped, overloaded or not barewire's is an error after
    /// this, not a hang), and a listener drops a connection whose request has not arrived
    /// (soft and shm; verbs bounds address and route resolution with it, and rdma_cm the
    /// rest). On soft, also how long a queue pair that is owed bytes may go without progress;
    /// on shm, how long a peer may leave a Send or a key request unlooked at (a running peer
    /// that holds a Send for want of a receive is waited for without limit).
    pub timeout: Duration,
    /// Send and receive queue depth (verbs; the software provider's queues grow as needed).
    pub depth: u32,
    /// Largest inline send (verbs).
    pub max_inline: u32,
    /// Outstanding RDMA Reads and atomics per direction (IRD/ORD).
    pub ird_ord: u8,
    /// Ask for MPA CRC32c (soft). On by default, as in the software provider's own settings
    /// and [`TransportDefaults::crc`](crate::TransportDefaults::crc); off only for trusted
    /// links (`BAREWIRE_CRC=off`, or [`DriverConfig::crc`](crate::DriverConfig::crc)).
    pub crc: bool,
    /// Largest ULPDU the software provider sends (its "MTU").
    pub mulpdu: usize,
    /// IP type of service for the connection (RoCE v2 traffic class, DSCP << 2).
    pub tos: Option<u8>,
    /// Receives posted on the new queue pair before the peer can send anything (`connect`;
    /// `Listener::accept_with_recvs` takes its own per connection). Their memory must stay
    /// registered until they complete.
    pub initial_recvs: Vec<RecvWr>,
    /// How long a connection may go without a sign of the peer's host before it fails, idle
    /// or not: the software provider's TCP keepalive (see
    /// [`TransportDefaults::keepalive`](crate::TransportDefaults::keepalive); verbs and shm
    /// do not use it).
    pub keepalive: Option<Duration>,
    /// A listener's defences against floods and key guessers (soft and shm).
    pub limits: ListenerLimits,
}

/// A listener's defences against floods and key guessers, on soft (per source address) and
/// shm (per process, which any local process can reach through the listener's name). The
/// defaults suit a server open to many peers. One that takes many connections from one peer,
/// say hundreds of queue pairs between two processes, raises the per-source limits.
/// ([`Listener::counters`] says what they refused; rdma_cm on verbs has defences of its own.)
///
/// ```
/// use barewire_drivers::{ConnectOptions, ListenerLimits};
/// let opts = ConnectOptions {
///     limits: ListenerLimits { max_connections_per_source: 1024, ..ListenerLimits::default() },
///     ..ConnectOptions::default()
/// };
/// assert_eq!(opts.limits.max_connections_per_source, 1024);
/// assert_eq!(opts.limits.max_setups_per_source, 16);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Setups in progress at once (each has [`ConnectOptions::timeout`] to finish); a new
    /// connection beyond it evicts the oldest. Default 128.
    pub max_setups: usize,
    /// Setups in progress at once from one source; beyond it, the oldest from that source is
    /// evicted, so one source cannot fill the listener. Default 16.
    pub max_setups_per_source: usize,
    /// Accepted connections open at once; a new one beyond it is closed at once (its connect
    /// fails saying so). A connection that failed no longer counts. Default 4,096.
    pub max_connections: usize,
    /// Accepted connections open at once from one source. Default 256.
    pub max_connections_per_source: usize,
    /// Protection violations (an access with a key the peer may not use) one source may
    /// commit within [`violation_window`](Self::violation_window) before it is refused for
    /// [`ban`](Self::ban). Default 8.
    pub violation_budget: usize,
    /// See [`violation_budget`](Self::violation_budget). Default 10 s.
    pub violation_window: Duration,
    /// See [`violation_budget`](Self::violation_budget). Default 60 s.
    pub ban: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            max_setups: 128,
            max_setups_per_source: 16,
            max_connections: 4096,
            max_connections_per_source: 256,
            violation_budget: 8,
            violation_window: Duration::from_secs(10),
            ban: Duration::from_secs(60),
        }
    }
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            private_data: Vec::new(),
            timeout: Duration::from_secs(1),
            depth: 256,
            max_inline: 64,
            ird_ord: 16,
            crc: true,
            mulpdu: 16 * 1024,
            tos: None,
            initial_recvs: Vec::new(),
            keepalive: crate::DEFAULT_KEEPALIVE,
            limits: ListenerLimits::default(),
        }
    }
}

/// A connected reliable queue pair. Cloning gives another handle to the same queue pair; it
/// disconnects when the last handle goes.
///
/// Work requests as verbs has them: posted, carried out in order, completed on the completion
/// queues. ([`Endpoint`](crate::Endpoint) wraps this in futures.)
///
/// ```
/// # barewire_engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # use barewire_drivers::*;
/// # let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// # let pd = dev.alloc_pd().unwrap();
/// # let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
/// # let pd2 = dev.alloc_pd().unwrap();
/// # let peer_mem = Buffer::new(&pd2, 4096, 64, all).unwrap();
/// # let private_data = peer_mem.descriptor().to_bytes().to_vec();
/// # let opts = ConnectOptions { private_data, ..dev.connect_options() };
/// # let l = Listener::bind(&dev, "127.0.0.1:0".parse().unwrap(), &opts).unwrap();
/// # let at = std::net::SocketAddr::from(([127, 0, 0, 1], l.port()));
/// # let (lcq, lrcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
/// # let far = barewire_engine::spawn_local(async move {
/// #     let (qp, _) = l.accept(&pd2, &lcq, &lrcq).await.unwrap();
/// #     (qp, lcq, lrcq, peer_mem, pd2, l)
/// # });
/// # let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
/// # let (qp, private) = connect(at, &pd, &scq, &rcq, &dev.connect_options()).await.unwrap();
/// # let _peer = far.await.unwrap();
/// // The peer's region, from the private data it sent at connection.
/// let theirs = RegionDescriptor::from_bytes(&private).unwrap();
/// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
/// buf.write_at(0, b"over the wire");
/// let write = SendOp::Write { remote_addr: theirs.addr + 100, rkey: theirs.rkey };
/// let read = SendOp::Read { remote_addr: theirs.addr + 100, rkey: theirs.rkey };
/// let wr = |wr_id, op, sge| {
///     let sges = [sge].into_iter().collect();
///     SendWr { wr_id, op, sges, signaled: true, fence: false }
/// };
/// qp.post_send(wr(1, write, buf.sge(0, 13))).unwrap();
/// qp.post_send(wr(2, read, buf.sge(1024, 13))).unwrap(); // after the Write, in order
/// for id in [1, 2] {
///     let wc = scq.next().await;
///     assert_eq!((wc.wr_id, wc.status), (id, WcStatus::Success));
/// }
/// let mut back = [0u8; 13];
/// buf.read_at(1024, &mut back);
/// assert_eq!(&back, b"over the wire");
/// assert_eq!(qp.state(), QpState::Rts);
/// # });
/// ```
#[derive(Clone)]
pub struct QueuePair {
    pub(crate) ops: Rc<dyn QpOps>,
}

/// Connects to a listening peer; returns the queue pair and the peer's private data.
///
/// ```no_run
/// # async fn demo() -> Result<(), barewire_drivers::DriverError> {
/// use barewire_drivers::*;
/// let dev = Device::from_env()?;
/// let pd = dev.alloc_pd()?;
/// let (scq, rcq) = (dev.create_cq(256)?, dev.create_cq(256)?);
/// let (qp, peer_data) =
///     connect("127.0.0.1:7471".parse().unwrap(), &pd, &scq, &rcq, &ConnectOptions::default())
///         .await?;
/// # let _ = (qp, peer_data); Ok(()) }
/// ```
pub async fn connect(
    addr: SocketAddr,
    pd: &ProtectionDomain,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    opts: &ConnectOptions,
) -> Result<(QueuePair, Vec<u8>), DriverError> {
    pd.ops.connect(addr, scq, rcq, opts).await
}

impl QueuePair {
    pub(crate) fn new(ops: impl QpOps) -> QueuePair {
        QueuePair { ops: Rc::new(ops) }
    }

    /// Asks that the peer's RDMA WRITEs into this side's memory may be watched: from now on
    /// each WRITE's bytes become visible in ascending address order (a watcher that sees a
    /// byte land sees every earlier byte of the same WRITE), and a WRITE that lands while this
    /// core sleeps wakes it, so a [`Poller`](barewire_engine::Poller) that looks at the memory
    /// in `pure_poll` and each pass sees it. Returns false where the transport cannot promise
    /// this, and nothing changes: on verbs the NIC places data with no event and no order, so
    /// the peer must announce data (WRITE with immediate).
    ///
    /// The software provider places data in stream order from this core's own poller, so it
    /// always can. On shm the peer's CPU copies: once asked, its WRITEs to this side use an
    /// ordered copy and look at this core's sleep flag afterwards (a fence per WRITE), which
    /// is why it is asked for rather than always on.
    ///
    /// ```no_run
    /// # fn demo(qp: &barewire_drivers::QueuePair) {
    /// let polled = qp.watch_memory(); // otherwise: post receives, ask for immediate data
    /// # let _ = polled; }
    /// ```
    pub fn watch_memory(&self) -> bool {
        self.ops.watch_memory()
    }

    /// Posts a send work request (Send, Write, Read, atomics, local invalidate).
    pub fn post_send(&self, wr: SendWr) -> Result<(), DriverError> {
        self.ops.post_send(wr)
    }

    /// Posts a send work request to be transmitted with the next progress pass, batched with
    /// others posted before the current task yields (the software provider's one system call
    /// per burst; on verbs and shm the same as `post_send`, whose doorbell is already cheap).
    pub fn post_send_batched(&self, wr: SendWr) -> Result<(), DriverError> {
        self.ops.post_send_batched(wr)
    }

    /// Posts a receive.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DriverError> {
        self.ops.post_recv(wr)
    }

    /// Disconnects: outstanding work completes with `WrFlushErr`.
    pub fn disconnect(&self) {
        self.ops.disconnect()
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        self.ops.state()
    }

    /// Its number.
    pub fn qp_num(&self) -> u32 {
        self.ops.qp_num()
    }

    /// How many send work requests its send queue holds, where it is bounded: on verbs, what
    /// the device granted for `ConnectOptions::depth`. An unsignaled request keeps its slot
    /// until a later signaled one completes, so a queue that only ever gets unsignaled
    /// requests fills up (see [`Endpoint::post_unsignaled`](crate::Endpoint::post_unsignaled),
    /// which signals one in time). `None` on the software provider and shm, whose send queues
    /// grow as needed.
    ///
    /// ```no_run
    /// # fn demo(qp: &barewire_drivers::QueuePair) {
    /// let slots = qp.send_queue_depth().unwrap_or(usize::MAX);
    /// # let _ = slots; }
    /// ```
    pub fn send_queue_depth(&self) -> Option<usize> {
        self.ops.send_queue_depth()
    }

    /// The peer's registered region `region` mapped into this process, for storing into it
    /// directly with no work request (see [`MappedRemote`]): only on shm, only once the peer
    /// has granted the key to this queue pair (any Write or Read naming it asks; the grant
    /// arrives with the peer's answer), and only for a writable grant that covers the whole
    /// descriptor. `None` otherwise, and on the other transports: post Writes instead.
    ///
    /// A store through the mapping costs what a store costs; a posted Write of the same bytes
    /// adds the work request, its checks and the send queue (15–20 ns a hop on this project's
    /// test host, `barewire-perf write_lat --driver shm --floor-slices N`), and a completion
    /// where one is asked for.
    ///
    /// ```no_run
    /// # fn demo(qp: &barewire_drivers::QueuePair, ring: barewire_drivers::RegionDescriptor) {
    /// if let Some(m) = qp.map_remote(&ring) {
    ///     let record = m.span(0, 12); // checked once, for both stores
    ///     record.write(0, b"hello");
    ///     record.store_u32_le(8, 1); // seen after the five bytes before it
    ///     m.wake_peer();
    /// }
    /// # }
    /// ```
    pub fn map_remote(&self, region: &RegionDescriptor) -> Option<MappedRemote> {
        self.ops.map_remote(region)
    }

    /// The transport it runs over: under `auto`, [`Transport::Shm`] for a peer on this host
    /// and network namespace, the software provider or the verbs device's transport for others.
    pub fn transport(&self) -> Transport {
        self.ops.transport()
    }
}

/// Accepts connections.
///
/// ```
/// # barewire_engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// use barewire_drivers::{connect, Device, DriverConfig, Listener};
/// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
/// let mut opts = dev.connect_options();
/// opts.private_data = b"hello from the listener".to_vec();
/// let l = Listener::bind(&dev, "127.0.0.1:0".parse().unwrap(), &opts).unwrap();
/// let at = std::net::SocketAddr::from(([127, 0, 0, 1], l.port()));
/// let client = barewire_engine::spawn_local(async move {
///     let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
///     let pd = dev.alloc_pd().unwrap();
///     let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
///     let (_qp, theirs) = connect(at, &pd, &scq, &rcq, &dev.connect_options()).await.unwrap();
///     theirs
/// });
/// let pd = dev.alloc_pd().unwrap();
/// let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
/// let (qp, _theirs) = l.accept(&pd, &scq, &rcq).await.unwrap();
/// assert_eq!(client.await.unwrap(), b"hello from the listener");
/// drop(qp);
/// # });
/// ```
pub struct Listener {
    ops: Box<dyn ListenerOps>,
}

impl Listener {
    /// Listens on `addr` with the device's backend; `opts.private_data` goes to each peer.
    pub fn bind(
        dev: &Device,
        addr: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Listener, DriverError> {
        let ops = dev.backend.listen(addr, opts).map_err(|e| match e {
            DriverError::Connect(why) => DriverError::Listen { addr, why },
            DriverError::Verbs { call, error } => DriverError::Listen {
                addr,
                why: format!("{call}: {error}"),
            },
            e => e,
        })?;
        Ok(Listener { ops })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        self.ops.port()
    }

    /// What the listener took in and refused, and why, since it was bound: connections whose
    /// setup timed out, was malformed or came from another user, setups pushed out by newer
    /// ones over the listener's caps, and complete setups dropped because `accept` fell
    /// behind. Soft counts its TCP connections and shm its local ones (`auto` adds the two);
    /// rdma_cm keeps no such counts, so on verbs they stay zero.
    pub fn counters(&self) -> ListenerCounters {
        self.ops.counters()
    }

    /// Accepts one peer: its queue pair and private data.
    pub async fn accept(
        &self,
        pd: &ProtectionDomain,
        scq: &CompletionQueue,
        rcq: &CompletionQueue,
    ) -> Result<(QueuePair, Vec<u8>), DriverError> {
        self.accept_with_recvs(pd, scq, rcq, Vec::new()).await
    }

    /// As [`accept`](Self::accept), posting `recvs` on the new queue pair before the peer can
    /// send anything.
    pub async fn accept_with_recvs(
        &self,
        pd: &ProtectionDomain,
        scq: &CompletionQueue,
        rcq: &CompletionQueue,
        recvs: Vec<RecvWr>,
    ) -> Result<(QueuePair, Vec<u8>), DriverError> {
        self.ops.accept(&*pd.ops, scq, rcq, recvs).await
    }
}
