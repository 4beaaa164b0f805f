//! `value/reprosum.rs`'s reproducible sums as CUDA kernels, compiled by NVRTC to PTX for
//! `compute_90` and to a cubin for `sm_90` (feature `nccl`).
//!
//! [`REPROSUM_SOURCE`] is one CUDA C translation unit; [`REPROSUM_KERNELS`] names its 6 kernels,
//! each with its arguments, the launch configuration the host must use ([`ReprosumLaunch`]) and
//! the CPU function whose bits it gives; [`compile_reprosum_kernels`] compiles it
//! ([`ReduceModules`]). Three families:
//! - columns (`detcheck_reprosum_columns_f32`, `_f64`): `out[i]` is the reproducible sum of
//!   `inputs[0..count][i]`, the bits of `sum_columns_f32` and `sum_columns_f64`; one thread per
//!   element, any launch configuration;
//! - one buffer (`detcheck_reprosum_f32`, and where it says so `_fixup_f32` then `_finish_f32`
//!   on the same stream): `reproducible_sum_f32` of a whole device buffer in one launch, reading
//!   it once in the common case. Each block takes tiles of [`REPROSUM_TILE_ELEMENTS`] terms held
//!   in registers, finds the tile's largest binade (a shared-memory block maximum), and sums the
//!   tile's grid steps on the [`REPROSUM_CANDIDATES`] grids the global grid can be (the tile's own
//!   binade and the next ones up) into a per-tile record of the scratch array; the global binade
//!   is an `atomicMax` into the scratch header. Then the block counts itself in (an `atomicAdd`
//!   after a `__threadfence`), and the last block to arrive finishes: it picks each tile's sum on
//!   the global grid, re-reads the few tiles too far below the global binade for any candidate
//!   (at most [`REPROSUM_LAST_BLOCK_REREADS`]), rounds once, and zeroes the header for the next
//!   sum. With more such tiles (a buffer of mixed scales) it leaves the sum pending, and the
//!   fixup kernel (every block) re-reads them and the finish kernel (one block) rounds. The
//!   scratch array's layout is in [`reprosum_scratch_bytes`]'s docs;
//! - `detcheck_plain_sum_f32`: the benchmark's baseline, a plain f32 sum that is
//!   nondeterministic by design (float atomics).
//!
//! Determinism: the reproducible kernels compute exactly what the CPU does, term by term: the
//! same grid (`grid_magic`), each term rounded to it by the same f64 addition `x + M`, compiled
//! with `--fmad=false` and without fast-math (`device/cuda.rs`, `NVRTC_OPTIONS`), the same final
//! rounding (`f32_from_grid`, `Grid::f64_sum`, with Rust's `i128 as f64` written out on two
//! 64-bit words). Everything in between is an integer added with wrap-around, or a maximum: exact
//! and order-independent, so the bits depend neither on the launch configuration nor on the
//! order in which blocks, warps and threads run; there are no float atomics and no warp
//! shuffles in them.
//!
//! Testing: without a GPU the tests run the kernels on the CPU, through the host emulation that
//! every kernel module's tests share (`device/host_emulation.rs`). `host_shim.h` (in this folder)
//! defines the bits of CUDA C they use, `host_driver.cpp` launches them (blocks one at a
//! time in a shuffled order, each block's threads as `std::thread`s sharing a `std::barrier`),
//! and g++ compiles the very text of [`REPROSUM_SOURCE`]; the results are compared bit for bit
//! with `value/reprosum.rs`, for the real tile sizes and for small ones that make many tiles.
//! That checks the kernels' arithmetic and order-independence on the CPU (g++'s IEEE doubles, no
//! contraction); that a GPU gives the same bits is for the GPU self-test
//! (`scripts/gpu-selftest.sh`), which launches them there.
//!
//! Limits: f32 and f64 columns, one f32 buffer; `count` fits a `u32` and the one-buffer `n` is
//! at most 2⁶⁰ terms (`value/reprosum.rs`). The one-buffer sum reads a tile twice when its terms
//! are all more than [`REPROSUM_CANDIDATES`] − 1 binades below the buffer's largest: rare in
//! gradients of one scale, but a buffer of mixed scales (two tensors 2⁴× apart, one tiny tile
//! among large ones) pays for it, up to twice the reads when almost every tile is far below, and
//! two more launches and a wait when more than [`REPROSUM_LAST_BLOCK_REREADS`] tiles are. The
//! last-block finish relies on CUDA's memory model as the CUDA samples' `threadFenceReduction`
//! does (records written, `__threadfence`, then the arrival atomic; the last block reads the
//! records and the header with `__ldcg`, from L2, where the other blocks' writes and atomics
//! are).
//! Its speed (the goal: at most 1.3× `detcheck_plain_sum_f32` on an H100) is measured on a GPU,
//! not here. The launches themselves are written elsewhere (the crate's one `unsafe` module).

use crate::device::cuda::{compile_cubin, compile_ptx, CudaError};
use crate::device::kernels::{ReduceModules, CUBIN_ARCH, PTX_ARCH};

/// The name NVRTC gives [`REPROSUM_SOURCE`] in its messages.
pub const REPROSUM_PROGRAM: &str = "detcheck_reprosum.cu";

/// Threads per block of the one-buffer kernels (tiles, fixup, finish): every launch of them must
/// use exactly this block size (the kernels `__trap()` otherwise). A power of two.
pub const REPROSUM_TILE_THREADS: u32 = 256;

/// Terms each thread of the tile kernel holds in registers.
pub const REPROSUM_TILE_ITEMS: u32 = 16;

/// Terms per tile: [`REPROSUM_TILE_THREADS`] × [`REPROSUM_TILE_ITEMS`]. Item `j` of thread `t`
/// of tile `k` is term `k · 4096 + j · 256 + t` (coalesced loads).
pub const REPROSUM_TILE_ELEMENTS: u64 = REPROSUM_TILE_THREADS as u64 * REPROSUM_TILE_ITEMS as u64;

/// Candidate grids per tile: a tile sums its terms on the grids of its own largest binade and
/// the `REPROSUM_CANDIDATES − 1` binades above it, one of which is the global grid unless the
/// tile is that far below the buffer's largest binade (then the fixup kernel re-reads it).
pub const REPROSUM_CANDIDATES: u32 = 4;

/// 64-bit words per tile record in the scratch array: the candidates' sums, then the tile's
/// largest magnitude.
pub const REPROSUM_RECORD_WORDS: u64 = REPROSUM_CANDIDATES as u64 + 1;

/// Bytes of the scratch header: zero before a one-buffer sum starts, and zero again when it is
/// done (its last kernel zeroes it), so one scratch array serves sum after sum on one stream.
pub const REPROSUM_HEADER_BYTES: u64 = 16;

/// The most tiles the one-launch sum's last block re-reads itself; with more, the fixup and
/// finish kernels must run (`out[1]` says so).
pub const REPROSUM_LAST_BLOCK_REREADS: u32 = 8;

/// `out[1]` after the one-launch sum (`detcheck_reprosum_f32`) when the fixup and finish kernels
/// must run; 0 when `out[0]` holds the sum's bits.
pub const REPROSUM_PENDING: u32 = 1;

/// The number of tiles of an `n`-term buffer: `⌈n / REPROSUM_TILE_ELEMENTS⌉`.
#[must_use]
pub const fn reprosum_tiles(n: u64) -> u64 {
    n.div_ceil(REPROSUM_TILE_ELEMENTS)
}

/// The size in bytes of the one-buffer sum's scratch array (device memory, 8-byte aligned, as
/// `cuMemAlloc` gives) for `n` terms: `16 + 40 · ⌈n / 4096⌉`, a quarter of a percent of the
/// buffer. A scratch array for `n` terms serves any smaller sum too.
///
/// Layout, in little-endian 64-bit words (`unsigned long long* scratch`):
/// - words 0 and 1, the header ([`REPROSUM_HEADER_BYTES`]): word 0's low 32 bits are the largest
///   binade over the buffer as a biased exponent, 0 to 255 (`atomicMax` of the tiles'; 255 when
///   some term is not finite), its high 32 bits the flags of non-finite terms (`atomicOr`: 1 NaN,
///   2 +∞, 4 −∞); word 1's low 32 bits count the blocks that have written their records (the last
///   one finishes). The host zeroes the header once, when it allocates the array; every sum
///   leaves it zero;
/// - then one record of [`REPROSUM_RECORD_WORDS`] words per tile `k`, at word `2 + 5k`: words 0
///   to 3 the wrap-around sums of the tile's grid steps on the grids of binades `level`,
///   `level + 1`, `level + 2`, `level + 3` (`level` = the tile's largest biased exponent; the
///   fixup kernel overwrites word 0 with the sum on the global grid when none of them is it),
///   word 4 the tile's largest magnitude (`f32` bits without the sign; 0 for an all-zero tile).
///   The kernels write every record; nothing needs initialising.
#[must_use]
pub const fn reprosum_scratch_bytes(n: u64) -> u64 {
    REPROSUM_HEADER_BYTES + reprosum_tiles(n) * REPROSUM_RECORD_WORDS * 8
}

/// The CUDA C of every reproducible-sum kernel (see the module docs and [`REPROSUM_KERNELS`]).
pub const REPROSUM_SOURCE: &str = r#"// detcheck's reproducible-sum kernels: value/reprosum.rs's integer grids, bit for bit.
// Compiled by NVRTC with --fmad=false --prec-div=true --prec-sqrt=true --ftz=false.
// Every partial result is an integer added with wrap-around, or a maximum: both are exact and
// order-independent, so no result depends on the order of blocks, warps or threads.

