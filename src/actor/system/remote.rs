//! An actor on another node, as an `ActorRef` holds it: tells, asks, exit signals and
//! monitors, each a `Wire` message through the system.

use super::*;

/// An actor on another node.
pub(crate) struct RemoteRef<A: Actor> {
    sys: Weak<Sys>,
    pub(crate) node: usize,
    pub(crate) id: u64,
    exit: Rc<Exit>,
    mref: Cell<Option<u64>>,
    /// How its messages and replies cross the wire (fixed where `A` is known to be serde).
    tell: fn(&Sys, usize, u64, &A::Msg) -> Result<()>,
    enc: fn(&A::Msg) -> Result<Vec<u8>>,
    dec: fn(&[u8]) -> Result<A::Reply>,
    dec_msg: fn(&[u8]) -> Result<A::Msg>,
    enc_reply: fn(&A::Reply) -> Result<Vec<u8>>,
}

impl<A: Actor> RemoteRef<A> {
    fn sys(&self) -> Result<Rc<Sys>> {
        self.sys
            .upgrade()
            .ok_or_else(|| Error::Invalid("the actor system was dropped".into()))
    }

    pub(crate) fn tell(&self, msg: &A::Msg) -> Result<()> {
        let sys = self.sys()?;
        if !sys.routes.borrow().is_empty() {
            let mut routes = sys.routes.borrow_mut();
            match routes.get_mut(&(self.node, self.id)) {
                None => {}
                Some(Route::Switching { held, .. }) => {
                    held.push((self.enc)(msg)?);
                    return Ok(());
                }
                Some(Route::Direct(n, i)) => {
                    let to = (*n, *i);
                    drop(routes);
                    if to.0 == sys.rank {
                        sys.tell_bytes(to, (self.enc)(msg)?);
                        return Ok(());
                    }
                    return (self.tell)(&sys, to.0, to.1, msg);
                }
            }
        }
        if sys.is_down(self.node) {
            return Err(Error::PeerGone(format!("node {} is down", self.node)));
        }
        (self.tell)(&sys, self.node, self.id, msg)
    }

    pub(crate) async fn ask(&self, msg: &A::Msg, timeout: Duration) -> Result<A::Reply> {
        let sys = self.sys()?;
        let bytes = (self.enc)(msg)?;
        let asked = async {
            // While this node switches to a moved actor's new address, wait: the tells it
            // holds go first.
            let (node, to) = std::future::poll_fn(|cx| match sys.route(self.node, self.id) {
                Some(r) => Poll::Ready(r),
                None => {
                    sys.route_waiters.borrow_mut().push(cx.waker().clone());
                    Poll::Pending
                }
            })
            .await;
            if node == sys.rank {
                // It moved here.
                let local = sys
                    .refs
                    .borrow()
                    .get(&to)
                    .and_then(|r| r.downcast_ref::<ActorRef<A>>().cloned())
                    .ok_or_else(|| Error::Exited("no such actor (noproc)".into()))?;
                // (Boxed: `ActorRef::ask` is what called this.)
                let asked: std::pin::Pin<Box<dyn std::future::Future<Output = Result<A::Reply>>>> =
                    Box::pin(local.ask((self.dec_msg)(&bytes)?, timeout));
                let reply = asked.await?;
                return (self.enc_reply)(&reply);
            }
            sys.request(node, |req| Wire::Ask {
                to,
                req,
                msg: bytes,
            })
            .await
        };
        match time::timeout(timeout, asked).await {
            Ok(Ok(b)) => (self.dec)(&b),
            Ok(Err(Error::Refused(m))) => Err(Error::Exited(m)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Timeout(format!("no reply within {timeout:?}"))),
        }
    }

    pub(crate) fn exit_signal(&self, reason: ExitReason, kill: bool) {
        if let Ok(sys) = self.sys() {
            sys.send(
                self.node,
                Wire::Exit {
                    to: self.id,
                    reason,
                    kill,
                },
            );
        }
    }

    /// The exit cell, with a monitor on the actor's node placed the first time.
    pub(crate) fn monitored_exit(&self) -> Rc<Exit> {
        if self.mref.get().is_none() {
            if let Ok(sys) = self.sys() {
                let mref = sys.id();
                self.mref.set(Some(mref));
                if sys.is_down(self.node) {
                    self.exit.set(ExitReason::NoConnection);
                } else {
                    sys.watching
                        .borrow_mut()
                        .insert(mref, (self.node, self.exit.clone()));
                    sys.send(
                        self.node,
                        Wire::Monitor {
                            target: self.id,
                            mref,
                        },
                    );
                }
            }
        }
        self.exit.clone()
    }
}

impl Sys {
    /// A reference to actor `id` on `node`, through this system.
    pub(super) fn remote_ref<A: RemoteActor>(self: &Rc<Self>, node: usize, id: u64) -> ActorRef<A> {
        ActorRef::remote(RemoteRef {
            sys: Rc::downgrade(self),
            node,
            id,
            exit: Rc::new(Exit::default()),
            mref: Cell::new(None),
            tell: Sys::tell_frame::<A::Msg>,
            enc: encode::<A::Msg>,
            dec: decode::<A::Reply>,
            dec_msg: decode::<A::Msg>,
            enc_reply: encode::<A::Reply>,
        })
    }
}
