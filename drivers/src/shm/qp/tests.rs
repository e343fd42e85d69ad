use super::listener::Port;
use super::percore::ShmPoller;
use super::*;
use crate::backend::{DeviceOps, ListenerOps};
use std::os::fd::FromRawFd;

/// A pipe: its read end and its write end.
fn pipe() -> (OwnedFd, OwnedFd) {
    let mut p = [0; 2];
    // SAFETY: a pipe of our own; both ends are owned below.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    // SAFETY: the descriptors pipe just made, each owned once.
    unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
}

/// A TCP port of `ip`'s, reserved as a plain shm listener reserves one; the listener stays
/// open for the whole test (a port given back could be taken meanwhile).
fn a_port_of(ip: impl Into<std::net::IpAddr>) -> (std::net::TcpListener, SocketAddr) {
    let tcp = std::net::TcpListener::bind(SocketAddr::new(ip.into(), 0)).unwrap();
    let bound = tcp.local_addr().unwrap();
    (tcp, bound)
}

/// With the shm name of `held`'s port taken: a listener on port 0, whose first pick the
/// kernel "makes" that port, names another; one on that port itself fails with an error
/// that contains `says`.
fn a_held_name(held: &(std::net::TcpListener, SocketAddr), says: &str) {
    let (tcp, at) = held;
    let again = || Ok((Port::Reserved(tcp.try_clone().unwrap()), *at));
    let mut picks = 0;
    let (_port, bound, fd) = Listener::name_a_port(SocketAddr::new(at.ip(), 0), |addr| {
        picks += 1;
        if picks == 1 {
            return again();
        }
        let (tcp, bound) = a_port_of(addr.ip());
        Ok((Port::Reserved(tcp), bound))
    })
    .unwrap();
    assert_eq!(picks, 2);
    assert_ne!(bound.port(), at.port());
    assert!(fd.is_some());
    // Asked for by number, the port is not changed: an error that names the holder.
    let e = Listener::name_a_port(*at, |_| again())
        .err()
        .expect("a named port whose name is held")
        .to_string();
    assert!(e.contains(says), "{e}");
}

/// A port the kernel picks for a listener on port 0 whose shm name this user's process
/// still holds (a listener closing) is set aside for another; a port the caller named is
/// not, and says why.
#[test]
fn a_picked_port_whose_name_is_still_held_gives_way_to_another() {
    // A port whose name is held here, as by a listener whose port went first.
    let held = a_port_of([0, 0, 0, 0]);
    let squatter = sock::seqpacket().unwrap();
    sock::listen(&squatter, &sock::name(held.1)).unwrap();
    a_held_name(&held, "another shm listener has it");
    // The squatter still has its name.
    assert!(sock::listen(&sock::seqpacket().unwrap(), &sock::name(held.1)).is_err());
    drop(squatter);
}

/// As above, with the name held by another user's process (any local user can take any
/// abstract name).
#[test]
fn a_picked_port_whose_name_another_user_holds_gives_way_to_another() {
    let held = a_port_of([127, 0, 0, 1]);
    let Some(squatter) = barewire_test_support::squat(held.1.port()) else {
        eprintln!("SKIP: changing users needs root");
        return;
    };
    a_held_name(&held, "a process of user 65534 holds it");
    drop(squatter);
}

#[test]
fn a_wake_up_descriptor_must_be_an_eventfd() {
    assert!(sock::check_eventfd(&sock::eventfd().unwrap()).is_ok());
    let (r, _w) = pipe();
    let e = sock::check_eventfd(&r).unwrap_err().to_string();
    assert!(e.contains("not an eventfd"), "{e}");
}

/// What a hostile peer does once its setup is through.
#[derive(Debug, Clone, Copy)]
enum Hostile {
    /// Forges a record of an unknown kind at the ring's start and publishes it.
    UnknownRecord,
    /// Publishes a tail a ring and a record past the reader's head.
    TailPastTheRing,
    /// Forges a Send of 4 KiB and publishes only its header.
    SendPastWhatIsPublished,
    /// A well-formed Send of 300 bytes, longer than the receive posted for it.
    SendLongerThanTheReceive,
    /// A control message of a kind nobody defined.
    UnknownControl,
    /// A grant nobody asked for, carrying a pipe.
    UnaskedGrant,
    /// A control message carrying more descriptors than any message may.
    TooManyDescriptors,
    /// Asks for a key nobody registered (guessing).
    GuessedKey,
}

/// A device, a listener on a free loopback port, the port, and a protection domain.
fn listening() -> (
    super::super::Device,
    Listener,
    u16,
    Box<dyn crate::backend::PdOps>,
) {
    let dev = super::super::Device::new();
    let opts = crate::api::ConnectOptions::default();
    let l = Listener::bind(([127, 0, 0, 1], 0).into(), &opts, false).unwrap();
    let port = l.port();
    let pd = dev.alloc_pd().unwrap();
    (dev, l, port, pd)
}

