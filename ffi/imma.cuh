// int4 / int8 weights (MatMulNBits layout, symmetric) through the integer tensor cores: the
// "imma" variant of int4_matmul / int8_matmul at M = 1-8 (jaxgemv/planner.py: plan_nbits).
//
// The "mma" variant (gemv_core.cuh with nbits.cuh) turns every code into a 16-bit float for
// mma.m16n8k16; here the codes stay integers and x becomes integers instead:
// - a 4-bit code q is the signed byte 16 (q - 8): one LOP3 per four codes ((word ^ 0x88888888) &
//   0xf0f0f0f0 on the word or the word shifted by 4: a nibble in a byte's high half with its top
//   bit flipped is its own sign extension); an 8-bit code q is the byte q - 128 (its top bit
//   flipped, one LOP3 per four codes);
// - x's row m becomes three planes of signed bytes, x = f0 p0 + f1 p1 + f2 p2, the factors powers
//   of two from the row's largest |x| (2^(e-6), 2^(e-12), 2^(e-19) with 2^e <= max < 2^(e+1)): every
//   value within 2^8 of the row's largest is exact, the rest within 2^-20 of the largest. A prep
//   kernel writes them, in the mma's B fragment order, to a scratch buffer;
// - mma.sync.m16n8k32.s32.s8.s8.s32 takes 16 rows of weight codes (A) and x's planes (B: row m's
//   plane p in column 3 m + p, in one, two or three mmas of eight columns: ImmaTiles), a group of
//   32 values per mma and n-tile, the A operand decoded once for them all. Its int32 sums take the
//   row's block scale in float32 (4 I2FP + 4 FFMA a group, lane and n-tile, or once per block
//   where blocks span groups: the int32 sums accumulate in the mma); the planes' factors (and
//   int4's 1/16) apply once at the end.
// The weight streams through a per-warp cp.async ring of 16-row windows (tools/imma_probe.cu
// measured the form: docs/perf-log.md, entry 144), x's planes for the window's groups with it, one
// 16-row tile per block, K split over the block's warps, their sums reduced in shared memory and
// stored through the products' epilogue (gemv_core.cuh: Epilogue). The launch pads the block's
// shared memory so that the grid spreads evenly over the SMs (gemv_launch.cuh: BalancedSharedBytes).
//
// Limits (checked by the handler, planned by jaxgemv/planner.py): no zero points, blocks of 32,
// 64 or 128 values, K padded to whole blocks a multiple of the window and at most kImmaMaxK,
// M <= 8, no SwiGLU, the RMSNorm's row scale from a given row_scale.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda_util.cuh"
#include "gemv_core.cuh"

namespace jaxgemv {

constexpr int kImmaPlanes = 3;
// K padded to whole blocks: the copies' offsets within a tile's 16 rows are 32-bit (ImmaGemvKernel).
constexpr int64_t kImmaMaxK = int64_t{1} << 24;
constexpr int kImmaMaxM = 8;  // rows of x: 3 M columns in up to three mmas' eight (ImmaTiles)
constexpr int kImmaFactorBytes = 4 * kImmaPlanes * kImmaMaxM + 32;  // 128: the factors, padded
// The mmas a group takes: x's 3 M columns in n-tiles of eight.
__host__ __device__ constexpr int ImmaTiles(int m) { return (kImmaPlanes * m + 7) / 8; }
constexpr int kImmaStages = 2;
constexpr int kImmaScaleSlot = 32;  // bytes of a row's staged scales per window

// A window: 16 rows x 128 LOADS bytes of codes (8 LOADS chunks of 16 bytes a row). A stage of the
// ring holds the window's codes, its rows' scales and x's planes for its groups (kGroups x 3 M
// columns x 32 bytes, as the scratch holds them): StageBytes.
template <int BITS, int LOADS>
struct ImmaWindow {
  static constexpr int kRowBytes = 128 * LOADS;
  static constexpr int kValues = kRowBytes * 8 / BITS;
  static constexpr int kGroups = kValues / 32;
  static constexpr int kChunks = kRowBytes / 16;
  static constexpr int kXOffset = 16 * kRowBytes + 16 * kImmaScaleSlot;
  __host__ __device__ static constexpr int XBytes(int m) { return kGroups * kImmaPlanes * m * 32; }
  __host__ __device__ static constexpr int StageBytes(int m) { return kXOffset + XBytes(m); }
};

// Scratch for x's planes (jaxgemv/nbits.py sizes it through jaxgemv.imma_scratch_bytes): per
// group of 32 values (K padded to whole windows), per column (3 M), per lane t of a quad, the
// two words of the B fragment (8 bytes); then the 3 M factors as float32.
__host__ __device__ constexpr int64_t ImmaPlaneBytes(int64_t groups, int m) { return groups * kImmaPlanes * m * 32; }
__host__ __device__ constexpr int64_t ImmaScratchBytes(int64_t groups, int m) {
  return ImmaPlaneBytes(groups, m) + kImmaFactorBytes;
}

template <typename T>
__device__ __forceinline__ float ScaleToFloat(uint32_t bits16) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits16)));
  } else {
    return __uint_as_float(bits16 << 16);
  }
}

