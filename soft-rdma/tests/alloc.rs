//! The provider's data path allocates nothing per message once a connection is warm: a core
//! moving one small WRITE after another (each posted, sent, placed by the peer, acknowledged
//! and completed) makes no call into the allocator per message or per pass, on either reactor.
//! An allocation per pass or per message costs a `malloc` and a `free` on the latency path
//! (the io_uring path once gave away the capacity of its lists of queue pairs to arm, and of
//! its reaped completions, every pass).
//!
//! A runtime that ran soft queue pairs gives back what its core kept for them when it shuts
//! down, so runtimes run one after another on a thread leave nothing behind.
//!
//! Its own test binary: the counting allocator below is this process's global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use barewire_engine::{spawn_local, time::timeout};
use barewire_soft_rdma::provider::{connect, ConnectOptions, Listener, QueuePair};
use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{
    Access, CompletionQueue, Device, MemoryRegion, ProtectionDomain, WcStatus,
};
use barewire_test_support::rt;

thread_local! {
    /// Allocations made by this thread so far.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    /// Bytes this thread allocated less those it freed (wrapping: a thread may free what
    /// another allocated).
    static LIVE: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting each thread's allocations and the bytes they hold.
struct Counting;

/// Counts `calls` allocator calls that allocate, and the bytes they take (`grown`) and give
/// back (`shrunk`).
fn count(calls: u64, grown: usize, shrunk: usize) {
    // (A constant-initialised `Cell` has no destructor: reading it never allocates, and
    // `try_with` covers a thread that is exiting.)
    let _ = ALLOCS.try_with(|c| c.set(c.get() + calls));
    let _ = LIVE.try_with(|c| {
        c.set(
            c.get()
                .wrapping_add(grown as u64)
                .wrapping_sub(shrunk as u64),
        )
    });
}

// SAFETY: every call is passed to `System` unchanged; counting touches only thread-local
// integers.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(1, layout.size(), 0);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(1, layout.size(), 0);
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(1, new_size, layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, 0, layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Bytes this thread holds from the allocator (see `LIVE`).
fn live() -> u64 {
    LIVE.with(Cell::get)
}

/// A connection over loopback on the current core: the protection domain and send
/// completion queue of its first end, its two queue pairs, and the second end's completion
/// queues (kept so they live as long as it does).
struct Connected {
    pd: ProtectionDomain,
    scq: CompletionQueue,
    qa: QueuePair,
    _far: (QueuePair, CompletionQueue, CompletionQueue),
}

async fn connected(depth: usize) -> Connected {
    let dev = Device::new();
    let (pd, scq, rcq) = (
        dev.alloc_pd(),
        CompletionQueue::new(depth),
        CompletionQueue::new(depth),
    );
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectOptions::default()).unwrap();
    let addr = l.local_addr().unwrap();
    let (spd, sscq, srcq) = (
        pd.clone_handle(),
        CompletionQueue::new(depth),
        CompletionQueue::new(depth),
    );
    let server = spawn_local(async move {
        let (qb, _) = l.accept(&spd, &sscq, &srcq).await.unwrap();
        (qb, sscq, srcq)
    });
    let (qa, _) = connect(addr, &pd, &scq, &rcq, ConnectOptions::default())
        .await
        .unwrap();
    Connected {
        pd,
        scq,
        qa,
        _far: server.await.unwrap(),
    }
}

/// A signaled 8-byte WRITE from `src` into `dst`.
fn write(wr_id: u64, src: &MemoryRegion, dst: &MemoryRegion) -> SendWr {
    SendWr {
        wr_id,
        op: SendOp::Write {
            remote_addr: dst.addr() as u64,
            rkey: dst.stag(),
        },
        sges: [Sge {
            addr: src.addr() as u64,
            len: 8,
            lkey: src.stag(),
        }]
        .into(),
        signaled: true,
        fence: false,
    }
}

/// One core (the test's thread) runs both ends: every allocation of the data path on either
/// side is this thread's.
#[test]
fn a_warm_connection_moves_small_writes_without_allocating() {
    const WARM: u64 = 500;
    const ROUNDS: u64 = 2000;
    rt().block_on(async {
        let Connected { pd, scq, qa, _far } = connected(64).await;
        let mut src = [0u8; 8];
        let mut dst = vec![0u8; 8];
        // SAFETY: both buffers outlive their regions (dropped at the end of this block).
        let smr = unsafe { pd.register(src.as_mut_ptr(), src.len(), Access::LOCAL_WRITE) }.unwrap();
        // SAFETY: as above.
        let dmr = unsafe {
            pd.register(
                dst.as_mut_ptr(),
                dst.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
        }
        .unwrap();
        let write = |wr_id: u64| write(wr_id, &smr, &dmr);
        let mut before = 0;
        for k in 0..WARM + ROUNDS {
            if k == WARM {
                before = allocs();
            }
            qa.post_send(write(k)).unwrap();
            let wc = scq.next().await;
            assert_eq!((wc.wr_id, wc.status), (k, WcStatus::Success));
        }
        let made = allocs() - before;
        // Nothing per message, per pass or per timer: none at all here, on either reactor and
        // under SQPOLL (the bound leaves room for a one-off, such as a map growing). The code
        // before this test made three per round trip (6,000); under SQPOLL, where a timer of the
        // engine's fires about every 125 round trips, firing it allocated (16-17) until the
        // timers kept their scratch list.
        assert!(
            made <= 4,
            "{made} allocations in {ROUNDS} WRITE round trips on one core"
        );
        // The connection still works after the count (nothing was left half done).
        qa.post_send(write(u64::MAX)).unwrap();
        let wc = timeout(Duration::from_secs(5), scq.next()).await.unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        drop((smr, dmr));
    });
}

/// One runtime on the test's thread: a connection with both its queue pairs on this core, one
/// WRITE through it (from a region into itself), then the runtime shuts down.
fn one_runtime_with_a_connection() {
    rt().block_on(async {
        let Connected { pd, scq, qa, _far } = connected(8).await;
        let mut buf = [7u8; 8];
        // SAFETY: `buf` outlives the region (dropped at the end of this block).
        let mr = unsafe {
            pd.register(
                buf.as_mut_ptr(),
                buf.len(),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
        }
        .unwrap();
        qa.post_send(write(1, &mr, &mr)).unwrap();
        let wc = timeout(Duration::from_secs(5), scq.next()).await.unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        drop(mr);
    });
}

/// Runtimes one after another on one thread, each with a soft connection, leave no memory
/// behind. An io_uring core gives its queue pairs a ring of provided receive buffers (4 MiB);
/// the provider kept it, with the rest of its state for the core, until the thread ended or
/// the next runtime on the thread started, and then could only leak it: with the core gone
/// (or another in its place) the buffers could not be taken back from the kernel's ring first.
/// They now go when the core shuts down. Everything here runs on the test's thread, so the
/// bytes it holds are what the runtimes left.
#[test]
fn runtimes_run_one_after_another_leave_no_memory_behind() {
    const RUNS: u64 = 6;
    // The first runs make what a thread keeps for good (its staging buffer, caches).
    one_runtime_with_a_connection();
    one_runtime_with_a_connection();
    let before = live();
    for _ in 0..RUNS {
        one_runtime_with_a_connection();
    }
    let left = live().wrapping_sub(before) as i64;
    // None here now. Leaking the buffer ring, each run left 4 MiB and a page (25,190,400 bytes
    // in all); the engine's wake buffer, 8 bytes (48).
    assert!(
        left < 4096,
        "{RUNS} runtimes left {left} bytes allocated on their thread"
    );
}
