//! The queue pair's control socket: keys the peer asks for, the grants (a memfd by
//! SCM_RIGHTS) and refusals it gets, and revocations.

use super::*;

impl QpInner {
    /// Queues a revocation of `stag` for the peer, in order with what was posted before.
    pub(in crate::shm) fn revoke(self: &Rc<Self>, stag: u32) {
        if self.state.get() == QpState::Rts {
            self.tx.borrow_mut().queue.push_back(Work::Revoke(stag));
            self.progress();
        }
    }

    /// Handles one control message from the peer.
    fn control(self: &Rc<Self>, msg: &[u8], mut fds: Vec<OwnedFd>) -> Result<(), String> {
        let kind = *msg.first().ok_or("an empty control message")?;
        let stag = msg
            .get(4..8)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .ok_or("a short control message")?;
        match kind {
            M_ASK => self.answer(stag),
            M_GRANT => {
                if msg.len() < 36 || fds.len() != 1 {
                    return Err("a malformed grant".into());
                }
                let base = u64::from_le_bytes(msg[8..16].try_into().unwrap());
                let len = u64::from_le_bytes(msg[16..24].try_into().unwrap());
                let offset = u64::from_le_bytes(msg[24..32].try_into().unwrap());
                let rights = msg[32];
                if !matches!(self.grants.read().get(&stag), Some(Grant::Asked)) {
                    return Err("a grant nobody asked for".into());
                }
                self.asked.set(self.asked.get() - 1);
                let writable = rights & (G_WRITE | G_ATOMIC) != 0;
                let fd = fds.pop().expect("one");
                let g = match Mapping::new(&fd, offset, len, base, writable) {
                    Ok(mut m) => {
                        m.readable = rights & G_READ != 0;
                        m.writable = rights & G_WRITE != 0;
                        m.atomic = rights & G_ATOMIC != 0;
                        Grant::Mapped(Rc::new(m))
                    }
                    Err(e) => {
                        eprintln!("barewire shm: a grant could not be mapped: {e}");
                        Grant::Refused
                    }
                };
                self.grants.change().insert(stag, g);
                self.progress();
                Ok(())
            }
            M_REFUSE => {
                if !matches!(self.grants.read().get(&stag), Some(Grant::Asked)) {
                    return Err("a refusal nobody asked for".into());
                }
                self.asked.set(self.asked.get() - 1);
                self.grants.change().insert(stag, Grant::Refused);
                self.progress();
                Ok(())
            }
            M_BROKE => {
                // The Send the peer could not place is the first one it has not taken: it
                // fails with the responder's error, as verbs reports one.
                let status = if msg[1] == WcStatus::LocLenErr as u8 {
                    WcStatus::RemInvReqErr
                } else {
                    WcStatus::RemOpErr
                };
                self.settle_front(status);
                // (This runs in the control task: it ends at the hang-up that follows.)
                self.task.borrow_mut().take();
                self.fail(WcStatus::WrFlushErr);
                Ok(())
            }
            _ => Err(format!("unknown control message {kind}")),
        }
    }

    /// Answers a peer's request for key `stag`: the memory, or a refusal.
    fn answer(self: &Rc<Self>, stag: u32) -> Result<(), String> {
        let grant = self
            .pd
            .dev
            .tables
            .lookup(Stag(stag), self.pd.id(), self.num)
            .ok()
            .and_then(|(addr, len, access)| {
                let Some((file, offset)) = crate::shm::mem::find(addr as usize, len as usize)
                else {
                    // Possible only under `auto`, which lets raw memory be registered for
                    // peers of the software provider.
                    eprintln!(
                        "barewire shm: a peer on this host asked for a region of {len} bytes \
                         that is not inside a buffer barewire allocated, so it cannot be mapped; \
                         refused (allocate remotely accessible memory with Buffer::new)"
                    );
                    return None;
                };
                let mut rights = 0;
                if access.contains(Access::REMOTE_READ) {
                    rights |= G_READ;
                }
                if access.contains(Access::REMOTE_WRITE) {
                    rights |= G_WRITE;
                }
                if access.contains(Access::REMOTE_ATOMIC) {
                    rights |= G_ATOMIC;
                }
                let fd = file.descriptor(rights & (G_WRITE | G_ATOMIC) != 0).ok()?;
                Some((addr, len, offset, rights, fd, file))
            });
        let refused = grant.is_none();
        let sent = match grant {
            Some((addr, len, offset, rights, fd, _file)) => {
                let mut m = [0u8; 36];
                m[0] = M_GRANT;
                m[4..8].copy_from_slice(&stag.to_le_bytes());
                m[8..16].copy_from_slice(&addr.to_le_bytes());
                m[16..24].copy_from_slice(&len.to_le_bytes());
                m[24..32].copy_from_slice(&(offset as u64).to_le_bytes());
                m[32] = rights;
                let r = sock::send(self.sock.as_raw_fd(), &m, &[fd]);
                if r.is_ok() {
                    self.dev().granted(stag, self);
                }
                r
            }
            None => {
                let mut m = [0u8; 8];
                m[0] = M_REFUSE;
                m[4..8].copy_from_slice(&stag.to_le_bytes());
                sock::send(self.sock.as_raw_fd(), &m, &[])
            }
        };
        match sent {
            // The peer hung up meanwhile (it is shutting down): not this side's error, and the
            // next receive on the socket sees the hang-up and fails the queue pair as gone.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => Ok(()),
            Err(e) => Err(format!("answering a grant request: {e}")),
            // A key this peer may not use is a protection violation, as an access with one is on
            // verbs and soft: the refusal tells the peer (whose request fails with a remote
            // access error, and whose queue pair then ends anyway), and the connection ends
            // here too, so a peer cannot guess keys on one connection.
            Ok(()) if refused => {
                if let Some(a) = self.admission.take() {
                    if let Some(i) = a.intake.upgrade() {
                        i.count(|n| n.violations += 1);
                        i.strikes.strike(*a.open.source(), Instant::now());
                    }
                }
                Err(format!(
                    "the peer asked for key {stag:#010x}, which it may not use (a protection \
                     violation)"
                ))
            }
            Ok(()) => Ok(()),
        }
    }
}

/// Reads the queue pair's control socket until the peer hangs up (or the queue pair ends).
pub(super) async fn serve_control(qp: Weak<QpInner>, fd: RawFd) {
    let mut buf = [0u8; 256];
    loop {
        let Some(q) = qp.upgrade() else { return };
        match sock::recv(fd, &mut buf) {
            Ok(Some(r)) if r.len > 0 => {
                if let Err(why) = q.control(&buf[..r.len], r.fds) {
                    eprintln!("barewire shm: queue pair {}: {why}; disconnecting", q.num);
                    q.task.borrow_mut().take();
                    q.fail(WcStatus::RetryExcErr);
                    return;
                }
            }
            // A control message (a grant asked for, a hang-up) can wait some microseconds on a
            // busy core: a relaxed wait spares an epoll core a system call per pass.
            Ok(None) => {
                drop(q);
                let _ = poll_readable_relaxed(fd).await;
            }
            // The peer hung up or the socket broke: the peer is gone. (A message too long or
            // with too many descriptors breaks the protocol, and ends the connection the same.)
            other => {
                if let Err(e) = other {
                    if e.kind() == std::io::ErrorKind::InvalidData {
                        eprintln!("barewire shm: queue pair {}: {e}; disconnecting", q.num);
                    }
                }
                q.task.borrow_mut().take();
                q.deliver();
                q.fail(WcStatus::RetryExcErr);
                return;
            }
        }
    }
}
