//! Actors on another core of the same process: started there, reached from here, in order,
//! with replies, stops and panics reported back.

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

#[test]
fn an_actor_on_another_core_runs_there_in_order_and_reports_its_exit() {
    Runtime::builder()
        .cores(2)
        .sleeping()
        .build()
        .unwrap()
        .block_on(async {
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
