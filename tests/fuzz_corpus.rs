//! Replays the facade's fuzz corpora (`fuzz/corpus/{control,bare_channel}/`, the seeds plus
//! what the fuzzers kept) through the same checks the cargo-fuzz targets run.

use barewire::fuzz;
use barewire_soft_rdma::wire::fuzz::replay_corpus;

#[test]
fn the_control_corpus_passes() {
    assert!(replay_corpus("control", fuzz::control) >= fuzz::seeds("control").len());
}

#[test]
fn the_bare_channel_corpus_passes() {
    assert!(replay_corpus("bare_channel", fuzz::bare_channel) >= fuzz::seeds("bare_channel").len());
}

#[test]
fn the_seeds_pass_and_are_in_the_corpus() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (target, check) in [
        ("control", fuzz::control as fn(&[u8])),
        ("bare_channel", fuzz::bare_channel),
    ] {
        for (i, s) in fuzz::seeds(target).iter().enumerate() {
            check(s);
            let path = root.join(target).join(format!("seed-{i}"));
            if std::env::var_os("BAREWIRE_WRITE_SEEDS").is_some() {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
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
}
