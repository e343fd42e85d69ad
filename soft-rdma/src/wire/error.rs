//! Decode errors, each carrying the Terminate code (RFC 5040 §7.2) it maps to.

/// The layer a Terminate names (RFC 5040 §7.2: the "Layer" field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// RDMAP.
    Rdmap = 0,
    /// DDP.
    Ddp = 1,
    /// The lower-layer protocol, MPA.
    Llp = 2,
}

/// Layer, error type and error code of a Terminate message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TermCode {
    /// Which layer failed.
    pub layer: Layer,
    /// The error type within that layer.
    pub etype: u8,
    /// The error code within that type.
    pub code: u8,
}

impl TermCode {
    /// MPA (RFC 5044 §8): the request/reply frame was invalid.
    pub const MPA_INVALID_REQ_REP: TermCode = TermCode {
        layer: Layer::Llp,
        etype: 0,
        code: 0x04,
    };
    /// MPA: the FPDU's CRC did not match.
    pub const MPA_CRC: TermCode = TermCode {
        layer: Layer::Llp,
        etype: 0,
        code: 0x02,
    };
    /// MPA: markers were present though not negotiated (we never negotiate them).
    pub const MPA_MARKER: TermCode = TermCode {
        layer: Layer::Llp,
        etype: 0,
        code: 0x03,
    };
    /// DDP untagged buffer error (etype 2): invalid DDP version (RFC 5041 §7.2).
    pub const DDP_UNTAGGED_VERSION: TermCode = TermCode {
        layer: Layer::Ddp,
        etype: 2,
        code: 0x06,
    };
    /// DDP tagged buffer error (etype 1): invalid DDP version.
    pub const DDP_TAGGED_VERSION: TermCode = TermCode {
        layer: Layer::Ddp,
        etype: 1,
        code: 0x04,
    };
    /// DDP untagged buffer error: invalid QN.
    pub const DDP_INVALID_QN: TermCode = TermCode {
        layer: Layer::Ddp,
        etype: 2,
        code: 0x01,
    };
    /// DDP: the segment is shorter than its header (a local catastrophic error, etype 0).
    pub const DDP_CATASTROPHIC: TermCode = TermCode {
        layer: Layer::Ddp,
        etype: 0,
        code: 0x00,
    };
    /// RDMAP remote operation error (etype 2): invalid RDMAP version (RFC 5040 §7.2).
    pub const RDMAP_VERSION: TermCode = TermCode {
        layer: Layer::Rdmap,
        etype: 2,
        code: 0x05,
    };
    /// RDMAP remote operation error: unexpected opcode.
    pub const RDMAP_OPCODE: TermCode = TermCode {
        layer: Layer::Rdmap,
        etype: 2,
        code: 0x06,
    };
}

/// A frame that cannot be decoded: which field, why, and the Terminate it calls for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct WireError {
    /// The offending field, as the RFC names it.
    pub field: &'static str,
    /// What was wrong with it.
    pub reason: &'static str,
    /// What to tell the peer.
    pub term: TermCode,
}

impl WireError {
    pub(crate) const fn new(field: &'static str, reason: &'static str, term: TermCode) -> Self {
        WireError {
            field,
            reason,
            term,
        }
    }
}
