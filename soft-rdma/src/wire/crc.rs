//! CRC32c (Castagnoli), the checksum in each FPDU's CRC field (RFC 5044 §4.3).
//!
//! [`crc32c_append`] has the `crc32c` crate's meaning (a finished CRC in, a finished CRC out, so
//! pieces can be checksummed one after another), and is that crate's code for short pieces and
//! on CPUs without vector carry-less multiplies. From [`FOLD_FROM`] bytes on, where the CPU has
//! VPCLMULQDQ, it folds blocks of 16 bytes with carry-less multiplies instead, several at a
//! time (three interleaved `crc32` instruction streams, the crate's way, top out at 8 bytes a
//! cycle):
//! - with AVX-512F, sixteen blocks a round in four 512-bit registers: 2.0–2.4× the crate's speed
//!   from 2 KiB on, about 56 GB/s against 25 at 64 KiB, on an AMD EPYC with AVX-512 (Zen 4);
//! - with AVX2 alone (AMD Zen 3, Intel's cores without AVX-512), eight blocks a round in four
//!   256-bit registers: 1.3–1.6× the crate's speed from 512 bytes to 64 KiB on an AMD EPYC of
//!   the Zen 3 generation, about 19 GB/s against 13 at 64 KiB (`bench/RESULTS.md`, fifty-fourth
//!   session). Its speed there, near 8 bytes a cycle, is what one 256-bit carry-less multiply
//!   every other cycle allows, the crate's ceiling too; what it saves is the crate's joining of
//!   its three streams.
//!
//! Both ends of a soft queue pair checksum every byte they move with CRC on (the default), so
//! this is on the path of every large WRITE, READ and channel burst. Where the provider copies
//! those bytes itself (a received payload out of the buffer the kernel filled, a Read
//! Response's snapshot), [`crc32c_copy`] copies and checksums them in one pass.
//!
//! How the fold works. With the message's bits read as a polynomial over GF(2), first bit the
//! highest power (the reflected order that CRC32c and MPA use), the CRC is the remainder of
//! (message × x³²) by the generator P, after the starting value is XORed into the first four
//! bytes. A 16-byte block `X` at some position stands for `A·x⁶⁴ + B` (A its first eight bytes,
//! B its last eight), counted from the block's end. Moving it `D` bits later, past blocks that
//! follow, multiplies it by `x^D`, and modulo P that is `A·x·(x^(63+D) mod P) + B·x·(x^(D-1) mod
//! P)`: two 64 × 32-bit carry-less products, whose 127-bit results land aligned with the block
//! `D` bits on once the 32-bit constant sits in the top half of its 64-bit operand (the extra
//! `x` is the one-bit offset a reflected carry-less product has). What is left at the end, one
//! 16-byte value and the tail shorter than a block, is finished with `crc32` instructions, which
//! compute the same remainder.

/// The generator of CRC32c, x³² included, in normal (not reflected) bit order.
const POLY: u64 = 0x1_1EDC_6F41;

/// `x^n mod P` in normal bit order.
const fn x_pow_mod(n: u32) -> u32 {
    let mut r: u64 = 1;
    let mut i = 0;
    while i < n {
        r <<= 1;
        if r & (1 << 32) != 0 {
            r ^= POLY;
        }
        i += 1;
    }
    r as u32
}

/// The operand that multiplies by `x^n mod P` in the reflected domain: the remainder reflected,
/// in the top half of a 64-bit word.
const fn fold_constant(n: u32) -> u64 {
    (x_pow_mod(n).reverse_bits() as u64) << 32
}