/// Sets up over the listener on `port` by hand, as barewire's peer does: what the listener
/// answered, and this side's half.
async fn set_up(port: u16, deadline: Instant) -> (Heard, Ours) {
    let fd = sock::seqpacket().unwrap();
    sock::connect(&fd, &sock::name(([127, 0, 0, 1], port).into())).unwrap();
    let ours = Ours::new().unwrap();
    ours.send(&fd, M_HELLO, b"").unwrap();
    (hear(fd, M_ACCEPT, deadline).await.unwrap(), ours)
}

/// A queue pair the listener accepted from a peer set up by hand ([`set_up`]), with the
/// peer's halves of the setup, and what the pair needs alive.
struct Accepted {
    qp: QueuePair,
    heard: Heard,
    ours: Ours,
    pd: Box<dyn crate::backend::PdOps>,
    _cqs: (crate::api::CompletionQueue, crate::api::CompletionQueue),
    _listener: (super::super::Device, Listener),
}

async fn accepted() -> Accepted {
    let (dev, l, port, pd) = listening();
    let peer = spawn_local(set_up(port, Instant::now() + Duration::from_secs(5)));
    let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
    let (qp, _) = l.accept(&*pd, &s, &r, Vec::new()).await.unwrap();
    let (heard, ours) = peer.await.unwrap();
    Accepted {
        qp,
        heard,
        ours,
        pd,
        _cqs: (s, r),
        _listener: (dev, l),
    }
}

/// A core that may not sleep (a Send waits in a ring for a receive) leaves none of its
/// rings marked asleep: the engine calls `exit_interrupt_mode` only after a `true`, and a
/// writer that saw the mark would wake an awake core at every record.
#[test]
fn a_core_that_may_not_sleep_leaves_no_ring_marked_asleep() {
    barewire_test_support::rt().block_on(async {
        let a = accepted().await;
        let cap = a.heard.peer.ring_cap as usize;
        let map = Mapping::new(&a.heard.ring, 0, (ring::HEADER + cap) as u64, 0, true);
        let map = map.unwrap();
        let mut w = Writer::new(Ring::from_mapping(map, cap));
        // SAFETY: `push` hands over the record's payload area of 8 bytes.
        let fill = |p| unsafe { std::ptr::write_bytes(p, 0x55, 8) };
        assert!(w.push(ring::SEND, ring::LAST, 8, 8, 0, fill));
        let mut poller = ShmPoller { registered: false };
        assert!(!poller.try_enter_interrupt_mode(), "a record waits");
        assert!(!w.reader_asleep(), "the ring is left marked asleep");
        drop(a);
    });
}

/// A core about to sleep asks its peer for a wake-up when the peer takes its records only
/// if a completion waits on that: taking an unsignaled Send completes nothing, and an idle
/// peer's wake-up was one poke slower for it.
#[test]
fn only_a_signaled_completion_held_for_the_peer_asks_it_for_a_wake_up() {
    barewire_test_support::rt().block_on(async {
        let Accepted { qp, ours, pd, .. } = accepted().await;
        let reader = Reader::new(ours.ring);
        let mut mem = vec![0u8; 64];
        // SAFETY: `mem` outlives the region (both live to the end of this block).
        let mr = unsafe { pd.register(mem.as_mut_ptr(), 64, Access::LOCAL_WRITE) }.unwrap();
        let send = |signaled| SendWr {
            wr_id: 1,
            op: SendOp::Send {
                solicited: false,
                invalidate: None,
            },
            sges: Sge {
                addr: mem.as_ptr() as u64,
                len: 8,
                lkey: mr.lkey(),
            }
            .into(),
            signaled,
            fence: false,
        };
        let mut poller = ShmPoller { registered: false };
        qp.post_send(send(false)).unwrap();
        poller.try_enter_interrupt_mode();
        assert!(
            !reader.writer_waits(),
            "an unsignaled Send asked for a wake-up"
        );
        qp.post_send(send(true)).unwrap();
        poller.try_enter_interrupt_mode();
        assert!(reader.writer_waits(), "a signaled Send did not ask for one");
        drop((qp, mr));
    });
}

