// Is the lm_heads' gap to the read ceiling the GEMV's work or the way it reads?
//
// The per-block tensor-core kernel at M = 1 without a K split (ffi/gemv_core.cuh, the lm_heads)
// runs one-warp blocks, one 16-row tile each, and streams the tile through a ring of
// MmaStages<false>() = 2 shared-memory stages with cp.async: a window is 16 rows x 64 x LOADS
// bytes, lane (g, t) copying rows g and g + 8 at t x 16 + 64 x l. This probe reads a weight of
// the same bytes in that pattern with no decode (an XOR of each piece, and optionally `work`
// float32 FMAs per window and lane to stand in for the decode's issue slots), and beside it the
// streaming-read kernel of the benchmark's ceiling, each cold (copies rotating over more than 3 x
// L2) from a CUDA graph. Variants: stages, loads per window, blocks per SM (shared memory padded to
// hold that occupancy), one tile per block or a persistent grid whose ring runs on across tiles,
// and windows of contiguous bytes instead of 16 row pieces.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi tools/tile_read_probe.cu -o /tmp/trprobe
//   /tmp/trprobe [rows [row_bytes [work]]]   (default 248320 rows of 1024 bytes: int4 248320 x 2048;
//                                            "work": the FMA sweep instead of the patterns, "alu":
//                                            LOP3s against FMAs, "pipes": each instruction kind's
//                                            cost, hot)
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "probe_util.cuh"
#include "stream_read.cuh"

namespace {

__device__ __forceinline__ void Cp16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void Commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WaitGroups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// S stages, L loads per window (16 rows x 64 L bytes), PERSIST: gridDim.x blocks walk tiles
// blockIdx.x, + gridDim.x, ... with one ring; CONTIG: a window is 1024 L contiguous bytes of the
// tile instead of its rows' pieces; LINES: each copy instruction takes whole 128-byte lines (lane
// q of a window's piece j x 32 + q copies row (j x 32 + q) / 4L, piece (j x 32 + q) % 4L) instead of
// the fragment's 64-byte halves; WORK: float32 FMAs per window and lane (8 chains); HOT: every
// block reads one of the first 64 tiles (1 MB, from L2), which times the work with no DRAM stream;
// ALU: LOP3s per window and lane (8 chains, the integer pipe) beside the FMAs.
// OP picks ALU's instruction (PTX that ptxas keeps as one SASS instruction, operands from the
// window's data so that nothing folds): 0 LOP3, 1 IMAD, 2 IMAD.HI, 3 PRMT, 4 HFMA2, 5 SHF, 6 IADD3,
// 7 HADD2, 8 FFMA, 9 IMAD.WIDE (and a LOP3 folding its halves), 10 FMUL; CH chains (fewer:
// longer dependent paths).
template <int OP>
__device__ __forceinline__ void Op(uint32_t& u, uint32_t v) {
  if constexpr (OP == 0) asm volatile("lop3.b32 %0, %0, %1, 0x5a5a5a5a, 0x96;" : "+r"(u) : "r"(v));
  if constexpr (OP == 1) asm volatile("mad.lo.u32 %0, %0, %1, 0x5a5a5a5a;" : "+r"(u) : "r"(v | 1u));
  if constexpr (OP == 2) asm volatile("mul.hi.u32 %0, %0, %1;" : "+r"(u) : "r"(v | 0x80000001u));
  if constexpr (OP == 3) asm volatile("prmt.b32 %0, %0, %1, 0x6240;" : "+r"(u) : "r"(v));
  if constexpr (OP == 4) asm volatile("fma.rn.f16x2 %0, %0, %1, %1;" : "+r"(u) : "r"(v & 0x3bff3bffu));
  if constexpr (OP == 5) asm volatile("shf.l.wrap.b32 %0, %0, %0, %1;" : "+r"(u) : "r"(v));
  if constexpr (OP == 6) asm volatile("add.u32 %0, %0, %1;" : "+r"(u) : "r"(v));
  if constexpr (OP == 7) asm volatile("add.rn.f16x2 %0, %0, %1;" : "+r"(u) : "r"(v & 0x3bff3bffu));
  if constexpr (OP == 8) asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+r"(u) : "r"(v & 0x3f7fffffu));
  if constexpr (OP == 9) {
    uint64_t w;
    asm volatile("mul.wide.u32 %0, %1, %2;" : "=l"(w) : "r"(u), "r"(v));
    u = static_cast<uint32_t>(w >> 32) ^ static_cast<uint32_t>(w);
  }
  if constexpr (OP == 10) asm volatile("mul.rn.f32 %0, %0, %1;" : "+r"(u) : "r"(v & 0x3f7fffffu));
}

template <int S, int L, bool PERSIST, bool CONTIG, int WORK, bool LINES = false, bool HOT = false, int ALU = 0,
          int OP = 0, int CH = 8>
__global__ void __launch_bounds__(32) TileReadKernel(const uint8_t* w, int64_t row_bytes, int tiles,
                                                     const uint32_t* salt, uint32_t* out) {
  extern __shared__ uint4 ring[];
  constexpr int kPieces = 2 * L;  // 16-byte pieces per lane and window
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const int windows = static_cast<int>(row_bytes / (64 * L));
  const int first = blockIdx.x, stride = PERSIST ? gridDim.x : tiles;
  const int count = first < tiles ? (tiles - first + stride - 1) / stride * windows : 0;
  auto issue = [&](int i, uint4* st) {
    const int tile = HOT ? (first + i / windows * stride) % 64 : first + i / windows * stride, win = i % windows;
    const uint8_t* base = w + static_cast<int64_t>(tile) * 16 * row_bytes;
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      const uint8_t* p;
      if (CONTIG) {
        p = base + static_cast<int64_t>(win) * (1024 * L) + (j * 32 + lane) * 16;
      } else if (LINES) {
        const int q = j * 32 + lane, r = q / (4 * L), c = q % (4 * L);
        p = base + static_cast<int64_t>(r) * row_bytes + win * (64 * L) + 16 * c;
      } else {
        const int r = g + 8 * (j & 1), l = j >> 1;
        p = base + static_cast<int64_t>(r) * row_bytes + win * (64 * L) + 64 * l + 16 * t;
      }
      Cp16(st + j * 32 + lane, p);
    }
  };
  uint32_t acc = 0;
  float f[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) f[c] = static_cast<float>(lane + c);
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    if (i < count) issue(i, ring + i * kPieces * 32);
    Commit();
  }
  for (int i = 0; i < count; ++i) {
    if (i + S - 1 < count) issue(i + S - 1, ring + ((i + S - 1) % S) * kPieces * 32);
    Commit();
    WaitGroups<S - 1>();
    const uint4* st = ring + (i % S) * kPieces * 32;
    uint32_t v = 0;
#pragma unroll
    for (int j = 0; j < kPieces; ++j) {
      const uint4 q = st[j * 32 + lane];
      v ^= q.x ^ q.y ^ q.z ^ q.w;
    }
    acc ^= v;
    if constexpr (WORK > 0) {
      const float m = __uint_as_float((v & 0x007fffffu) | 0x3f800000u);  // in [1, 2)
#pragma unroll
      for (int r = 0; r < WORK / 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) f[c] = fmaf(f[c], 0.999f, m);
    }
    if constexpr (ALU > 0) {
      uint32_t u[8];
#pragma unroll
      for (int c = 0; c < 8; ++c) u[c] = __float_as_uint(f[c]);
#pragma unroll
      for (int r = 0; r < ALU / CH; ++r)
#pragma unroll
        for (int c = 0; c < CH; ++c) Op<OP>(u[c], v);
#pragma unroll
      for (int c = 0; c < 8; ++c) f[c] = __uint_as_float(u[c]);
    }
    __syncwarp();
  }
  float fs = 0.0f;
