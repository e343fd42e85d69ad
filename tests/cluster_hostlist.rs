//! barewire's host-list expansion against Slurm's own (`scontrol show hostnames`) on random
//! lists, where Slurm's client is installed (scripts/setup.sh installs it): the same hosts in
//! the same order, and an error exactly where Slurm refuses the list.

use std::process::Command;

use barewire::cluster::expand_hostlist;
use proptest::prelude::*;

/// `scontrol show hostnames LIST`: the hosts, or `None` where Slurm calls the list invalid.
/// `Err` when there is no scontrol here.
fn scontrol(list: &str) -> Result<Option<Vec<String>>, String> {
    let conf = std::env::temp_dir().join("barewire-hostlist-slurm.conf");
    if !conf.exists() {
        // scontrol wants a configuration even to expand a host list; any valid one does.
        std::fs::write(
            &conf,
            "ClusterName=bw\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\n\
             PartitionName=p Nodes=localhost\n",
        )
        .map_err(|e| e.to_string())?;
    }
    let out = Command::new("scontrol")
        .args(["show", "hostnames", list])
        .env("SLURM_CONF", &conf)
        .output()
        .map_err(|e| format!("scontrol: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    // (It says so on standard error, and exits 0.)
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || err.contains("Invalid hostlist") {
        return Ok(None);
    }
    Ok(Some(text.lines().map(String::from).collect()))
}

fn present() -> bool {
    match scontrol("a") {
        Ok(Some(h)) => h == ["a"],
        _ => false,
    }
}

/// A bracket group: numbers and ranges, some zero-padded.
fn group() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        (0u32..40, 0u32..6, 0usize..3, any::<bool>()).prop_map(|(a, d, pad, range)| {
            let lo = format!("{a:0pad$}", pad = pad + 1);
            if range {
                format!("{lo}-{}", a + d)
            } else {
                lo
            }
        }),
        1..4,
    )
    .prop_map(|items| format!("[{}]", items.join(",")))
}

/// A name: a prefix, up to two groups with a separator between them, and sometimes text
/// after the last group (which Slurm refuses).
fn name() -> impl Strategy<Value = String> {
    (
        "[a-z]{1,4}",
        proptest::option::of(group()),
        proptest::option::of(("-[a-z]{1,2}", group())),
        proptest::option::weighted(0.1, "[a-z]{1,2}"),
    )
        .prop_map(|(p, g1, g2, tail)| {
            let mut s = p;
            if let Some(g) = g1 {
                s.push_str(&g);
                if let Some((sep, g)) = g2 {
                    s.push_str(&sep);
                    s.push_str(&g);
                }
            }
            if let Some(t) = tail {
                s.push_str(&t);
            }
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn host_lists_expand_as_scontrol_expands_them(names in proptest::collection::vec(name(), 1..4)) {
        if !present() {
            eprintln!("SKIP: no scontrol here (apt-get install slurm-client)");
            return Ok(());
        }
        let list = names.join(",");
        let theirs = scontrol(&list).unwrap();
        let ours = expand_hostlist(&list).ok();
        prop_assert_eq!(ours, theirs, "{}", list);
    }
}
