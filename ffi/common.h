// Contract shared by the CPU and CUDA handlers: variant codes, shape checks, small helpers.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace jaxgemv {

namespace ffi = xla::ffi;

// Kernel variants of a quantized GEMV. Python reads these codes through the extension
// (`_jaxgemv.variant_codes()`), so they are defined only here.
enum class Variant : int64_t {
  kCpu = 0,     // the plain C++ handler
  kScalar = 1,  // CUDA: one warp per output column, fp32 FMAs, x rows tiled per block
  kMma = 2,     // CUDA: 16 columns per warp on mma.m16n8k16, K split across the warps of a block
  kSplitK = 3,  // CUDA, dense weights: K split across the blocks of a cluster (ffi/dense.cu)
};

inline std::pair<const char*, int64_t> kVariantCodes[] = {
    {"cpu", static_cast<int64_t>(Variant::kCpu)},
    {"scalar", static_cast<int64_t>(Variant::kScalar)},
    {"mma", static_cast<int64_t>(Variant::kMma)},
    {"splitk", static_cast<int64_t>(Variant::kSplitK)},
};

// The per-block tensor-core kernel's residency pin (ffi/gemv_launch.cuh): its K-split-8 instances
// of one m-tile with x in fragment order, and of two m-tiles with x in either order, exist twice,
// as the compiler allocates them and held to more blocks per SM: one m-tile to kMmaBoundedBlocks
// (`__launch_bounds__`), two to kMmaTwoTileBoundedBlocks by keeping x at the chunk instead of
// taking it ahead (gemv_core.cuh: kAhead; the register bound too for formats with
// Format::kBoundTwoTiles). The launcher runs the held one where
// only it puts the whole grid on the device at once: more blocks than the free instance's
// resident slots, no more than the held one's. The slots per SM come from the occupancy API on
// the device at hand; here they are arguments, so that jaxgemv's planner can answer for any SM
// count through the extension (planner.takes_bounded_instance) and its tests check the window.
constexpr int kMmaBoundedBlocks = 4;
// The lm_heads' one-warp blocks at M = 2-8 (gemv_launch.cuh): MIN_BLOCKS 1, which lets ptxas spend
// registers up to the whole file instead of choosing for occupancy.
constexpr int kMmaFreeRegisters = 1;
constexpr int kMmaTwoTileBoundedBlocks = 3;
constexpr int MmaBoundedBlocks(int64_t rows) { return rows == 2 ? kMmaTwoTileBoundedBlocks : kMmaBoundedBlocks; }
constexpr bool MmaHasBoundedInstance(int64_t rows, int64_t ksplit, bool xperm) {
  return ksplit == 8 && (rows == 2 || (rows == 1 && xperm));
}
// Whether a grid of `blocks` takes more than one wave of `per_sm` blocks on each of `sms` SMs (false
// where either count is unknown, 0): what every rule that weighs another instance or split starts
// from, so the launcher asks it before it queries the other's occupancy.
constexpr bool PastOneWave(int64_t blocks, int64_t sms, int64_t per_sm) {
  return sms > 0 && per_sm > 0 && blocks > per_sm * sms;
}
constexpr bool TakesBoundedInstance(int64_t blocks, int64_t sms, int64_t free_per_sm, int64_t bounded_per_sm) {
  return PastOneWave(blocks, sms, free_per_sm) && blocks <= bounded_per_sm * sms;
}
// FP8's K split 8 at M = 1 in place of K split 4 (gemv_launch.cuh, TakesKSplit8OneRow): where the
// K-split-4 grid of `blocks` takes more than one wave of `per_sm` blocks on each of `sms` SMs and at
// most a quarter of a wave more.
constexpr bool PastOneWaveByAQuarter(int64_t blocks, int64_t sms, int64_t per_sm) {
  return PastOneWave(blocks, sms, per_sm) && 4 * blocks <= 5 * per_sm * sms;
}
// The tensor-core formats (each format policy's kMmaFormat), for the launcher's per-format wave
// rules, kept here in one place for the launcher, jaxgemv's tests and tools/waves.py.
enum class MmaFormat { kNvfp4, kFp8, kInt4, kInt8 };
// Which formats take K split 8 in place of 4 at M = 1 (TakesKSplit8OneRow): FP8; NVFP4 and int4 lost
// there (docs/perf-log.md, entry 127).
constexpr bool MmaKSplit8PastOneWave(MmaFormat f) { return f == MmaFormat::kFp8; }
// Which (m-tiles, K split) launches run at half the split at M > 1 where only the half holds the
// grid in one wave (gemv_launch.cuh, TakesHalfKSplit): those measured to gain (docs/perf-log.md,
// entries 127, 128, 140). FP8 and int8 one m-tile from K split 8, 4 and 2 (int8's 4 -> 2 untimed:
// entry 127's rule, for every format); int4 one m-tile from 4 and 2, and from 8 where K split 6
// does not hold the grid (it takes K split 6 in place of 8 first; 10240 x 8192 at M = 2-8, 640
// blocks, four per SM at K split 8, six at 4; on an H100, bf16 x, M = 2 / 8: 27.4 / 31.7 -> 23.8 /
// 24.3 us, entry 142), two m-tiles from 4; NVFP4 from 4 with one or two (2 -> 1 lost on 34816 x
// 5120) and one m-tile from 8 where K split 6 does not hold the grid (entry 140: 10240 x 8192, 640
// blocks, three per SM at K split 8, six at 4; on an H100, M = 2 / 4 / 8, bf16 x 24.3 / 24.7 / 24.7
// -> 20.4 / 20.6 / 21.0, fp16 24.1 / 24.3 / 24.2 -> 20.6 / 21.0 / 21.5); int8's two m-tiles from 8
// on their last wave (MmaHalvesOnLastWave below). FP8's two m-tiles keep their split (entry 140: K
// split 4 -> 2 at M = 16 lost on 12288 x 4096, 23.5 -> 31.3, level on 17408 x 5120 and 20480 x
// 4096).
constexpr bool MmaHalvesKSplit(MmaFormat f, int mt, int ks) {
  switch (f) {
    case MmaFormat::kFp8:
      return mt == 1 && (ks == 8 || ks == 4 || ks == 2);
    case MmaFormat::kInt8:
      return mt == 1 ? ks == 8 || ks == 4 || ks == 2 : ks == 8;
    case MmaFormat::kInt4:
      return mt == 1 ? ks == 8 || ks == 4 || ks == 2 : ks == 4;
    case MmaFormat::kNvfp4:
      return ks == 4 || (mt == 1 && ks == 8);
  }
  return false;
}
// int8's two m-tiles (M 9-16) at K split 8 halve on the planned grid's last wave instead: where
// the half holds the grid in one wave and the unheld K-split-8 grid's last wave is at most three
// quarters full, ahead of the held instance. On an H100 (docs/perf-log.md, entry 140, kernel us,
// bf16 x, K split 8 -> 4, two per SM unheld, three held, five at K split 4): 5120 x 5120 (320
// blocks, 1.21 waves unheld, run held) 17.3 -> 15.7, 6144 x 4096 (384, 1.45, held) 15.2 -> 13.8,
// 7168 x 5120 (448, 1.70) 22.0 -> 20.2, 10240 x 5120 / 8192 (640, 2.42) 31.1 -> 25.1 / 45.0 ->
// 37.5; lost at 512 blocks (1.94 waves): 8192 x 8192 32.0 -> 32.7, 8192 x 28672 102.4 -> 114.4,
// and at 12288 x 4096 (768 blocks, 1.16 waves at K split 4) 28.3 -> 31.3. Kept to K up to 8192,
// where it was measured: the 12% lost at K = 28672 is more than its nearly full last wave could
// cost, so longer K may lose for itself (5120 x 17408 / 25600 at M = 16: the held K split 8 ran
// 41.3 / 58.8 against 54.5 / 81.6 forced to 4, entry 141). With fp16 x (`f16_x`) int8's two m-tiles
// take the other pairs' rule instead (the half where only it holds the grid in one wave, not where
// the held instance runs): at 512 blocks, two K-split-8 blocks per SM (1.94 waves), K split 4 ran
// faster with fp16 x and slower with bf16 (entry 141, H100, kernel us, K split 8 -> 4 forced):
// 8192 x 8192 fp16 35.1 -> 31.3, bf16 32.9 -> 33.3; 8192 x 28672 fp16 113.4 -> 103.7, bf16 104.2 ->
// 115.8.
constexpr bool MmaHalvesOnLastWave(MmaFormat f, bool f16_x, int mt, int ks) {
  return f == MmaFormat::kInt8 && !f16_x && mt == 2 && ks == 8;
}
constexpr int64_t kMmaHalvesOnLastWaveMaxK = 8192;
constexpr bool LastWaveAtMostThreeQuarters(int64_t blocks, int64_t sms, int64_t per_sm) {
  const int64_t wave = sms * per_sm, last = wave > 0 ? blocks % wave : 0;
  return sms > 0 && per_sm > 0 && last != 0 && 4 * last <= 3 * wave;
}
// The half-split rule on blocks per SM (gemv_launch.cuh, TakesHalfKSplit): `f16_x` whether x is
// fp16 (not bf16), `k` the product's K, `per_sm` of the planned instance unheld, `held` whether the
// launcher would run the held one, `per_sm_half` of the half.
constexpr bool TakesHalfKSplitRule(MmaFormat f, bool f16_x, int mt, int ks, int64_t k, int64_t blocks, int64_t sms,
                                   int64_t per_sm, bool held, int64_t per_sm_half) {
  if (!MmaHalvesKSplit(f, mt, ks) || !TakesBoundedInstance(blocks, sms, per_sm, per_sm_half)) return false;
  if (MmaHalvesOnLastWave(f, f16_x, mt, ks))
    return k <= kMmaHalvesOnLastWaveMaxK && LastWaveAtMostThreeQuarters(blocks, sms, per_sm);
  return !held;
}
// Twice the planned K split at M 9-16 (gemv_launch.cuh, TakesDoubleKSplit): int4's and NVFP4's two
// m-tiles from K split 2, where the planned grid runs past one wave and the doubled one, each block
// half as long, ends sooner by whole waves: fewer than twice the planned grid's waves, rounded up.
// 34816 x 5120 at M = 16 (docs/perf-log.md, entries 140 (g) and 141, H100): 2176 blocks, eight per
// SM at K split 2 (three waves for 2.06 of work), four at K split 4 (five for 4.12). Under this rule,
// bf16 x, kernel us, M = 16, two rounds: int4 34816 x 5120 57.6-57.9 -> 53.5-54.1, 51200 x 5120
// 82.0-82.2 -> 72.6-73.2, 57344 x 8192 137.0-138.7 -> 124.1-124.4; NVFP4 52.6-52.7 -> 51.2-51.8,
// 72.2-72.4 -> 69.4, 119.6-119.9 -> 113.6-113.8; 28672 x 4096 (planned at K split 4) level.
constexpr bool MmaDoublesKSplit(MmaFormat f, int mt, int ks) {
  return (f == MmaFormat::kInt4 || f == MmaFormat::kNvfp4) && mt == 2 && ks == 2;
}
// The launcher applies its rules again at the split it substitutes (LaunchMmaBlocks calls itself),
// so a pair from K split 4 down to 2 (TakesHalfKSplitRule) and back up must never both hold: the half
// takes a grid K split 2 holds in one wave, the double one K split 2 runs past it (test_planner,
// test_half_and_double_never_undo_each_other).
constexpr bool TakesDoubleKSplitRule(int64_t blocks, int64_t sms, int64_t per_sm, int64_t per_sm_twice) {
  if (!PastOneWave(blocks, sms, per_sm) || per_sm_twice <= 0) return false;
  const auto waves = [&](int64_t per) { return (blocks + per * sms - 1) / (per * sms); };
  return waves(per_sm_twice) < 2 * waves(per_sm);
}
// Which formats have an instance of the per-block kernel's one m-tile K-split launches that takes
// x a chunk ahead at M = 2-8 (gemv_core.cuh, XAHEAD; gemv_launch.cuh, TakesXAhead): int4, whose
// kernels otherwise load x at the chunk (Nbits::kXAhead). On an H100 (docs/perf-log.md, entry 141
// (f), bf16 x, kernel us, one round, M = 2 / 4 / 8) x ahead everywhere took 5120 x 17408 (320
// blocks, 19 warps per SM) from 25.8 / 28.4 / 27.7 to 24.5 / 26.3 / 24.7 and lost 3-5% on 8192 x
// 28672 (512 blocks, 31 warps per SM) even at the same 64 registers with one load. Under this
// rule (entry 144, H100, two rounds bf16 x and one fp16, kernel us at M = 2 / 4 / 8): 5120 x 17408
// 25.4 / 27.9 / 27.3 -> 23.9 / 25.4 / 24.1, 4096 x 14336 18.8 / 19.7 / 18.6 -> 16.0 / 17.0 / 15.5,
// 17408 x 5120 (K split 2) 28.5 / 27.9 / 27.7 -> 24.1 / 23.8 / 22.1, the one-load 5120 x 5120 and
// 6144 x 4096 4-9% faster, 8192 x 8192 / 28672 (not taken) unchanged.
constexpr bool MmaXAheadFormat(MmaFormat f) { return f == MmaFormat::kInt4; }
// At most this many warps per SM on average (blocks x K split over the SMs) for x ahead.
constexpr int64_t kMmaXAheadMaxWarpsPerSm = 24;
// The x-ahead rule: the grid leaves the SMs at most kMmaXAheadMaxWarpsPerSm warps each, and both
// the planned instance (`per_sm`) and the x-ahead one (`per_sm_xa`) hold it in one wave. The
// launcher asks MayTakeXAhead, the part that needs no occupancy query of the x-ahead instance,
// before it makes that query.
constexpr bool MayTakeXAhead(int64_t blocks, int64_t sms, int64_t ksplit, int64_t per_sm) {
  return sms > 0 && per_sm > 0 && blocks * ksplit <= kMmaXAheadMaxWarpsPerSm * sms && !PastOneWave(blocks, sms, per_sm);
}
constexpr bool TakesXAheadRule(int64_t blocks, int64_t sms, int64_t ksplit, int64_t per_sm, int64_t per_sm_xa) {
  return MayTakeXAhead(blocks, sms, ksplit, per_sm) && per_sm_xa > 0 && !PastOneWave(blocks, sms, per_sm_xa);
}
// Which formats run K split 6 in place of K split 8 (one m-tile) where only it holds the grid in
// one wave (gemv_launch.cuh, TakesKSplit6), at M = 2-8 (`one_row` false) and at M = 1. On an H200
// (docs/perf-log.md, entries 120 and 123, kernel us, K split 8 -> 6), 8192 x 28672 at M = 2 / 4 /
// 8: int4 (bf16 x) 52.1 / 53.6 / 53.1 -> 48.9 / 49.7 / 50.9, NVFP4 (fp16 x) 44.5 / 44.7 / 43.9 ->
// 41.7 / 42.1 / 41.3 (bf16 x at M = 4 / 8 within 3%), int8 lost (77 / 78 / 79 -> 79 / 80 / 84). At
// M = 1: int4 8192 x 28672 43.7-44.0 -> 42.4-43.0 and 8192 x 8192 15.0 -> 14.2-14.3; int8 (its
// K-split-8 instance takes 75 registers there, three 8-warp blocks per SM) 8192 x 8192 24.1-24.2
// -> 23.3-23.5, 8192 x 28672 within spread; NVFP4 lost 1.5-2% on 8192 x 28672 (fp16 x 40.7-40.8 ->
// 41.4) and gained 1-2% on 8192 x 8192. FP8's compiler instance holds four 8-warp blocks per SM
// already (62 registers): K split 6 never ran for it.
constexpr bool MmaKSplit6(MmaFormat f, bool one_row) {
  return one_row ? f == MmaFormat::kInt4 || f == MmaFormat::kInt8 : f == MmaFormat::kInt4 || f == MmaFormat::kNvfp4;
}
// Whether a format's one-m-tile K-split-8 launch may take K split 6, before K split 6's occupancy
// is asked: M = 1 unless x is staged whatever the occupancy (`x_forced`: x_stage 1, or the rows'
// sums of squares), which the rule does not count; M = 2-8 with x in fragment order only where
// the instance held to four blocks per SM would run (`held`, which already says that K split 8
// takes more than one wave), in row order (no held instance) by the M = 1 rule; and, but for
// that held case, only where the K-split-8 grid (`per_sm8` blocks per SM of the instance the
// launcher would run otherwise, unheld, x in the ring at M = 1) takes more than one wave.
constexpr bool MayTakeKSplit6(MmaFormat f, int64_t m, bool xperm, bool held, bool x_forced, int64_t blocks, int64_t sms,
                              int64_t per_sm8) {
  const bool format = m == 1 ? MmaKSplit6(f, true) && !x_forced : MmaKSplit6(f, false) && (!xperm || held);
  return format && ((m > 1 && xperm) || PastOneWave(blocks, sms, per_sm8));
}
// The rule itself, given also K split 6's blocks per SM (`per_sm6`): K split 6 where it holds all
// `blocks` at once and K split 8 does not.
constexpr bool TakesKSplit6Rule(MmaFormat f, int64_t m, bool xperm, bool held, bool x_forced, int64_t blocks,
                                int64_t sms, int64_t per_sm8, int64_t per_sm6) {
  return MayTakeKSplit6(f, m, xperm, held, x_forced, blocks, sms, per_sm8) && sms > 0 && per_sm6 * sms >= blocks;
}

