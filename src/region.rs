//! Typed registered memory: `Region<T>` here, `RemoteRegion<T>` for a peer's, with a type
//! fingerprint that the receiving side checks.

use std::marker::PhantomData;
use std::rc::Rc;

use barewire_drivers::{Access, Buffer, ProtectionDomain, RegionDescriptor};
use bytemuck::Pod;

use crate::error::{Error, Result};

/// Where a region's first byte is aligned: at least this, and never less than the element
/// type's own alignment.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// use barewire::{Align, Node};
/// let node = Node::soft().unwrap();
/// let page = node.region::<u8>(8192, Align::Page).unwrap();
/// assert_eq!(page.as_ptr() as usize % 4096, 0);
/// let line = node.region::<u64>(16, Align::CacheLine).unwrap();
/// assert_eq!(line.as_ptr() as usize % 64, 0);
/// assert!(node.region::<u64>(16, Align::Bytes(3)).is_err()); // not a power of two
/// # });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// The type's own alignment (at least 8, so 8-byte atomics work on `u64` slots).
    Natural,
    /// A cache line (64 bytes): no false sharing with neighbouring data.
    CacheLine,
    /// A page (4096 bytes): what DMA engines and huge registrations prefer.
    Page,
    /// A device's requirement, in bytes (a power of two).
    Bytes(usize),
}

impl Align {
    /// The alignment in bytes: never less than `T`'s own, so `as_ptr` always points at a
    /// well-aligned `T`.
    fn bytes<T>(self) -> usize {
        std::mem::align_of::<T>().max(match self {
            Align::Natural => 8,
            Align::CacheLine => 64,
            Align::Page => 4096,
            Align::Bytes(n) => n,
        })
    }
}

/// What a typed descriptor claims about its element type: name, size and alignment. Two
/// builds of the same program agree on all three; a mismatch is refused at exchange time.
///
/// ```
/// use barewire::Fingerprint;
/// let f = Fingerprint::of::<[u32; 4]>();
/// assert_eq!((f.size, f.align), (16, 4));
/// assert!(f.check(&Fingerprint::of::<[u32; 4]>()).is_ok());
/// // Same size, another type: refused, naming both.
/// let e = f.check(&Fingerprint::of::<[f32; 4]>()).unwrap_err();
/// assert!(e.to_string().contains("f32"), "{e}");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint {
    /// `std::any::type_name`; one longer than [`Fingerprint::NAME_MAX`] bytes (deeply nested
    /// generics) is cut at a character boundary and followed by `..#` and a 64-bit FNV-1a hash
    /// of the whole name, so that it fits in a control message and still tells types apart.
    pub name: String,
    /// `size_of`.
    pub size: u32,
    /// `align_of`.
    pub align: u32,
}

impl Fingerprint {
    /// Longest name on the wire, in bytes.
    pub const NAME_MAX: usize = 384;

    /// The fingerprint of `T`.
    pub fn of<T>() -> Fingerprint {
        Fingerprint {
            name: Self::cut_name(std::any::type_name::<T>()),
            size: std::mem::size_of::<T>() as u32,
            align: std::mem::align_of::<T>() as u32,
        }
    }

    /// This fingerprint's name as it goes on the wire (see [`name`](Self::name)).
    pub(crate) fn wire_name(&self) -> String {
        Self::cut_name(&self.name)
    }

    /// `name`, or for one over [`NAME_MAX`](Self::NAME_MAX) bytes its cut and hashed form.
    fn cut_name(name: &str) -> String {
        if name.len() <= Self::NAME_MAX {
            return name.to_string();
        }
        let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
        });
        let mut cut = Self::NAME_MAX - 19; // room for "..#" and 16 hex digits
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        format!("{}..#{hash:016x}", &name[..cut])
    }

    /// Checks that `found` (what the peer sent) describes the type this side expects.
    pub fn check(&self, found: &Fingerprint) -> Result<()> {
        if self == found {
            Ok(())
        } else {
            Err(Error::type_mismatch(self.to_string(), found.to_string()))
        }
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (size {}, align {})",
            self.name, self.size, self.align
        )
    }
}

