// FP8 (E4M3, float32 block scales) weights through Hopper's FP8 tensor cores: the "wgmma" variant of
// fp8_matmul at M = 1-8 on sm_90 (jaxgemv/planner.py: plan_fp8).
//
// The "mma" variant (gemv_core.cuh with fp8.cuh) turns every E4M3 code into a 16-bit float for
// mma.sync, ~330 of a window's 445-513 issue units (docs/perf-log.md, entry 163). Here nothing is
// decoded: the codes go from shared memory to wgmma's A operand as they are, and x becomes E4M3
// instead (tools/wgmma_probe.cu measured the form, entry 164):
// - each group of 32 values of x's row m becomes P planes of E4M3 codes, x = f0 p0 + f1 p1 (+ f2
//   p2), the factors powers of two from the group's largest |x| (f0 = 2^(e - 7) with 2^e <= max <
//   2^(e+1), each next one 16 times smaller): a bf16 significand (8 bits) splits into two planes
//   of four, an fp16 one (11) into three, exactly for every value within 2^13 of the group's
//   largest, the rest to 2^-21 of it. The GEMV writes them itself, into B's place in the ring's
//   stage a window ahead of its wgmma: each warp takes one group (a lane a value, the largest
//   from one REDUX), x's values loaded a window before that (from L2), the work done while
//   the tensor cores run the window before (a separate prep kernel ran 5.5 us on the critical
//   path, entry 165);
// - a block is one warpgroup and a 64-row tile; the codes stream through a cp.async ring of windows
//   of 64 rows x 128 values, each row's 128 bytes in wgmma's 128-byte swizzle (whole rows a copy
//   request, no bank conflicts on either side), the rows' scales for the window beside them;
// - every k32 step is one wgmma m64nNk32 (N = 8 / 16 / 24: x's P M columns, row m's plane p in
//   column P m + p) whose sums start from zero and go into float32 at once, times the row's scale
//   of that step's block and the column's factor of that group: the tensor cores' FP8 sums keep
//   about 14 bits, so they never carry more than 32 products (a k32's);
// - K splits over neighbouring blocks of the grid (tiles x ks, a tile's splits together); each
//   block adds its planes' columns into per-row sums, stores them to a scratch result, and the
//   tile's last block to finish (a counter per tile, zeroed by a small kernel launched before,
//   which the GEMV overlaps through programmatic dependent launch) adds them in split order and
//   stores through the products' epilogue (gemv_core.cuh: Epilogue). Thread-block clusters
//   instead ran 58-77% of the read on an H100: 77 clusters of eight resident where 5120 x 17408's
//   grid has 80 (entry 165).
//
// Limits (checked by the handler, planned by jaxgemv/planner.py): an sm_90 device (the kernel is
// built for sm_90a alone), M <= 8, K a multiple of 128 and at most kWgMaxK, K blocks of 32 values or
// more (powers of two), no SwiGLU, the RMSNorm's row scale from a given row_scale.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda_util.cuh"
#include "gemv_core.cuh"