// The one-buffer sum's tile: DETCHECK_REPROSUM_THREADS threads (the block size every launch of
// the tile kernels must use) hold DETCHECK_REPROSUM_ITEMS terms each in registers, and sum them
// on DETCHECK_REPROSUM_CANDIDATES grids. device/reprosum.rs has the same numbers (a test
// checks); the host emulation may define smaller ones.
#ifndef DETCHECK_REPROSUM_THREADS
#define DETCHECK_REPROSUM_THREADS 256
#endif
#ifndef DETCHECK_REPROSUM_ITEMS
#define DETCHECK_REPROSUM_ITEMS 16
#endif
#ifndef DETCHECK_REPROSUM_CANDIDATES
#define DETCHECK_REPROSUM_CANDIDATES 4
#endif
#define DETCHECK_REPROSUM_TILE (DETCHECK_REPROSUM_THREADS * DETCHECK_REPROSUM_ITEMS)
// A tile's record in the scratch array: the candidates' sums, then the tile's largest magnitude.
#define DETCHECK_REPROSUM_RECORD (DETCHECK_REPROSUM_CANDIDATES + 1)

static_assert((DETCHECK_REPROSUM_THREADS & (DETCHECK_REPROSUM_THREADS - 1)) == 0,
              "the block reductions halve the block");
static_assert(DETCHECK_REPROSUM_CANDIDATES >= 1 &&
                  DETCHECK_REPROSUM_CANDIDATES <= DETCHECK_REPROSUM_THREADS,
              "one thread clears each candidate of a tile with a non-finite term");

// The flags of non-finite terms (value/reprosum.rs `Specials`), in the scratch header's word 1.
#define DETCHECK_NAN_FLAG 1u
#define DETCHECK_POS_INF_FLAG 2u
#define DETCHECK_NEG_INF_FLAG 4u

// ---- value/reprosum.rs's helpers -------------------------------------------------------------

// `precision(n)`: bits of a term kept below the largest magnitude, min(50, 62 - ceil(log2 n)).
__device__ __forceinline__ int detcheck_precision(unsigned long long num_terms) {
    unsigned long long below = num_terms == 0 ? 0 : num_terms - 1;
    int log2 = 64 - __clzll((long long)below);
    int precision = 62 - log2;
    return precision < 50 ? precision : 50;
}

// `pow2(k)`: 2^k for k in the normal range.
__device__ __forceinline__ double detcheck_pow2(int k) {
    return __longlong_as_double((long long)(k + 1023) << 52);
}

// `grid_magic(top, magic_factor(precision))` for the largest binade `top = 2^(level - 127)`,
// where `level` is the biased exponent of the largest magnitude (0 for zeros and subnormals:
// `top` is then `LOWEST_TOP`, 2^-127, as `grid_magic` clamps it). Both products are exact.
__device__ __forceinline__ double detcheck_magic_of_level(unsigned int level, int precision) {
    double top = detcheck_pow2((int)level - 127);
    double factor = 1.5 * detcheck_pow2(53 - precision);
    return top * factor;
}

// `grid_step(magic)`: the mantissa cleared, divided by 2^52 (exact).
__device__ __forceinline__ double detcheck_grid_step(double magic) {
    unsigned long long bits = (unsigned long long)__double_as_longlong(magic);
    return __longlong_as_double((long long)(bits & 0xfff0000000000000ULL)) * detcheck_pow2(-52);
}

// `bits(x + M)`: the grid steps of x, biased by bits(M) (subtracted once per term at the end).
__device__ __forceinline__ unsigned long long detcheck_biased_steps(float x, double magic) {
    return (unsigned long long)__double_as_longlong((double)x + magic);
}

// `f32_from_grid(sum, step)`: the f32 nearest to sum * step, rounded once. Beyond 2^53 steps the
// sum is first rounded to odd at 53 bits, which is exact in f64 and rounds to the same f32.
__device__ __forceinline__ float detcheck_f32_from_grid(long long sum, double step) {
    unsigned long long magnitude =
        sum < 0 ? 0ULL - (unsigned long long)sum : (unsigned long long)sum;
    if (magnitude <= (1ULL << 53)) return (float)((double)sum * step);
    int shift = 11 - __clzll((long long)magnitude);
    unsigned long long sticky = (magnitude & ((1ULL << shift) - 1)) != 0 ? 1ULL : 0ULL;
    double odd = (double)((magnitude >> shift) | sticky) * (double)(1u << shift);
    double value = odd * step;
    return (float)(sum < 0 ? -value : value);
}

// `Specials::note` for an f32 term, as flags.
__device__ __forceinline__ unsigned int detcheck_special_flags_f32(float x) {
    unsigned int bits = __float_as_uint(x);
    unsigned int magnitude = bits & 0x7fffffffu;
    if (magnitude > 0x7f800000u) return DETCHECK_NAN_FLAG;
    if (bits == 0x7f800000u) return DETCHECK_POS_INF_FLAG;
    if (bits == 0xff800000u) return DETCHECK_NEG_INF_FLAG;
    return 0;
}

// `Specials::result`, then `map_or(f32::NAN, ...)`: any NaN, or +inf and -inf, give the
// canonical NaN 0x7fc00000; otherwise the infinity.
__device__ __forceinline__ float detcheck_special_result_f32(unsigned int flags) {
    bool pos = (flags & DETCHECK_POS_INF_FLAG) != 0;
    bool neg = (flags & DETCHECK_NEG_INF_FLAG) != 0;
    if ((flags & DETCHECK_NAN_FLAG) != 0 || (pos && neg)) return __uint_as_float(0x7fc00000u);
    if (pos) return __uint_as_float(0x7f800000u);
    if (neg) return __uint_as_float(0xff800000u);
    return __uint_as_float(0x7fc00000u);
}

// ---- 1. Columns of f32: `sum_columns_f32` -------------------------------------------------

// out[i] = reproducible_sum_f32(inputs[0][i], ..., inputs[count - 1][i]). One thread per
// element (grid-stride loop, any launch configuration): the largest magnitude, the rounding
// constant M of its binade, the biased steps bits(x + M) summed with wrap-around less
// count * bits(M), one rounding. Terms are read twice (the second time from cache).
extern "C" __global__ void detcheck_reprosum_columns_f32(
    float* out, const float* const* inputs, unsigned int count, unsigned long long len) {
    const int precision = detcheck_precision(count);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < len; i += stride) {
        // The largest magnitude's bits: its biased exponent is the largest binade's (NaN's
        // magnitude is above +inf's, so its level is 255 too).
        unsigned int largest = 0;
        for (unsigned int k = 0; k < count; ++k) {
            unsigned int magnitude = __float_as_uint(inputs[k][i]) & 0x7fffffffu;
            largest = magnitude > largest ? magnitude : largest;
        }
        unsigned int level = largest >> 23;
        if (level == 255) {
            unsigned int flags = 0;
            for (unsigned int k = 0; k < count; ++k) {
                flags |= detcheck_special_flags_f32(inputs[k][i]);
            }
            out[i] = detcheck_special_result_f32(flags);
            continue;
        }
        double magic = detcheck_magic_of_level(level, precision);
        unsigned long long biased = 0;
        for (unsigned int k = 0; k < count; ++k) {
            biased += detcheck_biased_steps(inputs[k][i], magic);
        }
        unsigned long long bias =
            (unsigned long long)count * (unsigned long long)__double_as_longlong(magic);
        out[i] = detcheck_f32_from_grid((long long)(biased - bias), detcheck_grid_step(magic));
    }
}

// ---- 2. Columns of f64: `sum_columns_f64` -------------------------------------------------

// `round_to_i64(t)`: t (|t| < 2^51) to the nearest integer, ties to even, with 1.5 * 2^52.
__device__ __forceinline__ long long detcheck_round_to_i64(double t) {
    const double magic = 6755399441055744.0;
    return __double_as_longlong(t + magic) - __double_as_longlong(magic);
}

// `exponent_above(m)`: the smallest e with 2^e > m, for a finite m > 0.
__device__ __forceinline__ int detcheck_exponent_above(double m) {
    int biased = (int)(((unsigned long long)__double_as_longlong(m) >> 52) & 0x7ff);
    return biased == 0 ? -1022 : biased - 1022;
}

// Rust's `((high as i128) << precision) + low as i128) as f64` (round to nearest, ties to even),
// without __int128: the 128-bit value in two words, its magnitude rounded to odd at 64 bits
// (exact, and with more than 53 + 1 bits it rounds to the same f64), then converted once.
__device__ __forceinline__ double detcheck_two_grids_to_f64(
    long long high, long long low, int precision) {
    // high * 2^precision (precision in 1..=50), two's complement in (upper, lower).
    unsigned long long lower = (unsigned long long)high << precision;
    unsigned long long upper = (unsigned long long)(high >> (64 - precision));
    // + low, sign-extended.
    unsigned long long sum_lower = lower + (unsigned long long)low;
    unsigned long long carry = sum_lower < lower ? 1ULL : 0ULL;
    unsigned long long sum_upper = upper + (unsigned long long)(low >> 63) + carry;
    bool negative = (long long)sum_upper < 0;
    unsigned long long mag_lower = sum_lower, mag_upper = sum_upper;
    if (negative) {
        mag_lower = 0ULL - sum_lower;
        mag_upper = ~sum_upper + (sum_lower == 0 ? 1ULL : 0ULL);
    }
    double magnitude;
    if (mag_upper == 0) {
        magnitude = (double)mag_lower;
    } else {
        // The value has 64 + s bits (s in 1..=63: it is below 2^127); keep the top 64, the bits
        // shifted out collapse into the last one.
        int s = 64 - __clzll((long long)mag_upper);
        unsigned long long top = (mag_upper << (64 - s)) | (mag_lower >> s);
        unsigned long long sticky = (mag_lower & ((1ULL << s) - 1)) != 0 ? 1ULL : 0ULL;
        magnitude = (double)(top | sticky) * detcheck_pow2(s);
    }
    return negative ? -magnitude : magnitude;
}

