//! What `auto` picks without an RDMA device: shared memory for a peer on this host and network
//! namespace, the software provider for a peer in another namespace (a veth pair) and for a
//! peer that asked for `soft` explicitly. Each connection's transport is read back from its
//! queue pair, and the bytes are checked on both. Also how a connect ends where nothing
//! answers it, on each driver that reaches peers over TCP or on this host.

use std::net::SocketAddr;
use std::process::Command;

use barewire_drivers::{
    connect, verbs_devices, Access, Buffer, Device, DriverConfig, Endpoint, Listener,
    RegionDescriptor, Remote, Transport,
};
use barewire_test_support::{rt, squat, Netns, ReadyChild};

fn auto() -> Device {
    Device::open(&DriverConfig::parse("auto", None).unwrap()).unwrap()
}

/// `barewire-peer serve` with `BAREWIRE_DRIVER=driver`, in network namespace `netns` if given.
fn peer(driver: &str, netns: Option<&str>) -> ReadyChild {
    let bin = env!("CARGO_BIN_EXE_barewire-peer");
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin]);
            c
        }
        None => Command::new(bin),
    };
    c.args(["serve", "0"]).env("BAREWIRE_DRIVER", driver);
    ReadyChild::spawn(&mut c)
}

/// Connects with `dev` to the peer at `addr`, checks a WRITE and READ of its region 0, and
/// returns the transport the queue pair runs over.
fn transport_to(dev: &Device, addr: SocketAddr) -> Transport {
    rt().block_on(async {
        let pd = dev.alloc_pd().unwrap();
        let (scq, rcq) = (dev.create_cq(64).unwrap(), dev.create_cq(64).unwrap());
        let (qp, private) = connect(addr, &pd, &scq, &rcq, &dev.connect_options())
            .await
            .unwrap();
        let t = qp.transport();
        let r0 = RegionDescriptor::from_bytes(&private).unwrap();
        let ep = Endpoint::new(qp, scq, rcq);
        let buf = Buffer::new(&pd, 8192, 4096, Access::LOCAL_WRITE).unwrap();
        buf.write_at(0, b"which way did it go");
        ep.write(&buf, 0, 19, Remote::at(r0, 0)).await.unwrap();
        ep.read(&buf, 4096, 19, Remote::at(r0, 0)).await.unwrap();
        let mut back = [0u8; 19];
        buf.read_at(4096, &mut back);
        assert_eq!(&back, b"which way did it go");
        t
    })
}

#[test]
fn auto_picks_shm_on_this_host_and_soft_elsewhere_or_when_asked() {
    if !verbs_devices().is_empty() {
        eprintln!("SKIP: this host has an RDMA device, which auto prefers");
        return;
    }
    let here = peer("auto", None);
    let addr = SocketAddr::from(([127, 0, 0, 1], here.port()));
    assert_eq!(transport_to(&auto(), addr), Transport::Shm, "same host");
    // The same listener serves a peer that asked for the software provider.
    let soft = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
    assert_eq!(transport_to(&soft, addr), Transport::Soft, "explicit soft");
    // An explicit soft listener: auto finds no shm name there and uses the provider.
    let soft_peer = peer("soft", None);
    let addr = SocketAddr::from(([127, 0, 0, 1], soft_peer.port()));
    assert_eq!(
        transport_to(&auto(), addr),
        Transport::Soft,
        "soft listener"
    );
}

#[test]
fn auto_uses_the_software_provider_for_a_peer_in_another_network_namespace() {
    if !verbs_devices().is_empty() {
        eprintln!("SKIP: this host has an RDMA device, which auto prefers");
        return;
    }
    let (ns, _, far) = Netns::create_in(235).expect("a network namespace (this test needs root)");
    let there = peer("auto", Some(&ns.name));
    let addr: SocketAddr = format!("{far}:{}", there.port()).parse().unwrap();
    assert_eq!(transport_to(&auto(), addr), Transport::Soft);
    drop(there);
}

