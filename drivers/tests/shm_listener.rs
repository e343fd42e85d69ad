//! An shm listener under hostile or broken local processes. Any process in the network
//! namespace can connect to a listener's abstract name: connections that say nothing or send
//! junk are counted and dropped, never an error from `accept`, and a flood from one process is
//! bounded by the listener's caps, so it holds few of the listener's descriptors and delays
//! nobody else.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use barewire_drivers::{
    connect, Access, Buffer, ConnectOptions, Device, DriverConfig, DriverError, Endpoint, Listener,
    ListenerCounters, ListenerLimits, RegionDescriptor, Remote, Stag, WcStatus,
};
use barewire_engine::spawn_local;
use barewire_engine::time::sleep;
use barewire_test_support::{allow_fds, rt, shm_listener_address};

fn shm() -> Device {
    Device::open(&DriverConfig::parse("shm", None).unwrap()).unwrap()
}

/// A blocking Unix seqpacket socket, as any local process can open.
fn seqpacket() -> OwnedFd {
    // SAFETY: plain socket(2); the result is checked and owned.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: a descriptor we just created.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A connection to the shm name of the listener on 127.0.0.1:`port`, opened as any local
/// process can, with nothing said on it.
fn raw_connection(port: u16) -> OwnedFd {
    let fd = seqpacket();
    let (a, len) = shm_listener_address(port);
    // SAFETY: a valid address of the given length.
    let rc = unsafe { libc::connect(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) };
    assert_eq!(rc, 0, "connect: {}", std::io::Error::last_os_error());
    fd
}

/// Sends `junk` on a raw connection: not a setup message.
fn say(c: &OwnedFd, junk: &[u8]) {
    // SAFETY: writing from a live slice on a connected socket.
    let n = unsafe { libc::send(c.as_raw_fd(), junk.as_ptr().cast(), junk.len(), 0) };
    assert_eq!(
        n,
        junk.len() as isize,
        "{}",
        std::io::Error::last_os_error()
    );
}

/// The tests of this file run one at a time: one counts the process's descriptors, and the
/// others open hundreds.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// What the server thread reports: the listener's counters at each step.
type Report = mpsc::Receiver<ListenerCounters>;

/// Runs a listener with setup deadline `timeout` in a thread of its own (a sleeping core). It
/// accepts one peer in a task of its own while it reports its counters once `taken_in`
/// connections have come in, and again once the accept returned (which must be a queue pair:
/// the test fails if it is an error).
fn server(timeout: Duration, taken_in: u64) -> (u16, Report, std::thread::JoinHandle<()>) {
    let (port_tx, port_rx) = mpsc::channel();
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        rt().block_on(async move {
            let dev = shm();
            let opts = ConnectOptions {
                timeout,
                ..ConnectOptions::default()
            };
            let l = Rc::new(Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &opts).unwrap());
            port_tx.send(l.port()).unwrap();
            let acc = spawn_local({
                let l = l.clone();
                async move {
                    let pd = dev.alloc_pd().unwrap();
                    let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
                    let (qp, _) = l.accept(&pd, &scq, &rcq).await.expect("accept");
                    Endpoint::new(qp, scq, rcq)
                }
            });
            let t = Instant::now();
            while l.counters().connections < taken_in && t.elapsed() < Duration::from_secs(20) {
                sleep(Duration::from_millis(5)).await;
            }
            tx.send(l.counters()).unwrap();
            let ep = acc.await.expect("the accept task");
            tx.send(l.counters()).unwrap();
            drop(ep);
        })
    });
    (port_rx.recv().unwrap(), rx, t)
}

/// The thread of [`accept_all`]: what it returns once stopped.
type AcceptAll = std::thread::JoinHandle<(ListenerCounters, usize)>;

