// How FP8 (E4M3) block-scaled weights decode on the GPU: the format policy for the tensor-core
// GEMV of ffi/gemv_core.cuh, and the CUDA-core GEMV for the shapes that kernel does not take.
//
// Bytes: data [N, K] holds one E4M3 code per value; the kernel takes the block scales as float32
// per row, [N, ceil(K / bk)] (jaxgemv/fp8.py expands 128 x 128 blocks to rows), bk a power of two
// and a multiple of 64, so that a chunk of 4 lanes x 16 values never straddles two blocks.
// value = e4m3 x scale.
#pragma once

#include "common.h"
#include "cuda_util.cuh"
#include "gemv_core.cuh"

namespace jaxgemv {

// E4M3 -> fp16/bf16 by moving bits: the code's 7 magnitude bits s|eeee|mmm placed under a 16-bit
// float's exponent's low bits give value x 2^-8 in fp16 (bias 15 against 7) and value x 2^-120 in
// bf16 (bias 127), subnormal codes included (they land on 16-bit subnormals the same way). Per
// pair of codes: a byte permute, a shift and a mask-merge. fp16 goes to the mma as it is: its
// products with fp16 x are exact float32 numbers (at least 2^-17 x 2^-24), and the 2^8 joins the
// epilogue's multiplier (Fp8E4m3::Unit). bf16's 2^-120 would put the products of small x below
// float32's normal range, so bf16 pairs take one exact multiply by 2^120 on the FMA pipe first.
//
// sm_89 and later also convert a pair of E4M3 codes to an fp16 pair in one instruction (cvt.rn.
// f16x2.e4m3x2, exact: every E4M3 value is an fp16 normal): for fp16 a byte permute gathers two
// pairs' codes and two conversions widen them, 1.5 instructions a pair instead of 3, and the values
// come out as they are (unit 1). It is FP8's second decode (DecodeWord's CVT, gemv_core.cuh:
// kAltDecode), taken by the K-split kernels: on an H200 they ran 2-11% faster with it (12288 x
// 4096 at M = 4 / 8 0.3-0.7 us slower), where the one-warp-per-tile kernel of the lm_heads ran
// 2-6% slower at M = 4 and 8 (docs/perf-log.md, entry 107). NaN codes (0x7f, 0xff) become NaN
// there, as XLA's dequantize makes them, where the bit moves give +-480.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define JAXGEMV_E4M3_CVT 1
#else
#define JAXGEMV_E4M3_CVT 0
#endif
template <typename T>
struct E4m3Bits;
template <>
struct E4m3Bits<__half> {
  static constexpr int kShift = 1;            // code at bits 8..15 -> magnitude at bits 7..13
  static constexpr uint32_t kMask = 0x3f803f80u;
  static constexpr float kUnit = 256.0f;      // 2^8, in the epilogue
};
template <>
struct E4m3Bits<__nv_bfloat16> {
  static constexpr int kShift = 4;            // code at bits 8..15 -> magnitude at bits 4..10
  static constexpr uint32_t kMask = 0x07f007f0u;
  static constexpr float kUnit = 1.0f;
  __device__ static __forceinline__ __nv_bfloat162 Rescale() {
    return __bfloat162bfloat162(__ushort_as_bfloat16(0x7b80));  // 2^120
  }
};

struct Fp8E4m3 {
  // Whether a decode asked for the pair conversion (CVT) gets it: on this architecture, for fp16.
  template <typename T, bool CVT>
  __device__ static constexpr bool PairCvt() {
    return CVT && JAXGEMV_E4M3_CVT && std::is_same_v<T, __half>;
  }
  // The epilogue's multiplier that takes the decoded values back to values.
  template <typename T, bool CVT = false>
  __device__ static constexpr float Unit() {
    return PairCvt<T, CVT>() ? 1.0f : E4m3Bits<T>::kUnit;
  }
  // A 16-byte chunk of a row holds 16 consecutive values.
  static constexpr int kValuesPerChunk = 16;
  // Scales are float32 and arbitrary: folded into a 16-bit weight they would round, so they
  // multiply the float32 products of each chunk instead (gemv_core.cuh).
  static constexpr bool kAccumulatorScales = true;
  static constexpr bool kStagedPrep = false;
  // M = 2-8 with x from global memory: x loaded a chunk ahead (gemv_core.cuh, load_x).
  static constexpr bool kXAhead = true;
  static constexpr bool kXTwoBuffers = false;  // gemv_core.cuh, load_x (two untimed)
  // x's next-window load under a branch in every instance (gemv_core.cuh, load_x; without it, bf16
  // x lost 3-6% at M = 2-16 on an H200, docs/perf-log.md, entry 157).
  template <int MT, int LOADS>
  __device__ static constexpr bool XNextUnbranched() {
    return false;
  }
  // The launcher's rules for this format: K split 6, half the K split and FP8's K split 8 at M = 1
  // (common.h: MmaKSplit6, MmaHalvesKSplit, MmaKSplit8PastOneWave).
  static constexpr MmaFormat kMmaFormat = MmaFormat::kFp8;
  // x in fragment order unpadded at M < 8 (Nvfp4::kCompactX): on an H200 (docs/perf-log.md, entry
  // 126, fp16 x) 8192 x 28672 at M = 2-8 66.3-66.5 -> 63.5-63.7 us, 17408 x 5120 at M = 2 / 4
  // 34.5 / 34.9 -> 32.6 / 32.6, the 248k-row lm_head at M = 1-4 2.3-2.6 us faster.
  static constexpr bool kCompactX = true;
  // No block columns (nothing for kColumnsWherePlanned to restrict), and no register bound on the
  // two-m-tile instance for more blocks per SM: under it ptxas spilled (gemv_core.cuh).
  static constexpr bool kColumnsWherePlanned = false;
  static constexpr bool kBoundTwoTiles = false;
  template <typename T>
  using Prep = uint32_t;  // unused
  // Two words of 8 values per chunk (the word is 8 bytes: two registers).
  static constexpr int kWords = 2;

