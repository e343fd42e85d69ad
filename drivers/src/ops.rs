//! Async one-sided and two-sided operations whose futures complete on their own work
//! completion, over registered memory that barewire owns.
//!
//! A future that is dropped before its completion does not free anything the device may still
//! touch: the buffers it names stay alive in the endpoint's table until the completion arrives
//! (as a dropped io_uring operation parks its buffer until its CQE).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::hash::BuildHasherDefault;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use barewire_engine::{copy_bulk, spawn_local, JoinHandle};

use crate::api::{
    Access, CompletionQueue, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, RegionDescriptor,
    SendOp, SendWr, Sge, Sges, WcStatus, WorkCompletion,
};
use crate::transport::DriverError;
use barewire_rdma_types::StagHasher;

/// The panic of a bounds check on a buffer or mapping: out of line, so that the checks on
/// every message's path compile to a compare and a branch, with no panic arguments spilled
/// before it.
#[cold]
#[inline(never)]
#[track_caller]
fn overrun(what: &str, offset: usize, len: usize, size: usize) -> ! {
    panic!("{len} bytes at {offset} overrun a {size}-byte {what}")
}

/// The bounds check of every buffer, mapping and span here: `len` bytes at `offset` must lie
/// within the `size` bytes of the `what`, or it panics (see `overrun`).
#[inline(always)]
fn check_within(what: &str, offset: usize, len: usize, size: usize) {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        overrun(what, offset, len, size);
    }
}

/// The panic of an atomic word access at an address not aligned to the word (see `overrun`).
#[cold]
#[inline(never)]
#[track_caller]
fn unaligned(offset: usize, size: usize) -> ! {
    panic!("unaligned {size}-byte word at {offset}")
}

/// The little-endian 4-byte word at `p`, loaded with acquire ordering (what a `Span` of a
/// buffer or of a mapping reads a watched word with).
///
/// # Safety
/// `p` must be aligned to 4 and valid for reads of 4 bytes.
#[inline(always)]
unsafe fn load_u32_le_acquire(p: *const u8) -> u32 {
    // SAFETY: aligned and readable (the caller's promise); AtomicU32 has u32's layout.
    let w = unsafe {
        (*(p as *const std::sync::atomic::AtomicU32)).load(std::sync::atomic::Ordering::Acquire)
    };
    u32::from_le(w)
}

/// Registered memory owned by barewire: zeroed, aligned as asked, freed only once no work
/// request can reach it. Its bytes are read and written by copying (`read_at`, `write_at`),
/// because the device or a peer may change them at any time the access rights allow.
pub struct Buffer {
    mr: std::mem::ManuallyDrop<MemoryRegion>,
    ptr: *mut u8,
    /// The region's length, kept here: every access checks against it.
    len: usize,
    memory: Memory,
}

/// Where a buffer's bytes come from.
enum Memory {
    /// The heap, for small buffers.
    Heap(std::alloc::Layout),
    /// An anonymous mapping of this many bytes, for large ones: the kernel zeroes each page on
    /// first touch, so a large region costs nothing until used (the heap's aligned zeroed
    /// allocation writes every byte first: seconds of page faults for a few GiB, during which
    /// the core answers nobody).
    Mapped(usize),
    /// Memory the protection domain's backend allocated (shm: a sealed memfd it can grant to
    /// a peer process on this host).
    Backend(SharedMemory),
}

/// Memory a backend allocates for its buffers (see `PdOps::allocate`).
pub(crate) trait BackendMemory {
    /// The first byte.
    fn ptr(&self) -> *mut u8;
    /// Gives the memory up: called once, when the buffer goes (after its region).
    fn release(&self);
}

/// A backend's memory for one buffer.
pub(crate) type SharedMemory = Box<dyn BackendMemory>;

/// Buffers at least this large (and aligned to at most a page) are mapped, not allocated.
const MAP_AT: usize = 1 << 20;

