//! The `verbs` backend (rdma-core and librdmacm) behind the traits of [`crate::backend`].

use std::any::Any;
use std::net::SocketAddr;
use std::rc::Rc;

use barewire_rdma_types::{Access, QpState, RecvWr, SendWr, Stag};

use super::{cm, rc};
use crate::api::{CompletionQueue, ConnectOptions, QueuePair};
use crate::backend::{
    device_cq, ours, Connected, DeviceOps, ListenerOps, LocalBoxFuture, MrOps, PdOps, QpOps,
    WindowOps,
};
use crate::transport::{DriverError, Transport};

/// An opened verbs device and its transport.
pub(crate) struct Device(Rc<rc::Context>, Transport);

impl Device {
    pub(crate) fn open(name: &str, transport: Transport) -> Result<Device, DriverError> {
        Ok(Device(rc::Context::open(name)?, transport))
    }
}

/// rdma_cm's settings from the drivers' ones.
fn settings(o: &ConnectOptions) -> cm::CmSettings {
    cm::CmSettings {
        private_data: o.private_data.clone(),
        timeout: o.timeout,
        depth: o.depth,
        max_inline: o.max_inline,
        ird: o.ird_ord,
        ord: o.ird_ord,
        tos: o.tos,
    }
}

impl DeviceOps for Device {
    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, DriverError> {
        Ok(Box::new(Pd(rc::Pd::new(&self.0)?, self.1)))
    }

    fn create_cq(&self, depth: usize) -> Result<CompletionQueue, DriverError> {
        let cq = rc::Cq::new(&self.0, depth)?;
        Ok(CompletionQueue::with_device(cq.queue().clone(), cq))
    }

    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Box<dyn ListenerOps>, DriverError> {
        Ok(Box::new(Listener(cm::Listener::bind(
            addr,
            settings(opts),
        )?)))
    }
}

struct Pd(Rc<rc::Pd>, Transport);

impl PdOps for Pd {
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, DriverError> {
        // SAFETY: the caller's promise, passed on.
        let mr = unsafe { self.0.register(addr, len, access) }?;
        Ok(Box::new(Mr(mr)))
    }

    fn connect<'a>(
        &'a self,
        addr: SocketAddr,
        scq: &'a CompletionQueue,
        rcq: &'a CompletionQueue,
        opts: &'a ConnectOptions,
    ) -> LocalBoxFuture<'a, Connected> {
        Box::pin(async move {
            let (s, r) = (device_cq::<rc::Cq>(scq)?, device_cq::<rc::Cq>(rcq)?);
            let (qp, data) =
                cm::Qp::connect(addr, &self.0, &s, &r, &settings(opts), &opts.initial_recvs)
                    .await?;
            Ok((QueuePair::new(Qp(qp, self.1)), data))
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct Mr(rc::Mr);

impl MrOps for Mr {
    fn addr(&self) -> *mut u8 {
        self.0.addr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn lkey(&self) -> Stag {
        self.0.lkey()
    }
    fn rkey(&self) -> Stag {
        self.0.rkey()
    }
    fn access(&self) -> Access {
        self.0.access()
    }
    fn remote_only_through_windows(&self) -> Result<(), DriverError> {
        self.0.remote_only_through_windows()
    }
    fn bind_window(
        &self,
        qp: &dyn QpOps,
        access: Access,
    ) -> Result<(Stag, Box<dyn WindowOps>), DriverError> {
        let qp = ours::<Qp>(qp.as_any())?;
        let w = self.0.bind_window(&qp.0, access)?;
        Ok((w.rkey(), Box::new(Window(w))))
    }
}

struct Window(rc::Mw);

impl WindowOps for Window {
    fn is_live(&self) -> bool {
        self.0.is_live()
    }
}

struct Qp(Rc<cm::Qp>, Transport);

impl QpOps for Qp {
    fn post_send(&self, wr: SendWr) -> Result<(), DriverError> {
        self.0.post_send(&wr)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<(), DriverError> {
        self.0.post_recv(&wr)
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
    fn send_queue_depth(&self) -> Option<usize> {
        Some(self.0.send_queue_depth())
    }
    fn transport(&self) -> Transport {
        self.1
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

struct Listener(cm::Listener);

impl ListenerOps for Listener {
    fn port(&self) -> u16 {
        self.0.port()
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
            let (s, r) = (device_cq::<rc::Cq>(scq)?, device_cq::<rc::Cq>(rcq)?);
            let (qp, data) = self.0.accept(&pd.0, &s, &r, &recvs).await?;
            Ok((QueuePair::new(Qp(qp, pd.1)), data))
        })
    }
}
