//! A listener under hostile or broken clients: connections that send nothing or half an MPA
//! Request must not keep a well-behaved client from being answered, handshakes have a
//! deadline, and a flood is bounded by the per-listener and per-source caps.

use std::io::Write;
use std::net::{SocketAddr, TcpStream as StdStream};
use std::time::{Duration, Instant};

use barewire_engine::time::{sleep, timeout};
use barewire_engine::{spawn_local, Runtime};
use barewire_soft_rdma::provider::{connect, ConnectOptions, Listener};
use barewire_soft_rdma::verbs::{CompletionQueue, Device};

fn rt() -> Runtime {
    Runtime::builder().cores(1).sleeping().build().unwrap()
}

/// The first 10 bytes of a (well-formed) MPA Request: the key and a little more.
const HALF_REQUEST: &[u8] = b"MPA ID Req";

/// Connects a good client and waits until the listener has accepted it; how long that took.
async fn good_client(l: &Listener, addr: SocketAddr) -> Duration {
    let dev = Device::new();
    let pd = dev.alloc_pd();
    let (scq, rcq) = (CompletionQueue::new(8), CompletionQueue::new(8));
    let t0 = Instant::now();
    let client = spawn_local({
        let pd = pd.clone_handle();
        let (scq, rcq) = (scq.clone(), rcq.clone());
        async move {
            connect(addr, &pd, &scq, &rcq, ConnectOptions::default())
                .await
                .map(|(qp, _)| qp)
        }
    });
    let (qp, _) = timeout(Duration::from_secs(10), l.accept(&pd, &scq, &rcq))
        .await
        .expect("the good client was accepted within 10 s")
        .expect("accept");
    let theirs = client.await.unwrap().expect("the good client connected");
    let took = t0.elapsed();
    drop((qp, theirs));
    took
}

/// Lets a process hold `n` descriptors (the flood below opens a thousand sockets on each side).
fn allow_fds(n: u64) -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        if lim.rlim_cur >= n {
            return true;
        }
        if lim.rlim_max < n {
            return false;
        }
        lim.rlim_cur = n;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0
    }
}

#[test]
fn one_idle_connection_does_not_block_the_listener() {
    rt().block_on(async {
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectOptions::default()).unwrap();
        let addr = l.local_addr().unwrap();
        // Connected, and silent.
        let idle = StdStream::connect(addr).unwrap();
        sleep(Duration::from_millis(20)).await;
        let took = good_client(&l, addr).await;
        assert!(took < Duration::from_millis(500), "accepted after {took:?}");
        drop(idle);
    });
}

#[test]
fn a_thousand_idle_and_a_hundred_half_sent_requests_leave_a_good_client_answered_within_100_ms() {
    if !allow_fds(4096) {
        eprintln!("SKIP: RLIMIT_NOFILE cannot be raised to 4096 here");
        return;
    }
    rt().block_on(async {
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectOptions::default()).unwrap();
        let addr = l.local_addr().unwrap();
        // The flood comes from another thread, as from other machines, while this core accepts.
        let flood = std::thread::spawn(move || {
            let mut held = Vec::new();
            for i in 0..1100 {
                let mut s = StdStream::connect(addr).expect("connect");
                if i % 11 == 0 {
                    s.write_all(HALF_REQUEST).unwrap();
                }
                held.push(s);
            }
            held
        });
        while !flood.is_finished() {
            sleep(Duration::from_millis(5)).await;
        }
        let held = flood.join().unwrap();
        // Let the listener take in what is still in its backlog.
        let t = Instant::now();
        while l.counters().connections < 1100 && t.elapsed() < Duration::from_secs(10) {
            sleep(Duration::from_millis(5)).await;
        }
        let before = l.counters();
        assert_eq!(before.connections, 1100, "{before:?}");
        let took = good_client(&l, addr).await;
        assert!(
            took < Duration::from_millis(100),
            "a good client waited {took:?} behind 1,000 idle connections and 100 half-sent Requests"
        );
        // The caps held: all but the last 16 from this address were pushed out.
        let c = l.counters();
        assert!(c.evicted >= 1100 - 16, "{c:?}");
        drop(held);
    });
}

#[test]
fn a_request_that_never_completes_is_dropped_at_the_deadline() {
    rt().block_on(async {
        let opts = ConnectOptions {
            handshake_timeout: Duration::from_millis(200),
            ..ConnectOptions::default()
        };
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), opts).unwrap();
        let addr = l.local_addr().unwrap();
        let mut half = StdStream::connect(addr).unwrap();
        half.write_all(HALF_REQUEST).unwrap();
        sleep(Duration::from_millis(100)).await;
        assert_eq!(l.counters().timed_out, 0, "not before the deadline");
        sleep(Duration::from_millis(300)).await;
        assert_eq!(l.counters().timed_out, 1);
        // The listener closed it: the client reads EOF.
        half.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(std::io::Read::read(&mut half, &mut buf).unwrap(), 0);
    });
}
