// detcheck's CUDA-on-the-host shim: just enough of CUDA C for the kernels of
// device/reprosum.rs, device/kernels.rs and device/ops.rs to compile with g++
// (-std=c++20) and run on the CPU, for the tests of a machine without a GPU.
//
// A kernel launch is emulated by host_driver.cpp: blocks run one at a time (in an order the
// driver shuffles), the threads of a block run concurrently as std::threads. So:
// - `__shared__` is `static`: one copy, shared by the threads of the block that runs;
// - `__syncthreads()` waits on the block's std::barrier;
// - `threadIdx` and `blockIdx` are thread_local, `blockDim` and `gridDim` are set per launch;
// - atomics are std::atomic_ref operations (sequentially consistent, as strong as CUDA's), and
//   __threadfence() a sequentially consistent fence;
// - isnan is the C++ library's (<cmath>), as NVRTC's CUDA headers give it to device code.
// This checks the kernels' arithmetic and that their bits do not depend on the order of blocks
// and threads; that a GPU gives the same bits is for the tests scripts/gpu-selftest.sh runs on
// a GPU.
#pragma once

#include <atomic>
#include <barrier>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <math.h>

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};

inline thread_local dim3 threadIdx;
inline thread_local dim3 blockIdx;
inline dim3 blockDim;
inline dim3 gridDim;

// The barrier of the block the calling thread belongs to (set by the driver).
inline thread_local std::barrier<>* detcheck_block_barrier = nullptr;

inline void __syncthreads() { detcheck_block_barrier->arrive_and_wait(); }

// CUDA's __threadfence(): this thread's writes are seen by every other thread before its later
// ones. Blocks run one at a time here, so a sequentially consistent fence is more than enough.
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// CUDA's __ldcg(p): a load cached in L2 only. One memory here.
template <typename T> inline T __ldcg(const T* address) { return *address; }

// CUDA's __trap() stops the kernel with an error; here, the process.
[[noreturn]] inline void __trap() { std::abort(); }

inline int __float_as_int(float x) { return std::bit_cast<int>(x); }
inline unsigned int __float_as_uint(float x) { return std::bit_cast<unsigned int>(x); }
inline float __int_as_float(int x) { return std::bit_cast<float>(x); }
inline float __uint_as_float(unsigned int x) { return std::bit_cast<float>(x); }
inline long long __double_as_longlong(double x) { return std::bit_cast<long long>(x); }
inline double __longlong_as_double(long long x) { return std::bit_cast<double>(x); }

// The number of leading zero bits of a 64-bit word (64 for zero), as CUDA's __clzll.
inline int __clzll(long long x) {
    return std::countl_zero(static_cast<unsigned long long>(x));
}

inline unsigned int atomicMax(unsigned int* address, unsigned int value) {
    std::atomic_ref<unsigned int> target(*address);
    unsigned int old = target.load();
    while (old < value && !target.compare_exchange_weak(old, value)) {
    }
    return old;
}

inline unsigned int atomicOr(unsigned int* address, unsigned int value) {
    return std::atomic_ref<unsigned int>(*address).fetch_or(value);
}

inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
    return std::atomic_ref<unsigned int>(*address).fetch_add(value);
}

inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
    return std::atomic_ref<unsigned long long>(*address).fetch_add(value);
}

inline float atomicAdd(float* address, float value) {
    return std::atomic_ref<float>(*address).fetch_add(value);
}
