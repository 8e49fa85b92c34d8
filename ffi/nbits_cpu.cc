// int4 / int8 (ONNX Runtime MatMulNBits layout) handler for the CPU platform; the contract of
// jaxgemv/nbits.py in plain C++, for CI and machines without a GPU; right, not fast.
//
// x [M, K] fp16/bf16; packed u8 [N, blocks, bs * bits / 8]; scales [N, blocks] in x's type;
// zero points u8 [N, ceil(blocks * bits / 8)] packed like the codes, or [0] (2^(bits-1));
// bias [N] or [0]; y [M, N]. value = (q - zp) x scale, exact in float32.

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"
#include "cpu_types.h"
#include "handlers.h"

namespace jaxgemv {
namespace {

// Code i of a row of codes packed at `bits` per value (4: low nibble first).
inline int Code(const uint8_t* p, int64_t i, int64_t bits) {
  if (bits == 8) return p[i];
  const uint8_t b = p[i / 2];
  return (i & 1) ? (b >> 4) : (b & 15);
}

ffi::Error NbitsMatmulCpu(ffi::AnyBuffer x, ffi::AnyBuffer packed, ffi::AnyBuffer scales, ffi::AnyBuffer zp,
                          ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y, int64_t variant, int64_t rows,
                          int64_t ksplit, int64_t loads, int64_t xperm, int64_t bits, int64_t block_size,
                          int64_t has_zp) {
  if (variant != static_cast<int64_t>(Variant::kCpu)) return Invalid("the CPU handler runs only the 'cpu' variant");
  if (xperm) return Invalid("the CPU handler takes x in natural order");
  (void)rows, (void)ksplit, (void)loads;
  if (bits != 4 && bits != 8) return Invalid("bits must be 4 or 8");
  if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1)))
    return Invalid("block_size must be 16, 32, 64, 128 or 256");
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto sd = scales.dimensions();
  auto yd = y->dimensions();
  if (!IsActivationType(x.element_type()) || xd.size() != 2) return Invalid("x must be float16 or bfloat16 [M, K]");
  const int64_t m = xd[0], k = xd[1];
  if (pd.size() != 3 || packed.element_type() != ffi::DataType::U8) return Invalid("packed must be uint8 [N, blocks, bs*bits/8]");
  const int64_t n = pd[0], blocks = pd[1];
  if (blocks != (k + block_size - 1) / block_size || pd[2] != block_size * bits / 8)
    return Invalid("packed must be [N, ceil(K / block_size), block_size * bits / 8]");
  if (sd.size() != 2 || sd[0] != n || sd[1] != blocks || scales.element_type() != x.element_type())
    return Invalid("scales must be [N, blocks] in x's type");
  const int64_t zp_cols = (blocks * bits + 7) / 8;
  if (has_zp) {
    auto zd = zp.dimensions();
    if (zd.size() != 2 || zd[0] != n || zd[1] != zp_cols || zp.element_type() != ffi::DataType::U8)
      return Invalid("zero_points must be uint8 [N, ceil(blocks * bits / 8)]");
  }
  const bool has_bias = bias.element_count() != 0;
  if (has_bias && (bias.element_count() != n || bias.element_type() != x.element_type()))
    return Invalid("bias must be [N] in x's type, or empty");
  if (yd.size() != 2 || yd[0] != m || yd[1] != n || y->element_type() != x.element_type())
    return Invalid("y must be [M, N] in x's type");
  const ffi::DataType t = x.element_type();
  const auto* p = static_cast<const uint8_t*>(packed.untyped_data());
  const auto* z = static_cast<const uint8_t*>(zp.untyped_data());
  const int64_t row_bytes = blocks * block_size * bits / 8;
  std::vector<float> xf(static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m * k; ++i) xf[i] = LoadAct(x.untyped_data(), i, t);
  std::vector<float> wrow(static_cast<size_t>(k));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const int64_t blk = kk / block_size;
      const int zero = has_zp ? Code(z + r * zp_cols, blk, bits) : (1 << (bits - 1));
      const float s = LoadAct(scales.untyped_data(), r * blocks + blk, t);
      wrow[kk] = static_cast<float>(Code(p + r * row_bytes, kk, bits) - zero) * s;
    }
    const float b = has_bias ? LoadAct(bias.untyped_data(), r, t) : 0.0f;
    for (int64_t i = 0; i < m; ++i)
      StoreAct(y->untyped_data(), i * n + r, Dot(xf.data() + i * k, wrow.data(), k) + b, t);
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvNbitsMatmulCpu, jaxgemv::NbitsMatmulCpu,
                              jaxgemv::BindNbitsMatmul(xla::ffi::Ffi::Bind()));
