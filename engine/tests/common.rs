//! Shared by the engine's integration tests.
#![allow(dead_code)]

use barewire_engine::{ReactorKind, Runtime};

/// A runtime that sleeps when idle and does not pin, so parallel tests on a 2-core CI machine
/// do not fight. Honours BAREWIRE_REACTOR, so the same tests run under both reactors.
pub fn rt(cores: usize) -> Runtime {
    Runtime::builder()
        .cores(cores)
        .sleeping()
        .build()
        .expect("runtime")
}

pub fn expect_reactor(rt: &Runtime) {
    match std::env::var("BAREWIRE_REACTOR").as_deref() {
        Ok("epoll") => assert_eq!(rt.reactor(), ReactorKind::Epoll),
        Ok("io_uring") => assert!(matches!(rt.reactor(), ReactorKind::IoUring(_))),
        _ => {}
    }
}
