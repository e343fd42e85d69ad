//! SQPOLL: a core whose ring has a submission-polling kernel thread moves data without a system
//! call per message, and the setting fails clearly where it cannot apply.

use std::time::Duration;

use barewire_engine::net::{TcpListener, TcpStream};
use barewire_engine::{spawn_local, Error, Reactor, ReactorKind, Runtime, UringFlags};

/// One core, SQPOLL with a 50 ms idle time, spinning 2 ms before it sleeps (so a ping-pong
/// between two tasks of the core does not park between messages). Bounded: 2,000 round trips.
#[test]
fn a_busy_sqpoll_core_makes_far_fewer_system_calls_than_messages() {
    const ROUNDS: usize = 2000;
    let rt = Runtime::builder()
        .cores(1)
        .pin(false)
        .idle_spin(Duration::from_millis(2))
        .reactor(Reactor::IoUring)
        .sqpoll(Duration::from_millis(50))
        .build()
        .expect("this kernel runs io_uring, so it must accept SQPOLL");
    assert_eq!(rt.reactor(), ReactorKind::IoUring(UringFlags::SqPoll));
    let (before, after) = rt.block_on(async {
        let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = l.local_addr().unwrap();
        let server = spawn_local(async move {
            let (s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 64];
            loop {
                let (r, b) = s.read_exact(buf).await;
                if r.is_err() {
                    return;
                }
                let (r, b) = s.write_all(b).await;
                r.unwrap();
                buf = b;
            }
        });
        let c = TcpStream::connect(addr).await.unwrap();
        // Warm up (connection set-up, the kernel thread's first wake-up), then count.
        let mut msg = vec![7u8; 64];
        for _ in 0..10 {
            let (r, m) = c.write_all(msg).await;
            r.unwrap();
            let (r, m) = c.read_exact(m).await;
            r.unwrap();
            msg = m;
        }
        let before = barewire_engine::stats();
        for round in 0..ROUNDS {
            msg.fill(round as u8);
            let (r, m) = c.write_all(msg).await;
            r.unwrap();
            let (r, m) = c.read_exact(m).await;
            r.unwrap();
            assert!(
                m.iter().all(|&b| b == round as u8),
                "round {round} came back wrong"
            );
            msg = m;
        }
        let after = barewire_engine::stats();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        server.await.unwrap();
        (before, after)
    });
    // Four operations per round (two sends, two receives) pass through the ring.
    let ops = after.ops_completed - before.ops_completed;
    assert!(ops >= 4 * ROUNDS as u64, "only {ops} completions");
    let syscalls = (after.submit_calls - before.submit_calls) + (after.sleeps - before.sleeps);
    eprintln!("{syscalls} io_uring_enter calls, {ops} completions, {ROUNDS} round trips");
    assert!(
        syscalls * 10 <= ROUNDS as u64,
        "{syscalls} io_uring_enter calls for {ROUNDS} round trips"
    );
}

#[test]
fn sqpoll_under_the_epoll_reactor_is_a_configuration_error() {
    let err = Runtime::builder()
        .reactor(Reactor::Epoll)
        .sqpoll(Duration::from_millis(10))
        .build()
        .err()
        .expect("SQPOLL needs io_uring");
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("SQPOLL")),
        "{err}"
    );
}
