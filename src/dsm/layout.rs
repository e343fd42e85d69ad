//! Where a shared object's words live in its home's block, and what the lock word holds.
//!
//! A *word object* (any `T` of exactly 8 bytes, alignment at most 8) is its value and nothing
//! else: one `u64` slot that only ever changes by an RDMA atomic, so every READ of it sees a
//! whole value.
//!
//! A *wide object* (any other `T`) is a slot of `3 + P/8` words, `P` being `size_of::<T>()`
//! rounded up to 8:
//!
//! ```text
//! word 0        lock word W: version (32 bits) | epoch (16) | owner (16)
//! word 1        the version the data below holds
//! words 2..     the data, P bytes
//! last word     check: xxh3-64 of the data, seeded with that version
//! ```
//!
//! A reader takes the whole slot with one READ and accepts it only when the data's version
//! equals W's and the check matches (see the module above for why that is enough).

use bytemuck::Pod;

/// Owner field of a free lock word.
pub(crate) const FREE: u16 = 0;
/// Owner field while the home applies a commit: never broken, gone in nanoseconds.
pub(crate) const APPLYING: u16 = 0xffff;

/// The lock word: version, epoch (bumped by every acquisition, so a waiter can tell a lock that
/// was released and taken again from one that was held all along) and owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockWord(pub(crate) u64);

impl LockWord {
    pub(crate) fn new(version: u32, epoch: u16, owner: u16) -> LockWord {
        LockWord((version as u64) << 32 | (epoch as u64) << 16 | owner as u64)
    }
    pub(crate) fn version(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub(crate) fn epoch(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub(crate) fn owner(self) -> u16 {
        self.0 as u16
    }
    /// The word that acquiring it as `owner` installs (from a free word, or by breaking an
    /// expired holder's).
    pub(crate) fn acquired_by(self, owner: u16) -> LockWord {
        LockWord::new(self.version(), self.epoch().wrapping_add(1), owner)
    }
    /// The word a successful commit leaves: next version, free.
    pub(crate) fn committed(self) -> LockWord {
        LockWord::new(self.version().wrapping_add(1), self.epoch(), FREE)
    }
    pub(crate) fn applying(self) -> LockWord {
        LockWord::new(self.version(), self.epoch(), APPLYING)
    }
}

/// The shape of one object of `T` in its home's block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `size_of::<T>()`.
    pub(crate) size: usize,
    /// Words per slot (1 for a word object).
    pub(crate) stride: usize,
    pub(crate) wide: bool,
}

impl Layout {
    pub(crate) fn of<T: Pod>() -> Layout {
        let size = std::mem::size_of::<T>();
        if size == 8 && std::mem::align_of::<T>() <= 8 {
            Layout {
                size,
                stride: 1,
                wide: false,
            }
        } else {
            Layout {
                size,
                stride: 3 + size.div_ceil(8),
                wide: true,
            }
        }
    }

    /// Data words of a wide slot.
    pub(crate) fn data_words(&self) -> usize {
        self.stride - 3
    }

    /// The slot's words for `value` at `version` (wide objects), lock word free.
    pub(crate) fn encode<T: Pod>(&self, lock: LockWord, version: u32, value: &T) -> Vec<u64> {
        let mut words = vec![0u64; self.stride];
        words[0] = lock.0;
        words[1] = version as u64;
        let data: &mut [u8] = bytemuck::cast_slice_mut(&mut words[2..2 + self.data_words()]);
        data[..self.size].copy_from_slice(bytemuck::bytes_of(value));
        words[self.stride - 1] = check(version, &words[2..2 + self.data_words()]);
        words
    }

    /// The data words of a wide slot and their check, for a commit at `version`.
    pub(crate) fn data_and_check(&self, version: u32, value: &[u8]) -> Vec<u64> {
        let mut words = vec![0u64; self.data_words() + 1];
        let data: &mut [u8] = bytemuck::cast_slice_mut(&mut words[..self.data_words()]);
        data[..value.len()].copy_from_slice(value);
        let n = self.data_words();
        words[n] = check(version, &words[..n]);
        words
    }

