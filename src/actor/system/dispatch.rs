//! Frames out (queued for a peer, packed by its pump into channel messages, bounded by the
//! backlog) and frames in (each `Wire` handled), moves' forwarding, heartbeats and node-down.

use super::*;

/// The pump: this node's frames to `node`, in order, as few channel messages as fit.
pub(super) async fn pump(sys: Weak<Sys>, node: usize, tx: Sender<Vec<u8>, Bytes>, max: usize) {
    let mut spare = Vec::new();
    loop {
        let batch = std::future::poll_fn(|cx| {
            let Some(sys) = sys.upgrade() else {
                return Poll::Ready(None);
            };
            let Some(Some(p)) = sys.peers.get(node) else {
                return Poll::Ready(None);
            };
            let mut out = p.out.borrow_mut();
            if out.is_empty() {
                *p.pump.borrow_mut() = Some(cx.waker().clone());
                return Poll::Pending;
            }
            spare.clear();
            Poll::Ready(Some(std::mem::replace(
                &mut *out,
                std::mem::take(&mut spare),
            )))
        })
        .await;
        let Some(batch) = batch else { break };
        // Split at frame boundaries into channel messages of at most `max` bytes.
        let mut start = 0;
        while start < batch.len() {
            let mut end = start;
            while end < batch.len() {
                let len = u32::from_le_bytes(batch[end..end + 4].try_into().unwrap()) as usize;
                if end > start && end + 4 + len - start > max {
                    break;
                }
                end += 4 + len;
            }
            let sent = if start == 0 && end == batch.len() {
                tx.send(&batch).await
            } else {
                tx.send(&batch[start..end].to_vec()).await
            };
            if sent.is_err() {
                return;
            }
            start = end;
        }
        spare = batch;
    }
}

impl Sys {
    /// Queues a frame for `node`; `write` appends its payload. A `bounded` frame is refused
    /// while `max_backlog` bytes or more wait for that node.
    fn frame(
        &self,
        node: usize,
        bounded: bool,
        write: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let Some(Some(p)) = self.peers.get(node) else {
            return Err(Error::Invalid(format!("no node {node}")));
        };
        if p.down.get() {
            return Err(Error::PeerGone(format!("node {node} is down")));
        }
        let mut out = p.out.borrow_mut();
        if bounded && out.len() >= self.max_backlog {
            return Err(Error::Overloaded(format!(
                "{} bytes wait for node {node}, which is not taking them \
                 (SystemOptions::max_backlog)",
                out.len()
            )));
        }
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        let r = write(&mut out);
        let len = out.len() - at - 4;
        if r.is_err() || len > self.max_frame {
            out.truncate(at);
            r?;
            return Err(Error::TooLarge {
                len,
                max: self.max_frame,
            });
        }
        out[at..at + 4].copy_from_slice(&(len as u32).to_le_bytes());
        drop(out);
        if let Some(w) = p.pump.borrow_mut().take() {
            w.wake();
        }
        Ok(())
    }

    /// Queues `w` for `node`. Heartbeats, replies and requests are bounded (dropped, or for
    /// requests refused, while the node's backlog is full: it is not reading them); what this
    /// node's own protocol needs is not.
    pub(super) fn send(&self, node: usize, w: Wire) {
        let _ = self.send_wire(node, w);
    }

    fn send_wire(&self, node: usize, w: Wire) -> Result<()> {
        // (A `Tell` sent this way is one already accepted, passed on to where its actor
        // moved, and an `Adopt` is a migration under way: neither may be dropped.)
        let bounded = matches!(
            w,
            Wire::Heartbeat
                | Wire::Reply { .. }
                | Wire::Ask { .. }
                | Wire::Lookup { .. }
                | Wire::Spawn { .. }
        );
        self.frame(node, bounded, |out| {
            serde_bare::to_writer(out, &w).map_err(|e| Error::Invalid(format!("encoding: {e}")))
        })
    }

