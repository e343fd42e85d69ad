//! OTP supervision on one core: random crash sequences give exactly the restarts and the
//! escalation that a model of OTP's rules predicts; restarts stop siblings in reverse start
//! order; a child that ignores its shutdown is killed after its shutdown time; a panic is an
//! exit reason, not a dead core.

use barewire_test_support::rt;
use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use barewire::actor::{
    spawn, whereis, Actor, ActorRef, ChildSpec, Context, ExitReason, Restart, Strategy as Kind,
    Supervisor, SupervisorSpec,
};
use barewire::engine::{time, yield_now};
use proptest::prelude::*;

/// What the children did, as they saw it: (event, child name) in order.
type Journal = Rc<RefCell<Vec<(&'static str, String)>>>;

/// A child that records its starts and stops and exits as told.
struct Child {
    name: String,
    journal: Journal,
}

enum Cmd {
    Exit(ExitReason),
    /// Stay busy in the handler for this long (ignoring a shutdown request meanwhile).
    Busy(Duration),
}

impl Actor for Child {
    type Msg = Cmd;
    type Reply = ();
    async fn started(&mut self, _: &Context<Self>) {
        self.journal.borrow_mut().push(("start", self.name.clone()));
    }
    async fn handle(&mut self, cmd: Cmd, ctx: &Context<Self>) {
        match cmd {
            Cmd::Exit(ExitReason::Panic(m)) => panic!("{m}"),
            Cmd::Exit(r) => ctx.stop(r),
            Cmd::Busy(d) => time::sleep(d).await,
        }
    }
    fn stopped(&mut self, _: &ExitReason) {
        self.journal.borrow_mut().push(("stop", self.name.clone()));
    }
}

fn child(name: &str, restart: Restart, journal: &Journal) -> ChildSpec {
    let (n, j) = (name.to_string(), journal.clone());
    ChildSpec::actor(name, move || Child {
        name: n.clone(),
        journal: j.clone(),
    })
    .restart(restart)
}

/// Lets every ready task run until nothing is left to do.
async fn settle() {
    time::sleep(Duration::from_millis(1)).await;
    for _ in 0..64 {
        yield_now().await;
    }
}

// ------------------------------------------------------------------ the model

/// OTP's rules, written down independently of the implementation.
#[derive(Debug, Clone)]
struct Model {
    strategy: Kind,
    intensity: usize,
    restart: Vec<Restart>,
    running: Vec<bool>,
    removed: Vec<bool>,
    starts: Vec<u64>,
    restarts: usize,
    gave_up: bool,
}

impl Model {
    fn new(strategy: Kind, intensity: usize, restart: Vec<Restart>) -> Model {
        let n = restart.len();
        Model {
            strategy,
            intensity,
            restart,
            running: vec![true; n],
            removed: vec![false; n],
            starts: vec![1; n],
            restarts: 0,
            gave_up: false,
        }
    }

    fn stop(&mut self, j: usize) {
        self.running[j] = false;
        if self.restart[j] == Restart::Temporary {
            self.removed[j] = true;
        }
    }

    /// Child `i` exits, normally or not.
    fn exit(&mut self, i: usize, abnormal: bool) {
        self.stop(i);
        let restart = match self.restart[i] {
            Restart::Permanent => true,
            Restart::Transient => abnormal,
            Restart::Temporary => false,
        };
        if !restart {
            return;
        }
        // Every restart of a case falls within the (long) period.
        self.restarts += 1;
        if self.restarts > self.intensity {
            for j in 0..self.running.len() {
                self.stop(j);
            }
            self.gave_up = true;
            return;
        }
        let n = self.running.len();
        let group = match self.strategy {
            Kind::OneForOne => i..i + 1,
            Kind::OneForAll => 0..n,
            Kind::RestForOne => i..n,
        };
        for j in group.clone() {
            if self.running[j] {
                self.stop(j);
            }
        }
        for j in group {
            if !self.removed[j] {
                self.running[j] = true;
                self.starts[j] += 1;
            }
        }
    }
}

fn strategy() -> impl proptest::strategy::Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::OneForOne),
        Just(Kind::OneForAll),
        Just(Kind::RestForOne)
    ]
}