impl Buffer {
    /// Allocates and registers `len` bytes aligned to `align` (a power of two: 64 for a cache
    /// line, 4096 for a page, or what a device requires).
    ///
    /// ```
    /// use barewire_drivers::{Access, Buffer, Device, DriverConfig};
    /// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    /// buf.write_at(0, b"hello");
    /// let mut out = [0u8; 5];
    /// buf.read_at(0, &mut out);
    /// assert_eq!(&out, b"hello");
    /// ```
    pub fn new(
        pd: &ProtectionDomain,
        len: usize,
        align: usize,
        access: Access,
    ) -> Result<Rc<Buffer>, DriverError> {
        let layout =
            std::alloc::Layout::from_size_align(len.max(1), align.max(1)).map_err(|e| {
                DriverError::Unsupported(format!("buffer of {len} B aligned {align}: {e}"))
            })?;
        let (ptr, memory) = if let Some(m) = pd.ops.allocate(len, align) {
            let m = m?;
            (m.ptr(), Memory::Backend(m))
        } else if len >= MAP_AT && align <= 4096 {
            let p = barewire_engine::map_anonymous(len).map_err(|e| {
                let what = format!("mapping a buffer of {len} B: {e}");
                if e.raw_os_error() == Some(libc::ENOMEM) {
                    DriverError::OutOfMemory(what)
                } else {
                    DriverError::Unsupported(what)
                }
            })?;
            (p, Memory::Mapped(len))
        } else {
            // SAFETY: a non-zero-sized layout.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                // An error for the caller, not the allocator's abort of the whole process (a
                // large buffer with an alignment over a page comes this way).
                return Err(DriverError::OutOfMemory(format!(
                    "allocating a buffer of {len} B aligned {align}: {}",
                    std::io::Error::from_raw_os_error(libc::ENOMEM)
                )));
            }
            (p, Memory::Heap(layout))
        };
        // SAFETY: the memory lives until Drop, which deregisters the region first.
        match unsafe { pd.register(ptr, len, access) } {
            Ok(mr) => Ok(Rc::new(Buffer {
                len: mr.len(),
                mr: std::mem::ManuallyDrop::new(mr),
                ptr,
                memory,
            })),
            Err(e) => {
                // SAFETY: freeing what we allocated; nothing was registered.
                unsafe { memory.free(ptr) };
                Err(e)
            }
        }
    }

    /// The region.
    pub fn region(&self) -> &MemoryRegion {
        &self.mr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What a peer needs to address this buffer.
    pub fn descriptor(&self) -> RegionDescriptor {
        self.mr.descriptor()
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) {
        check_within("buffer", offset, len, self.len());
    }

    /// Copies bytes out. Panics if the range is outside the buffer.
    #[inline]
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        self.span(offset, out.len()).read(0, out)
    }

    /// Copies bytes in. Panics if the range is outside the buffer.
    #[inline]
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        self.span(offset, data.len()).write(0, data)
    }

    /// Sets `len` bytes at `offset` to zero. Panics if the range is outside the buffer.
    #[inline]
    pub fn zero(&self, offset: usize, len: usize) {
        self.check(offset, len);
        // SAFETY: in bounds (checked); a plain store with no reference into shared memory.
        unsafe { std::ptr::write_bytes(self.ptr.add(offset), 0, len) }
    }

    /// Reads the aligned 8-byte word at `offset` (native endian), atomically with respect to
    /// the device's atomics on it.
    #[inline]
    pub fn load_u64(&self, offset: usize) -> u64 {
        self.check(offset, 8);
        if (self.ptr as usize + offset) % 8 != 0 {
            unaligned(offset, 8);
        }
        // SAFETY: an aligned, in-bounds word; AtomicU64 has u64's layout.
        unsafe {
            (*(self.ptr.add(offset) as *const std::sync::atomic::AtomicU64))
                .load(std::sync::atomic::Ordering::Acquire)
        }
    }

    /// Writes `v` as 4 little-endian bytes at `offset` (any alignment): a plain store, as
    /// `write_at` of its bytes, without a call to copy 4 bytes. Panics if outside the buffer.
    #[inline]
    pub fn store_u32_le(&self, offset: usize, v: u32) {
        self.span(offset, 4).store_u32_le(0, v)
    }

    /// Reads the aligned little-endian 4-byte word at `offset` with acquire ordering: what a
    /// task watching memory a peer writes uses (a peer's later bytes are then read after it).
    /// Panics if the word is outside the buffer or unaligned.
    #[inline]
    pub fn load_u32_le(&self, offset: usize) -> u32 {
        self.span(offset, 4).load_u32_le(0)
    }

    /// The `len` bytes at `offset`, checked once here, for a run of accesses to one record
    /// (a channel's slot: its length word, its message, its mark). Panics if the range is
    /// outside the buffer.
    ///
    /// Each access through the span checks only against the span's length, a value the
    /// caller holds. A run of the buffer's own accesses checks each against the buffer, and
    /// after every store the compiler loads the buffer's address and length again, since the
    /// store went through a raw pointer that might, for all it knows, have changed them.
    ///
    /// ```
    /// use barewire_drivers::{Access, Buffer, Device, DriverConfig};
    /// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
    /// let s = buf.span(64, 16);
    /// s.store_u32_le(0, 5);
    /// s.write(4, b"hello");
    /// assert_eq!(buf.load_u32_le(64), 5);
    /// let mut out = [0u8; 5];
    /// buf.read_at(68, &mut out);
    /// assert_eq!(&out, b"hello");
    /// ```
    #[inline]
    pub fn span(&self, offset: usize, len: usize) -> Span<'_> {
        self.check(offset, len);
        Span {
            // SAFETY: `offset` is inside the buffer (checked above; the end may be one past).
            ptr: unsafe { self.ptr.add(offset) },
            len,
            at: offset,
            _of: std::marker::PhantomData,
        }
    }

    /// An SGE for `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        self.check(offset, len);
        self.mr.sge(offset, len)
    }
}

/// A checked range of a [`Buffer`] ([`Buffer::span`]), or of a [`MappedRemote`]
/// ([`MappedRemote::span`], a [`MappedSpan`]), with the accesses of what it covers, each
/// checked against the span. Offsets count from the span's start.
pub struct Span<'a, Of = Buffer> {
    ptr: *mut u8,
    len: usize,
    /// Where it starts in what it covers: an unaligned word's panic names that offset.
    at: usize,
    _of: std::marker::PhantomData<&'a Of>,
}

// (By hand: derived, they would ask `Of` to be `Copy`, which a buffer is not.)
impl<Of> Clone for Span<'_, Of> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<Of> Copy for Span<'_, Of> {}

impl<Of> Span<'_, Of> {
    #[inline]
    fn check(&self, offset: usize, len: usize) {
        check_within("span", offset, len, self.len);
    }
}

impl Span<'_> {
    /// Copies bytes out.
    #[inline]
    pub fn read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: inside the span (checked), which is inside the buffer (checked when it was
        // made), and the buffer outlives the span; a plain copy with no reference into
        // memory a peer may write.
        unsafe { copy_bulk(self.ptr.add(offset), out.as_mut_ptr(), out.len()) }
    }

    /// Copies bytes in.
    #[inline]
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: as `read`.
        unsafe { copy_bulk(data.as_ptr(), self.ptr.add(offset), data.len()) }
    }

    /// Writes `v` as 4 little-endian bytes (any alignment): a plain store.
    #[inline]
    pub fn store_u32_le(&self, offset: usize, v: u32) {
        self.check(offset, 4);
        // SAFETY: as `read`; an unaligned plain store.
        unsafe { std::ptr::write_unaligned(self.ptr.add(offset) as *mut u32, v.to_le()) }
    }

    /// Reads the aligned little-endian 4-byte word with acquire ordering (see
    /// [`Buffer::load_u32_le`]). Panics if it is unaligned.
    #[inline]
    pub fn load_u32_le(&self, offset: usize) -> u32 {
        self.check(offset, 4);
        if (self.ptr as usize + offset) % 4 != 0 {
            unaligned(self.at + offset, 4);
        }
        // SAFETY: an aligned word inside the span (checked).
        unsafe { load_u32_le_acquire(self.ptr.add(offset)) }
    }
}

