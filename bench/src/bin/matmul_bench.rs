//! matmul-bench: the distributed matrix multiply (examples/matmul.rs) beside ScaLAPACK's
//! `p?gemm` over Open MPI, at the same p, reps interleaved.
//!
//! ```text
//! cargo build --release --bins --examples && cargo build --release -p barewire-bench
//! matmul-bench [--sizes 2048,4096] [--procs 1,2] [--types f32,f64] [--reps 3] [--plots DIR]
//! matmul-bench --plots DIR --plot-only          # PNGs of the timelines already in DIR
//! ```
//!
//! Per configuration (n, p, type) and rep, three runs: barewire with matrixmultiply's kernel,
//! barewire with OpenBLAS's (loaded at run time, one thread), and ScaLAPACK
//! (`bench/peers/scalapack/pgemm.c`, built here with `mpicc` against Debian's
//! libscalapack-openmpi, whose BLAS is OpenBLAS; `OPENBLAS_NUM_THREADS=1`), each on p
//! processes pinned one per CPU. The figure is GFLOP/s of the multiply of already-distributed
//! blocks: for barewire the `submit_work` of the SUMMA tasks, for ScaLAPACK the `p?gemm`
//! call between barriers. Ratios are medians of per-rep ratios; parallel efficiency is
//! GFLOP/s at p = 2 over twice that at p = 1, per kernel, within each rep (a rep runs every
//! p back to back), then the median over reps. With `--plots DIR`, the last rep of
//! each barewire run leaves a PNG of every process's compute and wait intervals over time.
//!
//! Each rep also runs a control with no communication at all, per barewire kernel: two
//! single-process multiplies of the same size at once, pinned one per CPU. Its ceiling is
//! the slower of the two over the same rep's p = 1 run alone: the best parallel efficiency
//! this machine allows a p = 2 run that finishes with its slower rank, when both cores are
//! busy. The efficiency table prints it beside each kernel's figure, and the figure divided
//! by it (both medians of per-rep values).
//!
//! Installs what ScaLAPACK needs when it is missing (`libscalapack-openmpi-dev libopenmpi-dev
//! libopenblas-dev openmpi-bin`, through `barewire_bench::apt`).

use std::path::{Path, PathBuf};
use std::process::Command;

use barewire_bench::reps::{self, median, Row};
use clap::Parser;
use plotters::prelude::*;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "matmul-bench",
    about = "The distributed matrix multiply beside ScaLAPACK p?gemm over Open MPI"
)]
struct Cli {
    /// Matrix sizes n.
    #[arg(long, value_delimiter = ',', default_value = "2048,4096",
          value_parser = clap::value_parser!(u64).range(64..=65536))]
    sizes: Vec<u64>,
    /// Process counts p.
    #[arg(long, value_delimiter = ',', default_value = "1,2",
          value_parser = clap::value_parser!(u64).range(1..=64))]
    procs: Vec<u64>,
    /// Element types.
    #[arg(long, value_delimiter = ',', default_value = "f32,f64", value_parser = ["f32", "f64"])]
    types: Vec<String>,
    /// Reps.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Where the last rep of each barewire run leaves its timeline PNG.
    #[arg(long, value_name = "DIR")]
    plots: Option<PathBuf>,
    /// Only draw the PNGs of the timelines already in --plots DIR.
    #[arg(long, requires = "plots")]
    plot_only: bool,
}