// What the per-block tensor-core launcher runs for a plan on a device (ffi/gemv_launch.cuh,
// LaunchMma with a choice to fill): the K split after its own substitutions (TakesKSplit6,
// TakesHalfKSplit, TakesKSplit8OneRow), whether it takes the instance held to more blocks per SM, and
// whether it stages x (M = 1).
// The benchmark labels its rows with it (jaxgemv/_ext.py: mma_launch_choice). ksplit 0: no answer
// (no such device, or a plan the launcher would refuse).
struct MmaLaunchChoice {
  int ksplit = 0;
  bool held = false, x_staged = false, x_ahead = false;
};
// The product and plan a query asks about: a symmetric weight without epilogue (zero points and
// epilogues change no choice above K split 1; block_size only sizes int4 / int8 tile staging).
struct MmaLaunchQuery {
  int device = 0;
  bool f16 = false;
  int64_t m = 0, n = 0, k = 0, block_size = 0;
  int64_t rows = 1, ksplit = 1, loads = 1, xperm = 0, xs_warps = 0, x_stage = -1;
};

// Static shape of a product, checked once and shared by every handler.
struct ProductShape {
  int64_t m = 0, n = 0, k = 0;
  bool has_bias = false;
  ffi::DataType dtype = ffi::DataType::F16;
  bool has_row_scale = false, has_residual = false;  // CheckEpilogue
  float rms_eps = -1.0f, rms_inv_k = 0.0f;           // CheckEpilogue: the row scale from sums of squares
  bool rms_from_x = false;                           // CheckEpilogue: ... of x, summed by the handler
  // activation 1 (SwiGLU, jaxgemv/_product.py: ACTIVATIONS): W's rows are gate and up interleaved
  // in groups of 8 (rows 16j..16j+7 gate, 16j+8..16j+15 up), y [M, N / 2] = silu(gate) x up.
  int64_t activation = 0;
  int64_t n_out() const { return activation ? n / 2 : n; }
};

