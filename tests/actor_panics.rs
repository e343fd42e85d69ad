//! `actor::report_panics_with`: a panic inside an actor is reported from the reporter thread,
//! not through the hook installed before; every other panic still goes to that hook. (Its own
//! test binary: the panic hook is the process's.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use barewire::actor::{spawn, Actor, Context, ExitReason};
use barewire_test_support::rt;

struct Boom;

impl Actor for Boom {
    type Msg = ();
    type Reply = ();
    async fn handle(&mut self, _: (), _: &Context<Self>) {
        if std::hint::black_box(true) {
            panic!("boom in a handler");
        }
    }
}

static BEFORE: AtomicUsize = AtomicUsize::new(0);

#[test]
fn an_actors_panic_is_reported_off_its_core_and_other_panics_go_to_the_hook_before() {
    std::panic::set_hook(Box::new(|_| {
        BEFORE.fetch_add(1, Ordering::SeqCst);
    }));
    let (tx, rx) = mpsc::channel();
    barewire::actor::report_panics_with(move |report| {
        let _ = tx.send((std::thread::current().name().map(str::to_string), report));
    });

    let reason = rt().block_on(async {
        let a = spawn(Boom);
        a.tell(()).unwrap();
        a.wait().await
    });
    assert!(
        matches!(&reason, ExitReason::Panic(m) if m == "boom in a handler"),
        "{reason:?}"
    );
    let (thread, report) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the actor's panic was reported");
    assert_eq!(thread.as_deref(), Some("barewire-panics"));
    assert!(report.contains("boom in a handler"), "{report}");
    assert!(report.contains("tests/actor_panics.rs"), "{report}");
    assert_eq!(
        BEFORE.load(Ordering::SeqCst),
        0,
        "the actor's panic reached the old hook"
    );

    // A panic outside any actor goes to the hook installed before.
    assert!(std::panic::catch_unwind(|| panic!("not an actor")).is_err());
    assert_eq!(BEFORE.load(Ordering::SeqCst), 1);
    assert!(
        rx.try_recv().is_err(),
        "a panic outside an actor was reported"
    );
}