/// Runs a listener of `driver` with `limits` in a thread of its own that accepts every peer and holds its queue pair,
/// reporting how many it holds after each accept. Dropping the returned sender stops it; the
/// thread then returns the listener's counters and how many queue pairs it held.
fn accept_all(
    driver: &'static str,
    limits: ListenerLimits,
) -> (u16, mpsc::Receiver<usize>, mpsc::Sender<()>, AcceptAll) {
    let (port_tx, port_rx) = mpsc::channel();
    let (stop, stopped) = mpsc::channel::<()>();
    let (tx, report) = mpsc::channel();
    let t = std::thread::spawn(move || {
        rt().block_on(async move {
            let dev = Device::open(&DriverConfig::parse(driver, None).unwrap()).unwrap();
            let opts = ConnectOptions {
                limits,
                ..ConnectOptions::default()
            };
            let l = Rc::new(Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &opts).unwrap());
            port_tx.send(l.port()).unwrap();
            let held = Rc::new(std::cell::RefCell::new(Vec::new()));
            let acceptor = spawn_local({
                let (held, l) = (held.clone(), l.clone());
                async move {
                    let pd = dev.alloc_pd().unwrap();
                    loop {
                        let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
                        let (qp, _) = l.accept(&pd, &scq, &rcq).await.expect("accept");
                        held.borrow_mut().push(Endpoint::new(qp, scq, rcq));
                        let _ = tx.send(held.borrow().len());
                    }
                }
            });
            while stopped.try_recv() != Err(mpsc::TryRecvError::Disconnected) {
                sleep(Duration::from_millis(2)).await;
            }
            acceptor.cancel();
            let n = held.borrow().len();
            (l.counters(), n)
        })
    });
    (port_rx.recv().unwrap(), report, stop, t)
}

/// A good peer connects to `port` and is accepted; returns how long that took.
fn good_client(port: u16) -> Duration {
    rt().block_on(async move {
        let dev = shm();
        let pd = dev.alloc_pd().unwrap();
        let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
        let t = Instant::now();
        let (qp, _) = connect(
            ([127, 0, 0, 1], port).into(),
            &pd,
            &scq,
            &rcq,
            &ConnectOptions::default(),
        )
        .await
        .expect("a good peer connects");
        let took = t.elapsed();
        drop(qp);
        took
    })
}

/// A connection that sends junk, and one that says nothing until the setup deadline, are each
/// counted and closed; the accept that runs meanwhile returns the good peer after them.
#[test]
fn junk_and_silence_are_counted_and_the_accept_returns_the_next_good_peer() {
    let _serial = one_at_a_time();
    let (port, report, t) = server(Duration::from_millis(300), 2);
    let silent = raw_connection(port);
    let junk = raw_connection(port);
    say(&junk, b"GET / HTTP/1.1\r\n\r\n");
    let taken_in = report.recv().unwrap();
    assert_eq!(taken_in.connections, 2, "{taken_in:?}");
    // Past the silent one's deadline.
    std::thread::sleep(Duration::from_millis(600));
    good_client(port);
    let c = report.recv().unwrap();
    assert_eq!(
        (c.connections, c.bad_requests, c.timed_out, c.evicted),
        (3, 1, 1, 0),
        "{c:?}"
    );
    // The listener closed both: each reads the end of the connection.
    for fd in [&silent, &junk] {
        let mut b = [0u8; 64];
        // SAFETY: reading into a live buffer; blocking, and the peer has closed.
        let n = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
        assert_eq!(n, 0, "{}", std::io::Error::last_os_error());
    }
    t.join().unwrap();
}

