//! Replays the drivers' fuzz corpus (`fuzz/corpus/shm_ring/`, the seeds plus what the fuzzer
//! kept) through the same checks the cargo-fuzz target runs.

use barewire_drivers::fuzz;
use barewire_soft_rdma::wire::fuzz::{check_seeds, replay_corpus};

#[test]
fn the_shm_ring_corpus_passes() {
    assert!(replay_corpus("shm_ring", fuzz::shm_ring) >= fuzz::shm_ring_seeds().len());
}

#[test]
fn the_seeds_pass_and_are_in_the_corpus() {
    check_seeds("shm_ring", &fuzz::shm_ring_seeds(), fuzz::shm_ring);
}
