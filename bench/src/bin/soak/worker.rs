//! One worker: serves the previous rank, drives the next (see the crate docs).

use std::cell::Cell;
use std::rc::Rc;

use barewire::engine::{spawn_local, time, Runtime};
use barewire::{Align, ChannelOptions, Endpoint, Node, Region};

use super::*;

static FINAL: AtomicBool = AtomicBool::new(false);

/// A node on the transport the supervisor chose (`--driver`), its soft connections kept
/// alive with [`KEEPALIVE`] (none with `--break no-keepalive`).
pub(super) fn node() -> barewire::Result<Node> {
    let driver = std::env::var("BAREWIRE_SOAK_DRIVER").unwrap_or_else(|_| "soft".into());
    let keepalive = (!broken("no-keepalive")).then_some(KEEPALIVE);
    Node::with_config(&barewire::drivers::DriverConfig::parse(&driver, None)?.keepalive(keepalive))
}

/// The deliberate defect this worker has, if any (see `--break`).
fn broken(what: &str) -> bool {
    std::env::var("BAREWIRE_SOAK_BREAK").is_ok_and(|b| b == what)
}
static DUMP: AtomicBool = AtomicBool::new(false);

const OPTS: ChannelOptions = ChannelOptions::new(256, 16);

/// A worker's command line (`worker RANK INC RESUME LISTEN-ADDR NEXT-ADDR [NETNS]`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Its place in the ring.
    rank: usize,
    /// Its incarnation (restarts count up).
    inc: u64,
    /// Where the stream it serves resumes.
    resume: u64,
    /// Where it listens.
    listen: std::net::SocketAddr,
    /// The next worker's address.
    next: std::net::SocketAddr,
    /// The network namespace to enter first.
    netns: Option<String>,
}

pub fn main(a: Args) {
    if let Some(ns) = &a.netns {
        enter_netns(ns);
    }
    let (rank, inc, resume, listen, to) = (a.rank, a.inc, a.resume, a.listen, a.next);
    let resume = if broken("resume-zero") { 0 } else { resume };
    std::thread::spawn(|| {
        for line in std::io::stdin().lock().lines() {
            match line.as_deref() {
                Ok("final") => FINAL.store(true, Ordering::SeqCst),
                Ok("dump") => DUMP.store(true, Ordering::SeqCst),
                Ok(round) if round.starts_with("ROUND ") => {
                    rounds::COMMANDS.lock().unwrap().push(round.to_string());
                }
                _ => return,
            }
        }
    });
    let rt = Runtime::builder().cores(1).sleeping().build().unwrap();
    rt.block_on(async move {
        let node = Rc::new(node().unwrap());
        // A killed incarnation's connections may hold the port for a while (closed with
        // data unsent to a peer that is stopped or cut off, they linger in FIN-WAIT),
        // and even SO_REUSEADDR does not bind over those: try again, as a restarted
        // server must.
        let t0 = Instant::now();
        while let Err(e) = node.listen(listen) {
            if t0.elapsed() > Duration::from_secs(60) {
                say(&format!(
                    "VIOLATION cannot listen on {listen} for 60 s: {e}"
                ));
                std::process::exit(3);
            }
            time::sleep(Duration::from_millis(100)).await;
        }
        let region = Rc::new(node.region::<u64>(SLOTS, Align::CacheLine).unwrap());
        let next = Rc::new(Cell::new(resume));
        spawn_local(serve(node.clone(), region.clone(), next.clone(), inc));
        spawn_local(drive(node.clone(), to, inc));
        let mut leaked = Vec::new();
        let mut tick = Instant::now();
        let mut rounds = rounds::Rounds::new(rank, inc);
        while !DUMP.load(Ordering::SeqCst) {
            time::sleep(Duration::from_millis(20)).await;
            rounds.take_commands();
            if broken("leak") && tick.elapsed() >= Duration::from_secs(1) {
                tick = Instant::now();
                leaked.push(vec![1u8; 2 << 20]);
            }
        }
        if broken("lost-write") {
            region.set(5, 0);
        }
        let values: Vec<String> = region.to_vec().iter().map(u64::to_string).collect();
        say(&format!("DELIVERED {} {}", next.get(), mono_ns()));
        say(&format!("REGION {}", values.join(" ")));
    });
}

