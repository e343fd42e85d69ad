//! The one set of traits every backend implements — verbs (rdma-core), soft (barewire's iWARP
//! provider) and shm (shared memory on one host) — behind the public types of [`crate::api`].
//!
//! Each public object holds its backend's object as a trait object: a device, protection
//! domain, memory region, window, queue pair and listener. Calls that take objects of two kinds
//! (connecting with a domain and two completion queues, binding a window of a region to a
//! queue pair, accepting into a domain) downcast the second object to their own backend's
//! type, and objects of two backends mixed in one call are a clear error.
//!
//! Completion queues are the same for every backend ([`barewire_rdma_types::CompletionQueue`],
//! what applications poll and await); a backend that has a device queue behind it (verbs)
//! keeps that alongside.

use std::any::Any;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::rc::Rc;

use barewire_rdma_types::{Access, QpState, RecvWr, SendWr, Stag};

use crate::api::{CompletionQueue, ConnectOptions, QueuePair};
use crate::ops::MappedRemote;
use crate::transport::DriverError;

/// A future of a backend's, boxed so the traits stay object-safe (connection setup only: no
/// data-path call returns one).
pub(crate) type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// What connection setup gives: the queue pair and the peer's private data.
pub(crate) type Connected = Result<(QueuePair, Vec<u8>), DriverError>;

/// An opened device.
pub(crate) trait DeviceOps {
    /// Allocates a protection domain.
    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, DriverError>;

    /// Creates a completion queue of `depth` entries, polled by the current core.
    fn create_cq(&self, depth: usize) -> Result<CompletionQueue, DriverError>;

    /// Listens on `addr`; `opts.private_data` goes to each peer.
    fn listen(
        &self,
        addr: SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Box<dyn ListenerOps>, DriverError>;
}

/// A protection domain.
pub(crate) trait PdOps: Any {
    /// Registers `len` bytes at `addr`.
    ///
    /// # Safety
    /// As [`crate::ProtectionDomain::register`].
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, DriverError>;

    /// Connects to a listening peer with queues `scq` and `rcq`.
    fn connect<'a>(
        &'a self,
        addr: SocketAddr,
        scq: &'a CompletionQueue,
        rcq: &'a CompletionQueue,
        opts: &'a ConnectOptions,
    ) -> LocalBoxFuture<'a, Connected>;

    /// Memory for a [`crate::Buffer`] of `len` bytes aligned to `align`, if this backend needs
    /// its own kind (shm: a sealed memfd a peer process can map); `None`: ordinary memory.
    fn allocate(
        &self,
        _len: usize,
        _align: usize,
    ) -> Option<Result<crate::ops::SharedMemory, DriverError>> {
        None
    }

    fn as_any(&self) -> &dyn Any;
}

/// A registered memory region.
pub(crate) trait MrOps {
    fn addr(&self) -> *mut u8;
    fn len(&self) -> usize;
    fn lkey(&self) -> Stag;
    fn rkey(&self) -> Stag;
    fn access(&self) -> Access;
    /// See [`crate::MemoryRegion::remote_only_through_windows`].
    fn remote_only_through_windows(&self) -> Result<(), DriverError>;
    /// See [`crate::MemoryRegion::bind_window`]: the window's key and the window.
    fn bind_window(
        &self,
        qp: &dyn QpOps,
        access: Access,
    ) -> Result<(Stag, Box<dyn WindowOps>), DriverError>;
}

/// A memory window bound for one queue pair.
pub(crate) trait WindowOps {
    fn is_live(&self) -> bool;
}

/// A connected queue pair.
pub(crate) trait QpOps: Any {
    fn post_send(&self, wr: SendWr) -> Result<(), DriverError>;
    /// See [`crate::QueuePair::post_send_batched`]; by default the same as `post_send`.
    fn post_send_batched(&self, wr: SendWr) -> Result<(), DriverError> {
        self.post_send(wr)
    }
    fn post_recv(&self, wr: RecvWr) -> Result<(), DriverError>;
    fn disconnect(&self);
    fn state(&self) -> QpState;
    fn qp_num(&self) -> u32;
    /// See [`crate::QueuePair::send_queue_depth`]; by default unbounded.
    fn send_queue_depth(&self) -> Option<usize> {
        None
    }
    /// See [`crate::QueuePair::watch_memory`].
    fn watch_memory(&self) -> bool {
        false
    }
    /// See [`crate::QueuePair::map_remote`].
    fn map_remote(&self, _region: &barewire_rdma_types::RegionDescriptor) -> Option<MappedRemote> {
        None
    }
    /// The transport this queue pair runs over.
    fn transport(&self) -> crate::Transport;
    fn as_any(&self) -> &dyn Any;
}

/// What keeps a [`MappedRemote`] valid, and wakes its peer.
pub(crate) trait MappedPeer {
    /// Wakes the peer's core if it said it sleeps (after a fence that orders the caller's
    /// stores before the look).
    fn wake_if_asleep(&self);
}

/// Accepts connections.
pub(crate) trait ListenerOps {
    fn port(&self) -> u16;
    /// What the listener refused, and why (zeros where the backend keeps no counts).
    fn counters(&self) -> barewire_rdma_types::ListenerCounters {
        barewire_rdma_types::ListenerCounters::default()
    }
    /// Accepts one peer into `pd`, posting `recvs` before the peer can send anything.
    fn accept<'a>(
        &'a self,
        pd: &'a dyn PdOps,
        scq: &'a CompletionQueue,
        rcq: &'a CompletionQueue,
        recvs: Vec<RecvWr>,
    ) -> LocalBoxFuture<'a, Connected>;
}

/// `x` as backend type `T`, or the error for objects of two backends mixed in one call.
pub(crate) fn ours<T: 'static>(x: &dyn Any) -> Result<&T, DriverError> {
    x.downcast_ref::<T>().ok_or_else(mixed)
}

/// Runs `a` and `b` together until one finishes: `Ok` with `a`'s output, `Err` with `b`'s.
/// The other is dropped, so it must be cancel-safe.
pub(crate) async fn first<A: Future, B: Future>(a: A, b: B) -> Result<A::Output, B::Output> {
    let (mut a, mut b) = (std::pin::pin!(a), std::pin::pin!(b));
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(v) = a.as_mut().poll(cx) {
            return std::task::Poll::Ready(Ok(v));
        }
        b.as_mut().poll(cx).map(Err)
    })
    .await
}

/// The error for a window that cannot be bound (`e`, from the key tables).
pub(crate) fn bind_error(e: barewire_rdma_types::Violation) -> DriverError {
    DriverError::Post(match e {
        barewire_rdma_types::Violation::NotAssociated => "bind window: the region is not of the \
            queue pair's protection domain (a region of another node, or of another domain)"
            .into(),
        e => format!("bind window: {e}"),
    })
}

/// The error for objects of two backends mixed in one call.
pub(crate) fn mixed() -> DriverError {
    DriverError::Unsupported("objects from two different backends were mixed in one call".into())
}

/// A device completion queue kept behind a [`CompletionQueue`] (verbs), as `T`.
pub(crate) fn device_cq<T: 'static>(cq: &CompletionQueue) -> Result<Rc<T>, DriverError> {
    cq.device()
        .and_then(|d| d.clone().downcast::<T>().ok())
        .ok_or_else(mixed)
}
