// The host emulation's driver (the kernel modules' tests, through device/host_emulation.rs): runs
// CUDA kernels on the CPU through host_shim.h, on cases read from a file, and writes their
// results. One driver for every kernel source: a -D macro picks the sources it includes, and so
// the case kinds it knows (any of them at once: their names do not clash):
//
//   g++ -std=c++20 -O1 -pthread -ffp-contract=off -fno-strict-aliasing
//       -DDETCHECK_HOST_REPROSUM host_driver.cpp -o driver
//   ./driver cases.bin results.bin
//
// with host_shim.h and the sources, under their NVRTC names, in the same folder:
//   DETCHECK_HOST_REPROSUM  detcheck_reprosum.cu (device/reprosum.rs), kinds 1 to 4
//   DETCHECK_HOST_REDUCE    detcheck_reduce.cu (device/kernels.rs), kinds 5 and 6
//   DETCHECK_HOST_OPS       detcheck_ops.cu (device/ops.rs), kinds 7 and 8
//
// Every number in both files is little-endian; a case is a u64 kind and u64 parameters, then its
// terms:
//   1 columns f32: count, len, grid, block, seed, then count * len f32 (contribution-major)
//                  -> len f32
//   2 columns f64: the same with f64 -> len f64
//   3 one-buffer sum: n, grid, fixup grid, seed, then n f32, summed twice on one scratch array
//                  -> u64 result bits, tiles re-read, all-zero tiles, global level, 1 if the
//                  fixup and finish kernels ran, the header's bits left after the sums, the
//                  second sum's bits
//   4 plain sum: n, grid, block, seed, then n f32 -> u64 result bits
//   5 combine: op (0 sum, 1 max), dtype (0 f32, 1 f64, 2 i32, 3 i64, 4 u8), then as kind 1 with
//                  elements of that dtype: count, len, grid, block, seed, count * len elements
//                  (inputs[0] first) -> len elements
//   6 accumulate: op, dtype, len, grid, block, seed, then len elements of dst, len of src
//                  -> len elements (dst after the kernel)
//   7 segmented sum: buckets, n, grid, block, seed, then n f32 values, n u32 order,
//                  buckets + 1 u32 offsets -> buckets f32
//   8 atomic scatter: buckets, n, grid, block, seed, then n f32 values, n u32 indices
//                  -> buckets f32 (from zeros), then the grid's block order as u64s
// `seed` shuffles the order in which the blocks of every launch of the case run.
#include "host_shim.h"
#ifdef DETCHECK_HOST_REPROSUM
#include "detcheck_reprosum.cu"
#endif
#ifdef DETCHECK_HOST_REDUCE
#include "detcheck_reduce.cu"
#endif
#ifdef DETCHECK_HOST_OPS
#include "detcheck_ops.cu"
#endif
#if !defined(DETCHECK_HOST_REPROSUM) && !defined(DETCHECK_HOST_REDUCE) && \
    !defined(DETCHECK_HOST_OPS)
#error "define DETCHECK_HOST_REPROSUM, DETCHECK_HOST_REDUCE or DETCHECK_HOST_OPS"
#endif

#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

namespace {

unsigned long long splitmix64(unsigned long long& state) {
    unsigned long long z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// A kernel launch: the blocks one at a time, in an order shuffled by `seed`; each block's
// threads at once, sharing a barrier. Returns the order the blocks ran in.
std::vector<unsigned int> launch(unsigned int grid, unsigned int block, unsigned long long seed,
                                 const std::function<void()>& kernel) {
    std::vector<unsigned int> order(grid);
    std::iota(order.begin(), order.end(), 0u);
    for (unsigned int i = grid; i > 1; --i) {
        std::swap(order[i - 1], order[splitmix64(seed) % i]);
    }
    gridDim = dim3{grid, 1, 1};
    blockDim = dim3{block, 1, 1};
    for (unsigned int b : order) {
        std::barrier<> barrier(block);
        std::vector<std::thread> threads;
        threads.reserve(block);
        for (unsigned int t = 0; t < block; ++t) {
            threads.emplace_back([&, t] {
                threadIdx = dim3{t, 0, 0};
                blockIdx = dim3{b, 0, 0};
                detcheck_block_barrier = &barrier;
                kernel();
            });
        }
        for (auto& thread : threads) thread.join();
    }
    return order;
}

FILE* input;
FILE* output;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "driver: %s\n", what);
    std::exit(2);
}

unsigned long long read_u64() {
    unsigned long long value;
    if (std::fread(&value, sizeof value, 1, input) != 1) fail("truncated case file");
    return value;
}

