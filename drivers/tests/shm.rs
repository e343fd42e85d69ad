//! The shm backend's own behaviour, beyond the conformance suite (which also runs on it): Sends
//! larger than the ring, receives posted late, cores that sleep, memory it cannot share, and
//! the errors it gives for peers it cannot reach.

use std::sync::mpsc;
use std::time::Duration;

use barewire_drivers::{
    connect, Access, Buffer, CompletionQueue, ConnectOptions, Device, DriverConfig, DriverError,
    Endpoint, Listener, QueuePair, Remote, SendOp, SendWr, WcOpcode, WcStatus, WorkCompletion,
};
use barewire_test_support::rt;

fn shm() -> Device {
    Device::open(&DriverConfig::parse("shm", None).unwrap()).unwrap()
}

const ALL: Access = Access::LOCAL_WRITE;

/// Runs `serve` on a listener in a thread of its own (a sleeping core), and returns its port
/// and the thread.
fn server<F, Fut>(serve: F) -> (u16, std::thread::JoinHandle<()>)
where
    F: FnOnce(Listener, Device) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        rt().block_on(async move {
            let dev = shm();
            let l = Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &ConnectOptions::default())
                .unwrap();
            tx.send(l.port()).unwrap();
            serve(l, dev).await;
        })
    });
    (rx.recv().unwrap(), t)
}

async fn client(port: u16) -> (Endpoint, Device, barewire_drivers::ProtectionDomain) {
    let (qp, scq, rcq, dev, pd) = raw_client(port).await;
    (Endpoint::new(qp, scq, rcq), dev, pd)
}

/// The listener's next peer, as an endpoint on `pd` with completion queues of `depth` entries.
async fn accepted(
    l: &Listener,
    dev: &Device,
    pd: &barewire_drivers::ProtectionDomain,
    depth: usize,
) -> Endpoint {
    let (scq, rcq) = (dev.create_cq(depth).unwrap(), dev.create_cq(depth).unwrap());
    let (qp, _) = l.accept(pd, &scq, &rcq).await.unwrap();
    Endpoint::new(qp, scq, rcq)
}

/// A raw connection to the server on `port`: the queue pair, its send and receive completion
/// queues (256 entries each), the device and the protection domain.
async fn raw_client(
    port: u16,
) -> (
    QueuePair,
    CompletionQueue,
    CompletionQueue,
    Device,
    barewire_drivers::ProtectionDomain,
) {
    let dev = shm();
    let pd = dev.alloc_pd().unwrap();
    let (scq, rcq) = (dev.create_cq(256).unwrap(), dev.create_cq(256).unwrap());
    let (qp, _) = connect(
        ([127, 0, 0, 1], port).into(),
        &pd,
        &scq,
        &rcq,
        &ConnectOptions::default(),
    )
    .await
    .unwrap();
    (qp, scq, rcq, dev, pd)
}

/// Connects and receives the region descriptor the server sends first. Returns a 64 KiB local
/// buffer with it.
async fn told_region(
    port: u16,
) -> (
    Endpoint,
    std::rc::Rc<Buffer>,
    barewire_drivers::RegionDescriptor,
    Device,
) {
    told_region_with(port, 65536).await
}

/// As `told_region`, with a local buffer of `len` bytes.
async fn told_region_with(
    port: u16,
    len: usize,
) -> (
    Endpoint,
    std::rc::Rc<Buffer>,
    barewire_drivers::RegionDescriptor,
    Device,
) {
    let (ep, dev, pd) = client(port).await;
    let buf = Buffer::new(&pd, len, 4096, ALL).unwrap();
    let d = ep.recv(&buf, 0, 64).await.unwrap();
    assert_eq!(d.byte_len, 20);
    let mut b = [0u8; 20];
    buf.read_at(0, &mut b);
    let region = barewire_drivers::RegionDescriptor::from_bytes(&b).unwrap();
    (ep, buf, region, dev)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 11) as u8)
        .collect()
}

