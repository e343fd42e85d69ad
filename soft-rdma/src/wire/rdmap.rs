//! RDMAP message bodies that follow the DDP header: the RDMA Read Request (RFC 5040 §4.4), the
//! Terminate (RFC 5040 §4.8), and RFC 7306's Atomic Request, Atomic Response and Immediate Data.
//! Every decoder checks the exact length first, so a short or long body is an error, not a
//! panic or a partial read.

use super::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use super::error::{Layer, TermCode, WireError};

/// Untagged queue numbers (RFC 5040 §5.1; RFC 7306 §9 for the atomics).
pub mod qn {
    /// Send and Send with Invalidate/SE, and Immediate Data.
    pub const SEND: u32 = 0;
    /// RDMA Read Request.
    pub const READ_REQUEST: u32 = 1;
    /// Terminate.
    pub const TERMINATE: u32 = 2;
    /// Atomic Request (RFC 7306).
    pub const ATOMIC_REQUEST: u32 = 3;
    /// Atomic Response (RFC 7306).
    pub const ATOMIC_RESPONSE: u32 = 4;
}

fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn be64(b: &[u8], o: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[o..o + 8]);
    u64::from_be_bytes(a)
}

fn exact(b: &[u8], len: usize, field: &'static str) -> Result<(), WireError> {
    if b.len() == len {
        Ok(())
    } else {
        Err(WireError::new(
            field,
            "body has the wrong length",
            TermCode::RDMAP_OPCODE,
        ))
    }
}

/// The body of an RDMA Read Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest {
    /// Where the responder writes the data (the requester's region).
    pub sink_stag: u32,
    /// Offset in the sink region.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// The region read from (the responder's).
    pub source_stag: u32,
    /// Offset in the source region.
    pub source_to: u64,
}

impl ReadRequest {
    /// Bytes of the body.
    pub const LEN: usize = 28;

    /// Decodes the body of a Read Request segment.
    pub fn decode(b: &[u8]) -> Result<ReadRequest, WireError> {
        exact(b, Self::LEN, "RDMA Read Request")?;
        Ok(ReadRequest {
            sink_stag: be32(b, 0),
            sink_to: be64(b, 4),
            size: be32(b, 12),
            source_stag: be32(b, 16),
            source_to: be64(b, 20),
        })
    }

    /// Encodes the body.
    pub fn encode(&self, out: &mut [u8; Self::LEN]) {
        out[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        out[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        out[12..16].copy_from_slice(&self.size.to_be_bytes());
        out[16..20].copy_from_slice(&self.source_stag.to_be_bytes());
        out[20..28].copy_from_slice(&self.source_to.to_be_bytes());
    }
}

/// A Terminate message body: what failed, and copies of the headers that failed.
///
/// ```text
/// byte 0      layer (4 bits) | error type (4 bits)
/// byte 1      error code
/// bytes 2..4  M | D | R | reserved (13 bits)
/// if D:       DDP segment length (2) + the DDP header of the failing segment (14 or 18)
/// if R:       the RDMAP header of the failing message (28: a Read Request's body)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terminate {
    /// Layer, error type, error code.
    pub code: TermCode,
    /// M: the failing message was a DDP message the sender has acted on.
    pub m: bool,
    /// The failing segment's length and DDP header (tagged: 14 bytes, untagged: 18).
    pub ddp: Option<(u16, [u8; UNTAGGED_HEADER_LEN], usize)>,
    /// The failing message's RDMAP header.
    pub rdmap: Option<[u8; ReadRequest::LEN]>,
}

impl Terminate {
    /// Bytes `encode` writes.
    pub fn encoded_len(&self) -> usize {
        4 + self.ddp.map_or(0, |(_, _, n)| 2 + n) + self.rdmap.map_or(0, |_| ReadRequest::LEN)
    }

    /// Encodes into `out`; returns the length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let n = self.encoded_len();
        if out.len() < n {
            return Err(WireError::new(
                "output buffer",
                "too small for the Terminate",
                TermCode::RDMAP_OPCODE,
            ));
        }
        out[0] = ((self.code.layer as u8) << 4) | (self.code.etype & 0x0f);
        out[1] = self.code.code;
        out[2] = (self.m as u8) << 7
            | (self.ddp.is_some() as u8) << 6
            | (self.rdmap.is_some() as u8) << 5;
        out[3] = 0;
        let mut at = 4;
        if let Some((seg_len, hdr, hlen)) = self.ddp {
            out[at..at + 2].copy_from_slice(&seg_len.to_be_bytes());
            out[at + 2..at + 2 + hlen].copy_from_slice(&hdr[..hlen]);
            at += 2 + hlen;
        }
        if let Some(r) = self.rdmap {
            out[at..at + ReadRequest::LEN].copy_from_slice(&r);
        }
        Ok(n)
    }

