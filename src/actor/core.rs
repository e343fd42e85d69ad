//! Actors on another core of this process: started there, reached from here through the
//! engine's cross-core rings.
//!
//! The actor lives on its core as any local actor does; a forwarding task there takes what the
//! ring brings and puts it in the actor's mailbox, in order. On this side, the reference queues
//! to a pump task that moves envelopes onto the ring (waiting for room when it is full), so
//! `tell` stays synchronous and ordered. Replies and the exit reason come back on rings of
//! their own. The forwarder takes from the ring only while the actor's mailbox holds fewer
//! than `FORWARD_AHEAD` messages, so a slow actor's backlog waits on the sending core, where
//! [`ActorRef::queued`] counts it (and an actor system bounds what other nodes add to it).

/// Messages the forwarder lets wait in the actor's mailbox before it leaves the rest on the
/// ring (and behind it, on the sending core).
const FORWARD_AHEAD: usize = 1024;

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use barewire_engine::sync::{cross, mpsc};
use barewire_engine::{spawn_local, time};

use super::cell::{ActorRef, Exit};
use super::{spawn, Actor, ExitReason};
use crate::error::{Error, Result};

pub(crate) enum Envelope<A: Actor> {
    Tell(A::Msg),
    Ask(A::Msg, cross::Sender<A::Reply>),
    Stop(ExitReason),
    Exit(ExitReason),
}

type Asked<A> = Pin<Box<dyn Future<Output = Result<<A as Actor>::Reply>>>>;
type AskFn<A> = fn(&mpsc::Sender<Envelope<A>>, <A as Actor>::Msg, Duration) -> Asked<A>;

/// This core's handle on an actor of another core.
pub(crate) struct CoreRef<A: Actor> {
    pub(crate) core: usize,
    tx: mpsc::Sender<Envelope<A>>,
    pub(crate) exit: Rc<Exit>,
    /// Made where `A`'s message and reply are known to be `Send`.
    ask: AskFn<A>,
}

impl<A: Actor> CoreRef<A> {
    /// Envelopes waiting on this core for room on the ring.
    pub(crate) fn queued(&self) -> usize {
        self.tx.len()
    }

    pub(crate) fn send(&self, e: Envelope<A>) -> Result<()> {
        if let Some(r) = self.exit.get() {
            return Err(Error::Exited(r.to_string()));
        }
        self.tx
            .try_send(e)
            .map_err(|_| Error::Exited("its forwarder is gone".into()))
    }

    pub(crate) async fn ask(&self, msg: A::Msg, timeout: Duration) -> Result<A::Reply> {
        if let Some(r) = self.exit.get() {
            return Err(Error::Exited(r.to_string()));
        }
        (self.ask)(&self.tx, msg, timeout).await
    }
}

fn ask_across<A>(tx: &mpsc::Sender<Envelope<A>>, msg: A::Msg, timeout: Duration) -> Asked<A>
where
    A: Actor<Msg: Send, Reply: Send>,
{
    let (rtx, mut rrx) = cross::channel::<A::Reply>(1);
    let queued = tx.try_send(Envelope::Ask(msg, rtx));
    Box::pin(async move {
        queued.map_err(|_| Error::Exited("its forwarder is gone".into()))?;
        match time::timeout(timeout, rrx.recv()).await {
            Ok(Some(r)) => Ok(r),
            Ok(None) => Err(Error::Exited("it exited before replying".into())),
            Err(_) => Err(Error::Timeout(format!("no reply within {timeout:?}"))),
        }
    })
}

/// Starts the actor `make` builds on core `core` of this runtime (built there, so the actor
/// itself need not be `Send`; its messages and replies must be). The reference works from this
/// core like any other.
///
/// ```
/// use barewire::actor::{spawn_on_core, Actor, Context};
/// struct Where;
/// impl Actor for Where {
///     type Msg = ();
///     type Reply = usize;
///     async fn handle(&mut self, _: (), _: &Context<Self>) -> usize {
///         barewire::engine::current_core()
///     }
/// }
/// # barewire::engine::Runtime::builder().cores(2).pin(false).build().unwrap().block_on(async {
/// let w = spawn_on_core(1, || Where);
/// assert_eq!(w.ask((), std::time::Duration::from_secs(1)).await.unwrap(), 1);
/// # });
/// ```
pub fn spawn_on_core<A, F>(core: usize, make: F) -> ActorRef<A>
where
    A: Actor<Msg: Send, Reply: Send>,
    F: FnOnce() -> A + Send + 'static,
{
    let (mut ring_tx, mut ring_rx) = cross::channel::<Envelope<A>>(1024);
    let (mut exit_tx, mut exit_rx) = cross::channel::<ExitReason>(1);
    // There: the actor, a forwarder from the ring into its mailbox, and its exit sent back.
    drop(barewire_engine::spawn_on(core, move || async move {
        let r = spawn(make());
        let to = r.clone();
        let fwd = spawn_local(async move {
            while let Some(e) = ring_rx.recv().await {
                // A mailbox this long is the actor falling behind: wait for it rather than
                // move the backlog here.
                to.mailbox_room(FORWARD_AHEAD).await;
                match e {
                    Envelope::Tell(m) => {
                        let _ = to.tell(m);
                    }
                    Envelope::Ask(m, mut reply) => {
                        if let Ok(rx) = to.ask_local(m) {
                            drop(spawn_local(async move {
                                if let Ok(v) = rx.await {
                                    let _ = reply.send(v).await;
                                }
                            }));
                        }
                    }
                    Envelope::Stop(x) => to.stop(x),
                    Envelope::Exit(x) => to.exit_with(x),
                }
            }
        });
        let reason = r.wait().await;
        fwd.cancel();
        let _ = exit_tx.send(reason).await;
    }));
    // Here: the pump onto the ring, and the exit reason when it comes.
    let (tx, mut queue) = mpsc::unbounded::<Envelope<A>>();
    drop(spawn_local(async move {
        while let Some(e) = queue.recv().await {
            if ring_tx.send(e).await.is_err() {
                break;
            }
        }
    }));
    let exit = Rc::new(Exit::default());
    let seen = exit.clone();
    drop(spawn_local(async move {
        let r = exit_rx.recv().await.unwrap_or(ExitReason::Killed);
        seen.set(r);
    }));
    ActorRef::on_core(CoreRef {
        core,
        tx,
        exit,
        ask: ask_across::<A>,
    })
}
