// How NVFP4 weights decode on the GPU: the format policy that ffi/gemv_core.cuh is built on.
//
// Bytes: packed [N, K/2] holds E2M1 codes, k = 2i in the low nibble of byte i and k = 2i + 1 in
// its high nibble; scales [N, K/16] are E4M3; value = e2m1 x scale x global_scale.
#pragma once

#include "common.h"
#include "cuda_util.cuh"

namespace jaxgemv {

// E2M1 -> fp16/bf16 by moving bits, no lookup table. An E2M1 code is s e1 e0 m. Placed with
// e1 e0 in the two lowest exponent bits and m in the top mantissa bit of a 16-bit float, every
// code decodes to its value times a constant: fp16 (mantissa 10 bits, bias 15) gives
// 2^(e-15) (1 + m/2) = value x 2^-14 for e > 0, and for e = 0 the fp16 subnormal m x 2^-15 =
// (m / 2) x 2^-14 too. bf16 (mantissa 7 bits, bias 127) gives value x 2^-126 the same way.
// The constant is folded into the epilogue (kUnit below).
//
// Pairs: one 32-bit word holds 8 codes (nibbles 0..7), and an mma operand register holds two
// 16-bit values. Codes j and j + 4 are paired: in the byte planes below they sit two bytes
// apart, so one byte permute moves both into place. K is a reduction axis, so any pairing is
// legal as long as x is paired the same way (XPairs in gemv_core.cuh).
template <typename T>
struct E2m1Bits;
template <>
struct E2m1Bits<__half> {
  static constexpr float kUnit = 16384.0f;  // 2^14
};
template <>
struct E2m1Bits<__nv_bfloat16> {
  // The bf16 decode is value x 2^-126; the scale is pre-multiplied by 2^100 (see ScalePair),
  // so the folded weight is value x scale x 2^-26, a normal bf16 for every code and scale.
  static constexpr float kUnit = 67108864.0f;  // 2^26
};

// The eight codes of a word as four pairs (j, j + 4), built a byte plane at a time: first the
// byte that each code contributes to its 16-bit float, for the even nibbles (0, 2, 4, 6: one per
// byte of the word, at bits 0-3) and the odd ones (bits 4-7) separately, then one byte
// permutation per pair places two of those bytes, with zero bytes between them.
//
// The decode is the kernel's main integer work: Nsight Compute put the integer/logic (ALU) pipe,
// which retires a warp instruction every other cycle, at 70% on lm_head with shifts and masks
// building these planes, and at 57% with this form and x handed over pre-paired (perf log). For fp16
// the even plane's shifts are multiplies (IMAD.SHL, on the FMA pipe), the odd plane's a shift: 9
// ALU and 2 IMAD per 8 codes, where shifting and masking each pair directly takes 16 ALU. An IMAD
// costs a window about what an ALU instruction does and IMAD.HI 2.3 times that (perf log, entry
// 117): the multiplies save nothing over shifts (the even plane keeps them, untimed either way),
// and the high word of one costs more than the shift it stood for.
template <typename T>
__device__ __forceinline__ void E2m1Pairs(uint32_t q, uint32_t (&p)[4]);

template <>
__device__ __forceinline__ void E2m1Pairs<__half>(uint32_t q, uint32_t (&p)[4]) {
  // fp16 high byte of a code: sign at bit 7, e1 e0 m at bits 3..1 (fp16 bits 15 and 11..9).
  // Even nibbles: magnitude x 2 plus sign (bit 3) x 16.
  const uint32_t even = (q & 0x07070707u) * 2u + (q & 0x08080808u) * 16u;
  // Odd nibbles: the sign is already at bit 7; the magnitude (bits 6..4) moves down 3. A shift:
  // the high word of a multiply (IMAD.HI) costs a window 2.3 times an integer-pipe instruction
  // (perf log, entry 117), though it runs on the FMA pipe.
  const uint32_t odd = ((q >> 3) & 0x0e0e0e0eu) | (q & 0x80808080u);
  p[0] = __byte_perm(even, 0, 0x2404);  // codes 0, 4
  p[1] = __byte_perm(odd, 0, 0x2404);   // codes 1, 5
  p[2] = __byte_perm(even, 0, 0x3414);  // codes 2, 6
  p[3] = __byte_perm(odd, 0, 0x3414);   // codes 3, 7
}

// Multipliers of the bf16 decode below, read from the constant bank (an operand of IMAD like an
// immediate) so that ptxas cannot turn them into shifts and adds on the integer pipe: 2^6 + 2^12,
// 2^2 + 2^8 (two copies of a nibble pair).
static __constant__ uint32_t kE2m1Bf16Mul[2] = {(1u << 6) + (1u << 12), (1u << 2) + (1u << 8)};

template <>
__device__ __forceinline__ void E2m1Pairs<__nv_bfloat16>(uint32_t q, uint32_t (&p)[4]) {
  // bf16 of a code: sign at bit 15, e1 e0 m at bits 8..6. Pair (j, j + 4) is nibbles j and j + 4,
  // 16 bits apart: masked, then multiplied by 2^(6 - 4j) + 2^(12 - 4j), which writes the nibble
  // once with its magnitude at bits 6-8 and once with its sign at bit 15 (the copies do not overlap,
  // so nothing carries), and masked again. Pairs 2 and 3 take the word moved down 8 bits first (a
  // shift: as the high word of a multiply by 2^24 it cost 2.3 times as much, perf log entry 117).
  // Per word 9 ALU and 4 IMAD, where byte planes and permutes took 12 ALU and 3 FMA-pipe ones.
  const uint32_t q8 = q >> 8;
  p[0] = ((q & 0x000f000fu) * kE2m1Bf16Mul[0]) & 0x81c081c0u;   // codes 0, 4
  p[1] = ((q & 0x00f000f0u) * kE2m1Bf16Mul[1]) & 0x81c081c0u;   // 1, 5
  p[2] = ((q8 & 0x000f000fu) * kE2m1Bf16Mul[0]) & 0x81c081c0u;  // 2, 6
  p[3] = ((q8 & 0x00f000f0u) * kE2m1Bf16Mul[1]) & 0x81c081c0u;  // 3, 7
}

// Two consecutive E4M3 scales (low byte first) as a pair of T. fp16 holds every E4M3 value
// exactly. The product of an E2M1 value (2 significant bits) and an E4M3 scale (4 bits) needs
// 6 bits, and in units of 2^-24 it is an integer (E2M1 values are multiples of 1/2, E4M3 of
// 2^-9, the decode adds 2^-14), so the fp16 product of decode and scale is exact, subnormals
// included. For bf16 the scale is taken times 2^100 (exact, at most 448 x 2^100 < 2^127) so that
// the product of the 2^-126-scaled decode lands in bf16's normal range, again exactly.
template <typename T>
__device__ __forceinline__ typename Act<T>::T2 ScalePair(uint32_t two_scales) {
  const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_scales), __NV_E4M3);
  const __half2 h = *reinterpret_cast<const __half2*>(&raw);
  if constexpr (std::is_same_v<T, __half>) {
    return h;
  } else {
    const float2 f = __half22float2(h);
    constexpr float k2p100 = 1.2676506002282294e30f;  // 2^100
    return __floats2bfloat162_rn(f.x * k2p100, f.y * k2p100);
  }
}