    /// Decodes a Terminate body.
    pub fn decode(b: &[u8]) -> Result<Terminate, WireError> {
        if b.len() < 4 {
            return Err(WireError::new(
                "Terminate control",
                "shorter than 4 bytes",
                TermCode::RDMAP_OPCODE,
            ));
        }
        let layer = match b[0] >> 4 {
            0 => Layer::Rdmap,
            1 => Layer::Ddp,
            2 => Layer::Llp,
            _ => {
                return Err(WireError::new(
                    "Terminate layer",
                    "not RDMAP, DDP or LLP",
                    TermCode::RDMAP_OPCODE,
                ))
            }
        };
        let code = TermCode {
            layer,
            etype: b[0] & 0x0f,
            code: b[1],
        };
        let (m, d, r) = (b[2] & 0x80 != 0, b[2] & 0x40 != 0, b[2] & 0x20 != 0);
        let mut at = 4;
        let ddp = if d {
            if b.len() < at + 2 + 2 {
                return Err(WireError::new(
                    "Terminate DDP header",
                    "D set but the copy is missing",
                    TermCode::RDMAP_OPCODE,
                ));
            }
            let seg_len = u16::from_be_bytes([b[at], b[at + 1]]);
            // The copied header says itself whether it is tagged.
            let hlen = if b[at + 2] & 0x80 != 0 {
                TAGGED_HEADER_LEN
            } else {
                UNTAGGED_HEADER_LEN
            };
            if b.len() < at + 2 + hlen {
                return Err(WireError::new(
                    "Terminate DDP header",
                    "copy is truncated",
                    TermCode::RDMAP_OPCODE,
                ));
            }
            let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
            hdr[..hlen].copy_from_slice(&b[at + 2..at + 2 + hlen]);
            at += 2 + hlen;
            Some((seg_len, hdr, hlen))
        } else {
            None
        };
        let rdmap = if r {
            if b.len() < at + ReadRequest::LEN {
                return Err(WireError::new(
                    "Terminate RDMAP header",
                    "R set but the copy is missing",
                    TermCode::RDMAP_OPCODE,
                ));
            }
            let mut h = [0u8; ReadRequest::LEN];
            h.copy_from_slice(&b[at..at + ReadRequest::LEN]);
            at += ReadRequest::LEN;
            Some(h)
        } else {
            None
        };
        if at != b.len() {
            return Err(WireError::new(
                "Terminate",
                "trailing bytes after the header copies",
                TermCode::RDMAP_OPCODE,
            ));
        }
        Ok(Terminate {
            code,
            m,
            ddp,
            rdmap,
        })
    }
}

/// RFC 7306 atomic operation codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds `data` (under `mask`) and returns the original value.
    FetchAdd = 0,
    /// Swaps in `data` (under `mask`).
    Swap = 1,
    /// Swaps in `data` if the masked value equals `compare` under `compare_mask`.
    CmpSwap = 2,
}

/// An Atomic Request (RFC 7306 §5.2): always 56 bytes after the DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicRequest {
    /// What to do.
    pub op: AtomicOp,
    /// Matches the response to the request.
    pub request_id: u32,
    /// The target region.
    pub stag: u32,
    /// The 8-byte-aligned target offset.
    pub to: u64,
    /// Add or swap data.
    pub data: u64,
    /// Add or swap mask.
    pub data_mask: u64,
    /// Compare data (CmpSwap).
    pub compare: u64,
    /// Compare mask (CmpSwap).
    pub compare_mask: u64,
}

impl AtomicRequest {
    /// Bytes of the body.
    pub const LEN: usize = 56;

    /// Decodes the body.
    pub fn decode(b: &[u8]) -> Result<AtomicRequest, WireError> {
        exact(b, Self::LEN, "Atomic Request")?;
        let op = match be32(b, 0) & 0x0f {
            0 => AtomicOp::FetchAdd,
            1 => AtomicOp::Swap,
            2 => AtomicOp::CmpSwap,
            _ => {
                return Err(WireError::new(
                    "Atomic Request AOpCode",
                    "unknown atomic operation",
                    TermCode::RDMAP_OPCODE,
                ))
            }
        };
        Ok(AtomicRequest {
            op,
            request_id: be32(b, 4),
            stag: be32(b, 8),
            to: be64(b, 12),
            data: be64(b, 20),
            data_mask: be64(b, 28),
            compare: be64(b, 36),
            compare_mask: be64(b, 44),
        })
    }

