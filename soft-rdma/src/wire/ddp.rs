//! DDP segment headers (RFC 5041 §4) with the RDMAP control byte (RFC 5040 §4).
//!
//! ```text
//! byte 0   DDP control: T (tagged) | L (last) | reserved(4) | DV (2, = 1)
//! byte 1   RDMAP control: RV (2, = 1) | reserved(2) | opcode(4)
//! tagged:   STag (4) | TO (8)                                  -> 14 bytes
//! untagged: reserved for the ULP (4; the STag to invalidate) | QN (4) | MSN (4) | MO (4) -> 18
//! ```

use super::error::{TermCode, WireError};

/// Bytes of a tagged segment's header (after the MPA length).
pub const TAGGED_HEADER_LEN: usize = 14;
/// Bytes of an untagged segment's header.
pub const UNTAGGED_HEADER_LEN: usize = 18;
const DDP_T: u8 = 0x80;
const DDP_L: u8 = 0x40;
const DDP_VERSION: u8 = 1;
const RDMAP_VERSION: u8 = 1;

/// RDMAP opcodes (RFC 5040 §4.2; 8–11 from RFC 7306).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmapOpcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, QN 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send.
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (QN 2).
    Terminate = 7,
    /// Immediate Data (RFC 7306).
    ImmediateData = 8,
    /// Immediate Data with Solicited Event (RFC 7306).
    ImmediateDataSe = 9,
    /// Atomic Request (RFC 7306).
    AtomicRequest = 10,
    /// Atomic Response (RFC 7306).
    AtomicResponse = 11,
}

impl RdmapOpcode {
    fn from_u8(v: u8) -> Option<Self> {
        use RdmapOpcode::*;
        Some(match v {
            0 => Write,
            1 => ReadRequest,
            2 => ReadResponse,
            3 => Send,
            4 => SendInvalidate,
            5 => SendSe,
            6 => SendSeInvalidate,
            7 => Terminate,
            8 => ImmediateData,
            9 => ImmediateDataSe,
            10 => AtomicRequest,
            11 => AtomicResponse,
            _ => return None,
        })
    }

    /// Whether this opcode travels in tagged segments.
    pub fn is_tagged(self) -> bool {
        matches!(self, RdmapOpcode::Write | RdmapOpcode::ReadResponse)
    }
}

/// The buffer model part of a DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DdpHeader {
    /// Tagged: placed at `to` in the region named by `stag`.
    Tagged {
        /// Steering tag of the target region.
        stag: u32,
        /// Tagged offset.
        to: u64,
    },
    /// Untagged: placed in the next buffer of queue `qn`.
    Untagged {
        /// The ULP's 4 bytes (the STag to invalidate, for Send with Invalidate).
        ulp: u32,
        /// Queue number (0 Send, 1 Read Request, 2 Terminate, ...).
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset.
        mo: u32,
    },
}

/// One DDP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<'a> {
    /// L: the last segment of its message.
    pub last: bool,
    /// What the message is.
    pub opcode: RdmapOpcode,
    /// Where it goes.
    pub header: DdpHeader,
    /// The payload after the header.
    pub payload: &'a [u8],
}