/// An explicit `shm` device has no way to reach a listener that only speaks the software
/// provider: connecting is refused at once, saying so, rather than hanging or falling back.
#[test]
fn explicit_shm_to_a_soft_only_listener_is_a_prompt_clear_error() {
    let soft_peer = peer("soft", None);
    let addr = SocketAddr::from(([127, 0, 0, 1], soft_peer.port()));
    let shm = Device::open(&DriverConfig::parse("shm", None).unwrap()).unwrap();
    rt().block_on(async {
        let pd = shm.alloc_pd().unwrap();
        let (scq, rcq) = (shm.create_cq(16).unwrap(), shm.create_cq(16).unwrap());
        let t0 = std::time::Instant::now();
        let e = connect(addr, &pd, &scq, &rcq, &shm.connect_options())
            .await
            .err()
            .expect("a soft-only listener has no shm name");
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(2),
            "took {:?}",
            t0.elapsed()
        );
        assert!(e.to_string().contains("no shm listener"), "{e}");
        eprintln!("explicit shm to a soft-only listener: {e}");
    });
    // The same listener still serves a soft peer afterwards.
    let soft = Device::open(&DriverConfig::parse("soft", None).unwrap()).unwrap();
    assert_eq!(transport_to(&soft, addr), Transport::Soft);
}

/// Another user's process holds the shm name of a soft-only listener's port: `auto` passes
/// it over and reaches the listener through the software provider, and an explicit `shm`
/// connect says who holds the name.
#[test]
fn a_shm_name_held_by_another_user_is_passed_over() {
    if !verbs_devices().is_empty() {
        eprintln!("SKIP: this host has an RDMA device, which auto prefers");
        return;
    }
    let soft_peer = peer("soft", None);
    let addr = SocketAddr::from(([127, 0, 0, 1], soft_peer.port()));
    let Some(squatter) = squat(soft_peer.port()) else {
        eprintln!("SKIP: changing users needs root");
        return;
    };
    assert_eq!(transport_to(&auto(), addr), Transport::Soft);
    let shm = Device::open(&DriverConfig::parse("shm", None).unwrap()).unwrap();
    rt().block_on(async {
        let pd = shm.alloc_pd().unwrap();
        let (scq, rcq) = (shm.create_cq(16).unwrap(), shm.create_cq(16).unwrap());
        let e = connect(addr, &pd, &scq, &rcq, &shm.connect_options())
            .await
            .err()
            .expect("another user's name");
        assert!(
            e.to_string().contains("held by a process of user 65534"),
            "{e}"
        );
    });
    drop(squatter);
}

