//! Registered memory: one pool per core, registered once with io_uring (fixed buffers) and
//! exposed as raw memory for the RDMA drivers to register as memory regions, so the same pages
//! serve both without copies.
//!
//! Registration pins pages, which the kernel charges against `RLIMIT_MEMLOCK` unless the process
//! has `CAP_IPC_LOCK`. The pool checks the limit first and fails with [`Error::Memlock`], naming
//! the size needed, instead of a bare `ENOMEM` from deep inside the kernel.

use std::cell::RefCell;
use std::rc::Rc;

use crate::buf::{IoBuf, IoBufMut};
use crate::core::with_core;
use crate::driver::Driver;
use crate::error::Error;

struct Inner {
    base: *mut u8,
    len: usize,
    buf_size: usize,
    free: RefCell<Vec<u32>>,
    registered: bool,
}

/// A pool of equal, page-aligned buffers, locked in memory and registered with this core's
/// io_uring.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let pool = barewire_engine::pool::BufferPool::new(4, 4096).unwrap();
///     let mut b = pool.get().unwrap();
///     b.as_mut_slice()[..3].copy_from_slice(b"abc");
///     b.set_len(3);
///     assert_eq!(&b[..], b"abc");
///     assert_eq!(pool.available(), 3); // back to 4 when `b` drops
/// });
/// ```
#[derive(Clone)]
pub struct BufferPool {
    inner: Rc<Inner>,
}

/// Whether this thread may lock memory beyond RLIMIT_MEMLOCK (capabilities are per thread,
/// and the kernel checks the registering thread's).
fn has_cap_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/thread-self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// Fails with `Error::Memlock` if locking `needed` bytes would exceed the limit.
///
/// ```
/// // Ask before registering a large pool, and say what to raise if it would not fit.
/// if let Err(e) = barewire_engine::pool::check_memlock(64 << 30) {
///     eprintln!("{e}"); // names RLIMIT_MEMLOCK and how to raise it
/// }
/// assert!(barewire_engine::pool::check_memlock(0).is_ok());
/// ```
pub fn check_memlock(needed: u64) -> Result<(), Error> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur == libc::RLIM_INFINITY || needed <= lim.rlim_cur || has_cap_ipc_lock() {
        return Ok(());
    }
    Err(Error::Memlock {
        needed,
        limit: lim.rlim_cur,
    })
}

impl BufferPool {
    /// `count` buffers of `buf_size` bytes (rounded up to whole pages), registered with the
    /// current core's io_uring.
    pub fn new(count: usize, buf_size: usize) -> Result<BufferPool, Error> {
        if count == 0 || buf_size == 0 || count > u16::MAX as usize {
            return Err(Error::InvalidConfig(
                "BufferPool needs 1..=65535 buffers of non-zero size".into(),
            ));
        }
        let page = 4096;
        let buf_size = buf_size.div_ceil(page) * page;
        let len = count
            .checked_mul(buf_size)
            .ok_or_else(|| Error::InvalidConfig("pool size overflows".into()))?;
        check_memlock(len as u64)?;
        let base = map_anonymous(len).map_err(|e| Error::io("mmap for the buffer pool", e))?;
        let mut inner = Inner {
            base,
            len,
            buf_size,
            free: RefCell::new((0..count as u32).rev().collect()),
            registered: false,
        };
        let res = with_core(|c| match &c.driver {
            Driver::Uring(u) => {
                let iovecs: Vec<libc::iovec> = (0..count)
                    .map(|i| libc::iovec {
                        iov_base: base.wrapping_add(i * buf_size) as *mut libc::c_void,
                        iov_len: buf_size,
                    })
                    .collect();
                // SAFETY: the iovecs describe our mapping, which stays mapped until Drop, after
                // the buffers are unregistered.
                Some(u.with_submitter(|s| unsafe { s.register_buffers(&iovecs) }))
            }
            Driver::Epoll(_) => None,
        });
        match res {
            Some(Ok(())) => inner.registered = true,
            Some(Err(e)) if e.raw_os_error() == Some(libc::ENOMEM) => {
                drop(inner);
                return Err(Error::Memlock {
                    needed: len as u64,
                    limit: current_memlock(),
                });
            }
            Some(Err(e)) => {
                drop(inner);
                return Err(Error::io(
                    "registering fixed buffers with io_uring (one pool per core)",
                    e,
                ));
            }
            None => {}
        }
        Ok(BufferPool {
            inner: Rc::new(inner),
        })
    }

