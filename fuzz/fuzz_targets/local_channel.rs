//! Differential fuzzing of the engine's bounded local channel against a VecDeque model: any
//! sequence of sends, receives, sender clones and drops must behave as the model says.
#![no_main]

use std::collections::VecDeque;

use barewire_engine::sync::mpsc::{self, TrySendError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&cap, ops)) = data.split_first() else { return };
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
});
