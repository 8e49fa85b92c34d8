// What the standalone CUDA probes in tools/ share: a checked CUDA call, the device's facts, the
// copies a cold read rotates over (and a weight's pool of them, with the read kernel's time on it),
// the median time of a captured graph's replays and of cold reads, and the flags a read kernel
// checks its sums against.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "stream_read.cuh"

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

// The current device: its name, SMs and L2 bytes.
struct ProbeDevice {
  char name[256];
  int sms;
  int64_t l2;
};
inline ProbeDevice CurrentProbeDevice() {
  int dev = 0, sms = 0, l2 = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev));
  ProbeDevice d{{}, sms, l2};
  std::snprintf(d.name, sizeof(d.name), "%s", prop.name);
  return d;
}

// Copies of a `bytes` buffer that together hold more than 3 x L2 (at least 2): reading them in
// turn, every read finds its copy evicted.
inline int ColdCopies(int64_t bytes, int64_t l2) {
  return static_cast<int>(std::max<int64_t>(2, (3 * l2 + bytes - 1) / bytes + 1));
}

// A weight's codes and then its scales, `copies` times over in one allocation (each copy `stride`
// bytes, the scales `scale_off` into it, both on 256 bytes): enough copies that every read in turn
// finds its copy evicted (ColdCopies; `bytes`, one copy's codes and scales, is what they count).
struct ColdPool {
  uint8_t* pool;
  int64_t scale_off, scale_bytes, stride, bytes;
  int copies;
};
inline ColdPool UploadCold(const void* codes, int64_t code_bytes, const void* scales, int64_t scale_bytes,
                           int64_t l2) {
  ColdPool p;
  p.scale_off = (code_bytes + 255) / 256 * 256, p.stride = (p.scale_off + scale_bytes + 255) / 256 * 256;
  p.scale_bytes = scale_bytes, p.bytes = code_bytes + scale_bytes, p.copies = ColdCopies(p.bytes, l2);
  CK(cudaMalloc(&p.pool, p.stride * p.copies));
  for (int c = 0; c < p.copies; ++c) {
    CK(cudaMemcpy(p.pool + c * p.stride, codes, code_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(p.pool + c * p.stride + p.scale_off, scales, scale_bytes, cudaMemcpyHostToDevice));
  }
  return p;
}

// Median over `replays` launches of `exec` on `s` of the microseconds per item, the graph holding
// `items` (reads, iterations) each; before(), if it does anything, runs on `s` ahead of each timed
// launch (an eviction pass, say).
template <typename Before>
double MedianReplayMicros(cudaGraphExec_t exec, cudaStream_t s, int items, int replays, Before&& before) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<double> us;
  for (int r = 0; r < replays; ++r) {
    before();
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    us.push_back(ms * 1e3 / items);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Captures record(s) (launches on `s`) into a graph, replays it 3 times to warm up, and returns
// MedianReplayMicros of 7 replays per item of the `items` the graph holds.
template <typename Record>
double CapturedMicros(cudaStream_t s, int items, Record&& record) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  record(s);
  CK(cudaStreamEndCapture(s, &graph));
  CK(cudaGraphInstantiate(&exec, graph, 0));
  for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(exec, s));
  const double us = MedianReplayMicros(exec, s, items, 7, [] {});
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(graph));
  return us;
}

// Median microseconds per read of read(st, c), which launches one read of copy c on st: a graph of
// at least 32 reads (whole rounds over the `copies` copies), each copy evicted by the time it comes
// round again (ColdCopies).
template <typename Read>
double ColdMicros(cudaStream_t s, int copies, Read&& read) {
  const int reps = std::max(copies, 32 / copies * copies);
  return CapturedMicros(s, reps, [&](cudaStream_t st) {
    for (int r = 0; r < reps; ++r) read(st, r % copies);
  });
}

// The salt a read kernel compares its sums with and the flag it sets on a match (so that no load
// is dead code), zeroed.
struct ReadFlags {
  uint32_t* salt;
  uint32_t* out;
};
inline ReadFlags MakeReadFlags() {
  ReadFlags f;
  CK(cudaMalloc(&f.salt, sizeof(uint32_t)));
  CK(cudaMalloc(&f.out, sizeof(uint32_t)));
  CK(cudaMemset(f.salt, 0, sizeof(uint32_t)));
  return f;
}
inline void FreeReadFlags(const ReadFlags& f) {
  CK(cudaFree(f.salt));
  CK(cudaFree(f.out));
}

// The read kernel's median cold time over a pool's copies, all of each copy's codes and scales.
inline double ColdPoolReadMicros(cudaStream_t s, const ColdPool& p, int sms, const ReadFlags& flags) {
  return ColdMicros(s, p.copies, [&](cudaStream_t st, int c) {
    jaxgemv::StreamReadKernel<<<jaxgemv::kReadBlocksPerSm * sms, jaxgemv::kReadThreads, 0, st>>>(
        reinterpret_cast<const uint4*>(p.pool + c * p.stride), (p.scale_off + p.scale_bytes) / 16, flags.salt, flags.out);
  });
}
