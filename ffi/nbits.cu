// int4 / int8 (MatMulNBits layout) handler for the CUDA platform: validate, launch the tensor-core
// GEMV of ffi/gemv_core.cuh with the Nbits format policy (ffi/nbits.cuh). Shapes the kernel does
// not take run through jaxgemv/nbits.py's decode-then-dot path; the planner decides.
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <string>

#include "common.h"
#include "gemv_launch.cuh"
#include "handlers.h"
#include "nbits.cuh"

namespace jaxgemv {
JAXGEMV_EXTERN_MMA(Nbits<4>);  // ffi/mma_instance.cu.in
JAXGEMV_EXTERN_MMA(Nbits<8>);  // ffi/mma_instance.cu.in
namespace {

ffi::Error NbitsMatmulCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer packed, ffi::AnyBuffer scales,
                           ffi::AnyBuffer zp, ffi::AnyBuffer bias, ffi::AnyBuffer row_scale, ffi::AnyBuffer residual,
                           ffi::Result<ffi::AnyBuffer> y, int64_t variant,
                           int64_t rows, int64_t ksplit, int64_t loads, int64_t xperm, int64_t xs_warps, int64_t x_stage,
                           float rms_eps, float rms_inv_k, int64_t activation, int64_t bits,
                           int64_t block_size, int64_t has_zp) {
  if (static_cast<Variant>(variant) != Variant::kMma) return Invalid("int4/int8 on CUDA run only the 'mma' variant");
  ProductShape s;
  if (auto err = CheckNbitsMatmul(x, packed, scales, zp, bias, *y, bits, block_size, has_zp, &s, XRowMultiple(true, xperm),
                                  activation);
      err.failure())
    return err;
  if (auto err = CheckXOrder(xperm, s.m, rows, xs_warps, /*compact=*/false); err.failure()) return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  GemvArgs a;
  // The kernel copies scales and zero points in aligned 16-byte pieces (ffi/nbits.cuh).
  if (auto err = MakeGemvArgs(s, x, packed, scales, bias, row_scale, residual, *y, /*scales_by_16_bytes=*/true, &a);
      err.failure())
    return err;
  if (has_zp && !Aligned16(zp.untyped_data())) return Invalid("zero_points must be 16-byte aligned");
  if (has_zp && bits == 4 && block_size == 16 && loads == 2)
    return Invalid("mma plan: 4-bit blocks of 16 with zero points need loads 1 (ffi/nbits.cuh: kStageRowBytes)");
  a.scale_shift = Log2(block_size);
  a.zero_points = has_zp ? static_cast<const uint8_t*>(zp.untyped_data()) : nullptr;
  return bits == 4 ? LaunchMmaFor<Nbits<4>>(stream, device, a, s.dtype, rows, ksplit, loads, xperm != 0, xs_warps, x_stage)
                   : LaunchMmaFor<Nbits<8>>(stream, device, a, s.dtype, rows, ksplit, loads, xperm != 0, xs_warps, x_stage);
}

}  // namespace

MmaLaunchChoice NbitsMmaLaunchChoice(int64_t bits, const MmaLaunchQuery& q) {
  return bits == 4 ? QueryMmaLaunch<Nbits<4>>(q) : bits == 8 ? QueryMmaLaunch<Nbits<8>>(q) : MmaLaunchChoice{};
}

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvNbitsMatmulCuda, jaxgemv::NbitsMatmulCuda,
                              jaxgemv::BindNbitsMatmul(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>().Ctx<xla::ffi::DeviceOrdinal>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
