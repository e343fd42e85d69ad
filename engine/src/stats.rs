//! Per-core counters. Plain `Cell`s: each core counts only its own work, so no atomic is paid on
//! the hot path; read them on the core with [`stats`](crate::stats) or gather every core's with
//! [`Runtime::stats`](crate::Runtime::stats).

use std::cell::Cell;

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) tasks_spawned: Cell<u64>,
    pub(crate) tasks_polled: Cell<u64>,
    pub(crate) poller_passes: Cell<u64>,
    pub(crate) memory_looks: Cell<u64>,
    pub(crate) sleeps: Cell<u64>,
    pub(crate) ops_submitted: Cell<u64>,
    pub(crate) ops_completed: Cell<u64>,
    pub(crate) mesh_sent: Cell<u64>,
    pub(crate) mesh_received: Cell<u64>,
}

/// A snapshot of one core's counters.
///
/// ```
/// # let rt = barewire_engine::Runtime::builder().cores(2).pin(false).build().unwrap();
/// rt.block_on(async {
///     barewire_engine::spawn_on(1, || async {}).await.unwrap();
/// });
/// // Every core's, gathered by the runtime: the task ran on core 1.
/// let all = rt.stats();
/// assert_eq!(all.len(), 2);
/// assert!(all[1].tasks_spawned >= 1 && all[1].core == 1);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CoreStats {
    /// Which core (index in the runtime, not the CPU id).
    pub core: usize,
    /// Tasks spawned on this core.
    pub tasks_spawned: u64,
    /// Task polls.
    pub tasks_polled: u64,
    /// Passes over the pollers (reactor, timers, mesh, registered pollers).
    pub poller_passes: u64,
    /// Looks at the memory-watching pollers between two passes while idle (see
    /// [`Poller::watches_memory`](crate::Poller::watches_memory)); 0 where none watches memory.
    pub memory_looks: u64,
    /// Times the core went to sleep in the reactor.
    pub sleeps: u64,
    /// I/O operations handed to the kernel (io_uring SQEs; epoll has none).
    pub ops_submitted: u64,
    /// `io_uring_enter` calls made to submit or reap (the ones made to sleep are counted by
    /// `sleeps`); 0 on epoll. At most one per pass is the goal: every source's submissions of
    /// a pass go out together.
    pub submit_calls: u64,
    /// Sockets in this core's registered file table now (see `Builder::fixed_files`).
    pub registered_files: u64,
    /// Completions reaped (io_uring CQEs, or epoll events).
    pub ops_completed: u64,
    /// Messages this core sent over the cross-core mesh.
    pub mesh_sent: u64,
    /// Messages this core received over the mesh.
    pub mesh_received: u64,
    /// Freed task cells this core holds for its next spawns (see `Builder::task_cache`).
    pub task_cells_cached: u64,
    /// Spawns that reused a cached cell instead of allocating.
    pub task_cells_reused: u64,
}

impl Stats {
    pub(crate) fn snapshot(
        &self,
        core: usize,
        driver: &crate::driver::Driver,
        cache: &crate::task::cache::CellCache,
    ) -> CoreStats {
        CoreStats {
            task_cells_cached: cache.cached() as u64,
            task_cells_reused: cache.reused(),
            submit_calls: driver.submit_calls(),
            registered_files: driver.registered_files(),
            core,
            tasks_spawned: self.tasks_spawned.get(),
            tasks_polled: self.tasks_polled.get(),
            poller_passes: self.poller_passes.get(),
            memory_looks: self.memory_looks.get(),
            sleeps: self.sleeps.get(),
            ops_submitted: self.ops_submitted.get(),
            ops_completed: self.ops_completed.get(),
            mesh_sent: self.mesh_sent.get(),
            mesh_received: self.mesh_received.get(),
        }
    }
}

pub(crate) fn bump(c: &Cell<u64>) {
    c.set(c.get() + 1);
}
