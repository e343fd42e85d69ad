//! recv into a buffer the kernel picks from a provided-buffer ring (`IORING_REGISTER_PBUF_RING`,
//! 5.19, and `IOSQE_BUFFER_SELECT`). A core with many idle connections then needs buffers only
//! for the data that actually arrives, not one per pending recv.
//!
//! On epoll cores the same ring is a free list and `recv(2)` fills the buffer it hands out.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::{opcode, squeue};

use super::{cvt, cvt_sys, is_uring, MultiOp, Op, SharedFd};
use crate::buf::IoBuf;
use crate::core::{try_with_core, with_core};
use crate::driver::epoll::Direction;
use crate::driver::lifecycle::CQE_F_MORE;
use crate::driver::Driver;

/// `IORING_CQE_F_BUFFER`: the upper 16 bits of the CQE flags name the buffer used.
const CQE_F_BUFFER: u32 = 1 << 0;
const CQE_BUFFER_SHIFT: u32 = 16;

thread_local! {
    static NEXT_BGID: Cell<u16> = const { Cell::new(0) };
}

struct Inner {
    bgid: u16,
    mask: u16,
    buf_size: usize,
    /// The ring of `BufRingEntry`, page-aligned as the kernel requires.
    ring: *mut BufRingEntry,
    ring_layout: std::alloc::Layout,
    mem: Box<[u8]>,
    tail: Cell<u16>,
    uring: bool,
    free: RefCell<Vec<u16>>,
}

/// A ring of equal-sized receive buffers shared by every `recv_provided` on one core.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// use barewire_engine::{buf::BufRing, net::{TcpListener, TcpStream}};
/// rt.block_on(async {
///     let ring = BufRing::new(16, 4096).unwrap();
///     let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
///     let c = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
///     let (s, _) = l.accept().await.unwrap();
///     c.write_all(b"ping".to_vec()).await.0.unwrap();
///     let got = s.recv_provided(&ring).await.unwrap();
///     assert_eq!(&*got, b"ping"); // the buffer goes back to the ring when `got` drops
/// });
/// ```
#[derive(Clone)]
pub struct BufRing {
    inner: Rc<Inner>,
}

impl BufRing {
    /// `entries` buffers (a power of two, at most 32768) of `buf_size` bytes each.
    pub fn new(entries: u16, buf_size: usize) -> io::Result<BufRing> {
        if entries == 0
            || !entries.is_power_of_two()
            || entries > 32768
            || buf_size == 0
            || buf_size > u32::MAX as usize
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "BufRing needs a power-of-two entry count (1..=32768) and a non-zero buffer size",
            ));
        }
        let uring = is_uring();
        let bgid = NEXT_BGID.with(|n| {
            let id = n.get();
            n.set(id.wrapping_add(1));
            id
        });
        let ring_layout = std::alloc::Layout::from_size_align(
            entries as usize * std::mem::size_of::<BufRingEntry>(),
            4096,
        )
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: non-zero size layout.
        let ring = unsafe { std::alloc::alloc_zeroed(ring_layout) } as *mut BufRingEntry;
        if ring.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        let mem = vec![0u8; entries as usize * buf_size].into_boxed_slice();
        let inner = Rc::new(Inner {
            bgid,
            mask: entries - 1,
            buf_size,
            ring,
            ring_layout,
            mem,
            tail: Cell::new(0),
            uring,
            free: RefCell::new(Vec::new()),
        });
        if uring {
            let res = with_core(|c| match &c.driver {
                // SAFETY: the ring memory stays allocated until Inner's Drop unregisters it.
                Driver::Uring(u) => u.with_submitter(|s| unsafe {
                    s.register_buf_ring_with_flags(ring as u64, entries, bgid, 0)
                }),
                Driver::Epoll(_) => unreachable!(),
            });
            if let Err(e) = res {
                // Not registered: don't unregister on drop.
                let inner = Rc::into_inner(inner).expect("sole owner");
                let mut inner = inner;
                inner.uring = false;
                drop(inner);
                return Err(e);
            }
        }
        for bid in 0..entries {
            inner.recycle(bid);
        }
        Ok(BufRing { inner })
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }

    /// The buffer group id, for raw operations that pick from this ring
    /// (`IOSQE_BUFFER_SELECT`; see [`crate::uring`]).
    pub fn group_id(&self) -> u16 {
        self.inner.bgid
    }

    /// The first `len` bytes of buffer `bid`, which a raw operation's completion filled.
    ///
    /// # Safety
    /// `bid` came from such a completion ([`crate::uring::buffer_id`]) and has not been given
    /// back yet; `len` is at most the completion's result.
    pub unsafe fn filled(&self, bid: u16, len: usize) -> &[u8] {
        let len = len.min(self.inner.buf_size);
        // SAFETY: the caller vouches that the kernel wrote these bytes and the buffer is still
        // checked out; bid is masked into the ring's memory.
        unsafe { std::slice::from_raw_parts(self.inner.buf_ptr(bid & self.inner.mask), len) }
    }

    /// Gives buffer `bid` (from a raw completion) back to the ring.
    pub fn give_back(&self, bid: u16) {
        self.inner.recycle(bid & self.inner.mask);
    }
}

