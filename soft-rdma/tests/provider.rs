//! The provider over real TCP on loopback, driven by the engine: MPA handshake with private
//! data, every basic verb end to end with completions awaited from the completion queues, a
//! protection violation answered by a Terminate, and a peer that disappears failing the
//! survivor's outstanding work within the timeout.

use barewire_test_support::rt;
use std::time::{Duration, Instant};

use barewire_engine::{spawn_local, time::timeout};
use barewire_soft_rdma::provider::{
    connect, send_stats, CmError, ConnectOptions, Listener, QueuePair,
};
use barewire_soft_rdma::stream::{RecvWr, SendOp, SendWr, Sge};
use barewire_soft_rdma::verbs::{
    Access, CompletionQueue, Device, MemoryRegion, ProtectionDomain, QpState, WcOpcode, WcStatus,
};
use barewire_soft_rdma::wire::{DdpTaggedErrorCode, MpaSettings, TermCode};

struct End {
    pd: ProtectionDomain,
    scq: CompletionQueue,
    rcq: CompletionQueue,
}

fn end() -> End {
    let dev = Device::new();
    End {
        pd: dev.alloc_pd(),
        scq: CompletionQueue::new(256),
        rcq: CompletionQueue::new(256),
    }
}

fn reg(pd: &ProtectionDomain, buf: &mut [u8], access: Access) -> MemoryRegion {
    // SAFETY: every buffer outlives its region in these tests.
    unsafe { pd.register(buf.as_mut_ptr(), buf.len(), access) }.unwrap()
}

fn sge(mr: &MemoryRegion, off: usize, len: usize) -> Sge {
    Sge {
        addr: mr.addr() as u64 + off as u64,
        len: len as u32,
        lkey: mr.stag(),
    }
}

/// A work request of `op` with one local piece, unfenced.
fn wr(wr_id: u64, op: SendOp, local: Sge, signaled: bool) -> SendWr {
    SendWr {
        wr_id,
        op,
        sges: [local].into(),
        signaled,
        fence: false,
    }
}

/// A plain Send.
fn send() -> SendOp {
    SendOp::Send {
        solicited: false,
        invalidate: None,
    }
}

/// A WRITE to `mr` at `off` bytes in.
fn write_to(mr: &MemoryRegion, off: u64) -> SendOp {
    SendOp::Write {
        remote_addr: mr.addr() as u64 + off,
        rkey: mr.stag(),
    }
}

/// A READ from `mr` at `off` bytes in.
fn read_from(mr: &MemoryRegion, off: u64) -> SendOp {
    SendOp::Read {
        remote_addr: mr.addr() as u64 + off,
        rkey: mr.stag(),
    }
}

async fn pair(a: &End, b: &End, crc: bool) -> (QueuePair, QueuePair) {
    let opts = |pd: &[u8]| ConnectOptions {
        mpa: MpaSettings {
            crc,
            ..MpaSettings::default()
        },
        private_data: pd.to_vec(),
        ..ConnectOptions::default()
    };
    let l = Listener::bind("127.0.0.1:0".parse().unwrap(), opts(b"server says hi")).unwrap();
    let addr = l.local_addr().unwrap();
    let (pd, scq, rcq) = (b.pd.clone_handle(), b.scq.clone(), b.rcq.clone());
    let server = spawn_local(async move { l.accept(&pd, &scq, &rcq).await });
    let (qa, their) = connect(addr, &a.pd, &a.scq, &a.rcq, opts(b"client says hi"))
        .await
        .unwrap();
    assert_eq!(their, b"server says hi");
    let (qb, theirs) = server.await.unwrap().unwrap();
    assert_eq!(theirs, b"client says hi");
    (qa, qb)
}

