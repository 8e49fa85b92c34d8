// NVFP4 handlers for the CUDA platform: validate, pick the kernel instantiation the plan names,
// launch on XLA's stream. The plan (variant, rows, ksplit, loads) comes from jaxgemv/planner.py
// as static attributes; these handlers only check that it is one we compiled.
//
// Handlers are command-buffer compatible: no synchronisation, no allocation, no host reads of
// device memory, no cached device pointers (the global scale is read on the device).

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common.h"
#include "gemv_launch.cuh"
#include "handlers.h"
#include "layer.h"
#include "nvfp4.cuh"

namespace jaxgemv {
JAXGEMV_EXTERN_MMA(Nvfp4);  // ffi/mma_instance.cu.in

// (Outside the anonymous namespace: ffi/layer.cu launches it too; ffi/layer.h.)
ffi::Error Fp4MatmulCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer packed,
                         ffi::AnyBuffer scales, ffi::AnyBuffer gscale, ffi::AnyBuffer bias,
                         ffi::AnyBuffer row_scale, ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> y,
                         int64_t variant, int64_t rows, int64_t ksplit, int64_t loads, int64_t xperm,
                         int64_t xs_warps, int64_t x_stage, float rms_eps, float rms_inv_k, int64_t activation) {
  ProductShape s;
  const bool mma = static_cast<Variant>(variant) == Variant::kMma;
  if (auto err = CheckFp4Matmul(x, packed, scales, gscale, bias, *y, &s, XRowMultiple(mma, xperm), activation); err.failure())
    return err;
  if (auto err = CheckXOrder(xperm, s.m, rows, xs_warps, Nvfp4::kCompactX); mma && err.failure()) return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  GemvArgs a;
  if (auto err = MakeGemvArgs(s, x, packed, scales, bias, row_scale, residual, *y, /*scales_by_16_bytes=*/true, &a);
      err.failure())
    return err;
  a.gscale = static_cast<const float*>(gscale.untyped_data());
  a.x_lanes = XLanes(xperm, a.m);
  switch (static_cast<Variant>(variant)) {
    case Variant::kMma:
      return LaunchMmaFor<Nvfp4>(stream, device, a, s.dtype, rows, ksplit, loads, xperm != 0, xs_warps, x_stage);
    case Variant::kScalar:
      if (s.rms_from_x) return Invalid("rms_eps without the rows' sums of squares needs the mma plan");
      if (s.activation) return Invalid("an activation in the store needs the mma plan");
      return LaunchWarpColumns(stream, a, s.dtype, rows, "ScalarGemvKernel", [](auto t, auto r) {
        return ScalarGemvKernel<Nvfp4, typename decltype(t)::type, decltype(r)::value>;
      });
    default:
      return Invalid("unknown CUDA variant " + std::to_string(variant));
  }
}

namespace {

ffi::Error Fp4DequantizeCuda(cudaStream_t stream, ffi::AnyBuffer packed, ffi::AnyBuffer scales,
                             ffi::AnyBuffer gscale, ffi::Result<ffi::AnyBuffer> w,
                             int64_t apply_global_scale) {
  ProductShape s;
  if (auto err = CheckFp4Dequantize(packed, scales, gscale, *w, &s); err.failure()) return err;
  const int64_t pieces = s.n * (s.k / 16);
  if (pieces >= (int64_t{1} << 32)) return Invalid("the weight must have fewer than 2^36 values");
  if (pieces == 0) return ffi::Error::Success();
  const auto* p = static_cast<const uint8_t*>(packed.untyped_data());
  const auto* sc = static_cast<const uint8_t*>(scales.untyped_data());
  // nullptr: leave the global scale out (the caller applies it to the product).
  const auto* g = apply_global_scale ? static_cast<const float*>(gscale.untyped_data()) : nullptr;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((pieces + 255) / 256, 1 << 20));
  if (s.dtype == ffi::DataType::F16) {
    DequantizeKernel<Nvfp4, __half><<<blocks, 256, 0, stream>>>(p, sc, g, static_cast<__half*>(w->untyped_data()), s.n, s.k);
  } else {
    DequantizeKernel<Nvfp4, __nv_bfloat16><<<blocks, 256, 0, stream>>>(
        p, sc, g, static_cast<__nv_bfloat16*>(w->untyped_data()), s.n, s.k);
  }
  return LastLaunchError("DequantizeKernel");
}

}  // namespace

MmaLaunchChoice Nvfp4MmaLaunchChoice(const MmaLaunchQuery& q) { return QueryMmaLaunch<Nvfp4>(q); }

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp4MatmulCuda, jaxgemv::Fp4MatmulCuda,
                              jaxgemv::BindFp4Matmul(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>().Ctx<xla::ffi::DeviceOrdinal>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp4DequantizeCuda, jaxgemv::Fp4DequantizeCuda,
                              jaxgemv::BindFp4Dequantize(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
