// The streaming-read kernel behind the benchmark's ceiling and the decode's read floor
// (ffi/stream_read.cu), in a header of its own so that tools/read_floor_probe.cu times the same
// kernel under other grids.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_util.cuh"

namespace jaxgemv {

// Eight loads in flight per thread in every round, the last round included (predicated, not a
// serial tail: with a grid this large, a read of a few tens of MB is one or two rounds per
// thread, and a serial tail adds a full memory latency per extra load. The 28 MB ceiling went
// from 26 to 10 us when this landed together with the benchmark's ordered passes, commit
// f10282b; the two were not measured apart). The XOR keeps the loads from being dropped and the
// (practically never taken) store keeps the XOR. `salt` makes repeated calls in one program
// distinct. kPdl (tools/pdl_probe.cu only): launched with programmatic dependent launch, the
// kernel waits for the one before it before its first load and lets the next one launch once its
// last loads are issued.
constexpr int kReadUnroll = 8;
// The extension's grid: kReadBlocksPerSm blocks of kReadThreads per SM, whatever the size.
constexpr int kReadBlocksPerSm = 4, kReadThreads = 512;
template <bool kPdl = false>
__global__ void __launch_bounds__(kReadThreads)
    StreamReadKernel(const uint4* p, int64_t n16, const uint32_t* salt, uint32_t* out) {
  if constexpr (kPdl) GridDependencyWait();
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n16;
       i += kReadUnroll * stride) {
    uint4 v[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u)
      v[u] = i + u * stride < n16 ? LoadOnce16(p + i + u * stride) : make_uint4(0, 0, 0, 0);
    if (kPdl && i + kReadUnroll * stride >= n16) LaunchDependents();
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) out[0] = 0;
  if (acc == (0x9e3779b9u ^ __ldg(salt))) atomicOr(out, 1u);
}

}  // namespace jaxgemv
