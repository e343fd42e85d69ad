//! Distributed matrix multiply, C = A·B, as barewire's worked example: SUMMA over a grid of
//! the cluster's processes, tiles in registered regions, panels pulled by RDMA READ while the
//! previous panel is multiplied, driven by `submit_work`.
//!
//!     cargo build --release --example matmul --bin barewire
//!     target/release/barewire run -n 2 -- target/release/examples/matmul --n 2048 --type f32 --check
//!     srun -O -n 2 target/release/examples/matmul --n 4096 --type f64
//!
//! Every process (rank `r` of `p`, on a `pr × pc` grid as square as `p` allows) holds three
//! blocks in registered memory: its `n/pr × n/pc` blocks of A, B and C. A's block is kept as
//! column panels of width `b` (each panel contiguous), B's and C's row-major (with rows a
//! little longer than the block's, see `PAD`). Rank 0 builds A and B and RDMA WRITEs every
//! block to its owner. Then it submits a workflow of one `summa` task per process, placed on
//! that process (`near`): for each global panel `k`, the task
//! needs A's panel `k` of its block row (from the process of its grid row that owns it) and
//! B's panel `k` of its block column; it READs panel `k + 1` into the second buffer while it
//! multiplies panel `k` (matrixmultiply's gemm, in strips, yielding between them so the
//! transfers progress), and reports when it waited and when it computed. Rank 0 then READs
//! every C block back, compares C with a single-process multiply (`--check`), and prints one
//! line: `matmul n=.. p=.. type=.. seconds=.. gflops=.. error=..`. With `--timeline FILE` it
//! writes each process's compute and wait intervals (for `matmul-bench`'s plot).
//!
//! The local kernel is matrixmultiply's gemm; `--kernel openblas` loads OpenBLAS's CBLAS at
//! run time instead (one thread), the BLAS Debian's ScaLAPACK uses. Other flags: `--n 1024`,
//! `--type f32|f64`, `--panel 256` (panel width), `--check`, and `--broken` (skips the last
//! panel: a wrong product that `--check` must refuse).

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use barewire::cluster::{Cluster, ClusterOptions, Launch, MembershipOptions, Task, Workflow};
use barewire::engine::{spawn_local, time, yield_now, Runtime};
use barewire::{Align, Error, Mesh, Node, Region, RemoteRegion, Result};
use bytemuck::Pod;

/// OpenBLAS's `cblas_sgemm` and `cblas_dgemm`, loaded at run time with `--kernel openblas`
/// (one thread: `OPENBLAS_NUM_THREADS=1`), so the same BLAS as the ScaLAPACK peer can be
/// compared without linking it into the example.
struct Cblas {
    sgemm: CblasGemm<f32>,
    dgemm: CblasGemm<f64>,
}

type CblasGemm<T> = unsafe extern "C" fn(
    i32,
    i32,
    i32,
    i32,
    i32,
    i32,
    T,
    *const T,
    i32,
    *const T,
    i32,
    T,
    *mut T,
    i32,
);

static CBLAS: std::sync::OnceLock<Cblas> = std::sync::OnceLock::new();

fn load_openblas() -> Result<()> {
    // SAFETY: setting a variable before any other thread exists (OpenBLAS reads it on load).
    unsafe { std::env::set_var("OPENBLAS_NUM_THREADS", "1") };
    for lib in ["libopenblas.so.0", "libopenblas.so", "libblas.so.3"] {
        let name = std::ffi::CString::new(lib).expect("no NUL");
        // SAFETY: dlopen with a valid C string; the handle is kept for the process's life.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
        if h.is_null() {
            continue;
        }
        let sym = |s: &str| {
            let s = std::ffi::CString::new(s).expect("no NUL");
            // SAFETY: looking a symbol up in a handle dlopen returned.
            unsafe { libc::dlsym(h, s.as_ptr()) }
        };
        let (s, d) = (sym("cblas_sgemm"), sym("cblas_dgemm"));
        if s.is_null() || d.is_null() {
            continue;
        }
        // SAFETY: both symbols are CBLAS's ?gemm, whose C signature CblasGemm spells out.
        let k = unsafe {
            Cblas {
                sgemm: std::mem::transmute::<*mut libc::c_void, CblasGemm<f32>>(s),
                dgemm: std::mem::transmute::<*mut libc::c_void, CblasGemm<f64>>(d),
            }
        };
        let _ = CBLAS.set(k);
        return Ok(());
    }
    Err(Error::Invalid(
        "--kernel openblas: no libopenblas with cblas_?gemm (apt-get install libopenblas0)".into(),
    ))
}

