// NVFP4 handlers for the CPU platform: the same contract as ffi/fp4.cu, in plain C++.
// They make every op run without a GPU (tests in CI, sharding tests on virtual CPU devices,
// users without a GPU); exact first, then threaded over output rows (ffi/cpu_types.h:
// RowByRowProduct).

#include <cstdint>
#include <vector>

#include "common.h"
#include "cpu_types.h"
#include "handlers.h"

namespace jaxgemv {
namespace {

constexpr float kE2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Row n of the weight in float32: e2m1 x scale x global_scale, the same rounding as the
// reference (the first product is exact in float32, the second rounds once). The 16 possible
// values of each block are computed once, then looked up.
void DecodeRow(const uint8_t* packed, const uint8_t* scales, float gscale, int64_t k, float* out) {
  static const E4m3Table e4m3;
  for (int64_t blk = 0; blk < k / 16; ++blk) {
    float values[16];
    const float s = e4m3.value[scales[blk]];
    for (int c = 0; c < 16; ++c) values[c] = kE2m1[c] * s * gscale;
    const uint8_t* bytes = packed + blk * 8;
    float* o = out + blk * 16;
    for (int i = 0; i < 8; ++i) {
      o[2 * i] = values[bytes[i] & 0xf];
      o[2 * i + 1] = values[bytes[i] >> 4];
    }
  }
}

ffi::Error Fp4MatmulCpu(ffi::AnyBuffer x, ffi::AnyBuffer packed, ffi::AnyBuffer scales,
                        ffi::AnyBuffer gscale, ffi::AnyBuffer bias, ffi::AnyBuffer row_scale, ffi::AnyBuffer residual,
                        ffi::Result<ffi::AnyBuffer> y, int64_t variant, int64_t rows, int64_t ksplit, int64_t loads,
                        int64_t xperm, int64_t xs_warps, int64_t x_stage, float rms_eps, float rms_inv_k,
                        int64_t activation) {
  ProductShape s;
  if (auto err = CheckFp4Matmul(x, packed, scales, gscale, bias, *y, &s, 1, activation); err.failure()) return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  if (variant != static_cast<int64_t>(Variant::kCpu))
    return Invalid("the CPU handler runs only the 'cpu' variant");
  if (xperm || xs_warps) return Invalid("the CPU handler takes x in natural order, from global memory");
  (void)rows, (void)ksplit, (void)loads;
  const auto* p = static_cast<const uint8_t*>(packed.untyped_data());
  const auto* sc = static_cast<const uint8_t*>(scales.untyped_data());
  const float g = *static_cast<const float*>(gscale.untyped_data());
  RowByRowProduct(x.untyped_data(), bias.untyped_data(), row_scale.untyped_data(), residual.untyped_data(),
                  y->untyped_data(), s, [&](int64_t n, float* row) {
    DecodeRow(p + n * (s.k / 2), sc + n * (s.k / 16), g, s.k, row);
  });
  return ffi::Error::Success();
}

ffi::Error Fp4DequantizeCpu(ffi::AnyBuffer packed, ffi::AnyBuffer scales, ffi::AnyBuffer gscale,
                            ffi::Result<ffi::AnyBuffer> w, int64_t apply_global_scale) {
  ProductShape s;
  if (auto err = CheckFp4Dequantize(packed, scales, gscale, *w, &s); err.failure()) return err;
  const auto* p = static_cast<const uint8_t*>(packed.untyped_data());
  const auto* sc = static_cast<const uint8_t*>(scales.untyped_data());
  const float g = apply_global_scale ? *static_cast<const float*>(gscale.untyped_data()) : 1.0f;
  ParallelRows(s.n, s.k, [&](int64_t n0, int64_t n1) {
    std::vector<float> wrow(static_cast<size_t>(s.k));
    for (int64_t n = n0; n < n1; ++n) {
      DecodeRow(p + n * (s.k / 2), sc + n * (s.k / 16), g, s.k, wrow.data());
      for (int64_t k = 0; k < s.k; ++k) StoreAct(w->untyped_data(), n * s.k + k, wrow[k], s.dtype);
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp4MatmulCpu, jaxgemv::Fp4MatmulCpu,
                              jaxgemv::BindFp4Matmul(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp4DequantizeCpu, jaxgemv::Fp4DequantizeCpu,
                              jaxgemv::BindFp4Dequantize(xla::ffi::Ffi::Bind()));