/// Posts `n` Sends of `len` bytes (message k filled with k + 1) from `qa` to `qb`, which has a
/// receive for each and a spare, then ends `qa` with `end` (a disconnect, a drop). Checks that
/// every message arrives once, whole and in order, and that the close flushes the spare
/// receive instead of filling it with a repeated frame.
#[allow(clippy::too_many_arguments)]
async fn numbered_sends_then(
    a: &End,
    b: &End,
    qa: QueuePair,
    qb: &QueuePair,
    n: usize,
    len: usize,
    signaled: bool,
    end: impl FnOnce(QueuePair),
) {
    let mut src = vec![0u8; len * n];
    for (k, c) in src.chunks_mut(len).enumerate() {
        c.fill(k as u8 + 1);
    }
    let mut dst = vec![0u8; len * (n + 1)];
    let amr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
    let bmr = reg(&b.pd, &mut dst, Access::LOCAL_WRITE);
    for k in 0..=n {
        qb.post_recv(RecvWr {
            wr_id: k as u64,
            sges: [sge(&bmr, len * k, len)].into(),
        })
        .unwrap();
    }
    for k in 0..n {
        qa.post_send(SendWr {
            wr_id: k as u64,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sges: [sge(&amr, len * k, len)].into(),
            signaled,
            fence: false,
        })
        .unwrap();
    }
    end(qa);
    for k in 0..n {
        let wc = timeout(Duration::from_secs(5), b.rcq.next()).await.unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.byte_len),
            (k as u64, WcStatus::Success, len as u32)
        );
    }
    let wc = timeout(Duration::from_secs(5), b.rcq.next()).await.unwrap();
    assert_eq!(wc.wr_id, n as u64);
    assert_ne!(wc.status, WcStatus::Success, "{wc:?}");
    drop((amr, bmr));
    assert!(dst[..len * n]
        .chunks(len)
        .enumerate()
        .all(|(k, c)| c.iter().all(|&x| x == k as u8 + 1)));
}

#[test]
fn send_write_and_read_over_loopback_tcp() {
    for crc in [false, true] {
        rt().block_on(async {
            let (a, b) = (end(), end());
            let (qa, qb) = pair(&a, &b, crc).await;
            let mut a_buf = vec![0u8; 1 << 20];
            let mut b_buf = vec![0u8; 1 << 20];
            let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
            let bmr = reg(
                &b.pd,
                &mut b_buf,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            );
            for (i, x) in a_buf.iter_mut().enumerate() {
                *x = (i % 253) as u8;
            }

            // Send into a posted receive.
            qb.post_recv(RecvWr {
                wr_id: 1,
                sges: [sge(&bmr, 0, 4096)].into(),
            })
            .unwrap();
            qa.post_send(wr(2, send(), sge(&amr, 0, 3000), true))
                .unwrap();
            let rc = timeout(Duration::from_secs(5), b.rcq.next()).await.unwrap();
            assert_eq!(
                (rc.wr_id, rc.status, rc.byte_len),
                (1, WcStatus::Success, 3000)
            );
            assert_eq!(a.scq.next().await.status, WcStatus::Success);
            assert_eq!(&b_buf[..3000], &a_buf[..3000]);

            // A 1 MiB-ish Write, many FPDUs, part of it received straight into the region.
            qa.post_send(wr(3, write_to(&bmr, 4096), sge(&amr, 0, 900_000), true))
                .unwrap();
            let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode),
                (3, WcStatus::Success, WcOpcode::RdmaWrite)
            );
            // Write completion is local (iWARP); a Read after it returns only once the Write landed.
            qa.post_send(wr(4, read_from(&bmr, 4096), sge(&amr, 0, 900_000), true))
                .unwrap();
            a_buf[..900_000].fill(0);
            let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (4, WcStatus::Success, 900_000)
            );
            assert!(
                b_buf[4096..4096 + 900_000]
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == (i % 253) as u8),
                "the Write landed"
            );
            assert_eq!(
                &a_buf[..900_000],
                &b_buf[4096..4096 + 900_000],
                "the Read brought it back"
            );
            drop((amr, bmr, qa, qb));
        });
    }
}

#[test]
fn a_write_outside_the_region_is_terminated_over_tcp() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, true).await;
        let mut a_buf = vec![1u8; 4096];
        let mut b_buf = vec![0u8; 4096 + 128];
        let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
        let bmr = reg(
            &b.pd,
            &mut b_buf[64..64 + 4096],
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        qa.post_send(wr(1, write_to(&bmr, 4000), sge(&amr, 0, 200), false))
            .unwrap();
        // A Read behind it is failed by the Terminate.
        qa.post_send(wr(2, read_from(&bmr, 0), sge(&amr, 0, 16), true))
            .unwrap();
        let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
        assert_eq!(wc.wr_id, 2);
        assert_eq!(wc.status, WcStatus::RemAccessErr);
        assert_eq!(
            qa.last_terminate(),
            Some(TermCode::ddp_tagged(DdpTaggedErrorCode::BaseBounds))
        );
        assert_eq!(qb.state(), QpState::Error);
        drop(bmr);
        assert!(
            b_buf.iter().all(|&x| x == 0),
            "no byte changed, in the region or around it"
        );
        drop(amr);
    });
}