fn main() {
    let cli = Cli::parse();
    let sizes: Vec<usize> = cli.sizes.iter().map(|&n| n as usize).collect();
    let procs: Vec<usize> = cli.procs.iter().map(|&p| p as usize).collect();
    let (types, reps, plots) = (cli.types, cli.reps as usize, cli.plots);
    if let (Some(d), true) = (&plots, cli.plot_only) {
        barewire_bench::perf::plot::load_font().expect("a font");
        draw_all(d);
        return;
    }
    let dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let (barewire, example) = (dir.join("barewire"), dir.join("examples/matmul"));
    for p in [&barewire, &example] {
        assert!(
            p.exists(),
            "{} is missing: cargo build --release --bins --examples",
            p.display()
        );
    }
    let scalapack = build_scalapack();
    if let Some(d) = &plots {
        std::fs::create_dir_all(d).unwrap();
    }

    // One row per configuration; reps run p = 1 and p = 2 back to back, so each parallel
    // efficiency compares two runs a few seconds apart (this machine's speed drifts by up to
    // 2x over minutes).
    let mut table: Vec<(String, usize, usize, Vec<Row>)> = Vec::new();
    let mut controls: Vec<(String, usize, [Pairs; 2])> = Vec::new();
    for ty in &types {
        for &n in &sizes {
            let first = table.len();
            for &p in &procs {
                let mut r = Row::named(&[
                    ("barewire, matrixmultiply", "GFLOP/s"),
                    ("barewire, OpenBLAS", "GFLOP/s"),
                    ("ScaLAPACK p?gemm, OpenBLAS", "GFLOP/s"),
                ]);
                for name in r.iter_mut() {
                    name.name =
                        Box::leak(format!("{ty} n={n} p={p}: {}", name.name).into_boxed_str());
                }
                table.push((ty.clone(), n, p, r));
            }
            let pair_at = controls.len();
            controls.push((ty.clone(), n, [Vec::new(), Vec::new()]));
            for rep in 0..reps {
                let last = rep + 1 == reps;
                for (i, &p) in procs.iter().enumerate() {
                    let mut got = Vec::new();
                    for kernel in ["matrixmultiply", "openblas"] {
                        let timeline = plots
                            .as_ref()
                            .filter(|_| last)
                            .map(|d| d.join(format!("matmul-{ty}-{n}-p{p}-{kernel}.txt")));
                        got.push(barewire_run(
                            &barewire,
                            &example,
                            n,
                            p,
                            ty,
                            kernel,
                            timeline.as_deref(),
                        ));
                    }
                    got.push(scalapack_run(&scalapack, n, p, ty));
                    Row::push_rep(&mut table[first + i].3, &got);
                    eprintln!("{ty} n={n} p={p} rep {}: {got:?}", rep + 1);
                }
                if procs.contains(&1) {
                    for (k, kernel) in ["matrixmultiply", "openblas"].into_iter().enumerate() {
                        let pair = control_pair(&barewire, &example, n, ty, kernel);
                        eprintln!("{ty} n={n} control {kernel} rep {}: {pair:?}", rep + 1);
                        controls[pair_at].2[k].push(pair);
                    }
                }
            }
        }
    }
    let rows: Vec<Row> = table.iter().flat_map(|t| t.3.clone()).collect();
    let comparisons: Vec<(String, usize, usize, &str)> = (0..rows.len() / 3)
        .flat_map(|c| {
            let name = rows[3 * c].name.split(':').next().unwrap().to_string();
            [
                (
                    format!("{name}: matrixmultiply / ScaLAPACK"),
                    3 * c,
                    3 * c + 2,
                    ">= 1.0x",
                ),
                (
                    format!("{name}: OpenBLAS / ScaLAPACK (same BLAS)"),
                    3 * c + 1,
                    3 * c + 2,
                    ">= 1.0x",
                ),
            ]
        })
        .collect();
    let cmp: Vec<(&str, usize, usize, &str)> = comparisons
        .iter()
        .map(|(n, a, b, t)| (n.as_str(), *a, *b, *t))
        .collect();
    reps::report(&rows, &cmp);
    println!();
    println!("| parallel efficiency at p = 2 (GFLOP/s at 2 / twice GFLOP/s at 1 of the same rep; median (range)) | matrixmultiply | OpenBLAS | ScaLAPACK | target | control ceiling (two p = 1 at once, slower / alone): matrixmultiply, OpenBLAS | efficiency / ceiling: matrixmultiply, OpenBLAS |");
    println!("|---|---|---|---|---|---|---|");
    for ty in &types {
        for &n in &sizes {
            let at = |p: usize| table.iter().find(|t| t.0 == *ty && t.1 == n && t.2 == p);
            let pairs = &controls.iter().find(|c| c.0 == *ty && c.1 == n).unwrap().2;
            if let (Some(one), Some(two)) = (at(1), at(2)) {
                // Per rep: efficiency, and the control's ceiling where the kernel has one.
                let per_rep = |k: usize| -> Vec<(f64, f64)> {
                    one.3[k]
                        .reps
                        .iter()
                        .zip(&two.3[k].reps)
                        .enumerate()
                        .map(|(r, (a, b))| {
                            let ceiling = pairs
                                .get(k)
                                .and_then(|c| c.get(r))
                                .map_or(f64::NAN, |c| 100.0 * c.0.min(c.1) / a.0);
                            (100.0 * b.0 / (2.0 * a.0), ceiling)
                        })
                        .collect()
                };
                let eff = |k: usize| percent(per_rep(k).iter().map(|e| e.0).collect());
                let ceiling = |k: usize| percent(per_rep(k).iter().map(|e| e.1).collect());
                let adjusted =
                    |k: usize| percent(per_rep(k).iter().map(|(e, c)| 100.0 * e / c).collect());
                println!(
                    "| {ty} n={n} | {} | {} | {} | >= 85% | {}, {} | {}, {} |",
                    eff(0),
                    eff(1),
                    eff(2),
                    ceiling(0),
                    ceiling(1),
                    adjusted(0),
                    adjusted(1)
                );
            }
        }
    }
    if let Some(d) = &plots {
        if let Err(e) = barewire_bench::perf::plot::load_font() {
            eprintln!("matmul-bench: no plots: {e}");
            return;
        }
        draw_all(d);
    }
}

