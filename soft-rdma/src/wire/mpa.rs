//! MPA Request and Reply frames (RFC 5044 §7.1) and the revision 2 enhanced connection setup
//! of RFC 6581.
//!
//! ```text
//! 0..16   key: "MPA ID Req Frame" or "MPA ID Rep Frame"
//! 16      M (markers) | C (CRC) | R (rejected) | E (enhanced, RFC 6581) | reserved
//! 17      revision (1 or 2)
//! 18..20  private data length (at most 512)
//! 20..    private data; with E set its first 4 bytes are IRD and ORD (RFC 6581 §5):
//!         IRD: P2P bit 15, zero-length RTR bit 14, 14-bit IRD
//!         ORD: RDMA WRITE RTR bit 15, RDMA READ RTR bit 14, 14-bit ORD
//! ```

use super::error::{TermCode, WireError};

/// Bytes of the fixed part of a Request/Reply frame.
pub const MPA_HEADER_LEN: usize = 20;
/// The largest private data a frame may carry (RFC 5044 §7.1).
pub const MPA_MAX_PRIVATE_DATA: usize = 512;

const KEY_REQ: &[u8; 16] = b"MPA ID Req Frame";
const KEY_REP: &[u8; 16] = b"MPA ID Rep Frame";
const FLAG_M: u8 = 0x80;
const FLAG_C: u8 = 0x40;
const FLAG_R: u8 = 0x20;
const FLAG_E: u8 = 0x10;
const IRD_ORD_MASK: u16 = 0x3fff;

/// Request (from the connecting side) or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MpaKind {
    /// "MPA ID Req Frame".
    Request,
    /// "MPA ID Rep Frame".
    Reply,
}

/// A decoded Request or Reply frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpaFrame<'a> {
    /// Request or Reply.
    pub kind: MpaKind,
    /// M: the sender wants markers.
    pub markers: bool,
    /// C: the sender wants CRC32c on every FPDU.
    pub crc: bool,
    /// R: the connection is rejected (Reply only).
    pub reject: bool,
    /// Revision: 1 (RFC 5044) or 2 (RFC 6581).
    pub revision: u8,
    /// RFC 6581 parameters, when revision 2 sets the enhanced flag.
    pub rev2: Option<Rev2Params>,
    /// The application's private data (after the IRD/ORD words when enhanced).
    pub private_data: &'a [u8],
}

/// RFC 6581 enhanced connection parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rev2Params {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// Peer-to-peer mode: the initiator sends a ready-to-receive message.
    pub p2p: bool,
    /// RTR as a zero-length Send.
    pub rtr_zero_send: bool,
    /// RTR as a zero-length RDMA Write.
    pub rtr_zero_write: bool,
    /// RTR as a zero-length RDMA Read.
    pub rtr_zero_read: bool,
}

