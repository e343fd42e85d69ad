//! Raw io_uring operations, for a completion source that runs its own state machines instead
//! of a task per operation (the software RDMA provider moves every queue pair's bytes this way).
//!
//! A [`RawQueue`] pushes SQEs onto the core's one ring, tagged with a 48-bit token of the
//! owner's choosing; their CQEs are not routed to wakers but collected per queue, and the owner
//! takes them in bulk with [`RawQueue::drain`]. Pushed from [`Poller::prepare_submit`], they go
//! out in the same `io_uring_enter` as everything else the pass submits, and a send or receive
//! flagged `MSG_DONTWAIT` is then done (its CQE posted) by the time that call returns: the
//! kernel touches the memory it names only inside the call, while nothing else runs. Not so
//! under SQPOLL (`Builder::sqpoll`): a kernel thread reads the entries whenever it gets to them,
//! so there every operation must own what it names until its completion; ask
//! [`RawQueue::completes_in_submit`].
//!
//! ```
//! use barewire_engine::uring::{opcode, types, RawQueue};
//! let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
//! rt.block_on(async {
//!     let Some(q) = RawQueue::new() else { return }; // an epoll core has no ring
//!     // SAFETY: a NOP names no memory.
//!     unsafe { q.push(opcode::Nop::new().build(), 7) };
//!     let mut done = Vec::new();
//!     while done.is_empty() {
//!         barewire_engine::yield_now().await; // a pass submits and reaps
//!         q.drain(&mut done);
//!     }
//!     assert_eq!((done[0].token, done[0].result), (7, 0));
//! });
//! ```
//!
//! [`Poller::prepare_submit`]: crate::Poller::prepare_submit

use std::marker::PhantomData;

pub use io_uring::{opcode, squeue, types};

use crate::core::{try_with_core, with_core};
use crate::driver::uring::{RAW_BIT, RAW_TOKEN_BITS};
use crate::driver::Driver;

/// `IORING_CQE_F_MORE`: a multishot operation stays armed after this completion.
pub const CQE_F_MORE: u32 = crate::driver::lifecycle::CQE_F_MORE;

/// The provided buffer a completion filled (`IORING_CQE_F_BUFFER` and its id), if any.
pub fn buffer_id(flags: u32) -> Option<u16> {
    (flags & 1 != 0).then_some((flags >> 16) as u16)
}

/// One completion of a raw operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The token it was pushed with.
    pub token: u64,
    /// The CQE's result: a count, or a negated errno.
    pub result: i32,
    /// The CQE's flags ([`CQE_F_MORE`], [`buffer_id`]).
    pub flags: u32,
}

/// A stream of raw operations on the current core's ring. `!Send`: it belongs to its core.
pub struct RawQueue {
    index: usize,
    _not_send: PhantomData<*const ()>,
}

impl RawQueue {
    /// Tokens must fit in this many bits.
    pub const TOKEN_BITS: u32 = RAW_TOKEN_BITS;

    /// A new queue on the current core, or `None` if the core's reactor is not io_uring.
    pub fn new() -> Option<RawQueue> {
        with_core(|c| match &c.driver {
            Driver::Uring(u) => Some(RawQueue {
                index: u.new_raw_queue(),
                _not_send: PhantomData,
            }),
            Driver::Epoll(_) => None,
        })
    }

    /// True if an operation that completes without waiting (a `MSG_DONTWAIT` send or receive)
    /// is done by the time the submission that carries it returns, so the memory it names need
    /// only live until then. False under SQPOLL, where a kernel thread submits on its own time.
    pub fn completes_in_submit(&self) -> bool {
        with_core(|c| match &c.driver {
            Driver::Uring(u) => u.flags != crate::UringFlags::SqPoll,
            Driver::Epoll(_) => true,
        })
    }

    fn user_data(&self, token: u64) -> u64 {
        assert!(token < 1 << RAW_TOKEN_BITS, "raw token over 48 bits");
        RAW_BIT | (self.index as u64) << RAW_TOKEN_BITS | token
    }