fn restart() -> impl proptest::strategy::Strategy<Value = Restart> {
    prop_oneof![
        Just(Restart::Permanent),
        Just(Restart::Transient),
        Just(Restart::Temporary)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_crashes_restart_and_escalate_as_otp_predicts(
        strategy in strategy(),
        restarts in proptest::collection::vec(restart(), 1..5),
        intensity in 0usize..6,
        crashes in proptest::collection::vec((0usize..5, any::<bool>()), 1..14),
    ) {
        let journal: Journal = Rc::default();
        let names: Vec<String> = (0..restarts.len()).map(|i| format!("c{i}")).collect();
        let mut model = Model::new(strategy, intensity, restarts.clone());
        let sup = rt().block_on(async {
            let spec = SupervisorSpec::new(
                strategy,
                names.iter().zip(&restarts).map(|(n, r)| child(n, *r, &journal)).collect(),
            )
            .intensity(intensity as u32, Duration::from_secs(3600));
            let sup = Supervisor::start(spec).await;
            settle().await;
            for (k, abnormal) in &crashes {
                let i = k % names.len();
                if model.gave_up || !model.running[i] {
                    continue;
                }
                let reason = if *abnormal {
                    ExitReason::Panic(format!("crash {i}"))
                } else {
                    ExitReason::Normal
                };
                whereis::<Child>(&names[i]).expect("a running child is registered")
                    .tell(Cmd::Exit(reason)).unwrap();
                model.exit(i, *abnormal);
                settle().await;
                let starts: Vec<u64> = names.iter().map(|n| {
                    journal.borrow().iter().filter(|(e, m)| *e == "start" && m == n).count() as u64
                }).collect();
                prop_assert_eq!(&starts, &model.starts, "starts after {:?}", crashes);
                for (j, n) in names.iter().enumerate() {
                    prop_assert_eq!(sup.is_running(n), model.running[j], "{} running", n);
                }
                prop_assert_eq!(sup.exit_reason().is_some(), model.gave_up);
            }
            if !model.gave_up {
                sup.stop();
                prop_assert_eq!(sup.wait().await, ExitReason::Shutdown);
            }
            Ok(sup)
        })?;
        prop_assert_eq!(sup.exit_reason(), Some(ExitReason::Shutdown));
    }
}

#[test]
fn the_model_itself_follows_otp_on_known_sequences() {
    use Restart::*;
    // one_for_one, default intensity 1: the second restart gives up.
    let mut m = Model::new(Kind::OneForOne, 1, vec![Permanent, Permanent]);
    m.exit(1, true);
    assert_eq!((m.starts.clone(), m.gave_up), (vec![1, 2], false));
    m.exit(0, true);
    assert!(m.gave_up && m.running == [false, false]);
    // rest_for_one: a crash of the first restarts everything after it; temporary siblings go.
    let mut m = Model::new(Kind::RestForOne, 5, vec![Permanent, Temporary, Transient]);
    m.exit(0, true);
    assert_eq!(m.starts, [2, 1, 2]);
    assert_eq!(m.running, [true, false, true]);
    // transient: a normal exit is not restarted and does not count.
    m.exit(2, false);
    assert_eq!((m.restarts, m.running[2]), (1, false));
}

#[test]
fn a_group_restart_stops_siblings_last_first_and_starts_them_first_first() {
    rt().block_on(async {
        let journal: Journal = Rc::default();
        let names = ["a", "b", "c", "d"];
        let sup = Supervisor::start(
            SupervisorSpec::new(
                Kind::OneForAll,
                names
                    .iter()
                    .map(|n| child(n, Restart::Permanent, &journal))
                    .collect(),
            )
            .intensity(3, Duration::from_secs(5)),
        )
        .await;
        settle().await;
        journal.borrow_mut().clear();
        whereis::<Child>("c")
            .unwrap()
            .tell(Cmd::Exit(ExitReason::Error("boom".into())))
            .unwrap();
        settle().await;
        let got: Vec<String> = journal
            .borrow()
            .iter()
            .map(|(e, n)| format!("{e} {n}"))
            .collect();
        assert_eq!(
            got,
            ["stop c", "stop d", "stop b", "stop a", "start a", "start b", "start c", "start d"]
        );
        journal.borrow_mut().clear();
        sup.stop();
        assert_eq!(sup.wait().await, ExitReason::Shutdown);
        let got: Vec<String> = journal.borrow().iter().map(|(_, n)| n.clone()).collect();
        assert_eq!(got, ["d", "c", "b", "a"], "shutdown in reverse start order");
    });
}

#[test]
fn a_child_that_ignores_shutdown_is_killed_after_its_shutdown_time() {
    rt().block_on(async {
        let journal: Journal = Rc::default();
        let sup = Supervisor::start(SupervisorSpec::new(
            Kind::OneForOne,
            vec![child("slow", Restart::Permanent, &journal).shutdown(Duration::from_millis(50))],
        ))
        .await;
        settle().await;
        let slow = whereis::<Child>("slow").unwrap();
        slow.tell(Cmd::Busy(Duration::from_secs(30))).unwrap();
        settle().await;
        let t0 = Instant::now();
        sup.stop();
        assert_eq!(sup.wait().await, ExitReason::Shutdown);
        let took = t0.elapsed();
        assert_eq!(slow.exit_reason(), Some(ExitReason::Killed));
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert!(
            !journal.borrow().iter().any(|(e, _)| *e == "stop"),
            "a killed child's stopped hook does not run"
        );
    });
}

#[test]
fn escalation_reaches_the_parent_which_restarts_the_subtree() {
    rt().block_on(async {
        let journal: Journal = Rc::default();
        let j = journal.clone();
        let top = Supervisor::start(
            SupervisorSpec::new(
                Kind::OneForOne,
                vec![ChildSpec::supervisor("inner", move || {
                    // The inner supervisor allows no restart at all.
                    SupervisorSpec::new(
                        Kind::OneForOne,
                        vec![child("leaf", Restart::Permanent, &j)],
                    )
                    .intensity(0, Duration::from_secs(5))
                })],
            )
            .intensity(5, Duration::from_secs(5)),
        )
        .await;
        settle().await;
        let first = whereis::<Child>("leaf").unwrap();
        first
            .tell(Cmd::Exit(ExitReason::Panic("leaf".into())))
            .unwrap();
        settle().await;
        assert_eq!(first.exit_reason(), Some(ExitReason::Panic("leaf".into())));
        assert_eq!(
            top.starts("inner"),
            Some(2),
            "the parent restarted the subtree"
        );
        let second = whereis::<Child>("leaf").unwrap();
        assert!(!second.same(&first));
        assert_eq!(top.restarts(), 1);
        top.stop();
        top.wait().await;
    });
}

#[test]
fn a_panicking_handler_is_an_exit_reason_and_the_core_goes_on() {
    struct Bomb;
    impl Actor for Bomb {
        type Msg = u32;
        type Reply = u32;
        async fn handle(&mut self, n: u32, _: &Context<Self>) -> u32 {
            if n == 0 {
                panic!("division by zero");
            }
            100 / n
        }
    }
    rt().block_on(async {
        let b = spawn(Bomb);
        assert_eq!(b.ask(4, Duration::from_secs(1)).await.unwrap(), 25);
        let e = b.ask(0, Duration::from_secs(1)).await.unwrap_err();
        assert!(e.to_string().contains("division by zero"), "{e}");
        assert_eq!(b.wait().await, ExitReason::Panic("division by zero".into()));
        assert!(b.tell(1).is_err());
        let other = spawn(Bomb);
        assert_eq!(other.ask(5, Duration::from_secs(1)).await.unwrap(), 20);
    });
}

/// A panic in `stopped` is the actor's exit reason, as an exception in an OTP `terminate`
/// becomes the process's: whoever waits on the actor or supervises it learns it ended, and a
/// supervisor restarts it as it would after a crash.
#[test]
fn a_panic_in_stopped_is_the_exit_reason() {
    rt().block_on(async {
        let a = spawn(Fragile::panicking_in_stopped());
        a.tell(()).unwrap();
        let reason = exit_within_5s(&a).await;
        assert_eq!(reason, ExitReason::Panic("cleanup failed".into()));
        // Stopped from outside, the same.
        let b = spawn(Fragile::panicking_in_stopped());
        b.stop(ExitReason::Shutdown);
        let reason = exit_within_5s(&b).await;
        assert_eq!(reason, ExitReason::Panic("cleanup failed".into()));
    });
}

/// An actor whose `Drop` panics (after `stopped` ran) still has a known exit: the panic.
#[test]
fn a_panic_in_an_actors_drop_is_the_exit_reason() {
    rt().block_on(async {
        let a = spawn(Fragile {
            panic_in_stopped: false,
            panic_in_drop: true,
        });
        a.tell(()).unwrap();
        let reason = exit_within_5s(&a).await;
        assert_eq!(reason, ExitReason::Panic("drop failed".into()));
    });
}

/// Stops at its first message; panics in `stopped` or in its `Drop`, as set.
struct Fragile {
    panic_in_stopped: bool,
    panic_in_drop: bool,
}

impl Fragile {
    fn panicking_in_stopped() -> Fragile {
        Fragile {
            panic_in_stopped: true,
            panic_in_drop: false,
        }
    }
}

impl Actor for Fragile {
    type Msg = ();
    type Reply = ();
    async fn handle(&mut self, _: (), ctx: &Context<Self>) {
        ctx.stop(ExitReason::Normal);
    }
    fn stopped(&mut self, _: &ExitReason) {
        if self.panic_in_stopped {
            panic!("cleanup failed");
        }
    }
}

impl Drop for Fragile {
    fn drop(&mut self) {
        if self.panic_in_drop && !std::thread::panicking() {
            panic!("drop failed");
        }
    }
}

/// How `a` ended; fails the test if that is not known within 5 s.
async fn exit_within_5s<A: Actor>(a: &ActorRef<A>) -> ExitReason {
    time::timeout(Duration::from_secs(5), a.wait())
        .await
        .expect("the actor's exit is known")
}

/// A child whose start panics (its constructor, say) counts as a child that exited with that
/// panic: the supervisor restarts it under its intensity, as OTP treats a failed restart,
/// instead of dying without an exit reason and leaving its other children unsupervised.
#[test]
fn a_panicking_child_start_counts_as_an_exit_and_is_restarted() {
    rt().block_on(async {
        let journal: Journal = Rc::default();
        let made = Rc::new(std::cell::Cell::new(0u32));
        let (m, j) = (made.clone(), journal.clone());
        let flaky = ChildSpec::actor("flaky", move || {
            m.set(m.get() + 1);
            if m.get() == 2 {
                panic!("constructor failed");
            }
            Child {
                name: "flaky".into(),
                journal: j.clone(),
            }
        });
        let sup = Supervisor::start(
            SupervisorSpec::new(Kind::OneForOne, vec![flaky]).intensity(5, Duration::from_secs(5)),
        )
        .await;
        settle().await;
        let first = whereis::<Child>("flaky").unwrap();
        first
            .tell(Cmd::Exit(ExitReason::Panic("crash".into())))
            .unwrap();
        // Restart 1 panics in the constructor; restart 2 starts it.
        let t0 = Instant::now();
        while sup.starts("flaky") != Some(3) || !sup.is_running("flaky") {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "not restarted after a failed start: starts {:?}, supervisor exit {:?}",
                sup.starts("flaky"),
                sup.exit_reason()
            );
            settle().await;
        }
        assert_eq!(made.get(), 3);
        assert_eq!(sup.restarts(), 2);
        assert_eq!(sup.exit_reason(), None);
        sup.stop();
        assert_eq!(sup.wait().await, ExitReason::Shutdown);
    });
}