/// CBLAS row-major, no transposition.
const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;

/// An element type with a gemm kernel.
trait Elem: Pod + Default + std::fmt::Display + PartialOrd {
    const NAME: &'static str;
    /// The largest acceptable error, relative to `n · max|A| · max|B|`.
    const TOLERANCE: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// C (m×n) += A (m×k) · B (k×n), all row-major with the given row strides.
    ///
    /// # Safety
    /// The pointers must address matrices of those shapes and strides, C not overlapping A or B.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        k: usize,
        n: usize,
        a: *const Self,
        lda: usize,
        b: *const Self,
        ldb: usize,
        c: *mut Self,
        ldc: usize,
    );
}

/// `Elem` for a float type: its name, tolerance, and which CBLAS and matrixmultiply gemm.
macro_rules! elem {
    ($t:ty, $name:literal, $tolerance:literal, $cblas:ident, $mm:path) => {
        impl Elem for $t {
            const NAME: &'static str = $name;
            const TOLERANCE: f64 = $tolerance;
            fn from_f64(v: f64) -> $t {
                v as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            unsafe fn gemm(
                m: usize,
                k: usize,
                n: usize,
                a: *const $t,
                lda: usize,
                b: *const $t,
                ldb: usize,
                c: *mut $t,
                ldc: usize,
            ) {
                if let Some(blas) = CBLAS.get() {
                    let i = |v: usize| v as i32;
                    // SAFETY: the caller's contract is CBLAS's, for row-major matrices.
                    return unsafe {
                        (blas.$cblas)(
                            ROW_MAJOR,
                            NO_TRANS,
                            NO_TRANS,
                            i(m),
                            i(n),
                            i(k),
                            1.0,
                            a,
                            i(lda),
                            b,
                            i(ldb),
                            1.0,
                            c,
                            i(ldc),
                        )
                    };
                }
                let s = |v: usize| v as isize;
                // SAFETY: the caller's contract is matrixmultiply's.
                unsafe { $mm(m, k, n, 1.0, a, s(lda), 1, b, s(ldb), 1, 1.0, c, s(ldc), 1) }
            }
        }
    };
}

elem!(f32, "f32", 1e-4, sgemm, matrixmultiply::sgemm);
elem!(f64, "f64", 1e-10, dgemm, matrixmultiply::dgemm);

/// The process grid and the block and panel shapes.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
struct Grid {
    n: usize,
    pr: usize,
    pc: usize,
    /// Panel width.
    b: usize,
}

impl Grid {
    fn new(n: usize, p: usize, b: usize) -> Result<Grid> {
        let pr = (1..=p)
            .filter(|d| p % d == 0 && d * d <= p)
            .max()
            .unwrap_or(1);
        let g = Grid {
            n,
            pr,
            pc: p / pr,
            b,
        };
        if n % g.pr != 0 || n % g.pc != 0 || g.mr() % b != 0 || g.nc() % b != 0 {
            return Err(Error::Invalid(format!(
                "n = {n} must split into {}×{} blocks of whole panels of {b}",
                g.pr, g.pc
            )));
        }
        Ok(g)
    }
    /// Rows of a block.
    fn mr(&self) -> usize {
        self.n / self.pr
    }
    /// Columns of a block.
    fn nc(&self) -> usize {
        self.n / self.pc
    }
    /// The row stride of B's and C's blocks and of B's panel buffers: `nc` and a little more
    /// (see `PAD`).
    fn ld(&self) -> usize {
        self.nc() + PAD
    }
    fn at(&self, rank: usize) -> (usize, usize) {
        (rank / self.pc, rank % self.pc)
    }
    fn rank(&self, row: usize, col: usize) -> usize {
        row * self.pc + col
    }
    /// Who holds A's panel `k` for grid row `row`, and where it starts in that block.
    fn a_panel(&self, row: usize, k: usize) -> (usize, usize) {
        let col = k * self.b / self.nc();
        let q = (k * self.b % self.nc()) / self.b;
        (self.rank(row, col), q * self.mr() * self.b)
    }
    /// Who holds B's panel `k` for grid column `col`, and where it starts in that block.
    fn b_panel(&self, col: usize, k: usize) -> (usize, usize) {
        let row = k * self.b / self.mr();
        let local = k * self.b % self.mr();
        (self.rank(row, col), local * self.ld())
    }
}

/// Panel buffers per operand: the panel being multiplied and two on their way (a READ from a
/// peer that computes moves only between its tiles, so one panel ahead was not always enough).
const DEPTH: usize = 3;

/// The side of the C tiles one gemm call updates between two yields.
const TILE: usize = 256;

/// Elements past the end of each row of B and C, unused. With rows a multiple of 4 KiB apart
/// (n = 2048 or 4096 split in two), the rows of a tile fall into the same few cache sets and
/// evict one another; 16 elements apart they spread. Measured on the compute loop alone (f32,
/// n = 2048, 8 alternations): 9-10% less time at p = 1 and p = 2, more with both cores busy.
const PAD: usize = 16;

/// When a process waited for panels (kind 0) and computed (kind 1), in ns from the start.
type Spans = Vec<(u8, u64, u64)>;

/// One process's blocks, panel buffers, and every other process's blocks.
struct Part<T: Pod> {
    grid: Grid,
    rank: usize,
    mesh: Mesh,
    a: Region<T>,
    b: Region<T>,
    c: Region<T>,
    pa: [Region<T>; DEPTH],
    pb: [Region<T>; DEPTH],
    /// By rank (none for this one): its A, B and C blocks.
    remote: Vec<Option<[RemoteRegion<T>; 3]>>,
    done: Cell<bool>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl<T: Elem> Part<T> {
    async fn new(node: &Node, mesh: &Mesh, grid: Grid) -> Result<Part<T>> {
        let (mr, nc, ld, b) = (grid.mr(), grid.nc(), grid.ld(), grid.b);
        let region = |len| node.region::<T>(len, Align::Page);
        let part = Part {
            grid,
            rank: mesh.rank(),
            mesh: mesh.clone(),
            a: region(mr * nc)?,
            b: region(mr * ld)?,
            c: region(mr * ld)?,
            pa: [region(mr * b)?, region(mr * b)?, region(mr * b)?],
            pb: [region(b * ld)?, region(b * ld)?, region(b * ld)?],
            remote: Vec::new(),
            done: Cell::new(false),
        };
        // C = 0 is written before the multiply, as the ScaLAPACK driver writes its C, and the
        // other blocks and the panel buffers are written too: their pages are then resident
        // in this process when the timed part starts, as a verbs registration (which pins
        // them) would leave them. Otherwise the first touch of each page, inside the
        // multiply, costs p = 2 runs more than p = 1 runs: the panel buffers, and the A and
        // B blocks that rank 0 WRITEs into a peer's memory (a shared-memory peer's writes
        // put the pages in the file, not in the owner's page table). This comes before any
        // peer learns where the blocks are, so no zero lands on what rank 0 has written.
        for r in [&part.a, &part.b, &part.c]
            .into_iter()
            .chain(&part.pa)
            .chain(&part.pb)
        {
            zero(r).await;
        }
        // Every process tells every other where its blocks are (a region is bound to the
        // connection it was sent over).
        let mut remote = Vec::new();
        for j in 0..mesh.size() {
            if j != part.rank {
                let ep = mesh.endpoint(j);
                ep.send_region(&part.a).await?;
                ep.send_region(&part.b).await?;
                ep.send_region(&part.c).await?;
            }
        }
        for j in 0..mesh.size() {
            if j == part.rank {
                remote.push(None);
                continue;
            }
            let ep = mesh.endpoint(j);
            remote.push(Some([
                ep.recv_region::<T>().await?,
                ep.recv_region::<T>().await?,
                ep.recv_region::<T>().await?,
            ]));
        }
        let part = Part { remote, ..part };
        Ok(part)
    }

    /// Brings A's and B's panel `k` into buffer `slot` (READs from their owners; nothing to
    /// do for what this process holds).
    async fn fetch(self: Rc<Self>, k: usize, slot: usize) -> Result<()> {
        let g = self.grid;
        let (row, col) = g.at(self.rank);
        let (owner, at) = g.a_panel(row, k);
        if let Some(r) = &self.remote[owner] {
            let len = g.mr() * g.b;
            self.mesh
                .endpoint(owner)
                .read_to_region(&r[0], at as u64, &self.pa[slot], 0, len)
                .await?;
        }
        let (owner, at) = g.b_panel(col, k);
        if let Some(r) = &self.remote[owner] {
            let len = g.b * g.ld();
            self.mesh
                .endpoint(owner)
                .read_to_region(&r[1], at as u64, &self.pb[slot], 0, len)
                .await?;
        }
        Ok(())
    }

    /// This process's part of SUMMA: C block += Σ_k A panel k · B panel k, over the first
    /// `panels` panels (all `n / b` of them, unless the run is deliberately broken).
    async fn summa(self: Rc<Self>, t0: u64, panels: usize) -> Result<Spans> {
        let g = self.grid;
        let (row, col) = g.at(self.rank);
        let (mr, nc, ld, b) = (g.mr(), g.nc(), g.ld(), g.b);
        let mut spans = Spans::new();
        // The sum over k may go in any order: each process starts at the first panel it holds
        // itself (its A block's first column panel), so it computes from the first moment
        // while the panels it must READ are on their way.
        let first = (col * g.nc() / b) % (g.n / b);
        let order: Vec<usize> = (0..panels).map(|i| (first + i) % panels).collect();
        // Panels in flight, oldest first: DEPTH - 1 ahead of the one being multiplied.
        let mut ahead = std::collections::VecDeque::new();
        for (i, &k) in order.iter().enumerate().take(DEPTH - 1) {
            ahead.push_back(spawn_local(self.clone().fetch(k, i % DEPTH)));
        }
        for (i, &k) in order.iter().enumerate() {
            let slot = i % DEPTH;
            let w0 = now_ns();
            match ahead.pop_front() {
                Some(h) => h
                    .await
                    .map_err(|e| Error::Invalid(format!("panel fetch: {e}")))??,
                None => unreachable!("panel {k} was asked for"),
            }
            spans.push((0, w0.saturating_sub(t0), now_ns().saturating_sub(t0)));
            let later = i + DEPTH - 1;
            if later < panels {
                ahead.push_back(spawn_local(self.clone().fetch(order[later], later % DEPTH)));
            }
            // Where panel k is: in this process's own block, or in the buffer it was read into.
            let (a_owner, a_at) = g.a_panel(row, k);
            let (b_owner, b_at) = g.b_panel(col, k);
            let a = if a_owner == self.rank {
                // SAFETY: a_at + mr·b ≤ mr·nc, inside the block.
                unsafe { self.a.as_ptr().add(a_at) }
            } else {
                self.pa[slot].as_ptr()
            };
            let bp = if b_owner == self.rank {
                // SAFETY: b_at + b·ld ≤ mr·ld, inside the block.
                unsafe { self.b.as_ptr().add(b_at) }
            } else {
                self.pb[slot].as_ptr()
            };
            // C += A_k (mr×b) · B_k (b×nc), in tiles of C of at most TILE × TILE (about a
            // millisecond each), yielding between them so that the next panel's transfer and
            // the node's membership traffic move meanwhile.
            let c0 = now_ns();
            for r0 in (0..mr).step_by(TILE) {
                for j0 in (0..nc).step_by(TILE) {
                    let (rows, cols) = (TILE.min(mr - r0), TILE.min(nc - j0));
                    // SAFETY: A_k is mr×b row-major (stride b), B_k is b×nc (stride ld), C is
                    // mr×nc (stride ld); the tile lies inside each; C is this process's own
                    // block, which no peer touches while the task runs, and neither A nor B
                    // overlaps it.
                    unsafe {
                        T::gemm(
                            rows,
                            b,
                            cols,
                            a.add(r0 * b),
                            b,
                            bp.add(j0),
                            ld,
                            self.c.as_mut_ptr().add(r0 * ld + j0),
                            ld,
                        )
                    };
                    yield_now().await;
                }
            }
            spans.push((1, c0.saturating_sub(t0), now_ns().saturating_sub(t0)));
        }
        Ok(spans)
    }
}

/// A reproducible matrix with entries in [-1, 1). (Made a block of rows at a time, yielding
/// between them: a core that holds on for long is declared down by its peers.)
async fn matrix<T: Elem>(n: usize, seed: u64) -> Vec<T> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut m = Vec::with_capacity(n * n);
    for _ in (0..n).step_by(64) {
        let rows = 64.min(n - m.len() / n);
        m.extend((0..rows * n).map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            T::from_f64((x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0)
        }));
        yield_now().await;
    }
    m
}