  // A window's scales for one row, staged in the ring beside its weights: the float of each
  // block the window touches, the window's first block first. A window is 64 x LOADS values and a
  // block at least 64, so that is at most LOADS floats (two only for 64-value blocks at LOADS = 2).
  // Read per chunk from global memory instead, they were the kernel's second stall (20% of the
  // samples on down_proj 5120 x 17408, Nsight Compute at bed1afa).
  template <int LOADS>
  __device__ __host__ static constexpr int WindowScaleBytes() {
    return 4 * LOADS;
  }
  template <int LOADS>
  __device__ static __forceinline__ void CopyWindowScales(uint8_t* dst, const uint8_t* scale_row, uint32_t k0, int shift) {
    const float* src = reinterpret_cast<const float*>(scale_row) + (k0 >> shift);
    CpAsyncCa<4>(dst, src);
    if (LOADS == 2 && shift == 6) CpAsyncCa<4>(dst + 4, src + 1);
  }
  // The scale of chunk l (values k0 + 64 l ...) of row r.
  template <int LOADS>
  __device__ static __forceinline__ float ChunkScale(const uint8_t* stage_scales, int r, int l, int k0, int shift) {
    const int i = ((k0 + 64 * l) >> shift) - (k0 >> shift);
    return reinterpret_cast<const float*>(stage_scales + r * WindowScaleBytes<LOADS>())[i];
  }

