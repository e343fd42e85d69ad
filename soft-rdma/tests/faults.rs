//! Faults with a real peer process: killed with SIGKILL or paused with SIGSTOP while work is
//! outstanding. The survivor's work requests complete with errors within a bounded time.

use std::process::Command;
use std::time::{Duration, Instant};

use barewire_engine::time::timeout;
use barewire_soft_rdma::provider::{connect, ConnectOptions, QueuePair, RegionDescriptor};
use barewire_soft_rdma::stream::{RecvWr, SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{Access, CompletionQueue, Device, MemoryRegion, QpState, WcStatus};
use barewire_test_support::{rt, Netns, ReadyChild};

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

/// A `softrdma-peer` in a network namespace of its own, joined to this one by a veth pair:
/// the namespace, the peer and its address. `None` (the test skips) where namespaces cannot be
/// made, except under CI, where that fails the test.
fn peer_in_a_namespace() -> Option<(Netns, Peer, String)> {
    let (ns, _, peer_ip) = Netns::for_test(233)?;
    let peer = Peer::spawn_with(
        Command::new("ip").args([
            "netns",
            "exec",
            &ns.name,
            env!("CARGO_BIN_EXE_softrdma-peer"),
        ]),
        &[&peer_ip],
    );
    Some((ns, peer, peer_ip))
}

/// Takes the link to `ns` down: a real partition (nothing crosses, nobody is told).
fn cut(ns: &Netns) {
    assert!(Netns::ip(&["link", "set", &ns.veth, "down"]), "link down");
}

/// A queue pair to a `softrdma-peer`, the peer's region, and 16 MiB registered here to read
/// into.
struct Link {
    qp: QueuePair,
    scq: CompletionQueue,
    rcq: CompletionQueue,
    remote: RegionDescriptor,
    mr: MemoryRegion,
    buf: Vec<u8>,
}

impl Link {
    /// Connects to the peer at `host` with `opts` and proves the link works with a Read.
    async fn open(peer: &Peer, host: &str, opts: ConnectOptions) -> Link {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let (scq, rcq) = (CompletionQueue::new(64), CompletionQueue::new(64));
        let addr = format!("{host}:{}", peer.port).parse().unwrap();
        let (qp, desc) = connect(addr, &pd, &scq, &rcq, opts).await.unwrap();
        let remote =
            RegionDescriptor::from_bytes(&desc).expect("the descriptor came in the private data");
        let mut buf = vec![0u8; 16 << 20];
        // SAFETY: buf's heap memory does not move when the Vec does, and the Link drops the
        // region before it (fields drop in order: `mr` before `buf`).
        let mr = unsafe { pd.register(buf.as_mut_ptr(), buf.len(), Access::LOCAL_WRITE) }.unwrap();
        let link = Link {
            qp,
            scq,
            rcq,
            remote,
            mr,
            buf,
        };
        link.read_and_check(1).await;
        link
    }

    /// A signaled Read of `len` bytes from the start of the peer's region.
    fn read(&self, wr_id: u64, len: u32) -> SendWr {
        SendWr {
            wr_id,
            op: SendOp::Read {
                remote_addr: self.remote.addr,
                rkey: self.remote.rkey,
            },
            sges: [Sge {
                addr: self.mr.addr() as u64,
                len,
                lkey: self.mr.stag(),
            }]
            .into(),
            signaled: true,
            fence: false,
        }
    }

    /// Reads 4 KiB and checks that the peer's bytes arrived.
    async fn read_and_check(&self, wr_id: u64) {
        self.qp.post_send(self.read(wr_id, 4096)).unwrap();
        let wc = timeout(Duration::from_secs(5), self.scq.next())
            .await
            .unwrap();
        assert_eq!((wc.wr_id, wc.status), (wr_id, WcStatus::Success));
        assert!(
            self.buf[..4096]
                .iter()
                .enumerate()
                .all(|(i, &x)| x == (i % 251) as u8),
            "the peer's bytes arrived"
        );
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
    rt().block_on(async {
        let link = Link::open(peer, host, ConnectOptions::default()).await;
        fault();
        let t0 = Instant::now();
        link.qp.post_send(link.read(2, 16 << 20)).unwrap();
        let wc = timeout(Duration::from_secs(10), link.scq.next())
            .await
            .expect("an error completion arrives");
        assert_eq!(wc.wr_id, 2);
        (wc.status, t0.elapsed(), link.qp.state())
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

#[test]
fn a_cut_link_fails_outstanding_work_within_the_timeout() {
    let Some((ns, peer, peer_ip)) = peer_in_a_namespace() else {
        return;
    };
    let (status, took, state) = outstanding_read(&peer, &peer_ip, || cut(&ns));
    drop(peer);
    assert_eq!(status, WcStatus::RetryExcErr);
    assert_eq!(state, QpState::Error);
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_millis(2500),
        "reported after {took:?}"
    );
    eprintln!("link down: error completion after {took:?}");
}

/// The keepalive the idle tests connect with: short, so that they end in seconds.
const KEEPALIVE: Duration = Duration::from_secs(2);

impl Link {
    /// Posts a receive into the first 4 KiB: what a queue pair with nothing outstanding has,
    /// waiting for the peer's next message.
    fn post_receive(&self, wr_id: u64) {
        self.qp
            .post_recv(RecvWr {
                wr_id,
                sges: [Sge {
                    addr: self.mr.addr() as u64,
                    len: 4096,
                    lkey: self.mr.stag(),
                }]
                .into(),
            })
            .unwrap();
    }
}

/// A queue pair with only a receive posted, to a peer whose link is then cut: before the
/// keepalive, nothing told it, and the receive waited for ever. Now the kernel's probes go
/// unanswered, the connection fails after the keepalive, and the receive completes with an
/// error.
#[test]
fn an_idle_queue_pair_whose_link_is_cut_fails_its_receives_within_the_keepalive() {
    let Some((ns, peer, peer_ip)) = peer_in_a_namespace() else {
        return;
    };
    let opts = ConnectOptions {
        keepalive: Some(KEEPALIVE),
        ..ConnectOptions::default()
    };
    rt().block_on(async {
        let link = Link::open(&peer, &peer_ip, opts).await;
        link.post_receive(7);
        cut(&ns);
        let t0 = Instant::now();
        let wc = timeout(KEEPALIVE * 4, link.rcq.next())
            .await
            .expect("the receive completes once the keepalive runs out");
        let took = t0.elapsed();
        assert_eq!(wc.wr_id, 7);
        assert_ne!(wc.status, WcStatus::Success);
        assert_eq!(link.qp.state(), QpState::Error);
        // The bound is kept to the second (the kernel's probes are a second apart here).
        assert!(
            took >= KEEPALIVE - Duration::from_millis(100)
                && took < KEEPALIVE + Duration::from_millis(1500),
            "the receive failed {took:?} after the cut, with a keepalive of {KEEPALIVE:?}"
        );
        eprintln!(
            "link cut, nothing outstanding: the receive failed ({:?}) after {took:?}",
            wc.status
        );
    });
    drop(peer);
}

/// A peer process stopped for twice the keepalive, with nothing outstanding: its kernel answers
/// the probes, so the connection lives, and serves again once the peer runs (a stopped or busy
/// peer is not a dead one; work outstanding on it fails by `ConnectOptions::timeout` instead).
#[test]
fn a_stopped_peers_idle_queue_pair_outlives_the_keepalive() {
    let peer = Peer::spawn();
    let opts = ConnectOptions {
        keepalive: Some(KEEPALIVE),
        ..ConnectOptions::default()
    };
    rt().block_on(async {
        let link = Link::open(&peer, "127.0.0.1", opts).await;
        link.post_receive(7);
        peer.signal(libc::SIGSTOP);
        let waited = timeout(KEEPALIVE * 2, link.rcq.next()).await;
        peer.signal(libc::SIGCONT);
        assert!(
            waited.is_err(),
            "the receive completed while the peer was stopped: {waited:?}"
        );
        assert_eq!(link.qp.state(), QpState::Rts);
        link.read_and_check(8).await;
    });
}

/// A keepalive under a second is refused before any connection is made: the kernel counts
/// its probes in whole seconds.
#[test]
fn a_keepalive_under_a_second_is_refused() {
    rt().block_on(async {
        let dev = Device::new();
        let pd = dev.alloc_pd();
        let (scq, rcq) = (CompletionQueue::new(4), CompletionQueue::new(4));
        let opts = ConnectOptions {
            keepalive: Some(Duration::from_millis(500)),
            ..ConnectOptions::default()
        };
        // Nothing listens there; the options are refused before a connection is tried.
        let e = connect(
            "127.0.0.1:9".parse().unwrap(),
            &pd,
            &scq,
            &rcq,
            opts.clone(),
        )
        .await
        .err()
        .expect("refused");
        assert!(e.to_string().contains("at least 1 s"), "{e}");
        let e = barewire_soft_rdma::provider::Listener::bind("127.0.0.1:0".parse().unwrap(), opts)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("at least 1 s"), "{e}");
    });
}
