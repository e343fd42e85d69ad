//! The bench binaries' command lines (clap): generated help, and errors that say what is wrong
//! and what is allowed. (barewire-perf's own are in `perf_cli.rs`.) Short real runs only of
//! the benchmarks with no failure detector in them: on a loaded two-core CI machine, a
//! membership timeout could fire and fail a run for a reason that is not its command line.

use std::process::Command;

mod common;

fn run(bin: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .output()
        .expect("the binary runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn channel_bench_help_and_bad_input() {
    let bin = env!("CARGO_BIN_EXE_channel-bench");
    let (ok, help) = run(bin, &["--help"]);
    assert!(ok, "{help}");
    for flag in [
        "--reps",
        "-n",
        "--cpu",
        "--channel-only",
        "--versus-soft",
        "--consume",
        "--crc",
    ] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
    assert!(
        !help.contains("--serve"),
        "the server modes stay hidden: {help}"
    );
    let (ok, e) = run(bin, &["--reps", "0"]);
    assert!(!ok && e.contains("--reps") && e.contains("1.."), "{e}");
    let (ok, e) = run(bin, &["--cpu", "1"]);
    assert!(!ok && e.contains("two CPU numbers"), "{e}");
    let (ok, e) = run(bin, &["--frobnicate"]);
    assert!(!ok && e.contains("--frobnicate"), "{e}");
    // shm beside soft needs shm on one side.
    let (ok, e) = run(bin, &["--versus-soft", "--channel-only"]);
    assert!(!ok && e.contains("--driver shm"), "{e}");
}

#[test]
fn echo_bench_subcommands_and_bad_input() {
    let bin = env!("CARGO_BIN_EXE_echo-bench");
    let (ok, help) = run(bin, &["compare", "--help"]);
    assert!(ok, "{help}");
    for flag in ["--mode", "--conns", "--size", "--secs", "--reps"] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
    let (ok, e) = run(bin, &["run", "node"]);
    assert!(!ok && e.contains("tokio") && e.contains("monoio"), "{e}");
    let (ok, e) = run(bin, &["compare", "--mode", "fast"]);
    assert!(!ok && e.contains("pingpong"), "{e}");
    let (ok, e) = run(bin, &["run", "tokio", "--conns", "0"]);
    assert!(!ok && e.contains("--conns"), "{e}");
    // A real run: one machine-readable line.
    let (ok, out) = run(bin, &["run", "barewire", "--secs", "1", "--conns", "4"]);
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with("RESULT barewire rate="));
    let rate: f64 = line
        .and_then(|l| {
            l.split_whitespace()
                .nth(2)?
                .strip_prefix("rate=")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no RESULT line in {out}"));
    assert!(rate > 0.0, "{out}");
}

#[test]
fn driver_overhead_runs_and_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_driver-overhead");
    let (ok, help) = run(bin, &["--help"]);
    assert!(
        ok && help.contains("--reps") && !help.contains("--serve"),
        "{help}"
    );
    let (ok, e) = run(bin, &["-n", "lots"]);
    assert!(!ok && e.contains("-n"), "{e}");
    let (ok, out) = run(bin, &["--reps", "1", "-n", "300"]);
    assert!(ok, "{out}");
    assert!(out.contains("direct: 8 B WRITE p50"), "{out}");
    assert!(out.contains("drivers: 8 B WRITE p50"), "{out}");
}

#[test]
fn softrdma_qpmem_runs_and_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_softrdma-qpmem");
    let (ok, e) = run(bin, &["0"]);
    assert!(!ok && e.contains("[N]"), "{e}");
    // More than the listener lets one address hold by default (256): the tool raises it.
    let (ok, out) = run(bin, &["300"]);
    assert!(ok, "{out}");
    assert!(out.contains("RESULT qps=300 "), "{out}");
}

#[test]
fn dsm_bench_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_dsm-bench");
    let (ok, help) = run(bin, &["--help"]);
    assert!(
        ok && help.contains("--no-redis") && !help.contains("--serve"),
        "{help}"
    );
    let (ok, e) = run(bin, &["--cpus", "0;1"]);
    assert!(!ok && e.contains("two CPU numbers"), "{e}");
}

#[test]
fn actor_bench_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_actor-bench");
    let (ok, help) = run(bin, &["--help"]);
    assert!(ok, "{help}");
    for word in ["nodedown", "soak", "--no-erlang", "--msgs"] {
        assert!(help.contains(word), "{word} in {help}");
    }
    let (ok, e) = run(bin, &["nodedown", "--rounds", "0"]);
    assert!(!ok && e.contains("--rounds"), "{e}");
    let (ok, e) = run(bin, &["soak", "--reps", "3"]);
    assert!(!ok && e.contains("--reps"), "{e}");
    let (ok, out) = run(
        bin,
        &[
            "--reps",
            "1",
            "--iters",
            "200",
            "--msgs",
            "2000",
            "--no-erlang",
            "--no-ractor",
        ],
    );
    assert!(ok, "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("| remote ask p50 / Channel round trip p50 |"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(row.contains('x') && !row.contains("n/a"), "{row}");
}