// out[i] = the f64 sum of inputs[0..count][i] on two grids, as `sum_columns_f64`: non-finite
// terms decide by `Specials`; otherwise the grid of the largest finite magnitude and the count,
// each term's two integers (`Grid::f64_term`) summed, then `Grid::f64_sum`. Any launch
// configuration (grid-stride loop). The i64 sums cannot overflow (P leaves the headroom).
extern "C" __global__ void detcheck_reprosum_columns_f64(
    double* out, const double* const* inputs, unsigned int count, unsigned long long len) {
    const int precision = detcheck_precision(count);
    const unsigned long long exponent_mask = 0x7ff0000000000000ULL;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
         i < len; i += stride) {
        bool nan = false, pos_inf = false, neg_inf = false;
        double max_abs = 0.0;
        for (unsigned int k = 0; k < count; ++k) {
            double x = inputs[k][i];
            unsigned long long bits = (unsigned long long)__double_as_longlong(x);
            if ((bits & exponent_mask) != exponent_mask) {
                double a = __longlong_as_double((long long)(bits & 0x7fffffffffffffffULL));
                max_abs = a > max_abs ? a : max_abs;
            } else if ((bits & 0x000fffffffffffffULL) != 0) {
                nan = true;
            } else if ((long long)bits > 0) {
                pos_inf = true;
            } else {
                neg_inf = true;
            }
        }
        if (nan || (pos_inf && neg_inf)) {
            out[i] = __longlong_as_double(0x7ff8000000000000LL);
            continue;
        }
        if (pos_inf || neg_inf) {
            out[i] = __longlong_as_double(
                pos_inf ? 0x7ff0000000000000LL : (long long)0xfff0000000000000ULL);
            continue;
        }
        if (!(max_abs > 0.0)) {
            out[i] = 0.0;
            continue;
        }
        // `Grid::scale`: 2^(precision - exponent) in two factors that stay normal.
        int k = precision - detcheck_exponent_above(max_abs);
        int half = k / 2;
        double a = detcheck_pow2(half), b = detcheck_pow2(k - half);
        double second = detcheck_pow2(precision);
        unsigned long long high = 0, low = 0;
        for (unsigned int j = 0; j < count; ++j) {
            // `Grid::f64_term`, in the same operations and order.
            double t = inputs[j][i] * a * b;
            long long h = detcheck_round_to_i64(t);
            long long l = detcheck_round_to_i64((t - (double)h) * second);
            high += (unsigned long long)h;
            low += (unsigned long long)l;
        }
        // `Grid::f64_sum`.
        double exact = detcheck_two_grids_to_f64((long long)high, (long long)low, precision);
        out[i] = exact / second / a / b;
    }
}

// ---- 3. One buffer: `reproducible_sum_f32` in one launch (three where many tiles are far) ----

// The last block re-reads at most this many tiles itself; with more, the sum is left pending for
// the fixup and finish kernels (many blocks re-read them, then one block finishes).
#ifndef DETCHECK_REPROSUM_LAST_BLOCK_REREADS
#define DETCHECK_REPROSUM_LAST_BLOCK_REREADS 8
#endif
static_assert(DETCHECK_REPROSUM_LAST_BLOCK_REREADS >= 0, "a count of tiles");

// The scratch header's 64-bit words: word 0 the global level (low 32 bits) and the flags of
// non-finite terms (high 32 bits), word 1 the blocks arrived (low 32 bits). Records follow.
#define DETCHECK_REPROSUM_HEADER_WORDS 2

// What `out[1]` says once a one-buffer sum's last kernel has run: `out[0]` is the sum's bits, or
// the fixup and finish kernels must run.
#define DETCHECK_REPROSUM_DONE 0u
#define DETCHECK_REPROSUM_PENDING 1u

// Tile `tile`'s record in the scratch array (and the same in a const one).
__device__ __forceinline__ unsigned long long* detcheck_reprosum_record(
    unsigned long long* scratch, unsigned long long tile) {
    return scratch + DETCHECK_REPROSUM_HEADER_WORDS + tile * DETCHECK_REPROSUM_RECORD;
}
__device__ __forceinline__ const unsigned long long* detcheck_reprosum_record(
    const unsigned long long* scratch, unsigned long long tile) {
    return scratch + DETCHECK_REPROSUM_HEADER_WORDS + tile * DETCHECK_REPROSUM_RECORD;
}

// Tiles a thread of the finishing block looks at together (their loads overlap).
#define DETCHECK_REPROSUM_GATHER 4

// The largest of every thread's `value`, in every thread. Shared memory and barriers only (no
// warp shuffles), so the host emulation runs it as it is.
__device__ __forceinline__ unsigned int detcheck_block_max(
    unsigned int value, unsigned int* shared) {
    const unsigned int tid = threadIdx.x;
    shared[tid] = value;
    __syncthreads();
    for (unsigned int half = DETCHECK_REPROSUM_THREADS / 2; half > 0; half >>= 1) {
        if (tid < half) {
            unsigned int other = shared[tid + half];
            if (other > shared[tid]) shared[tid] = other;
        }
        __syncthreads();
    }
    unsigned int result = shared[0];
    __syncthreads();  // everyone has read it before the array is written again
    return result;
}

// The wrap-around sums of every thread's `values[0..N]`, in thread 0's `values` (the other
// threads' are left partial). `shared` holds N * DETCHECK_REPROSUM_THREADS words.
template <int N>
__device__ __forceinline__ void detcheck_block_sums(
    unsigned long long (&values)[N], unsigned long long* shared) {
    const unsigned int tid = threadIdx.x;
    for (int c = 0; c < N; ++c) shared[c * DETCHECK_REPROSUM_THREADS + tid] = values[c];
    __syncthreads();
    for (unsigned int half = DETCHECK_REPROSUM_THREADS / 2; half > 0; half >>= 1) {
        if (tid < half) {
            for (int c = 0; c < N; ++c) {
                shared[c * DETCHECK_REPROSUM_THREADS + tid] +=
                    shared[c * DETCHECK_REPROSUM_THREADS + tid + half];
            }
        }
        __syncthreads();
    }
    if (tid == 0) {
        for (int c = 0; c < N; ++c) values[c] = shared[c * DETCHECK_REPROSUM_THREADS];
    }
    __syncthreads();  // thread 0 has read them before the array is written again
}

// A tile's terms, each thread's DETCHECK_REPROSUM_ITEMS of them, coalesced: item j of thread t
// is element tile * TILE + j * THREADS + t. Elements past n read as +0.0, which adds no step on
// any grid and does not raise the largest magnitude.
__device__ __forceinline__ void detcheck_load_tile(
    float (&items)[DETCHECK_REPROSUM_ITEMS], const float* terms, unsigned long long n,
    unsigned long long tile) {
    const unsigned long long first = tile * DETCHECK_REPROSUM_TILE + threadIdx.x;
#pragma unroll
    for (int j = 0; j < DETCHECK_REPROSUM_ITEMS; ++j) {
        unsigned long long i = first + (unsigned long long)j * DETCHECK_REPROSUM_THREADS;
        items[j] = i < n ? terms[i] : 0.0f;
    }
}

// Whether a tile's sum on the global grid is missing from its record: its largest binade is more
// than CANDIDATES - 1 below the global one, and some term is nonzero (an all-zero tile adds no
// step on any grid). `largest` is the tile's largest magnitude bits, `global_level` < 255.
__device__ __forceinline__ bool detcheck_reprosum_needs_fixup(
    unsigned long long largest, unsigned int global_level) {
    unsigned int level = (unsigned int)(largest >> 23);
    return largest != 0 && global_level - level >= DETCHECK_REPROSUM_CANDIDATES;
}

// A tile's sum on the grid of `magic` (the global one), read again from `terms`, in thread 0;
// every thread of the block must call it (barriers).
__device__ __forceinline__ unsigned long long detcheck_reprosum_tile_on_grid(
    const float* terms, unsigned long long n, unsigned long long tile, double magic,
    unsigned long long* sums_shared) {
    float items[DETCHECK_REPROSUM_ITEMS];
    detcheck_load_tile(items, terms, n, tile);
    unsigned long long biased[1] = {0};
#pragma unroll
    for (int j = 0; j < DETCHECK_REPROSUM_ITEMS; ++j) {
        biased[0] += detcheck_biased_steps(items[j], magic);
    }
    detcheck_block_sums(biased, sums_shared);
    // Less bits(M) once per term of the tile, padding included.
    return biased[0] - (unsigned long long)DETCHECK_REPROSUM_TILE *
                           (unsigned long long)__double_as_longlong(magic);
}

