// The "xshare" variant of int4_matmul / int8_matmul (jaxgemv/planner.py: xshare_unfit): symmetric
// 4-bit and 8-bit codes at M = 1-16 with x shared by a block's warps through shared memory.
//
// The per-block tensor-core kernel (gemv_core.cuh) gives a block one 16-row tile and splits its K
// over the block's warps, so every warp loads its own x pieces from global memory: at M = 16 that
// is 16 rows x 2 bytes of x for every half byte of weight, and the mma waiting on them held 11-34%
// of the stall samples of int4 at M = 16 on an H100 and an H200 (docs/perf-log.md, entry 147).
// Here a block's W warps take W adjacent tiles over the same K window: the window's x (8 MT rows x
// 256 values) is copied once per block by cp.async into a ring stage beside each warp's 16 rows of
// codes and their scales, the mmas' B operands are shared-memory loads, and one barrier per
// window hands a stage on (tools/xshare_probe.cu measured the design first: docs/perf-log.md,
// entries 148 and 150).
//
// The grid is persistent and balanced as a stream over (tile group, window) steps: block b takes
// steps [b T / B, (b + 1) T / B) of the T = groups x windows, so every block does the same work to
// within one window whatever N and K are. Each warp adds its sums of a tile (the whole tile or a
// piece of it) into a float32 scratch result with atomic adds, which the handler zeroes before and
// XshareStoreKernel turns into y (the epilogue, x's type) after. (Two forms that stored from the
// kernel ran slower on an H100: entry 148's, which stored whole groups from the registers and let
// the block that completed a group store it from the sums behind a fence inside the loop, 22-27%;
// entry 152's, the same with the fence and the tiles' counters after the loop, 2-4 us a product,
// a dependent chain of fence, counter and read at the end of every block against the store
// kernel's 1.6-3.1 us.)
//
// Layouts: the codes and scales of MatMulNBits (nbits.cuh) at blocks of 32-256 values, no zero
// points (q - 8, q - 128); x [M, K] with each 8 values in the decode's pair order (jaxgemv/nbits.py:
// xshare_pair_order): (0, 4, 1, 5, 2, 6, 3, 7) for 4-bit codes, (0, 2, 1, 3, 4, 6, 5, 7) for 8-bit
// ones; K a multiple of the 256-value window.
#pragma once

#include <type_traits>

#include "cuda_util.cuh"
#include "gemv_core.cuh"
#include "nbits.cuh"

namespace jaxgemv {

constexpr int kXshareWin = 256;  // K values a window
constexpr int kXshareMaxM = 16;

// Warps a block by format and M (the instances, tools/xshare_probe.cu on an H100, each within 1%
// of the other forms timed there: 4-bit codes on four warps at M <= 8 and eight above, three ring
// stages; 8-bit ones on four warps at two stages, whose stage holds twice the codes).
__host__ __device__ constexpr int XshareWarps(int bits, int64_t m) { return bits == 8 || m <= 8 ? 4 : 8; }

template <int BITS, int MT>
struct XshareShape {
  static constexpr int kWarps = XshareWarps(BITS, 8 * MT), kStages = BITS == 8 ? 2 : 3;
  static constexpr int kCodeBytes = kXshareWin * BITS / 8;  // a row's codes a window: 128 or 256
};

// A stage: x's window (8 MT rows x 512 bytes), then per warp its tile's 16 rows of codes and 16
// rows' aligned 16-byte pieces of scales (the window's 256 / block_size).
template <int BITS, int MT>
struct XshareStage {
  static constexpr int kX = MT * 8 * 512, kW = 16 * XshareShape<BITS, MT>::kCodeBytes, kS = 16 * 16;
  static constexpr int kWarpBytes = kW + kS;
  static constexpr int kBytes = kX + XshareShape<BITS, MT>::kWarps * kWarpBytes;
};
template <int BITS, int MT>
constexpr int XshareSmemBytes() {
  return XshareShape<BITS, MT>::kStages * XshareStage<BITS, MT>::kBytes;
}

// Where 16-byte unit u of a row lands in its stage row, so that the eight lanes of a shared-memory
// load phase (g = 2p, 2p + 1, t = 0..3) read eight different bank groups: x rows (32 units), read
// by lane (g, t) at units 16 l + 4 t + j of row 8 mt + g; code rows (CB / 16 units), at units
// (4 l + t) CB / 128 + c of rows g and g + 8 (the odd rows' units swapped in halves of four units
// for 128-byte rows, in pairs for 256-byte ones).
__device__ __forceinline__ int XshareXUnit(int u, int row) { return u ^ (((u >> 3) & 1) << 1) ^ (row & 1); }
template <int CB>
__device__ __forceinline__ int XshareWUnit(int u, int row) {
  return CB == 128 ? u ^ ((row & 1) << 2) : u ^ (row & 1);
}

// The decode's constant, which the kernel keeps in a register (below): 4-bit codes write q under
// T's magic exponent (nbits.cuh, NbitsMagic: 1024 in fp16, 128 in bf16) in both halves of a pair;
// 8-bit ones under fp16's (0x64 in each byte, for the byte permute) or as the low byte of float32's
// 2^23 (bf16 x: 8-bit codes do not fit bf16's 128..255).
template <int BITS, typename T>
__host__ __device__ constexpr uint32_t XshareMagic() {
  if constexpr (BITS == 4) {
    return NbitsMagic<T>::kByte * 0x01000100u;
  } else if constexpr (std::is_same_v<T, __half>) {
    return 0x64646464u;
  } else {
    return 0x4b000000u;
  }
}

// 4-bit codes: pair P of a word of eight, (v_P, v_P+4), as T (q - 8) x s, one rounding: magic + q
// less magic + 8 is exact. The and-or is one LOP3 only with the mask and the magic in registers:
// with both as immediates ptxas splits it in two (cuobjdump, sm_90).
template <typename T, int P>
__device__ __forceinline__ uint32_t XshareDecodePair4(uint32_t word, uint32_t mask, uint32_t magic,
                                                      typename Act<T>::T2 s2) {
  using T2 = typename Act<T>::T2;
  constexpr uint32_t kSub = XshareMagic<4, T>() | 0x00080008u;
  uint32_t v;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(v) : "r"(word >> (4 * P)), "r"(mask), "r"(magic));
  return AsU32(__hmul2(__hsub2(FromU32<T2>(v), FromU32<T2>(kSub)), s2));
}

