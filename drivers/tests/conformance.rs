//! The conformance suite, written once against barewire-drivers' API and run on whichever
//! backend `BAREWIRE_DRIVER` selects: `soft` (the default here, and always in CI), `shm` (also
//! in CI) or `verbs` where a device exists (hardware, rxe, siw). Without a device, the verbs run prints a skip
//! with the reason instead of failing.
//!
//! The peer is `barewire-peer serve` in its own process, on the same backend: every verb with
//! its bytes checked in the remote region, atomics under contention from several queue pairs,
//! protection errors with their statuses and untouched guard bytes, completion order, and the
//! peer killed (SIGKILL) or stopped (SIGSTOP) with work outstanding.

use barewire_test_support::{rt, ReadyChild};
use std::net::SocketAddr;
use std::process::Command;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire_drivers::{
    connect, Access, Buffer, CompletionQueue, Device, DriverConfig, DriverError, Endpoint,
    ProtectionDomain, QpState, QueuePair, RegionDescriptor, Remote, SendOp, SendWr, Stag,
    Transport, WcStatus,
};

/// The backend under test, or `None` (after printing why) when it is not available here.
fn backend() -> Option<String> {
    let name = std::env::var("BAREWIRE_DRIVER").unwrap_or_else(|_| "soft".into());
    let cfg = DriverConfig::parse(&name, std::env::var("BAREWIRE_DEVICE").ok()).unwrap();
    match cfg.select() {
        Ok(_) => Some(name),
        Err(e) => {
            eprintln!("SKIP: conformance on BAREWIRE_DRIVER={name}: {e}");
            None
        }
    }
}

/// `barewire-peer serve` on the driver under test; killed when dropped.
struct Peer {
    child: ReadyChild,
    addr: SocketAddr,
}

impl Peer {
    fn start(driver: &str) -> Peer {
        // BAREWIRE_PEER lets a prebuilt suite run on another machine (where cargo's path to
        // the peer binary does not exist).
        let bin = std::env::var("BAREWIRE_PEER")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_barewire-peer").to_string());
        let child = ReadyChild::spawn(
            Command::new(bin)
                .args(["serve", "0"])
                .env("BAREWIRE_DRIVER", driver),
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], child.port()));
        Peer { child, addr }
    }

    fn signal(&self, sig: i32) {
        self.child.signal(sig);
    }
}

/// One side's objects.
struct Side {
    dev: Device,
    pd: ProtectionDomain,
}

fn side(driver: &str) -> Side {
    let dev =
        Device::open(&DriverConfig::parse(driver, std::env::var("BAREWIRE_DEVICE").ok()).unwrap())
            .unwrap();
    let pd = dev.alloc_pd().unwrap();
    Side { dev, pd }
}

/// A connection to the peer: the endpoint and the peer's two regions (0: all rights, 17 MiB;
/// 1: remote read only, 4 KiB of 0x5a).
async fn open(s: &Side, peer: &Peer) -> (Endpoint, RegionDescriptor, RegionDescriptor) {
    let (qp, scq, rcq, r0, r1) = raw(s, peer).await;
    (Endpoint::new(qp, scq, rcq), r0, r1)
}

/// A raw connection to the peer (queue pair and completion queues) and the peer's two regions.
type Raw = (
    QueuePair,
    CompletionQueue,
    CompletionQueue,
    RegionDescriptor,
    RegionDescriptor,
);

async fn raw(s: &Side, peer: &Peer) -> Raw {
    raw_with(s, peer, 1024, 1024).await
}

/// A connection to the peer whose send and receive completion queues hold `sends` and
/// `recvs` completions.
async fn raw_with(s: &Side, peer: &Peer, sends: usize, recvs: usize) -> Raw {
    let (scq, rcq) = (
        s.dev.create_cq(sends).unwrap(),
        s.dev.create_cq(recvs).unwrap(),
    );
    let (qp, private) = connect(peer.addr, &s.pd, &scq, &rcq, &s.dev.connect_options())
        .await
        .unwrap();
    assert_eq!(private.len(), 40, "two region descriptors");
    let r0 = RegionDescriptor::from_bytes(&private[..20]).unwrap();
    let r1 = RegionDescriptor::from_bytes(&private[20..40]).unwrap();
    (qp, scq, rcq, r0, r1)
}

/// Sends `msg` and returns the peer's answer.
async fn ask(ep: &Endpoint, buf: &Rc<Buffer>, msg: &[u8]) -> Vec<u8> {
    let reply = ep.recv(buf, 8192, 4096);
    buf.write_at(0, msg);
    ep.send(buf, 0, msg.len()).await.unwrap();
    let wc = reply.await.unwrap();
    let mut out = vec![0u8; wc.byte_len as usize];
    buf.read_at(8192, &mut out);
    out
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// A xorshift generator from `seed`: each call gives a number below its argument.
fn xorshift(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed;
    move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    }
}

/// Posts a signaled, unfenced send work request.
fn post_signaled(qp: &QueuePair, wr_id: u64, op: SendOp, sges: Vec<barewire_drivers::Sge>) {
    qp.post_send(SendWr {
        wr_id,
        op,
        sges: sges.into_iter().collect(),
        signaled: true,
        fence: false,
    })
    .unwrap()
}

/// Takes the next send completion: it must be request `next`'s, and successful.
async fn next_in_order(scq: &CompletionQueue, next: &mut u64) {
    let wc = scq.next().await;
    assert_eq!(
        (wc.wr_id, wc.status),
        (*next, WcStatus::Success),
        "completions in posting order, all successful"
    );
    *next += 1;
}

/// A gather list of `len` bytes in up to three pieces (none empty: some NICs read an entry of
/// length 0 as 2 GiB) from random places of `src`, which lies at `at` in `buf`; and the bytes
/// it gathers, in order.
fn gather(
    rand: &mut impl FnMut(usize) -> usize,
    buf: &Buffer,
    at: usize,
    src: &[u8],
    len: usize,
) -> (Vec<barewire_drivers::Sge>, Vec<u8>) {
    let pieces = 1 + rand(3);
    let (mut sges, mut bytes, mut left) = (Vec::new(), Vec::new(), len);
    for k in 0..pieces {
        let n = if k + 1 == pieces {
            left
        } else {
            rand(left + 1)
        };
        if n == 0 {
            continue;
        }
        let from = rand(src.len() - n + 1);
        sges.push(buf.sge(at + from, n));
        bytes.extend_from_slice(&src[from..from + n]);
        left -= n;
    }
    (sges, bytes)
}

/// A completion queue of no entries is refused when it is made, on every backend (verbs
/// refuses one; elsewhere its first completion would overrun it and stop its queue pair).
#[test]
fn a_completion_queue_of_no_entries_is_refused() {
    let Some(driver) = backend() else { return };
    rt().block_on(async {
        let s = side(&driver);
        let e = s.dev.create_cq(0).err().expect("refused");
        assert!(e.to_string().contains("0 entries"), "{e}");
        assert!(s.dev.create_cq(1).unwrap().capacity() >= 1); // verbs may round up
    });
}

