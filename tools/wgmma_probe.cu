// Could FP8 (1, 128) weights reach the read through Hopper's FP8 tensor cores, with no decode?
//
// The library's FP8 loops (ffi/fp8.cuh) turn every E4M3 code into a 16-bit float before
// mma.sync: with bf16 x 257-295 instructions / 445-513 units per 16-row window of 2 KB (perf log,
// entry 163), about the H200's read time of that window, and those rows stand at 77-82% of the read
// there. mma.sync has no FP8 form on sm_90 (it compiles to F2FP + HMMA); wgmma has. This probe
// times that route, none of it in the library:
//
// - a block is one warpgroup (128 threads) and a 64-row tile; the codes stream through a cp.async
//   ring of windows of 64 rows x BLK scale blocks of 128 values, stored in one of wgmma's K-major
//   layouts (no swizzle: 8-row x 16-byte core matrices, K-adjacent ones 128 bytes apart; SWZ: the
//   128-byte swizzle, a row's 128 bytes together with their 16-byte chunks permuted by the row),
//   and go to the tensor cores as they are: A from shared memory, no decode;
// - x is two planes of E4M3 a row, x = f0 p0 + f1 p1 (f0 = 2^(e - 7) for the row's largest
//   |x| in [2^e, 2^(e+1)), f1 = f0 / 16): exact for bf16 x whose magnitude is within 2^13 of the
//   row's largest (a bf16 significand is 8 bits, each plane holds 4). Written by the host here
//   (a prep kernel in a library form), in B's layout per window (column 2 m + p: plane p of row m,
//   M <= 4 in the eight columns of m64n8k32), streamed through the ring beside the codes with the
//   rows' scales: one read of x a 64-row tile;
// - a scale block is four wgmma m64n8k32 (the first with scale-d 0), its sums taken into float32
//   accumulators times the row's scale; the K split is over blocks (grid (N / 64, KS)), their
//   partial sums added into y with float atomics (zeroed before the check, not before the timed
//   runs: the probe times the stream, not the store). MODE 1 / 2 / 3 time the ring alone, the
//   wgmma loop alone and the ring without its barrier.
//
// Measured (perf log 163-164, H100): right to 2-3e-4 of the largest output (the tensor cores' FP8
// sums keep ~14 bits); 46-62% of the read in every unswizzled form, the ring alone as slow, and
// with SWZ (whole rows a copy instruction, the 128-byte swizzle) 90-99% at K split 8-16, the
// splits as the grid's neighbours (split_major) 1-7% ahead. The library form is ffi/fp8_wgmma.cuh
// (perf log 165).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iffi tools/wgmma_probe.cu -o /tmp/wgmma_probe
//   /tmp/wgmma_probe [N K [CASE]]    (default: 10240 x 8192, 34816 x 5120 and 5120 x 17408, every
//                                     case; CASE: the cases of that name alone, e.g. "KS8 S4 swz
//                                     split-major", for a profiler; per case
//                                     registers, blocks per SM, waves, the error against a float64
//                                     reference, the kernel's cold time and its share of the read
//                                     kernel's on the same bytes)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "probe_util.cuh"
#include "stream_read.cuh"

namespace {

constexpr int kTileRows = 64;                          // wgmma's m64: a warpgroup's rows
constexpr int kWin = 128;                              // values a row per window: one scale block
constexpr int kCols = 8;                               // wgmma's n8: x's planes and rows
constexpr int kABytes = kTileRows * kWin;              // 8 KB of codes a window
constexpr int kBBytes = kCols * kWin;                  // 1 KB of x planes a window
constexpr int kSBytes = kTileRows * 4;                 // the rows' float32 scales of the window
// A stage of the ring: a window of BLK scale blocks (its codes, x's planes, the rows' scales), on
// 1 KB with the swizzle (its atoms' address bits).
template <int BLK, bool SWZ>
__host__ __device__ constexpr int StageBytes() {
  return SWZ ? ((kABytes + kBBytes + kSBytes) * BLK + 1023) / 1024 * 1024 : (kABytes + kBBytes + kSBytes) * BLK;
}

using jaxgemv::CpAsync16;
using jaxgemv::CpAsyncCa;
using jaxgemv::CpAsyncCommit;
using jaxgemv::CpAsyncWait;

// A shared-memory matrix descriptor: start address, the byte distance of K-adjacent core matrices
// (leading) and of M / N-adjacent ones (stride), each in 16-byte units; no swizzle (the caller ORs
// a swizzle mode into bits 62-63).
__device__ __forceinline__ uint64_t Desc(uint32_t addr, uint32_t leading, uint32_t stride) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>(leading >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32);
}

