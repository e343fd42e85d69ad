//! Who this process is in its job, read from what the launcher left in the environment:
//! barewire's own launcher, Slurm's `srun`, Open MPI's `mpirun` (or any PMIx launcher), or a
//! Kubernetes indexed Job or StatefulSet. barewire starts nothing itself.
//!
//! Every rank's address is its host and a port derived from it: `base_port` plus the rank's
//! index among the ranks on the same host, so every process computes every address alone and
//! no rendezvous is needed.

use std::net::{SocketAddr, ToSocketAddrs};

use super::hostlist::{expand_hostlist, expand_tasks_per_node};
use crate::error::{Error, Result};

/// Which launcher described the job.
///
/// ```
/// use barewire::cluster::{Launch, Launcher};
/// let vars = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "2"),
///              ("OMPI_COMM_WORLD_LOCAL_RANK", "1"), ("OMPI_COMM_WORLD_LOCAL_SIZE", "2")];
/// let get = |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string());
/// assert_eq!(Launch::from_vars(get).unwrap().launcher, Launcher::Mpi);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// barewire's own (`BAREWIRE_RANK`, ...), or a list given by hand.
    Barewire,
    /// Slurm (`SLURM_PROCID`, ...).
    Slurm,
    /// Open MPI or another PMIx launcher (`OMPI_COMM_WORLD_RANK` / `PMIX_RANK`).
    Mpi,
    /// A Kubernetes indexed Job (`JOB_COMPLETION_INDEX`) or StatefulSet (ordinal host name).
    Kubernetes,
}

/// This process's place in its job.
///
/// ```
/// use barewire::cluster::{Launch, Launcher};
/// // What `srun -N 2 --ntasks-per-node 2` leaves for its fourth task.
/// let vars = [
///     ("SLURM_PROCID", "3"),
///     ("SLURM_NTASKS", "4"),
///     ("SLURM_LOCALID", "1"),
///     ("SLURM_STEP_NODELIST", "node[07-08]"),
///     ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
/// ];
/// let get = |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string());
/// let me = Launch::from_vars(get).unwrap();
/// assert_eq!((me.rank, me.size, me.local_rank), (3, 4, 1));
/// assert_eq!(me.hosts, ["node07", "node07", "node08", "node08"]);
/// assert_eq!(me.launcher, Launcher::Slurm);
///
/// // Every rank's address: its host and a port from the base, by its index on that host.
/// let vars = [("BAREWIRE_RANK", "0"), ("BAREWIRE_SIZE", "2")]; // both on 127.0.0.1
/// let get = |k: &str| vars.iter().find(|v| v.0 == k).map(|v| v.1.to_string());
/// let addrs = Launch::from_vars(get).unwrap().addrs(7000).unwrap();
/// assert_eq!(addrs, ["127.0.0.1:7000".parse().unwrap(), "127.0.0.1:7001".parse().unwrap()]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// Processes in the job.
    pub size: usize,
    /// Its index among the processes on its host.
    pub local_rank: usize,
    /// The host of every rank, by rank.
    pub hosts: Vec<String>,
    /// Who said so.
    pub launcher: Launcher,
    /// `BAREWIRE_BASE_PORT`, when the launcher chose the ports (barewire's does).
    pub base_port: Option<u16>,
}

