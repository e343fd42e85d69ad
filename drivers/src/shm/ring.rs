//! The shared message ring of one direction of a queue pair: Sends, the notices of Writes with
//! immediate data, and revocations travel through it in posting order. The receiver creates it
//! (a sealed memfd) and hands it to the writer at connection setup; both map it.
//!
//! Layout: a header of three cache lines (the writer's tail; the reader's head and how far it
//! has looked; and three flags: "reader asleep", "writer waits for room", "reader watches its
//! memory"), then `cap` bytes of records. A record is a 16-byte
//! header and its payload padded to 16 bytes; one that would not fit before the end is
//! preceded by a padding record to the end. Positions count bytes forever (u64), so
//! `tail - head` is the fill.
//!
//! The writer may be hostile: the reader keeps its own head, checks every header it reads
//! (kind, length, that the record lies within what the tail published) and treats anything
//! else as a protocol error that ends the connection. Payload bytes are only copied.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::mem::MemFile;

pub(crate) mod fuzz;

/// Header bytes before the records.
pub(crate) const HEADER: usize = 256;
const TAIL: usize = 0;
const HEAD: usize = 64;
/// How far the reader has looked: records up to here wait for a posted receive (the reader
/// runs, and will take them once it has one). On the head's line, which only the reader writes.
const SEEN: usize = 72;
const READER_ASLEEP: usize = 128;
const WRITER_WAITS: usize = 132;
const READER_WATCHES: usize = 136;
const REC: usize = 16;

/// Record kinds.
pub(crate) const SEND: u8 = 1;
pub(crate) const IMM: u8 = 2;
pub(crate) const REVOKE: u8 = 3;
const PAD: u8 = 4;

/// Record flags.
pub(crate) const LAST: u8 = 1;
pub(crate) const SOLICITED: u8 = 2;
/// On a Send's last fragment: the receiver invalidates the STag in `value` (Send with
/// Invalidate).
pub(crate) const INVALIDATE: u8 = 4;

/// Smallest and largest ring the reader may offer.
pub(crate) const MIN_CAP: usize = 64 << 10;
pub(crate) const MAX_CAP: usize = 64 << 20;

/// What a hostile writer can do to a ring it maps, for the live queue pair tests: a header of
/// its choosing at any position, and any tail.
#[cfg(test)]
impl Writer {
    pub(crate) fn forge(&self, pos: u64, kind: u8, flags: u8, len: u32, value: u32) {
        self.write_header(pos, kind, flags, len, value);
    }

    pub(crate) fn publish(&self, tail: u64) {
        self.ring.word(TAIL).store(tail, Ordering::Release);
    }
}

/// One record's header as the reader sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Record {
    pub kind: u8,
    pub flags: u8,
    /// Payload bytes (a Send fragment), or the Write's length (IMM).
    pub len: u32,
    /// Immediate data (IMM), or the STag (REVOKE).
    pub value: u32,
}

fn pad16(n: usize) -> usize {
    n.div_ceil(REC) * REC
}

/// A mapped ring: the header words and the record area.
pub(crate) struct Ring {
    base: *mut u8,
    cap: usize,
    /// Keeps the mapping (the receiver's own file, or the writer's mapping of it).
    _keep: Keep,
}

