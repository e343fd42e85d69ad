use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Sources are forgotten once this many are remembered and they have nothing recent.
const REMEMBERED: usize = 4096;

/// Protection violations per source (an address, a process), and the bans they earn: a source
/// that commits `budget` violations within `window` is refused for `ban`. What a listener
/// keeps so that guessing keys by reconnecting goes no faster than that allows. Belongs to one
/// core; bounded (sources with nothing recent are forgotten as the map grows).
///
/// ```
/// use std::time::{Duration, Instant};
/// use barewire_engine::net::Strikes;
/// let s = Strikes::new(2, Duration::from_secs(10), Duration::from_secs(60));
/// let t = Instant::now();
/// assert!(!s.strike("10.0.0.1", t));
/// assert!(s.strike("10.0.0.1", t + Duration::from_secs(1))); // the second within 10 s
/// assert!(s.banned(&"10.0.0.1", t + Duration::from_secs(30)));
/// assert!(!s.banned(&"10.0.0.1", t + Duration::from_secs(62)));
/// assert!(!s.banned(&"10.0.0.2", t));
/// ```
pub struct Strikes<K> {
    sources: RefCell<HashMap<K, Record>>,
    budget: usize,
    window: Duration,
    ban: Duration,
}

#[derive(Default)]
struct Record {
    recent: VecDeque<Instant>,
    banned_until: Option<Instant>,
}

impl<K: Eq + Hash> Strikes<K> {
    /// `budget` violations (at least 1) within `window` earn a ban of `ban`.
    pub fn new(budget: usize, window: Duration, ban: Duration) -> Strikes<K> {
        Strikes {
            sources: RefCell::new(HashMap::new()),
            budget: budget.max(1),
            window,
            ban,
        }
    }

    /// `source` broke a protection rule at `now`; true if that spent its budget (it is now
    /// banned).
    pub fn strike(&self, source: K, now: Instant) -> bool {
        let mut sources = self.sources.borrow_mut();
        if sources.len() >= REMEMBERED {
            let window = self.window;
            sources.retain(|_, r| {
                r.banned_until.is_some_and(|t| t > now)
                    || r.recent
                        .back()
                        .is_some_and(|t| now.duration_since(*t) < window)
            });
        }
        let r = sources.entry(source).or_default();
        r.recent.push_back(now);
        while r
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > self.window)
        {
            r.recent.pop_front();
        }
        if r.recent.len() >= self.budget {
            r.banned_until = Some(now + self.ban);
            r.recent.clear();
            return true;
        }
        false
    }

    /// True while `source` is serving a ban at `now`.
    pub fn banned(&self, source: &K, now: Instant) -> bool {
        self.sources
            .borrow()
            .get(source)
            .and_then(|r| r.banned_until)
            .is_some_and(|t| t > now)
    }
}