#pragma unroll
  for (int c = 0; c < 8; ++c) fs += f[c];
  if ((acc ^ __float_as_uint(fs)) == (0x9e3779b9u ^ __ldg(salt))) atomicOr(out, 1u);
}

struct Case {
  std::string name;
  void (*kernel)(const uint8_t*, int64_t, int, const uint32_t*, uint32_t*);
  int stages, loads, per_sm;
  bool persist;
};

template <int S, int L, bool P, bool C, int W, bool LN = false, bool H = false, int A = 0, int OP = 0, int CH = 8>
Case Make(const char* name, int per_sm) {
  return Case{name, TileReadKernel<S, L, P, C, W, LN, H, A, OP, CH>, S, L, per_sm, P};
}
// A pipe case: hot (L2), 24 blocks per SM, FMA float32 FMAs and N instructions OP in CH chains.
template <int FMA, int N, int OP, int CH = 8>
Case Pipe(const char* name) {
  return Make<2, 2, false, false, FMA, false, true, N, OP, CH>(name, 24);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 248320, row_bytes = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t bytes = rows * row_bytes;
  const int tiles = static_cast<int>(rows / 16);
  const ProbeDevice d = CurrentProbeDevice();
  std::printf("%s, %d SMs, L2 %.0f MB; %lld rows x %lld bytes (%.1f MB), %d tiles; median of 7 graph replays, cold\n",
              d.name, d.sms, d.l2 / 1e6, static_cast<long long>(rows), static_cast<long long>(row_bytes), bytes / 1e6,
              tiles);
  int smem_sm = 0, optin = 0;
  CK(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const ReadFlags flags = MakeReadFlags();
  const int64_t stride = (bytes + 255) / 256 * 256;
  const int copies = ColdCopies(bytes, d.l2);
  char* pool;
  CK(cudaMalloc(&pool, stride * copies));
  CK(cudaMemset(pool, 1, stride * copies));

  const double read_us = ColdMicros(s, copies, [&](cudaStream_t st, int c) {
    jaxgemv::StreamReadKernel<<<jaxgemv::kReadBlocksPerSm * d.sms, jaxgemv::kReadThreads, 0, st>>>(
        reinterpret_cast<const uint4*>(pool + c * stride), bytes / 16, flags.salt, flags.out);
  });
  std::printf("%-40s %6s %7s %9s %6s %6s\n", "case", "per SM", "blocks", "us/read", "TB/s", "%read");
  std::printf("%-40s %6s %7d %9.2f %6.2f %6.1f\n", "stream read (the ceiling's kernel)", "-", 4 * d.sms, read_us,
              bytes / read_us / 1e6, 100.0);

  const Case pattern_cases[] = {
      Make<2, 2, false, false, 0>("rows S2 L2 (the lm_heads' pattern)", 24),
      Make<2, 2, false, false, 384>("rows S2 L2 + 384 FMA/window", 24),
      Make<2, 2, false, false, 0>("rows S2 L2, 32 per SM", 32),
      Make<2, 2, false, false, 0>("rows S2 L2, 16 per SM", 16),
      Make<3, 2, false, false, 0>("rows S3 L2", 24),
      Make<3, 2, false, false, 384>("rows S3 L2 + 384 FMA", 24),
      Make<4, 2, false, false, 0>("rows S4 L2", 24),
      Make<2, 4, false, false, 0>("rows S2 L4", 24),
      Make<2, 4, false, false, 768>("rows S2 L4 + 768 FMA", 24),
      Make<2, 2, true, false, 0>("rows S2 L2 persistent", 24),
      Make<2, 2, true, false, 384>("rows S2 L2 persistent + 384 FMA", 24),
      Make<3, 2, true, false, 0>("rows S3 L2 persistent", 24),
      Make<3, 2, true, false, 384>("rows S3 L2 persistent + 384 FMA", 24),
      Make<2, 2, false, false, 0, true>("rows S2 L2, whole lines", 24),
      Make<2, 2, false, false, 384, true>("rows S2 L2, whole lines + 384 FMA", 24),
      Make<2, 4, false, false, 0, true>("rows S2 L4, whole lines", 24),
      Make<2, 4, false, false, 768, true>("rows S2 L4, whole lines + 768 FMA", 24),
      Make<3, 2, false, false, 0, true>("rows S3 L2, whole lines", 24),
      Make<2, 2, true, false, 0, true>("rows S2 L2 persistent, whole lines", 24),
      Make<2, 2, false, true, 0>("contiguous S2 L2", 24),
      Make<2, 2, false, true, 384>("contiguous S2 L2 + 384 FMA", 24),
  };  // argv[3] == "work": the decode's cost against the stream, in the lm_heads' pattern.
  const Case work_cases[] = {
      Make<2, 2, false, false, 0>("rows S2 L2", 24),
      Make<2, 2, false, false, 128>("rows S2 L2 + 128 FMA", 24),
      Make<2, 2, false, false, 192>("rows S2 L2 + 192 FMA", 24),
      Make<2, 2, false, false, 256>("rows S2 L2 + 256 FMA", 24),
      Make<2, 2, false, false, 320>("rows S2 L2 + 320 FMA", 24),
      Make<2, 2, false, false, 384>("rows S2 L2 + 384 FMA", 24),
      Make<2, 2, false, false, 448>("rows S2 L2 + 448 FMA", 24),
      Make<2, 2, false, false, 384, false, true>("hot (L2) S2 L2 + 384 FMA", 24),
      Make<2, 2, false, false, 256, false, true>("hot (L2) S2 L2 + 256 FMA", 24),
      Make<2, 2, false, false, 384>("rows S2 L2 + 384 FMA, 16 per SM", 16),
      Make<2, 2, false, false, 384>("rows S2 L2 + 384 FMA, 32 per SM", 32),
      Make<3, 2, false, false, 384>("rows S3 L2 + 384 FMA, 32 per SM", 32),
      Make<4, 2, false, false, 384>("rows S4 L2 + 384 FMA", 24),
      Make<2, 4, false, false, 768>("rows S2 L4 + 768 FMA, 16 per SM", 16),
      Make<3, 4, false, false, 768>("rows S3 L4 + 768 FMA, 16 per SM", 16),
      Make<2, 2, false, true, 256>("contiguous S2 L2 + 256 FMA", 24),
  };
  // argv[3] == "alu": the integer pipe's share (LOP3s) against the FMA pipe's.
  const Case alu_cases[] = {
      Make<2, 2, false, false, 0, false, true, 192>("hot 192 LOP3", 24),
      Make<2, 2, false, false, 192, false, true, 0>("hot 192 FMA", 24),
      Make<2, 2, false, false, 192, false, true, 192>("hot 192 FMA + 192 LOP3", 24),
      Make<2, 2, false, false, 0, false, true, 384>("hot 384 LOP3", 24),
      Make<2, 2, false, false, 384, false, true, 0>("hot 384 FMA", 24),
      Make<2, 2, false, false, 0, false, false, 192>("rows 192 LOP3", 24),
      Make<2, 2, false, false, 192, false, false, 192>("rows 192 FMA + 192 LOP3", 24),
      Make<2, 2, false, false, 224, false, false, 160>("rows 224 FMA + 160 LOP3", 24),
      Make<2, 2, false, false, 256, false, false, 128>("rows 256 FMA + 128 LOP3", 24),
      Make<2, 2, false, false, 384, false, false, 0>("rows 384 FMA", 24),
  };
  // argv[3] == "pipes": what each instruction kind costs a window (hot, so the instruction stream
  // alone), alone and beside FMAs; the decode's cost model prices instructions from this table.
  const Case pipe_cases[] = {
      Pipe<0, 0, 0>("hot, no work"),
      Pipe<192, 0, 0>("hot 192 FFMA"),
      Pipe<0, 192, 8>("hot 192 FFMA (asm)"),
      Pipe<0, 192, 10>("hot 192 FMUL"),
      Pipe<0, 192, 0>("hot 192 LOP3"),
      Pipe<0, 192, 1>("hot 192 IMAD"),
      Pipe<0, 192, 2>("hot 192 IMAD.HI"),
      Pipe<0, 192, 9>("hot 192 IMAD.WIDE (+LOP3)"),
      Pipe<0, 192, 3>("hot 192 PRMT"),
      Pipe<0, 192, 4>("hot 192 HFMA2"),
      Pipe<0, 192, 7>("hot 192 HADD2"),
      Pipe<0, 192, 5>("hot 192 SHF"),
      Pipe<0, 192, 6>("hot 192 IADD3"),
      Pipe<192, 192, 1>("hot 192 FFMA + 192 IMAD"),
      Pipe<192, 192, 4>("hot 192 FFMA + 192 HFMA2"),
      Pipe<192, 192, 3>("hot 192 FFMA + 192 PRMT"),
      Pipe<192, 192, 2>("hot 192 FFMA + 192 IMAD.HI"),
      Pipe<0, 192, 2, 2>("hot 192 IMAD.HI, 2 chains"),
      Pipe<0, 192, 1, 2>("hot 192 IMAD, 2 chains"),
      Pipe<0, 192, 0, 2>("hot 192 LOP3, 2 chains"),
  };
  const bool pipes = argc > 3 && std::string(argv[3]) == "pipes";
  const bool alu = argc > 3 && std::string(argv[3]) == "alu";
  const bool work = argc > 3 && std::string(argv[3]) == "work";
  const Case* cases = pipes ? pipe_cases : alu ? alu_cases : work ? work_cases : pattern_cases;
  const int n_cases = pipes  ? sizeof(pipe_cases) / sizeof(Case)
                      : alu  ? sizeof(alu_cases) / sizeof(Case)
                      : work ? sizeof(work_cases) / sizeof(Case)
                             : sizeof(pattern_cases) / sizeof(Case);

  for (int ci = 0; ci < n_cases; ++ci) {
    const Case& c = cases[ci];
    const int ring = c.stages * 2 * c.loads * 512;
    // Shared memory per block padded so that no more than per_sm blocks fit (1 KB reserved each).
    const int smem = std::min(optin, std::max(ring, (smem_sm / c.per_sm - 1024) / 128 * 128));
    CK(cudaFuncSetAttribute(c.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c.kernel, 32, smem));
    const int blocks = c.persist ? per_sm * d.sms : tiles;
    const double us = ColdMicros(s, copies, [&](cudaStream_t st, int cp) {
      c.kernel<<<blocks, 32, smem, st>>>(reinterpret_cast<const uint8_t*>(pool + cp * stride), row_bytes, tiles,
                                          flags.salt, flags.out);
    });
    std::printf("%-40s %6d %7d %9.2f %6.2f %6.1f\n", c.name.c_str(), per_sm, blocks, us, bytes / us / 1e6,
                100.0 * read_us / us);
  }
  CK(cudaFree(pool));
  FreeReadFlags(flags);
  CK(cudaStreamDestroy(s));
  return 0;
}
