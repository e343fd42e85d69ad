//! A timeline of one thread's steps, for finding where a message's microseconds go.
//!
//! Built with the `trace` feature, each [`event`] stores the time stamp counter (on x86_64;
//! elsewhere a monotonic clock in nanoseconds), a [`Kind`] and an argument in a log of this
//! thread's own (24 bytes an event, up to [`CAPACITY`] events, then counted as dropped; its
//! pages are written when it is first used, so recording takes no page faults).
//! Without the feature every call compiles to nothing, so the engine and the providers call it
//! on their hot paths: around each `io_uring_enter` (the epoll reactor's waits are not marked),
//! at each reap, where the software provider places received bytes (either reactor) and where
//! a send is posted to it. An application adds its own kinds ([`Kind::user`]) to see its
//! handler in the same timeline.
//!
//! [`write()`] saves the log (a first record gives the clock's rate). `barewire-perf --trace
//! <prefix>` writes both of its processes' logs, and `bench/tools/hop-trace.py` cuts them into
//! the parts of each round trip (bench/RESULTS.md, fifty-second session).
//!
//! ```
//! use barewire_engine::trace::{self, Kind};
//!
//! trace::event(Kind::user(1), 42);
//! let events = trace::take();
//! if trace::ENABLED {
//!     assert_eq!((events[0].kind, events[0].arg), (Kind::user(1), 42));
//! } else {
//!     assert!(events.is_empty());
//! }
//! ```

use std::io;
use std::path::Path;

/// Whether this build records events (the `trace` feature).
pub const ENABLED: bool = cfg!(feature = "trace");

/// Events one thread keeps; later ones are counted in [`dropped`] and not stored.
pub const CAPACITY: usize = 1 << 22;

/// What an [`Event`] marks. The engine's and the providers' kinds are below
/// [`Kind::USER`]; an application's own start there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kind(pub u16);

impl Kind {
    /// An `io_uring_enter` begins; the argument is the entries it submits, shifted left by
    /// one, with bit 0 set when it also asks for completions.
    pub const ENTER: Kind = Kind(1);
    /// That `io_uring_enter` returned; the argument is its result (negative: an errno).
    pub const ENTERED: Kind = Kind(2);
    /// The engine took completions from the ring; the argument is how many.
    pub const REAPED: Kind = Kind(3);
    /// The software provider begins to place received bytes; the argument is how many.
    pub const RECEIVED: Kind = Kind(4);
    /// The software provider placed them.
    pub const PLACED: Kind = Kind(5);
    /// A send request is posted to the software provider.
    pub const POSTED: Kind = Kind(6);
    /// The first of the kinds left to applications.
    pub const USER: Kind = Kind(0x100);

    /// An application's kind number `n` (`USER + n`).
    pub const fn user(n: u16) -> Kind {
        Kind(Kind::USER.0 + n)
    }
}

/// One step of the timeline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// The clock when it was recorded: TSC ticks on x86_64, nanoseconds elsewhere.
    pub at: u64,
    /// What it marks.
    pub kind: Kind,
    /// What the kind says it is (only its low 48 bits are kept).
    pub arg: u64,
}

/// Records `kind` with `arg` in this thread's timeline; nothing without the `trace` feature.
#[inline(always)]
pub fn event(kind: Kind, arg: u64) {
    #[cfg(feature = "trace")]
    imp::event(kind, arg);
    #[cfg(not(feature = "trace"))]
    let _ = (kind, arg);
}

/// Takes this thread's events so far, oldest first, and starts its log again.
pub fn take() -> Vec<Event> {
    #[cfg(feature = "trace")]
    return imp::take();
    #[cfg(not(feature = "trace"))]
    Vec::new()
}

/// Events this thread did not keep because its log was full.
pub fn dropped() -> u64 {
    #[cfg(feature = "trace")]
    return imp::dropped();
    #[cfg(not(feature = "trace"))]
    0
}

/// The clock's ticks per second, measured over about 20 ms (nanoseconds: 10^9).
pub fn ticks_per_second() -> u64 {
    if !cfg!(target_arch = "x86_64") {
        return 1_000_000_000;
    }
    let (t0, c0) = (std::time::Instant::now(), now());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let (t1, c1) = (std::time::Instant::now(), now());
    let ns = t1.duration_since(t0).as_nanos().max(1);
    (u128::from(c1.wrapping_sub(c0)) * 1_000_000_000 / ns) as u64
}

/// Takes this thread's events ([`take`]) and writes them to `path`: 16 bytes each, little
/// endian, the clock then the kind in the top 16 bits over the argument's low 48; first a
/// record of kind 0 whose clock field is [`ticks_per_second`]. Returns the events written.
pub fn write(path: &Path) -> io::Result<usize> {
    let events = take();
    let mut out = Vec::with_capacity((events.len() + 1) * 16);
    let mut put = |at: u64, kind: Kind, arg: u64| {
        out.extend_from_slice(&at.to_le_bytes());
        out.extend_from_slice(&(u64::from(kind.0) << 48 | arg & ARG_MASK).to_le_bytes());
    };
    put(ticks_per_second(), Kind(0), 0);
    for e in &events {
        put(e.at, e.kind, e.arg);
    }
    std::fs::write(path, out)?;
    Ok(events.len())
}

const ARG_MASK: u64 = (1 << 48) - 1;

