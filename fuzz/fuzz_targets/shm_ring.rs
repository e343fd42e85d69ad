//! cargo-fuzz target: see `barewire_drivers::fuzz::shm_ring` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| barewire_drivers::fuzz::shm_ring(data));
