//! barewire-perf end to end: every perftest-named test in `--loopback` mode over the soft
//! driver with a small iteration count (numbers are not asserted, only that each run finishes
//! and prints well-formed rows), `--plot` writing a real PNG, and `compare` reporting missing
//! peers by name. The runs spin while busy, so they take turns.

use std::process::Command;
use std::sync::Mutex;

use barewire_bench::perf::table::{parse_row, BwRow, LatRow, Record, BW_HEADER, LAT_HEADER};

mod common;

static SERIAL: Mutex<()> = Mutex::new(());

fn perf(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_barewire-perf"))
        .args(args)
        .env("BAREWIRE_DRIVER", "soft")
        .output()
        .expect("barewire-perf runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The rows under the header, each parsed; fails the test on anything malformed.
fn rows(stdout: &str, bw: bool) -> Vec<Vec<f64>> {
    let header = if bw { BW_HEADER } else { LAT_HEADER };
    let mut lines = stdout.lines();
    assert!(lines.any(|l| l == header), "no header in:\n{stdout}");
    let rows: Vec<Vec<f64>> = lines
        .take_while(|l| !l.starts_with("----"))
        .map(|l| parse_row(l).unwrap_or_else(|| panic!("malformed row {l:?} in:\n{stdout}")))
        .collect();
    let want = if bw { 5 } else { 9 };
    assert!(rows.iter().all(|r| r.len() == want), "{stdout}");
    rows
}

#[test]
fn every_test_runs_in_loopback_mode_and_prints_well_formed_rows() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (test, extra) in [
        ("write_lat", vec!["-s", "64", "-n", "300"]),
        ("read_lat", vec!["-s", "64", "-n", "300"]),
        ("send_lat", vec!["-s", "64", "-n", "300"]),
        ("atomic_lat", vec!["-n", "300"]),
        ("atomic_lat", vec!["-n", "300", "-A", "CMP_AND_SWAP"]),
        ("write_bw", vec!["-s", "4096", "-n", "3000"]),
        ("read_bw", vec!["-s", "4096", "-n", "3000"]),
        ("send_bw", vec!["-s", "4096", "-n", "3000", "-t", "32"]),
        // `--remote-offset`, its largest value, on both drivers (the server's buffer holds the
        // largest message twice over, so any offset fits).
        (
            "write_bw",
            vec!["-s", "64", "-n", "3000", "--remote-offset", "4095"],
        ),
        (
            "read_bw",
            vec!["-s", "64", "-n", "3000", "--remote-offset", "4095"],
        ),
        (
            "write_bw",
            vec![
                "-s",
                "4096",
                "-n",
                "3000",
                "--remote-offset",
                "16",
                "--driver",
                "shm",
            ],
        ),
    ] {
        let mut args = vec![test, "--loopback"];
        args.extend(extra.iter().copied());
        let (ok, out, err) = perf(&args);
        assert!(ok, "{args:?} failed:\n{out}\n{err}");
        let bw = test.ends_with("_bw");
        let r = rows(&out, bw);
        assert_eq!(r.len(), 1, "{args:?}:\n{out}");
        let size = match extra.iter().position(|&a| a == "-s") {
            Some(i) => extra[i + 1].parse().unwrap(),
            None => 8.0, // atomic_lat
        };
        assert_eq!(r[0][0], size, "{args:?}");
        if bw {
            assert!(r[0][1] >= 3000.0 && r[0][3] > 0.0, "{args:?}: {:?}", r[0]);
        } else {
            // iterations, and min <= typical <= max
            assert_eq!(r[0][1], 300.0, "{args:?}");
            assert!(
                r[0][2] <= r[0][4] && r[0][4] <= r[0][3],
                "{args:?}: {:?}",
                r[0]
            );
        }
    }
}

#[test]
fn all_sizes_run_from_2_bytes_to_8_mib_and_json_is_one_object_per_size() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (ok, out, err) = perf(&["write_lat", "--loopback", "-a", "-n", "20"]);
    assert!(ok, "{out}\n{err}");
    let sizes: Vec<f64> = rows(&out, false).iter().map(|r| r[0]).collect();
    let want: Vec<f64> = (1..=23).map(|p| (1u64 << p) as f64).collect();
    assert_eq!(sizes, want);
    let (ok, out, err) = perf(&["read_bw", "--loopback", "-s", "1024", "-n", "500", "--json"]);
    assert!(ok, "{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let r: Record<BwRow> = serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!((r.test.as_str(), r.row.bytes), ("read_bw", 1024));
    assert!(r.row.iters >= 500 && r.row.avg > 0.0, "{out}");
    // Latency rows round-trip too, one object per size.
    let (ok, out, err) = perf(&["atomic_lat", "--loopback", "-n", "50", "--json"]);
    assert!(ok, "{out}\n{err}");
    let rows: Vec<Record<LatRow>> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(
        (rows[0].test.as_str(), rows[0].row.bytes),
        ("atomic_lat", 8)
    );
    assert!(rows[0].row.min <= rows[0].row.typical && rows[0].row.typical <= rows[0].row.max);
}

/// `--floor-slices` over shm: the measured iterations split evenly between WRITE slices (the
/// latency row) and bare-store slices, paired into a summary; over soft, which maps nothing, a
/// clear refusal.
#[test]
fn floor_slices_set_writes_beside_bare_stores_over_shm_and_are_refused_over_soft() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let args = [
        "write_lat",
        "--loopback",
        "-s",
        "64",
        "-n",
        "4000",
        "--driver",
        "shm",
        "--floor-slices",
        "500",
        "--json",
    ];
    let (ok, out, err) = perf(&args);
    assert!(ok, "{out}\n{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    let row: Record<LatRow> =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(
        (row.test.as_str(), row.row.iters),
        ("write_lat", 2000),
        "{out}"
    );
    let s: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(s["test"], "write_lat_floor_slices", "{out}");
    assert_eq!(s["slice"], 500);
    assert_eq!(s["write"]["iterations"], 2000, "{out}");
    assert_eq!(s["store"]["iterations"], 2000, "{out}");
    assert_eq!(s["write"]["t_typical_us"], row.row.typical, "{out}");
    let pairs = s["fast"]["pairs"].as_u64().unwrap() + s["slow"]["pairs"].as_u64().unwrap_or(0);
    assert_eq!(pairs, 4, "{out}");
    assert!(s["ratio"].as_f64().unwrap() > 0.0, "{out}");
    let (ok, out, err) = perf(&[
        "write_lat",
        "--loopback",
        "-n",
        "100",
        "--floor-slices",
        "10",
    ]);
    assert!(!ok, "{out}");
    assert!(
        err.contains("--floor-slices needs a backend that maps the peer's memory"),
        "{err}"
    );
}

