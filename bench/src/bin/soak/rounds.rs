//! Distributed shared memory and actor rounds: what the supervisor tracks of each, and the
//! summary it judges them by (see the crate docs).

use super::*;

/// How long a DSM and actor round runs its operations; twice this for its members to stop.
pub(super) const ROUND_TIME: Duration = Duration::from_secs(5);

/// The round in progress.
pub(super) struct Round {
    pub(super) r: u64,
    pub(super) phase: Phase,
    /// When the phase began.
    pub(super) since: Instant,
    /// Each rank's incarnation when the round began: a member restarted since is not in it.
    pub(super) incs: [u64; PROCS],
}

pub(super) enum Phase {
    /// Members form the round's mesh and run operations.
    Running,
    /// Told to end; waiting for every member to say it stopped.
    Ending,
    /// Told to read their own objects; waiting for the values.
    Reading,
}

/// What the workers said about one round.
#[derive(Default)]
pub(super) struct RoundSeen {
    pub(super) up: [bool; PROCS],
    pub(super) stopped: [bool; PROCS],
    /// Indexed `[client][home][kind]`: operations announced (at most this many issued).
    pub(super) announced: [[[u64; KINDS]; PROCS]; PROCS],
    /// Indexed `[client][home][kind]`: operations that succeeded.
    pub(super) acked: [[[u64; KINDS]; PROCS]; PROCS],
    /// Per home: its word, wide counter and actor total at the end (None: not read).
    pub(super) values: [Option<Option<[u64; KINDS]>>; PROCS],
    /// Every member stopped before the values were read.
    pub(super) judged: bool,
    pub(super) why: Vec<String>,
}

/// The rounds so far.
#[derive(Default)]
pub(super) struct RoundsSummary {
    pub(super) started: u64,
    pub(super) formed: u64,
    pub(super) judged: u64,
    /// Homes judged, and operations acknowledged on them, per kind.
    pub(super) homes: u64,
    pub(super) ops: [u64; KINDS],
    /// Homes not judged: restarted during the round, or not read.
    pub(super) homes_lost: u64,
    pub(super) stops: HashMap<String, u64>,
}

impl RoundsSummary {
    /// Checks one round: on every home that lived through it and was read, each kind's value
    /// is at least what clients saw succeed and at most what they announced. An operation
    /// that failed or whose client died may or may not have taken effect; none may take
    /// effect twice, and none that succeeded may be lost.
    pub(super) fn judge(
        &mut self,
        r: u64,
        seen: &RoundSeen,
        alive: [bool; PROCS],
        v: &mut Vec<String>,
    ) {
        for why in &seen.why {
            // "rank 1: told to" -> "told to"; errors keep their first words only.
            let key: String = why.split(": ").skip(1).collect::<Vec<_>>().join(": ");
            let key: String = key.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
            *self.stops.entry(key).or_default() += 1;
        }
        if seen.up.iter().all(|&u| u) {
            self.formed += 1;
        }
        if !seen.judged {
            return;
        }
        self.judged += 1;
        for (h, (value, alive)) in seen.values.iter().zip(alive).enumerate() {
            let Some(Some(values)) = value.filter(|_| alive) else {
                self.homes_lost += 1;
                continue;
            };
            self.homes += 1;
            for (k, &value) in values.iter().enumerate() {
                let lo: u64 = (0..PROCS).map(|c| seen.acked[c][h][k]).sum();
                let hi: u64 = (0..PROCS).map(|c| seen.announced[c][h][k]).sum();
                self.ops[k] += lo;
                if value < lo || value > hi {
                    v.push(format!(
                        "round {r}, home {h}, {}: {value}, but {lo} operations succeeded and \
                         at most {hi} were issued",
                        ["DSM fetch_add", "DSM update", "actor ask"][k]
                    ));
                }
            }
        }
    }

    pub(super) fn line(&self) -> String {
        let mut stops: Vec<_> = self.stops.iter().collect();
        stops.sort_by(|a, b| b.1.cmp(a.1));
        format!(
            "rounds: {} started, {} formed, {} judged; homes judged {} (lost to restarts or \
             unread: {}); operations checked: DSM fetch_add {}, DSM update {}, actor ask {}; \
             clients stopped by: {:?}",
            self.started,
            self.formed,
            self.judged,
            self.homes,
            self.homes_lost,
            self.ops[0],
            self.ops[1],
            self.ops[2],
            stops
        )
    }
}