// 8-bit codes: bytes (P, P + 2) of a word of four as T (q - 128) x s, one rounding. fp16: 1024 + q
// by one byte permute under 0x64, less 1152 (exact); bf16: each byte as the float32 2^23 + q, less
// 2^23 + 128, packed to a bf16 pair (exact: |q - 128| has at most 8 significant bits).
template <typename T, int P>
__device__ __forceinline__ uint32_t XshareDecodePair8(uint32_t word, uint32_t magic, typename Act<T>::T2 s2) {
  if constexpr (std::is_same_v<T, __half>) {
    const uint32_t v = __byte_perm(word, magic, P ? 0x4341 : 0x4240);
    return AsU32(__hmul2(__hsub2(FromU32<__half2>(v), FromU32<__half2>(0x64806480u)), s2));  // 0x6480: 1152
  } else {
    const float lo = __uint_as_float(__byte_perm(word, magic, 0x7650 | P)) - 8388736.0f;
    const float hi = __uint_as_float(__byte_perm(word, magic, 0x7650 | (P + 2))) - 8388736.0f;
    return AsU32(__hmul2(__floats2bfloat162_rn(lo, hi), s2));
  }
}

// The four A pairs that x's unit j (8 values) of the lane's 32 meets, from the lane's words of one
// row (32 values of BITS bits: BITS words): 4-bit codes, word j's pairs (0, 4), (1, 5), (2, 6),
// (3, 7); 8-bit ones, words 2 j and 2 j + 1, pairs (0, 2), (1, 3) of each. The slots match x's
// unit in pair order (xshare_pair_order).
template <int BITS, typename T>
__device__ __forceinline__ void XshareDecodeUnit(const uint32_t (&w)[BITS], int j, uint32_t mask, uint32_t magic,
                                                 typename Act<T>::T2 s, uint32_t (&p)[4]) {
  if constexpr (BITS == 4) {
    p[0] = XshareDecodePair4<T, 0>(w[j], mask, magic, s), p[1] = XshareDecodePair4<T, 1>(w[j], mask, magic, s);
    p[2] = XshareDecodePair4<T, 2>(w[j], mask, magic, s), p[3] = XshareDecodePair4<T, 3>(w[j], mask, magic, s);
  } else {
    p[0] = XshareDecodePair8<T, 0>(w[2 * j], magic, s), p[1] = XshareDecodePair8<T, 1>(w[2 * j], magic, s);
    p[2] = XshareDecodePair8<T, 0>(w[2 * j + 1], magic, s), p[3] = XshareDecodePair8<T, 1>(w[2 * j + 1], magic, s);
  }
}

