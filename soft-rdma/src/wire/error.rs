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

/// RDMAP error types (RFC 5040 §7.2, layer 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmapErrorType {
    /// Local catastrophic error.
    LocalCatastrophic = 0,
    /// Remote protection error.
    RemoteProtection = 1,
    /// Remote operation error.
    RemoteOperation = 2,
}

/// RDMAP error codes (RFC 5040 §7.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmapErrorCode {
    /// Invalid STag.
    InvalidStag = 0x00,
    /// Base or bounds violation.
    BaseBounds = 0x01,
    /// Access rights violation.
    AccessRights = 0x02,
    /// STag not associated with this RDMAP stream.
    StagNotAssociated = 0x03,
    /// TO wrap.
    ToWrap = 0x04,
    /// Invalid RDMAP version.
    Version = 0x05,
    /// Unexpected opcode.
    Opcode = 0x06,
    /// Catastrophic error, localized to the RDMAP stream.
    CatastrophicStream = 0x07,
    /// Catastrophic error, global.
    CatastrophicGlobal = 0x08,
    /// STag cannot be invalidated.
    CannotInvalidate = 0x09,
    /// Unspecified.
    Unspecified = 0xff,
}

/// DDP tagged buffer error codes (RFC 5041 §7.2, error type 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpTaggedErrorCode {
    /// Invalid STag.
    InvalidStag = 0x00,
    /// Base or bounds violation.
    BaseBounds = 0x01,
    /// STag not associated with this DDP stream.
    StagNotAssociated = 0x02,
    /// TO wrap.
    ToWrap = 0x03,
    /// Invalid DDP version.
    Version = 0x04,
}

/// DDP untagged buffer error codes (RFC 5041 §7.2, error type 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpUntaggedErrorCode {
    /// Invalid QN.
    InvalidQn = 0x01,
    /// Invalid MSN: no buffer available.
    NoBuffer = 0x02,
    /// Invalid MSN: MSN range is not valid.
    MsnRange = 0x03,
    /// Invalid MO.
    InvalidMo = 0x04,
    /// DDP message too long for the available buffer.
    TooLong = 0x05,
    /// Invalid DDP version.
    Version = 0x06,
}

/// MPA (LLP) error codes (RFC 5044 §8 and RFC 6581 §8, layer 2, error type 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpaErrorCode {
    /// TCP connection closed, terminated or lost.
    StreamLost = 0x01,
    /// MPA CRC error.
    Crc = 0x02,
    /// Marker and ULPDU length mismatch.
    Marker = 0x03,
    /// Invalid MPA Request or Reply frame.
    InvalidRequestReply = 0x04,
    /// Local catastrophic error (RFC 6581).
    LocalCatastrophic = 0x05,
    /// Insufficient IRD resources (RFC 6581).
    InsufficientIrd = 0x06,
    /// No matching RTR option (RFC 6581).
    NoMatchingRtr = 0x07,
}

impl TermCode {
    /// An RDMAP Terminate code.
    pub const fn rdmap(etype: RdmapErrorType, code: RdmapErrorCode) -> TermCode {
        TermCode {
            layer: Layer::Rdmap,
            etype: etype as u8,
            code: code as u8,
        }
    }
    /// A DDP tagged buffer Terminate code.
    pub const fn ddp_tagged(code: DdpTaggedErrorCode) -> TermCode {
        TermCode {
            layer: Layer::Ddp,
            etype: 1,
            code: code as u8,
        }
    }
    /// A DDP untagged buffer Terminate code.
    pub const fn ddp_untagged(code: DdpUntaggedErrorCode) -> TermCode {
        TermCode {
            layer: Layer::Ddp,
            etype: 2,
            code: code as u8,
        }
    }
    /// An MPA Terminate code.
    pub const fn mpa(code: MpaErrorCode) -> TermCode {
        TermCode {
            layer: Layer::Llp,
            etype: 0,
            code: code as u8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_constants_agree_with_the_tables() {
        assert_eq!(TermCode::MPA_CRC, TermCode::mpa(MpaErrorCode::Crc));
        assert_eq!(
            TermCode::MPA_INVALID_REQ_REP,
            TermCode::mpa(MpaErrorCode::InvalidRequestReply)
        );
        assert_eq!(TermCode::MPA_MARKER, TermCode::mpa(MpaErrorCode::Marker));
        assert_eq!(
            TermCode::DDP_TAGGED_VERSION,
            TermCode::ddp_tagged(DdpTaggedErrorCode::Version)
        );
        assert_eq!(
            TermCode::DDP_UNTAGGED_VERSION,
            TermCode::ddp_untagged(DdpUntaggedErrorCode::Version)
        );
        assert_eq!(
            TermCode::DDP_INVALID_QN,
            TermCode::ddp_untagged(DdpUntaggedErrorCode::InvalidQn)
        );
        assert_eq!(
            TermCode::RDMAP_VERSION,
            TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Version)
        );
        assert_eq!(
            TermCode::RDMAP_OPCODE,
            TermCode::rdmap(RdmapErrorType::RemoteOperation, RdmapErrorCode::Opcode)
        );
    }
}
