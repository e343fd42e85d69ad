use super::*;

fn wake_fd() -> RawFd {
    // SAFETY: eventfd with valid flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    assert!(fd >= 0, "eventfd");
    fd
}

/// Kernel release as (major, minor).
fn kernel() -> (u32, u32) {
    let r = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r.trim().split(|c: char| !c.is_ascii_digit());
    let major = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let minor = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    (major, minor)
}

/// Pushes a NOP and parks until its completion is reaped.
fn nop_round_trip(u: &Uring, stats: &Stats) {
    u.push(opcode::Nop::new().build().user_data(IGNORE_TOKEN));
    let before = stats.ops_completed.get();
    u.poll(stats);
    if stats.ops_completed.get() == before {
        u.park(Some(Duration::from_millis(100)));
        u.poll(stats);
    }
    assert!(stats.ops_completed.get() > before, "the NOP completed");
}

/// Polls and parks (bounded) until `done` holds.
fn until(u: &Uring, stats: &Stats, done: impl Fn(&Uring) -> bool) -> bool {
    for _ in 0..100 {
        u.poll(stats);
        if done(u) {
            return true;
        }
        u.park(Some(Duration::from_millis(10)));
    }
    done(u)
}

/// A core's shutdown takes back the wake eventfd's read along with every other operation,
/// so the buffer it reads into is freed with the ring. It was left armed, and the buffer
/// leaked (8 bytes a core for every runtime on io_uring).
#[test]
fn the_drain_takes_back_the_wake_read() {
    let fd = wake_fd();
    let stats = Stats::default();
    let u = Uring::new(64, fd, None, 0).expect("an io_uring");
    nop_round_trip(&u, &stats);
    u.park(Some(Duration::from_millis(1)));
    assert!(u.wake_armed.get(), "a park arms the read");
    u.drain(&stats);
    assert!(
        !u.wake_armed.get(),
        "the drain cancelled it and reaped its completion"
    );
    drop(u);
    // SAFETY: our own eventfd, closed once.
    unsafe { libc::close(fd) };
}

/// A watch's multishot poll stays armed across events (each write to the eventfd is a
/// completion with `F_MORE`, and none is a task's work); dropping it removes the poll and
/// frees its slot once the kernel's last completion comes; a poll the kernel ends with an
/// error is not armed again, and `arm_watch` says why.
#[test]
fn a_watch_stays_armed_across_events_and_goes_when_dropped_or_failed() {
    let fd = wake_fd();
    let stats = Stats::default();
    let u = Uring::new(64, fd, None, 0).expect("an io_uring");
    let target = wake_fd();
    let key = u.watch(target);
    let writes = |n: u64| {
        for _ in 0..n {
            let one = 1u64;
            // SAFETY: 8-byte write to our own eventfd.
            unsafe { libc::write(target, (&one as *const u64).cast(), 8) };
        }
    };
    let completed = || stats.ops_completed.get();
    for round in 1..=3 {
        let before = completed();
        writes(1);
        assert!(
            until(&u, &stats, |_| completed() > before),
            "write {round} was seen"
        );
        assert!(
            u.watches.borrow()[key].armed,
            "still armed after event {round}"
        );
        assert!(u.arm_watch(key).is_ok());
    }
    assert!(
        !u.poll(&stats),
        "a watch's completions are nobody's work, and none is left"
    );

    u.unwatch(key);
    assert!(
        until(&u, &stats, |u| u.watches.borrow().is_empty()),
        "the dropped watch's slot was freed"
    );

    // Ended by the kernel with an error: a cancel stands in for one here.
    let key = u.watch(target);
    u.push(
        opcode::AsyncCancel::new(WATCH_BIT | key as u64)
            .build()
            .user_data(IGNORE_TOKEN),
    );
    assert!(
        until(&u, &stats, |u| !u.watches.borrow()[key].armed),
        "the cancelled poll ended"
    );
    let e = u
        .arm_watch(key)
        .expect_err("a failed watch is not armed again");
    assert_eq!(e.raw_os_error(), Some(libc::ECANCELED));
    u.unwatch(key);
    assert!(
        u.watches.borrow().is_empty(),
        "a disarmed watch goes at once"
    );
    // As a core's shutdown does: the wake read goes too (else its buffer is leaked).
    u.drain(&stats);
    // SAFETY: closing the eventfds made above.
    unsafe {
        libc::close(target);
        libc::close(fd);
    }
}

#[test]
fn a_ring_is_entered_by_its_registered_index_and_gives_it_back() {
    let fd = wake_fd();
    let stats = Stats::default();
    let registered = {
        let u = Uring::new(64, fd, None, 0).expect("an io_uring");
        if kernel() >= (5, 18) {
            assert!(
                u.registered(),
                "a 5.18+ kernel registers the ring's descriptor"
            );
        }
        // Submissions, completions, and waits with and without a timeout all go through
        // the index.
        nop_round_trip(&u, &stats);
        u.park(Some(Duration::from_millis(1)));
        nop_round_trip(&u, &stats);
        u.drain(&stats);
        u.registered()
    };
    if registered {
        // Each dropped ring gives its slot back: far more rings than a thread may register
        // at once (16) are all registered in turn.
        for _ in 0..40 {
            let u = Uring::new(8, fd, None, 0).expect("an io_uring");
            assert!(u.registered(), "the slots of dropped rings were given back");
            nop_round_trip(&u, &stats);
            u.drain(&stats);
        }
    }
    // SAFETY: closing the eventfd made above.
    unsafe { libc::close(fd) };
}
