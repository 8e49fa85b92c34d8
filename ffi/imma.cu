// The "imma" variant of int4 / int8 (ffi/imma.cuh): handler, launcher and the K split's choice.
// Two launches per product: the prep kernel writes x's planes to the scratch result, and the GEMV,
// launched with programmatic dependent launch, copies its first windows of weight while the prep
// runs and waits for it before it reads the planes (GridDependencyWait).
//
// Command-buffer compatible: no synchronisation, no allocation, no host reads of device memory.

#include <cuda_runtime.h>

#include <string>

#include "cluster.cuh"
#include "common.h"
#include "gemv_launch.cuh"
#include "handlers.h"
#include "imma.cuh"

namespace jaxgemv {
namespace {

// What the launcher needs of one product: its shape in the kernel's units.
struct ImmaShape {
  int64_t tiles = 0, groups = 0;
  int r = 1;  // groups of 32 a scale block
};

// Blocks of the instance resident per SM (its shared memory allowed first), 0 where refused.
template <int BITS, typename T, int KS, int LOADS, int R, int TILES>
int ImmaPerSm(int m) {
  auto* kernel = ImmaGemvKernel<BITS, T, KS, LOADS, R, TILES>;
  const int smem = ImmaSmemBytes<BITS, LOADS>(KS, TILES, m);
  const int per_sm = AllowSharedBytes(kernel, smem, 0) ? ResidentPerSm(kernel, 32 * KS, smem) : 0;
  cudaGetLastError();
  return per_sm;
}

// The K split where `ksplit` is 0: the largest of 8, 4, 2 whose grid (a block a tile) fits one wave
// and leaves every warp at least two windows, else 1. On an H100 (docs/perf-log.md, entry 144,
// tools/imma_probe.cu, M = 1) 8192 x 28672 ran int8 at K split 4 (5 blocks per SM, 0.78 waves) at
// 97% of the read against 81% at K split 8 (3 per SM: 1.29 waves), and int4 at K split 8 (4 per
// SM, 0.97 waves) at 81% against 63% at K split 4 (half the bytes in flight a warp).
template <int BITS, typename T, int LOADS, int R, int TILES>
int ImmaKSplit(const ImmaShape& s, int m, int sms) {
  const int64_t windows = s.groups / ImmaWindow<BITS, LOADS>::kGroups;
  int chosen = 1;
  const auto fits = [&](int ks, int per_sm) { return per_sm > 0 && s.tiles <= int64_t{per_sm} * sms && windows >= 2 * ks; };
  if (fits(8, ImmaPerSm<BITS, T, 8, LOADS, R, TILES>(m))) {
    chosen = 8;
  } else if (fits(4, ImmaPerSm<BITS, T, 4, LOADS, R, TILES>(m))) {
    chosen = 4;
  } else if (fits(2, ImmaPerSm<BITS, T, 2, LOADS, R, TILES>(m))) {
    chosen = 2;
  }
  return chosen;
}

// The grid's blocks spread evenly over the SMs (BalancedSharedBytes).
template <int BITS, typename T, int KS, int LOADS, int R, int TILES>
cudaError_t LaunchImmaGemv(cudaStream_t stream, const GemvArgs& a, const ImmaShape& s, const uint8_t* scratch, int sms) {
  auto* kernel = ImmaGemvKernel<BITS, T, KS, LOADS, R, TILES>;
  int smem = ImmaSmemBytes<BITS, LOADS>(KS, TILES, a.m);
  if (!AllowSharedBytes(kernel, smem, 0)) return cudaGetLastError();
  smem = BalancedSharedBytes(kernel, 32 * KS, smem, 0, s.tiles, sms);
  return LaunchClustered(kernel, 1, static_cast<unsigned>(s.tiles), 32 * KS, smem, stream, /*pdl=*/true, a, scratch,
                         s.groups);
}

// Prep then GEMV; `ksplit` 0 picks it (ImmaKSplit). Returns the K split launched through *ks_out
// (or, with `query`, only chooses it).
template <int BITS, typename T>
ffi::Error LaunchImma(cudaStream_t stream, int32_t device, const GemvArgs& a, const ImmaShape& s, int64_t ksplit,
                      int64_t loads, uint8_t* scratch, bool query, int* ks_out) {
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: reading device attributes: ") + cudaGetErrorString(cudaGetLastError()));
  bool launched = false;
  cudaError_t err = cudaSuccess;
  Switch<1, 2>(loads, [&](auto ld) {
    constexpr int kLd = decltype(ld)::value;
    Switch<1, 2, 4>(s.r, [&](auto rr) {
      constexpr int kR = decltype(rr)::value;
      Switch<1, 2, 3>(ImmaTiles(a.m), [&](auto tt) {
      constexpr int kTiles = decltype(tt)::value;
      if constexpr (ImmaWindow<BITS, kLd>::kGroups % kR == 0) {
        const int ks = ksplit > 0 ? static_cast<int>(ksplit) : ImmaKSplit<BITS, T, kLd, kR, kTiles>(s, a.m, sms);
        Switch<1, 2, 4, 8>(ks, [&](auto kk) {
          launched = true;
          *ks_out = ks;
          if (query) return;
          ImmaPrepKernel<T, BITS><<<dim3(static_cast<unsigned>((s.groups + kImmaPrepGroups - 1) / kImmaPrepGroups), a.m),
                                    kImmaPrepThreads, 0, stream>>>(
              static_cast<const T*>(a.x), a.k, s.groups, scratch, a.m);
          err = cudaGetLastError();
          if (err == cudaSuccess) err = LaunchImmaGemv<BITS, T, decltype(kk)::value, kLd, kR, kTiles>(stream, a, s, scratch, sms);
        });
      }
      });
    });
  });
  if (!launched) return Invalid("imma plan: ksplit must be 0/1/2/4/8, loads 1/2, block_size 32/64/128 within the window");
  if (err != cudaSuccess) return ffi::Error::Internal(std::string("jaxgemv: launching the imma kernels: ") + cudaGetErrorString(err));
  return ffi::Error::Success();
}

// The checks beyond the products' own (CheckNbitsMatmul, CheckEpilogue): what the kernel takes.
ffi::Error CheckImma(const ProductShape& s, int64_t bits, int64_t block_size, int64_t has_zp, int64_t loads,
                     ImmaShape* out) {
  if (auto err = CheckPlainNbitsPlan("imma", s, has_zp); err.failure()) return err;
  if (s.m < 1 || s.m > kImmaMaxM) return Invalid("imma plan: M must be 1 to 8, got " + std::to_string(s.m));
  if (loads != 1 && loads != 2) return Invalid("imma plan: loads must be 1 or 2");
  const int64_t window = 128 * loads * 8 / bits;
  const int64_t padded = (s.k + block_size - 1) / block_size * block_size;
  if (block_size < 32 || block_size > window || padded % window != 0)
    return Invalid("imma plan: block_size must be 32..window and K padded to whole blocks a multiple of the window (" +
                   std::to_string(window) + " values), got block_size " + std::to_string(block_size) + ", K " +
                   std::to_string(s.k));
  if (padded > kImmaMaxK)
    return Invalid("imma plan: K padded to whole blocks must be at most " + std::to_string(kImmaMaxK) + ", got " +
                   std::to_string(padded));
  out->tiles = (s.n + 15) / 16;
  out->groups = padded / 32;
  out->r = static_cast<int>(block_size / 32);
  return ffi::Error::Success();
}

ffi::Error NbitsImmaCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer packed,
                         ffi::AnyBuffer scales, ffi::AnyBuffer zp, ffi::AnyBuffer bias, ffi::AnyBuffer row_scale,
                         ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> scratch,
                         int64_t ksplit, int64_t loads, float rms_eps, float rms_inv_k, int64_t activation, int64_t bits,
                         int64_t block_size, int64_t has_zp) {
  ProductShape s;
  if (auto err = CheckNbitsMatmul(x, packed, scales, zp, bias, *y, bits, block_size, has_zp, &s, 1, activation);
      err.failure())
    return err;
  if (auto err = CheckEpilogue(x, row_scale, residual, rms_eps, rms_inv_k, &s); err.failure()) return err;
  ImmaShape shape;
  if (auto err = CheckImma(s, bits, block_size, has_zp, loads, &shape); err.failure()) return err;
  if (auto err = CheckPlanScratch("imma", *scratch, ImmaScratchBytes(shape.groups, static_cast<int>(s.m)),
                                  "jaxgemv.nbits.imma_scratch_bytes");
      err.failure())
    return err;
  GemvArgs a;
  if (auto err = MakeGemvArgs(s, x, packed, scales, bias, row_scale, residual, *y, /*scales_by_16_bytes=*/true, &a);
      err.failure())
    return err;
  uint8_t* buf = static_cast<uint8_t*>(scratch->untyped_data());
  int ks = 0;
  if (bits == 4)
    return s.dtype == ffi::DataType::F16 ? LaunchImma<4, __half>(stream, device, a, shape, ksplit, loads, buf, false, &ks)
                                         : LaunchImma<4, __nv_bfloat16>(stream, device, a, shape, ksplit, loads, buf, false, &ks);
  return s.dtype == ffi::DataType::F16 ? LaunchImma<8, __half>(stream, device, a, shape, ksplit, loads, buf, false, &ks)
                                       : LaunchImma<8, __nv_bfloat16>(stream, device, a, shape, ksplit, loads, buf, false, &ks);
}

}  // namespace

