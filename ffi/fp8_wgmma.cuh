// FP8 (E4M3, float32 block scales) weights through Hopper's FP8 tensor cores: the "wgmma" variant of
// fp8_matmul at M = 1-8 on sm_90 (jaxgemv/planner.py: plan_fp8).
//
// The "mma" variant (gemv_core.cuh with fp8.cuh) turns every E4M3 code into a 16-bit float for
// mma.sync, ~330 of a window's 445-513 issue units (docs/perf-log.md, entry 163). Here nothing is
// decoded: the codes go from shared memory to wgmma's A operand as they are, and x becomes E4M3
// instead (tools/wgmma_probe.cu measured the form, entry 164):
// - x's row m becomes P planes of E4M3 codes, x = f0 p0 + f1 p1 (+ f2 p2), the factors powers of
//   two from the row's largest |x| (f0 = 2^(e - 7) with 2^e <= max < 2^(e+1), each next one 16
//   times smaller): a bf16 significand (8 bits) splits into two planes of four, an fp16 one (11) into
//   three, exactly for every value within 2^13 of the row's largest, the rest to 2^-24 of it. A prep
//   kernel writes them, in B's shared-memory layout per window, to a scratch result;
// - a block is one warpgroup and a 64-row tile; the codes stream through a cp.async ring of windows
//   of 64 rows x 128 values, each row's 128 bytes in wgmma's 128-byte swizzle (whole rows a copy
//   request, no bank conflicts on either side), x's planes and the rows' scales for the window
//   beside them;
// - every k32 step is one wgmma m64nNk32 (N = 8 / 16 / 24: x's P M columns, row m's plane p in
//   column P m + p) whose sums start from zero and go into float32 at once, times the row's scale
//   of that step's block: the tensor cores' FP8 sums keep about 14 bits, so they never carry more
//   than 32 products (a k32's);
// - K splits over the blocks of a cluster; each block takes its planes' columns into per-row sums
//   with the factors, stores them into rank 0's shared memory, and rank 0 adds them in rank order
//   and stores through the products' epilogue (gemv_core.cuh: Epilogue).
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

#include "cluster.cuh"
#include "cuda_util.cuh"
#include "gemv_core.cuh"

