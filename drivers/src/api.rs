//! The one API: device, protection domain, memory region, completion queue, queue pair, work
//! requests and completions, and connection setup, each an enum over the two backends so the
//! hot path is a `match`, never a virtual call.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

pub use barewire_rdma_types::{
    Access, QpState, RecvWr, RegionDescriptor, SendOp, SendWr, Sge, Stag, WcOpcode, WcStatus,
    WorkCompletion,
};
use barewire_soft_rdma as soft;
use barewire_soft_rdma::wire::MpaSettings;

use crate::shm;
use crate::transport::{Chosen, DriverConfig, DriverError, Transport, TransportDefaults};
use crate::verbs::{cm, rc};

/// An opened RDMA device: a verbs device, or the software provider.
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
    backend: DeviceBackend,
    chosen: Chosen,
}

enum DeviceBackend {
    Soft(soft::verbs::Device),
    Shm(shm::Device),
    Verbs(Rc<rc::Context>),
}

impl Device {
    /// Opens what `cfg` selects (see [`DriverConfig::select`]).
    pub fn open(cfg: &DriverConfig) -> Result<Device, DriverError> {
        let chosen = cfg.select()?;
        let backend = if chosen.transport == Transport::Soft {
            DeviceBackend::Soft(soft::verbs::Device::new())
        } else if chosen.transport == Transport::Shm {
            DeviceBackend::Shm(shm::Device::new())
        } else {
            DeviceBackend::Verbs(rc::Context::open(&chosen.device)?)
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

    /// The device name (`soft` for the software provider).
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
            ..ConnectOptions::default()
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain, DriverError> {
        Ok(match &self.backend {
            DeviceBackend::Soft(d) => ProtectionDomain::Soft(d.alloc_pd()),
            DeviceBackend::Shm(d) => ProtectionDomain::Shm(d.alloc_pd()),
            DeviceBackend::Verbs(c) => ProtectionDomain::Verbs(rc::Pd::new(c)?),
        })
    }

    /// Creates a completion queue of `depth` entries, polled by the current core.
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue, DriverError> {
        Ok(match &self.backend {
            DeviceBackend::Soft(_) | DeviceBackend::Shm(_) => {
                CompletionQueue::Soft(soft::verbs::CompletionQueue::new(depth))
            }
            DeviceBackend::Verbs(c) => CompletionQueue::Verbs(rc::Cq::new(c, depth)?),
        })
    }
}

/// A protection domain.
pub enum ProtectionDomain {
    /// The software provider's.
    Soft(soft::verbs::ProtectionDomain),
    /// rdma-core's.
    Verbs(Rc<rc::Pd>),
    /// The shared-memory backend's.
    #[allow(private_interfaces)]
    Shm(shm::Pd),
}

impl ProtectionDomain {
    /// Registers `len` bytes at `addr` with `access` rights.
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
        match self {
            // SAFETY: the caller's promise, passed on.
            ProtectionDomain::Soft(pd) => unsafe { pd.register(addr, len, access) }
                .map(MemoryRegion::Soft)
                .map_err(|e| DriverError::Unsupported(format!("register: {e:?}"))),
            ProtectionDomain::Verbs(pd) => {
                // SAFETY: the caller's promise, passed on.
                unsafe { pd.register(addr, len, access) }.map(MemoryRegion::Verbs)
            }
            ProtectionDomain::Shm(pd) => {
                // SAFETY: the caller's promise, passed on.
                unsafe { pd.register(addr, len, access) }.map(MemoryRegion::Shm)
            }
        }
    }
}

/// A registered memory region.
pub enum MemoryRegion {
    /// The software provider's.
    Soft(soft::verbs::MemoryRegion),
    /// rdma-core's.
    Verbs(rc::Mr),
    /// The shared-memory backend's.
    #[allow(private_interfaces)]
    Shm(shm::Mr),
}

impl MemoryRegion {
    /// First byte.
    pub fn addr(&self) -> *mut u8 {
        match self {
            MemoryRegion::Soft(m) => m.addr(),
            MemoryRegion::Verbs(m) => m.addr(),
            MemoryRegion::Shm(m) => m.addr(),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            MemoryRegion::Soft(m) => m.len(),
            MemoryRegion::Verbs(m) => m.len(),
            MemoryRegion::Shm(m) => m.len(),
        }
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The key local SGEs name it by.
    pub fn lkey(&self) -> Stag {
        match self {
            MemoryRegion::Soft(m) => m.stag(),
            MemoryRegion::Verbs(m) => m.lkey(),
            MemoryRegion::Shm(m) => m.stag(),
        }
    }

    /// The key a peer names it by.
    pub fn rkey(&self) -> Stag {
        match self {
            MemoryRegion::Soft(m) => m.stag(),
            MemoryRegion::Verbs(m) => m.rkey(),
            MemoryRegion::Shm(m) => m.stag(),
        }
    }

    /// Its access rights.
    pub fn access(&self) -> Access {
        match self {
            MemoryRegion::Soft(m) => m.access(),
            MemoryRegion::Verbs(m) => m.access(),
            MemoryRegion::Shm(m) => m.access(),
        }
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
        match self {
            MemoryRegion::Soft(m) => {
                m.remote_only_through_windows();
                Ok(())
            }
            MemoryRegion::Verbs(m) => m.remote_only_through_windows(),
            MemoryRegion::Shm(m) => {
                m.remote_only_through_windows();
                Ok(())
            }
        }
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
        let (rkey, inner) = match (self, qp) {
            (MemoryRegion::Soft(m), QueuePair::Soft(q)) => {
                let w = m
                    .bind_window(q.qp_num(), access)
                    .map_err(|e| DriverError::Post(format!("bind window: {e}")))?;
                (w.stag(), WindowInner::Soft(w))
            }
            (MemoryRegion::Verbs(m), QueuePair::Verbs(q)) => {
                let w = m.bind_window(q, access)?;
                (w.rkey(), WindowInner::Verbs(w))
            }
            (MemoryRegion::Shm(m), QueuePair::Shm(q)) => {
                let w = m.bind_window(q, access)?;
                (w.stag(), WindowInner::Shm(w))
            }
            _ => return Err(mismatch()),
        };
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
pub struct Window {
    desc: RegionDescriptor,
    inner: WindowInner,
}

enum WindowInner {
    Soft(soft::verbs::Window),
    Verbs(rc::Mw),
    Shm(shm::Window),
}

impl Window {
    /// What the one peer needs to address it.
    pub fn descriptor(&self) -> RegionDescriptor {
        self.desc
    }

    /// False once its region was deregistered or it was invalidated.
    pub fn is_live(&self) -> bool {
        match &self.inner {
            WindowInner::Soft(w) => w.is_live(),
            WindowInner::Verbs(w) => w.is_live(),
            WindowInner::Shm(w) => w.is_live(),
        }
    }
}

/// A completion queue. Cloning gives another handle to the same queue.
#[derive(Clone)]
pub enum CompletionQueue {
    /// The software provider's (its poller pushes completions in).
    Soft(soft::verbs::CompletionQueue),
    /// rdma-core's (the core's verbs poller moves completions in).
    Verbs(Rc<rc::Cq>),
}

impl CompletionQueue {
    fn queue(&self) -> &soft::verbs::CompletionQueue {
        match self {
            CompletionQueue::Soft(q) => q,
            CompletionQueue::Verbs(c) => c.queue(),
        }
    }

    /// Takes up to `out.len()` completions that have arrived; the number taken.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        self.queue().poll(out)
    }

    /// True if no completion is waiting.
    pub fn is_empty(&self) -> bool {
        self.queue().is_empty()
    }

    /// The next completion, waiting for it (busy-polled while the core spins, by interrupt
    /// when it sleeps).
    pub async fn next(&self) -> WorkCompletion {
        self.queue().next().await
    }
}

/// Connection settings for both backends.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Private data for the peer: how applications exchange region descriptors. The software
    /// provider carries up to 508 bytes (MPA); rdma_cm fewer (56 on InfiniBand/RoCE).
    pub private_data: Vec<u8>,
    /// How long setup, and (soft) a stalled peer, may take before failing.
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
        }
    }
}