#[test]
fn a_vanished_peer_fails_outstanding_reads_within_the_timeout() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, false).await;
        let mut a_buf = vec![0u8; 64];
        let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
        // The peer disappears (its socket closes) with a Read outstanding.
        qb.disconnect();
        let t0 = Instant::now();
        qa.post_send(wr(
            9,
            SendOp::Read {
                remote_addr: 0x1000,
                rkey: barewire_soft_rdma::verbs::Stag(1),
            },
            sge(&amr, 0, 64),
            true,
        ))
        .unwrap();
        let wc = timeout(Duration::from_secs(5), a.scq.next())
            .await
            .expect("the failure is reported");
        assert_eq!(wc.wr_id, 9);
        assert!(
            matches!(wc.status, WcStatus::RetryExcErr | WcStatus::WrFlushErr),
            "{:?}",
            wc.status
        );
        assert!(
            t0.elapsed() < Duration::from_secs(2),
            "reported in {:?}",
            t0.elapsed()
        );
        drop(amr);
    });
}

#[test]
fn a_peer_asking_for_markers_is_rejected() {
    rt().block_on(async {
        let b = end();
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectOptions::default()).unwrap();
        let addr = l.local_addr().unwrap();
        let server = spawn_local(async move {
            let r = l.accept(&b.pd, &b.scq, &b.rcq).await;
            matches!(r, Err(CmError::Rejected { .. }))
        });
        // A raw client sending an MPA Request with M set.
        let s = barewire_engine::net::TcpStream::connect(addr)
            .await
            .unwrap();
        let mut req = b"MPA ID Req Frame".to_vec();
        req.extend_from_slice(&[0x80, 1, 0, 0]);
        s.write_all(req).await.0.unwrap();
        let (r, rep) = s.read_exact(vec![0u8; 20]).await;
        r.unwrap();
        assert_eq!(&rep[..16], b"MPA ID Rep Frame");
        assert_ne!(rep[16] & 0x20, 0, "the Reply has R set");
        assert!(server.await.unwrap());
    });
}

#[test]
fn dropping_the_last_handle_closes_the_connection() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, false).await;
        let mut a_buf = vec![0u8; 64];
        let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
        drop(qb); // like ibv_destroy_qp: the socket closes, the provider forgets it
        barewire_engine::time::sleep(Duration::from_millis(20)).await;
        qa.post_send(wr(
            1,
            SendOp::Read {
                remote_addr: 0,
                rkey: barewire_soft_rdma::verbs::Stag(1),
            },
            sge(&amr, 0, 8),
            true,
        ))
        .unwrap();
        let wc = timeout(Duration::from_secs(5), a.scq.next())
            .await
            .expect("the failure is reported");
        assert_ne!(wc.status, WcStatus::Success);
        assert_eq!(qa.state(), QpState::Error);
        drop(amr);
    });
}

/// On an io_uring core a queue pair names its socket by a slot in the core's registered file
/// table, and gives the slot back when it is dropped: the table would otherwise hold the
/// socket open after its descriptor closed. (On epoll there is no table, and under SQPOLL the
/// queue pairs send through duplicates of their descriptors: both stay at none.)
#[test]
fn a_dropped_queue_pair_gives_its_registered_file_back() {
    rt().block_on(async {
        let uses_table = matches!(
            barewire_engine::reactor(),
            barewire_engine::ReactorKind::IoUring(f) if f != barewire_engine::UringFlags::SqPoll
        );
        let files = || barewire_engine::stats().registered_files;
        let before = files();
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, false).await;
        if uses_table {
            assert!(files() >= before + 2, "each queue pair holds a slot");
        }
        drop((qa, qb));
        assert_eq!(files(), before, "the slots went back");
    });
}

#[test]
fn a_refused_write_completes_with_rem_access_err_on_the_initiator() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, false).await;
        let mut a_buf = vec![1u8; 4096];
        let mut b_buf = vec![0u8; 4096];
        let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
        let bmr = reg(&b.pd, &mut b_buf, Access::LOCAL_WRITE | Access::REMOTE_READ);
        // B's region does not allow remote writes.
        qa.post_send(wr(7, write_to(&bmr, 0), sge(&amr, 0, 64), true))
            .unwrap();
        let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode),
            (7, WcStatus::RemAccessErr, WcOpcode::RdmaWrite),
            "the Write itself reports the refusal"
        );
        assert_eq!(qb.state(), QpState::Error);
        drop((amr, bmr));
        assert!(b_buf.iter().all(|&x| x == 0));
    });
}