namespace jaxgemv {

constexpr int kWgRows = 64;    // rows a tile: wgmma's m64, one warpgroup of 128 threads
constexpr int kWgWin = 128;    // values of K a window: a row's 128 bytes, one swizzle atom row
constexpr int kWgStages = 4;   // the ring's stages (tools/wgmma_probe.cu: 4 and 6 level)
constexpr int kWgMaxM = 8;
// A tile's copy offsets (64 rows of K bytes) are 32-bit.
constexpr int64_t kWgMaxK = int64_t{1} << 24;
constexpr int kWgFactorBytes = 128;  // the P M float32 factors (at most 96 bytes), padded
// Where the K split's per-row sums go in rank 0's shared memory (past the staged columns).
constexpr int kWgPartOffset = 8192;

// x's planes a row: 3 for fp16 x, 2 for bf16.
__host__ __device__ constexpr int WgPlanes(bool f16) { return f16 ? 3 : 2; }
// wgmma's N: the planes' P M columns in whole eights.
__host__ __device__ constexpr int WgCols(int planes, int m) { return (planes * m + 7) / 8 * 8; }
// Scratch: per window, B's `cols` columns as the ring's stage holds them (cols / 8 groups of eight
// 16-byte K chunks of eight columns: core matrices of 128 bytes, K-adjacent ones 128 apart,
// N-adjacent ones 1024), then the factors.
__host__ __device__ constexpr int64_t WgPlaneBytes(int64_t windows, int cols) { return windows * cols * 128; }
__host__ __device__ constexpr int64_t WgScratchBytes(int64_t windows, int cols) {
  return WgPlaneBytes(windows, cols) + kWgFactorBytes;
}
// A stage: the window's codes (8 KB), B's columns, the rows' SPW scales, on 1 KB (the swizzle's
// atoms are 1 KB: the copies' chunk permutation follows the address bits 7-9).
template <int NT, int SPW>
__host__ __device__ constexpr int WgStageBytes() {
  return (kWgRows * kWgWin + NT * 128 + kWgRows * 4 * SPW + 1023) / 1024 * 1024;
}
template <int NT, int SPW>
__host__ __device__ constexpr int WgSmemBytes() {
  return kWgStages * WgStageBytes<NT, SPW>();
}
// The K split's sums of rank 0 (at most 8 ranks x M x 64 rows) inside the smallest ring.
static_assert(kWgPartOffset + 8 * kWgMaxM * kWgRows * 4 <= WgSmemBytes<8, 1>(), "the K split's sums fit the ring");
static_assert(kWgPartOffset >= kWgRows * 24 * 4, "the staged columns end before the K split's sums");

// ---------------------------------------------------------------------------------------------
// Prep: x [M, K] -> planes and factors. Grid (ceil(K / 16 / kWgPrepThreads), M): each block finds
// its row's largest |x| (the whole row, from L2), then thread i writes the P planes of the row's
// 16 values 16 i .. 16 i + 15 (a 16-byte chunk a plane); the last row's blocks write the columns
// past P M as zeros.
constexpr int kWgPrepThreads = 256;
template <typename T>
__global__ void __launch_bounds__(kWgPrepThreads) Fp8WgmmaPrepKernel(const T* x, int64_t k, int cols, uint8_t* scratch,
                                                                     int m_rows) {
  LaunchDependents();  // the GEMV may start its weight copies now; it waits for this grid's end
  constexpr int P = WgPlanes(std::is_same_v<T, __half>);
  const int m = blockIdx.y;
  const T* row = x + static_cast<int64_t>(m) * k;
  // A NaN or an infinity anywhere in the row makes its factors NaN (fmaxf would drop a NaN).
  float mx = 0.0f;
  bool bad = false;
  const uint4* row16 = reinterpret_cast<const uint4*>(row);  // K % 128 == 0, x on 16 bytes
  for (int64_t i = threadIdx.x; i < k / 8; i += kWgPrepThreads) {
    const uint4 v = __ldg(row16 + i);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = Act<T>::ToFloat2(FromU32<typename Act<T>::T2>(w[j]));
      bad |= !(fabsf(f.x) <= 3.0e38f) || !(fabsf(f.y) <= 3.0e38f);
      mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
    }
  }
  __shared__ float warp_max[kWgPrepThreads / 32];
  __shared__ int warp_bad[kWgPrepThreads / 32];
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
  const int any_bad = __any_sync(~0u, bad);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx, warp_bad[threadIdx.x >> 5] = any_bad;
  __syncthreads();
  mx = 0.0f;
  bad = false;
  for (int w = 0; w < kWgPrepThreads / 32; ++w) mx = fmaxf(mx, warp_max[w]), bad |= warp_bad[w] != 0;
  const int e = mx > 0.0f ? max(ilogbf(mx), -100) : 0;
  const float inv0 = ldexpf(1.0f, 7 - e);
  if (blockIdx.x == 0 && threadIdx.x < P) {
    float* factors = reinterpret_cast<float*>(scratch + WgPlaneBytes(k / kWgWin, cols));
    factors[m * P + threadIdx.x] = bad ? __int_as_float(0x7fc00000) : ldexpf(1.0f, e - 7 - 4 * static_cast<int>(threadIdx.x));
  }
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) * kWgPrepThreads + threadIdx.x;
  if (chunk >= k / 16) return;
  // Column c's chunk kc of window `win`: (c / 8) x 1024 + kc x 128 + (c % 8) x 16.
  uint8_t* at = scratch + (chunk >> 3) * cols * 128 + (chunk & 7) * 128;
  uint32_t words[P][4] = {};
  const uint4 in[2] = {__ldg(row16 + 2 * chunk), __ldg(row16 + 2 * chunk + 1)};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t pair = i < 4 ? (&in[0].x)[i] : (&in[1].x)[i - 4];
    const float2 f = Act<T>::ToFloat2(FromU32<typename Act<T>::T2>(pair));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // In units of f0 (below 2^8, inside E4M3's 448), then each residual 16 times finer; every
      // step exact in float32.
      float v = (h ? f.y : f.x) * inv0;
      const int byte = 2 * i + h;