impl Inner {
    fn buf_ptr(&self, bid: u16) -> *mut u8 {
        self.mem.as_ptr().wrapping_add(bid as usize * self.buf_size) as *mut u8
    }

    /// Gives buffer `bid` back to the kernel (or the free list).
    fn recycle(&self, bid: u16) {
        if !self.uring {
            self.free.borrow_mut().push(bid);
            return;
        }
        let tail = self.tail.get();
        // SAFETY: the slot index is masked into the ring; the kernel only reads entries below
        // the published tail, and this one is at the tail, so it is ours to write.
        let entry = unsafe { &mut *self.ring.add((tail & self.mask) as usize) };
        entry.set_addr(self.buf_ptr(bid) as u64);
        entry.set_len(self.buf_size as u32);
        entry.set_bid(bid);
        let tail = tail.wrapping_add(1);
        self.tail.set(tail);
        // SAFETY: the tail field lives in the ring's first entry and is read by the kernel; a
        // release store publishes the entry written above.
        unsafe {
            (*(BufRingEntry::tail(self.ring) as *const AtomicU16)).store(tail, Ordering::Release)
        };
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.uring {
            let bgid = self.bgid;
            let unregistered = try_with_core(|c| match &c.driver {
                Driver::Uring(u) => u.with_submitter(|s| s.unregister_buf_ring(bgid)).is_ok(),
                Driver::Epoll(_) => false,
            });
            if unregistered != Some(true) {
                // The kernel may still pick these buffers: leak them.
                std::mem::forget(std::mem::take(&mut self.mem));
                return;
            }
        }
        // SAFETY: allocated with this layout in `new`, no longer registered.
        unsafe { std::alloc::dealloc(self.ring as *mut u8, self.ring_layout) };
    }
}

/// A filled buffer from a [`BufRing`]; it returns to the ring when dropped.
pub struct ProvidedBuf {
    ring: Rc<Inner>,
    /// None for end-of-stream, which consumes no buffer.
    bid: Option<u16>,
    len: usize,
}

impl std::ops::Deref for ProvidedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let Some(bid) = self.bid else { return &[] };
        // SAFETY: the kernel (or recv) wrote `len` bytes into this buffer, which nobody else
        // uses until it is recycled in Drop.
        unsafe { std::slice::from_raw_parts(self.ring.buf_ptr(bid), self.len) }
    }
}

impl std::fmt::Debug for ProvidedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvidedBuf")
            .field("bid", &self.bid)
            .field("len", &self.len)
            .finish()
    }
}

// SAFETY: the buffer lies in the ring's boxed memory, which does not move and outlives every
// ProvidedBuf (each holds the ring); nobody else uses it until Drop recycles it.
unsafe impl IoBuf for ProvidedBuf {
    fn stable_ptr(&self) -> *const u8 {
        match self.bid {
            Some(bid) => self.ring.buf_ptr(bid),
            None => std::ptr::NonNull::dangling().as_ptr(),
        }
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.len
    }
}

impl Drop for ProvidedBuf {
    fn drop(&mut self) {
        if let Some(bid) = self.bid {
            self.ring.recycle(bid);
        }
    }
}

/// A completion for a dropped recv still consumed a buffer: give it back.
fn recycle_orphan(data: &mut dyn Any, _res: i32, flags: u32) {
    if flags & CQE_F_BUFFER != 0 {
        if let Some(ring) = data.downcast_ref::<Rc<Inner>>() {
            ring.recycle((flags >> CQE_BUFFER_SHIFT) as u16);
        }
    }
}

