//! The io_uring reactor.
//!
//! Setup flags are probed, strongest first, because each needs a newer kernel and some
//! container runtimes refuse some of them:
//! - `IORING_SETUP_SINGLE_ISSUER` (6.0): only this core's thread submits, so the kernel skips
//!   its submission locking. True by construction: each core builds its own ring.
//! - `IORING_SETUP_DEFER_TASKRUN` (6.1): completions are run only when we enter the kernel to
//!   reap, never by interrupting the thread mid-task. With `IORING_SETUP_TASKRUN_FLAG` the kernel
//!   tells us through `IORING_SQ_TASKRUN` when such work waits, so an idle pass costs no syscall.
//! - `IORING_SETUP_COOP_TASKRUN` (5.19): the fallback that also avoids interrupting IPIs.
//!
//! With SQPOLL asked for (`Builder::sqpoll`), the ring is set up with `IORING_SETUP_SQPOLL`
//! (plus SINGLE_ISSUER where accepted; the kernel refuses the task-run flags beside it): a
//! kernel thread reads the submission queue, and a submission makes a system call only when
//! that thread has gone to sleep (`IORING_SQ_NEED_WAKEUP`).
//!
//! Each core also registers its ring's descriptor with the kernel (`IORING_REGISTER_RING_FDS`,
//! 5.18) and enters the kernel by that index (`IORING_ENTER_REGISTERED_RING`): every
//! `io_uring_enter` on a plain descriptor looks the ring's file up, and in a process with more
//! than one thread, whose file table is shared, also takes and drops a reference on it. A
//! kernel that refuses the registration is entered by descriptor, as is an SQPOLL ring.
//!
//! See io_uring_setup(2), io_uring_enter(2) and io_uring_register(2).

mod fixed;
mod register;
#[cfg(test)]
mod tests;
mod watch;

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};
use slab::Slab;

use super::lifecycle::{Lifecycle, OpState, OrphanFn};
use crate::stats::Stats;
use crate::trace;
use register::{register_ring_fd, ring_fds_update, RsrcUpdate, IORING_UNREGISTER_RING_FDS};
use watch::Watch;

/// user_data of the always-armed read on the core's wake eventfd.
const WAKE_TOKEN: u64 = u64::MAX;
/// user_data of internal operations whose completion is ignored (cancels, park timeouts).
const IGNORE_TOKEN: u64 = u64::MAX - 1;
/// user_data bit of raw operations (see `crate::uring`): bits 48..62 name the queue, bits
/// 0..48 are the owner's token. Slab keys never come near it; bit 63 marks the two above.
pub(crate) const RAW_BIT: u64 = 1 << 62;
/// Bits of a raw operation's token.
pub(crate) const RAW_TOKEN_BITS: u32 = 48;
/// user_data bit of a wake watch's multishot poll (see `Uring::watch`); the low bits are its
/// slot in `watches`.
const WATCH_BIT: u64 = 1 << 61;

/// Which setup flags the kernel accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UringFlags {
    /// SINGLE_ISSUER + DEFER_TASKRUN + TASKRUN_FLAG.
    DeferTaskrun,
    /// SINGLE_ISSUER + COOP_TASKRUN + TASKRUN_FLAG.
    CoopTaskrun,
    /// No optional flags.
    Plain,
    /// SQPOLL (with SINGLE_ISSUER where the kernel accepts it): a kernel thread submits.
    SqPoll,
}

