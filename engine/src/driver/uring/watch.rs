//! Readiness watches: foreign descriptors whose readability ends a sleeping core's wait.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types};

use super::{Uring, IGNORE_TOKEN, WATCH_BIT};

/// A foreign fd whose readiness wakes a sleeping core (`op::poll_fd::WakeSource`).
pub(super) struct Watch {
    fd: RawFd,
    /// Its multishot poll is in the kernel (or queued to go there).
    pub(super) armed: bool,
    /// Its owner dropped it: the slot goes when the poll's last completion comes.
    dropped: bool,
    /// The poll ended with this error; it is not armed again.
    failed: Option<i32>,
}

impl Uring {
    /// Starts a multishot poll for `fd`'s readability whose completions end the core's wait
    /// and wake no task (see `op::poll_fd::WakeSource`). Returns its slot.
    pub(crate) fn watch(&self, fd: RawFd) -> usize {
        let key = self.watches.borrow_mut().insert(Watch {
            fd,
            armed: false,
            dropped: false,
            failed: None,
        });
        self.arm_watch(key)
            .expect("a new watch has not failed, so it arms");
        key
    }

    /// Makes sure the watch's poll is in the kernel (the kernel ends a multishot poll now and
    /// then, for one when its completion queue overflows): the poll goes out with the next
    /// submission, the park's included. An error where the kernel ended it with one.
    pub(crate) fn arm_watch(&self, key: usize) -> io::Result<()> {
        let fd = {
            let mut watches = self.watches.borrow_mut();
            let w = &mut watches[key];
            if let Some(e) = w.failed {
                return Err(io::Error::from_raw_os_error(e));
            }
            if w.armed {
                return Ok(());
            }
            w.armed = true;
            w.fd
        };
        self.push(
            opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32)
                .multi(true)
                .build()
                .user_data(WATCH_BIT | key as u64),
        );
        Ok(())
    }

    /// The owner dropped the watch: cancel its poll, and free the slot once the kernel is done.
    pub(crate) fn unwatch(&self, key: usize) {
        let armed = {
            let mut watches = self.watches.borrow_mut();
            let Some(w) = watches.get_mut(key) else {
                return;
            };
            if !w.armed {
                watches.remove(key);
                return;
            }
            w.dropped = true;
            true
        };
        if armed {
            self.push(
                opcode::PollRemove::new(WATCH_BIT | key as u64)
                    .build()
                    .user_data(IGNORE_TOKEN),
            );
        }
    }

    pub(super) fn watch_completed(&self, key: usize, res: i32, flags: u32) {
        if io_uring::cqueue::more(flags) {
            return; // still armed
        }
        let mut watches = self.watches.borrow_mut();
        let Some(w) = watches.get_mut(key) else {
            return;
        };
        w.armed = false;
        if w.dropped {
            watches.remove(key);
        } else if res < 0 {
            w.failed = Some(-res);
        }
    }
}
