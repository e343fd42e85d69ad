//! What can go wrong, in words a user can act on.

use barewire_drivers::DriverError;

/// barewire's error.
///
/// Each variant says what to do about it; the ones an application usually tells apart are the
/// end of a stream, a peer that is gone, and an outcome it must check:
///
/// ```
/// use barewire::Error;
/// fn what_next(e: &Error) -> &'static str {
///     match e {
///         Error::Closed => "the sender finished: stop reading",
///         Error::PeerGone(_) => "reconnect, or fail over",
///         Error::Indeterminate(_) => "read the value again before retrying",
///         Error::Timeout(_) | Error::Overloaded(_) => "try again later",
///         _ => "report it",
///     }
/// }
/// assert_eq!(what_next(&Error::Closed), "the sender finished: stop reading");
/// let e = Error::OutOfBounds { index: 8, count: 1, len: 8 };
/// assert_eq!(e.to_string(), "index 8 (+1) is outside a region of 8 elements");
/// ```
///
/// Kept small (32 bytes: its largest variants are boxed), because every `Result` barewire
/// returns carries one, and a `Result<(), Error>` is moved whole on its way back from each
/// call and each `.await`, `Ok` or not: at 56 bytes that move was a measurable part of sending
/// a 64-byte channel message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The RDMA layer failed (setup, a post, or a work request completed with an error).
    #[error("{0}")]
    Driver(#[source] Box<DriverError>),
    /// The peer described a region or channel of another type than the one asked for.
    #[error("type mismatch: expected {}, the peer offered {}", .0.expected, .0.found)]
    TypeMismatch(Box<Mismatch>),
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
    /// The receiver cannot take more now, and this message was not queued: an actor's mailbox
    /// at the bound its node keeps for messages from other nodes, or more bytes waiting for a
    /// peer that is not reading than this node keeps (see
    /// [`SystemOptions`](crate::actor::SystemOptions)). Nothing else was lost; try again later
    /// or shed the load.
    #[error("overloaded: {0}")]
    Overloaded(String),
    /// A setting outside what barewire supports.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// barewire's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What [`Error::TypeMismatch`] holds.
///
/// ```
/// use barewire::Error;
/// let e = Error::type_mismatch("Region<u64>", "Region<f32>");
/// if let Error::TypeMismatch(m) = &e {
///     assert_eq!((m.expected.as_str(), m.found.as_str()), ("Region<u64>", "Region<f32>"));
/// }
/// assert_eq!(e.to_string(), "type mismatch: expected Region<u64>, the peer offered Region<f32>");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// What this side asked for.
    pub expected: String,
    /// What the peer described.
    pub found: String,
}

impl Error {
    /// A [`Error::TypeMismatch`].
    pub fn type_mismatch(expected: impl Into<String>, found: impl Into<String>) -> Error {
        Error::TypeMismatch(Box::new(Mismatch {
            expected: expected.into(),
            found: found.into(),
        }))
    }
}

impl From<DriverError> for Error {
    fn from(e: DriverError) -> Error {
        Error::Driver(Box::new(e))
    }
}

#[cfg(test)]
mod size {
    /// The size the docs promise (a change that grows it should be a decision).
    #[test]
    fn an_error_is_four_words() {
        assert_eq!(std::mem::size_of::<super::Error>(), 32);
        assert_eq!(std::mem::size_of::<crate::Result<()>>(), 32);
    }
}