struct Nvfp4 : UnitFrom<E2m1Bits> {
  // A 16-byte chunk of a packed row holds 32 consecutive values and spans two scale blocks.
  static constexpr int kValuesPerChunk = 32;
  // The E4M3 block scales are folded into the decoded weight (exact, see ScalePair), staged with
  // the weight in shared memory (CopyWindowScales).
  static constexpr bool kAccumulatorScales = false;
  static constexpr bool kStagedPrep = false;
  // M = 2-8 with x from global memory: x loaded a chunk ahead (gemv_core.cuh, load_x).
  static constexpr bool kXAhead = true;
  // One x buffer (gemv_core.cuh, load_x: two lost 40% at M = 16).
  static constexpr bool kXTwoBuffers = false;
  // x's next-window load under a branch in every instance (gemv_core.cuh, load_x; without it,
  // within 2% at M = 2-8 and 4% slower at M = 16 on an H200, docs/perf-log.md, entry 157).
  template <int MT, int LOADS>
  __device__ static constexpr bool XNextUnbranched() {
    return false;
  }
  // The launcher's rules for this format: K split 6, half the K split and FP8's K split 8 at M = 1
  // (common.h: MmaKSplit6, MmaHalvesKSplit, MmaKSplit8PastOneWave).
  static constexpr MmaFormat kMmaFormat = MmaFormat::kNvfp4;
  // One m-tile of M < 8 rows reads x in fragment order unpadded, the pieces' stride a runtime
  // value (gemv_core.cuh, GemvArgs::x_lanes). On an H200 (docs/perf-log.md, entry 126, kernel us,
  // fp16 x) 8192 x 28672 at M = 2 / 4 went 41.5 / 42.3 -> 38.4 / 38.6, 12288 x 4096 and 17408 x
  // 5120 at M = 4 ~1 us faster; int4 lost 3.5-6 us on 8192 x 28672 (Nbits: false).
  static constexpr bool kCompactX = true;
  // Block columns in every instance, and no register bound on the two-m-tile instance for more
  // blocks per SM (gemv_core.cuh: kBlockCols, MmaGemvKernel's launch bounds).
  static constexpr bool kColumnsWherePlanned = false;
  static constexpr bool kBoundTwoTiles = false;
  template <typename T>
  using Prep = uint32_t;  // the chunk's two scales as a pair of T

  __device__ static __forceinline__ int64_t RowBytes(int64_t k, int /*scale_shift*/) { return k / 2; }
  __device__ static __forceinline__ int64_t ScaleRowBytes(int64_t k, int /*scale_shift*/) { return k / 16; }