/// A peer's registered memory mapped into this process, for storing into it directly, with no
/// work request: what shm offers ([`QueuePair::map_remote`](crate::QueuePair::map_remote))
/// once the peer has granted the key. It is reached through checked spans
/// ([`span`](Self::span)). Stores become visible to the peer in program order and each
/// [`MappedSpan::write`](Span::write) in ascending address order, so a peer that watches the
/// memory (as it would a Write's last word) sees a record's last word only after the rest of
/// it.
///
/// The mapping stays valid while this value lives, whatever the peer does: a region the peer
/// deregisters afterwards (or a peer that dies) leaves pages nobody reads, never a fault. The
/// caller learns of such ends as before, from the connection.
pub struct MappedRemote {
    ptr: *mut u8,
    len: usize,
    peer: Box<dyn crate::backend::MappedPeer>,
}

impl MappedRemote {
    pub(crate) fn new(
        ptr: *mut u8,
        len: usize,
        peer: Box<dyn crate::backend::MappedPeer>,
    ) -> MappedRemote {
        MappedRemote { ptr, len, peer }
    }

    /// Length in bytes (the region's).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn check(&self, offset: usize, len: usize) {
        check_within("mapped region", offset, len, self.len);
    }

    /// The `len` bytes at `offset`, checked once for the accesses made through them (a
    /// message's slot: its bytes, its mark and its length word). The span starts on a 4-byte
    /// boundary, so a word at an offset that is a multiple of 4 needs no further alignment
    /// check, and one at a constant offset none at run time. Panics if the range is outside
    /// the region or its start is unaligned.
    #[inline]
    pub fn span(&self, offset: usize, len: usize) -> MappedSpan<'_> {
        self.check(offset, len);
        if (self.ptr as usize + offset) % 4 != 0 {
            unaligned(offset, 4);
        }
        MappedSpan {
            // SAFETY: `offset` is within the mapping (checked: `offset + len <= self.len`).
            ptr: unsafe { self.ptr.add(offset) },
            len,
            at: offset,
            _of: std::marker::PhantomData,
        }
    }

    /// Wakes the peer's core if it sleeps, so that it looks at what was stored: call it after a
    /// batch of stores, before this task waits (it costs a fence). A peer that is awake sees the
    /// stores without it.
    pub fn wake_peer(&self) {
        self.peer.wake_if_asleep()
    }
}

/// A checked range of a [`MappedRemote`] ([`MappedRemote::span`]), starting on a 4-byte
/// boundary (checked when it was made), with the mapping's own accesses, each checked against
/// the span. Offsets count from the span's start.
pub type MappedSpan<'a> = Span<'a, MappedRemote>;

impl MappedSpan<'_> {
    /// The word at `offset`, checked: inside the span and aligned (the span's start is, so
    /// only `offset` is looked at, which a constant offset settles at compile time).
    #[inline]
    fn word(&self, offset: usize) -> *mut u8 {
        self.check(offset, 4);
        if offset % 4 != 0 {
            unaligned(self.at + offset, 4);
        }
        // SAFETY: inside the span (checked), which is inside the mapping.
        unsafe { self.ptr.add(offset) }
    }

    /// Copies `data` to `offset`. Its bytes reach the peer in no particular order among
    /// themselves; a later [`store_u32_le`](Self::store_u32_le) (a release store) publishes
    /// them: a peer that reads that word with acquire ordering and finds it written finds
    /// them written too. Panics if the range is outside the span.
    #[inline]
    pub fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: inside the span (checked), which is inside the mapping the `MappedRemote`
        // this borrows keeps mapped; `data` is this process's own memory, never inside the
        // peer's mapping.
        unsafe { copy_chunks(data.as_ptr(), self.ptr.add(offset), data.len()) }
    }

    /// Stores `v` as 4 little-endian bytes at `offset` (aligned to 4), after every earlier
    /// store (release ordering). Panics if outside the span or unaligned.
    #[inline]
    pub fn store_u32_le(&self, offset: usize, v: u32) {
        let p = self.word(offset);
        // SAFETY: an aligned word inside the mapping (`word`); AtomicU32 has u32's layout.
        unsafe {
            (*(p as *const std::sync::atomic::AtomicU32))
                .store(v.to_le(), std::sync::atomic::Ordering::Release)
        }
    }

    /// Reads the aligned little-endian 4-byte word at `offset` with acquire ordering (a word
    /// this process stored there, read back). Panics if outside the span or unaligned.
    #[inline]
    pub fn load_u32_le(&self, offset: usize) -> u32 {
        let p = self.word(offset);
        // SAFETY: an aligned word inside the mapping (`word`).
        unsafe { load_u32_le_acquire(p) }
    }
}

/// Copies `len` bytes from `src` to `dst` inline, 16 bytes a store, in no promised order: a
/// message published afterwards by a release store (a channel's slot, whose length word is
/// stored last). Four stores for a 64-byte message wherever it lies, where
/// [`copy_ascending`], whose stores are aligned pieces, needs five or six when the message
/// does not start on a 16-byte boundary.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline]
pub(crate) unsafe fn copy_chunks(src: *const u8, dst: *mut u8, len: usize) {
    let mut off = 0;
    while len - off >= 16 {
        // SAFETY: within both ranges (the caller's promise); unaligned access is allowed.
        unsafe {
            let v = std::ptr::read_unaligned(src.add(off) as *const u128);
            std::ptr::write_unaligned(dst.add(off) as *mut u128, v);
        }
        off += 16;
    }
    // SAFETY: the last `len - off` (< 16) bytes of both ranges.
    unsafe { copy_small(src.add(off), dst.add(off), len - off) }
}