// The records of this block's tiles (tile = blockIdx.x, + gridDim.x, ...). Per tile: the
// largest magnitude (block maximum, into the record and, as a level, atomicMax'ed into the
// header) and, with the terms still in registers, the wrap-around sums of their steps on the
// CANDIDATES grids of levels level, level + 1, ...: the global level is at least the tile's. A
// tile with a non-finite term ORs its Specials flags into the header instead.
__device__ __forceinline__ void detcheck_reprosum_tile_records(
    unsigned long long* scratch, const float* terms, unsigned long long n,
    unsigned int* largest_shared, unsigned long long* sums_shared) {
    unsigned int* header = (unsigned int*)scratch;
    const int precision = detcheck_precision(n);
    const unsigned long long tiles = (n + DETCHECK_REPROSUM_TILE - 1) / DETCHECK_REPROSUM_TILE;
    for (unsigned long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        float items[DETCHECK_REPROSUM_ITEMS];
        detcheck_load_tile(items, terms, n, tile);
        unsigned int largest = 0;
#pragma unroll
        for (int j = 0; j < DETCHECK_REPROSUM_ITEMS; ++j) {
            unsigned int magnitude = __float_as_uint(items[j]) & 0x7fffffffu;
            largest = magnitude > largest ? magnitude : largest;
        }
        largest = detcheck_block_max(largest, largest_shared);
        const unsigned int level = largest >> 23;
        unsigned long long* record = detcheck_reprosum_record(scratch, tile);
        if (level == 255) {
            // The sum is decided by the non-finite terms; the candidates are never read.
            unsigned int flags = 0;
#pragma unroll
            for (int j = 0; j < DETCHECK_REPROSUM_ITEMS; ++j) {
                flags |= detcheck_special_flags_f32(items[j]);
            }
            if (flags != 0) atomicOr(header + 1, flags);
            if (threadIdx.x < DETCHECK_REPROSUM_CANDIDATES) record[threadIdx.x] = 0;
        } else {
            double magic[DETCHECK_REPROSUM_CANDIDATES];
            unsigned long long biased[DETCHECK_REPROSUM_CANDIDATES];
#pragma unroll
            for (int c = 0; c < DETCHECK_REPROSUM_CANDIDATES; ++c) {
                magic[c] = detcheck_magic_of_level(level + c, precision);
                biased[c] = 0;
            }
#pragma unroll
            for (int j = 0; j < DETCHECK_REPROSUM_ITEMS; ++j) {
                double wide = (double)items[j];
#pragma unroll
                for (int c = 0; c < DETCHECK_REPROSUM_CANDIDATES; ++c) {
                    biased[c] += (unsigned long long)__double_as_longlong(wide + magic[c]);
                }
            }
            detcheck_block_sums(biased, sums_shared);
            if (threadIdx.x == 0) {
                for (int c = 0; c < DETCHECK_REPROSUM_CANDIDATES; ++c) {
                    // Less bits(M) once per term of the tile, padding included.
                    record[c] = biased[c] - (unsigned long long)DETCHECK_REPROSUM_TILE *
                                                (unsigned long long)__double_as_longlong(magic[c]);
                }
            }
        }
        if (threadIdx.x == 0) {
            record[DETCHECK_REPROSUM_CANDIDATES] = largest;
            atomicMax(header, level);
        }
    }
}

// The result and its status into out[0] and out[1], and the header zeroed for the next sum. Thread
// 0 only, once every thread has read the header.
__device__ __forceinline__ void detcheck_reprosum_done(
    unsigned int* out, unsigned long long* scratch, float result) {
    out[0] = __float_as_uint(result);
    out[1] = DETCHECK_REPROSUM_DONE;
    scratch[0] = 0;
    scratch[1] = 0;
}

// The sum of every tile's record on the global grid, in thread 0: candidate global - level, or
// nothing for an all-zero tile; a tile that needs a fixup adds its record's candidate 0 when
// `fixed` (the fixup kernel wrote it there), and is otherwise counted in *pending and, while
// there is room, listed in listed[0..DETCHECK_REPROSUM_LAST_BLOCK_REREADS]. *pending must be
// zero on entry. The records are read with __ldcg (cached in L2 only, where other blocks'
// writes are, never in this SM's L1), as plain loads the compiler may issue several at a time.
__device__ __forceinline__ unsigned long long detcheck_reprosum_gather(
    const unsigned long long* scratch, unsigned long long n, unsigned int global_level,
    bool fixed, unsigned int* pending, unsigned long long* listed,
    unsigned long long* sums_shared) {
    const unsigned long long tiles = (n + DETCHECK_REPROSUM_TILE - 1) / DETCHECK_REPROSUM_TILE;
    const unsigned long long span = DETCHECK_REPROSUM_GATHER * DETCHECK_REPROSUM_THREADS;
    unsigned long long sum[1] = {0};
    // Thread t takes tiles t, t + THREADS, t + 2 THREADS, ..., GATHER at a time: their largest
    // magnitudes are loaded together, then their sums, so one thread waits for two loads per
    // GATHER tiles rather than per tile.
    for (unsigned long long first = threadIdx.x; first < tiles; first += span) {
        unsigned long long largest[DETCHECK_REPROSUM_GATHER];
#pragma unroll
        for (int u = 0; u < DETCHECK_REPROSUM_GATHER; ++u) {
            unsigned long long tile = first + (unsigned long long)u * DETCHECK_REPROSUM_THREADS;
            largest[u] = tile < tiles ? __ldcg(detcheck_reprosum_record(scratch, tile) +
                                               DETCHECK_REPROSUM_CANDIDATES)
                                      : 0;
        }
#pragma unroll
        for (int u = 0; u < DETCHECK_REPROSUM_GATHER; ++u) {
            unsigned long long tile = first + (unsigned long long)u * DETCHECK_REPROSUM_THREADS;
            if (tile >= tiles) continue;
            const unsigned long long* record = detcheck_reprosum_record(scratch, tile);
            unsigned int distance = global_level - (unsigned int)(largest[u] >> 23);
            if (distance < DETCHECK_REPROSUM_CANDIDATES) {
                sum[0] += __ldcg(record + distance);
            } else if (detcheck_reprosum_needs_fixup(largest[u], global_level)) {
                if (fixed) {
                    sum[0] += __ldcg(record);
                } else {
                    unsigned int k = atomicAdd(pending, 1u);
                    if (k < DETCHECK_REPROSUM_LAST_BLOCK_REREADS) listed[k] = tile;
                }
            }
        }
    }
    detcheck_block_sums(sum, sums_shared);
    return sum[0];
}

// The one-buffer sum in one launch: every block writes its tiles' records, then counts itself
// in (word 1 of the header); the last block to arrive finishes. It sums the records on the global
// grid, re-reads the tiles too far below it (at most DETCHECK_REPROSUM_LAST_BLOCK_REREADS: with
// more it leaves out[1] PENDING for the fixup and finish kernels), writes out[0], out[1] DONE,
// and zeroes the header for the next sum. The header must be zero before the launch; any grid of
// DETCHECK_REPROSUM_THREADS-thread blocks.
extern "C" __global__ void detcheck_reprosum_f32(
    unsigned int* out, unsigned long long* scratch, const float* terms, unsigned long long n) {
    if (blockDim.x != DETCHECK_REPROSUM_THREADS) __trap();
    __shared__ unsigned int largest_shared[DETCHECK_REPROSUM_THREADS];
    __shared__ unsigned long long
        sums_shared[DETCHECK_REPROSUM_CANDIDATES * DETCHECK_REPROSUM_THREADS];
    __shared__ unsigned int last_shared;
    __shared__ unsigned int pending_shared;
    __shared__ unsigned long long listed_shared[DETCHECK_REPROSUM_LAST_BLOCK_REREADS + 1];
    detcheck_reprosum_tile_records(scratch, terms, n, largest_shared, sums_shared);
    // Every thread's record writes are visible to the whole device before the block counts in.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int arrived = atomicAdd((unsigned int*)(scratch + 1), 1u);
        last_shared = arrived == gridDim.x - 1 ? 1u : 0u;
        pending_shared = 0;
    }
    __syncthreads();
    if (last_shared == 0) return;
    __threadfence();
    const unsigned int global_level = __ldcg((const unsigned int*)scratch);
    const unsigned int flags = __ldcg((const unsigned int*)scratch + 1);
    __syncthreads();  // every thread has read the header before thread 0 may zero it
    if (global_level == 255) {
        if (threadIdx.x == 0) {
            detcheck_reprosum_done(out, scratch, detcheck_special_result_f32(flags));
        }
        return;
    }
    unsigned long long sum = detcheck_reprosum_gather(
        scratch, n, global_level, false, &pending_shared, listed_shared, sums_shared);
    const unsigned int pending = pending_shared;  // read after gather's barriers
    if (pending > DETCHECK_REPROSUM_LAST_BLOCK_REREADS) {
        if (threadIdx.x == 0) out[1] = DETCHECK_REPROSUM_PENDING;
        return;
    }
    const double magic = detcheck_magic_of_level(global_level, detcheck_precision(n));
    for (unsigned int k = 0; k < pending; ++k) {
        sum += detcheck_reprosum_tile_on_grid(terms, n, listed_shared[k], magic, sums_shared);
    }
    if (threadIdx.x == 0) {
        float result = detcheck_f32_from_grid((long long)sum, detcheck_grid_step(magic));
        detcheck_reprosum_done(out, scratch, result);
    }
}

// Where detcheck_reprosum_f32 left out[1] PENDING (after it, on its stream): each tile that
// `detcheck_reprosum_needs_fixup` names is read again and summed on the global grid, into its
// record's candidate 0. Other tiles cost one read of their record. Blocks loop over tiles.
extern "C" __global__ void detcheck_reprosum_fixup_f32(
    unsigned long long* scratch, const float* terms, unsigned long long n) {
    if (blockDim.x != DETCHECK_REPROSUM_THREADS) __trap();
    __shared__ unsigned long long sums_shared[DETCHECK_REPROSUM_THREADS];
    const unsigned int global_level = ((const unsigned int*)scratch)[0];
    if (global_level == 255) return;
    const int precision = detcheck_precision(n);
    const double magic = detcheck_magic_of_level(global_level, precision);
    const unsigned long long tiles = (n + DETCHECK_REPROSUM_TILE - 1) / DETCHECK_REPROSUM_TILE;
    for (unsigned long long tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        unsigned long long* record = detcheck_reprosum_record(scratch, tile);
        // The same decision in every thread of the block, so the barriers below are uniform.
        unsigned long long largest = record[DETCHECK_REPROSUM_CANDIDATES];
        if (!detcheck_reprosum_needs_fixup(largest, global_level)) continue;
        unsigned long long sum = detcheck_reprosum_tile_on_grid(terms, n, tile, magic, sums_shared);
        if (threadIdx.x == 0) record[0] = sum;
    }
}

