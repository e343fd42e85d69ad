//! Work requests (`struct ibv_send_wr`, `struct ibv_recv_wr`) and their scatter/gather
//! elements.

use crate::{Stag, WcOpcode};

/// One scatter/gather element: `len` bytes at `addr` in the local region `lkey`.
///
/// ```
/// use barewire_rdma_types::{Sge, Sges, Stag};
/// let header = Sge { addr: 0x1000, len: 16, lkey: Stag(7) };
/// let body = Sge { addr: 0x8000, len: 4096, lkey: Stag(7) };
/// let list: Sges = [header, body].into_iter().collect(); // gathered in this order
/// assert_eq!(list.iter().map(|s| s.len).sum::<u32>(), 4112);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// The local region's STag.
    pub lkey: Stag,
}

/// A work request's scatter/gather list (`sg_list` and `num_sge` of `ibv_send_wr`).
///
/// Up to [`Sges::INLINE`] elements live inside the request itself, so posting one costs no
/// allocation (a latency loop posts millions); longer lists go to the heap. It reads as a
/// slice of [`Sge`], and is made from one element, an array, a vector or an iterator.
///
/// ```
/// use barewire_rdma_types::{Sge, Sges, Stag};
/// let a = Sge { addr: 0x1000, len: 64, lkey: Stag(7) };
/// let b = Sge { addr: 0x2000, len: 32, lkey: Stag(7) };
/// let one = Sges::from(a);
/// let two = Sges::from([a, b]);
/// assert_eq!((one.len(), two.iter().map(|s| s.len).sum::<u32>()), (1, 96));
/// assert_eq!(two, Sges::from(vec![a, b]));
/// assert_eq!(Sges::new().len(), 0);
/// ```
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Sges(smallvec::SmallVec<[Sge; Sges::INLINE]>);

impl Sges {
    /// How many elements a list holds without allocating.
    pub const INLINE: usize = 2;

    /// An empty list (a zero-length request).
    pub fn new() -> Sges {
        Sges(smallvec::SmallVec::new())
    }

    /// Appends an element.
    pub fn push(&mut self, sge: Sge) {
        self.0.push(sge);
    }
}

impl std::fmt::Debug for Sges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl std::ops::Deref for Sges {
    type Target = [Sge];

    #[inline]
    fn deref(&self) -> &[Sge] {
        &self.0
    }
}

impl std::ops::DerefMut for Sges {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Sge] {
        &mut self.0
    }
}

impl From<Sge> for Sges {
    #[inline]
    fn from(sge: Sge) -> Sges {
        Sges(smallvec::smallvec![sge])
    }
}

impl<const N: usize> From<[Sge; N]> for Sges {
    fn from(sges: [Sge; N]) -> Sges {
        sges.into_iter().collect()
    }
}

impl From<&[Sge]> for Sges {
    fn from(sges: &[Sge]) -> Sges {
        Sges(smallvec::SmallVec::from_slice(sges))
    }
}

impl From<Vec<Sge>> for Sges {
    fn from(sges: Vec<Sge>) -> Sges {
        Sges(smallvec::SmallVec::from_vec(sges))
    }
}

impl FromIterator<Sge> for Sges {
    fn from_iter<I: IntoIterator<Item = Sge>>(iter: I) -> Sges {
        Sges(iter.into_iter().collect())
    }
}

