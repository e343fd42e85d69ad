//! Protection domains and memory regions, and the check every tagged access passes before a
//! byte moves.
//!
//! STags come from the OS CSPRNG (`getrandom`), so a peer cannot guess a live one from one it
//! has seen (ReDMArk's STag-prediction attack). An STag is bound to its protection domain and,
//! optionally, to one queue pair; deregistration invalidates it at once, and a retired STag is
//! never handed out again (the device remembers every STag it retired: 4 bytes per
//! registration over the device's life).
//!
//! **Guessing.** A connection that names a wrong STag is cut at once with a Terminate, so a
//! guesser gets one try per connection and must reconnect. Measured here (2026-12-01,
//! `tests/listener.rs` `guess_rate`, release build, loopback), one client manages about 5,100
//! connect-and-guess rounds per second. Against a listener whose domain holds N live STags, the
//! expected time to a hit is 2^32 / (N × rate): with N = 10,000 and nothing else in the way,
//! 2^32 / (10^4 × 5,100) ≈ 84 s. The provider's listener therefore keeps a per-source-address
//! budget of protection violations (8 within 10 s by default; the address is then refused for
//! 60 s, see `provider::ConnectOptions::violation_budget`), which caps one address at about 8
//! guesses a minute: 2^32 / (10^4 × 8/60 s) ≈ 3.2 × 10^6 s, some 37 days per address (an attacker
//! with A addresses divides that by A). The stronger defence is windows
//! ([`MemoryRegion::bind_window`]): a region whose own STag grants no remote access
//! ([`MemoryRegion::remote_only_through_windows`]) and one window per connection it was sent
//! over. A new connection then holds no valid STag at all, and a guess can only ever hit a
//! window bound to another connection, which this one is refused (`NotAssociated`). The
//! facade exports its regions this way by default.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

/// Access rights of a memory region (ibv_reg_mr(3)'s `IBV_ACCESS_*`).
///
/// ```
/// use barewire_rdma_types::Access;
/// let readable = Access::LOCAL_WRITE | Access::REMOTE_READ;
/// assert!(readable.contains(Access::REMOTE_READ));
/// assert!(!readable.contains(Access::REMOTE_READ | Access::REMOTE_WRITE));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access(u8);

impl Access {
    /// The local side may write (receives and READ responses land here).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Peers may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Peers may RDMA READ from it.
    pub const REMOTE_READ: Access = Access(4);
    /// Peers may run atomics on it.
    pub const REMOTE_ATOMIC: Access = Access(8);

    /// True if every right in `other` is granted.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

/// A steering tag: the lkey/rkey of a region on the wire (RFC 5040 §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Stag(pub u32);

/// Why a tagged access was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// No live region has this STag (never registered, deregistered or invalidated).
    #[error("invalid STag")]
    InvalidStag,
    /// The access falls (partly) outside the region.
    #[error("base or bounds violation")]
    BaseBounds,
    /// The region does not grant the right needed.
    #[error("access rights violation")]
    AccessRights,
    /// The STag belongs to another protection domain or queue pair.
    #[error("STag not associated with this stream")]
    NotAssociated,
    /// Offset plus length overflows 64 bits.
    #[error("tagged offset wraps")]
    ToWrap,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    pd: u32,
    qp: Option<u32>,
    addr: usize,
    len: usize,
    access: Access,
    /// For a window: the STag of the region it was bound in (windows name remote access
    /// only; they are no local key).
    window_of: Option<u32>,
}

/// The queue pair number of no queue pair: a region bound to it (see
/// [`MemoryRegion::remote_only_through_windows`]) grants no remote access under its own STag.
const NO_QP: u32 = u32::MAX;

/// Hashes an STag for a key table. STags come from a CSPRNG, so their bits are already
/// uniform and a keyed hash (std's SipHash) would only add cost to every access check; a
/// multiply spreads them into the high bits the table also uses. A peer only looks STags up,
/// so it cannot crowd the table. It also keys tables by ids this process assigns itself in
/// sequence (an endpoint's work-request ids), which no peer picks either.
#[derive(Default)]
pub struct StagHasher(u64);

