//! What `auto` picks without an RDMA device: shared memory for a peer on this host and network
//! namespace, the software provider for a peer in another namespace (a veth pair) and for a
//! peer that asked for `soft` explicitly. Each connection's transport is read back from its
//! queue pair, and the bytes are checked on both.

use std::net::SocketAddr;
use std::process::Command;

use barewire_drivers::{
    connect, verbs_devices, Access, Buffer, Device, DriverConfig, Endpoint, RegionDescriptor,
    Remote, Transport,
};
use barewire_test_support::{rt, Netns, ReadyChild};

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