// ---------------------------------------------------------------------------------------------
// Prep: x [M, K] -> planes and factors. Grid (ceil(groups / kImmaPrepGroups), M), kImmaPrepThreads
// threads: each block finds its row's largest |x| (the whole row, from L2: 16-byte loads where
// rows start on 16 bytes), then thread (group, t) writes the three planes of its 8 values. Values
// past K (the last block's padding, the last window's) are 0.
constexpr int kImmaPrepThreads = 512;
constexpr int kImmaPrepGroups = kImmaPrepThreads / 4;
template <typename T, int BITS>
__global__ void __launch_bounds__(kImmaPrepThreads) ImmaPrepKernel(const T* x, int64_t k, int64_t groups,
                                                                   uint8_t* scratch, int m_rows) {
  LaunchDependents();  // the GEMV may start its weight copies now; it waits for this grid's end
  const int m = blockIdx.y, cols = kImmaPlanes * m_rows;
  const T* row = x + static_cast<int64_t>(m) * k;
  // A NaN or an infinity anywhere in the row makes its factors NaN (fmaxf would drop a NaN).
  float mx = 0.0f;
  bool bad = false;
  const auto see = [&](float v) {
    v = fabsf(v);
    bad |= !(v <= 3.0e38f);
    mx = fmaxf(mx, v);
  };
  if (k % 8 == 0) {
    const uint4* row16 = reinterpret_cast<const uint4*>(row);
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < k / 8; i += kImmaPrepThreads) {
      const uint4 v = __ldg(row16 + i);
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = Act<T>::ToFloat2(FromU32<typename Act<T>::T2>(w[j]));
        see(f.x);
        see(f.y);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < k; i += kImmaPrepThreads) see(Act<T>::ToFloat(row[i]));
  }
  __shared__ float warp_max[kImmaPrepThreads / 32];
  __shared__ int warp_bad[kImmaPrepThreads / 32];
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
  const int any_bad = __any_sync(~0u, bad);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = mx, warp_bad[threadIdx.x >> 5] = any_bad;
  __syncthreads();
  mx = 0.0f;
  bad = false;
  for (int w = 0; w < kImmaPrepThreads / 32; ++w) mx = fmaxf(mx, warp_max[w]), bad |= warp_bad[w] != 0;
  const int e = mx > 0.0f ? max(ilogbf(mx), -100) : 0;
  const float u0 = ldexpf(1.0f, e - 6), inv0 = ldexpf(1.0f, 6 - e);
  if (blockIdx.x == 0 && threadIdx.x < kImmaPlanes) {
    // The factors, int4's 1/16 folded in (its codes are bytes 16 (q - 8)).
    const float f[kImmaPlanes] = {u0, u0 * (1.0f / 64), u0 * (1.0f / 8192)};
    float* factors = reinterpret_cast<float*>(scratch + ImmaPlaneBytes(groups, m_rows));
    factors[m * kImmaPlanes + threadIdx.x] = bad ? __int_as_float(0x7fc00000) : f[threadIdx.x] * (BITS == 4 ? 1.0f / 16 : 1.0f);
  }
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kImmaPrepThreads + threadIdx.x;  // (group, t)
  if (item >= groups * 4) return;
  const int t = static_cast<int>(item & 3);
  const int64_t grp = item >> 2;
  uint32_t words[kImmaPlanes][2] = {};
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // The value each byte pairs with in the A operand (imma.cuh's decode of that width).
      const int64_t kk = BITS == 4 ? 32 * grp + 8 * t + 2 * i + half : 32 * grp + 16 * half + 4 * t + i;
      const float v = kk < k ? Act<T>::ToFloat(row[kk]) : 0.0f;
      // Plane 0 in units of u0 (|v| / u0 < 128), then 6 and 7 bits more; every step exact in
      // float32 (multiples of powers of two within 24 bits of each other).
      const float p0 = fminf(127.0f, fmaxf(-127.0f, rintf(v * inv0)));
      const float r0 = fmaf(-p0, u0, v);
      const float p1 = fminf(127.0f, fmaxf(-127.0f, rintf(r0 * inv0 * 64.0f)));
      const float r1 = fmaf(-p1, u0 * (1.0f / 64), r0);
      const float p2 = fminf(127.0f, fmaxf(-127.0f, rintf(r1 * inv0 * 8192.0f)));
      const float p[kImmaPlanes] = {p0, p1, p2};