impl<'a> IntoIterator for &'a Sges {
    type Item = &'a Sge;
    type IntoIter = std::slice::Iter<'a, Sge>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// A Send into the peer's next posted receive; `invalidate` names a peer STag to invalidate.
    Send {
        /// Ask for a solicited event at the receiver.
        solicited: bool,
        /// Send with Invalidate.
        invalidate: Option<Stag>,
    },
    /// An RDMA Write to `remote_addr` in the peer's region `rkey`.
    Write {
        /// Target address.
        remote_addr: u64,
        /// Target region.
        rkey: Stag,
    },
    /// An RDMA Read from `remote_addr` in the peer's region `rkey` into the (single) local SGE.
    Read {
        /// Source address.
        remote_addr: u64,
        /// Source region.
        rkey: Stag,
    },
    /// An RDMA Write followed by RFC 7306 Immediate Data: the peer's next receive completes
    /// with `imm` (as `RecvRdmaWithImm`) once the written data is in place.
    WriteWithImm {
        /// Target address.
        remote_addr: u64,
        /// Target region.
        rkey: Stag,
        /// Delivered in the receiver's completion.
        imm: u32,
    },
    /// Adds `add` to the 8-byte word at `remote_addr`; the original value lands in the single
    /// 8-byte local SGE.
    FetchAdd {
        /// Target word (8-byte aligned).
        remote_addr: u64,
        /// Target region (needs REMOTE_ATOMIC).
        rkey: Stag,
        /// Addend.
        add: u64,
    },
    /// Replaces the word with `swap` if it equals `compare`; the original lands locally.
    CmpSwap {
        /// Target word (8-byte aligned).
        remote_addr: u64,
        /// Target region (needs REMOTE_ATOMIC).
        rkey: Stag,
        /// Expected value.
        compare: u64,
        /// New value.
        swap: u64,
    },
    /// Invalidates one of this side's own STags (ibv_post_send(3) `IBV_WR_LOCAL_INV`), in
    /// order with the requests before it: later remote accesses with it fail.
    LocalInvalidate {
        /// The STag to invalidate.
        stag: Stag,
    },
    /// Replaces the word with `swap` unconditionally; the original lands locally.
    Swap {
        /// Target word (8-byte aligned).
        remote_addr: u64,
        /// Target region (needs REMOTE_ATOMIC).
        rkey: Stag,
        /// New value.
        swap: u64,
    },
}

/// A send work request (`struct ibv_send_wr`).
///
/// ```
/// use barewire_rdma_types::{SendOp, SendWr, Sge, Stag, WcOpcode};
/// // An unsignaled 64-byte Write: no completion unless it fails.
/// let wr = SendWr {
///     wr_id: 42,
///     op: SendOp::Write { remote_addr: 0x7f00_0000, rkey: Stag(0xabcd) },
///     sges: [Sge { addr: 0x1000, len: 64, lkey: Stag(1) }].into_iter().collect(),
///     signaled: false,
///     fence: false,
/// };
/// assert_eq!(wr.op.opcode(), WcOpcode::RdmaWrite);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local memory: the payload of a Send/Write, the sink of a Read.
    pub sges: Sges,
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
    /// `IBV_SEND_FENCE`: start only after every earlier RDMA Read and atomic has completed
    /// (so this request sees their effects, e.g. a Send that announces data just read).
    pub fence: bool,
}

/// A receive work request (`struct ibv_recv_wr`).
///
/// ```
/// use barewire_rdma_types::{RecvWr, Sge, Stag};
/// // Where the next incoming Send lands: up to 4 KiB at 0x2000.
/// let into = Sge { addr: 0x2000, len: 4096, lkey: Stag(1) };
/// let wr = RecvWr { wr_id: 3, sges: [into].into_iter().collect() };
/// assert_eq!(wr.sges.len(), 1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send lands, in order.
    pub sges: Sges,
}

impl SendOp {
    /// The opcode its completion carries.
    pub fn opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::Write { .. } | SendOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            SendOp::CmpSwap { .. } | SendOp::Swap { .. } => WcOpcode::CompSwap,
            SendOp::LocalInvalidate { .. } => WcOpcode::LocalInv,
        }
    }

    /// Reads and atomics: the peer's data comes back into local memory (and, on iWARP, each
    /// takes an ORD slot).
    pub fn returns_data(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. }
                | SendOp::FetchAdd { .. }
                | SendOp::CmpSwap { .. }
                | SendOp::Swap { .. }
        )
    }
}
