//! The control messages two endpoints exchange by SEND: region descriptors and the channel
//! handshake. Every decode of peer bytes returns an error, never panics.
//!
//! On the wire (version 1): one byte, the version, then the message in BARE (serde_bare: the
//! variant as a varint tag, integers little-endian of fixed width, strings with a varint
//! length, a region descriptor as its key, address and length). A peer that speaks another
//! version is refused with an error naming both. `tests` pins the bytes of each message, so
//! a change of layout cannot pass unnoticed: it needs a new version. A new message kind
//! appended at the end (as `Ping` was, tag 5) leaves every other message's bytes as they were;
//! a build from before it fails the connection on which one arrives, as on any message it
//! cannot decode.

use barewire_drivers::{RegionDescriptor, Stag};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::region::Fingerprint;

/// Largest control message (a fingerprint's type name is cut to fit).
pub(crate) const MAX: usize = 512;

/// The layout this build writes and reads.
pub(crate) const VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Control {
    /// "Here is a region of `len` elements of this type."
    Region {
        fp: Fingerprint,
        #[serde(with = "desc")]
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
        #[serde(with = "desc")]
        credit: RegionDescriptor,
    },
    /// "Your channel `id` lands in `ring`; `polled`: write plain WRITEs, I watch the ring's
    /// memory (otherwise WRITE with immediate, one receive completion per run)."
    Accept {
        id: u16,
        #[serde(with = "desc")]
        ring: RegionDescriptor,
        #[serde(with = "strict_bool")]
        polled: bool,
    },
    /// "I will not take your channel `id`: `reason`."
    Refuse { id: u16, reason: String },
    /// "I am rank `rank` of a mesh of `size`" (the first word on a mesh connection).
    Hello { rank: u32, size: u32 },
    /// "Are you there?": a liveness probe, which the receive side takes and drops (see
    /// `Inner::probe`).
    Ping,
}

/// A region descriptor as (key, address, length).
mod desc {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        d: &RegionDescriptor,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        (d.rkey.0, d.addr, d.len).serialize(s)
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<RegionDescriptor, D::Error> {
        let (rkey, addr, len) = <(u32, u64, u64)>::deserialize(d)?;
        Ok(RegionDescriptor {
            rkey: Stag(rkey),
            addr,
            len,
        })
    }
}

/// A flag as one byte that must be 0 or 1 (BARE's own bool takes any non-zero as true).
mod strict_bool {
    use super::*;

    pub(super) fn serialize<S: serde::Serializer>(
        b: &bool,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        (*b as u8).serialize(s)
    }

    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<bool, D::Error> {
        match u8::deserialize(d)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(serde::de::Error::custom(format!("a flag of {v}"))),
        }
    }
}

/// The longest prefix of `reason`, cut at a character boundary, that fits in a Refuse.
fn fit_reason(reason: &str) -> &str {
    let mut n = reason.len().min(MAX - 16);
    while !reason.is_char_boundary(n) {
        n -= 1;
    }
    &reason[..n]
}