/// One process opens 1,100 connections to the listener's name and says nothing on them (every
/// 11th sends junk). The listener hears at most 16 of them at once (its cap per process), so
/// it holds at most that many of their descriptors; every other one is pushed out or refused,
/// and counted. A good peer that connects after the flood is accepted without waiting for any
/// of them (their setup deadline is 20 s).
#[test]
fn a_flood_from_one_process_holds_few_descriptors_and_fails_no_accept() {
    let _serial = one_at_a_time();
    const FLOOD: usize = 1100;
    const PER_PROCESS: usize = 16;
    if !allow_fds(4096) {
        eprintln!("SKIP: RLIMIT_NOFILE cannot be raised to 4096 here");
        return;
    }
    let (port, report, t) = server(Duration::from_secs(20), FLOOD as u64);
    let before = open_fds();
    let mut held = Vec::new();
    for i in 0..FLOOD {
        let c = raw_connection(port);
        if i % 11 == 0 {
            say(&c, &[0xab; 64]);
        }
        held.push(c);
    }
    let flooded = report.recv().unwrap();
    assert_eq!(flooded.connections, FLOOD as u64, "{flooded:?}");
    // The flood's own descriptors, and at most the cap's worth on the listener's side (and a
    // few of its own): the tasks it pushed out close theirs when they are next scheduled.
    let bound = before + FLOOD + PER_PROCESS + 8;
    let t0 = Instant::now();
    while open_fds() > bound && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let fds = open_fds();
    assert!(
        fds <= bound,
        "{} descriptors besides the flood's own {FLOOD}, past the cap of {PER_PROCESS}",
        fds - before - FLOOD
    );
    let took = good_client(port);
    assert!(
        took < Duration::from_secs(2),
        "a good peer waited {took:?} behind the flood"
    );
    let c = report.recv().unwrap();
    assert_eq!(c.connections, FLOOD as u64 + 1, "{c:?}");
    assert!(
        c.evicted + c.bad_requests >= (FLOOD - PER_PROCESS) as u64,
        "{c:?}"
    );
    drop(held);
    t.join().unwrap();
}

/// One process holds at most 256 of a listener's accepted connections at once: the next is
/// closed at once and its connect fails. Once one of them fails (its peer went), another gets
/// in, though the listener's application still holds the failed queue pair.
#[test]
fn one_process_holds_at_most_256_open_connections_and_a_failed_one_frees_its_place() {
    let _serial = one_at_a_time();
    const PER_PROCESS: usize = 256;
    if !allow_fds(4096) {
        eprintln!("SKIP: RLIMIT_NOFILE cannot be raised to 4096 here");
        return;
    }
    let (port, report, stop, t) = accept_all("shm", ListenerLimits::default());
    rt().block_on(async {
        let dev = shm();
        let pd = dev.alloc_pd().unwrap();
        let opts = ConnectOptions::default();
        let mut mine = Vec::new();
        for i in 0..PER_PROCESS {
            let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
            let (qp, _) = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
                .await
                .unwrap_or_else(|e| panic!("connection {i}: {e}"));
            mine.push(qp);
            assert_eq!(report.recv().unwrap(), i + 1, "accepted in order");
        }
        let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
        let over = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts).await;
        let e = over.err().expect("the 257th connection is refused");
        assert!(e.to_string().contains("over its connection limits"), "{e}");
        // One of ours goes, so the listener's side of it fails: its place is free again.
        drop(mine.pop());
        let t = std::time::Instant::now();
        let qp = loop {
            match connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts).await {
                Ok((qp, _)) => break qp,
                Err(e) if t.elapsed() < Duration::from_secs(5) => {
                    assert!(e.to_string().contains("over its connection limits"), "{e}");
                    sleep(Duration::from_millis(20)).await;
                }
                Err(e) => panic!("the failed connection's place was never freed: {e}"),
            }
        };
        assert_eq!(report.recv().unwrap(), PER_PROCESS + 1);
        drop((qp, mine));
    });
    drop(stop);
    let (c, held) = t.join().unwrap();
    assert_eq!(held, PER_PROCESS + 1, "every queue pair still held");
    assert!(c.over_limit >= 1, "{c:?}");
    assert_eq!(
        c.connections - c.over_limit,
        PER_PROCESS as u64 + 1,
        "{c:?}"
    );
}