/// A core's shm state goes with the core: once its runtime has ended, the thread holds no
/// wake-up eventfd, reactor registration or queue pair of it (they stayed until the
/// thread's next runtime before).
#[test]
fn a_core_that_ends_lets_go_of_its_wake_up_eventfd() {
    std::thread::spawn(|| {
        let wake = barewire_test_support::rt().block_on(async {
            let a = accepted().await;
            // The core sleeps here, so its eventfd is armed with the reactor.
            barewire_engine::time::sleep(Duration::from_millis(20)).await;
            let wake = CORE.with(|c| {
                assert!(
                    c.irq.borrow().is_some(),
                    "the core slept without its eventfd"
                );
                assert_eq!(c.qps.borrow().len(), 1);
                Rc::downgrade(c.wake.borrow().as_ref().expect("made at setup"))
            });
            drop(a);
            wake
        });
        assert!(wake.upgrade().is_none(), "the eventfd outlived its core");
        CORE.with(|c| {
            assert!(
                c.irq.borrow().is_none(),
                "still registered with the ended core"
            );
            assert!(c.qps.borrow().is_empty());
            assert!(!c.registered.get());
        });
    })
    .join()
    .unwrap();
}

/// A peer that asks for one key a thousand times (on one connection), and then on ten
/// connections that end, leaves the owner's list of where the key went as long as the
/// queue pairs that still hold it: one entry per live queue pair.
#[test]
fn a_key_asked_for_over_and_over_is_noted_once_per_live_queue_pair() {
    barewire_test_support::rt().block_on(async {
        let (dev, l, port, pd) = listening();
        let mem = pd.allocate(4096, 64).unwrap().unwrap();
        // SAFETY: `mem` outlives the region (both live to the end of this block).
        let mr = unsafe { pd.register(mem.ptr(), 4096, Access::REMOTE_READ) }.unwrap();
        let stag = mr.rkey().0;
        let noted = || dev.grants.borrow().over.get(&stag).map_or(0, Vec::len);
        let ask = move |times: usize| async move {
            let deadline = Instant::now() + Duration::from_secs(5);
            let (heard, _ours) = set_up(port, deadline).await;
            let raw = heard.fd.as_raw_fd();
            let mut m = [M_ASK, 0, 0, 0, 0, 0, 0, 0];
            m[4..8].copy_from_slice(&stag.to_le_bytes());
            let mut buf = [0u8; 64];
            for _ in 0..times {
                sock::send(raw, &m, &[]).unwrap();
                let got = sock::recv_by(raw, &mut buf, deadline).await.unwrap();
                assert_eq!(buf[0], M_GRANT);
                assert_eq!(got.fds.len(), 1);
            }
        };
        let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
        let asker = spawn_local(ask(1000));
        let (held, _) = l.accept(&*pd, &s, &r, Vec::new()).await.unwrap();
        asker.await.unwrap();
        assert_eq!(noted(), 1, "a thousand asks on one queue pair");
        for _ in 0..10 {
            let asker = spawn_local(ask(1));
            let (qp, _) = l.accept(&*pd, &s, &r, Vec::new()).await.unwrap();
            asker.await.unwrap();
            drop(qp);
        }
        assert_eq!(noted(), 2, "the last connection's, and the one still held");
        drop((held, mr));
        mem.release();
    });
}

/// Sets up over the listener on `port` as barewire's peer would, then does `what` through
/// the ring it was handed (mapped writable, as every writer maps it) or its control socket,
/// and wakes the listener's core. Returns whether the listener hung up on it in time.
async fn hostile_peer(port: u16, what: Hostile) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    let (heard, _ours) = set_up(port, deadline).await;
    let cap = heard.peer.ring_cap as usize;
    let map = Mapping::new(&heard.ring, 0, (ring::HEADER + cap) as u64, 0, true).unwrap();
    let mut w = Writer::new(Ring::from_mapping(map, cap));
    let raw = heard.fd.as_raw_fd();
    match what {
        Hostile::UnknownRecord => {
            w.forge(0, 9, 0, 0, 0);
            w.publish(16);
        }
        Hostile::TailPastTheRing => w.publish(cap as u64 + 16),
        Hostile::SendPastWhatIsPublished => {
            w.forge(0, ring::SEND, ring::LAST, 4096, 0);
            w.publish(16);
        }
        Hostile::SendLongerThanTheReceive => {
            // SAFETY: `push` hands over the record's payload area of 300 bytes.
            let fill = |p| unsafe { std::ptr::write_bytes(p, 0x55, 300) };
            assert!(w.push(ring::SEND, ring::LAST, 300, 300, 0, fill));
        }
        Hostile::UnknownControl => sock::send(raw, &[99, 0, 0, 0, 0, 0, 0, 0], &[]).unwrap(),
        Hostile::UnaskedGrant => {
            let (r, _w) = pipe();
            let mut m = [0u8; 36];
            m[0] = M_GRANT;
            m[16..24].copy_from_slice(&(1u64 << 40).to_le_bytes());
            m[32] = G_READ | G_WRITE;
            sock::send(raw, &m, &[r.as_raw_fd()]).unwrap();
        }
        Hostile::TooManyDescriptors => {
            let e: Vec<OwnedFd> = (0..4).map(|_| sock::eventfd().unwrap()).collect();
            let mut fds: Vec<RawFd> = e.iter().map(|f| f.as_raw_fd()).collect();
            fds.push(fds[0]);
            sock::send_any(raw, &[M_ASK, 0, 0, 0, 1, 0, 0, 0], &fds).unwrap();
        }
        Hostile::GuessedKey => {
            sock::send(raw, &[M_ASK, 0, 0, 0, 0x78, 0x56, 0x34, 0x12], &[]).unwrap();
        }
    }
    sock::poke(heard.wake.as_raw_fd());
    let mut buf = [0u8; 64];
    loop {
        match sock::recv_by(raw, &mut buf, deadline).await {
            Ok(r) if r.len > 0 => continue,
            Ok(_) => return true,
            Err(e) => return e.kind() != std::io::ErrorKind::TimedOut,
        }
    }
}