// After the fixup kernel, one block: the result into out[0], out[1] DONE, the header zeroed. The
// header's level is the largest over the tiles (255: the flags decide, `Specials`); each tile
// adds its record's sum on that level's grid, with wrap-around; then `f32_from_grid`.
extern "C" __global__ void detcheck_reprosum_finish_f32(
    unsigned int* out, unsigned long long* scratch, unsigned long long n) {
    if (blockDim.x != DETCHECK_REPROSUM_THREADS) __trap();
    __shared__ unsigned long long sums_shared[DETCHECK_REPROSUM_THREADS];
    const unsigned int global_level = ((const unsigned int*)scratch)[0];
    const unsigned int flags = ((const unsigned int*)scratch)[1];
    __syncthreads();  // every thread has read the header before thread 0 may zero it
    if (global_level == 255) {
        if (threadIdx.x == 0) {
            detcheck_reprosum_done(out, scratch, detcheck_special_result_f32(flags));
        }
        return;
    }
    unsigned long long sum =
        detcheck_reprosum_gather(scratch, n, global_level, true, nullptr, nullptr, sums_shared);
    if (threadIdx.x == 0) {
        double magic = detcheck_magic_of_level(global_level, detcheck_precision(n));
        float result = detcheck_f32_from_grid((long long)sum, detcheck_grid_step(magic));
        detcheck_reprosum_done(out, scratch, result);
    }
}

// ---- 4. The benchmark's baseline: a plain, nondeterministic sum ----------------------------

// *out += the f32 sum of terms[0..n], in no fixed order: per-thread f32 partials (grid-stride),
// a block tree in shared memory, one float atomicAdd per block (whose order varies from run to
// run). blockDim.x must be a power of two, at most 1024; *out must be zeroed first.
extern "C" __global__ void detcheck_plain_sum_f32(
    float* out, const float* terms, unsigned long long n) {
    __shared__ float partials[1024];
    const unsigned int tid = threadIdx.x;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    float acc = 0.0f;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + tid; i < n;
         i += stride) {
        acc += terms[i];
    }
    partials[tid] = acc;
    __syncthreads();
    for (unsigned int half = blockDim.x / 2; half > 0; half >>= 1) {
        if (tid < half) partials[tid] += partials[tid + half];
        __syncthreads();
    }
    if (tid == 0) atomicAdd(out, partials[0]);
}
"#;

/// How the host must launch a kernel of [`REPROSUM_SOURCE`]. None uses dynamic shared memory
/// (pass 0); the static shared memory is in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReprosumLaunch {
    /// Any grid and block size (a grid-stride loop over elements: which thread computes an
    /// element never changes its bits), e.g. blocks of 256 and `min(⌈len / 256⌉, 65535)`
    /// blocks. No shared memory.
    AnyGrid,
    /// Blocks of exactly [`REPROSUM_TILE_THREADS`] threads; any number of blocks from 1 (each
    /// loops over tiles `blockIdx.x`, `+ gridDim.x`, ...), e.g. `min(tiles, 8 × SMs)` with
    /// `tiles = reprosum_tiles(n)`; at least 1 even when `n` is 0.
    TileLoop,
    /// One block of [`REPROSUM_TILE_THREADS`] threads.
    OneBlock,
    /// Blocks of a power of two threads, at most 1024; any number of blocks.
    PowerOfTwoBlocks,
}

/// One argument of a kernel, as the CUDA C declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelArgument {
    /// Its C type.
    pub c_type: &'static str,
    /// Its name in the source.
    pub name: &'static str,
    /// What the host passes.
    pub meaning: &'static str,
}

/// One kernel of [`REPROSUM_SOURCE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReprosumKernel {
    /// Its `extern "C"` name, as the PTX and cubin name it.
    pub name: &'static str,
    /// Its arguments, in order.
    pub arguments: &'static [KernelArgument],
    /// The launch configuration the host must use.
    pub launch: ReprosumLaunch,
    /// Static shared memory per block, in bytes (for occupancy; nothing to pass).
    pub static_shared_bytes: u32,
    /// The CPU function in `value/reprosum.rs` whose bits it gives; `None` for the
    /// nondeterministic baseline.
    pub reference: Option<&'static str>,
    /// What it computes, and what must run before it.
    pub role: &'static str,
}

const fn argument(
    c_type: &'static str,
    name: &'static str,
    meaning: &'static str,
) -> KernelArgument {
    KernelArgument {
        c_type,
        name,
        meaning,
    }
}

const COLUMNS_F32_ARGUMENTS: [KernelArgument; 4] = [
    argument("float*", "out", "device array of `len` f32: the sums"),
    argument(
        "const float* const*",
        "inputs",
        "device array of `count` device pointers, each to `len` f32 (a contribution; their order \
         does not matter)",
    ),
    argument(
        "unsigned int",
        "count",
        "the number of contributions (0 gives +0.0 everywhere)",
    ),
    argument("unsigned long long", "len", "elements per contribution"),
];

const COLUMNS_F64_ARGUMENTS: [KernelArgument; 4] = [
    argument("double*", "out", "device array of `len` f64: the sums"),
    argument(
        "const double* const*",
        "inputs",
        "device array of `count` device pointers, each to `len` f64",
    ),
    argument(
        "unsigned int",
        "count",
        "the number of contributions (0 gives +0.0 everywhere)",
    ),
    argument("unsigned long long", "len", "elements per contribution"),
];

const SCRATCH_MEANING: &str =
    "device array of at least `reprosum_scratch_bytes(n)` bytes, its header zero when a sum \
     starts (layout: `reprosum_scratch_bytes`), the same for the kernels of one sum";
const TERMS_MEANING: &str = "device array of the `n` f32 terms";
const N_MEANING: &str = "the number of terms (at most 2^60), the same for the kernels of one sum";
const OUT_MEANING: &str =
    "device array of two u32: the sum's f32 bits, then 0 (done) or `REPROSUM_PENDING`";

const ONE_LAUNCH_ARGUMENTS: [KernelArgument; 4] = [
    argument("unsigned int*", "out", OUT_MEANING),
    argument("unsigned long long*", "scratch", SCRATCH_MEANING),
    argument("const float*", "terms", TERMS_MEANING),
    argument("unsigned long long", "n", N_MEANING),
];

const FIXUP_ARGUMENTS: [KernelArgument; 3] = [
    argument("unsigned long long*", "scratch", SCRATCH_MEANING),
    argument("const float*", "terms", TERMS_MEANING),
    argument("unsigned long long", "n", N_MEANING),
];

const FINISH_ARGUMENTS: [KernelArgument; 3] = [
    argument("unsigned int*", "out", OUT_MEANING),
    argument("unsigned long long*", "scratch", SCRATCH_MEANING),
    argument("unsigned long long", "n", N_MEANING),
];

const PLAIN_SUM_ARGUMENTS: [KernelArgument; 3] = [
    argument(
        "float*",
        "out",
        "device pointer to one f32, zeroed before the launch: the sum is added to it",
    ),
    argument("const float*", "terms", "device array of the `n` f32 terms"),
    argument("unsigned long long", "n", "the number of terms"),
];

const TILE_THREADS: u32 = REPROSUM_TILE_THREADS;

/// Every kernel of [`REPROSUM_SOURCE`]. The one-buffer sum is `detcheck_reprosum_f32`, then,
/// when it leaves `out[1]` [`REPROSUM_PENDING`], `*_fixup_f32` and `*_finish_f32` on the same
/// stream; for `n = 0` it gives +0.0 like the others.
pub const REPROSUM_KERNELS: [ReprosumKernel; 6] = [
    ReprosumKernel {
        name: "detcheck_reprosum_columns_f32",
        arguments: &COLUMNS_F32_ARGUMENTS,
        launch: ReprosumLaunch::AnyGrid,
        static_shared_bytes: 0,
        reference: Some("value::reprosum::sum_columns_f32"),
        role: "out[i] = reproducible_sum_f32 of inputs[0..count][i]",
    },
    ReprosumKernel {
        name: "detcheck_reprosum_columns_f64",
        arguments: &COLUMNS_F64_ARGUMENTS,
        launch: ReprosumLaunch::AnyGrid,
        static_shared_bytes: 0,
        reference: Some("value::reprosum::sum_columns_f64"),
        role: "out[i] = the two-grid sum of inputs[0..count][i]",
    },
    ReprosumKernel {
        name: "detcheck_reprosum_f32",
        arguments: &ONE_LAUNCH_ARGUMENTS,
        launch: ReprosumLaunch::TileLoop,
        // The block maximum's u32 per thread, the candidates' u64 sums per thread, the last
        // block's flag, count and list of tiles to re-read.
        static_shared_bytes: TILE_THREADS * 4
            + REPROSUM_CANDIDATES * TILE_THREADS * 8
            + 8
            + (REPROSUM_LAST_BLOCK_REREADS + 1) * 8,
        reference: Some("value::reprosum::reproducible_sum_f32"),
        role: "one-buffer sum in one launch: every tile's record, then the last block to arrive \
               finishes (out[1] 0), or leaves it to the fixup and finish kernels (out[1] \
               REPROSUM_PENDING); the scratch header must be zero",
    },
    ReprosumKernel {
        name: "detcheck_reprosum_fixup_f32",
        arguments: &FIXUP_ARGUMENTS,
        launch: ReprosumLaunch::TileLoop,
        static_shared_bytes: TILE_THREADS * 8,
        reference: Some("value::reprosum::reproducible_sum_f32"),
        role: "one-buffer sum, pending: re-sums the tiles too far below the global binade on its \
               grid",
    },
    ReprosumKernel {
        name: "detcheck_reprosum_finish_f32",
        arguments: &FINISH_ARGUMENTS,
        launch: ReprosumLaunch::OneBlock,
        static_shared_bytes: TILE_THREADS * 8,
        reference: Some("value::reprosum::reproducible_sum_f32"),
        role: "one-buffer sum, pending, after the fixup kernel: the result into out[0], out[1] \
               0, the scratch header zeroed",
    },
    ReprosumKernel {
        name: "detcheck_plain_sum_f32",
        arguments: &PLAIN_SUM_ARGUMENTS,
        launch: ReprosumLaunch::PowerOfTwoBlocks,
        static_shared_bytes: 1024 * 4,
        reference: None,
        role: "the benchmark's baseline: *out += a plain f32 sum, nondeterministic by design \
               (one float atomicAdd per block, in whatever order blocks finish)",
    },
];

