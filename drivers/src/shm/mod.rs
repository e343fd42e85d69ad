//! `shm`: the backend for peers on the same host, at memory speed.
//!
//! Two processes on one machine talk through memory they both map, as UCX's and libfabric's
//! shared-memory transports do:
//!
//! - **Memory.** Buffers barewire allocates on a shm protection domain ([`crate::Buffer`]) are
//!   sealed memfds. A region with remote rights must lie inside one; registering remote rights
//!   on other memory is refused with a clear error (the choice between refusing and
//!   cross-memory attach: refusing keeps every remote access a plain load, store or CPU atomic
//!   on a mapping, and a region that cannot be mapped could not serve atomics anyway).
//! - **Grants.** A peer that names a region's key for the first time asks the owner over the
//!   queue pair's control socket (an abstract Unix socket, so only within one network
//!   namespace). The owner checks the key as the soft provider checks a tagged access (live,
//!   same protection domain, bound to this queue pair if it is a window, some remote right)
//!   and sends the memfd with SCM_RIGHTS: read-only (a read-only reopening of the file) when
//!   the key grants no remote write or atomic, so the peer's mapping is read-only too. The
//!   peer then checks every access against the granted bounds and rights itself, and answers
//!   a violation as the soft provider does: a remote access error, and the queue pair goes to
//!   ERROR. A request for a key the peer may not use is refused and ends the connection on the
//!   owner's side too (counted as a violation), so keys cannot be guessed on one connection;
//!   a process whose peers do that past the listener's violation budget (8 within 10 s by
//!   default) is refused for its ban (60 s), as the software provider refuses an address.
//! - **Operations.** WRITE and READ are copies into and out of the mapping, made by the
//!   initiator's CPU when it posts them, a MiB per loop pass (the rest at the next passes, so
//!   a large one does not hold the core from its other tasks; later requests wait behind it);
//!   atomics are CPU atomics on the mapped word, so they
//!   are atomic with the owner's own atomics. Sends, the notices of Writes with immediate data
//!   and revocations go through a ring in the receiver's memory, in posting order; the
//!   receiver's poller delivers them to its posted receives. A Send, or a Write with immediate
//!   data, completes once the receiver has taken its record into a posted receive (the
//!   writer sees the reader's head pass it), as verbs completes one once the responder has
//!   placed it: not while the peer has no receive for it, and never successfully if the peer
//!   goes before taking it. Every completion goes through the same completion queues as on
//!   the other backends, in posting order, so those after a Send wait for it.
//! - **Watched memory.** A receiver that asks to watch its memory
//!   ([`crate::QueuePair::watch_memory`], as `Channel<T>` does) sets a flag in its ring's
//!   header. The writer then copies its Writes to that peer in ascending address order (16-byte
//!   stores, each fenced; `memcpy` may let later bytes show first), and after each Write looks
//!   at the reader's sleep flag and wakes it through its eventfd: the reader sets that flag,
//!   fences, and looks at its memory once more before it sleeps, so either it sees the Write
//!   or the writer sees it asleep. Peers that never ask pay nothing of this.
//! - **Revocation.** Dropping a region or a window, or invalidating a key (locally, or by a
//!   peer's Send with Invalidate, which the receiver carries out as it takes the Send, and
//!   which the sender's own mapping of the key stops serving when it posts it), pushes a
//!   revocation
//!   into the ring of every queue pair it was granted over, in order with the owner's later
//!   Sends: a peer that has received anything the owner sent after the revocation no longer
//!   maps the memory, and asks again (and is refused) if it names the key. A freed buffer's
//!   pages are punched out of its file, so a mapping kept by a peer that ignores revocations
//!   reads zeros and writes into pages nobody uses. The files are sealed against shrinking, so
//!   no mapping can ever fault (SIGBUS), whatever the owner does.
//! - **Trust.** Only processes of the same user may connect (SO_PEERCRED): such a process could
//!   read this one's memory through /proc anyway, so a grant gives it no new power; bounds
//!   and rights are enforced at byte granularity by the peer's driver, and the pages around a
//!   region in the same buffer are reachable by a process that bypasses it.
//!   Such a process can also stop or kill this one, so what it shares for speed is not
//!   defended against it: a peer that turns the wake-up eventfd it handed over blocking and
//!   fills its counter makes this core's next poke of it block. (Datagram sockets, which no
//!   flag can make block, were tried and measured: `bench/RESULTS.md`, forty-first session.)
//! - **Listeners.** Any process in the namespace can connect to a listener's abstract name,
//!   so a listener defends itself as the software provider's does, under the same
//!   [`ListenerLimits`](crate::ListenerLimits) with the peer's process as the source: setups
//!   run in tasks of their own under the setup deadline, capped in all and per process (by
//!   default 128 and 16; a newcomer pushes out the oldest it competes with); a setup that is
//!   junk, silent, from another user or gone before the answer is counted and dropped, never
//!   an error from `accept`; and accepted connections open at once are capped too (4,096 and
//!   256), a connection beyond them closed at once (its connect says why).
//!   [`crate::Listener::counters`] says what was
//!   refused. Abstract names have no owner, so another user can take a port's name first: a
//!   connect passes a name held by another user's process over (`auto` then goes through the
//!   software provider), an `auto` listener whose name is taken serves everyone through the
//!   provider and says so, and an explicit shm listener fails, naming the user.
//! - **Faults.** A peer that dies closes its control socket: the queue pair delivers what the
//!   peer had already sent, then goes to ERROR and flushes everything outstanding. A stopped
//!   peer's memory stays readable and writable, as a NIC serves a stopped process, through
//!   the keys it granted before it stopped. What needs its CPU (taking a Send from the ring,
//!   granting a key) is watched: a reader that holds records for want of a posted receive
//!   says so in its ring's header, and Sends to it wait for the receive without limit (as
//!   verbs' wait, retrying, on a responder that answers "receiver not ready"). A peer that
//!   has not even looked at what it owes for the connection's timeout
//!   ([`ConnectOptions::timeout`](crate::ConnectOptions::timeout), 1 s; a timer, so it fires
//!   while this core sleeps) is stopped, hung, or holds its core that long: the request at the
//!   front fails with `RETRY_EXC_ERR`, the rest flush, and the connection ends, within the
//!   same bound as the software provider's stall timeout.
//! - **Responder errors.** A Send the receiver cannot place (its receive too small, or that
//!   receive's memory gone) fails there with a local error and at the sender with the
//!   responder's (`REM_INV_REQ_ERR`, `REM_OP_ERR`), as verbs reports them; both queue pairs
//!   then go to ERROR.