/// A 3 MiB Send (three times the ring) arrives whole, in order with the small Sends around it,
/// into receives the server posts only after the Sends were posted; the receiving core sleeps
/// between them and is woken by the ring's writer.
#[test]
fn sends_larger_than_the_ring_and_late_receives_arrive_whole_and_in_order() {
    const BIG: usize = 3 << 20;
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let ep = accepted(&l, &dev, &pd, 256).await;
        let buf = Buffer::new(&pd, 8 << 20, 4096, ALL).unwrap();
        // The client's Sends are posted by now (it waits for nothing); the receives come late.
        barewire_engine::time::sleep(Duration::from_millis(100)).await;
        let mut sizes = Vec::new();
        for (i, at) in [0usize, 4 << 20, 4096].into_iter().enumerate() {
            let wc = ep.recv(&buf, at, if i == 1 { 4 << 20 } else { 4096 }).await;
            let wc = wc.unwrap();
            assert_eq!(wc.opcode, WcOpcode::Recv);
            sizes.push(wc.byte_len as usize);
        }
        assert_eq!(sizes, [5, BIG, 7]);
        let mut got = vec![0u8; BIG];
        buf.read_at(4 << 20, &mut got);
        assert!(got == pattern(BIG, 3), "the big Send's bytes");
        let mut small = [0u8; 7];
        buf.read_at(4096, &mut small);
        assert_eq!(&small, b"goodbye");
        // Answer, so the client knows the check ran.
        buf.write_at(0, b"ok");
        ep.send(&buf, 0, 2).await.unwrap();
    });
    rt().block_on(async {
        let (ep, _dev, pd) = client(port).await;
        let buf = Buffer::new(&pd, 8 << 20, 4096, ALL).unwrap();
        buf.write_at(0, b"hello");
        buf.write_at(4096, &pattern(BIG, 3));
        buf.write_at(4 << 20, b"goodbye");
        let reply = ep.recv(&buf, 6 << 20, 64);
        let a = ep.send(&buf, 0, 5);
        let b = ep.send(&buf, 4096, BIG);
        let c = ep.send(&buf, 4 << 20, 7);
        a.await.unwrap();
        b.await.unwrap();
        c.await.unwrap();
        let wc = barewire_engine::time::timeout(Duration::from_secs(10), reply)
            .await
            .expect("the server answers")
            .unwrap();
        assert_eq!(wc.byte_len, 2);
    });
    t.join().unwrap();
}

/// A Write with immediate data wakes a receiver whose core sleeps, and its data is in place
/// when the receive completes; a receive too small for a Send fails with a length error, and
/// the Send with the responder's error (`REM_INV_REQ_ERR`).
#[test]
fn immediate_data_wakes_a_sleeping_receiver_and_a_short_receive_is_a_length_error() {
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let region = Buffer::new(&pd, 65536, 4096, all).unwrap();
        let ep = accepted(&l, &dev, &pd, 256).await;
        let msg = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        // Tell the client where to write.
        msg.write_at(0, &region.descriptor().to_bytes());
        let imm = ep.recv(&msg, 1024, 16);
        ep.send(&msg, 0, 20).await.unwrap();
        let wc = imm.await.unwrap();
        assert_eq!(
            (wc.opcode, wc.imm, wc.byte_len),
            (WcOpcode::RecvRdmaWithImm, Some(77), 40_000)
        );
        let mut got = vec![0u8; 40_000];
        region.read_at(1000, &mut got);
        assert!(
            got == pattern(40_000, 9),
            "the data is in place with the notice"
        );
        // A 16-byte receive for a 100-byte Send.
        let short = ep.recv(&msg, 2048, 16).await;
        match short {
            Err(DriverError::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::LocLenErr)
            }
            other => panic!("expected a length error, got {other:?}"),
        }
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        // Let the server's core go to sleep first.
        barewire_engine::time::sleep(Duration::from_millis(200)).await;
        buf.write_at(4096, &pattern(40_000, 9));
        ep.write_with_imm(&buf, 4096, 40_000, Remote::at(region, 1000), 77)
            .await
            .unwrap();
        barewire_engine::time::sleep(Duration::from_millis(100)).await;
        // The Send the peer could not place fails here too, as verbs reports a responder's
        // length error to the requester (it used to complete successfully).
        let e = ep.send(&buf, 4096, 100).await.unwrap_err();
        assert!(
            matches!(
                e,
                DriverError::Completion {
                    status: WcStatus::RemInvReqErr,
                    ..
                }
            ),
            "{e:?}"
        );
    });
    t.join().unwrap();
}

/// A side that asks to watch its memory (`QueuePair::watch_memory`) sees the peer's plain
/// Writes, with no immediate data and no receive, from a poller that looks at the memory, and a
/// Write that lands while its core sleeps wakes the core. Without the wake the core would sleep
/// until its 5 s timer.
#[test]
fn a_watched_region_wakes_its_sleeping_core_on_a_plain_write() {
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::task::{Poll, Waker};

    /// Wakes its task once the region's last written word is non-zero.
    struct Watch {
        region: Rc<Buffer>,
        at: usize,
        waker: Rc<RefCell<Option<Waker>>>,
    }
    impl barewire_engine::Poller for Watch {
        fn poll(&mut self) -> bool {
            let landed = self.region.load_u64(self.at) != 0;
            if landed {
                if let Some(w) = self.waker.borrow_mut().take() {
                    w.wake();
                    return true;
                }
            }
            false
        }
        fn pure_poll(&mut self) -> bool {
            self.region.load_u64(self.at) != 0 && self.waker.borrow().is_some()
        }
    }

    const LEN: usize = 40_000;
    /// What the client writes: a pattern whose last word (the watched one) is non-zero.
    fn watched_data() -> Vec<u8> {
        let mut data = pattern(LEN, 5);
        data[LEN - 8..].copy_from_slice(&u64::MAX.to_ne_bytes());
        data
    }
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let (scq, rcq) = (dev.create_cq(256).unwrap(), dev.create_cq(256).unwrap());
        let region = Buffer::new(&pd, 65536, 4096, ALL | Access::REMOTE_WRITE).unwrap();
        let (qp, _) = l.accept(&pd, &scq, &rcq).await.unwrap();
        assert!(qp.watch_memory(), "shm lets memory be watched");
        let ep = Endpoint::new(qp, scq, rcq);
        let msg = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        msg.write_at(0, &region.descriptor().to_bytes());
        ep.send(&msg, 0, 20).await.unwrap();
        let waker = Rc::new(RefCell::new(None));
        let last = 1000 + LEN - 8;
        barewire_engine::register_poller(Box::new(Watch {
            region: region.clone(),
            at: last,
            waker: waker.clone(),
        }));
        let start = std::time::Instant::now();
        // The fallback that a lost wake-up would leave: a timer 5 s out.
        let fallback =
            barewire_engine::spawn_local(barewire_engine::time::sleep(Duration::from_secs(5)));
        std::future::poll_fn(|cx| {
            if region.load_u64(last) != 0 {
                return Poll::Ready(());
            }
            *waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        let waited = start.elapsed();
        drop(fallback);
        assert!(
            waited < Duration::from_secs(3),
            "the Write landed about 0.2 s in, but the sleeping core saw it only after {waited:?}"
        );
        let mut got = vec![0u8; LEN];
        region.read_at(1000, &mut got);
        assert!(got == watched_data(), "the whole Write is there");
        // Tell the writer it may go.
        ep.send(&msg, 0, 1).await.unwrap();
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        // Let the server's core go to sleep first.
        barewire_engine::time::sleep(Duration::from_millis(200)).await;
        // Posted first: the server's word comes just before it goes.
        let go = ep.recv(&buf, 0, 64);
        buf.write_at(4096, &watched_data());
        ep.write(&buf, 4096, LEN, Remote::at(region, 1000))
            .await
            .unwrap();
        go.await.unwrap();
    });
    t.join().unwrap();
}

