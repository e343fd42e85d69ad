//! Shared pieces of barewire's benchmarks: the echo workload, written once per runtime
//! (barewire, tokio, monoio) so the three are measured doing exactly the same thing.

pub mod echo;
pub mod perf;

/// Pins the calling thread to `cpu` (if the machine has it).
pub fn pin(cpu: usize) {
    if let Some(ids) = core_affinity::get_core_ids() {
        if let Some(id) = ids.into_iter().find(|c| c.id == cpu) {
            core_affinity::set_for_current(id);
        }
    }
}

/// Lets the calling thread run on every online CPU again (a runtime pinned on this thread
/// earlier narrows what threads spawned from it inherit).
pub fn unpin() {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes inside it; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..n.max(libc::sysconf(libc::_SC_NPROCESSORS_ONLN) as usize) {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