mod mem;
mod qp;
pub(crate) mod ring;
mod sock;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::Arc;

use barewire_rdma_types as keys;
use keys::{Access, Stag};

use mem::MemFile;
use qp::Qp;

use crate::api::{CompletionQueue, ConnectOptions};
use crate::backend::{
    ours, Connected, DeviceOps, ListenerOps, LocalBoxFuture, MrOps, PdOps, QpOps, WindowOps,
};
use crate::ops::SharedMemory;
use crate::transport::DriverError;

/// The shm device of one core: the key tables (barewire-rdma-types', as the soft provider's:
/// the same checks) and
/// which queue pairs each key was granted over.
#[derive(Clone)]
pub(crate) struct Device {
    tables: keys::Device,
    grants: Rc<RefCell<Grants>>,
    /// `auto`: peers that are not on this host (or run the software provider) are connected
    /// through the software provider, with the same keys.
    auto: bool,
}

#[derive(Default)]
struct Grants {
    /// A key → the queue pairs that were sent its memory.
    over: HashMap<u32, Vec<Weak<qp::QpInner>>>,
    /// A region's key → the windows bound in it.
    windows: HashMap<u32, Vec<u32>>,
}

impl Device {
    pub(crate) fn new() -> Device {
        Device {
            tables: keys::Device::new(),
            grants: Rc::default(),
            auto: false,
        }
    }

    /// What `auto` opens without an RDMA device: shm for peers on this host and network
    /// namespace, the software provider for the others (same key tables, so a region has one
    /// key whichever way a peer reaches it).
    pub(crate) fn auto() -> Device {
        Device {
            auto: true,
            ..Device::new()
        }
    }