/// Remote rights on memory barewire did not allocate are refused with a message that says
/// what to do; local-only registrations of it are fine.
#[test]
fn raw_memory_with_remote_rights_is_refused_with_a_clear_error() {
    let dev = shm();
    let pd = dev.alloc_pd().unwrap();
    let mut mem = vec![0u8; 4096];
    // SAFETY: `mem` outlives both registrations (they are dropped first).
    let local = unsafe { pd.register(mem.as_mut_ptr(), 4096, Access::LOCAL_WRITE) };
    assert!(local.is_ok());
    drop(local);
    // SAFETY: as above.
    let remote = unsafe {
        pd.register(
            mem.as_mut_ptr(),
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_READ,
        )
    };
    let msg = remote.err().expect("refused").to_string();
    assert!(
        msg.contains("Buffer::new") && msg.contains("BAREWIRE_DRIVER=soft"),
        "{msg}"
    );
}

/// This machine's memory and swap together, in bytes (`/proc/meminfo`).
fn memory_and_swap() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |key: &str| -> u64 {
        let line = info.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    (kib("MemTotal:") + kib("SwapTotal:")) * 1024
}

/// A buffer larger than this machine's memory and swap is refused when it is made, on shm as
/// on soft (whose large buffers are anonymous mappings, which the kernel's default overcommit
/// policy refuses at that size), rather than made and left for the first touch of its missing
/// pages to end in the OOM killer. One aligned to more than a page is refused too, not an
/// abort of the process.
#[test]
fn a_buffer_beyond_memory_and_swap_is_refused_at_once() {
    let len = (memory_and_swap() + (1 << 30)) as usize;
    let heuristic =
        std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "0");
    let drivers: &[&str] = if heuristic {
        &["shm", "soft"]
    } else {
        eprintln!("SKIP (soft): the kernel's overcommit policy is not its default heuristic");
        &["shm"]
    };
    // The error `driver` gives for the buffer aligned to `align`: it must say `what`.
    let refused = |driver: &str, align: usize, what: String| {
        let dev = Device::open(&DriverConfig::parse(driver, None).unwrap()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let e = Buffer::new(&pd, len, align, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .err()
            .unwrap_or_else(|| panic!("{driver}: a buffer of {len} B aligned {align} was made"));
        let msg = e.to_string();
        assert!(
            matches!(e, DriverError::OutOfMemory(_))
                && msg.contains(&what)
                && msg.contains("Cannot allocate memory"),
            "{driver}: {msg}"
        );
        // What fits is still made.
        assert!(Buffer::new(&pd, 1 << 20, 4096, Access::LOCAL_WRITE).is_ok());
    };
    for driver in drivers {
        refused(driver, 4096, format!("mapping a buffer of {len} B"));
    }
    if heuristic {
        // Aligned to more than a page, soft's buffer comes from the allocator, whose failure
        // used to abort the process.
        refused(
            "soft",
            8192,
            format!("allocating a buffer of {len} B aligned 8192"),
        );
    }
}

/// A buffer aligned to more than a page (here 2 MiB, as for huge pages) is made on shm
/// (it used to be refused), starts on its alignment, and serves a peer's WRITE and READ.
#[test]
fn a_buffer_aligned_to_more_than_a_page_is_made_and_served() {
    const ALIGN: usize = 2 << 20;
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let region = Buffer::new(
            &pd,
            65536,
            ALIGN,
            ALL | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
        assert_eq!(region.descriptor().addr % ALIGN as u64, 0, "aligned");
        let ep = accepted(&l, &dev, &pd, 64).await;
        let msg = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        msg.write_at(0, &region.descriptor().to_bytes());
        let done = ep.recv(&msg, 1024, 16);
        ep.send(&msg, 0, 20).await.unwrap();
        done.await.unwrap();
        let mut got = vec![0u8; 40_000];
        region.read_at(1000, &mut got);
        assert!(got == pattern(40_000, 3), "the peer's WRITE is in place");
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        buf.write_at(0, &pattern(40_000, 3));
        ep.write(&buf, 0, 40_000, Remote::at(region, 1000))
            .await
            .unwrap();
        ep.read(&buf, 40_000, 20_000, Remote::at(region, 1000))
            .await
            .unwrap();
        let mut back = vec![0u8; 20_000];
        buf.read_at(40_000, &mut back);
        assert!(back == pattern(40_000, 3)[..20_000], "READ returns it");
        ep.send(&buf, 0, 1).await.unwrap();
    });
    t.join().unwrap();
    // Several in a row, each on its alignment.
    let dev = shm();
    let pd = dev.alloc_pd().unwrap();
    for align in [8192, 65536, ALIGN] {
        let b = Buffer::new(&pd, 4096, align, ALL).unwrap();
        assert_eq!(b.descriptor().addr % align as u64, 0, "{align}");
    }
}

