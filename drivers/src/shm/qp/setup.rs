//! Connection setup: the hello each side sends (its ring and its core's wake-up eventfd),
//! the checks on the peer's, and reaching a listener's abstract name.

use super::*;

/// What one side says at setup.
pub(super) struct Hello {
    pub(super) kind: u8,
    qp_num: u32,
    pub(super) ring_cap: u32,
    netns: u64,
    boot: [u8; 36],
    private: Vec<u8>,
}

impl Hello {
    fn ours(kind: u8, qp_num: u32, private: &[u8]) -> Hello {
        let (boot, netns) = crate::shm::identity();
        Hello {
            kind,
            qp_num,
            ring_cap: RING as u32,
            netns,
            boot,
            private: private.to_vec(),
        }
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; HELLO];
        b[0] = self.kind;
        b[2..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&self.qp_num.to_le_bytes());
        b[12..16].copy_from_slice(&self.ring_cap.to_le_bytes());
        b[16..24].copy_from_slice(&self.netns.to_le_bytes());
        b[24..60].copy_from_slice(&self.boot);
        b.extend_from_slice(&self.private);
        b
    }

    fn decode(b: &[u8]) -> Result<Hello, String> {
        if b.len() < HELLO || b[2..8] != MAGIC {
            return Err("the peer does not speak barewire's shm setup".into());
        }
        if b.len() - HELLO > MAX_PRIVATE {
            return Err("the peer's private data is too long".into());
        }
        Ok(Hello {
            kind: b[0],
            qp_num: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            ring_cap: u32::from_le_bytes(b[12..16].try_into().unwrap()),
            netns: u64::from_le_bytes(b[16..24].try_into().unwrap()),
            boot: b[24..60].try_into().unwrap(),
            private: b[HELLO..].to_vec(),
        })
    }

    /// Checks that the peer shares this host and namespace.
    fn check(&self) -> Result<(), String> {
        let (boot, netns) = crate::shm::identity();
        if self.boot != boot || self.netns != netns {
            return Err("the peer is not on this host and network namespace".into());
        }
        let cap = self.ring_cap as usize;
        if !cap.is_power_of_two() || !(ring::MIN_CAP..=ring::MAX_CAP).contains(&cap) {
            return Err(format!("the peer offers a ring of {cap} bytes"));
        }
        Ok(())
    }
}

/// A peer's setup message, heard and checked: the socket, what it said, its ring and its
/// core's wake-up descriptor.
pub(super) struct Heard {
    pub(super) fd: OwnedFd,
    pub(super) peer: Hello,
    pub(super) ring: OwnedFd,
    pub(super) wake: OwnedFd,
}

/// Waits (until `deadline`) for the peer's setup message of kind `want` on a connected socket,
/// and checks it and the peer (same user, host and namespace; a sane ring). A listener answers
/// a peer it refuses with a Reject that says why.
pub(super) async fn hear(fd: OwnedFd, want: u8, deadline: Instant) -> Result<Heard, DriverError> {
    // Only processes of this user: see the module docs.
    let me = sock::uid();
    match sock::peer_cred(&fd).map(|c| c.uid) {
        Ok(uid) if uid == me => {}
        Ok(uid) => {
            return Err(connect_error(format!(
                "the peer runs as user {uid}, not {me}; shm connects only processes of one user"
            )))
        }
        Err(e) => return Err(connect_error(format!("SO_PEERCRED: {e}"))),
    }
    let raw = fd.as_raw_fd();
    let mut buf = vec![0u8; HELLO + MAX_PRIVATE + 1];
    // A listener closes a connection over its limits at once (its hello unread: a reset).
    let closed = || {
        if want == M_ACCEPT {
            closed_by_listener()
        } else {
            connect_error("the peer hung up during setup")
        }
    };
    let got = match sock::recv_by(raw, &mut buf, deadline).await {
        Ok(got) if got.len == 0 => return Err(closed()),
        Ok(got) => got,
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => return Err(closed()),
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut && want == M_ACCEPT => {
            return Err(connect_error(
                "no answer from the listener within the setup timeout \
                 (ConnectOptions::timeout): is it stopped, overloaded, or slow to accept?",
            ))
        }
        Err(e) => return Err(connect_error(format!("waiting for the peer's setup: {e}"))),
    };
    if buf[0] == M_REJECT {
        return Err(DriverError::Rejected {
            private_data: buf[1..got.len].to_vec(),
        });
    }
    let peer = Hello::decode(&buf[..got.len]).map_err(connect_error)?;
    let checked = if peer.kind != want {
        Err("an unexpected setup message".to_string())
    } else if got.fds.len() != 2 {
        Err("the peer sent no ring".to_string())
    } else {
        peer.check()
    };
    if let Err(why) = checked {
        if want == M_HELLO {
            let mut r = vec![M_REJECT];
            r.extend_from_slice(why.as_bytes());
            let _ = sock::send(raw, &r, &[]);
        }
        return Err(connect_error(why));
    }
    let mut fds = got.fds;
    let wake = fds.pop().expect("two");
    let ring = fds.pop().expect("two");
    sock::check_eventfd(&wake).map_err(|e| connect_error(format!("setup: {e}")))?;
    Ok(Heard {
        fd,
        peer,
        ring,
        wake,
    })
}