#pragma unroll
      for (int q = 0; q < kImmaPlanes; ++q)
        words[q][half] |= (static_cast<uint32_t>(static_cast<int>(p[q])) & 0xffu) << (8 * i);
    }
  uint2* planes = reinterpret_cast<uint2*>(scratch);
#pragma unroll
  for (int q = 0; q < kImmaPlanes; ++q)
    planes[(grp * cols + m * kImmaPlanes + q) * 4 + t] = make_uint2(words[q][0], words[q][1]);
}

// ---------------------------------------------------------------------------------------------
// The GEMV. BITS-bit codes, x (and scales) in T, KS warps a block splitting K, windows of 128 LOADS
// bytes a row, R groups of 32 values a scale block (block_size 32 R).
template <int BITS, typename T, int KS, int LOADS, int R, int TILES>
__global__ void __launch_bounds__(32 * KS) ImmaGemvKernel(GemvArgs a, const uint8_t* scratch, int64_t groups) {
  using Win = ImmaWindow<BITS, LOADS>;
  static_assert(Win::kGroups % R == 0, "whole scale blocks per window");
  constexpr int kBlocksPerWin = Win::kGroups / R;
  constexpr int kScaleBytes = 2 * kBlocksPerWin;  // a row's scales per window: 2 .. 32
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  const int cols = kImmaPlanes * a.m;
  const int stage_bytes = Win::StageBytes(a.m), xbytes = Win::XBytes(a.m);
  uint8_t* ring = smem + warp * kImmaStages * stage_bytes;
  const int64_t windows = groups / Win::kGroups;
  const int64_t w0 = warp * windows / KS, w1 = (warp + 1) * windows / KS;
  const int64_t blocks = groups / R;  // the weight's blocks a row (K padded to whole windows)
  const int64_t row_bytes = groups * 4 * BITS;  // groups x 32 values x BITS / 8 bytes

  // Copies of window `win` into stage `st`: chunk c of row r at chunk position c ^ (r & 7) (ldmatrix
  // below reads eight rows' chunk at once without bank conflicts); lanes 0-15 copy row lane's
  // first 16 bytes of scales (the aligned piece that holds them where there are fewer), lanes
  // 16-31 the second where a window has 32. Rows past N read row N - 1. A lane's addresses are
  // fixed for the kernel but for the window's offset and the stage's: copy i moves chunk
  // lane % kChunks of row lane / kChunks + kStep i, its source as a 32-bit offset from the tile's
  // first row (16 rows of at most 2^24 bytes: kImmaMaxK) and its destination as a shared-space address,
  // so that a window's copies cost an add or two each rather than their row's 64-bit arithmetic.
  constexpr int kCopies = 16 * Win::kChunks / 32, kStep = 32 / Win::kChunks;
  const int last = static_cast<int>(min(int64_t{15}, int64_t{a.n} - 1 - int64_t{tile} * 16));
  const uint8_t* wtile = a.w + int64_t{tile} * 16 * row_bytes + (lane % Win::kChunks) * 16;
  const uint32_t ring_s = static_cast<uint32_t>(__cvta_generic_to_shared(ring));
  uint32_t goff[kCopies], sdst[kCopies];
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int r = lane / Win::kChunks + kStep * i, c = lane % Win::kChunks;
    goff[i] = static_cast<uint32_t>(min(r, last)) * static_cast<uint32_t>(row_bytes);
    sdst[i] = ring_s + r * Win::kRowBytes + ((c ^ (r & 7)) << 4);
  }
  const int sr = lane & 15, piece = lane >> 4;
  const bool scale_lane = piece == 0 || kScaleBytes == 32;
  const int64_t scale0 = min(int64_t{tile} * 16 + sr, int64_t{a.n} - 1) * blocks * 2 + piece * 16;
  const uint32_t sdst_scale = ring_s + 16 * Win::kRowBytes + sr * kImmaScaleSlot + piece * 16;
  auto copy = [&](int st, int64_t win) {
    const uint32_t soff = st * stage_bytes;
    const uint8_t* src = wtile + win * Win::kRowBytes;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) CpAsync16Shared(sdst[i] + soff, src + goff[i]);
    if (scale_lane) CpAsync16Shared(sdst_scale + soff, a.scales + ((scale0 + win * kScaleBytes) & ~int64_t{15}));
  };
  // x's planes for window `win` (written by the prep kernel: only after GridDependencyWait), through
  // the ring with the weight, so that the mmas' B operands are shared loads: read from global memory
  // they missed L1 (10% hits) and cost an L2 round trip a group and n-tile, 45% of the time at
  // M = 4-8 (docs/perf-log.md, entry 146).
  const uint8_t* xsrc = scratch + lane * 16;
  auto copy_x = [&](int st, int64_t win) {
    const uint32_t dst = ring_s + st * stage_bytes + Win::kXOffset + lane * 16;
    const uint8_t* src = xsrc + win * xbytes;
    // At most the planes of the M that TILES n-tiles hold, 512 bytes (32 lanes x 16) a round.
    constexpr int kMaxM = 8 * TILES / kImmaPlanes < kImmaMaxM ? 8 * TILES / kImmaPlanes : kImmaMaxM;
#pragma unroll
    for (int q = 0; q < (Win::XBytes(kMaxM) + 511) / 512; ++q) {
      if (q * 512 + lane * 16 < xbytes) CpAsync16Shared(dst + q * 512, src + q * 512);
    }
  };