// Scratch: float32 sums [M][groups x 16 W] (output columns padded to whole tile groups).
// jaxgemv/nbits.py mirrors it (xshare_scratch_bytes); the handler zeroes it.
__host__ __device__ inline int64_t XshareSumCols(int64_t n, int warps) {
  return (n + 16 * warps - 1) / (16 * warps) * 16 * warps;
}
__host__ __device__ inline int64_t XshareScratchBytes(int64_t m, int64_t n, int warps) {
  return 4 * m * XshareSumCols(n, warps);
}

// Blocks per SM that shared memory allows on sm_90 (228 KB, 1 KB of it reserved per block): the
// kernel's __launch_bounds__ give ptxas the registers that leaves (65536 / threads an SM). Without
// it ptxas held the two-m-tile instances to 80 registers and spilled, where two blocks of 256
// threads an SM allow 128.
template <int BITS, int MT>
constexpr int XshareMinBlocks() {
  constexpr int kBlocks = 233472 / (XshareSmemBytes<BITS, MT>() + 1024);
  return kBlocks > 0 ? kBlocks : 1;
}

// A value ptxas must keep in a register as computed: the loop's shared-memory offsets, which it
// otherwise rebuilt from the thread index at every use (about a hundred instructions a window in
// the two-m-tile loop, perf log 170).
__device__ __forceinline__ int XshareKeep(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

template <int BITS, typename T, int MT>
__global__ void __launch_bounds__(32 * XshareShape<BITS, MT>::kWarps, (XshareMinBlocks<BITS, MT>()))
    XshareGemvKernel(GemvArgs a, float* __restrict__ sums) {
  constexpr int W = XshareShape<BITS, MT>::kWarps, S = XshareShape<BITS, MT>::kStages;
  constexpr int CB = XshareShape<BITS, MT>::kCodeBytes, kUnits = CB / 16, kCodeCopies = CB / 32, kC = CB / 128;
  using St = XshareStage<BITS, MT>;
  constexpr int kXCopies = MT * 8 * 32 / (32 * W);  // x's 16-byte units a thread copies per window
  static_assert(kXCopies >= 1 && MT * 8 * 32 % (32 * W) == 0, "x's units spread evenly over the block");
  static_assert(W % 2 == 0, "a thread's x rows (warp + W c) share the parity XshareXUnit places them by");
  constexpr int kCodeRowStep = 32 / kUnits;  // code rows between a lane's copies (even: same parity)
  extern __shared__ __align__(16) uint8_t smem[];
  const uint32_t sbase = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n = a.n, m_rows = a.m;
  const int64_t k = a.k;
  const int windows = static_cast<int>(k / kXshareWin), groups = (n + 16 * W - 1) / (16 * W);
  const int64_t sum_cols = static_cast<int64_t>(groups) * 16 * W;
  const int shift = a.scale_shift;
  const int64_t blocks = k >> shift, row_bytes = k * BITS / 8;
  const int64_t total = static_cast<int64_t>(groups) * windows;
  const int begin = static_cast<int>(total * blockIdx.x / gridDim.x);
  const int count = static_cast<int>(total * (blockIdx.x + 1) / gridDim.x) - begin;
  const T* x = static_cast<const T*>(a.x);

  // The copying cursor: per thread its x units (unit `lane` of rows warp + W c: a source at window
  // 0 and one destination, the others W x 512 bytes apart) and for the current tile group its code
  // units (unit lane % kUnits of rows lane / kUnits + kCodeRowStep c) and (lanes 0-15) one row's
  // scales, set when the cursor enters a group. Rows past N read row N - 1. x's rows past M are not
  // copied: their stage rows hold whatever they held, which reaches only the mmas' B columns of
  // those rows, whose sums are never added or stored (each output is its own column's dot
  // product). (Copied from row M - 1, every block's copies of a window to the same few L2 sectors,
  // they ran 34816 x 5120 at M = 2 in 72.4 us against 56.8 at M = 8: perf log 148.)
  const uint8_t* xsrc[kXCopies];
  bool xcopy[kXCopies];
#pragma unroll
  for (int c = 0; c < kXCopies; ++c) {
    const int row = warp + W * c;
    xcopy[c] = row < m_rows;
    xsrc[c] = reinterpret_cast<const uint8_t*>(x + static_cast<int64_t>(min(row, m_rows - 1)) * k + lane * 8);
  }
  const int wbase = St::kX + warp * St::kWarpBytes, wrow = lane / kUnits, wunit = lane % kUnits;
  const int xdst = XshareKeep(warp * 512 + XshareXUnit(lane, warp) * 16);
  const int wdst = XshareKeep(wbase + wrow * CB + XshareWUnit<CB>(wunit, wrow) * 16);
  const int sdst = XshareKeep(wbase + St::kW + (lane & 15) * 16);
  const uint8_t* wsrc[kCodeCopies];
  const uint8_t* ssrc = nullptr;  // the row's scales (lanes 0-15)
  auto enter = [&](int group) {
    const int tile = group * W + warp;
#pragma unroll
    for (int c = 0; c < kCodeCopies; ++c) {
      const int row = min(tile * 16 + wrow + kCodeRowStep * c, n - 1);
      wsrc[c] = a.w + row * row_bytes + wunit * 16;
    }
    ssrc = a.scales + static_cast<int64_t>(min(tile * 16 + (lane & 15), n - 1)) * blocks * 2;
  };
  // Per window the scales of a row take 512 >> shift bytes from byte (w x that) of its row, within
  // one aligned 16-byte piece: a row's scales start at a multiple of that size (its windows x the
  // size), which divides 16.
  const int scale_step = 512 >> shift;
  int ig = begin / windows, iw = begin % windows;
  if (count > 0) enter(ig);
  // Copies window iw of the cursor's group into the stage at shared offset `stage`.
  auto issue = [&](int stage) {
    const uint32_t st = sbase + static_cast<uint32_t>(stage), w = static_cast<uint32_t>(iw);
#pragma unroll
    for (int c = 0; c < kXCopies; ++c)
      if (xcopy[c]) CpAsync16Shared(st + xdst + c * W * 512, xsrc[c] + w * (kXshareWin * 2));
#pragma unroll
    for (int c = 0; c < kCodeCopies; ++c) CpAsync16Shared(st + wdst + c * kCodeRowStep * CB, wsrc[c] + w * CB);
    if (lane < 16)
      CpAsync16Shared(st + sdst, reinterpret_cast<const uint8_t*>(
                                     reinterpret_cast<uintptr_t>(ssrc + w * scale_step) & ~uintptr_t{15}));
    if (++iw == windows) {
      iw = 0;
      if (++ig < groups) enter(ig);
    }
  };

  // This lane's reads of a stage: x row 8 mt + g's unit 16 l + 4 t + j sits at 16 l + 4 t + (j ^ xc);
  // code units (4 l + t) kC + c of rows g and g + 8 where XshareWUnit puts them.
  const int xc = ((t >> 1) << 1) ^ (g & 1);
  int xoff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) xoff[j] = XshareKeep(g * 512 + (4 * t + (j ^ xc)) * 16);
  int woff[2][kC];
#pragma unroll
  for (int l = 0; l < 2; ++l)
#pragma unroll
    for (int c = 0; c < kC; ++c) woff[l][c] = XshareKeep(wbase + g * CB + XshareWUnit<CB>((4 * l + t) * kC + c, g) * 16);
  // A row's piece of scales starts (row x blocks x 2) mod 16 bytes in (the tile's first row's is 0
  // mod 16: 16 rows x blocks x 2 bytes), and the window's at (w x scale_step) mod 16 from there.
  const int srow_g = static_cast<int>((g * blocks * 2) & 15), srow_g8 = static_cast<int>(((g + 8) * blocks * 2) & 15);
  const int sbase_g = XshareKeep(wbase + St::kW + g * 16);
  // The chunk of half l holds values 128 l + 32 t ..: its scale is (128 l + 32 t) >> shift of the window's.
  const int sidx0 = (32 * t) >> shift, sidx1 = (128 + 32 * t) >> shift;

  // 0x000F000F and the magic, in registers (XshareDecodePair4): N and K are never negative.
  const uint32_t mask = 0x000F000Fu | (static_cast<uint32_t>(n) >> 31);
  const uint32_t magic = XshareMagic<BITS, T>() | static_cast<uint32_t>(k >> 62);
  // 4-bit codes at one m-tile: a unit's second mma goes to a second accumulator set, added in at
  // the flush, so that a window's sixteen mmas are two dependent chains of eight instead of one
  // (91 registers instead of 83, the same five blocks per SM; on an H200 up to 2.6% faster in 21
  // of 24 pairs over four shapes at M = 2-8, level in two, 0.5% behind in one: perf log 172).
  // Two m-tiles have their two chains already; 8-bit codes at one m-tile were not timed with it.
  constexpr int kChains = BITS == 4 && MT == 1 ? 2 : 1;
  float acc[MT][4] = {}, acc2[MT][4] = {};
  int cg = ig, cw = iw;  // the computing cursor
  // This warp's sums of its tile, for the rows within M, added into the scratch result.
  auto flush = [&] {
    float* col = sums + (cg * W + warp) * 16 + g;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mt * 8 + 2 * t;
      if constexpr (kChains == 2) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][e] += acc2[mt][e], acc2[mt][e] = 0.0f;
      }
      if (m < m_rows) atomicAdd(col + m * sum_cols, acc[mt][0]), atomicAdd(col + m * sum_cols + 8, acc[mt][2]);
      if (m + 1 < m_rows)
        atomicAdd(col + (m + 1) * sum_cols, acc[mt][1]), atomicAdd(col + (m + 1) * sum_cols + 8, acc[mt][3]);
      acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
    }
  };