template <typename T> std::vector<T> read_values(unsigned long long count) {
    std::vector<T> values(count);
    if (count != 0 && std::fread(values.data(), sizeof(T), count, input) != count) {
        fail("truncated case file");
    }
    return values;
}

template <typename T> void write_values(const std::vector<T>& values) {
    if (!values.empty()) std::fwrite(values.data(), sizeof(T), values.size(), output);
}

// `out[i]` from `inputs[0..count][i]`: the reproducible sums' columns and the reductions'
// combine kernels share this signature.
template <typename T, typename Kernel> void columns(Kernel kernel) {
    unsigned long long count = read_u64(), len = read_u64(), grid = read_u64(),
                       block = read_u64(), seed = read_u64();
    std::vector<T> terms = read_values<T>(count * len);
    std::vector<const T*> inputs;
    for (unsigned long long k = 0; k < count; ++k) inputs.push_back(terms.data() + k * len);
    std::vector<T> out(len, T(-1));
    launch(grid, block, seed, [&] {
        kernel(out.data(), inputs.data(), (unsigned int)count, len);
    });
    write_values(out);
}

#ifdef DETCHECK_HOST_REPROSUM
void one_buffer_sum() {
    unsigned long long n = read_u64(), grid = read_u64(), fixup_grid = read_u64(),
                       seed = read_u64();
    std::vector<float> terms = read_values<float>(n);
    const unsigned long long tile = DETCHECK_REPROSUM_TILE;
    unsigned long long tiles = (n + tile - 1) / tile;
    // The header zeroed (as the host does once, when it allocates the array); the records start
    // as garbage.
    std::vector<unsigned long long> scratch(
        DETCHECK_REPROSUM_HEADER_WORDS + tiles * DETCHECK_REPROSUM_RECORD, 0xdeadbeefdeadbeefULL);
    scratch[0] = 0;
    scratch[1] = 0;
    // Twice on the same scratch array, in other block orders: the first sum must leave the header
    // zero for the second.
    unsigned long long bits[2] = {0, 0}, pending = 0, header_left = 0;
    for (int round = 0; round < 2; ++round) {
        unsigned int out[2] = {0xffffffffu, 0xffffffffu};
        unsigned long long order = seed + 10 * (unsigned long long)round;
        launch(grid, DETCHECK_REPROSUM_THREADS, order, [&] {
            detcheck_reprosum_f32(out, scratch.data(), terms.data(), n);
        });
        if (out[1] == DETCHECK_REPROSUM_PENDING) {
            pending = 1;
            launch(fixup_grid, DETCHECK_REPROSUM_THREADS, order + 1, [&] {
                detcheck_reprosum_fixup_f32(scratch.data(), terms.data(), n);
            });
            launch(1, DETCHECK_REPROSUM_THREADS, order + 2, [&] {
                detcheck_reprosum_finish_f32(out, scratch.data(), n);
            });
        }
        if (out[1] != DETCHECK_REPROSUM_DONE) fail("a one-buffer sum not done");
        bits[round] = out[0];
        header_left |= scratch[0] | scratch[1];
    }
    // What the records say: the global level (255 if a term is not finite), the tiles re-read
    // (in the last block or by the fixup kernel) and the all-zero tiles.
    unsigned int global_level = 0;
    for (unsigned long long t = 0; t < tiles; ++t) {
        unsigned long long largest = scratch[DETCHECK_REPROSUM_HEADER_WORDS +
                                             t * DETCHECK_REPROSUM_RECORD +
                                             DETCHECK_REPROSUM_CANDIDATES];
        unsigned int level = (unsigned int)(largest >> 23);
        if (level > global_level) global_level = level;
    }
    unsigned long long fixed = 0, all_zero = 0;
    for (unsigned long long t = 0; t < tiles; ++t) {
        unsigned long long largest = scratch[DETCHECK_REPROSUM_HEADER_WORDS +
                                             t * DETCHECK_REPROSUM_RECORD +
                                             DETCHECK_REPROSUM_CANDIDATES];
        if (global_level != 255 && detcheck_reprosum_needs_fixup(largest, global_level)) ++fixed;
        if (largest == 0) ++all_zero;
    }
    write_values(std::vector<unsigned long long>{bits[0], fixed, all_zero, global_level, pending,
                                                 header_left, bits[1]});
}

