// FP8 (E4M3, float32 block scales) handler for the CPU platform: the contract of ffi/fp8.cu in
// plain C++, for CI and machines without a GPU; threaded over output rows (ffi/cpu_types.h).

#include <algorithm>
#include <cstdint>

#include "common.h"
#include "cpu_types.h"
#include "handlers.h"

namespace jaxgemv {
namespace {

ffi::Error Fp8MatmulCpu(ffi::AnyBuffer x, ffi::AnyBuffer data, ffi::AnyBuffer scales, ffi::AnyBuffer bias,
                        ffi::AnyBuffer row_scale, ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> y,
                        int64_t variant, int64_t rows, int64_t ksplit, int64_t loads, int64_t xperm,
                        int64_t xs_warps, int64_t x_stage, float rms_eps, float rms_inv_k, int64_t activation,
                        int64_t block_k) {
  ProductShape s;
  if (auto err = CheckFp8Matmul(x, data, scales, bias, *y, block_k, &s, 1, activation); err.failure()) return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  if (variant != static_cast<int64_t>(Variant::kCpu))
    return Invalid("the CPU handler runs only the 'cpu' variant");
  if (xperm || xs_warps) return Invalid("the CPU handler takes x in natural order, from global memory");
  (void)rows, (void)ksplit, (void)loads;
  static const E4m3Table e4m3;
  const auto* d = static_cast<const uint8_t*>(data.untyped_data());
  const auto* sc = static_cast<const float*>(scales.untyped_data());
  const int64_t blocks = (s.k + block_k - 1) / block_k;
  // value = e4m3 x scale, rounded once to float32 (as the reference does), a block at a time.
  RowByRowProduct(x.untyped_data(), bias.untyped_data(), row_scale.untyped_data(), residual.untyped_data(),
                  y->untyped_data(), s, [&](int64_t n, float* row) {
    const uint8_t* codes = d + n * s.k;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const float scale = sc[n * blocks + blk];
      const int64_t end = std::min(s.k, (blk + 1) * block_k);
      for (int64_t k = blk * block_k; k < end; ++k) row[k] = e4m3.value[codes[k]] * scale;
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp8MatmulCpu, jaxgemv::Fp8MatmulCpu,
                              jaxgemv::BindFp8Matmul(xla::ffi::Ffi::Bind()));
