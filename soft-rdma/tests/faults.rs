//! Faults with a real peer process: killed with SIGKILL or paused with SIGSTOP while work is
//! outstanding. The survivor's work requests complete with errors within a bounded time.

use std::process::Command;
use std::time::{Duration, Instant};

use barewire_engine::time::timeout;
use barewire_soft_rdma::provider::{connect, ConnectOptions, RegionDescriptor};
use barewire_soft_rdma::stream::{SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device, QpState, WcStatus};
use barewire_test_support::{rt, ReadyChild};

/// `softrdma-peer` with 32 regions; killed when dropped.
struct Peer {
    child: ReadyChild,
    port: u16,
}

impl Peer {
    fn spawn() -> Peer {
        Peer::spawn_with(&mut Command::new(env!("CARGO_BIN_EXE_softrdma-peer")), &[])
    }

    fn spawn_with(cmd: &mut Command, extra: &[&str]) -> Peer {
        let child = ReadyChild::spawn(cmd.arg("32").args(extra));
        let port = child.port();
        Peer { child, port }
    }

    fn signal(&self, sig: i32) {
        self.child.signal(sig);
    }
}

/// Connects, proves the link works with a Read, then applies `fault` with a 16 MiB Read
/// outstanding; returns the failed completion's status and how long it took to arrive.
fn outstanding_read_under(fault: i32) -> (WcStatus, Duration, QpState) {
    let peer = Peer::spawn();
    outstanding_read(&peer, "127.0.0.1", || peer.signal(fault))
}

/// As above, with the peer at `host` and `fault` applied after the first Read succeeded.
fn outstanding_read(
    peer: &Peer,
    host: &str,
    fault: impl FnOnce(),
) -> (WcStatus, Duration, QpState) {
    let rt = rt();
    rt.block_on(async {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
        let addr = format!("{host}:{}", peer.port).parse().unwrap();
        let (qp, desc) = connect(addr, &pd, &scq, &rcq, ConnectOptions::default())
            .await
            .unwrap();
        let remote =
            RegionDescriptor::from_bytes(&desc).expect("the descriptor came in the private data");
        let mut buf = vec![0u8; 16 << 20];
        // SAFETY: buf outlives the region.
        let mr = unsafe { pd.register(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }.unwrap();
        let read = |wr_id, len: u32| SendWr {
            wr_id,
            op: SendOp::Read {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            },
            sges: [Sge {
                addr: mr.addr() as u64,
                len,
                lkey: mr.stag(),
            }]
            .into(),
            signaled: true,
            fence: false,
        };
        qp.post_send(read(1, 4096)).unwrap();
        let wc = timeout(Duration::from_secs(5), scq.next()).await.unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        assert!(
            buf[..4096]
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (i % 251) as u8),
            "the peer's bytes arrived"
        );

        fault();
        let t0 = Instant::now();
        qp.post_send(read(2, 16 << 20)).unwrap();
        let wc = timeout(Duration::from_secs(10), scq.next())
            .await
            .expect("an error completion arrives");
        assert_eq!(wc.wr_id, 2);
        let took = t0.elapsed();
        let state = qp.state();
        drop(mr);
        (wc.status, took, state)
    })
}

#[test]
fn a_killed_peer_fails_outstanding_work_promptly() {
    let (status, took, state) = outstanding_read_under(libc::SIGKILL);
    assert_eq!(
        status,
        WcStatus::RetryExcErr,
        "the Read fails with a transport error"
    );
    assert_eq!(state, QpState::Error);
    assert!(took < Duration::from_secs(2), "reported after {took:?}");
    eprintln!("SIGKILL: error completion after {took:?}");
}

#[test]
fn a_stopped_peer_fails_outstanding_work_within_the_timeout() {
    let (status, took, state) = outstanding_read_under(libc::SIGSTOP);
    assert_eq!(status, WcStatus::RetryExcErr);
    assert_eq!(state, QpState::Error);
    // The default timeout is 1 s without progress; allow for the 5 ms timer and scheduling.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "reported after {took:?}"
    );
    eprintln!("SIGSTOP: error completion after {took:?}");
}

/// A network namespace with a veth pair to the test's namespace; removed on drop.
struct Netns {
    name: String,
    veth: String,
    peer_ip: String,
}

impl Netns {
    fn ip(args: &[&str]) -> bool {
        Command::new("ip")
            .args(args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    fn create() -> Option<Netns> {
        let id = std::process::id() % 100_000;
        let (name, veth, inner) = (format!("bwft{id}"), format!("bwa{id}"), format!("bwb{id}"));
        let net = id % 200 + 20;
        let (host_ip, peer_ip) = (format!("10.233.{net}.1"), format!("10.233.{net}.2"));
        let ns = Netns {
            name: name.clone(),
            veth: veth.clone(),
            peer_ip: peer_ip.clone(),
        };
        let ok = Netns::ip(&["netns", "add", &name])
            && Netns::ip(&["link", "add", &veth, "type", "veth", "peer", "name", &inner])
            && Netns::ip(&["link", "set", &inner, "netns", &name])
            && Netns::ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &veth])
            && Netns::ip(&["link", "set", &veth, "up"])
            && Netns::ip(&[
                "netns",
                "exec",
                &name,
                "ip",
                "addr",
                "add",
                &format!("{peer_ip}/30"),
                "dev",
                &inner,
            ])
            && Netns::ip(&["netns", "exec", &name, "ip", "link", "set", &inner, "up"])
            && Netns::ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"]);
        ok.then_some(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        Netns::ip(&["link", "del", &self.veth]);
        Netns::ip(&["netns", "del", &self.name]);
    }
}

#[test]
fn a_cut_link_fails_outstanding_work_within_the_timeout() {
    let Some(ns) = Netns::create() else {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("network namespaces are unavailable under CI (needs root and iproute2)");
        }
        eprintln!("SKIP: cannot create a network namespace here (needs root and iproute2)");
        return;
    };
    let peer = Peer::spawn_with(
        Command::new("ip").args([
            "netns",
            "exec",
            &ns.name,
            env!("CARGO_BIN_EXE_softrdma-peer"),
        ]),
        &[&ns.peer_ip],
    );
    let (status, took, state) = outstanding_read(&peer, &ns.peer_ip, || {
        assert!(Netns::ip(&["link", "set", &ns.veth, "down"]), "link down");
    });
    drop(peer);
    assert_eq!(status, WcStatus::RetryExcErr);
    assert_eq!(state, QpState::Error);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "reported after {took:?}"
    );
    eprintln!("link down: error completion after {took:?}");
}