/// Connecting where no shm listener is, or to an address of another host, says so.
#[test]
fn unreachable_peers_are_clear_errors() {
    rt().block_on(async {
        let dev = shm();
        let pd = dev.alloc_pd().unwrap();
        let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
        // A port with nothing on it (bound and released just now).
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let opts = ConnectOptions::default();
        let e = connect(([127, 0, 0, 1], port).into(), &pd, &scq, &rcq, &opts)
            .await
            .err()
            .expect("nobody listens");
        assert!(e.to_string().contains("no shm listener"), "{e}");
        // TEST-NET-1 (RFC 5737): never an address of this host.
        let e = connect(([192, 0, 2, 1], 7000).into(), &pd, &scq, &rcq, &opts)
            .await
            .err()
            .expect("not this host");
        assert!(e.to_string().contains("not an address of this host"), "{e}");
    });
}

/// Everything a queue pair posted completes when the peer goes: here the peer's queue pair is
/// dropped while our receives wait, and they flush; later posts flush too.
#[test]
fn a_peer_that_goes_away_flushes_what_waits() {
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
        let (qp, _) = l.accept(&pd, &scq, &rcq).await.unwrap();
        barewire_engine::time::sleep(Duration::from_millis(50)).await;
        drop(qp);
    });
    rt().block_on(async {
        let (ep, _dev, pd) = client(port).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        let r = barewire_engine::time::timeout(Duration::from_secs(5), ep.recv(&buf, 0, 64))
            .await
            .expect("flushed, not hung");
        match r {
            Err(DriverError::Completion { status, .. }) => assert!(
                matches!(status, WcStatus::WrFlushErr | WcStatus::RetryExcErr),
                "{status:?}"
            ),
            other => panic!("expected a flush, got {other:?}"),
        }
        match ep.send(&buf, 0, 8).await {
            Err(DriverError::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::WrFlushErr)
            }
            other => panic!("expected a flush, got {other:?}"),
        }
    });
    t.join().unwrap();
}

/// A local invalidate of a key the peer holds a mapping of revokes it, in order with the
/// owner's later Sends: once the peer has the Send, the key is refused.
#[test]
fn a_local_invalidate_revokes_the_peers_mapping_before_later_sends() {
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let region = Buffer::new(&pd, 4096, 4096, all).unwrap();
        region.write_at(0, &[0x61; 4096]);
        let ep = accepted(&l, &dev, &pd, 64).await;
        let msg = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        msg.write_at(0, &region.descriptor().to_bytes());
        let go = ep.recv(&msg, 1024, 16);
        ep.send(&msg, 0, 20).await.unwrap();
        go.await.unwrap(); // the client read the region
        let stag = region.descriptor().rkey;
        ep.execute(
            barewire_drivers::SendOp::LocalInvalidate { stag },
            vec![],
            vec![],
            false,
        )
        .await
        .unwrap();
        ep.send(&msg, 0, 4).await.unwrap();
        // Stay until the client is done.
        let _ = ep.recv(&msg, 2048, 16).await;
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        ep.read(&buf, 4096, 4096, Remote::at(region, 0))
            .await
            .unwrap();
        let mut back = [0u8; 4096];
        buf.read_at(4096, &mut back);
        assert!(back.iter().all(|&x| x == 0x61));
        let after = ep.recv(&buf, 0, 64);
        ep.send(&buf, 100, 1).await.unwrap();
        after.await.unwrap();
        match ep.read(&buf, 4096, 8, Remote::at(region, 0)).await {
            Err(DriverError::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::RemAccessErr)
            }
            other => panic!("an invalidated key still served: {other:?}"),
        }
    });
    t.join().unwrap();
}