#[test]
fn an_accepted_write_completes_only_after_the_peer_placed_it() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, _qb) = pair(&a, &b, false).await;
        let mut a_buf = vec![9u8; 1 << 20];
        let mut b_buf = vec![0u8; 1 << 20];
        let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
        let bmr = reg(
            &b.pd,
            &mut b_buf,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        );
        qa.post_send(wr(1, write_to(&bmr, 0), sge(&amr, 0, 1 << 20), true))
            .unwrap();
        let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 1 << 20));
        // Same core: if the completion came before placement, B's memory would still be zero here.
        assert!(
            b_buf.iter().all(|&x| x == 9),
            "completion implies the data is in the peer's region"
        );
        drop((amr, bmr));
    });
}

#[test]
fn sixteen_mib_write_and_read_round_trip() {
    const N: usize = 16 << 20;
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, _qb) = pair(&a, &b, true).await;
        let mut src: Vec<u8> = (0..N).map(|i| (i * 31 % 257) as u8).collect();
        let mut back = vec![0u8; N];
        let mut b_buf = vec![0u8; N];
        let smr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
        let rmr = reg(&a.pd, &mut back, Access::LOCAL_WRITE);
        let bmr = reg(
            &b.pd,
            &mut b_buf,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        );
        qa.post_send(wr(1, write_to(&bmr, 0), sge(&smr, 0, N), true))
            .unwrap();
        qa.post_send(wr(2, read_from(&bmr, 0), sge(&rmr, 0, N), true))
            .unwrap();
        for id in [1, 2] {
            let wc = timeout(Duration::from_secs(20), a.scq.next())
                .await
                .unwrap();
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len as usize),
                (id, WcStatus::Success, N)
            );
        }
        drop((smr, rmr, bmr));
        assert!(b_buf == src, "16 MiB landed in the peer's region intact");
        assert!(back == src, "and came back intact");
    });
}

/// A core whose queue pairs are idle sleeps (the poller's interrupt source does not fire for
/// nothing), and each message from another core wakes it at once. Three messages, 250 ms
/// apart, each to be taken within 150 ms of its post: a core that a message does not wake
/// sleeps until a timer of its own (about a second away) and misses that bound for at least
/// two of them.
#[test]
fn an_idle_core_sleeps_and_wakes_for_a_message() {
    const MSGS: u64 = 3;
    let (tx, rx) = std::sync::mpsc::channel::<std::net::SocketAddr>();
    let posted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sender = {
        let posted = posted.clone();
        std::thread::spawn(move || {
            rt().block_on(async move {
                let a = end();
                let mut buf = vec![7u8; 64];
                let amr = reg(&a.pd, &mut buf, Access::LOCAL_WRITE);
                let addr = rx.recv().unwrap();
                let (qa, _) = connect(addr, &a.pd, &a.scq, &a.rcq, ConnectOptions::default())
                    .await
                    .unwrap();
                for id in 0..MSGS {
                    // Let the receiver go idle first.
                    barewire_engine::time::sleep(Duration::from_millis(250)).await;
                    posted.lock().unwrap().push(std::time::Instant::now());
                    qa.post_send(wr(id, send(), sge(&amr, 0, 64), true))
                        .unwrap();
                    let wc = a.scq.next().await;
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                }
            })
        })
    };
    let taken = rt().block_on(async move {
        let b = end();
        let mut buf = vec![0u8; 64 * MSGS as usize];
        let bmr = reg(&b.pd, &mut buf, Access::LOCAL_WRITE);
        let l = Listener::bind("127.0.0.1:0".parse().unwrap(), ConnectOptions::default()).unwrap();
        tx.send(l.local_addr().unwrap()).unwrap();
        let (qb, _) = l.accept(&b.pd, &b.scq, &b.rcq).await.unwrap();
        for id in 0..MSGS {
            qb.post_recv(RecvWr {
                wr_id: id,
                sges: [sge(&bmr, 64 * id as usize, 64)].into(),
            })
            .unwrap();
        }
        let before = barewire_engine::stats();
        let mut taken = Vec::new();
        for _ in 0..MSGS {
            let wc = timeout(Duration::from_secs(5), b.rcq.next())
                .await
                .expect("the message came");
            taken.push(std::time::Instant::now());
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 64));
        }
        let after = barewire_engine::stats();
        assert!(after.sleeps > before.sleeps, "the core slept: {after:?}");
        // About 750 ms idle: a handful of sleeps (the timers, the wakes), not a spin of
        // wake-ups caused by an interrupt source that keeps firing.
        assert!(
            after.poller_passes - before.poller_passes < 100,
            "idle passes: {before:?} -> {after:?}"
        );
        drop(bmr);
        taken
    });
    sender.join().unwrap();
    let posted = posted.lock().unwrap();
    for (i, (p, t)) in posted.iter().zip(&taken).enumerate() {
        let late = t.saturating_duration_since(*p);
        assert!(
            late < Duration::from_millis(150),
            "message {i} did not wake the sleeping core: taken {late:?} after its post"
        );
    }
}