impl std::hash::Hasher for StagHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8 | b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = (v as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A table keyed by STag, hashed with [`StagHasher`].
pub type StagMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<StagHasher>>;

#[derive(Default)]
struct Tables {
    live: StagMap<Entry>,
    retired: HashSet<u32>,
    /// A region's STag → the STags of the windows bound in it.
    windows: StagMap<Vec<u32>>,
}

impl Tables {
    /// Retires `stag` and, for a region, every window bound in it.
    fn retire(&mut self, stag: u32) {
        if let Some(e) = self.live.remove(&stag) {
            self.retired.insert(stag);
            match e.window_of {
                Some(parent) => {
                    if let Some(w) = self.windows.get_mut(&parent) {
                        w.retain(|&x| x != stag);
                    }
                }
                None => {
                    for w in self.windows.remove(&stag).unwrap_or_default() {
                        self.live.remove(&w);
                        self.retired.insert(w);
                    }
                }
            }
        }
    }
}

struct DeviceInner {
    /// Changed only through [`DeviceInner::tables_mut`].
    tables: RefCell<Tables>,
    /// The local key `check_local` found last, so a flow of operations on one region pays a
    /// compare for it instead of a table lookup. Any change to the tables forgets it first,
    /// so a key deregistered or invalidated since is never served from it.
    last_local: Cell<Option<LocalKey>>,
    /// The key `check` found last, for the same reason and on the same terms: a peer's run
    /// of Writes into one region pays a compare for it. Only a live key is remembered, so a
    /// guessed one always goes to the table.
    last_remote: Cell<Option<RemoteKey>>,
    next_pd: Cell<u32>,
    /// Fuzzing only: STags handed out in order from this one instead of at random.
    predictable: Cell<Option<u32>>,
}

/// What `check_local` needs of a live local key.
#[derive(Clone, Copy)]
struct LocalKey {
    lkey: u32,
    pd: u32,
    addr: usize,
    len: usize,
    writable: bool,
}

/// What `check` needs of a live key (a region's or a window's).
#[derive(Clone, Copy)]
struct RemoteKey {
    stag: u32,
    pd: u32,
    qp: Option<u32>,
    access: Access,
    /// Its first byte's address, and the address after its last.
    base: u64,
    limit: u64,
}

impl DeviceInner {
    /// The tables, to change: forgets the last keys found first.
    fn tables_mut(&self) -> std::cell::RefMut<'_, Tables> {
        self.last_local.set(None);
        self.last_remote.set(None);
        self.tables.borrow_mut()
    }

    /// The live key `stag`, remembered for the next call.
    fn remote_key(&self, stag: u32) -> Result<RemoteKey, Violation> {
        let t = self.tables.borrow();
        let e = t.live.get(&stag).ok_or(Violation::InvalidStag)?;
        let k = RemoteKey {
            stag,
            pd: e.pd,
            qp: e.qp,
            access: e.access,
            base: e.addr as u64,
            limit: e.addr as u64 + e.len as u64,
        };
        self.last_remote.set(Some(k));
        Ok(k)
    }

    /// The live local key `lkey` (a region's, not a window's), remembered for the next call.
    fn local_key(&self, lkey: u32) -> Result<LocalKey, Violation> {
        let t = self.tables.borrow();
        let e = t
            .live
            .get(&lkey)
            .filter(|e| e.window_of.is_none())
            .ok_or(Violation::InvalidStag)?;
        let k = LocalKey {
            lkey,
            pd: e.pd,
            addr: e.addr,
            len: e.len,
            writable: e.access.contains(Access::LOCAL_WRITE),
        };
        self.last_local.set(Some(k));
        Ok(k)
    }
}

/// The soft RDMA device of one core.
///
/// ```
/// use barewire_rdma_types::*;
/// let dev = Device::new();
/// let pd = dev.alloc_pd();
/// let mut buf = vec![0u8; 4096];
/// // SAFETY: `buf` outlives the region.
/// let mr = unsafe { pd.register(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE | Access::REMOTE_WRITE) }.unwrap();
/// let base = mr.addr() as u64;
/// // What a peer's WRITE must pass before a byte moves:
/// assert!(dev.check(mr.stag(), pd.id(), 1, base, 4096, Access::REMOTE_WRITE).is_ok());
/// assert_eq!(dev.check(mr.stag(), pd.id(), 1, base + 1, 4096, Access::REMOTE_WRITE), Err(Violation::BaseBounds));
/// assert_eq!(dev.check(mr.stag(), pd.id(), 1, base, 8, Access::REMOTE_READ), Err(Violation::AccessRights));
/// drop(mr);
/// ```
#[derive(Clone)]
pub struct Device {
    inner: Rc<DeviceInner>,
}