    /// A tell, written straight into the peer's batch in the layout BARE gives
    /// `Wire::Tell { to, msg }` (the message encoded once, into a reused scratch buffer).
    pub(super) fn tell_frame<M: Serialize>(&self, node: usize, to: u64, msg: &M) -> Result<()> {
        thread_local!(static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) });
        SCRATCH.with(|scratch| {
            let mut m = scratch.borrow_mut();
            m.clear();
            serde_bare::to_writer(&mut *m, msg)
                .map_err(|e| Error::Invalid(format!("encoding: {e}")))?;
            self.frame(node, true, |out| {
                out.push(TELL);
                out.extend_from_slice(&to.to_le_bytes());
                put_uint(out, m.len() as u64);
                out.extend_from_slice(&m);
                Ok(())
            })
        })
    }

    /// Every frame of a batch from `from`, in order.
    pub(super) fn dispatch_batch(self: &Rc<Self>, from: usize, mut batch: &[u8]) {
        if let Some(Some(p)) = self.peers.get(from) {
            p.last_heard.set(Instant::now());
        }
        // Runs of tells to one actor look it up once.
        let mut last: Option<(u64, Rc<dyn Exported>)> = None;
        while batch.len() >= 4 {
            let len = u32::from_le_bytes(batch[..4].try_into().unwrap()) as usize;
            let Some(payload) = batch.get(4..4 + len) else {
                break; // a truncated frame: nothing else in this batch can be trusted
            };
            batch = &batch[4 + len..];
            if let Some((to, msg)) = parse_tell(payload) {
                if last.as_ref().map(|(id, _)| *id) != Some(to) {
                    last = self.exported.borrow().get(&to).map(|e| (to, e.clone()));
                }
                if let Some((_, e)) = &last {
                    let _ = e.deliver(msg, None, self);
                    self.note_forward(from, to, e.as_ref());
                }
                continue;
            }
            match serde_bare::from_slice::<Wire>(payload) {
                Ok(w) => self.dispatch(from, w),
                Err(_) => break,
            }
        }
    }

    /// Node `from` monitors this node's actor `target` (its exit cell `exit`) as `mref`: an
    /// entry in the actor's list, which the task `export` started sends its `Down` when the
    /// actor exits; a node that goes down is dropped from every list (`node_down`). Refused
    /// beyond `max_monitors` monitors from that node.
    fn monitor(&self, from: usize, target: u64, mref: u64, exit: Rc<Exit>) {
        let Some(Some(p)) = self.peers.get(from) else {
            return;
        };
        if let Some(reason) = exit.get() {
            self.send(from, Wire::Down { mref, reason });
            return;
        }
        if p.monitors.get() >= self.max_monitors {
            let reason = ExitReason::Error(format!(
                "monitor refused: node {from} already holds {} monitors here \
                 (SystemOptions::max_monitors)",
                self.max_monitors
            ));
            self.send(from, Wire::Down { mref, reason });
            return;
        }
        p.monitors.set(p.monitors.get() + 1);
        self.monitored
            .borrow_mut()
            .entry(target)
            .or_default()
            .push((from, mref));
    }

    /// The exit reason of actor `id`, gone from here, if it exited lately (see `export`).
    fn tombstone(&self, id: u64) -> Option<ExitReason> {
        self.tombstones.borrow().0.get(&id).cloned()
    }

    pub(super) fn is_down(&self, node: usize) -> bool {
        matches!(self.peers.get(node), Some(Some(p)) if p.down.get())
    }

    pub(super) async fn request(
        &self,
        node: usize,
        make: impl FnOnce(u64) -> Wire,
    ) -> Result<Vec<u8>> {
        if self.is_down(node) {
            return Err(Error::PeerGone(format!("node {node} is down")));
        }
        let req = self.id();
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(req, (node, tx));
        if let Err(e) = self.send_wire(node, make(req)) {
            self.pending.borrow_mut().remove(&req);
            return Err(e);
        }
        match rx.await {
            Ok(Ok(b)) => Ok(b),
            Ok(Err(e)) => Err(match e.strip_prefix(OVERLOADED) {
                Some(m) => Error::Overloaded(m.to_string()),
                None => Error::Refused(e),
            }),
            Err(_) => Err(Error::PeerGone(format!("node {node} is down"))),
        }
    }

    fn dispatch(self: &Rc<Self>, from: usize, w: Wire) {
        match w {
            Wire::Heartbeat => {}
            Wire::Tell { to, msg } => {
                let e = self.exported.borrow().get(&to).cloned();
                if let Some(e) = e {
                    let _ = e.deliver(&msg, None, self);
                    self.note_forward(from, to, e.as_ref());
                }
            }
            Wire::Moved { old, node, id } => {
                let token = self.id();
                self.fences.borrow_mut().insert(token, (from, old));
                self.routes.borrow_mut().insert(
                    (from, old),
                    Route::Switching {
                        to: (node as usize, id),
                        held: Vec::new(),
                    },
                );
                self.send(from, Wire::Fence { old, token });
            }
            Wire::Fence { old, token } => {
                let e = self.exported.borrow().get(&old).cloned();
                if let Some((node, _)) = e.and_then(|e| e.moved()) {
                    let w = Wire::FenceFwd {
                        origin: from as u64,
                        token,
                    };
                    if node == self.rank {
                        self.dispatch(from, w);
                    } else {
                        self.send(node, w);
                    }
                }
            }
            Wire::FenceFwd { origin, token } => {
                if origin as usize == self.rank {
                    self.switched(token);
                } else {
                    self.send(origin as usize, Wire::FenceAck { token });
                }
            }
            Wire::FenceAck { token } => self.switched(token),
            Wire::Ask { to, req, msg } => {
                let e = self.exported.borrow().get(&to).cloned();
                let r = match e {
                    Some(e) => {
                        let r = e.deliver(&msg, Some((from, req)), self);
                        self.note_forward(from, to, e.as_ref());
                        r
                    }
                    None => Err(Error::Exited(
                        self.tombstone(to)
                            .map_or("no such actor (noproc)".into(), |r| r.to_string()),
                    )),
                };
                if let Err(e) = r {
                    self.send(
                        from,
                        Wire::Reply {
                            req,
                            result: Err(e.to_string()),
                        },
                    );
                }
            }
            Wire::Reply { req, result } => {
                if let Some((_, tx)) = self.pending.borrow_mut().remove(&req) {
                    let _ = tx.send(result);
                }
            }
            Wire::Lookup { req, name, fp } => {
                let id = self.names.borrow().get(&name).copied();
                let e = id.and_then(|id| self.exported.borrow().get(&id).cloned());
                let result = match (id, e) {
                    (Some(id), Some(e)) if e.fingerprint() == fp => {
                        encode(&id).map_err(|e| e.to_string())
                    }
                    (Some(_), Some(e)) => {
                        Err(format!("{name:?} takes {}, not {fp}", e.fingerprint()))
                    }
                    _ => Err(format!("no actor {name:?} on node {}", self.rank)),
                };
                self.send(from, Wire::Reply { req, result });
            }
            Wire::Spawn {
                req,
                kind,
                fp,
                args,
            } => {
                let f = self.kinds.borrow().get(&kind).cloned();
                let result = match f {
                    Some((kfp, f)) if kfp == fp => f(self, &args)
                        .and_then(|id| encode(&id))
                        .map_err(|e| e.to_string()),
                    Some((kfp, _)) => Err(format!("kind {kind:?} takes {kfp}, not {fp}")),
                    None => Err(format!("no actor kind {kind:?} on node {}", self.rank)),
                };
                self.send(from, Wire::Reply { req, result });
            }
            Wire::Monitor { target, mref } => {
                let e = self.exported.borrow().get(&target).cloned();
                match e {
                    None => {
                        let reason = self
                            .tombstone(target)
                            .unwrap_or_else(|| ExitReason::Error("noproc".into()));
                        self.send(from, Wire::Down { mref, reason });
                    }
                    Some(e) => self.monitor(from, target, mref, e.exit()),
                }
            }
            Wire::Down { mref, reason } => {
                if let Some((_, exit)) = self.watching.borrow_mut().remove(&mref) {
                    exit.set(reason);
                }
            }
            Wire::Adopt {
                req,
                kind,
                fp,
                state,
            } => {
                let f = self.adopters.borrow().get(&kind).cloned();
                let result = match f {
                    Some((kfp, f)) if kfp == fp => f(self, &state)
                        .and_then(|id| encode(&id))
                        .map_err(|e| e.to_string()),
                    Some((kfp, _)) => Err(format!("kind {kind:?} takes {kfp}, not {fp}")),
                    None => Err(format!("no migratable kind {kind:?} on node {}", self.rank)),
                };
                self.send(from, Wire::Reply { req, result });
            }
            Wire::Exit { to, reason, kill } => {
                let e = self.exported.borrow().get(&to).cloned();
                if let Some(e) = e {
                    e.signal(reason, kill);
                }
            }
        }
    }

    /// A message from `from` to this node's actor `to` was delivered; if that actor moved
    /// away, the message was forwarded: count it, and tell `from` (once) where it went.
    fn note_forward(&self, from: usize, to: u64, e: &dyn Exported) {
        let Some((node, id)) = e.moved() else { return };
        self.forwarded.set(self.forwarded.get() + 1);
        if self.told_moved.borrow_mut().insert((from, to)) {
            self.send(
                from,
                Wire::Moved {
                    old: to,
                    node: node as u64,
                    id,
                },
            );
        }
    }

    /// The fence `token` came back: everything this node sent to the old address has reached
    /// the new home; send there directly from now on, held tells first.
    fn switched(self: &Rc<Self>, token: u64) {
        let Some(old) = self.fences.borrow_mut().remove(&token) else {
            return;
        };
        let route = self.routes.borrow_mut().remove(&old);
        let Some(Route::Switching { to, held }) = route else {
            return;
        };
        self.routes
            .borrow_mut()
            .insert(old, Route::Direct(to.0, to.1));
        for msg in held {
            self.tell_bytes(to, msg);
        }
        for w in self.route_waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// An encoded tell to `(node, id)`, which may be an actor of this node.
    pub(super) fn tell_bytes(self: &Rc<Self>, (node, id): (usize, u64), msg: Vec<u8>) {
        if node == self.rank {
            let e = self.exported.borrow().get(&id).cloned();
            if let Some(e) = e {
                let _ = e.deliver(&msg, None, self);
            }
        } else {
            self.send(node, Wire::Tell { to: id, msg });
        }
    }

    /// Where a reference to `(node, id)` should send now: its own address, a moved actor's
    /// new one, or `None` while the switch is under way.
    pub(super) fn route(&self, node: usize, id: u64) -> Option<(usize, u64)> {
        match self.routes.borrow().get(&(node, id)) {
            None => Some((node, id)),
            Some(Route::Direct(n, i)) => Some((*n, *i)),
            Some(Route::Switching { .. }) => None,
        }
    }

    /// `node` is gone: fail what waits on it, once.
    pub(super) fn node_down(&self, node: usize, _why: &str) {
        let Some(Some(p)) = self.peers.get(node) else {
            return;
        };
        if p.down.replace(true) {
            return;
        }
        self.pending.borrow_mut().retain(|_, (n, _)| *n != node);
        let gone: Vec<Rc<Exit>> = {
            let mut w = self.watching.borrow_mut();
            let keys: Vec<u64> = w
                .iter()
                .filter(|(_, (n, _))| *n == node)
                .map(|(k, _)| *k)
                .collect();
            keys.iter()
                .filter_map(|k| w.remove(k))
                .map(|(_, e)| e)
                .collect()
        };
        for e in gone {
            e.set(ExitReason::NoConnection);
        }
        // Its monitors of this node's actors go: nobody is left to tell.
        for watchers in self.monitored.borrow_mut().values_mut() {
            watchers.retain(|(n, _)| *n != node);
        }
        p.monitors.set(0);
        self.downs.borrow_mut().push(node);
        for w in self.down_waiters.borrow_mut().drain(..) {
            w.wake();
        }
        // Disconnect it: a node this one no longer talks to learns so at once (its side of
        // the connection fails, and it declares this one down in turn), instead of waiting
        // for answers this node would drop. Down stays down for both, as in OTP.
        if let Some(Some(ep)) = self.links.get(node) {
            ep.close();
        }
    }
}

pub(super) async fn heartbeats(sys: Weak<Sys>, opts: SystemOptions) {
    let deadline = opts.heartbeat * opts.misses;
    let mut tick = time::interval(opts.heartbeat);
    loop {
        tick.tick().await;
        let Some(sys) = sys.upgrade() else { break };
        let now = Instant::now();
        for (j, p) in sys.peers.iter().enumerate() {
            let Some(p) = p else { continue };
            if p.down.get() {
                continue;
            }
            if opts.detector == Detector::Heartbeats
                && now.duration_since(p.last_heard.get()) > deadline
            {
                sys.node_down(j, "no heartbeat");
                continue;
            }
            sys.send(j, Wire::Heartbeat);
        }
    }
}