/// Per rep, the two GFLOP/s of a control pair (one list per barewire kernel, per type and n).
type Pairs = Vec<(f64, f64)>;

/// "median% (lowest-highest)" of the finite values; "n/a" without any.
fn percent(v: Vec<f64>) -> String {
    let v: Vec<f64> = v.into_iter().filter(|e| e.is_finite()).collect();
    if v.is_empty() {
        return "n/a".into();
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.0}% ({lo:.0}-{hi:.0})", median(v))
}

/// The control: two single-process runs of the example at once, the first pinned to CPU 0
/// and the second to CPU 1 (by the launcher's affinity being inherited); both GFLOP/s.
fn control_pair(barewire: &Path, example: &Path, n: usize, ty: &str, kernel: &str) -> (f64, f64) {
    let start = |cpu: usize| {
        let mut c = Command::new("taskset");
        c.args(["-c", &cpu.to_string()])
            .arg(barewire)
            .args(["run", "-n", "1", "--no-pin", "--"])
            .arg(example)
            .args(["--n", &n.to_string(), "--type", ty, "--kernel", kernel])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c.spawn().expect("taskset (util-linux)")
    };
    let (a, b) = (start(0), start(1));
    let gflops = |c: std::process::Child| {
        let out = c.wait_with_output().expect("control run");
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            eprintln!(
                "FAILED: control n={n} {ty} {kernel}: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            return f64::NAN;
        }
        field(&text, "matmul ", "gflops=")
    };
    (gflops(a), gflops(b))
}

/// A PNG beside every timeline file in `dir`.
fn draw_all(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.extension().is_some_and(|x| x == "txt") {
            plot(&path, &path.with_extension("png"));
        }
    }
}

/// GFLOP/s of one run of the example.
fn barewire_run(
    barewire: &Path,
    example: &Path,
    n: usize,
    p: usize,
    ty: &str,
    kernel: &str,
    timeline: Option<&Path>,
) -> f64 {
    let mut c = Command::new(barewire);
    c.args(["run", "-n", &p.to_string(), "--"])
        .arg(example)
        .args(["--n", &n.to_string(), "--type", ty, "--kernel", kernel]);
    if let Some(t) = timeline {
        c.arg("--timeline").arg(t);
    }
    let out = c.output().expect("barewire run");
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // Counted, not hidden: the rep's figure is NaN and the failure is printed.
        eprintln!(
            "FAILED: matmul n={n} p={p} {ty} {kernel}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return f64::NAN;
    }
    field(&text, "matmul ", "gflops=")
}

