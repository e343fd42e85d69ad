//! Memory that can be shared with a peer process: memfd-backed allocations, the process-wide
//! table that finds the allocation holding a registered range, and a peer's mapping of a
//! grant.
//!
//! Every allocation is sealed against shrinking and growing before it is mapped
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), and a receiver maps only sealed files, within
//! their size. A mapping of a sealed file can never lose its pages, so no access through it
//! can raise SIGBUS, whatever the owner does later: a stale mapping reads the last bytes the
//! owner left (or zeros, once the owner punched them out when freeing) and writes into pages
//! the owner no longer uses.

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock};

use crate::transport::DriverError;

fn os_error(call: &str) -> DriverError {
    DriverError::Verbs {
        call: call.into(),
        error: std::io::Error::last_os_error().to_string(),
    }
}

/// Refuses a file larger than this machine's memory and swap together, as the kernel's
/// default overcommit policy refuses such an anonymous mapping (what the software provider's
/// large buffers are). A shared file's pages are not counted by that policy: without this, a
/// region that could never be backed would be created, and touching it would end in the OOM
/// killer rather than in an error here.
fn within_memory(len: usize) -> Result<(), DriverError> {
    // SAFETY: sysinfo fills the plain struct it is given; all zeros is a valid value.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: a valid pointer to that struct.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return Ok(()); // nothing known: the kernel decides at the first touch
    }
    let unit = u128::from(si.mem_unit.max(1));
    let total = (u128::from(si.totalram) + u128::from(si.totalswap)) * unit;
    if len as u128 > total {
        return Err(DriverError::OutOfMemory(format!(
            "mapping a buffer of {len} B: more than this machine's memory and swap ({total} B): {}",
            std::io::Error::from_raw_os_error(libc::ENOMEM)
        )));
    }
    Ok(())
}

/// The page size.
pub(crate) fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// One memfd-backed allocation, mapped read-write in this process.
pub(crate) struct MemFile {
    fd: OwnedFd,
    /// A read-only descriptor of the same file, for read-only grants (made on first use).
    read_only: OnceLock<OwnedFd>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is to a shared mapping owned by this value; the table that holds these
// only reads `ptr`/`len` (plain values) and hands out descriptors, from any thread.
unsafe impl Send for MemFile {}
// SAFETY: as above; nothing mutates through a shared reference except the OnceLock.
unsafe impl Sync for MemFile {}

/// Allocations by start address, for `find`.
fn table() -> &'static Mutex<BTreeMap<usize, Arc<MemFile>>> {
    static T: OnceLock<Mutex<BTreeMap<usize, Arc<MemFile>>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(BTreeMap::new()))
}

impl MemFile {
    /// Creates, seals and maps a zeroed file of at least `len` bytes (whole pages), and lists
    /// it so that registrations inside it can be granted to peers.
    pub(crate) fn create(len: usize) -> Result<Arc<MemFile>, DriverError> {
        let f = MemFile::create_unlisted(len)?;
        table().lock().unwrap().insert(f.ptr as usize, f.clone());
        Ok(f)
    }

