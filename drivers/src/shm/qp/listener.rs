//! The listener: a TCP port's abstract name, each peer's setup heard by a task of its own,
//! under the listener's limits.

use super::*;

/// Ports [`Listener::name_a_port`] tries for a listener on port 0.
const NAME_TRIES: usize = 8;

/// Accepts shm queue pairs on a TCP port's abstract name. The TCP port itself is held, so the
/// number is this listener's in the namespace, and `port 0` picks a free one.
///
/// Any local process can connect to an abstract name, so a listener defends itself as the
/// software provider's does, under the same [`ListenerLimits`](crate::ListenerLimits), with
/// the peer's process (`SO_PEERCRED`) as its source. Each connection is heard by a task of its
/// own, with the setup's deadline. Setups in progress are capped in all and per process; a new
/// connection over a cap evicts the oldest it competes with, so a process that floods the name
/// pushes out only its own stale connections and holds a bounded number of this process's
/// descriptors. A peer whose setup fails (malformed, another user, another host, gone before
/// the answer, a ring that cannot be mapped) is counted and dropped: `accept` goes on to the
/// next, and fails only for this side's own errors. As many complete setups as may be in
/// progress wait for `accept`; beyond that, new ones are dropped. Accepted connections open at
/// once are capped in all and per process; a connection beyond them is closed at once (one
/// that failed no longer counts, even while the application still holds its queue pair). A
/// peer that asks for a key it may not use ends its connection, and a process whose peers do
/// that past the violation budget is refused for the ban.
pub(crate) struct Listener {
    /// The shm name's socket; `None` under `auto` when another user's process holds the name
    /// (see [`Listener::bind`]): every peer then comes through the software provider.
    fd: Option<OwnedFd>,
    /// Peers heard by their setup tasks, waiting for an accept to finish them.
    heard: RefCell<Option<barewire_engine::sync::mpsc::Receiver<(libc::pid_t, Heard)>>>,
    heard_tx: barewire_engine::sync::mpsc::Sender<(libc::pid_t, Heard)>,
    /// Setups in progress, and what was refused.
    intake: Rc<Intake>,
    port_of: Port,
    port: u16,
    private: Vec<u8>,
    timeout: Duration,
}

/// A listener's setups in progress (by the peer's process) and its counts, shared with the
/// tasks that hear peers.
pub(super) struct Intake {
    setups: barewire_engine::net::Handshakes<libc::pid_t>,
    open: barewire_engine::net::Connections<libc::pid_t>,
    /// Processes whose peers asked for keys they may not use, and their bans.
    pub(super) strikes: barewire_engine::net::Strikes<libc::pid_t>,
    /// Complete setups that may wait for `accept`.
    max_waiting: usize,
    counters: Cell<barewire_rdma_types::ListenerCounters>,
}

impl Intake {
    pub(super) fn count(&self, f: impl FnOnce(&mut barewire_rdma_types::ListenerCounters)) {
        let mut c = self.counters.get();
        f(&mut c);
        self.counters.set(c);
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Every connection still in its setup is dropped with the listener.
        self.intake.setups.cancel_all();
    }
}

impl crate::backend::ListenerOps for Listener {
    fn port(&self) -> u16 {
        self.port
    }

    fn counters(&self) -> barewire_rdma_types::ListenerCounters {
        let shm = self.intake.counters.get();
        match &self.port_of {
            Port::Reserved(_) => shm,
            Port::Soft(l) => shm + l.counters(),
        }
    }