/// What a connect says when the listener closes the connection before accepting it.
fn closed_by_listener() -> DriverError {
    connect_error(
        "the listener closed the connection before accepting it; a barewire listener does so \
         when it closes, to a process over its connection limits or banned for protection \
         violations, and to a setup that newer ones pushed out (see its counters)",
    )
}

/// This side's half of the setup: its ring, queue pair number and core wake-up descriptor.
pub(super) struct Ours {
    pub(super) ring: Ring,
    num: u32,
    wake: Rc<OwnedFd>,
}

impl Ours {
    pub(super) fn new() -> Result<Ours, DriverError> {
        Ok(Ours {
            wake: core_wake()?,
            ring: Ring::create(RING)?,
            num: next_qp_num(),
        })
    }

    /// Sends this side's setup message of `kind` with `private` data, the ring and the wake-up
    /// descriptor.
    pub(super) fn send(&self, fd: &OwnedFd, kind: u8, private: &[u8]) -> Result<(), DriverError> {
        let ring_fd = self
            .ring
            .file()
            .expect("our own")
            .descriptor(true)
            .map_err(|e| connect_error(e.to_string()))?;
        let msg = Hello::ours(kind, self.num, private).encode();
        sock::send(fd.as_raw_fd(), &msg, &[ring_fd, self.wake.as_raw_fd()]).map_err(|e| {
            if kind == M_HELLO && matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) {
                closed_by_listener()
            } else {
                connect_error(format!("sending setup: {e}"))
            }
        })
    }
}

/// Builds the queue pair from both halves of the setup (`admission`: an accepted one's place
/// among its listener's connections). No waiting: a listener's accept stays cancel-safe.
pub(super) fn finish(
    heard: Heard,
    ours: Ours,
    admission: Option<Admission>,
    pd: &Pd,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    timeout: Duration,
) -> Result<(QueuePair, Vec<u8>), DriverError> {
    let Heard {
        fd,
        peer,
        ring: peer_ring,
        wake: peer_wake,
    } = heard;
    let Ours { ring, num, .. } = ours;
    let raw = fd.as_raw_fd();
    let cap = peer.ring_cap as usize;
    let map = Mapping::new(&peer_ring, 0, (ring::HEADER + cap) as u64, 0, true)
        .map_err(|e| connect_error(format!("mapping the peer's ring: {e}")))?;
    let inner = Rc::new(QpInner {
        num,
        pd: Pd {
            pd: pd.pd.clone_handle(),
            dev: pd.dev.clone(),
        },
        scq: scq.clone(),
        rcq: rcq.clone(),
        sock: fd,
        peer_wake,
        state: Cell::new(QpState::Rts),
        tx: RefCell::new(Tx {
            w: Writer::new(Ring::from_mapping(map, cap)),
            queue: VecDeque::new(),
            held: VecDeque::new(),
            copying: false,
        }),
        holding: Cell::new(false),
        rx: RefCell::new(Rx {
            r: Reader::new(ring),
            recvs: VecDeque::new(),
            placed: 0,
            error: None,
        }),
        grants: PeerKeys::new(),
        invalidated: RefCell::new(Vec::new()),
        task: RefCell::new(None),
        timeout,
        asked: Cell::new(0),
        popped: Cell::new(0),
        stall: Cell::new(None),
        admission: Cell::new(admission),
    });
    let task = spawn_local(serve_control(Rc::downgrade(&inner), raw));
    *inner.task.borrow_mut() = Some(task);
    CORE.with(|c| c.qps.borrow_mut().push(Rc::downgrade(&inner)));
    Ok((QueuePair::new(Qp(inner)), peer.private))
}

