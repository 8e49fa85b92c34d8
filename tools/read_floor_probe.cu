// Is the read floor of a small weight the memory's or the read kernel's own launch?
//
// The benchmark's ceiling and the decode's read floor (tools/decode_profile.py --floor) both time
// ffi/stream_read.cuh's kernel on a grid of 4 blocks of 512 threads per SM whatever the size: at
// 9.4 MB (the 8B decode's o projection in NVFP4) that is 8448 warps for one round of 8 loads per
// thread, most of them predicated off, and the benchmark's 4096 x 4096 GEMV rows read 111-134% of
// it. This times the same kernel under other grids on the decode's five projection sizes, each
// read cold (copies rotating over more than 3 x L2) and replayed from a CUDA graph, one read
// after the other, the way XLA's command buffers replay a decode step.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi tools/read_floor_probe.cu -o /tmp/rfprobe
//   /tmp/rfprobe [MB ...]        (default: the 8B decode's NVFP4 projections)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "probe_util.cuh"
#include "stream_read.cuh"

namespace {

struct Size {
  std::string name;
  int64_t bytes;
};

// NVFP4 bytes of an [N, K] weight: K / 2 bytes of codes and K / 16 scales per row.
int64_t Nvfp4Bytes(int64_t n, int64_t k) { return n * (k / 2 + k / 16); }

// Median microseconds per cold read of `bytes` over `blocks` blocks, rotating over `copies` copies
// at `pool`.
double TimeReads(const char* pool, int64_t stride, int copies, int64_t bytes, int blocks, const ReadFlags& f,
                 cudaStream_t s) {
  return ColdMicros(s, copies, [&](cudaStream_t st, int c) {
    jaxgemv::StreamReadKernel<<<blocks, jaxgemv::kReadThreads, 0, st>>>(
        reinterpret_cast<const uint4*>(pool + c * stride), bytes / 16, f.salt, f.out);
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Size> sizes;
  for (int i = 1; i < argc; ++i)
    sizes.push_back({std::string(argv[i]) + " MB", static_cast<int64_t>(std::atof(argv[i]) * 1e6) / 16 * 16});
  if (sizes.empty()) {
    // Qwen3-8B (examples/decode.py --config 8b): o, qkv, down, gate_up, lm_head.
    sizes = {{"o", Nvfp4Bytes(4096, 4096)},
             {"qkv", Nvfp4Bytes(6144, 4096)},
             {"down", Nvfp4Bytes(4096, 12288)},
             {"gate_up", Nvfp4Bytes(24576, 4096)},
             {"lm_head", Nvfp4Bytes(151936, 4096)}};
  }
  const ProbeDevice d = CurrentProbeDevice();
  const int sms = d.sms;
  std::printf("%s, %d SMs, L2 %.0f MB; per read: median of 7 graph replays, cold (copies over 3 x L2)\n", d.name,
              sms, d.l2 / 1e6);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const ReadFlags flags = MakeReadFlags();
  std::printf("%-8s %8s  %-28s %6s %9s %6s\n", "read", "MB", "grid", "blocks", "us/read", "TB/s");
  for (const Size& z : sizes) {
    const int64_t stride = (z.bytes + 255) / 256 * 256;
    const int copies = ColdCopies(z.bytes, d.l2);
    char* pool;
    CK(cudaMalloc(&pool, stride * copies));
    CK(cudaMemset(pool, 1, stride * copies));
    const int64_t n16 = z.bytes / 16;
    // One round of kReadUnroll loads per thread, at least a block per SM, at most the default.
    const int64_t round = int64_t{jaxgemv::kReadThreads} * jaxgemv::kReadUnroll;
    const int sized =
        static_cast<int>(std::clamp<int64_t>((n16 + round - 1) / round, sms, jaxgemv::kReadBlocksPerSm * sms));
    const struct {
      const char* name;
      int blocks;
    } grids[] = {{"4 per SM (the extension's)", jaxgemv::kReadBlocksPerSm * sms},
                 {"2 per SM", 2 * sms},
                 {"1 per SM", sms},
                 {"sized: one round of loads", sized}};
    for (const auto& g : grids) {
      const double us = TimeReads(pool, stride, copies, z.bytes, g.blocks, flags, s);
      std::printf("%-8s %8.2f  %-28s %6d %9.2f %6.2f\n", z.name.c_str(), z.bytes / 1e6, g.name, g.blocks, us,
                  z.bytes / us / 1e6);
    }
    CK(cudaFree(pool));
  }
  FreeReadFlags(flags);
  CK(cudaStreamDestroy(s));
  return 0;
}