/// The clock events are stamped with.
#[inline(always)]
fn now() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC has no preconditions; every x86_64 CPU has it.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    {
        use std::sync::OnceLock;
        static START: OnceLock<std::time::Instant> = OnceLock::new();
        START
            .get_or_init(std::time::Instant::now)
            .elapsed()
            .as_nanos() as u64
    }
}

#[cfg(feature = "trace")]
mod imp {
    use super::{now, Event, Kind, ARG_MASK, CAPACITY};
    use std::cell::{Cell, RefCell};

    thread_local! {
        static LOG: RefCell<Vec<Event>> = const { RefCell::new(Vec::new()) };
        static DROPPED: Cell<u64> = const { Cell::new(0) };
    }

    #[inline(always)]
    pub(super) fn event(kind: Kind, arg: u64) {
        let at = now();
        LOG.with(|log| {
            let mut log = log.borrow_mut();
            if log.capacity() == 0 {
                reserve(&mut log);
            }
            if log.len() < CAPACITY {
                log.push(Event {
                    at,
                    kind,
                    arg: arg & ARG_MASK,
                });
            } else {
                DROPPED.with(|d| d.set(d.get() + 1));
            }
        });
    }

    /// Reserves the whole log at once and writes every page of it, so no later event pays for
    /// the log's growth or takes a page fault on first touch (one every 170 events otherwise;
    /// about 2 µs each on this host, enough to make a round trip look slow: bench/RESULTS.md,
    /// fifty-second session).
    #[cold]
    fn reserve(log: &mut Vec<Event>) {
        log.reserve_exact(CAPACITY);
        let blank = Event {
            at: 0,
            kind: Kind(0),
            arg: 0,
        };
        let per_page = 4096 / std::mem::size_of::<Event>();
        for slot in log.spare_capacity_mut().iter_mut().step_by(per_page) {
            // SAFETY: a slot of the buffer just reserved, written (never read: `len` stays 0)
            // so that its page is faulted in now; volatile, so the store is not elided.
            unsafe { std::ptr::write_volatile(slot.as_mut_ptr(), blank) };
        }
    }

    pub(super) fn take() -> Vec<Event> {
        LOG.with(|log| std::mem::take(&mut *log.borrow_mut()))
    }

    pub(super) fn dropped() -> u64 {
        DROPPED.with(Cell::get)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(feature = "trace")]
    fn events_come_back_in_order_with_their_kinds_and_arguments() {
        take();
        event(Kind::ENTER, 3);
        event(Kind::user(7), u64::MAX);
        event(Kind::ENTERED, 1);
        let e = take();
        let got: Vec<(Kind, u64)> = e.iter().map(|e| (e.kind, e.arg)).collect();
        assert_eq!(
            got,
            [
                (Kind::ENTER, 3),
                (Kind(0x107), ARG_MASK),
                (Kind::ENTERED, 1)
            ]
        );
        assert!(e.windows(2).all(|w| w[0].at <= w[1].at), "{e:?}");
        assert!(take().is_empty(), "take starts the log again");
    }

    #[test]
    #[cfg(feature = "trace")]
    fn a_log_is_written_after_its_clock_rate() {
        take();
        event(Kind::POSTED, 5);
        event(Kind::user(0), 6);
        let path = std::env::temp_dir().join(format!("barewire-trace-{}", std::process::id()));
        assert_eq!(write(&path).unwrap(), 2);
        let bytes = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let words: Vec<u64> = bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(words.len(), 6);
        // The rate: a clock of at least 100 MHz (TSCs run at GHz; elsewhere nanoseconds).
        assert!(words[0] >= 100_000_000, "{}", words[0]);
        assert_eq!(words[1], 0);
        assert_eq!((words[3] >> 48, words[3] & ARG_MASK), (6, 5));
        assert_eq!((words[5] >> 48, words[5] & ARG_MASK), (0x100, 6));
        assert!(words[2] <= words[4]);
    }

    #[test]
    #[cfg(feature = "trace")]
    fn a_full_log_counts_what_it_drops() {
        // On a thread of its own: the log and its count are per thread.
        std::thread::spawn(|| {
            for i in 0..CAPACITY as u64 + 3 {
                event(Kind::user(1), i);
            }
            assert_eq!(dropped(), 3);
            let e = take();
            assert_eq!(e.len(), CAPACITY);
            assert_eq!(
                e.last().unwrap().arg,
                CAPACITY as u64 - 1,
                "the first ones are kept"
            );
        })
        .join()
        .unwrap();
    }

    #[test]
    #[cfg(feature = "trace")]
    fn recording_takes_no_page_faults_once_the_log_is_reserved() {
        std::thread::spawn(|| {
            let faults = || {
                // SAFETY: rusage is plain integers, for which all zeroes is a value.
                let mut u: libc::rusage = unsafe { std::mem::zeroed() };
                // SAFETY: getrusage writes only the struct it is given.
                let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
                assert_eq!(r, 0);
                u.ru_minflt
            };
            event(Kind::user(0), 0); // reserves the log and writes its pages
            let before = faults();
            // 2.4 MB of events: about 590 pages, each a fault if first touched now.
            for i in 0..100_000 {
                event(Kind::user(1), i);
            }
            let during = faults() - before;
            assert!(during < 50, "{during} page faults while recording");
            take();
        })
        .join()
        .unwrap();
    }

    #[test]
    #[cfg(not(feature = "trace"))]
    fn without_the_feature_nothing_is_kept() {
        event(Kind::ENTER, 1);
        assert!(take().is_empty());
        assert_eq!(dropped(), 0);
    }
}