inline bool IsActivationType(ffi::DataType t) {
  return t == ffi::DataType::F16 || t == ffi::DataType::BF16;
}

inline ffi::Error Invalid(const std::string& what) {
  return ffi::Error::InvalidArgument("jaxgemv: " + what);
}

inline bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The checks that the int4 / int8 plans beside 'mma' (imma, xshare) share: symmetric weights, no
// SwiGLU, the RMSNorm's row scale handed in; `plan` names the variant in the message.
inline ffi::Error CheckPlainNbitsPlan(const std::string& plan, const ProductShape& s, int64_t has_zp) {
  if (has_zp) return Invalid(plan + " plan: weights with zero points run the 'mma' variant");
  if (s.activation) return Invalid(plan + " plan: SwiGLU runs the 'mma' variant");
  if (s.rms_from_x) return Invalid(plan + " plan: the RMSNorm's row scale must come as row_scale");
  return ffi::Error::Success();
}

// A plan's scratch result: at least `need` bytes, 16-byte aligned; `sizer` names the Python
// function that sizes it.
inline ffi::Error CheckPlanScratch(const std::string& plan, const ffi::AnyBuffer& scratch, int64_t need,
                                   const char* sizer) {
  if (scratch.size_bytes() < static_cast<size_t>(need))
    return Invalid(plan + " plan: the scratch result is too small (" + sizer + ")");
  if (!Aligned16(scratch.untyped_data())) return Invalid(plan + " plan: the scratch result must be 16-byte aligned");
  return ffi::Error::Success();
}

