//! What can go wrong, in words a user can act on.

use barewire_drivers::DriverError;

/// barewire's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The RDMA layer failed (setup, a post, or a work request completed with an error).
    #[error("{0}")]
    Driver(#[from] DriverError),
    /// The peer described a region or channel of another type than the one asked for.
    #[error("type mismatch: expected {expected}, the peer offered {found}")]
    TypeMismatch {
        /// What this side asked for.
        expected: String,
        /// What the peer described.
        found: String,
    },
    /// An element index or range outside the remote region.
    #[error("index {index} (+{count}) is outside a region of {len} elements")]
    OutOfBounds {
        /// First element.
        index: u64,
        /// Elements.
        count: u64,
        /// The region's length in elements.
        len: u64,
    },
    /// A message larger than the channel's maximum.
    #[error("a {len}-byte message exceeds this channel's maximum of {max} bytes")]
    TooLarge {
        /// Its encoded size.
        len: usize,
        /// The channel's maximum.
        max: usize,
    },
    /// The other end of a channel was dropped.
    #[error("the other end of the channel is closed")]
    Closed,
    /// The peer is gone (killed, cut off, or disconnected): the connection failed.
    #[error("the peer is gone: {0}")]
    PeerGone(String),
    /// The connection was lost while an operation that changes remote memory was in flight:
    /// it may or may not have taken effect. Read the value again to find out; never retry a
    /// non-idempotent operation blindly.
    #[error("outcome unknown (the connection was lost mid-operation): {0}")]
    Indeterminate(String),
    /// A lock could not be taken or kept (its lease was broken by another node, or the wait
    /// for it exceeded the limit).
    #[error("lock: {0}")]
    Lock(String),
    /// The actor has exited (its reason).
    #[error("the actor has exited: {0}")]
    Exited(String),
    /// No answer in time.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The peer refused a channel.
    #[error("the peer refused the channel: {0}")]
    Refused(String),
    /// Bytes from the peer that do not decode.
    #[error("malformed message from the peer: {0}")]
    Malformed(String),
    /// A setting outside what barewire supports.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// barewire's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
