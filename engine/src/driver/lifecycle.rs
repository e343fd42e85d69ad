//! Who owns an io_uring operation's buffer, and who is waiting for it, at each point of its life.
//!
//! ```text
//! Submitted --poll--> Waiting(waker) --CQE--> Completed --poll--> (slot freed, buffer returned)
//!     \                    |
//!      \---- future dropped ----> Ignored(buffer) --final CQE--> (slot freed, buffer dropped)
//! ```
//!
//! The kernel may write into a buffer until the operation's final completion arrives, so a
//! dropped future parks its buffer in `Ignored` and asks for a cancel; the buffer is freed only
//! when the CQE says the kernel is done with it. Multishot operations (accept, recv on a
//! provided-buffer ring) queue their completions in `Multi` until the last one, which comes
//! without `IORING_CQE_F_MORE`.

use std::any::Any;
use std::collections::VecDeque;
use std::task::Waker;

/// Called for each completion that arrives after the future was dropped, so resources the
/// kernel handed over (an accepted fd, a provided buffer) are given back, not leaked.
pub(crate) type OrphanFn = fn(&mut dyn Any, i32, u32);

pub(crate) enum Lifecycle {
    Submitted,
    Waiting(Waker),
    Ignored(Box<dyn Any>, Option<OrphanFn>),
    Completed(i32, u32),
    Multi {
        queue: VecDeque<(i32, u32)>,
        waker: Option<Waker>,
        done: bool,
    },
}

pub(crate) struct OpState {
    pub(crate) life: Lifecycle,
    /// For send_zc: the byte count from the first CQE, returned when the notification arrives.
    pub(crate) first_result: Option<i32>,
}

/// `IORING_CQE_F_MORE`: more completions will follow for this operation.
pub(crate) const CQE_F_MORE: u32 = 1 << 1;
/// `IORING_CQE_F_NOTIF`: the zero-copy send's buffer is released.
pub(crate) const CQE_F_NOTIF: u32 = 1 << 3;

impl OpState {
    pub(crate) fn new(multi: bool) -> Self {
        let life = if multi {
            Lifecycle::Multi {
                queue: VecDeque::new(),
                waker: None,
                done: false,
            }
        } else {
            Lifecycle::Submitted
        };
        OpState {
            life,
            first_result: None,
        }
    }

    /// Records a CQE. Returns `(waker to wake, slot is finished and can be freed)`.
    pub(crate) fn complete(&mut self, res: i32, flags: u32) -> (Option<Waker>, bool) {
        let more = flags & CQE_F_MORE != 0;
        match &mut self.life {
            Lifecycle::Multi { queue, waker, done } => {
                queue.push_back((res, flags));
                if !more {
                    *done = true;
                }
                (waker.take(), false)
            }
            Lifecycle::Ignored(data, orphan) => {
                if let Some(f) = orphan {
                    f(data.as_mut(), res, flags);
                }
                (None, !more)
            }
            Lifecycle::Submitted | Lifecycle::Waiting(_) => {
                if more {
                    self.first_result = Some(res);
                    return (None, false);
                }
                let res = if flags & CQE_F_NOTIF != 0 {
                    self.first_result.unwrap_or(res)
                } else {
                    res
                };
                match std::mem::replace(&mut self.life, Lifecycle::Completed(res, flags)) {
                    Lifecycle::Waiting(w) => (Some(w), false),
                    _ => (None, false),
                }
            }
            Lifecycle::Completed(..) => (None, false),
        }
    }
}
