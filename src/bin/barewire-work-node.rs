//! barewire-work-node: one member of a cluster that runs workflows, for the fault tests of
//! `submit_work` and for trying them by hand.
//!
//! ```text
//! barewire-work-node --rank R [--bind IP[:PORT]] [--cores N] [--labels k=v,...] [--swim]
//! ```
//!
//! Handshake as every member program (`READY <port>`, then `ADDRS ...`); then it joins the
//! mesh, starts its actor system (node-down from SWIM membership with `--swim`, from the
//! heartbeat deadline otherwise) and its part of the cluster, offering N workers (default 2)
//! and the labels given, creates three shared arrays of u64 (`effects`, `applied`, `runs`; 64
//! elements per member) and registers two tasks:
//!
//! - `effect (slot, value, hold_ms)`: counts the run in `runs[slot]`, sets `effects[slot]` to
//!   `value` if it is still 0 and, only if it did, counts that in `applied[slot]` (an
//!   idempotent effect: a second run changes nothing); prints `EFFECT <slot>`; holds `hold_ms`
//!   milliseconds; returns `value`;
//! - `sum ()`: the sum of its inputs.
//!
//! - `effect-naive`: the same, except that it sets the value and counts it as applied every
//!   time: the deliberately broken variant the fault test must catch.
//!
//! It prints `STARTED`, and `DOWN <rank>` for each member declared down. On
//! `WORK <tasks> <hold_ms> <victim> [naive]` it submits a workflow: first one `effect` that is not
//! idempotent and needs label `role=victim`, then a `sum` depending on it, then `<tasks>`
//! idempotent `effect`s (`effect-naive` with `naive`; slots homed away from `<victim>`), then a `sum` of those. It prints
//! `RESULT <index> ok <value> on <ranks>` or `RESULT <index> err <error>` per task, then
//! `STATE <slot> <effects> <applied> <runs>` per `effect` task, then `WORKED`. It leaves at
//! `EXIT` or the end of its input.

use std::rc::Rc;
use std::time::Duration;

use barewire::actor::{ActorSystem, Detector, SystemOptions};
use barewire::cluster::{
    parse_labels, Cluster, Member, Membership, MembershipOptions, Needs, Resources, Task, Workflow,
};
use barewire::dsm::{SharedArray, SharedOptions};
use barewire::engine::time;
use barewire::{Error, Mesh, Node, Result};

mod member;
use member::{arg, say};

struct Arrays {
    effects: SharedArray<u64>,
    applied: SharedArray<u64>,
    runs: SharedArray<u64>,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(rank) = arg(&args, "--rank").and_then(|r| r.parse::<usize>().ok()) else {
        eprintln!("usage: barewire-work-node --rank R [--bind IP[:PORT]] [--cores N] [--labels k=v,...] [--swim]");
        std::process::exit(2);
    };
    if let Err(e) = member::runtime().block_on(run(rank, &args)) {
        eprintln!("barewire-work-node: {e}");
        std::process::exit(1);
    }
}

