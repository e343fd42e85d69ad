//! What the cargo-fuzz targets over the engine check, here so that `cargo test` replays their
//! corpus through the same code (`tests/fuzz_corpus.rs`).

use std::collections::VecDeque;

use crate::sync::mpsc::{self, TrySendError};

/// Differential check of the bounded local channel against a `VecDeque` model: the first byte
/// picks the capacity (1 to 8), each later byte one step (a send, a receive, a sender cloned or
/// dropped), and every step must do what the model says.
pub fn local_channel(data: &[u8]) {
    let Some((&cap, ops)) = data.split_first() else {
        return;
    };
    let cap = (cap as usize % 8) + 1;
    let (tx, mut rx) = mpsc::channel::<u8>(cap);
    let mut senders = vec![tx];
    let mut model: VecDeque<u8> = VecDeque::new();
    for &op in ops {
        match op % 4 {
            0 | 1 => {
                let Some(tx) = senders.first() else { continue };
                let r = tx.try_send(op);
                if model.len() < cap {
                    assert_eq!(r, Ok(()));
                    model.push_back(op);
                } else {
                    assert_eq!(r, Err(TrySendError::Full(op)));
                }
            }
            2 => assert_eq!(rx.try_recv(), model.pop_front()),
            _ => {
                if op & 0x80 != 0 {
                    if let Some(tx) = senders.first() {
                        senders.push(tx.clone());
                    }
                } else {
                    senders.pop();
                }
            }
        }
        assert_eq!(rx.len(), model.len());
    }
}
