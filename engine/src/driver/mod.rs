//! The reactor backends: io_uring, and epoll as the fallback. One per core.

pub(crate) mod epoll;
pub(crate) mod lifecycle;
pub(crate) mod uring;

use std::time::Duration;

use crate::stats::Stats;
pub use uring::UringFlags;

/// Which reactor a runtime uses.
///
/// ```
/// use barewire_engine::{Reactor, Runtime};
/// // epoll even where io_uring exists (a seccomp profile that forbids it, say).
/// let rt = Runtime::builder().cores(1).pin(false).reactor(Reactor::Epoll).build().unwrap();
/// rt.block_on(async {});
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reactor {
    /// io_uring where it can be set up, otherwise epoll (with one warning). `BAREWIRE_REACTOR`
    /// (`io_uring` or `epoll`) overrides this default.
    #[default]
    Auto,
    /// io_uring, or an error if it is unavailable.
    IoUring,
    /// epoll through mio.
    Epoll,
}

/// What a core's reactor actually is.
///
/// ```
/// use barewire_engine::{ReactorKind, Runtime};
/// let rt = Runtime::builder().cores(1).pin(false).build().unwrap();
/// match rt.reactor() {
///     ReactorKind::IoUring(flags) => println!("io_uring, setup flags {flags:?}"),
///     ReactorKind::Epoll => println!("epoll (io_uring unavailable or not asked for)"),
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReactorKind {
    /// io_uring, with the setup flags the kernel accepted.
    IoUring(UringFlags),
    /// epoll.
    Epoll,
}

// One per core, never moved: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Driver {
    Uring(uring::Uring),
    Epoll(epoll::Epoll),
}

impl Driver {
    pub(crate) fn kind(&self) -> ReactorKind {
        match self {
            Driver::Uring(u) => ReactorKind::IoUring(u.flags),
            Driver::Epoll(_) => ReactorKind::Epoll,
        }
    }

    pub(crate) fn poll(&self, stats: &Stats) -> bool {
        match self {
            Driver::Uring(u) => u.poll(stats),
            Driver::Epoll(e) => e.poll(stats),
        }
    }

    pub(crate) fn submit_calls(&self) -> u64 {
        match self {
            Driver::Uring(u) => u.enters.get(),
            Driver::Epoll(_) => 0,
        }
    }

    pub(crate) fn registered_files(&self) -> u64 {
        match self {
            Driver::Uring(u) => u.fixed_in_use(),
            Driver::Epoll(_) => 0,
        }
    }

    pub(crate) fn pure_poll(&self) -> bool {
        match self {
            Driver::Uring(u) => u.pure_poll(),
            Driver::Epoll(_) => false,
        }
    }

    pub(crate) fn park(&self, timeout: Option<Duration>, stats: &Stats) {
        match self {
            Driver::Uring(u) => u.park(timeout),
            Driver::Epoll(e) => e.park(timeout, stats),
        }
    }

    pub(crate) fn drain(&self, stats: &Stats) {
        if let Driver::Uring(u) = self {
            u.drain(stats);
        }
    }
}
