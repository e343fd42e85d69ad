//! Replays the facade's fuzz corpora (`fuzz/corpus/{control,bare_channel}/`, the seeds plus
//! what the fuzzers kept) through the same checks the cargo-fuzz targets run.

use barewire::fuzz;
use barewire_soft_rdma::wire::fuzz::{check_seeds, replay_corpus};

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
    check_seeds("control", &fuzz::seeds("control"), fuzz::control);
    check_seeds(
        "bare_channel",
        &fuzz::seeds("bare_channel"),
        fuzz::bare_channel,
    );
}
