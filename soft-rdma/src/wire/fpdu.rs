//! FPDU framing (RFC 5044 §4): a 2-byte ULPDU length, the ULPDU (a DDP segment), padding to a
//! 4-byte boundary, and a 4-byte CRC field. The CRC field is always there; it holds the CRC32c
//! of everything before it when CRC was negotiated, and zero otherwise (as siw sends it).
//! Markers are never used.
//!
//! The header goes out separately from the payload (a gather list), so `encode_fpdu_header` and
//! `fpdu_trailer` write only the bytes around the payload; the CRC is accumulated over the
//! pieces as they are, with no copy.

use super::crc::{crc32c_append, crc32c_copy};
use super::ddp::{TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
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
    pieces.iter().fold(0u32, |crc, p| crc32c_append(crc, p))
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
/// itself (with [`crc32c_append`], starting from 0) as it queued them.
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
    let c = crc32c_append(crc_so_far, &out[..pad]);
    // Linux (siw) writes the CRC least significant byte first.
    out[pad..pad + 4].copy_from_slice(&c.to_le_bytes());
    pad + 4
}

impl<'a> Fpdu<'a> {
    /// Decodes one FPDU from the start of `buf`. `Ok(None)`: more bytes are needed. A length
    /// above `max_ulpdu` is refused before anything is buffered for it. This is the
    /// [`Framer`] run over a buffer that holds the whole frame.
    pub fn decode(
        buf: &'a [u8],
        crc: bool,
        max_ulpdu: usize,
    ) -> Result<Option<(Fpdu<'a>, usize)>, WireError> {
        let mut f = Framer::new(crc, max_ulpdu);
        let mut at = 0;
        loop {
            let left = &buf[at..];
            let step = match f.scratch() {
                Some(s) => {
                    let n = s.len().min(left.len());
                    if n == 0 {
                        return Ok(None);
                    }
                    s[..n].copy_from_slice(&left[..n]);
                    at += n;
                    f.filled(n)?
                }
                None => {
                    let n = f.payload_left().min(left.len());
                    if n == 0 {
                        return Ok(None);
                    }
                    at += n;
                    f.placed(&left[..n])?
                }
            };
            if step == Step::Frame {
                let ulpdu = &buf[FPDU_HEADER_LEN..FPDU_HEADER_LEN + f.ulpdu_len()];
                return Ok(Some((Fpdu { ulpdu }, at)));
            }
        }
    }
}

