//! The control messages two endpoints exchange by SEND: region descriptors and the channel
//! handshake. Every decode of peer bytes returns an error, never panics.

use barewire_drivers::RegionDescriptor;

use crate::error::{Error, Result};
use crate::region::{take, take_u16, take_u32, take_u64, Fingerprint};

/// Largest control message (a fingerprint's type name is cut to fit).
pub(crate) const MAX: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Control {
    /// "Here is a region of `len` elements of this type."
    Region {
        fp: Fingerprint,
        desc: RegionDescriptor,
        len: u64,
    },
    /// "I am opening channel `id` towards you: messages of this type and codec, `capacity`
    /// slots of `slot` bytes; return credits into `credit`."
    Open {
        id: u16,
        fp: Fingerprint,
        codec: u8,
        capacity: u32,
        slot: u32,
        credit: RegionDescriptor,
    },
    /// "Your channel `id` lands in `ring`; `polled`: write plain WRITEs, I watch the ring's
    /// memory (otherwise WRITE with immediate, one receive completion per run)."
    Accept {
        id: u16,
        ring: RegionDescriptor,
        polled: bool,
    },
    /// "I will not take your channel `id`: `reason`."
    Refuse { id: u16, reason: String },
    /// "I am rank `rank` of a mesh of `size`" (the first word on a mesh connection).
    Hello { rank: u32, size: u32 },
}

fn desc(out: &mut Vec<u8>, d: &RegionDescriptor) {
    out.extend_from_slice(&d.to_bytes());
}

fn take_desc(b: &mut &[u8]) -> Result<RegionDescriptor> {
    let raw = take(b, RegionDescriptor::LEN)?;
    RegionDescriptor::from_bytes(raw).ok_or_else(|| Error::Malformed("region descriptor".into()))
}

/// The longest prefix of `reason`, cut at a character boundary, that fits in a Refuse.
fn fit_reason(reason: &str) -> &str {
    let mut n = reason.len().min(MAX - 5);
    while !reason.is_char_boundary(n) {
        n -= 1;
    }
    &reason[..n]
}

impl Control {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        match self {
            Control::Region { fp, desc: d, len } => {
                out.push(1);
                fp.encode(&mut out);
                desc(&mut out, d);
                out.extend_from_slice(&len.to_be_bytes());
            }
            Control::Open {
                id,
                fp,
                codec,
                capacity,
                slot,
                credit,
            } => {
                out.push(2);
                out.extend_from_slice(&id.to_be_bytes());
                fp.encode(&mut out);
                out.push(*codec);
                out.extend_from_slice(&capacity.to_be_bytes());
                out.extend_from_slice(&slot.to_be_bytes());
                desc(&mut out, credit);
            }
            Control::Accept { id, ring, polled } => {
                out.push(3);
                out.extend_from_slice(&id.to_be_bytes());
                desc(&mut out, ring);
                out.push(*polled as u8);
            }
            Control::Refuse { id, reason } => {
                out.push(4);
                out.extend_from_slice(&id.to_be_bytes());
                let r = fit_reason(reason);
                out.extend_from_slice(&(r.len() as u16).to_be_bytes());
                out.extend_from_slice(r.as_bytes());
            }
            Control::Hello { rank, size } => {
                out.push(5);
                out.extend_from_slice(&rank.to_be_bytes());
                out.extend_from_slice(&size.to_be_bytes());
            }
        }
        // Every field is bounded (names by Fingerprint::NAME_MAX, reasons cut above): the
        // largest, an Open, is 42 bytes plus the name.
        debug_assert!(out.len() <= MAX, "a {}-byte control message", out.len());
        out
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<Control> {
        if b.len() > MAX {
            return Err(Error::Malformed(format!(
                "a control message of {} bytes (at most {MAX})",
                b.len()
            )));
        }
        let b = &mut b;
        let kind = take(b, 1)?[0];
        let c = match kind {
            1 => Control::Region {
                fp: Fingerprint::decode(b)?,
                desc: take_desc(b)?,
                len: take_u64(b)?,
            },
            2 => Control::Open {
                id: take_u16(b)?,
                fp: Fingerprint::decode(b)?,
                codec: take(b, 1)?[0],
                capacity: take_u32(b)?,
                slot: take_u32(b)?,
                credit: take_desc(b)?,
            },
            3 => Control::Accept {
                id: take_u16(b)?,
                ring: take_desc(b)?,
                polled: match take(b, 1)?[0] {
                    0 => false,
                    1 => true,
                    v => return Err(Error::Malformed(format!("ring mode {v}"))),
                },
            },
            4 => {
                let id = take_u16(b)?;
                let n = take_u16(b)? as usize;
                // Bytes that are not UTF-8 become U+FFFD, which can make the text longer:
                // cut it again so that what decodes always encodes as it is.
                let lossy = String::from_utf8_lossy(take(b, n)?);
                Control::Refuse {
                    id,
                    reason: fit_reason(&lossy).to_string(),
                }
            }
            5 => Control::Hello {
                rank: take_u32(b)?,
                size: take_u32(b)?,
            },
            k => {
                return Err(Error::Malformed(format!(
                    "unknown control message kind {k}"
                )))
            }
        };
        if !b.is_empty() {
            return Err(Error::Malformed(format!(
                "{} trailing bytes after a control message",
                b.len()
            )));
        }
        Ok(c)
    }
}