namespace jaxgemv {

constexpr int kWgRows = 64;    // rows a tile: wgmma's m64, one warpgroup of 128 threads
constexpr int kWgWin = 128;    // values of K a window: a row's 128 bytes, one swizzle atom row
constexpr int kWgStages = 4;   // the ring's stages (tools/wgmma_probe.cu: 4 and 6 level)
constexpr int kWgMaxM = 8;
// A tile's copy offsets (64 rows of K bytes) are 32-bit.
constexpr int64_t kWgMaxK = int64_t{1} << 24;

// x's planes a row: 3 for fp16 x, 2 for bf16.
__host__ __device__ constexpr int WgPlanes(bool f16) { return f16 ? 3 : 2; }
// wgmma's N: the planes' P M columns in whole eights.
__host__ __device__ constexpr int WgCols(int planes, int m) { return (planes * m + 7) / 8 * 8; }
// The K split where the plan leaves it (0): the largest of 8, 4, 2 that leaves every block at
// least kWgMinWindows windows, else 1; a forced one at most one block a window.
constexpr int kWgMinWindows = 4;
__host__ __device__ constexpr int WgKSplit(int64_t windows, int64_t ksplit) {
  return ksplit > 0 ? static_cast<int>(ksplit < windows ? ksplit : windows)
         : windows >= 8 * kWgMinWindows ? 8
         : windows >= 4 * kWgMinWindows ? 4
         : windows >= 2 * kWgMinWindows ? 2
                                        : 1;
}
// Scratch (with a K split): the blocks' per-row sums, [tile][split][m][64 rows] float32, then a
// counter per tile (int32); 16 bytes without one (unused).
__host__ __device__ constexpr int64_t WgCountOffset(int64_t tiles, int ks, int m) { return tiles * ks * m * kWgRows * 4; }
__host__ __device__ constexpr int64_t WgScratchBytes(int64_t tiles, int ks, int m) {
  return ks > 1 ? WgCountOffset(tiles, ks, m) + tiles * 4 : 16;
}
// A stage: the window's codes (8 KB), x's planes (B: NT / 8 groups of eight 16-byte K chunks of
// eight columns, core matrices of 128 bytes, K-adjacent ones 128 apart, N-adjacent ones 1024), their
// factors [4 groups][NT] float32, the rows' SPW scales; on 1 KB (the swizzle's atoms are 1 KB: the
// copies' chunk permutation follows the address bits 7-9).
template <int NT, int SPW>
__host__ __device__ constexpr int WgStageBytes() {
  return (kWgRows * kWgWin + NT * 128 + 4 * NT * 4 + kWgRows * 4 * SPW + 1023) / 1024 * 1024;
}
template <int NT, int SPW>
__host__ __device__ constexpr int WgSmemBytes() {
  return kWgStages * WgStageBytes<NT, SPW>();
}

// The K split's counters zeroed, a thread each, before the GEMV (which waits for this grid only
// before it counts itself).
constexpr int kWgZeroThreads = 256;
__global__ void __launch_bounds__(kWgZeroThreads) Fp8WgmmaZeroKernel(int32_t* counters, int64_t tiles) {
  LaunchDependents();  // the GEMV may start now
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWgZeroThreads + threadIdx.x;
  if (i < tiles) counters[i] = 0;
}

// ---------------------------------------------------------------------------------------------
// The GEMV.

// A shared-memory matrix descriptor (PTX ISA, wgmma): the start address and the byte distances of
// K-adjacent (leading) and M / N-adjacent (stride) core matrices, in 16-byte units; `swizzle128`
// sets the 128-byte swizzle mode (bits 62-63: 1).
__device__ __forceinline__ uint64_t WgDesc(uint32_t addr, uint32_t leading, uint32_t stride, bool swizzle128) {
  return static_cast<uint64_t>((addr & 0x3ffff) >> 4) | (static_cast<uint64_t>(leading >> 4) << 16) |
         (static_cast<uint64_t>(stride >> 4) << 32) | (static_cast<uint64_t>(swizzle128) << 62);
}
// d = A B for 64 rows x 32 values of codes (A) and 32 values x NT columns of x's planes (B), the
// sums started from zero (scale-d 0). The registers are written when the group is waited for.
template <int NT>
__device__ __forceinline__ void WgmmaE4m3(float (&d)[NT / 2], uint64_t a, uint64_t b);
template <>
__device__ __forceinline__ void WgmmaE4m3<8>(float (&d)[4], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(a), "l"(b), "r"(0));
}
template <>
__device__ __forceinline__ void WgmmaE4m3<16>(float (&d)[8], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(a), "l"(b), "r"(0));
}
template <>
__device__ __forceinline__ void WgmmaE4m3<24>(float (&d)[12], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %14, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n24k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, %12, %13, p, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
      : "l"(a), "l"(b), "r"(0));
}

