// How int4 / int8 weights in ONNX Runtime's MatMulNBits layout decode on the GPU: the format
// policy for the tensor-core GEMV of ffi/gemv_core.cuh.
//
// Bytes: packed [N, blocks, bs x BITS / 8] (a row is blocks x bs values, the last block padded),
// 4-bit codes low nibble first; scales [N, blocks] in the activations' type; zero points packed
// like the codes [N, ceil(blocks x BITS / 8)], or none (2^(BITS-1)). value = (q - zp) x scale.
#pragma once

#include "cuda_util.cuh"
#include "gemv_core.cuh"

namespace jaxgemv {

// A code q as a 16-bit float "magic + q" by writing it under a fixed exponent: fp16 0x6400 is
// 1024 with a spacing of 1 up to 2047, bf16 0x4300 is 128 with a spacing of 1 up to 255. So
// (magic + q) - (magic + zp) is the exact integer q - zp, and one multiply by the scale rounds
// once, as the reference does. 8-bit codes do not fit bf16's 128..255, so they go through fp16.
template <typename T>
struct NbitsMagic;
template <>
struct NbitsMagic<__half> {
  static constexpr uint32_t kByte = 0x64;  // high byte of 1024 in fp16
};
template <>
struct NbitsMagic<__nv_bfloat16> {
  static constexpr uint32_t kByte = 0x43;  // high byte of 128 in bf16
};

template <int BITS>
struct Nbits : NoStagedScales {
  static_assert(BITS == 4 || BITS == 8, "4 or 8 bits");
  static constexpr int kValuesPerChunk = 128 / BITS;  // 16 bytes
  static constexpr int kWords = kValuesPerChunk / 8;  // 8 values each
  static constexpr bool kAccumulatorScales = false;   // scales fold into the 16-bit weight
  static constexpr bool kGlobalChunkScales = true;    // read per chunk, not staged

  // Per row, per chunk: the scales and (magic + zero point) of the blocks the chunk touches, as
  // pairs of T: low half for words 0..kWords/2-1, high half for the rest (two 16-value blocks of
  // a 4-bit chunk), the same block in both halves otherwise.
  template <typename T>
  struct Prep {
    uint32_t scales, bias;
  };

  __device__ static __forceinline__ int64_t Blocks(int64_t k, int shift) { return (k + (int64_t{1} << shift) - 1) >> shift; }
  __device__ static __forceinline__ int64_t RowBytes(int64_t k, int shift) { return (Blocks(k, shift) << shift) * BITS / 8; }
  __device__ static __forceinline__ int ByteOffset(int k) { return k * BITS / 8; }
  __device__ static __forceinline__ int64_t ScaleRowBytes(int64_t k, int shift) { return 2 * Blocks(k, shift); }
  // Zero point of block b of a row (packed zero points, or the implied 2^(BITS-1)).
  __device__ static __forceinline__ uint32_t ZeroPoint(const uint8_t* zrow, int64_t b) {
    if (zrow == nullptr) return 1u << (BITS - 1);
    if constexpr (BITS == 8) {
      return __ldg(zrow + b);
    } else {
      const uint32_t byte = __ldg(zrow + (b >> 1));
      return (b & 1) ? (byte >> 4) : (byte & 15);
    }
  }

  // The 16-bit float (magic + zp), in T's own magic for 4-bit codes, in fp16's for 8-bit ones.
  template <typename T>
  __device__ static __forceinline__ uint32_t Bias16(uint32_t zp) {
    constexpr uint32_t magic = (BITS == 8 ? NbitsMagic<__half>::kByte : NbitsMagic<T>::kByte) << 8;
    return magic | zp;
  }

  // The scales and zero points of a window of kWin values from k0, for one row: prefetched into
  // L1 when the window's weights are issued (kMmaStages - 1 windows ahead of their use), so that
  // LoadChunkPrep's loads hit L1 instead of waiting on DRAM at the start of each row's tile.
  __device__ static __forceinline__ void PrefetchWindowScales(const GemvArgs& a, int row, int k0, int kWin) {
    const int shift = a.scale_shift;
    const int64_t blocks = Blocks(a.k, shift);
    const int64_t first = k0 >> shift, last = (k0 + kWin - 1) >> shift;
    const unsigned short* srow = reinterpret_cast<const unsigned short*>(a.scales) + row * blocks;
    PrefetchL1(srow + first);
    if (((reinterpret_cast<uintptr_t>(srow + first) ^ reinterpret_cast<uintptr_t>(srow + last)) >> 7) != 0)
      PrefetchL1(srow + last);  // the window's scales cross a 128-byte line
    if (a.zero_points) PrefetchL1(a.zero_points + row * ((blocks * BITS + 7) / 8) + first * BITS / 8);
  }