/// A send posted for the next progress pass and followed at once by a disconnect still
/// reaches the peer: disconnecting hands queued work to the socket before the FIN.
#[test]
fn a_batched_send_posted_just_before_disconnect_is_delivered() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, false).await;
        let mut src = vec![0x42u8; 256];
        let mut dst = vec![0u8; 256];
        let amr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
        let bmr = reg(&b.pd, &mut dst, Access::LOCAL_WRITE);
        qb.post_recv(RecvWr {
            wr_id: 1,
            sges: [sge(&bmr, 0, 256)].into(),
        })
        .unwrap();
        qa.post_send_batched(wr(7, send(), sge(&amr, 0, 256), false))
            .unwrap();
        qa.disconnect();
        let wc = timeout(Duration::from_secs(5), b.rcq.next()).await.unwrap();
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 256));
        drop((amr, bmr));
    });
}

/// Sixteen 16 KiB WRITEs posted in one poll of a task, as a bandwidth loop posts its batch: on
/// an io_uring core with few queue pairs the first goes at once, in a submission of its own,
/// and the fifteen after it wait for the task to yield and go together (they were one
/// `io_uring_enter` and one `SENDMSG` each); on the epoll fallback likewise, with one `sendmsg`
/// for the first and the rest when the task yields (they were a `sendmsg` each). Every byte
/// lands and every WRITE completes. Under epoll, and under SQPOLL, the provider makes no ring
/// calls.
#[test]
fn writes_posted_in_one_poll_go_out_together_when_the_task_yields() {
    const N: usize = 16;
    const LEN: usize = 16 << 10;
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, _qb) = pair(&a, &b, true).await;
        let mut src: Vec<u8> = (0..N * LEN).map(|i| (i % 253) as u8).collect();
        let mut dst = vec![0u8; N * LEN];
        let smr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
        let dmr = reg(&b.pd, &mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        // Under SQPOLL the kernel's thread submits (sends go from copies): no call either.
        let sqpoll = matches!(
            barewire_engine::reactor(),
            barewire_engine::ReactorKind::IoUring(barewire_engine::UringFlags::SqPoll)
        );
        let ring = !sqpoll
            && matches!(
                barewire_engine::reactor(),
                barewire_engine::ReactorKind::IoUring(_)
            );
        let before = barewire_engine::stats().submit_calls;
        let sends_before = send_stats().sends;
        for n in 0..N {
            let at = n * LEN;
            qa.post_send(wr(
                n as u64,
                write_to(&dmr, at as u64),
                sge(&smr, at, LEN),
                true,
            ))
            .unwrap();
        }
        let posting = barewire_engine::stats().submit_calls - before;
        assert_eq!(posting, u64::from(ring), "ring calls while the task posted");
        if !sqpoll {
            // The first WRITE went at once, in one send (one `sendmsg` on epoll); the rest
            // wait for the yield, on either reactor.
            assert_eq!(
                send_stats().sends - sends_before,
                1,
                "sends while the task posted"
            );
        }
        for _ in 0..N {
            let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
            assert_eq!(wc.status, WcStatus::Success);
        }
        drop((smr, dmr));
        assert!(dst == src, "every WRITE's bytes landed where it named");
    });
}

/// `n` connected pairs between `a` and `b`.
async fn pairs(a: &End, b: &End, n: usize, crc: bool) -> Vec<(QueuePair, QueuePair)> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(pair(a, b, crc).await);
    }
    v
}