/// Moves this process into the named network namespace. Called first thing, while the
/// process has one thread: `setns` moves only the calling thread, and every thread made
/// later inherits its namespace.
fn enter_netns(name: &str) {
    use std::os::fd::AsRawFd;
    let ns = std::fs::File::open(format!("/run/netns/{name}"))
        .unwrap_or_else(|e| panic!("network namespace {name}: {e}"));
    // SAFETY: `ns` is an open descriptor of a network namespace, alive for the call.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(
        rc,
        0,
        "entering network namespace {name}: {}",
        std::io::Error::last_os_error()
    );
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Accepts the previous rank, again after each failure; the newest connection wins.
async fn serve(node: Rc<Node>, region: Rc<Region<u64>>, next: Rc<Cell<u64>>, inc: u64) {
    let generation = Rc::new(Cell::new(0u64));
    loop {
        let Ok(ep) = node.accept().await else {
            continue;
        };
        let g = generation.get() + 1;
        generation.set(g);
        let (region, next, generation) = (region.clone(), next.clone(), generation.clone());
        spawn_local(async move {
            let r = receive(ep, &region, &next, inc, || generation.get() == g).await;
            if r.is_err() && generation.get() == g {
                // The connection it was serving failed (no newer one had taken over).
                say(&format!("RECV-FAILED {}", mono_ns()));
            }
        });
    }
}

async fn receive(
    ep: Endpoint,
    region: &Region<u64>,
    next: &Cell<u64>,
    inc: u64,
    current: impl Fn() -> bool,
) -> barewire::Result<()> {
    ep.send_region(region).await?;
    let (tx, rx) = ep.open_channel::<[u64; 2]>(OPTS).await?;
    tx.send(&[next.get(), inc]).await?;
    tx.flush().await?;
    let mut said = Instant::now();
    let mut reported = u64::MAX;
    loop {
        let got = time::timeout(Duration::from_millis(100), rx.recv()).await;
        if !current() {
            return Ok(()); // a newer connection from the same client took over
        }
        if let Ok(m) = got {
            let [seq, check] = m?;
            if check != mix(seq) || seq != next.get() {
                say(&format!(
                    "VIOLATION expected message {} got {seq} (checksum {})",
                    next.get(),
                    if check == mix(seq) { "ok" } else { "bad" }
                ));
                std::process::exit(3);
            }
            next.set(seq + 1);
        }
        if next.get() != reported && said.elapsed() >= Duration::from_millis(50) {
            reported = next.get();
            said = Instant::now();
            say(&format!("DELIVERED {reported} {}", mono_ns()));
        }
    }
}

/// Connects to the next rank and sends to it until told to stop, reconnecting after
/// each failure.
async fn drive(node: Rc<Node>, to: std::net::SocketAddr, inc: u64) {
    // Written values only grow: this incarnation in the high bits, a counter below.
    let written = Cell::new(inc << 40);
    while !FINAL.load(Ordering::SeqCst) {
        if let Ok(Ok(ep)) = time::timeout(Duration::from_secs(2), node.connect(to)).await {
            let _ = send(ep, &written).await;
        }
        time::sleep(Duration::from_millis(50)).await;
    }
    say("SENDER-DONE");
}

async fn send(ep: Endpoint, written: &Cell<u64>) -> barewire::Result<()> {
    ep.set_handshake_timeout(Some(Duration::from_secs(2)));
    let remote = ep.recv_region::<u64>().await?;
    let (tx, rx) = ep.open_channel::<[u64; 2]>(OPTS).await?;
    let [mut seq, server_inc] = time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .map_err(|_| barewire::Error::Timeout("the resume point".into()))??;
    while !FINAL.load(Ordering::SeqCst) {
        for _ in 0..64 {
            tx.send(&[seq, mix(seq)]).await?;
            seq += 1;
        }
        if broken("dup") && seq % 100_000 < 64 {
            tx.send(&[seq - 1, mix(seq - 1)]).await?;
        }
        tx.flush().await?;
        // One WRITE per batch, into the next slot round robin.
        let v = written.get() + 1;
        written.set(v);
        let slot = v % SLOTS as u64;
        ep.write(&remote, slot, v).await?;
        say(&format!("ACKED {server_inc} {slot} {v}"));
    }
    Ok(())
}

mod rounds {
    //! Distributed shared memory and actors, in rounds (see the crate docs): one mesh
    //! per round, made for it and dropped after it.

    use std::cell::Cell;
    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::rc::Rc;
    use std::sync::Mutex;
    use std::time::Duration;

