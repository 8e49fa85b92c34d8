// Does a small kernel between two streaming reads make the second read slower?
//
// The benchmark's ceiling read (ffi/stream_read.cuh) took 2.0-2.3 us longer, in kernel time, when a
// small reduce computing its salt ran before each read (docs/perf-log.md, entry 103: 286 MB 65.9
// against 63.6 us, 50 MB 14.9 against 12.6). If a small kernel ahead of a streaming kernel costs it
// that much, the decode step's GEMVs, each after a small kernel or another GEMV, may pay it too.
// This replays, from CUDA graphs, cold reads (copies rotating over more than 3 x L2) in four
// arrangements per size and prints the microseconds per repetition:
//   reads               read, read, ...
//   tiny                the small kernel alone, repeated
//   tiny -> read        the small kernel computes the next read's salt from 8 values of x and the
//                       first 8 bytes of the next buffer (the benchmark's old salt), the read uses it
//   tiny, read          the same small kernel writing elsewhere, the read on a fixed salt
// and "extra", the arrangement's time less reads' and tiny's: what the read pays for the kernel
// before it, beside the kernel's own time and launch (0 if nothing interacts).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi tools/read_between_probe.cu -o /tmp/rbprobe
//   /tmp/rbprobe [MB ...]        (default: 50 92 286, the benchmark's sizes of entry 103)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_util.cuh"
#include "stream_read.cuh"

namespace {

// The old salt: the sum of 8 values of x and of the buffer's first 8 bytes, as one uint32.
__global__ void TinySalt(const float* x, const uint8_t* buf, uint32_t* salt) {
  float v = threadIdx.x < 8 ? x[threadIdx.x] + static_cast<float>(buf[threadIdx.x]) : 0.0f;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x == 0) *salt = __float_as_uint(v);
}

enum class Mode { kReads, kTiny, kTinyThenRead, kTinyBesideRead };

// Median microseconds per repetition of `mode` over `copies` copies of `bytes` at `pool`.
double Time(Mode mode, const char* pool, int64_t stride, int copies, int64_t bytes, const float* x,
            uint32_t* salts, uint32_t* fixed_salt, uint32_t* out, int blocks, cudaStream_t s) {
  const int reps = std::max(copies, 32 / copies * copies);
  return CapturedMicros(s, reps, [&](cudaStream_t st) {
    for (int r = 0; r < reps; ++r) {
      const char* buf = pool + (r % copies) * stride;
      if (mode != Mode::kReads) {
        uint32_t* dst = mode == Mode::kTinyThenRead ? salts + r : salts + reps + r;
        TinySalt<<<1, 32, 0, st>>>(x + (r % 64), reinterpret_cast<const uint8_t*>(buf), dst);
      }
      if (mode != Mode::kTiny) {
        const uint32_t* salt = mode == Mode::kTinyThenRead ? salts + r : fixed_salt;
        jaxgemv::StreamReadKernel<<<blocks, jaxgemv::kReadThreads, 0, st>>>(reinterpret_cast<const uint4*>(buf),
                                                                            bytes / 16, salt, out);
      }
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<double> mbs;
  for (int i = 1; i < argc; ++i) mbs.push_back(std::atof(argv[i]));
  if (mbs.empty()) mbs = {50, 92, 286};
  const ProbeDevice d = CurrentProbeDevice();
  const int sms = d.sms;
  std::printf("%s, %d SMs, L2 %.0f MB; us per repetition: median of 7 graph replays, cold (copies over 3 x L2)\n",
              d.name, sms, d.l2 / 1e6);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  constexpr int kMaxReps = 64;
  float* x;
  uint32_t *salts, *fixed_salt, *out;
  CK(cudaMalloc(&x, 128 * sizeof(float)));
  CK(cudaMalloc(&salts, 2 * kMaxReps * sizeof(uint32_t)));
  CK(cudaMalloc(&fixed_salt, sizeof(uint32_t)));
  CK(cudaMalloc(&out, sizeof(uint32_t)));
  CK(cudaMemset(x, 0, 128 * sizeof(float)));
  CK(cudaMemset(fixed_salt, 0, sizeof(uint32_t)));
  const int blocks = jaxgemv::kReadBlocksPerSm * sms;  // the extension's grid
  std::printf("%8s  %-16s %9s %9s\n", "MB", "arrangement", "us/rep", "extra us");
  for (double mb : mbs) {
    const int64_t bytes = static_cast<int64_t>(mb * 1e6) / 16 * 16;
    const int64_t stride = (bytes + 255) / 256 * 256;
    const int copies = ColdCopies(bytes, d.l2);
    if (std::max(copies, 32 / copies * copies) > kMaxReps) {
      std::printf("%8.2f  too small for this probe's %d salts\n", mb, kMaxReps);
      continue;
    }
    char* pool;
    CK(cudaMalloc(&pool, stride * copies));
    CK(cudaMemset(pool, 1, stride * copies));
    const double reads = Time(Mode::kReads, pool, stride, copies, bytes, x, salts, fixed_salt, out, blocks, s);
    const double tiny = Time(Mode::kTiny, pool, stride, copies, bytes, x, salts, fixed_salt, out, blocks, s);
    const double then = Time(Mode::kTinyThenRead, pool, stride, copies, bytes, x, salts, fixed_salt, out, blocks, s);
    const double beside = Time(Mode::kTinyBesideRead, pool, stride, copies, bytes, x, salts, fixed_salt, out, blocks, s);
    std::printf("%8.2f  %-16s %9.2f\n", mb, "reads", reads);
    std::printf("%8.2f  %-16s %9.2f\n", mb, "tiny", tiny);
    std::printf("%8.2f  %-16s %9.2f %9.2f\n", mb, "tiny -> read", then, then - reads - tiny);
    std::printf("%8.2f  %-16s %9.2f %9.2f\n", mb, "tiny, read", beside, beside - reads - tiny);
    CK(cudaFree(pool));
  }
  CK(cudaFree(x));
  CK(cudaFree(salts));
  CK(cudaFree(fixed_salt));
  CK(cudaFree(out));
  CK(cudaStreamDestroy(s));
  return 0;
}
