//! The iWARP wire codec: pure functions from bytes to frames and back. No I/O, no allocation
//! driven by peer input (the deframer's buffer is bounded by the negotiated maximum), and every
//! decode of untrusted bytes returns an error naming the field and the Terminate code it maps
//! to, never a panic.
//!
//! Layers, outermost first: MPA (RFC 5044, enhanced by RFC 6581) frames the TCP stream into
//! FPDUs; DDP (RFC 5041) places segments, tagged or untagged; RDMAP (RFC 5040, extended by
//! RFC 7306) says what each message means.
//!
//! ```
//! use barewire_soft_rdma::wire::*;
//! // A Send segment: header and payload are encoded separately, so the payload can go out
//! // from its own memory (a gather list) instead of being copied into the frame.
//! let seg = Segment { last: true, opcode: RdmapOpcode::Send,
//!                     header: DdpHeader::Untagged { ulp: 0, qn: qn::SEND, msn: 1, mo: 0 },
//!                     payload: b"hello" };
//! let mut ddp = [0u8; UNTAGGED_HEADER_LEN];
//! let n = seg.encode_header(&mut ddp).unwrap();
//! let ulpdu_len = n + seg.payload.len();
//! let mut len = [0u8; FPDU_HEADER_LEN];
//! encode_fpdu_header(ulpdu_len, &mut len).unwrap();
//! let mut trailer = [0u8; 8];
//! let t = fpdu_trailer(&[&len, &ddp[..n], seg.payload], ulpdu_len, true, &mut trailer);
//! let wire = [&len[..], &ddp[..n], seg.payload, &trailer[..t]].concat();
//!
//! let (fpdu, used) = Fpdu::decode(&wire, true, 65535).unwrap().unwrap();
//! assert_eq!(used, wire.len());
//! assert_eq!(Segment::decode(fpdu.ulpdu).unwrap(), seg);
//! ```

mod crc;
mod ddp;
mod error;
mod fpdu;
#[doc(hidden)]
pub mod fuzz;
mod mpa;
mod rdmap;
mod segment;

pub use crc::{crc32c_append, crc32c_copy};
pub use ddp::{DdpHeader, RdmapOpcode, Segment, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
pub use error::{
    DdpTaggedErrorCode, DdpUntaggedErrorCode, Layer, MpaErrorCode, RdmapErrorCode, RdmapErrorType,
    TermCode, WireError,
};
pub use fpdu::{
    crc32c_fpdu, encode_fpdu_header, fpdu_trailer, fpdu_trailer_after, Deframer, Fpdu, Framer,
    Step, FPDU_HEADER_LEN,
};
pub use mpa::{
    negotiate, MpaFrame, MpaKind, MpaSettings, Negotiated, Reject, Rev2Params, MPA_HEADER_LEN,
    MPA_MAX_PRIVATE_DATA,
};
pub use rdmap::{
    qn, AtomicOp, AtomicRequest, AtomicResponse, ImmediateData, ReadRequest, Terminate,
};
pub use segment::{split, Placement, Reassembly, QUEUES};