    use barewire::actor::{spawn, Actor, ActorRef, ActorSystem, Context, SystemOptions};
    use barewire::dsm::{SharedMemory, SharedOptions};
    use barewire::engine::{spawn_local, time, JoinHandle};
    use barewire::{Mesh, Node, Result};

    use super::{broken, say};
    use crate::{wide_of, wide_value, Wide, KINDS, PROCS};

    /// `ROUND <verb> <round> ...` lines from the supervisor, handed over by the stdin
    /// thread.
    pub static COMMANDS: Mutex<Vec<String>> = Mutex::new(Vec::new());

    /// How long making a round's mesh, shared objects and actor system may take.
    const FORM_WAIT: Duration = Duration::from_secs(6);
    /// How long one operation may take before the round is over for this client.
    const OP_WAIT: Duration = Duration::from_secs(3);
    /// Operations announced at a time, per home and kind, before they are issued.
    const ANNOUNCE: u64 = 16;

    /// Adds what it is told; `0` reads the total.
    struct Counter(u64);
    impl Actor for Counter {
        type Msg = u64;
        type Reply = u64;
        async fn handle(&mut self, add: u64, _: &Context<Self>) -> u64 {
            self.0 += add;
            if broken("actor-double") {
                self.0 += add; // as if each message were delivered twice
            }
            self.0
        }
    }

    /// What the supervisor has said about one round.
    #[derive(Default)]
    struct Ctl {
        end: Cell<bool>,
        read: Cell<bool>,
    }

    pub struct Rounds {
        rank: usize,
        seed: u64,
        live: HashMap<u64, (Rc<Ctl>, JoinHandle<()>)>,
    }

    impl Rounds {
        pub fn new(rank: usize, inc: u64) -> Rounds {
            Rounds {
                rank,
                seed: (rank as u64 + 1) * 0x9E37_79B9 + inc,
                live: HashMap::new(),
            }
        }

        /// `ROUND START r a0 a1 a2` | `ROUND END r` | `ROUND READ r`.
        pub fn take_commands(&mut self) {
            let cmds = std::mem::take(&mut *COMMANDS.lock().unwrap());
            self.live.retain(|_, (_, task)| !task.is_finished());
            for c in cmds {
                let w: Vec<&str> = c.split_whitespace().collect();
                let Some(r) = w.get(2).and_then(|v| v.parse::<u64>().ok()) else {
                    continue;
                };
                match w[1] {
                    "START" => {
                        let addrs: Vec<SocketAddr> =
                            w[3..].iter().filter_map(|a| a.parse().ok()).collect();
                        let ctl = Rc::new(Ctl::default());
                        self.seed = self.seed.wrapping_mul(6364136223846793005) | 1;
                        let task = spawn_local(round(r, self.rank, addrs, ctl.clone(), self.seed));
                        self.live.insert(r, (ctl, task));
                    }
                    "END" => {
                        if let Some((ctl, _)) = self.live.get(&r) {
                            ctl.end.set(true);
                        }
                    }
                    "READ" => {
                        if let Some((ctl, _)) = self.live.get(&r) {
                            ctl.read.set(true);
                        }
                    }
                    _ => {}
                }
            }
        }
    }

    /// What a round runs on.
    struct Parts {
        // Dropped last: everything below lives on its connections.
        _node: Node,
        _mesh: Mesh,
        word: SharedMemory<u64>,
        wide: SharedMemory<Wide>,
        _sys: ActorSystem,
        counter: ActorRef<Counter>,
        counters: Vec<ActorRef<Counter>>,
    }

    async fn form(rank: usize, addrs: &[SocketAddr]) -> Result<Parts> {
        let node = super::node()?;
        node.listen(addrs[rank])?;
        let mesh = Mesh::join(&node, rank, addrs).await?;
        let mut opts = SharedOptions::default();
        if broken("dsm-no-lock") {
            opts.broken = Some(barewire::dsm::Broken::NoLock);
        }
        let word = SharedMemory::<u64>::create(&node, &mesh, 0, opts).await?;
        let wide = SharedMemory::<Wide>::create(&node, &mesh, wide_of(0), opts).await?;
        // Node-down after 500 ms of silence: this machine is loaded (three busy workers
        // on two cores), and a stopped member is the fault meant here.
        let sopts = SystemOptions {
            misses: 50,
            ..SystemOptions::default()
        };
        let sys = ActorSystem::start(&mesh, sopts).await?;
        let counter = spawn(Counter(0));
        sys.register("counter", &counter)?;
        let mut counters = Vec::new();
        for h in 0..PROCS {
            // Each member registers its counter once its system is up: look again
            // until it is there.
            let mut tries = 0;
            counters.push(loop {
                match sys.lookup::<Counter>(h, "counter").await {
                    Ok(c) => break c,
                    Err(e) if tries > 100 => return Err(e),
                    Err(_) => {
                        tries += 1;
                        time::sleep(Duration::from_millis(20)).await;
                    }
                }
            });
        }
        Ok(Parts {
            _node: node,
            _mesh: mesh,
            word,
            wide,
            _sys: sys,
            counter,
            counters,
        })
    }

