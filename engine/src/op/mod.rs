//! I/O operations, one per file: each holds the io_uring submission and completion of its
//! opcode, and the readiness-based equivalent for the epoll reactor.

pub(crate) mod accept;
pub(crate) mod connect;
pub(crate) mod datagram;
pub(crate) mod poll_fd;
pub(crate) mod recv;
pub(crate) mod recv_provided;
pub(crate) mod rw;
pub(crate) mod send;
pub(crate) mod send_zc;
pub(crate) mod writev;

use std::any::Any;
use std::cell::Cell;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::task::{Context, Poll};

use io_uring::squeue;

use crate::core::{try_with_core, with_core};
use crate::driver::epoll::Direction;
use crate::driver::lifecycle::OrphanFn;
use crate::driver::Driver;

/// True when the current core runs io_uring.
pub(crate) fn is_uring() -> bool {
    with_core(|c| matches!(c.driver, Driver::Uring(_)))
}

fn with_uring<R>(f: impl FnOnce(&crate::driver::uring::Uring) -> R) -> R {
    with_core(|c| match &c.driver {
        Driver::Uring(u) => f(u),
        Driver::Epoll(_) => unreachable!("io_uring op on an epoll core"),
    })
}

/// A CQE result as `io::Result`.
pub(crate) fn cvt(res: i32) -> io::Result<u32> {
    if res < 0 {
        Err(io::Error::from_raw_os_error(-res))
    } else {
        Ok(res as u32)
    }
}

/// A syscall's return as `io::Result`.
pub(crate) fn cvt_sys(res: isize) -> io::Result<usize> {
    if res < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(res as usize)
    }
}

/// A one-shot io_uring operation that owns `T` (its buffers, its sockaddr) until the kernel is
/// done. `!Send`: it belongs to the core whose ring it was submitted to.
pub(crate) struct Op<T: 'static> {
    key: usize,
    data: Option<T>,
    orphan: Option<OrphanFn>,
    _not_send: PhantomData<*const ()>,
}

impl<T: 'static> Op<T> {
    /// Builds the SQE from the data at its final heap address and submits it.
    pub(crate) fn submit(mut data: T, build: impl FnOnce(&mut T) -> squeue::Entry) -> Op<T> {
        let entry = build(&mut data);
        let key = with_uring(|u| u.submit_op(entry, false));
        Op {
            key,
            data: Some(data),
            orphan: None,
            _not_send: PhantomData,
        }
    }

    /// What to do with completions that arrive after the future was dropped.
    pub(crate) fn on_orphan(mut self, f: OrphanFn) -> Self {
        self.orphan = Some(f);
        self
    }
}

impl<T: 'static> Future for Op<T> {
    /// (result, CQE flags, the data back).
    type Output = (i32, u32, T);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (res, flags) = std::task::ready!(with_uring(|u| u.poll_op(this.key, cx)));
        Poll::Ready((
            res,
            flags,
            this.data.take().expect("Op polled after completion"),
        ))
    }
}

impl<T: 'static> Unpin for Op<T> {}

impl<T: 'static> Drop for Op<T> {
    fn drop(&mut self) {
        let Some(data) = self.data.take() else { return };
        let parked = try_with_core(|c| match &c.driver {
            Driver::Uring(u) => {
                u.orphan(self.key, Box::new(data) as Box<dyn Any>, self.orphan);
                true
            }
            Driver::Epoll(_) => unreachable!(),
        });
        if parked.is_none() {
            // No core on this thread any more: nobody can tell when the kernel is done with the
            // memory, so it is leaked rather than freed.
            std::mem::forget(self.data.take());
        }
    }
}

/// A multishot io_uring operation: a stream of completions.
pub(crate) struct MultiOp {
    key: usize,
    orphan: Option<OrphanFn>,
    /// Handed to `orphan` for completions after the drop (the ring their buffers go back to).
    data: Option<Box<dyn Any>>,
    finished: bool,
    _not_send: PhantomData<*const ()>,
}

impl MultiOp {
    pub(crate) fn submit(entry: squeue::Entry, orphan: Option<OrphanFn>) -> MultiOp {
        let key = with_uring(|u| u.submit_op(entry, true));
        MultiOp {
            key,
            orphan,
            data: None,
            finished: false,
            _not_send: PhantomData,
        }
    }