/// Posts one signaled WRITE of `len` bytes on each pair's connecting queue pair, from offset
/// `src_at(n)` of `smr` to offset `n * len` of `dmr` for pair `n`, all at once, and waits for
/// every completion (each comes once the peer placed the bytes).
async fn write_on_each(
    a: &End,
    pairs: &[(QueuePair, QueuePair)],
    smr: &MemoryRegion,
    dmr: &MemoryRegion,
    len: usize,
    src_at: impl Fn(usize) -> usize,
) {
    for (n, (qa, _)) in pairs.iter().enumerate() {
        qa.post_send(wr(
            n as u64,
            write_to(dmr, (n * len) as u64),
            sge(smr, src_at(n), len),
            true,
        ))
        .unwrap();
    }
    for _ in 0..pairs.len() {
        let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
        assert_eq!(wc.status, WcStatus::Success);
    }
}

/// On an io_uring core, every queue pair's sends and receives of one loop pass go out in one
/// `io_uring_enter`: with 16 connections (32 queue pairs on the core) moving 4 KiB WRITEs at
/// once, the core makes no more submitting calls than passes, and the bytes went through the
/// ring (SQEs counted by the engine). Under epoll the provider makes no ring calls at all.
#[test]
fn a_loaded_core_makes_at_most_one_ring_call_per_pass() {
    const PAIRS: usize = 16;
    const WRITES: usize = 64;
    const LEN: usize = 4096;
    rt().block_on(async {
        let (a, b) = (end(), end());
        let pairs = pairs(&a, &b, PAIRS, true).await;
        let mut src = vec![5u8; LEN];
        let mut dst = vec![0u8; LEN * PAIRS];
        let smr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
        let dmr = reg(&b.pd, &mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let before = barewire_engine::stats();
        for _ in 0..WRITES {
            write_on_each(&a, &pairs, &smr, &dmr, LEN, |_| 0).await;
        }
        let after = barewire_engine::stats();
        let passes = after.poller_passes - before.poller_passes;
        let calls = after.submit_calls - before.submit_calls;
        match barewire_engine::reactor() {
            barewire_engine::ReactorKind::IoUring(flags) => {
                let sqes = after.ops_submitted - before.ops_submitted;
                // Each WRITE needs its send and, for its acknowledgement, the peer's: far more
                // SQEs than calls, if they are batched. Under SQPOLL a queue pair sends from
                // copies, and what it queues while a send is in flight goes with its next one
                // (the kernel thread's pace decides how many: 675 for these 1,024 WRITEs in
                // one CI run, 124-594 with the test run alone, on this code and the code
                // before), so there it is at least one SQE per queue pair on each side.
                let least = if flags == barewire_engine::UringFlags::SqPoll {
                    2 * PAIRS
                } else {
                    PAIRS * WRITES
                };
                assert!(
                    sqes >= least as u64,
                    "the provider's I/O went through the ring: {sqes} SQEs"
                );
                assert!(
                    calls <= passes,
                    "{calls} submitting io_uring_enter calls in {passes} passes"
                );
            }
            barewire_engine::ReactorKind::Epoll => assert_eq!(calls, 0),
        }
        drop((smr, dmr));
        assert!(dst.iter().all(|&x| x == 5));
    });
}

/// Two pairs on one core (four queue pairs: the core polls their receives each pass), each
/// carrying small WRITEs of its own pattern at once, round after round: every queue pair's
/// bytes land where its own WRITE put them, whole, even in passes where several of them
/// received (each polled receive of a pass reads into a buffer of its own).
#[test]
fn queue_pairs_polled_in_the_same_pass_keep_their_own_bytes() {
    const PAIRS: usize = 2;
    const ROUNDS: usize = 300;
    const LEN: usize = 200;
    rt().block_on(async {
        let (a, b) = (end(), end());
        let pairs = pairs(&a, &b, PAIRS, false).await;
        let mut src = vec![0u8; LEN * PAIRS];
        let mut dst = vec![0u8; LEN * PAIRS];
        let smr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
        let dmr = reg(&b.pd, &mut dst, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let pattern = |round: usize, n: usize| (round * PAIRS + n) as u8 | 1;
        for round in 0..ROUNDS {
            for n in 0..PAIRS {
                // (No WRITE reading it is outstanding: the last round's completed.)
                src[n * LEN..(n + 1) * LEN].fill(pattern(round, n));
            }
            write_on_each(&a, &pairs, &smr, &dmr, LEN, |n| n * LEN).await;
            // Every WRITE of the round has been placed (completed).
            for n in 0..PAIRS {
                let got = &dst[n * LEN..(n + 1) * LEN];
                assert!(
                    got.iter().all(|&x| x == pattern(round, n)),
                    "round {round}, pair {n}: {:?}",
                    &got[..8]
                );
            }
        }
        drop((smr, dmr));
    });
}

/// Sends posted one after another and a disconnect at once: each message arrives exactly once
/// and whole, then the close. (A send that left on the wire but was not yet applied to the
/// stream would be sent again by the disconnect's flush: the peer would then read a second
/// copy of its bytes as a new frame.)
#[test]
fn posts_then_an_immediate_disconnect_deliver_each_message_once() {
    const N: usize = 3;
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, true).await;
        numbered_sends_then(&a, &b, qa, &qb, N, 64, false, |qa| qa.disconnect()).await;
        assert!(qb.last_terminate().is_none(), "{:?}", qb.last_terminate());
    });
}

