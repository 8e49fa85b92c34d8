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
namespace {

ffi::Error NbitsMatmulCuda(cudaStream_t stream, ffi::AnyBuffer x, ffi::AnyBuffer packed, ffi::AnyBuffer scales,
                           ffi::AnyBuffer zp, ffi::AnyBuffer bias, ffi::Result<ffi::AnyBuffer> y, int64_t variant,
                           int64_t rows, int64_t ksplit, int64_t loads, int64_t xperm, int64_t bits,
                           int64_t block_size, int64_t has_zp) {
  if (static_cast<Variant>(variant) != Variant::kMma) return Invalid("int4/int8 on CUDA run only the 'mma' variant");
  if (bits != 4 && bits != 8) return Invalid("bits must be 4 or 8");
  if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1)))
    return Invalid("block_size must be 16, 32, 64, 128 or 256");
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto sd = scales.dimensions();
  auto yd = y->dimensions();
  if (!IsActivationType(x.element_type()) || xd.size() != 2 || yd.size() != 2)
    return Invalid("x must be float16 or bfloat16 [M, K]; y 2-D");
  const int64_t m = yd[0], k = xd[1];
  if (xd[0] != (xperm ? (m + 7) / 8 * 8 : m)) return Invalid("x must have M rows (fragment order: M rounded up to 8)");
  if (pd.size() != 3 || packed.element_type() != ffi::DataType::U8) return Invalid("packed must be uint8 [N, blocks, bs*bits/8]");
  const int64_t n = pd[0], blocks = pd[1];
  if (blocks != (k + block_size - 1) / block_size || pd[2] != block_size * bits / 8)
    return Invalid("packed must be [N, ceil(K / block_size), block_size * bits / 8]");
  if (sd.size() != 2 || sd[0] != n || sd[1] != blocks || scales.element_type() != x.element_type())
    return Invalid("scales must be [N, blocks] in x's type");
  if (has_zp) {
    auto zd = zp.dimensions();
    if (zd.size() != 2 || zd[0] != n || zd[1] != (blocks * bits + 7) / 8 || zp.element_type() != ffi::DataType::U8)
      return Invalid("zero_points must be uint8 [N, ceil(blocks * bits / 8)]");
  }
  const bool has_bias = bias.element_count() != 0;
  if (has_bias && (bias.element_count() != n || bias.element_type() != x.element_type()))
    return Invalid("bias must be [N] in x's type, or empty");
  if (yd[1] != n || y->element_type() != x.element_type()) return Invalid("y must be [M, N] in x's type");
  if (m > (1 << 30) || n > (1 << 30)) return Invalid("M and N must be below 2^30");
  if (!Aligned16(x.untyped_data()) || !Aligned16(packed.untyped_data()))
    return Invalid("x and packed must be 16-byte aligned");
  int shift = 0;
  while ((int64_t{1} << shift) < block_size) ++shift;
  GemvArgs a{x.untyped_data(),
             static_cast<const uint8_t*>(packed.untyped_data()),
             static_cast<const uint8_t*>(scales.untyped_data()),
             nullptr,
             has_bias ? bias.untyped_data() : nullptr,
             y->untyped_data(),
             static_cast<int>(m),
             static_cast<int>(n),
             k,
             shift,
             has_zp ? static_cast<const uint8_t*>(zp.untyped_data()) : nullptr};
  const bool half = x.element_type() == ffi::DataType::F16;
  if (bits == 4)
    return half ? LaunchMma<Nbits<4>, __half>(stream, a, rows, ksplit, loads, xperm)
                : LaunchMma<Nbits<4>, __nv_bfloat16>(stream, a, rows, ksplit, loads, xperm);
  return half ? LaunchMma<Nbits<8>, __half>(stream, a, rows, ksplit, loads, xperm)
              : LaunchMma<Nbits<8>, __nv_bfloat16>(stream, a, rows, ksplit, loads, xperm);
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvNbitsMatmulCuda, jaxgemv::NbitsMatmulCuda,
                              jaxgemv::BindNbitsMatmul(
                                  xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
                              {xla::ffi::Traits::kCmdBufferCompatible});