    /// Encodes the body.
    pub fn encode(&self, out: &mut [u8; Self::LEN]) {
        out[0..4].copy_from_slice(&(self.op as u32).to_be_bytes());
        out[4..8].copy_from_slice(&self.request_id.to_be_bytes());
        out[8..12].copy_from_slice(&self.stag.to_be_bytes());
        for (i, v) in [
            self.to,
            self.data,
            self.data_mask,
            self.compare,
            self.compare_mask,
        ]
        .into_iter()
        .enumerate()
        {
            out[12 + 8 * i..20 + 8 * i].copy_from_slice(&v.to_be_bytes());
        }
    }
}

/// An Atomic Response (RFC 7306 §5.3): the request's id and the value before the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicResponse {
    /// The request's `request_id`.
    pub request_id: u32,
    /// The target's value before the operation.
    pub original: u64,
}

impl AtomicResponse {
    /// Bytes of the body.
    pub const LEN: usize = 12;

    /// Decodes the body.
    pub fn decode(b: &[u8]) -> Result<AtomicResponse, WireError> {
        exact(b, Self::LEN, "Atomic Response")?;
        Ok(AtomicResponse {
            request_id: be32(b, 0),
            original: be64(b, 4),
        })
    }

    /// Encodes the body.
    pub fn encode(&self, out: &mut [u8; Self::LEN]) {
        out[0..4].copy_from_slice(&self.request_id.to_be_bytes());
        out[4..12].copy_from_slice(&self.original.to_be_bytes());
    }
}

/// Immediate Data (RFC 7306 §4): 8 bytes delivered to the receiver's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImmediateData(pub u64);

impl ImmediateData {
    /// Bytes of the body.
    pub const LEN: usize = 8;

    /// Decodes the body.
    pub fn decode(b: &[u8]) -> Result<ImmediateData, WireError> {
        exact(b, Self::LEN, "Immediate Data")?;
        Ok(ImmediateData(be64(b, 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminate_round_trips_with_and_without_header_copies() {
        let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
        hdr[0] = 0x80 | 0x40 | 1; // a tagged DDP header: 14 bytes
        hdr[1] = 0x40;
        let cases = [
            Terminate {
                code: TermCode::RDMAP_OPCODE,
                m: false,
                ddp: None,
                rdmap: None,
            },
            Terminate {
                code: TermCode {
                    layer: Layer::Ddp,
                    etype: 1,
                    code: 1,
                },
                m: true,
                ddp: Some((1024, hdr, TAGGED_HEADER_LEN)),
                rdmap: None,
            },
            Terminate {
                code: TermCode {
                    layer: Layer::Rdmap,
                    etype: 1,
                    code: 2,
                },
                m: true,
                ddp: None,
                rdmap: Some([7; 28]),
            },
        ];
        for t in cases {
            let mut buf = [0u8; 80];
            let n = t.encode(&mut buf).unwrap();
            assert_eq!(Terminate::decode(&buf[..n]).unwrap(), t);
            assert!(Terminate::decode(&buf[..n - 1]).is_err() || n == 4);
        }
    }

    #[test]
    fn atomics_round_trip_and_reject_bad_opcodes() {
        let r = AtomicRequest {
            op: AtomicOp::CmpSwap,
            request_id: 9,
            stag: 0xabcd,
            to: 0x1000,
            data: 5,
            data_mask: !0,
            compare: 4,
            compare_mask: !0,
        };
        let mut b = [0u8; AtomicRequest::LEN];
        r.encode(&mut b);
        assert_eq!(AtomicRequest::decode(&b).unwrap(), r);
        b[3] = 7;
        assert_eq!(
            AtomicRequest::decode(&b).unwrap_err().field,
            "Atomic Request AOpCode"
        );
        let resp = AtomicResponse {
            request_id: 9,
            original: 4,
        };
        let mut b = [0u8; AtomicResponse::LEN];
        resp.encode(&mut b);
        assert_eq!(AtomicResponse::decode(&b).unwrap(), resp);
        assert!(AtomicResponse::decode(&b[..11]).is_err());
    }
}
