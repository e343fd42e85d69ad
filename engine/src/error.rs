//! Errors of building and running a runtime.

use std::io;

/// What can go wrong setting up or driving the engine.
///
/// ```
/// use barewire_engine::{Error, Runtime};
/// let e = Runtime::builder().cores(0).build().err().unwrap();
/// assert!(matches!(e, Error::InvalidConfig(_)), "{e}");
/// let e = Runtime::builder().cores(100_000).build().err().unwrap();
/// assert!(matches!(e, Error::TooManyCores { requested: 100_000, .. }), "{e}");
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A core id that this machine does not have.
    #[error("core {id} does not exist; this machine has cores {available:?}")]
    UnknownCore {
        /// The requested id.
        id: usize,
        /// The ids that exist (and that this process may run on).
        available: Vec<usize>,
    },
    /// More cores asked for than exist.
    #[error("asked for {requested} cores but only {available} are available to this process")]
    TooManyCores {
        /// How many were asked for.
        requested: usize,
        /// How many exist.
        available: usize,
    },
    /// Zero cores, a zero ring size, or a similar setting that cannot work.
    #[error("invalid runtime setting: {0}")]
    InvalidConfig(String),
    /// io_uring was asked for explicitly and cannot be set up.
    #[error("io_uring is unavailable ({0}); use Reactor::Auto or BAREWIRE_REACTOR=epoll to fall back to epoll")]
    IoUringUnavailable(io::Error),
    /// SQPOLL was asked for (`Builder::sqpoll`, `BAREWIRE_SQPOLL`) and the kernel refused it.
    #[error(
        "io_uring with SQPOLL is unavailable ({0}); drop Builder::sqpoll or unset BAREWIRE_SQPOLL"
    )]
    SqPollUnavailable(io::Error),
    /// Registering memory would exceed the locked-memory limit.
    #[error(
        "registering {needed} bytes of memory exceeds RLIMIT_MEMLOCK ({limit} bytes); raise it \
         (ulimit -l, or LimitMEMLOCK= for systemd services) to at least {needed} bytes"
    )]
    Memlock {
        /// Bytes the registration needs.
        needed: u64,
        /// The current soft limit.
        limit: u64,
    },
    /// `pthread_setaffinity` refused the core.
    #[error("could not pin the thread to core {0}")]
    Pin(usize),
    /// Any other OS error during setup.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The OS error.
        source: io::Error,
    },
}

impl Error {
    pub(crate) fn io(context: &'static str, source: io::Error) -> Self {
        Error::Io { context, source }
    }
}