/// A Send with Invalidate naming `region`'s key, `len` bytes from `buf` at 4096.
fn send_invalidate(
    ep: &Endpoint,
    buf: &std::rc::Rc<Buffer>,
    region: barewire_drivers::RegionDescriptor,
) -> barewire_drivers::Op {
    ep.execute(
        barewire_drivers::SendOp::Send {
            solicited: false,
            invalidate: Some(region.rkey),
        },
        vec![buf.sge(4096, 8)],
        vec![buf.clone()],
        false,
    )
}

/// A server that posts a receive (into `msg` at 1024), sends a 4 KiB remotely writable
/// region's descriptor, then runs `check` with the endpoint, the region, `msg` and the
/// receive.
fn region_server<F, Fut>(check: F) -> (u16, std::thread::JoinHandle<()>)
where
    F: FnOnce(Endpoint, std::rc::Rc<Buffer>, std::rc::Rc<Buffer>, barewire_drivers::Op) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()>,
{
    region_server_with(4096, Access::REMOTE_WRITE, check)
}

/// As `region_server`, with a region of `len` bytes and the remote rights `remote`.
fn region_server_with<F, Fut>(
    len: usize,
    remote: Access,
    check: F,
) -> (u16, std::thread::JoinHandle<()>)
where
    F: FnOnce(Endpoint, std::rc::Rc<Buffer>, std::rc::Rc<Buffer>, barewire_drivers::Op) -> Fut
        + Send
        + 'static,
    Fut: std::future::Future<Output = ()>,
{
    server(move |l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let region = Buffer::new(&pd, len, 4096, ALL | remote).unwrap();
        let ep = accepted(&l, &dev, &pd, 64).await;
        let msg = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        msg.write_at(0, &region.descriptor().to_bytes());
        let first = ep.recv(&msg, 1024, 16);
        ep.send(&msg, 0, 20).await.unwrap();
        check(ep, region, msg, first).await
    })
}

/// A Send with Invalidate: the receiver's completion names the key, and the sender's Write to
/// it afterwards fails and changes nothing.
#[test]
fn a_send_with_invalidate_kills_the_named_key() {
    let (port, t) = region_server(|ep, region, msg, first| async move {
        let wc = first.await.unwrap();
        assert_eq!(wc.invalidated, Some(region.descriptor().rkey.0));
        assert_eq!(wc.byte_len, 8);
        // Stay until the client is done.
        let _ = ep.recv(&msg, 2048, 16).await;
        // The client's Write before the Send landed; the one after it did not.
        let mut got = [0u8; 16];
        region.read_at(0, &mut got);
        assert_eq!(got, [[7u8; 8], [0u8; 8]].concat()[..]);
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        buf.write_at(4096, &[7u8; 16]);
        ep.write(&buf, 4096, 8, Remote::at(region, 0))
            .await
            .unwrap();
        send_invalidate(&ep, &buf, region).await.unwrap();
        match ep.write(&buf, 4096 + 8, 8, Remote::at(region, 8)).await {
            Err(DriverError::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::RemAccessErr)
            }
            other => panic!("a Write to an invalidated key went through: {other:?}"),
        }
    });
    t.join().unwrap();
}

/// A Send completes once the peer has taken it into a posted receive, as verbs completes one
/// once the responder has placed it: not while the peer has no receive for it, and never
/// successfully when the peer goes away before taking it. (It used to complete as soon as it
/// was in the peer's ring: a success for a message the peer might never see.)
#[test]
fn a_send_completes_once_the_peer_has_taken_it() {
    // The client says when it has seen its Sends wait; only then does the server post.
    let (go, wait) = mpsc::channel::<()>();
    let (port, t) = server(move |l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let ep = accepted(&l, &dev, &pd, 16).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        while wait.try_recv().is_err() {
            barewire_engine::time::sleep(Duration::from_millis(1)).await;
        }
        // One receive: it takes the first Send only.
        assert_eq!(ep.recv(&buf, 0, 4096).await.unwrap().byte_len, 100);
        barewire_engine::time::sleep(Duration::from_millis(50)).await;
        // Gone, with the second Send untaken.
    });
    rt().block_on(async {
        let (ep, _dev, pd) = client(port).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        let (mut first, second) = (ep.send(&buf, 0, 100), ep.send(&buf, 0, 200));
        // In the peer's ring, with no receive there: not complete (it was, before, at once).
        let early = barewire_engine::time::timeout(Duration::from_millis(50), &mut first).await;
        assert!(
            early.is_err(),
            "completed before the peer had a receive: {early:?}"
        );
        go.send(()).unwrap();
        first.await.unwrap();
        let e = second.await.unwrap_err();
        assert!(
            matches!(
                e,
                DriverError::Completion {
                    status: WcStatus::WrFlushErr | WcStatus::RetryExcErr,
                    ..
                }
            ),
            "{e:?}"
        );
    });
    t.join().unwrap();
}