  template <typename T>
  __device__ static __forceinline__ Prep<T> LoadChunkPrep(const GemvArgs& a, int row, int k) {
    const int shift = a.scale_shift;
    const int64_t blocks = Blocks(a.k, shift);
    const unsigned short* srow = reinterpret_cast<const unsigned short*>(a.scales) + row * blocks;
    const uint8_t* zrow = a.zero_points ? a.zero_points + row * ((blocks * BITS + 7) / 8) : nullptr;
    const int64_t b0 = k >> shift;
    // A 4-bit chunk spans 32 values: two blocks when they are 16 wide.
    const int64_t b1 = (BITS == 4 && shift == 4) ? b0 + 1 : b0;
    Prep<T> p;
    p.scales = static_cast<uint32_t>(__ldg(srow + b0)) | (static_cast<uint32_t>(__ldg(srow + b1)) << 16);
    p.bias = Bias16<T>(ZeroPoint(zrow, b0)) | (Bias16<T>(ZeroPoint(zrow, b1)) << 16);
    return p;
  }

  // pairs[j] = (value 8W + j, value 8W + j + 4) of the chunk, (q - zp) x scale in T.
  template <typename T, int W>
  __device__ static __forceinline__ void DecodeWord(const uint4& raw, const Prep<T>& prep, uint32_t (&pairs)[4]) {
    using T2 = typename Act<T>::T2;
    const bool high = W >= kWords / 2;
    uint32_t h[4];  // (magic + q) pairs, as 16-bit floats (fp16 for 8-bit codes)
    if constexpr (BITS == 4) {
      const uint32_t q = W == 0 ? raw.x : W == 1 ? raw.y : W == 2 ? raw.z : raw.w;
      const uint32_t even = q & 0x0f0f0f0fu, odd = (q >> 4) & 0x0f0f0f0fu;  // values 0 2 4 6, 1 3 5 7
      constexpr uint32_t m = NbitsMagic<T>::kByte;
      h[0] = __byte_perm(even, m, 0x4240);  // values 0, 4
      h[1] = __byte_perm(odd, m, 0x4240);   // 1, 5
      h[2] = __byte_perm(even, m, 0x4341);  // 2, 6
      h[3] = __byte_perm(odd, m, 0x4341);   // 3, 7
    } else {
      const uint32_t q0 = W == 0 ? raw.x : raw.z, q1 = W == 0 ? raw.y : raw.w;  // values 0-3, 4-7
#pragma unroll
      for (int j = 0; j < 4; ++j)  // byte 0 <- q0 byte j, byte 2 <- q1 byte j (selector nibbles 0, 2)
        h[j] = (__byte_perm(q0, q1, j | ((4 + j) << 8)) & 0x00ff00ffu) | 0x64006400u;
    }
    const uint32_t bias = high ? (prep.bias >> 16) * 0x10001u : (prep.bias & 0xffffu) * 0x10001u;
    const T2 scale = high ? Act<T>::High(FromU32<T2>(prep.scales)) : Act<T>::Low(FromU32<T2>(prep.scales));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (BITS == 8 && std::is_same_v<T, __nv_bfloat16>) {
        // q - zp exactly in fp16, then to bf16 (|q - zp| <= 255 fits bf16's 8 bits exactly).
        const __half2 v = __hsub2(FromU32<__half2>(h[j]), FromU32<__half2>(bias));
        pairs[j] = AsU32(__hmul2(__float22bfloat162_rn(__half22float2(v)), scale));
      } else {
        pairs[j] = AsU32(__hmul2(__hsub2(FromU32<T2>(h[j]), FromU32<T2>(bias)), scale));
      }
    }
  }
};

}  // namespace jaxgemv