/// Copies `data` into the start of `r`, a few MiB at a time with a yield between (a copy of
/// hundreds of MiB into fresh pages holds the core for a second: its peers would declare it
/// down).
async fn fill<T: Elem>(r: &Region<T>, data: &[T]) {
    const CHUNK: usize = 1 << 20;
    for (k, piece) in data.chunks(CHUNK).enumerate() {
        r.copy_from(k * CHUNK, piece);
        yield_now().await;
    }
}

/// Writes zeros over all of `r`, a MiB at a time with a yield between.
async fn zero<T: Elem>(r: &Region<T>) {
    let zeros = vec![T::default(); (1 << 20) / std::mem::size_of::<T>()];
    for at in (0..r.len()).step_by(zeros.len()) {
        r.copy_from(at, &zeros[..zeros.len().min(r.len() - at)]);
        yield_now().await;
    }
}

/// Rank 0: every block of A (as column panels) and B to its owner.
async fn distribute<T: Elem>(part: &Part<T>, a: &[T], bm: &[T], node: &Node) -> Result<()> {
    let g = part.grid;
    let (mr, nc, ld, b, n) = (g.mr(), g.nc(), g.ld(), g.b, g.n);
    let stage_a = node.region::<T>(mr * nc, Align::Page)?;
    let stage_b = node.region::<T>(mr * ld, Align::Page)?;
    for rank in 0..g.pr * g.pc {
        let (row, col) = g.at(rank);
        let mut blk = Vec::with_capacity(mr * nc);
        for q in 0..nc / b {
            for i in 0..mr {
                let start = (row * mr + i) * n + col * nc + q * b;
                blk.extend_from_slice(&a[start..start + b]);
            }
            yield_now().await;
        }
        let mut bblk = Vec::with_capacity(mr * ld);
        for i in 0..mr {
            let start = (row * mr + i) * n + col * nc;
            bblk.extend_from_slice(&bm[start..start + nc]);
            bblk.extend_from_slice(&[T::default(); PAD]);
            if i % 256 == 255 {
                yield_now().await;
            }
        }
        match &part.remote[rank] {
            None => {
                fill(&part.a, &blk).await;
                fill(&part.b, &bblk).await;
            }
            Some(r) => {
                fill(&stage_a, &blk).await;
                fill(&stage_b, &bblk).await;
                let ep = part.mesh.endpoint(rank);
                ep.write_from_region(&r[0], 0, &stage_a, 0, mr * nc).await?;
                ep.write_from_region(&r[1], 0, &stage_b, 0, mr * ld).await?;
            }
        }
    }
    Ok(())
}

