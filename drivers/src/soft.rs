//! The `soft` backend: barewire's software RDMA provider (iWARP over TCP through the engine),
//! behind the traits of [`crate::backend`].

use std::any::Any;
use std::net::SocketAddr;

use barewire_rdma_types::{Access, QpState, RecvWr, SendWr, Stag};
use barewire_soft_rdma as soft;
use soft::wire::MpaSettings;

use crate::api::{CompletionQueue, ConnectOptions, QueuePair};
use crate::backend::{
    ours, Connected, DeviceOps, ListenerOps, LocalBoxFuture, MrOps, PdOps, QpOps, WindowOps,
};
use crate::transport::DriverError;

/// The provider's key tables on this core.
pub(crate) struct Device(soft::verbs::Device);

impl Device {
    pub(crate) fn new() -> Device {
        Device(soft::verbs::Device::new())
    }
}

impl DeviceOps for Device {
    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, DriverError> {
        Ok(Box::new(Pd(self.0.alloc_pd())))
    }

    fn create_cq(&self, depth: usize) -> Result<CompletionQueue, DriverError> {
        Ok(CompletionQueue::new(soft::verbs::CompletionQueue::new(
            depth,
        )))
    }

    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Box<dyn ListenerOps>, DriverError> {
        let l = soft::provider::Listener::bind(addr, options(opts)).map_err(cm_error)?;
        Ok(Box::new(Listener(l)))
    }
}