// NT columns of x's planes (WgCols), SPW scales a row per window (128 / block_k for blocks of 32
// and 64 values, else 1; blocks of 2^s x 128 values take one a window, column window >> s). The
// grid is tiles x ks blocks, a tile's K splits neighbours; windows = K / 128.
template <typename T, int NT, int SPW>
__global__ void __launch_bounds__(128) Fp8WgmmaKernel(GemvArgs a, uint8_t* scratch, int64_t windows, int ks,
                                                      int64_t scale_cols, int win_shift) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int P = WgPlanes(std::is_same_v<T, __half>);
  constexpr int kMaxM = NT / P < kWgMaxM ? NT / P : kWgMaxM;  // the rows of x NT columns hold
  constexpr int kStage = WgStageBytes<NT, SPW>(), kA = kWgRows * kWgWin, kB = NT * 128, kF = 4 * NT * 4;
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int split = static_cast<int>(blockIdx.x % ks);
  const int64_t tile = blockIdx.x / ks, row0 = tile * kWgRows;
  const int64_t w0 = split * windows / ks;
  const int nwin = static_cast<int>((split + 1) * windows / ks - w0);
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // The codes: thread tid copies chunk tid % 8 of rows tid / 8 + 16 i, to the chunk position the
  // swizzle gives it (the chunk index XOR the row's address bits 7-9); rows past N read row N - 1.
  const int kc = tid & 7, last = static_cast<int>(min(int64_t{kWgRows - 1}, a.n - 1 - row0));
  const uint8_t* wsrc = a.w + row0 * a.k + w0 * kWgWin + kc * 16;
  uint32_t goff[4], sdst[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = (tid >> 3) + 16 * i;
    goff[i] = static_cast<uint32_t>(min(r, last)) * static_cast<uint32_t>(a.k);
    sdst[i] = sbase + r * 128 + ((kc ^ (((sbase >> 7) + r) & 7)) << 4);
  }
  // The scales: threads 0-63 copy row tid's SPW of the window.
  const float* srow = reinterpret_cast<const float*>(a.scales) + min(row0 + (tid & 63), int64_t{a.n} - 1) * scale_cols;
  const uint32_t sdst_scale = sbase + kA + kB + kF + (tid & 63) * 4 * SPW;
  auto copy_w = [&](int st, int win) {
    const uint32_t soff = st * kStage;
    const uint8_t* src = wsrc + win * kWgWin;
#pragma unroll
    for (int i = 0; i < 4; ++i) CpAsync16Shared(sdst[i] + soff, src + goff[i]);
    if (tid < 64) {
      const int64_t wg = w0 + win;
      const float* sp = srow + (SPW > 1 ? wg * SPW : wg >> win_shift);
      if constexpr (SPW == 4) {
        CpAsync16Shared(sdst_scale + soff, sp);
      } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(sdst_scale + soff), "l"(sp), "n"(4 * SPW) : "memory");
      }
    }
  };
  // x: thread tid takes value tid of each window of each row (warp s: the window's group s).
  using Bits = unsigned short;
  const Bits* xsrc = static_cast<const Bits*>(a.x) + w0 * kWgWin + tid;
  auto load_x = [&](Bits (&xr)[kMaxM], int win) {
#pragma unroll
    for (int m = 0; m < kMaxM; ++m)
      if (m < a.m) xr[m] = __ldg(xsrc + m * a.k + win * kWgWin);
  };
  // The planes of a window's x into stage `st`: row m's value as P E4M3 codes in units of its
  // group's f0 (below 2^8, inside E4M3's 448), each residual 16 times finer, every step exact in
  // float32; lanes 0..P-1 write the group's factors, NaN where the group holds a NaN or an
  // infinity. Columns past P M stay as they are: nothing reads their sums.
  const int boff = (tid >> 4) * 128 + (tid & 15);  // byte tid of a column: its K chunk, then byte
  auto convert = [&](const Bits (&xr)[kMaxM], int st) {
    uint8_t* b = smem + st * kStage + kA;
    float* fac = reinterpret_cast<float*>(smem + st * kStage + kA + kB) + warp * NT;
#pragma unroll
    for (int m = 0; m < kMaxM; ++m) {
      if (m < a.m) {
        Bits raw = xr[m];
        const float v = Act<T>::ToFloat(*reinterpret_cast<const T*>(&raw));
        // The group's largest |x| as bits (one REDUX: non-negative floats order as their bits, an
        // infinity or a NaN above every finite value; five shuffles and maxima were the loop's
        // longest stall, entry 165), and 2^e <= it < 2^(e+1) from them (a subnormal or zero
        // largest: e = -100, its planes 0).
        const uint32_t mx = __reduce_max_sync(~0u, __float_as_uint(v) & 0x7fffffffu);
        const bool bad = mx >= 0x7f800000u;
        const int e = max(static_cast<int>(mx >> 23) - 127, -100);
        float u = v * __uint_as_float(static_cast<uint32_t>(127 + 7 - e) << 23);
#pragma unroll
        for (int p = 0; p < P; ++p) {
          const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(u, __NV_SATFINITE, __NV_E4M3);
          const int c = P * m + p;
          b[(c >> 3) * 1024 + (c & 7) * 16 + boff] = q;
          u = (u - __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)))) * 16.0f;
        }
        if (lane < P)
          fac[P * m + lane] = bad ? __int_as_float(0x7fc00000)
                                  : __uint_as_float(static_cast<uint32_t>(127 + e - 7 - 4 * lane) << 23);
      }
    }
  };
  // The ring's fill: the weight's first windows, then x's planes for them (their loads first, all
  // in flight together), then x of the next window into registers.
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < nwin) copy_w(s, s);
    CpAsyncCommit();
  }
  {
    Bits xr[kWgStages - 1][kMaxM];
#pragma unroll
    for (int s = 0; s < kWgStages - 1; ++s)
      if (s < nwin) load_x(xr[s], s);
#pragma unroll
    for (int s = 0; s < kWgStages - 1; ++s)
      if (s < nwin) convert(xr[s], s);
  }
  Bits xnext[kMaxM];
  if (kWgStages - 1 < nwin) load_x(xnext, kWgStages - 1);

  constexpr int kD = NT / 2;
  float acc[kD], d[4][kD];
