//! The ring's slot layout and the receiving half's state, with the per-core watcher that
//! sees messages land in watched rings.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};

use barewire_drivers::{Buffer, Span};

use super::Waiters;
use crate::endpoint::Arrival;

/// Each slot starts with the message's length, 4 bytes little-endian, with `LEN_SET` or'd in:
/// a slot not yet written (zeroed), or whose length word is only partly in, never reads as a
/// message, not even an empty one.
pub(super) const PREFIX: usize = 4;
pub(super) const LEN_SET: u32 = 1 << 31;

/// After the message (at `PREFIX` + its length rounded up to 4) come these 4 bytes, the last a
/// message's WRITE places: a receiver that watches its ring knows a message has fully landed
/// once they read `MARK` (every byte non-zero, so a partly placed mark never matches).
pub(super) const MARK_LEN: usize = 4;
pub(super) const MARK: u32 = 0x5ab1_7e0d;

/// How many slots ahead of the one it takes each side of a shm ring in a stream asks the CPU
/// to fetch (see [`ahead`]), and how many bytes of that slot: its length word and, for small
/// messages, the whole slot.
///
/// Over shm every slot's lines travel between the two CPUs' caches twice a lap: to the
/// receiver when it reads a message (and clears its length word), back to the sender when it
/// stores the next. Each side otherwise takes each line when it first touches it, one cache
/// miss after another. With the receiver fetching a slot ahead for reading, and the sender
/// one ahead for writing (`MappedRemote::prefetch_for_write`), those transfers overlap:
/// `Channel<[u8; 64]>` at 1,024 slots went from 27–30 to 60–73 M msg/s, fetching 8 slots
/// ahead, on an Intel Xeon host (KVM, 2 vCPUs) whose cross-core transfers are slow (a store
/// seen by the other CPU after about 150 ns); the sender's fetch alone gained nothing there,
/// the receiver's alone a fifth to a half (`bench/RESULTS.md`, sixty-second session). But 8
/// slots at about 13 ns a message are about 100 ns, less than one such transfer: 16 slots ahead
/// went 1.10x as fast as 8 (`recv` 78.5 against 71.7 M msg/s, ahead in 8 of 8 alternated
/// rounds), and 24 or 32 no faster than 16 (sixty-third session). Neither side fetches ahead
/// when it is not in a stream: not the sender's first message since its task last yielded (one
/// a ping-pong sends), nor the receiver's first message after it waited for one. There the
/// fetch would move a line the other side is about to store into, for nothing. (In a ring of
/// fewer than 16 slots the offset [`ahead`] names may lie past the ring's end: the receiver's
/// hint then does nothing, and the sender never fetches, having never room for 16 more.)
pub(super) const PREFETCH_SLOTS: usize = 16;
pub(super) const PREFETCH_BYTES: usize = 128;

/// The offset of the slot [`PREFETCH_SLOTS`] after the one at `at` in a ring of `capacity`
/// slots of `slot` bytes, wrapping at the ring's end.
#[inline(always)]
pub(super) fn ahead(at: usize, slot: usize, capacity: u64) -> usize {
    let ring = capacity as usize * slot;
    let to = at + PREFETCH_SLOTS * slot;
    if to >= ring {
        to - ring
    } else {
        to
    }
}

/// The length a slot's length word claims, or `None` for a word not yet written (see
/// `LEN_SET`).
#[inline(always)]
pub(super) fn length(word: u32) -> Option<usize> {
    (word & LEN_SET != 0).then_some((word & !LEN_SET) as usize)
}

/// Bytes a message of `len` bytes occupies in its slot: length, message, mark.
pub(super) fn extent(len: usize) -> usize {
    PREFIX + len.next_multiple_of(4) + MARK_LEN
}

/// The receiver's half, as the receive task sees it.
pub(crate) struct RxState {
    pub(super) id: u16,
    pub(super) capacity: u64,
    pub(super) slot: usize,
    pub(super) ring: Rc<Buffer>,
    /// Messages that have arrived (the ring holds them in order from `consumed`).
    pub(super) arrived: Cell<u64>,
    /// The sender's close notice has come.
    pub(super) closed: Cell<bool>,
    pub(super) waker: Waiters,
    /// This side watches the ring's memory for arrivals (the sender writes plain WRITEs);
    /// otherwise each run's immediate counts them (`arrived`).
    pub(super) polled: bool,
    /// The peer's CPU stores into this polled ring itself (shm), rather than this core's own
    /// provider placing what came off a socket: worth looking at between passes (see
    /// `RingWatcher::watches_memory`).
    pub(super) peer_stores: bool,
    /// Where the waited-for message starts, while on the core's watch list.
    pub(super) watch_at: Cell<usize>,
    pub(super) watched: Cell<bool>,
}

