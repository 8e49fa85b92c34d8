// Host-side launch of the tensor-core GEMV of ffi/gemv_core.cuh for any format: the plan's
// launch parameters (rows, ksplit, loads, xperm) picked from the instantiated whitelist.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "cluster.cuh"
#include "common.h"
#include "gemv_core.cuh"

namespace jaxgemv {

inline ffi::Error LastLaunchError(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching ") + kernel + ": " + cudaGetErrorString(err));
  return ffi::Error::Success();
}

// The kernels' arguments from a checked product (its epilogue checked too: CheckEpilogue): x, the
// weight (and, where the kernel copies them 16 bytes at a time, the scales) 16-byte aligned, M
// and N below 2^30 (32-bit row indices). The format-specific fields (gscale, scale_shift,
// zero_points) are set by the caller.
inline ffi::Error MakeGemvArgs(const ProductShape& s, const ffi::AnyBuffer& x, const ffi::AnyBuffer& w,
                               const ffi::AnyBuffer& scales, const ffi::AnyBuffer& bias,
                               const ffi::AnyBuffer& row_scale, const ffi::AnyBuffer& residual, ffi::AnyBuffer y,
                               bool scales_by_16_bytes, GemvArgs* a) {
  if (s.m > (1 << 30) || s.n > (1 << 30)) return Invalid("M and N must be below 2^30");
  if (!Aligned16(x.untyped_data()) || !Aligned16(w.untyped_data()) ||
      (scales_by_16_bytes && !Aligned16(scales.untyped_data())))
    return Invalid(scales_by_16_bytes ? "x, the weight and its scales must be 16-byte aligned"
                                      : "x and the weight must be 16-byte aligned");
  *a = GemvArgs{x.untyped_data(), static_cast<const uint8_t*>(w.untyped_data()),
                static_cast<const uint8_t*>(scales.untyped_data()), nullptr,
                s.has_bias ? bias.untyped_data() : nullptr, y.untyped_data(), static_cast<int>(s.m),
                static_cast<int>(s.n), s.k};
  a->row_scale = s.has_row_scale ? static_cast<const float*>(row_scale.untyped_data()) : nullptr;
  a->residual = s.has_residual ? residual.untyped_data() : nullptr;
  a->rms_eps = s.rms_eps;
  a->rms_inv_k = s.rms_inv_k;
  a->swiglu = s.activation == 1;
  return ffi::Error::Success();
}

// log2 of a power of two (a block size, checked by the caller).
inline int Log2(int64_t v) {
  int shift = 0;
  while ((int64_t{1} << shift) < v) ++shift;
  return shift;
}

// Above 48 KB of static and dynamic shared memory together a kernel must opt in to more dynamic
// shared memory (a function attribute, per device; setting it on every launch keeps no state and is
// not a stream operation). Counting the dynamic bytes alone let a launch with 48 KB of ring and
// 1.5 KB of K-split buffer fail with "invalid argument" (int4, M = 1, K split 4).
template <typename Kernel>
bool AllowSharedBytes(Kernel* kernel, int dynamic_bytes, int static_bytes) {
  return dynamic_bytes + static_bytes <= 48 * 1024 ||
         cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_bytes) == cudaSuccess;
}

// A type as a value, for a lambda that names a kernel instantiation per activation type.
template <typename T>
struct TypeTag {
  using type = T;
};

// The warp-per-column kernels (ffi/gemv_core.cuh, ffi/fp8.cuh): a warp per output column,
// kScalarWarps per block, the grid's y dimension over x's rows in groups of `rows` (1, 2 or 4).
// kernel_for(TypeTag<T>{}, R as std::integral_constant) returns the instantiation to launch.
template <typename KernelFor>
ffi::Error LaunchWarpColumns(cudaStream_t stream, const GemvArgs& a, ffi::DataType dtype, int64_t rows,
                             const char* name, KernelFor&& kernel_for) {
  bool launched = false;
  Switch<1, 2, 4>(rows, [&](auto r) {
    constexpr int kR = decltype(r)::value;
    const dim3 grid((a.n + kScalarWarps - 1) / kScalarWarps, (a.m + kR - 1) / kR);
    if (dtype == ffi::DataType::F16) {
      kernel_for(TypeTag<__half>{}, r)<<<grid, 32 * kScalarWarps, 0, stream>>>(a);
    } else {
      kernel_for(TypeTag<__nv_bfloat16>{}, r)<<<grid, 32 * kScalarWarps, 0, stream>>>(a);
    }
    launched = true;
  });
  if (!launched) return Invalid("scalar plan: rows must be 1, 2 or 4");
  return LastLaunchError(name);
}

