//! Membership and failure suspicion: SWIM, from the foca library, over the engine's UDP.
//!
//! Each member runs one foca instance in a task of its core. Datagrams come from a receive
//! task that hands them over a local queue (so no receive is ever cancelled, which on io_uring
//! could swallow a datagram); foca's timers are kept in an ordered map and fired on time; what
//! foca wants sent goes out as one datagram each. Changes arrive as [`Event`]s, in order.
//!
//! SWIM finds a member down when it stops answering direct and indirect probes for
//! `suspect_to_down_after` (the defaults here: a probe every 40 ms, 20 ms to answer, down after
//! 100 ms of suspicion: about 200 ms from a member's last answer to its verdict, measured with
//! no false verdict in 10 minutes under a CPU hog, see bench/RESULTS.md), and a member that
//! comes back with a higher incarnation rejoins. After a partition heals, each side has the
//! other down: seeds that are not live members are announced to again every 500 ms, and a
//! member that hears from one it has down tells it so, which renews its incarnation and
//! rejoins (`tests/membership_procs.rs`: killed, paused, cut off, each back again).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU8};
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use barewire_engine::net::UdpSocket;
use barewire_engine::sync::{mpsc, oneshot};
use barewire_engine::{spawn_local, time, JoinHandle};
use foca::{AccumulatingRuntime, Config, Foca, Notification, PostcardCodec, Timer};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A member as SWIM knows it: its rank, the UDP address it answers on, and its incarnation
/// (raised when it rejoins, so the cluster can tell the new life from the old).
///
/// ```
/// use barewire::cluster::Member;
/// // Rank 2 after its first restart: a port of its own choosing (see `Membership::start`).
/// let me = Member { rank: 2, addr: "127.0.0.1:0".parse().unwrap(), incarnation: 1 };
/// assert_eq!(me.addr.port(), 0);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Member {
    /// Its rank in the job.
    pub rank: u32,
    /// Where its membership traffic goes.
    pub addr: SocketAddr,
    /// Its life: a restarted member comes back with a higher one.
    pub incarnation: u32,
}

impl foca::Identity for Member {
    type Addr = SocketAddr;
    fn renew(&self) -> Option<Self> {
        Some(Member {
            incarnation: self.incarnation.wrapping_add(1),
            ..self.clone()
        })
    }
    fn addr(&self) -> SocketAddr {
        self.addr
    }
    fn win_addr_conflict(&self, other: &Self) -> bool {
        self.incarnation > other.incarnation
    }
}

/// A change of membership.
///
/// ```
/// use barewire::cluster::{Event, Member, Membership, MembershipOptions};
/// use barewire::engine::time::timeout;
/// use std::time::Duration;
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// let member = |rank| Member { rank, addr: "127.0.0.1:0".parse().unwrap(), incarnation: 0 };
/// let opts = MembershipOptions::default();
/// let mut first = Membership::start(member(0), &[], opts).unwrap();
/// let second = Membership::start(member(1), &[first.local_addr()], opts).unwrap();
/// let up = timeout(Duration::from_secs(5), first.next_event()).await.unwrap();
/// assert!(matches!(up, Some(Event::Up(m)) if m.rank == 1));
/// second.leave().await;
/// let down = timeout(Duration::from_secs(5), first.next_event()).await.unwrap();
/// assert!(matches!(down, Some(Event::Down(m)) if m.rank == 1));
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A member is up (joined, or came back).
    Up(Member),
    /// A member is down (it stopped answering, or left).
    Down(Member),
}

/// What the driver task waits for besides its timers.
enum Input {
    Datagram(Vec<u8>),
    Leave(oneshot::Sender<()>),
}

/// How often seeds that are not live members are announced to again.
const REANNOUNCE: Duration = Duration::from_millis(500);

/// SWIM's timing, tighter than a LAN default: this is for one rack, not a data centre.
///
/// ```
/// use barewire::cluster::MembershipOptions;
/// use std::time::Duration;
/// // Across a slower network: probe less often, give suspects longer to refute.
/// let wan = MembershipOptions {
///     probe_period: Duration::from_millis(500),
///     probe_rtt: Duration::from_millis(200),
///     suspect_to_down_after: Duration::from_secs(3),
/// };
/// assert!(wan.suspect_to_down_after > MembershipOptions::default().suspect_to_down_after);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct MembershipOptions {
    /// How often a member probes another.
    pub probe_period: Duration,
    /// How long a probe may take before indirect probes are tried.
    pub probe_rtt: Duration,
    /// How long a suspect has to refute before it is declared down.
    pub suspect_to_down_after: Duration,
}