impl Control {
    /// What goes on the wire: names and reasons cut to what always fits.
    fn bounded(&self) -> Control {
        let mut c = self.clone();
        match &mut c {
            Control::Region { fp, .. } | Control::Open { fp, .. } => fp.name = fp.wire_name(),
            Control::Refuse { reason, .. } => *reason = fit_reason(reason).to_string(),
            Control::Accept { .. } | Control::Hello { .. } | Control::Ping => {}
        }
        c
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        out.push(VERSION);
        serde_bare::to_writer(&mut out, &self.bounded()).expect("a Vec takes any message");
        // Every field is bounded (names by Fingerprint::NAME_MAX, reasons cut above): the
        // largest, an Open, is about 50 bytes plus the name.
        debug_assert!(out.len() <= MAX, "a {}-byte control message", out.len());
        out
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Control> {
        if b.len() > MAX {
            return Err(Error::Malformed(format!(
                "a control message of {} bytes (at most {MAX})",
                b.len()
            )));
        }
        let Some((&version, mut rest)) = b.split_first() else {
            return Err(Error::Malformed("an empty control message".into()));
        };
        if version != VERSION {
            return Err(Error::Malformed(format!(
                "a control message of version {version}; this build speaks version {VERSION}"
            )));
        }
        // Read from a slice that advances, so what is left after the message shows.
        let c: Control = serde_bare::from_reader(&mut rest)
            .map_err(|e| Error::Malformed(format!("control message: {e}")))?;
        if !rest.is_empty() {
            return Err(Error::Malformed(format!(
                "{} trailing bytes after a control message",
                rest.len()
            )));
        }
        match &c {
            Control::Region { fp, .. } | Control::Open { fp, .. }
                if fp.name.len() > Fingerprint::NAME_MAX =>
            {
                Err(Error::Malformed(format!(
                    "a type name of {} bytes (at most {})",
                    fp.name.len(),
                    Fingerprint::NAME_MAX
                )))
            }
            Control::Open { capacity, slot, .. }
                if !crate::channel::ring_shape_fits(*capacity, *slot) =>
            {
                Err(Error::Malformed(format!(
                    "channel of {capacity} slots of {slot} bytes"
                )))
            }
            Control::Refuse { reason, .. } if fit_reason(reason.as_str()).len() < reason.len() => {
                Err(Error::Malformed(format!(
                    "a refusal of {} bytes",
                    reason.len()
                )))
            }
            _ => Ok(c),
        }
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

    /// Version 1's bytes, pinned: a change here breaks every peer built before it, so it
    /// needs a new `VERSION` (and this test for both).
    #[test]
    fn version_1_bytes_are_fixed() {
        let fp = |name: &str, size| Fingerprint {
            name: name.into(),
            size,
            align: size,
        };
        #[rustfmt::skip]
        let golden: [(Control, &[u8]); 6] = [
            (
                Control::Region { fp: fp("u64", 8), desc: d(1), len: 9 },
                // version, tag, name (varint length + UTF-8), size, align, then the
                // descriptor (key u32, address u64, length u64), then len u64; all little-endian
                &[1, 0, 3, b'u', b'6', b'4', 8, 0, 0, 0, 8, 0, 0, 0,
                  1, 0, 0, 0, 0, 16, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0,
                  9, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                Control::Open { id: 7, fp: fp("u8", 1), codec: 1, capacity: 256, slot: 128, credit: d(2) },
                &[1, 1, 7, 0, 2, b'u', b'8', 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 0, 128, 0, 0, 0,
                  2, 0, 0, 0, 0, 32, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0],
            ),
            (
                Control::Accept { id: 7, ring: d(3), polled: true },
                &[1, 2, 7, 0, 3, 0, 0, 0, 0, 48, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 1],
            ),
            (Control::Refuse { id: 7, reason: "no".into() }, &[1, 3, 7, 0, 2, b'n', b'o']),
            (Control::Hello { rank: 2, size: 3 }, &[1, 4, 2, 0, 0, 0, 3, 0, 0, 0]),
            (Control::Ping, &[1, 5]),
        ];
        for (c, bytes) in golden {
            assert_eq!(c.encode(), bytes, "{c:?}");
            assert_eq!(Control::decode(bytes).unwrap(), c);
        }
    }

    /// An Open whose ring no channel could have (no slot, or a slot that is not a multiple of
    /// 8, too small for a 1-byte message, or larger than the largest message) does not decode,
    /// so the connection fails on it; the extremes that fit do.
    #[test]
    fn an_open_of_a_ring_no_channel_has_does_not_decode() {
        let open = |capacity, slot| Control::Open {
            id: 1,
            fp: Fingerprint::of::<u64>(),
            codec: 1,
            capacity,
            slot,
            credit: d(1),
        };
        // The largest slot that is a multiple of 8.
        let most = ((imm::MAX_MESSAGE + 64) / 8 * 8) as u32;
        for (capacity, slot) in [
            (0, 64),
            (8, 12),
            (8, 8),
            (8, 0),
            (8, most + 8),
            (8, u32::MAX),
        ] {
            let e = Control::decode(&open(capacity, slot).encode()).unwrap_err();
            assert!(
                matches!(&e, Error::Malformed(m) if m.contains("slots")),
                "{capacity} x {slot}: {e}"
            );
        }
        for (capacity, slot) in [(1, 16), (u32::MAX, 16), (8, most)] {
            assert!(Control::decode(&open(capacity, slot).encode()).is_ok());
        }
    }

    #[test]
    fn another_version_is_refused_by_name() {
        let mut b = Control::Hello { rank: 0, size: 1 }.encode();
        b[0] = 2;
        let e = Control::decode(&b).unwrap_err().to_string();
        assert!(
            e.contains("version 2") && e.contains("speaks version 1"),
            "{e}"
        );
        assert!(Control::decode(&[]).is_err());
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