// The runtime's occupancy answers, kept per (device, kernel, threads, dynamic shared memory): a
// launch asks it of the planned instance and of each rule's alternative (held instance, K split 6,
// half the split, x staged, one wave: up to six calls into the driver per launch), and the answer
// depends on those four alone, so each is asked once per process. It matters where the handler
// runs per call (XLA's command buffers run it once per capture): eager calls, and jitted
// computations too small for a command buffer. Only answers of at least one block are kept (a
// refused or empty answer is asked again). JAXGEMV_OCCUPANCY_CACHE=0, a diagnostic read once per
// process, asks every time.
struct OccupancyKey {
  int device, threads;
  int64_t smem;
  const void* kernel;
  bool operator==(const OccupancyKey& o) const {
    return device == o.device && threads == o.threads && smem == o.smem && kernel == o.kernel;
  }
};
struct OccupancyKeyHash {
  size_t operator()(const OccupancyKey& k) const {
    size_t h = std::hash<const void*>()(k.kernel);
    for (const int64_t v : {int64_t{k.device}, int64_t{k.threads}, k.smem}) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
inline bool OccupancyCacheOn() {
  static const bool on = EnvDigit("JAXGEMV_OCCUPANCY_CACHE", 1) != 0;
  return on;
}
inline std::mutex& OccupancyMutex() {
  static std::mutex mu;
  return mu;
}
inline std::unordered_map<OccupancyKey, int, OccupancyKeyHash>& OccupancyAnswers() {
  static std::unordered_map<OccupancyKey, int, OccupancyKeyHash> answers;
  return answers;
}

// Blocks of `kernel` resident per SM with `smem` bytes of dynamic shared memory on the current
// device (its attribute already allowing them), or 0 where the runtime refuses the query (its
// error cleared).
template <typename Kernel>
int ResidentPerSm(Kernel* kernel, int threads, int64_t smem) {
  int device = -1;
  const bool cached = OccupancyCacheOn() && cudaGetDevice(&device) == cudaSuccess;
  const OccupancyKey key{device, threads, smem, reinterpret_cast<const void*>(kernel)};
  if (cached) {
    const std::lock_guard<std::mutex> lock(OccupancyMutex());
    const auto it = OccupancyAnswers().find(key);
    if (it != OccupancyAnswers().end()) return it->second;
  }
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, static_cast<size_t>(smem)) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  if (cached && per_sm > 0) {
    const std::lock_guard<std::mutex> lock(OccupancyMutex());
    OccupancyAnswers().emplace(key, per_sm);
  }
  return per_sm;
}

// The dynamic shared memory to launch `blocks` blocks of `kernel` with so that no SM takes more than
// ceil(blocks / SMs) of them, where the grid is one wave with room to spare. The block scheduler
// is free to fill some SMs to their limit and leave others short, and on the imma kernel (launched
// while its prep kernel holds a few SMs) it did: 512 blocks at 5 and 6 a SM ran 3-5% slower than
// at a limit of 4 (docs/perf-log.md, entry 146; the same padding moved the mma kernels' M = 1
// grids by less than 0.4 us, and they do not take it). `smem` itself where the grid already
// needs every SM's limit, more than one wave, or the device's attributes or the padded launch's
// attribute are refused.
template <typename Kernel>
int BalancedSharedBytes(Kernel* kernel, int threads, int smem, int static_bytes, int64_t blocks, int sms) {
  const int per_sm = ResidentPerSm(kernel, threads, smem);
  const int64_t target = (blocks + sms - 1) / sms;
  if (per_sm <= 0 || target >= per_sm || blocks > int64_t{per_sm} * sms) return smem;
  int device = 0, sm_bytes = 0, reserved = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, device) != cudaSuccess) {
    cudaGetLastError();
    return smem;
  }
  // Past an SM's share for target + 1 blocks (the first multiple of 16 beyond it): target fit.
  const int padded = std::max(smem, (static_cast<int>(sm_bytes / (target + 1)) - reserved - static_bytes + 16) & ~15);
  if (padded == smem) return smem;
  if (!AllowSharedBytes(kernel, padded, static_bytes) || ResidentPerSm(kernel, threads, padded) != target) {
    cudaGetLastError();
    return smem;
  }
  return padded;
}

// The persistent kernel (x in shared memory, ffi/gemv_core.cuh): as many blocks as the device
// holds at once, so every warp's tiles are dealt in one wave.
template <typename Format, typename T, int kMt, int kLd, int kXw>
ffi::Error LaunchMmaXs(cudaStream_t stream, int32_t device, const GemvArgs& a) {
  auto* kernel = MmaGemvKernel<Format, T, kMt, 1, kLd, true, kXw>;
  const int64_t smem = MmaSharedBytes<Format, kXw, kLd, true>() + int64_t{2} * a.m * a.k;
  int sms = 0, per_sm = 0, optin = 0;
  cudaError_t err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: reading device attributes: ") + cudaGetErrorString(err));
  if (smem > optin)
    return Invalid("mma plan: x in shared memory needs " + std::to_string(smem) + " bytes of shared memory, the device has " +
                   std::to_string(optin) + " per block");
  if (!AllowSharedBytes(kernel, static_cast<int>(smem), 0) || (per_sm = ResidentPerSm(kernel, 32 * kXw, smem)) == 0) {
    const cudaError_t refused = cudaGetLastError();
    return ffi::Error::Internal(std::string("jaxgemv: MmaGemvKernel with x in shared memory (") + std::to_string(smem) +
                                " bytes) does not fit on the device" +
                                (refused != cudaSuccess ? std::string(": ") + cudaGetErrorString(refused) : std::string()));
  }
  const int64_t tile_blocks = ((a.n + 15) / 16 + kXw - 1) / kXw;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(tile_blocks, int64_t{per_sm} * sms));
  // A plain launch: the persistent kernel does not wait for the kernel before it (GridDependencyWait),
  // so it never takes programmatic dependent launch (JAXGEMV_PDL, PdlScope).
  kernel<<<static_cast<unsigned>(blocks), 32 * kXw, smem, stream>>>(a, 1, false, false);
  return LastLaunchError("MmaGemvKernel");
}

// Whether the per-block kernel at M = 1 with a K split stages x (gemv_core.cuh, MmaXStagedBytes)
// instead of carrying it in its ring: where staging leaves at least as many blocks resident per SM
// as the grid can use at once, or as the ring would. At the 8B decode's sizes it always does (their
// blocks are register-bound, or fewer than the SMs hold); a large K with a grid of several waves
// keeps the ring. Anything the runtime refuses (more shared memory than the device has) keeps the
// ring too, and its error is cleared. `ring`: the kernel's blocks per SM with x in the ring
// (ring_bytes), which the launcher has already asked.
template <typename Kernel>
bool StageX(Kernel* kernel, int sms, int optin, int64_t blocks, int threads, int ring_bytes, int ring,
            int64_t staged_bytes, int static_bytes) {
  if (staged_bytes + static_bytes > optin ||
      !AllowSharedBytes(kernel, std::max(ring_bytes, static_cast<int>(staged_bytes)), static_bytes)) {
    cudaGetLastError();
    return false;
  }
  const int staged = ResidentPerSm(kernel, threads, staged_bytes);
  const int64_t needed = (blocks + sms - 1) / sms;
  return staged > 0 && staged >= std::min<int64_t>(ring, needed);
}

