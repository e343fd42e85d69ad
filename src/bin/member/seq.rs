//! `Seq`: checks sequence numbers per sender, (sender, n) must come as 0, 1, 2, ... from each;
//! `(u64::MAX, _)` asks for (messages seen, messages out of order). Migratable. Shared by
//! `barewire-actor-node` and tests/actor_remote.rs (which moves one under load).

use barewire::actor::{Actor, Context};

#[derive(Default, serde::Serialize, serde::Deserialize)]
pub struct Seq {
    next: std::collections::BTreeMap<u64, u64>,
    total: u64,
    bad: u64,
}

impl Actor for Seq {
    type Msg = (u64, u64);
    type Reply = (u64, u64);
    async fn handle(&mut self, (sender, n): (u64, u64), _: &Context<Self>) -> (u64, u64) {
        if sender != u64::MAX {
            let next = self.next.entry(sender).or_insert(0);
            if n != *next {
                self.bad += 1;
            }
            *next = n + 1;
            self.total += 1;
        }
        (self.total, self.bad)
    }
}

impl barewire::actor::Migratable for Seq {}