impl Default for Device {
    fn default() -> Self {
        Device::new()
    }
}

impl Device {
    /// A device with no regions.
    pub fn new() -> Device {
        Device {
            inner: Rc::new(DeviceInner {
                tables: RefCell::new(Tables::default()),
                last_local: Cell::new(None),
                last_remote: Cell::new(None),
                next_pd: Cell::new(1),
                predictable: Cell::new(None),
            }),
        }
    }

    /// A device whose STags are 1, 2, 3, ... in registration order, so that a fuzzer's inputs
    /// can name live regions. Only in tests and `--features fuzzing` builds: predictable
    /// STags are exactly what a real device must never have.
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn with_predictable_stags() -> Device {
        let d = Device::new();
        d.inner.predictable.set(Some(1));
        d
    }

    /// Allocates a protection domain (ibv_alloc_pd(3)).
    pub fn alloc_pd(&self) -> ProtectionDomain {
        let id = self.inner.next_pd.get();
        self.inner.next_pd.set(id + 1);
        ProtectionDomain {
            id,
            dev: self.clone(),
        }
    }

    fn fresh_stag(&self) -> u32 {
        if let Some(s) = self.inner.predictable.get() {
            self.inner.predictable.set(Some(s.wrapping_add(1).max(1)));
            return s;
        }
        let t = self.inner.tables.borrow();
        loop {
            let mut b = [0u8; 4];
            getrandom::fill(&mut b).expect("the OS CSPRNG is available");
            let s = u32::from_ne_bytes(b);
            // 0 is never valid: siw and many NICs treat it as "no STag".
            if s != 0 && !t.live.contains_key(&s) && !t.retired.contains(&s) {
                return s;
            }
        }
    }

    /// Checks a remote access of `len` bytes at tagged offset `to` (a virtual address within
    /// the region, as verbs uses) by a queue pair of domain `pd`, and returns where the bytes
    /// are. Nothing may touch memory before this returns `Ok`.
    pub fn check(
        &self,
        stag: Stag,
        pd: u32,
        qp: u32,
        to: u64,
        len: u64,
        need: Access,
    ) -> Result<*mut u8, Violation> {
        let e = match self.inner.last_remote.get() {
            Some(k) if k.stag == stag.0 => k,
            _ => self.inner.remote_key(stag.0)?,
        };
        if e.pd != pd || e.qp.is_some_and(|q| q != qp) {
            return Err(Violation::NotAssociated);
        }
        if !e.access.contains(need) {
            return Err(Violation::AccessRights);
        }
        let end = to.checked_add(len).ok_or(Violation::ToWrap)?;
        if to < e.base || end > e.limit {
            return Err(Violation::BaseBounds);
        }
        Ok(to as usize as *mut u8)
    }

    /// The region or window `stag` names for remote access by queue pair `qp` of domain `pd`:
    /// its first address, length and rights. A backend that lets a peer map the memory
    /// itself (shm) asks this before it grants the mapping, and the peer then checks each
    /// access against what it was granted.
    pub fn lookup(&self, stag: Stag, pd: u32, qp: u32) -> Result<(u64, u64, Access), Violation> {
        let t = self.inner.tables.borrow();
        let e = t.live.get(&stag.0).ok_or(Violation::InvalidStag)?;
        if e.pd != pd || e.qp.is_some_and(|q| q != qp) {
            return Err(Violation::NotAssociated);
        }
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if e.access.0 & remote.0 == 0 {
            return Err(Violation::AccessRights);
        }
        Ok((e.addr as u64, e.len as u64, e.access))
    }