/// Another user's process holds the shm name of a free port before a listener binds it: an
/// `auto` listener still binds, serves a same-host `auto` peer through the software provider,
/// and an explicit `shm` listener fails, naming the user.
#[test]
fn a_listener_whose_shm_name_another_user_holds_serves_through_soft_or_says_who() {
    if !verbs_devices().is_empty() {
        eprintln!("SKIP: this host has an RDMA device, which auto prefers");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Some(squatter) = squat(port) else {
        eprintln!("SKIP: changing users needs root");
        return;
    };
    let listen = format!("127.0.0.1:{port}");
    assert_eq!(
        reached("auto", &listen, "auto", "127.0.0.1"),
        Ok(Transport::Soft)
    );
    let shm = Device::open(&DriverConfig::parse("shm", None).unwrap()).unwrap();
    let e = Listener::bind(&shm, listen.parse().unwrap(), &shm.connect_options())
        .err()
        .expect("an explicit shm listener cannot listen there");
    assert!(
        e.to_string().contains("a process of user 65534 holds it"),
        "{e}"
    );
    drop(squatter);
}

/// On this core: a listener of driver `listening` bound to `listen` (port 0), and a peer of
/// driver `connecting` that connects to the address `to` with the listener's port, then
/// checks a WRITE and a READ of the listener's region. The transport the connection runs over,
/// or the connection's error.
fn reached(listening: &str, listen: &str, connecting: &str, to: &str) -> Result<Transport, String> {
    let open = |d: &str| Device::open(&DriverConfig::parse(d, None).unwrap()).unwrap();
    let (server, client) = (open(listening), open(connecting));
    rt().block_on(async move {
        let pd = server.alloc_pd().unwrap();
        let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        let region = Buffer::new(&pd, 4096, 64, all).unwrap();
        let opts = barewire_drivers::ConnectOptions {
            private_data: region.descriptor().to_bytes().to_vec(),
            ..server.connect_options()
        };
        let l = Listener::bind(&server, listen.parse().unwrap(), &opts).unwrap();
        let to: SocketAddr = format!("{to}:{}", l.port()).parse().unwrap();
        let accepted = barewire_engine::spawn_local(async move {
            let (scq, rcq) = (server.create_cq(64).unwrap(), server.create_cq(64).unwrap());
            let r = l.accept(&pd, &scq, &rcq).await;
            (r, scq, rcq, region, pd, server)
        });
        let cpd = client.alloc_pd().unwrap();
        let (scq, rcq) = (client.create_cq(64).unwrap(), client.create_cq(64).unwrap());
        let (qp, private) = match connect(to, &cpd, &scq, &rcq, &client.connect_options()).await {
            Ok(c) => c,
            Err(e) => {
                accepted.cancel();
                return Err(e.to_string());
            }
        };
        // The listener's side (its queue pair, queues, region and device) lives to the end.
        let (theirs, _scq, _rcq, _region, _pd, _dev) = accepted.await.unwrap();
        let (their_qp, _) = theirs.unwrap();
        let t = qp.transport();
        assert_eq!(their_qp.transport(), t, "both ends run over one transport");
        let r0 = RegionDescriptor::from_bytes(&private).unwrap();
        let ep = Endpoint::new(qp, scq, rcq);
        let buf = Buffer::new(&cpd, 8192, 4096, Access::LOCAL_WRITE).unwrap();
        buf.write_at(0, to.to_string().as_bytes());
        let n = to.to_string().len();
        ep.write(&buf, 0, n, Remote::at(r0, 0)).await.unwrap();
        ep.read(&buf, 4096, n, Remote::at(r0, 0)).await.unwrap();
        let mut back = vec![0u8; n];
        buf.read_at(4096, &mut back);
        assert_eq!(back, to.to_string().as_bytes());
        Ok(t)
    })
}

/// A listener on this host is reached through shared memory under every address TCP would
/// reach it by: its own, a wildcard's IPv4 and IPv6 loopback, and the IPv4-mapped IPv6 form
/// of an IPv4 address (`::ffff:127.0.0.1`, which the kernel connects to the same listener).
/// Explicit soft reaches it by each of them over TCP, and an address TCP cannot reach is an
/// error under every driver, not a hang.
#[test]
fn a_listener_on_this_host_is_reached_by_every_name_tcp_gives_it() {
    if !verbs_devices().is_empty() {
        eprintln!("SKIP: this host has an RDMA device, which auto prefers");
        return;
    }
    let mut cases = vec![
        ("127.0.0.1:0", "127.0.0.1"),
        ("127.0.0.1:0", "[::ffff:127.0.0.1]"),
        ("0.0.0.0:0", "127.0.0.1"),
        ("0.0.0.0:0", "[::ffff:127.0.0.1]"),
    ];
    let v6 = std::net::TcpListener::bind("[::1]:0").is_ok();
    if v6 {
        cases.extend([
            ("[::1]:0", "[::1]"),
            ("[::]:0", "[::1]"),
            ("[::]:0", "127.0.0.1"),
            ("[::]:0", "[::ffff:127.0.0.1]"),
        ]);
    } else {
        eprintln!("SKIP (IPv6 cases): this host has no IPv6 loopback");
    }
    for (listen, to) in cases {
        let case = format!("listening on {listen}, connecting to {to}");
        assert_eq!(
            reached("auto", listen, "auto", to),
            Ok(Transport::Shm),
            "auto, {case}"
        );
        assert_eq!(
            reached("shm", listen, "shm", to),
            Ok(Transport::Shm),
            "shm, {case}"
        );
        assert_eq!(
            reached("soft", listen, "soft", to),
            Ok(Transport::Soft),
            "soft, {case}"
        );
    }
    if v6 {
        for (listen, to) in [("127.0.0.1:0", "[::1]"), ("[::1]:0", "127.0.0.1")] {
            for driver in ["auto", "shm", "soft"] {
                let e = reached(driver, listen, driver, to)
                    .expect_err("TCP does not reach this listener by that address");
                eprintln!("{driver}, listening on {listen}, connecting to {to}: {e}");
            }
        }
    }
}

/// A connect that nothing answers fails within the setup deadline (`ConnectOptions::timeout`,
/// 1 s by default), saying what it waited for, rather than waiting for ever:
/// - a TCP server that accepts and says nothing (what a stopped listener's kernel does, or a
///   service that is not barewire's), on soft and on auto (which finds no shm listener there);
/// - a barewire listener whose application never accepts, on soft, shm and auto.
#[test]
fn a_connect_that_nothing_answers_fails_within_the_setup_deadline() {
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_at = silent.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        // Accepts the connects below and holds them, answering nothing.
        let mut held = Vec::new();
        for s in silent.incoming().take(2) {
            held.push(s.unwrap());
        }
        std::thread::sleep(std::time::Duration::from_secs(3));
    });
    // Connects with `driver` to where `at` says (it may bind a listener of that driver first,
    // kept until the connect has ended), and returns the error and how long it took.
    let attempt = |driver: &str, at: &dyn Fn(&Device) -> (Option<Listener>, SocketAddr)| {
        let dev = Device::open(&DriverConfig::parse(driver, None).unwrap()).unwrap();
        rt().block_on(async {
            let (_listener, to) = at(&dev);
            let pd = dev.alloc_pd().unwrap();
            let (scq, rcq) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
            let t0 = std::time::Instant::now();
            let opts = dev.connect_options();
            let bound = opts.timeout + std::time::Duration::from_secs(5);
            let e = barewire_engine::time::timeout(bound, connect(to, &pd, &scq, &rcq, &opts))
                .await
                .unwrap_or_else(|_| {
                    panic!("{driver}: the connect to {to} still waits after {bound:?}")
                })
                .err()
                .expect("nothing answers this connect");
            (e.to_string(), t0.elapsed())
        })
    };
    let deadline = barewire_drivers::ConnectOptions::default().timeout;
    let within = |driver: &str, what: &str, (e, took): (String, std::time::Duration)| {
        eprintln!("{driver}, {what}: {e} (after {took:?})");
        assert!(
            took >= deadline.mul_f64(0.9) && took < deadline + std::time::Duration::from_secs(1),
            "{driver}, {what}: {took:?}"
        );
        e
    };
    for driver in ["soft", "auto"] {
        let e = within(
            driver,
            "a silent TCP server",
            attempt(driver, &|_| (None, silent_at)),
        );
        assert!(
            e.contains("MPA Reply") && e.contains(&format!("{deadline:?}")),
            "{e}"
        );
    }
    let unaccepted = |dev: &Device| {
        let l = Listener::bind(dev, ([127, 0, 0, 1], 0).into(), &dev.connect_options()).unwrap();
        let at = SocketAddr::from(([127, 0, 0, 1], l.port()));
        (Some(l), at)
    };
    for driver in ["soft", "shm", "auto"] {
        let e = within(
            driver,
            "a listener that never accepts",
            attempt(driver, &unaccepted),
        );
        assert!(e.contains("slow to accept"), "{e}");
    }
    held.join().unwrap();
}

/// A listener that cannot be set up says where and why, on each driver (it used to say
/// "connection failed", of a bind).
#[test]
fn a_listener_on_a_taken_or_foreign_address_says_where_and_why() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_at = taken.local_addr().unwrap();
    // TEST-NET-1 (RFC 5737): never an address of this host.
    let foreign = SocketAddr::from(([192, 0, 2, 1], 0));
    for driver in ["soft", "shm", "auto"] {
        let dev = Device::open(&DriverConfig::parse(driver, None).unwrap()).unwrap();
        for (at, why) in [
            (taken_at, "Address already in use"),
            (foreign, "Cannot assign requested address"),
        ] {
            let e = Listener::bind(&dev, at, &dev.connect_options())
                .err()
                .unwrap_or_else(|| panic!("{driver}: listening on {at} succeeded"));
            assert!(
                matches!(e, barewire_drivers::DriverError::Listen { addr, .. } if addr == at),
                "{driver}: {e:?}"
            );
            let said = e.to_string();
            assert!(
                said.starts_with(&format!("cannot listen on {at}: ")) && said.contains(why),
                "{driver}: {said}"
            );
        }
    }
}