// The tail every product's check shares: bias [N] or [0] in x's type, y [M, N] in x's type ([M, N
// / 2] with SwiGLU, `activation` 1); then the shape.
inline ffi::Error CheckBiasAndOutput(const ffi::AnyBuffer& x, const ffi::AnyBuffer& bias, const ffi::AnyBuffer& y,
                                     int64_t m, int64_t n, int64_t k, ProductShape* out, int64_t activation = 0) {
  if (bias.element_count() != 0 && (bias.element_count() != n || bias.element_type() != x.element_type()))
    return Invalid("bias must be [N] in x's type, or empty");
  if (activation < 0 || activation > 1) return Invalid("activation must be 0 (none) or 1 (SwiGLU)");
  if (activation && n % 16 != 0) return Invalid("SwiGLU needs N % 16 == 0 (gate and up rows interleaved by 8)");
  auto yd = y.dimensions();
  if (yd.size() != 2 || yd[0] != m || yd[1] != (activation ? n / 2 : n) || y.element_type() != x.element_type())
    return Invalid(activation ? "y must be [M, N / 2] in x's type (SwiGLU)" : "y must be [M, N] in x's type");
  *out = ProductShape{m, n, k, bias.element_count() != 0, x.element_type()};
  out->activation = activation;
  return ffi::Error::Success();
}