fn scalapack_run(bin: &Path, n: usize, p: usize, ty: &str) -> f64 {
    let out = Command::new("mpirun")
        .args([
            "--allow-run-as-root",
            "--bind-to",
            "core",
            "-n",
            &p.to_string(),
        ])
        .args(["-x", "OPENBLAS_NUM_THREADS=1"])
        .arg(bin)
        .args([&n.to_string(), ty, "256", "1"])
        .output()
        .expect("mpirun");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pgemm failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    field(&text, "scalapack ", "gflops=")
}

fn field(text: &str, line: &str, key: &str) -> f64 {
    let l = text
        .lines()
        .find(|l| l.starts_with(line))
        .unwrap_or_else(|| panic!("no {line:?} line in {text:?}"));
    l.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {l:?}"))
}

/// Builds the ScaLAPACK driver into the temporary directory, installing Open MPI, ScaLAPACK
/// and OpenBLAS first if they are missing.
fn build_scalapack() -> PathBuf {
    if let Err(how) = barewire_bench::apt::ensure(&[
        "libopenmpi-dev",
        "libscalapack-openmpi-dev",
        "libopenblas-dev",
        "openmpi-bin",
    ]) {
        panic!("matmul-bench runs ScaLAPACK beside barewire: {how}");
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/scalapack/pgemm.c");
    let bin = std::env::temp_dir().join("barewire-pgemm");
    let st = Command::new("mpicc")
        .args(["-O2"])
        .arg(&src)
        .arg("-o")
        .arg(&bin)
        .args(["-lscalapack-openmpi", "-lblas", "-lm"])
        .status()
        .expect("mpicc (apt-get install libopenmpi-dev libscalapack-openmpi-dev libopenblas-dev)");
    assert!(
        st.success(),
        "building {} failed (mpi.h and the ScaLAPACK library come from apt-get install \
         libopenmpi-dev libscalapack-openmpi-dev)",
        src.display()
    );
    bin
}

/// A PNG of a timeline file (`rank node kind start_ns end_ns` per line): one lane per
/// process, compute intervals in blue, waits for panels in red.
fn plot(txt: &Path, png: &Path) {
    let text = std::fs::read_to_string(txt).unwrap();
    let spans: Vec<(usize, bool, f64, f64)> = text
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((
                w.first()?.parse().ok()?,
                *w.get(2)? == "compute",
                w.get(3)?.parse::<f64>().ok()? / 1e6,
                w.get(4)?.parse::<f64>().ok()? / 1e6,
            ))
        })
        .collect();
    let lanes = spans.iter().map(|s| s.0).max().unwrap_or(0) + 1;
    let end = spans.iter().map(|s| s.3).fold(1.0, f64::max);
    let root = BitMapBackend::new(png, (1100, 160 + 70 * lanes as u32)).into_drawing_area();
    root.fill(&WHITE).unwrap();
    let title = txt.file_stem().unwrap().to_string_lossy().to_string();
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: compute (blue) and waiting for panels (red)"),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..end, -0.5f64..lanes as f64 - 0.5)
        .unwrap();
    chart
        .configure_mesh()
        .x_desc("ms since the workflow was submitted")
        .y_desc("process")
        .y_labels(lanes)
        .y_label_formatter(&|y| format!("rank {}", y.round() as usize))
        .draw()
        .unwrap();
    chart
        .draw_series(spans.iter().map(|&(r, compute, s, e)| {
            let color = if compute { BLUE.mix(0.8) } else { RED.mix(0.9) };
            let (y0, y1) = (r as f64 - 0.35, r as f64 + 0.35);
            Rectangle::new([(s, y0), (e.max(s + end / 2000.0), y1)], color.filled())
        }))
        .unwrap();
    root.present().unwrap();
}
