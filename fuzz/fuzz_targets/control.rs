//! cargo-fuzz target: see `barewire::fuzz::control` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| barewire::fuzz::control(data));