impl<'a> Segment<'a> {
    /// Decodes a segment from a ULPDU.
    pub fn decode(ulpdu: &'a [u8]) -> Result<Segment<'a>, WireError> {
        if ulpdu.len() < 2 {
            return Err(WireError::new(
                "DDP control",
                "segment shorter than its control bytes",
                TermCode::DDP_CATASTROPHIC,
            ));
        }
        let (ddp, rdmap) = (ulpdu[0], ulpdu[1]);
        let tagged = ddp & DDP_T != 0;
        if ddp & 0x03 != DDP_VERSION {
            let term = if tagged {
                TermCode::DDP_TAGGED_VERSION
            } else {
                TermCode::DDP_UNTAGGED_VERSION
            };
            return Err(WireError::new("DDP DV", "DDP version must be 1", term));
        }
        if rdmap >> 6 != RDMAP_VERSION {
            return Err(WireError::new(
                "RDMAP RV",
                "RDMAP version must be 1",
                TermCode::RDMAP_VERSION,
            ));
        }
        let opcode = RdmapOpcode::from_u8(rdmap & 0x0f).ok_or(WireError::new(
            "RDMAP opcode",
            "unknown opcode",
            TermCode::RDMAP_OPCODE,
        ))?;
        if opcode.is_tagged() != tagged {
            return Err(WireError::new(
                "RDMAP opcode",
                "opcode does not match the DDP buffer model",
                TermCode::RDMAP_OPCODE,
            ));
        }
        let be32 = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let (header, rest) = if tagged {
            if ulpdu.len() < TAGGED_HEADER_LEN {
                return Err(WireError::new(
                    "DDP tagged header",
                    "segment shorter than its header",
                    TermCode::DDP_CATASTROPHIC,
                ));
            }
            let to = u64::from_be_bytes(ulpdu[6..14].try_into().expect("8 bytes"));
            (
                DdpHeader::Tagged {
                    stag: be32(&ulpdu[2..6]),
                    to,
                },
                &ulpdu[TAGGED_HEADER_LEN..],
            )
        } else {
            if ulpdu.len() < UNTAGGED_HEADER_LEN {
                return Err(WireError::new(
                    "DDP untagged header",
                    "segment shorter than its header",
                    TermCode::DDP_CATASTROPHIC,
                ));
            }
            let h = DdpHeader::Untagged {
                ulp: be32(&ulpdu[2..6]),
                qn: be32(&ulpdu[6..10]),
                msn: be32(&ulpdu[10..14]),
                mo: be32(&ulpdu[14..18]),
            };
            (h, &ulpdu[UNTAGGED_HEADER_LEN..])
        };
        Ok(Segment {
            last: ddp & DDP_L != 0,
            opcode,
            header,
            payload: rest,
        })
    }

    /// Header bytes `encode_header` writes.
    pub fn header_len(&self) -> usize {
        match self.header {
            DdpHeader::Tagged { .. } => TAGGED_HEADER_LEN,
            DdpHeader::Untagged { .. } => UNTAGGED_HEADER_LEN,
        }
    }

    /// Writes the DDP and RDMAP header (not the payload, which goes out from its own memory).
    pub fn encode_header(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let n = self.header_len();
        if out.len() < n {
            return Err(WireError::new(
                "output buffer",
                "too small for the header",
                TermCode::DDP_CATASTROPHIC,
            ));
        }
        let tagged = matches!(self.header, DdpHeader::Tagged { .. });
        out[0] = (tagged as u8 * DDP_T) | (self.last as u8 * DDP_L) | DDP_VERSION;
        out[1] = (RDMAP_VERSION << 6) | self.opcode as u8;
        match self.header {
            DdpHeader::Tagged { stag, to } => {
                out[2..6].copy_from_slice(&stag.to_be_bytes());
                out[6..14].copy_from_slice(&to.to_be_bytes());
            }
            DdpHeader::Untagged { ulp, qn, msn, mo } => {
                for (i, v) in [ulp, qn, msn, mo].into_iter().enumerate() {
                    out[2 + 4 * i..6 + 4 * i].copy_from_slice(&v.to_be_bytes());
                }
            }
        }
        Ok(n)
    }
}

impl Segment<'_> {
    /// Appends the whole FPDU (length, header, payload, pad, CRC field) to `out`. The data path
    /// sends header and payload as a gather list instead; this contiguous form suits control
    /// messages, which are small, and tests.
    pub fn encode_fpdu(&self, crc: bool, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut hdr = [0u8; UNTAGGED_HEADER_LEN];
        let n = self.encode_header(&mut hdr)?;
        let ulpdu_len = n + self.payload.len();
        let mut len = [0u8; super::fpdu::FPDU_HEADER_LEN];
        super::fpdu::encode_fpdu_header(ulpdu_len, &mut len)?;
        let mut trailer = [0u8; 8];
        let t = super::fpdu::fpdu_trailer(
            &[&len, &hdr[..n], self.payload],
            ulpdu_len,
            crc,
            &mut trailer,
        );
        out.reserve(len.len() + ulpdu_len + t);
        out.extend_from_slice(&len);
        out.extend_from_slice(&hdr[..n]);
        out.extend_from_slice(self.payload);
        out.extend_from_slice(&trailer[..t]);
        Ok(())
    }
}
