//! Replays the fuzz corpus (`fuzz/corpus/<target>/`, seeds plus whatever the fuzzers kept) and
//! any crash reproducers (`fuzz/regressions/<target>/`) through the same checks the cargo-fuzz
//! targets run, so stable `cargo test` in CI covers them.

use barewire_soft_rdma::wire::fuzz;

fn replay(target: &str, check: fn(&[u8])) {
    let n = fuzz::replay_corpus(target, check);
    eprintln!("{target}: replayed {n} inputs");
}

#[test]
fn mpa_handshake_corpus() {
    replay("mpa_handshake", fuzz::mpa_handshake);
}

#[test]
fn deframer_corpus() {
    replay("deframer", fuzz::deframer);
}

#[test]
fn ddp_rdmap_corpus() {
    replay("ddp_rdmap", fuzz::ddp_rdmap);
}

#[test]
fn mpa_private_data_corpus() {
    replay("mpa_private_data", fuzz::mpa_private_data);
}