/// A Send to a peer that runs but has posted no receive waits for one, however long past the
/// connection's timeout: the peer has looked at it (it holds it for want of a receive, as a
/// verbs responder answers "receiver not ready"), so it is not taken for a stopped peer. It
/// completes once the receive comes. (A stopped peer never looks, and the conformance test
/// `sends_to_a_stopped_peer_fail_within_the_bound` sees its Sends fail.)
#[test]
fn a_send_waits_past_the_timeout_for_a_running_peer_to_post_a_receive() {
    let late = 2 * ConnectOptions::default().timeout;
    let (port, t) = server(move |l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let ep = accepted(&l, &dev, &pd, 16).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        // The core sleeps meanwhile; the client's Send wakes it.
        barewire_engine::time::sleep(late).await;
        assert_eq!(ep.recv(&buf, 0, 4096).await.unwrap().byte_len, 100);
    });
    rt().block_on(async {
        let (ep, _dev, pd) = client(port).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        let t0 = std::time::Instant::now();
        let r = ep.send(&buf, 0, 100).await;
        assert!(r.is_ok(), "{r:?} after {:?}", t0.elapsed());
        assert!(
            t0.elapsed() >= late - Duration::from_millis(200),
            "completed after {:?}, before the peer posted its receive",
            t0.elapsed()
        );
    });
    t.join().unwrap();
}

/// A peer whose core hangs (here, blocked in a system call) with a Send of ours unlooked at
/// fails that Send with `RETRY_EXC_ERR` within the connection's timeout and a little more,
/// whether this side's core sleeps meanwhile (a timer wakes it) or keeps busy (its poller
/// looks at the clock).
fn a_hung_peer_fails_a_send_within_the_timeout(busy: bool) {
    let timeout = ConnectOptions::default().timeout;
    let (port, t) = server(move |l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let _ep = accepted(&l, &dev, &pd, 16).await;
        // Hung: the core runs nothing for three timeouts.
        std::thread::sleep(3 * timeout);
    });
    rt().block_on(async {
        let (ep, _dev, pd) = client(port).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        let spin = busy.then(|| {
            barewire_engine::spawn_local(async {
                loop {
                    barewire_engine::yield_now().await;
                }
            })
        });
        let t0 = std::time::Instant::now();
        let r = barewire_engine::time::timeout(3 * timeout, ep.send(&buf, 0, 100))
            .await
            .expect("the Send completes before the peer runs again");
        let took = t0.elapsed();
        assert!(
            matches!(
                r,
                Err(DriverError::Completion {
                    status: WcStatus::RetryExcErr,
                    ..
                })
            ),
            "{r:?}"
        );
        assert!(
            took >= timeout && took < timeout + Duration::from_secs(1),
            "failed after {took:?}"
        );
        if let Some(s) = spin {
            s.cancel();
        }
    });
    t.join().unwrap();
}

#[test]
fn a_hung_peer_fails_a_send_within_the_timeout_on_a_sleeping_core() {
    a_hung_peer_fails_a_send_within_the_timeout(false);
}

#[test]
fn a_hung_peer_fails_a_send_within_the_timeout_on_a_busy_core() {
    a_hung_peer_fails_a_send_within_the_timeout(true);
}