#pragma unroll
  for (int s = 0; s < kImmaStages - 1; ++s) {
    if (w0 + s < w1) copy(s, w0 + s);
    CpAsyncCommit();
  }
  GridDependencyWait();  // x's planes (the prep kernel) and the epilogue's operands from here on
#pragma unroll
  for (int s = 0; s < kImmaStages - 1; ++s) {
    if (w0 + s < w1) copy_x(s, w0 + s);
    CpAsyncCommit();
  }

  float acc[TILES][4] = {};
  // ldmatrix.x4's row address for this lane: matrices (rows 0-7, chunk c), (8-15, c), (0-7, c + 1),
  // (8-15, c + 1) from lanes 0-7, 8-15, 16-23, 24-31; each lane then holds word t of rows g and g + 8
  // of chunks c and c + 1.
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = lane >> 4;
  // The in-piece offset of rows g's and g + 8's scales (below 16 bytes of them a window).
  // (The low 32 bits of their byte offsets are enough for that.)
  const uint32_t scale_g = static_cast<uint32_t>(min(int64_t{tile} * 16 + g, int64_t{a.n} - 1) * blocks * 2);
  const uint32_t scale_g8 = static_cast<uint32_t>(min(int64_t{tile} * 16 + g + 8, int64_t{a.n} - 1) * blocks * 2);
  // This lane's B operand in a stage's planes: column 8 nt + g, word pair t.
  const int xlane = Win::kXOffset + g * 32 + t * 8;
  for (int64_t win = w0; win < w1; ++win) {
    const int64_t i = win - w0;
    if (win + kImmaStages - 1 < w1) {
      const int st = static_cast<int>((i + kImmaStages - 1) % kImmaStages);
      copy(st, win + kImmaStages - 1);
      copy_x(st, win + kImmaStages - 1);
    }
    CpAsyncCommit();
    CpAsyncWait<kImmaStages - 1>();
    __syncwarp();
    const uint8_t* stage = ring + (i % kImmaStages) * stage_bytes;
    const int off_g = kScaleBytes >= 16 ? 0 : static_cast<int>((scale_g + static_cast<uint32_t>(win) * kScaleBytes) & 15);
    const int off_g8 = kScaleBytes >= 16 ? 0 : static_cast<int>((scale_g8 + static_cast<uint32_t>(win) * kScaleBytes) & 15);
    const unsigned short* sc_g = reinterpret_cast<const unsigned short*>(stage + 16 * Win::kRowBytes + g * kImmaScaleSlot + off_g);
    const unsigned short* sc_g8 =
        reinterpret_cast<const unsigned short*>(stage + 16 * Win::kRowBytes + (g + 8) * kImmaScaleSlot + off_g8);
    int d[TILES][4] = {};
#pragma unroll
    for (int j = 0; j < Win::kChunks / 2; ++j) {  // one ldmatrix.x4: chunks 2j and 2j + 1
      uint32_t rg[4];
      const int c = 2 * j + lc;
      LdMatrixX4(rg, static_cast<uint32_t>(__cvta_generic_to_shared(stage + lr * Win::kRowBytes + ((c ^ (lr & 7)) << 4))));
#pragma unroll
      for (int h = 0; h < (BITS == 4 ? 2 : 1); ++h) {
        // 4-bit codes: a chunk is a group of 32 values; 8-bit: the two chunks are one group.
        const int grp = BITS == 4 ? 2 * j + h : j;
        const uint32_t a0 = BITS == 4 ? ImmaEven4(rg[2 * h]) : rg[0] ^ 0x80808080u;
        const uint32_t a1 = BITS == 4 ? ImmaEven4(rg[2 * h + 1]) : rg[1] ^ 0x80808080u;
        const uint32_t a2 = BITS == 4 ? ImmaOdd4(rg[2 * h]) : rg[2] ^ 0x80808080u;
        const uint32_t a3 = BITS == 4 ? ImmaOdd4(rg[2 * h + 1]) : rg[3] ^ 0x80808080u;
#pragma unroll
        for (int nt = 0; nt < TILES; ++nt) {  // columns 8 nt + g of x's planes
          const uint2 b = 8 * nt + g < cols ? *reinterpret_cast<const uint2*>(stage + xlane + (grp * cols + 8 * nt) * 32)
                                            : make_uint2(0, 0);
          if (grp % R == 0) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0;  // a block's first group: fresh sums
          Imma16832(d[nt], a0, a1, a2, a3, b, d[nt]);
        }
        if (grp % R == R - 1) {  // the block's last group: its sums take the block's scale
          const float sg = ScaleToFloat<T>(sc_g[grp / R]), sg8 = ScaleToFloat<T>(sc_g8[grp / R]);
#pragma unroll
          for (int nt = 0; nt < TILES; ++nt) {
            acc[nt][0] = fmaf(static_cast<float>(d[nt][0]), sg, acc[nt][0]);
            acc[nt][1] = fmaf(static_cast<float>(d[nt][1]), sg, acc[nt][1]);
            acc[nt][2] = fmaf(static_cast<float>(d[nt][2]), sg8, acc[nt][2]);
            acc[nt][3] = fmaf(static_cast<float>(d[nt][3]), sg8, acc[nt][3]);
          }
        }
      }
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
  // The K split's sums: red[warp][row][column], then each output from its planes' columns.
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);  // [KS][16 rows][8 TILES columns]
  constexpr int kCols = 8 * TILES;
#pragma unroll
  for (int nt = 0; nt < TILES; ++nt) {
    red[(warp * 16 + g) * kCols + 8 * nt + 2 * t] = acc[nt][0];
    red[(warp * 16 + g) * kCols + 8 * nt + 2 * t + 1] = acc[nt][1];
    red[(warp * 16 + g + 8) * kCols + 8 * nt + 2 * t] = acc[nt][2];
    red[(warp * 16 + g + 8) * kCols + 8 * nt + 2 * t + 1] = acc[nt][3];
  }
  __syncthreads();
  const float* factors = reinterpret_cast<const float*>(scratch + ImmaPlaneBytes(groups, a.m));
  for (int idx = threadIdx.x; idx < 16 * a.m; idx += 32 * KS) {
    const int r = idx & 15, m = idx >> 4, row = tile * 16 + r;
    float out = 0.0f;
#pragma unroll
    for (int p = 0; p < kImmaPlanes; ++p) {
      float col = 0.0f;
#pragma unroll
      for (int w = 0; w < KS; ++w) col += red[(w * 16 + r) * kCols + m * kImmaPlanes + p];
      out = fmaf(col, factors[m * kImmaPlanes + p], out);
    }
    if (row < a.n) static_cast<T*>(a.y)[static_cast<int64_t>(m) * a.n + row] = Act<T>::FromFloat(Epilogue<T>(out, a, m, row));
  }
}

template <int BITS, int LOADS>
constexpr int ImmaSmemBytes(int ks, int tiles, int m) {
  const int ring = ks * kImmaStages * ImmaWindow<BITS, LOADS>::StageBytes(m);
  const int red = ks * 16 * 8 * tiles * 4;
  return ring > red ? ring : red;
}

}  // namespace jaxgemv