#pragma unroll
  for (int i = 0; i < kD; ++i) {
    acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; ++s) d[s][i] = 0.0f;
  }
  const int ra = warp * 16 + g, rb = ra + 8;  // this thread's rows of the tile (its D fragment)
  for (int win = 0; win < nwin; ++win) {
    // The proxy fence hands this thread's finished copies and plane stores to the tensor cores'
    // reads; the barrier every thread's, and the end of every warp's wgmma of the stage the next
    // copies and planes overwrite.
    CpAsyncWait<kWgStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    const int stage = win % kWgStages;
    const uint32_t st = sbase + stage * kStage;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < 4; ++s)
      WgmmaE4m3<NT>(d[s], WgDesc(st + s * 32, 16, 1024, true), WgDesc(st + kA + s * 256, 128, 1024, false));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    // While the tensor cores run: the window kWgStages - 1 ahead (its copies and its planes, into
    // the stage the window before used) and x of the one after it.
    const int ahead = win + kWgStages - 1;
    if (ahead < nwin) {
      copy_w(ahead % kWgStages, ahead);
      convert(xnext, ahead % kWgStages);
    }
    CpAsyncCommit();
    if (ahead + 1 < nwin) load_x(xnext, ahead + 1);
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    const float* fac = reinterpret_cast<const float*>(smem + stage * kStage + kA + kB);
    const float* sc = reinterpret_cast<const float*>(smem + stage * kStage + kA + kB + kF);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int i = 0; i < kD; ++i) asm volatile("" : "+f"(d[s][i])::"memory");
      const float sa = sc[ra * SPW + s * SPW / 4], sb = sc[rb * SPW + s * SPW / 4];
