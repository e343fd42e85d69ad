//! cargo-fuzz target: see `barewire_soft_rdma::stream::fuzz::pair` for what it checks.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| barewire_soft_rdma::stream::fuzz::stream_pair(data));