impl ConnectOptions {
    fn soft(&self) -> soft::provider::ConnectOptions {
        soft::provider::ConnectOptions {
            mpa: MpaSettings {
                crc: self.crc,
                ird: self.ird_ord as u16,
                ord: self.ird_ord as u16,
                ..MpaSettings::default()
            },
            private_data: self.private_data.clone(),
            timeout: self.timeout,
            mulpdu: self.mulpdu,
            ..soft::provider::ConnectOptions::default()
        }
    }

    fn verbs(&self) -> cm::CmSettings {
        cm::CmSettings {
            private_data: self.private_data.clone(),
            timeout: self.timeout,
            depth: self.depth,
            max_inline: self.max_inline,
            ird: self.ird_ord,
            ord: self.ird_ord,
            tos: self.tos,
        }
    }
}

fn cm_error(e: soft::provider::CmError) -> DriverError {
    match e {
        soft::provider::CmError::Rejected { private_data, .. } => {
            DriverError::Rejected { private_data }
        }
        e => DriverError::Connect(e.to_string()),
    }
}

fn mismatch() -> DriverError {
    DriverError::Unsupported("objects from two different backends were mixed in one call".into())
}

/// A connected reliable queue pair. Cloning gives another handle to the same queue pair; it
/// disconnects when the last handle goes.
#[derive(Clone)]
pub enum QueuePair {
    /// The software provider's.
    Soft(soft::provider::QueuePair),
    /// rdma-core's.
    Verbs(Rc<cm::Qp>),
    /// The shared-memory backend's.
    #[allow(private_interfaces)]
    Shm(shm::Qp),
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
    match (pd, scq, rcq) {
        (ProtectionDomain::Soft(pd), CompletionQueue::Soft(s), CompletionQueue::Soft(r)) => {
            let (qp, data) = soft::provider::connect(addr, pd, s, r, opts.soft())
                .await
                .map_err(cm_error)?;
            // Posted before this task yields, so before the provider reads anything the peer
            // sent after the handshake.
            for wr in &opts.initial_recvs {
                qp.post_recv(wr.clone())
                    .map_err(|e| DriverError::Post(e.to_string()))?;
            }
            Ok((QueuePair::Soft(qp), data))
        }
        (ProtectionDomain::Verbs(pd), CompletionQueue::Verbs(s), CompletionQueue::Verbs(r)) => {
            let (qp, data) =
                cm::Qp::connect(addr, pd, s, r, &opts.verbs(), &opts.initial_recvs).await?;
            Ok((QueuePair::Verbs(qp), data))
        }
        (ProtectionDomain::Shm(pd), CompletionQueue::Soft(s), CompletionQueue::Soft(r)) => {
            let (qp, data) = shm::connect(addr, pd, s, r, &opts.private_data, opts.timeout).await?;
            for wr in &opts.initial_recvs {
                qp.post_recv(wr.clone())?;
            }
            Ok((QueuePair::Shm(qp), data))
        }
        _ => Err(mismatch()),
    }
}