#[test]
fn every_verb_moves_the_right_bytes() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (ep, r0, _) = open(&s, &peer).await;
        let buf = Buffer::new(&s.pd, 40 << 20, 4096, Access::LOCAL_WRITE).unwrap();

        // WRITE then READ back, from one byte to 16 MiB (many FPDUs / MTUs).
        for (len, off) in [
            (1usize, 3u64),
            (4096, 4096),
            (100_000, 1 << 20),
            (16 << 20, 0),
        ] {
            let data = pattern(len, len as u32);
            buf.write_at(0, &data);
            ep.write(&buf, 0, len, Remote::at(r0, off)).await.unwrap();
            let wc = ep
                .read(&buf, 20 << 20, len, Remote::at(r0, off))
                .await
                .unwrap();
            assert_eq!(wc.byte_len as usize, len);
            let mut back = vec![0u8; len];
            buf.read_at(20 << 20, &mut back);
            assert!(back == data, "{len} bytes at {off} came back changed");
        }

        // SEND / RECV (the peer echoes).
        assert_eq!(ask(&ep, &buf, b"ping over SEND").await, b"ping over SEND");

        // WRITE with immediate: the bytes land and the peer's receive carries the value.
        let data = pattern(3000, 9);
        buf.write_at(0, &data);
        let reply = ep.recv(&buf, 8192, 4096);
        ep.write_with_imm(&buf, 0, 3000, Remote::at(r0, 8 << 20), 0xfeed_beef)
            .await
            .unwrap();
        let wc = reply.await.unwrap();
        let mut msg = vec![0u8; wc.byte_len as usize];
        buf.read_at(8192, &mut msg);
        assert_eq!(
            String::from_utf8(msg).unwrap(),
            format!("imm {} 3000", 0xfeed_beefu32)
        );
        ep.read(&buf, 4096, 3000, Remote::at(r0, 8 << 20))
            .await
            .unwrap();
        let mut back = vec![0u8; 3000];
        buf.read_at(4096, &mut back);
        assert_eq!(back, data);

        // Atomics on an 8-byte aligned word.
        let word = Remote::at(r0, 12 << 20);
        buf.write_at(0, &0u64.to_ne_bytes());
        ep.write(&buf, 0, 8, word).await.unwrap();
        assert_eq!(ep.fetch_add(&buf, 64, word, 5).await.unwrap(), 0);
        assert_eq!(ep.fetch_add(&buf, 64, word, 7).await.unwrap(), 5);
        assert_eq!(ep.compare_swap(&buf, 64, word, 12, 100).await.unwrap(), 12);
        assert_eq!(
            ep.compare_swap(&buf, 64, word, 12, 999).await.unwrap(),
            100,
            "no swap"
        );
        ep.read(&buf, 128, 8, word).await.unwrap();
        assert_eq!(buf.load_u64(128), 100);

        // A zero-length READ names no region (RFC 5040 §4.4; verbs does not check the key of
        // a zero-length operation): it completes even with a key nobody granted, which is
        // what makes it a plain "everything before me is done" probe.
        let nobody = RegionDescriptor {
            rkey: barewire_drivers::Stag(0x5eed_0001),
            addr: 0,
            len: 0,
        };
        let wc = ep.read(&buf, 0, 0, Remote::at(nobody, 0)).await.unwrap();
        assert_eq!(wc.byte_len, 0);
        assert_eq!(ask(&ep, &buf, b"?guards").await, b"guards ok");
    });
}

#[test]
fn atomics_from_several_queue_pairs_give_the_exact_count() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        const QPS: usize = 4;
        const EACH: usize = 250;
        let mut eps = Vec::new();
        for _ in 0..QPS {
            eps.push(open(&s, &peer).await);
        }
        let word = Remote::at(eps[0].1, 64);
        let buf = Buffer::new(&s.pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
        eps[0].0.write(&buf, 0, 8, word).await.unwrap(); // zero
        let bufs: Vec<_> = (0..QPS)
            .map(|_| Buffer::new(&s.pd, 8 * EACH, 64, Access::LOCAL_WRITE).unwrap())
            .collect();
        // All queue pairs race, interleaved on the wire.
        let tasks: Vec<_> = eps
            .iter()
            .zip(&bufs)
            .map(|((ep, _, _), b)| {
                let ops: Vec<_> = (0..EACH)
                    .map(|i| {
                        ep.execute(
                            SendOp::FetchAdd {
                                remote_addr: word.region.addr + word.offset,
                                rkey: word.region.rkey,
                                add: 1,
                            },
                            vec![b.sge(i * 8, 8)],
                            vec![b.clone()],
                            false,
                        )
                    })
                    .collect();
                ops
            })
            .collect();
        let mut seen = Vec::new();
        for (ops, b) in tasks.into_iter().zip(&bufs) {
            for (i, op) in ops.into_iter().enumerate() {
                op.await.unwrap();
                seen.push(b.load_u64(i * 8));
            }
        }
        seen.sort_unstable();
        assert_eq!(
            seen,
            (0..(QPS * EACH) as u64).collect::<Vec<_>>(),
            "every old value once"
        );
        eps[0].0.read(&buf, 0, 8, word).await.unwrap();
        assert_eq!(buf.load_u64(0), (QPS * EACH) as u64);
    });
}