#pragma unroll
      for (int j = 0; j < NT / 8; ++j) {
        // Columns 8 j + 2 t and 8 j + 2 t + 1: their factors of group s.
        const float2 f = *reinterpret_cast<const float2*>(fac + s * NT + 8 * j + 2 * t);
        acc[4 * j] = fmaf(d[s][4 * j] * sa, f.x, acc[4 * j]);
        acc[4 * j + 1] = fmaf(d[s][4 * j + 1] * sa, f.y, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(d[s][4 * j + 2] * sb, f.x, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(d[s][4 * j + 3] * sb, f.y, acc[4 * j + 3]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // the ring is free: its first bytes take the columns

  // D's fragment: (row ra, columns 8 j + 2 t, + 1), then rb's; staged [64 rows][NT].
  float* cols = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
    *reinterpret_cast<float2*>(cols + ra * NT + 8 * j + 2 * t) = make_float2(acc[4 * j], acc[4 * j + 1]);
    *reinterpret_cast<float2*>(cols + rb * NT + 8 * j + 2 * t) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
  }
  __syncthreads();
  // Output (row r, x row m) for 64 m + r = tid + 128 q: its planes' columns added.
  constexpr int kOuts = (kMaxM * kWgRows + 127) / 128;
  const int r = tid & 63;
  float v[kOuts];
#pragma unroll
  for (int q = 0; q < kOuts; ++q) {
    const int m = (tid >> 6) + 2 * q;
    v[q] = 0.0f;
    if (m < a.m) {
#pragma unroll
      for (int p = 0; p < P; ++p) v[q] += cols[r * NT + m * P + p];
    }
  }
  if (ks > 1) {
    // The K split: each block's sums to the scratch result; the tile's last block to count itself
    // (after a fence that makes its sums visible first) reads them all, in split order. The
    // counters were zeroed by the kernel before (GridDependencyWait: its end).
    const int64_t tiles = gridDim.x / ks;
    float* part = reinterpret_cast<float*>(scratch) + tile * ks * a.m * kWgRows;
    int32_t* counter = reinterpret_cast<int32_t*>(scratch + WgCountOffset(tiles, ks, a.m)) + tile;
#pragma unroll
    for (int q = 0; q < kOuts; ++q) {
      const int m = (tid >> 6) + 2 * q;
      if (m < a.m) part[(split * a.m + m) * kWgRows + r] = v[q];
    }
    __threadfence();
    __syncthreads();
    GridDependencyWait();
    // The count lands in shared memory past the staged columns (no static shared memory: the
    // ring's stages stay on 1 KB).
    int* arrived = reinterpret_cast<int*>(smem + kWgRows * NT * 4);
    if (tid == 0) *arrived = atomicAdd(counter, 1);
    __syncthreads();
    if (*arrived != ks - 1) return;
    __threadfence();
#pragma unroll
    for (int q = 0; q < kOuts; ++q) {
      const int m = (tid >> 6) + 2 * q;
      if (m < a.m) {
        float sum = __ldcg(part + m * kWgRows + r);
        for (int s = 1; s < ks; ++s) sum += __ldcg(part + (s * a.m + m) * kWgRows + r);
        v[q] = sum;
      }
    }
  }
#pragma unroll
  for (int q = 0; q < kOuts; ++q) {
    const int m = (tid >> 6) + 2 * q;
    const int64_t row = row0 + r;
    if (m < a.m && row < a.n)
      static_cast<T*>(a.y)[static_cast<int64_t>(m) * a.n + row] = Act<T>::FromFloat(Epilogue<T>(v[q], a, m, static_cast<int>(row)));
  }
#else
  __trap();  // built for sm_90a alone (CMakeLists.txt); the launcher refuses other devices
#endif
}

}  // namespace jaxgemv