/// Immediate data of a channel WRITE: bit 31 set for a credit return; bits 30..20 the channel;
/// bits 19..0 the message length plus one (0: the sender closed the channel).
pub(crate) mod imm {
    /// Largest message a channel can carry.
    pub(crate) const MAX_MESSAGE: usize = (1 << 20) - 2;

    pub(crate) fn data(id: u16, len: Option<usize>) -> u32 {
        ((id as u32 & 0x7ff) << 20) | len.map_or(0, |l| l as u32 + 1)
    }

    pub(crate) fn credit(id: u16) -> u32 {
        (1 << 31) | ((id as u32 & 0x7ff) << 20)
    }

    /// (is a credit, channel, length: None when closed).
    pub(crate) fn parse(v: u32) -> (bool, u16, Option<usize>) {
        let len = v & 0xf_ffff;
        (
            v >> 31 == 1,
            ((v >> 20) & 0x7ff) as u16,
            (len > 0).then(|| len as usize - 1),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use barewire_drivers::Stag;

    fn d(n: u32) -> RegionDescriptor {
        RegionDescriptor {
            rkey: Stag(n),
            addr: 0x1000 * n as u64,
            len: 64,
        }
    }

    #[test]
    fn control_messages_round_trip_and_bad_bytes_are_errors() {
        let all = [
            Control::Region {
                fp: Fingerprint::of::<u64>(),
                desc: d(1),
                len: 9,
            },
            Control::Open {
                id: 7,
                fp: Fingerprint::of::<[u8; 64]>(),
                codec: 1,
                capacity: 256,
                slot: 128,
                credit: d(2),
            },
            Control::Accept {
                id: 7,
                ring: d(3),
                polled: false,
            },
            Control::Accept {
                id: 8,
                ring: d(4),
                polled: true,
            },
            Control::Refuse {
                id: 7,
                reason: "type mismatch".into(),
            },
            Control::Hello { rank: 2, size: 3 },
        ];
        for c in all {
            let b = c.encode();
            assert_eq!(Control::decode(&b).unwrap(), c);
            for cut in 0..b.len() {
                assert!(Control::decode(&b[..cut]).is_err(), "{c:?} cut at {cut}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(Control::decode(&long).is_err());
        }
        assert!(Control::decode(&[9]).is_err());
        // A ring mode other than 0 or 1 is refused.
        let mut b = Control::Accept {
            id: 1,
            ring: d(1),
            polled: true,
        }
        .encode();
        *b.last_mut().unwrap() = 2;
        assert!(Control::decode(&b).is_err());
    }

    /// A type whose name is longer than a control message (deeply nested generics) still
    /// crosses: its name is cut and hashed the same way on both sides, and two such types that
    /// differ only past the cut are still told apart. (Encoding used to cut the whole message
    /// at 512 bytes, which the peer could not decode.)
    #[test]
    fn a_type_name_longer_than_a_control_message_crosses_and_stays_distinct() {
        type Deep<T> = (
            (((T, T), (T, T)), ((T, T), (T, T))),
            (((T, T), (T, T)), ((T, T), (T, T))),
        );
        type A = Deep<Deep<std::collections::BTreeMap<String, Vec<Option<u8>>>>>;
        type B = Deep<Deep<std::collections::BTreeMap<String, Vec<Option<u16>>>>>;
        assert!(std::any::type_name::<A>().len() > MAX);
        let (fa, fb) = (Fingerprint::of::<A>(), Fingerprint::of::<B>());
        assert!(fa.name.len() <= Fingerprint::NAME_MAX);
        assert_ne!(fa, fb);
        for fp in [fa.clone(), fb] {
            let c = Control::Open {
                id: 1,
                fp: fp.clone(),
                codec: 1,
                capacity: 8,
                slot: 64,
                credit: d(1),
            };
            let bytes = c.encode();
            assert!(bytes.len() <= MAX);
            assert_eq!(Control::decode(&bytes).unwrap(), c);
        }
        assert!(Fingerprint::of::<A>().check(&fa).is_ok());
        // A long refusal is cut at a character boundary and still decodes.
        let reason = "é".repeat(400);
        let bytes = Control::Refuse { id: 2, reason }.encode();
        match Control::decode(&bytes).unwrap() {
            Control::Refuse { reason, .. } => assert!(reason.chars().all(|c| c == 'é')),
            other => panic!("{other:?}"),
        }
        // What no peer can send (the receive slots hold MAX bytes) is refused.
        assert!(Control::decode(&vec![5; MAX + 1]).is_err());
    }

    #[test]
    fn immediates_carry_channel_length_and_credit() {
        assert_eq!(imm::parse(imm::data(5, Some(64))), (false, 5, Some(64)));
        assert_eq!(imm::parse(imm::data(2047, Some(0))), (false, 2047, Some(0)));
        assert_eq!(imm::parse(imm::data(3, None)), (false, 3, None));
        assert_eq!(imm::parse(imm::credit(9)), (true, 9, None));
        assert_eq!(
            imm::parse(imm::data(1, Some(imm::MAX_MESSAGE))),
            (false, 1, Some(imm::MAX_MESSAGE))
        );
    }
}