    /// Takes a free buffer, or `None` if all are in use.
    pub fn get(&self) -> Option<FixedBuf> {
        let index = self.inner.free.borrow_mut().pop()?;
        Some(FixedBuf {
            pool: self.inner.clone(),
            index,
            len: 0,
        })
    }

    /// Free buffers left.
    pub fn available(&self) -> usize {
        self.inner.free.borrow().len()
    }

    /// The whole pool's memory, for registering it as an RDMA memory region.
    pub fn as_raw(&self) -> (*mut u8, usize) {
        (self.inner.base, self.inner.len)
    }

    /// Size of each buffer.
    pub fn buf_size(&self) -> usize {
        self.inner.buf_size
    }
}

fn current_memlock() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid rlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    lim.rlim_cur
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.registered {
            let ok = crate::core::try_with_core(|c| match &c.driver {
                Driver::Uring(u) => u.with_submitter(|s| s.unregister_buffers()).is_ok(),
                Driver::Epoll(_) => true,
            });
            if ok != Some(true) {
                return; // still registered somewhere: leak the mapping.
            }
        }
        // SAFETY: our mapping, no longer registered, and no FixedBuf is alive (they hold the Rc).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// One buffer of a [`BufferPool`]; it goes back to the pool when dropped.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
/// rt.block_on(async {
///     let pool = barewire_engine::pool::BufferPool::new(2, 4096).unwrap();
///     let mut b = pool.get().unwrap();
///     assert_eq!((b.capacity(), b.len()), (4096, 0));
///     b.as_mut_slice()[..5].copy_from_slice(b"bytes");
///     b.set_len(5); // what a write sends, or a read filled
///     assert_eq!(&b[..], b"bytes");
///     drop(b);
///     assert_eq!(pool.available(), 2);
/// });
/// ```
pub struct FixedBuf {
    pool: Rc<Inner>,
    index: u32,
    len: usize,
}

impl FixedBuf {
    fn ptr(&self) -> *mut u8 {
        self.pool
            .base
            .wrapping_add(self.index as usize * self.pool.buf_size)
    }

    /// The io_uring fixed-buffer index, if the pool is registered.
    pub(crate) fn uring_index(&self) -> Option<u16> {
        self.pool.registered.then_some(self.index as u16)
    }

    /// The whole buffer, for filling.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: this buffer is checked out to us alone, inside the live mapping.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(), self.pool.buf_size) }
    }

    /// Sets how many bytes hold data (what a write sends).
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.pool.buf_size,
            "FixedBuf::set_len beyond the buffer"
        );
        self.len = len;
    }

    /// Capacity of the buffer.
    pub fn capacity(&self) -> usize {
        self.pool.buf_size
    }
}

impl std::ops::Deref for FixedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are initialised (mmap zero-fills; set_len is bounded).
        unsafe { std::slice::from_raw_parts(self.ptr(), self.len) }
    }
}

impl Drop for FixedBuf {
    fn drop(&mut self) {
        self.pool.free.borrow_mut().push(self.index);
    }
}

// SAFETY: the memory is inside the pool's mapping, which lives as long as any FixedBuf (Rc).
unsafe impl IoBuf for FixedBuf {
    fn stable_ptr(&self) -> *const u8 {
        self.ptr()
    }
    fn bytes_init(&self) -> usize {
        self.len
    }
    fn bytes_total(&self) -> usize {
        self.pool.buf_size
    }
}

// SAFETY: as above; set_init records bytes the kernel wrote.
unsafe impl IoBufMut for FixedBuf {
    fn stable_mut_ptr(&mut self) -> *mut u8 {
        self.ptr()
    }
    unsafe fn set_init(&mut self, n: usize) {
        self.len = n.min(self.pool.buf_size);
    }
}

impl Unpin for FixedBuf {}

/// Maps `len` bytes of anonymous private memory, readable and writable, page-aligned; the
/// kernel zeroes each page on first touch, so a large mapping costs nothing until used.
/// Unmap it with `libc::munmap(ptr, len)`.
///
/// ```
/// let p = barewire_engine::map_anonymous(1 << 20).unwrap();
/// assert_eq!(p as usize % 4096, 0);
/// // SAFETY: unmapping the mapping just made, which nothing else uses.
/// unsafe { libc::munmap(p.cast(), 1 << 20) };
/// ```
pub fn map_anonymous(len: usize) -> std::io::Result<*mut u8> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as *mut u8)
}
