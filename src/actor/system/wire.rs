//! What crosses between nodes: each `Wire` message, BARE-encoded in a frame (`u32`
//! little-endian length, then the message), and the checks on an actor's types.

use super::*;

#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Wire {
    Heartbeat,
    Tell {
        to: u64,
        msg: Vec<u8>,
    },
    Ask {
        to: u64,
        req: u64,
        msg: Vec<u8>,
    },
    Reply {
        req: u64,
        result: std::result::Result<Vec<u8>, String>,
    },
    Lookup {
        req: u64,
        name: String,
        fp: String,
    },
    Spawn {
        req: u64,
        kind: String,
        fp: String,
        args: Vec<u8>,
    },
    Monitor {
        target: u64,
        mref: u64,
    },
    Down {
        mref: u64,
        reason: ExitReason,
    },
    Exit {
        to: u64,
        reason: ExitReason,
        kill: bool,
    },
    /// "The actor you sent to at `old` here now lives at (`node`, `id`)."
    Moved {
        old: u64,
        node: u64,
        id: u64,
    },
    /// "Everything I sent to `old` before this is with you": passed on to the new home.
    Fence {
        old: u64,
        token: u64,
    },
    /// A fence from `origin`, passed on by the old home after everything it forwarded.
    FenceFwd {
        origin: u64,
        token: u64,
    },
    /// "Your fence arrived here": the sender may now send to the new home directly.
    FenceAck {
        token: u64,
    },
    /// "Take over this actor": its kind and its state; reply with its new id.
    Adopt {
        req: u64,
        kind: String,
        fp: String,
        state: Vec<u8>,
    },
}

/// `Wire::Tell`'s variant index in BARE (the order of `Wire`'s variants).
pub(super) const TELL: u8 = 1;

/// Appends a BARE `uint` (LEB128).
pub(super) fn put_uint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A BARE `uint` from the front of `b`, and the rest.
pub(super) fn take_uint(b: &[u8]) -> Option<(u64, &[u8])> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= ((byte & 0x7f) as u64) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((v, &b[i + 1..]));
        }
    }
    None
}

/// A frame that is a `Wire::Tell`: its target and the message's bytes, without copying them.
pub(super) fn parse_tell(payload: &[u8]) -> Option<(u64, &[u8])> {
    let (&kind, rest) = payload.split_first()?;
    if kind != TELL || rest.len() < 8 {
        return None;
    }
    let to = u64::from_le_bytes(rest[..8].try_into().ok()?);
    let (len, msg) = take_uint(&rest[8..])?;
    (msg.len() as u64 == len).then_some((to, msg))
}

/// What an actor's messages and replies are, as the wire checks them.
pub(super) fn fingerprint<A: Actor>() -> String {
    format!("{} -> {}", type_name::<A::Msg>(), type_name::<A::Reply>())
}

pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>> {
    serde_bare::to_vec(v).map_err(|e| Error::Malformed(format!("encoding: {e}")))
}

pub(crate) fn decode<T: DeserializeOwned>(b: &[u8]) -> Result<T> {
    serde_bare::from_slice(b).map_err(|e| Error::Malformed(format!("decoding: {e}")))
}