#[test]
fn protection_violations_complete_with_their_statuses_and_touch_nothing() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let buf = Buffer::new(&s.pd, 65536, 64, Access::LOCAL_WRITE).unwrap();
        buf.write_at(0, &[0x11; 65536]);
        let (_, r0, r1) = open(&s, &peer).await;
        // Each violation breaks its connection, so each gets a fresh one.
        type Case = Box<dyn Fn(&Endpoint, &Rc<Buffer>) -> barewire_drivers::Op>;
        let cases: Vec<(&str, Case)> = vec![
            (
                "write past the end",
                Box::new(move |ep: &Endpoint, buf: &Rc<Buffer>| {
                    ep.write(buf, 0, 8192, Remote::at(r0, r0.len - 4096))
                }),
            ),
            (
                "write before the start",
                Box::new(move |ep: &Endpoint, buf: &Rc<Buffer>| {
                    let mut r = r0;
                    r.addr -= 4096;
                    ep.write(buf, 0, 4096, Remote::at(r, 0))
                }),
            ),
            (
                "write to a read-only region",
                Box::new(move |ep: &Endpoint, buf: &Rc<Buffer>| {
                    ep.write(buf, 0, 16, Remote::at(r1, 0))
                }),
            ),
            (
                "write with an unknown STag",
                Box::new(move |ep: &Endpoint, buf: &Rc<Buffer>| {
                    let mut r = r0;
                    r.rkey = Stag(r0.rkey.0 ^ 0x5a5a_5a00);
                    ep.write(buf, 0, 16, Remote::at(r, 0))
                }),
            ),
            (
                "read past the end",
                Box::new(move |ep: &Endpoint, buf: &Rc<Buffer>| {
                    ep.read(buf, 0, 4096, Remote::at(r1, 2048))
                }),
            ),
        ];
        for (what, op) in &cases {
            let (ep, _, _) = open(&s, &peer).await;
            let t = Instant::now();
            match op(&ep, &buf).await {
                // The software provider answers every one of these with a Terminate carrying a
                // protection error, so REM_ACCESS_ERR; hardware may report some as a remote
                // invalid request or operation error instead.
                Err(DriverError::Completion { status, .. }) => assert!(
                    status == WcStatus::RemAccessErr
                        || (driver != "soft"
                            && driver != "shm"
                            && matches!(status, WcStatus::RemOpErr | WcStatus::RemInvReqErr)),
                    "{what}: {status:?}"
                ),
                other => panic!("{what}: expected a remote access error, got {other:?}"),
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{what}: took {:?}",
                t.elapsed()
            );
        }
        // Nothing moved: the guards around region 0 and region 1's bytes are as they were.
        let (ep, _, r1) = open(&s, &peer).await;
        let check = Buffer::new(&s.pd, 16384, 64, Access::LOCAL_WRITE).unwrap();
        assert_eq!(ask(&ep, &check, b"?guards").await, b"guards ok");
        ep.read(&check, 0, 4096, Remote::at(r1, 0)).await.unwrap();
        let mut back = vec![0u8; 4096];
        check.read_at(0, &mut back);
        assert!(back.iter().all(|&b| b == 0x5a), "region 1 unchanged");
    });
}

/// A request that fails and was not signaled: on verbs and shm it completes with its error
/// anyway (`signaled` asks for a completion on success only), here an unsignaled WRITE with
/// an unknown key after an unsignaled one that succeeds (which completes with nothing). The
/// software provider speaks iWARP, where a WRITE has no response and the peer's Terminate names
/// the offending message, not a work request: the queue pair goes to ERROR, and the next
/// request completes with a flush.
#[test]
fn an_unsignaled_request_that_fails_is_reported() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, _rcq, r0, _) = raw(&s, &peer).await;
        let buf = Buffer::new(&s.pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
        let write = |wr_id, rkey, signaled| SendWr {
            wr_id,
            op: SendOp::Write {
                remote_addr: r0.addr,
                rkey,
            },
            sges: [buf.sge(0, 16)].into(),
            signaled,
            fence: false,
        };
        qp.post_send(write(1, r0.rkey, false)).unwrap();
        qp.post_send(write(2, Stag(r0.rkey.0 ^ 0x5a5a_5a00), false))
            .unwrap();
        let t0 = Instant::now();
        if driver == "soft" {
            while qp.state() != QpState::Error {
                assert!(
                    t0.elapsed() < Duration::from_secs(5),
                    "still {:?}",
                    qp.state()
                );
                barewire_engine::time::sleep(Duration::from_millis(1)).await;
            }
            qp.post_send(write(3, r0.rkey, true)).unwrap();
            let wc = scq.next().await;
            assert_eq!((wc.wr_id, wc.status), (3, WcStatus::WrFlushErr), "{wc:?}");
            return;
        }
        let wc = barewire_engine::time::timeout(Duration::from_secs(5), scq.next())
            .await
            .expect("the failed WRITE completes");
        assert_eq!(wc.wr_id, 2, "{wc:?}");
        assert!(
            wc.status == WcStatus::RemAccessErr
                || (driver != "shm"
                    && matches!(wc.status, WcStatus::RemOpErr | WcStatus::RemInvReqErr)),
            "{wc:?}"
        );
    });
}

/// A window (type 2 memory window semantics) serves the connection it was bound for and no
/// other: the same key on a second connection is a remote access error, and nothing moves.
#[test]
fn a_window_serves_only_its_own_connection() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let buf = Buffer::new(&s.pd, 16384, 64, Access::LOCAL_WRITE).unwrap();
        let (ep, _, _) = open(&s, &peer).await;
        let reply = ask(&ep, &buf, b"?window").await;
        let said = String::from_utf8_lossy(&reply);
        if said.contains("binds no type 2 memory windows") {
            // A device without them (siw): the facade then exports regions unbound, and says
            // so once.
            println!("SKIP a_window_serves_only_its_own_connection on {driver}: {said}");
            return;
        }
        let w = RegionDescriptor::from_bytes(&reply)
            .unwrap_or_else(|| panic!("{driver}: no window: {said}"));
        let data = pattern(4096, 11);
        buf.write_at(0, &data);
        ep.write(&buf, 0, 4096, Remote::at(w, 8192)).await.unwrap();
        ep.read(&buf, 4096, 4096, Remote::at(w, 8192))
            .await
            .unwrap();
        let mut back = vec![0u8; 4096];
        buf.read_at(4096, &mut back);
        assert_eq!(back, data, "through its own connection");
        // The same key on another connection.
        let (other, _, _) = open(&s, &peer).await;
        buf.write_at(0, &[0x77; 4096]);
        match other.write(&buf, 0, 4096, Remote::at(w, 8192)).await {
            Err(DriverError::Completion { status, .. }) => {
                assert_eq!(status, WcStatus::RemAccessErr)
            }
            got => panic!("a window on another connection: expected an access error, got {got:?}"),
        }
        // Nothing moved: still the first pattern, and the guards hold.
        ep.read(&buf, 4096, 4096, Remote::at(w, 8192))
            .await
            .unwrap();
        buf.read_at(4096, &mut back);
        assert_eq!(back, data, "the refused write moved nothing");
        assert_eq!(ask(&ep, &buf, b"?guards").await, b"guards ok");
    });
}

/// A region the peer deregistered is out of reach, even for a connection that used it before
/// (on shm: that already holds a mapping of it), and the access fails as any bad key does.
#[test]
fn a_deregistered_region_is_no_longer_reachable() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let buf = Buffer::new(&s.pd, 16384, 64, Access::LOCAL_WRITE).unwrap();
        let (ep, _, _) = open(&s, &peer).await;
        let r = RegionDescriptor::from_bytes(&ask(&ep, &buf, b"?region").await).unwrap();
        ep.read(&buf, 0, 4096, Remote::at(r, 0)).await.unwrap();
        let mut back = vec![0u8; 4096];
        buf.read_at(0, &mut back);
        assert!(back.iter().all(|&b| b == 0x3c), "the fresh region's bytes");
        buf.write_at(0, &[0x44; 64]);
        ep.write(&buf, 0, 64, Remote::at(r, 0)).await.unwrap();
        assert_eq!(ask(&ep, &buf, b"?drop").await, b"dropped");
        buf.write_at(0, &[0x55; 64]);
        match ep.write(&buf, 0, 64, Remote::at(r, 0)).await {
            Err(DriverError::Completion { status, .. }) => assert!(
                status == WcStatus::RemAccessErr
                    || (driver == "verbs"
                        && matches!(status, WcStatus::RemOpErr | WcStatus::RemInvReqErr)),
                "{status:?}"
            ),
            got => {
                panic!("a write to a deregistered region: expected an access error, got {got:?}")
            }
        }
    });
}