// The per-block kernel's register bound (gemv_core.cuh, MIN_BLOCKS; the rule in common.h,
// TakesBoundedInstance): its K-split-8 instances of one m-tile with fragment-ordered x (M = 2-8 on
// weights of 64 MB and more) exist twice, as the compiler allocates them (NVFP4, int4 and int8 at
// 68-80 registers: three 8-warp blocks per SM) and held to four blocks per SM (64 registers, 16-56
// bytes of spills). The held one runs where it alone puts the whole grid in one wave: N = 8192 is
// 512 blocks, 1.29 waves of 396 on an H200 at three per SM and one of 528 at four
// (docs/perf-log.md, entries 107 (b) and 108: 8192 x 28672 at M = 4, NVFP4 with fp16 x 50.7 -> 45.0
// us; with bf16 x int4 73.4 -> 56.5, int8 103.2 -> 86.8, NVFP4 49.5 -> 49.2, no gain there and no
// loss; FP8 with fp16 x 66.2 -> 66.5, none either; for int4 and NVFP4 K split 6 now runs there
// instead, TakesKSplit6 below). Since the weight's stream (gemv_core.cuh, kStream) int4's and
// int8's unheld K-split-8 instances take 64 registers, four blocks per SM, so that neither the held
// instance nor K split 6 runs for them at M = 2-8 (docs/perf-log.md, entry 139: int4 bf16 8192 x
// 28672 at M = 4 / 8 62.7 / 64.1 -> 59.5 / 60.0 us, int8 104.1 / 103.1 -> 97.8 / 94.8, on an H100,
// int8 timed with int4's constant bias too). Where the grid fits either way the spills are all it
// brings (5120 x 17408, 320 blocks: 22.5 -> 30.5 with the bound held there too, 107 (a)). Two
// m-tiles (M 9-16) split 8 ways, x in either order, take x a chunk ahead (gemv_core.cuh, kAhead),
// at 88-128 registers two blocks per SM; their held instance keeps x at the chunk, at 72-80
// registers three per SM. At M = 16 (docs/perf-log.md, entry 111) int8 5120 x 17408 (320 blocks)
// ran 37.6 us so and 51.9 with x ahead, FP8 with fp16 x 6144 x 5120 (384) 14.2 and 17.7.
// JAXGEMV_MIN_BLOCKS, a diagnostic read once per process, forces it: 0 never, 4 wherever the
// instance exists (held to 4 blocks per SM with one m-tile, 3 with two); jaxgemv's planner rejects
// other values at trace time.
inline int MinBlocksMode() {
  static const int mode = [] {
    const int d = EnvDigit("JAXGEMV_MIN_BLOCKS", -1);
    return d == 0 || d == kMmaBoundedBlocks ? d : -1;
  }();
  return mode;
}

// The per-block kernel instance LaunchMmaBlocks starts from for (MT, KS, LD, XP) and M rows: the
// compiler's allocation, except at M = 2-8 without a K split (the lm_heads' one-warp blocks): an
// instance under __launch_bounds__(32, 1) (MIN_BLOCKS kMmaFreeRegisters), so that ptxas spends
// registers on loading a chunk's x pieces together ahead of its mma instead of one at a time
// before each (sm_90, bf16 x: int4's M > 1 loop took 80 -> 91 registers, 25 -> 22 warps per SM;
// int8 76 -> 88, FP8 and NVFP4 with fp16 x 72 -> 80 and 70 -> 78). On an H200 (docs/perf-log.md,
// entry 112, kernel us, M = 4 / 8) int4 248320 x 2048 went from 92.0 / 95.2 to 84.7 / 88.9 and
// 151936 x 2048 from 62.0 / 62.9 to 55.5 / 54.9, int8 and FP8 2-5% faster, NVFP4 unchanged. M = 1
// keeps the compiler's allocation: its loop reads x from the ring, and on this instance (the same
// loop, 22 blocks per SM instead of 25) every format's lm_heads ran within spread (entry 113 (d)).
// At M = 2 with a K split, where the format decodes into block columns (NVFP4 with fp16 x): the
// instance with block columns for two rows (gemv_core.cuh, COLS2), 80 registers against 70-72.
// On an H200 (docs/perf-log.md, entry 131, kernel us, cold, off -> on, two rounds on, within 0.1)
// 17408 x 5120 20.2 -> 19.5, 12288 x 4096 12.4 -> 12.0, 8192 x 28672 40.4 -> 40.1, 6144 x 4096
// 8.4 level. JAXGEMV_COLS2, a diagnostic read once per process: 0 never, 1 (the default)
// wherever it exists.
inline bool Columns2Mode() {
  static const bool on = EnvDigit("JAXGEMV_COLS2", 1) != 0;
  return on;
}
// Whether the per-block kernel has an x-ahead instance (MmaGemvKernel's XAHEAD) with these
// template arguments: int4, one m-tile, a K split (common.h, MmaXAheadFormat).
template <typename Format, int MT, int KSPLIT>
constexpr bool MmaHasXAheadInstance() {
  return MmaXAheadFormat(Format::kMmaFormat) && !Format::kXAhead && MT == 1 && KSPLIT > 1;
}
// JAXGEMV_XAHEAD, a diagnostic read once per process: 0 never the x-ahead instance, 1 (the default)
// where common.h's TakesXAheadRule says, 2 wherever it exists (M = 2-8).
inline int XAheadMode() {
  static const int mode = [] {
    const int d = EnvDigit("JAXGEMV_XAHEAD", 1);
    return d == 0 || d == 2 ? d : 1;
  }();
  return mode;
}
template <typename Format, typename T, int kMt, int kKs, int kLd, bool kXp>
auto* MmaStartKernel(int m) {
  auto* kernel = MmaGemvKernel<Format, T, kMt, kKs, kLd, kXp, 0>;
  if constexpr (kMt == 1 && kKs == 1) {
    if (m > 1) kernel = MmaGemvKernel<Format, T, kMt, kKs, kLd, kXp, 0, kMmaFreeRegisters>;
  }
  if constexpr (kMt == 1 && MmaHasColumns2<Format, T, kKs, kXp>()) {
    if (m == 2 && Columns2Mode()) kernel = MmaGemvKernel<Format, T, kMt, kKs, kLd, kXp, 0, 0, true>;
  }
  return kernel;
}

