//! FPDU framing (RFC 5044 §4): a 2-byte ULPDU length, the ULPDU (a DDP segment), padding to a
//! 4-byte boundary, and a 4-byte CRC field. The CRC field is always there; it holds the CRC32c
//! of everything before it when CRC was negotiated, and zero otherwise (as siw sends it).
//! Markers are never used.
//!
//! The header goes out separately from the payload (a gather list), so `encode_fpdu_header` and
//! `fpdu_trailer` write only the bytes around the payload; the CRC is accumulated over the
//! pieces as they are, with no copy.

use super::error::{TermCode, WireError};

/// Bytes of the MPA length field in front of each ULPDU.
pub const FPDU_HEADER_LEN: usize = 2;

/// A decoded FPDU: the ULPDU it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpdu<'a> {
    /// The DDP segment.
    pub ulpdu: &'a [u8],
}

fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (FPDU_HEADER_LEN + ulpdu_len) % 4) % 4
}

/// CRC32c over `pieces` (the length field, the ULPDU's parts and the pad), as MPA computes it.
pub fn crc32c_fpdu(pieces: &[&[u8]]) -> u32 {
    pieces
        .iter()
        .fold(0u32, |crc, p| crc32c::crc32c_append(crc, p))
}

/// Writes the 2-byte ULPDU length.
pub fn encode_fpdu_header(
    ulpdu_len: usize,
    out: &mut [u8; FPDU_HEADER_LEN],
) -> Result<(), WireError> {
    let len = u16::try_from(ulpdu_len).map_err(|_| {
        WireError::new(
            "ULPDU_LENGTH",
            "a ULPDU is at most 65535 bytes",
            TermCode::MPA_INVALID_REQ_REP,
        )
    })?;
    *out = len.to_be_bytes();
    Ok(())
}

/// Writes the pad and the CRC field that follow a ULPDU (the CRC32c with `crc`, zero without);
/// returns the bytes written (4 to 7). `pieces` are every byte before the pad: the header and
/// the ULPDU's parts.
pub fn fpdu_trailer(pieces: &[&[u8]], ulpdu_len: usize, crc: bool, out: &mut [u8; 8]) -> usize {
    let pad = pad_len(ulpdu_len);
    out[..pad].fill(0);
    if !crc {
        out[pad..pad + 4].fill(0);
        return pad + 4;
    }
    let c = crc32c::crc32c_append(crc32c_fpdu(pieces), &out[..pad]);
    // Linux (siw) writes the CRC least significant byte first.
    out[pad..pad + 4].copy_from_slice(&c.to_le_bytes());
    pad + 4
}

impl<'a> Fpdu<'a> {
    /// Decodes one FPDU from the start of `buf`. `Ok(None)`: more bytes are needed. A length
    /// above `max_ulpdu` is refused before anything is buffered for it.
    pub fn decode(
        buf: &'a [u8],
        crc: bool,
        max_ulpdu: usize,
    ) -> Result<Option<(Fpdu<'a>, usize)>, WireError> {
        if buf.len() < FPDU_HEADER_LEN {
            return Ok(None);
        }
        let len = u16::from_be_bytes([buf[0], buf[1]]) as usize;
        if len > max_ulpdu {
            return Err(WireError::new(
                "ULPDU_LENGTH",
                "longer than the negotiated maximum",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        let body = FPDU_HEADER_LEN + len + pad_len(len);
        let total = body + 4;
        if buf.len() < total {
            return Ok(None);
        }
        if crc {
            let want = crc32c::crc32c(&buf[..body]);
            let got = u32::from_le_bytes([buf[body], buf[body + 1], buf[body + 2], buf[body + 3]]);
            if want != got {
                return Err(WireError::new(
                    "MPA CRC",
                    "CRC32c does not match the FPDU",
                    TermCode::MPA_CRC,
                ));
            }
        }
        Ok(Some((
            Fpdu {
                ulpdu: &buf[FPDU_HEADER_LEN..FPDU_HEADER_LEN + len],
            },
            total,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ulpdu: &[u8], crc: bool) -> Vec<u8> {
        let mut hdr = [0u8; 2];
        encode_fpdu_header(ulpdu.len(), &mut hdr).unwrap();
        let mut tr = [0u8; 8];
        let n = fpdu_trailer(&[&hdr, ulpdu], ulpdu.len(), crc, &mut tr);
        [&hdr[..], ulpdu, &tr[..n]].concat()
    }

    #[test]
    fn round_trips_every_length_with_and_without_crc() {
        for len in 0..40 {
            let ulpdu: Vec<u8> = (0..len as u8).collect();
            for crc in [false, true] {
                let f = frame(&ulpdu, crc);
                assert_eq!(f.len() % 4, 0, "FPDUs are 4-byte aligned");
                let (d, used) = Fpdu::decode(&f, crc, 1 << 16).unwrap().unwrap();
                assert_eq!((d.ulpdu, used), (&ulpdu[..], f.len()));
                assert_eq!(Fpdu::decode(&f[..f.len() - 1], crc, 1 << 16).unwrap(), None);
            }
        }
    }

    #[test]
    fn a_flipped_bit_fails_the_crc() {
        let mut f = frame(b"payload!", true);
        f[5] ^= 1;
        assert_eq!(
            Fpdu::decode(&f, true, 1 << 16).unwrap_err().term,
            TermCode::MPA_CRC
        );
    }

    #[test]
    fn an_oversized_length_is_refused_before_buffering() {
        assert_eq!(
            Fpdu::decode(&[0xff, 0xff], false, 1024).unwrap_err().field,
            "ULPDU_LENGTH"
        );
    }
}
