//! Where the workers live: two network namespaces joined by a veth pair, or loopback.

use super::*;

/// Where the workers live and how they reach each other (see the crate docs).
pub(super) struct Net {
    /// Per rank: the network namespace it enters (none on loopback).
    pub(super) netns: [Option<String>; PROCS],
    /// Per rank: the address it listens on.
    pub(super) listen: [SocketAddr; PROCS],
    /// Per rank: the address through which the previous rank reaches it.
    pub(super) reach: [SocketAddr; PROCS],
    /// Per rank: the address of its listener for the rounds' meshes (the port varies).
    pub(super) mesh_ip: [std::net::IpAddr; PROCS],
    /// The first port for the rounds' meshes.
    pub(super) mesh_base: u16,
    /// The namespace holding the end of the veth pair that `cut` sets down, and that end.
    pub(super) link: Option<(String, String)>,
    /// Namespaces made for this run, removed on drop.
    pub(super) made: Vec<String>,
}

/// Namespaces of one soak are named `bwsoak-<supervisor pid>-{a,b}`.
pub(super) const NETNS_PREFIX: &str = "bwsoak-";

impl Net {
    pub(super) fn loopback() -> Net {
        let base = free_ports();
        let at = |r: usize| SocketAddr::from(([127, 0, 0, 1], base + r as u16));
        Net {
            netns: Default::default(),
            listen: std::array::from_fn(at),
            reach: std::array::from_fn(at),
            mesh_ip: [[127, 0, 0, 1].into(); PROCS],
            mesh_base: base + PROCS as u16,
            link: None,
            made: Vec::new(),
        }
    }

    /// Two fresh namespaces and a veth pair between them: ranks 0 and 1 in `a`, rank 2 in `b`.
    pub(super) fn namespaces() -> Result<Net, String> {
        remove_stale_namespaces();
        let pid = std::process::id();
        let (a, b) = (
            format!("{NETNS_PREFIX}{pid}-a"),
            format!("{NETNS_PREFIX}{pid}-b"),
        );
        let (va, vb) = (format!("bws{pid}a"), format!("bws{pid}b"));
        let mut net = Net {
            netns: [Some(a.clone()), Some(a.clone()), Some(b.clone())],
            listen: std::array::from_fn(|r| SocketAddr::from(([0, 0, 0, 0], 7000 + r as u16))),
            reach: [
                SocketAddr::from(([10, 213, 0, 1], 7000)),
                SocketAddr::from(([127, 0, 0, 1], 7001)),
                SocketAddr::from(([10, 213, 0, 2], 7002)),
            ],
            // Ranks 0 and 1 use the address on their side of the pair among themselves too:
            // the cut is made on rank 2's side, so that address stays theirs.
            mesh_ip: [
                [10, 213, 0, 1].into(),
                [10, 213, 0, 1].into(),
                [10, 213, 0, 2].into(),
            ],
            mesh_base: 7100,
            link: Some((b.clone(), vb.clone())),
            made: Vec::new(),
        };
        // What is made goes on `made` at once: Drop removes it, on success or not.
        for ns in [&a, &b] {
            ip(&["netns", "add", ns])?;
            net.made.push(ns.clone());
        }
        ip(&[
            "link", "add", &va, "netns", &a, "type", "veth", "peer", "name", &vb, "netns", &b,
        ])?;
        for (ns, dev, addr) in [(&a, &va, "10.213.0.1/24"), (&b, &vb, "10.213.0.2/24")] {
            ip(&["-n", ns, "addr", "add", addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(net)
    }

    /// The mesh addresses of round `r`, by rank (a fresh port per round, cycling).
    pub(super) fn mesh_addrs(&self, r: u64) -> String {
        let port = |rank: usize| self.mesh_base + (r % 64) as u16 * PROCS as u16 + rank as u16;
        (0..PROCS)
            .map(|rank| SocketAddr::new(self.mesh_ip[rank], port(rank)).to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Sets the veth link down (a partition) or up again. False on loopback.
    pub(super) fn cut(&self, down: bool) -> bool {
        let Some((ns, dev)) = &self.link else {
            return false;
        };
        if std::env::var("BAREWIRE_SOAK_BREAK").is_ok_and(|b| b == "fake-cut") {
            return true; // the deliberate defect: a cut that cuts nothing
        }
        let state = if down { "down" } else { "up" };
        if let Err(e) = ip(&["-n", ns, "link", "set", dev, state]) {
            eprintln!("barewire-soak: setting the link {state}: {e}");
        }
        true
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for ns in &self.made {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Runs `ip` with these arguments.
pub(super) fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e} (iproute2 installed?)", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Removes the namespaces of soaks whose supervisor no longer runs (killed before its Drop).
pub(super) fn remove_stale_namespaces() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(NETNS_PREFIX)
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &name]);
        }
    }
}