/// Lanes carried at once: enough independent chains to cover a carry-less multiply's latency.
const LANES: usize = 8;
/// Bytes per lane step.
const BLOCK: usize = 16;
/// (first-half, second-half) constants that move a block `LANES` blocks on, and one block on.
const FOLD_LANES: (u64, u64) = (
    fold_constant(63 + 128 * LANES as u32),
    fold_constant(128 * LANES as u32 - 1),
);
const FOLD_ONE: (u64, u64) = (fold_constant(63 + 128), fold_constant(128 - 1));
/// Bytes the 512-bit path takes per round: sixteen blocks, four to a register.
const WIDE: usize = 256;
/// Bytes the 256-bit path takes per round: eight blocks, two to a register; the lanes that
/// [`x86::finish`] carries on with.
const HALF: usize = LANES * BLOCK;
/// The constants that move a block sixteen blocks on, as the 512-bit path loads them.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
static FOLD_WIDE: [u64; 2] = [fold_constant(63 + 128 * 16), fold_constant(128 * 16 - 1)];
/// The constants that move a block eight blocks on ([`FOLD_LANES`]), as the 256-bit path loads
/// them.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
static FOLD_HALF: [u64; 2] = [FOLD_LANES.0, FOLD_LANES.1];

/// From this length on the folding paths are the faster (at 512 bytes the 512-bit one 1.2–2× the
/// crate's, even at 256, and the 256-bit one about 1.4× on a Zen 3), measured with
/// `cargo bench -p barewire-bench --bench codec -- crc32c` and, paired, with
/// `bench/results/2026-12-06-s54-crc-ab.rs`.
pub const FOLD_FROM: usize = 512;

/// The CRC32c of `crc`'s message followed by `data` (`crc` is 0 for an empty message).
///
/// ```
/// use barewire_soft_rdma::wire::crc32c_append;
/// assert_eq!(crc32c_append(0, b"123456789"), 0xE306_9283);
/// assert_eq!(crc32c_append(crc32c_append(0, b"1234"), b"56789"), 0xE306_9283);
/// ```
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= FOLD_FROM {
        let paths = x86::available();
        if paths.zmm {
            // SAFETY: `available` checked that this CPU has every feature `wide` needs.
            return unsafe { x86::wide(crc, data) };
        }
        if paths.ymm {
            // SAFETY: `available` checked that this CPU has every feature `half` needs.
            return unsafe { x86::half(crc, data) };
        }
    }
    crc32c::crc32c_append(crc, data)
}