    /// Checks a local scatter/gather element: `lkey` must be live in domain `pd`, cover
    /// `[addr, addr+len)`, and grant LOCAL_WRITE when the operation writes into it.
    #[inline]
    pub fn check_local(
        &self,
        lkey: Stag,
        pd: u32,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Result<*mut u8, Violation> {
        let e = match self.inner.last_local.get() {
            Some(k) if k.lkey == lkey.0 => k,
            _ => self.inner.local_key(lkey.0)?,
        };
        if e.pd != pd {
            return Err(Violation::NotAssociated);
        }
        if write && !e.writable {
            return Err(Violation::AccessRights);
        }
        let end = addr.checked_add(len).ok_or(Violation::ToWrap)?;
        if addr < e.addr as u64 || end > e.addr as u64 + e.len as u64 {
            return Err(Violation::BaseBounds);
        }
        Ok(addr as usize as *mut u8)
    }

    /// Invalidates an STag (a remote Send with Invalidate, or a local invalidate). Fails if it
    /// is not live or belongs to another domain. Invalidating a region invalidates every
    /// window bound in it.
    pub fn invalidate(&self, stag: Stag, pd: u32) -> Result<(), Violation> {
        let mut t = self.inner.tables_mut();
        match t.live.get(&stag.0) {
            None => Err(Violation::InvalidStag),
            Some(e) if e.pd != pd => Err(Violation::NotAssociated),
            Some(_) => {
                t.retire(stag.0);
                Ok(())
            }
        }
    }
}

/// A protection domain: regions and queue pairs of one domain can be used only together.
pub struct ProtectionDomain {
    id: u32,
    dev: Device,
}

impl ProtectionDomain {
    /// The domain's number.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Another handle to the same domain (for a task that needs its own).
    pub fn clone_handle(&self) -> ProtectionDomain {
        ProtectionDomain {
            id: self.id,
            dev: self.dev.clone(),
        }
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Registers `len` bytes at `addr` (ibv_reg_mr(3)). Remote rights need LOCAL_WRITE too when
    /// they include REMOTE_WRITE or REMOTE_ATOMIC, as verbs requires.
    ///
    /// # Safety
    /// The memory must stay valid (and must not be freed or moved) until the region is dropped;
    /// peers granted remote rights may read or write it at any time until then, so the caller
    /// must not hold Rust references into it that assume it does not change.
    pub unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<MemoryRegion, Violation> {
        if (access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC))
            && !access.contains(Access::LOCAL_WRITE)
        {
            return Err(Violation::AccessRights);
        }
        if (addr as usize).checked_add(len).is_none() {
            return Err(Violation::ToWrap);
        }
        let stag = self.dev.fresh_stag();
        self.dev.inner.tables_mut().live.insert(
            stag,
            Entry {
                pd: self.id,
                qp: None,
                addr: addr as usize,
                len,
                access,
                window_of: None,
            },
        );
        Ok(MemoryRegion {
            stag: Stag(stag),
            pd: self.id,
            addr,
            len,
            access,
            dev: self.dev.clone(),
        })
    }
}

/// A registered region. Dropping it deregisters: the STag is dead from that moment on.
pub struct MemoryRegion {
    stag: Stag,
    pd: u32,
    addr: *mut u8,
    len: usize,
    access: Access,
    dev: Device,
}

impl MemoryRegion {
    /// The STag peers name it by (rkey) and the local side uses (lkey).
    pub fn stag(&self) -> Stag {
        self.stag
    }

    /// Start address (the tagged offset of its first byte).
    pub fn addr(&self) -> *mut u8 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rights granted.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Restricts remote use to queue pair `qp` (like a type 2 memory window): any other
    /// connection presenting the STag gets `NotAssociated`.
    pub fn bind_to_qp(&self, qp: u32) {
        if let Some(e) = self.dev.inner.tables_mut().live.get_mut(&self.stag.0) {
            e.qp = Some(qp);
        }
    }

    /// Makes the region's own STag useless to every peer: remote access then goes only through
    /// windows bound with [`bind_window`](Self::bind_window). Local use is unchanged.
    pub fn remote_only_through_windows(&self) {
        self.bind_to_qp(NO_QP);
    }

