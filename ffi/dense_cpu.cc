// Dense fp16/bf16 product for the CPU platform: the contract of ffi/dense.cu in plain C++, for CI
// and machines without a GPU, threaded over output rows. Each weight row is widened to float32
// once and dotted with every row of x in a fixed order, so the result is deterministic.

#include <cstdint>

#include "common.h"
#include "cpu_types.h"
#include "handlers.h"

namespace jaxgemv {
namespace {

ffi::Error DenseMatmulCpu(ffi::AnyBuffer x, ffi::AnyBuffer w, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y,
                          int64_t variant, int64_t splits, int64_t loads) {
  ProductShape s;
  if (auto err = CheckDenseMatmul(x, w, bias, *y, &s); err.failure()) return err;
  if (variant != static_cast<int64_t>(Variant::kCpu))
    return Invalid("the CPU handler runs only the 'cpu' variant");
  (void)splits, (void)loads;
  const void* wp = w.untyped_data();
  RowByRowProduct(x.untyped_data(), bias.untyped_data(), nullptr, nullptr, y->untyped_data(), s, [&](int64_t n, float* row) {
    for (int64_t k = 0; k < s.k; ++k) row[k] = LoadAct(wp, n * s.k + k, s.dtype);
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvDenseMatmulCpu, jaxgemv::DenseMatmulCpu,
                              jaxgemv::BindDenseMatmul(xla::ffi::Ffi::Bind()));