    /// A wide slot as read: its lock word and, when the data is whole and of W's version,
    /// the value. `None`: torn or mid-commit; read again.
    pub(crate) fn decode<T: Pod>(&self, words: &[u64]) -> (LockWord, Option<T>) {
        let w = LockWord(words[0]);
        let version = words[1];
        let data = &words[2..2 + self.data_words()];
        if version != w.version() as u64 || words[self.stride - 1] != check(w.version(), data) {
            return (w, None);
        }
        let mut v = T::zeroed();
        let bytes: &[u8] = bytemuck::cast_slice(data);
        bytemuck::bytes_of_mut(&mut v).copy_from_slice(&bytes[..self.size]);
        (w, Some(v))
    }
}

impl Layout {
    /// The broken test variant's read: the data words as they are, no version, no check.
    pub(crate) fn decode_unchecked<T: Pod>(&self, words: &[u64]) -> (LockWord, T) {
        let mut v = T::zeroed();
        let bytes: &[u8] = bytemuck::cast_slice(&words[2..2 + self.data_words()]);
        bytemuck::bytes_of_mut(&mut v).copy_from_slice(&bytes[..self.size]);
        (LockWord(words[0]), v)
    }
}

/// The check word of a wide slot: a 64-bit hash of its data seeded with its version, so a
/// READ that caught parts of two commits (or a version's data under another version) fails it
/// with probability 1 - 2^-64.
pub(crate) fn check(version: u32, data: &[u64]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(bytemuck::cast_slice(data), version as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_words_pack_and_transition() {
        let w = LockWord::new(7, 3, FREE);
        assert_eq!((w.version(), w.epoch(), w.owner()), (7, 3, FREE));
        let held = w.acquired_by(12);
        assert_eq!((held.version(), held.epoch(), held.owner()), (7, 4, 12));
        let broken = held.acquired_by(13);
        assert_ne!(broken, held);
        assert_eq!(held.committed(), LockWord::new(8, 4, FREE));
        assert_eq!(held.applying().owner(), APPLYING);
        assert_eq!(LockWord::new(1, u16::MAX, 5).acquired_by(6).epoch(), 0);
    }

    #[test]
    fn word_and_wide_layouts() {
        assert!(!Layout::of::<u64>().wide);
        assert!(!Layout::of::<[u8; 8]>().wide);
        assert_eq!(Layout::of::<u64>().stride, 1);
        let l = Layout::of::<[u32; 5]>();
        assert!(l.wide);
        assert_eq!(l.stride, 3 + 3);
        assert!(Layout::of::<[u8; 4]>().wide);
    }

    #[test]
    fn a_slot_decodes_only_when_whole_and_current() {
        let l = Layout::of::<[u64; 4]>();
        let w = LockWord::new(5, 0, FREE);
        let words = l.encode(w, 5, &[1u64, 2, 3, 4]);
        assert_eq!(l.decode::<[u64; 4]>(&words), (w, Some([1, 2, 3, 4])));
        // Held by someone: still readable, the holder has not committed.
        let mut held = words.clone();
        held[0] = w.acquired_by(9).0;
        assert_eq!(l.decode::<[u64; 4]>(&held).1, Some([1, 2, 3, 4]));
        // Data of version 6 under a lock word still at 5 (mid-commit).
        let mut next = l.encode(w, 6, &[9u64, 9, 9, 9]);
        next[0] = w.0;
        assert_eq!(l.decode::<[u64; 4]>(&next).1, None);
        // A torn mix of two versions' data.
        let newer = l.encode(w.committed(), 6, &[9u64, 9, 9, 9]);
        let mut torn = newer.clone();
        torn[2] = words[2];
        assert_eq!(l.decode::<[u64; 4]>(&torn).1, None);
        let mut torn = words.clone();
        torn[4] = newer[4];
        assert_eq!(l.decode::<[u64; 4]>(&torn).1, None);
    }
}
