//! The same cluster program under Open MPI's `mpirun`: its ranks come from
//! `OMPI_COMM_WORLD_*`, they form the cluster and run a workflow.

mod common;

use std::process::Command;

#[test]
fn a_three_rank_mpirun_job_forms_a_cluster_and_runs_a_workflow() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("mpirun is not installed: scripts/setup.sh installs openmpi-bin");
        }
        eprintln!("SKIP: mpirun is not installed (apt-get install openmpi-bin)");
        return;
    }
    let example = common::example("cluster_hello");
    let out = Command::new("timeout")
        .args([
            "120",
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "-n",
            "3",
        ])
        .args(["-x", "BAREWIRE_DRIVER", "-x", "BAREWIRE_BASE_PORT"])
        .arg(&example)
        .env("BAREWIRE_DRIVER", "soft")
        .env("BAREWIRE_BASE_PORT", "7710")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mpirun failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("3 processes (Mpi): total 6, sum of squares 1..6 = 91"),
        "{text}"
    );
}
