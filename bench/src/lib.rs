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