#[test]
fn a_local_sge_outside_its_region_fails_locally() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (ep, r0, _) = open(&s, &peer).await;
        let buf = Buffer::new(&s.pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
        let mut sge = buf.sge(0, 16);
        sge.lkey = Stag(sge.lkey.0 ^ 0x0101_0100);
        let op = SendOp::Write {
            remote_addr: r0.addr,
            rkey: r0.rkey,
        };
        match ep.execute(op, vec![sge], vec![buf.clone()], false).await {
            Err(DriverError::Completion { status, .. }) => {
                assert!(
                    matches!(status, WcStatus::LocProtErr | WcStatus::LocLenErr),
                    "{status:?}"
                )
            }
            Err(DriverError::Post(_)) => {} // refused at post time: also local
            other => panic!("expected a local protection error, got {other:?}"),
        }
    });
}

#[test]
fn completions_come_in_posting_order_and_a_fenced_read_sees_prior_writes() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, _rcq, r0, _) = raw(&s, &peer).await;
        let buf = Buffer::new(&s.pd, 1 << 20, 64, Access::LOCAL_WRITE).unwrap();
        buf.write_at(0, &pattern(65536, 1));
        // Mixed sizes and kinds, all signaled: completions must come back in posting order.
        for i in 0..64u64 {
            let len = [8usize, 65536, 100, 4096][i as usize % 4];
            let op = if i % 3 == 2 {
                SendOp::Read {
                    remote_addr: r0.addr,
                    rkey: r0.rkey,
                }
            } else {
                SendOp::Write {
                    remote_addr: r0.addr + (i % 7) * 65536,
                    rkey: r0.rkey,
                }
            };
            let dst = if i % 3 == 2 { 512 << 10 } else { 0 };
            qp.post_send(SendWr {
                wr_id: i,
                op,
                sges: [buf.sge(dst, len)].into(),
                signaled: true,
                fence: false,
            })
            .unwrap();
        }
        for i in 0..64u64 {
            let wc = scq.next().await;
            assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        }
        // A fenced READ after an unsignaled WRITE to the same place returns the new bytes.
        let data = pattern(4096, 77);
        buf.write_at(0, &data);
        qp.post_send(SendWr {
            wr_id: 100,
            op: SendOp::Write {
                remote_addr: r0.addr + (5 << 20),
                rkey: r0.rkey,
            },
            sges: [buf.sge(0, 4096)].into(),
            signaled: false,
            fence: false,
        })
        .unwrap();
        qp.post_send(SendWr {
            wr_id: 101,
            op: SendOp::Read {
                remote_addr: r0.addr + (5 << 20),
                rkey: r0.rkey,
            },
            sges: [buf.sge(256 << 10, 4096)].into(),
            signaled: true,
            fence: true,
        })
        .unwrap();
        let wc = scq.next().await;
        assert_eq!((wc.wr_id, wc.status), (101, WcStatus::Success));
        let mut back = vec![0u8; 4096];
        buf.read_at(256 << 10, &mut back);
        assert_eq!(back, data);
        qp.disconnect();
    });
}

/// A few hundred one-sided requests of every kind, pipelined (up to 32 outstanding), over one
/// 64 KiB window of the peer's region: Writes of 0 to 60,000 bytes gathered from up to three
/// pieces (none empty), Reads, fetch-adds and compare-and-swaps (half of them with the word's
/// current value), at pseudo-random offsets. Every request completes successfully, in posting
/// order; every atomic returns the word as the requests before it left it; every Read returns,
/// byte by byte, a value the window held there at its turn or was given by a request after it
/// (an unfenced Read may see later Writes); and the window ends exactly as the requests, applied
/// in posting order, leave it.
#[test]
fn a_pipelined_random_mix_of_requests_leaves_what_the_model_says() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, _rcq, r0, _) = raw(&s, &peer).await;
        const WINDOW: usize = 64 << 10;
        const SRC: usize = 0; // 256 KiB of source bytes
        const SINKS: usize = 1 << 20; // where Reads and atomics land, each in its own slot
        let buf = Buffer::new(&s.pd, 8 << 20, 64, Access::LOCAL_WRITE).unwrap();
        let base = r0.addr + (13 << 20);
        // The window's known start.
        let mut model = pattern(WINDOW, 31);
        buf.write_at(SRC, &model);
        let post = |wr_id, op, sges| post_signaled(&qp, wr_id, op, sges);
        post(
            u64::MAX,
            SendOp::Write {
                remote_addr: base,
                rkey: r0.rkey,
            },
            vec![buf.sge(SRC, WINDOW)],
        );
        let wc = scq.next().await;
        assert_eq!((wc.wr_id, wc.status), (u64::MAX, WcStatus::Success));
        buf.write_at(SRC, &pattern(256 << 10, 32));
        let src = pattern(256 << 10, 32);

        enum Check {
            None,
            /// A Read's sink and, per byte, the values it may hold.
            Read(usize, Vec<Vec<u8>>, usize, usize),
            /// An atomic's sink and the original it must return.
            Atomic(usize, u64),
        }
        /// A request's change to the window: the model takes `bytes` at `off`, and every
        /// earlier Read of an overlapping range may return the range as it is now.
        fn change(model: &mut [u8], checks: &mut [Check], off: usize, bytes: &[u8]) {
            model[off..off + bytes.len()].copy_from_slice(bytes);
            for c in checks {
                if let Check::Read(_, versions, roff, rlen) = c {
                    if off < *roff + *rlen && *roff < off + bytes.len() {
                        versions.push(model[*roff..*roff + *rlen].to_vec());
                    }
                }
            }
        }
        let mut rand = xorshift(0x9E37_79B9_7F4A_7C15);
        let (mut checks, mut sink, mut outstanding, mut next_done) = (Vec::new(), SINKS, 0, 0u64);
        const N: u64 = 400;
        for id in 0..N {
            let kind = rand(10);
            let check = if kind < 5 {
                let len = if rand(8) == 0 {
                    rand(60_001)
                } else {
                    rand(20_001)
                };
                let off = rand(WINDOW - len + 1);
                let (sges, bytes) = gather(&mut rand, &buf, SRC, &src, len);
                post(
                    id,
                    SendOp::Write {
                        remote_addr: base + off as u64,
                        rkey: r0.rkey,
                    },
                    sges,
                );
                change(&mut model, &mut checks, off, &bytes);
                Check::None
            } else if kind < 7 {
                let len = 1 + rand(20_000);
                let off = rand(WINDOW - len + 1);
                post(
                    id,
                    SendOp::Read {
                        remote_addr: base + off as u64,
                        rkey: r0.rkey,
                    },
                    vec![buf.sge(sink, len)],
                );
                let c = Check::Read(sink, vec![model[off..off + len].to_vec()], off, len);
                sink += len.next_multiple_of(8);
                c
            } else {
                let off = rand(WINDOW / 8) * 8;
                let old = u64::from_ne_bytes(model[off..off + 8].try_into().unwrap());
                let remote_addr = base + off as u64;
                let (op, new) = if kind < 9 {
                    let add = rand(1 << 30) as u64;
                    let op = SendOp::FetchAdd {
                        remote_addr,
                        rkey: r0.rkey,
                        add,
                    };
                    (op, old.wrapping_add(add))
                } else {
                    let compare = if rand(2) == 0 { old } else { old ^ 1 };
                    let swap = rand(1 << 30) as u64;
                    let op = SendOp::CmpSwap {
                        remote_addr,
                        rkey: r0.rkey,
                        compare,
                        swap,
                    };
                    (op, if old == compare { swap } else { old })
                };
                post(id, op, vec![buf.sge(sink, 8)]);
                change(&mut model, &mut checks, off, &new.to_ne_bytes());
                let c = Check::Atomic(sink, old);
                sink += 8;
                c
            };
            checks.push(check);
            outstanding += 1;
            while outstanding >= 32 || (id + 1 == N && outstanding > 0) {
                next_in_order(&scq, &mut next_done).await;
                outstanding -= 1;
            }
        }
        assert!(sink < 8 << 20, "the sinks fit the buffer");
        for (id, c) in checks.iter().enumerate() {
            match c {
                Check::None => {}
                Check::Read(at, versions, _, len) => {
                    let mut got = vec![0u8; *len];
                    buf.read_at(*at, &mut got);
                    for (k, b) in got.iter().enumerate() {
                        assert!(
                            versions.iter().any(|v| v[k] == *b),
                            "Read {id}: byte {k} is {b:#04x}, which the window never held there"
                        );
                    }
                }
                Check::Atomic(at, old) => {
                    assert_eq!(buf.load_u64(*at), *old, "atomic {id}'s original value");
                }
            }
        }
        // The window, read back with nothing outstanding.
        let wc = {
            post(
                N,
                SendOp::Read {
                    remote_addr: base,
                    rkey: r0.rkey,
                },
                vec![buf.sge(SINKS - WINDOW, WINDOW)],
            );
            scq.next().await
        };
        assert_eq!((wc.wr_id, wc.status), (N, WcStatus::Success));
        let mut back = vec![0u8; WINDOW];
        buf.read_at(SINKS - WINDOW, &mut back);
        assert!(
            back == model,
            "the window differs from the model at byte {:?}",
            back.iter().zip(&model).position(|(a, b)| a != b)
        );
        qp.disconnect();
    });
}

