//! Completion queues (ibv_create_cq(3), ibv_poll_cq(3), ibv_req_notify_cq(3)).

use std::cell::RefCell;
use std::rc::Rc;
use std::task::Waker;

/// Status of a work completion, as `enum ibv_wc_status` in ibv_poll_cq(3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WcStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// `IBV_WC_LOC_LEN_ERR`: a receive buffer too small for the incoming Send.
    LocLenErr,
    /// `IBV_WC_LOC_PROT_ERR`: a local SGE names a region that does not allow the access.
    LocProtErr,
    /// `IBV_WC_REM_ACCESS_ERR`: the peer refused the access to its region (a Terminate with a
    /// protection error came back).
    RemAccessErr,
    /// `IBV_WC_REM_INV_REQ_ERR`: the peer found the request invalid.
    RemInvReqErr,
    /// `IBV_WC_REM_OP_ERR`: the peer could not complete the operation.
    RemOpErr,
    /// `IBV_WC_WR_FLUSH_ERR`: the queue pair went to ERROR before this request ran.
    WrFlushErr,
    /// `IBV_WC_RETRY_EXC_ERR`: the transport gave up (peer dead, cut off or stalled).
    RetryExcErr,
    /// `IBV_WC_GENERAL_ERR`.
    GeneralErr,
}

impl WcStatus {
    /// Every status, in declaration order: `ALL[s as usize] == s`.
    const ALL: [WcStatus; 9] = {
        use WcStatus::*;
        [
            Success,
            LocLenErr,
            LocProtErr,
            RemAccessErr,
            RemInvReqErr,
            RemOpErr,
            WrFlushErr,
            RetryExcErr,
            GeneralErr,
        ]
    };

    /// The status whose `as u8` is `code` (only codes this crate packed itself reach it).
    #[inline(always)]
    fn from_code(code: u8) -> WcStatus {
        Self::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(WcStatus::GeneralErr)
    }
}

/// What completed (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WcOpcode {
    /// A Send (any kind) finished.
    Send,
    /// An RDMA Write finished.
    RdmaWrite,
    /// An RDMA Read finished.
    RdmaRead,
    /// A compare-and-swap finished.
    CompSwap,
    /// A fetch-and-add finished.
    FetchAdd,
    /// A local invalidate finished.
    LocalInv,
    /// A receive consumed a Send.
    Recv,
    /// A receive consumed an RDMA Write with immediate data.
    RecvRdmaWithImm,
}

impl WcOpcode {
    /// Every opcode, in declaration order: `ALL[o as usize] == o`.
    const ALL: [WcOpcode; 8] = {
        use WcOpcode::*;
        [
            Send,
            RdmaWrite,
            RdmaRead,
            CompSwap,
            FetchAdd,
            LocalInv,
            Recv,
            RecvRdmaWithImm,
        ]
    };

    /// The opcode whose `as u8` is `code` (only codes this crate packed itself reach it).
    #[inline(always)]
    fn from_code(code: u8) -> WcOpcode {
        Self::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(WcOpcode::Send)
    }
}

/// One completion (`struct ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// How it ended.
    pub status: WcStatus,
    /// What it was.
    pub opcode: WcOpcode,
    /// Bytes transferred (receives: bytes placed).
    pub byte_len: u32,
    /// Immediate data, when the message carried some.
    pub imm: Option<u32>,
    /// The STag a Send with Invalidate invalidated (`IBV_WC_WITH_INV`).
    pub invalidated: Option<u32>,
    /// The sender asked for a solicited event (Send with SE, Immediate Data with SE).
    pub solicited: bool,
    /// The queue pair it belongs to.
    pub qp_num: u32,
}

