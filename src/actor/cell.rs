//! One actor: its task, its mailbox, the reference others hold, and how it ends.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Duration;

use barewire_engine::sync::{mpsc, oneshot};
use barewire_engine::{spawn_local, time, JoinHandle};

use super::{Actor, ExitReason};
use crate::error::{Error, Result};

enum Envelope<A: Actor> {
    Tell(A::Msg),
    Ask(A::Msg, oneshot::Sender<A::Reply>),
    Stop(ExitReason),
}

/// How an actor ended, for whoever waits on it (its supervisor, monitors).
#[derive(Default)]
pub(crate) struct Exit {
    reason: RefCell<Option<ExitReason>>,
    waiters: RefCell<Vec<Waker>>,
}

impl Exit {
    pub(crate) fn set(&self, r: ExitReason) {
        if self.reason.borrow().is_some() {
            return;
        }
        *self.reason.borrow_mut() = Some(r);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub(crate) fn get(&self) -> Option<ExitReason> {
        self.reason.borrow().clone()
    }

    pub(crate) fn poll_exit(&self, cx: &mut std::task::Context<'_>) -> Poll<ExitReason> {
        match self.get() {
            Some(r) => Poll::Ready(r),
            None => {
                self.waiters.borrow_mut().push(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

struct Shared<A: Actor> {
    tx: mpsc::Sender<Envelope<A>>,
    exit: Rc<Exit>,
    task: RefCell<Option<JoinHandle<()>>>,
}

/// A reference to an actor on this core: cheap to clone, usable from any task of the core.
pub struct ActorRef<A: Actor> {
    shared: Rc<Shared<A>>,
}

impl<A: Actor> Clone for ActorRef<A> {
    fn clone(&self) -> Self {
        ActorRef {
            shared: self.shared.clone(),
        }
    }
}

/// What a handler sees of its own actor.
pub struct Context<A: Actor> {
    myself: ActorRef<A>,
    stop: RefCell<Option<ExitReason>>,
}

impl<A: Actor> Context<A> {
    /// A reference to this actor.
    pub fn myself(&self) -> &ActorRef<A> {
        &self.myself
    }

    /// Ends this actor with `reason` once the current handler returns.
    pub fn stop(&self, reason: ExitReason) {
        *self.stop.borrow_mut() = Some(reason);
    }
}

/// Starts `actor` as a task of this core.
pub fn spawn<A: Actor>(actor: A) -> ActorRef<A> {
    let (tx, rx) = mpsc::unbounded();
    let shared = Rc::new(Shared {
        tx,
        exit: Rc::new(Exit::default()),
        task: RefCell::new(None),
    });
    let me = ActorRef { shared };
    let ctx = Context {
        myself: me.clone(),
        stop: RefCell::new(None),
    };
    let exit = me.shared.exit.clone();
    let task = spawn_local(async move {
        let reason = run(actor, rx, &ctx).await;
        // The context holds a reference to this actor: drop the mailbox with it.
        drop(ctx);
        exit.set(reason);
    });
    *me.shared.task.borrow_mut() = Some(task);
    me
}

async fn run<A: Actor>(
    mut actor: A,
    mut rx: mpsc::Receiver<Envelope<A>>,
    ctx: &Context<A>,
) -> ExitReason {
    if let Err(p) = catch(actor.started(ctx)).await {
        return p;
    }
    let reason = loop {
        let Some(env) = rx.recv().await else {
            break ExitReason::Normal;
        };
        let outcome = match env {
            Envelope::Tell(m) => catch(actor.handle(m, ctx)).await.map(drop),
            Envelope::Ask(m, reply) => catch(actor.handle(m, ctx)).await.map(|r| {
                let _ = reply.send(r);
            }),
            Envelope::Stop(r) => break r,
        };
        if let Err(p) = outcome {
            break p;
        }
        if let Some(r) = ctx.stop.borrow_mut().take() {
            break r;
        }
    };
    actor.stopped(&reason);
    reason
}

/// Runs `f` to completion; a panic inside becomes `ExitReason::Panic` with its message.
async fn catch<F: Future>(f: F) -> Result<F::Output, ExitReason> {
    let mut f = std::pin::pin!(f);
    poll_fn(|cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| Pin::as_mut(&mut f).poll(cx))) {
            Ok(Poll::Ready(v)) => Poll::Ready(Ok(v)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(p) => {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                Poll::Ready(Err(ExitReason::Panic(msg)))
            }
        }
    })
    .await
}

impl<A: Actor> ActorRef<A> {
    fn send(&self, env: Envelope<A>) -> Result<()> {
        if let Some(r) = self.shared.exit.get() {
            return Err(Error::Exited(r.to_string()));
        }
        self.shared
            .tx
            .try_send(env)
            .map_err(|_| Error::Exited("its mailbox is closed".into()))
    }

    /// Sends `msg`; messages from one sender are handled in the order sent.
    pub fn tell(&self, msg: A::Msg) -> Result<()> {
        self.send(Envelope::Tell(msg))
    }

    /// Sends `msg` and waits for the handler's reply, at most `timeout`.
    pub async fn ask(&self, msg: A::Msg, timeout: Duration) -> Result<A::Reply> {
        let (tx, rx) = oneshot::channel();
        self.send(Envelope::Ask(msg, tx))?;
        match time::timeout(timeout, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(Error::Exited(
                self.exit_reason()
                    .map_or("it exited before replying".into(), |r| r.to_string()),
            )),
            Err(_) => Err(Error::Timeout(format!("no reply within {timeout:?}"))),
        }
    }

    /// Asks it to stop with `reason` after the messages already in its mailbox.
    pub fn stop(&self, reason: ExitReason) {
        let _ = self.send(Envelope::Stop(reason));
    }

    /// Ends it now: its task is dropped at its next scheduling point, `stopped` does not run,
    /// and its exit reason is `Killed`.
    pub fn kill(&self) {
        if let Some(t) = &*self.shared.task.borrow() {
            t.cancel();
        }
        self.shared.exit.set(ExitReason::Killed);
    }

    /// How it ended, once it has.
    pub fn exit_reason(&self) -> Option<ExitReason> {
        self.shared.exit.get()
    }

    /// Waits until it ends; its exit reason.
    pub async fn wait(&self) -> ExitReason {
        poll_fn(|cx| self.shared.exit.poll_exit(cx)).await
    }

    pub(crate) fn exit_cell(&self) -> Rc<Exit> {
        self.shared.exit.clone()
    }

    /// True when both refer to the same actor.
    pub fn same(&self, other: &ActorRef<A>) -> bool {
        Rc::ptr_eq(&self.shared, &other.shared)
    }
}