/// An unsignaled Send the receiver cannot place (its receive is too short) completes anyway,
/// with the responder's error, as a failed request does on verbs signaled or not; the
/// unsignaled Send before it, which the receiver took, completes with nothing.
#[test]
fn an_unsignaled_send_that_fails_at_the_receiver_still_completes_with_its_error() {
    let (port, t) = server(|l, dev| async move {
        let pd = dev.alloc_pd().unwrap();
        let ep = accepted(&l, &dev, &pd, 16).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        assert_eq!(ep.recv(&buf, 0, 4096).await.unwrap().byte_len, 10);
        let short = ep.recv(&buf, 0, 16).await;
        assert!(
            matches!(
                short,
                Err(DriverError::Completion {
                    status: WcStatus::LocLenErr,
                    ..
                })
            ),
            "{short:?}"
        );
    });
    rt().block_on(async {
        let (qp, scq, _rcq, _dev, pd) = raw_client(port).await;
        let buf = Buffer::new(&pd, 4096, 64, ALL).unwrap();
        let send = |wr_id, len| SendWr {
            wr_id,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sges: [buf.sge(0, len)].into(),
            signaled: false,
            fence: false,
        };
        qp.post_send(send(1, 10)).unwrap();
        qp.post_send(send(2, 100)).unwrap();
        let t0 = std::time::Instant::now();
        let mut got = Vec::new();
        while got.is_empty() && t0.elapsed() < Duration::from_secs(5) {
            let mut out = [WorkCompletion::BLANK; 4];
            let n = scq.poll(&mut out);
            got.extend_from_slice(&out[..n]);
            barewire_engine::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!((got[0].wr_id, got[0].status), (2, WcStatus::RemInvReqErr));
    });
    t.join().unwrap();
}

/// A Send with Invalidate naming a key the receiver cannot invalidate (here, one already
/// dead) breaks the protocol: the receiver ends the connection, and both sides see it. The
/// Send itself does not complete successfully: a Send completes once the peer has taken it,
/// and this one it refused.
#[test]
fn a_send_that_invalidates_a_dead_key_ends_the_connection() {
    let (port, t) = region_server(|ep, region, msg, first| async move {
        let first = first.await.unwrap();
        assert_eq!(first.invalidated, Some(region.descriptor().rkey.0));
        let second = ep.recv(&msg, 2048, 16);
        let second = barewire_engine::time::timeout(Duration::from_secs(10), second).await;
        assert!(
            matches!(second, Ok(Err(_))),
            "the second invalidation of a dead key ended the connection: {second:?}"
        );
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        // Posted first: it fails when the server ends the connection.
        let ended = ep.recv(&buf, 0, 64);
        send_invalidate(&ep, &buf, region).await.unwrap();
        let refused = send_invalidate(&ep, &buf, region).await;
        assert!(refused.is_err(), "{refused:?}");
        let ended = barewire_engine::time::timeout(Duration::from_secs(10), ended).await;
        assert!(matches!(ended, Ok(Err(_))), "{ended:?}");
    });
    t.join().unwrap();
}

/// Objects of two backends mixed in one call are a clear error: here a shm listener asked to
/// accept into a soft protection domain.
#[test]
fn objects_of_two_backends_mixed_in_one_call_are_a_clear_error() {
    rt().block_on(async {
        let shm = shm();
        let soft = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
        let soft_pd = soft.alloc_pd().unwrap();
        let (scq, rcq) = (shm.create_cq(16).unwrap(), shm.create_cq(16).unwrap());
        let l =
            Listener::bind(&shm, ([127, 0, 0, 1], 0).into(), &ConnectOptions::default()).unwrap();
        let port = l.port();
        let accepting = barewire_engine::spawn_local(async move {
            let (scq, rcq) = (scq.clone(), rcq.clone());
            l.accept(&soft_pd, &scq, &rcq)
                .await
                .err()
                .map(|e| e.to_string())
        });
        // A client on shm makes the accept get as far as the domain.
        let pd = shm.alloc_pd().unwrap();
        let (s2, r2) = (shm.create_cq(16).unwrap(), shm.create_cq(16).unwrap());
        let opts = ConnectOptions {
            timeout: Duration::from_millis(300),
            ..ConnectOptions::default()
        };
        let _ = connect(([127, 0, 0, 1], port).into(), &pd, &s2, &r2, &opts).await;
        let e = accepting.await.unwrap().expect("refused");
        assert!(e.contains("two different backends"), "{e}");
    });
}

/// Two listeners on one port number and two addresses (the kernel allows it, and hands out
/// such ports): each has its own shm name, and a client reaches the one it addressed.
#[test]
fn listeners_on_one_port_and_two_addresses_are_told_apart() {
    rt().block_on(async {
        let dev = shm();
        let opts = |tag: &[u8]| ConnectOptions {
            private_data: tag.to_vec(),
            ..ConnectOptions::default()
        };
        let a = Listener::bind(&dev, ([127, 0, 0, 1], 0).into(), &opts(b"one")).unwrap();
        let port = a.port();
        let b = Listener::bind(&dev, ([127, 0, 0, 2], port).into(), &opts(b"two"))
            .expect("the same port on another address has a name of its own");
        let serve = |l: Listener| {
            barewire_engine::spawn_local(async move {
                let pd = shm().alloc_pd().unwrap();
                let dev = shm();
                let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
                let (qp, _) = l.accept(&pd, &s, &r).await.unwrap();
                barewire_engine::time::sleep(Duration::from_millis(50)).await;
                drop(qp);
            })
        };
        let (ta, tb) = (serve(a), serve(b));
        for (ip, want) in [([127, 0, 0, 2], b"two"), ([127, 0, 0, 1], b"one")] {
            let pd = dev.alloc_pd().unwrap();
            let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
            let (_, private) = connect((ip, port).into(), &pd, &s, &r, &ConnectOptions::default())
                .await
                .unwrap();
            assert_eq!(&private[..], &want[..]);
        }
        ta.await.unwrap();
        tb.await.unwrap();
    });
}

/// A 12 MiB WRITE and a 12 MiB READ are copied a step per loop pass, so the posting core keeps
/// running its other tasks meanwhile (a copy made at once held a core for a quarter of a
/// second per 256 MiB: long enough for a failure detector to declare the node down). The
/// bytes still arrive whole, and a small WRITE posted after the big one lands after it.
#[test]
fn large_writes_and_reads_move_in_steps_and_the_core_runs_other_tasks_between_them() {
    const BIG: usize = 12 << 20;
    let remote = Access::REMOTE_WRITE | Access::REMOTE_READ;
    let (port, t) = region_server_with(BIG, remote, |ep, region, msg, done| async move {
        // The endpoint and the receive's buffer live until the client says it is done.
        let _keep = (ep, msg);
        done.await.unwrap();
        let mut got = vec![0u8; BIG];
        region.read_at(0, &mut got);
        let mut want = pattern(BIG, 9);
        want[..5].copy_from_slice(b"after");
        assert!(
            got == want,
            "the region holds the big WRITE, then the small one"
        );
    });
    rt().block_on(async {
        let (ep, buf, region, dev) = told_region_with(port, 2 * BIG + 4096).await;
        buf.write_at(4096, &pattern(BIG, 9));
        buf.write_at(0, b"after");
        // A task that counts the loop passes it gets while the copies run.
        let ticks = std::rc::Rc::new(std::cell::Cell::new(0u32));
        let ticker = {
            let ticks = ticks.clone();
            barewire_engine::spawn_local(async move {
                loop {
                    ticks.set(ticks.get() + 1);
                    barewire_engine::yield_now().await;
                }
            })
        };
        // A first WRITE maps the region (the grant's round trip takes passes of its own).
        ep.write(&buf, 0, 1, Remote::at(region, 0)).await.unwrap();
        let before = ticks.get();
        let big = ep.write(&buf, 4096, BIG, Remote::at(region, 0));
        let small = ep.write(&buf, 0, 5, Remote::at(region, 0));
        big.await.unwrap();
        small.await.unwrap();
        let during_write = ticks.get() - before;
        let before = ticks.get();
        ep.read(&buf, 4096 + BIG, BIG, Remote::at(region, 0))
            .await
            .unwrap();
        let during_read = ticks.get() - before;
        ticker.cancel();
        eprintln!("passes while copying: WRITE {during_write}, READ {during_read}");
        // 12 steps of 1 MiB each: the ticker ran between them.
        assert!(during_write >= 8, "{during_write} passes during the WRITE");
        assert!(during_read >= 8, "{during_read} passes during the READ");
        let mut back = vec![0u8; BIG];
        buf.read_at(4096 + BIG, &mut back);
        let mut want = pattern(BIG, 9);
        want[..5].copy_from_slice(b"after");
        assert!(back == want, "the READ brought back what the WRITEs left");
        ep.send(&buf, 0, 1).await.unwrap();
        drop(dev);
    });
    t.join().unwrap();
}

/// A task that posts signaled WRITEs in a loop and never waits (shm completes each inside its
/// post) posts far more of them than its completion queue holds: the endpoint routes the
/// waiting completions itself before the queue overflows, so the queue pair stays up and
/// every WRITE lands.
#[test]
fn signaled_writes_posted_without_waiting_never_overflow_the_completion_queue() {
    const WRITES: usize = 4000;
    let (port, t) = region_server(|ep, region, msg, first| async move {
        let _ = first.await;
        // Stay until the client is done.
        let _ = ep.recv(&msg, 2048, 16).await;
        let mut got = [0u8; 8];
        region.read_at(0, &mut got);
        assert_eq!(u64::from_le_bytes(got), WRITES as u64 - 1, "the last WRITE");
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        // The first WRITE maps the region (its grant takes a round trip).
        ep.write(&buf, 4096, 8, Remote::at(region, 0))
            .await
            .unwrap();
        let capacity = 256; // `client`'s completion queues
        assert!(WRITES > 4 * capacity);
        for i in 0..WRITES {
            buf.write_at(8192 + 8 * i, &(i as u64).to_le_bytes());
            // Dropped at once: the endpoint keeps the buffer until the completion comes.
            drop(ep.write(&buf, 8192 + 8 * i, 8, Remote::at(region, 0)));
        }
        // (Bounded: an overflowed queue loses the flushes that would end this.)
        let last = ep.write(&buf, 8192 + 8 * (WRITES - 1), 8, Remote::at(region, 0));
        barewire_engine::time::timeout(Duration::from_secs(5), last)
            .await
            .expect("completed")
            .expect("the queue pair is still up");
        ep.send(&buf, 0, 8).await.unwrap();
    });
    t.join().unwrap();
}

/// A peer's region mapped for stores: the prefetch hints (for writing, in range, past the end,
/// and with a length that overflows) change nothing and panic on nothing; the stores made
/// through the mapping land where they were made, and nowhere else.
#[test]
fn prefetch_hints_on_a_mapped_region_change_no_byte() {
    let (port, t) = region_server(|ep, region, msg, first| async move {
        first.await.unwrap(); // the client's stores are in
        let mut got = vec![0u8; 4096];
        region.read_at(0, &mut got);
        let mut want = vec![0u8; 4096];
        want[..8].copy_from_slice(&[7; 8]);
        want[1024..1032].copy_from_slice(b"prefetch");
        assert!(
            got == want,
            "the region holds what was stored and nothing else"
        );
        ep.send(&msg, 0, 4).await.unwrap();
    });
    rt().block_on(async {
        let (ep, buf, region, _dev) = told_region(port).await;
        // A Write asks for the grant; the mapping comes with its answer.
        buf.write_at(4096, &[7; 8]);
        ep.write(&buf, 4096, 8, Remote::at(region, 0))
            .await
            .unwrap();
        let m = ep
            .qp()
            .map_remote(&region)
            .expect("a granted, writable region maps");
        m.prefetch_for_write(1024, 128);
        m.prefetch_for_write(2048, 256);
        m.prefetch_for_write(4000, 4096); // past the end: ignored
        m.prefetch_for_write(usize::MAX - 8, 64); // overflows: ignored
        buf.prefetch(0, 64);
        buf.prefetch(usize::MAX, 1);
        m.span(1024, 8).write(0, b"prefetch");
        let done = ep.recv(&buf, 0, 64);
        ep.send(&buf, 100, 1).await.unwrap();
        done.await.unwrap();
    });
    t.join().unwrap();
}
