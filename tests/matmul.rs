//! examples/matmul.rs under `barewire run`: the distributed product equals a single-process
//! multiply (f32 and f64, grids 1×1, 1×2 and 2×2, both local kernels where OpenBLAS is
//! installed), and a deliberately wrong product (the last panel skipped) is refused by the
//! same check. (tests/slurm.rs runs it under `srun`.) One test at a time: each keeps every
//! CPU busy.

use std::process::{Command, Output};

mod common;

fn run(procs: usize, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("120")
        .arg(env!("CARGO_BIN_EXE_barewire"))
        .args(["run", "-n", &procs.to_string(), "--no-pin", "--"])
        .arg(common::example("matmul"))
        .args(args)
        .env("BAREWIRE_DRIVER", "soft")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn the_distributed_product_matches_a_single_process_multiply() {
    let _one_at_a_time = common::serial();
    for (procs, grid) in [(1, "1x1"), (2, "1x2"), (4, "2x2")] {
        for ty in ["f32", "f64"] {
            let o = run(
                procs,
                &["--n", "512", "--panel", "64", "--type", ty, "--check"],
            );
            let t = text(&o);
            assert!(o.status.success(), "p={procs} {ty}: {t}");
            assert!(
                t.contains(&format!("matmul n=512 p={procs} grid={grid} type={ty}")),
                "{t}"
            );
            assert!(!t.contains("error=unchecked"), "{t}");
        }
    }
}

#[test]
fn with_openblas_as_the_kernel_the_product_is_the_same() {
    let _one_at_a_time = common::serial();
    let have = ["libopenblas.so.0", "libopenblas.so"].iter().any(|l| {
        std::path::Path::new("/usr/lib/x86_64-linux-gnu")
            .join(l)
            .exists()
    });
    if !have {
        eprintln!("SKIP: OpenBLAS is not installed (apt-get install libopenblas0)");
        return;
    }
    let o = run(
        2,
        &[
            "--n", "512", "--panel", "128", "--type", "f64", "--check", "--kernel", "openblas",
        ],
    );
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(t.contains("kernel=openblas"), "{t}");
}

#[test]
fn a_wrong_product_is_refused_by_the_check() {
    let _one_at_a_time = common::serial();
    let o = run(2, &["--n", "512", "--panel", "128", "--check", "--broken"]);
    let t = text(&o);
    assert!(!o.status.success(), "a broken product passed: {t}");
    assert!(t.contains("relative error"), "{t}");
}