/// A queue pair used after its runtime's `block_on` returned (a handle dropped late, as a
/// channel's receiver returning its credits does) does not panic: the post waits in the
/// stream, as it would on a core that is gone.
#[test]
fn a_post_outside_the_runtime_does_not_panic() {
    let (a, b) = (end(), end());
    let mut src = vec![1u8; 64];
    let amr = reg(&a.pd, &mut src, Access::LOCAL_WRITE);
    let (qa, qb) = rt().block_on(async { pair(&a, &b, false).await });
    qa.post_send(wr(1, send(), sge(&amr, 0, 64), false))
        .unwrap();
    drop((qa, qb, amr));
}

/// Under SQPOLL the provider sends from copies and receives into provided buffers only, and a
/// spinning core moves its verbs without a system call per message: 500 rounds of an 8-byte
/// Write and an 8-byte Read between two queue pairs of one core make far fewer
/// `io_uring_enter` calls than rounds. A 1 MiB Write and Read come back whole, and sends posted
/// just before a disconnect still arrive (the socket shuts down after the copies went out).
#[test]
fn under_sqpoll_every_verb_works_without_a_system_call_per_message() {
    const ROUNDS: usize = 500;
    const BIG: usize = 1 << 20;
    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .pin(false)
        .idle_spin(Duration::from_millis(2))
        .reactor(barewire_engine::Reactor::IoUring)
        .sqpoll(Duration::from_millis(50))
        .build()
        .expect("this kernel runs io_uring, so it must accept SQPOLL");
    rt.block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, true).await;
        let mut a_buf = vec![0u8; 2 * BIG];
        let mut b_buf = vec![0u8; 2 * BIG];
        let amr = reg(&a.pd, &mut a_buf, Access::LOCAL_WRITE);
        let bmr = reg(
            &b.pd,
            &mut b_buf,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        );
        let (base, rkey) = (bmr.addr() as u64, bmr.stag());
        let post = |wr_id: u64, op: SendOp, off: usize, len: usize| {
            qa.post_send(SendWr {
                wr_id,
                op,
                sges: [sge(&amr, off, len)].into(),
                signaled: true,
                fence: false,
            })
            .unwrap()
        };
        let a_ptr = amr.addr();
        let before = barewire_engine::stats();
        for round in 0..ROUNDS {
            // SAFETY: the region's memory, written while no operation uses it.
            unsafe { std::ptr::write_bytes(a_ptr, round as u8, 8) };
            let remote_addr = base + 8 * (round % 64) as u64;
            post(2 * round as u64, SendOp::Write { remote_addr, rkey }, 0, 8);
            let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
            assert_eq!(wc.status, WcStatus::Success);
            post(
                2 * round as u64 + 1,
                SendOp::Read { remote_addr, rkey },
                8,
                8,
            );
            let wc = timeout(Duration::from_secs(5), a.scq.next()).await.unwrap();
            assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, 8));
            // SAFETY: the Read completed; nothing writes the region now.
            let back = unsafe { std::slice::from_raw_parts(a_ptr.add(8), 8) };
            assert!(back.iter().all(|&x| x == round as u8), "round {round}");
        }
        let after = barewire_engine::stats();
        let syscalls = (after.submit_calls - before.submit_calls) + (after.sleeps - before.sleeps);
        assert!(
            syscalls * 10 <= ROUNDS as u64,
            "{syscalls} io_uring_enter calls for {ROUNDS} Write+Read rounds"
        );

        // Large: a Write that the peer receives through provided buffers, and a Read back.
        for (k, x) in a_buf[..BIG].iter_mut().enumerate() {
            *x = (k % 251) as u8;
        }
        post(
            9000,
            SendOp::Write {
                remote_addr: base + BIG as u64,
                rkey,
            },
            0,
            BIG,
        );
        let wc = timeout(Duration::from_secs(10), a.scq.next())
            .await
            .unwrap();
        assert_eq!(wc.status, WcStatus::Success);
        post(
            9001,
            SendOp::Read {
                remote_addr: base + BIG as u64,
                rkey,
            },
            BIG,
            BIG,
        );
        let wc = timeout(Duration::from_secs(10), a.scq.next())
            .await
            .unwrap();
        assert_eq!((wc.status, wc.byte_len), (WcStatus::Success, BIG as u32));
        assert!(a_buf[BIG..]
            .iter()
            .enumerate()
            .all(|(k, &x)| x == (k % 251) as u8));

        // Sends, then a disconnect at once: every message arrives, then the close.
        for k in 0..3u64 {
            qb.post_recv(RecvWr {
                wr_id: k,
                sges: [sge(&bmr, 64 * k as usize, 64)].into(),
            })
            .unwrap();
        }
        for k in 0..3u64 {
            post(
                10_000 + k,
                SendOp::Send {
                    solicited: false,
                    invalidate: None,
                },
                0,
                64,
            );
        }
        qa.disconnect();
        for k in 0..3u64 {
            let wc = timeout(Duration::from_secs(5), b.rcq.next()).await.unwrap();
            assert_eq!(
                (wc.wr_id, wc.status, wc.byte_len),
                (k, WcStatus::Success, 64)
            );
        }
        drop((amr, bmr));
    });
}