// The epilogue operands after the bias (jaxgemv/_product.py: EPILOGUE): row_scale float32 [M],
// multiplying each row's float32 product before the bias, and residual [M, N] in x's type, added
// last; each empty when absent. After the format's check, which set `out`'s shape.
//
// rms_eps >= 0 (an RMSNorm in front of the product, jaxgemv/_product.py: Call.rms): row_scale
// holds each row's sum of squares, and the row's scale is rsqrt(sum x rms_inv_k + rms_eps); with
// row_scale empty the handler sums the squares of x's rows itself (rms_from_x: the CPU handlers
// and the per-block tensor-core kernel at M = 1 with a K split, RmsFromX in ffi/gemv_core.cuh;
// the other kernels refuse it). rms_eps < 0: row_scale, if given, is the scale itself.
inline ffi::Error CheckEpilogue(const ffi::AnyBuffer& x, const ffi::AnyBuffer& row_scale,
                                const ffi::AnyBuffer& residual, float rms_eps, float rms_inv_k, ProductShape* out) {
  if (rms_eps >= 0.0f && !(rms_inv_k > 0.0f)) return Invalid("rms_eps needs rms_inv_k > 0 (1 / K)");
  out->rms_eps = rms_eps >= 0.0f ? rms_eps : -1.0f;
  out->rms_inv_k = rms_inv_k;
  out->rms_from_x = rms_eps >= 0.0f && row_scale.element_count() == 0;
  if (row_scale.element_count() != 0 &&
      (row_scale.element_count() != out->m || row_scale.element_type() != ffi::DataType::F32))
    return Invalid("row_scale must be float32 [M], or empty");
  if (residual.element_count() != 0) {
    auto rd = residual.dimensions();
    if (rd.size() != 2 || rd[0] != out->m || rd[1] != out->n_out() || residual.element_type() != x.element_type())
      return Invalid("residual must be y's shape in x's type, or empty");
  }
  out->has_row_scale = row_scale.element_count() != 0;
  out->has_residual = residual.element_count() != 0;
  return ffi::Error::Success();
}