/// Copies `src` into `dst` (of the same length) and returns [`crc32c_append`]`(crc, src)`,
/// reading `src` once for both.
///
/// The soft provider's two copies with CRC on go through here: a received payload moved from
/// the buffer the kernel filled into its region, and a Read Response's snapshot of its
/// source. Where the CPU has AVX2 and VPCLMULQDQ but not AVX-512 (the 256-bit path of
/// [`crc32c_append`]), from 512 bytes on, the folding loop stores each 128 bytes it
/// loads, and the copy costs next to nothing: from 2 KiB on it runs as fast as the CRC alone,
/// 1.1–1.5× a copy followed by the CRC at 2–64 KiB on a Zen 3 (`cargo bench -p barewire-bench
/// --bench codec -- crc32c_vs_memcpy`; `bench/RESULTS.md`, fifty-seventh session). Elsewhere
/// it is that copy and that CRC, one after the other. The CRC is of the bytes read from `src`,
/// which are the bytes written.
///
/// # Panics
/// If `dst` and `src` differ in length.
///
/// ```
/// use std::mem::MaybeUninit;
/// use barewire_soft_rdma::wire::{crc32c_append, crc32c_copy};
/// let src = vec![7u8; 3000];
/// let mut dst = vec![MaybeUninit::<u8>::uninit(); 3000];
/// let crc = crc32c_copy(0, &src, &mut dst);
/// assert_eq!(crc, crc32c_append(0, &src));
/// // SAFETY: `crc32c_copy` wrote every byte of `dst`.
/// assert!(dst.iter().all(|b| unsafe { b.assume_init() } == 7));
/// ```
pub fn crc32c_copy(crc: u32, src: &[u8], dst: &mut [std::mem::MaybeUninit<u8>]) -> u32 {
    assert_eq!(src.len(), dst.len(), "crc32c_copy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= FOLD_FROM {
        let paths = x86::available();
        if paths.ymm && !paths.zmm {
            // SAFETY: `available` checked that this CPU has every feature `half_copy` needs;
            // `dst` is writable and as long as `src`.
            return unsafe { x86::half_copy(crc, src, dst.as_mut_ptr().cast()) };
        }
    }
    // SAFETY: `dst` is as long as `src` (asserted), and a slice the caller holds mutably, so
    // the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
    crc32c_append(crc, src)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{BLOCK, FOLD_HALF, FOLD_LANES, FOLD_ONE, FOLD_WIDE, HALF, LANES, WIDE};
    use std::arch::global_asm;
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Which folding paths this CPU can run.
    #[derive(Clone, Copy, Debug)]
    pub(super) struct Paths {
        /// [`wide`]: AVX-512F (with the system saving its registers) and VPCLMULQDQ.
        pub(super) zmm: bool,
        /// [`half`]: AVX2 (likewise) and VPCLMULQDQ.
        pub(super) ymm: bool,
    }

    /// The folding paths this CPU can run. Both need PCLMULQDQ and SSE4.2 as well, which std
    /// detects with the rest, and VPCLMULQDQ (CPUID leaf 7, ECX bit 10; std's name for it is
    /// newer than this workspace's minimum Rust). Asked once.
    #[inline]
    pub(super) fn available() -> Paths {
        static HAS: AtomicU8 = AtomicU8::new(UNKNOWN);
        let bits = match HAS.load(Ordering::Relaxed) {
            UNKNOWN => {
                let bits = probe();
                HAS.store(bits, Ordering::Relaxed);
                bits
            }
            known => known,
        };
        Paths {
            zmm: bits & ZMM != 0,
            ymm: bits & YMM != 0,
        }
    }

    const UNKNOWN: u8 = 0xff;
    const ZMM: u8 = 1;
    const YMM: u8 = 2;

    #[cold]
    fn probe() -> u8 {
        let common = is_x86_feature_detected!("pclmulqdq") && is_x86_feature_detected!("sse4.2");
        // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is read only where leaf 0 says the
        // CPU has it. (The block is needed before Rust 1.94, where the intrinsic became safe.)
        #[allow(unused_unsafe)]
        let vpclmulqdq =
            common && unsafe { __cpuid(0).eax >= 7 && (__cpuid_count(7, 0).ecx >> 10) & 1 == 1 };
        if !vpclmulqdq {
            return 0;
        }
        let zmm = if is_x86_feature_detected!("avx512f") {
            ZMM
        } else {
            0
        };
        let ymm = if is_x86_feature_detected!("avx2") {
            YMM
        } else {
            0
        };
        zmm | ymm
    }

    /// `$x` moved on by the distance the constants `$k` stand for, added to `$next` (a macro,
    /// so that it expands inside `fold`'s body and its enabled features).
    macro_rules! step {
        ($x:expr, $k:expr, $next:expr) => {{
            let (x, k) = ($x, $k);
            let first = _mm_clmulepi64_si128::<0x00>(x, k);
            let second = _mm_clmulepi64_si128::<0x11>(x, k);
            _mm_xor_si128(_mm_xor_si128(first, second), $next)
        }};
    }

    // The wide loop, as a function of its own in assembly. Rust's AVX-512 intrinsics and its
    // 512-bit register operands for `asm!` are newer than this workspace's minimum Rust (1.85);
    // a separate function under the System V ABI may use every vector register, since all of
    // them are the caller's to save. Arguments: `edi` the starting register, `rsi` the data,
    // `rdx` the rounds of 256 bytes (at least 1), `rcx` the two 64-bit constants, `r8` where the
    // 256 folded bytes go.
    global_asm!(
        ".text",
        ".p2align 4",
        ".globl barewire_crc32c_fold_zmm",
        ".hidden barewire_crc32c_fold_zmm",
        ".type barewire_crc32c_fold_zmm,@function",
        "barewire_crc32c_fold_zmm:",
        "vmovdqu64 zmm0, [rsi]",
        "vmovdqu64 zmm1, [rsi + 64]",
        "vmovdqu64 zmm2, [rsi + 128]",
        "vmovdqu64 zmm3, [rsi + 192]",
        // The register into the message's first four bytes (vmovd clears the rest of zmm4).
        "vmovd xmm4, edi",
        "vpxorq zmm0, zmm0, zmm4",
        "vbroadcasti32x4 zmm5, [rcx]",
        "add rsi, 256",
        "sub rdx, 1",
        "jz 3f",
        "2:",
        "vpclmulqdq zmm6, zmm0, zmm5, 0x00",
        "vpclmulqdq zmm0, zmm0, zmm5, 0x11",
        "vpclmulqdq zmm7, zmm1, zmm5, 0x00",
        "vpclmulqdq zmm1, zmm1, zmm5, 0x11",
        "vpclmulqdq zmm8, zmm2, zmm5, 0x00",
        "vpclmulqdq zmm2, zmm2, zmm5, 0x11",
        "vpclmulqdq zmm9, zmm3, zmm5, 0x00",
        "vpclmulqdq zmm3, zmm3, zmm5, 0x11",
        // Three-way XOR: the two products and the next 64 bytes.
        "vpternlogq zmm0, zmm6, [rsi], 0x96",
        "vpternlogq zmm1, zmm7, [rsi + 64], 0x96",
        "vpternlogq zmm2, zmm8, [rsi + 128], 0x96",
        "vpternlogq zmm3, zmm9, [rsi + 192], 0x96",
        "add rsi, 256",
        "sub rdx, 1",
        "jnz 2b",
        "3:",
        "vmovdqu64 [r8], zmm0",
        "vmovdqu64 [r8 + 64], zmm1",
        "vmovdqu64 [r8 + 128], zmm2",
        "vmovdqu64 [r8 + 192], zmm3",
        "vzeroupper",
        "ret",
        ".size barewire_crc32c_fold_zmm, . - barewire_crc32c_fold_zmm",
    );

    extern "sysv64" {
        /// See the assembly above.
        fn barewire_crc32c_fold_zmm(
            register: u32,
            data: *const u8,
            rounds: usize,
            constants: *const u64,
            folded: *mut u8,
        );
    }

    // The 256-bit loops, as a macro since there are two: eight blocks a round, two to each of
    // four registers, each moved on eight blocks; the XOR that AVX-512 does in one step takes
    // two here. Arguments as for the 512-bit loop, with rounds of 128 bytes and 128 folded
    // bytes. The macro's arguments: the symbol; what follows the first loads (`$first`);
    // what each round does first (`$load`); the four operands each round XORs in, the next 128
    // bytes (`$n0`-`$n3`); what moves on with `rsi` after each round (`$advance`).
    macro_rules! fold_ymm {
        ($name:literal, [$($first:literal),*], [$($load:literal),*],
         [$n0:literal, $n1:literal, $n2:literal, $n3:literal], [$($advance:literal),*]) => {
            global_asm!(
                ".text",
                ".p2align 4",
                concat!(".globl ", $name),
                concat!(".hidden ", $name),
                concat!(".type ", $name, ",@function"),
                concat!($name, ":"),
                "vmovdqu ymm0, [rsi]",
                "vmovdqu ymm1, [rsi + 32]",
                "vmovdqu ymm2, [rsi + 64]",
                "vmovdqu ymm3, [rsi + 96]",
                $($first,)*
                // The register into the message's first four bytes (vmovd clears the rest of
                // ymm4).
                "vmovd xmm4, edi",
                "vpxor ymm0, ymm0, ymm4",
                "vbroadcasti128 ymm5, [rcx]",
                "add rsi, 128",
                $($advance,)*
                "sub rdx, 1",
                "jz 3f",
                "2:",
                $($load,)*
                "vpclmulqdq ymm6, ymm0, ymm5, 0x00",
                "vpclmulqdq ymm0, ymm0, ymm5, 0x11",
                "vpclmulqdq ymm7, ymm1, ymm5, 0x00",
                "vpclmulqdq ymm1, ymm1, ymm5, 0x11",
                "vpclmulqdq ymm8, ymm2, ymm5, 0x00",
                "vpclmulqdq ymm2, ymm2, ymm5, 0x11",
                "vpclmulqdq ymm9, ymm3, ymm5, 0x00",
                "vpclmulqdq ymm3, ymm3, ymm5, 0x11",
                "vpxor ymm0, ymm0, ymm6",
                "vpxor ymm1, ymm1, ymm7",
                "vpxor ymm2, ymm2, ymm8",
                "vpxor ymm3, ymm3, ymm9",
                concat!("vpxor ymm0, ymm0, ", $n0),
                concat!("vpxor ymm1, ymm1, ", $n1),
                concat!("vpxor ymm2, ymm2, ", $n2),
                concat!("vpxor ymm3, ymm3, ", $n3),
                "add rsi, 128",
                $($advance,)*
                "sub rdx, 1",
                "jnz 2b",
                "3:",
                "vmovdqu [r8], ymm0",
                "vmovdqu [r8 + 32], ymm1",
                "vmovdqu [r8 + 64], ymm2",
                "vmovdqu [r8 + 96], ymm3",
                "vzeroupper",
                "ret",
                concat!(".size ", $name, ", . - ", $name),
            );
        };
    }

    // The CRC alone: each round XORs in the next 128 bytes straight from memory.
    fold_ymm!(
        "barewire_crc32c_fold_ymm",
        [],
        [],
        ["[rsi]", "[rsi + 32]", "[rsi + 64]", "[rsi + 96]"],
        []
    );

    extern "sysv64" {
        /// See the assembly above.
        fn barewire_crc32c_fold_ymm(
            register: u32,
            data: *const u8,
            rounds: usize,
            constants: *const u64,
            folded: *mut u8,
        );
    }

    // The CRC and a copy: every 32 bytes loaded are stored at the same offset from a sixth
    // argument, `r9` (the first 128 before the starting register goes into them). Each round
    // loads into registers of its own (ymm10-ymm13), stores them, and XORs them in.
    fold_ymm!(
        "barewire_crc32c_copy_fold_ymm",
        [
            "vmovdqu [r9], ymm0",
            "vmovdqu [r9 + 32], ymm1",
            "vmovdqu [r9 + 64], ymm2",
            "vmovdqu [r9 + 96], ymm3"
        ],
        [
            "vmovdqu ymm10, [rsi]",
            "vmovdqu ymm11, [rsi + 32]",
            "vmovdqu ymm12, [rsi + 64]",
            "vmovdqu ymm13, [rsi + 96]",
            "vmovdqu [r9], ymm10",
            "vmovdqu [r9 + 32], ymm11",
            "vmovdqu [r9 + 64], ymm12",
            "vmovdqu [r9 + 96], ymm13"
        ],
        ["ymm10", "ymm11", "ymm12", "ymm13"],
        ["add r9, 128"]
    );

    extern "sysv64" {
        /// See the assembly above.
        fn barewire_crc32c_copy_fold_ymm(
            register: u32,
            data: *const u8,
            rounds: usize,
            constants: *const u64,
            folded: *mut u8,
            copy: *mut u8,
        );
    }

    /// [`super::crc32c_append`] for `data` of at least [`WIDE`] bytes.
    ///
    /// Sixteen blocks at a time go through four-block `VPCLMULQDQ` multiplies on four 512-bit
    /// registers (`barewire_crc32c_fold_zmm`), leaving 256 bytes that stand for everything read
    /// so far; `finish` takes it from there.
    ///
    /// # Safety
    /// The CPU must have what [`available`] checks for `zmm`.
    pub(super) unsafe fn wide(crc: u32, data: &[u8]) -> u32 {
        // SAFETY: the caller checked the CPU has the loop's instructions, and `fold`'s.
        unsafe {
            fold::<WIDE>(crc, data, |register, rounds, folded| {
                // SAFETY: the 512-bit loop with its constants reads `rounds` rounds of `data`
                // and writes the `WIDE` bytes at `folded`, as `fold` allows.
                barewire_crc32c_fold_zmm(
                    register,
                    data.as_ptr(),
                    rounds,
                    FOLD_WIDE.as_ptr(),
                    folded,
                )
            })
        }
    }

    /// [`super::crc32c_append`] for `data` of at least [`HALF`] bytes, through
    /// `barewire_crc32c_fold_ymm` (eight blocks a round on four 256-bit registers), which leaves
    /// 128 bytes for `finish`.
    ///
    /// # Safety
    /// The CPU must have what [`available`] checks for `ymm`.
    pub(super) unsafe fn half(crc: u32, data: &[u8]) -> u32 {
        // SAFETY: the caller checked the CPU has the loop's instructions, and `fold`'s.
        unsafe {
            fold::<HALF>(crc, data, |register, rounds, folded| {
                // SAFETY: the 256-bit loop with its constants reads `rounds` rounds of `data`
                // and writes the `HALF` bytes at `folded`, as `fold` allows.
                barewire_crc32c_fold_ymm(
                    register,
                    data.as_ptr(),
                    rounds,
                    FOLD_HALF.as_ptr(),
                    folded,
                )
            })
        }
    }

    /// [`half`] that also copies `data` to `copy` in the same pass
    /// (`barewire_crc32c_copy_fold_ymm`, then the rest after its last whole round).
    ///
    /// # Safety
    /// The CPU must have what [`available`] checks for `ymm`; `copy` must be valid for writes
    /// of `data.len()` bytes and overlap no byte of `data`.
    pub(super) unsafe fn half_copy(crc: u32, data: &[u8], copy: *mut u8) -> u32 {
        // SAFETY: the caller checked the CPU has the loop's instructions, and `fold`'s.
        unsafe {
            fold::<HALF>(crc, data, |register, rounds, folded| {
                let whole = rounds * HALF;
                // SAFETY: the copying loop reads `whole` bytes of `data` (at most all of it),
                // and writes the `HALF` bytes at `folded` and `whole` bytes at `copy`, which
                // the caller vouches for; then the rest of `data` goes to the rest of `copy`.
                barewire_crc32c_copy_fold_ymm(
                    register,
                    data.as_ptr(),
                    rounds,
                    FOLD_HALF.as_ptr(),
                    folded,
                    copy,
                );
                let rest = &data[whole..];
                std::ptr::copy_nonoverlapping(rest.as_ptr(), copy.add(whole), rest.len());
            })
        }
    }

    /// Runs `lp` over all of `data`'s whole rounds of `ROUND` bytes (it gets the starting
    /// register, the count of rounds, and where the `ROUND` folded bytes go), then `finish`
    /// over the folded bytes and the rest.
    ///
    /// # Safety
    /// `lp` may read at most the given rounds of `data` and write at most `ROUND` bytes where
    /// the folded bytes go, and must leave there what stands for those rounds; the CPU must
    /// have PCLMULQDQ and SSE4.2.
    #[target_feature(enable = "pclmulqdq,sse2,sse4.2")]
    unsafe fn fold<const ROUND: usize>(
        crc: u32,
        data: &[u8],
        lp: impl FnOnce(u32, usize, *mut u8),
    ) -> u32 {
        let rounds = data.len() / ROUND;
        assert!(rounds >= 1);
        let mut folded = [0u8; ROUND];
        lp(!crc, rounds, folded.as_mut_ptr());
        // SAFETY: the caller checked the CPU has `finish`'s instructions.
        unsafe { finish(&folded, &data[rounds * ROUND..]) }
    }

    /// The CRC32c of a message whose first part `folded` stands for (with the starting register
    /// already in it; [`HALF`] or [`WIDE`] bytes) and whose rest is `rest`.
    ///
    /// # Safety
    /// The CPU must have PCLMULQDQ and SSE4.2.
    #[target_feature(enable = "pclmulqdq,sse2,sse4.2")]
    unsafe fn finish(folded: &[u8], rest: &[u8]) -> u32 {
        assert!(folded.len() == HALF || folded.len() == WIDE);
        let blocks = rest.len() / BLOCK;
        let at = |bytes: &[u8], block: usize| {
            assert!((block + 1) * BLOCK <= bytes.len());
            bytes.as_ptr().wrapping_add(block * BLOCK).cast::<__m128i>()
        };
        // SAFETY: every load reads the 16 bytes `at` checked are inside its slice (unaligned
        // loads need no alignment); the intrinsics need the features this function is compiled
        // with, which its caller checked the CPU has.
        unsafe {
            let far = _mm_set_epi64x(FOLD_LANES.1 as i64, FOLD_LANES.0 as i64);
            let mut lane = [_mm_setzero_si128(); LANES];
            for (i, l) in lane.iter_mut().enumerate() {
                *l = _mm_loadu_si128(at(folded, i));
            }
            if folded.len() == WIDE {
                // The 512-bit path's: its first eight blocks move on onto its last eight.
                for (i, l) in lane.iter_mut().enumerate() {
                    *l = step!(*l, far, _mm_loadu_si128(at(folded, i + LANES)));
                }
            }
            let mut next = 0;
            while next + LANES <= blocks {
                for (i, l) in lane.iter_mut().enumerate() {
                    *l = step!(*l, far, _mm_loadu_si128(at(rest, next + i)));
                }
                next += LANES;
            }
            let near = _mm_set_epi64x(FOLD_ONE.1 as i64, FOLD_ONE.0 as i64);
            let mut acc = lane[0];
            for l in &lane[1..] {
                acc = step!(acc, near, *l);
            }
            while next < blocks {
                acc = step!(acc, near, _mm_loadu_si128(at(rest, next)));
                next += 1;
            }
            // The folded block and the tail, through the crc32 instruction from a zero register.
            let low = _mm_cvtsi128_si64(acc) as u64;
            let high = _mm_cvtsi128_si64(_mm_unpackhi_epi64(acc, acc)) as u64;
            let mut reg = _mm_crc32_u64(_mm_crc32_u64(0, low), high) as u32;
            let mut words = rest[blocks * BLOCK..].chunks_exact(8);
            for w in &mut words {
                let w = u64::from_le_bytes(w.try_into().expect("chunks of 8"));
                reg = _mm_crc32_u64(reg as u64, w) as u32;
            }
            for &b in words.remainder() {
                reg = _mm_crc32_u8(reg, b);
            }
            !reg
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn the_check_value() {
        assert_eq!(crc32c_append(0, b"123456789"), 0xE306_9283);
        let long = b"123456789".repeat(100);
        assert_eq!(crc32c_append(0, &long), crc32c::crc32c(&long));
    }

    /// Every length around the lane and block boundaries, from a zero and a non-zero start, is
    /// what the bytewise-proven `crc32c` crate gives.
    #[test]
    fn every_length_matches_the_reference() {
        let data = bytes(4 * 1024 + 64, 7);
        for start in [0u32, 0xDEAD_BEEF, u32::MAX] {
            for len in (0..=2200).chain([4095, 4096, 4097, 4 * 1024 + 64]) {
                let d = &data[..len];
                assert_eq!(
                    crc32c_append(start, d),
                    crc32c::crc32c_append(start, d),
                    "length {len}, start {start:#x}"
                );
            }
        }
    }

    /// What `crc32c_copy` writes, with `GUARD` bytes of 0xA5 on either side that must stay:
    /// the copy, and its CRC.
    fn copied(start: u32, src: &[u8], at: usize) -> (Vec<u8>, u32) {
        use std::mem::MaybeUninit;
        const GUARD: usize = 64;
        let mut out = vec![MaybeUninit::new(0xA5u8); at + src.len() + GUARD];
        let crc = crc32c_copy(start, src, &mut out[at..at + src.len()]);
        // SAFETY: every byte was initialized above, and `crc32c_copy` wrote only initialized
        // bytes.
        let out: Vec<u8> = out
            .into_iter()
            .map(|b| unsafe { b.assume_init() })
            .collect();
        assert!(
            out[..at]
                .iter()
                .chain(&out[at + src.len()..])
                .all(|&b| b == 0xA5),
            "{} bytes at {at}: a byte outside the copy changed",
            src.len()
        );
        (out[at..at + src.len()].to_vec(), crc)
    }

    /// A copy with its CRC holds exactly the source's bytes, writes nothing beside them, and
    /// gives the reference CRC, at every length around the blocks and rounds, from three starts,
    /// at odd offsets on both sides.
    #[test]
    fn a_copy_holds_the_bytes_and_their_crc() {
        let data = bytes(70_000, 5);
        for start in [0u32, 0xDEAD_BEEF, u32::MAX] {
            for len in (0..=2200).chain([4095, 4096, 4097, 16_384, 65_535, 65_536]) {
                for (from, at) in [(0, 0), (1, 3), (17, 64)] {
                    let src = &data[from..from + len];
                    let (copy, crc) = copied(start, src, at);
                    assert!(
                        copy == src,
                        "length {len} from {from} to {at}: the copy differs"
                    );
                    assert_eq!(
                        crc,
                        crc32c::crc32c_append(start, src),
                        "length {len}, start {start:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn pieces_at_any_offset_and_split_match() {
        let data = bytes(70_000, 11);
        for (i, (off, cut)) in [(0, 600), (1, 513), (3, 1024), (15, 65_536), (17, 20_000)]
            .into_iter()
            .enumerate()
        {
            let d = &data[off..];
            let whole = crc32c::crc32c(d);
            let split = crc32c_append(crc32c_append(0, &d[..cut]), &d[cut..]);
            assert_eq!(split, whole, "case {i}");
        }
    }

    proptest::proptest! {
        /// Any bytes, cut into three pieces anywhere, checksum as the crate checksums them whole.
        #[test]
        fn any_bytes_cut_anywhere(
            data in proptest::collection::vec(proptest::num::u8::ANY, 0..20_000),
            a in 0usize..20_000,
            b in 0usize..20_000,
        ) {
            let (a, b) = (a.min(data.len()), b.min(data.len()));
            let (a, b) = (a.min(b), a.max(b));
            let piecewise = crc32c_append(
                crc32c_append(crc32c_append(0, &data[..a]), &data[a..b]),
                &data[b..],
            );
            proptest::prop_assert_eq!(piecewise, crc32c::crc32c(&data));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_folding_paths_themselves_match_where_the_cpu_has_them() {
        let paths = x86::available();
        let data = bytes(3000, 3);
        let start = 0x1234_5678;
        // (present, shortest input, the path, what it needs)
        type Path = unsafe fn(u32, &[u8]) -> u32;
        let each: [(bool, usize, Path, &str); 2] = [
            (paths.zmm, WIDE, x86::wide, "AVX-512F and VPCLMULQDQ"),
            (paths.ymm, HALF, x86::half, "AVX2 and VPCLMULQDQ"),
        ];
        for (present, from, path, needs) in each {
            if !present {
                eprintln!("no {needs} here: that path is not checked");
                continue;
            }
            for len in from..data.len() {
                // SAFETY: `available` said this CPU runs this path.
                let got = unsafe { path(start, &data[..len]) };
                let want = crc32c::crc32c_append(start, &data[..len]);
                assert_eq!(got, want, "{needs}: {len} bytes");
            }
        }
        if !paths.ymm {
            return;
        }
        // The copying 256-bit loop, called directly (`crc32c_copy` takes it only without
        // AVX-512), into a buffer with guard bytes after the copy.
        for len in HALF..data.len() {
            let mut out = vec![0xA5u8; len + 32];
            // SAFETY: `available` said this CPU runs the path; `out` holds `len` bytes and
            // overlaps nothing of `data`.
            let got = unsafe { x86::half_copy(start, &data[..len], out.as_mut_ptr()) };
            assert_eq!(
                got,
                crc32c::crc32c_append(start, &data[..len]),
                "copying: {len}"
            );
            assert!(out[..len] == data[..len], "copying: {len} bytes differ");
            assert!(
                out[len..].iter().all(|&b| b == 0xA5),
                "copying: {len} overran"
            );
        }
    }
}