    /// Notes that `stag` was granted over `qp`: once per queue pair, though its peer may ask
    /// again (after a revocation, or over and over), and with the queue pairs that are gone
    /// dropped, so the list never outgrows the live queue pairs that hold the key.
    fn granted(&self, stag: u32, qp: &Rc<qp::QpInner>) {
        let mut g = self.grants.borrow_mut();
        let over = g.over.entry(stag).or_default();
        over.retain(|w| w.strong_count() > 0);
        if !over
            .iter()
            .any(|w| std::ptr::eq(w.as_ptr(), Rc::as_ptr(qp)))
        {
            over.push(Rc::downgrade(qp));
        }
    }

    /// Tells every queue pair that was granted `stag` (and, for a region, its windows) that
    /// the grant is gone.
    fn revoke(&self, stag: u32) {
        let (qps, windows) = {
            let mut g = self.grants.borrow_mut();
            (
                g.over.remove(&stag).unwrap_or_default(),
                g.windows.remove(&stag).unwrap_or_default(),
            )
        };
        for q in qps.iter().filter_map(Weak::upgrade) {
            q.revoke(stag);
        }
        for w in windows {
            self.revoke(w);
        }
    }
}

impl DeviceOps for Device {
    fn alloc_pd(&self) -> Result<Box<dyn PdOps>, DriverError> {
        Ok(Box::new(Pd {
            pd: self.tables.alloc_pd(),
            dev: self.clone(),
        }))
    }

    fn create_cq(&self, depth: usize) -> Result<CompletionQueue, DriverError> {
        Ok(CompletionQueue::new(keys::CompletionQueue::new(depth)))
    }

    fn listen(
        &self,
        addr: std::net::SocketAddr,
        opts: &ConnectOptions,
    ) -> Result<Box<dyn ListenerOps>, DriverError> {
        Ok(Box::new(qp::Listener::bind(addr, opts, self.auto)?))
    }
}

/// A shm protection domain.
pub(crate) struct Pd {
    pd: keys::ProtectionDomain,
    dev: Device,
}

impl Pd {
    pub(crate) fn id(&self) -> u32 {
        self.pd.id()
    }
}

impl PdOps for Pd {
    /// Remote rights need memory barewire allocated on a shm domain (see the module docs).
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<Box<dyn MrOps>, DriverError> {
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        let file = mem::find(addr as usize, len).map(|(f, _)| f);
        // Under `auto` such a region still serves peers reached through the software provider;
        // a shm peer that asks for it is refused (see `QpInner::answer`).
        if file.is_none() && access_any(access, remote) && !self.dev.auto {
            return Err(DriverError::Unsupported(format!(
                "shm: {len} bytes at {addr:p} are not inside a buffer barewire allocated, so no \
                 peer process can map them; allocate remotely accessible memory with \
                 Buffer::new on this protection domain (or use BAREWIRE_DRIVER=soft)"
            )));
        }
        // SAFETY: the caller's promise, passed on.
        let mr = unsafe { self.pd.register(addr, len, access) }
            .map_err(|e| DriverError::Unsupported(format!("register: {e:?}")))?;
        Ok(Box::new(Mr {
            mr,
            _file: file,
            dev: self.dev.clone(),
        }))
    }