// x [M, K] fp16/bf16; packed u8 [N, K/2]; scales u8 [N, K/16]; global_scale f32 [];
// x's order for the tensor-core kernel, the plans' xperm (jaxgemv/_product.py: x_order): 0 row
// order; 1 fragment order in 8-row m-tiles, M padded to 8 (to 16 with two); 2 fragment order of
// one m-tile of M < 8 rows, unpadded (gemv_core.cuh, GemvArgs::x_lanes). The rows x has.
inline int64_t XRowMultiple(bool mma, int64_t xperm) { return mma && xperm == 1 ? 8 : 1; }
// GemvArgs::x_lanes for an order: 4 M pieces per window, chunk and word where x comes unpadded
// (xperm 2), else the 32 lanes of an 8-row m-tile.
inline int XLanes(int64_t xperm, int m) { return xperm == 2 ? 4 * m : 32; }
// `compact`: whether the format's kernels read x unpadded (their kCompactX).
inline ffi::Error CheckXOrder(int64_t xperm, int64_t m, int64_t rows, int64_t xs_warps, bool compact) {
  if (xperm < 0 || xperm > 2) return Invalid("xperm must be 0, 1 or 2, got " + std::to_string(xperm));
  if (xperm == 2 && !compact) return Invalid("xperm 2 (x in fragment order, unpadded) is for FP8 and NVFP4 only");
  if (xperm == 2 && (m >= 8 || rows != 1 || xs_warps != 0))
    return Invalid("xperm 2 (x in fragment order, unpadded) needs M < 8, one m-tile and no x in shared memory");
  return ffi::Error::Success();
}

// bias [N] or [0] in x's type; y [M, N] in x's type.
inline ffi::Error CheckFp4Matmul(const ffi::AnyBuffer& x, const ffi::AnyBuffer& packed,
                                 const ffi::AnyBuffer& scales, const ffi::AnyBuffer& gscale,
                                 const ffi::AnyBuffer& bias, const ffi::AnyBuffer& y,
                                 ProductShape* out, int64_t x_row_multiple = 1, int64_t activation = 0) {
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto sd = scales.dimensions();
  auto yd = y.dimensions();
  if (!IsActivationType(x.element_type())) return Invalid("x must be float16 or bfloat16");
  if (xd.size() != 2) return Invalid("x must be 2-D [M, K]");
  if (pd.size() != 2 || packed.element_type() != ffi::DataType::U8)
    return Invalid("packed must be uint8 [N, K/2]");
  // x_row_multiple > 1: x comes padded to that many rows (fragment order, see gemv_core.cuh).
  if (yd.size() != 2) return Invalid("y must be 2-D [M, N]");
  const int64_t m = yd[0], k = xd[1], n = pd[0];
  if (xd[0] != (m + x_row_multiple - 1) / x_row_multiple * x_row_multiple)
    return Invalid(x_row_multiple > 1 ? "x must be [M rounded up to 8, K] in fragment order (xperm 1)"
                                      : "x must have M rows, as y");
  if (k % 16 != 0 || pd[1] * 2 != k) return Invalid("packed must be [N, K/2] with K % 16 == 0");
  if (sd.size() != 2 || sd[0] != n || sd[1] != k / 16 || scales.element_type() != ffi::DataType::U8)
    return Invalid("scales must be uint8 [N, K/16]");
  if (gscale.element_count() != 1 || gscale.element_type() != ffi::DataType::F32)
    return Invalid("global_scale must be one float32");
  return CheckBiasAndOutput(x, bias, y, m, n, k, out, activation);
}