    fn accept<'a>(
        &'a self,
        pd: &'a dyn crate::backend::PdOps,
        scq: &'a crate::api::CompletionQueue,
        rcq: &'a crate::api::CompletionQueue,
        recvs: Vec<RecvWr>,
    ) -> crate::backend::LocalBoxFuture<'a, crate::backend::Connected> {
        Box::pin(async move {
            let pd = crate::backend::ours::<Pd>(pd.as_any())?;
            if scq.device().is_some() || rcq.device().is_some() {
                return Err(crate::backend::mixed());
            }
            // Peers are heard by tasks of their own (`heard`); what they heard is finished here
            // without waiting, so a dropped accept loses no connection.
            let Some(taken) = self.heard.borrow_mut().take() else {
                return Err(connect_error("accept from two tasks at once"));
            };
            // Puts the queue back however this future ends.
            struct Back<'a, T>(&'a RefCell<Option<T>>, Option<T>);
            impl<T> Drop for Back<'_, T> {
                fn drop(&mut self) {
                    *self.0.borrow_mut() = self.1.take();
                }
            }
            let mut back = Back(&self.heard, Some(taken));
            let queue = back.1.as_mut().expect("held until dropped");
            let (qp, data) = loop {
                let heard = loop {
                    if let Some(h) = queue.try_recv() {
                        break h;
                    }
                    let backoff = match self.fd.as_ref().map(sock::accept) {
                        Some(Ok(Some(c))) => {
                            self.take_in(c);
                            continue;
                        }
                        Some(Ok(None)) | None => false,
                        // Out of descriptors or memory for a moment: wait rather than spin (the
                        // connection stays in the backlog) and rather than fail the accept.
                        Some(Err(e)) if barewire_engine::net::accept_error_is_transient(&e) => true,
                        Some(Err(e)) => return Err(connect_error(format!("accept: {e}"))),
                    };
                    // Whichever comes first; each is cancel-safe (a heard peer waits in the
                    // queue, a new one in the backlog, and the provider's accept keeps what it
                    // accepted).
                    let fd = self.fd.as_ref().map(|f| f.as_raw_fd());
                    let more = async move {
                        match fd {
                            None => std::future::pending().await,
                            Some(_) if backoff => {
                                barewire_engine::time::sleep(Duration::from_millis(10)).await
                            }
                            Some(fd) => drop(poll_readable_relaxed(fd).await),
                        }
                    };
                    let shm = crate::backend::first(queue.recv(), more);
                    let shm = match &self.port_of {
                        Port::Reserved(_) => shm.await,
                        Port::Soft(l) => {
                            let soft = crate::soft::accept(l, &pd.pd, scq, rcq, &recvs);
                            match crate::backend::first(soft, shm).await {
                                Ok(r) => return r,
                                Err(shm) => shm,
                            }
                        }
                    };
                    if let Ok(Some(h)) = shm {
                        break h;
                    }
                };
                // A peer that hung up meanwhile, or whose ring cannot be mapped, is its own
                // failure: counted, and the next peer is taken.
                let ours = Ours::new()?;
                let (pid, heard) = heard;
                let admitted = Some(Admission {
                    open: self.intake.open.admit(pid),
                    intake: Rc::downgrade(&self.intake),
                });
                let (scq, rcq, timeout) = (scq.queue(), rcq.queue(), self.timeout);
                let answered = ours
                    .send(&heard.fd, M_ACCEPT, &self.private)
                    .and_then(|()| finish(heard, ours, admitted, pd, scq, rcq, timeout));
                match answered {
                    Ok(r) => break r,
                    Err(_) => self.intake.count(|n| n.bad_requests += 1),
                }
            };
            drop(back);
            for wr in recvs {
                qp.post_recv(wr)?;
            }
            Ok((qp, data))
        })
    }
}

/// What holds the listener's TCP port.
pub(super) enum Port {
    /// A plain TCP listener, never accepted on: the number is this listener's.
    Reserved(#[allow(dead_code)] std::net::TcpListener),
    /// The software provider's listener (`auto`): peers that do not reach the shm name (other
    /// hosts, other namespaces, explicit `soft`) connect there.
    Soft(Box<barewire_soft_rdma::provider::Listener>),
}

impl Listener {
    /// Listens on `addr`: on the shm name of its port, and (`auto`) through the software
    /// provider on the port itself.
    ///
    /// Any local user can bind an abstract name. A name that another user's process holds is
    /// not this listener's to take: under `auto` the listener then serves every peer through
    /// the software provider (same-host peers pass such a name over too, see [`reach`]), and
    /// says so; an explicit shm listener fails, naming the user.
    pub(crate) fn bind(
        addr: SocketAddr,
        opts: &crate::api::ConnectOptions,
        auto: bool,
    ) -> Result<Listener, DriverError> {
        let (private, timeout, limits) = (&opts.private_data, opts.timeout, opts.limits);
        if private.len() > MAX_PRIVATE {
            return Err(connect_error(format!(
                "{} bytes of private data (at most {MAX_PRIVATE})",
                private.len()
            )));
        }
        let reserve = |addr: SocketAddr| -> Result<(Port, SocketAddr), DriverError> {
            if auto {
                let l =
                    barewire_soft_rdma::provider::Listener::bind(addr, crate::soft::options(opts))
                        .map_err(|e| DriverError::Connect(e.to_string()))?;
                let bound = l.local_addr().map_err(|e| connect_error(e.to_string()))?;
                Ok((Port::Soft(Box::new(l)), bound))
            } else {
                let tcp = std::net::TcpListener::bind(addr)
                    .map_err(|e| connect_error(format!("reserving its TCP port: {e}")))?;
                let bound = tcp.local_addr().map_err(|e| connect_error(e.to_string()))?;
                Ok((Port::Reserved(tcp), bound))
            }
        };
        let (port_of, bound, fd) = Self::name_a_port(addr, reserve)?;
        let port = bound.port();
        let (heard_tx, heard) = barewire_engine::sync::mpsc::unbounded();
        Ok(Listener {
            fd,
            heard: RefCell::new(Some(heard)),
            heard_tx,
            intake: Rc::new(Intake {
                setups: barewire_engine::net::Handshakes::new(
                    limits.max_setups,
                    limits.max_setups_per_source,
                ),
                open: barewire_engine::net::Connections::new(
                    limits.max_connections,
                    limits.max_connections_per_source,
                ),
                strikes: barewire_engine::net::Strikes::new(
                    limits.violation_budget,
                    limits.violation_window,
                    limits.ban,
                ),
                max_waiting: limits.max_setups.max(1),
                counters: Cell::new(Default::default()),
            }),
            port_of,
            port,
            private: private.to_vec(),
            timeout,
        })
    }

