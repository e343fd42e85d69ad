//! What a peer needs to address a region.

/// Where a peer may access a region: what applications put in the MPA private data (or a
/// message) so the other side can address its one-sided operations. 20 bytes on the wire,
/// big-endian.
///
/// ```
/// use barewire_rdma_types::{RegionDescriptor, Stag};
/// let d = RegionDescriptor { rkey: Stag(0x1234_5678), addr: 0x7f00_0000_1000, len: 1 << 20 };
/// let wire = d.to_bytes();
/// assert_eq!(wire.len(), RegionDescriptor::LEN);
/// assert_eq!(RegionDescriptor::from_bytes(&wire), Some(d));
/// assert_eq!(RegionDescriptor::from_bytes(&wire[..19]), None); // too short
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionDescriptor {
    /// The region's STag.
    pub rkey: crate::Stag,
    /// The address of its first byte (the tagged offset).
    pub addr: u64,
    /// Its length.
    pub len: u64,
}

impl RegionDescriptor {
    /// Bytes of the encoding.
    pub const LEN: usize = 20;

    /// Describes a registered region.
    pub fn of(mr: &crate::MemoryRegion) -> RegionDescriptor {
        RegionDescriptor {
            rkey: mr.stag(),
            addr: mr.addr() as u64,
            len: mr.len() as u64,
        }
    }

    /// The 20-byte encoding.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..4].copy_from_slice(&self.rkey.0.to_be_bytes());
        b[4..12].copy_from_slice(&self.addr.to_be_bytes());
        b[12..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Decodes the first 20 bytes of `b`; `None` if it is shorter.
    pub fn from_bytes(b: &[u8]) -> Option<RegionDescriptor> {
        let b: &[u8; Self::LEN] = b.get(..Self::LEN)?.try_into().ok()?;
        Some(RegionDescriptor {
            rkey: crate::Stag(u32::from_be_bytes(b[..4].try_into().ok()?)),
            addr: u64::from_be_bytes(b[4..12].try_into().ok()?),
            len: u64::from_be_bytes(b[12..].try_into().ok()?),
        })
    }
}