/// Copies `len` bytes from `src` to `dst` so that another CPU sees them land in ascending
/// address order: one that reads a byte of `dst` (with acquire ordering) and finds it written
/// will find every earlier byte written too. `memcpy` promises no such order (string stores
/// and non-temporal stores may become visible out of order), and a peer that watches its
/// memory for the last word of a message relies on it.
///
/// Every store is of a naturally aligned piece (1, 2, 4, 8 or 16 bytes at an address that is a
/// multiple of its size), so none is split across two cache lines, whose halves could land in
/// either order; an aligned 8-byte message lands in one store, not eight. Each store is
/// followed by a release fence: on x86 (whose stores are seen in program order) that only keeps
/// the compiler from reordering or merging them, and costs nothing; on weaker machines it
/// orders them.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline]
pub(crate) unsafe fn copy_ascending(src: *const u8, dst: *mut u8, len: usize) {
    use std::sync::atomic::{fence, Ordering};
    /// Copies one `T`-sized piece at `off` (aligned at `dst`) and fences.
    ///
    /// # Safety
    /// As `copy_ascending`, for `off..off + size_of::<T>()`; `dst + off` aligned to `T`'s size.
    #[inline(always)]
    unsafe fn piece<T: Copy>(src: *const u8, dst: *mut u8, off: usize) -> usize {
        // SAFETY: within both ranges (the caller's promise); the source may be unaligned,
        // the destination is aligned to the piece's size.
        unsafe {
            let v = std::ptr::read_unaligned(src.add(off) as *const T);
            std::ptr::write_unaligned(dst.add(off) as *mut T, v);
        }
        fence(Ordering::Release);
        off + std::mem::size_of::<T>()
    }
    let mut off = 0;
    // SAFETY: every `piece` below copies bytes below `len` (each is taken only when that many
    // are left), at a destination address aligned to its size (the head checks the address;
    // the body and tail start at a 16-byte boundary and go in decreasing sizes).
    unsafe {
        // Up to a 16-byte boundary of dst, each piece as large as the address allows...
        while off < len && (dst as usize + off) % 16 != 0 {
            let (at, left) = (dst as usize + off, len - off);
            off = if at % 8 == 0 && left >= 8 {
                piece::<u64>(src, dst, off)
            } else if at % 4 == 0 && left >= 4 {
                piece::<u32>(src, dst, off)
            } else if at % 2 == 0 && left >= 2 {
                piece::<u16>(src, dst, off)
            } else {
                piece::<u8>(src, dst, off)
            };
        }
        // ...then aligned 16-byte pieces...
        while len - off >= 16 {
            off = piece::<u128>(src, dst, off);
        }
        // ...and the tail, from a 16-byte boundary: at most 8, 4, 2 and 1 bytes, in that order.
        if len - off >= 8 {
            off = piece::<u64>(src, dst, off);
        }
        if len - off >= 4 {
            off = piece::<u32>(src, dst, off);
        }
        if len - off >= 2 {
            off = piece::<u16>(src, dst, off);
        }
        if len - off >= 1 {
            piece::<u8>(src, dst, off);
        }
    }
}

/// Copies `len` bytes from `src` to `dst`: inline for up to 16 bytes (an 8-byte READ or
/// atomic result is one load and one store, not a call to `memcpy` with a length it must
/// examine), [`copy_bulk`] otherwise.
///
/// # Safety
/// `src` must be readable and `dst` writable for `len` bytes; they may not overlap.
#[inline(always)]
pub(crate) unsafe fn copy_small(src: *const u8, dst: *mut u8, len: usize) {
    // SAFETY: every read and write stays within the `len` bytes of its range (the caller's
    // promise); unaligned access is allowed.
    unsafe {
        match len {
            8..=16 => {
                // The first and the last eight bytes (overlapping below 16).
                let a = std::ptr::read_unaligned(src as *const u64);
                let b = std::ptr::read_unaligned(src.add(len - 8) as *const u64);
                std::ptr::write_unaligned(dst as *mut u64, a);
                std::ptr::write_unaligned(dst.add(len - 8) as *mut u64, b);
            }
            4..=7 => {
                let a = std::ptr::read_unaligned(src as *const u32);
                let b = std::ptr::read_unaligned(src.add(len - 4) as *const u32);
                std::ptr::write_unaligned(dst as *mut u32, a);
                std::ptr::write_unaligned(dst.add(len - 4) as *mut u32, b);
            }
            0..=3 => {
                for i in 0..len {
                    *dst.add(i) = *src.add(i);
                }
            }
            _ => copy_bulk(src, dst, len),
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // The region goes before the memory it covers.
        // SAFETY: mr is dropped exactly once, here, and not used afterwards; then the bytes
        // are freed with the layout they were allocated with.
        unsafe {
            std::mem::ManuallyDrop::drop(&mut self.mr);
            self.memory.free(self.ptr);
        }
    }
}

impl Memory {
    /// # Safety
    /// `ptr` is what this memory was allocated or mapped at, and is not used afterwards.
    unsafe fn free(&self, ptr: *mut u8) {
        match self {
            // SAFETY: as the caller promises.
            Memory::Heap(layout) => unsafe { std::alloc::dealloc(ptr, *layout) },
            // SAFETY: as the caller promises; the whole mapping goes.
            Memory::Mapped(len) => unsafe {
                libc::munmap(ptr as *mut libc::c_void, *len);
            },
            // The mapping goes with the last reference; the pages go now.
            Memory::Backend(m) => {
                let _ = ptr;
                m.release();
            }
        }
    }
}

/// Where a one-sided operation lands: a peer's region and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote {
    /// The region.
    pub region: RegionDescriptor,
    /// Byte offset into it.
    pub offset: u64,
}

