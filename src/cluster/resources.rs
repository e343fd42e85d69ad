//! What a node offers (its resource manager's advertisement) and what a task needs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::Node;

/// What a node offers the cluster: every member advertises one when the cluster starts, and
/// [`submit_work`](super::Cluster::submit_work) places tasks by them.
///
/// ```
/// # barewire::engine::Runtime::builder().cores(1).sleeping().build().unwrap().block_on(async {
/// use barewire::{cluster::Resources, Node};
/// let mine = Resources::detect(&Node::soft().unwrap()).unwrap();
/// assert!(mine.cores >= 1 && mine.memory > 0);
/// assert_eq!(mine.transports, ["soft"]);
/// # });
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPUs this process may run on (its affinity mask). Also how many tasks it runs at once.
    pub cores: usize,
    /// Memory it may use, in bytes (the host's, or its cgroup's limit when lower).
    pub memory: u64,
    /// The RDMA transports it reaches peers by (`soft`, `iwarp`, `rocev2`, `infiniband`, ...).
    pub transports: Vec<String>,
    /// Free-form labels (`zone=a`, `gpu=h200`): from `BAREWIRE_LABELS` (`k=v,k=v`) and
    /// [`label`](Self::label).
    pub labels: BTreeMap<String, String>,
}

impl Resources {
    /// What this process has: its CPU affinity, its memory limit, `node`'s transport, and the
    /// labels in `BAREWIRE_LABELS`.
    pub fn detect(node: &Node) -> Result<Resources> {
        let labels = match std::env::var("BAREWIRE_LABELS") {
            Ok(s) => parse_labels(&s)?,
            Err(_) => BTreeMap::new(),
        };
        Ok(Resources {
            cores: affinity_cores(),
            memory: memory_limit(),
            transports: vec![format!("{:?}", node.device().transport()).to_lowercase()],
            labels,
        })
    }

    /// Adds (or replaces) label `key=value`.
    pub fn label(mut self, key: &str, value: &str) -> Resources {
        self.labels.insert(key.into(), value.into());
        self
    }
}

/// What a task needs of the node it runs on. The default needs nothing.
///
/// ```
/// use barewire::cluster::Needs;
/// let big = Needs::default().memory(8 << 30).transport("soft").label("zone", "a");
/// # let _ = big;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needs {
    /// At least this many cores.
    pub cores: usize,
    /// At least this much memory, in bytes.
    pub memory: u64,
    /// This transport among the node's.
    pub transport: Option<String>,
    /// Each of these labels, with these values.
    pub labels: BTreeMap<String, String>,
}

impl Needs {
    /// At least `n` cores.
    pub fn cores(mut self, n: usize) -> Needs {
        self.cores = n;
        self
    }

    /// At least `bytes` of memory.
    pub fn memory(mut self, bytes: u64) -> Needs {
        self.memory = bytes;
        self
    }

    /// The transport `t`.
    pub fn transport(mut self, t: &str) -> Needs {
        self.transport = Some(t.into());
        self
    }

    /// Label `key` with `value`.
    pub fn label(mut self, key: &str, value: &str) -> Needs {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Whether a node offering `r` can take the task; if not, what it lacks.
    pub fn unmet_by(&self, r: &Resources) -> Option<String> {
        if r.cores < self.cores {
            return Some(format!("{} cores < {}", r.cores, self.cores));
        }
        if r.memory < self.memory {
            return Some(format!("{} B of memory < {} B", r.memory, self.memory));
        }
        if let Some(t) = &self.transport {
            if !r.transports.contains(t) {
                return Some(format!("no transport {t:?} in {:?}", r.transports));
            }
        }
        for (k, v) in &self.labels {
            if r.labels.get(k) != Some(v) {
                return Some(format!("no label {k}={v}"));
            }
        }
        None
    }
}

/// Parses `k=v,k=v` (spaces around either side are trimmed; an empty string is no labels).
///
/// ```
/// use barewire::cluster::parse_labels;
/// let labels = parse_labels("zone=a, gpu = h200").unwrap();
/// assert_eq!(labels["zone"], "a");
/// assert_eq!(labels["gpu"], "h200");
/// assert!(parse_labels("").unwrap().is_empty());
/// assert!(parse_labels("zone").is_err()); // not key=value
/// ```
pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').ok_or_else(|| {
                Error::Invalid(format!("label {p:?} is not key=value (BAREWIRE_LABELS)"))
            })?;
            Ok((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

fn affinity_cores() -> usize {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and sched_getaffinity writes at most
    // size_of::<cpu_set_t>() bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            let n = libc::CPU_COUNT(&set);
            if n > 0 {
                return n as usize;
            }
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn memory_limit() -> u64 {
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match cgroup {
        Some(c) if c < host || host == 0 => c,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer() -> Resources {
        Resources {
            cores: 4,
            memory: 8 << 30,
            transports: vec!["soft".into()],
            labels: parse_labels("zone=a, gpu = h200").unwrap(),
        }
    }

    #[test]
    fn needs_are_checked_one_by_one() {
        let r = offer();
        assert_eq!(Needs::default().unmet_by(&r), None);
        assert_eq!(
            Needs::default()
                .cores(4)
                .memory(8 << 30)
                .transport("soft")
                .label("gpu", "h200")
                .unmet_by(&r),
            None
        );
        assert!(Needs::default()
            .cores(5)
            .unmet_by(&r)
            .unwrap()
            .contains("cores"));
        assert!(Needs::default()
            .memory(9 << 30)
            .unmet_by(&r)
            .unwrap()
            .contains("memory"));
        assert!(Needs::default()
            .transport("infiniband")
            .unmet_by(&r)
            .unwrap()
            .contains("transport"));
        assert!(Needs::default()
            .label("zone", "b")
            .unmet_by(&r)
            .unwrap()
            .contains("zone=b"));
    }

    #[test]
    fn labels_parse_and_bad_ones_are_named() {
        assert!(parse_labels("").unwrap().is_empty());
        assert_eq!(
            parse_labels("a=1").unwrap().get("a").map(String::as_str),
            Some("1")
        );
        let e = parse_labels("a=1,oops").unwrap_err().to_string();
        assert!(e.contains("oops"), "{e}");
    }

    #[test]
    fn this_process_has_cores_and_memory() {
        assert!(affinity_cores() >= 1);
        assert!(memory_limit() > 0);
    }
}