    /// As `create`, for memory no registration may name (a queue pair's ring).
    pub(crate) fn create_unlisted(len: usize) -> Result<Arc<MemFile>, DriverError> {
        let len = len.max(1).div_ceil(page()) * page();
        within_memory(len)?;
        // SAFETY: a constant NUL-terminated name; the result is checked.
        let raw = unsafe {
            libc::memfd_create(
                c"barewire-shm".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(os_error("memfd_create"));
        }
        // SAFETY: a descriptor we just created and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain calls on our own descriptor.
        unsafe {
            if libc::ftruncate(raw, len as libc::off_t) != 0 {
                return Err(os_error("ftruncate(memfd)"));
            }
            if libc::fcntl(raw, libc::F_ADD_SEALS, SEALS) != 0 {
                return Err(os_error("fcntl(F_ADD_SEALS)"));
            }
        }
        let ptr = map(raw, 0, len, true)?;
        Ok(Arc::new(MemFile {
            fd,
            read_only: OnceLock::new(),
            ptr,
            len,
        }))
    }

    /// First byte of this process's mapping.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Unlists the allocation and punches its pages out, so a peer's stale mapping reads zeros
    /// from then on; the mapping here goes when the last reference does.
    pub(crate) fn release(self: &Arc<MemFile>) {
        table().lock().unwrap().remove(&(self.ptr as usize));
        // SAFETY: our own descriptor; punching keeps the size (the seals allow it).
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                self.len as libc::off_t,
            );
        }
    }

    /// The descriptor to send for a grant: read-write, or a read-only reopening of the file.
    pub(crate) fn descriptor(&self, writable: bool) -> Result<RawFd, DriverError> {
        if writable {
            return Ok(self.fd.as_raw_fd());
        }
        if let Some(fd) = self.read_only.get() {
            return Ok(fd.as_raw_fd());
        }
        let path = format!("/proc/self/fd/{}\0", self.fd.as_raw_fd());
        // SAFETY: a NUL-terminated path; the result is checked.
        let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if raw < 0 {
            return Err(os_error("reopening a memfd read-only"));
        }
        // SAFETY: a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(self.read_only.get_or_init(|| fd).as_raw_fd())
    }
}

impl crate::ops::BackendMemory for Arc<MemFile> {
    fn ptr(&self) -> *mut u8 {
        MemFile::ptr(self)
    }
    fn release(&self) {
        MemFile::release(self)
    }
}

/// A buffer that starts `skip` bytes into its file (one aligned to more than a page).
pub(crate) struct Within {
    pub(crate) file: Arc<MemFile>,
    pub(crate) skip: usize,
}

impl crate::ops::BackendMemory for Within {
    fn ptr(&self) -> *mut u8 {
        // SAFETY: `skip` is less than the alignment the file was lengthened by, so inside it.
        unsafe { self.file.ptr().add(self.skip) }
    }
    fn release(&self) {
        self.file.release()
    }
}

impl Drop for MemFile {
    fn drop(&mut self) {
        // SAFETY: the whole mapping made in `create`; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The allocation holding `[addr, addr+len)` and the range's offset in it, if barewire
/// allocated that memory.
pub(crate) fn find(addr: usize, len: usize) -> Option<(Arc<MemFile>, usize)> {
    let t = table().lock().unwrap();
    let (&start, f) = t.range(..=addr).next_back()?;
    let end = addr.checked_add(len)?;
    (end <= start + f.len).then(|| (f.clone(), addr - start))
}

/// Maps `len` bytes of `fd` from `offset` (page-aligned), shared.
fn map(fd: RawFd, offset: usize, len: usize, writable: bool) -> Result<*mut u8, DriverError> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    // SAFETY: a fresh mapping chosen by the kernel; the result is checked.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_error("mmap(shared memory)"));
    }
    Ok(p.cast())
}

/// A peer's region as mapped here: `len` bytes that the peer addresses from `base`.
pub(crate) struct Mapping {
    map: *mut u8,
    map_len: usize,
    /// Where the region starts inside the mapping.
    ptr: *mut u8,
    /// The peer's address of the region's first byte (what its descriptor names).
    pub(crate) base: u64,
    pub(crate) len: u64,
    /// The rights granted (the mapping is writable if either of the last two is).
    pub(crate) readable: bool,
    pub(crate) writable: bool,
    pub(crate) atomic: bool,
}