#pragma unroll
  for (int p = 0; p < S - 1; ++p) {
    if (p < count) issue(p * St::kBytes);
    CpAsyncCommit();
  }
  // Stages by shared offset: step i computes on `cstage` (stage i mod S) and copies step i + S - 1
  // into `istage` (stage i - 1 mod S, which step i - 1 computed on).
  int cstage = 0, istage = (S - 1) * St::kBytes;
  for (int i = 0; i < count; ++i) {
    CpAsyncWait<S - 2>();
    __syncthreads();  // step i landed for every thread's copies; step i - 1's stage is free
    if (i + S - 1 < count) issue(istage);
    CpAsyncCommit();

    const uint8_t* st = smem + cstage;
    const int swin = (cw * scale_step) & 15;
    const T* sca = reinterpret_cast<const T*>(st + sbase_g + ((srow_g + swin) & 15));
    const T* scb = reinterpret_cast<const T*>(st + sbase_g + 8 * 16 + ((srow_g8 + swin) & 15));
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      // Rows g and g + 8: this lane's 32 codes of half l (within one scale block) and their scale.
      uint32_t wa[BITS], wb[BITS];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const uint4 qa = *reinterpret_cast<const uint4*>(st + woff[l][c]);
        const uint4 qb = *reinterpret_cast<const uint4*>(st + woff[l][c] + 8 * CB);
        wa[4 * c] = qa.x, wa[4 * c + 1] = qa.y, wa[4 * c + 2] = qa.z, wa[4 * c + 3] = qa.w;
        wb[4 * c] = qb.x, wb[4 * c + 1] = qb.y, wb[4 * c + 2] = qb.z, wb[4 * c + 3] = qb.w;
      }
      const auto sa = Act<T>::Splat(sca[l ? sidx1 : sidx0]);
      const auto sb = Act<T>::Splat(scb[l ? sidx1 : sidx0]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // x's unit j: values 8 j .. 8 j + 7 of the lane's 32
        uint32_t pa[4], pb[4];
        XshareDecodeUnit<BITS, T>(wa, j, mask, magic, sa, pa);
        XshareDecodeUnit<BITS, T>(wb, j, mask, magic, sb, pb);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint4 xv = *reinterpret_cast<const uint4*>(st + xoff[j] + mt * 8 * 512 + l * 256);
          // The unit's first two pairs in one mma, its last two in the next: slots 2t, 2t + 1
          // carry the first pair of each, slots 2t + 8, 2t + 9 the second, in A and B alike.
          Mma16816<T>(acc[mt], pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
          Mma16816<T>(kChains == 2 ? acc2[mt] : acc[mt], pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
        }
      }
    }
    if (++cw == windows || i + 1 == count) {
      flush();
      if (cw == windows) cw = 0, ++cg;
    }
    istage = cstage;
    cstage = cstage == (S - 1) * St::kBytes ? 0 : cstage + St::kBytes;
  }
}

// y [M, N] from the sums: the epilogue (row scale, bias, residual) in float32, rounded once to T.
template <typename T>
__global__ void __launch_bounds__(256) XshareStoreKernel(GemvArgs a, const float* __restrict__ sums, int64_t sum_cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * 256 + threadIdx.x;
  if (i >= static_cast<int64_t>(a.m) * a.n) return;
  const int m = static_cast<int>(i / a.n), n = static_cast<int>(i % a.n);
  static_cast<T*>(a.y)[i] = Act<T>::FromFloat(Epilogue<T>(sums[m * sum_cols + n], a, m, n));
}

}  // namespace jaxgemv