impl Remote {
    /// `offset` bytes into `region`.
    pub fn at(region: RegionDescriptor, offset: u64) -> Remote {
        Remote { region, offset }
    }
    fn addr(&self) -> u64 {
        self.region.addr + self.offset
    }
}

/// The buffers an operation holds: one or two, inline (an operation allocates nothing).
type Hold = smallvec::SmallVec<[Rc<Buffer>; 2]>;

struct Pending {
    done: Option<WorkCompletion>,
    waker: Option<Waker>,
    /// What the device may still touch until the completion arrives.
    hold: Hold,
    /// The future was dropped: forget the entry when the completion comes.
    abandoned: bool,
    /// A receive (counted in `Table::recvs`).
    recv: bool,
}

#[derive(Default)]
struct Table {
    next: u64,
    pending: HashMap<u64, Pending, BuildHasherDefault<StagHasher>>,
    closed: bool,
    /// Receives posted and not yet completed.
    recvs: usize,
    /// The tasks that route completions into this table (one per completion queue).
    routes: Vec<JoinHandle<()>>,
}

impl Table {
    /// Once the endpoint is gone and nothing it posted is outstanding, no completion will
    /// come to wake the routing tasks: they are ended here (by whoever empties the table, a
    /// routing task included, at the top of its loop). One left waiting would keep its
    /// completion queue and this table for the life of the core.
    fn end_routes_if_done(&mut self) {
        if self.closed && self.pending.is_empty() {
            for task in self.routes.drain(..) {
                task.cancel();
            }
        }
    }

    fn complete(&mut self, wc: WorkCompletion) {
        let Some(p) = self.pending.get_mut(&wc.wr_id) else {
            return;
        };
        if std::mem::take(&mut p.recv) {
            self.recvs -= 1;
        }
        if p.abandoned {
            self.pending.remove(&wc.wr_id); // drops the held buffers: the device is done
            return;
        }
        p.done = Some(wc);
        p.hold.clear();
        if let Some(w) = p.waker.take() {
            w.wake();
        }
    }
}

/// A queue pair with async operations. It owns the queue pair's two completion queues: a task
/// on the current core routes each completion to the future waiting for it.
///
/// ```no_run
/// # async fn demo() -> Result<(), barewire_drivers::DriverError> {
/// use barewire_drivers::*;
/// let dev = Device::from_env()?;
/// let pd = dev.alloc_pd()?;
/// let (scq, rcq) = (dev.create_cq(256)?, dev.create_cq(256)?);
/// let (qp, peer) = connect("127.0.0.1:7471".parse().unwrap(), &pd, &scq, &rcq,
///                          &ConnectOptions::default()).await?;
/// let remote = RegionDescriptor::from_bytes(&peer).unwrap();
/// let ep = Endpoint::new(qp, scq, rcq);
/// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE)?;
/// buf.write_at(0, b"hello, remote memory");
/// ep.write(&buf, 0, 20, Remote::at(remote, 0)).await?;
/// ep.read(&buf, 100, 20, Remote::at(remote, 0)).await?;
/// let old = ep.fetch_add(&buf, 200, Remote::at(remote, 64), 1).await?;
/// # let _ = old; Ok(()) }
/// ```
pub struct Endpoint {
    qp: QueuePair,
    table: Rc<RefCell<Table>>,
    /// Held by each routing task while it lives (see `routing_probe`).
    routing: Rc<()>,
    /// Buffers named by unsignaled requests since the last signaled send: the next signaled
    /// send holds them, because its completion implies theirs (the send queue completes in
    /// order).
    unsignaled: RefCell<Vec<Rc<Buffer>>>,
    /// Unsignaled requests posted since the last signaled one.
    unsignaled_run: Cell<usize>,
    /// The most unsignaled requests in a row: the next is signaled (see `post_unsignaled`).
    unsignaled_limit: usize,
    /// The send completion queue, also routed by a task: a signaled send drains it first once
    /// it is half full (see `drain_sends_if_full`).
    scq: CompletionQueue,
    /// How many completions the receive queue holds: the most receives `recv` keeps
    /// outstanding (`None` for `sends_only`, whose owner takes receive completions itself).
    rcq_capacity: Option<usize>,
}

impl Endpoint {
    /// Wraps a connected queue pair and its completion queues (which it then owns).
    pub fn new(qp: QueuePair, scq: CompletionQueue, rcq: CompletionQueue) -> Endpoint {
        let mut ep = Endpoint::sends_only(qp, scq);
        ep.rcq_capacity = Some(rcq.capacity());
        ep.route(rcq);
        ep
    }

    /// As [`new`](Self::new), for owners that post their own receives with `qp().post_recv`,
    /// keep their buffers, and take receive completions themselves with
    /// [`CompletionQueue::poll`] (from a [`Poller`](barewire_engine::Poller), say, which then
    /// sees each one in the same pass the provider delivers it, with no task woken).
    pub fn sends_only(qp: QueuePair, scq: CompletionQueue) -> Endpoint {
        let slots = scq
            .capacity()
            .min(qp.send_queue_depth().unwrap_or(usize::MAX));
        let ep = Endpoint {
            qp,
            table: Rc::new(RefCell::new(Table::default())),
            routing: Rc::new(()),
            unsignaled: RefCell::new(Vec::new()),
            unsignaled_run: Cell::new(0),
            unsignaled_limit: (slots / 2).max(1),
            scq: scq.clone(),
            rcq_capacity: None,
        };
        ep.route(scq);
        ep
    }

    /// A task that hands each completion of `cq` to the future waiting for it, until the
    /// endpoint is gone and nothing it posted is outstanding (see `Drop`).
    fn route(&self, cq: CompletionQueue) {
        let t = self.table.clone();
        let alive = self.routing.clone();
        let task = spawn_local(async move {
            let _alive = alive;
            loop {
                {
                    let mut t = t.borrow_mut();
                    if t.closed && t.pending.is_empty() {
                        // The others too (this one among them: it returns now anyway).
                        t.end_routes_if_done();
                        return;
                    }
                }
                let wc = cq.next().await;
                t.borrow_mut().complete(wc);
            }
        });
        self.table.borrow_mut().routes.push(task);
    }

