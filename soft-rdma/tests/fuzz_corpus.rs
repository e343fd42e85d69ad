//! Replays the fuzz corpus (`fuzz/corpus/<target>/`, seeds plus whatever the fuzzers kept) and
//! any crash reproducers (`fuzz/regressions/<target>/`) through the same checks the cargo-fuzz
//! targets run, so stable `cargo test` in CI covers them.

use std::path::Path;

use barewire_soft_rdma::wire::fuzz;

fn replay(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut n = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            let r = std::panic::catch_unwind(|| check(&bytes));
            assert!(r.is_ok(), "{} fails {target}'s checks", path.display());
            n += 1;
        }
    }
    assert!(n > 0, "the {target} corpus is empty");
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