impl<'a> MpaFrame<'a> {
    /// Decodes a frame from the start of `buf`. `Ok(None)` means more bytes are needed;
    /// `Ok(Some((frame, used)))` says how many bytes it took.
    pub fn decode(
        buf: &'a [u8],
        expect: MpaKind,
    ) -> Result<Option<(MpaFrame<'a>, usize)>, WireError> {
        if buf.len() < MPA_HEADER_LEN {
            return Ok(None);
        }
        let key = match expect {
            MpaKind::Request => KEY_REQ,
            MpaKind::Reply => KEY_REP,
        };
        if &buf[..16] != key {
            return Err(WireError::new(
                "MPA key",
                "not the expected MPA ID frame key",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        let flags = buf[16];
        let revision = buf[17];
        if revision != 1 && revision != 2 {
            return Err(WireError::new(
                "MPA Rev",
                "only revisions 1 and 2 exist",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        let pd_len = u16::from_be_bytes([buf[18], buf[19]]) as usize;
        if pd_len > MPA_MAX_PRIVATE_DATA {
            return Err(WireError::new(
                "MPA PD_Length",
                "private data longer than 512 bytes",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        if buf.len() < MPA_HEADER_LEN + pd_len {
            return Ok(None);
        }
        let mut pd = &buf[MPA_HEADER_LEN..MPA_HEADER_LEN + pd_len];
        let enhanced = flags & FLAG_E != 0 && revision == 2;
        let rev2 = if enhanced {
            if pd.len() < 4 {
                return Err(WireError::new(
                    "MPA IRD/ORD",
                    "enhanced frame without its 4-byte IRD/ORD",
                    TermCode::MPA_INVALID_REQ_REP,
                ));
            }
            let ird = u16::from_be_bytes([pd[0], pd[1]]);
            let ord = u16::from_be_bytes([pd[2], pd[3]]);
            pd = &pd[4..];
            Some(Rev2Params {
                ird: ird & IRD_ORD_MASK,
                ord: ord & IRD_ORD_MASK,
                p2p: ird & 0x8000 != 0,
                rtr_zero_send: ird & 0x4000 != 0,
                rtr_zero_write: ord & 0x8000 != 0,
                rtr_zero_read: ord & 0x4000 != 0,
            })
        } else {
            None
        };
        let frame = MpaFrame {
            kind: expect,
            markers: flags & FLAG_M != 0,
            crc: flags & FLAG_C != 0,
            reject: flags & FLAG_R != 0,
            revision,
            rev2,
            private_data: pd,
        };
        Ok(Some((frame, MPA_HEADER_LEN + pd_len)))
    }

    /// Bytes `encode` writes.
    pub fn encoded_len(&self) -> usize {
        MPA_HEADER_LEN + self.rev2.map_or(0, |_| 4) + self.private_data.len()
    }

    /// Encodes into `out`; returns the length written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let pd_total = self.rev2.map_or(0, |_| 4) + self.private_data.len();
        if pd_total > MPA_MAX_PRIVATE_DATA {
            return Err(WireError::new(
                "MPA PD_Length",
                "private data longer than 512 bytes",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        let n = MPA_HEADER_LEN + pd_total;
        if out.len() < n {
            return Err(WireError::new(
                "output buffer",
                "too small for the frame",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        out[..16].copy_from_slice(match self.kind {
            MpaKind::Request => KEY_REQ,
            MpaKind::Reply => KEY_REP,
        });
        out[16] = (self.markers as u8 * FLAG_M)
            | (self.crc as u8 * FLAG_C)
            | (self.reject as u8 * FLAG_R)
            | (self.rev2.is_some() as u8 * FLAG_E);
        out[17] = self.revision;
        out[18..20].copy_from_slice(&(pd_total as u16).to_be_bytes());
        let mut at = MPA_HEADER_LEN;
        if let Some(p) = self.rev2 {
            let ird =
                (p.ird & IRD_ORD_MASK) | (p.p2p as u16) << 15 | (p.rtr_zero_send as u16) << 14;
            let ord = (p.ord & IRD_ORD_MASK)
                | (p.rtr_zero_write as u16) << 15
                | (p.rtr_zero_read as u16) << 14;
            out[at..at + 2].copy_from_slice(&ird.to_be_bytes());
            out[at + 2..at + 4].copy_from_slice(&ord.to_be_bytes());
            at += 4;
        }
        out[at..n].copy_from_slice(self.private_data);
        Ok(n)
    }
}

/// What this side offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MpaSettings {
    /// Ask for CRC32c (RFC 5044 intends it on; switch off only for trusted links).
    pub crc: bool,
    /// Revision to send (2 by default; revision 1 peers are still accepted).
    pub revision: u8,
    /// IRD and ORD to offer in revision 2.
    pub ird: u16,
    /// See `ird`.
    pub ord: u16,
}

impl Default for MpaSettings {
    /// What Linux siw accepts: revision 2 enhanced, CRC on, markers off.
    fn default() -> Self {
        MpaSettings {
            crc: true,
            revision: 2,
            ird: 16,
            ord: 16,
        }
    }
}

/// The parameters both sides will use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// CRC32c on every FPDU: used if either side asked (RFC 5044 §7.1.2).
    pub crc: bool,
    /// The lower of the two revisions.
    pub revision: u8,
    /// Reads we may have outstanding toward the peer: min(our ORD, their IRD).
    pub ord: u16,
    /// Reads the peer may have outstanding toward us: min(our IRD, their ORD).
    pub ird: u16,
}

/// Why negotiation refused the peer's frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// The peer asked for markers, which barewire never uses.
    #[error("the peer asked for MPA markers, which are not supported")]
    Markers,
    /// The peer rejected us (R set in its Reply).
    #[error("the peer rejected the connection")]
    Rejected,
}

/// Negotiates from our settings and the peer's frame (pure: no I/O). A peer that asks for
/// markers is rejected (we answer with R set); CRC is on if either side asks for it.
pub fn negotiate(local: &MpaSettings, peer: &MpaFrame<'_>) -> Result<Negotiated, Reject> {
    if peer.reject {
        return Err(Reject::Rejected);
    }
    if peer.markers {
        return Err(Reject::Markers);
    }
    let revision = local.revision.min(peer.revision);
    let (ird, ord) = match (revision, peer.rev2) {
        (2, Some(p)) => (local.ird.min(p.ord), local.ord.min(p.ird)),
        // Revision 1 carries no IRD/ORD: assume one outstanding Read each way, as siw does.
        _ => (1, 1),
    };
    Ok(Negotiated {
        crc: local.crc || peer.crc,
        revision,
        ord,
        ird,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rev2_round_trip_with_private_data() {
        let f = MpaFrame {
            kind: MpaKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: 2,
            rev2: Some(Rev2Params {
                ird: 0x3fff,
                ord: 7,
                p2p: true,
                rtr_zero_send: false,
                rtr_zero_write: true,
                rtr_zero_read: false,
            }),
            private_data: b"region descriptors",
        };
        let mut buf = [0u8; 128];
        let n = f.encode(&mut buf).unwrap();
        assert_eq!(n, f.encoded_len());
        let (g, used) = MpaFrame::decode(&buf[..n], MpaKind::Request)
            .unwrap()
            .unwrap();
        assert_eq!((g, used), (f, n));
        // Partial input asks for more instead of failing.
        assert_eq!(
            MpaFrame::decode(&buf[..n - 1], MpaKind::Request).unwrap(),
            None
        );
    }

    #[test]
    fn bad_frames_are_errors_with_the_mpa_terminate_code() {
        let mut buf = [0u8; 20];
        buf[..16].copy_from_slice(KEY_REQ);
        buf[17] = 3;
        let e = MpaFrame::decode(&buf, MpaKind::Request).unwrap_err();
        assert_eq!(
            (e.field, e.term),
            ("MPA Rev", TermCode::MPA_INVALID_REQ_REP)
        );
        buf[17] = 1;
        buf[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(
            MpaFrame::decode(&buf, MpaKind::Request).unwrap_err().field,
            "MPA PD_Length"
        );
        assert_eq!(
            MpaFrame::decode(&buf, MpaKind::Reply).unwrap_err().field,
            "MPA key"
        );
    }

    #[test]
    fn negotiation_rejects_markers_and_ors_crc() {
        let peer = |markers, crc, rev2| MpaFrame {
            kind: MpaKind::Request,
            markers,
            crc,
            reject: false,
            revision: 2,
            rev2,
            private_data: &[],
        };
        let local = MpaSettings {
            crc: false,
            ..MpaSettings::default()
        };
        assert_eq!(
            negotiate(&local, &peer(true, false, None)),
            Err(Reject::Markers)
        );
        assert!(
            negotiate(&local, &peer(false, true, None)).unwrap().crc,
            "CRC if either side asks"
        );
        assert!(!negotiate(&local, &peer(false, false, None)).unwrap().crc);
        let p = Rev2Params {
            ird: 4,
            ord: 32,
            ..Rev2Params::default()
        };
        let n = negotiate(&MpaSettings::default(), &peer(false, false, Some(p))).unwrap();
        assert_eq!((n.ord, n.ird), (4, 16));
    }
}