/// Rank 0: every C block, READ back and put in place.
async fn gather<T: Elem>(part: &Part<T>, node: &Node) -> Result<Vec<T>> {
    let g = part.grid;
    let (mr, nc, ld, n) = (g.mr(), g.nc(), g.ld(), g.n);
    let mut c = vec![T::default(); n * n];
    let stage = node.region::<T>(mr * ld, Align::Page)?;
    for rank in 0..g.pr * g.pc {
        let blk = match &part.remote[rank] {
            None => &part.c,
            Some(r) => {
                part.mesh
                    .endpoint(rank)
                    .read_to_region(&r[2], 0, &stage, 0, mr * ld)
                    .await?;
                &stage
            }
        };
        let (row, col) = g.at(rank);
        for i in 0..mr {
            let start = (row * mr + i) * n + col * nc;
            // SAFETY: row i of the block (stride ld) lies inside the region; every SUMMA task has
            // ended and the READ above completed, so nothing writes the block meanwhile.
            let src = unsafe { std::slice::from_raw_parts(blk.as_ptr().add(i * ld), nc) };
            c[start..start + nc].copy_from_slice(src);
            if i % 256 == 255 {
                yield_now().await;
            }
        }
    }
    Ok(c)
}

/// max |C − A·B| / (n · max|A| · max|B|), with A·B by one process (in tiles of C, yielding
/// between them).
async fn error<T: Elem>(n: usize, a: &[T], b: &[T], c: &[T]) -> f64 {
    let mut want = vec![T::default(); n * n];
    for r0 in (0..n).step_by(TILE) {
        for j0 in (0..n).step_by(TILE) {
            let (rows, cols) = (TILE.min(n - r0), TILE.min(n - j0));
            // SAFETY: three n×n row-major matrices, `want` apart from the others; the tile
            // (rows from r0, columns from j0) lies inside each.
            unsafe {
                T::gemm(
                    rows,
                    n,
                    cols,
                    a.as_ptr().add(r0 * n),
                    n,
                    b.as_ptr().add(j0),
                    n,
                    want.as_mut_ptr().add(r0 * n + j0),
                    n,
                )
            };
            yield_now().await;
        }
    }
    let max = |v: &[T]| v.iter().fold(0f64, |m, x| m.max(x.to_f64().abs()));
    let diff = c
        .iter()
        .zip(&want)
        .fold(0f64, |m, (x, y)| m.max((x.to_f64() - y.to_f64()).abs()));
    diff / (n as f64 * max(a) * max(b))
}