// The per-block kernel's ring of KS warps: weight and scales per stage, and at M = 1 (one_row) x
// in the ring too (gemv_core.cuh); with a K split the launcher may stage x after it instead.
template <typename Format, typename T, int KS, int LD>
constexpr int MmaRingSharedBytes(bool one_row) {
  return MmaSharedBytes<Format, KS, LD, false>() + (one_row ? KS * MmaStages<false>() * MmaXRingBytes<Format, T, LD>() : 0);
}

// GemvArgs::tile_prep: int4 / int8 with one m-tile and no K split (the lm_heads) stage each
// tile's scales and zero points once, after the ring, where they take at most kTilePrepBytes at
// M = 1 (x in the ring) and kTilePrepBytesGlobalX above (x read through L1 per chunk). On an H200
// (docs/perf-log.md, entry 114, kernel us, two rounds, off -> on): int4 248320 x 2048 (2 KB per
// tile) at M = 1 / 2 / 4 86.0-86.6 / 86.9-92.3 / 87.7-91.5 -> 80.6-83.1 / 84.4-85.0 / 85.7-86.7, M = 8
// unchanged; int8 at M = 1 / 4 / 8 145-149 / 148 / 151 -> 139 / 143 / 146; int4 128256 x 4096
// (4 KB per tile) at M = 1 87.0-87.8 -> 84.2-85.3 but at M = 4 96.0-97.0 -> 122.1, where the
// one-warp blocks' shared memory (~22 per SM x 10 KB) probably left L1 too little for x's 32 KB
// (not profiled).
// JAXGEMV_TILE_PREP, a diagnostic read once per process, forces it: 0 never, 1 wherever the
// kernel can (jaxgemv's planner rejects other values at trace time).
constexpr int64_t kTilePrepBytes = 4096, kTilePrepBytesGlobalX = 2048;
inline int TilePrepMode() {
  static const int mode = [] {
    const int d = EnvDigit("JAXGEMV_TILE_PREP", -1);
    return d == 0 || d == 1 ? d : -1;
  }();
  return mode;
}
// The shared memory a launch adds for its tile's scales: 0 where it stages them per window.
template <typename Format>
int TilePrepBytes(const GemvArgs& a, int64_t rows, int64_t ksplit, int64_t smem, int optin) {
  if constexpr (Format::kStagedPrep) {
    if (rows != 1 || ksplit != 1 || TilePrepMode() == 0) return 0;
    const int64_t bytes = Format::TileStageBytes(a.k, a.scale_shift, a.zero_points != nullptr);
    const bool take = smem + bytes <= optin &&
                      (TilePrepMode() == 1 || bytes <= (MmaOneRowX(static_cast<int>(rows), a.m) ? kTilePrepBytes : kTilePrepBytesGlobalX));
    return take ? static_cast<int>(bytes) : 0;
  }
  return 0;
}

// Blocks per SM of the instance LaunchMmaBlocks would start from (MmaStartKernel) at m-tiles kMt
// and K split kKs for `a`, with its ring and tile staging: 0 where the runtime refuses the
// shared-memory attribute or the query. For the launcher's rules that weigh a split other than
// the planned one (TakesKSplit6, TakesHalfKSplit, TakesDoubleKSplit).
template <typename Format, typename T, int kMt, int kKs, int kLd, bool kXp>
int StartInstancePerSm(const GemvArgs& a, int optin) {
  auto* kernel = MmaStartKernel<Format, T, kMt, kKs, kLd, kXp>(a.m);
  int smem = MmaRingSharedBytes<Format, T, kKs, kLd>(MmaOneRowX(kMt, a.m));
  smem += TilePrepBytes<Format>(a, kMt, kKs, smem, optin);
  const int per_sm =
      AllowSharedBytes(kernel, smem, MmaStaticSharedBytes<kKs, kMt>()) ? ResidentPerSm(kernel, 32 * kKs, smem) : 0;
  cudaGetLastError();  // a refused attribute or query: 0, which keeps the planned split
  return per_sm;
}

// K split 6 in place of K split 8 (one m-tile): six warps per block instead of eight put four
// blocks per SM at the compiler's own allocation wherever it takes up to 85 registers (6 x 32 x
// 85 x 4 <= 65536), where the K-split-8 blocks at 70-80 registers fit three. It runs where K
// split 8 would take more than one wave and K split 6 takes one, in the formats measured to gain
// (common.h: MmaKSplit6, with the measurements; the rule on counts is TakesKSplit6Rule there,
// which tools/waves.py and jaxgemv's tests read through _ext):
// - M = 2-8 (int4, NVFP4; x in fragment order, where the instance held to four blocks per SM
//   exists; int4's unheld one fits four since entry 139, so NVFP4's alone): where that held
//   instance would run, without its spills and register moves (int4 bf16's loop: 941 units of
//   issue cost per window and 108 bytes of spills held, 739 and none at K split 6;
//   docs/perf-log.md, entry 119). With x in row order (no held instance) the M = 1
//   rule below instead: 8192 x 8192 (512 tiles) at M = 2 / 4 / 8 went 23.7 / 24.8 / 27.7 -> 16.9
//   / 18.2 / 19.8 us for int4 and 18.7 / 22.0 / 25.3 -> 15.8 / 16.0 / 17.6 for NVFP4 with fp16 x
//   (entry 123).
// - M = 1 (int4, int8; x in the ring, or staged where that keeps the blocks the grid needs, as for
//   K split 8): where the compiler's K-split-8 instance alone would take more than one wave (8192
//   x 28672: 512 blocks, 396 at a time).
// Each warp takes windows w, w + 6, ..., so warps get unequal shares where the windows per tile
// are no multiple of 6 (8192 x 28672: 112 two-load windows, 19 or 18 each).
// JAXGEMV_K6, a diagnostic read once per process: 0 never, 1 (the default) the rule above, 2 in
// place of every one-m-tile K-split-8 launch of int4 and NVFP4 at any M (tests).
// JAXGEMV_MIN_BLOCKS forced (0 or 4) keeps K split 8.
inline int KSplit6Mode() {
  static const int mode = [] {
    const int d = EnvDigit("JAXGEMV_K6", 1);
    return d >= 0 && d <= 2 ? d : 1;
  }();
  return mode;
}
// `per_sm8`: blocks per SM of the K-split-8 instance the launcher has (not held; whether it holds
// the held one: `held`), x in the ring at M = 1; `x_forced`: x staged whatever the occupancy
// (x_stage 1, or the rows' sums of squares), which the rule does not count and so keeps K split 8.
template <typename Format, typename T, int kLd, bool kXp>
bool TakesKSplit6(const GemvArgs& a, int sms, int optin, int64_t blocks, int per_sm8, bool held, bool x_forced) {
  const int mode = MinBlocksMode() < 0 ? KSplit6Mode() : 0;
  if (mode != 1) return mode == 2;
  constexpr MmaFormat f = Format::kMmaFormat;
  if (!MayTakeKSplit6(f, a.m, kXp, held, x_forced, blocks, sms, per_sm8)) return false;  // no query where it cannot
  const int per_sm6 = StartInstancePerSm<Format, T, 1, 6, kLd, kXp>(a, optin);
  return TakesKSplit6Rule(f, a.m, kXp, held, x_forced, blocks, sms, per_sm8, per_sm6);
}