impl WorkCompletion {
    /// A completion of `byte_len` bytes with no immediate data, invalidation or solicited
    /// event (a provider sets those fields after).
    pub fn new(
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: u32,
        qp_num: u32,
    ) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode,
            byte_len,
            imm: None,
            invalidated: None,
            solicited: false,
            qp_num,
        }
    }

    /// A placeholder, to fill an array that [`CompletionQueue::poll`] then writes into.
    ///
    /// ```
    /// use barewire_rdma_types::{CompletionQueue, WorkCompletion};
    /// let cq = CompletionQueue::new(8);
    /// let mut wcs = [WorkCompletion::BLANK; 8];
    /// assert_eq!(cq.poll(&mut wcs), 0);
    /// ```
    pub const BLANK: WorkCompletion = WorkCompletion {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Recv,
        byte_len: 0,
        imm: None,
        invalidated: None,
        solicited: false,
        qp_num: 0,
    };
}

/// The queued completions, oldest first: a vector read from `head`, which starts again at
/// its front whenever the queue drains. A flow of one completion at a time (a latency loop)
/// then keeps writing and reading the same cache line, where a ring the size of the queue's
/// capacity (64 Ki entries are 2 MiB) would walk the whole of it and miss the cache on
/// every completion.
///
/// Entries are kept as four words ([`Packed`]), each stored and loaded whole. A completion
/// is often taken a few nanoseconds after it was queued (a READ on shared memory completes
/// inside its post), so its loads find its stores still in the core's store buffer. A load
/// that spans several smaller stores cannot be forwarded from them and waits for them to
/// reach the cache; the compiler's own copies of the struct did exactly that (byte and
/// 4-byte field stores, 16-byte vector loads), which cost about 5 ns per completion on shm.
#[derive(Default)]
struct Entries {
    list: Vec<Packed>,
    head: usize,
}

/// A [`WorkCompletion`] as four words: the id; the length and queue pair; the immediate
/// data and invalidated key; the status, opcode and flags.
#[derive(Clone, Copy)]
struct Packed([u64; 4]);

const HAS_IMM: u64 = 1 << 24;
const HAS_INVALIDATED: u64 = 1 << 25;
const SOLICITED: u64 = 1 << 26;

impl Packed {
    #[inline(always)]
    fn new(wc: &WorkCompletion) -> Packed {
        let mut flags = wc.status as u64 | (wc.opcode as u64) << 8;
        if wc.imm.is_some() {
            flags |= HAS_IMM;
        }
        if wc.invalidated.is_some() {
            flags |= HAS_INVALIDATED;
        }
        if wc.solicited {
            flags |= SOLICITED;
        }
        let extra = wc.imm.unwrap_or(0) as u64 | (wc.invalidated.unwrap_or(0) as u64) << 32;
        Packed([
            wc.wr_id,
            wc.byte_len as u64 | (wc.qp_num as u64) << 32,
            extra,
            flags,
        ])
    }

    #[inline(always)]
    fn get(&self) -> WorkCompletion {
        let [wr_id, len_qp, extra, flags] = self.0;
        WorkCompletion {
            wr_id,
            status: WcStatus::from_code(flags as u8),
            opcode: WcOpcode::from_code((flags >> 8) as u8),
            byte_len: len_qp as u32,
            imm: (flags & HAS_IMM != 0).then_some(extra as u32),
            invalidated: (flags & HAS_INVALIDATED != 0).then_some((extra >> 32) as u32),
            solicited: flags & SOLICITED != 0,
            qp_num: (len_qp >> 32) as u32,
        }
    }

    /// Stores the words one by one: volatile, so that the compiler neither merges nor splits
    /// them (see [`Entries`]).
    #[inline(always)]
    fn store(self, to: &mut Packed) {
        for (w, v) in to.0.iter_mut().zip(self.0) {
            // SAFETY: `w` is a valid, aligned, exclusively borrowed word.
            unsafe { std::ptr::write_volatile(w, v) };
        }
    }

    /// Loads the words one by one, the widths they were stored with.
    #[inline(always)]
    fn load(&self) -> Packed {
        let mut out = [0u64; 4];
        for (o, w) in out.iter_mut().zip(&self.0) {
            // SAFETY: `w` is a valid, aligned, initialised word.
            *o = unsafe { std::ptr::read_volatile(w) };
        }
        Packed(out)
    }
}

impl Entries {
    fn len(&self) -> usize {
        self.list.len() - self.head
    }