pub(crate) struct Uring {
    ring: RefCell<IoUring>,
    ops: RefCell<Slab<OpState>>,
    wake_fd: RawFd,
    wake_buf: Box<Cell<u64>>,
    wake_armed: Cell<bool>,
    pub(crate) flags: UringFlags,
    ext_arg: bool,
    reaped: RefCell<Vec<(u64, i32, u32)>>,
    watches: RefCell<Slab<Watch>>,
    /// Completions of raw operations, per raw queue, until their owner drains them.
    raw: RefCell<Vec<Vec<crate::uring::Completion>>>,
    /// Counts `io_uring_enter` calls made to submit (not to sleep).
    pub(crate) enters: Cell<u64>,
    /// Free slots of the registered file table (empty when there is none).
    fixed_free: RefCell<Vec<u32>>,
    /// Slots in the registered file table.
    fixed_total: Cell<u32>,
    park_ts: Box<std::cell::UnsafeCell<types::Timespec>>,
    /// The ring's index among this thread's registered ring descriptors, which every enter
    /// names instead of the descriptor; `None` where the kernel refused it (or under SQPOLL).
    enter_index: Option<u32>,
    /// The thread that registered it (the table is per thread): only it may unregister.
    registrar: std::thread::ThreadId,
}

impl Uring {
    /// A ring of `entries` submission slots; with `sqpoll`, a submission-polling one whose
    /// kernel thread sleeps after that idle time (at least 1 ms); with `fixed_files`, a sparse
    /// registered file table of that many slots (see [`register_fixed`](Self::register_fixed)).
    pub(crate) fn new(
        entries: u32,
        wake_fd: RawFd,
        sqpoll: Option<Duration>,
        fixed_files: u32,
    ) -> io::Result<Uring> {
        type Apply = fn(&mut io_uring::Builder);
        let idle_ms = sqpoll.map_or(0, |d| d.as_millis().clamp(1, u32::MAX as u128) as u32);
        let sqpoll_attempts: [(UringFlags, Apply); 2] = [
            (UringFlags::SqPoll, |b| {
                b.setup_single_issuer();
            }),
            (UringFlags::SqPoll, |_| {}),
        ];
        let plain_attempts: [(UringFlags, Apply); 3] = [
            (UringFlags::DeferTaskrun, |b| {
                b.setup_single_issuer()
                    .setup_defer_taskrun()
                    .setup_taskrun_flag();
            }),
            (UringFlags::CoopTaskrun, |b| {
                b.setup_single_issuer()
                    .setup_coop_taskrun()
                    .setup_taskrun_flag();
            }),
            (UringFlags::Plain, |_| {}),
        ];
        let attempts: &[(UringFlags, Apply)] = if sqpoll.is_some() {
            &sqpoll_attempts
        } else {
            &plain_attempts
        };
        let mut last_err = None;
        for &(flags, apply) in attempts {
            let mut builder = IoUring::builder();
            apply(&mut builder);
            if sqpoll.is_some() {
                builder.setup_sqpoll(idle_ms);
            }
            builder.setup_cqsize(entries.saturating_mul(4));
            match builder.build(entries) {
                Ok(ring) => {
                    let ext_arg = ring.params().is_feature_ext_arg();
                    let enter_index = match flags {
                        UringFlags::SqPoll => None,
                        _ => register_ring_fd(&ring),
                    };
                    let u = Uring {
                        ring: RefCell::new(ring),
                        ops: RefCell::new(Slab::with_capacity(entries as usize)),
                        wake_fd,
                        wake_buf: Box::new(Cell::new(0)),
                        wake_armed: Cell::new(false),
                        flags,
                        ext_arg,
                        reaped: RefCell::new(Vec::with_capacity(64)),
                        watches: RefCell::new(Slab::new()),
                        raw: RefCell::new(Vec::new()),
                        enters: Cell::new(0),
                        fixed_free: RefCell::new(Vec::new()),
                        fixed_total: Cell::new(0),
                        park_ts: Box::new(std::cell::UnsafeCell::new(types::Timespec::new())),
                        enter_index,
                        registrar: std::thread::current().id(),
                    };
                    // A kernel without sparse file tables (before 5.19) runs without one: every
                    // socket then uses its descriptor.
                    if fixed_files > 0
                        && u.ring
                            .borrow()
                            .submitter()
                            .register_files_sparse(fixed_files)
                            .is_ok()
                    {
                        *u.fixed_free.borrow_mut() = (0..fixed_files).rev().collect();
                        u.fixed_total.set(fixed_files);
                    }
                    return Ok(u);
                }
                // EINVAL: the kernel does not know a flag; try the next set. Anything else
                // (ENOSYS, EPERM from seccomp or kernel.io_uring_disabled) ends the probe.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => last_err = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or_else(|| io::Error::other("io_uring setup failed")))
    }

    /// Queues an SQE; submits first if the submission queue is full.
    pub(crate) fn push(&self, entry: squeue::Entry) {
        let mut ring = self.ring.borrow_mut();
        loop {
            // SAFETY: every entry built by the ops in this crate points at memory owned by the
            // op's parked data (Lifecycle) or by the driver, which outlives the operation.
            if unsafe { ring.submission().push(&entry) }.is_ok() {
                return;
            }
            self.enters.set(self.enters.get() + 1);
            if let Err(e) = self.enter(&mut ring, 0, None) {
                if e.raw_os_error() != Some(libc::EBUSY) {
                    panic!("io_uring submit failed with a full submission queue: {e}");
                }
            }
            // EBUSY: the completion queue is backed up; reaping happens at the next poll.
            drop(ring);
            self.reap();
            ring = self.ring.borrow_mut();
        }
    }

    /// Registers a new operation and queues its SQE. Returns the slot key.
    pub(crate) fn submit_op(&self, entry: squeue::Entry, multi: bool) -> usize {
        let key = self.ops.borrow_mut().insert(OpState::new(multi));
        self.push(entry.user_data(key as u64));
        key
    }

    /// Polls a one-shot operation.
    pub(crate) fn poll_op(
        &self,
        key: usize,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<(i32, u32)> {
        let mut ops = self.ops.borrow_mut();
        let state = &mut ops[key];
        match &mut state.life {
            Lifecycle::Completed(res, flags) => {
                let out = (*res, *flags);
                ops.remove(key);
                std::task::Poll::Ready(out)
            }
            Lifecycle::Waiting(w) if w.will_wake(cx.waker()) => std::task::Poll::Pending,
            life => {
                *life = Lifecycle::Waiting(cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }

    /// Polls a multishot operation for its next completion; `None` after the last.
    pub(crate) fn poll_multi(
        &self,
        key: usize,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<(i32, u32)>> {
        let mut ops = self.ops.borrow_mut();
        let Lifecycle::Multi { queue, waker, done } = &mut ops[key].life else {
            unreachable!("poll_multi on a one-shot operation")
        };
        if let Some(c) = queue.pop_front() {
            return std::task::Poll::Ready(Some(c));
        }
        if *done {
            return std::task::Poll::Ready(None);
        }
        *waker = Some(cx.waker().clone());
        std::task::Poll::Pending
    }

    /// The future was dropped: park its data until the kernel is done, and ask for a cancel.
    pub(crate) fn orphan(&self, key: usize, data: Box<dyn Any>, on_cqe: Option<OrphanFn>) {
        let mut ops = self.ops.borrow_mut();
        let state = &mut ops[key];
        match &mut state.life {
            Lifecycle::Completed(..) => {
                ops.remove(key);
                drop(ops);
                drop(data);
            }
            Lifecycle::Multi {
                queue, done: true, ..
            } => {
                let mut data = data;
                if let Some(f) = on_cqe {
                    for (res, flags) in queue.drain(..) {
                        f(data.as_mut(), res, flags);
                    }
                }
                ops.remove(key);
            }
            life => {
                let mut data = data;
                if let (Lifecycle::Multi { queue, .. }, Some(f)) = (&mut *life, on_cqe) {
                    for (res, flags) in queue.drain(..) {
                        f(data.as_mut(), res, flags);
                    }
                }
                *life = Lifecycle::Ignored(data, on_cqe);
                drop(ops);
                self.push(
                    opcode::AsyncCancel::new(key as u64)
                        .build()
                        .user_data(IGNORE_TOKEN),
                );
            }
        }
    }

    /// True if the CQ holds completions or the kernel has deferred work for us.
    pub(crate) fn pure_poll(&self) -> bool {
        let mut ring = self.ring.borrow_mut();
        !ring.completion().is_empty() || ring.submission().taskrun()
    }

    /// Submits queued SQEs and reaps completions. True if anything happened.
    pub(crate) fn poll(&self, stats: &Stats) -> bool {
        let empty = {
            let mut ring = self.ring.borrow_mut();
            // One view of the submission queue for all three questions (each view loads the
            // kernel's head, and stores the tail back when dropped).
            let (pending, taskrun) = {
                let sq = ring.submission();
                (sq.len(), sq.taskrun() || sq.cq_overflow())
            };
            if pending > 0 || taskrun {
                stats
                    .ops_submitted
                    .set(stats.ops_submitted.get() + pending as u64);
                // Under SQPOLL the kernel thread takes the entries by itself: `submit` enters
                // the kernel only to wake it (or to flush an overflowed completion queue).
                let enters = self.flags != UringFlags::SqPoll
                    || ring.submission().need_wakeup()
                    || ring.submission().cq_overflow();
                self.enters.set(self.enters.get() + enters as u64);
                match self.enter(&mut ring, 0, None) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::EBUSY | libc::EINTR | libc::EAGAIN)
                        ) => {}
                    Err(e) => panic!("io_uring_enter failed: {e}"),
                }
            }
            // (Bound first: the queue's view borrows `ring`, and must end before it does.)
            let empty = ring.completion().is_empty();
            empty
        };
        if empty {
            // Nothing to reap: the idle pass's usual case, which then skips `reap`'s buffers.
            return false;
        }
        let (n, raw) = self.reap();
        stats
            .ops_completed
            .set(stats.ops_completed.get() + n as u64);
        // Raw completions count as work only if their owner's poll says so (a polled receive
        // that found nothing must not keep the core from going idle).
        n > raw
    }

    /// Moves completions out of the CQ, then wakes waiters with no driver borrow held. Returns
    /// how many it reaped, and how many of them were raw.
    fn reap(&self) -> (usize, usize) {
        let mut reaped = self.reaped.borrow_mut();
        {
            let mut ring = self.ring.borrow_mut();
            let mut cq = ring.completion();
            cq.sync();
            for cqe in &mut cq {
                reaped.push((cqe.user_data(), cqe.result(), cqe.flags()));
            }
        }
        let n = reaped.len();
        trace::event(trace::Kind::REAPED, n as u64);
        let mut raw_count = 0;
        let mut finished: Vec<OpState> = Vec::new();
        for (user_data, res, flags) in reaped.drain(..) {
            match user_data {
                WAKE_TOKEN => self.wake_armed.set(false),
                IGNORE_TOKEN => {}
                watch if watch & (WATCH_BIT | RAW_BIT | 1 << 63) == WATCH_BIT => {
                    // Its work is to have ended the wait; the owner's poller finds the rest.
                    raw_count += 1;
                    self.watch_completed((watch & !WATCH_BIT) as usize, res, flags);
                }
                raw if raw & (RAW_BIT | 1 << 63) == RAW_BIT => {
                    raw_count += 1;
                    let queue = ((raw & !RAW_BIT) >> RAW_TOKEN_BITS) as usize;
                    if let Some(q) = self.raw.borrow_mut().get_mut(queue) {
                        q.push(crate::uring::Completion {
                            token: raw & ((1 << RAW_TOKEN_BITS) - 1),
                            result: res,
                            flags,
                        });
                    }
                }
                key => {
                    let key = key as usize;
                    let (waker, done) = {
                        let mut ops = self.ops.borrow_mut();
                        match ops.get_mut(key) {
                            Some(state) => state.complete(res, flags),
                            None => (None, false),
                        }
                    };
                    if done {
                        // Dropped outside the borrow: parked data may run arbitrary destructors.
                        finished.push(self.ops.borrow_mut().remove(key));
                    }
                    if let Some(w) = waker {
                        w.wake();
                    }
                }
            }
        }
        drop(reaped);
        drop(finished);
        (n, raw_count)
    }

    fn arm_wake_read(&self) {
        if self.wake_armed.replace(true) {
            return;
        }
        let entry = opcode::Read::new(
            types::Fd(self.wake_fd),
            self.wake_buf.as_ptr() as *mut u8,
            8,
        )
        .build()
        .user_data(WAKE_TOKEN);
        self.push(entry);
    }

    /// Sleeps until a completion, the wake eventfd, or `timeout`.
    pub(crate) fn park(&self, timeout: Option<Duration>) {
        self.arm_wake_read();
        self.wait(timeout);
    }

    /// Sleeps until a completion or `timeout`.
    fn wait(&self, timeout: Option<Duration>) {
        let mut ring = self.ring.borrow_mut();
        let res = match timeout {
            None => self.enter(&mut ring, 1, None),
            Some(t) if self.ext_arg => {
                let ts = types::Timespec::new()
                    .sec(t.as_secs())
                    .nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.enter(&mut ring, 1, Some(&args))
            }
            Some(t) => {
                drop(ring);
                // Kernels before 5.11 lack EXT_ARG: a timeout SQE bounds the wait instead.
                // The kernel copies the timespec when it prepares the SQE, so one slot owned by
                // the driver serves every park.
                let ts_ptr = self.park_ts.get();
                // SAFETY: the driver is single-threaded and nothing else references park_ts.
                unsafe {
                    *ts_ptr = types::Timespec::new()
                        .sec(t.as_secs())
                        .nsec(t.subsec_nanos())
                };
                self.push(opcode::Timeout::new(ts_ptr).build().user_data(IGNORE_TOKEN));
                let mut ring = self.ring.borrow_mut();
                self.enter(&mut ring, 1, None)
            }
        };
        match res {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY | libc::EAGAIN)
                ) => {}
            Err(e) => panic!("io_uring_enter (wait) failed: {e}"),
        }
    }

    /// Submits what the submission queue holds and, with `want` > 0, waits for that many
    /// completions (bounded by `args`' timeout where given): `io_uring_enter` by the ring's
    /// registered index, with the flags the io-uring crate's `submit_and_wait` and
    /// `submit_with_args` would pass; through those where the ring is not registered.
    fn enter(
        &self,
        ring: &mut IoUring,
        want: u32,
        args: Option<&types::SubmitArgs<'_, '_>>,
    ) -> io::Result<usize> {
        let Some(index) = self.enter_index else {
            if trace::ENABLED {
                // (A view of the queue loads and stores its indices: only when tracing.)
                let pending = ring.submission().len() as u64;
                trace::event(trace::Kind::ENTER, pending << 1 | u64::from(want > 0));
            }
            let r = match args {
                None => ring.submit_and_wait(want as usize),
                Some(a) => ring.submitter().submit_with_args(want as usize, a),
            };
            let result = r
                .as_ref()
                .map_or_else(|e| -i64::from(e.raw_os_error().unwrap_or(0)), |&n| n as i64);
            trace::event(trace::Kind::ENTERED, result as u64);
            return r;
        };
        let sq = ring.submission();
        let to_submit = sq.len() as u32;
        let mut flags = IORING_ENTER_REGISTERED_RING;
        // Deferred task work runs only in an enter that asks for completions.
        if want > 0 || sq.cq_overflow() || sq.taskrun() {
            flags |= IORING_ENTER_GETEVENTS;
        }
        drop(sq);
        let (arg, size) = match args {
            Some(a) => {
                flags |= IORING_ENTER_EXT_ARG;
                (
                    a as *const types::SubmitArgs<'_, '_> as *const libc::c_void,
                    std::mem::size_of_val(a),
                )
            }
            None => (std::ptr::null(), std::mem::size_of::<libc::sigset_t>()),
        };
        trace::event(
            trace::Kind::ENTER,
            u64::from(to_submit) << 1 | u64::from(flags & IORING_ENTER_GETEVENTS != 0),
        );
        // SAFETY: `index` names this ring among this thread's registered rings (a core's ring
        // is registered and entered only by the core's own thread); the submission queue's
        // tail was published when its entries were pushed; `arg` is null or points at a live
        // `io_uring_getevents_arg` (SubmitArgs is transparent over it) of `size` bytes.
        // (Every argument widened to a full register: the call reads each as a `long`.)
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_enter,
                index as libc::c_long,
                to_submit as libc::c_long,
                want as libc::c_long,
                flags as libc::c_long,
                arg,
                size,
            )
        };
        trace::event(trace::Kind::ENTERED, r as u64);
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// Whether this ring is entered by its registered index (see the module's docs).
    #[cfg(test)]
    pub(crate) fn registered(&self) -> bool {
        self.enter_index.is_some()
    }

    /// Number of operations the kernel still owns.
    pub(crate) fn in_flight(&self) -> usize {
        self.ops.borrow().len()
    }

    /// Cancels everything and waits (bounded) for the kernel to give every buffer back. What it
    /// still holds after the bound is leaked rather than freed under the kernel's feet.
    pub(crate) fn drain(&self, stats: &Stats) {
        let keys: Vec<usize> = self.ops.borrow().iter().map(|(k, _)| k).collect();
        for key in keys {
            self.push(
                opcode::AsyncCancel::new(key as u64)
                    .build()
                    .user_data(IGNORE_TOKEN),
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while self.in_flight() > 0 && std::time::Instant::now() < deadline {
            self.poll(stats);
            if self.in_flight() > 0 {
                self.park(Some(Duration::from_millis(10)));
            }
        }
        // Then the wake eventfd's read, with waits that do not arm it again: its buffer comes
        // back instead of being leaked when the ring goes (see `Drop`).
        if self.wake_armed.get() {
            self.push_ignored(opcode::AsyncCancel::new(WAKE_TOKEN).build());
        }
        while self.wake_armed.get() && std::time::Instant::now() < deadline {
            self.poll(stats);
            if self.wake_armed.get() {
                self.wait(Some(Duration::from_millis(10)));
            }
        }
        if self.in_flight() > 0 {
            let ops = std::mem::take(&mut *self.ops.borrow_mut());
            std::mem::forget(ops);
        }
    }

    /// Queues an SQE whose completion is ignored (a cancel).
    pub(crate) fn push_ignored(&self, entry: squeue::Entry) {
        self.push(entry.user_data(IGNORE_TOKEN));
    }
    /// A new raw completion queue; its index.
    pub(crate) fn new_raw_queue(&self) -> usize {
        let mut raw = self.raw.borrow_mut();
        raw.push(Vec::new());
        raw.len() - 1
    }

    /// Moves the raw completions of `queue` into `out`.
    pub(crate) fn drain_raw(&self, queue: usize, out: &mut Vec<crate::uring::Completion>) {
        if let Some(q) = self.raw.borrow_mut().get_mut(queue) {
            out.append(q);
        }
    }
}

/// io_uring_enter(2) flags used by [`Uring::enter`].
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;
const IORING_ENTER_REGISTERED_RING: u32 = 1 << 4;

impl Drop for Uring {
    fn drop(&mut self) {
        // The registration holds the ring's file open: give the slot back, or a thread that
        // builds runtime after runtime would keep every old ring alive and run out of slots.
        if let Some(index) = self.enter_index {
            if std::thread::current().id() == self.registrar {
                let mut up = RsrcUpdate {
                    offset: index,
                    resv: 0,
                    data: 0,
                };
                // From the thread whose table holds `index` (checked above).
                let fd = std::os::fd::AsRawFd::as_raw_fd(&*self.ring.borrow());
                ring_fds_update(fd, IORING_UNREGISTER_RING_FDS, &mut up);
            }
        }
        if self.wake_armed.get() {
            // The eventfd read may still reference wake_buf: it is cheap to leak.
            std::mem::forget(std::mem::replace(
                &mut self.wake_buf,
                Box::new(Cell::new(0)),
            ));
        }
    }
}