// Half the K split at M > 1 (TakesHalfKSplit): where the grid at the planned K split takes more
// than one wave and at half of it one (TakesBoundedInstance's window, with the two instances'
// resident blocks per SM; each block reads its tile's whole K either way, with half the warps). A
// grid just past one wave runs its last blocks on an idle device: 17408 x 5120 is 1088 blocks, and
// seven or eight four-warp blocks per SM (62-70 registers) hold 924-1056 of them. Nsight Compute
// (FP8, bf16 x, M = 2, docs/perf-log.md, entry 127) had the SMs active 65% of the kernel's cycles
// (1.18 waves); at M = 1 (1.03 waves, eight per SM) 83%. Two-warp blocks (66-68 registers, fourteen
// per SM) hold the whole grid: 16.5 warps per SM where the four-warp blocks ran 28, with no second
// wave. On an H200, kernel us, M = 2 / 4 / 8, the rule off -> on:
// - K split 4 -> 2, one m-tile (entry 127):
//   FP8, fp16 x    17408 x 5120 (1088 blocks)  33.0 / 33.0 / 33.9 -> 26.2 / 26.2 / 26.6
//                  20480 x 4096 (1280)         31.6 / 31.8 / 32.2 -> 24.9 / 24.9 / 24.9
//                  24576 x 4096 (1536)         32.5 / 32.6 / 33.4 -> 29.9 / 30.1 / 30.0
//   FP8, bf16 x    17408 x 5120                35.5 / 36.3 / 38.3 -> 29.1 / 29.1 / 29.5
//   and in an earlier call of the same A/B (bf16 x): NVFP4 17408 x 5120 20.7 / 20.9 / 21.3 -> 20.4 /
//   20.4 / 20.6, 24576 x 4096 21.2 / 21.5 / 21.8 -> 20.3 / 20.4 / 20.5, 28672 x 4096 (1792) 24.3 /
//   24.6 / 25.0 -> 23.5 / 23.7 / 23.9; int4 17408 x 5120 27.5 / 24.1 / 23.6 -> 25.6 / 23.6 / 23.4,
//   24576 x 4096 25.7 / 25.0 / 23.7 -> 25.7 / 23.8 / 23.2 (its two-warp blocks do not hold 1792
//   blocks: 28672 x 4096 keeps K split 4); FP8 28672 x 4096 level.
// - K split 8 -> 4, one m-tile, and K split 2 -> 1, and two m-tiles (M 9-16) K split 4 -> 2 (entry
//   128, c803999, the halved split forced against the plan): FP8 10240 x 8192 (640 blocks,
//   four eight-warp blocks per SM: 1.21 waves) with fp16 x 31.5 / 31.8 / 33.2 -> 24.6 / 24.7 / 26.0,
//   bf16 32.3 / 32.7 / 34.3 -> 24.9 / 25.1 / 25.5; 10240 x 5120 fp16 20.9 / 21.3 / 21.7 -> 16.1 /
//   16.1 / 16.9, bf16 20.9 / 21.0 / 22.6 -> 18.1 / 18.0 / 17.5; int8 7168 x 5120 (448 blocks, three
//   per SM, x in row order) at M = 2 / 4 17.8 / 18.4 -> 16.1 / 16.7 (bf16 x). 34816 x 5120 (2176
//   blocks, 12-14 two-warp blocks per SM) at M = 4 / 8, bf16 x: FP8 67.4 / 70.1 -> 53.1 / 53.4,
//   int4 43.8 / 44.4 -> 41.1 / 41.2, int8 60.1 / 66.7 -> 59.9 / 58.1; NVFP4 lost (34.6 / 35.0 ->
//   36.0 / 36.7) and keeps K split 2. At M = 16, bf16 x, 10240 x 5120 / 10240 x 8192 (640 blocks,
//   four per SM): int4 20.2 / 31.4 -> 17.5 / 26.3, NVFP4 17.7 / 25.2 -> 16.3 / 24.1.
// Which (m-tiles, K split) launches halve is the format's: those measured to gain (common.h,
// MmaHalvesKSplit; int8's two m-tiles at K split 8 judge it on the planned grid's last wave,
// MmaHalvesOnLastWave). At M = 1 K split 2 lost (int4 18.7 -> 20.0, NVFP4 19.7 -> 20.0 at 17408 x
// 5120; K split 1 at 34816 x 5120 lost 5-13% in every format; FP8's K split 4 at 10240 x 8192 was
// level), so M = 1 keeps its split (FP8: TakesKSplit8OneRow below). The instance held to more
// blocks per SM, where it runs, already holds its grid in one wave and keeps its split, except
// int8's two m-tiles, whose K split 4 ran 9-10% faster than the held K split 8 (entry 140).
// JAXGEMV_WAVES, a diagnostic read once per process: 0 never, 1 (the default) the rule above,
// TakesKSplit8OneRow and TakesDoubleKSplit below.
inline int WavesMode() {
  static const int mode = [] {
    const int d = EnvDigit("JAXGEMV_WAVES", 1);
    return d == 0 ? 0 : 1;
  }();
  return mode;
}
// `per_sm`: blocks per SM of the planned instance unheld (the launcher's one query of it); `held`:
// whether the launcher would run the held instance (common.h, TakesHalfKSplitRule).
template <typename Format, typename T, int kMt, int kKs, int kLd, bool kXp>
bool TakesHalfKSplit(const GemvArgs& a, int sms, int optin, int64_t blocks, int per_sm, bool held) {
  if constexpr (!MmaHalvesKSplit(Format::kMmaFormat, kMt, kKs)) {
    return false;
  } else {
    // The held instance forced (JAXGEMV_MIN_BLOCKS=4) runs as forced; within one wave no query.
    if (WavesMode() != 1 || a.m < 2 || (held && MinBlocksMode() == kMmaBoundedBlocks) || !PastOneWave(blocks, sms, per_sm))
      return false;
    return TakesHalfKSplitRule(Format::kMmaFormat, std::is_same_v<T, __half>, kMt, kKs, a.k, blocks, sms, per_sm, held,
                               StartInstancePerSm<Format, T, kMt, kKs / 2, kLd, kXp>(a, optin));
  }
}
// FP8 at M = 1 (common.h: MmaKSplit8PastOneWave): K split 8 in place of K split 4 where the K-split-4
// grid takes more than one wave and at most a quarter more. On an H200 (docs/perf-log.md, entry
// 127, kernel us, K split 4 -> 8 forced, eight four-warp blocks per SM at 64 registers, fp16 / bf16
// x): 17408 x 5120 (1088 blocks, 1.03 waves) 26.7 -> 25.6 / 29.9 -> 27.5, 20480 x 4096 (1280,
// 1.21) 25.7 -> 24.9 / 26.6 -> 26.2; past that it went both ways: 24576 x 4096 (1536) 29.8 ->
// 29.8 / 29.8 -> 30.3, 28672 x 4096 (1792) 33.9 -> 33.8 / 34.1 -> 34.5, 28672 x 8192 (1792) 64.6
// -> 64.3 / 66.9 -> 66.4 (a second call; the first's 67.1 -> 64.1 with bf16 x did not repeat).
// Why K split 8 (four blocks per SM, 2.1-2.4 waves) does better than K split 2 (one wave; 30.5
// against 30.1 at 17408 x 5120, bf16) is not known; the rule is kept to the grids where it was
// measured to gain. NVFP4 and int4 lost at 17408 x 5120 (19.7 -> 20.4, 18.7 ->
// 20.7). JAXGEMV_WAVES=0 keeps K split 4.
// `per_sm4`: blocks per SM of the planned K-split-4 instance.
template <typename Format>
bool TakesKSplit8OneRow(const GemvArgs& a, int sms, int64_t blocks, int per_sm4) {
  return MmaKSplit8PastOneWave(Format::kMmaFormat) && WavesMode() == 1 && a.m == 1 &&
         PastOneWaveByAQuarter(blocks, sms, per_sm4);
}