/// 64-bit FNV-1a: the hash `barewire-peer` answers `?sum` with.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Sends, Writes and Writes with immediate data, mixed at random and pipelined, keep their
/// order at the peer, as verbs promises for one queue pair:
/// - Writes of 0 bytes to 2 MiB (gathered from up to three pieces) into a 4 MiB window of the
///   peer's region;
/// - Sends of up to 4 KiB that the peer echoes;
/// - Sends asking the peer for a hash of a range of the window (`?sum`), posted right behind
///   the Writes with no wait: the peer must see every earlier Write in place (a later Write
///   into that range waits for the answer, as the peer places Writes as they arrive);
/// - Writes with immediate data, which the peer answers with the value and length.
///
/// Every request completes successfully, in posting order; every answer comes back in posting
/// order and says what the model says at that point; the window ends as the model; the
/// guards around the peer's region are untouched.
#[test]
fn sends_and_writes_mixed_at_random_keep_their_order_at_the_peer() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, rcq, r0, _) = raw(&s, &peer).await;
        const WINDOW: usize = 4 << 20; // at offset AT of region 0
        const AT: usize = 1 << 20;
        const SRC: usize = 0; // 8 MiB of source bytes
        const SRC_LEN: usize = 8 << 20;
        const ASKS: usize = SRC_LEN; // 64 slots of 64 B for `?sum` requests
        const REPLIES: usize = ASKS + 4096; // 32 slots of 4 KiB for the peer's answers
        const SLOTS: usize = 32;
        let buf = Buffer::new(&s.pd, REPLIES + SLOTS * 4096, 4096, Access::LOCAL_WRITE).unwrap();
        let src = pattern(SRC_LEN, 77);
        buf.write_at(SRC, &src);
        let post = |wr_id, op, sges| post_signaled(&qp, wr_id, op, sges);
        let post_reply_slot = |slot: usize| {
            qp.post_recv(barewire_drivers::RecvWr {
                wr_id: slot as u64,
                sges: [buf.sge(REPLIES + slot * 4096, 4096)].into_iter().collect(),
            })
            .unwrap()
        };
        for slot in 0..SLOTS {
            post_reply_slot(slot);
        }
        // The window's known start.
        let mut model = src[..WINDOW].to_vec();
        post(
            u64::MAX,
            SendOp::Write {
                remote_addr: r0.addr + AT as u64,
                rkey: r0.rkey,
            },
            vec![buf.sge(SRC, WINDOW)],
        );
        let wc = scq.next().await;
        assert_eq!((wc.wr_id, wc.status), (u64::MAX, WcStatus::Success));

        let mut rand = xorshift(0x2545_F491_4F6C_DD1D);
        // Answers owed by the peer, in posting order, each with the range of the window it
        // reads (a `?sum`): no Write into that range is posted until the answer is in, since the
        // peer places Writes as they arrive, ahead of its own reading of earlier Sends.
        struct Owed {
            id: u64,
            want: Vec<u8>,
            reads: Option<(usize, usize)>,
        }
        let mut owed = std::collections::VecDeque::<Owed>::new();
        let (mut outstanding, mut next_done, mut answered) = (0usize, 0u64, 0usize);
        let mut kinds = [0usize; 4];
        let overlaps = |a: (usize, usize), b: (usize, usize)| a.0 < b.0 + b.1 && b.0 < a.0 + a.1;
        const N: u64 = 600;
        for id in 0..=N {
            // The next request: its operation and gather list, what it does to the window, and
            // the answer it is owed.
            let mut next = None;
            if id < N {
                let kind = rand(10);
                let send = SendOp::Send {
                    solicited: rand(2) == 0,
                    invalidate: None,
                };
                next = Some(if kind < 4 {
                    let len = match rand(16) {
                        0 => rand((2 << 20) + 1),
                        1 => 0,
                        _ => rand(20_001),
                    };
                    let off = rand(WINDOW - len + 1);
                    let (sges, bytes) = gather(&mut rand, &buf, SRC, &src, len);
                    let remote_addr = r0.addr + (AT + off) as u64;
                    let op = SendOp::Write {
                        remote_addr,
                        rkey: r0.rkey,
                    };
                    (0, op, sges, Some((off, bytes)), None)
                } else if kind < 6 {
                    let len = 1 + rand(4096);
                    let at = rand(SRC_LEN - len + 1);
                    let want = src[at..at + len].to_vec();
                    (
                        1,
                        send,
                        vec![buf.sge(SRC + at, len)],
                        None,
                        Some((want, None)),
                    )
                } else if kind < 8 {
                    let len = if rand(20) == 0 { WINDOW } else { rand(65_537) };
                    let off = rand(WINDOW - len + 1);
                    let ask = format!("?sum {} {len}", AT + off);
                    let slot = ASKS + (id as usize % 64) * 64;
                    buf.write_at(slot, ask.as_bytes());
                    let want = format!("sum {:016x}", fnv1a(&model[off..off + len]));
                    let sges = vec![buf.sge(slot, ask.len())];
                    (
                        2,
                        send,
                        sges,
                        None,
                        Some((want.into_bytes(), Some((off, len)))),
                    )
                } else {
                    let len = if rand(8) == 0 { 0 } else { rand(20_001) };
                    let off = rand(WINDOW - len + 1);
                    let at = rand(SRC_LEN - len + 1);
                    let imm = rand(1 << 31) as u32;
                    let remote_addr = r0.addr + (AT + off) as u64;
                    let sges = if len == 0 {
                        vec![]
                    } else {
                        vec![buf.sge(SRC + at, len)]
                    };
                    let op = SendOp::WriteWithImm {
                        remote_addr,
                        rkey: r0.rkey,
                        imm,
                    };
                    let bytes = src[at..at + len].to_vec();
                    let want = format!("imm {imm} {len}").into_bytes();
                    (3, op, sges, Some((off, bytes)), Some((want, None)))
                });
            }
            let writes = next
                .as_ref()
                .and_then(|n| n.3.as_ref())
                .map(|(off, bytes)| (*off, bytes.len()));
            // Room first: at most 32 requests outstanding; at most 14 messages the peer has not
            // answered (it keeps 16 receives posted, and reposts each before answering); no
            // Write into a range a `?sum` still waits to read. At the end, everything drained.
            loop {
                let blocked = writes.is_some_and(|w| {
                    owed.iter()
                        .any(|o| o.reads.is_some_and(|r| w.1 > 0 && overlaps(w, r)))
                });
                let full = outstanding >= 32 || owed.len() >= 14;
                let end = next.is_none() && outstanding + owed.len() > 0;
                if !(blocked || full || end) {
                    break;
                }
                if outstanding > 0 && (outstanding >= 32 || owed.is_empty() || end) {
                    next_in_order(&scq, &mut next_done).await;
                    outstanding -= 1;
                } else {
                    let wc = rcq.next().await;
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                    let mut got = vec![0u8; wc.byte_len as usize];
                    buf.read_at(REPLIES + wc.wr_id as usize * 4096, &mut got);
                    post_reply_slot(wc.wr_id as usize);
                    let o = owed.pop_front().expect("an answer nobody asked for");
                    assert!(
                        got == o.want,
                        "request {}'s answer: got {:?}, want {:?}",
                        o.id,
                        String::from_utf8_lossy(&got[..got.len().min(64)]),
                        String::from_utf8_lossy(&o.want[..o.want.len().min(64)])
                    );
                    answered += 1;
                }
            }
            let Some((kind, op, sges, change, answer)) = next else {
                break;
            };
            post(id, op, sges);
            if let Some((off, bytes)) = change {
                model[off..off + bytes.len()].copy_from_slice(&bytes);
            }
            if let Some((want, reads)) = answer {
                owed.push_back(Owed { id, want, reads });
            }
            kinds[kind] += 1;
            outstanding += 1;
        }
        assert!(
            kinds.iter().all(|&k| k > 50),
            "every kind of request ran: {kinds:?}"
        );
        assert_eq!(answered, kinds[1] + kinds[2] + kinds[3]);
        // The whole window, read back with nothing outstanding, and the guards.
        let back_at = REPLIES - WINDOW; // over source bytes no longer needed
        post(
            N,
            SendOp::Read {
                remote_addr: r0.addr + AT as u64,
                rkey: r0.rkey,
            },
            vec![buf.sge(back_at, WINDOW)],
        );
        let wc = scq.next().await;
        assert_eq!((wc.wr_id, wc.status), (N, WcStatus::Success));
        let mut back = vec![0u8; WINDOW];
        buf.read_at(back_at, &mut back);
        assert!(
            back == model,
            "the window differs from the model at byte {:?}",
            back.iter().zip(&model).position(|(a, b)| a != b)
        );
        buf.write_at(ASKS, b"?guards");
        let send = SendOp::Send {
            solicited: false,
            invalidate: None,
        };
        post(N + 1, send, vec![buf.sge(ASKS, 7)]);
        let wc = rcq.next().await;
        let mut got = vec![0u8; wc.byte_len as usize];
        buf.read_at(REPLIES + wc.wr_id as usize * 4096, &mut got);
        assert_eq!(String::from_utf8_lossy(&got), "guards ok");
        qp.disconnect();
    });
}