    /// As `submit`; `orphan` gets `data` with each completion that arrives after the drop.
    pub(crate) fn submit_with(
        entry: squeue::Entry,
        data: Box<dyn Any>,
        orphan: OrphanFn,
    ) -> MultiOp {
        let mut op = MultiOp::submit(entry, Some(orphan));
        op.data = Some(data);
        op
    }

    pub(crate) fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<(i32, u32)>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let r = std::task::ready!(with_uring(|u| u.poll_multi(self.key, cx)));
        if r.is_none() {
            self.finished = true;
        }
        Poll::Ready(r)
    }
}

impl Drop for MultiOp {
    fn drop(&mut self) {
        let key = self.key;
        let orphan = self.orphan;
        let data = self.data.take().unwrap_or_else(|| Box::new(()));
        try_with_core(|c| {
            if let Driver::Uring(u) = &c.driver {
                u.orphan(key, data, orphan);
            }
        });
    }
}

/// An owned fd plus, on epoll cores, its registration (made on first wait), and on io_uring
/// cores with a registered file table, its slot there (taken on first operation).
pub(crate) struct SharedFd {
    fd: OwnedFd,
    epoll_key: Cell<Option<usize>>,
    /// Registered for relaxed waits under epoll (a listener, a control socket: see
    /// `SharedFd::relaxed`).
    relaxed: bool,
    fixed: Cell<Fixed>,
    /// The shared half of the core whose table holds the slot (set with it): operations on
    /// other cores use the descriptor, and a socket dropped on another thread (it is `Send`)
    /// asks that core to empty the slot. The weak reference also keeps the address from being
    /// reused by another core while it is compared.
    fixed_home: std::cell::OnceCell<std::sync::Weak<crate::core::CoreShared>>,
}

/// A socket's place in its core's registered file table.
#[derive(Clone, Copy)]
enum Fixed {
    /// Not asked yet.
    Untried,
    /// This slot of the table of the core in `fixed_home`.
    Slot(u32),
    /// No slot (no table, or it was full): the descriptor it is.
    No,
}

impl SharedFd {
    pub(crate) fn new(fd: OwnedFd) -> Self {
        SharedFd::with(fd, false)
    }

    fn with(fd: OwnedFd, relaxed: bool) -> Self {
        SharedFd {
            fd,
            epoll_key: Cell::new(None),
            relaxed,
            fixed: Cell::new(Fixed::Untried),
            fixed_home: std::cell::OnceCell::new(),
        }
    }