int ImmaKSplitChoice(int64_t bits, bool bf16, int64_t m, int64_t n, int64_t k, int64_t block_size, int64_t loads,
                     int device) {
  ProductShape s;
  s.m = m, s.n = n, s.k = k;
  ImmaShape shape;
  if (CheckImma(s, bits, block_size, 0, loads, &shape).failure()) return 0;
  GemvArgs a{};
  a.m = static_cast<int>(m), a.n = static_cast<int>(n), a.k = k;
  int ks = 0;
  ffi::Error err = bits == 4 ? (bf16 ? LaunchImma<4, __nv_bfloat16>(nullptr, device, a, shape, 0, loads, nullptr, true, &ks)
                                     : LaunchImma<4, __half>(nullptr, device, a, shape, 0, loads, nullptr, true, &ks))
                             : (bf16 ? LaunchImma<8, __nv_bfloat16>(nullptr, device, a, shape, 0, loads, nullptr, true, &ks)
                                     : LaunchImma<8, __half>(nullptr, device, a, shape, 0, loads, nullptr, true, &ks));
  return err.failure() ? 0 : ks;
}

}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvNbitsImmaCuda, jaxgemv::NbitsImmaCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()  // x
                                  .Arg<xla::ffi::AnyBuffer>()  // packed
                                  .Arg<xla::ffi::AnyBuffer>()  // scales
                                  .Arg<xla::ffi::AnyBuffer>()  // zero points ([0]: none)
                                  .Arg<xla::ffi::AnyBuffer>()  // bias
                                  .Arg<xla::ffi::AnyBuffer>()  // row_scale
                                  .Arg<xla::ffi::AnyBuffer>()  // residual
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Ret<xla::ffi::AnyBuffer>()  // scratch: x's planes and factors
                                  .Attr<int64_t>("ksplit")     // 0: the launcher's choice (ImmaKSplit)
                                  .Attr<int64_t>("loads")
                                  .Attr<float>("rms_eps")
                                  .Attr<float>("rms_inv_k")
                                  .Attr<int64_t>("activation")
                                  .Attr<int64_t>("bits")
                                  .Attr<int64_t>("block_size")
                                  .Attr<int64_t>("has_zp"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