/// What READs posted after the peer was signalled came to.
#[derive(Debug)]
enum AfterSignal {
    /// One failed with this status, this long after the signal.
    Failed(WcStatus, Duration),
    /// Every READ for the whole bound returned the peer's bytes: its memory is served without
    /// its CPU (shm mappings, a NIC).
    Served,
}

/// A raw queue pair whose owner posts far more signaled WRITEs than its send completion queue
/// holds and never polls: the queue overflows, and the queue pair stops (as verbs' CQ overrun)
/// instead of carrying on with work it can no longer report. It leaves RTS within the bound,
/// and the completions that fit come out first, in posting order.
#[test]
fn an_overrun_completion_queue_stops_its_queue_pair() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, _rcq, r0, _) = raw_with(&s, &peer, 16, 16).await;
        let buf = Buffer::new(&s.pd, 4096, 64, Access::LOCAL_WRITE).unwrap();
        let cap = scq.capacity() as u64;
        let t = Instant::now();
        for i in 0..2 * cap + 8 {
            let posted = qp.post_send(SendWr {
                wr_id: i,
                op: SendOp::Write {
                    remote_addr: r0.addr + 8 * i,
                    rkey: r0.rkey,
                },
                sges: [buf.sge(0, 8)].into(),
                signaled: true,
                fence: false,
            });
            // Once the queue pair has stopped, a post may also be refused outright.
            assert!(posted.is_ok() || qp.state() == QpState::Error, "{posted:?}");
        }
        while qp.state() != QpState::Error && t.elapsed() < bound() {
            barewire_engine::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(qp.state(), QpState::Error, "after {:?}", t.elapsed());
        let mut wcs = vec![barewire_drivers::WorkCompletion::BLANK; 2 * cap as usize];
        let n = scq.poll(&mut wcs);
        assert_eq!(n as u64, cap, "the queue kept what fitted");
        for (i, wc) in wcs[..n].iter().enumerate() {
            assert_eq!((wc.wr_id, wc.status), (i as u64, WcStatus::Success));
        }
    });
}

