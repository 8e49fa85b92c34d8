// FP8 (E4M3, float32 block scales) handler for the CUDA platform: validate, launch the
// tensor-core GEMV of ffi/gemv_core.cuh with the E4M3 format policy (ffi/fp8.cuh). Shapes the
// kernel does not take run through jaxgemv/fp8.py's decode-then-dot path instead; the planner
// decides, and this handler checks that the plan is one it can run.
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "fp8.cuh"
#include "gemv_launch.cuh"
#include "handlers.h"

namespace jaxgemv {
namespace {

ffi::Error Fp8MatmulCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                         ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y, int64_t variant, int64_t rows,
                         int64_t ksplit, int64_t loads, int64_t xperm, int64_t xs_warps, int64_t block_k) {
  if (static_cast<Variant>(variant) != Variant::kMma) return Invalid("FP8 on CUDA runs only the 'mma' variant");
  ProductShape s;
  if (auto err = CheckFp8Matmul(x, data, scales, bias, *y, block_k, &s, xperm ? 8 : 1); err.failure()) return err;
  // A chunk of 4 lanes covers 64 consecutive values: it must sit inside one scale block.
  if (block_k < 64 || (block_k & (block_k - 1)) != 0)
    return Invalid("the FP8 mma kernel needs block_k a power of two and at least 64, got " + std::to_string(block_k));
  GemvArgs a;
  if (auto err = MakeGemvArgs(s, x, data, scales, bias, *y, /*scales_by_16_bytes=*/false, &a); err.failure())
    return err;
  a.scale_shift = Log2(block_k);
  return LaunchMmaFor<Fp8E4m3>(stream, device, a, s.dtype, rows, ksplit, loads, xperm, xs_warps);
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp8MatmulCuda, jaxgemv::Fp8MatmulCuda,
                              jaxgemv::BindFp8Matmul(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>().Ctx<xla::ffi::DeviceOrdinal>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