// Twice the K split at M 9-16 (common.h: MmaDoublesKSplit, TakesDoubleKSplitRule). `per_sm`:
// blocks per SM of the planned instance.
template <typename Format, typename T, int kMt, int kKs, int kLd, bool kXp>
bool TakesDoubleKSplit(const GemvArgs& a, int sms, int optin, int64_t blocks, int per_sm) {
  if (WavesMode() != 1 || a.m < 2 || !PastOneWave(blocks, sms, per_sm)) return false;
  return TakesDoubleKSplitRule(blocks, sms, per_sm, StartInstancePerSm<Format, T, kMt, 2 * kKs, kLd, kXp>(a, optin));
}

// One instance of the per-block tensor-core kernel: its shared memory, the instance held to more
// blocks per SM, K split 6 in place of K split 8 or half the K split (TakesKSplit6, TakesHalfKSplit
// above), x staged or not, and the launch (or, given a choice to fill, what it would launch).
// Returns the launch's error; a refused shared-memory attribute returns success and leaves its
// error for the caller's cudaGetLastError.
template <typename Format, typename T, int kMt, int kKs, int kLd, bool kXp>
cudaError_t LaunchMmaBlocks(cudaStream_t stream, const GemvArgs& a, int sms, int optin, bool x_sums, int64_t x_stage,
                            MmaLaunchChoice* choice) {
  const int m_blocks = (a.m + 8 * kMt - 1) / (8 * kMt);
  const int64_t blocks = static_cast<int64_t>((a.n + 15) / 16) * m_blocks;
  // The kernel's ring (MmaRingSharedBytes); x staged after the weight's ring where StageX says so.
  const bool one_row = MmaOneRowX(kMt, a.m);
  const int ring_bytes = MmaSharedBytes<Format, kKs, kLd, false>();
  int smem = MmaRingSharedBytes<Format, T, kKs, kLd>(one_row);
  const int tile_bytes = TilePrepBytes<Format>(a, kMt, kKs, smem, optin);
  smem += tile_bytes;
  auto* kernel = MmaStartKernel<Format, T, kMt, kKs, kLd, kXp>(a.m);
  constexpr int threads = 32 * kKs, static_bytes = MmaStaticSharedBytes<kKs, kMt>();
  // The planned instance's blocks per SM with x in the ring, asked once for every rule below (0
  // where the runtime refuses the attribute or the query, which keeps the plan as it is).
  const int per_sm = AllowSharedBytes(kernel, smem, static_bytes) ? ResidentPerSm(kernel, threads, smem) : 0;
  cudaGetLastError();
  int resident = per_sm;  // the same for the instance that runs
  bool take = false;      // the instance held to more blocks per SM
  auto* bounded = kernel;
  if constexpr (MmaHasBoundedInstance(kMt, kKs, kXp)) {
    bounded = MmaGemvKernel<Format, T, kMt, kKs, kLd, kXp, 0, MmaBoundedBlocks(kMt)>;
    const int mode = MinBlocksMode();
    if (mode != 0) {
      const int held = AllowSharedBytes(bounded, smem, static_bytes) ? ResidentPerSm(bounded, threads, smem) : 0;
      cudaGetLastError();  // a refused attribute or query leaves the unbounded kernel
      take = mode == kMmaBoundedBlocks || TakesBoundedInstance(blocks, sms, per_sm, held);
      if (take) resident = held;
    }
  }
  if constexpr (kMt == 1 && kKs == 8 && (MmaKSplit6(Format::kMmaFormat, false) || MmaKSplit6(Format::kMmaFormat, true))) {
    if (TakesKSplit6<Format, T, kLd, kXp>(a, sms, optin, blocks, per_sm, take, x_sums || x_stage == 1))
      return LaunchMmaBlocks<Format, T, 1, 6, kLd, kXp>(stream, a, sms, optin, x_sums, x_stage, choice);
  }
  if constexpr (MmaHalvesKSplit(Format::kMmaFormat, kMt, kKs)) {
    if (TakesHalfKSplit<Format, T, kMt, kKs, kLd, kXp>(a, sms, optin, blocks, per_sm, take))
      return LaunchMmaBlocks<Format, T, kMt, kKs / 2, kLd, kXp>(stream, a, sms, optin, x_sums, x_stage, choice);
  }
  if constexpr (kMt == 1 && kKs == 4) {
    if (TakesKSplit8OneRow<Format>(a, sms, blocks, per_sm))
      return LaunchMmaBlocks<Format, T, 1, 8, kLd, kXp>(stream, a, sms, optin, x_sums, x_stage, choice);
  }
  if constexpr (MmaDoublesKSplit(Format::kMmaFormat, kMt, kKs)) {
    if (TakesDoubleKSplit<Format, T, kMt, kKs, kLd, kXp>(a, sms, optin, blocks, per_sm))
      return LaunchMmaBlocks<Format, T, kMt, 2 * kKs, kLd, kXp>(stream, a, sms, optin, x_sums, x_stage, choice);
  }
  if (take) kernel = bounded;
  // The x-ahead instance at M = 2-8 (MmaHasXAheadInstance, TakesXAheadRule), not over the held one.
  bool x_ahead = false;
  if constexpr (MmaHasXAheadInstance<Format, kMt, kKs>()) {
    const int mode = XAheadMode();
    if (!take && !one_row && a.m <= 8 && (mode == 2 || (mode == 1 && MayTakeXAhead(blocks, sms, kKs, per_sm)))) {
      auto* ahead = MmaGemvKernel<Format, T, kMt, kKs, kLd, kXp, 0, 0, false, true>;
      const int per_sm_xa = AllowSharedBytes(ahead, smem, static_bytes) ? ResidentPerSm(ahead, threads, smem) : 0;
      cudaGetLastError();
      if (mode == 2 ? per_sm_xa > 0 : TakesXAheadRule(blocks, sms, kKs, per_sm, per_sm_xa)) {
        kernel = ahead, resident = per_sm_xa, x_ahead = true;
      }
    }
  }
  bool x_staged = false;
  if (kKs > 1 && one_row) {
    // In 64 bits: at a K of millions the staged x would not fit any device; StageX says
    // no, and a forced x_stage = 1 fails below at the shared-memory attribute.
    const int64_t staged = std::min<int64_t>(ring_bytes + MmaXStagedBytes<Format, T, kKs, kLd>(a.k), 1 << 30);
    x_staged = x_sums || x_stage == 1 ||
               (x_stage < 0 && StageX(kernel, sms, optin, blocks, threads, smem, resident, staged, static_bytes));
    if (x_staged) smem = static_cast<int>(staged);
  }
  if (!AllowSharedBytes(kernel, smem, static_bytes)) return cudaSuccess;  // the caller reads the error
  if (choice) {  // a query: what would run, without running it
    *choice = MmaLaunchChoice{kKs, take, x_staged, x_ahead};
    return cudaSuccess;
  }
  // Every block resident at once: gemv_core.cuh fetches the store's operands early only then.
  // (With x staged the shared memory changed since `resident` was asked; the attribute now allows it.)
  const bool one_wave = blocks <= int64_t{x_staged ? ResidentPerSm(kernel, threads, smem) : resident} * sms;
  GemvArgs la = a;
  la.l2_first = PdlMode() == 2;
  la.early_weights = EarlyReads();  // GemvArgs::early_weights
  la.early_trigger = EarlyTrigger();
  la.tile_prep = tile_bytes > 0;
  const cudaError_t launch = LaunchClustered(kernel, 1, static_cast<unsigned>(blocks), threads, static_cast<size_t>(smem),
                                             stream, PdlLaunch(), la, m_blocks, x_staged, one_wave);
  if (launch != cudaSuccess) cudaGetLastError();
  return launch;
}

