//! The BARE encoding used by `Bare` channels, checked against the encodings that
//! draft-devault-bare's rules give for its example values: LEB128 `uint`, zig-zag `int`,
//! little-endian fixed-width integers and floats, `bool`, length-prefixed `str` and `data`,
//! `optional`, fixed and variable arrays, and structs as the concatenation of their fields.
//! Then a serde type through a real channel.

mod common;

use barewire::{Bare, Codec};
use serde::{Deserialize, Serialize};
use serde_bare::{Int, Uint};

fn enc<T: Serialize + serde::de::DeserializeOwned>(v: &T) -> Vec<u8> {
    let mut out = Vec::new();
    <Bare as Codec<T>>::encode(v, &mut out).unwrap();
    out
}

#[test]
fn variable_length_integers() {
    for (v, want) in [
        (0u64, &[0x00][..]),
        (1, &[0x01]),
        (126, &[0x7e]),
        (127, &[0x7f]),
        (128, &[0x80, 0x01]),
        (129, &[0x81, 0x01]),
        (255, &[0xff, 0x01]),
        (300, &[0xac, 0x02]),
        (
            u64::MAX,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01],
        ),
    ] {
        assert_eq!(enc(&Uint(v)), want, "uint {v}");
    }
    for (v, want) in [
        (0i64, &[0x00][..]),
        (1, &[0x02]),
        (-1, &[0x01]),
        (63, &[0x7e]),
        (-63, &[0x7d]),
        (64, &[0x80, 0x01]),
        (-64, &[0x7f]),
        (65, &[0x82, 0x01]),
        (-65, &[0x81, 0x01]),
        (255, &[0xfe, 0x03]),
        (-255, &[0xfd, 0x03]),
    ] {
        assert_eq!(enc(&Int(v)), want, "int {v}");
    }
}

#[test]
fn fixed_width_values_strings_and_aggregates() {
    assert_eq!(enc(&0x1234_5678u32), [0x78, 0x56, 0x34, 0x12]);
    assert_eq!(enc(&-2i16), [0xfe, 0xff]);
    assert_eq!(enc(&1.0f64), [0, 0, 0, 0, 0, 0, 0xf0, 0x3f]);
    assert_eq!(enc(&true), [0x01]);
    assert_eq!(enc(&false), [0x00]);
    assert_eq!(enc(&"BARE".to_string()), [0x04, b'B', b'A', b'R', b'E']);
    assert_eq!(enc(&None::<u8>), [0x00]);
    assert_eq!(enc(&Some(7u8)), [0x01, 0x07]);
    assert_eq!(
        enc(&vec![1u8, 2, 3]),
        [0x03, 1, 2, 3],
        "list<u8>: length then items"
    );
    assert_eq!(enc(&[9u8, 8]), [9, 8], "[2]u8: no length");

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Customer {
        name: String,
        age: Uint,
        email: Option<String>,
    }
    let c = Customer {
        name: "Ada".into(),
        age: Uint(36),
        email: None,
    };
    let b = enc(&c);
    assert_eq!(
        b,
        [0x03, b'A', b'd', b'a', 36, 0x00],
        "fields in order, nothing else"
    );
    assert_eq!(<Bare as Codec<Customer>>::decode(&b).unwrap(), c);
    assert!(
        <Bare as Codec<Customer>>::decode(&b[..4]).is_err(),
        "truncated input is an error"
    );
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Job {
    Multiply { rows: u32, cols: u32, seed: u64 },
    Stop,
}

#[test]
fn serde_types_cross_a_bare_channel() {
    use barewire::Node;
    use barewire_test_support::rt;
    use std::time::Duration;
    let (t, port) = common::listening(|node| async move {
        let ep = node.accept().await.unwrap();
        let (_t, r) = ep
            .open_bare_channel::<Job>(Default::default())
            .await
            .unwrap();
        let mut got = Vec::new();
        loop {
            let j = r.recv().await.unwrap();
            got.push(j.clone());
            if j == Job::Stop {
                break;
            }
        }
        // Stay connected while the sender's flush completes.
        barewire::engine::time::sleep(Duration::from_millis(100)).await;
        got
    });
    let jobs = vec![
        Job::Multiply {
            rows: 2,
            cols: 3,
            seed: 99,
        },
        Job::Multiply {
            rows: 1024,
            cols: 1,
            seed: u64::MAX,
        },
        Job::Stop,
    ];
    let sent = jobs.clone();
    rt().block_on(async move {
        let node = Node::soft().unwrap();
        let ep = node
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        let (t, _r) = ep
            .open_bare_channel::<Job>(Default::default())
            .await
            .unwrap();
        for j in &sent {
            t.send(j).await.unwrap();
        }
        t.flush().await.unwrap();
    });
    assert_eq!(t.join().unwrap(), jobs);
}