impl MembershipOptions {
    /// Timings SWIM cannot run with, as an error that names them: a probe must have a period
    /// and a round trip, and the round trip must end before the next probe starts.
    fn check(&self) -> Result<()> {
        let (period, rtt, suspect) = (
            self.probe_period,
            self.probe_rtt,
            self.suspect_to_down_after,
        );
        if period.is_zero() || rtt.is_zero() || suspect.is_zero() || rtt >= period {
            return Err(Error::Invalid(format!(
                "MembershipOptions: probe_period {period:?}, probe_rtt {rtt:?} and \
                 suspect_to_down_after {suspect:?} must all be longer than zero, with \
                 probe_rtt shorter than probe_period"
            )));
        }
        Ok(())
    }
}

impl Default for MembershipOptions {
    fn default() -> Self {
        MembershipOptions {
            probe_period: Duration::from_millis(40),
            probe_rtt: Duration::from_millis(20),
            suspect_to_down_after: Duration::from_millis(90),
        }
    }
}

/// This member's view of the cluster, kept current by a task of this core.
///
/// ```no_run
/// # async fn demo() -> barewire::Result<()> {
/// use barewire::cluster::{Event, Member, Membership, MembershipOptions};
/// let me = Member { rank: 1, addr: "0.0.0.0:7700".parse().unwrap(), incarnation: 0 };
/// let seed = "10.0.0.1:7700".parse().unwrap();
/// let mut m = Membership::start(me, &[seed], MembershipOptions::default())?;
/// while let Some(e) = m.next_event().await {
///     match e {
///         Event::Up(x) => println!("rank {} is up", x.rank),
///         Event::Down(x) => println!("rank {} is down", x.rank),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Membership {
    inputs: mpsc::Sender<Input>,
    events: mpsc::Receiver<Event>,
    members: Rc<RefCell<Vec<Member>>>,
    local: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.cancel();
        }
    }
}

impl Membership {
    /// Starts SWIM as member `me` (its `addr` is bound here; port 0 picks one, see
    /// [`local_addr`](Self::local_addr)) and announces it to `seeds`.
    pub fn start(me: Member, seeds: &[SocketAddr], opts: MembershipOptions) -> Result<Membership> {
        opts.check()?;
        // Gossip is control traffic: its receive waits relaxed (no system call per pass on a
        // busy epoll core; some microseconds late at worst, against probes of milliseconds).
        let sock = UdpSocket::bind_relaxed(me.addr)
            .map_err(|e| Error::Invalid(format!("membership: binding {}: {e}", me.addr)))?;
        let local = sock
            .local_addr()
            .map_err(|e| Error::Invalid(e.to_string()))?;
        let me = Member { addr: local, ..me };
        let mut config = Config::new_lan(NonZeroU32::new(16).unwrap());
        config.probe_period = opts.probe_period;
        config.probe_rtt = opts.probe_rtt;
        config.suspect_to_down_after = opts.suspect_to_down_after;
        config.max_transmissions = NonZeroU8::new(10).unwrap();
        config.periodic_announce = Some(foca::PeriodicParams {
            frequency: Duration::from_millis(500),
            num_members: std::num::NonZeroUsize::new(2).unwrap(),
        });
        // After a partition heals, each side has the other down and ignores it: telling a
        // down member so (TurnUndead) makes it renew its identity and rejoin.
        config.notify_down_members = true;
        config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
            frequency: Duration::from_millis(500),
            num_members: std::num::NonZeroUsize::new(2).unwrap(),
        });
        let foca = Foca::new(me.clone(), config, StdRng::from_entropy(), PostcardCodec);
        let sock = Rc::new(sock);
        let (data_tx, data_rx) = mpsc::unbounded::<Input>();
        let (event_tx, event_rx) = mpsc::unbounded::<Event>();
        let members = Rc::new(RefCell::new(Vec::new()));
        let inputs = data_tx.clone();
        let receiver = {
            let sock = sock.clone();
            spawn_local(async move {
                loop {
                    let (r, buf) = sock.recv_from(vec![0u8; 1500]).await;
                    match r {
                        Ok((n, _)) => {
                            let mut buf = buf;
                            buf.truncate(n);
                            if data_tx.try_send(Input::Datagram(buf)).is_err() {
                                break;
                            }
                        }
                        Err(_) => time::sleep(Duration::from_millis(1)).await,
                    }
                }
            })
        };
        let seeds: Vec<SocketAddr> = seeds.iter().copied().filter(|s| *s != local).collect();
        let driver = spawn_local(drive(foca, sock, data_rx, event_tx, members.clone(), seeds));
        Ok(Membership {
            inputs,
            events: event_rx,
            members,
            local,
            tasks: vec![receiver, driver],
        })
    }

    /// Where this member's SWIM traffic goes.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The members this one considers up now (itself excluded).
    pub fn members(&self) -> Vec<Member> {
        self.members.borrow().clone()
    }

    /// Leaves the cluster: the others learn this member is down at once (from the members it
    /// tells, then by gossip) instead of after the failure detector's suspicion. Its
    /// membership stops.
    pub async fn leave(self) {
        let (tx, rx) = oneshot::channel();
        if self.inputs.try_send(Input::Leave(tx)).is_ok() {
            let _ = rx.await;
        }
    }

    /// The next membership change.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }
}