#pragma unroll
      for (int p = 0; p < P; ++p) {
        const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
        words[p][byte / 4] |= static_cast<uint32_t>(q) << (8 * (byte % 4));
        v = (v - __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)))) * 16.0f;
      }
    }
  }
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int c = P * m + p;
    *reinterpret_cast<uint4*>(at + (c >> 3) * 1024 + (c & 7) * 16) =
        make_uint4(words[p][0], words[p][1], words[p][2], words[p][3]);
  }
  if (m == m_rows - 1)
    for (int c = P * m_rows; c < cols; ++c) *reinterpret_cast<uint4*>(at + (c >> 3) * 1024 + (c & 7) * 16) = make_uint4(0, 0, 0, 0);
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
// grid is tiles x ks blocks in clusters of ks (the K split), windows = K / 128.
template <typename T, int NT, int SPW>
__global__ void __launch_bounds__(128) Fp8WgmmaKernel(GemvArgs a, const uint8_t* scratch, int64_t windows, int ks,
                                                      int64_t scale_cols, int win_shift) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int P = WgPlanes(std::is_same_v<T, __half>);
  constexpr int kStage = WgStageBytes<NT, SPW>(), kA = kWgRows * kWgWin, kB = NT * 128;
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int split = static_cast<int>(blockIdx.x % ks);  // the block's rank in its cluster
  const int64_t row0 = static_cast<int64_t>(blockIdx.x / ks) * kWgRows;
  const int64_t w0 = split * windows / ks, nwin = (split + 1) * windows / ks - w0;
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));

  // The codes: thread tid copies chunk tid % 8 of rows tid / 8 + 16 i, to the chunk position the
  // swizzle gives it (the chunk index XOR the row's address bits 7-9); rows past N read row N - 1.
  const int kc = tid & 7, last = static_cast<int>(min(int64_t{kWgRows - 1}, a.n - 1 - row0));
  const uint8_t* wtile = a.w + row0 * a.k + kc * 16;
  uint32_t goff[4], sdst[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = (tid >> 3) + 16 * i;
    goff[i] = static_cast<uint32_t>(min(r, last)) * static_cast<uint32_t>(a.k);
    sdst[i] = sbase + r * 128 + ((kc ^ (((sbase >> 7) + r) & 7)) << 4);
  }
  // The scales: thread tid < 64 copies row tid's SPW of the window.
  const float* srow = reinterpret_cast<const float*>(a.scales) + min(row0 + (tid & 63), int64_t{a.n} - 1) * scale_cols;
  const uint32_t sdst_scale = sbase + kA + kB + (tid & 63) * 4 * SPW;
  auto copy_w = [&](int st, int64_t win) {
    const uint32_t soff = st * kStage;
    const uint8_t* src = wtile + (w0 + win) * kWgWin;
#pragma unroll
    for (int i = 0; i < 4; ++i) CpAsync16Shared(sdst[i] + soff, src + goff[i]);
    if (tid < 64) {
      const float* s = srow + (SPW > 1 ? (w0 + win) * SPW : (w0 + win) >> win_shift);
      if constexpr (SPW == 4) {
        CpAsync16Shared(sdst_scale + soff, s);
      } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(sdst_scale + soff), "l"(s), "n"(4 * SPW) : "memory");
      }
    }
  };
  // x's planes for a window (written by the prep kernel: only after GridDependencyWait).
  auto copy_x = [&](int st, int64_t win) {
    const uint8_t* src = scratch + (w0 + win) * kB;
#pragma unroll
    for (int c = tid; c < NT * 8; c += 128) CpAsync16Shared(sbase + st * kStage + kA + c * 16, src + c * 16);
  };
  // The ring's fill: the weight's first windows before the wait (the kernel before is the prep,
  // which writes no weight), x's planes after, a group a stage each.
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < nwin) copy_w(s, s);
    CpAsyncCommit();
  }
  GridDependencyWait();
#pragma unroll
  for (int s = 0; s < kWgStages - 1; ++s) {
    if (s < nwin) copy_x(s, s);
    CpAsyncCommit();
  }

  constexpr int kD = NT / 2;
  float acc[kD], d[4][kD];
#pragma unroll
  for (int i = 0; i < kD; ++i) {
    acc[i] = 0.0f;
#pragma unroll
    for (int s = 0; s < 4; ++s) d[s][i] = 0.0f;
  }
  const int ra = warp * 16 + g, rb = ra + 8;  // this thread's rows of the tile (its D fragment)
  for (int64_t win = 0; win < nwin; ++win) {
    // Window win's groups (its weight's, then its planes' for the first stages) are in once at
    // most kWgStages - 2 later groups are pending; the proxy fence hands the copies to the tensor
    // cores' reads, the barrier every thread's copies and the end of every warp's wgmma of the
    // stage the next copies overwrite.
    CpAsyncWait<kWgStages - 2>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (win + kWgStages - 1 < nwin) {
      const int st = static_cast<int>((win + kWgStages - 1) % kWgStages);
      copy_w(st, win + kWgStages - 1);
      copy_x(st, win + kWgStages - 1);
    }
    CpAsyncCommit();
    const int stage = static_cast<int>(win % kWgStages);
    const uint32_t st = sbase + stage * kStage;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int s = 0; s < 4; ++s)
      WgmmaE4m3<NT>(d[s], WgDesc(st + s * 32, 16, 1024, true), WgDesc(st + kA + s * 256, 128, 1024, false));
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    const float* sc = reinterpret_cast<const float*>(smem + stage * kStage + kA + kB);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int i = 0; i < kD; ++i) asm volatile("" : "+f"(d[s][i])::"memory");
      const float sa = sc[ra * SPW + s * SPW / 4], sb = sc[rb * SPW + s * SPW / 4];