    /// Upgradable while any of this endpoint's routing tasks lives, which is until the
    /// endpoint is dropped and nothing it posted is outstanding: for tests that check an
    /// endpoint leaves nothing behind.
    #[doc(hidden)]
    pub fn routing_probe(&self) -> std::rc::Weak<()> {
        Rc::downgrade(&self.routing)
    }

    /// The queue pair.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// Posts a send work request without a completion of its own (perftest's moderation):
    /// cheaper, and on the software provider no remote-completion round trip; it is
    /// transmitted with the next progress pass, batched with others (see
    /// [`QueuePair::post_send_batched`]). `hold` stays
    /// alive until a later signaled send on this endpoint completes.
    ///
    /// An unsignaled request keeps its send-queue slot (on verbs) until a later signaled one
    /// completes, so a queue given only unsignaled requests would fill and refuse the next
    /// post. The endpoint signals one itself when half the smaller of the send queue
    /// ([`QueuePair::send_queue_depth`]) and the send completion queue has gone unsignaled
    /// in a row, on every transport alike; its completion is routed like any other and
    /// releases the buffers held so far.
    pub fn post_unsignaled(
        &self,
        op: SendOp,
        sges: impl Into<Sges>,
        hold: &Rc<Buffer>,
    ) -> Result<(), DriverError> {
        self.post_unsignaled_with(op, sges, hold, true)
    }

    /// As [`post_unsignaled`](Self::post_unsignaled), transmitted at once (`batched: false`)
    /// or with the next progress pass (`batched: true`).
    pub fn post_unsignaled_with(
        &self,
        op: SendOp,
        sges: impl Into<Sges>,
        hold: &Rc<Buffer>,
        batched: bool,
    ) -> Result<(), DriverError> {
        let post = |wr: SendWr| {
            if batched {
                self.qp.post_send_batched(wr)
            } else {
                self.qp.post_send(wr)
            }
        };
        let sges = sges.into();
        let run = self.unsignaled_run.get() + 1;
        if run >= self.unsignaled_limit {
            // Signaled after all, and not awaited: the routing task takes its completion.
            let op = self.start_send(smallvec::smallvec![hold.clone()], |id| {
                post(SendWr {
                    wr_id: id,
                    op,
                    sges,
                    signaled: true,
                    fence: false,
                })
            });
            return op.posted.clone();
        }
        post(SendWr {
            wr_id: 0,
            op,
            sges,
            signaled: false,
            fence: false,
        })?;
        self.unsignaled_run.set(run);
        let mut h = self.unsignaled.borrow_mut();
        if !h.iter().any(|b| Rc::ptr_eq(b, hold)) {
            h.push(hold.clone());
        }
        Ok(())
    }

    fn start_send(&self, mut hold: Hold, post: impl FnOnce(u64) -> Result<(), DriverError>) -> Op {
        hold.extend(self.unsignaled.borrow_mut().drain(..));
        self.unsignaled_run.set(0);
        self.drain_sends_if_full();
        self.start(hold, false, post)
    }

    /// Routes the send completions waiting in the queue here, if it is half full. Its routing
    /// task runs only when the core gets to it: a task that posts signaled sends in a loop
    /// without ever waiting (a channel's sender while the receiver keeps up; shm completes a
    /// WRITE inside its post) would otherwise fill the queue, and an overflowed completion
    /// queue puts the queue pair in ERROR, as verbs' `IBV_EVENT_CQ_ERR` does.
    #[inline]
    fn drain_sends_if_full(&self) {
        if self.scq.len() * 2 >= self.scq.capacity() {
            self.drain_sends();
        }
    }

    #[cold]
    fn drain_sends(&self) {
        let mut wcs = [WorkCompletion::BLANK; 32];
        loop {
            let n = self.scq.poll(&mut wcs);
            let mut t = self.table.borrow_mut();
            for wc in &wcs[..n] {
                t.complete(*wc);
            }
            if n < wcs.len() {
                return;
            }
        }
    }

    fn start(
        &self,
        hold: Hold,
        recv: bool,
        post: impl FnOnce(u64) -> Result<(), DriverError>,
    ) -> Op {
        let id = {
            let mut t = self.table.borrow_mut();
            t.next += 1;
            t.next
        };
        self.table.borrow_mut().pending.insert(
            id,
            Pending {
                done: None,
                waker: None,
                hold,
                abandoned: false,
                recv,
            },
        );
        let posted = post(id);
        let mut t = self.table.borrow_mut();
        if posted.is_err() {
            t.pending.remove(&id);
        } else if recv {
            t.recvs += 1;
        }
        drop(t);
        Op {
            table: self.table.clone(),
            id,
            posted,
        }
    }

    /// Posts any send work request, signaled, with the given SGEs; `hold` names the buffers
    /// they point into, kept alive until the completion even if the future is dropped.
    pub fn execute(
        &self,
        op: SendOp,
        sges: impl Into<Sges>,
        hold: impl IntoIterator<Item = Rc<Buffer>>,
        fence: bool,
    ) -> Op {
        let sges = sges.into();
        self.start_send(hold.into_iter().collect(), |id| {
            self.qp.post_send(SendWr {
                wr_id: id,
                op,
                sges,
                signaled: true,
                fence,
            })
        })
    }

    fn send_op(&self, op: SendOp, buf: &Rc<Buffer>, sge: Sge) -> Op {
        self.start_send(smallvec::smallvec![buf.clone()], |id| {
            self.qp.post_send(SendWr {
                wr_id: id,
                op,
                sges: sge.into(),
                signaled: true,
                fence: false,
            })
        })
    }