async fn run(rank: usize, args: &[String]) -> Result<()> {
    let node = Node::new()?;
    let bind = arg(args, "--bind").unwrap_or_else(|| "127.0.0.1".into());
    let addrs = member::handshake(&node, &bind)?;
    let (cmd_rx, exit) = member::commands();
    let swim = args.iter().any(|a| a == "--swim");
    let mesh = Mesh::join(&node, rank, &addrs).await?;
    let mut opts = SystemOptions::default();
    if swim {
        opts.detector = Detector::Membership;
    }
    let sys = ActorSystem::start(&mesh, opts).await?;
    if swim {
        let me = Member {
            rank: rank as u32,
            addr: addrs[rank],
            incarnation: 0,
        };
        sys.follow(Membership::start(me, &addrs, MembershipOptions::default())?);
    }
    let mut offer = Resources::detect(&node)?;
    if let Some(n) = arg(args, "--cores") {
        offer.cores = n
            .parse()
            .map_err(|_| Error::Invalid(format!("--cores {n}")))?;
    } else {
        offer.cores = 2;
    }
    if let Some(l) = arg(args, "--labels") {
        offer.labels.extend(parse_labels(&l)?);
    }
    let len = 64 * mesh.size() as u64;
    let so = SharedOptions::default();
    let arrays = Rc::new(Arrays {
        effects: SharedArray::create(&node, &mesh, len, 0u64, so).await?,
        applied: SharedArray::create(&node, &mesh, len, 0u64, so).await?,
        runs: SharedArray::create(&node, &mesh, len, 0u64, so).await?,
    });
    let cluster = Cluster::over(node, mesh, sys.clone(), offer).await?;
    let a = arrays.clone();
    cluster.register_task(
        "effect",
        move |(slot, value, hold_ms): (u64, u64, u64), ctx| {
            let a = a.clone();
            async move {
                let r = async {
                    a.runs.fetch_add(slot, 1).await?;
                    if a.effects.compare_and_swap(slot, 0, value).await? == 0 {
                        a.applied.fetch_add(slot, 1).await?;
                    }
                    Ok::<_, Error>(())
                }
                .await;
                r.map_err(|e| format!("effect on slot {slot}: {e}"))?;
                say(&format!("EFFECT {slot} attempt {}", ctx.attempt()));
                time::sleep(Duration::from_millis(hold_ms)).await;
                Ok(value)
            }
        },
    );
    // The deliberately broken variant: declared idempotent by `WORK ... naive`, but its
    // effect is not (it counts every run as applied), so a re-run shows twice.
    let a = arrays.clone();
    cluster.register_task(
        "effect-naive",
        move |(slot, value, hold_ms): (u64, u64, u64), _ctx| {
            let a = a.clone();
            async move {
                let r = async {
                    a.runs.fetch_add(slot, 1).await?;
                    a.effects.put(slot, value).await?;
                    a.applied.fetch_add(slot, 1).await?;
                    Ok::<_, Error>(())
                }
                .await;
                r.map_err(|e| format!("effect on slot {slot}: {e}"))?;
                say(&format!("EFFECT {slot}"));
                time::sleep(Duration::from_millis(hold_ms)).await;
                Ok(value)
            }
        },
    );
    cluster.register_task("sum", |(): (), ctx| async move {
        Ok(ctx
            .inputs::<u64>()
            .map_err(|e| e.to_string())?
            .iter()
            .sum::<u64>())
    });
    let _downs = member::print_downs(&sys);
    say("STARTED");
    while !member::exiting(&exit) {
        while let Ok(cmd) = cmd_rx.try_recv() {
            let w: Vec<u64> = cmd
                .split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect();
            if cmd.starts_with("WORK ") && w.len() == 3 {
                let task = if cmd.ends_with(" naive") {
                    "effect-naive"
                } else {
                    "effect"
                };
                work(&cluster, &arrays, task, w[0], w[1], w[2] as usize).await?;
            }
        }
        time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

async fn work(
    cluster: &Cluster,
    a: &Arrays,
    task: &str,
    tasks: u64,
    hold_ms: u64,
    victim: usize,
) -> Result<()> {
    let mut slots = (0..a.effects.len()).filter(|s| a.effects.home_of(*s) != victim);
    let mut next_slot = || {
        slots
            .next()
            .ok_or_else(|| Error::Invalid("more tasks than shared slots".into()))
    };
    let value = |slot: u64| 1000 + slot * 7;
    let mut wf = Workflow::new();
    let mut effect_slots = Vec::new();
    let s = next_slot()?;
    effect_slots.push((0, s));
    let lost = wf.add(
        Task::<u64>::new("effect", &(s, value(s), hold_ms * 4))
            .needs(Needs::default().label("role", "victim")),
    );
    let mut all = vec![lost, wf.add(Task::<u64>::new("sum", &()).after(lost))];
    let mut parts = Vec::new();
    for _ in 0..tasks {
        let s = next_slot()?;
        let t = wf.add(Task::<u64>::new(task, &(s, value(s), hold_ms)).idempotent());
        effect_slots.push((t.index(), s));
        parts.push(t);
    }
    all.extend(&parts);
    all.push(wf.add(Task::<u64>::new("sum", &()).after_all(&parts)));
    let r = cluster.submit_work(wf).await?;
    for id in all {
        let i = id.index();
        match r.get(id) {
            Ok(v) => {
                let on: Vec<String> = r.ran_on(id).iter().map(|n| n.to_string()).collect();
                say(&format!("RESULT {i} ok {v} on {}", on.join(",")))
            }
            Err(e) => say(&format!("RESULT {i} err {e}")),
        }
    }
    for (_, s) in effect_slots {
        say(&format!(
            "STATE {s} {} {} {}",
            a.effects.get(s).await?,
            a.applied.get(s).await?,
            a.runs.get(s).await?
        ));
    }
    say("WORKED");
    Ok(())
}