// d (+)= A B for a 64 x 32 slice of codes and 32 x 8 of x planes; accumulate false: d = A B.
__device__ __forceinline__ void Wgmma(float (&d)[4], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// MODE (diagnostics): 0 the product; 1 the ring alone (no wgmma: one shared word a window into the
// sums); 2 the wgmma loop alone (the first windows' copies only, then every window on stage 0); 3
// the ring alone without the block barrier (each thread waits for its own copies only).
template <int M, int STAGES, bool FENCE, int BLK, int MODE, bool SWZ>
__global__ void __launch_bounds__(128) WgmmaFp8Kernel(const uint8_t* __restrict__ w, const float* __restrict__ scales,
                                                      const uint8_t* __restrict__ xp, const float* __restrict__ xf,
                                                      float* __restrict__ y, int n, int k, int win_per_split,
                                                      bool split_major) {
  // A window: 64 rows x BLK scale blocks of 128 values, kChunks 16-byte chunks a row.
  constexpr int kValues = kWin * BLK, kChunks = kValues / 16;
  // SWZ: the codes in wgmma's 128-byte swizzle (row r's 128 bytes at 128 r, chunk c at c ^ (bits 7-9
  // of that address), which is r % 8 on a stage aligned to 1 KB), copied a whole row by eight lanes
  // (128-byte requests).
  static_assert(!SWZ || BLK == 1, "the swizzled layout holds one scale block a row");
  constexpr int kA = kTileRows * kValues, kB = kBBytes * BLK;
  constexpr int kStage = StageBytes<BLK, SWZ>();
  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  // split_major: the K splits of a tile are neighbours in the grid (blockIdx.x), so that the blocks
  // resident together read all of K rather than a few narrow columns of every row.
  const int tile = split_major ? blockIdx.y : blockIdx.x, split = split_major ? blockIdx.x : blockIdx.y;
  const int64_t row0 = static_cast<int64_t>(tile) * kTileRows;
  const int blocks = k / kWin, windows = blocks / BLK, win0 = split * win_per_split;
  const int nwin = min(win_per_split, windows - win0);
  if (nwin <= 0) return;
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // Window `win` of the split into stage `stage`: the codes, kChunks / 2 chunks a thread, eight
  // threads a core matrix's rows (conflict-free stores); x's planes, already in B's order; the
  // rows' BLK scales.
  const auto copy = [&](int win, int stage) {
    uint8_t* st = smem + stage * kStage;
    const int64_t k0 = static_cast<int64_t>(win0 + win) * kValues;
#pragma unroll
    for (int i = 0; i < kChunks / 2; ++i) {
      const int c = tid + 128 * i;
      if constexpr (SWZ) {
        const int kc = c & 7, r = c >> 3;
        const uint32_t row_at = sbase + stage * kStage + r * 128;
        CpAsync16(smem + (row_at - sbase) + ((kc ^ ((row_at >> 7) & 7)) << 4), w + (row0 + r) * k + k0 + kc * 16);
      } else {
        const int r8 = c & 7, kc = (c >> 3) % kChunks, rg = c / (8 * kChunks);
        CpAsync16(st + (rg * kChunks + kc) * 128 + r8 * 16, w + (row0 + rg * 8 + r8) * k + k0 + kc * 16);
      }
    }
#pragma unroll
    for (int i = 0; i < BLK; ++i)
      if (tid < 64)
        CpAsync16(st + kA + i * kBBytes + tid * 16, xp + static_cast<int64_t>((win0 + win) * BLK + i) * kBBytes + tid * 16);
    if (tid >= 64)
      CpAsyncCa<4 * BLK>(st + kA + kB + (tid - 64) * 4 * BLK, scales + (row0 + tid - 64) * blocks + (win0 + win) * BLK);
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nwin) copy(s, s);
    CpAsyncCommit();
  }
  const int ra = warp * 16 + g, rb = ra + 8;  // this thread's rows of the tile (its d fragment)
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int win = 0; win < nwin; ++win) {
    CpAsyncWait<STAGES - 2>();
    if constexpr (FENCE) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if constexpr (MODE != 3) __syncthreads();  // the window is in; every warp's wgmma of the window before it is done
    if (MODE != 2 && win + STAGES - 1 < nwin) copy(win + STAGES - 1, (win + STAGES - 1) % STAGES);
    CpAsyncCommit();
    const int stage = MODE == 2 ? 0 : win % STAGES;
    const uint32_t st = sbase + stage * kStage;
    if constexpr (MODE == 1 || MODE == 3) {
      acc[0] += reinterpret_cast<const float*>(smem + stage * kStage)[tid];
    } else {
      float d[BLK][4];
#pragma unroll
      for (int b = 0; b < BLK; ++b) d[b][0] = d[b][1] = d[b][2] = d[b][3] = 0.0f;
      asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
      for (int b = 0; b < BLK; ++b)
#pragma unroll
        for (int step = 0; step < kWin / 32; ++step)
          Wgmma(d[b],
                SWZ ? Desc(st + step * 32, 16, 1024) | (uint64_t{1} << 62)
                    : Desc(st + (b * 4 + step) * 256, 128, kChunks * 128),
                Desc(st + kA + b * kBBytes + step * 256, 128, 1024), step > 0);
      asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
      const float* sc = reinterpret_cast<const float*>(smem + stage * kStage + kA + kB);
#pragma unroll
      for (int b = 0; b < BLK; ++b) {
        asm volatile("" : "+f"(d[b][0]), "+f"(d[b][1]), "+f"(d[b][2]), "+f"(d[b][3])::"memory");
        const float sa = sc[ra * BLK + b], sb = sc[rb * BLK + b];
        acc[0] = fmaf(d[b][0], sa, acc[0]);
        acc[1] = fmaf(d[b][1], sa, acc[1]);
        acc[2] = fmaf(d[b][2], sb, acc[2]);
        acc[3] = fmaf(d[b][3], sb, acc[3]);
      }
    }
  }
  // Columns 2t and 2t + 1 are x row t's two planes.
  if (t < M) {
    const float f0 = xf[2 * t], f1 = xf[2 * t + 1];
    atomicAdd(y + static_cast<int64_t>(t) * n + row0 + ra, f0 * acc[0] + f1 * acc[1]);
    atomicAdd(y + static_cast<int64_t>(t) * n + row0 + rb, f0 * acc[2] + f1 * acc[3]);
  }
}