async fn drive(
    mut foca: Foca<Member, PostcardCodec, StdRng, foca::NoCustomBroadcast>,
    sock: Rc<UdpSocket>,
    mut data: mpsc::Receiver<Input>,
    events: mpsc::Sender<Event>,
    members: Rc<RefCell<Vec<Member>>>,
    seeds: Vec<SocketAddr>,
) {
    let mut rt = AccumulatingRuntime::new();
    let mut timers: BTreeMap<(Instant, u64), Timer<Member>> = BTreeMap::new();
    let mut seq = 0u64;
    // A seed is known by its address; foca learns its identity from its answer.
    let announce = |foca: &mut Foca<_, _, _, _>, rt: &mut AccumulatingRuntime<Member>, s| {
        let seed = Member {
            rank: u32::MAX,
            addr: s,
            incarnation: 0,
        };
        let _ = foca.announce(seed, rt);
    };
    for s in &seeds {
        announce(&mut foca, &mut rt, *s);
    }
    let mut next_reannounce = Instant::now() + REANNOUNCE;
    loop {
        // Seeds not among the live members are announced to again: after a partition heals
        // each side has the other down and ignores it, and a member cut off from everyone has
        // nobody left to probe. The seed answers a down identity with TurnUndead (it renews
        // its incarnation and rejoins) or takes the announce and feeds back the members.
        if Instant::now() >= next_reannounce {
            next_reannounce = Instant::now() + REANNOUNCE;
            let live: Vec<SocketAddr> = foca.iter_members().map(|m| m.id().addr).collect();
            for s in seeds.iter().filter(|s| !live.contains(s)) {
                announce(&mut foca, &mut rt, *s);
            }
        }
        // Everything foca asked for since the last turn.
        while let Some((to, bytes)) = rt.to_send() {
            let (_, _) = sock.send_to(bytes.to_vec(), to.addr).await;
        }
        while let Some((after, timer)) = rt.to_schedule() {
            seq += 1;
            timers.insert((Instant::now() + after, seq), timer);
        }
        while let Some(n) = rt.to_notify() {
            let e = match n {
                Notification::MemberUp(m) => Some(Event::Up(m)),
                Notification::MemberDown(m) => Some(Event::Down(m)),
                _ => None,
            };
            *members.borrow_mut() = foca.iter_members().map(|m| m.id().clone()).collect();
            if let Some(e) = e {
                let _ = events.try_send(e);
            }
        }
        // Wait for a datagram or the next timer (ours included).
        let next = timers
            .keys()
            .next()
            .map_or(next_reannounce, |(t, _)| (*t).min(next_reannounce));
        let mut sleep = pin!(time::sleep_until(next));
        let got = {
            let mut recv = pin!(data.recv());
            poll_fn(|cx| {
                if let Poll::Ready(d) = recv.as_mut().poll(cx) {
                    return Poll::Ready(Some(d));
                }
                if sleep.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await
        };
        match got {
            Some(Some(Input::Datagram(d))) => {
                let _ = foca.handle_data(&d, &mut rt);
            }
            Some(Some(Input::Leave(done))) => {
                // Tell a few members this identity is down, send it, and stop.
                let _ = foca.leave_cluster(&mut rt);
                while let Some((to, bytes)) = rt.to_send() {
                    let (_, _) = sock.send_to(bytes.to_vec(), to.addr).await;
                }
                let _ = done.send(());
                break;
            }
            Some(None) => break,
            None => {
                let now = Instant::now();
                while let Some(entry) = timers.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let timer = entry.remove();
                    let _ = foca.handle_timer(timer, &mut rt);
                }
            }
        }
    }
}
