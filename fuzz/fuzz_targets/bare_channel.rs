//! cargo-fuzz target: see `barewire::fuzz::bare_channel` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| barewire::fuzz::bare_channel(data));
