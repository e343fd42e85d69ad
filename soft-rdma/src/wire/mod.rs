//! The iWARP wire codec: pure functions from bytes to frames and back. No I/O, no allocation
//! driven by peer input, and every decode of untrusted bytes returns an error, never panics.
//!
//! Layers, outermost first: MPA (RFC 5044, enhanced by RFC 6581) frames the TCP stream into
//! FPDUs; DDP (RFC 5041) places segments, tagged or untagged; RDMAP (RFC 5040) says what each
//! message means.

mod ddp;
mod error;
mod fpdu;
mod mpa;

pub use ddp::{
    DdpHeader, RdmapOpcode, ReadRequest, Segment, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN,
};
pub use error::{Layer, TermCode, WireError};
pub use fpdu::{crc32c_fpdu, encode_fpdu_header, fpdu_trailer, Fpdu, FPDU_HEADER_LEN};
pub use mpa::{
    negotiate, MpaFrame, MpaKind, MpaSettings, Negotiated, Reject, Rev2Params, MPA_HEADER_LEN,
    MPA_MAX_PRIVATE_DATA,
};