/// The first byte of a DDP header (its control field) says how long the DDP and RDMAP
/// headers are together: 14 bytes when tagged, 18 when untagged (RFC 5041 §4, RFC 5040 §4).
fn ddp_rdmap_header_len(ddp_control: u8) -> usize {
    if ddp_control & 0x80 != 0 {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

/// What a [`Framer`] step completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing yet: more bytes are due.
    More,
    /// A frame's DDP and RDMAP headers are in: [`Framer::header`] has them, and
    /// [`Framer::payload_left`] bytes of payload come next (the caller decides where they go).
    Header,
    /// A frame ended and its CRC (when negotiated) matched.
    Frame,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The length field, the DDP control byte and the RDMAP control byte.
    Start { have: usize },
    /// The rest of the DDP and RDMAP headers.
    Header { have: usize },
    /// Payload bytes, placed by the caller.
    Payload { left: usize },
    /// Pad and CRC field.
    Trailer { have: usize, need: usize },
    /// After an error: MPA without markers cannot find the next frame.
    Dead,
}

/// The one MPA framer: turns a TCP byte stream, arriving in pieces of any size, into FPDUs,
/// without I/O and without copying payloads.
///
/// The framer keeps the few bytes it must interpret itself (the length, the DDP and RDMAP
/// headers, the pad and the CRC field) in a fixed scratch buffer, [`Framer::scratch`]. After a
/// header ([`Step::Header`]) the payload is the caller's: it puts the bytes where they belong
/// (a registered region, a receive buffer, its own buffer) and reports them with
/// [`Framer::placed`], which folds them into the CRC. The live soft-RDMA stream, the
/// buffering [`Deframer`] and [`Fpdu::decode`] all run this code, so fuzzing any of them
/// fuzzes what faces the network.
///
/// Checks: the ULPDU length covers the DDP/RDMAP header its control byte announces and is at
/// most `max_ulpdu`; the CRC field matches when CRC is on. After the first error the framer
/// is dead.
///
/// ```
/// use barewire_soft_rdma::wire::*;
/// // One untagged FPDU: 18 header bytes and a 6-byte payload, CRC off.
/// let mut ulpdu = vec![0x41u8, 0x40];
/// ulpdu.resize(UNTAGGED_HEADER_LEN, 0);
/// ulpdu.extend_from_slice(b"abcdef");
/// let mut len = [0u8; FPDU_HEADER_LEN];
/// encode_fpdu_header(ulpdu.len(), &mut len).unwrap();
/// let mut tr = [0u8; 8];
/// let t = fpdu_trailer(&[&len, &ulpdu], ulpdu.len(), false, &mut tr);
/// let wire = [&len[..], &ulpdu[..], &tr[..t]].concat();
///
/// let mut f = Framer::new(false, 65535);
/// let (mut at, mut payload) = (0, Vec::new());
/// loop {
///     let step = match f.scratch() {
///         Some(s) => {
///             let n = s.len().min(1); // one byte at a time: any split works
///             s[..n].copy_from_slice(&wire[at..at + n]);
///             at += n;
///             f.filled(n).unwrap()
///         }
///         None => {
///             let n = f.payload_left();
///             payload.extend_from_slice(&wire[at..at + n]); // "placed" here
///             at += n;
///             f.placed(&wire[at - n..at]).unwrap()
///         }
///     };
///     if step == Step::Frame {
///         break;
///     }
/// }
/// assert_eq!((payload.as_slice(), at), (&b"abcdef"[..], wire.len()));
/// ```
#[derive(Debug, Clone)]
pub struct Framer {
    crc: bool,
    max_ulpdu: usize,
    phase: Phase,
    /// The length field and the DDP/RDMAP headers of the current frame.
    hdr: [u8; FPDU_HEADER_LEN + UNTAGGED_HEADER_LEN],
    /// Where the headers end in `hdr`.
    hend: usize,
    trailer: [u8; 8],
    sum: u32,
    ulpdu_len: usize,
}

impl Framer {
    /// A framer for a stream with the negotiated CRC setting, accepting ULPDUs of at most
    /// `max_ulpdu` bytes (the 16-bit length field caps them at 65535 anyway).
    pub fn new(crc: bool, max_ulpdu: usize) -> Framer {
        Framer {
            crc,
            max_ulpdu,
            phase: Phase::Start { have: 0 },
            hdr: [0; FPDU_HEADER_LEN + UNTAGGED_HEADER_LEN],
            hend: 0,
            trailer: [0; 8],
            sum: 0,
            ulpdu_len: 0,
        }
    }

    /// Where the next bytes go while the framer reads them itself (a header, a trailer):
    /// the caller writes up to this slice's length and calls [`Framer::filled`]. `None` while
    /// payload is due, or once the stream is dead.
    pub fn scratch(&mut self) -> Option<&mut [u8]> {
        match self.phase {
            Phase::Start { have } => Some(&mut self.hdr[have..FPDU_HEADER_LEN + 2]),
            Phase::Header { have } => Some(&mut self.hdr[have..self.hend]),
            Phase::Trailer { have, need } => Some(&mut self.trailer[have..need]),
            Phase::Payload { .. } | Phase::Dead => None,
        }
    }

    /// Payload bytes still due in the current frame (0 outside a payload).
    pub fn payload_left(&self) -> usize {
        match self.phase {
            Phase::Payload { left } => left,
            _ => 0,
        }
    }

    /// True after an error.
    pub fn is_dead(&self) -> bool {
        self.phase == Phase::Dead
    }

    /// Stops the stream (the caller found the frame's content invalid).
    pub fn kill(&mut self) {
        self.phase = Phase::Dead;
    }

    /// The current frame's DDP and RDMAP headers (complete from [`Step::Header`] on).
    pub fn header(&self) -> &[u8] {
        &self.hdr[FPDU_HEADER_LEN..self.hend.max(FPDU_HEADER_LEN)]
    }

    /// The current frame's ULPDU length (headers and payload).
    pub fn ulpdu_len(&self) -> usize {
        self.ulpdu_len
    }

    /// The current frame's payload length (known from [`Step::Header`] on).
    pub fn payload_len(&self) -> usize {
        self.ulpdu_len - (self.hend - FPDU_HEADER_LEN)
    }

    fn fail(&mut self, e: WireError) -> Result<Step, WireError> {
        self.phase = Phase::Dead;
        Err(e)
    }

    fn sum(&mut self, bytes: &[u8]) {
        if self.crc {
            self.sum = crc32c_append(self.sum, bytes);
        }
    }

    /// `n` bytes were written at the front of [`Framer::scratch`].
    pub fn filled(&mut self, n: usize) -> Result<Step, WireError> {
        match self.phase {
            Phase::Start { have } => {
                let now = have + n;
                if self.crc {
                    self.sum = crc32c_append(self.sum, &self.hdr[have..now]);
                }
                if have < FPDU_HEADER_LEN && now >= FPDU_HEADER_LEN {
                    self.ulpdu_len = u16::from_be_bytes([self.hdr[0], self.hdr[1]]) as usize;
                    if self.ulpdu_len > self.max_ulpdu {
                        return self.fail(WireError::new(
                            "ULPDU_LENGTH",
                            "longer than the negotiated maximum",
                            TermCode::MPA_INVALID_REQ_REP,
                        ));
                    }
                }
                if now < FPDU_HEADER_LEN + 2 {
                    self.phase = Phase::Start { have: now };
                    return Ok(Step::More);
                }
                let hlen = ddp_rdmap_header_len(self.hdr[FPDU_HEADER_LEN]);
                if self.ulpdu_len < hlen {
                    return self.fail(WireError::new(
                        "ULPDU_LENGTH",
                        "shorter than the DDP and RDMAP headers its control field announces",
                        TermCode::MPA_INVALID_REQ_REP,
                    ));
                }
                self.hend = FPDU_HEADER_LEN + hlen;
                self.phase = Phase::Header { have: now };
                Ok(Step::More)
            }
            Phase::Header { have } => {
                let now = have + n;
                if self.crc {
                    self.sum = crc32c_append(self.sum, &self.hdr[have..now]);
                }
                if now < self.hend {
                    self.phase = Phase::Header { have: now };
                    return Ok(Step::More);
                }
                let left = self.payload_len();
                self.phase = if left > 0 {
                    Phase::Payload { left }
                } else {
                    self.trailer_phase()
                };
                Ok(Step::Header)
            }
            Phase::Trailer { have, need } => {
                let now = have + n;
                if now < need {
                    self.phase = Phase::Trailer { have: now, need };
                    return Ok(Step::More);
                }
                let pad = need - 4;
                let got = u32::from_le_bytes([
                    self.trailer[pad],
                    self.trailer[pad + 1],
                    self.trailer[pad + 2],
                    self.trailer[pad + 3],
                ]);
                if self.crc {
                    self.sum = crc32c_append(self.sum, &self.trailer[..pad]);
                }
                if self.crc && got != self.sum {
                    return self.fail(WireError::new(
                        "MPA CRC",
                        "CRC32c does not match the FPDU",
                        TermCode::MPA_CRC,
                    ));
                }
                self.sum = 0;
                self.phase = Phase::Start { have: 0 };
                Ok(Step::Frame)
            }
            Phase::Payload { .. } | Phase::Dead => Ok(Step::More),
        }
    }

    /// Between frames, takes the next frame's length field and DDP and RDMAP headers from the
    /// front of `bytes` when they are all there: the one step [`Framer::scratch`] and
    /// [`Framer::filled`] take in two (the control byte says how long the headers are), for a
    /// caller that holds received bytes in a buffer. `None` mid-frame or when `bytes` holds
    /// less (fill the scratch then); otherwise how many bytes it took and [`Step::Header`], or
    /// the error `filled` gives for them and the bytes it had taken then (the framer is dead).
    pub fn headers_from(&mut self, bytes: &[u8]) -> Option<(usize, Result<Step, WireError>)> {
        const START: usize = FPDU_HEADER_LEN + 2;
        if self.phase != (Phase::Start { have: 0 }) || bytes.len() < START {
            return None;
        }
        let end = FPDU_HEADER_LEN + ddp_rdmap_header_len(bytes[FPDU_HEADER_LEN]);
        let headers = bytes.get(..end)?;
        self.hdr[..end].copy_from_slice(headers);
        // The same checks, in the same order, as the bytes coming a few at a time.
        if let Err(e) = self.filled(START) {
            return Some((START, Err(e)));
        }
        Some((end, self.filled(end - START)))
    }

    /// The caller put `bytes`, the next payload bytes of the frame, where they belong (at most
    /// [`Framer::payload_left`] of them).
    pub fn placed(&mut self, bytes: &[u8]) -> Result<Step, WireError> {
        let Phase::Payload { left } = self.phase else {
            return Ok(Step::More);
        };
        let n = bytes.len().min(left);
        self.sum(&bytes[..n]);
        self.placed_len(n)
    }

    /// Copies `src`, the next payload bytes of the frame (at most [`Framer::payload_left`] of
    /// them), to `dst`, where they belong, and counts them as [`Framer::placed`] would: with
    /// CRC on, the copy and the CRC are one pass over `src` ([`crc32c_copy`]); without it, the
    /// copy is [`barewire_engine::copy_bulk`].
    ///
    /// # Panics
    /// If `dst` and `src` differ in length.
    pub fn placed_copy(
        &mut self,
        src: &[u8],
        dst: &mut [std::mem::MaybeUninit<u8>],
    ) -> Result<Step, WireError> {
        match self.phase {
            Phase::Payload { left } if self.crc && src.len() <= left => {
                self.sum = crc32c_copy(self.sum, src, dst);
                self.placed_len(src.len())
            }
            _ => {
                assert_eq!(src.len(), dst.len(), "placed_copy: lengths differ");
                // SAFETY: `dst` is as long as `src` and mutably borrowed, so they do not
                // overlap.
                unsafe {
                    barewire_engine::copy_bulk(src.as_ptr(), dst.as_mut_ptr().cast(), src.len())
                };
                self.placed(src)
            }
        }
    }

    /// True when the frames carry a CRC, so payload must be shown to [`Framer::placed`].
    pub fn crc(&self) -> bool {
        self.crc
    }

    /// Like [`Framer::placed`] without showing the bytes, for a stream without CRC (where
    /// they need no reading back). With CRC on, the frame then fails its CRC check.
    pub fn placed_len(&mut self, n: usize) -> Result<Step, WireError> {
        let Phase::Payload { left } = self.phase else {
            return Ok(Step::More);
        };
        self.phase = if n < left {
            Phase::Payload { left: left - n }
        } else {
            self.trailer_phase()
        };
        Ok(Step::More)
    }

    fn trailer_phase(&self) -> Phase {
        Phase::Trailer {
            have: 0,
            need: pad_len(self.ulpdu_len) + 4,
        }
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

    /// A ULPDU shaped like a DDP segment: the control byte says tagged or untagged, the
    /// rest of the headers and the payload are filler.
    pub(super) fn segment(tagged: bool, payload: usize) -> Vec<u8> {
        let hlen = if tagged {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        };
        let mut u: Vec<u8> = (0..(hlen + payload) as u32).map(|i| i as u8).collect();
        u[0] = if tagged { 0xc1 } else { 0x41 };
        u
    }

    #[test]
    fn round_trips_every_length_with_and_without_crc() {
        for payload in 0..40 {
            for tagged in [false, true] {
                let ulpdu = segment(tagged, payload);
                for crc in [false, true] {
                    let f = frame(&ulpdu, crc);
                    assert_eq!(f.len() % 4, 0, "FPDUs are 4-byte aligned");
                    let (d, used) = Fpdu::decode(&f, crc, 1 << 16).unwrap().unwrap();
                    assert_eq!((d.ulpdu, used), (&ulpdu[..], f.len()));
                    assert_eq!(Fpdu::decode(&f[..f.len() - 1], crc, 1 << 16).unwrap(), None);
                }
            }
        }
    }

    /// `headers_from` takes a frame's headers in one step exactly when they are all there,
    /// leaves the framer as the scratch taking them a byte at a time leaves it, and refuses
    /// what `filled` refuses.
    #[test]
    fn headers_in_one_step_are_the_headers_a_byte_at_a_time() {
        for payload in [0, 1, 8, 33] {
            for tagged in [false, true] {
                for crc in [false, true] {
                    let f = frame(&segment(tagged, payload), crc);
                    let end = FPDU_HEADER_LEN + if tagged { 14 } else { 18 };
                    for k in 0..f.len() {
                        let mut one = Framer::new(crc, 1 << 16);
                        let Some((n, step)) = one.headers_from(&f[..k]) else {
                            assert!(k < end, "k {k}: the headers are all there");
                            continue;
                        };
                        assert!(k >= end);
                        assert_eq!((n, step.unwrap()), (end, Step::Header));
                        let mut bytes = Framer::new(crc, 1 << 16);
                        for b in &f[..end] {
                            bytes.scratch().unwrap()[0] = *b;
                            bytes.filled(1).unwrap();
                        }
                        assert_eq!(one.header(), bytes.header());
                        assert_eq!(one.payload_left(), bytes.payload_left());
                        // Mid-frame: not between frames any more.
                        assert!(one.headers_from(&f[end..]).is_none());
                        // The rest of the frame completes it, CRC included.
                        let mut at = end;
                        if payload > 0 {
                            at += payload;
                            assert_eq!(one.placed(&f[end..at]).unwrap(), Step::More);
                        }
                        let s = one.scratch().unwrap();
                        let t = s.len();
                        s.copy_from_slice(&f[at..at + t]);
                        assert_eq!(one.filled(t).unwrap(), Step::Frame);
                        assert_eq!(at + t, f.len());
                    }
                }
            }
        }
        // Refused: a length shorter than the headers, and one longer than the maximum.
        let mut u = segment(true, 0);
        u.pop();
        let short = frame(&u, false);
        let (n, step) = Framer::new(false, 1 << 16).headers_from(&short).unwrap();
        assert_eq!((n, step.unwrap_err().field), (4, "ULPDU_LENGTH"));
        let long = frame(&segment(true, 40), false);
        let mut f = Framer::new(false, 50);
        let (n, step) = f.headers_from(&long).unwrap();
        assert_eq!((n, step.unwrap_err().field), (4, "ULPDU_LENGTH"));
        assert!(f.is_dead() && f.headers_from(&long).is_none());
    }

    /// A payload copied in with `placed_copy`, in two pieces, lands whole and completes its
    /// frame, CRC included; a bit flipped in the source fails the frame's CRC.
    #[test]
    fn a_payload_copied_in_completes_its_frame_and_a_flipped_bit_fails_it() {
        for payload in [1, 8, 600, 3000] {
            for crc in [false, true] {
                for flip in [false, true] {
                    let mut f = frame(&segment(true, payload), crc);
                    let mut one = Framer::new(crc, 1 << 16);
                    let (end, step) = one.headers_from(&f).unwrap();
                    assert_eq!(step.unwrap(), Step::Header);
                    if flip {
                        f[end + payload / 2] ^= 0x10;
                    }
                    let mut dst = vec![std::mem::MaybeUninit::new(0u8); payload];
                    let cut = payload / 3;
                    let (a, b) = dst.split_at_mut(cut);
                    assert_eq!(one.placed_copy(&f[end..end + cut], a).unwrap(), Step::More);
                    let at = end + payload;
                    assert_eq!(one.placed_copy(&f[end + cut..at], b).unwrap(), Step::More);
                    // SAFETY: every byte of `dst` was initialized.
                    let dst: Vec<u8> = dst.iter().map(|b| unsafe { b.assume_init() }).collect();
                    assert!(dst == f[end..at], "{payload} bytes: the copy differs");
                    let s = one.scratch().unwrap();
                    let t = s.len();
                    s.copy_from_slice(&f[at..at + t]);
                    match (crc && flip, one.filled(t)) {
                        (false, step) => assert_eq!(step.unwrap(), Step::Frame),
                        (true, step) => assert_eq!(step.unwrap_err().term, TermCode::MPA_CRC),
                    }
                }
            }
        }
    }

    #[test]
    fn a_length_shorter_than_the_headers_is_refused() {
        for tagged in [false, true] {
            let mut u = segment(tagged, 0);
            u.pop();
            let e = Fpdu::decode(&frame(&u, false), false, 1 << 16).unwrap_err();
            assert_eq!(e.field, "ULPDU_LENGTH");
        }
    }

    #[test]
    fn a_flipped_bit_fails_the_crc() {
        let mut f = frame(&segment(false, 8), true);
        f[21] ^= 1;
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

/// Turns a TCP byte stream, in chunks of any size, into whole ULPDUs: the [`Framer`] with a
/// buffer that collects each frame's headers and payload. The buffer never grows past one
/// maximum-size ULPDU: the length is checked against the maximum before a payload byte is
/// kept.
#[derive(Debug)]
pub struct Deframer {
    framer: Framer,
    ulpdu: Vec<u8>,
}

impl Deframer {
    /// A deframer for a stream with the negotiated CRC setting and maximum ULPDU.
    pub fn new(crc: bool, max_ulpdu: usize) -> Deframer {
        Deframer {
            framer: Framer::new(crc, max_ulpdu.min(u16::MAX as usize)),
            ulpdu: Vec::new(),
        }
    }

    /// Bytes held from a frame not yet complete (its headers and payload so far).
    pub fn buffered(&self) -> usize {
        self.ulpdu.len()
    }

    /// Feeds the next chunk; `on_ulpdu` gets each complete ULPDU in order. After the first error
    /// the stream is dead (MPA cannot resynchronise without markers) and every later call fails.
    pub fn feed(
        &mut self,
        mut data: &[u8],
        mut on_ulpdu: impl FnMut(&[u8]) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        let r = self.feed_inner(&mut data, &mut on_ulpdu);
        if r.is_err() {
            self.framer.kill();
            self.ulpdu = Vec::new();
        }
        r
    }

    fn feed_inner(
        &mut self,
        data: &mut &[u8],
        on_ulpdu: &mut impl FnMut(&[u8]) -> Result<(), WireError>,
    ) -> Result<(), WireError> {
        if self.framer.is_dead() {
            return Err(WireError::new(
                "MPA stream",
                "an earlier frame was invalid",
                TermCode::MPA_INVALID_REQ_REP,
            ));
        }
        while !data.is_empty() {
            let step = match self.framer.scratch() {
                Some(s) => {
                    let n = s.len().min(data.len());
                    s[..n].copy_from_slice(&data[..n]);
                    *data = &data[n..];
                    self.framer.filled(n)?
                }
                None => {
                    let n = self.framer.payload_left().min(data.len());
                    let at = self.ulpdu.len();
                    self.ulpdu.reserve(n);
                    let step = self
                        .framer
                        .placed_copy(&data[..n], &mut self.ulpdu.spare_capacity_mut()[..n]);
                    // SAFETY: `placed_copy` wrote the `n` bytes after the first `at`, within
                    // the capacity reserved above.
                    unsafe { self.ulpdu.set_len(at + n) };
                    *data = &data[n..];
                    step?
                }
            };
            match step {
                Step::More => {}
                Step::Header => {
                    self.ulpdu.clear();
                    if self.ulpdu.capacity() == 0 {
                        self.ulpdu.reserve_exact(self.framer.max_ulpdu);
                    }
                    self.ulpdu.extend_from_slice(self.framer.header());
                }
                Step::Frame => {
                    on_ulpdu(&self.ulpdu)?;
                    self.ulpdu.clear();
                }
            }
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
            .map(|i| super::tests::segment(i % 3 == 0, i * 13 % 97))
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
                assert!(d.buffered() <= 1024);
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
            d.feed(&frame(&super::tests::segment(false, 2), false), |_| Ok(()))
                .is_err(),
            "a dead stream stays dead"
        );
    }
}