    /// One round: form, run operations until told to end (or one fails), report, read
    /// this node's own objects when told to, and drop everything.
    async fn round(r: u64, rank: usize, addrs: Vec<SocketAddr>, ctl: Rc<Ctl>, seed: u64) {
        let parts = match time::timeout(FORM_WAIT, form(rank, &addrs)).await {
            Ok(Ok(p)) => Some(p),
            Ok(Err(e)) => {
                say(&format!("ROUND NOTFORMED {r} {e}"));
                None
            }
            Err(_) => {
                say(&format!("ROUND NOTFORMED {r} not within {FORM_WAIT:?}"));
                None
            }
        };
        if let Some(p) = &parts {
            say(&format!("ROUND UP {r}"));
            let why = operate(r, p, &ctl, seed).await;
            say(&format!("ROUND STOPPED {r} {why}"));
        } else {
            say(&format!("ROUND STOPPED {r} not formed"));
        }
        while !ctl.read.get() {
            time::sleep(Duration::from_millis(10)).await;
        }
        let Some(p) = parts else {
            say(&format!("ROUND VALUES {r} none"));
            return;
        };
        let read = async {
            let word = p.word.read_from(rank).await?;
            let wide = p.wide.read_from(rank).await?;
            let count = p.counter.ask(0, OP_WAIT).await?;
            Ok::<_, barewire::Error>((word, wide, count))
        };
        match time::timeout(OP_WAIT, read).await {
            Ok(Ok((word, wide, count))) => match wide_value(&wide) {
                Some(w) => say(&format!("ROUND VALUES {r} {word} {w} {count}")),
                None => say(&format!("VIOLATION round {r}: a torn wide object {wide:?}")),
            },
            Ok(Err(e)) => say(&format!("ROUND VALUES {r} none {e}")),
            Err(_) => say(&format!("ROUND VALUES {r} none (no answer)")),
        }
    }

    /// Random operations on every member's objects until the round ends or one fails;
    /// returns why it stopped. Every operation is announced before it is issued and
    /// reported once it succeeded (see the crate docs).
    async fn operate(r: u64, p: &Parts, ctl: &Ctl, mut rng: u64) -> String {
        let mut announced = [[0u64; KINDS]; PROCS];
        let mut acked = [[0u64; KINDS]; PROCS];
        let mut said = std::time::Instant::now();
        let report = |acked: &[[u64; KINDS]; PROCS]| {
            for (h, a) in acked.iter().enumerate() {
                say(&format!("ROUND ACKED {r} {h} {} {} {}", a[0], a[1], a[2]));
            }
        };
        let why = loop {
            if ctl.end.get() {
                break "told to".to_string();
            }
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let (h, k) = (
                (rng % PROCS as u64) as usize,
                ((rng >> 8) % KINDS as u64) as usize,
            );
            if acked[h][k] == announced[h][k] {
                announced[h][k] += ANNOUNCE;
                say(&format!("ROUND ANNOUNCED {r} {h} {k} {}", announced[h][k]));
            }
            let op = async {
                match k {
                    0 => p.word.fetch_add(h, 1).await.map(drop),
                    1 => p
                        .wide
                        .update(h, |w| wide_of(wide_value(w).map_or(u64::MAX, |v| v + 1)))
                        .await
                        .map(drop),
                    _ => p.counters[h].ask(1, OP_WAIT).await.map(drop),
                }
            };
            match time::timeout(OP_WAIT, op).await {
                Ok(Ok(())) => acked[h][k] += 1,
                Ok(Err(e)) => break format!("{e}"),
                Err(_) => break format!("an operation took over {OP_WAIT:?}"),
            }
            if said.elapsed() >= Duration::from_millis(100) {
                said = std::time::Instant::now();
                report(&acked);
            }
        };
        report(&acked);
        why.replace('\n', " ")
    }
}