pub(crate) enum Keep {
    File(Arc<MemFile>),
    /// Held for its Drop (the unmapping).
    Mapping(#[allow(dead_code)] super::mem::Mapping),
    /// Ordinary memory shared by both ends in one process (the fuzz harness, and the tests
    /// under Miri, which cannot make a memfd). Held for its Drop (the freeing).
    Heap(#[allow(dead_code)] std::rc::Rc<Heap>),
}

impl Ring {
    /// A new ring of `cap` bytes (a power of two within the limits), owned by the reader.
    pub(crate) fn create(cap: usize) -> Result<Ring, crate::DriverError> {
        debug_assert!(cap.is_power_of_two() && (MIN_CAP..=MAX_CAP).contains(&cap));
        let f = MemFile::create_unlisted(HEADER + cap)?;
        Ok(Ring {
            base: f.ptr(),
            cap,
            _keep: Keep::File(f),
        })
    }

    /// The writer's view of a ring the reader sent.
    pub(crate) fn from_mapping(m: super::mem::Mapping, cap: usize) -> Ring {
        Ring {
            base: m.at(0, (HEADER + cap) as u64).expect("mapped whole"),
            cap,
            _keep: Keep::Mapping(m),
        }
    }

    /// The reader's file, to send to the writer.
    pub(crate) fn file(&self) -> Option<&Arc<MemFile>> {
        match &self._keep {
            Keep::File(f) => Some(f),
            _ => None,
        }
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: an aligned word of the header, inside the mapping this ring keeps.
        unsafe { &*(self.base.add(at) as *const AtomicU64) }
    }

    fn flag(&self, at: usize) -> &AtomicU32 {
        // SAFETY: as `word`.
        unsafe { &*(self.base.add(at) as *const AtomicU32) }
    }

    fn data(&self, pos: u64) -> *mut u8 {
        // SAFETY: pos modulo cap lies in the record area.
        unsafe { self.base.add(HEADER + (pos as usize & (self.cap - 1))) }
    }

    /// The largest Send fragment one record carries.
    pub(crate) fn max_fragment(&self) -> usize {
        self.cap / 4
    }
}

/// The writer's side.
pub(crate) struct Writer {
    ring: Ring,
    tail: u64,
    /// The reader's head as last seen.
    head: u64,
}

impl Writer {
    pub(crate) fn new(ring: Ring) -> Writer {
        Writer {
            ring,
            tail: 0,
            head: 0,
        }
    }

    pub(crate) fn max_fragment(&self) -> usize {
        self.ring.max_fragment()
    }

    /// Room for a record of `payload` bytes now (re-reading the reader's head if needed).
    fn room(&mut self, payload: usize) -> Option<u64> {
        let need = REC + pad16(payload);
        let at = self.tail as usize & (self.ring.cap - 1);
        let total = if at + need > self.ring.cap {
            need + (self.ring.cap - at)
        } else {
            need
        };
        let (cap, tail) = (self.ring.cap as u64, self.tail);
        let fits = |head: u64| cap - (tail - head) >= total as u64;
        // The reader's head is read again only when the one last seen leaves too little.
        if !fits(self.head) && !fits(self.consumed()) {
            return None;
        }
        if at + need > self.ring.cap {
            self.write_header(self.tail, PAD, 0, (self.ring.cap - at - REC) as u32, 0);
            self.tail += (self.ring.cap - at) as u64;
        }
        Some(self.tail)
    }

    fn write_header(&self, pos: u64, kind: u8, flags: u8, len: u32, value: u32) {
        let mut h = [0u8; REC];
        h[0..4].copy_from_slice(&len.to_le_bytes());
        h[4] = kind;
        h[5] = flags;
        h[8..12].copy_from_slice(&value.to_le_bytes());
        // SAFETY: a free record slot in the mapped area (room checked), owned by the writer
        // until the tail is published.
        unsafe { std::ptr::copy_nonoverlapping(h.as_ptr(), self.ring.data(pos), REC) }
    }

    /// Appends a record with `body` payload bytes (written by `fill` at the given pointer)
    /// and header fields `len` and `value`, or returns false when the ring has no room (after
    /// asking the reader to wake us once it frees some).
    pub(crate) fn push(
        &mut self,
        kind: u8,
        flags: u8,
        body: usize,
        len: u32,
        value: u32,
        fill: impl FnOnce(*mut u8),
    ) -> bool {
        debug_assert!(body <= self.max_fragment());
        let Some(pos) = self.room(body).or_else(|| {
            // Ask to be woken when the reader frees room, then look once more (the reader may
            // have moved between our look and the flag).
            self.wake_when_consumed();
            self.room(body)
        }) else {
            return false;
        };
        self.write_header(pos, kind, flags, len, value);
        if body > 0 {
            fill(self.ring.data(pos + REC as u64));
        }
        self.tail = pos + (REC + pad16(body)) as u64;
        self.ring.word(TAIL).store(self.tail, Ordering::Release);
        true
    }

    /// Where the reader has consumed up to (records before it have been taken): its published
    /// head, believed only within what it could have taken (from what this side saw before to
    /// this side's tail), so a hostile reader can claim no more than it was sent.
    pub(crate) fn consumed(&mut self) -> u64 {
        let h = self.ring.word(HEAD).load(Ordering::Acquire);
        if h >= self.head && h <= self.tail {
            self.head = h;
        }
        self.head
    }

    /// Where the reader has looked up to: what it has consumed, or seen and holds for want of
    /// a posted receive (it is running). Records past it have not been looked at since they
    /// were published. Like the head, believed only within what was sent.
    pub(crate) fn acknowledged(&mut self) -> u64 {
        let seen = self.ring.word(SEEN).load(Ordering::Acquire);
        let consumed = self.consumed();
        if seen > consumed && seen <= self.tail {
            seen
        } else {
            consumed
        }
    }

    /// The end of what this side has published.
    pub(crate) fn tail(&self) -> u64 {
        self.tail
    }

    /// Asks the reader to wake this side when it next consumes a record (the flag a full ring
    /// uses); the caller then looks at [`consumed`](Self::consumed) once more, since the reader
    /// may have moved between its last look and the flag.
    pub(crate) fn wake_when_consumed(&self) {
        self.ring.flag(WRITER_WAITS).store(1, Ordering::SeqCst);
        // Ordered before the head is read again, against the reader's store of the head and
        // its read of this flag (the reader fences the same way).
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// True when the reader asked to watch its memory (`Reader::watch`): Writes to it are then
    /// copied in ascending order and followed by a look at `reader_asleep`.
    pub(crate) fn reader_watches(&self) -> bool {
        self.ring.flag(READER_WATCHES).load(Ordering::Relaxed) != 0
    }

    /// True when the reader said it sleeps (after a publish: the caller then wakes it).
    pub(crate) fn reader_asleep(&self) -> bool {
        std::sync::atomic::fence(Ordering::SeqCst);
        self.ring.flag(READER_ASLEEP).load(Ordering::Relaxed) != 0
    }
}

/// Why a ring could not be read.
#[derive(Debug)]
pub(crate) struct Corrupt(pub &'static str);

/// The reader's side.
pub(crate) struct Reader {
    ring: Ring,
    head: u64,
    /// The tail last published as seen ([`waits`](Self::waits)).
    seen: u64,
}

impl Reader {
    pub(crate) fn new(ring: Ring) -> Reader {
        Reader {
            ring,
            head: 0,
            seen: 0,
        }
    }

    fn tail(&self) -> Result<u64, Corrupt> {
        let t = self.ring.word(TAIL).load(Ordering::Acquire);
        if t < self.head || t - self.head > self.ring.cap as u64 {
            return Err(Corrupt("the writer's tail is outside the ring"));
        }
        Ok(t)
    }

    /// Whether the writer asked to be woken when this side next consumes (for the tests).
    #[cfg(test)]
    pub(crate) fn writer_waits(&self) -> bool {
        self.ring.flag(WRITER_WAITS).load(Ordering::SeqCst) != 0
    }

    /// True if a record is waiting that this side has not looked at (records it holds for
    /// want of a receive are taken when one is posted, with nothing to wake for).
    pub(crate) fn has_data(&self) -> bool {
        self.ring.word(TAIL).load(Ordering::Acquire) != self.head.max(self.seen)
    }

    /// The front record waits for a posted receive: tells the writer that this side runs and
    /// has looked at everything published so far (so its Sends wait, as verbs' wait for a
    /// responder with no receive, rather than fail as sent to a stopped peer).
    pub(crate) fn waits(&mut self) {
        let t = self.ring.word(TAIL).load(Ordering::Acquire);
        if t != self.seen {
            self.seen = t;
            self.ring.word(SEEN).store(t, Ordering::Release);
        }
    }

    /// The next record (padding skipped), with a pointer to its payload, without consuming it.
    pub(crate) fn peek(&mut self) -> Result<Option<(Record, *const u8)>, Corrupt> {
        loop {
            let tail = self.tail()?;
            if tail == self.head {
                return Ok(None);
            }
            let at = self.head as usize & (self.ring.cap - 1);
            if self.ring.cap - at < REC || tail - self.head < REC as u64 {
                return Err(Corrupt("a record header crosses the end"));
            }
            let mut h = [0u8; REC];
            // SAFETY: a published record header inside the area.
            unsafe { std::ptr::copy_nonoverlapping(self.ring.data(self.head), h.as_mut_ptr(), REC) }
            let rec = Record {
                len: u32::from_le_bytes(h[0..4].try_into().unwrap()),
                kind: h[4],
                flags: h[5],
                value: u32::from_le_bytes(h[8..12].try_into().unwrap()),
            };
            let body = match rec.kind {
                PAD => {
                    if rec.len as usize != self.ring.cap - at - REC {
                        return Err(Corrupt("padding that does not reach the end"));
                    }
                    self.head += (self.ring.cap - at) as u64;
                    continue;
                }
                SEND => rec.len as usize,
                IMM | REVOKE => 0,
                _ => return Err(Corrupt("an unknown record kind")),
            };
            if body > self.ring.max_fragment()
                || at + REC + pad16(body) > self.ring.cap
                || (REC + pad16(body)) as u64 > tail - self.head
            {
                return Err(Corrupt("a record longer than what was published"));
            }
            return Ok(Some((rec, self.ring.data(self.head + REC as u64))));
        }
    }

    /// Consumes the record `peek` returned. Returns true if the writer waits for room (the
    /// caller then wakes it).
    pub(crate) fn consume(&mut self, rec: &Record) -> bool {
        let body = if rec.kind == SEND {
            rec.len as usize
        } else {
            0
        };
        self.head += (REC + pad16(body)) as u64;
        self.ring.word(HEAD).store(self.head, Ordering::Release);
        std::sync::atomic::fence(Ordering::SeqCst);
        self.ring.flag(WRITER_WAITS).load(Ordering::Relaxed) != 0
            && self.ring.flag(WRITER_WAITS).swap(0, Ordering::AcqRel) != 0
    }

    /// Says the reader is about to sleep; false if a record is already waiting (then it must
    /// not).
    pub(crate) fn sleep(&self) -> bool {
        self.ring.flag(READER_ASLEEP).store(1, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        !self.has_data()
    }

    /// Asks the writer to place its Writes in ascending order and to wake this reader after
    /// each one (see `QueuePair::watch_memory`). Stays set. The writer learns of it before any
    /// message this reader sends after the call (the message's tail store releases it).
    pub(crate) fn watch(&self) {
        self.ring.flag(READER_WATCHES).store(1, Ordering::SeqCst);
    }

    /// The reader is awake again.
    pub(crate) fn wake(&self) {
        self.ring.flag(READER_ASLEEP).store(0, Ordering::Relaxed);
    }
}

/// Ordinary zeroed memory holding one ring in this process, with [`Heap::GUARD`] bytes of
/// [`Heap::FILL`] before and after it, freed when the last end lets go.
pub(crate) struct Heap {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Heap {
    /// Guard bytes either side of the ring (a multiple of the ring's 64-byte alignment).
    pub(crate) const GUARD: usize = 64;
    pub(crate) const FILL: u8 = 0xa5;

    /// A ring of `cap` bytes (a power of two within the limits) and its two ends.
    pub(crate) fn pair(cap: usize) -> (Writer, Reader, std::rc::Rc<Heap>) {
        assert!(cap.is_power_of_two() && (MIN_CAP..=MAX_CAP).contains(&cap));
        let len = HEADER + cap + 2 * Self::GUARD;
        let layout = std::alloc::Layout::from_size_align(len, 64).expect("a valid layout");
        // SAFETY: the layout's size is not zero.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        // SAFETY: the guards lie inside the allocation: [0, GUARD) and [len - GUARD, len).
        unsafe {
            std::ptr::write_bytes(ptr, Self::FILL, Self::GUARD);
            std::ptr::write_bytes(ptr.add(len - Self::GUARD), Self::FILL, Self::GUARD);
        }
        let heap = std::rc::Rc::new(Heap { ptr, layout });
        // SAFETY: the ring starts after the first guard, inside the allocation.
        let base = unsafe { ptr.add(Self::GUARD) };
        let end = |keep| Ring {
            base,
            cap,
            _keep: Keep::Heap(keep),
        };
        let (w, r) = (end(heap.clone()), end(heap.clone()));
        (Writer::new(w), Reader::new(r), heap)
    }

    /// True while both guards hold only what was put there: nothing wrote outside the ring.
    pub(crate) fn guards_intact(&self) -> bool {
        let len = self.layout.size();
        // SAFETY: the allocation is `len` bytes and lives as long as `self`; only this
        // process's two ends write to it, and not during this call.
        let all = unsafe { std::slice::from_raw_parts(self.ptr, len) };
        let (head, tail) = (&all[..Self::GUARD], &all[len - Self::GUARD..]);
        head.iter().chain(tail).all(|&b| b == Self::FILL)
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: allocated in `pair` with this layout, and freed once, by the last owner.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reproducible stream of pseudo-random words (xorshift64).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// A ring's two ends over one area. The area is a memfd as in a connection, or under Miri
    /// (which cannot make one) ordinary memory: the ring's code sees a pointer either way.
    fn pair(cap: usize) -> (Writer, Reader) {
        if cfg!(miri) {
            let (w, r, _) = Heap::pair(cap);
            return (w, r);
        }
        let r = Ring::create(cap).unwrap();
        let w = Ring {
            base: r.base,
            cap,
            _keep: Keep::File(r.file().unwrap().clone()),
        };
        (Writer::new(w), Reader::new(r))
    }

    #[test]
    fn records_come_out_in_order_across_the_wrap_and_a_full_ring_refuses() {
        let (mut w, mut r) = pair(MIN_CAP);
        let mut sent = 0u32;
        let mut got = 0u32;
        // (Under Miri, which interprets every byte's copy, fewer rounds: still several wraps.)
        for round in 0..if cfg!(miri) { 60 } else { 2000usize } {
            let len = (round * 7919) % w.max_fragment();
            while !w.push(SEND, LAST, len, len as u32, sent, |p| {
                // SAFETY: the record's payload area of `len` bytes.
                unsafe { std::ptr::write_bytes(p, sent as u8, len) }
            }) {
                // Full: drain one and retry.
                let (rec, body) = r.peek().unwrap().expect("full means something is there");
                assert_eq!(rec.value, got);
                let mut b = vec![0u8; rec.len as usize];
                // SAFETY: the record's payload.
                unsafe { std::ptr::copy_nonoverlapping(body, b.as_mut_ptr(), b.len()) };
                assert!(b.iter().all(|&x| x == got as u8));
                r.consume(&rec);
                got += 1;
            }
            sent += 1;
        }
        while let Some((rec, _)) = r.peek().unwrap() {
            assert_eq!(rec.value, got);
            r.consume(&rec);
            got += 1;
        }
        assert_eq!(got, sent);
    }

    #[test]
    fn a_forged_header_is_a_protocol_error_not_a_read_out_of_bounds() {
        let (mut w, mut r) = pair(MIN_CAP);
        assert!(w.push(SEND, LAST, 16, 16, 0, |_| {}));
        // The writer rewrites the published header with a length past the tail.
        w.write_header(0, SEND, LAST, 40_000, 0);
        assert!(r.peek().is_err());
        // A tail beyond the ring.
        let (_, mut r) = pair(MIN_CAP);
        r.ring.word(TAIL).store(u64::MAX, Ordering::Release);
        assert!(r.peek().is_err());
    }

    /// A reader that writes anything into the words the writer reads (its head and how far it
    /// has looked: behind, ahead of what was sent, or anywhere) moves the writer only within
    /// what it sent: what the writer believes consumed never goes back and never passes its
    /// tail, so it never has more than a ring's worth outstanding and never writes over a
    /// record it believes unread.
    #[test]
    fn a_hostile_reader_moves_the_writer_only_within_what_it_sent() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let cap = MIN_CAP as u64;
        let (mut w, r) = pair(MIN_CAP);
        let (mut believed, mut pushed, mut refused, mut moved) = (0u64, 0, 0, 0);
        for i in 0..if cfg!(miri) { 300 } else { 20_000 } {
            let tail = w.tail();
            // Stretches of 64 steps in which the reader is silent (the ring fills) alternate
            // with stretches of claims.
            let silent = (i / 64) % 2 == 0;
            let claim = match if silent { 5 } else { next() % 6 } {
                0 => next(),
                1 => tail.wrapping_sub(next() % (2 * cap)),
                2 => tail + next() % 4096,
                3 => believed + next() % (tail - believed + 1),
                _ => u64::MAX,
            };
            if claim != u64::MAX {
                let word = if next() % 3 == 0 { SEEN } else { HEAD };
                r.ring.word(word).store(claim, Ordering::Release);
            }
            let body = (next() % 4096) as usize;
            if w.push(SEND, LAST, body, body as u32, 0, |_| {}) {
                pushed += 1;
            } else {
                refused += 1;
            }
            let c = w.consumed();
            assert!(
                c >= believed && c <= w.tail(),
                "believed {c} consumed, after {believed}, with {} sent",
                w.tail()
            );
            moved += (c > believed) as u32;
            believed = c;
            let a = w.acknowledged();
            assert!(a >= c && a <= w.tail(), "acknowledged {a} of {}", w.tail());
            assert!(w.tail() - c <= cap, "{} bytes outstanding", w.tail() - c);
        }
        // Every kind of step happened: records went in, a full ring refused one, and the
        // reader's honest claims moved the writer on.
        assert!(
            pushed > 0 && refused > 0 && moved > 0,
            "{pushed} {refused} {moved}"
        );
    }

    /// A writer that writes anything anywhere: random record headers (kinds, flags and lengths
    /// both plausible and not) over the whole area, random bytes between them, and a random tail,
    /// after a random number of honest records has moved the reader's head (so reads wrap). The
    /// reader must stop with `Ok(None)` or an error, every record it hands out must lie inside
    /// the area and inside what the tail published, and it must never panic.
    #[test]
    fn a_hostile_writer_cannot_move_the_reader_outside_what_it_published() {
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        let cap = MIN_CAP;
        let (mut outcomes_none, mut outcomes_err, mut records) = (0, 0, 0);
        for _ in 0..if cfg!(miri) { 100 } else { 2000 } {
            let (mut w, mut r) = pair(cap);
            // Honest traffic first, consumed, to put the head anywhere (16-byte aligned).
            for _ in 0..next() % 64 {
                let body = (next() % 8192) as usize;
                assert!(w.push(SEND, LAST, body, body as u32, 0, |_| {}));
                let (rec, _) = r.peek().unwrap().unwrap();
                r.consume(&rec);
            }
            let head = r.head;
            // Then a chain of records from the head, each of a random kind (the four known
            // ones more often than not) and length (plausible, cut to reach the end of the area,
            // or anything), laid end to end as an honest writer would place them...
            let mut pos = head;
            for _ in 0..next() % 32 {
                let kind = [SEND, SEND, IMM, REVOKE, PAD, 0, 5][(next() % 7) as usize];
                let left = cap - (pos as usize & (cap - 1)) - REC;
                let len = match next() % 4 {
                    0 => (next() % 64) as u32,
                    1 => (next() % (cap as u64 / 3)) as u32,
                    2 => left as u32,
                    _ => next() as u32,
                };
                w.write_header(pos, kind, (next() % 8) as u8, len, next() as u32);
                pos += match kind {
                    SEND => (REC + pad16(len as usize % (2 * cap))) as u64,
                    PAD => (left + REC) as u64,
                    _ => REC as u64,
                };
            }
            // ...then headers at random slots and random bytes anywhere.
            for _ in 0..next() % 64 {
                let at = (next() % cap as u64) & !15;
                let kind = (next() % 6) as u8;
                w.write_header(at, kind, (next() % 8) as u8, next() as u32 % 70_000, 0);
            }
            for _ in 0..next() % 64 {
                let at = (next() % cap as u64) as usize;
                // SAFETY: `at` lies in the record area of the ring this test mapped.
                unsafe { *r.ring.base.add(HEADER + at) = next() as u8 };
            }
            // A tail anywhere, behind the head, where the chain ended or near it, or near a full
            // ring.
            let tail = match next() % 6 {
                0 => next(),
                1 => head.wrapping_sub(next() % 64),
                2 => pos.wrapping_add(next() % 512).wrapping_sub(256),
                3 => head + cap as u64 - next() % 256,
                4 => head + next() % (cap as u64 + 64),
                _ => pos,
            };
            r.ring.word(TAIL).store(tail, Ordering::Release);
            let mut steps = 0;
            loop {
                match r.peek() {
                    Ok(None) => {
                        outcomes_none += 1;
                        break;
                    }
                    Err(_) => {
                        outcomes_err += 1;
                        break;
                    }
                    Ok(Some((rec, body))) => {
                        fuzz::assert_inside(&r, &rec, body);
                        r.consume(&rec);
                        records += 1;
                        steps += 1;
                        assert!(steps <= cap / REC, "more records than the ring holds");
                    }
                }
            }
        }
        // The cases reached every outcome, so the asserts above were exercised.
        assert!(outcomes_none > 0 && outcomes_err > 0 && records > 0);
    }
}