/// A peer that breaks the protocol on a live connection (through the ring it writes or
/// its control socket) ends that connection: the listener's posted receive completes with
/// an error and the peer sees the hang-up, both within a bound; nothing around the receive
/// changes; and the listener goes on accepting the next peer.
#[test]
fn a_hostile_peer_ends_only_its_own_connection_and_reaches_nothing() {
    use Hostile::*;
    barewire_test_support::rt().block_on(async {
        let (dev, l, port, pd) = listening();
        // A receive of 256 bytes between two guards of 64, all registered.
        let mut mem = vec![0xeeu8; 384];
        let base = mem.as_mut_ptr();
        // SAFETY: `mem` outlives the region (both live to the end of this block).
        let mr = unsafe { pd.register(base, 384, Access::LOCAL_WRITE) }.unwrap();
        for what in [
            UnknownRecord,
            TailPastTheRing,
            SendPastWhatIsPublished,
            SendLongerThanTheReceive,
            UnknownControl,
            UnaskedGrant,
            TooManyDescriptors,
            GuessedKey,
        ] {
            let peer = spawn_local(hostile_peer(port, what));
            let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
            let recv = RecvWr {
                wr_id: 7,
                sges: Sge {
                    addr: base as u64 + 64,
                    len: 256,
                    lkey: mr.lkey(),
                }
                .into(),
            };
            let (qp, _) = l.accept(&*pd, &s, &r, vec![recv]).await.unwrap();
            let wc = barewire_engine::time::timeout(Duration::from_secs(3), r.queue().next())
                .await
                .unwrap_or_else(|_| panic!("{what:?}: the receive never completed"));
            assert_eq!(wc.wr_id, 7, "{what:?}");
            assert_ne!(wc.status, WcStatus::Success, "{what:?}");
            assert_eq!(qp.state(), QpState::Error, "{what:?}");
            assert!(peer.await.unwrap(), "{what:?}: the listener never hung up");
            assert!(mem.iter().all(|&b| b == 0xee), "{what:?}: memory changed");
        }
        // The guess is the one protection violation among them.
        assert_eq!(l.counters().violations, 1);
        drop(mr);
    });
}

/// A client that connects, waits, and only then says hello: an accept dropped while it
/// waits must not lose it (the next accept finishes it). Fails when accept waits for the
/// hello itself.
#[test]
fn an_accept_dropped_mid_setup_loses_no_connection() {
    barewire_test_support::rt().block_on(async {
        let dev = super::super::Device::new();
        let l = Listener::bind(
            ([127, 0, 0, 1], 0).into(),
            &crate::api::ConnectOptions::default(),
            false,
        )
        .unwrap();
        let port = l.port();
        let client = spawn_local(async move {
            let fd = sock::seqpacket().unwrap();
            sock::connect(&fd, &sock::name(([127, 0, 0, 1], port).into())).unwrap();
            barewire_engine::time::sleep(Duration::from_millis(20)).await;
            let ours = Ours::new().unwrap();
            ours.send(&fd, M_HELLO, b"").unwrap();
            hear(fd, M_ACCEPT, Instant::now() + Duration::from_secs(5))
                .await
                .map(|h| h.peer.kind)
        });
        let pd = dev.alloc_pd().unwrap();
        let (s, r) = (dev.create_cq(16).unwrap(), dev.create_cq(16).unwrap());
        let t0 = Instant::now();
        let (_qp, _) = loop {
            assert!(t0.elapsed() < Duration::from_secs(5), "never accepted");
            let accept = l.accept(&*pd, &s, &r, Vec::new());
            if let Ok(done) = barewire_engine::time::timeout(Duration::from_millis(2), accept).await
            {
                break done.unwrap();
            }
        };
        assert_eq!(client.await.unwrap().unwrap(), M_ACCEPT);
    });
}
