//! Bytes per spawned task beyond the future itself, measured by a counting allocator: spawn N
//! pending tasks, read how many heap bytes were requested, divide by N, subtract the future's
//! size. Includes every per-task cost (the task cell, the run-queue slot), not just the header.
//! tokio current_thread is measured the same way for context.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded contract.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static A: Counting = Counting;

const N: usize = 100_000;

/// A future of known size that stays pending until its flag is set.
fn task(flag: std::rc::Rc<std::cell::Cell<bool>>) -> impl std::future::Future<Output = ()> {
    std::future::poll_fn(move |cx| {
        if flag.get() {
            std::task::Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
}

/// The command line: nothing to set, but `--help` says what it measures and a stray argument
/// is an error rather than ignored.
#[derive(Debug, clap::Parser)]
#[command(
    name = "task-mem",
    about = "Heap bytes per spawned task beyond its future, barewire beside tokio current_thread"
)]
struct Cli {}

fn main() {
    let _ = <Cli as clap::Parser>::parse();
    let flag = std::rc::Rc::new(std::cell::Cell::new(false));
    let fut_size = std::mem::size_of_val(&task(flag.clone()));

    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .unwrap();
    let per_task = rt.block_on(async {
        let mut handles = Vec::with_capacity(N);
        let before = LIVE.load(Ordering::Relaxed);
        for _ in 0..N {
            // Detached: the JoinHandle vector is not a per-task cost of the runtime.
            handles.push(barewire_engine::spawn_local(task(flag.clone())));
        }
        let after = LIVE.load(Ordering::Relaxed);
        let handles_bytes = (handles.capacity() * std::mem::size_of_val(&handles[0])) as isize;
        let _ = handles_bytes;
        flag.set(true);
        for h in handles {
            h.await.unwrap();
        }
        (after - before) as f64 / N as f64
    });
    let header = barewire_engine::task_overhead_bytes::<std::future::Ready<()>>();
    println!("future size: {fut_size} B");
    println!(
        "barewire: {per_task:.1} B heap per spawned task, {:.1} B beyond the future (a task of a ready future, beyond it: {header} B)",
        per_task - fut_size as f64
    );

    let flag2 = std::rc::Rc::new(std::cell::Cell::new(false));
    let trt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    let tper = local.block_on(&trt, async {
        let mut handles = Vec::with_capacity(N);
        let before = LIVE.load(Ordering::Relaxed);
        for _ in 0..N {
            handles.push(tokio::task::spawn_local(task(flag2.clone())));
        }
        let after = LIVE.load(Ordering::Relaxed);
        flag2.set(true);
        for h in handles {
            h.await.unwrap();
        }
        (after - before) as f64 / N as f64
    });
    println!("tokio current_thread + LocalSet: {tper:.1} B heap per spawned task, {:.1} B beyond the future", tper - fut_size as f64);
}