  __device__ static __forceinline__ int64_t RowBytes(int64_t k, int /*scale_shift*/) { return k; }
  __device__ static __forceinline__ int64_t ScaleRowBytes(int64_t k, int scale_shift) {
    return 4 * ((k + (int64_t{1} << scale_shift) - 1) >> scale_shift);
  }
  // pairs[j] = (value 8W + j, value 8W + j + 4) of the chunk, in units of Unit<T, CVT>().
  template <typename T, int W, bool CVT = false>
  __device__ static __forceinline__ void DecodeWord(const uint4& raw, uint32_t /*scales*/, uint32_t (&pairs)[4]) {
    using T2 [[maybe_unused]] = typename Act<T>::T2;
    const uint32_t q0 = W == 0 ? raw.x : raw.z, q1 = W == 0 ? raw.y : raw.w;  // values 0-3, 4-7
    if constexpr (PairCvt<T, CVT>()) {
#if JAXGEMV_E4M3_CVT
#pragma unroll
      for (int j = 0; j < 4; j += 2) {
        // Bytes (code j of q0, code j of q1, code j + 1 of q0, code j + 1 of q1): pair j in the
        // low 16 bits, pair j + 1 in the high; each converts low byte to low half.
        const uint32_t u = __byte_perm(q0, q1, j | ((4 + j) << 4) | ((j + 1) << 8) | ((5 + j) << 12));
        asm("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\t"
            "cvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;\n\t}"
            : "=r"(pairs[j]), "=r"(pairs[j + 1])
            : "r"(u));
      }
#endif
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // Code j of q0 to byte 1, code j of q1 to byte 3 (bytes 0 and 2 are masked off below).
        const uint32_t u = __byte_perm(q0, q1, (j << 4) | ((4 + j) << 12));
        const uint32_t bits = ((u >> E4m3Bits<T>::kShift) & E4m3Bits<T>::kMask) | (u & 0x80008000u);
        if constexpr (std::is_same_v<T, __half>) {
          pairs[j] = bits;
        } else {
          pairs[j] = AsU32(__hmul2(FromU32<T2>(bits), E4m3Bits<T>::Rescale()));
        }
      }
    }
  }
};

// CUDA-core GEMV for the FP8 products the tensor-core kernel does not take (K blocks of 32 values,
// K a multiple of 16 but not of 64): one warp per output column, each lane
// reading 16 codes (one 16-byte load, inside one scale block since blocks are powers of two of at
// least 16 values) per step, so a warp reads 512 contiguous bytes per instruction. The codes are
// widened to float32 once per step and the widened values serve the block's R rows of x (the
// widening hoisted out of the row loop); each row's 16 products are summed in float32 and the
// piece's float32 scale multiplies the sum, so the scale never rounds to 16 bits. The grid's y
// dimension covers the rows past R.
template <typename T, int R>
__global__ void __launch_bounds__(32 * kScalarWarps) Fp8ScalarGemvKernel(GemvArgs a) {
  const auto [lane, n, m0] = WarpColumn<R>{};
  if (n >= a.n) return;
  const int64_t pieces = a.k / 16;
  const uint8_t* wrow = a.w + static_cast<int64_t>(n) * a.k;
  const float* srow = reinterpret_cast<const float*>(a.scales + static_cast<int64_t>(n) * Fp8E4m3::ScaleRowBytes(a.k, a.scale_shift));

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

#pragma unroll 2
  for (int64_t p = lane; p < pieces; p += 32) {
    const uint4 raw = LoadOnce16(wrow + p * 16);
    const float scale = __ldg(srow + ((p * 16) >> a.scale_shift));
    // Value 8W + j in wf[8W + j], in units of 2^-8 (E4m3Bits<__half>: exact in fp16 and float32).
    float wf[16];
    StaticFor<2>([&](auto word) {
      constexpr int kW = decltype(word)::value;
      uint32_t pairs[4];
      Fp8E4m3::DecodeWord<__half, kW>(raw, 0u, pairs);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(FromU32<__half2>(pairs[j]));
        wf[8 * kW + j] = f.x, wf[8 * kW + j + 4] = f.y;
      }
    });
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (m0 + r >= a.m) break;
      const uint4* xp = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + static_cast<int64_t>(m0 + r) * a.k + p * 16);
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const uint4 v = LoadKeep16(xp + w);
        const T* xv = reinterpret_cast<const T*>(&v);
#pragma unroll
        for (int i = 0; i < 8; ++i) sum = fmaf(wf[8 * w + i], Act<T>::ToFloat(xv[i]), sum);
      }
      acc[r] = fmaf(sum, scale, acc[r]);
    }
  }

  StoreWarpColumn<T, R>(acc, a, n, m0, lane, E4m3Bits<__half>::kUnit);
}

}  // namespace jaxgemv
