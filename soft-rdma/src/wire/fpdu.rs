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
    let so_far = if crc { crc32c_fpdu(pieces) } else { 0 };
    fpdu_trailer_after(so_far, ulpdu_len, crc, out)
}

/// As [`fpdu_trailer`], for a sender that accumulated the CRC32c of the bytes before the pad
/// itself (with `crc32c::crc32c_append`, starting from 0) as it queued them.
pub fn fpdu_trailer_after(
    crc_so_far: u32,
    ulpdu_len: usize,
    crc: bool,
    out: &mut [u8; 8],
) -> usize {
    let pad = pad_len(ulpdu_len);
    out[..pad].fill(0);
    if !crc {
        out[pad..pad + 4].fill(0);
        return pad + 4;
    }
    let c = crc32c::crc32c_append(crc_so_far, &out[..pad]);
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

/// Turns a TCP byte stream, in chunks of any size, into FPDUs.
///
/// Whole FPDUs inside a chunk are handed out straight from the chunk; only a frame split
/// across chunks is copied, into a buffer that never grows past one maximum-size FPDU (the
/// length is checked against the negotiated maximum before a byte of the frame is kept).
#[derive(Debug)]
pub struct Deframer {
    crc: bool,
    max_ulpdu: usize,
    partial: Vec<u8>,
    dead: bool,
}

impl Deframer {
    /// A deframer for a stream with the negotiated CRC setting and maximum ULPDU.
    pub fn new(crc: bool, max_ulpdu: usize) -> Deframer {
        Deframer {
            crc,
            max_ulpdu: max_ulpdu.min(u16::MAX as usize),
            partial: Vec::new(),
            dead: false,
        }
    }

    /// Bytes held from a frame not yet complete.
    pub fn buffered(&self) -> usize {
        self.partial.len()
    }

    fn max_fpdu(&self) -> usize {
        FPDU_HEADER_LEN + self.max_ulpdu + 3 + 4
    }

    /// Feeds the next chunk; `on_ulpdu` gets each complete ULPDU in order. After the first error
    /// the stream is dead (MPA cannot resynchronise without markers) and every later call fails.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut on_ulpdu: impl FnMut(&[u8]) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        if self.dead {
            return Err(WireError::new(
                "MPA stream",
                "an earlier frame was invalid",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        let r = self.feed_inner(&mut data, &mut on_ulpdu);
        if r.is_err() {
            self.dead = true;
            self.partial = Vec::new();
        }
        r
    }

    fn feed_inner(
        &mut self,
        data: &mut &[u8],
        on_ulpdu: &mut impl FnMut(&[u8]) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        // Finish a frame split across chunks.
        while !self.partial.is_empty() && !data.is_empty() {
            let need = if self.partial.len() < FPDU_HEADER_LEN {
                FPDU_HEADER_LEN - self.partial.len()
            } else {
                let len = u16::from_be_bytes([self.partial[0], self.partial[1]]) as usize;
                FPDU_HEADER_LEN + len + pad_len(len) + 4 - self.partial.len()
            };
            let take = need.min(data.len());
            self.partial.extend_from_slice(&data[..take]);
            *data = &data[take..];
            match Fpdu::decode(&self.partial, self.crc, self.max_ulpdu)? {
                Some((f, _)) => {
                    on_ulpdu(f.ulpdu)?;
                    self.partial.clear();
                }
                None => debug_assert!(self.partial.len() <= self.max_fpdu()),
            }
        }
        // Whole frames straight from the chunk.
        while let Some((f, used)) = Fpdu::decode(data, self.crc, self.max_ulpdu)? {
            on_ulpdu(f.ulpdu)?;
            *data = &data[used..];
        }
        if !data.is_empty() {
            if self.partial.capacity() == 0 {
                self.partial.reserve_exact(self.max_fpdu());
            }
            self.partial.extend_from_slice(data);
        }
        Ok(())
    }
}

#[cfg(test)]
mod deframer_tests {
    use super::*;

    fn frame(ulpdu: &[u8], crc: bool) -> Vec<u8> {
        let mut hdr = [0u8; 2];
        encode_fpdu_header(ulpdu.len(), &mut hdr).unwrap();
        let mut tr = [0u8; 8];
        let n = fpdu_trailer(&[&hdr, ulpdu], ulpdu.len(), crc, &mut tr);
        [&hdr[..], ulpdu, &tr[..n]].concat()
    }

    #[test]
    fn any_chunking_yields_the_same_frames() {
        let frames: Vec<Vec<u8>> = (0..20)
            .map(|i| (0..(i * 13 % 97) as u8).collect())
            .collect();
        let stream: Vec<u8> = frames.iter().flat_map(|f| frame(f, true)).collect();
        for chunk in [1, 2, 3, 5, 7, 64, 1000, stream.len()] {
            let mut d = Deframer::new(true, 1024);
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                d.feed(c, |u| {
                    got.push(u.to_vec());
                    Ok(())
                })
                .unwrap();
                assert!(d.buffered() <= 2 + 1024 + 7);
            }
            assert_eq!(got, frames, "chunk size {chunk}");
            assert_eq!(d.buffered(), 0);
        }
    }

    #[test]
    fn an_oversized_frame_kills_the_stream_without_buffering_it() {
        let mut d = Deframer::new(false, 100);
        let e = d.feed(&[0x10, 0x00, 1, 2, 3], |_| Ok(())).unwrap_err();
        assert_eq!(e.field, "ULPDU_LENGTH");
        assert_eq!(d.buffered(), 0);
        assert!(
            d.feed(&frame(b"ok", false), |_| Ok(())).is_err(),
            "a dead stream stays dead"
        );
    }
}