/// A registered array of `len` plain-old-data `T`s in this process, zero-initialised, that
/// peers may read, write and update atomically once they hold its [`RemoteRegion`].
///
/// Peers reach it only through a connection it was sent over
/// ([`Endpoint::send_region`](crate::Endpoint::send_region)): each send binds a window
/// (iWARP type 2 memory window semantics) to that connection, so a key seen on one connection,
/// or guessed, is refused on any other with a protection error. The region's own key grants
/// no remote access. (On a verbs device without type 2 memory windows, siw for one, the
/// region keeps its remote rights and its key is sent as is; a warning says so once.)
///
/// Its memory is reachable by the RDMA device and by peers at any time, so it is never lent
/// out as `&[T]`: read and write it by copying (`get`, `set`, `to_vec`, `copy_from`).
///
/// ```
/// use barewire::{Node, Align};
/// # barewire::engine::Runtime::builder().cores(1).pin(false).build().unwrap().block_on(async {
/// let node = Node::soft().unwrap();
/// let counters = node.region::<u64>(16, Align::CacheLine).unwrap();
/// counters.set(3, 42);
/// assert_eq!(counters.get(3), 42);
/// # });
/// ```
pub struct Region<T: Pod> {
    pub(crate) buf: Rc<Buffer>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> Region<T> {
    pub(crate) fn new(pd: &ProtectionDomain, len: usize, align: Align) -> Result<Region<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::Invalid(format!("{len} elements overflow")))?;
        // Asked for, before the type's own alignment raises it: an alignment of 3 or 0 is a
        // mistake whatever `T` is.
        if let Align::Bytes(n) = align {
            if !n.is_power_of_two() {
                return Err(Error::Invalid(format!(
                    "alignment {n} is not a power of two"
                )));
            }
        }
        let a = align.bytes::<T>();
        let all = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC;
        let buf = Buffer::new(pd, bytes, a, all)?;
        if let Err(e) = buf.region().remote_only_through_windows() {
            crate::endpoint::windows_unavailable(&e);
        }
        Ok(Region {
            buf,
            len,
            _t: PhantomData,
        })
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn at(&self, i: usize) -> usize {
        assert!(i < self.len, "index {i} out of a region of {}", self.len);
        i * std::mem::size_of::<T>()
    }

    /// Element `i` (a copy).
    pub fn get(&self, i: usize) -> T {
        let mut v = T::zeroed();
        self.buf.read_at(self.at(i), bytemuck::bytes_of_mut(&mut v));
        v
    }

    /// Sets element `i`.
    pub fn set(&self, i: usize, v: T) {
        self.buf.write_at(self.at(i), bytemuck::bytes_of(&v));
    }

    /// Every element (a copy).
    pub fn to_vec(&self) -> Vec<T> {
        let mut v = vec![T::zeroed(); self.len];
        self.buf.read_at(0, bytemuck::cast_slice_mut(&mut v));
        v
    }

    /// Copies `src` in, starting at element `start`.
    pub fn copy_from(&self, start: usize, src: &[T]) {
        assert!(start + src.len() <= self.len, "copy past the region's end");
        self.buf
            .write_at(start * std::mem::size_of::<T>(), bytemuck::cast_slice(src));
    }

    /// Address of the first byte (for alignment checks).
    pub fn as_ptr(&self) -> *const T {
        self.buf.region().addr() as *const T
    }

    /// Address of the first element, for computing in place (a BLAS kernel over a block).
    /// Writing through it is the caller's to make safe: nothing else may touch the elements
    /// written meanwhile, including a peer's RDMA WRITE or READ of them.
    pub fn as_mut_ptr(&self) -> *mut T {
        self.buf.region().addr() as *mut T
    }
}

