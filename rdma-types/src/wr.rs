//! Work requests (`struct ibv_send_wr`, `struct ibv_recv_wr`) and their scatter/gather
//! elements.

use crate::{Stag, WcOpcode};

/// One scatter/gather element: `len` bytes at `addr` in the local region `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length.
    pub len: u32,
    /// The local region's STag.
    pub lkey: Stag,
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub op: SendOp,
    /// Local memory: the payload of a Send/Write, the sink of a Read.
    pub sges: Vec<Sge>,
    /// Produce a completion on success (errors always complete).
    pub signaled: bool,
    /// `IBV_SEND_FENCE`: start only after every earlier RDMA Read and atomic has completed
    /// (so this request sees their effects, e.g. a Send that announces data just read).
    pub fence: bool,
}

/// A receive work request (`struct ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send lands, in order.
    pub sges: Vec<Sge>,
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