impl RxState {
    /// Receives this half keeps in the connection's pool: announced runs need one for every
    /// message the peer may have in flight; a polled ring only the close notice's, and a few.
    pub(super) fn recvs(&self) -> usize {
        if self.polled {
            4
        } else {
            self.capacity as usize + 4
        }
    }

    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// The slot at `at`, checked once for the accesses that read or clear it.
    #[inline(always)]
    pub(super) fn slot_at(&self, at: usize) -> Span<'_> {
        self.ring.span(at, self.slot)
    }

    /// Polled rings: clears the slot at `at` (`slot`, its span) once its message of `len`
    /// bytes is taken, so that the next mark seen there is new. With `fixed` (every message of
    /// this channel has `len` bytes, `Codec::FIXED_LEN`) the next message's mark lands where
    /// this one's was, so the length and mark words are all there is to clear; otherwise the
    /// slot is zeroed as far as the sender may have written (a run carries whole slots, a lone
    /// large-slot message only its extent).
    #[inline(always)]
    pub(super) fn clear_taken(&self, slot: &Span<'_>, at: usize, len: usize, fixed: bool) {
        if fixed {
            slot.store_u32_le(0, 0);
            slot.store_u32_le(extent(len) - MARK_LEN, 0);
            return;
        }
        self.clear_slot(at, len);
    }

    /// `clear_taken` for a message of a length the next one need not share.
    #[inline(never)]
    fn clear_slot(&self, at: usize, len: usize) {
        let written = if self.slot <= super::COALESCE_MAX_SLOT {
            self.slot
        } else {
            extent(len)
        };
        self.ring.zero(at, written);
    }

    /// Polled rings: what the slot at `at` holds. A transport that lets memory be watched
    /// places a WRITE's bytes in ascending order (the software provider in stream order, shm
    /// by an ordered copy), so a message's length word lands before the message and its mark
    /// after; a sender that stores straight into a mapped ring (shm) puts the message and its
    /// mark in first and sets the length word's `LEN_SET` last. A consumed slot is zeroed, so
    /// a length that reads as set is this message's, and with the mark at the end it gives
    /// read too, the message has fully landed, whichever way it came. A length too large for
    /// the slot is the peer's fault, for `recv` to report.
    ///
    /// The slot is checked once, and its length word loaded once: the receiver takes a
    /// landed message through the span this hands back.
    #[inline(always)]
    pub(super) fn look(&self, at: usize) -> Look<'_> {
        let slot = self.slot_at(at);
        let Some(len) = length(slot.load_u32_le(0)) else {
            return Look::Landing;
        };
        if len > self.slot - extent(0) {
            return Look::Oversized;
        }
        if slot.load_u32_le(extent(len) - MARK_LEN) != MARK {
            return Look::Landing;
        }
        Look::Landed(len, slot)
    }

    /// Polled rings: whether the slot at `at` is ready for `recv` (see [`look`](Self::look)):
    /// its message has fully landed, or its length word is one to report.
    #[inline]
    pub(super) fn landed(&self, at: usize) -> bool {
        !matches!(self.look(at), Look::Landing)
    }
}

/// What a polled ring's slot holds (see [`RxState::look`]).
pub(super) enum Look<'a> {
    /// Nothing yet, or a message still landing.
    Landing,
    /// A length word the slot cannot hold.
    Oversized,
    /// A message of this many bytes, all of it in, and the slot it is in.
    Landed(usize, Span<'a>),
}

thread_local! {
    /// This core's receivers of polled rings that wait for a message, each with whether its
    /// peer stores into it (`RxState::peer_stores`).
    static WATCHED: RefCell<Vec<(Weak<RxState>, bool)>> = const { RefCell::new(Vec::new()) };
    /// How many of them the peer stores into.
    static STORED_INTO: Cell<usize> = const { Cell::new(0) };
    static WATCHER: Cell<u64> = const { Cell::new(0) };
}

/// Puts a receiver that waits for the message at `at` on the core's watch list.
pub(super) fn watch(st: &Rc<RxState>, at: usize) {
    st.watch_at.set(at);
    if st.watched.replace(true) {
        return;
    }
    if st.peer_stores {
        STORED_INTO.with(|n| n.set(n.get() + 1));
    }
    WATCHED.with(|w| w.borrow_mut().push((Rc::downgrade(st), st.peer_stores)));
    let token = barewire_engine::core_token();
    if WATCHER.with(|t| t.replace(token)) != token {
        barewire_engine::register_poller(Box::new(RingWatcher));
    }
}

/// Looks, in every pass, at the next slot of each polled ring whose receiver waits, and wakes
/// the receiver once its message has landed. It is registered after the provider's poller
/// (a ring exists only once a connection does), so a message is seen in the pass that placed
/// it, as a NIC user polling memory would; before the core sleeps it looks once more, and the
/// next arrival wakes the core through the provider's socket.
pub(super) struct RingWatcher;

impl RingWatcher {
    pub(super) fn scan(&self) -> bool {
        WATCHED.with(|w| {
            let mut any = false;
            w.borrow_mut().retain(|(st, stored)| {
                let off = || {
                    if *stored {
                        STORED_INTO.with(|n| n.set(n.get() - 1));
                    }
                    false
                };
                let Some(st) = st.upgrade() else {
                    return off();
                };
                let waiting = st.waker.any();
                if waiting && !st.landed(st.watch_at.get()) {
                    return true;
                }
                off();
                st.watched.set(false);
                if waiting {
                    any = true;
                    st.wake();
                }
                false
            });
            any
        })
    }
}

impl barewire_engine::Poller for RingWatcher {
    fn poll(&mut self) -> bool {
        self.scan()
    }

    fn pure_poll(&mut self) -> bool {
        WATCHED.with(|w| {
            w.borrow()
                .iter()
                .any(|(st, _)| st.upgrade().is_some_and(|st| st.landed(st.watch_at.get())))
        })
    }

    fn try_enter_interrupt_mode(&mut self) -> bool {
        !self.scan()
    }

    /// While a receiver waits on a ring its peer stores into (shm): a store from the other
    /// process is then seen within one of the idle core's looks. A ring the core's own
    /// provider fills (soft) gains nothing from them.
    fn watches_memory(&self) -> bool {
        STORED_INTO.with(|n| n.get() > 0)
    }
}

impl Arrival for RxState {
    fn arrived(&self, _credit: bool, count: Option<usize>) {
        match count {
            Some(n) => self.arrived.set(self.arrived.get() + n as u64),
            None => self.closed.set(true),
        }
        self.wake();
    }
}