/// An endpoint keeps no more receives outstanding than its receive completion queue holds:
/// one more is refused at once with a clear error (it could overflow the queue), and once a
/// receive has completed there is room for the next.
#[test]
fn an_endpoint_refuses_more_receives_than_its_completion_queue_holds() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, rcq, ..) = raw_with(&s, &peer, 64, 16).await;
        let cap = rcq.capacity();
        let ep = Endpoint::new(qp, scq, rcq);
        let buf = Buffer::new(&s.pd, 64 * (cap + 2), 64, Access::LOCAL_WRITE).unwrap();
        let recvs: Vec<_> = (0..cap).map(|i| ep.recv(&buf, 64 * (i + 1), 64)).collect();
        let refused = barewire_engine::time::timeout(
            Duration::from_secs(5),
            ep.recv(&buf, 64 * (cap + 1), 64),
        )
        .await
        .expect("refused at once, not posted to wait");
        match refused {
            Err(DriverError::Post(why)) => assert!(why.contains("outstanding"), "{why}"),
            other => panic!("expected the receive to be refused, got {other:?}"),
        }
        // The peer echoes a SEND into the first receive posted; then the next is taken.
        buf.write_at(0, b"echo me");
        ep.send(&buf, 0, 7).await.unwrap();
        let mut recvs = recvs.into_iter();
        let wc = recvs.next().unwrap().await.unwrap();
        assert_eq!(wc.byte_len, 7);
        let mut back = [0u8; 7];
        buf.read_at(64, &mut back);
        assert_eq!(&back, b"echo me");
        let again = ep.recv(&buf, 64, 64);
        buf.write_at(0, b"and me");
        ep.send(&buf, 0, 6).await.unwrap();
        assert_eq!(recvs.next().unwrap().await.unwrap().byte_len, 6);
        drop(again);
    });
}

#[test]
fn an_endpoint_signals_one_of_a_long_run_of_unsignaled_requests() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (qp, scq, rcq, r0, _) = raw_with(&s, &peer, 64, 16).await;
        // Half the smaller of the send queue and its completion queue.
        let limit = 64.min(qp.send_queue_depth().unwrap_or(usize::MAX)) / 2;
        let ep = Endpoint::new(qp, scq, rcq);
        let (a, b) = (
            Buffer::new(&s.pd, 4096, 64, Access::LOCAL_WRITE).unwrap(),
            Buffer::new(&s.pd, 4096, 64, Access::LOCAL_WRITE).unwrap(),
        );
        // Requests 1..=limit + 8 name `a`, the rest up to 2 * limit + 16 name `b`: the
        // endpoint signals the limit-th and the 2 * limit-th itself, and the second of those
        // completing releases every hold on `a`. Without that, the send queue (on verbs) would
        // fill with unsignaled requests, and `a` would stay held until a signaled send.
        let total = 2 * limit + 16;
        for i in 0..total {
            let src = if i < limit + 8 { &a } else { &b };
            src.write_at(8 * (i % 512), &(i as u64).to_le_bytes());
            let op = SendOp::Write {
                remote_addr: r0.addr + 8 * i as u64,
                rkey: r0.rkey,
            };
            ep.post_unsignaled(op, src.sge(8 * (i % 512), 8), src)
                .unwrap();
        }
        let released = barewire_engine::time::timeout(Duration::from_secs(5), async {
            while Rc::strong_count(&a) > 1 {
                barewire_engine::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await;
        assert!(
            released.is_ok(),
            "{} holds on `a` after {total} unsignaled requests: none was signaled",
            Rc::strong_count(&a) - 1
        );
        assert_eq!(
            Rc::strong_count(&b),
            2,
            "the unsignaled requests after the last signaled one still hold `b`"
        );
        // Every request landed, in order; and a signaled request releases `b`.
        let back = Buffer::new(&s.pd, 8 * total, 64, Access::LOCAL_WRITE).unwrap();
        ep.read(&back, 0, 8 * total, Remote::at(r0, 0))
            .await
            .unwrap();
        for i in 0..total {
            let mut w = [0u8; 8];
            back.read_at(8 * i, &mut w);
            assert_eq!(u64::from_le_bytes(w), i as u64, "word {i}");
        }
        assert_eq!(Rc::strong_count(&b), 1);
    });
}

/// Signals the peer with `sig`, then posts a 1 MiB READ of its region again and again until
/// one fails or the backend's bound has passed. A READ that hangs fails the test.
fn reads_after(sig: i32) -> Option<AfterSignal> {
    let driver = backend()?;
    let peer = Peer::start(&driver);
    Some(rt().block_on(async {
        let s = side(&driver);
        let (ep, r0, _) = open(&s, &peer).await;
        let buf = Buffer::new(&s.pd, 2 << 20, 64, Access::LOCAL_WRITE).unwrap();
        let mark = pattern(4096, 5);
        buf.write_at(0, &mark);
        ep.write(&buf, 0, 4096, Remote::at(r0, 0)).await.unwrap();
        peer.signal(sig);
        let t = Instant::now();
        while t.elapsed() < bound() {
            let r = barewire_engine::time::timeout(
                Duration::from_secs(60),
                ep.read(&buf, 1 << 20, 1 << 20, Remote::at(r0, 0)),
            )
            .await
            .expect("the read completes instead of hanging");
            match r {
                Err(DriverError::Completion { status, .. }) => {
                    return AfterSignal::Failed(status, t.elapsed())
                }
                Ok(_) => {
                    let mut back = vec![0u8; 4096];
                    buf.read_at(1 << 20, &mut back);
                    assert_eq!(back, mark, "a READ that succeeds returns the peer's bytes");
                }
                other => panic!("expected a completion, got {other:?}"),
            }
            barewire_engine::time::sleep(Duration::from_millis(5)).await;
        }
        AfterSignal::Served
    }))
}

/// How long a backend may take to notice a dead peer: the software provider's timeout is 1 s
/// and shm sees the hang-up of the peer's socket; hardware RC retries (timeout and retry
/// count) take longer.
fn bound() -> Duration {
    if is_verbs() {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(3)
    }
}

