// FP8 (E4M3, float32 block scales) handler for the CUDA platform: validate, launch the
// tensor-core GEMV of ffi/gemv_core.cuh with the E4M3 format policy (ffi/fp8.cuh) or the CUDA-core
// GEMV beside it. Shapes neither kernel takes run through jaxgemv/fp8.py's decode-then-dot path
// instead; the planner decides, and this handler checks that the plan is one it can run.
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "fp8.cuh"
#include "gemv_launch.cuh"
#include "handlers.h"

namespace jaxgemv {
JAXGEMV_EXTERN_MMA(Fp8E4m3);  // ffi/mma_instance.cu.in
namespace {

// The CUDA-core kernel (ffi/fp8.cuh): 16-byte pieces of 16 codes, each inside one block of K.
ffi::Error LaunchFp8Scalar(cudaStream_t stream, const ProductShape& s, GemvArgs a, int64_t rows, int64_t block_k) {
  if (s.k % 16 != 0) return Invalid("the FP8 scalar kernel needs K % 16 == 0, got K = " + std::to_string(s.k));
  if (block_k < 16 || (block_k & (block_k - 1)) != 0)
    return Invalid("the FP8 scalar kernel needs block_k a power of two and at least 16, got " + std::to_string(block_k));
  a.scale_shift = Log2(block_k);
  return LaunchWarpColumns(stream, a, s.dtype, rows, "Fp8ScalarGemvKernel", [](auto t, auto r) {
    return Fp8ScalarGemvKernel<typename decltype(t)::type, decltype(r)::value>;
  });
}

ffi::Error Fp8MatmulCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                         ffi::AnyBuffer bias, ffi::AnyBuffer row_scale, ffi::AnyBuffer residual,
                         ffi::Result<ffi::AnyBuffer> y, int64_t variant, int64_t rows, int64_t ksplit, int64_t loads,
                         int64_t xperm, int64_t xs_warps, int64_t x_stage, float rms_eps, float rms_inv_k, int64_t activation,
                         int64_t block_k) {
  const Variant v = static_cast<Variant>(variant);
  if (v != Variant::kMma && v != Variant::kScalar) return Invalid("FP8 on CUDA runs the 'mma' or 'scalar' variant");
  ProductShape s;
  if (auto err = CheckFp8Matmul(x, data, scales, bias, *y, block_k, &s, XRowMultiple(v == Variant::kMma, xperm), activation);
      err.failure())
    return err;
  if (auto err = CheckXOrder(xperm, s.m, rows, xs_warps, Fp8E4m3::kCompactX); v == Variant::kMma && err.failure()) return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  GemvArgs a;
  if (auto err = MakeGemvArgs(s, x, data, scales, bias, row_scale, residual, *y, /*scales_by_16_bytes=*/false, &a);
      err.failure())
    return err;
  if (v == Variant::kScalar) {
    if (s.rms_from_x) return Invalid("rms_eps without the rows' sums of squares needs the mma plan");
    if (s.activation) return Invalid("an activation in the store needs the mma plan");
    return LaunchFp8Scalar(stream, s, a, rows, block_k);
  }
  // A chunk of 4 lanes covers 64 consecutive values: it must sit inside one scale block.
  if (block_k < 64 || (block_k & (block_k - 1)) != 0)
    return Invalid("the FP8 mma kernel needs block_k a power of two and at least 64, got " + std::to_string(block_k));
  a.scale_shift = Log2(block_k);
  a.x_lanes = XLanes(xperm, a.m);
  return LaunchMmaFor<Fp8E4m3>(stream, device, a, s.dtype, rows, ksplit, loads, xperm != 0, xs_warps, x_stage);
}

}  // namespace

MmaLaunchChoice Fp8MmaLaunchChoice(const MmaLaunchQuery& q) { return QueryMmaLaunch<Fp8E4m3>(q); }

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp8MatmulCuda, jaxgemv::Fp8MatmulCuda,
                              jaxgemv::BindFp8Matmul(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>().Ctx<xla::ffi::DeviceOrdinal>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
