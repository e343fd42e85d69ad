//! A real single-node Slurm (Debian's slurm-wlm 22.05, installed by scripts/setup.sh): this
//! test starts slurmctld and slurmd in the foreground as root with a minimal slurm.conf in a
//! temporary directory, runs a 3-task job with `srun -O -n 3` (overcommitted: the node has
//! fewer CPUs), whose tasks find each other from Slurm's environment, form a mesh and add to a
//! shared counter; then stops exactly the daemons it started, by PID. Not root: it skips and
//! says why (CI runs as root, where it must pass).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemons {
    dir: PathBuf,
    conf: PathBuf,
    children: Vec<Child>,
}

impl Drop for Daemons {
    fn drop(&mut self) {
        // slurmd first, then slurmctld: the reverse of their start.
        for c in self.children.iter_mut().rev() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = c.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn host() -> String {
    let out = Command::new("hostname").arg("-s").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn up() -> Daemons {
    let dir = std::env::temp_dir().join(format!("barewire-slurm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for d in ["state/ctld", "state/d", "log"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let node = host();
    let p = |s: &str| dir.join(s).display().to_string();
    let conf = dir.join("slurm.conf");
    std::fs::write(
        &conf,
        format!(
            "ClusterName=barewire\nSlurmctldHost={node}(127.0.0.1)\nSlurmUser=root\n\
             SlurmdUser=root\nAuthType=auth/none\nCredType=cred/none\n\
             ProctrackType=proctrack/pgid\nTaskPlugin=task/none\nSelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\nMpiDefault=none\nJobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\nJobCompType=jobcomp/none\n\
             ReturnToService=2\nStateSaveLocation={}\nSlurmdSpoolDir={}\n\
             SlurmctldPidFile={}\nSlurmdPidFile={}\nSlurmctldLogFile={}\nSlurmdLogFile={}\n\
             SlurmctldPort=16817\nSlurmdPort=16818\n\
             NodeName={node} NodeAddr=127.0.0.1 CPUs={} State=UNKNOWN\n\
             PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP\n",
            p("state/ctld"),
            p("state/d"),
            p("state/slurmctld.pid"),
            p("state/slurmd.pid"),
            p("log/slurmctld.log"),
            p("log/slurmd.log"),
            std::thread::available_parallelism().map_or(1, |c| c.get()),
        ),
    )
    .unwrap();
    let mut d = Daemons {
        dir: dir.clone(),
        conf: conf.clone(),
        children: Vec::new(),
    };
    for daemon in ["slurmctld", "slurmd"] {
        d.children.push(
            Command::new(daemon)
                .args(["-D", "-f"])
                .arg(&conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(dir.join(format!("log/{daemon}.out"))).unwrap())
                .spawn()
                .unwrap_or_else(|e| panic!("{daemon}: {e}")),
        );
    }
    let t0 = Instant::now();
    loop {
        let out = Command::new("sinfo")
            .args(["-h", "-N", "-o", "%T"])
            .env("SLURM_CONF", &conf)
            .output()
            .unwrap();
        if String::from_utf8_lossy(&out.stdout).trim() == "idle" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the node never became idle: {}",
            log_tail(&dir)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    d
}

fn log_tail(dir: &Path) -> String {
    [
        "log/slurmctld.log",
        "log/slurmd.log",
        "log/slurmctld.out",
        "log/slurmd.out",
    ]
    .iter()
    .map(|f| {
        let t = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let lines: Vec<&str> = t.lines().collect();
        format!(
            "{f}: {}",
            lines[lines.len().saturating_sub(5)..].join(" | ")
        )
    })
    .collect::<Vec<_>>()
    .join("\n")
}

#[test]
fn a_three_task_srun_job_forms_a_cluster_from_slurms_environment_and_runs_a_workflow() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("this test needs root to run slurmctld and slurmd, and CI runs as root");
        }
        eprintln!("SKIP: a real Slurm needs root (slurmctld and slurmd run as root here)");
        return;
    }
    if Command::new("slurmctld").arg("-V").output().is_err() {
        panic!("slurmctld is not installed: scripts/setup.sh installs slurmctld and slurmd");
    }
    let example = common::example("cluster_hello");
    let d = up();
    let out = Command::new("srun")
        .args(["-O", "-n", "3", "--kill-on-bad-exit=1", "-t", "2"])
        .arg(&example)
        .env("SLURM_CONF", &d.conf)
        .env("BAREWIRE_DRIVER", "soft")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "srun failed: {text}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_tail(&d.dir)
    );
    assert!(
        text.contains("3 processes (Slurm): total 6, sum of squares 1..6 = 91"),
        "{text}"
    );

    // The worked example, the distributed matrix multiply, as a 2-task job.
    let matmul = example.with_file_name("matmul");
    let out = Command::new("srun")
        .args(["-O", "-n", "2", "--kill-on-bad-exit=1", "-t", "2"])
        .arg(&matmul)
        .args(["--n", "512", "--panel", "128", "--type", "f64", "--check"])
        .env("SLURM_CONF", &d.conf)
        .env("BAREWIRE_DRIVER", "soft")
        .env("BAREWIRE_BASE_PORT", "7720")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "srun matmul failed: {text}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        log_tail(&d.dir)
    );
    assert!(
        text.contains("matmul n=512 p=2 grid=1x2 type=f64"),
        "{text}"
    );
}
