//! `barewire run`: N processes with srun's environment shape, pinned, failures propagated; and
//! a real cluster program started by it.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

fn barewire() -> Command {
    Command::new(env!("CARGO_BIN_EXE_barewire"))
}

#[test]
fn every_process_gets_its_rank_the_size_and_a_cpu() {
    let out = barewire()
        .args(["run", "-n", "3", "--", "sh", "-c"])
        .arg("echo $BAREWIRE_RANK/$BAREWIRE_SIZE/$BAREWIRE_LOCAL_RANK/$BAREWIRE_NODELIST $(grep Cpus_allowed_list /proc/self/status | cut -f2)")
        .output()
        .unwrap();
    assert!(out.status.success());
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    lines.sort();
    let cpus = std::thread::available_parallelism().map_or(1, |c| c.get());
    let expect: Vec<String> = (0..3)
        .map(|r| format!("{r}/3/{r}/127.0.0.1 {}", r % cpus))
        .collect();
    assert_eq!(lines, expect);
}

/// A command line it cannot run says what is wrong with it (exit status 2), and starts nothing.
#[test]
fn a_bad_command_line_says_what_is_wrong() {
    for (args, says) in [
        (
            &["run", "-n", "0", "--", "true"][..],
            "at least one process",
        ),
        (&["run", "-n", "two", "--", "true"], "-n takes a number"),
        (&["run", "-n", "2", "true"], "no `--`"),
        (&["run", "-n", "2", "--"], "no program"),
        (
            &["run", "-n", "2", "--fast", "--", "true"],
            "unknown option \"--fast\"",
        ),
        (&["start"], "the one command is `run`"),
    ] {
        let out = barewire().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(says) && err.contains("usage:"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn one_failure_stops_the_others_and_is_the_exit_status() {
    let t0 = Instant::now();
    let st = barewire()
        .args(["run", "-n", "2", "--", "sh", "-c"])
        .arg("if [ \"$BAREWIRE_RANK\" = 1 ]; then exit 3; fi; sleep 30")
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(3));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn a_cluster_program_started_by_the_launcher_meshes_and_shares_memory() {
    let example = common::example("cluster_hello");
    let out = barewire()
        .args(["run", "-n", "3", "--no-pin", "--"])
        .arg(&example)
        .env("BAREWIRE_DRIVER", "soft")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("3 processes (Barewire): total 6, sum of squares 1..6 = 91"),
        "{text}"
    );
}