fn need(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<String> {
    get(var).ok_or_else(|| Error::Invalid(format!("{var} is not set")))
}

fn num(get: &impl Fn(&str) -> Option<String>, var: &str) -> Result<usize> {
    let v = need(get, var)?;
    v.trim()
        .parse()
        .map_err(|_| Error::Invalid(format!("{var}={v:?} is not a number")))
}

/// Every rank's host from a node list and tasks per node, ranks placed in blocks (Slurm's
/// default distribution: the first node's tasks first).
fn block_hosts(nodes: &[String], per_node: &[usize], size: usize) -> Result<Vec<String>> {
    let per_node: Vec<usize> = match per_node.len() {
        0 => vec![size.div_ceil(nodes.len().max(1)); nodes.len()],
        n if n == nodes.len() => per_node.to_vec(),
        n => {
            return Err(Error::Invalid(format!(
                "{} nodes but task counts for {n}",
                nodes.len()
            )))
        }
    };
    let mut hosts = Vec::with_capacity(size);
    for (node, &k) in nodes.iter().zip(&per_node) {
        hosts.extend(std::iter::repeat_n(node.clone(), k));
    }
    hosts.truncate(size);
    if hosts.len() != size {
        return Err(Error::Invalid(format!(
            "{size} tasks but the node list places only {}",
            hosts.len()
        )));
    }
    Ok(hosts)
}

impl Launch {
    /// From this process's environment (see [`Launch::from_vars`]).
    pub fn from_env() -> Result<Launch> {
        Launch::from_vars(|k| std::env::var(k).ok())
    }

    /// From environment variables as `get` returns them, trying in order:
    ///
    /// - barewire's launcher: `BAREWIRE_RANK`, `BAREWIRE_SIZE`, `BAREWIRE_LOCAL_RANK`,
    ///   `BAREWIRE_NODELIST` (a host list, default `127.0.0.1`), `BAREWIRE_TASKS_PER_NODE`;
    /// - Slurm: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_STEP_NODELIST` (or
    ///   `SLURM_JOB_NODELIST`), `SLURM_STEP_TASKS_PER_NODE` (or `SLURM_TASKS_PER_NODE`);
    /// - Open MPI / PMIx: `OMPI_COMM_WORLD_RANK` / `_SIZE` / `_LOCAL_RANK` (or `PMIX_RANK`
    ///   with `BAREWIRE_SIZE`); the hosts from `BAREWIRE_NODELIST`, or all on this host when
    ///   `OMPI_COMM_WORLD_LOCAL_SIZE` equals the size (MPI does not publish the others);
    /// - Kubernetes: `JOB_COMPLETION_INDEX` (indexed Job) or the ordinal at the end of
    ///   `HOSTNAME` (StatefulSet) as the rank, `BAREWIRE_SIZE`, and the pods' names through the
    ///   headless Service `BAREWIRE_K8S_SERVICE`: rank `i` is `<name>-<i>.<service>`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let mut l = Launch::from_launcher(&get)?;
        if get("BAREWIRE_BASE_PORT").is_some() {
            l.base_port = Some(
                num(&get, "BAREWIRE_BASE_PORT")?
                    .try_into()
                    .map_err(|_| Error::Invalid("BAREWIRE_BASE_PORT is not a port".into()))?,
            );
        }
        Ok(l)
    }

    fn from_launcher(get: &impl Fn(&str) -> Option<String>) -> Result<Launch> {
        let get = |k: &str| get(k);
        if get("BAREWIRE_RANK").is_some() {
            let size = num(&get, "BAREWIRE_SIZE")?;
            let nodes = expand_hostlist(&get("BAREWIRE_NODELIST").unwrap_or("127.0.0.1".into()))?;
            let per = expand_tasks_per_node(&get("BAREWIRE_TASKS_PER_NODE").unwrap_or_default())?;
            return Launch::checked(
                num(&get, "BAREWIRE_RANK")?,
                size,
                get("BAREWIRE_LOCAL_RANK")
                    .map_or(Ok(None), |_| num(&get, "BAREWIRE_LOCAL_RANK").map(Some))?,
                block_hosts(&nodes, &per, size)?,
                Launcher::Barewire,
            );
        }
        if get("SLURM_PROCID").is_some() {
            let size = match get("SLURM_NTASKS") {
                Some(_) => num(&get, "SLURM_NTASKS")?,
                None => num(&get, "SLURM_NPROCS")?,
            };
            let list = get("SLURM_STEP_NODELIST")
                .or_else(|| get("SLURM_JOB_NODELIST"))
                .ok_or_else(|| Error::Invalid("SLURM_STEP_NODELIST is not set".into()))?;
            let per = get("SLURM_STEP_TASKS_PER_NODE")
                .or_else(|| get("SLURM_TASKS_PER_NODE"))
                .unwrap_or_default();
            return Launch::checked(
                num(&get, "SLURM_PROCID")?,
                size,
                Some(num(&get, "SLURM_LOCALID")?),
                block_hosts(
                    &expand_hostlist(&list)?,
                    &expand_tasks_per_node(&per)?,
                    size,
                )?,
                Launcher::Slurm,
            );
        }
        if get("OMPI_COMM_WORLD_RANK").is_some() || get("PMIX_RANK").is_some() {
            let (rank, size) = if get("OMPI_COMM_WORLD_RANK").is_some() {
                (
                    num(&get, "OMPI_COMM_WORLD_RANK")?,
                    num(&get, "OMPI_COMM_WORLD_SIZE")?,
                )
            } else {
                (num(&get, "PMIX_RANK")?, num(&get, "BAREWIRE_SIZE")?)
            };
            let local = get("OMPI_COMM_WORLD_LOCAL_RANK").map_or(Ok(None), |_| {
                num(&get, "OMPI_COMM_WORLD_LOCAL_RANK").map(Some)
            })?;
            let hosts = match get("BAREWIRE_NODELIST") {
                Some(list) => {
                    let per = get("BAREWIRE_TASKS_PER_NODE").unwrap_or_default();
                    block_hosts(
                        &expand_hostlist(&list)?,
                        &expand_tasks_per_node(&per)?,
                        size,
                    )?
                }
                None if get("OMPI_COMM_WORLD_LOCAL_SIZE").is_some()
                    && num(&get, "OMPI_COMM_WORLD_LOCAL_SIZE")? == size =>
                {
                    vec!["127.0.0.1".to_string(); size]
                }
                None => {
                    return Err(Error::Invalid(
                        "an MPI job across hosts: set BAREWIRE_NODELIST (and \
                         BAREWIRE_TASKS_PER_NODE) to the hosts, MPI does not publish them"
                            .into(),
                    ))
                }
            };
            return Launch::checked(rank, size, local, hosts, Launcher::Mpi);
        }
        if let Some(service) = get("BAREWIRE_K8S_SERVICE") {
            let host = need(&get, "HOSTNAME")?;
            let (name, ordinal) = host
                .rsplit_once('-')
                .ok_or_else(|| Error::Invalid(format!("HOSTNAME {host:?} has no -<ordinal>")))?;
            let rank = match get("JOB_COMPLETION_INDEX") {
                Some(_) => num(&get, "JOB_COMPLETION_INDEX")?,
                None => ordinal.parse().map_err(|_| {
                    Error::Invalid(format!("HOSTNAME {host:?} does not end in an ordinal"))
                })?,
            };
            let size = num(&get, "BAREWIRE_SIZE")?;
            let hosts = (0..size).map(|i| format!("{name}-{i}.{service}")).collect();
            return Launch::checked(rank, size, Some(0), hosts, Launcher::Kubernetes);
        }
        Err(Error::Invalid(
            "no launcher found in the environment (BAREWIRE_RANK, SLURM_PROCID, \
             OMPI_COMM_WORLD_RANK, PMIX_RANK or BAREWIRE_K8S_SERVICE); start the program with \
             `barewire run`, srun or mpirun"
                .into(),
        ))
    }

    fn checked(
        rank: usize,
        size: usize,
        local: Option<usize>,
        hosts: Vec<String>,
        launcher: Launcher,
    ) -> Result<Launch> {
        if size == 0 || rank >= size || hosts.len() != size {
            return Err(Error::Invalid(format!(
                "rank {rank} of a job of {size} with {} hosts",
                hosts.len()
            )));
        }
        let derived = hosts[..rank].iter().filter(|h| **h == hosts[rank]).count();
        Ok(Launch {
            rank,
            size,
            local_rank: local.unwrap_or(derived),
            hosts,
            launcher,
            base_port: None,
        })
    }

    /// Every rank's address: its host, and the base port (the launcher's `BAREWIRE_BASE_PORT`
    /// if it set one, else `base_port`) plus its index among the ranks on that host. Host names
    /// are resolved here (IPv4 preferred).
    pub fn addrs(&self, base_port: u16) -> Result<Vec<SocketAddr>> {
        let base_port = self.base_port.unwrap_or(base_port);
        let mut out = Vec::with_capacity(self.size);
        for (r, host) in self.hosts.iter().enumerate() {
            let index = self.hosts[..r].iter().filter(|h| *h == host).count();
            let port = base_port
                .checked_add(index as u16)
                .ok_or_else(|| Error::Invalid(format!("port {base_port} + {index} overflows")))?;
            let mut found: Vec<SocketAddr> = (host.as_str(), port)
                .to_socket_addrs()
                .map_err(|e| Error::Invalid(format!("resolving {host}: {e}")))?
                .collect();
            found.sort_by_key(|a| !a.is_ipv4());
            out.push(
                *found
                    .first()
                    .ok_or_else(|| Error::Invalid(format!("{host} has no address")))?,
            );
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn slurm_ranks_are_placed_in_blocks_over_the_node_list() {
        let l = Launch::from_vars(env(&[
            ("SLURM_PROCID", "4"),
            ("SLURM_NTASKS", "5"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "n[01-02],login"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2),1"),
        ]))
        .unwrap();
        assert_eq!(l.launcher, Launcher::Slurm);
        assert_eq!((l.rank, l.size, l.local_rank), (4, 5, 1));
        assert_eq!(l.hosts, ["n01", "n01", "n02", "n02", "login"]);
    }

    #[test]
    fn a_single_node_job_shares_one_host_with_ports_by_local_index() {
        let l = Launch::from_vars(env(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_LOCALID", "2"),
            ("SLURM_STEP_NODELIST", "localhost"),
            ("SLURM_STEP_TASKS_PER_NODE", "3"),
        ]))
        .unwrap();
        let a = l.addrs(7600).unwrap();
        assert_eq!(
            a.iter().map(|a| a.port()).collect::<Vec<_>>(),
            [7600, 7601, 7602]
        );
        assert!(a.iter().all(|a| a.ip().is_loopback()));
    }

    #[test]
    fn open_mpi_on_one_host_and_across_hosts() {
        let l = Launch::from_vars(env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]))
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.local_rank), (Launcher::Mpi, 1, 1));
        assert_eq!(l.hosts, ["127.0.0.1", "127.0.0.1"]);
        let e = Launch::from_vars(env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("BAREWIRE_NODELIST"), "{e}");
    }

    #[test]
    fn kubernetes_indexed_jobs_and_statefulsets() {
        let l = Launch::from_vars(env(&[
            ("BAREWIRE_K8S_SERVICE", "bw"),
            ("HOSTNAME", "matmul-2"),
            ("JOB_COMPLETION_INDEX", "2"),
            ("BAREWIRE_SIZE", "3"),
        ]))
        .unwrap();
        assert_eq!((l.launcher, l.rank), (Launcher::Kubernetes, 2));
        assert_eq!(l.hosts, ["matmul-0.bw", "matmul-1.bw", "matmul-2.bw"]);
        let s = Launch::from_vars(env(&[
            ("BAREWIRE_K8S_SERVICE", "bw"),
            ("HOSTNAME", "web-1"),
            ("BAREWIRE_SIZE", "2"),
        ]))
        .unwrap();
        assert_eq!(s.rank, 1);
    }

    #[test]
    fn barewires_own_launcher_and_what_is_missing() {
        let l = Launch::from_vars(env(&[("BAREWIRE_RANK", "0"), ("BAREWIRE_SIZE", "4")])).unwrap();
        assert_eq!(l.hosts, ["127.0.0.1"; 4]);
        assert_eq!(l.local_rank, 0);
        let e = Launch::from_vars(env(&[])).unwrap_err();
        assert!(e.to_string().contains("barewire run"), "{e}");
        let e =
            Launch::from_vars(env(&[("BAREWIRE_RANK", "5"), ("BAREWIRE_SIZE", "4")])).unwrap_err();
        assert!(e.to_string().contains("rank 5"), "{e}");
        let e =
            Launch::from_vars(env(&[("SLURM_PROCID", "x"), ("SLURM_NTASKS", "2")])).unwrap_err();
        assert!(e.to_string().contains("not"), "{e}");
    }
}
