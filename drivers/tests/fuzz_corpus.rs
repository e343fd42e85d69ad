//! Replays the drivers' fuzz corpus (`fuzz/corpus/shm_ring/`, the seeds plus what the fuzzer
//! kept) through the same checks the cargo-fuzz target runs.

use barewire_drivers::fuzz;
use barewire_soft_rdma::wire::fuzz::replay_corpus;

#[test]
fn the_shm_ring_corpus_passes() {
    assert!(replay_corpus("shm_ring", fuzz::shm_ring) >= fuzz::shm_ring_seeds().len());
}

#[test]
fn the_seeds_pass_and_are_in_the_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/shm_ring");
    for (i, s) in fuzz::shm_ring_seeds().iter().enumerate() {
        fuzz::shm_ring(s);
        let path = root.join(format!("seed-{i}"));
        if std::env::var_os("BAREWIRE_WRITE_SEEDS").is_some() {
            std::fs::create_dir_all(&root).unwrap();
            std::fs::write(&path, s).unwrap();
        }
        assert_eq!(
            std::fs::read(&path).ok().as_ref(),
            Some(s),
            "{}",
            path.display()
        );
    }
}