struct Weight {
  int n, k, copies;
  int64_t code_bytes, scale_count, bytes, scale_off, stride;
  std::vector<uint8_t> hw;
  std::vector<float> hs;
  uint8_t* pool;
  double read_us;
};

double E4m3Value(uint8_t c) {
  __nv_fp8_e4m3 v;
  v.__x = c;
  return static_cast<double>(static_cast<float>(v));
}

Weight MakeWeight(int n, int k, const ProbeDevice& d, cudaStream_t s, const ReadFlags& flags) {
  Weight wt;
  wt.n = n, wt.k = k;
  wt.code_bytes = static_cast<int64_t>(n) * k, wt.scale_count = static_cast<int64_t>(n) * (k / kWin);
  wt.bytes = wt.code_bytes + 4 * wt.scale_count;  // codes and float32 scales, as the benchmark counts them
  std::mt19937 rng(4321);
  wt.hw.resize(wt.code_bytes);
  for (auto& b : wt.hw) {
    b = static_cast<uint8_t>(rng());
    if ((b & 0x7f) == 0x7f) b ^= 1;  // no NaN codes
  }
  wt.hs.resize(wt.scale_count);
  std::uniform_real_distribution<float> us(0.5f, 2.0f);
  for (auto& v : wt.hs) v = us(rng) * 0.01f;
  const ColdPool cold = UploadCold(wt.hw.data(), wt.code_bytes, wt.hs.data(), 4 * wt.scale_count, d.l2);
  wt.pool = cold.pool, wt.scale_off = cold.scale_off, wt.stride = cold.stride, wt.copies = cold.copies;
  wt.read_us = ColdPoolReadMicros(s, cold, d.sms, flags);
  std::printf("FP8 %d x %d: %.1f MB with scales, %d copies; stream read %.2f us, %.2f TB/s\n", n, k, wt.bytes / 1e6,
              wt.copies, wt.read_us, wt.bytes / wt.read_us / 1e6);
  return wt;
}