/// The provider's connection settings from the drivers' ones.
pub(crate) fn options(o: &ConnectOptions) -> soft::provider::ConnectOptions {
    soft::provider::ConnectOptions {
        mpa: MpaSettings {
            crc: o.crc,
            ird: o.ird_ord as u16,
            ord: o.ird_ord as u16,
            ..MpaSettings::default()
        },
        private_data: o.private_data.clone(),
        timeout: o.timeout,
        // Setup, on both sides, within the one deadline `ConnectOptions::timeout` sets (as on shm).
        handshake_timeout: o.timeout,
        mulpdu: o.mulpdu,
        keepalive: o.keepalive,
        max_pending_handshakes: o.limits.max_setups,
        max_pending_per_source: o.limits.max_setups_per_source,
        max_connections: o.limits.max_connections,
        max_connections_per_source: o.limits.max_connections_per_source,
        violation_budget: o.limits.violation_budget,
        violation_window: o.limits.violation_window,
        ban: o.limits.ban,
        ..soft::provider::ConnectOptions::default()
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

fn post_error(e: impl std::fmt::Display) -> DriverError {
    DriverError::Post(e.to_string())
}

/// Posts `recvs` on a new queue pair, before this task yields (so before the provider reads
/// anything the peer sent after the handshake).
fn post_all(qp: &soft::provider::QueuePair, recvs: &[RecvWr]) -> Result<(), DriverError> {
    for wr in recvs {
        qp.post_recv(wr.clone()).map_err(post_error)?;
    }
    Ok(())
}

/// Connects a queue pair of domain `pd` through the software provider (also the shm backend's
/// way to peers on other hosts, under `auto`).
pub(crate) async fn connect(
    pd: &soft::verbs::ProtectionDomain,
    addr: SocketAddr,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    opts: &ConnectOptions,
) -> Connected {
    if scq.device().is_some() || rcq.device().is_some() {
        return Err(crate::backend::mixed());
    }
    let (qp, data) = soft::provider::connect(addr, pd, scq.queue(), rcq.queue(), options(opts))
        .await
        .map_err(cm_error)?;
    post_all(&qp, &opts.initial_recvs)?;
    Ok((QueuePair::new(Qp(qp)), data))
}

/// Accepts one peer of the provider's listener `l` into domain `pd` (cancel-safe, as the
/// provider's accept is).
pub(crate) async fn accept(
    l: &soft::provider::Listener,
    pd: &soft::verbs::ProtectionDomain,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    recvs: &[RecvWr],
) -> Connected {
    if scq.device().is_some() || rcq.device().is_some() {
        return Err(crate::backend::mixed());
    }
    let (qp, data) = l
        .accept(pd, scq.queue(), rcq.queue())
        .await
        .map_err(cm_error)?;
    post_all(&qp, recvs)?;
    Ok((QueuePair::new(Qp(qp)), data))
}

struct Pd(soft::verbs::ProtectionDomain);

impl PdOps for Pd {
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, DriverError> {
        // SAFETY: the caller's promise, passed on.
        let mr = unsafe { self.0.register(addr, len, access) }
            .map_err(|e| DriverError::Unsupported(format!("register: {e:?}")))?;
        Ok(Box::new(Mr(mr)))
    }

    fn connect<'a>(
        &'a self,
        addr: SocketAddr,
        scq: &'a CompletionQueue,
        rcq: &'a CompletionQueue,
        opts: &'a ConnectOptions,
    ) -> LocalBoxFuture<'a, Connected> {
        Box::pin(connect(&self.0, addr, scq, rcq, opts))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct Mr(soft::verbs::MemoryRegion);

impl MrOps for Mr {
    fn addr(&self) -> *mut u8 {
        self.0.addr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn lkey(&self) -> Stag {
        self.0.stag()
    }
    fn rkey(&self) -> Stag {
        self.0.stag()
    }
    fn access(&self) -> Access {
        self.0.access()
    }
    fn remote_only_through_windows(&self) -> Result<(), DriverError> {
        self.0.remote_only_through_windows();
        Ok(())
    }
    fn bind_window(
        &self,
        qp: &dyn QpOps,
        access: Access,
    ) -> Result<(Stag, Box<dyn WindowOps>), DriverError> {
        let qp = ours::<Qp>(qp.as_any())?;
        let w = self
            .0
            .bind_window(qp.0.qp_num(), qp.0.pd(), access)
            .map_err(crate::backend::bind_error)?;
        Ok((w.stag(), Box::new(Window(w))))
    }
}

struct Window(soft::verbs::Window);

impl WindowOps for Window {
    fn is_live(&self) -> bool {
        self.0.is_live()
    }
}

/// A queue pair of the provider's.
pub(crate) struct Qp(pub(crate) soft::provider::QueuePair);

impl QpOps for Qp {
    fn post_send(&self, wr: SendWr) -> Result<(), DriverError> {
        self.0.post_send(wr).map_err(post_error)
    }
    fn post_send_batched(&self, wr: SendWr) -> Result<(), DriverError> {
        self.0.post_send_batched(wr).map_err(post_error)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<(), DriverError> {
        self.0.post_recv(wr).map_err(post_error)
    }
    fn disconnect(&self) {
        self.0.disconnect()
    }
    fn state(&self) -> QpState {
        self.0.state()
    }
    fn qp_num(&self) -> u32 {
        self.0.qp_num()
    }
    fn watch_memory(&self) -> bool {
        // Data is placed in stream order by this core's own poller, and the socket that
        // carried it wakes a sleeping core.
        true
    }
    fn transport(&self) -> crate::Transport {
        crate::Transport::Soft
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct Listener(soft::provider::Listener);

impl ListenerOps for Listener {
    fn port(&self) -> u16 {
        self.0.local_addr().map(|a| a.port()).unwrap_or(0)
    }

    fn counters(&self) -> barewire_rdma_types::ListenerCounters {
        self.0.counters()
    }

    fn accept<'a>(
        &'a self,
        pd: &'a dyn PdOps,
        scq: &'a CompletionQueue,
        rcq: &'a CompletionQueue,
        recvs: Vec<RecvWr>,
    ) -> LocalBoxFuture<'a, Connected> {
        Box::pin(async move {
            let pd = ours::<Pd>(pd.as_any())?;
            accept(&self.0, &pd.0, scq, rcq, &recvs).await
        })
    }
}