impl QueuePair {
    /// True when incoming data is placed by this core's own progress poller (the software
    /// provider), in stream order: a poller registered after the provider's then sees an RDMA
    /// WRITE's bytes in the same pass that delivered them, and the socket that carried them
    /// wakes a sleeping core. On verbs the NIC places data on its own, with no event unless
    /// the sender asks for a completion (WRITE with immediate).
    pub fn places_on_this_core(&self) -> bool {
        matches!(self, QueuePair::Soft(_))
    }

    /// Posts a send work request (Send, Write, Read, atomics, local invalidate).
    pub fn post_send(&self, wr: SendWr) -> Result<(), DriverError> {
        match self {
            QueuePair::Soft(q) => q
                .post_send(wr)
                .map_err(|e| DriverError::Post(e.to_string())),
            QueuePair::Verbs(q) => q.post_send(&wr),
            QueuePair::Shm(q) => q.post_send(wr),
        }
    }

    /// Posts a send work request to be transmitted with the next progress pass, batched with
    /// others posted before the current task yields (the software provider's one system call
    /// per burst; on verbs the same as `post_send`, whose doorbell is already cheap).
    pub fn post_send_batched(&self, wr: SendWr) -> Result<(), DriverError> {
        match self {
            QueuePair::Soft(q) => q
                .post_send_batched(wr)
                .map_err(|e| DriverError::Post(e.to_string())),
            QueuePair::Verbs(q) => q.post_send(&wr),
            QueuePair::Shm(q) => q.post_send(wr),
        }
    }