#[test]
fn plot_writes_a_real_png() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let path = std::env::temp_dir().join(format!("bwperf-{}.png", std::process::id()));
    let p = path.to_str().unwrap();
    let (ok, out, err) = perf(&["read_lat", "--loopback", "-n", "500", "--plot", p]);
    assert!(ok, "{out}\n{err}");
    let png = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let (w, h) = (
        u32::from_be_bytes(png[16..20].try_into().unwrap()),
        u32::from_be_bytes(png[20..24].try_into().unwrap()),
    );
    assert_eq!((w, h), (1000, 620));
    assert!(
        png.len() > 5000,
        "a drawn chart, not an empty image: {} bytes",
        png.len()
    );
}

#[test]
fn compare_names_the_peers_that_are_missing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // A PATH with the coreutils compare needs but none of the peers.
    let dir = std::env::temp_dir().join(format!("bwperf-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for tool in ["timeout", "taskset", "date"] {
        let src = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| std::path::Path::new(d).join(tool))
            .find(|p| p.exists())
            .unwrap();
        let _ = std::os::unix::fs::symlink(src, dir.join(tool));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_barewire-perf"))
        .args(["compare", "-n", "200", "-D", "0.2", "--cpu", "0,0"])
        .env("PATH", &dir)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (tool, pkg) in [
        ("ucx_perftest", "ucx-utils"),
        ("fi_pingpong", "libfabric-bin"),
        ("qperf", "qperf"),
        ("sockperf", "sockperf"),
    ] {
        assert!(
            stdout.contains(&format!(
                "MISSING peer: {tool} is not installed (apt-get install {pkg})"
            )),
            "{tool}:\n{stdout}"
        );
    }
    assert!(
        !stdout.contains("FAILED"),
        "barewire's own runs all finished:\n{stdout}"
    );
}

#[test]
fn an_absent_verbs_driver_is_a_clear_error() {
    if !barewire_drivers::verbs_devices().is_empty() {
        return; // a device exists here: --driver verbs would run
    }
    let (ok, _, err) = perf(&["write_lat", "--loopback", "--driver", "verbs"]);
    assert!(!ok);
    assert!(
        err.contains("--driver verbs: no verbs RDMA device found")
            && err.contains("BAREWIRE_DRIVER=soft"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one clear line: {err}");
}

#[test]
fn progress_goes_to_a_terminal_only() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Piped (as here): nothing on stderr, even for a run long enough to show progress.
    let (ok, out, err) = perf(&["write_bw", "--loopback", "-D", "2.5", "-s", "4096"]);
    assert!(ok, "{out}\n{err}");
    assert!(!err.contains("ETA"), "progress on a pipe: {err}");
    // On a terminal (util-linux `script` gives the run a pseudo-terminal): the bar, with the
    // test, its rate and an ETA.
    let cmd = format!(
        "{} write_bw --loopback -D 2.5 -s 4096",
        env!("CARGO_BIN_EXE_barewire-perf")
    );
    let tty = Command::new("script")
        .args(["-qc", &cmd, "/dev/null"])
        .output()
        .expect("script (util-linux) runs");
    let seen = String::from_utf8_lossy(&tty.stdout);
    assert!(
        seen.contains("write_bw 4096 B") && seen.contains("ETA"),
        "no progress on a terminal: {seen}"
    );
}

/// `--trace` writes each side's engine timeline (a build with the `trace` feature), and a build
/// without it says which build it needs instead of running untraced.
#[test]
fn trace_writes_both_sides_timelines_or_names_the_build_it_needs() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let prefix = std::env::temp_dir().join(format!("barewire-perf-trace-{}", std::process::id()));
    let prefix = prefix.to_str().unwrap();
    let (ok, out, err) = perf(&[
        "write_lat",
        "--loopback",
        "-s",
        "8",
        "-n",
        "300",
        "--trace",
        prefix,
    ]);
    if !barewire_engine::trace::ENABLED {
        assert!(!ok, "ran untraced:\n{out}");
        assert!(
            err.contains("--trace needs a build with the trace feature"),
            "{err}"
        );
        return;
    }
    assert!(ok, "{out}\n{err}");
    for side in ["client", "server"] {
        let path = format!("{prefix}.{side}");
        let n = common::timeline_counts(&path, &[1, 2, 6, 5, 0x101]);
        let _ = std::fs::remove_file(&path);
        assert!(
            n[0] > 0 && n[0] == n[1],
            "{side}: {} enters, {} returns",
            n[0],
            n[1]
        );
        // Each side posts, places and sees one message per iteration (and the warm-up's).
        for (count, what) in n[2..].iter().zip(["posts", "placements", "bytes seen"]) {
            assert!(*count >= 300, "{side}: {count} {what}");
        }
    }
}