    /// RDMA WRITE of `len` bytes at `offset` of `src` to `remote`.
    pub fn write(&self, src: &Rc<Buffer>, offset: usize, len: usize, remote: Remote) -> Op {
        let op = SendOp::Write {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
        };
        self.send_op(op, src, src.sge(offset, len))
    }

    /// RDMA WRITE with immediate data (the peer's receive completes with `imm`).
    pub fn write_with_imm(
        &self,
        src: &Rc<Buffer>,
        offset: usize,
        len: usize,
        remote: Remote,
        imm: u32,
    ) -> Op {
        let op = SendOp::WriteWithImm {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
            imm,
        };
        self.send_op(op, src, src.sge(offset, len))
    }

    /// RDMA READ of `len` bytes from `remote` into `dst` at `offset`.
    pub fn read(&self, dst: &Rc<Buffer>, offset: usize, len: usize, remote: Remote) -> Op {
        let op = SendOp::Read {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
        };
        self.send_op(op, dst, dst.sge(offset, len))
    }

    /// SEND of `len` bytes at `offset` of `src`.
    pub fn send(&self, src: &Rc<Buffer>, offset: usize, len: usize) -> Op {
        let op = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        self.send_op(op, src, src.sge(offset, len))
    }

    /// Posts a receive of up to `len` bytes into `dst` at `offset`; completes when a Send (or
    /// a Write with immediate) consumes it. Fails at once with [`DriverError::Post`] while as
    /// many receives are outstanding as the receive completion queue holds: one more could
    /// overflow the queue, which stops the queue pair (as verbs' CQ overrun) and loses the
    /// completions that would end the receives still waiting.
    pub fn recv(&self, dst: &Rc<Buffer>, offset: usize, len: usize) -> Op {
        let sge = dst.sge(offset, len);
        let outstanding = self.table.borrow().recvs;
        if self.rcq_capacity.is_some_and(|cap| outstanding >= cap) {
            // One more could overflow the queue, which stops the queue pair and loses the
            // completions that would have ended the waiting receives.
            return Op {
                table: self.table.clone(),
                id: 0, // never posted: no entry, and ids start at 1
                posted: Err(DriverError::Post(format!(
                    "{outstanding} receives are outstanding already, as many as the receive \
                     completion queue holds: await one first, or create the queue deeper"
                ))),
            };
        }
        self.start(smallvec::smallvec![dst.clone()], true, |id| {
            self.qp.post_recv(RecvWr {
                wr_id: id,
                sges: sge.into(),
            })
        })
    }

    /// Atomic fetch-and-add on the 8-byte word at `remote`; the old value lands in `result` at
    /// `offset` and is returned.
    pub async fn fetch_add(
        &self,
        result: &Rc<Buffer>,
        offset: usize,
        remote: Remote,
        add: u64,
    ) -> Result<u64, DriverError> {
        let op = SendOp::FetchAdd {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
            add,
        };
        self.send_op(op, result, result.sge(offset, 8)).await?;
        Ok(result.load_u64(offset))
    }

    /// Atomic compare-and-swap on the 8-byte word at `remote`; returns the old value (the swap
    /// happened if it equals `compare`).
    pub async fn compare_swap(
        &self,
        result: &Rc<Buffer>,
        offset: usize,
        remote: Remote,
        compare: u64,
        swap: u64,
    ) -> Result<u64, DriverError> {
        let op = SendOp::CmpSwap {
            remote_addr: remote.addr(),
            rkey: remote.region.rkey,
            compare,
            swap,
        };
        self.send_op(op, result, result.sge(offset, 8)).await?;
        Ok(result.load_u64(offset))
    }

    /// Work requests whose futures were dropped and whose completions have not come yet.
    pub fn abandoned_in_flight(&self) -> usize {
        self.table
            .borrow()
            .pending
            .values()
            .filter(|p| p.abandoned)
            .count()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Disconnecting flushes everything outstanding; the routing tasks stay until the last
        // held buffer's completion has come, then end. With nothing outstanding no completion
        // will come to wake them, so they are ended here: a routing task left waiting would
        // keep its completion queue, and this endpoint's table, for the life of the core.
        self.table.borrow_mut().closed = true;
        self.qp.disconnect();
        self.table.borrow_mut().end_routes_if_done();
    }
}

/// One operation in flight. Resolves to its work completion; an error status is an
/// `Err(DriverError::Completion { .. })`.
pub struct Op {
    table: Rc<RefCell<Table>>,
    id: u64,
    posted: Result<(), DriverError>,
}

