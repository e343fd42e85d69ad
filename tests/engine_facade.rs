//! The facade re-exports the engine: a program written against `barewire` runs on it.

use barewire::engine::{spawn_local, Runtime};

#[test]
fn the_facade_exposes_a_working_runtime() {
    let rt = Runtime::builder()
        .cores(1)
        .pin(false)
        .idle_spin(std::time::Duration::ZERO)
        .build()
        .unwrap();
    let v = rt.block_on(async { spawn_local(async { 21 * 2 }).await.unwrap() });
    assert_eq!(v, 42);
}