/// A provided-buffer receive's completion as what it gave: the buffer it filled, an empty one
/// at the end of the stream, or the error (a buffer it took anyway goes back to the ring).
fn completed(inner: Rc<Inner>, res: i32, flags: u32) -> io::Result<ProvidedBuf> {
    let buffer = (flags & CQE_F_BUFFER != 0).then_some((flags >> CQE_BUFFER_SHIFT) as u16);
    match (cvt(res), buffer) {
        (Ok(n), bid) => Ok(ProvidedBuf {
            ring: inner,
            bid,
            len: if bid.is_some() { n as usize } else { 0 },
        }),
        (Err(e), bid) => {
            if let Some(bid) = bid {
                inner.recycle(bid);
            }
            Err(e)
        }
    }
}

pub(crate) async fn recv_provided(fd: &SharedFd, ring: &BufRing) -> io::Result<ProvidedBuf> {
    let inner = ring.inner.clone();
    if inner.uring {
        let (target, fixed) = fd.uring_target();
        let op = Op::submit(inner, |r| {
            opcode::Recv::new(target, std::ptr::null_mut(), r.buf_size as u32)
                .buf_group(r.bgid)
                .build()
                .flags(fixed)
                .flags(squeue::Flags::BUFFER_SELECT)
        })
        .on_orphan(recycle_orphan);
        let (res, flags, inner) = op.await;
        completed(inner, res, flags)
    } else {
        let Some(bid) = inner.free.borrow_mut().pop() else {
            return Err(io::Error::from_raw_os_error(libc::ENOBUFS));
        };
        let mut buf = ProvidedBuf {
            ring: inner.clone(),
            bid: Some(bid),
            len: 0,
        };
        let ptr = inner.buf_ptr(bid);
        let n = fd
            .retry(Direction::Read, || {
                // SAFETY: the buffer `bid` is checked out to `buf`, owned by this future.
                cvt_sys(unsafe {
                    libc::recv(fd.raw(), ptr as *mut libc::c_void, inner.buf_size, 0)
                })
            })
            .await?;
        buf.len = n;
        Ok(buf)
    }
}

/// Receives on one socket into buffers of a [`BufRing`], from one multishot receive
/// (`IORING_RECV_MULTISHOT`, 6.0): armed once, it completes once per arrival until the stream
/// ends, an error comes, or the ring runs out of buffers; then the next call arms another. On
/// epoll cores, one `recv` per call. Made by [`TcpStream::recv_multi`](crate::net::TcpStream::recv_multi).
pub struct RecvMulti<'a> {
    fd: &'a SharedFd,
    ring: BufRing,
    op: Option<MultiOp>,
    ended: bool,
}

impl<'a> RecvMulti<'a> {
    pub(crate) fn new(fd: &'a SharedFd, ring: &BufRing) -> RecvMulti<'a> {
        RecvMulti {
            fd,
            ring: ring.clone(),
            op: None,
            ended: false,
        }
    }

    /// The next buffer of data; an empty one at the end of the stream, then `None`. An error
    /// does not end the stream: `ENOBUFS` says the ring ran out of buffers (give some back,
    /// by dropping the `ProvidedBuf`s held, and call again).
    pub async fn next(&mut self) -> Option<io::Result<ProvidedBuf>> {
        if self.ended {
            return None;
        }
        let inner = self.ring.inner.clone();
        if !inner.uring {
            let r = recv_provided(self.fd, &self.ring).await;
            self.ended = matches!(&r, Ok(b) if b.is_empty());
            return Some(r);
        }
        loop {
            let fd = self.fd;
            let op = self.op.get_or_insert_with(|| {
                let (target, fixed) = fd.uring_target();
                MultiOp::submit_with(
                    opcode::RecvMulti::new(target, inner.bgid)
                        .build()
                        .flags(fixed | squeue::Flags::BUFFER_SELECT),
                    Box::new(inner.clone()),
                    recycle_orphan,
                )
            });
            let Some((res, flags)) = std::future::poll_fn(|cx| op.poll_next(cx)).await else {
                // Ended with no completion left for us (a CQ overflow): arm a new one.
                self.op = None;
                continue;
            };
            if flags & CQE_F_MORE == 0 {
                // The kernel ended this multishot; the next call arms another.
                self.op = None;
            }
            let r = completed(inner, res, flags);
            self.ended = matches!(&r, Ok(b) if b.is_empty());
            return Some(r);
        }
    }
}