    fn connect<'a>(
        &'a self,
        addr: std::net::SocketAddr,
        scq: &'a CompletionQueue,
        rcq: &'a CompletionQueue,
        opts: &'a ConnectOptions,
    ) -> LocalBoxFuture<'a, Connected> {
        Box::pin(async move {
            if scq.device().is_some() || rcq.device().is_some() {
                return Err(crate::backend::mixed());
            }
            let deadline = std::time::Instant::now() + opts.timeout;
            let fd = match qp::reach(addr, deadline).await? {
                qp::Reach::Listener(fd) => fd,
                qp::Reach::NotHere(_) if self.dev.auto => {
                    return crate::soft::connect(&self.pd, addr, scq, rcq, opts).await
                }
                qp::Reach::NotHere(why) => {
                    return Err(DriverError::Connect(format!(
                        "shm: {why}; shm reaches only peers on this host and network \
                         namespace (BAREWIRE_DRIVER=soft or auto reach any)"
                    )))
                }
            };
            let (qp, data) = qp::connect(
                fd,
                self,
                scq.queue(),
                rcq.queue(),
                &opts.private_data,
                deadline,
                opts.timeout,
            )
            .await?;
            for wr in &opts.initial_recvs {
                qp.post_recv(wr.clone())?;
            }
            Ok((qp, data))
        })
    }

    fn allocate(&self, len: usize, align: usize) -> Option<Result<SharedMemory, DriverError>> {
        let page = mem::page();
        if align <= page {
            return Some(MemFile::create(len).map(|f| Box::new(f) as SharedMemory));
        }
        // Aligned to more than a page (a power of two, which the caller's layout checked): a
        // file that much longer, used from its first aligned byte. Pages never touched cost
        // nothing.
        let Some(padded) = len.max(1).checked_add(align - page) else {
            return Some(Err(DriverError::Unsupported(format!(
                "a buffer of {len} B aligned {align}: too large"
            ))));
        };
        Some(MemFile::create(padded).map(|f| {
            let skip = (f.ptr() as usize).next_multiple_of(align) - f.ptr() as usize;
            Box::new(mem::Within { file: f, skip }) as SharedMemory
        }))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

fn access_any(a: Access, of: Access) -> bool {
    [
        Access::LOCAL_WRITE,
        Access::REMOTE_WRITE,
        Access::REMOTE_READ,
        Access::REMOTE_ATOMIC,
    ]
    .into_iter()
    .any(|r| of.contains(r) && a.contains(r))
}

/// A shm memory region. Dropping it revokes every grant of its key.
pub(crate) struct Mr {
    mr: keys::MemoryRegion,
    /// Keeps the mapping of the file it lies in while it is registered.
    _file: Option<Arc<MemFile>>,
    dev: Device,
}

impl MrOps for Mr {
    fn addr(&self) -> *mut u8 {
        self.mr.addr()
    }
    fn len(&self) -> usize {
        self.mr.len()
    }
    fn lkey(&self) -> Stag {
        self.mr.stag()
    }
    fn rkey(&self) -> Stag {
        self.mr.stag()
    }
    fn access(&self) -> Access {
        self.mr.access()
    }

    /// Its key stops serving remote access (already granted mappings are revoked).
    fn remote_only_through_windows(&self) -> Result<(), DriverError> {
        self.mr.remote_only_through_windows();
        self.dev.revoke(self.mr.stag().0);
        Ok(())
    }

    fn bind_window(
        &self,
        qp: &dyn QpOps,
        access: Access,
    ) -> Result<(Stag, Box<dyn WindowOps>), DriverError> {
        // Under `auto` the queue pair may be the software provider's: the same key tables.
        let soft = qp.as_any().downcast_ref::<crate::soft::Qp>();
        let w = match soft {
            Some(soft) if self.dev.auto => {
                self.mr.bind_window(soft.0.qp_num(), soft.0.pd(), access)
            }
            _ => {
                let qp = ours::<Qp>(qp.as_any())?;
                self.mr.bind_window(qp.qp_num(), qp.pd(), access)
            }
        }
        .map_err(crate::backend::bind_error)?;
        self.dev
            .grants
            .borrow_mut()
            .windows
            .entry(self.mr.stag().0)
            .or_default()
            .push(w.stag().0);
        Ok((
            w.stag(),
            Box::new(Window {
                w,
                dev: self.dev.clone(),
            }),
        ))
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.dev.revoke(self.mr.stag().0);
    }
}

/// A window bound for one shm queue pair. Dropping it revokes its grant.
pub(crate) struct Window {
    w: keys::Window,
    dev: Device,
}

impl WindowOps for Window {
    fn is_live(&self) -> bool {
        self.w.is_live()
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.dev.revoke(self.w.stag().0);
    }
}

/// This host's boot and this process's network namespace: a peer with both the same shares
/// this machine's memory.
pub(crate) fn identity() -> ([u8; 36], u64) {
    let mut boot = [0u8; 36];
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let s = s.trim().as_bytes();
        let n = s.len().min(36);
        boot[..n].copy_from_slice(&s[..n]);
    }
    use std::os::unix::fs::MetadataExt;
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0);
    (boot, netns)
}