struct Args {
    n: usize,
    panel: usize,
    check: bool,
    timeline: Option<String>,
    /// Skip the last panel: a deliberately wrong product, which `--check` must refuse.
    broken: bool,
}

async fn run<T: Elem>(args: Args) -> Result<()> {
    let me = Launch::from_env()?;
    // Cores that compute for a millisecond between yields answer membership probes late: a
    // compute job trades detection time for tolerance (about 0.7 s instead of 0.2 s).
    let opts = ClusterOptions {
        membership: Some(MembershipOptions {
            probe_period: Duration::from_millis(100),
            probe_rtt: Duration::from_millis(60),
            suspect_to_down_after: Duration::from_millis(500),
        }),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::start(&me, opts).await?;
    let grid = Grid::new(args.n, me.size, args.panel)?;
    let part = Rc::new(Part::<T>::new(cluster.node(), cluster.mesh(), grid).await?);
    let p = part.clone();
    let panels = if args.broken {
        args.n / args.panel - 1
    } else {
        args.n / args.panel
    };
    cluster.register_task("summa", move |t0: u64, _ctx| {
        let p = p.clone();
        async move { p.summa(t0, panels).await.map_err(|e| e.to_string()) }
    });
    let p = part.clone();
    cluster.register_task("finish", move |(): (), _ctx| {
        let p = p.clone();
        async move {
            p.done.set(true);
            Ok(())
        }
    });
    if me.rank == 0 {
        let (a, b) = (matrix::<T>(args.n, 1).await, matrix::<T>(args.n, 2).await);
        let t = Instant::now();
        distribute(&part, &a, &b, cluster.node()).await?;
        let spread = t.elapsed();
        let t0 = now_ns();
        let started = Instant::now();
        let mut wf = Workflow::new();
        let parts: Vec<_> = (0..me.size)
            .map(|r| wf.add(Task::<Spans>::new("summa", &t0).near(r)))
            .collect();
        let results = cluster.submit_work(wf).await?;
        let secs = started.elapsed().as_secs_f64();
        let mut timeline = Vec::new();
        for (r, id) in parts.iter().enumerate() {
            match results.get(*id) {
                Ok(spans) => timeline.push((r, results.ran_on(*id).to_vec(), spans)),
                Err(e) => return Err(Error::Invalid(format!("summa on {r}: {e}"))),
            }
        }
        let c = gather(&part, cluster.node()).await?;
        let err = if args.check {
            let e = error(args.n, &a, &b, &c).await;
            if e.is_nan() || e > T::TOLERANCE {
                return Err(Error::Invalid(format!(
                    "relative error {e:e} over the {} bound {:e}",
                    T::NAME,
                    T::TOLERANCE
                )));
            }
            format!("{e:.2e}")
        } else {
            "unchecked".into()
        };
        let n = args.n as f64;
        println!(
            "matmul n={} p={} grid={}x{} type={} kernel={} panel={} distribute_s={:.3} seconds={:.4} gflops={:.2} error={err}",
            args.n,
            me.size,
            grid.pr,
            grid.pc,
            T::NAME,
            if CBLAS.get().is_some() { "openblas" } else { "matrixmultiply" },
            grid.b,
            spread.as_secs_f64(),
            secs,
            2.0 * n * n * n / secs / 1e9,
        );
        if let Some(path) = &args.timeline {
            let mut out = String::new();
            for (r, on, spans) in &timeline {
                for (kind, s, e) in spans {
                    let k = if *kind == 0 { "wait" } else { "compute" };
                    out += &format!("{r} {} {k} {s} {e}\n", on[0]);
                }
            }
            std::fs::write(path, out).map_err(|e| Error::Invalid(format!("{path}: {e}")))?;
        }
        let mut wf = Workflow::new();
        for r in 0..me.size {
            wf.add(Task::<()>::new("finish", &()).near(r));
        }
        cluster.submit_work(wf).await?;
    }
    while !part.done.get() {
        time::sleep(Duration::from_millis(5)).await;
    }
    // Let rank 0's last answers leave before the connections close.
    time::sleep(Duration::from_millis(200)).await;
    Ok(())
}

fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let get = |k: &str| {
        argv.iter()
            .position(|a| a == k)
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    let num = |k: &str, d: usize| get(k).map_or(d, |v| v.parse().expect("a number"));
    let args = Args {
        n: num("--n", 1024),
        panel: num("--panel", 256),
        check: argv.iter().any(|a| a == "--check"),
        timeline: get("--timeline"),
        broken: argv.iter().any(|a| a == "--broken"),
    };
    match get("--kernel").as_deref() {
        None | Some("matrixmultiply") => {}
        Some("openblas") => {
            if let Err(e) = load_openblas() {
                eprintln!("matmul: {e}");
                std::process::exit(2);
            }
        }
        Some(other) => {
            eprintln!("matmul: --kernel {other}: matrixmultiply or openblas");
            std::process::exit(2);
        }
    }
    let ty = get("--type").unwrap_or_else(|| "f32".into());
    let rt = Runtime::builder()
        .cores(1)
        .pin(false)
        .build()
        .expect("runtime");
    let r = match ty.as_str() {
        "f32" => rt.block_on(run::<f32>(args)),
        "f64" => rt.block_on(run::<f64>(args)),
        other => Err(Error::Invalid(format!("--type {other}: f32 or f64"))),
    };
    if let Err(e) = r {
        eprintln!("matmul: {e}");
        std::process::exit(1);
    }
}