    /// Binds a window over the whole region for queue pair `qp` alone, with `access` (remote
    /// rights, a subset of the region's): the semantics of an iWARP type 2 memory window (RFC
    /// 5040 §2.1; ibv_bind_mw(3)). Its STag is fresh; another queue pair presenting it gets
    /// `NotAssociated` (a protection Terminate), and it dies with the [`Window`] or with the
    /// region, whichever goes first.
    ///
    /// ```
    /// use barewire_rdma_types::*;
    /// let dev = Device::new();
    /// let pd = dev.alloc_pd();
    /// let mut buf = vec![0u8; 64];
    /// let rights = Access::LOCAL_WRITE | Access::REMOTE_READ;
    /// // SAFETY: `buf` outlives the region.
    /// let mr = unsafe { pd.register(buf.as_mut_ptr(), buf.len(), rights) }.unwrap();
    /// mr.remote_only_through_windows();
    /// let w = mr.bind_window(7, &pd, Access::REMOTE_READ).unwrap();
    /// let at = mr.addr() as u64;
    /// assert!(dev.check(w.stag(), pd.id(), 7, at, 8, Access::REMOTE_READ).is_ok());
    /// assert_eq!(dev.check(w.stag(), pd.id(), 8, at, 8, Access::REMOTE_READ), Err(Violation::NotAssociated));
    /// assert_eq!(dev.check(mr.stag(), pd.id(), 7, at, 8, Access::REMOTE_READ), Err(Violation::NotAssociated));
    /// // Only for a queue pair of the region's own domain.
    /// let elsewhere = dev.alloc_pd();
    /// let refused = mr.bind_window(9, &elsewhere, Access::REMOTE_READ);
    /// assert_eq!(refused.err(), Some(Violation::NotAssociated));
    /// ```
    pub fn bind_window(
        &self,
        qp: u32,
        qp_pd: &ProtectionDomain,
        access: Access,
    ) -> Result<Window, Violation> {
        // The queue pair must be of this region's domain, on this device, as verbs requires: a
        // window bound across domains could never be used, and its key would only mislead.
        if qp_pd.id != self.pd || !Rc::ptr_eq(&qp_pd.dev.inner, &self.dev.inner) {
            return Err(Violation::NotAssociated);
        }
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC;
        if !self.access.contains(access) || !remote.contains(access) {
            return Err(Violation::AccessRights);
        }
        let stag = self.dev.fresh_stag();
        let mut t = self.dev.inner.tables_mut();
        if !t.live.contains_key(&self.stag.0) {
            return Err(Violation::InvalidStag); // invalidated (a Send with Invalidate)
        }
        t.live.insert(
            stag,
            Entry {
                pd: self.pd,
                qp: Some(qp),
                addr: self.addr as usize,
                len: self.len,
                access,
                window_of: Some(self.stag.0),
            },
        );
        t.windows.entry(self.stag.0).or_default().push(stag);
        Ok(Window {
            stag: Stag(stag),
            pd: self.pd,
            dev: self.dev.clone(),
        })
    }
}

/// A window bound in a region for one queue pair (see [`MemoryRegion::bind_window`]).
/// Dropping it invalidates its STag.
pub struct Window {
    stag: Stag,
    pd: u32,
    dev: Device,
}

impl Window {
    /// The STag the one queue pair's peer names it by.
    pub fn stag(&self) -> Stag {
        self.stag
    }