    #[inline(always)]
    fn push_back(&mut self, wc: WorkCompletion) {
        let at = self.list.len();
        self.list.push(Packed([0; 4]));
        Packed::new(&wc).store(&mut self.list[at]);
    }

    #[inline(always)]
    fn pop_front(&mut self) -> Option<WorkCompletion> {
        let wc = self.list.get(self.head)?.load().get();
        self.head += 1;
        if self.head == self.list.len() {
            self.list.clear();
            self.head = 0;
        } else if self.head >= 1024 && self.head * 2 >= self.list.len() {
            // A queue that never drains: drop the taken half (amortised: each entry is moved
            // at most once per time the queue's length doubles).
            self.list.drain(..self.head);
            self.head = 0;
        }
        Some(wc)
    }
}

struct Inner {
    entries: Entries,
    capacity: usize,
    armed: Option<bool>,
    overflowed: bool,
    waiter: Option<Waker>,
}

/// A completion queue: bounded; a producer that finds it full marks it overflowed (the verbs
/// `IBV_EVENT_CQ_ERR`), and the provider moves the queue pairs using it to ERROR.
#[derive(Clone)]
pub struct CompletionQueue {
    inner: Rc<RefCell<Inner>>,
}

impl CompletionQueue {
    /// A queue of at most `capacity` completions.
    pub fn new(capacity: usize) -> CompletionQueue {
        CompletionQueue {
            inner: Rc::new(RefCell::new(Inner {
                entries: Entries::default(),
                capacity,
                armed: None,
                overflowed: false,
                waiter: None,
            })),
        }
    }

    /// Adds a completion (provider side). `false` if the queue was full: the completion is
    /// lost and the queue is marked overflowed.
    #[inline(always)]
    pub fn push(&self, wc: WorkCompletion) -> bool {
        let waker = {
            let mut i = self.inner.borrow_mut();
            if i.entries.len() >= i.capacity {
                i.overflowed = true;
                return false;
            }
            let notify = match i.armed {
                Some(solicited_only) => {
                    !solicited_only || wc.status != WcStatus::Success || wc.opcode == WcOpcode::Recv
                }
                None => false,
            };
            i.entries.push_back(wc);
            if notify {
                i.armed = None;
                i.waiter.take()
            } else {
                None
            }
        };
        if let Some(w) = waker {
            w.wake();
        }
        true
    }

    /// Moves up to `out.len()` completions into `out`; returns how many (ibv_poll_cq(3)).
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut i = self.inner.borrow_mut();
        let n = out.len().min(i.entries.len());
        for slot in out.iter_mut().take(n) {
            *slot = i.entries.pop_front().expect("counted");
        }
        n
    }

    /// Asks for one notification at the next completion (`solicited_only`: only solicited ones
    /// and errors), as ibv_req_notify_cq(3). The notification wakes `waker`.
    pub fn req_notify(&self, solicited_only: bool, waker: &Waker) {
        let mut i = self.inner.borrow_mut();
        i.armed = Some(solicited_only);
        i.waiter = Some(waker.clone());
    }

    /// Waits for the next completion (on the core that owns the queue).
    #[inline]
    pub fn next(&self) -> Next<'_> {
        Next { cq: self }
    }

    /// Completions waiting.
    pub fn len(&self) -> usize {
        self.inner.borrow().entries.len()
    }

    /// The most completions it holds (what it was created with).
    pub fn capacity(&self) -> usize {
        self.inner.borrow().capacity
    }

    /// True if none wait.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once a completion was lost to a full queue.
    pub fn overflowed(&self) -> bool {
        self.inner.borrow().overflowed
    }
}

/// The future of [`CompletionQueue::next`]: the next completion. Its poll is inlined into
/// the caller, so a completion already queued is taken without a call and without passing the
/// completion back through memory.
#[must_use = "futures do nothing unless polled"]
pub struct Next<'a> {
    cq: &'a CompletionQueue,
}