impl Mapping {
    /// Maps the `len` bytes at `offset` of the file `fd` that a peer granted. Refuses a file
    /// that is not sealed against shrinking, or too short: a mapping of either could fault.
    pub(crate) fn new(
        fd: &OwnedFd,
        offset: u64,
        len: u64,
        base: u64,
        writable: bool,
    ) -> Result<Mapping, DriverError> {
        let raw = fd.as_raw_fd();
        // SAFETY: a descriptor we own.
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(DriverError::Unsupported(
                "a peer granted memory that is not sealed against shrinking".into(),
            ));
        }
        // SAFETY: a zeroed stat for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(raw, &mut st) } != 0 {
            return Err(os_error("fstat(granted memory)"));
        }
        let end = offset.checked_add(len);
        if end.is_none_or(|e| e > st.st_size as u64) || base.checked_add(len).is_none() {
            return Err(DriverError::Unsupported(
                "a peer granted a range outside its memory".into(),
            ));
        }
        let pg = page() as u64;
        let start = offset / pg * pg;
        let map_len = ((offset + len - start).max(1)).div_ceil(pg) * pg;
        let map = map(raw, start as usize, map_len as usize, writable)?;
        Ok(Mapping {
            map,
            map_len: map_len as usize,
            // SAFETY: within the mapping just made.
            ptr: unsafe { map.add((offset - start) as usize) },
            base,
            len,
            readable: true,
            writable,
            atomic: writable,
        })
    }

    /// Where the peer's address `to` (with `len` bytes after it) is mapped here, if the whole
    /// range lies in the region.
    pub(crate) fn at(&self, to: u64, len: u64) -> Option<*mut u8> {
        let off = to.checked_sub(self.base)?;
        (off.checked_add(len)? <= self.len).then(|| {
            // SAFETY: within the region, which lies within the mapping.
            unsafe { self.ptr.add(off as usize) }
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; operations copy synchronously, so none is using it.
        unsafe { libc::munmap(self.map.cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(fd: RawFd) -> OwnedFd {
        // SAFETY: dup of a live descriptor; the copy is owned by the result.
        unsafe { OwnedFd::from_raw_fd(libc::dup(fd)) }
    }

    #[test]
    fn a_read_only_grant_cannot_be_mapped_writable_and_its_mapping_sees_the_owners_bytes() {
        let f = MemFile::create(8192).unwrap();
        // SAFETY: our own fresh mapping.
        unsafe { std::ptr::write_bytes(f.ptr(), 0x7e, 8192) };
        let ro = dup(f.descriptor(false).unwrap());
        assert!(
            Mapping::new(&ro, 4096, 4096, 0x1000, true).is_err(),
            "a read-only file maps read-only only"
        );
        let m = Mapping::new(&ro, 4096, 4096, 0x1000, false).unwrap();
        let p = m.at(0x1000, 4096).unwrap();
        // SAFETY: inside the mapping.
        assert_eq!(unsafe { *p.add(100) }, 0x7e);
        assert!(m.at(0x1000, 4097).is_none() && m.at(0xfff, 1).is_none());
        // A grant past the file's end is refused, not mapped (it would fault).
        let rw = dup(f.descriptor(true).unwrap());
        assert!(Mapping::new(&rw, 4096, 8192, 0, true).is_err());
        // Memory that is not sealed is refused.
        // SAFETY: a plain memfd of our own, unsealed.
        let raw = unsafe { libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC) };
        // SAFETY: as above.
        let unsealed = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizing our own memfd.
        unsafe { libc::ftruncate(raw, 4096) };
        assert!(Mapping::new(&unsealed, 0, 4096, 0, false).is_err());
    }

    #[test]
    fn a_released_file_reads_as_zeros_through_a_kept_mapping() {
        let f = MemFile::create(4096).unwrap();
        // SAFETY: our own fresh mapping.
        unsafe { std::ptr::write_bytes(f.ptr(), 0x5a, 4096) };
        let fd = dup(f.descriptor(true).unwrap());
        let m = Mapping::new(&fd, 0, 4096, 0, true).unwrap();
        assert!(find(f.ptr() as usize, 16).is_some());
        f.release();
        assert!(find(f.ptr() as usize, 16).is_none(), "unlisted");
        drop(f);
        // SAFETY: the kept mapping is still valid (the file is sealed against shrinking).
        assert_eq!(unsafe { *m.at(0, 1).unwrap() }, 0);
    }
}
