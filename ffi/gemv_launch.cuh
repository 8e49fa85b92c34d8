// Host-side launch of the tensor-core GEMV of ffi/gemv_core.cuh for any format: the plan's
// launch parameters (rows, ksplit, loads, xperm) picked from the instantiated whitelist.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "gemv_core.cuh"

namespace jaxgemv {

inline ffi::Error LastLaunchError(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching ") + kernel + ": " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// log2 of a power of two (a block size, checked by the caller).
inline int Log2(int64_t v) {
  int shift = 0;
  while ((int64_t{1} << shift) < v) ++shift;
  return shift;
}

template <typename Format, typename T>
ffi::Error LaunchMma(cudaStream_t stream, const GemvArgs& a, int64_t rows, int64_t ksplit, int64_t loads,
                     int64_t xperm) {
  if (a.k % (4 * Format::kValuesPerChunk * loads) != 0)
    return Invalid("mma plan needs K % (" + std::to_string(4 * Format::kValuesPerChunk) + " x loads) == 0");
  bool launched = false;
  Switch<1, 2>(rows, [&](auto mt) {
    Switch<1, 2, 4, 8>(ksplit, [&](auto ks) {
      Switch<1, 2>(loads, [&](auto ld) {
        Switch<0, 1>(xperm, [&](auto xp) {
          constexpr int kMt = decltype(mt)::value, kKs = decltype(ks)::value, kLd = decltype(ld)::value;
          constexpr bool kXp = decltype(xp)::value != 0;
          const int m_blocks = (a.m + 8 * kMt - 1) / (8 * kMt);
          const int64_t blocks = static_cast<int64_t>((a.n + 15) / 16) * m_blocks;
          constexpr int kSmem = MmaSharedBytes<Format, kKs, kLd>();
          auto* kernel = MmaGemvKernel<Format, T, kMt, kKs, kLd, kXp>;
          // Above the 48 KB default the kernel must opt in (a function attribute, per device;
          // setting it on every launch keeps no state and is not a stream operation).
          if (kSmem > 48 * 1024 &&
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess) {
            launched = true;  // reported below through cudaGetLastError
            return;
          }
          kernel<<<static_cast<unsigned>(blocks), 32 * kKs, kSmem, stream>>>(a, m_blocks);
          launched = true;
        });
      });
    });
  });
  if (!launched) return Invalid("mma plan: rows must be 1 or 2, ksplit 1/2/4/8, loads 1/2, xperm 0/1");
  return LastLaunchError("MmaGemvKernel");
}

// The same, with the activation type taken from the FFI dtype (float16 or bfloat16, checked).
template <typename Format>
ffi::Error LaunchMmaFor(cudaStream_t stream, const GemvArgs& a, ffi::DataType dtype, int64_t rows, int64_t ksplit,
                        int64_t loads, int64_t xperm) {
  return dtype == ffi::DataType::F16 ? LaunchMma<Format, __half>(stream, a, rows, ksplit, loads, xperm)
                                     : LaunchMma<Format, __nv_bfloat16>(stream, a, rows, ksplit, loads, xperm);
}

}  // namespace jaxgemv