void plain_sum() {
    unsigned long long n = read_u64(), grid = read_u64(), block = read_u64(), seed = read_u64();
    std::vector<float> terms = read_values<float>(n);
    float result = 0.0f;
    launch(grid, block, seed, [&] { detcheck_plain_sum_f32(&result, terms.data(), n); });
    unsigned int bits;
    std::memcpy(&bits, &result, sizeof bits);
    write_values(std::vector<unsigned long long>{bits});
}
#endif

#ifdef DETCHECK_HOST_REDUCE
// `dst[i] = dst[i] op src[i]`.
template <typename T, typename Kernel> void accumulate(Kernel kernel) {
    unsigned long long len = read_u64(), grid = read_u64(), block = read_u64(),
                       seed = read_u64();
    std::vector<T> dst = read_values<T>(len);
    std::vector<T> src = read_values<T>(len);
    launch(grid, block, seed, [&] { kernel(dst.data(), src.data(), len); });
    write_values(dst);
}

// Kinds 5 and 6: the kernel of the case's operation and dtype.
void reduction(unsigned long long kind) {
    unsigned long long op = read_u64(), dtype = read_u64();
    if (op > 1) fail("unknown reduction op");
    const bool sum = op == 0;
#define DETCHECK_REDUCE_CASE(CODE, T, NAME)                                                    \
    case CODE:                                                                                 \
        if (kind == 5) {                                                                       \
            columns<T>(sum ? detcheck_sum_##NAME : detcheck_max_##NAME);                       \
        } else {                                                                               \
            accumulate<T>(sum ? detcheck_accumulate_sum_##NAME : detcheck_accumulate_max_##NAME); \
        }                                                                                      \
        break;
    switch (dtype) {
        DETCHECK_REDUCE_CASE(0, float, f32)
        DETCHECK_REDUCE_CASE(1, double, f64)
        DETCHECK_REDUCE_CASE(2, int, i32)
        DETCHECK_REDUCE_CASE(3, long long, i64)
        DETCHECK_REDUCE_CASE(4, unsigned char, u8)
        default: fail("unknown reduction dtype");
    }
#undef DETCHECK_REDUCE_CASE
}
#endif

#ifdef DETCHECK_HOST_OPS
void segmented_sum() {
    unsigned long long buckets = read_u64(), n = read_u64(), grid = read_u64(),
                       block = read_u64(), seed = read_u64();
    std::vector<float> values = read_values<float>(n);
    std::vector<unsigned int> order = read_values<unsigned int>(n);
    std::vector<unsigned int> offsets = read_values<unsigned int>(buckets + 1);
    std::vector<float> out(buckets, -1.0f);
    launch(grid, block, seed, [&] {
        detcheck_segmented_sum_f32(out.data(), values.data(), order.data(), offsets.data(),
                                   (unsigned int)buckets);
    });
    write_values(out);
}

void scatter_atomic() {
    unsigned long long buckets = read_u64(), n = read_u64(), grid = read_u64(),
                       block = read_u64(), seed = read_u64();
    std::vector<float> values = read_values<float>(n);
    std::vector<unsigned int> indices = read_values<unsigned int>(n);
    // From zeros, as Gpu::scatter_add_atomic allocates it.
    std::vector<float> out(buckets, 0.0f);
    std::vector<unsigned int> order = launch(grid, block, seed, [&] {
        detcheck_scatter_atomic_f32(out.data(), values.data(), indices.data(), n);
    });
    write_values(out);
    write_values(std::vector<unsigned long long>(order.begin(), order.end()));
}
#endif

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: driver CASES RESULTS\n");
        return 2;
    }
    input = std::fopen(argv[1], "rb");
    output = std::fopen(argv[2], "wb");
    if (input == nullptr || output == nullptr) {
        std::perror("driver");
        return 2;
    }
    unsigned long long kind;
    while (std::fread(&kind, sizeof kind, 1, input) == 1) {
        switch (kind) {
#ifdef DETCHECK_HOST_REPROSUM
            case 1: columns<float>(detcheck_reprosum_columns_f32); break;
            case 2: columns<double>(detcheck_reprosum_columns_f64); break;
            case 3: one_buffer_sum(); break;
            case 4: plain_sum(); break;
#endif
#ifdef DETCHECK_HOST_REDUCE
            case 5:
            case 6: reduction(kind); break;
#endif
#ifdef DETCHECK_HOST_OPS
            case 7: segmented_sum(); break;
            case 8: scatter_atomic(); break;
#endif
            default:
                std::fprintf(stderr, "driver: case kind %llu unknown or not compiled in\n", kind);
                return 2;
        }
    }
    return std::fclose(output) == 0 ? 0 : 1;
}