/// What trying `addr` over shm found.
pub(crate) enum Reach {
    /// A socket connected to the shm listener of `addr`'s port.
    Listener(OwnedFd),
    /// No shm listener can be there, and why.
    NotHere(String),
}

/// Looks for the shm listener of `addr`'s port on this host (in this network namespace).
pub(crate) async fn reach(addr: SocketAddr, deadline: Instant) -> Result<Reach, DriverError> {
    if !is_local(addr) {
        return Ok(Reach::NotHere(format!(
            "{} is not an address of this host",
            addr.ip()
        )));
    }
    // A listener on this very address, else one on every address of the port.
    let wildcard = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
    // Any local user can bind an abstract name: one held by another user's process is not
    // this user's listener (and setup with it would be refused), so it is passed over, and
    // `auto` goes on to the software provider rather than fail.
    let me = sock::uid();
    let mut foreign = None;
    for name in [sock::name(addr), sock::name(wildcard)] {
        let fd = sock::seqpacket().map_err(|e| connect_error(format!("socket: {e}")))?;
        loop {
            match sock::connect(&fd, &name) {
                Ok(()) => match sock::peer_cred(&fd) {
                    Ok(c) if c.uid != me => {
                        foreign = Some(format!(
                            "the shm name of {name} is held by a process of user {}, not {me}",
                            c.uid
                        ));
                        break;
                    }
                    _ => return Ok(Reach::Listener(fd)),
                },
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline =>
                {
                    barewire_engine::time::sleep(Duration::from_millis(1)).await;
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return Err(connect_error(format!(
                        "the shm listener of {name} had no room for another connection \
                         (its backlog was full) for the whole setup timeout \
                         (ConnectOptions::timeout): is it stopped, overloaded, or slow to accept?"
                    )))
                }
                Err(e) => return Err(connect_error(format!("connecting to {name}: {e}"))),
            }
        }
    }
    Ok(Reach::NotHere(foreign.unwrap_or_else(|| {
        format!("no shm listener on {addr} (connection refused)")
    })))
}

/// Sets up a queue pair over a socket [`reach`] connected.
pub(crate) async fn connect(
    fd: OwnedFd,
    pd: &Pd,
    scq: &CompletionQueue,
    rcq: &CompletionQueue,
    private: &[u8],
    deadline: Instant,
    timeout: Duration,
) -> Result<(QueuePair, Vec<u8>), DriverError> {
    if private.len() > MAX_PRIVATE {
        return Err(connect_error(format!(
            "{} bytes of private data (at most {MAX_PRIVATE})",
            private.len()
        )));
    }
    let ours = Ours::new()?;
    ours.send(&fd, M_HELLO, private)?;
    let heard = hear(fd, M_ACCEPT, deadline).await?;
    finish(heard, ours, None, pd, scq, rcq, timeout)
}

/// True if `addr`'s IP is one of this host's (in this network namespace).
fn is_local(addr: SocketAddr) -> bool {
    let ip = addr.ip().to_canonical();
    ip.is_loopback() || ip.is_unspecified() || std::net::UdpSocket::bind((ip, 0)).is_ok()
}
