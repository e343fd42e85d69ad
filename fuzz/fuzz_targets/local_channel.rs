//! cargo-fuzz target: see `barewire_engine::fuzz::local_channel` for what it checks
//! (differential fuzzing of the engine's bounded local channel against a `VecDeque` model).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| barewire_engine::fuzz::local_channel(data));
