//! Replays the engine's fuzz corpus (`fuzz/corpus/local_channel/`, what the fuzzer kept)
//! through the check the cargo-fuzz target runs.

#[test]
fn the_local_channel_corpus_passes() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/local_channel");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).expect("the local_channel corpus") {
        let path = e.expect("a directory entry").path();
        let bytes = std::fs::read(&path).expect("a corpus file");
        let r = std::panic::catch_unwind(|| barewire_engine::fuzz::local_channel(&bytes));
        assert!(
            r.is_ok(),
            "{} fails the local channel's checks",
            path.display()
        );
        n += 1;
    }
    assert!(n > 0, "the local_channel corpus is empty");
}