#[test]
fn cluster_bench_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_cluster-bench");
    let (ok, help) = run(bin, &["--help"]);
    assert!(ok, "{help}");
    for word in ["work", "start", "detect"] {
        assert!(help.contains(word), "{word} in {help}");
    }
    assert!(
        !help.contains("--serve") && !help.contains("--noop"),
        "{help}"
    );
    let (ok, e) = run(bin, &["start", "--procs", "1"]);
    assert!(!ok && e.contains("--procs"), "{e}");
    let (ok, e) = run(bin, &["work", "--cpus", "0"]);
    assert!(!ok && e.contains("two CPU numbers"), "{e}");
}

#[test]
fn matmul_bench_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_matmul-bench");
    let (ok, help) = run(bin, &["--help"]);
    assert!(
        ok && help.contains("--sizes") && help.contains("--plot-only"),
        "{help}"
    );
    let (ok, e) = run(bin, &["--types", "f16"]);
    assert!(!ok && e.contains("f32") && e.contains("f64"), "{e}");
    let (ok, e) = run(bin, &["--sizes", "2048,x"]);
    assert!(!ok && e.contains("--sizes"), "{e}");
    let (ok, e) = run(bin, &["--plot-only"]);
    assert!(!ok && e.contains("--plots"), "{e}");
}

#[test]
fn soak_refuses_bad_input() {
    let bin = env!("CARGO_BIN_EXE_barewire-soak");
    let (ok, help) = run(bin, &["--help"]);
    assert!(
        ok && help.contains("--fault-every-ms") && help.contains("--break"),
        "{help}"
    );
    let (ok, e) = run(bin, &["--break", "nothing"]);
    assert!(
        !ok && e.contains("lost-write") && e.contains("actor-double"),
        "{e}"
    );
    let (ok, e) = run(bin, &["--net", "wifi"]);
    assert!(!ok && e.contains("netns") && e.contains("loopback"), "{e}");
    let (ok, e) = run(bin, &["--seconds", "0"]);
    assert!(!ok && e.contains("--seconds"), "{e}");
}

#[test]
fn task_mem_help_and_a_stray_argument() {
    let bin = env!("CARGO_BIN_EXE_task-mem");
    let (ok, help) = run(bin, &["--help"]);
    assert!(ok && help.contains("Heap bytes per spawned task"), "{help}");
    let (ok, e) = run(bin, &["--tasks", "5"]);
    assert!(!ok && e.contains("--tasks"), "{e}");
}

#[test]
fn soak_worker_arguments_are_checked() {
    let bin = env!("CARGO_BIN_EXE_barewire-soak");
    let (ok, e) = run(bin, &["worker", "0", "1"]);
    assert!(!ok && e.contains("<RESUME>"), "{e}");
    let (ok, e) = run(
        bin,
        &["worker", "0", "1", "0", "not-an-address", "127.0.0.1:1"],
    );
    assert!(!ok && e.contains("<LISTEN>"), "{e}");
}

/// `tcp-floor --trace` writes both ends' timelines with the steps barewire-perf's `--trace`
/// marks (a build with the `trace` feature), so `bench/tools/hop-trace.py` can cut the floor's
/// round trips as it cuts barewire's; a build without it says which build it needs, and the
/// threads mode (one process) is refused.
#[test]
fn tcp_floor_trace_writes_both_ends_timelines_or_names_the_build_it_needs() {
    let bin = env!("CARGO_BIN_EXE_tcp-floor");
    let prefix = std::env::temp_dir().join(format!("tcp-floor-trace-{}", std::process::id()));
    let prefix = prefix.to_str().unwrap();
    let args = [
        "-n", "300", "--reps", "1", "--ways", "ring", "--trace", prefix,
    ];
    let (ok, out) = run(bin, &args);
    if !barewire_engine::trace::ENABLED {
        assert!(!ok, "ran untraced:\n{out}");
        assert!(
            out.contains("--trace needs a build with the trace feature"),
            "{out}"
        );
        return;
    }
    assert!(ok, "{out}");
    // 300 round trips and a warm-up of 30: per end, a send each (an enter, its return), the
    // answer's bytes taken; the initiator sees each answer whole.
    for (end, saw) in [("client", 330), ("server", 0)] {
        let path = format!("{prefix}.{end}");
        let n = common::timeline_counts(&path, &[6, 1, 2, 4, 0x101]);
        let _ = std::fs::remove_file(&path);
        let [posted, enter, entered, received, seen] = n[..] else {
            unreachable!()
        };
        assert_eq!(posted, 330, "{end}: sends");
        assert!(
            enter >= posted && enter == entered,
            "{end}: {enter} enters, {entered} returns"
        );
        assert!(received >= 330, "{end}: {received} receives");
        assert_eq!(seen, saw, "{end}: answers seen whole");
    }
    let (ok, out) = run(bin, &["--threads", "--trace", prefix]);
    assert!(!ok && out.contains("run without --threads"), "{out}");
}