    /// A socket whose waits under the epoll reactor are relaxed (see
    /// [`poll_readable_relaxed`](crate::poll_readable_relaxed)): a task waiting on it does not
    /// make a busy core ask the kernel for events on every pass. For listening sockets and
    /// control traffic (`UdpSocket::bind_relaxed`), which can be taken some microseconds late.
    pub(crate) fn relaxed(fd: OwnedFd) -> Self {
        SharedFd::with(fd, true)
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// How an io_uring operation on this core names the socket: its registered slot with
    /// `IOSQE_FIXED_FILE`, or its descriptor. Set the returned flags on the entry.
    pub(crate) fn uring_target(&self) -> (io_uring::types::Fd, squeue::Flags) {
        let plain = (io_uring::types::Fd(self.raw()), squeue::Flags::empty());
        with_core(|c| {
            let Driver::Uring(u) = &c.driver else {
                return plain;
            };
            let fixed = match self.fixed.get() {
                Fixed::Untried => {
                    let f = match u.register_fixed(self.raw()) {
                        Some(slot) => {
                            let _ = self.fixed_home.set(std::sync::Arc::downgrade(&c.shared));
                            Fixed::Slot(slot)
                        }
                        None => Fixed::No,
                    };
                    self.fixed.set(f);
                    f
                }
                f => f,
            };
            match fixed {
                Fixed::Slot(slot) if self.home_is(c) => (
                    io_uring::types::Fd(slot as RawFd),
                    squeue::Flags::FIXED_FILE,
                ),
                _ => plain,
            }
        })
    }

    /// Whether `c` is the core whose table holds this socket's slot.
    fn home_is(&self, c: &crate::core::Core) -> bool {
        self.fixed_home
            .get()
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), std::sync::Arc::as_ptr(&c.shared)))
    }

    /// Gives the registered slot back: at once on the core that holds it; from anywhere else
    /// (only a ring's own thread may touch it) that core empties it on its next pass, and
    /// until then its table keeps the socket open. A core that has gone took its table along.
    fn release_fixed(&self) {
        if let Fixed::Slot(slot) = self.fixed.replace(Fixed::No) {
            let here = try_with_core(|c| match &c.driver {
                Driver::Uring(u) if self.home_is(c) => {
                    u.unregister_fixed(slot);
                    true
                }
                _ => false,
            });
            if here != Some(true) {
                if let Some(home) = self.fixed_home.get().and_then(|w| w.upgrade()) {
                    // Refused only once that core has gone, its ring and table with it.
                    let _ = home.wake.push(crate::core::InboxItem::ReleaseSlot(slot));
                }
            }
        }
    }

    fn key(&self) -> io::Result<usize> {
        if let Some(k) = self.epoll_key.get() {
            return Ok(k);
        }
        let k = with_core(|c| match &c.driver {
            Driver::Epoll(e) => e.register_waits(self.raw(), self.relaxed),
            Driver::Uring(_) => unreachable!("epoll registration on an io_uring core"),
        })?;
        self.epoll_key.set(Some(k));
        Ok(k)
    }

    /// epoll: runs `f` until it stops saying `WouldBlock`, waiting for readiness in between.
    pub(crate) async fn retry<R>(
        &self,
        dir: Direction,
        mut f: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        loop {
            match f() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let key = self.key()?;
                    with_core(|c| match &c.driver {
                        Driver::Epoll(e) => e.clear(key, dir),
                        Driver::Uring(_) => unreachable!(),
                    });
                    std::future::poll_fn(|cx| {
                        with_core(|c| match &c.driver {
                            Driver::Epoll(e) => e.poll_ready(key, dir, cx),
                            Driver::Uring(_) => unreachable!(),
                        })
                    })
                    .await;
                }
                r => return r,
            }
        }
    }
}

impl SharedFd {
    /// Gives up the fd (and its epoll registration, if any).
    pub(crate) fn into_owned(self) -> OwnedFd {
        self.release_fixed();
        let mut this = std::mem::ManuallyDrop::new(self);
        if let Some(key) = this.epoll_key.get() {
            let fd = this.raw();
            try_with_core(|c| {
                if let Driver::Epoll(e) = &c.driver {
                    e.deregister(fd, key);
                }
            });
        }
        // The one field besides `fd` that owns something: its weak reference, left in `this`,
        // would keep the home core's shared half allocated for good.
        drop(std::mem::take(&mut this.fixed_home));
        // SAFETY: `this` is never dropped, so the fd is moved out exactly once.
        unsafe { std::ptr::read(&this.fd) }
    }
}

impl Drop for SharedFd {
    fn drop(&mut self) {
        // Before the descriptor closes: the table's reference would keep the file open.
        self.release_fixed();
        if let Some(key) = self.epoll_key.get() {
            let fd = self.raw();
            try_with_core(|c| {
                if let Driver::Epoll(e) = &c.driver {
                    e.deregister(fd, key);
                }
            });
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A socket taken out of the reactor (`TcpStream::into_fd`) leaves nothing of its
    /// `SharedFd` behind. It used to keep its weak reference to the core that holds its
    /// registered slot, and with it that core's shared half allocated for the life of the
    /// process.
    #[test]
    fn a_socket_taken_out_of_the_reactor_keeps_no_reference_to_its_core() {
        let rt = crate::Runtime::builder()
            .cores(1)
            .pin(false)
            .build()
            .unwrap();
        let (slotted, held, left) = rt.block_on(async {
            let weak_refs = || with_core(|c| std::sync::Arc::weak_count(&c.shared));
            let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
            let fd = SharedFd::new(OwnedFd::from(a));
            // An io_uring operation names it by a slot of the core's file table where it can.
            let _ = fd.uring_target();
            let slotted = matches!(fd.fixed.get(), Fixed::Slot(_));
            let held = weak_refs();
            drop(fd.into_owned());
            (slotted, held, weak_refs())
        });
        if slotted {
            assert_eq!(
                held - left,
                1,
                "the slot's reference to its core goes with it"
            );
        } else {
            // The epoll reactor, or a core without a file table: no slot, no reference.
            assert_eq!(held, left);
        }
    }
}