/// A peer's [`Region<T>`]: its address, length and key. Obtained from
/// [`Endpoint::recv_region`](crate::Endpoint::recv_region), which checks that the peer's
/// region holds `T`.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// # let cfg = barewire::drivers::DriverConfig::parse("soft", None).unwrap();
/// # let ([home, _], a, b) = barewire::Node::loopback_pair(&cfg).await.unwrap();
/// use barewire::{Align, Error};
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Point { x: f32, y: f32 }
///
/// let points = home.region::<Point>(100, Align::Natural).unwrap();
/// a.send_region(&points).await.unwrap();
/// let remote = b.recv_region::<Point>().await.unwrap();
/// assert_eq!(remote.len(), 100);
/// b.write(&remote, 99, Point { x: 1.0, y: 2.0 }).await.unwrap();
/// assert_eq!(points.get(99), Point { x: 1.0, y: 2.0 });
///
/// // Asking for the region as another type is refused at the exchange.
/// a.send_region(&points).await.unwrap();
/// assert!(matches!(b.recv_region::<u64>().await, Err(Error::TypeMismatch(_))));
/// # });
/// ```
pub struct RemoteRegion<T> {
    pub(crate) desc: RegionDescriptor,
    pub(crate) len: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for RemoteRegion<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for RemoteRegion<T> {}

impl<T> std::fmt::Debug for RemoteRegion<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RemoteRegion<{}>({} elements at {:#x}, rkey {:#x})",
            std::any::type_name::<T>(),
            self.len,
            self.desc.addr,
            self.desc.rkey.0
        )
    }
}

impl<T> RemoteRegion<T> {
    pub(crate) fn from_parts(desc: RegionDescriptor, len: u64) -> RemoteRegion<T> {
        RemoteRegion {
            desc,
            len,
            _t: PhantomData,
        }
    }

    /// Elements.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn check(&self, index: u64, count: u64) -> Result<u64> {
        match index.checked_add(count) {
            Some(end) if end <= self.len => Ok(index * std::mem::size_of::<T>() as u64),
            _ => Err(Error::OutOfBounds {
                index,
                count,
                len: self.len,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_round_trip_and_name_the_mismatch() {
        let b = serde_bare::to_vec(&Fingerprint::of::<[u32; 3]>()).unwrap();
        let got: Fingerprint = serde_bare::from_slice(&b).unwrap();
        assert_eq!(got, Fingerprint::of::<[u32; 3]>());
        let e = Fingerprint::of::<u64>().check(&got).unwrap_err();
        assert_eq!(
            e.to_string(),
            "type mismatch: expected u64 (size 8, align 8), the peer offered [u32; 3] (size 12, align 4)"
        );
        assert!(serde_bare::from_slice::<Fingerprint>(&b[..5]).is_err());
    }

    /// A type aligned beyond a cache line, in a region asked to start at one.
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    #[repr(C, align(256))]
    struct Wide([u8; 256]);

    /// Every choice gives at least the type's own alignment, on soft and on shm (whose buffers
    /// are files mapped a page at a time, so more than a page takes a longer file), and an
    /// alignment that is not a power of two is refused before the type's raises it.
    #[test]
    fn a_region_is_never_aligned_below_its_type() {
        barewire_test_support::rt().block_on(async {
            for driver in ["soft", "shm"] {
                let cfg = barewire_drivers::DriverConfig::parse(driver, None).unwrap();
                let node = crate::Node::with_config(&cfg).unwrap();
                for align in [
                    Align::Natural,
                    Align::CacheLine,
                    Align::Bytes(16),
                    Align::Page,
                    Align::Bytes(1 << 16),
                    Align::Bytes(2 << 20),
                ] {
                    for _ in 0..8 {
                        let r = node.region::<Wide>(3, align).unwrap();
                        let want = align.bytes::<u8>().max(256);
                        assert_eq!(r.as_ptr() as usize % want, 0, "{driver}: {align:?}");
                    }
                }
                for n in [0, 3, 24] {
                    let e = node.region::<u8>(8, Align::Bytes(n)).err().unwrap();
                    assert!(e.to_string().contains("not a power of two"), "{e}");
                }
            }
        });
    }
}