// packed u8 [N, K/2]; scales u8 [N, K/16]; global_scale f32 []; w [N, K] fp16/bf16.
inline ffi::Error CheckFp4Dequantize(const ffi::AnyBuffer& packed, const ffi::AnyBuffer& scales,
                                     const ffi::AnyBuffer& gscale, const ffi::AnyBuffer& w,
                                     ProductShape* out) {
  auto pd = packed.dimensions();
  auto sd = scales.dimensions();
  auto wd = w.dimensions();
  if (pd.size() != 2 || packed.element_type() != ffi::DataType::U8)
    return Invalid("packed must be uint8 [N, K/2]");
  const int64_t n = pd[0], k = pd[1] * 2;
  if (k % 16 != 0) return Invalid("K must be a multiple of 16");
  if (sd.size() != 2 || sd[0] != n || sd[1] != k / 16 || scales.element_type() != ffi::DataType::U8)
    return Invalid("scales must be uint8 [N, K/16]");
  if (gscale.element_count() != 1 || gscale.element_type() != ffi::DataType::F32)
    return Invalid("global_scale must be one float32");
  if (!IsActivationType(w.element_type()) || wd.size() != 2 || wd[0] != n || wd[1] != k)
    return Invalid("the dequantized weight must be float16 or bfloat16 [N, K]");
  *out = ProductShape{0, n, k, false, w.element_type()};
  return ffi::Error::Success();
}

// FP8: x [M, K] (or [M rounded up to x_row_multiple, K] in fragment order); data u8 [N, K] of
// E4M3 codes; scales f32 [N, ceil(K / block_k)], one per row and block of K (jaxgemv/fp8.py
// expands row blocks); bias [N] or [0] in x's type; y [M, N] in x's type.
inline ffi::Error CheckFp8Matmul(const ffi::AnyBuffer& x, const ffi::AnyBuffer& data,
                                 const ffi::AnyBuffer& scales, const ffi::AnyBuffer& bias,
                                 const ffi::AnyBuffer& y, int64_t block_k, ProductShape* out,
                                 int64_t x_row_multiple = 1, int64_t activation = 0) {
  auto xd = x.dimensions();
  auto dd = data.dimensions();
  auto sd = scales.dimensions();
  auto yd = y.dimensions();
  if (!IsActivationType(x.element_type())) return Invalid("x must be float16 or bfloat16");
  if (xd.size() != 2 || yd.size() != 2) return Invalid("x and y must be 2-D");
  if (dd.size() != 2 || data.element_type() != ffi::DataType::U8) return Invalid("data must be uint8 [N, K]");
  const int64_t m = yd[0], n = dd[0], k = dd[1];
  if (xd[1] != k || xd[0] != (m + x_row_multiple - 1) / x_row_multiple * x_row_multiple)
    return Invalid("x must be [M, K] to match data [N, K] and y [M, N]");
  if (block_k <= 0) return Invalid("block_k must be positive");
  if (sd.size() != 2 || sd[0] != n || sd[1] != (k + block_k - 1) / block_k ||
      scales.element_type() != ffi::DataType::F32)
    return Invalid("scales must be float32 [N, ceil(K / block_k)]");
  return CheckBiasAndOutput(x, bias, y, m, n, k, out, activation);
}

// int4 / int8 (MatMulNBits): x [M, K] (or [M rounded up to x_row_multiple, K] in fragment
// order); packed u8 [N, blocks, bs * bits / 8]; scales [N, blocks] in x's type; zero points u8
// [N, ceil(blocks * bits / 8)] packed like the codes, or [0] (has_zp false); bias; y [M, N].
inline ffi::Error CheckNbitsMatmul(const ffi::AnyBuffer& x, const ffi::AnyBuffer& packed,
                                   const ffi::AnyBuffer& scales, const ffi::AnyBuffer& zp,
                                   const ffi::AnyBuffer& bias, const ffi::AnyBuffer& y, int64_t bits,
                                   int64_t block_size, int64_t has_zp, ProductShape* out,
                                   int64_t x_row_multiple = 1, int64_t activation = 0) {
  if (bits != 4 && bits != 8) return Invalid("bits must be 4 or 8");
  if (block_size < 16 || block_size > 256 || (block_size & (block_size - 1)))
    return Invalid("block_size must be 16, 32, 64, 128 or 256");
  auto xd = x.dimensions();
  auto pd = packed.dimensions();
  auto sd = scales.dimensions();
  auto yd = y.dimensions();
  if (!IsActivationType(x.element_type()) || xd.size() != 2 || yd.size() != 2)
    return Invalid("x must be float16 or bfloat16 [M, K], y 2-D");
  const int64_t m = yd[0], k = xd[1];
  if (xd[0] != (m + x_row_multiple - 1) / x_row_multiple * x_row_multiple)
    return Invalid("x must have M rows (fragment order: M rounded up to 8)");
  if (pd.size() != 3 || packed.element_type() != ffi::DataType::U8)
    return Invalid("packed must be uint8 [N, blocks, bs*bits/8]");
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
  return CheckBiasAndOutput(x, bias, y, m, n, k, out, activation);
}