// `choice`: nullptr to launch; otherwise filled with what would run and nothing is launched
// (MmaLaunchChoice, common.h).
template <typename Format, typename T>
ffi::Error LaunchMma(cudaStream_t stream, int32_t device, const GemvArgs& a, int64_t rows, int64_t ksplit,
                     int64_t loads, int64_t xperm, int64_t xs_warps, int64_t x_stage, MmaLaunchChoice* choice) {
  if (a.k % (4 * Format::kValuesPerChunk * loads) != 0)
    return Invalid("mma plan needs K % (" + std::to_string(4 * Format::kValuesPerChunk) + " x loads) == 0");
  if (x_stage < -1 || x_stage > 1) return Invalid("mma plan: x_stage must be -1 (the launcher's choice), 0 or 1");
  if (x_stage == 1 && (a.m != 1 || ksplit < 2 || rows != 1 || xs_warps))
    return Invalid("mma plan: x staged (x_stage 1) needs M = 1, rows 1, a K split and no xs_warps");
  // The kernel sums x's squares where it stages x: the launch stages it whatever StageX would say.
  const bool x_sums = RmsFromX(a);
  if (x_sums && (a.m != 1 || ksplit < 2 || rows != 1 || xs_warps || x_stage == 0))
    return Invalid("mma plan: rms_eps without the rows' sums of squares (the kernel sums x's squares) needs M = 1, "
                   "rows 1, a K split, no xs_warps and x staged (x_stage -1 or 1)");
  if (xs_warps) {
    // One m-tile holds every row up to M = 8, two from 9 to 16 (the kernel reads past-M lanes of
    // its last m-tile from the lanes of row 8 * (MT - 1), which must exist).
    if (ksplit != 1 || !xperm || a.m > 16 || rows != (a.m > 8 ? 2 : 1))
      return Invalid("mma plan: x in shared memory needs ksplit 1, xperm 1, M <= 16 and rows 1 up to M = 8, 2 above");
    ffi::Error err = Invalid("mma plan: xs_warps must be 0, 4, 8 or 16, loads 1 or 2");
    Switch<1, 2>(rows, [&](auto mt) {
      Switch<4, 8, 16>(xs_warps, [&](auto xw) {
        Switch<1, 2>(loads, [&](auto ld) {
          if (choice) {  // a query: these blocks take the plan as it is
            *choice = MmaLaunchChoice{1, false, false};
            err = ffi::Error::Success();
          } else {
            err = LaunchMmaXs<Format, T, decltype(mt)::value, decltype(ld)::value, decltype(xw)::value>(stream, device, a);
          }
        });
      });
    });
    return err;
  }
  int sms = 0, optin = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: reading device attributes: ") +
                                cudaGetErrorString(cudaGetLastError()));
  bool launched = false;
  cudaError_t launch_error = cudaSuccess;
  Switch<1, 2>(rows, [&](auto mt) {
    Switch<1, 2, 4, 8>(ksplit, [&](auto ks) {
      Switch<1, 2>(loads, [&](auto ld) {
        Switch<0, 1>(xperm, [&](auto xp) {
          launched = true;
          launch_error = LaunchMmaBlocks<Format, T, decltype(mt)::value, decltype(ks)::value, decltype(ld)::value,
                                         decltype(xp)::value != 0>(stream, a, sms, optin, x_sums, x_stage, choice);
        });
      });
    });
  });
  if (!launched) return Invalid("mma plan: rows must be 1 or 2, ksplit 1/2/4/8, loads 1/2, xperm 0/1");
  if (choice) {
    cudaGetLastError();  // a refused attribute leaves the choice unfilled (ksplit 0)
    return ffi::Error::Success();
  }
  if (launch_error != cudaSuccess)
    return ffi::Error::Internal(std::string("jaxgemv: launching MmaGemvKernel: ") + cudaGetErrorString(launch_error));
  return LastLaunchError("MmaGemvKernel");
}