/// A process whose peers ask for keys they may not use is refused for a while: each such
/// request ends its connection, and after the listener's budget of them (three here) within
/// its window the process's next connect is closed at once and says why. The listener counts
/// the violations and the refusal.
#[test]
fn a_process_that_asks_for_keys_it_may_not_use_is_refused_for_a_while() {
    let _serial = one_at_a_time();
    const BUDGET: u32 = 3;
    let limits = ListenerLimits {
        violation_budget: BUDGET as usize,
        ..ListenerLimits::default()
    };
    let (port, report, stop, t) = accept_all("shm", limits);
    rt().block_on(async {
        let dev = shm();
        let pd = dev.alloc_pd().unwrap();
        let opts = ConnectOptions::default();
        let buf = Buffer::new(&pd, 64, 64, Access::LOCAL_WRITE).unwrap();
        for guess in 0..BUDGET {
            let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
            let (qp, _) = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
                .await
                .unwrap_or_else(|e| panic!("connection {guess}: {e}"));
            assert_eq!(report.recv().unwrap(), guess as usize + 1);
            let ep = Endpoint::new(qp, scq, rcq);
            let made_up = RegionDescriptor {
                addr: 1 << 40,
                len: 4096,
                rkey: Stag(0x5eed_0000 + guess),
            };
            match ep.read(&buf, 0, 8, Remote::at(made_up, 0)).await {
                Err(DriverError::Completion { status, .. }) => {
                    assert_eq!(status, WcStatus::RemAccessErr, "guess {guess}")
                }
                other => panic!("guess {guess}: {other:?}"),
            }
        }
        let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
        let e = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
            .await
            .err()
            .expect("the connection after the budget is refused");
        assert!(
            e.to_string().contains("banned for protection violations"),
            "{e}"
        );
    });
    drop(stop);
    let (c, _) = t.join().unwrap();
    assert_eq!((c.violations, c.banned), (BUDGET as u64, 1), "{c:?}");
}

/// A connect to a name whose holder takes no connections (a stopped listener: its backlog
/// stays full) ends at its setup timeout and says why, not "Resource temporarily unavailable".
#[test]
fn a_connect_that_finds_the_backlog_full_for_its_whole_timeout_says_so() {
    let _serial = one_at_a_time();
    let port_holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = port_holder.local_addr().unwrap().port();
    let name_holder = seqpacket();
    let (a, len) = shm_listener_address(port);
    // SAFETY: a valid address of the given length; a backlog with room for one connection.
    unsafe {
        let at = (&a as *const libc::sockaddr_un).cast();
        assert_eq!(libc::bind(name_holder.as_raw_fd(), at, len), 0);
        assert_eq!(libc::listen(name_holder.as_raw_fd(), 0), 0);
    }
    let _waiting = raw_connection(port);
    rt().block_on(async {
        let dev = shm();
        let pd = dev.alloc_pd().unwrap();
        let timeout = Duration::from_millis(200);
        let opts = ConnectOptions {
            timeout,
            ..ConnectOptions::default()
        };
        let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
        let t0 = Instant::now();
        let e = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
            .await
            .err()
            .expect("nobody accepts");
        let took = t0.elapsed();
        assert!(e.to_string().contains("backlog was full"), "{e}");
        assert!(took >= timeout && took < Duration::from_secs(5), "{took:?}");
    });
}

/// The same limits reach the software provider's listener: with two connections allowed per
/// source address, a third from 127.0.0.1 is closed at once.
#[test]
fn the_limits_reach_the_software_providers_listener_too() {
    let _serial = one_at_a_time();
    let limits = ListenerLimits {
        max_connections_per_source: 2,
        ..ListenerLimits::default()
    };
    let (port, report, stop, t) = accept_all("soft", limits);
    rt().block_on(async {
        let dev = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let opts = dev.connect_options();
        let mut mine = Vec::new();
        for i in 0..2 {
            let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
            let (qp, _) = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
                .await
                .unwrap_or_else(|e| panic!("connection {i}: {e}"));
            mine.push(qp);
            assert_eq!(report.recv().unwrap(), i + 1);
        }
        let (scq, rcq) = (dev.create_cq(8).unwrap(), dev.create_cq(8).unwrap());
        let e = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
            .await
            .err()
            .expect("a third connection from one address is refused");
        assert!(e.to_string().contains("connection limits"), "{e}");
        drop(mine);
    });
    drop(stop);
    let (c, held) = t.join().unwrap();
    assert_eq!((held, c.over_limit), (2, 1), "{c:?}");
}