/// Under SQPOLL a queue pair dropped right after posting (no disconnect, its sends completed
/// but perhaps not yet read by the kernel thread) still delivers what it posted: its wire owns
/// the copies and a duplicate of the socket until the sends complete, then closes. The peer gets
/// every message, whole and in order, then sees the connection end.
#[test]
fn under_sqpoll_a_dropped_queue_pair_still_delivers_what_it_posted() {
    const N: usize = 8;
    let rt = barewire_engine::Runtime::builder()
        .cores(1)
        .sleeping()
        .reactor(barewire_engine::Reactor::IoUring)
        .sqpoll(Duration::from_millis(20))
        .build()
        .expect("this kernel runs io_uring, so it must accept SQPOLL");
    rt.block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, true).await;
        numbered_sends_then(&a, &b, qa, &qb, N, 4096, true, drop).await;
    });
}

/// The peer writes its last word and hangs up; this side, not having looked at its socket
/// yet, posts and finds the connection gone (its second post fails with EPIPE, after the
/// first drew a reset). What the peer sent before hanging up is still in the socket, ahead of
/// its end, and lands all the same: the queue pair fails only once it has taken it. (A
/// channel's receiver returns its last credits this way just before it hangs up, and its
/// sender's `flush` relies on them.) Before, the failed send closed the queue pair at once and
/// the last word was dropped.
#[test]
fn what_the_peer_wrote_before_hanging_up_lands_though_a_send_fails_first() {
    rt().block_on(async {
        let (a, b) = (end(), end());
        let (qa, qb) = pair(&a, &b, false).await;
        let mut word = vec![0u8; 8];
        let mut last = vec![0x5Au8; 8];
        let mut scratch = vec![0u8; 8];
        let amr = reg(&a.pd, &mut word, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
        let smr = reg(&a.pd, &mut scratch, Access::LOCAL_WRITE);
        let bmr = reg(&b.pd, &mut last, Access::LOCAL_WRITE);
        // From here to the first await nothing lets `qa`'s side look at its socket.
        qb.post_send(wr(1, write_to(&amr, 0), sge(&bmr, 0, 8), false))
            .unwrap();
        drop(qb);
        // (Posts after the queue pair failed complete at once with WR_FLUSH_ERR.)
        for wr_id in 10..14 {
            let _ = qa.post_send(wr(wr_id, read_from(&bmr, 0), sge(&smr, 0, 0), true));
        }
        let wc = timeout(Duration::from_secs(5), a.scq.next())
            .await
            .expect("the failure is reported");
        assert_ne!(wc.status, WcStatus::Success);
        assert_eq!(qa.state(), QpState::Error);
        drop(amr);
        assert_eq!(word, [0x5A; 8], "the peer's last word was lost");
        drop((smr, bmr));
    });
}