    /// Posts a receive.
    pub fn post_recv(&self, wr: RecvWr) -> Result<(), DriverError> {
        match self {
            QueuePair::Soft(q) => q
                .post_recv(wr)
                .map_err(|e| DriverError::Post(e.to_string())),
            QueuePair::Verbs(q) => q.post_recv(&wr),
            QueuePair::Shm(q) => q.post_recv(wr),
        }
    }

    /// Disconnects: outstanding work completes with `WrFlushErr`.
    pub fn disconnect(&self) {
        match self {
            QueuePair::Soft(q) => q.disconnect(),
            QueuePair::Verbs(q) => q.disconnect(),
            QueuePair::Shm(q) => q.disconnect(),
        }
    }

    /// Its state.
    pub fn state(&self) -> QpState {
        match self {
            QueuePair::Soft(q) => q.state(),
            QueuePair::Verbs(q) => q.state(),
            QueuePair::Shm(q) => q.state(),
        }
    }

    /// Its number.
    pub fn qp_num(&self) -> u32 {
        match self {
            QueuePair::Soft(q) => q.qp_num(),
            QueuePair::Verbs(q) => q.qp_num(),
            QueuePair::Shm(q) => q.qp_num(),
        }
    }
}

/// Accepts connections.
pub enum Listener {
    /// The software provider's (TCP + MPA).
    Soft(soft::provider::Listener),
    /// librdmacm's.
    Verbs(cm::Listener),
    /// The shared-memory backend's.
    #[allow(private_interfaces)]
    Shm(shm::Listener),
}

impl Listener {
    /// Listens on `addr` with the device's backend; `opts.private_data` goes to each peer.
    pub fn bind(
        dev: &Device,
        addr: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Listener, DriverError> {
        Ok(match dev.backend {
            DeviceBackend::Soft(_) => {
                Listener::Soft(soft::provider::Listener::bind(addr, opts.soft()).map_err(cm_error)?)
            }
            DeviceBackend::Verbs(_) => Listener::Verbs(cm::Listener::bind(addr, opts.verbs())?),
            DeviceBackend::Shm(_) => {
                Listener::Shm(shm::Listener::bind(addr, &opts.private_data, opts.timeout)?)
            }
        })
    }

    /// The bound port.
    pub fn port(&self) -> u16 {
        match self {
            Listener::Soft(l) => l.local_addr().map(|a| a.port()).unwrap_or(0),
            Listener::Verbs(l) => l.port(),
            Listener::Shm(l) => l.port(),
        }
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
        match (self, pd, scq, rcq) {
            (
                Listener::Soft(l),
                ProtectionDomain::Soft(pd),
                CompletionQueue::Soft(s),
                CompletionQueue::Soft(r),
            ) => {
                let (qp, data) = l.accept(pd, s, r).await.map_err(cm_error)?;
                for wr in recvs {
                    qp.post_recv(wr)
                        .map_err(|e| DriverError::Post(e.to_string()))?;
                }
                Ok((QueuePair::Soft(qp), data))
            }
            (
                Listener::Verbs(l),
                ProtectionDomain::Verbs(pd),
                CompletionQueue::Verbs(s),
                CompletionQueue::Verbs(r),
            ) => {
                let (qp, data) = l.accept(pd, s, r, &recvs).await?;
                Ok((QueuePair::Verbs(qp), data))
            }
            (
                Listener::Shm(l),
                ProtectionDomain::Shm(pd),
                CompletionQueue::Soft(s),
                CompletionQueue::Soft(r),
            ) => {
                let (qp, data) = l.accept(pd, s, r).await?;
                for wr in recvs {
                    qp.post_recv(wr)?;
                }
                Ok((QueuePair::Shm(qp), data))
            }
            _ => Err(mismatch()),
        }
    }
}
