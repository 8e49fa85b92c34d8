// The "wgmma" variant of fp8_matmul (ffi/fp8_wgmma.cuh): handler, launcher and the K split's
// choice. Built for sm_90a alone (CMakeLists.txt: wgmma exists only in the architecture-specific
// target), so the handler refuses any device but compute capability 9.0. One launch per
// product, two with a K split: a small kernel zeroes the split's counters first, and the GEMV,
// launched with programmatic dependent launch, runs beside it and waits for it only before it
// counts itself (GridDependencyWait).
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <string>

#include "cluster.cuh"
#include "common.h"
#include "fp8_wgmma.cuh"
#include "gemv_launch.cuh"
#include "handlers.h"

namespace jaxgemv {
namespace {

template <typename T, int NT, int SPW>
cudaError_t LaunchFp8Wgmma(cudaStream_t stream, const GemvArgs& a, uint8_t* scratch, int64_t windows, int ks,
                           int64_t scale_cols, int win_shift) {
  auto* kernel = Fp8WgmmaKernel<T, NT, SPW>;
  constexpr int smem = WgSmemBytes<NT, SPW>();
  if (!AllowSharedBytes(kernel, smem, 0)) return cudaGetLastError();
  const int64_t tiles = (a.n + kWgRows - 1) / kWgRows;
  return LaunchClustered(kernel, /*cluster=*/1, static_cast<unsigned>(tiles * ks), 128, smem, stream, /*pdl=*/ks > 1, a,
                         scratch, windows, ks, scale_cols, win_shift);
}

// What the launch needs beyond GemvArgs.
struct WgShape {
  int64_t windows = 0, scale_cols = 0, tiles = 0;
  int cols = 8, spw = 1, win_shift = 0, ks = 1;
};

ffi::Error CheckWgmma(const ProductShape& s, int64_t block_k, int64_t ksplit, WgShape* out) {
  if (s.activation) return Invalid("wgmma plan: SwiGLU runs the 'mma' variant");
  if (s.rms_from_x) return Invalid("wgmma plan: the RMSNorm's row scale must come as row_scale");
  if (s.m < 1 || s.m > kWgMaxM) return Invalid("wgmma plan: M must be 1 to 8, got " + std::to_string(s.m));
  if (s.k % kWgWin != 0 || s.k > kWgMaxK)
    return Invalid("wgmma plan: K must be a multiple of 128 and at most " + std::to_string(kWgMaxK) + ", got " +
                   std::to_string(s.k));
  if (block_k < 32 || (block_k & (block_k - 1)) != 0)
    return Invalid("wgmma plan: block_k must be a power of two and at least 32, got " + std::to_string(block_k));
  if (ksplit != 0 && ksplit != 1 && ksplit != 2 && ksplit != 4 && ksplit != 8)
    return Invalid("wgmma plan: ksplit must be 0, 1, 2, 4 or 8, got " + std::to_string(ksplit));
  out->windows = s.k / kWgWin;
  out->tiles = (s.n + kWgRows - 1) / kWgRows;
  out->ks = WgKSplit(out->windows, ksplit);
  out->scale_cols = (s.k + block_k - 1) / block_k;
  out->cols = WgCols(WgPlanes(s.dtype == ffi::DataType::F16), static_cast<int>(s.m));
  out->spw = block_k >= kWgWin ? 1 : static_cast<int>(kWgWin / block_k);
  out->win_shift = block_k >= kWgWin ? Log2(block_k / kWgWin) : 0;
  return ffi::Error::Success();
}

template <typename T>
ffi::Error LaunchWgmma(cudaStream_t stream, const GemvArgs& a, const WgShape& w, uint8_t* scratch) {
  if (w.ks > 1) {
    Fp8WgmmaZeroKernel<<<static_cast<unsigned>((w.tiles + kWgZeroThreads - 1) / kWgZeroThreads), kWgZeroThreads, 0,
                         stream>>>(reinterpret_cast<int32_t*>(scratch + WgCountOffset(w.tiles, w.ks, a.m)), w.tiles);
  }
  cudaError_t err = cudaGetLastError();
  bool launched = false;
  if (err == cudaSuccess) {
    Switch<8, 16, 24>(w.cols, [&](auto nt) {
      Switch<1, 2, 4>(w.spw, [&](auto spw) {
        constexpr int kNt = decltype(nt)::value;
        // bf16's two planes a row reach 16 columns at M = 8: no 24-column instances for it.
        if constexpr (kNt <= 8 * WgPlanes(std::is_same_v<T, __half>)) {
          launched = true;
          err = LaunchFp8Wgmma<T, kNt, decltype(spw)::value>(stream, a, scratch, w.windows, w.ks, w.scale_cols,
                                                               w.win_shift);
        }
      });
    });
  }
  if (err != cudaSuccess) return ffi::Error::Internal(std::string("jaxgemv: launching the wgmma kernels: ") + cudaGetErrorString(err));
  if (!launched) return Invalid("wgmma plan: no kernel instance for these columns and scales");
  return ffi::Error::Success();
}

ffi::Error Fp8WgmmaCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer data, ffi::AnyBuffer scales,
                        ffi::AnyBuffer bias, ffi::AnyBuffer row_scale, ffi::AnyBuffer residual,
                        ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> scratch, int64_t ksplit, float rms_eps,
                        float rms_inv_k, int64_t activation, int64_t block_k) {
  ProductShape s;
  if (auto err = CheckFp8Matmul(x, data, scales, bias, *y, block_k, &s, 1, activation); err.failure()) return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  WgShape w;
  if (auto err = CheckWgmma(s, block_k, ksplit, &w); err.failure()) return err;
  if (!Aligned16(scales.untyped_data())) return Invalid("wgmma plan: the scales must be 16-byte aligned");
  if (auto err = CheckPlanScratch("wgmma", *scratch, WgScratchBytes(w.tiles, w.ks, static_cast<int>(s.m)),
                                  "jaxgemv.fp8.wgmma_scratch_bytes");
      err.failure())
    return err;
  if (auto err = RequireSm90(device, true, "wgmma plan: the kernel, built for sm_90a,"); err.failure()) return err;
  GemvArgs a;
  if (auto err = MakeGemvArgs(s, x, data, scales, bias, row_scale, residual, *y, /*scales_by_16_bytes=*/false, &a);
      err.failure())
    return err;
  uint8_t* buf = static_cast<uint8_t*>(scratch->untyped_data());
  return s.dtype == ffi::DataType::F16 ? LaunchWgmma<__half>(stream, a, w, buf) : LaunchWgmma<__nv_bfloat16>(stream, a, w, buf);
}

}  // namespace

int64_t Fp8WgmmaScratchBytes(int64_t m, int64_t n, int64_t k, int64_t ksplit) {
  return WgScratchBytes((n + kWgRows - 1) / kWgRows, WgKSplit(k / kWgWin, ksplit), static_cast<int>(m));
}

int Fp8WgmmaKSplit(int64_t k, int64_t ksplit) { return WgKSplit(k / kWgWin, ksplit); }

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp8WgmmaCuda, jaxgemv::Fp8WgmmaCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()  // x
                                  .Arg<xla::ffi::AnyBuffer>()  // data
                                  .Arg<xla::ffi::AnyBuffer>()  // row scales [N, ceil(K / block_k)]
                                  .Arg<xla::ffi::AnyBuffer>()  // bias
                                  .Arg<xla::ffi::AnyBuffer>()  // row_scale
                                  .Arg<xla::ffi::AnyBuffer>()  // residual
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Ret<xla::ffi::AnyBuffer>()  // scratch: the K split's sums and counters
                                  .Attr<int64_t>("ksplit")     // 0: the launcher's choice (fp8_wgmma.cuh: WgKSplit)
                                  .Attr<float>("rms_eps")
                                  .Attr<float>("rms_inv_k")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("block_k"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