    /// False once its region was deregistered or it was invalidated.
    pub fn is_live(&self) -> bool {
        self.dev
            .inner
            .tables
            .borrow()
            .live
            .contains_key(&self.stag.0)
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // Already gone when its region was deregistered first.
        let _ = self.dev.invalidate(self.stag, self.pd);
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        let _ = self.dev.invalidate(self.stag, self.pd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(pd: &ProtectionDomain, buf: &mut [u8], access: Access) -> MemoryRegion {
        // SAFETY: the buffer outlives the region in every test.
        unsafe { pd.register(buf.as_mut_ptr(), buf.len(), access) }.unwrap()
    }

    /// A window binds only to a queue pair of its region's own domain on the same device: one
    /// bound across would be keyed in the region's tables to a number that names no queue pair
    /// of the domain, so verbs refuses the bind, and so does this.
    #[test]
    fn a_window_binds_only_to_a_queue_pair_of_its_regions_domain() {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let mut buf = vec![0u8; 64];
        let mr = region(&pd, &mut buf, Access::LOCAL_WRITE | Access::REMOTE_READ);
        let other_pd = dev.alloc_pd();
        let other_dev = Device::new();
        let same_number_elsewhere = other_dev.alloc_pd();
        for (qp_pd, what) in [
            (&other_pd, "another domain"),
            (&same_number_elsewhere, "another device"),
        ] {
            assert_eq!(
                mr.bind_window(1, qp_pd, Access::REMOTE_READ).err(),
                Some(Violation::NotAssociated),
                "{what}"
            );
        }
        assert!(mr.bind_window(1, &pd, Access::REMOTE_READ).is_ok());
    }

    #[test]
    fn a_window_serves_its_queue_pair_only_and_dies_with_its_region() {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let mut buf = vec![0u8; 256];
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let mr = region(&pd, &mut buf, rights);
        let at = mr.addr() as u64;
        mr.remote_only_through_windows();
        // The region's own STag: no queue pair may use it remotely; locally it still works.
        assert_eq!(
            dev.check(mr.stag(), pd.id(), 1, at, 8, Access::REMOTE_READ),
            Err(Violation::NotAssociated)
        );
        assert!(dev.check_local(mr.stag(), pd.id(), at, 8, true).is_ok());
        let w1 = mr.bind_window(1, &pd, Access::REMOTE_WRITE).unwrap();
        let w2 = mr.bind_window(2, &pd, Access::REMOTE_READ).unwrap();
        assert_ne!(w1.stag(), w2.stag());
        assert!(dev
            .check(w1.stag(), pd.id(), 1, at, 256, Access::REMOTE_WRITE)
            .is_ok());
        // Another queue pair, the other window's rights, past the end, as a local key.
        assert_eq!(
            dev.check(w1.stag(), pd.id(), 2, at, 8, Access::REMOTE_WRITE),
            Err(Violation::NotAssociated)
        );
        assert_eq!(
            dev.check(w2.stag(), pd.id(), 2, at, 8, Access::REMOTE_WRITE),
            Err(Violation::AccessRights)
        );
        assert_eq!(
            dev.check(w1.stag(), pd.id(), 1, at, 257, Access::REMOTE_WRITE),
            Err(Violation::BaseBounds)
        );
        assert_eq!(
            dev.check_local(w1.stag(), pd.id(), at, 8, false),
            Err(Violation::InvalidStag)
        );
        // Rights the region lacks, or local ones, cannot be bound.
        assert_eq!(
            mr.bind_window(1, &pd, Access::REMOTE_ATOMIC).err(),
            Some(Violation::AccessRights)
        );
        assert_eq!(
            mr.bind_window(1, &pd, Access::LOCAL_WRITE).err(),
            Some(Violation::AccessRights)
        );
        // Dropping a window kills its STag alone.
        let s2 = w2.stag();
        drop(w2);
        assert_eq!(
            dev.check(s2, pd.id(), 2, at, 8, Access::REMOTE_READ),
            Err(Violation::InvalidStag)
        );
        assert!(dev
            .check(w1.stag(), pd.id(), 1, at, 8, Access::REMOTE_WRITE)
            .is_ok());
        // Deregistering the region kills every window bound in it, and none comes back.
        let s1 = w1.stag();
        drop(mr);
        assert_eq!(
            dev.check(s1, pd.id(), 1, at, 8, Access::REMOTE_WRITE),
            Err(Violation::InvalidStag)
        );
        drop(w1); // after its region: harmless
        let mr = region(&pd, &mut buf, rights);
        let w = mr.bind_window(1, &pd, Access::REMOTE_WRITE).unwrap();
        assert!(w.stag() != s1 && w.stag() != s2 && w.stag() != mr.stag());
    }

    #[test]
    fn every_check_happens_before_access() {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let other = dev.alloc_pd();
        let mut buf = vec![0u8; 4096];
        let base = buf.as_mut_ptr() as u64;
        let mr = region(&pd, &mut buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let s = mr.stag();
        assert_eq!(
            dev.check(s, pd.id(), 1, base + 8, 8, Access::REMOTE_WRITE)
                .unwrap() as u64,
            base + 8
        );
        assert_eq!(
            dev.check(s, pd.id(), 1, base + 4090, 8, Access::REMOTE_WRITE),
            Err(Violation::BaseBounds)
        );
        assert_eq!(
            dev.check(s, pd.id(), 1, base - 1, 1, Access::REMOTE_WRITE),
            Err(Violation::BaseBounds)
        );
        assert_eq!(
            dev.check(s, pd.id(), 1, u64::MAX, 2, Access::REMOTE_WRITE),
            Err(Violation::ToWrap)
        );
        assert_eq!(
            dev.check(s, pd.id(), 1, base, 8, Access::REMOTE_READ),
            Err(Violation::AccessRights)
        );
        assert_eq!(
            dev.check(s, other.id(), 1, base, 8, Access::REMOTE_WRITE),
            Err(Violation::NotAssociated)
        );
        assert_eq!(
            dev.check(Stag(s.0 ^ 1), pd.id(), 1, base, 8, Access::REMOTE_WRITE),
            Err(Violation::InvalidStag)
        );
        mr.bind_to_qp(7);
        assert_eq!(
            dev.check(s, pd.id(), 8, base, 8, Access::REMOTE_WRITE),
            Err(Violation::NotAssociated)
        );
        assert!(dev
            .check(s, pd.id(), 7, base, 8, Access::REMOTE_WRITE)
            .is_ok());
    }

    #[test]
    fn deregistered_and_invalidated_stags_die_and_never_return() {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let mr = region(&pd, &mut buf, Access::LOCAL_WRITE | Access::REMOTE_READ);
        let s = mr.stag();
        drop(mr);
        assert_eq!(
            dev.check(s, pd.id(), 1, base, 8, Access::REMOTE_READ),
            Err(Violation::InvalidStag)
        );
        let mut seen = HashSet::new();
        seen.insert(s.0);
        for _ in 0..2000 {
            let mr = region(&pd, &mut buf, Access::REMOTE_READ);
            assert!(seen.insert(mr.stag().0), "an STag was handed out twice");
            dev.invalidate(mr.stag(), pd.id()).unwrap();
            assert_eq!(
                dev.check(mr.stag(), pd.id(), 1, base, 1, Access::REMOTE_READ),
                Err(Violation::InvalidStag)
            );
        }
    }

    /// `check_local` remembers the key it found last: a key that passed a moment ago fails at
    /// once when its region is deregistered, when it is invalidated, or when a window bound in
    /// it is presented as a local key; its domain, rights and bounds are checked on every call.
    #[test]
    fn a_local_key_that_just_passed_fails_once_it_is_gone() {
        let dev = Device::new();
        let (pd, other) = (dev.alloc_pd(), dev.alloc_pd());
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let rw = Access::LOCAL_WRITE | Access::REMOTE_READ;
        let mr = region(&pd, &mut buf, rw);
        let s = mr.stag();
        for _ in 0..2 {
            assert!(dev.check_local(s, pd.id(), base, 64, true).is_ok());
            assert_eq!(
                dev.check_local(s, other.id(), base, 8, false),
                Err(Violation::NotAssociated)
            );
            assert_eq!(
                dev.check_local(s, pd.id(), base + 1, 64, false),
                Err(Violation::BaseBounds)
            );
        }
        // A window's key is not a local key, right after its region's passed.
        let w = mr.bind_window(7, &pd, Access::REMOTE_READ).unwrap();
        assert!(dev.check_local(s, pd.id(), base, 8, false).is_ok());
        assert_eq!(
            dev.check_local(w.stag(), pd.id(), base, 8, false),
            Err(Violation::InvalidStag)
        );
        drop(w);
        assert!(dev.check_local(s, pd.id(), base, 8, false).is_ok());
        drop(mr);
        assert_eq!(
            dev.check_local(s, pd.id(), base, 8, false),
            Err(Violation::InvalidStag),
            "a deregistered key that passed a moment ago"
        );
        let mr = region(&pd, &mut buf, Access::LOCAL_WRITE);
        let ro = region(&pd, &mut buf, Access::REMOTE_READ);
        assert!(dev.check_local(mr.stag(), pd.id(), base, 8, true).is_ok());
        assert_eq!(
            dev.check_local(ro.stag(), pd.id(), base, 8, true),
            Err(Violation::AccessRights)
        );
        assert!(dev.check_local(mr.stag(), pd.id(), base, 8, true).is_ok());
        dev.invalidate(mr.stag(), pd.id()).unwrap();
        assert_eq!(
            dev.check_local(mr.stag(), pd.id(), base, 8, true),
            Err(Violation::InvalidStag),
            "an invalidated key that passed a moment ago"
        );
    }

    /// `check` remembers the key it found last, as `check_local` does: a key that passed a
    /// moment ago fails at once when its region is deregistered or invalidated, when the
    /// region is bound to queue pairs through windows only, or when a window's region goes;
    /// its domain, queue pair, rights and bounds are checked on every call.
    #[test]
    fn a_remote_key_that_just_passed_fails_once_it_is_gone() {
        let dev = Device::new();
        let (pd, other) = (dev.alloc_pd(), dev.alloc_pd());
        let mut buf = vec![0u8; 64];
        let base = buf.as_mut_ptr() as u64;
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = region(&pd, &mut buf, rw);
        let s = mr.stag();
        let w = Access::REMOTE_WRITE;
        for _ in 0..2 {
            assert!(dev.check(s, pd.id(), 3, base, 64, w).is_ok());
            assert_eq!(
                dev.check(s, other.id(), 3, base, 8, w),
                Err(Violation::NotAssociated)
            );
            assert_eq!(
                dev.check(s, pd.id(), 3, base, 8, Access::REMOTE_READ),
                Err(Violation::AccessRights)
            );
            assert_eq!(
                dev.check(s, pd.id(), 3, base + 1, 64, w),
                Err(Violation::BaseBounds)
            );
        }
        // Windows only: the region's own key stops serving any queue pair.
        let win = mr.bind_window(7, &pd, w).unwrap();
        assert!(dev.check(win.stag(), pd.id(), 7, base, 8, w).is_ok());
        assert_eq!(
            dev.check(win.stag(), pd.id(), 8, base, 8, w),
            Err(Violation::NotAssociated)
        );
        assert!(dev.check(s, pd.id(), 3, base, 8, w).is_ok());
        mr.remote_only_through_windows();
        assert_eq!(
            dev.check(s, pd.id(), 3, base, 8, w),
            Err(Violation::NotAssociated),
            "a region bound to windows only, its key having passed a moment ago"
        );
        assert!(dev.check(win.stag(), pd.id(), 7, base, 8, w).is_ok());
        drop(mr);
        assert_eq!(
            dev.check(win.stag(), pd.id(), 7, base, 8, w),
            Err(Violation::InvalidStag),
            "a window whose region went, having passed a moment ago"
        );
        drop(win);
        let mr = region(&pd, &mut buf, rw);
        assert!(dev.check(mr.stag(), pd.id(), 3, base, 8, w).is_ok());
        dev.invalidate(mr.stag(), pd.id()).unwrap();
        assert_eq!(
            dev.check(mr.stag(), pd.id(), 3, base, 8, w),
            Err(Violation::InvalidStag),
            "an invalidated key that passed a moment ago"
        );
        let mr = region(&pd, &mut buf, rw);
        assert!(dev.check(mr.stag(), pd.id(), 3, base, 8, w).is_ok());
        let s = mr.stag();
        drop(mr);
        assert_eq!(
            dev.check(s, pd.id(), 3, base, 8, w),
            Err(Violation::InvalidStag),
            "a deregistered key that passed a moment ago"
        );
    }

    #[test]
    fn stags_are_not_sequential() {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let mut buf = [0u8; 8];
        let a: Vec<u32> = (0..64)
            .map(|_| region(&pd, &mut buf, Access::REMOTE_READ).stag().0)
            .collect();
        let sequential = a
            .windows(2)
            .filter(|w| w[1].wrapping_sub(w[0]) < 1024)
            .count();
        assert!(sequential < 4, "STags look predictable: {a:?}");
    }

    #[test]
    fn remote_write_needs_local_write() {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let mut buf = [0u8; 8];
        // SAFETY: the buffer outlives the attempt.
        let r = unsafe { pd.register(buf.as_mut_ptr(), 8, Access::REMOTE_WRITE) };
        assert_eq!(r.err(), Some(Violation::AccessRights));
    }
}