/// Compiles [`REPROSUM_SOURCE`] with NVRTC, to PTX for [`PTX_ARCH`] and a cubin for
/// [`CUBIN_ARCH`].
///
/// # Errors
/// [`CudaError::LibraryMissing`] when NVRTC cannot be loaded (see its hint);
/// [`CudaError::Compile`] if NVRTC refuses the source.
pub fn compile_reprosum_kernels() -> Result<ReduceModules, CudaError> {
    Ok(ReduceModules {
        ptx: compile_ptx(REPROSUM_PROGRAM, REPROSUM_SOURCE, PTX_ARCH)?,
        cubin: compile_cubin(REPROSUM_PROGRAM, REPROSUM_SOURCE, CUBIN_ARCH)?,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::device::cuda::assert_compiles_with_nvrtc;
    use crate::device::host_emulation::{self, run, Cases, HostKernels, HostSource};
    use crate::value::reprosum::{reproducible_sum_f32, sum_columns_f32, sum_columns_f64};
    use crate::value::seed::{derive_stream, Stream};
    use std::collections::BTreeSet;

    #[test]
    fn the_table_matches_the_source_and_names_real_references() {
        let names: BTreeSet<_> = REPROSUM_KERNELS.iter().map(|k| k.name).collect();
        assert_eq!(names.len(), REPROSUM_KERNELS.len());
        let cpu = include_str!("../value/reprosum.rs");
        for kernel in &REPROSUM_KERNELS {
            // The source declares the table's arguments, in order, with the same types.
            let declaration = format!("extern \"C\" __global__ void {}(", kernel.name);
            let start = REPROSUM_SOURCE
                .find(&declaration)
                .unwrap_or_else(|| panic!("{} is not declared", kernel.name))
                + declaration.len();
            let end = start + REPROSUM_SOURCE[start..].find(')').unwrap();
            let declared: Vec<String> = REPROSUM_SOURCE[start..end]
                .split(',')
                .map(|a| a.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            let table: Vec<String> = kernel
                .arguments
                .iter()
                .map(|a| format!("{} {}", a.c_type, a.name))
                .collect();
            assert_eq!(declared, table, "{}", kernel.name);
            if let Some(reference) = kernel.reference {
                let function = reference.rsplit("::").next().unwrap();
                assert!(cpu.contains(&format!("fn {function}(")), "{reference}");
            }
        }
    }

    /// The tile constants the host computes with are the ones the source compiles with.
    #[test]
    fn the_sources_tile_constants_are_the_rust_ones() {
        let defined = |name: &str| -> u64 {
            let line = format!("#define {name} ");
            let at = REPROSUM_SOURCE.find(&line).unwrap() + line.len();
            REPROSUM_SOURCE[at..]
                .lines()
                .next()
                .unwrap()
                .trim()
                .parse()
                .unwrap()
        };
        assert_eq!(
            defined("DETCHECK_REPROSUM_THREADS"),
            u64::from(REPROSUM_TILE_THREADS)
        );
        assert_eq!(
            defined("DETCHECK_REPROSUM_ITEMS"),
            u64::from(REPROSUM_TILE_ITEMS)
        );
        assert_eq!(
            defined("DETCHECK_REPROSUM_CANDIDATES"),
            u64::from(REPROSUM_CANDIDATES)
        );
        assert!(REPROSUM_TILE_THREADS.is_power_of_two());
        assert_eq!(
            defined("DETCHECK_REPROSUM_LAST_BLOCK_REREADS"),
            u64::from(REPROSUM_LAST_BLOCK_REREADS)
        );
        assert!(REPROSUM_SOURCE.contains(&format!(
            "#define DETCHECK_REPROSUM_PENDING {REPROSUM_PENDING}u\n"
        )));
        assert!(REPROSUM_SOURCE.contains(&format!(
            "#define DETCHECK_REPROSUM_HEADER_WORDS {}\n",
            REPROSUM_HEADER_BYTES / 8
        )));
        assert_eq!(reprosum_scratch_bytes(0), 16);
        assert_eq!(reprosum_scratch_bytes(1), 16 + 40);
        assert_eq!(reprosum_scratch_bytes(4096 * 3 + 1), 16 + 4 * 40);
        // The canonical NaNs are Rust's.
        assert!(REPROSUM_SOURCE.contains(&format!("{:#x}u", f32::NAN.to_bits())));
        assert!(REPROSUM_SOURCE.contains(&format!("{:#x}LL", f64::NAN.to_bits())));
    }

    /// Every kernel compiles with NVRTC to PTX (compute_90) and to a cubin (sm_90). Without NVRTC
    /// this says what it would check and passes, unless `DETCHECK_REQUIRE_NVRTC=1` (CI).
    #[test]
    fn every_reprosum_kernel_compiles_with_nvrtc() {
        // The plain sum's `atom.global.add.f32` is an atomic, not an add instruction.
        let names: Vec<&str> = REPROSUM_KERNELS.iter().map(|k| k.name).collect();
        assert_compiles_with_nvrtc(
            (REPROSUM_PROGRAM, REPROSUM_SOURCE),
            (PTX_ARCH, CUBIN_ARCH),
            &names,
            &["f32", "f64"],
        );
    }

    // ---- The host emulation ---------------------------------------------------------------

    /// Tile sizes the host emulation compiles the source with: the real ones, or small ones
    /// (32 threads × 4 items, 2 candidates, the last block re-reading at most 2 tiles) that make
    /// many tiles of few terms and send many sums to the fixup and finish kernels.
    #[derive(Debug, Clone, Copy)]
    struct TileConfig {
        threads: u64,
        items: u64,
        candidates: u64,
        rereads: u64,
    }

    const REAL_TILES: TileConfig = TileConfig {
        threads: REPROSUM_TILE_THREADS as u64,
        items: REPROSUM_TILE_ITEMS as u64,
        candidates: REPROSUM_CANDIDATES as u64,
        rereads: REPROSUM_LAST_BLOCK_REREADS as u64,
    };

    const SMALL_TILES: TileConfig = TileConfig {
        threads: 32,
        items: 4,
        candidates: 2,
        rereads: 2,
    };

    impl TileConfig {
        fn tile(self) -> u64 {
            self.threads * self.items
        }
    }

    /// [`REPROSUM_SOURCE`] for the host emulation's driver.
    pub(crate) const HOST: HostSource = HostSource {
        program: REPROSUM_PROGRAM,
        source: REPROSUM_SOURCE,
    };

    /// [`REPROSUM_SOURCE`] compiled for the CPU with `config`'s tiles (`device/host_emulation.rs`);
    /// `None` (after saying what would be checked) without g++, unless
    /// `DETCHECK_REQUIRE_NVRTC=1`.
    fn host_kernels(config: TileConfig) -> Option<HostKernels> {
        host_emulation::host_kernels(
            HOST,
            &[
                format!("DETCHECK_REPROSUM_THREADS={}", config.threads),
                format!("DETCHECK_REPROSUM_ITEMS={}", config.items),
                format!("DETCHECK_REPROSUM_CANDIDATES={}", config.candidates),
                format!("DETCHECK_REPROSUM_LAST_BLOCK_REREADS={}", config.rereads),
            ],
            "run the reproducible-sum kernels on the CPU and compare their bits with \
             value/reprosum.rs",
        )
    }

    /// The reproducible sums' case kinds (1 to 4 in `host_driver.cpp`).
    trait ReprosumCases {
        fn columns_f32(&mut self, rows: &[Vec<f32>], len: usize, grid: u64, block: u64, seed: u64);
        fn columns_f64(&mut self, rows: &[Vec<f64>], len: usize, grid: u64, block: u64, seed: u64);
        fn sum(&mut self, terms: &[f32], grid: u64, fixup_grid: u64, seed: u64);
        fn plain_sum(&mut self, terms: &[f32], grid: u64, block: u64, seed: u64);
    }

    impl ReprosumCases for Cases {
        fn columns_f32(&mut self, rows: &[Vec<f32>], len: usize, grid: u64, block: u64, seed: u64) {
            self.words(&[1, rows.len() as u64, len as u64, grid, block, seed]);
            rows.iter().for_each(|row| self.f32s(row));
        }

        fn columns_f64(&mut self, rows: &[Vec<f64>], len: usize, grid: u64, block: u64, seed: u64) {
            self.words(&[2, rows.len() as u64, len as u64, grid, block, seed]);
            rows.iter().for_each(|row| self.f64s(row));
        }

        fn sum(&mut self, terms: &[f32], grid: u64, fixup_grid: u64, seed: u64) {
            self.words(&[3, terms.len() as u64, grid, fixup_grid, seed]);
            self.f32s(terms);
        }

        fn plain_sum(&mut self, terms: &[f32], grid: u64, block: u64, seed: u64) {
            self.words(&[4, terms.len() as u64, grid, block, seed]);
            self.f32s(terms);
        }
    }

    /// Random normal terms with magnitudes spread over `2^±(spread/2)`.
    fn normals(n: usize, stream: u64, spread: f64) -> Vec<f64> {
        let mut rng = derive_stream(17, Stream::User(stream), 0, 0);
        (0..n)
            .map(|_| {
                let magnitude = libm::exp2(rng.uniform_f64() * spread - spread / 2.0);
                rng.normal_f64() * magnitude
            })
            .collect()
    }

    fn normals_f32(n: usize, stream: u64, spread: f64) -> Vec<f32> {
        normals(n, stream, spread)
            .into_iter()
            .map(|x| x as f32)
            .collect()
    }

    /// Columns with every kind of element from 40 on: NaN, infinities of one and both signs,
    /// zeros of both signs, subnormals, overflow, exact ties, terms hundreds of binades apart.
    fn plant_f32(rows: &mut [Vec<f32>]) {
        let (count, last) = (rows.len(), rows.len() - 1);
        if rows[0].len() < 1000 {
            return;
        }
        rows[0][40] = f32::NAN;
        rows[last][41] = f32::INFINITY;
        rows[0][42] = f32::INFINITY;
        rows[last][42] = f32::NEG_INFINITY;
        rows[last][43] = f32::NEG_INFINITY;
        rows[0][44] = f32::from_bits(0x7fc0_1234); // a NaN with a payload
        for (k, row) in rows.iter_mut().enumerate() {
            row[45] = if k % 2 == 0 { -0.0 } else { 0.0 };
            row[46] = -0.0;
            row[47] = f32::from_bits(1 + k as u32 * 77);
            row[48] = -f32::from_bits(0x0040_0000 + k as u32);
            row[49] = f32::MAX;
            row[50] = if k % 2 == 0 { f32::MAX } else { -f32::MAX };
            row[51] = 2f32.powi(100 - 30 * k as i32);
            row[52] = if k == 0 {
                1.0
            } else {
                2f32.powi(-60) * (k as f32)
            };
            row[53] = if k == 0 { 3.0e38 } else { 1.0e-38 };
            row[54] = f32::MIN_POSITIVE;
        }
        if count > 1 {
            // 1 + 2^-52·(1/2): a term exactly half a step of the 1.0 element's grid.
            rows[1][55] = 1.0;
            rows[0][55] = 2f32.powi(-51);
        }
        if count == 17 {
            // More than 2^53 steps whose f32 rounding is a tie but for the last step:
            // `f32_from_grid`'s sticky bit decides it.
            for (k, x) in tie_broken_by_one_step().into_iter().enumerate() {
                rows[k][57] = x;
            }
        }
    }

    /// 17 terms, 15 × 3.0, half an f32 ulp of their sum (2^-19) and one grid step (2^-48): the
    /// exact sum is just above a tie between two f32s, and more than 2^53 steps.
    fn tie_broken_by_one_step() -> Vec<f32> {
        let mut terms = vec![3.0f32; 15];
        terms.extend([2f32.powi(-19), 2f32.powi(-48)]);
        assert_eq!(
            reproducible_sum_f32(&terms),
            45.0 + 2f32.powi(-18),
            "rounded up"
        );
        terms
    }

    fn plant_f64(rows: &mut [Vec<f64>]) {
        let (count, last) = (rows.len(), rows.len() - 1);
        if rows[0].len() < 1000 {
            return;
        }
        rows[0][40] = f64::NAN;
        rows[last][41] = f64::INFINITY;
        rows[0][42] = f64::INFINITY;
        rows[last][42] = f64::NEG_INFINITY;
        rows[last][43] = f64::NEG_INFINITY;
        for (k, row) in rows.iter_mut().enumerate() {
            row[45] = if k % 2 == 0 { -0.0 } else { 0.0 };
            row[47] = f64::from_bits(1 + k as u64 * 77);
            row[48] = -f64::from_bits(0x0008_0000_0000_0000 + k as u64);
            row[49] = f64::MAX;
            row[50] = if k % 2 == 0 { f64::MAX } else { -f64::MAX };
            row[51] = 2f64.powi(900 - 250 * k as i32);
            row[52] = if k == 0 {
                1.0
            } else {
                2f64.powi(-100) * (k as f64)
            };
            row[53] = f64::MIN_POSITIVE;
        }
        if count > 1 {
            rows[0][55] = 1.0e300;
            rows[1][55] = -1.0e300;
            rows[last][55] = 3.0 * 2f64.powi(-1074);
        }
    }

    const COUNTS: [usize; 11] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17];
    const LENGTHS: [usize; 3] = [0, 1, 1000];
    /// Launch configurations (grid, block, block-order seed): several threads and blocks per
    /// element range, and one thread for everything.
    const COLUMN_LAUNCHES: [(u64, u64, u64); 2] = [(3, 64, 5), (1, 7, 6)];

    /// The column kernels against `sum_columns_f32` and `sum_columns_f64`, bit for bit, for 1 to
    /// 10 and 17 contributions, lengths 0, 1 and 1000, narrow and wide random terms and every
    /// special element, at two launch configurations.
    #[test]
    fn column_kernels_give_the_cpus_bits_on_the_host() {
        let Some(kernels) = host_kernels(REAL_TILES) else {
            return;
        };
        let mut cases = Cases::default();
        let mut expected_f32: Vec<Vec<u32>> = Vec::new();
        let mut expected_f64: Vec<Vec<u64>> = Vec::new();
        for count in COUNTS {
            for len in LENGTHS {
                let spread = [4.0, 40.0, 90.0][count % 3];
                let mut rows: Vec<Vec<f32>> = (0..count)
                    .map(|k| normals_f32(len, 100 * count as u64 + k as u64, spread))
                    .collect();
                plant_f32(&mut rows);
                let mut wide: Vec<Vec<f64>> = (0..count)
                    .map(|k| normals(len, 5000 + 100 * count as u64 + k as u64, 12.0 * spread))
                    .collect();
                plant_f64(&mut wide);
                let refs: Vec<&[f32]> = rows.iter().map(Vec::as_slice).collect();
                let mut out = vec![0.0f32; len];
                sum_columns_f32(&refs, &mut out);
                let wide_refs: Vec<&[f64]> = wide.iter().map(Vec::as_slice).collect();
                let mut wide_out = vec![0.0f64; len];
                sum_columns_f64(&wide_refs, &mut wide_out);
                for (grid, block, seed) in COLUMN_LAUNCHES {
                    cases.columns_f32(&rows, len, grid, block, seed);
                    expected_f32.push(out.iter().map(|x| x.to_bits()).collect());
                    cases.columns_f64(&wide, len, grid, block, seed);
                    expected_f64.push(wide_out.iter().map(|x| x.to_bits()).collect());
                }
            }
        }
        let mut results = run(&kernels, &cases);
        for (case, (f32_bits, f64_bits)) in expected_f32.iter().zip(&expected_f64).enumerate() {
            let (count, len) = (
                COUNTS[case / (LENGTHS.len() * 2)],
                LENGTHS[case / 2 % LENGTHS.len()],
            );
            let got = results.f32s(f32_bits.len());
            for (i, (g, e)) in got.iter().zip(f32_bits).enumerate() {
                assert_eq!(
                    g, e,
                    "f32, {count} contributions of {len}: element {i}: {g:#x}, cpu {e:#x}"
                );
            }
            let got = results.f64s(f64_bits.len());
            for (i, (g, e)) in got.iter().zip(f64_bits).enumerate() {
                assert_eq!(
                    g, e,
                    "f64, {count} contributions of {len}: element {i}: {g:#x}, cpu {e:#x}"
                );
            }
        }
        results.assert_done();
    }

    /// A one-buffer case and what the host emulation must report for it.
    struct OneBuffer {
        name: String,
        terms: Vec<f32>,
        /// Tiles the fixup kernel must re-read, and all-zero tiles, when known.
        fixed: Option<u64>,
        all_zero: Option<u64>,
    }

    impl OneBuffer {
        fn new(name: impl Into<String>, terms: Vec<f32>) -> OneBuffer {
            OneBuffer {
                name: name.into(),
                terms,
                fixed: None,
                all_zero: None,
            }
        }
    }

    /// What the one-buffer cases of one configuration showed.
    #[derive(Debug, Default)]
    struct OneBufferRun {
        /// Tiles re-read, over every case and launch.
        fixed: u64,
        /// Sums that the fixup and finish kernels finished.
        pending: u64,
        /// Sums that the one launch finished.
        done: u64,
    }

    /// Each case at several grids (one block for every tile, two, one per tile) and block
    /// orders, twice on one scratch array, against `reproducible_sum_f32`; `None` without g++
    /// (nothing ran).
    fn check_one_buffer_sums(config: TileConfig, buffers: &[OneBuffer]) -> Option<OneBufferRun> {
        let kernels = host_kernels(config)?;
        let launches = |tiles: u64| [(1, 1, 11), (2, 3, 12), (tiles.max(1), 2, 13)];
        let mut cases = Cases::default();
        for buffer in buffers {
            let tiles = (buffer.terms.len() as u64).div_ceil(config.tile());
            for (grid, fixup_grid, seed) in launches(tiles) {
                cases.sum(&buffer.terms, grid, fixup_grid, seed);
            }
        }
        let mut results = run(&kernels, &cases);
        let mut seen = OneBufferRun::default();
        for buffer in buffers {
            let expected = reproducible_sum_f32(&buffer.terms).to_bits();
            for (grid, _, _) in launches(1) {
                let [bits, fixed, all_zero, level, pending, header_left, again] =
                    results.words::<7>();
                assert_eq!(
                    bits,
                    u64::from(expected),
                    "{} ({config:?}, {grid} blocks): {:e} ({bits:#x}), cpu {:e} ({expected:#x}), \
                     global level {level}, {fixed} tiles re-read, pending {pending}",
                    buffer.name,
                    f32::from_bits(bits as u32),
                    f32::from_bits(expected)
                );
                assert_eq!(
                    again, bits,
                    "{}: the second sum on one scratch",
                    buffer.name
                );
                assert_eq!(
                    header_left, 0,
                    "{}: the header left after a sum",
                    buffer.name
                );
                // The last block re-reads up to `rereads` tiles; more go to the other kernels.
                assert_eq!(
                    pending,
                    u64::from(fixed > config.rereads),
                    "{}: {fixed} tiles re-read, pending {pending}",
                    buffer.name
                );
                if let Some(want) = buffer.fixed {
                    assert_eq!(fixed, want, "{}: tiles re-read", buffer.name);
                }
                if let Some(want) = buffer.all_zero {
                    assert_eq!(all_zero, want, "{}: all-zero tiles", buffer.name);
                }
                seen.fixed += fixed;
                seen.pending += pending;
                seen.done += 1 - pending;
            }
        }
        results.assert_done();
        Some(seen)
    }

    /// `tiles` tiles of random terms, tile `k` scaled by `2^scales[k]` (`None`: all zeros, with
    /// negative zeros), and `tail` more terms at scale 1.
    fn tiled(tile: u64, scales: &[Option<i32>], tail: usize, stream: u64) -> Vec<f32> {
        let tile = tile as usize;
        let mut terms = normals_f32(scales.len() * tile + tail, stream, 6.0);
        for (k, scale) in scales.iter().enumerate() {
            for (j, x) in terms[k * tile..(k + 1) * tile].iter_mut().enumerate() {
                *x = match scale {
                    // Scaled in f64 and rounded once: 2^s itself may be beyond f32.
                    Some(s) => (f64::from(*x) * 2f64.powi(*s)) as f32,
                    None if j % 3 == 0 => -0.0,
                    None => 0.0,
                };
            }
        }
        terms
    }

    /// Buffers for any tile size: empty, one term, a partial tile, whole tiles, wide ranges;
    /// a tile far below the rest (re-read by the fixup kernel), an all-zero tile (not re-read),
    /// a tile of subnormals only; tiles within the candidates; the largest term in the last,
    /// partial tile; non-finite terms; overflow; a sum beyond 2^53 steps.
    fn one_buffer_cases(config: TileConfig) -> Vec<OneBuffer> {
        let tile = config.tile();
        let far = -(config.candidates as i32) - 20;
        let near = -(config.candidates as i32) + 1;
        let mut buffers = vec![
            OneBuffer::new("empty", vec![]),
            OneBuffer::new("one term", vec![-3.25]),
            OneBuffer::new("one subnormal", vec![f32::from_bits(3)]),
            OneBuffer::new(
                "a partial tile",
                normals_f32(tile as usize / 3 + 1, 1, 20.0),
            ),
            OneBuffer::new("1000 terms", normals_f32(1000, 2, 40.0)),
            OneBuffer::new("one whole tile", normals_f32(tile as usize, 3, 8.0)),
            OneBuffer::new(
                "3 tiles and 17, wide",
                normals_f32(3 * tile as usize + 17, 4, 60.0),
            ),
            OneBuffer::new(
                "7 tiles and 5, narrow",
                normals_f32(7 * tile as usize + 5, 5, 2.0),
            ),
        ];
        let mut far_below = OneBuffer::new(
            "a tile far below, an all-zero tile, a subnormal tile, a near tile",
            tiled(
                tile,
                &[Some(0), Some(far), None, Some(-140), Some(near)],
                100,
                6,
            ),
        );
        far_below.fixed = Some(2);
        far_below.all_zero = Some(1);
        buffers.push(far_below);
        // More far tiles than the last block re-reads: the fixup and finish kernels run.
        let mut scales = vec![Some(far); 10];
        scales[4] = Some(0);
        let mut many_far = OneBuffer::new("ten tiles far below one", tiled(tile, &scales, 0, 13));
        many_far.fixed = Some(9);
        buffers.push(many_far);
        let mut all_zero = OneBuffer::new("all zeros", tiled(tile, &[None, None], 3, 7));
        let len = all_zero.terms.len();
        all_zero.terms[len - 3..].fill(-0.0);
        all_zero.fixed = Some(0);
        all_zero.all_zero = Some(3);
        buffers.push(all_zero);
        let mut last_largest = tiled(tile, &[Some(-3), Some(-1), Some(-2)], 9, 8);
        *last_largest.last_mut().unwrap() = 1.0e3;
        let mut last_largest = OneBuffer::new("the largest term last", last_largest);
        last_largest.fixed = Some(3);
        buffers.push(last_largest);
        // Every tile one binade below the next, so each candidate is used.
        let stairs: Vec<Option<i32>> = (0..6).map(|k| Some(-k)).collect();
        buffers.push(OneBuffer::new("stairs", tiled(tile, &stairs, 0, 9)));
        let mut top = tiled(tile, &[Some(100), Some(99), Some(97), Some(60)], 1, 10);
        top[5] = f32::MAX;
        top[6] = f32::MAX;
        buffers.push(OneBuffer::new("overflow to +inf", top.clone()));
        top[7] = -f32::MAX;
        top[8] = -f32::MAX;
        buffers.push(OneBuffer::new("near f32::MAX, cancelling", top));
        for (name, planted) in [
            ("NaN", vec![(1, f32::NAN)]),
            (
                "NaN with a payload, +inf",
                vec![(0, f32::from_bits(0xffc0_0001)), (2, f32::INFINITY)],
            ),
            ("+inf", vec![(2, f32::INFINITY)]),
            (
                "-inf twice",
                vec![(0, f32::NEG_INFINITY), (1, f32::NEG_INFINITY)],
            ),
            (
                "+inf and -inf",
                vec![(0, f32::INFINITY), (2, f32::NEG_INFINITY)],
            ),
        ] {
            let mut terms = tiled(tile, &[Some(0), Some(far), Some(0)], 5, 11);
            for (k, value) in planted {
                terms[k * tile as usize + 7] = value;
            }
            buffers.push(OneBuffer::new(name, terms));
        }
        let mut tie = tie_broken_by_one_step();
        buffers.push(OneBuffer::new("a tie broken by one step", tie.clone()));
        tie.reverse();
        buffers.push(OneBuffer::new("a tie broken by one step, reversed", tie));
        // Terms of one sign near the top binade: more than 2^53 steps in the sum.
        let big: Vec<f32> = normals_f32(2 * tile as usize + 3, 12, 1.0)
            .into_iter()
            .map(f32::abs)
            .collect();
        buffers.push(OneBuffer::new("one sign, many steps", big));
        buffers
    }

    /// The one-buffer kernels with the real tiles (256 threads × 16 terms, 4 candidates), against
    /// `reproducible_sum_f32` bit for bit, at three grids and block orders each.
    #[test]
    fn one_buffer_kernels_give_the_cpus_bits_on_the_host() {
        let Some(seen) = check_one_buffer_sums(REAL_TILES, &one_buffer_cases(REAL_TILES)) else {
            return;
        };
        println!("{seen:?}");
        assert!(seen.fixed > 0, "no tile re-read: {seen:?}");
    }

    /// The same with small tiles (32 threads × 4 terms, 2 candidates): many tiles, and buffers of
    /// random tile scales so every path (a candidate above the tile's binade, a fixup, an
    /// all-zero tile) is taken many times.
    #[test]
    fn one_buffer_kernels_with_small_tiles_give_the_cpus_bits_on_the_host() {
        let tile = SMALL_TILES.tile();
        let mut buffers = one_buffer_cases(SMALL_TILES);
        let mut rng = derive_stream(3, Stream::User(40), 0, 0);
        for case in 0..12 {
            let tiles = 1 + rng.below(60) as usize;
            let scales: Vec<Option<i32>> = (0..tiles)
                .map(|_| match rng.below(10) {
                    0 => None,
                    1 => Some(-(rng.below(40) as i32)),
                    _ => Some(-(rng.below(3) as i32)),
                })
                .collect();
            let tail = rng.below(tile) as usize;
            let terms = tiled(tile, &scales, tail, 100 + case);
            buffers.push(OneBuffer::new(format!("random scales {case}"), terms));
        }
        // More tiles than the finishing block's threads look at in one round (32 threads, 4
        // tiles each): its loop goes round three times; two tiles far below.
        let mut scales = vec![Some(0); 300];
        scales[7] = Some(-30);
        scales[290] = Some(-25);
        buffers.push(OneBuffer::new(
            "300 tiles, two far",
            tiled(tile, &scales, 9, 200),
        ));
        // Without g++ nothing ran (and nothing was re-read).
        let Some(seen) = check_one_buffer_sums(SMALL_TILES, &buffers) else {
            return;
        };
        println!("{seen:?}");
        assert!(seen.fixed > 20, "only {} tiles re-read", seen.fixed);
        // Both ways of finishing, many times each.
        assert!(seen.pending > 10 && seen.done > 10, "{seen:?}");
    }

    /// The baseline adds up (it is not compared bit for bit: its bits depend on the order of the
    /// blocks' atomics by design): within `n` roundings of the sum of magnitudes.
    #[test]
    fn the_plain_sum_is_a_sum_on_the_host() {
        let Some(kernels) = host_kernels(REAL_TILES) else {
            return;
        };
        let terms = normals_f32(10_000, 30, 10.0);
        let launches = [(4, 64, 1), (1, 256, 2), (3, 1, 3)];
        let mut cases = Cases::default();
        cases.plain_sum(&[], 2, 32, 0);
        for (grid, block, seed) in launches {
            cases.plain_sum(&terms, grid, block, seed);
        }
        let mut results = run(&kernels, &cases);
        assert_eq!(results.words::<1>(), [0]);
        let exact: f64 = terms.iter().map(|&x| f64::from(x)).sum();
        let magnitudes: f64 = terms.iter().map(|&x| f64::from(x.abs())).sum();
        let bound = terms.len() as f64 * f64::from(f32::EPSILON) * magnitudes;
        for (grid, block, _) in launches {
            let [bits] = results.words::<1>();
            let got = f64::from(f32::from_bits(bits as u32));
            assert!(
                (got - exact).abs() <= bound,
                "{grid}×{block}: {got} vs {exact} (bound {bound})"
            );
        }
        results.assert_done();
    }
}
