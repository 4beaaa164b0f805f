// The host emulation's driver (comm/cuda_reprosum.rs's tests): runs the reproducible-sum kernels
// on the CPU through cuda_host_shim.h, on cases read from a file, and writes their results.
//
//   g++ -std=c++20 -O1 -pthread -ffp-contract=off cuda_host_driver.cpp -o driver
//   ./driver cases.bin results.bin
//
// with cuda_host_shim.h and the kernels' source, as detcheck_reprosum.cu, in the same folder.
//
// Every number in both files is little-endian; a case is a u64 kind and u64 parameters, then its
// terms:
//   1 columns f32: count, len, grid, block, seed, then count * len f32 (contribution-major)
//                  -> len f32
//   2 columns f64: the same with f64 -> len f64
//   3 one-buffer sum: n, tiles grid, fixup grid, seed, then n f32
//                  -> u64 result bits, tiles fixed up, all-zero tiles skipped, global level
//   4 plain sum: n, grid, block, seed, then n f32 -> u64 result bits
// `seed` shuffles the order in which the blocks of every launch of the case run.
#include "cuda_host_shim.h"
#include "detcheck_reprosum.cu"

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
// threads at once, sharing a barrier.
void launch(unsigned int grid, unsigned int block, unsigned long long seed,
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
}

FILE* input;
FILE* output;

unsigned long long read_u64() {
    unsigned long long value;
    if (std::fread(&value, sizeof value, 1, input) != 1) {
        std::fprintf(stderr, "driver: truncated case file\n");
        std::exit(2);
    }
    return value;
}

template <typename T> std::vector<T> read_values(unsigned long long count) {
    std::vector<T> values(count);
    if (count != 0 && std::fread(values.data(), sizeof(T), count, input) != count) {
        std::fprintf(stderr, "driver: truncated case file\n");
        std::exit(2);
    }
    return values;
}

template <typename T> void write_values(const std::vector<T>& values) {
    if (!values.empty()) std::fwrite(values.data(), sizeof(T), values.size(), output);
}

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

void one_buffer_sum() {
    unsigned long long n = read_u64(), tiles_grid = read_u64(), fixup_grid = read_u64(),
                       seed = read_u64();
    std::vector<float> terms = read_values<float>(n);
    const unsigned long long tile = DETCHECK_REPROSUM_TILE;
    unsigned long long tiles = (n + tile - 1) / tile;
    // Header (zeroed, as the host must) and one record per tile; the records start as garbage.
    std::vector<unsigned long long> scratch(1 + tiles * DETCHECK_REPROSUM_RECORD,
                                            0xdeadbeefdeadbeefULL);
    scratch[0] = 0;
    float result = -1.0f;
    launch(tiles_grid, DETCHECK_REPROSUM_THREADS, seed, [&] {
        detcheck_reprosum_tiles_f32(scratch.data(), terms.data(), n);
    });
    unsigned int global_level = (unsigned int)(scratch[0] & 0xffffffffULL);
    unsigned long long fixed = 0, all_zero = 0;
    for (unsigned long long t = 0; t < tiles; ++t) {
        unsigned long long largest =
            scratch[1 + t * DETCHECK_REPROSUM_RECORD + DETCHECK_REPROSUM_CANDIDATES];
        if (global_level != 255 && detcheck_reprosum_needs_fixup(largest, global_level)) ++fixed;
        if (largest == 0) ++all_zero;
    }
    launch(fixup_grid, DETCHECK_REPROSUM_THREADS, seed + 1, [&] {
        detcheck_reprosum_fixup_f32(scratch.data(), terms.data(), n);
    });
    launch(1, DETCHECK_REPROSUM_THREADS, seed + 2, [&] {
        detcheck_reprosum_finish_f32(&result, scratch.data(), n);
    });
    unsigned int bits;
    std::memcpy(&bits, &result, sizeof bits);
    write_values(std::vector<unsigned long long>{bits, fixed, all_zero, global_level});
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
            case 1: columns<float>(detcheck_reprosum_columns_f32); break;
            case 2: columns<double>(detcheck_reprosum_columns_f64); break;
            case 3: one_buffer_sum(); break;
            case 4: plain_sum(); break;
            default: std::fprintf(stderr, "driver: unknown case kind %llu\n", kind); return 2;
        }
    }
    return std::fclose(output) == 0 ? 0 : 1;
}
