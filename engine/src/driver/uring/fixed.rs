//! The registered file table: descriptors that operations name by slot.

use std::os::fd::RawFd;

use super::Uring;

impl Uring {
    /// Puts `fd` in a free slot of the registered file table: operations on it may then name
    /// the slot (`IOSQE_FIXED_FILE`) and the kernel skips looking the file up and counting a
    /// reference on it for each one. `None` when the table is full or absent. The table holds
    /// the file open until [`unregister_fixed`](Self::unregister_fixed).
    pub(crate) fn register_fixed(&self, fd: RawFd) -> Option<u32> {
        let slot = self.fixed_free.borrow_mut().pop()?;
        let ring = self.ring.borrow();
        match ring.submitter().register_files_update(slot, &[fd]) {
            Ok(1) => Some(slot),
            _ => {
                self.fixed_free.borrow_mut().push(slot);
                None
            }
        }
    }

    /// Slots of the registered file table in use.
    pub(crate) fn fixed_in_use(&self) -> u64 {
        (self.fixed_total.get() as usize - self.fixed_free.borrow().len()) as u64
    }

    /// Empties a slot of the registered file table (operations in flight keep their own
    /// reference to the file, so the slot is free at once).
    pub(crate) fn unregister_fixed(&self, slot: u32) {
        let ring = self.ring.borrow();
        if let Ok(1) = ring.submitter().register_files_update(slot, &[-1]) {
            self.fixed_free.borrow_mut().push(slot);
        }
    }

    /// Raw access for registration calls (buffers, buffer rings).
    pub(crate) fn with_submitter<R>(&self, f: impl FnOnce(&io_uring::Submitter<'_>) -> R) -> R {
        let ring = self.ring.borrow();
        f(&ring.submitter())
    }
}
