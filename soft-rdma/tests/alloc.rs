//! The provider's data path allocates nothing per message once a connection is warm: a core
//! moving one small WRITE after another (each posted, sent, placed by the peer, acknowledged
//! and completed) makes no call into the allocator per message or per pass, on either reactor.
//! An allocation per pass or per message costs a `malloc` and a `free` on the latency path
//! (the io_uring path once gave away the capacity of its lists of queue pairs to arm, and of
//! its reaped completions, every pass).
//!
//! Its own test binary: the counting allocator below is this process's global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Duration;

use barewire_engine::{spawn_local, time::timeout};
use barewire_soft_rdma::provider::{connect, ConnectOptions, Listener};
use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device, WcStatus};
use barewire_test_support::rt;

thread_local! {
    /// Allocations made by this thread so far.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting each thread's allocations.
struct Counting;

fn count() {
    // (A constant-initialised `Cell` has no destructor: reading it never allocates, and
    // `try_with` covers a thread that is exiting.)
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is passed to `System` unchanged; counting touches only a thread-local
// integer.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as `alloc`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

/// One core (the test's thread) runs both ends: every allocation of the data path on either
/// side is this thread's.
#[test]
fn a_warm_connection_moves_small_writes_without_allocating() {
    const WARM: u64 = 500;
    const ROUNDS: u64 = 2000;
    rt().block_on(async {
        let dev = Device::new();
        let (pd, scq, rcq) = (
            dev.alloc_pd(),
            CompletionQueue::new(64),
            CompletionQueue::new(64),
        );
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectOptions::default()).unwrap();
        let addr = l.local_addr().unwrap();
        let (spd, sscq, srcq) = (
            pd.clone_handle(),
            CompletionQueue::new(64),
            CompletionQueue::new(64),
        );
        let server = spawn_local(async move { l.accept(&spd, &sscq, &srcq).await });
        let (qa, _) = connect(addr, &pd, &scq, &rcq, ConnectOptions::default())
            .await
            .unwrap();
        let (_qb, _) = server.await.unwrap().unwrap();
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
        // A signaled 8-byte WRITE from `src` into `dst`.
        let write = |wr_id: u64| SendWr {
            wr_id,
            op: SendOp::Write {
                remote_addr: dmr.addr() as u64,
                rkey: dmr.stag(),
            },
            sges: [Sge {
                addr: smr.addr() as u64,
                len: 8,
                lkey: smr.stag(),
            }]
            .into(),
            signaled: true,
            fence: false,
        };
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