impl Future for Op {
    type Output = Result<WorkCompletion, DriverError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Err(e) = &this.posted {
            return Poll::Ready(Err(e.clone()));
        }
        let mut t = this.table.borrow_mut();
        let Some(p) = t.pending.get_mut(&this.id) else {
            return Poll::Ready(Err(DriverError::Unsupported(
                "operation polled after completion".into(),
            )));
        };
        match p.done.take() {
            Some(wc) => {
                t.pending.remove(&this.id);
                t.end_routes_if_done();
                Poll::Ready(if wc.status == WcStatus::Success {
                    Ok(wc)
                } else {
                    Err(DriverError::Completion {
                        status: wc.status,
                        wr_id: wc.wr_id,
                    })
                })
            }
            None => {
                p.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Op {
    fn drop(&mut self) {
        let mut t = self.table.borrow_mut();
        if let Some(p) = t.pending.get_mut(&self.id) {
            if p.done.is_some() {
                t.pending.remove(&self.id);
                t.end_routes_if_done();
            } else {
                // Still owned by the device: keep the buffers until the completion.
                p.abandoned = true;
                p.waker = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buffer() -> Rc<Buffer> {
        let dev = crate::Device::open(&crate::DriverConfig::parse("soft", None).unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        Buffer::new(&pd, 64, 64, Access::LOCAL_WRITE).unwrap()
    }

    /// What `f` panicked with (empty if it did not).
    fn panics(f: &dyn Fn()) -> String {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
            .err()
            .and_then(|p| p.downcast_ref::<String>().cloned())
            .unwrap_or_default()
    }

    /// The bounds and alignment checks (out of line since their panics moved to cold
    /// functions) still stop every access that leaves the buffer, and say why.
    #[test]
    fn a_buffer_refuses_every_access_outside_it_or_unaligned() {
        let b = buffer();
        b.write_at(60, &[1, 2, 3, 4]);
        assert_eq!(b.load_u32_le(60), u32::from_le_bytes([1, 2, 3, 4]));
        assert_eq!(
            panics(&|| b.write_at(61, &[0; 4])),
            "4 bytes at 61 overrun a 64-byte buffer"
        );
        assert!(panics(&|| b.read_at(usize::MAX, &mut [0; 2])).contains("overrun"));
        assert!(panics(&|| b.zero(0, 65)).contains("overrun"));
        assert!(panics(&|| b.store_u32_le(62, 0)).contains("overrun"));
        assert!(panics(&|| {
            b.load_u32_le(64);
        })
        .contains("overrun"));
        assert_eq!(
            panics(&|| {
                b.load_u32_le(2);
            }),
            "unaligned 4-byte word at 2"
        );
        assert_eq!(
            panics(&|| {
                b.load_u64(4);
            }),
            "unaligned 8-byte word at 4"
        );
        // Nothing outside [60, 64) changed.
        let mut all = [0u8; 64];
        b.read_at(0, &mut all);
        assert!(all[..60].iter().all(|&x| x == 0));
    }

    /// A span is checked against the buffer when it is made, and each access through it
    /// against the span, so no access through one leaves the range it was given.
    #[test]
    fn a_span_refuses_every_access_outside_it() {
        let b = buffer();
        assert_eq!(
            panics(&|| {
                b.span(60, 8);
            }),
            "8 bytes at 60 overrun a 64-byte buffer"
        );
        let s = b.span(16, 8);
        s.store_u32_le(4, 7);
        s.write(0, &[9, 9]);
        assert_eq!(s.load_u32_le(4), 7);
        assert_eq!(
            panics(&|| s.store_u32_le(5, 0)),
            "4 bytes at 5 overrun a 8-byte span"
        );
        assert!(panics(&|| s.write(8, &[1])).contains("overrun a 8-byte span"));
        assert!(panics(&|| s.read(usize::MAX, &mut [0; 2])).contains("overrun"));
        // (An unaligned word is named by its offset in the buffer.)
        assert_eq!(
            panics(&|| {
                s.load_u32_le(2);
            }),
            "unaligned 4-byte word at 18"
        );
        // Only what the span's accesses wrote, inside it, changed.
        let mut all = [0u8; 64];
        b.read_at(0, &mut all);
        let mut want = [0u8; 64];
        want[16..18].copy_from_slice(&[9, 9]);
        want[20..24].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(all, want);
    }

    /// A mapped span is checked against the mapping, and its start for alignment, when it is
    /// made; each access through it against the span, and a word for its offset's alignment.
    #[test]
    fn a_mapped_span_refuses_every_access_outside_it() {
        struct Awake;
        impl crate::backend::MappedPeer for Awake {
            fn wake_if_asleep(&self) {}
        }
        let mut memory = vec![0u32; 16];
        let m = MappedRemote::new(memory.as_mut_ptr() as *mut u8, 64, Box::new(Awake));
        assert_eq!(
            panics(&|| {
                m.span(60, 8);
            }),
            "8 bytes at 60 overrun a 64-byte mapped region"
        );
        assert_eq!(
            panics(&|| {
                m.span(18, 8);
            }),
            "unaligned 4-byte word at 18"
        );
        let s = m.span(16, 12);
        s.write(0, &[9, 9]);
        s.store_u32_le(8, 7);
        assert_eq!(s.load_u32_le(8), 7);
        assert_eq!(
            panics(&|| s.store_u32_le(12, 0)),
            "4 bytes at 12 overrun a 12-byte span"
        );
        assert!(panics(&|| s.write(11, &[1, 1])).contains("overrun a 12-byte span"));
        // (An unaligned word is named by its offset in the region.)
        assert_eq!(
            panics(&|| {
                s.load_u32_le(2);
            }),
            "unaligned 4-byte word at 18"
        );
        // A one-word span at the region's end.
        m.span(60, 4).store_u32_le(0, 5);
        assert_eq!(m.span(60, 4).load_u32_le(0), 5);
        assert_eq!(
            panics(&|| {
                m.span(62, 4);
            }),
            "4 bytes at 62 overrun a 64-byte mapped region"
        );
        drop(m);
        // Only what the accesses wrote, inside the span or the word, changed.
        let mut want = vec![0u32; 16];
        want[4] = u32::from_le_bytes([9, 9, 0, 0]);
        want[6] = 7u32.to_le();
        want[15] = 5u32.to_le();
        assert_eq!(memory, want);
    }

    #[test]
    fn the_inline_copies_copy_every_length_and_alignment() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 1) as u8).collect();
        for from in 0..17 {
            for to in 0..17 {
                for len in [0, 1, 2, 3, 4, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100, 255] {
                    let mut dst = vec![0u8; 300];
                    // SAFETY: both ranges lie within their vectors; distinct allocations.
                    unsafe { copy_ascending(src[from..].as_ptr(), dst[to..].as_mut_ptr(), len) };
                    assert_eq!(&dst[to..to + len], &src[from..from + len]);
                    assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0));
                    let mut dst = vec![0u8; 300];
                    // SAFETY: as above.
                    unsafe { copy_chunks(src[from..].as_ptr(), dst[to..].as_mut_ptr(), len) };
                    assert_eq!(&dst[to..to + len], &src[from..from + len]);
                    assert!(dst[..to].iter().chain(&dst[to + len..]).all(|&b| b == 0));
                }
            }
        }
    }
}
