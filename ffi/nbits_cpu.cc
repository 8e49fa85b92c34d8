// int4 / int8 (ONNX Runtime MatMulNBits layout) handler for the CPU platform; the contract of
// jaxgemv/nbits.py in plain C++, for CI and machines without a GPU; threaded over output rows.
//
// x [M, K] fp16/bf16; packed u8 [N, blocks, bs * bits / 8]; scales [N, blocks] in x's type;
// zero points u8 [N, ceil(blocks * bits / 8)] packed like the codes, or [0] (2^(bits-1));
// bias [N] or [0]; row scale [M] or [0]; residual [M, N] or [0]; y [M, N]. value = (q - zp) x scale,
// exact in float32.

#include <algorithm>
#include <cstdint>

#include "common.h"
#include "cpu_types.h"
#include "handlers.h"

namespace jaxgemv {
namespace {

// Code i of a row of codes packed at kBits per value (4: low nibble first).
template <int kBits>
inline int Code(const uint8_t* p, int64_t i) {
  if constexpr (kBits == 8) {
    return p[i];
  } else {
    const uint8_t b = p[i >> 1];
    return (i & 1) ? (b >> 4) : (b & 15);
  }
}

// Row r of the weight in float32, a block at a time: (q - zero point) x scale.
template <int kBits>
void DecodeRow(const uint8_t* codes, const uint8_t* zps, const void* scales, int64_t r, int64_t blocks,
               int64_t block_size, int64_t k, ffi::DataType dtype, float* row) {
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int zero = zps ? Code<kBits>(zps, blk) : (1 << (kBits - 1));
    const float scale = LoadAct(scales, r * blocks + blk, dtype);
    const int64_t end = std::min(k, (blk + 1) * block_size);
    for (int64_t kk = blk * block_size; kk < end; ++kk)
      row[kk] = static_cast<float>(Code<kBits>(codes, kk) - zero) * scale;
  }
}

ffi::Error NbitsMatmulCpu(ffi::AnyBuffer x, ffi::AnyBuffer packed, ffi::AnyBuffer scales, ffi::AnyBuffer zp,
                          ffi::AnyBuffer bias, ffi::AnyBuffer row_scale, ffi::AnyBuffer residual,
                          ffi::Result<ffi::AnyBuffer> y, int64_t variant, int64_t rows,
                          int64_t ksplit, int64_t loads, int64_t xperm, int64_t xs_warps, int64_t x_stage, float rms_eps,
                          float rms_inv_k, int64_t activation, int64_t bits, int64_t block_size,
                          int64_t has_zp) {
  if (variant != static_cast<int64_t>(Variant::kCpu)) return Invalid("the CPU handler runs only the 'cpu' variant");
  if (xperm || xs_warps) return Invalid("the CPU handler takes x in natural order, from global memory");
  (void)rows, (void)ksplit, (void)loads;
  ProductShape s;
  if (auto err = CheckNbitsMatmul(x, packed, scales, zp, bias, *y, bits, block_size, has_zp, &s, 1, activation);
      err.failure())
    return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  const int64_t blocks = (s.k + block_size - 1) / block_size, zp_cols = (blocks * bits + 7) / 8;
  const int64_t row_bytes = blocks * block_size * bits / 8;
  const auto* p = static_cast<const uint8_t*>(packed.untyped_data());
  const auto* z = static_cast<const uint8_t*>(zp.untyped_data());
  RowByRowProduct(x.untyped_data(), bias.untyped_data(), row_scale.untyped_data(), residual.untyped_data(),
                  y->untyped_data(), s, [&](int64_t r, float* row) {
    const uint8_t* codes = p + r * row_bytes;
    const uint8_t* zps = has_zp ? z + r * zp_cols : nullptr;
    if (bits == 8) {
      DecodeRow<8>(codes, zps, scales.untyped_data(), r, blocks, block_size, s.k, s.dtype, row);
    } else {
      DecodeRow<4>(codes, zps, scales.untyped_data(), r, blocks, block_size, s.k, s.dtype, row);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvNbitsMatmulCpu, jaxgemv::NbitsMatmulCpu,
                              jaxgemv::BindNbitsMatmul(xla::ffi::Ffi::Bind()));
