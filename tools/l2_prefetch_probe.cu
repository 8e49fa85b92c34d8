// Does a weight read get faster when its bytes were sent to L2 while the GPU ran work that leaves
// DRAM idle (as the norms, RoPE and attention kernels between a decode step's GEMVs do)?
//
// Each iteration of a CUDA graph (the way XLA's command buffers replay a step) reads one weight
// copy of S bytes with a streaming-read kernel, then spins one warp for G cycles (memory-idle
// work). Copies rotate over more than 3 x L2, so every read is cold unless prefetched. Modes:
//   none     the read alone
//   bulk     every block of the read, when done, issues cp.async.bulk.prefetch.L2 for its share of
//            the NEXT copy (fire and forget: the block exits without waiting)
//   lines    the same with prefetch.global.L2, one per 128-byte line, every thread
//   kernel   a separate small kernel after the read issues the bulk prefetches
// and the time per iteration is what a GEMV followed by memory-idle work would cost.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 tools/l2_prefetch_probe.cu -o /tmp/l2probe && /tmp/l2probe
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_util.cuh"

enum Mode { kNone = 0, kBulk = 1, kLines = 2, kKernel = 3 };

__device__ __forceinline__ void PrefetchBulk(const char* p, int64_t bytes) {
  // One instruction per piece of at most 1 MB (16-byte aligned, multiple of 16).
  for (int64_t off = 0; off < bytes; off += (1 << 20)) {
    const uint32_t n = static_cast<uint32_t>(min(bytes - off, int64_t{1} << 20)) & ~15u;
    if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
}

// This block's share of [p, p + bytes), 128-byte aligned pieces.
__device__ __forceinline__ void Share(int64_t bytes, int64_t* lo, int64_t* hi) {
  const int64_t lines = (bytes + 127) / 128;
  const int64_t per = (lines + gridDim.x - 1) / gridDim.x;
  *lo = min(bytes, blockIdx.x * per * 128);
  *hi = min(bytes, (blockIdx.x + 1) * per * 128);
}

__device__ __forceinline__ void IssuePrefetch(const char* pf, int64_t pf_bytes, int mode) {
  int64_t lo, hi;
  Share(pf_bytes, &lo, &hi);
  if (mode == kBulk || mode == kKernel) {
    if (threadIdx.x == 0 && hi > lo) PrefetchBulk(pf + lo, hi - lo);
  } else if (mode == kLines) {
    for (int64_t off = lo + threadIdx.x * 128; off < hi; off += blockDim.x * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(pf + off));
  }
}

__global__ void __launch_bounds__(512) ReadKernel(const uint4* p, int64_t n16, uint32_t* out, const char* pf,
                                                  int64_t pf_bytes, int mode) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      if (i + u * stride < n16) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                     : "l"(p + i + u * stride));
      } else {
        v[u] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) atomicOr(out, 1u);
  if (mode == kBulk || mode == kLines) {
    __syncthreads();  // the block's own loads are done: prefetch from here
    IssuePrefetch(pf, pf_bytes, mode);
  }
}

__global__ void PrefetchKernel(const char* pf, int64_t pf_bytes) { IssuePrefetch(pf, pf_bytes, kKernel); }

__global__ void SpinKernel(int64_t cycles) {
  const int64_t t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

int main() {
  const ProbeDevice d = CurrentProbeDevice();
  const int sms = d.sms;
  std::printf("%s, %d SMs, L2 %.0f MB\n", d.name, sms, d.l2 / 1e6);
  const int64_t kPool = int64_t{2} << 30;  // copies rotate over 2 GB
  char* pool = nullptr;
  CK(cudaMalloc(&pool, kPool + (64 << 20)));
  CK(cudaMemset(pool, 0x5a, kPool + (64 << 20)));
  uint32_t* out = nullptr;
  CK(cudaMalloc(&out, 4));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int kIters = 24;
  const double sizes_mb[] = {9.4, 14.2, 28.3, 56.6};
  const int64_t gaps[] = {0, 10000, 20000, 40000};  // cycles (~5 / 10 / 20 us at ~1.98 GHz)
  const char* names[] = {"none", "bulk", "lines", "kernel"};
  std::printf("%8s %8s %8s %10s %10s\n", "MB", "gap_cyc", "mode", "us/iter", "saved_us");
  for (double mb : sizes_mb) {
    const int64_t bytes = static_cast<int64_t>(mb * (1 << 20)) & ~int64_t{4095};
    const int64_t copies = kPool / bytes;
    for (int64_t gap : gaps) {
      double base = 0;
      for (int mode = 0; mode < 4; ++mode) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int it = 0; it < kIters; ++it) {
          const char* w = pool + (it % copies) * bytes;
          const char* next = pool + ((it + 1) % copies) * bytes;
          ReadKernel<<<4 * sms, 512, 0, s>>>(reinterpret_cast<const uint4*>(w), bytes / 16, out, next, bytes,
                                             mode == kKernel ? kNone : mode);
          if (mode == kKernel) PrefetchKernel<<<sms, 32, 0, s>>>(next, bytes);
          if (gap) SpinKernel<<<1, 32, 0, s>>>(gap);
        }
        CK(cudaStreamEndCapture(s, &g));
        cudaGraphExec_t ge;
        CK(cudaGraphInstantiate(&ge, g, 0));
        // Before each timed replay, evict: read 1 GB elsewhere in the pool.
        const double med = MedianReplayMicros(ge, s, kIters, 7, [&] {
          ReadKernel<<<4 * sms, 512, 0, s>>>(reinterpret_cast<const uint4*>(pool + kPool / 2), (kPool / 2) / 16, out,
                                             nullptr, 0, kNone);
        });
        if (mode == kNone) base = med;
        std::printf("%8.1f %8lld %8s %10.2f %10.2f\n", mb, static_cast<long long>(gap), names[mode], med, base - med);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));
      }
    }
  }
  // The spin alone, to convert cycles to time.
  for (int64_t gap : gaps) {
    CK(cudaEventRecord(e0, s));
    for (int it = 0; it < kIters; ++it) SpinKernel<<<1, 32, 0, s>>>(gap);
    CK(cudaEventRecord(e1, s));
    CK(cudaStreamSynchronize(s));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    std::printf("spin %lld cycles: %.2f us per launch (stream)\n", static_cast<long long>(gap), ms * 1000 / kIters);
  }
  return 0;
}