// The FFI contract of the products, written once for the CPU and CUDA handlers: each platform
// starts the binding with its own context (the CUDA stream) and appends these. Every quantized
// product takes x, its weight's arrays and the epilogue operands (bias, row scale, residual:
// CheckEpilogue), returns y, and carries the plan's launch parameters
// (jaxgemv/planner.py: Plan) as attributes; a format appends its own after them.
// (Bindings move only through their member functions, so these take and pass them by reference.)
template <int N, typename Binding>
auto AppendBufferArgs(Binding&& b) {
  static_assert(N >= 1);
  if constexpr (N == 1) {
    return std::forward<Binding>(b).template Arg<ffi::AnyBuffer>();
  } else {
    return AppendBufferArgs<N - 1>(std::forward<Binding>(b).template Arg<ffi::AnyBuffer>());
  }
}

template <int kWeightArrays, typename Binding>
auto BindProduct(Binding&& b) {
  return AppendBufferArgs<kWeightArrays + 4>(std::forward<Binding>(b))  // x, the weight's arrays, epilogue
      .template Ret<ffi::AnyBuffer>()                                   // y
      .template Attr<int64_t>("variant")
      .template Attr<int64_t>("rows")
      .template Attr<int64_t>("ksplit")
      .template Attr<int64_t>("loads")
      .template Attr<int64_t>("xperm")
      .template Attr<int64_t>("xs_warps")
      .template Attr<int64_t>("x_stage")  // M = 1 with a K split: -1 the launcher's choice, 0 ring, 1 staged
      .template Attr<float>("rms_eps")     // < 0: row_scale is the scale (CheckEpilogue)
      .template Attr<float>("rms_inv_k")
      .template Attr<int64_t>("activation");  // 0 none, 1 SwiGLU (ProductShape)
}

// NVFP4: packed, scales, global_scale.
template <typename Binding>
auto BindFp4Matmul(Binding b) {
  return BindProduct<3>(std::move(b));
}

// FP8: data, scales; block_k values of K per scale.
template <typename Binding>
auto BindFp8Matmul(Binding b) {
  return BindProduct<2>(std::move(b)).template Attr<int64_t>("block_k");
}

// int4 / int8: packed, scales, zero points.
template <typename Binding>
auto BindNbitsMatmul(Binding b) {
  return BindProduct<3>(std::move(b))
      .template Attr<int64_t>("bits")
      .template Attr<int64_t>("block_size")
      .template Attr<int64_t>("has_zp");
}

// Dense fp16/bf16 weight (jaxgemv/dense.py): x [M, K]; w [N, K] in x's type; bias [N] or [0] in
// x's type; y [M, N] in x's type.
inline ffi::Error CheckDenseMatmul(const ffi::AnyBuffer& x, const ffi::AnyBuffer& w, const ffi::AnyBuffer& bias,
                                   const ffi::AnyBuffer& y, ProductShape* out) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  if (!IsActivationType(x.element_type()) || xd.size() != 2) return Invalid("x must be float16 or bfloat16 [M, K]");
  if (wd.size() != 2 || w.element_type() != x.element_type() || wd[1] != xd[1])
    return Invalid("w must be [N, K] in x's type");
  const int64_t m = xd[0], n = wd[0], k = xd[1];
  return CheckBiasAndOutput(x, bias, y, m, n, k, out);
}

// Dense: x, w, bias -> y. Its plan (jaxgemv/planner.py: DensePlan) is not the quantized GEMVs':
// `splits` blocks of a cluster share K, `loads` 16-byte loads per lane and weight row in flight.
template <typename Binding>
auto BindDenseMatmul(Binding b) {
  return AppendBufferArgs<3>(std::move(b))  // x, w, bias
      .template Ret<ffi::AnyBuffer>()       // y
      .template Attr<int64_t>("variant")
      .template Attr<int64_t>("splits")
      .template Attr<int64_t>("loads");
}

template <typename Binding>
auto BindFp4Dequantize(Binding b) {
  return std::move(b).template Arg<ffi::AnyBuffer>()  // packed
      .template Arg<ffi::AnyBuffer>()                // scales
      .template Arg<ffi::AnyBuffer>()                // global_scale
      .template Ret<ffi::AnyBuffer>()                // w
      .template Attr<int64_t>("apply_global_scale");  // apply_global_scale
}

}  // namespace jaxgemv