// x's two E4M3 planes a row in B's window layout (window, 16-byte K chunk, column, byte) and their
// factors; rows M..3 and the columns past 2M are zero.
void MakePlanes(const std::vector<__nv_bfloat16>& hx, int m_rows, int k, std::vector<uint8_t>& planes,
                std::vector<float>& factors) {
  planes.assign(static_cast<size_t>(k) * kCols, 0);
  factors.assign(kCols, 0.0f);
  for (int m = 0; m < m_rows; ++m) {
    double mx = 0;
    for (int kk = 0; kk < k; ++kk) mx = std::max(mx, std::fabs(static_cast<double>(__bfloat162float(hx[m * k + kk]))));
    const double f0 = mx > 0 ? std::ldexp(1.0, std::ilogb(mx) - 7) : 1.0, f1 = f0 / 16;
    factors[2 * m] = static_cast<float>(f0), factors[2 * m + 1] = static_cast<float>(f1);
    for (int kk = 0; kk < k; ++kk) {
      const double v = static_cast<double>(__bfloat162float(hx[m * k + kk])) / f0;
      const __nv_fp8_e4m3 p0(static_cast<float>(v));
      const double r = (v - E4m3Value(p0.__x)) * 16;
      const __nv_fp8_e4m3 p1(static_cast<float>(r));
      const size_t at = static_cast<size_t>(kk / kWin) * kBBytes + (kk % kWin / 16) * 128 + kk % 16;
      planes[at + (2 * m) * 16] = p0.__x;
      planes[at + (2 * m + 1) * 16] = p1.__x;
    }
  }
}

// The one case to run (its name, argv[3]), else every one.
const char* g_only = nullptr;

