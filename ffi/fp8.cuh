// How FP8 (E4M3) block-scaled weights decode on the GPU: the format policy for the tensor-core
// GEMV of ffi/gemv_core.cuh.
//
// Bytes: data [N, K] holds one E4M3 code per value; the kernel takes the block scales as float32
// per row, [N, ceil(K / bk)] (jaxgemv/fp8.py expands 128 x 128 blocks to rows), bk a power of two
// and a multiple of 64, so that a chunk of 4 lanes x 16 values never straddles two blocks.
// value = e4m3 x scale.
#pragma once

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

struct Fp8E4m3 : UnitFrom<E4m3Bits> {
  // A 16-byte chunk of a row holds 16 consecutive values.
  static constexpr int kValuesPerChunk = 16;
  // Scales are float32 and arbitrary: folded into a 16-bit weight they would round, so they
  // multiply the float32 products of each chunk instead (gemv_core.cuh).
  static constexpr bool kAccumulatorScales = true;
  static constexpr bool kStagedPrep = false;
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
  // pairs[j] = (value 8W + j, value 8W + j + 4) of the chunk, in units of E4m3Bits<T>::kUnit.
  template <typename T, int W>
  __device__ static __forceinline__ void DecodeWord(const uint4& raw, uint32_t /*scales*/, uint32_t (&pairs)[4]) {
    using T2 [[maybe_unused]] = typename Act<T>::T2;
    const uint32_t q0 = W == 0 ? raw.x : raw.z, q1 = W == 0 ? raw.y : raw.w;  // values 0-3, 4-7
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
};

}  // namespace jaxgemv
