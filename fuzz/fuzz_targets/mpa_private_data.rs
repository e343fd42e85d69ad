//! cargo-fuzz target: see `barewire_soft_rdma::wire::fuzz::mpa_private_data` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| barewire_soft_rdma::wire::fuzz::mpa_private_data(data));