  // A window's block scales for one row: LOADS chunks x 4 lanes x 2 scales, 8 x LOADS bytes
  // from value k0 (the window's first), copied to shared memory with one cp.async per row; the
  // row's four lanes then pick their own pair (ChunkScales). One 2-byte global load per chunk
  // and lane cost as many L1 wavefronts as a 16-byte weight load, for an eighth of the bytes.
  template <int LOADS>
  __device__ __host__ static constexpr int WindowScaleBytes() {
    return 8 * LOADS;
  }
  template <int LOADS>
  __device__ static __forceinline__ void CopyWindowScales(uint8_t* dst, const uint8_t* scale_row, uint32_t k0, int /*shift*/) {
    if constexpr (LOADS == 2) {
      CpAsync16(dst, scale_row + (k0 >> 4));
    } else {
      static_assert(LOADS == 1, "one or two chunks per lane and row");
      CpAsyncCa<8>(dst, scale_row + (k0 >> 4));
    }
  }
  // The two scales of chunk l of lane t for row r of the 16 (bytes 8l + 2t, 8l + 2t + 1 of the
  // row's window scales in a stage).
  template <int LOADS>
  __device__ static __forceinline__ uint32_t ChunkScales(const uint8_t* stage_scales, int r, int l, int t) {
    return *reinterpret_cast<const unsigned short*>(stage_scales + r * WindowScaleBytes<LOADS>() + 8 * l + 2 * t);
  }

  // A chunk is decoded one 32-bit word (8 values) at a time, to keep few registers live.
  static constexpr int kWords = 4;

  // The chunk's two block scales as a T pair, converted once per chunk.
  template <typename T>
  __device__ static __forceinline__ uint32_t PrepareScales(uint32_t two_scales) {
    return AsU32(ScalePair<T>(two_scales));
  }

  // pairs[j] = (value 8W + j, value 8W + j + 4) of the chunk, times its block scale (one decode:
  // ALT is ignored).
  template <typename T, int W, bool /*ALT*/ = false>
  __device__ static __forceinline__ void DecodeWord(const uint4& raw, uint32_t scales, uint32_t (&pairs)[4]) {
    using T2 = typename Act<T>::T2;
    uint32_t p[4];
    DecodeCodes<T, W>(raw, scales, p);
    // Words 0-1 are the first scale block, 2-3 the second; broadcast that scale to both halves
    // (the compiler folds the broadcast into the multiply's operand selector).
    const T2 s = W < 2 ? Act<T>::Low(FromU32<T2>(scales)) : Act<T>::High(FromU32<T2>(scales));
#pragma unroll
    for (int j = 0; j < 4; ++j) pairs[j] = AsU32(__hmul2(FromU32<T2>(p[j]), s));
  }

  // The same pairs without the block scale (value x 2^-14, see E2m1Bits). The chunk's prepared
  // scales come along as in every format's (int4 takes its zero points from them); unused here.
  template <typename T, int W>
  __device__ static __forceinline__ void DecodeCodes(const uint4& raw, uint32_t /*scales*/, uint32_t (&pairs)[4]) {
    E2m1Pairs<T>(W == 0 ? raw.x : W == 1 ? raw.y : W == 2 ? raw.z : raw.w, pairs);
  }

  // Block columns (gemv_core.cuh, M = 1): the mma's eight output columns hold the products of
  // eight scale blocks apart, and the scales multiply the float32 sums once per chunk instead of
  // every decoded pair (4 multiplies per word and row, 64 of the loop's 353 instructions per
  // window at M = 1, cuobjdump). fp16 only: its decode is value x 2^-14, whose products with x
  // are normal float32 numbers; bf16's is value x 2^-126, and its products with small x would
  // fall below float32's normal range, so bf16 keeps the scale in the weight (ScalePair).
  template <typename T>
  __device__ static constexpr bool BlockColumns() {
    return std::is_same_v<T, __half>;
  }
  // The chunk's two block scales as float32, first block in x, from the pair PrepareScales made
  // (words 0-1 of a chunk are its first block, 2-3 its second).
  template <typename T>
  __device__ static __forceinline__ float2 ColumnScales(uint32_t scales) {
    return __half22float2(FromU32<__half2>(scales));
  }

  // Scalar path: an 8-byte piece of a row (16 values, one scale block) decoded to fp16 pairs
  // whatever the activation type, since that path multiplies in fp32 (the fp16 decode and
  // scale product is exact, see above).
  __device__ static __forceinline__ void DecodeHalf8(uint2 raw, uint8_t scale, __half2 (&pairs)[8]) {
    const __half2 s = __low2half2(ScalePair<__half>(scale));
    uint32_t p[8];
    E2m1Pairs<__half>(raw.x, *reinterpret_cast<uint32_t(*)[4]>(p));
    E2m1Pairs<__half>(raw.y, *reinterpret_cast<uint32_t(*)[4]>(p + 4));
#pragma unroll
    for (int i = 0; i < 8; ++i) pairs[i] = __hmul2(FromU32<__half2>(p[i]), s);
  }
};

}  // namespace jaxgemv