#pragma unroll
      for (int j = 0; j < NT / 8; ++j) {
        acc[4 * j] = fmaf(d[s][4 * j], sa, acc[4 * j]);
        acc[4 * j + 1] = fmaf(d[s][4 * j + 1], sa, acc[4 * j + 1]);
        acc[4 * j + 2] = fmaf(d[s][4 * j + 2], sb, acc[4 * j + 2]);
        acc[4 * j + 3] = fmaf(d[s][4 * j + 3], sb, acc[4 * j + 3]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // the ring is free: its first bytes take the columns

  // D's fragment: d[4 j] = (row ra, column 8 j + 2 t), d[4 j + 1] = (ra, 8 j + 2 t + 1), then rb's.
  float* cols = reinterpret_cast<float*>(smem);  // [64 rows][NT]
#pragma unroll
  for (int j = 0; j < NT / 8; ++j) {
    cols[ra * NT + 8 * j + 2 * t] = acc[4 * j];
    cols[ra * NT + 8 * j + 2 * t + 1] = acc[4 * j + 1];
    cols[rb * NT + 8 * j + 2 * t] = acc[4 * j + 2];
    cols[rb * NT + 8 * j + 2 * t + 1] = acc[4 * j + 3];
  }
  __syncthreads();
  // Output (row r, x row m) for idx = tid + 128 q = 64 m + r: its planes' columns with the factors.
  const float* factors = reinterpret_cast<const float*>(scratch + WgPlaneBytes(windows, NT));
  constexpr int kOuts = kWgMaxM * kWgRows / 128;
  float v[kOuts];
#pragma unroll
  for (int q = 0; q < kOuts; ++q) {
    const int r = tid & 63, m = (tid >> 6) + 2 * q;
    v[q] = 0.0f;
    if (m < a.m) {
#pragma unroll
      for (int p = 0; p < P; ++p) v[q] = fmaf(factors[m * P + p], cols[r * NT + m * P + p], v[q]);
    }
  }
  if (ks > 1) {
    // Every block's ring is done before any stores into rank 0's (the first barrier), then each
    // block's sums go into rank 0's shared memory, [rank][m][row], and rank 0 adds them in rank
    // order after the second (release / acquire at cluster scope).
    float* part = reinterpret_cast<float*>(smem + kWgPartOffset);
    ClusterArriveRelaxed();
    ClusterWait();
#pragma unroll
    for (int q = 0; q < kOuts; ++q) {
      const int r = tid & 63, m = (tid >> 6) + 2 * q;
      if (m < a.m) StoreToRank0(&part[(split * a.m + m) * kWgRows + r], v[q]);
    }
    ClusterArriveRelease();
    ClusterWaitAcquire();
    if (split != 0) return;  // nothing reads this block's shared memory: it may leave
#pragma unroll
    for (int q = 0; q < kOuts; ++q) {
      const int r = tid & 63, m = (tid >> 6) + 2 * q;
      if (m < a.m) {
        float sum = part[m * kWgRows + r];
        for (int s = 1; s < ks; ++s) sum += part[(s * a.m + m) * kWgRows + r];
        v[q] = sum;
      }
    }
  }
#pragma unroll
  for (int q = 0; q < kOuts; ++q) {
    const int r = tid & 63, m = (tid >> 6) + 2 * q;
    const int64_t row = row0 + r;
    if (m < a.m && row < a.n)
      static_cast<T*>(a.y)[static_cast<int64_t>(m) * a.n + row] = Act<T>::FromFloat(Epilogue<T>(v[q], a, m, static_cast<int>(row)));
  }
#else
  __trap();  // built for sm_90a alone (CMakeLists.txt); the launcher refuses other devices
#endif
}

}  // namespace jaxgemv
