//! The checks the facade's cargo-fuzz targets run (`fuzz/fuzz_targets/control.rs`,
//! `bare_channel.rs`), here so that `cargo test` replays them over the committed corpus on
//! stable Rust (`tests/fuzz_corpus.rs`). Each takes arbitrary peer bytes and panics only if a
//! decoder breaks a promise: no panic, no unbounded allocation, and what decodes re-encodes
//! to something that decodes to the same value.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::channel::{Bare, Bytes, Codec, Raw};
use crate::control::{imm, Control, MAX};

/// A control message (region descriptor, channel Open/Accept/Refuse, hello) as a peer's SEND
/// delivers it, and a channel WRITE's immediate data.
pub fn control(data: &[u8]) {
    if let Ok(c) = Control::decode(data) {
        let bytes = c.encode();
        assert!(bytes.len() <= MAX, "{} bytes", bytes.len());
        let again = Control::decode(&bytes).expect("a re-encoded control message decodes");
        assert_eq!(again, c);
    }
    if let Some(v) = data.first_chunk::<4>() {
        let v = u32::from_le_bytes(*v);
        let (credit, id, len) = imm::parse(v);
        assert!(id < 1 << 11);
        assert!(len.is_none_or(|l| l <= imm::MAX_MESSAGE));
        let back = if credit {
            imm::credit(id)
        } else {
            imm::data(id, len)
        };
        // Every field survives; a credit's length bits are not used.
        assert_eq!(imm::parse(back).1, id);
        if !credit {
            assert_eq!(back, v);
        }
    }
}

/// What a BARE channel of a typical application type receives.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    id: u64,
    name: String,
    tags: Vec<String>,
    values: Vec<i32>,
    parent: Option<Box<Message>>,
    kind: Kind,
    attrs: BTreeMap<String, u16>,
    blob: Vec<u8>,
}

#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum Kind {
    Empty,
    Point(i64, i64),
    Named { label: String },
}

/// A channel message as the receiving half decodes it, with each codec: BARE into an
/// application type, raw plain-old-data, raw bytes.
pub fn bare_channel(data: &[u8]) {
    if let Ok(m) = <Bare as Codec<Message>>::decode(data) {
        let mut out = Vec::new();
        <Bare as Codec<Message>>::encode(&m, &mut out).expect("a decoded message encodes");
        let again = <Bare as Codec<Message>>::decode(&out).expect("re-encoded decodes");
        assert_eq!(again, m);
    }
    let _ = <Bare as Codec<Vec<String>>>::decode(data);
    let pod = <Raw as Codec<[u64; 4]>>::decode_from(data.len(), |b| b.copy_from_slice(data));
    assert_eq!(pod.is_ok(), data.len() == 32);
    let bytes = <Bytes as Codec<Vec<u8>>>::decode_from(data.len(), |b| b.copy_from_slice(data));
    assert_eq!(bytes.expect("any bytes are bytes"), data);
}

/// Valid inputs to start each target's corpus from (`fuzz/corpus/<target>/seed-*`).
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    use crate::region::Fingerprint;
    use barewire_drivers::{RegionDescriptor, Stag};
    let d = |k: u32| RegionDescriptor {
        rkey: Stag(k),
        addr: 0x7f00_0000_1000,
        len: 4096,
    };
    match target {
        "control" => [
            Control::Region {
                fp: Fingerprint::of::<u64>(),
                desc: d(7),
                len: 512,
            },
            Control::Open {
                id: 4,
                fp: Fingerprint::of::<Message>(),
                codec: 1,
                capacity: 256,
                slot: 4104,
                credit: d(9),
            },
            Control::Accept {
                id: 4,
                ring: d(11),
                polled: true,
            },
            Control::Refuse {
                id: 5,
                reason: "expected u64, found f32".into(),
            },
            Control::Hello { rank: 2, size: 3 },
        ]
        .iter()
        .map(Control::encode)
        .chain([imm::data(3, Some(100)).to_le_bytes().to_vec()])
        .collect(),
        "bare_channel" => {
            let m = Message {
                id: 1,
                name: "job".into(),
                tags: vec!["a".into(), "bc".into()],
                values: vec![-1, 2, 3],
                parent: Some(Box::new(Message {
                    id: 0,
                    name: String::new(),
                    tags: vec![],
                    values: vec![],
                    parent: None,
                    kind: Kind::Empty,
                    attrs: BTreeMap::new(),
                    blob: vec![],
                })),
                kind: Kind::Named { label: "x".into() },
                attrs: [("k".to_string(), 7)].into_iter().collect(),
                blob: vec![0, 255, 3],
            };
            let mut out = Vec::new();
            <Bare as Codec<Message>>::encode(&m, &mut out).unwrap();
            let mut point = Vec::new();
            let p = Message {
                kind: Kind::Point(-5, 9),
                parent: None,
                ..m
            };
            <Bare as Codec<Message>>::encode(&p, &mut point).unwrap();
            vec![out, point, vec![0; 32]]
        }
        _ => Vec::new(),
    }
}