fn is_transport_failure(status: WcStatus) -> bool {
    matches!(status, WcStatus::RetryExcErr | WcStatus::WrFlushErr)
}

/// A killed peer makes READs fail with a transport or flush error within the backend's bound,
/// on every backend.
#[test]
fn a_killed_peer_fails_outstanding_work_within_the_bound() {
    match reads_after(libc::SIGKILL) {
        None => {}
        Some(AfterSignal::Failed(status, took)) => {
            assert!(is_transport_failure(status), "{status:?}");
            assert!(took < bound(), "took {took:?}");
        }
        Some(AfterSignal::Served) => panic!("a killed peer's memory was still served"),
    }
}

/// A stopped peer: the software provider, whose target side runs on the peer's CPU, fails the
/// READ within its bound. Where the peer's memory is served without its CPU (shm, a NIC), the
/// READs keep returning its bytes, and none hangs.
#[test]
fn a_stopped_peer_fails_outstanding_work_within_the_bound() {
    let driver = std::env::var("BAREWIRE_DRIVER").unwrap_or_else(|_| "soft".into());
    match reads_after(libc::SIGSTOP) {
        None => {}
        Some(AfterSignal::Failed(status, took)) => {
            assert!(is_transport_failure(status), "{status:?}");
            assert!(took < bound(), "took {took:?}");
        }
        Some(AfterSignal::Served) => assert!(
            driver != "soft",
            "the software provider served a stopped peer's memory"
        ),
    }
}

/// True where the backend is RC verbs (hardware, rxe, siw): its NIC takes a stopped process's
/// Sends into the receives it posted, then retries for a receive without limit (RNR,
/// `rnr_retry_count` 7), and serves its memory without its CPU.
fn is_verbs() -> bool {
    DriverConfig::from_env()
        .ok()
        .and_then(|c| c.select().ok())
        .is_some_and(|c| !matches!(c.transport, Transport::Soft | Transport::Shm))
}

/// A connection to the peer, shown to work by one echo, then the peer stopped (SIGSTOP): the
/// endpoint, the peer's read-only region 1 (not yet used), and a 16 KiB local buffer.
async fn stopped_after_an_echo(s: &Side, peer: &Peer) -> (Endpoint, RegionDescriptor, Rc<Buffer>) {
    let (ep, _, r1) = open(s, peer).await;
    let buf = Buffer::new(&s.pd, 16384, 64, Access::LOCAL_WRITE).unwrap();
    assert_eq!(ask(&ep, &buf, b"before").await, b"before");
    peer.signal(libc::SIGSTOP);
    (ep, r1, buf)
}

/// Sends to a stopped peer end in a transport error within the backend's bound instead of
/// waiting for it for ever: on soft once the socket has filled and stays full, on shm at
/// once (only the peer's CPU takes a Send from its ring, and a peer that has not even looked
/// at it is not running, unlike one that holds it for want of a receive).
#[test]
fn sends_to_a_stopped_peer_fail_within_the_bound() {
    let Some(driver) = backend() else { return };
    if is_verbs() {
        eprintln!("SKIP: verbs takes Sends for a stopped process's receives, then waits (RNR)");
        return;
    }
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (ep, _, buf) = stopped_after_an_echo(&s, &peer).await;
        let t = Instant::now();
        let mut sent = 0;
        let status = loop {
            assert!(
                t.elapsed() < bound(),
                "{sent} Sends to a stopped peer completed and none failed within {:?}",
                bound()
            );
            let r = barewire_engine::time::timeout(Duration::from_secs(60), ep.send(&buf, 0, 4096))
                .await
                .expect("the Send completes instead of hanging");
            match r {
                Ok(_) => sent += 1,
                Err(DriverError::Completion { status, .. }) => break status,
                Err(other) => panic!("expected a completion, got {other:?}"),
            }
        };
        let took = t.elapsed();
        assert!(is_transport_failure(status), "{status:?}");
        assert!(took < bound(), "took {took:?}");
        if driver == "shm" {
            assert_eq!(sent, 0, "shm completed a Send the stopped peer never took");
        }
    });
}

/// The first use of a key of a stopped peer completes within the bound: with the peer's
/// bytes where its memory is served without its CPU (verbs), otherwise with a transport
/// error (soft serves a READ on the peer's CPU; shm maps a key only once the peer has sent
/// it, which a stopped peer never does).
#[test]
fn a_first_use_of_a_stopped_peers_key_completes_within_the_bound() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (ep, r1, buf) = stopped_after_an_echo(&s, &peer).await;
        let t = Instant::now();
        let r = barewire_engine::time::timeout(
            Duration::from_secs(60),
            ep.read(&buf, 0, 4096, Remote::at(r1, 0)),
        )
        .await
        .expect("the READ completes instead of hanging");
        let took = t.elapsed();
        assert!(took < bound(), "took {took:?}");
        match r {
            Ok(_) if is_verbs() => {
                let mut back = vec![0u8; 4096];
                buf.read_at(0, &mut back);
                assert!(back.iter().all(|&b| b == 0x5a), "the peer's bytes");
            }
            Err(DriverError::Completion { status, .. }) if !is_verbs() => {
                assert!(is_transport_failure(status), "{status:?}")
            }
            other => panic!("{driver}: unexpected {other:?}"),
        }
    });
}

#[test]
fn a_dropped_operation_holds_its_buffer_until_its_completion() {
    let Some(driver) = backend() else { return };
    let peer = Peer::start(&driver);
    rt().block_on(async {
        let s = side(&driver);
        let (ep, r0, _) = open(&s, &peer).await;
        let buf = Buffer::new(&s.pd, 16 << 20, 64, Access::LOCAL_WRITE).unwrap();
        let weak = Rc::downgrade(&buf);
        // Start a large READ, then drop both the future and our handle to the buffer.
        let op = ep.read(&buf, 0, 16 << 20, Remote::at(r0, 0));
        drop(op);
        drop(buf);
        assert_eq!(ep.abandoned_in_flight(), 1);
        assert!(
            weak.upgrade().is_some(),
            "the endpoint holds the buffer while the READ runs"
        );
        let t = Instant::now();
        while ep.abandoned_in_flight() > 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the completion never came"
            );
            barewire_engine::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(weak.upgrade().is_none(), "freed once the completion came");
    });
}

#[test]
fn verbs_without_a_device_is_a_clear_error() {
    if !barewire_drivers::verbs_devices().is_empty() {
        return; // a device exists: the other tests cover it
    }
    let cfg = DriverConfig::parse("verbs", None).unwrap();
    let e = Device::open(&cfg).err().expect("no device, no verbs");
    let msg = e.to_string();
    assert!(
        msg.contains("no verbs RDMA device found") && msg.contains("BAREWIRE_DRIVER=soft"),
        "{msg}"
    );
}