template <int M, int STAGES, int BLK = 1, bool FENCE = true, int MODE = 0, bool SWZ = false>
void Run(const char* name, int ks, bool split_major, const Weight& wt, const ProbeDevice& d, cudaStream_t s,
         const std::vector<__nv_bfloat16>& hx_all) {
  if (g_only != nullptr && std::strcmp(name, g_only) != 0) return;
  const int n = wt.n, k = wt.k, windows = k / kWin / BLK, per_split = (windows + ks - 1) / ks;
  std::vector<uint8_t> hplanes;
  std::vector<float> hfactors;
  MakePlanes(hx_all, M, k, hplanes, hfactors);
  uint8_t* xp;
  float *xf, *y;
  CK(cudaMalloc(&xp, hplanes.size()));
  CK(cudaMalloc(&xf, kCols * sizeof(float)));
  CK(cudaMalloc(&y, static_cast<size_t>(M) * n * sizeof(float)));
  CK(cudaMemcpy(xp, hplanes.data(), hplanes.size(), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xf, hfactors.data(), kCols * sizeof(float), cudaMemcpyHostToDevice));
  auto kernel = WgmmaFp8Kernel<M, STAGES, FENCE, BLK, MODE, SWZ>;
  const int smem = STAGES * StageBytes<BLK, SWZ>();
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kernel));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 128, smem));
  const dim3 grid = split_major ? dim3(ks, n / kTileRows) : dim3(n / kTileRows, ks);
  auto codes_of = [&](int c) { return wt.pool + c * wt.stride; };
  auto scales_of = [&](int c) { return reinterpret_cast<const float*>(wt.pool + c * wt.stride + wt.scale_off); };
  CK(cudaMemsetAsync(y, 0, static_cast<size_t>(M) * n * sizeof(float), s));
  kernel<<<grid, 128, smem, s>>>(codes_of(0), scales_of(0), xp, xf, y, n, k, per_split, split_major);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::vector<float> hy(static_cast<size_t>(M) * n);
  CK(cudaMemcpy(hy.data(), y, hy.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0, ref_max = 0;
  for (int m = 0; m < M; ++m)
    for (int row = 0; row < n; row += (n > 4096 ? 7 : 1)) {
      double ref = 0;
      for (int kk = 0; kk < k; ++kk)
        ref += E4m3Value(wt.hw[static_cast<int64_t>(row) * k + kk]) * wt.hs[static_cast<int64_t>(row) * (k / kWin) + kk / kWin] *
               static_cast<double>(__bfloat162float(hx_all[static_cast<int64_t>(m) * k + kk]));
      const double got = hy[static_cast<size_t>(m) * n + row];
      err = std::max(err, std::isfinite(got) ? std::fabs(got - ref) : INFINITY);
      ref_max = std::max(ref_max, std::fabs(ref));
    }
  const double us = ColdMicros(s, wt.copies, [&](cudaStream_t st, int c) {
    kernel<<<grid, 128, smem, st>>>(codes_of(c), scales_of(c), xp, xf, y, n, k, per_split, split_major);
  });
  const int blocks = grid.x * grid.y;
  std::printf("%-22s %3d %4d %3d %6d %6.2f %9.2e %8.2f %6.2f %6.1f\n", name, M, fa.numRegs, per_sm, blocks,
              blocks / static_cast<double>(per_sm * d.sms), err / ref_max, us, wt.bytes / us / 1e6, 100.0 * wt.read_us / us);
  CK(cudaFree(xp));
  CK(cudaFree(xf));
  CK(cudaFree(y));
}

void Shape(int n, int k, const ProbeDevice& d, cudaStream_t s, const ReadFlags& flags) {
  if (n % kTileRows || k % (4 * kWin)) {
    std::printf("%d x %d: N must be a multiple of %d and K of %d\n", n, k, kTileRows, 4 * kWin);
    return;
  }
  std::mt19937 rng(99);
  std::vector<__nv_bfloat16> hx(4 * static_cast<int64_t>(k));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (int64_t i = 0; i < static_cast<int64_t>(hx.size()); ++i)  // varies along K, one large value a row
    hx[i] = __float2bfloat16(i % k == 77 ? 30.0f : ux(rng) * (1.0f + (i % k) / static_cast<float>(k)));
  Weight wt = MakeWeight(n, k, d, s, flags);
  std::printf("%-22s %3s %4s %3s %6s %6s %9s %8s %6s %6s\n", "case", "M", "regs", "/SM", "blocks", "waves", "rel.err", "us",
              "TB/s", "%read");
  Run<1, 4>("KS8 S4", 8, false, wt, d, s, hx);
  Run<1, 4>("KS8 S4 split-major", 8, true, wt, d, s, hx);
  Run<1, 4, 1, true, 1>("KS8 S4 split-major ring", 8, true, wt, d, s, hx);
  Run<1, 4, 1, true, 1>("KS8 S4 ring", 8, false, wt, d, s, hx);
  Run<1, 4, 1, true, 3>("KS8 S4 ring, no barrier", 8, false, wt, d, s, hx);
  Run<1, 4, 1, true, 0, true>("KS8 S4 swz", 8, false, wt, d, s, hx);
  Run<1, 4, 1, true, 1, true>("KS8 S4 swz ring", 8, false, wt, d, s, hx);
  Run<1, 4, 1, true, 2, true>("KS8 S4 swz wgmma", 8, false, wt, d, s, hx);
  Run<1, 4, 1, true, 0, true>("KS8 S4 swz split-major", 8, true, wt, d, s, hx);
  Run<1, 6, 1, true, 0, true>("KS8 S6 swz split-major", 8, true, wt, d, s, hx);
  Run<1, 4, 1, true, 0, true>("KS16 S4 swz split-major", 16, true, wt, d, s, hx);
  Run<4, 4, 1, true, 0, true>("KS8 S4 swz split-major", 8, true, wt, d, s, hx);
  CK(cudaFree(wt.pool));
}

}  // namespace

int main(int argc, char** argv) {
  const ProbeDevice d = CurrentProbeDevice();
  std::printf("%s, %d SMs, L2 %.0f MB; median of 7 graph replays, cold\n", d.name, d.sms, d.l2 / 1e6);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const ReadFlags flags = MakeReadFlags();
  if (argc > 2) {
    if (argc > 3) g_only = argv[3];
    Shape(std::atoi(argv[1]), std::atoi(argv[2]), d, s, flags);
  } else {
    Shape(10240, 8192, d, s, flags);
    Shape(34816, 5120, d, s, flags);
    Shape(5120, 17408, d, s, flags);
  }
  FreeReadFlags(flags);
  return 0;
}
