//! Actors on another core of the same process: started there, reached from here, in order,
//! with replies, stops and panics reported back.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use barewire::actor::{spawn_on_core, Actor, Context, ExitReason};
use barewire::engine::{current_core, Runtime};

struct Tally {
    n: u64,
}

enum Msg {
    Add(u64),
    Get,
    Boom,
}

impl Actor for Tally {
    type Msg = Msg;
    type Reply = (u64, usize);
    async fn handle(&mut self, m: Msg, _: &Context<Self>) -> (u64, usize) {
        match m {
            Msg::Add(k) => self.n += k,
            Msg::Get => {}
            Msg::Boom => panic!("boom on core {}", current_core()),
        }
        (self.n, current_core())
    }
}

const ASK: Duration = Duration::from_secs(5);

/// Two cores that sleep when idle (test binaries share the machine's CPUs).
fn two_cores() -> Runtime {
    Runtime::builder().cores(2).sleeping().build().unwrap()
}

#[test]
fn an_actor_on_another_core_runs_there_in_order_and_reports_its_exit() {
    two_cores().block_on(async {
        let t = spawn_on_core(1, || Tally { n: 0 });
        assert_eq!(t.core(), Some(1));
        for k in 1..=10_000 {
            t.tell(Msg::Add(k)).unwrap();
        }
        // Everything told before the ask was handled first, on core 1.
        assert_eq!(t.ask(Msg::Get, ASK).await.unwrap(), (50_005_000, 1));
        t.stop(ExitReason::Shutdown);
        assert_eq!(t.wait().await, ExitReason::Shutdown);
        assert!(t.tell(Msg::Get).is_err());

        let u = spawn_on_core(1, || Tally { n: 7 });
        assert!(u.ask(Msg::Boom, ASK).await.is_err());
        assert_eq!(u.wait().await, ExitReason::Panic("boom on core 1".into()));
        // Core 1 goes on.
        let v = spawn_on_core(1, || Tally { n: 1 });
        assert_eq!(v.ask(Msg::Add(1), ASK).await.unwrap(), (2, 1));
        assert_eq!(current_core(), 0);
    });
}

/// Holds its messages until `OPEN`; records the longest mailbox it saw and what it handled.
struct Slow;
static OPEN: AtomicBool = AtomicBool::new(false);
static LONGEST: AtomicUsize = AtomicUsize::new(0);
static HANDLED: AtomicU64 = AtomicU64::new(0);

impl Actor for Slow {
    type Msg = u64;
    type Reply = u64;
    async fn handle(&mut self, n: u64, ctx: &Context<Self>) -> u64 {
        while !OPEN.load(Ordering::SeqCst) {
            barewire::engine::time::sleep(Duration::from_millis(1)).await;
        }
        let queued = ctx.myself().queued().unwrap();
        LONGEST.fetch_max(queued, Ordering::SeqCst);
        // In order: message n is the n-th handled.
        assert_eq!(HANDLED.fetch_add(1, Ordering::SeqCst), n);
        n
    }
}

#[test]
fn a_slow_actor_on_another_core_leaves_its_backlog_on_the_sending_core() {
    const SENT: u64 = 5_000;
    two_cores().block_on(async {
        let s = spawn_on_core(1, || Slow);
        for n in 0..SENT {
            s.tell(n).unwrap();
            if n % 256 == 0 {
                barewire::engine::yield_now().await;
            }
        }
        // Give the pump and the forwarder time to move what they will.
        barewire::engine::time::sleep(Duration::from_millis(100)).await;
        // At most the ring (1,024), the mailbox's 1,024, the one in the handler and one
        // in the hand of each task between went on; the rest waits here, counted.
        let here = s.queued().unwrap() as u64;
        assert!(
            (SENT - 2 * 1024 - 3..=SENT).contains(&here),
            "{here} of {SENT} wait on the sending core"
        );
        OPEN.store(true, Ordering::SeqCst);
        assert_eq!(s.ask(SENT, ASK).await.unwrap(), SENT);
        assert_eq!(HANDLED.load(Ordering::SeqCst), SENT + 1);
        let longest = LONGEST.load(Ordering::SeqCst);
        assert!(longest <= 1024, "core 1's mailbox held {longest}");
        assert_eq!(s.queued(), Some(0));
    });
}
