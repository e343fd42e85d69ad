//! Registered memory: a [`Buffer`] barewire owns, a peer's region mapped for plain loads
//! and stores ([`MappedRemote`]), and a checked range of either ([`Span`]), every access
//! bounds-checked.

use super::*;

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

    /// A hint that the `len` bytes at `offset` will be read soon: asks the CPU to bring their
    /// cache lines in now, so that the read does not wait for them (a ring's later slots,
    /// which the peer's CPU stores into, while this one takes an earlier slot). It changes no
    /// byte; a range outside the buffer is ignored rather than checked (nothing is fetched,
    /// nothing panics).
    ///
    /// ```
    /// use barewire_drivers::{Access, Buffer, Device, DriverConfig};
    /// let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
    /// let pd = dev.alloc_pd().unwrap();
    /// let buf = Buffer::new(&pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
    /// buf.write_at(1024, b"next");
    /// buf.prefetch(1024, 128);
    /// buf.prefetch(4000, 1 << 20); // past the end: ignored
    /// let mut out = [0u8; 4];
    /// buf.read_at(1024, &mut out);
    /// assert_eq!(&out, b"next");
    /// ```
    #[inline(always)]
    pub fn prefetch(&self, offset: usize, len: usize) {
        if offset.checked_add(len).is_some_and(|end| end <= self.len) {
            // SAFETY: `offset` is within the buffer (checked), so the pointer stays inside
            // its allocation.
            prefetch_lines(unsafe { self.ptr.add(offset) }, len, false);
        }
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

    /// A hint that this process will store into the `len` bytes at `offset` soon: asks the
    /// CPU to take their cache lines for writing now, so that taking them over from the peer's
    /// cache (where the peer last read or cleared them) overlaps with other work rather than
    /// holding up the stores when they come. It changes no byte; a range outside the region is
    /// ignored rather than checked (nothing is fetched, nothing panics).
    #[inline(always)]
    pub fn prefetch_for_write(&self, offset: usize, len: usize) {
        if offset.checked_add(len).is_some_and(|end| end <= self.len) {
            // SAFETY: `offset` is within the mapping (checked), so the pointer stays inside it.
            prefetch_lines(unsafe { self.ptr.add(offset) }, len, true);
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