// LaunchMma<Format, T> is compiled once per format and activation type, each in a translation
// unit of its own that CMake generates from ffi/mma_instance.cu.in, so that a parallel build
// spreads the tensor-core kernels over eight compiler processes instead of three (for sm_90 on
// one core, ffi/nbits.cu took 139 s with int4 and int8 for both types, the rest of the build's
// files 38 s at most; one of its four parts takes 32 s). A handler's translation unit names its
// format with JAXGEMV_EXTERN_MMA, which keeps it from compiling the kernels again.
#define JAXGEMV_MMA_INSTANCE(FORMAT, T)                                                                       \
  template ffi::Error LaunchMma<FORMAT, T>(cudaStream_t, int32_t, const GemvArgs&, int64_t, int64_t, int64_t, \
                                           int64_t, int64_t, int64_t, MmaLaunchChoice*)
#define JAXGEMV_EXTERN_MMA(FORMAT)                \
  extern JAXGEMV_MMA_INSTANCE(FORMAT, __half); \
  extern JAXGEMV_MMA_INSTANCE(FORMAT, __nv_bfloat16)

// The same, with the activation type taken from the FFI dtype (float16 or bfloat16, checked).
template <typename Format>
ffi::Error LaunchMmaFor(cudaStream_t stream, int32_t device, const GemvArgs& a, ffi::DataType dtype, int64_t rows,
                        int64_t ksplit, int64_t loads, int64_t xperm, int64_t xs_warps, int64_t x_stage) {
  return dtype == ffi::DataType::F16
             ? LaunchMma<Format, __half>(stream, device, a, rows, ksplit, loads, xperm, xs_warps, x_stage, nullptr)
             : LaunchMma<Format, __nv_bfloat16>(stream, device, a, rows, ksplit, loads, xperm, xs_warps, x_stage, nullptr);
}

// What LaunchMma would run for the query's product and plan (MmaLaunchChoice, common.h), asked
// with no buffers: the launcher's decisions read shapes and the device, never memory. The
// occupancy API reads the current device, so the query makes its device current for the call.
template <typename Format>
MmaLaunchChoice QueryMmaLaunch(const MmaLaunchQuery& q) {
  MmaLaunchChoice choice;
  if (q.m < 1 || q.n < 1 || q.k < 1 || q.m > INT32_MAX || q.n > INT32_MAX) return choice;
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess || (previous != q.device && cudaSetDevice(q.device) != cudaSuccess)) {
    cudaGetLastError();
    return choice;
  }
  GemvArgs a{};
  a.m = static_cast<int>(q.m), a.n = static_cast<int>(q.n), a.k = q.k;
  a.scale_shift = Log2(q.block_size);
  const ffi::Error err =
      q.f16 ? LaunchMma<Format, __half>(nullptr, q.device, a, q.rows, q.ksplit, q.loads, q.xperm, q.xs_warps, q.x_stage, &choice)
            : LaunchMma<Format, __nv_bfloat16>(nullptr, q.device, a, q.rows, q.ksplit, q.loads, q.xperm, q.xs_warps,
                                               q.x_stage, &choice);
  if (previous != q.device) cudaSetDevice(previous);
  cudaGetLastError();
  return err.failure() ? MmaLaunchChoice{} : choice;
}

}  // namespace jaxgemv
