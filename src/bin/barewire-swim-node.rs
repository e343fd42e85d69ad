//! barewire-swim-node: one SWIM member (barewire's `Membership`, foca over the engine's UDP)
//! and nothing else, for the membership tests across processes and for trying partitions by
//! hand.
//!
//! ```text
//! barewire-swim-node --rank R --bind IP:PORT [--seeds IP:PORT,...] [--incarnation N]
//! ```
//!
//! It prints `STARTED`, then `UP <rank> <incarnation>` and `DOWN <rank> <incarnation>` for each
//! membership change it sees, until standard input says `EXIT` or closes; then it leaves the
//! cluster (the others learn at once) and prints `LEFT`.

use std::time::Duration;

use barewire::cluster::{Event, Member, Membership, MembershipOptions};
use barewire::engine::time;
use barewire::{Error, Result};

mod member;
use member::{arg, say};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(rank), Some(bind)) = (
        arg(&args, "--rank").and_then(|r| r.parse::<u32>().ok()),
        arg(&args, "--bind"),
    ) else {
        eprintln!("usage: barewire-swim-node --rank R --bind IP:PORT [--seeds IP:PORT,...] [--incarnation N]");
        std::process::exit(2);
    };
    if let Err(e) = member::runtime().block_on(run(rank, &bind, &args)) {
        eprintln!("barewire-swim-node: {e}");
        std::process::exit(1);
    }
}

async fn run(rank: u32, bind: &str, args: &[String]) -> Result<()> {
    let addr = bind
        .parse()
        .map_err(|e| Error::Invalid(format!("--bind {bind}: {e}")))?;
    let seeds = arg(args, "--seeds")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|e| Error::Invalid(format!("seed {s}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let incarnation = arg(args, "--incarnation").map_or(Ok(0), |n| {
        n.parse()
            .map_err(|_| Error::Invalid(format!("--incarnation {n}")))
    })?;
    let (_, exit) = member::commands();
    let me = Member {
        rank,
        addr,
        incarnation,
    };
    let mut m = Membership::start(me, &seeds, MembershipOptions::default())?;
    say("STARTED");
    while !member::exiting(&exit) {
        if let Ok(Some(e)) = time::timeout(Duration::from_millis(20), m.next_event()).await {
            match e {
                Event::Up(x) => say(&format!("UP {} {}", x.rank, x.incarnation)),
                Event::Down(x) => say(&format!("DOWN {} {}", x.rank, x.incarnation)),
            }
        }
    }
    m.leave().await;
    say("LEFT");
    Ok(())
}