    /// Reserves a TCP port for `addr` (`reserve`) and binds the shm name of the port it got.
    ///
    /// A port the kernel picked (`addr`'s port is 0) whose name is taken is set aside and
    /// another is picked, up to [`NAME_TRIES`] times: a listener of this user that is closing
    /// gives its port back before its name (a process's descriptors close in order, and a name
    /// an io_uring request still refers to lives until the request is cancelled), so the next
    /// port 0 can be that one; and any local user can hold any name. A port the caller named is
    /// not changed. Where the name stays taken, another user's name sends an `auto` listener
    /// (`Port::Soft`) to serve local peers through the software provider; otherwise the
    /// holder is an error.
    pub(super) fn name_a_port(
        addr: SocketAddr,
        mut reserve: impl FnMut(SocketAddr) -> Result<(Port, SocketAddr), DriverError>,
    ) -> Result<(Port, SocketAddr, Option<OwnedFd>), DriverError> {
        // Ports given up on stay reserved until the end, so that the kernel picks others.
        let mut given_up = Vec::new();
        loop {
            let (port_of, bound) = reserve(addr)?;
            let name = sock::name(bound);
            let fd = sock::seqpacket().map_err(|e| connect_error(format!("socket: {e}")))?;
            let Err(e) = sock::listen(&fd, &name) else {
                return Ok((port_of, bound, Some(fd)));
            };
            if addr.port() == 0 && given_up.len() + 1 < NAME_TRIES {
                given_up.push(port_of);
                continue;
            }
            let me = sock::uid();
            match sock::holder_uid(&name) {
                Some(uid) if uid != me && matches!(port_of, Port::Soft(_)) => {
                    eprintln!(
                        "barewire shm: the shm name {name} is held by a process of user {uid}; \
                         this listener serves peers on this host through the software provider"
                    );
                    return Ok((port_of, bound, None));
                }
                Some(uid) if uid != me => {
                    return Err(connect_error(format!(
                        "listening on the shm name {name}: a process of user {uid} holds it"
                    )))
                }
                _ => {
                    return Err(connect_error(format!(
                        "listening on the shm name {name}: {e} (another shm listener has it)"
                    )))
                }
            }
        }
    }

    /// Starts hearing a new local connection, in a task of its own, under the listener's caps.
    fn take_in(&self, c: OwnedFd) {
        let intake = &self.intake;
        intake.count(|n| n.connections += 1);
        // The peer's process is its source (one whose credentials cannot be read counts as 0).
        let pid = sock::peer_cred(&c).map_or(0, |cred| cred.pid);
        if intake.strikes.banned(&pid, Instant::now()) {
            intake.count(|n| n.banned += 1);
            return; // closed at once
        }
        if intake.open.full(&pid) {
            intake.count(|n| n.over_limit += 1);
            return;
        }
        let evicted = intake.setups.make_room(&pid);
        intake.count(|n| n.evicted += evicted as u64);
        let id = intake.setups.next_id();
        let (tx, i) = (self.heard_tx.clone(), intake.clone());
        let deadline = Instant::now() + self.timeout;
        let task = spawn_local(async move {
            match hear(c, M_HELLO, deadline).await {
                Ok(h) if tx.len() < i.max_waiting => {
                    let _ = tx.try_send((pid, h));
                }
                Ok(_) => i.count(|n| n.overflowed += 1),
                Err(_) if Instant::now() >= deadline => i.count(|n| n.timed_out += 1),
                Err(_) => i.count(|n| n.bad_requests += 1),
            }
            i.setups.done(id);
        });
        intake.setups.push(id, pid, task);
    }
}