    /// Queues `entry`; its completions come back with `token` (under 2^48).
    ///
    /// # Safety
    /// Every pointer in `entry` must stay valid for as long as the kernel may use it: until its
    /// last completion, or, for an operation that completes inside the submitting call (a
    /// `MSG_DONTWAIT` send or receive pushed from `prepare_submit`, where
    /// [`RawQueue::completes_in_submit`] holds), until that call.
    pub unsafe fn push(&self, entry: squeue::Entry, token: u64) {
        let entry = entry.user_data(self.user_data(token));
        with_core(|c| match &c.driver {
            Driver::Uring(u) => u.push(entry),
            Driver::Epoll(_) => unreachable!("a RawQueue exists only on io_uring cores"),
        })
    }

    /// Asks the kernel to cancel the operations pushed with `token`; each still completes
    /// (with `-ECANCELED`, or its result if it won the race). Outside the runtime (its core
    /// has shut down, and its ring with it) there is nothing left to cancel.
    pub fn cancel(&self, token: u64) {
        let target = self.user_data(token);
        try_with_core(|c| {
            if let Driver::Uring(u) = &c.driver {
                u.push_ignored(opcode::AsyncCancel::new(target).build());
            }
        });
    }

    /// Submits everything queued on the core's ring now (one `io_uring_enter`), instead of at
    /// the pass's submission, and reaps what completed. For a latency-sensitive operation
    /// pushed outside `prepare_submit`; the same rule holds (a `MSG_DONTWAIT` operation is
    /// done when this returns, so what it names need only live until then).
    pub fn submit(&self) {
        try_with_core(|c| {
            if let Driver::Uring(u) = &c.driver {
                u.poll(&c.stats);
            }
        });
    }

    /// Puts `fd` in a free slot of the core's registered file table, so that operations may
    /// name the slot instead (the slot as their descriptor, with [`squeue::Flags::FIXED_FILE`]):
    /// the kernel then neither looks the file up nor counts a reference on it for each one.
    /// `None` if the table is full, or the core runs without one (`Builder::fixed_files`).
    /// The table keeps the file open until [`RawQueue::unregister_file`]: give the slot back
    /// before the descriptor is dropped, or the socket stays open.
    ///
    /// ```
    /// use barewire_engine::uring::{opcode, squeue, types, RawQueue};
    /// use std::os::fd::AsRawFd;
    /// let rt = barewire_engine::Runtime::builder().cores(1).pin(false).build().unwrap();
    /// rt.block_on(async {
    ///     let Some(q) = RawQueue::new() else { return }; // an epoll core has no ring
    ///     let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    ///     let Some(slot) = q.register_file(a.as_raw_fd()) else { return };
    ///     let e = opcode::Send::new(types::Fd(slot as i32), b"hi".as_ptr(), 2)
    ///         .build()
    ///         .flags(squeue::Flags::FIXED_FILE);
    ///     // SAFETY: the bytes are a static; the send completes inside the submission.
    ///     unsafe { q.push(e, 1) };
    ///     q.submit();
    ///     let mut done = Vec::new();
    ///     q.drain(&mut done);
    ///     assert_eq!((done[0].token, done[0].result), (1, 2));
    ///     q.unregister_file(slot);
    /// });
    /// ```
    pub fn register_file(&self, fd: std::os::fd::RawFd) -> Option<u32> {
        try_with_core(|c| match &c.driver {
            Driver::Uring(u) => u.register_fixed(fd),
            Driver::Epoll(_) => None,
        })
        .flatten()
    }

    /// Empties a slot [`RawQueue::register_file`] filled. Operations in flight keep their own
    /// reference to the file. Outside the runtime the core's table has gone already.
    pub fn unregister_file(&self, slot: u32) {
        try_with_core(|c| {
            if let Driver::Uring(u) = &c.driver {
                u.unregister_fixed(slot);
            }
        });
    }

    /// Moves the completions reaped so far into `out` (appended, in arrival order).
    pub fn drain(&self, out: &mut Vec<Completion>) {
        try_with_core(|c| {
            if let Driver::Uring(u) = &c.driver {
                u.drain_raw(self.index, out)
            }
        });
    }
}