impl std::future::Future for Next<'_> {
    type Output = WorkCompletion;

    #[inline(always)]
    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<WorkCompletion> {
        let mut i = self.cq.inner.borrow_mut();
        if let Some(wc) = i.entries.pop_front() {
            return std::task::Poll::Ready(wc);
        }
        i.armed = Some(false);
        i.waiter = Some(cx.waker().clone());
        std::task::Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 8,
            imm: None,
            invalidated: None,
            solicited: false,
            qp_num: 1,
        }
    }

    #[test]
    fn completions_come_out_in_order_and_overflow_is_reported() {
        let cq = CompletionQueue::new(2);
        assert!(cq.push(wc(1)) && cq.push(wc(2)));
        assert!(!cq.push(wc(3)), "a full queue refuses");
        assert!(cq.overflowed());
        let mut out = [wc(0); 4];
        assert_eq!(cq.poll(&mut out), 2);
        assert_eq!((out[0].wr_id, out[1].wr_id), (1, 2));
    }

    #[test]
    fn every_field_of_a_completion_comes_out_as_it_went_in() {
        let (statuses, opcodes) = (WcStatus::ALL, WcOpcode::ALL);
        let cq = CompletionQueue::new(1 << 12);
        let mut sent = Vec::new();
        for (k, (&status, &opcode)) in statuses
            .iter()
            .flat_map(|s| opcodes.iter().map(move |o| (s, o)))
            .enumerate()
        {
            let k = k as u64;
            let wc = WorkCompletion {
                wr_id: u64::MAX - k,
                status,
                opcode,
                byte_len: u32::MAX - k as u32,
                imm: (k % 2 == 0).then_some(0xdead_0000 | k as u32),
                invalidated: (k % 3 == 0).then_some(u32::MAX - 7 * k as u32),
                solicited: k % 5 == 0,
                qp_num: 0x8000_0000 | k as u32,
            };
            assert!(cq.push(wc));
            sent.push(wc);
        }
        let mut out = vec![WorkCompletion::BLANK; sent.len()];
        assert_eq!(cq.poll(&mut out), sent.len());
        assert_eq!(out, sent);
    }

    #[test]
    fn a_queue_that_never_drains_keeps_its_order_and_its_bound() {
        // Push two, take one, many times over: the backlog grows by one each round, so the
        // queue never empties and its taken front is dropped again and again.
        let cq = CompletionQueue::new(3000);
        let (mut next_in, mut next_out) = (0u64, 0u64);
        for _ in 0..2900 {
            for _ in 0..2 {
                assert!(cq.push(wc(next_in)));
                next_in += 1;
            }
            let mut one = [wc(u64::MAX)];
            assert_eq!(cq.poll(&mut one), 1);
            assert_eq!(one[0].wr_id, next_out, "out of order");
            next_out += 1;
            assert_eq!(cq.len() as u64, next_in - next_out);
        }
        assert!(cq.push(wc(next_in)), "2901 of 3000 held");
        let mut rest = vec![wc(u64::MAX); 4000];
        assert_eq!(cq.poll(&mut rest), 2901);
        assert!(rest[..2901].iter().map(|w| w.wr_id).eq(next_out..=next_in));
        assert!(cq.is_empty());
        // Drained: the queue takes and gives one at a time, as a latency loop does.
        for id in 0..10 {
            assert!(cq.push(wc(id)));
            assert_eq!(cq.poll(&mut rest[..1]), 1);
            assert_eq!(rest[0].wr_id, id);
        }
    }

    #[test]
    fn notification_fires_once_per_arm() {
        let cq = CompletionQueue::new(8);
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        cq.push(wc(1));
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "not armed: no event");
        cq.req_notify(false, &waker);
        cq.push(wc(2));
        cq.push(wc(3));
        assert_eq!(count.0.load(Ordering::SeqCst), 1, "one event per arm");
        cq.req_notify(true, &waker);
        cq.push(wc(4));
        assert_eq!(
            count.0.load(Ordering::SeqCst),
            1,
            "solicited-only ignores a plain send completion"
        );
        cq.push(WorkCompletion {
            status: WcStatus::RemAccessErr,
            ..wc(5)
        });
        assert_eq!(count.0.load(Ordering::SeqCst), 2, "errors always notify");
    }
}
