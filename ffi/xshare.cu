// The "xshare" variant of int4_matmul / int8_matmul (ffi/xshare.cuh): handler and launcher. One
// memset (the scratch's sums), one persistent launch, as many blocks as the device holds at once (at
// most one per step of the stream), and the store of y from the sums.
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "common.h"
#include "gemv_launch.cuh"
#include "handlers.h"
#include "xshare.cuh"

namespace jaxgemv {
namespace {

template <int BITS, typename T, int MT>
cudaError_t LaunchXshareKernel(cudaStream_t stream, int32_t device, const GemvArgs& a, uint8_t* scratch,
                               int64_t scratch_bytes) {
  constexpr int W = XshareShape<BITS, MT>::kWarps;
  auto* kernel = XshareGemvKernel<BITS, T, MT>;
  const int smem = XshareSmemBytes<BITS, MT>();
  if (!AllowSharedBytes(kernel, smem, 0)) return cudaGetLastError();
  int sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int per_sm = ResidentPerSm(kernel, 32 * W, smem);
  const int64_t groups = XshareSumCols(a.n, W) / (16 * W), steps = groups * (a.k / kXshareWin);
  const int grid = static_cast<int>(std::min<int64_t>(int64_t{std::max(per_sm, 1)} * sms, steps));
  err = cudaMemsetAsync(scratch, 0, static_cast<size_t>(scratch_bytes), stream);
  if (err != cudaSuccess) return err;
  float* sums = reinterpret_cast<float*>(scratch);
  kernel<<<grid, 32 * W, smem, stream>>>(a, sums);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t outputs = static_cast<int64_t>(a.m) * a.n;
  XshareStoreKernel<T><<<static_cast<unsigned>((outputs + 255) / 256), 256, 0, stream>>>(a, sums, XshareSumCols(a.n, W));
  return cudaGetLastError();
}

template <int BITS, typename T>
cudaError_t LaunchXshare(cudaStream_t stream, int32_t device, const GemvArgs& a, uint8_t* scratch, int64_t scratch_bytes) {
  return a.m > 8 ? LaunchXshareKernel<BITS, T, 2>(stream, device, a, scratch, scratch_bytes)
                 : LaunchXshareKernel<BITS, T, 1>(stream, device, a, scratch, scratch_bytes);
}

// The checks beyond the products' own (CheckNbitsMatmul, CheckEpilogue): what the kernel takes.
ffi::Error CheckXshare(const ProductShape& s, int64_t bits, int64_t block_size, int64_t has_zp) {
  if (bits != 4 && bits != 8) return Invalid("xshare plan: 4-bit or 8-bit codes only");
  if (auto err = CheckPlainNbitsPlan("xshare", s, has_zp); err.failure()) return err;
  if (s.m < 1 || s.m > kXshareMaxM) return Invalid("xshare plan: M must be 1 to 16, got " + std::to_string(s.m));
  if (block_size < 32 || s.k % kXshareWin != 0)
    return Invalid("xshare plan: block_size must be 32-256 and K a multiple of " + std::to_string(kXshareWin) +
                   ", got block_size " + std::to_string(block_size) + ", K " + std::to_string(s.k));
  if (s.k >= (int64_t{1} << 27)) return Invalid("xshare plan: K must be below 2^27");
  return ffi::Error::Success();
}

ffi::Error NbitsXshareCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer packed,
                           ffi::AnyBuffer scales, ffi::AnyBuffer zp, ffi::AnyBuffer bias, ffi::AnyBuffer row_scale,
                           ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> scratch,
                           float rms_eps, float rms_inv_k, int64_t bits, int64_t block_size, int64_t has_zp) {
  ProductShape s;
  if (auto err = CheckNbitsMatmul(x, packed, scales, zp, bias, *y, bits, block_size, has_zp, &s); err.failure())
    return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  if (auto err = CheckXshare(s, bits, block_size, has_zp); err.failure()) return err;
  const int64_t need = XshareScratchBytes(s.m, s.n, XshareWarps(static_cast<int>(bits), s.m));
  if (auto err = CheckPlanScratch("xshare", *scratch, need, "jaxgemv.nbits.xshare_scratch_bytes"); err.failure())
    return err;
  GemvArgs a;
  if (auto err = MakeGemvArgs(s, x, packed, scales, bias, row_scale, residual, *y, /*scales_by_16_bytes=*/true, &a);
      err.failure())
    return err;
  a.scale_shift = Log2(block_size);
  uint8_t* buf = static_cast<uint8_t*>(scratch->untyped_data());
  const bool f16 = s.dtype == ffi::DataType::F16;
  const cudaError_t err = bits == 8 ? (f16 ? LaunchXshare<8, __half>(stream, device, a, buf, need)
                                           : LaunchXshare<8, __nv_bfloat16>(stream, device, a, buf, need))
                                    : (f16 ? LaunchXshare<4, __half>(stream, device, a, buf, need)
                                           : LaunchXshare<4, __nv_bfloat16>(stream, device, a, buf, need));
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching the xshare kernel: ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

}  // namespace

int64_t XshareScratchBytesOf(int64_t m, int64_t n, int64_t bits) {
  return XshareScratchBytes(m, n, XshareWarps(static_cast<int>(bits), m));
}

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvNbitsXshareCuda, jaxgemv::NbitsXshareCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()  // x, each 8 values in pair order
                                  .Arg<xla::ffi::AnyBuffer>()  // packed
                                  .Arg<xla::ffi::AnyBuffer>()  // scales
                                  .Arg<xla::ffi::AnyBuffer>()  // zero points ([0]: none)
                                  .Arg<xla::ffi::AnyBuffer>()  // bias
                                  .Arg<xla::ffi::AnyBuffer>()  // row_scale
                                  .Arg<xla::ffi::AnyBuffer>()  // residual
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Ret<xla::ffi::AnyBuffer>()  // scratch: float32 sums
                                  .Attr<float>("rms_eps")
                                  .Attr<float>("rms_inv_k")
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("has_zp"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
