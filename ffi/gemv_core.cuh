// The quantized GEMV core: y[M, N] = x[M, K] @ dequant(W[N, K])^T for small M, templated on a
// format policy (how 16 bytes of a weight row decode: ffi/nvfp4.cuh, ffi/fp8.cuh, ffi/nbits.cuh)
// and on the activation type. Three kernels: the tensor-core GEMV, the warp-per-column GEMV and the dequantizer that
// feeds XLA's dot above the GEMV range.
#pragma once

#include "cuda_util.cuh"

namespace jaxgemv {

struct GemvArgs {
  const void* x;          // [M, K] activations
  const uint8_t* w;       // [N, RowBytes(K)] packed weight
  const uint8_t* scales;  // [N, ScaleRowBytes(K)] block scales
  const float* gscale;    // [] global scale (device memory), or nullptr: none
  const void* bias;       // [N] or nullptr
  void* y;                // [M, N]
  int m, n;
  int64_t k;
  int scale_shift = 0;    // formats with per-block scales along K: log2 of the values per block
  const uint8_t* zero_points = nullptr;  // int4/int8: packed zero points, or nullptr (2^(bits-1))
  // The store's epilogue beyond the bias (jaxgemv/_product.py: EPILOGUE), each nullptr when absent:
  // y = acc x row_scale[m] + bias[n] + residual[m, n], in float32, rounded once.
  const float* row_scale = nullptr;  // [M]
  const void* residual = nullptr;    // [M, N] in x's type
  // rms_eps >= 0: row_scale holds each row's sum of squares of the normalized input, and the row
  // scale is rsqrt(row_scale[m] x rms_inv_k + rms_eps) (an RMSNorm in front, its gain folded
  // into the weight; RowScale). rms_eps >= 0 without a row_scale (RmsFromX): the kernel sums the
  // squares of x itself, which only the per-block tensor-core kernel does, at M = 1 with a K split
  // and x staged (the launcher checks).
  float rms_eps = -1.0f, rms_inv_k = 0.0f;
  // SwiGLU in the store (tensor-core kernel only): W's rows are gate and up interleaved by 8
  // (ProductShape::activation), so that lane (g, t) holds both rows of output tile x 8 + g (rows g
  // and g + 8 of its tile); y and residual are [M, N / 2].
  bool swiglu = false;
  // JAXGEMV_PDL=2 (cluster.cuh: PdlMode): the tensor-core kernel sends its first windows' weight
  // rows to L2 before it waits for the kernel before it.
  bool l2_first = false;
  // Whether the tensor-core kernel may copy its first windows of weight and scales before it waits
  // for the kernel before it (GridDependencyWait): true where that kernel writes no weight (it is
  // launched without programmatic dependent launch, so nothing runs beside it; or inside
  // decoder_layer's call, ffi/layer.cu, where the kernel before is one of the layer's own, which
  // write activations only). False under the JAXGEMV_PDL diagnostic, which launches every
  // product with the attribute whatever ran before it.
  bool early_weights = false;
  // Whether the tensor-core kernel lets the next kernel launch at its start instead of once its
  // weight stream is done (cluster.cuh: EarlyTrigger; the per-block kernel only).
  bool early_trigger = false;
  // Whether the per-block tensor-core kernel (int4 / int8, one m-tile, no K split) stages its tile's
  // scales and zero points once, after its ring (ffi/nbits.cuh: StageTile; the launcher sizes
  // shared memory for them), instead of each window's in its stage.
  bool tile_prep = false;
  // x in fragment order (XPERM): its 16-byte pieces per window, chunk and word, one per lane of
  // the m-tile's rows: 32 (8-row m-tiles, M padded) or 4 M (one m-tile of M < 8 rows, unpadded:
  // the rows past M read row 0's pieces, as in row order, and their sums are never stored).
  int x_lanes = 32;
};

// Whether the kernel forms the RMSNorm's row scale from x's own squares (GemvArgs::rms_eps).
__host__ __device__ __forceinline__ bool RmsFromX(const GemvArgs& a) { return a.rms_eps >= 0.0f && !a.row_scale; }

// The sum of squares of 8 values of x (one 16-byte piece), in float32, added to s.
template <typename T>
__device__ __forceinline__ float SquareSum(const uint4& v, float s) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Act<T>::ToFloat2(FromU32<typename Act<T>::T2>(w[i]));
    s = fmaf(f.x, f.x, s);
    s = fmaf(f.y, f.y, s);
  }
  return s;
}

// Row m's scale (a.row_scale present): as given, or formed from the row's sum of squares.
__device__ __forceinline__ float RowScale(const GemvArgs& a, int m) {
  const float s = a.row_scale[m];
  return a.rms_eps >= 0.0f ? rsqrtf(fmaf(s, a.rms_inv_k, a.rms_eps)) : s;
}

// Activations in the decode's pairing: 8 consecutive x values (one 16-byte load) as the four
// pairs (j, j + 4), the order in which every format's DecodeWord pairs 8 weight values. XPERM: x
// arrives with each group of 8 already stored in that order (jaxgemv/_product.py: fragment_order),
// so the pairs are the loaded registers as they are.
template <bool XPERM>
__device__ __forceinline__ void XPairs(const uint4& v, uint32_t (&pairs)[4]) {
  if constexpr (XPERM) {
    pairs[0] = v.x, pairs[1] = v.y, pairs[2] = v.z, pairs[3] = v.w;
  } else {
    pairs[0] = __byte_perm(v.x, v.z, 0x5410);  // (0, 4)
    pairs[1] = __byte_perm(v.x, v.z, 0x7632);  // (1, 5)
    pairs[2] = __byte_perm(v.y, v.w, 0x5410);  // (2, 6)
    pairs[3] = __byte_perm(v.y, v.w, 0x7632);  // (3, 7)
  }
}

// A product's value as stored: v (the float32 product, unit applied) times the row scale, plus
// the bias and the residual, each where present.
template <typename T>
__device__ __forceinline__ float Epilogue(float v, const GemvArgs& a, int m, int n) {
  if (a.row_scale) v *= RowScale(a, m);
  if (a.bias) v += Act<T>::ToFloat(static_cast<const T*>(a.bias)[n]);
  if (a.residual) v += Act<T>::ToFloat(static_cast<const T*>(a.residual)[static_cast<int64_t>(m) * a.n + n]);
  return v;
}

// Every format's DecodeWord<T, W, ALT> and Unit<T, ALT> take a second decode's flag, which the
// per-block kernel sets in its K-split instances (kAltDecode); a format with one decode ignores it
// (FP8's is the pair conversion, fp8.cuh).
// Base of the formats that need no unit correction in the epilogue.
struct UnitOne {
  template <typename T, bool ALT = false>
  __device__ static constexpr float Unit() {
    return 1.0f;
  }
};
// Base of the formats whose decode leaves values in units of Bits<T>::kUnit: the epilogue's
// multiplier that takes them back to values.
template <template <typename> class Bits>
struct UnitFrom {
  template <typename T, bool ALT = false>
  __device__ static constexpr float Unit() {
    return Bits<T>::kUnit;
  }
};

// Formats whose stage holds, per row, scales and zero points to be located per window
// (Format::kStagedPrep: int4/int8) set that up once per window and row, from the window's stage
// or from the tile's, staged once (GemvArgs::tile_prep); the others carry nothing. At one m-tile
// and K split 8 (the kernel's kStream) their copies take each window's pieces from a cursor per
// lane (Cursor: set at the warp's first window of a tile and advanced one step, the windows
// between two of the warp's, per window) instead of an address formed from the window's index.
template <typename Format, typename = void>
struct StagedRows {
  struct Row {};
  struct Cursor {};
  __device__ static __forceinline__ Row Of(const uint8_t*, const GemvArgs&, int, int, int) { return {}; }
  __device__ static __forceinline__ Row OfTile(const uint8_t*, const GemvArgs&, int, int, int) { return {}; }
  __device__ static __forceinline__ void StageTile(uint8_t*, const GemvArgs&, int, int) {}
  template <int LOADS>
  __device__ static __forceinline__ Cursor From(const GemvArgs&, int, int, int, int) {
    return {};
  }
  __device__ static __forceinline__ void Next(uint8_t*, Cursor&, const GemvArgs&, int) {}
};
template <typename Format>
struct StagedRows<Format, std::enable_if_t<Format::kStagedPrep>> {
  using Row = typename Format::WindowRow;
  __device__ static __forceinline__ Row Of(const uint8_t* stage, const GemvArgs& a, int r, int row, int k0) {
    return Format::StagedRow(stage, a, r, row, k0);
  }
  __device__ static __forceinline__ Row OfTile(const uint8_t* area, const GemvArgs& a, int tile, int row, int k0) {
    return Format::TileRow(area, a, tile, row, k0);
  }
  __device__ static __forceinline__ void StageTile(uint8_t* area, const GemvArgs& a, int tile, int lane) {
    Format::StageTile(area, a, tile, lane);
  }
  using Cursor = typename Format::StageCursor;
  template <int LOADS>
  __device__ static __forceinline__ Cursor From(const GemvArgs& a, int row, int w, int wstep, int lane) {
    return Format::template StageFrom<LOADS>(a, row, w, wstep, lane);
  }
  __device__ static __forceinline__ void Next(uint8_t* stage, Cursor& c, const GemvArgs& a, int lane) {
    Format::StageNext(stage, c, a, lane);
  }
};

// Formats whose M = 1 products keep their scale blocks apart in the mma's output columns
// (Format::BlockColumns<T>(), see the tensor-core GEMV below); the others fold the scale into the
// weight or multiply each chunk's products.
template <typename Format, typename T, typename = void>
struct BlockColumns : std::false_type {};
template <typename Format, typename T>
struct BlockColumns<Format, T, std::enable_if_t<Format::template BlockColumns<T>()>> : std::true_type {};

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV.
//
// The weight goes in the A slot of mma.m16n8k16 and x in the B slot: A's rows are 16 output
// columns, B's columns are 8 rows of x, so W [N, K] row-major is exactly the row-major A
// fragment and x [M, K] row-major exactly the column-major B fragment: the weight passes
// through shared memory only as a copy buffer (the ring below), never reshuffled. Lane (g, t)
// owns weight rows g and g + 8 of the warp's 16 columns and x row g.
//
// K mapping: a K window is 4 lanes x LOADS chunks of Format::kValuesPerChunk values. In chunk l,
// lane t reads the 16 bytes at l x 64 + t x 16 of the window's bytes, so the four lanes of a
// group read 64 contiguous bytes per instruction (whole sectors) and each lane's 16 bytes feed
// the chunk's mma steps (8 for 4-bit codes, 4 for 8-bit ones) with no shuffles. Which k lands in
// which mma position is a permutation of K, legal because the same permutation is applied to x
// (XPairs).
//
// Block scales: NVFP4 folds its E4M3 scales into the decoded weight before the mma (exact, see
// ffi/nvfp4.cuh), since one mma sums across lanes holding different 16-value blocks. FP8's
// float32 scales would round there, so its blocks are at least a chunk of 4 lanes (64 values)
// wide and each chunk's products accumulate apart, then multiply by the row's scale in float32
// (Format::kAccumulatorScales). int4/int8 scales are 16-bit like the weight; at M > 1 they fold
// into it and round once, as the reference does; they and the zero points are staged as aligned
// pieces that each window locates (Format::kStagedPrep).
//
// Block columns (M = 1 with x in the ring or staged, formats that opt in: NVFP4 with fp16 x,
// int4): one row of x would leave seven of the mma's eight B columns idle. Instead, B column
// 2t + h carries x only in the lanes (g = 2t + h) that hold half h of lane t's chunk (its words
// from h x kWords / 2 on), where a chunk half lies in one scale block, and a zero piece
// everywhere else; so output column 2t + h of each weight row is the product over that one
// block, the row's two accumulators in lane (g, t) are exactly the two halves of its own chunk
// (ColumnScales: the format's scale of each), and the scales multiply the float32 chunk sums (4
// fma per chunk) instead of every decoded pair (DecodeCodes instead of DecodeWord). The store
// first sums the columns across the lane quad.
//
// KSPLIT warps of a block take windows round-robin and reduce through shared memory in a fixed
// order, so the result does not depend on scheduling.
//
// XPERM: x comes in fragment order (jaxgemv/_product.py: fragment_order), M padded to 8 rows per
// m-tile: for m-tile i, window w, chunk l and word W, the 32 lanes' 16-byte pieces are
// consecutive in lane order, values paired the way the decode pairs them. One m-tile of M < 8
// rows comes unpadded, 4 M pieces per window, chunk and word (GemvArgs::x_lanes): no rows of
// zeros to write before the call nor to read in it. A warp's x load is
// then 512 contiguous bytes (4 L1 wavefronts) instead of 4 lanes x 8 rows at a 64-byte stride
// (8 or more): at M = 4 the row-major x loads were half the L1 data-pipe traffic, and that pipe
// ran at 71% (Nsight Compute, lm_head, commit f10282b).
//
// MT m-tiles of 8 rows share each decoded weight; larger M runs several m-tile blocks, placed
// next to each other in the grid so that the second reads the weight from L2, not DRAM.

// XS_WARPS > 0 (x staged in shared memory, persistent warps): the block's XS_WARPS warps each walk
// their own sequence of 16-column tiles (tile = global warp, then + all warps of the grid), and x
// (fragment order, only the lanes of its M rows, one m-tile or two for 9 to 16 rows) is copied into
// shared memory once per block, so the x loads of every chunk are shared-memory reads. Without it
// every warp loads its x pieces from global memory per chunk, just before their mma: at M = 8 that
// is twice the weight's bytes through L1 (hit rate 55%, the rest from L2), and at M = 1 and in FP8
// down_proj the top stall sat on the first mma of a chunk waiting for x (Nsight Compute, commit
// bed1afa: 23% of samples, FP8 5120 x 17408). The grid holds as many blocks as are resident at
// once, so tiles are dealt evenly and each warp's ring never drains between its tiles.

// Shared-memory ring of the tensor-core kernel: stages per warp, and bytes per stage (the
// weight pieces of 16 rows, then their scales). The launcher sizes dynamic shared memory with it.
// Stages: 2 in the per-block kernel, 4 in the persistent one (x in shared memory). A read-only
// build of the kernel (decode and mma replaced by an XOR of the staged words) reached 93-98% of
// the read ceiling on NVFP4 151936 x 2048 at M = 1 with 12-19 one-warp blocks per SM, so few
// windows in flight per warp are enough there, and a smaller ring fits more blocks per SM. On an
// H200, one session each (docs/perf-log.md entries 28 and 33): 3 stages against 4 took NVFP4
// 5120 x 17408 at M = 4 from 35.6 to 25.9 us, 12288 x 4096 at M = 1 from 15.6 to 14.3 and
// per-block M = 16 on 151936 x 2048 from 121.3 to 88.4; 2 against 3 took 5120 x 17408 at M = 1
// / 4 from 24.6-25.2 / 24.3-25.7 to 23.0-23.5 / 23.8-24.1 and int4 151936 x 2048 at M = 1 from
// 60.1-62.7 to 58.4-58.7, left the other lm_heads at M = 1 within run-to-run spread and 12288 x
// 4096 at M = 4 ~3% slower (17.7-18.0 -> 18.3-18.4). The persistent kernel went both ways with 3
// (151936 x 2048 M = 4 60.7 -> 58.9, 248320 x 2048 M = 4 / 8 91.3 / 93.0 -> 94.1 / 97.6) and
// keeps 4; with 2 and blocks of 16 warps (twice the warps per SM) it was slower at M = 4 and no
// faster at M = 8 (perf log 39).
template <bool XS>
constexpr int MmaStages() {
  return XS ? 4 : 2;
}
template <typename Format, int LOADS>
constexpr int MmaStageBytes() {
  return 2 * LOADS * 32 * 16 + 16 * Format::template WindowScaleBytes<LOADS>();
}
// M = 1, per-block kernel: x's pieces of a window (4 lanes x LOADS chunks x kWords words) after
// the weight and the scales of each stage, and with block columns one zero piece per chunk and
// word beside them (MmaXSlots).
template <typename Format, typename T>
constexpr int MmaXSlots() {
  return BlockColumns<Format, T>::value ? 5 : 4;
}
constexpr int kMmaXZeroSlot = 4;  // the zero piece, after the 4 lanes' pieces
template <typename Format, typename T, int LOADS>
constexpr int MmaXRingBytes() {
  return MmaXSlots<Format, T>() * LOADS * Format::kWords * 16;
}
// M = 1 with a K split: each warp's x, every window it takes, copied once before its loop into
// shared memory after the rings, already in the decode's pair order (XPairs), 4 pieces per chunk
// and word (one per lane t); with block columns a zero window after every warp's, which the lanes
// that hold no x piece read instead. A one-wave product (the 8B decode's qkv, o, down) gives each
// warp 2 to 6 windows, so the prologue's loads and permutes (one per piece) replace, per window,
// 8 copies of x into the ring and the 4 permutes per word of x every lane did (at M = 1, NVFP4
// 6144 x 4096, K split 4: 8 copies and 32 of the loop's 356 instructions; cuobjdump, f3bd428).
// The loop went 356 -> 288 instructions, and on an H200 the 8B decode step's GEMVs 1.84 -> 1.68
// ms at batch 1 (gate_up 21.4 -> 19.0 us, down 12.8 -> 11.6; docs/perf-log.md, entry 74). Copying
// the pieces with cp.async instead (one group before the ring's, paired in place once it landed)
// made those products twice as slow, unexplained (entry 75). The staged x (2K bytes per block in
// float16) can cost blocks per SM where the ring's would not: the launcher stages only where the
// grid keeps as many blocks resident as it needs or as the ring would allow (gemv_launch.cuh),
// and without a K split (the lm_heads' one-warp blocks, many waves, each warp taking every window
// of K) never.
template <typename Format, int LOADS>
constexpr int MmaXWindowPieces() {
  return LOADS * Format::kWords * 4;
}
template <typename Format, typename T, int KSPLIT, int LOADS>
__host__ __device__ constexpr int64_t MmaXStagedBytes(int64_t k) {
  const int64_t windows = k / (4 * LOADS * Format::kValuesPerChunk);
  const int64_t per_warp = (windows + KSPLIT - 1) / KSPLIT;
  return (KSPLIT * per_warp + (BlockColumns<Format, T>::value ? 1 : 0)) * MmaXWindowPieces<Format, LOADS>() * 16;
}
// Whether the per-block kernel with MT m-tiles takes its M = 1 path for M rows (x in the ring, or
// staged as above): the kernel compiles its pipelines for this case, the launcher sizes shared
// memory for it.
__host__ __device__ constexpr bool MmaOneRowX(int mt, int m) { return mt == 1 && m == 1; }
// Where the per-block kernel's pipeline reads x: from global memory per chunk (M > 1), from its
// ring (M = 1), or staged once per warp (M = 1, K split, where the launcher says so); kGlobalCols:
// from global memory at M = 2 with block columns (MmaGemvKernel, kCols2).
enum class XPath { kGlobal, kRing, kStaged, kGlobalCols };
template <typename Format, int WARPS, int LOADS, bool XS>
constexpr int MmaSharedBytes() {
  return WARPS * MmaStages<XS>() * MmaStageBytes<Format, LOADS>();
}
// Static shared memory of the per-block kernel: the K-split reduction buffer (warps 1..KSPLIT-1,
// MT m-tiles of 4 accumulators, 32 lanes), then each warp's lanes' sums of squares of x (RmsFromX).
// The launcher adds it to the dynamic bytes when it decides whether the kernel must opt in past
// 48 KB.
template <int KSPLIT, int MT>
constexpr int MmaStaticSharedBytes() {
  return KSPLIT > 1 ? ((KSPLIT - 1) * MT * 4 + KSPLIT) * 32 * static_cast<int>(sizeof(float)) : 0;
}

// A 16-byte piece of zeros in global memory: the x piece of the lanes that carry no x with block
// columns at M = 2 (MmaGemvKernel, kColumns2). Never written.
static __device__ uint4 kMmaZeroPiece;

// Whether the per-block kernel has a block-column instance for M = 2 (MmaGemvKernel's COLS2) with
// these template arguments (one m-tile, no register bound, x not in shared memory).
template <typename Format, typename T, int KSPLIT, bool XPERM>
constexpr bool MmaHasColumns2() {
  return BlockColumns<Format, T>::value && Format::kXAhead && KSPLIT > 1 && XPERM && !Format::kColumnsWherePlanned;
}

// MIN_BLOCKS: blocks per SM that the registers must allow (0: the compiler's choice, no bound). The
// launcher takes a bounded instance where only it puts the whole grid in one wave (common.h,
// MmaHasBoundedInstance and TakesBoundedInstance); an explicit 1 is not the same as none, ptxas
// then spends up to the whole register file, which the lm_heads' M = 2-8 launches use
// (common.h: kMmaFreeRegisters). Two m-tiles reach their MIN_BLOCKS by keeping x at
// the chunk (kAhead below), and carry the register bound only where Format::kBoundTwoTiles:
// held to 80 registers, ptxas spilled 52 bytes of FP8's (fp16) two-load instance, which
// unbounded takes 72, and FP8 6144 x 5120 at M = 16 ran 15.6 us against 14.1 (sm_90, one H200,
// docs/perf-log.md, entry 111).
//
// COLS2: the instance for M = 2 with block columns (kColumns2 below; MmaHasColumns2), launched at
// M = 2 only: it compiles that pipeline alone, so that its registers are its own.
//
// XAHEAD: the instance of a format without Format::kXAhead that takes x a chunk ahead anyway
// (kAhead below; one m-tile, a K split, M = 2-8; MmaHasXAheadInstance), launched where the grid
// leaves the SMs few warps (common.h, TakesXAheadRule).
template <typename Format, typename T, int MT, int KSPLIT, int LOADS, bool XPERM, int XS_WARPS, int MIN_BLOCKS = 0,
          bool COLS2 = false, bool XAHEAD = false>
__global__ void __launch_bounds__(32 * (XS_WARPS > 0 ? XS_WARPS : KSPLIT),
                                  MT == 1 || Format::kBoundTwoTiles ? MIN_BLOCKS : 0)
    MmaGemvKernel(GemvArgs a, int m_blocks, bool x_staged, bool one_wave) {
  constexpr bool kXs = XS_WARPS > 0;
  static_assert(!kXs || (MT <= 2 && KSPLIT == 1 && XPERM), "x in shared memory: one or two m-tiles, no K split, fragment order");
  constexpr int kWarps = kXs ? XS_WARPS : KSPLIT;
  constexpr int kStages = MmaStages<kXs>();
  constexpr bool kAltDecode = KSPLIT > 1;  // the formats' second decode (UnitOne above; fp8.cuh)
  constexpr int kWin = 4 * LOADS * Format::kValuesPerChunk;
  // Block columns at M = 1. With Format::kColumnsWherePlanned (int4) only where the planner runs
  // M = 1 on this instance: not in the K-split instances with fragment-ordered x (it plans x
  // row-major at M = 1 with a K split) nor in those held to more blocks per SM (taken at M =
  // 2-8). There the M = 1 paths, reached only through the environment's overrides, fold the
  // scales into the weight, and leave the registers that the M > 1 loop shares as they were
  // (sm_90: int4's held K-split-8 instance spills 104 bytes, 144 with block columns in its M = 1
  // paths). NVFP4 keeps them everywhere: its held instance spills 20 bytes with them and 32
  // without, and without them NVFP4 8192 x 28672 at M = 4 / 8 went from 45.7 / 44.8 to 48.5 /
  // 49.5 us (docs/perf-log.md, entry 110).
  constexpr bool kBlockCols = BlockColumns<Format, T>::value &&
                              (!Format::kColumnsWherePlanned || (MIN_BLOCKS == 0 && (KSPLIT == 1 || !XPERM)));
  // Block columns at M = 2 (COLS2; MmaHasColumns2: one m-tile, a K split, x from global memory a
  // chunk ahead, the compiler's register allocation; NVFP4 with fp16 x): B column 2t + r carries x
  // row r only in the lanes g = 2t, 2t + 1, that is only over lane t's chunk, so lane (g, t)'s
  // accumulators hold its own chunk's products for x rows 0 and 1 (d0 / d1 row g, d2 / d3 row g +
  // 8). Each scale half's products accumulate apart and its scale multiplies their float32 sums (8
  // fma per chunk) instead of every decoded pair (DecodeCodes: the 64 multiplies per window of the
  // M > 1 loop, 367 instructions per window in NVFP4 fp16's K-split-6 instance; cuobjdump, sm_90);
  // the store sums the quad. As a third pipeline of the shared instances it took their registers
  // from 70-72 to 74-78 at every M (docs/perf-log.md, open item 2), hence an instance of its own.
  constexpr bool kColumns2 = COLS2;
  static_assert(!COLS2 || (MT == 1 && kBlockCols && !kXs && KSPLIT > 1 && MIN_BLOCKS == 0 && Format::kXAhead),
                "block columns at M = 2: one m-tile, a K split, x a chunk ahead, no register bound");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int m_block = kXs ? 0 : blockIdx.x % m_blocks;
  const int m0 = m_block * 8 * MT;
  const int64_t row_bytes = Format::RowBytes(a.k, a.scale_shift), scale_bytes = Format::ScaleRowBytes(a.k, a.scale_shift);
  const int windows = static_cast<int>(a.k / kWin);
  const int tiles = (a.n + 15) / 16;
  // RmsFromX (per-block kernel, M = 1, K split, x staged): each lane's sum of the squares of the
  // x pieces it staged, per warp, for warp 0 to add up before its store.
  const bool x_sums = !kXs && MT == 1 && KSPLIT > 1 && RmsFromX(a);
  __shared__ float xsq[KSPLIT][32];  // MmaStaticSharedBytes; used only where x_sums can hold
  float x_rms = 1.0f;                // warp 0's row scale rsqrt(mean(x^2) + eps) with x_sums

  // This warp's steps, one K window of one tile each: without XS, windows warp, warp + KSPLIT, ...
  // of the block's tile; with XS, every window of tiles first, first + stride, ..., the warps
  // numbered warp-major across blocks (warp w of block b first takes tile w x gridDim + b), so
  // that the warps that get one tile more than the others are spread over every block instead of
  // filling the first blocks. At 151936 x 2048, M = 8: 9496 tiles over 2112 warps, 1048 of them
  // take 5; numbered block-major, those were every warp of the first 131 of 264 blocks, and
  // Nsight Compute found the SMs active 84% of the kernel's time (commit 8a63ca0).
  const int first_tile = kXs ? warp * static_cast<int>(gridDim.x) + blockIdx.x : blockIdx.x / m_blocks;
  const int tile_stride = kXs ? gridDim.x * kWarps : 0;
  int count;
  if constexpr (kXs) {
    count = first_tile < tiles ? (tiles - first_tile + tile_stride - 1) / tile_stride * windows : 0;
  } else {
    count = warp < windows ? (windows - warp + KSPLIT - 1) / KSPLIT : 0;
  }
  struct Cursor {
    int tile, w;
  };
  auto advance = [&](Cursor& c) {
    c.w += kXs ? 1 : KSPLIT;
    if (kXs && c.w == windows) c.w = 0, c.tile += tile_stride;
  };
  // Rows past N read row N - 1 (valid memory) and are never written.
  auto row_of = [&](int tile, int r) { return min(tile * 16 + r, a.n - 1); };
  // Where the copies of a tile's windows start: this lane's two weight rows and (lanes 0-15) one
  // row's scales. Set when the copying cursor enters a tile, not per window: with x in shared
  // memory a warp walks many tiles, and the 64-bit row products per window were about 40 of the
  // loop's ~390 instructions per window (cuobjdump, NVFP4 f16, 4 warps). The weight pointers
  // start at the lane's first chunk of a window (t x 16 bytes in), so that a window's copies
  // are one unsigned 32-bit offset added per row and the chunks' l x 64 bytes immediates (with
  // signed value offsets, each copy's address cost a shift, a sign extension and a 64-bit add).
  struct Rows {
    const uint8_t *wa, *wb, *sc;
  };
  auto rows_of = [&](int tile) {
    return Rows{a.w + static_cast<int64_t>(row_of(tile, g)) * row_bytes + 16 * t,
                a.w + static_cast<int64_t>(row_of(tile, g + 8)) * row_bytes + 16 * t,
                a.scales + static_cast<int64_t>(row_of(tile, lane & 15)) * scale_bytes};
  };
  // The copying cursor's sources at window w of a tile, stepped a fixed kWinStep windows at a time
  // (the warp's next window): the two weight rows' pointers and the staged pieces' cursor
  // (StagedRows' Cursor), each advanced by a constant per window, instead of formed from the
  // window's index per window. int4 / int8 at one m-tile and K split 8 only, where it takes the
  // loop to 61-64 registers (from 72-80; ptxas -v, sm_90; int4 with its constant bias, nbits.cuh
  // Prep), four 8-warp blocks per SM at the compiler's allocation: on an H100 (docs/perf-log.md,
  // entry 139, kernel us) int4 bf16 8192 x 28672 at M = 4 / 8 went 62.7 / 64.1 (K split 6) to 59.5
  // / 60.0, int8 104.1 / 103.1 (the held instance) to 97.8 / 94.8 (timed with int4's constant bias
  // in int8 too, entry 139 (d)). Elsewhere it lost: K split 6 with the cursor ran 5% slower at the
  // same occupancy (65.9 against 62.7), and two m-tiles, whose loop issued the copies together at
  // its top, 15% at M = 16 (entry 138); those loops form the addresses from the window's index.
  constexpr bool kStream = Format::kStagedPrep && MT == 1 && KSPLIT == 8;
  constexpr int kWinStep = KSPLIT;  // never x in shared memory, which has no K split
  struct Stream {
    const uint8_t *wa, *wb;
    typename StagedRows<Format>::Cursor sc;
  };
  auto stream_of = [&](int tile, int w) {
    const Rows r = rows_of(tile);
    const uint32_t off = static_cast<uint32_t>(w) * (64 * LOADS);
    return Stream{r.wa + off, r.wb + off,
                  StagedRows<Format>::template From<LOADS>(a, row_of(tile, lane & 15), w, kWinStep, lane)};
  };

  // Lanes of x rows past M read a valid row's pieces instead (the lane of row 0 with the same
  // t, or their own zero padding where the m-tile has no row at all): their B columns only feed
  // outputs that are never stored, and reading real values spares the loop the predication and
  // the zeroing moves (16 of them per window at M = 1, cuobjdump).
  const T* xrow[MT];
  int xlane[MT];  // the lane whose x pieces this lane reads
  // x's pieces per window, chunk and word in fragment order: a.x_lanes where the format reads x
  // unpadded (kCompactX), else 32 as a constant.
  const int x_lanes = Format::kCompactX ? a.x_lanes : 32;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int m = m0 + mt * 8 + g;
    // At M = 2 with block columns (kColumns2) every lane reads row g % 2, the row its B column
    // carries; otherwise a lane past M reads any valid row.
    xlane[mt] = m < a.m || m0 + mt * 8 >= a.m ? lane : kColumns2 ? (g & 1) * 4 + t : t;
    if constexpr (XPERM) {  // this m-tile's fragment-ordered x, at this lane's piece
      xrow[mt] = static_cast<const T*>(a.x) +
                 (static_cast<int64_t>(m_block * MT + mt) * windows * LOADS * Format::kWords * x_lanes + xlane[mt]) * 8;
    } else {
      xrow[mt] = static_cast<const T*>(a.x) + static_cast<int64_t>(kColumns2 ? g & 1 : min(m, a.m - 1)) * a.k;
    }
  }
  // The stride of a lane's x pieces from one (window, chunk, word) to the next in fragment order;
  // with block columns at M = 2 (kColumns2) the lanes that carry no x (g != 2t, 2t + 1) read a
  // zero piece in global memory at every step instead, so that every lane loads every piece
  // (predicated loads that keep the zeros cost a register copy of each piece per chunk: 16
  // moves per chunk, cuobjdump).
  int x_stride = x_lanes;
  if constexpr (kColumns2) {
    static_assert(XPERM, "block columns at M = 2 read x in fragment order");
    if (g >> 1 != t) xrow[0] = reinterpret_cast<const T*>(&kMmaZeroPiece), x_stride = 0;
  }

  float acc[MT][4];
  auto zero_acc = [&] {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
  };
  zero_acc();

  // Software pipeline over the warp's steps through a ring of kStages shared-memory stages
  // per warp, filled with cp.async: kStages - 1 windows are in flight while one decodes, and
  // they cost no registers. The register ping-pong this replaces held one window in flight at
  // 96 registers (20 warps per SM, about 40 KB per SM in flight), and Nsight Compute put the
  // kernel's top stall on the first decode instruction waiting for its weights (commit e846f11).
  // Each lane copies and later reads its own 16-byte pieces of the weight (no barrier needed for
  // those); lanes 0-15 copy one row's scales each, read by the row's four lanes after a
  // __syncwarp.
  constexpr int kStageU4 = MmaStageBytes<Format, LOADS>() / 16;
  constexpr int kXSlots = MmaXSlots<Format, T>();  // x pieces per chunk and word in the M = 1 ring
  // M = 1 (per-block kernel): without a K split the window's x pieces travel in the ring too,
  // after the weight and scales, so that no mma waits on an x load issued just before it
  // (MmaXRingBytes); with one, x is staged once per warp before the loop (MmaXStagedBytes).
  // Whether the M = 1 path is taken is known per launch, and the pipeline below is compiled for
  // each case (its argument xr): tested at run time inside the loop, both x paths stayed in it,
  // predicated, and the idle one still took issue slots (cuobjdump: 8 global x loads and their
  // address arithmetic per window at M = 1, where x comes from the ring).
  extern __shared__ uint4 ring[];
  // XS: x's pieces after the rings, [window][chunk][word][4 M lanes]: lane L < 32 of m-tile 0's
  // fragment, then lane L - 32 of m-tile 1's (MT = 2, 8 < M <= 16).
  uint4* const xs = ring + kWarps * kStages * kStageU4;
  const int xs_lanes = 4 * a.m;
  // Per lane: where its x pieces start and the offsets of a window's pieces, set once, so that a
  // word's read is an add and a load: a runtime index product per word cost about 5
  // instructions and two zeroing moves in an instruction-bound loop (cuobjdump at 310676e: 505
  // instructions per window with x in shared memory, 419 without).
  constexpr int kPieces = LOADS * Format::kWords;  // x pieces of a window per lane
  const uint4* xs_lane[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) xs_lane[mt] = xs + 32 * mt + xlane[mt];
  int xs_off[kPieces];
#pragma unroll
  for (int j = 0; j < kPieces; ++j) xs_off[j] = j * xs_lanes;
  // M = 1: row 0's x piece of window w, chunk l, lane t' and word wd, which the ring's copies and
  // the staged x both read (in fragment order the 32 lanes' pieces of a word lie together).
  auto x_piece = [&](int w, int l, int pt, int wd) {
    return XPERM ? reinterpret_cast<const uint4*>(a.x) + ((w * LOADS + l) * Format::kWords + wd) * x_lanes + pt
                 : reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + w * kWin +
                                                  (l * 4 + pt) * Format::kValuesPerChunk) + wd;
  };
  // tp (std::bool_constant): the tile's scales staged once for all its windows (GemvArgs::
  // tile_prep), so no window copies them.
  auto issue = [&](auto xr, auto tp, const Cursor& c, const Rows& rows, Stream& s, uint4* st) {
    // A window is 64 bytes per load of each row (4 lanes x 16), whatever the format. Where the
    // stream runs (kStream) the weight's addresses come from it too; elsewhere, and in NVFP4 and
    // FP8 (their loops within 1-3% either way with a stream, and registers and spills that moved
    // both ways in their held instances; cuobjdump, sm_90), from the window's index.
    const uint32_t wbytes = kStream ? 0u : static_cast<uint32_t>(c.w) * (64 * LOADS);
    const uint8_t *wa = (kStream ? s.wa : rows.wa) + wbytes, *wb = (kStream ? s.wb : rows.wb) + wbytes;
#pragma unroll
    for (int l = 0; l < LOADS; ++l) {
      CpAsync16(st + (2 * l) * 32 + lane, wa + 64 * l);
      CpAsync16(st + (2 * l + 1) * 32 + lane, wb + 64 * l);
    }
    if constexpr (kStream) s.wa += kWinStep * 64 * LOADS, s.wb += kWinStep * 64 * LOADS;
    if constexpr (decltype(tp)::value) {
      // nothing: the tile's scales were staged before the ring
    } else if constexpr (kStream) {
      StagedRows<Format>::Next(reinterpret_cast<uint8_t*>(st + 2 * LOADS * 32), s.sc, a, lane);
    } else if constexpr (Format::kStagedPrep) {
      Format::template StageWindow<LOADS>(reinterpret_cast<uint8_t*>(st + 2 * LOADS * 32), a, row_of(c.tile, lane & 15),
                                          c.w * kWin, lane);
    } else if constexpr (Format::template WindowScaleBytes<LOADS>() > 0) {
      if (lane < 16)
        Format::template CopyWindowScales<LOADS>(
            reinterpret_cast<uint8_t*>(st + 2 * LOADS * 32) + lane * Format::template WindowScaleBytes<LOADS>(),
            rows.sc, static_cast<uint32_t>(c.w) * kWin, a.scale_shift);
    }
    if (decltype(xr)::value == XPath::kRing && lane < 4) {
#pragma unroll
      for (int l = 0; l < LOADS; ++l) {
#pragma unroll
        for (int wd = 0; wd < Format::kWords; ++wd)
          CpAsyncCa<16>(st + kStageU4 + (l * Format::kWords + wd) * kXSlots + lane, x_piece(c.w, l, t, wd));
      }
    }
  };
  // x from global memory (XPath::kGlobal, per-block kernel with a K split: one m-tile (M = 2-8)
  // in formats with Format::kXAhead, two (M 9-16) in every format): each chunk's x pieces are
  // loaded one chunk ahead, into xnext, while the chunk before decodes (the next window's first
  // chunk during a window's last), so that the loads' L2 round trip overlaps a chunk's work
  // instead of stalling the chunk's first byte permute (Nsight Compute, NVFP4 5120 x 17408, M =
  // 4, k8: 43% of stall samples). Volatile, so
  // that the compiler keeps each load where it is issued instead of sinking it to its use. On an
  // H200 (docs/perf-log.md, entry 101) FP8 5120 x 17408 at M = 4 / 8 went from 38.7 / 41.2 to
  // 31.7 / 32.0 us of kernel time, NVFP4 from 23.6 / 27.0 to 22.5 / 24.8, and the 8B decode
  // step at batch 4 / 8 from 2.573 / 2.790 to 2.432 / 2.688 ms. Two m-tiles (M 9-16) take it in
  // every format, but not in their instance held to more blocks per SM: 22-48 registers more
  // (sm_90, K split 8, two loads, bf16 x: int4 80 -> 128, int8 80 -> 102, NVFP4 -> 106; FP8 with
  // fp16 x 76 -> 88), so two 8-warp blocks per SM, four to six 4-warp ones (the planner's
  // TWO_TILE_K8_BLOCKS_PER_SM_* split, and the held instance where only it makes one wave). At
  // M = 16 on an H200 (docs/perf-log.md, entry 111) 8192 x 28672 went from 91.7 (int4, k4) /
  // 135.8 (int8, k8) / 83.2 (NVFP4, k4) / 142.3 (FP8 fp16, k8) to 61.5 / 87.9 / 57.6 / 80.2 (k4)
  // us of kernel time, 5120 x 17408 from 33.2 / 41.6 / 34.7 / 42.9 to 30.3 (k4) / 37.6 (held,
  // x at the chunk) / 28.4 (k4) / 33.2. Only with a K split:
  // without one (the lm_heads, one warp per tile, many blocks per SM) it cost NVFP4 248320 x 2048
  // at M = 4 7 us (79.1 -> 86.0 us of kernel time, one H200, perf log 103).
  // The instances held to more blocks per SM (MIN_BLOCKS) take x ahead in every format, where
  // their registers are capped whether or not it comes ahead. int4's waited on x's loads without
  // it (Nsight Compute, 8192 x 28672 at M = 4, bf16 x: 61% of stall samples long-scoreboard, on
  // the chunks' first mma); with it int4 8192 x 28672 at M = 2 / 4 / 8 went from 54.5 / 56.1 /
  // 59.3 to 53.7 / 55.2 / 55.6 us of kernel time (two rounds, one H200, docs/perf-log.md, entry
  // 109), and int8 from 73.3 / 76.4 / 85.2 to 76.7 / 77.5 / 76.9 (entry 110: 10% off the slowest
  // row, 5% and 1.5% on at M = 2 and 4; before 5196be9's shorter loop it went both ways, entry
  // 108).
  static_assert(!XAHEAD || (MT == 1 && KSPLIT > 1 && !kXs && MIN_BLOCKS == 0 && !COLS2 && !Format::kXAhead),
                "the x-ahead instance: one m-tile, a K split, the compiler's registers, a format without kXAhead");
  constexpr bool kAhead =
      !kXs && KSPLIT > 1 && (MT == 2 ? MIN_BLOCKS == 0 : MIN_BLOCKS > 0 || Format::kXAhead || XAHEAD);
  // Format::kXTwoBuffers, two m-tiles, an even number of chunks per window: chunk l's pieces sit
  // in buffer l % 2, so chunk l reads its buffer while the next chunk's loads land in the other and
  // no copy passes between them (one buffer: the compiler moved the pieces between registers each
  // chunk; two hold no more registers than that copy did). On an H200 (docs/perf-log.md, entry 117,
  // kernel us, two rounds) int4 8192 x 28672 at M = 16 went from 62.0 / 60.5 to 57.3 / 56.1 and
  // 5120 x 17408 from 29.0 / 28.9 to 27.8 / 27.8. Taken in every instance it cost int4 at M = 4
  // (the held one-m-tile instance) 7% and NVFP4 fp16 at M = 16 40%, so it is taken only where it
  // gained.
  constexpr int kXBufs = Format::kXTwoBuffers && MT == 2 && LOADS % 2 == 0 ? 2 : 1;
  [[maybe_unused]] uint4 xnext[kXBufs][MT][Format::kWords];
  [[maybe_unused]] auto load_x = [&](int w, int l) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int wd = 0; wd < Format::kWords; ++wd) {
        const uint4* p = XPERM ? reinterpret_cast<const uint4*>(xrow[mt]) + ((w * LOADS + l) * Format::kWords + wd) * x_stride
                               : reinterpret_cast<const uint4*>(xrow[mt] + w * kWin + (l * 4 + t) * Format::kValuesPerChunk) + wd;
        xnext[l % kXBufs][mt][wd] = LoadKeep16<true>(p);
      }
  };
  // xw: with x staged (XPath::kStaged), where this lane reads the window's x pieces of each scale
  // block half (h = 0, 1; the zero window for a lane that holds none of that half).
  // tile: with tp, where the tile's scales sit (after the ring).
  auto compute = [&](auto xr, auto tp, const Cursor& c, const uint4* st, const uint4* const (&xw)[2], const uint8_t* tile) {
    constexpr XPath kPath = decltype(xr)::value;
    constexpr bool kTile = decltype(tp)::value;
    constexpr bool kCols = (kPath == XPath::kRing || kPath == XPath::kStaged) && kBlockCols;
    constexpr bool kCols2 = kPath == XPath::kGlobalCols;  // compiled only where kColumns2 holds
    // The format's block-column members, named through a type that depends on xr so that they
    // are looked up only where block columns are compiled in (formats without them lack them).
    using Cols = std::conditional_t<kCols || kCols2, Format, void>;
    const uint8_t* scales = reinterpret_cast<const uint8_t*>(st + 2 * LOADS * 32);
    [[maybe_unused]] const auto wra = kTile ? StagedRows<Format>::OfTile(tile, a, c.tile, row_of(c.tile, g), c.w * kWin)
                                            : StagedRows<Format>::Of(scales, a, g, row_of(c.tile, g), c.w * kWin);
    [[maybe_unused]] const auto wrb = kTile ? StagedRows<Format>::OfTile(tile, a, c.tile, row_of(c.tile, g + 8), c.w * kWin)
                                            : StagedRows<Format>::Of(scales, a, g + 8, row_of(c.tile, g + 8), c.w * kWin);
#pragma unroll
    for (int l = 0; l < LOADS; ++l) {
      [[maybe_unused]] const int k = c.w * kWin + (l * 4 + t) * Format::kValuesPerChunk;
      const uint4 qa = st[(2 * l) * 32 + lane], qb = st[(2 * l + 1) * 32 + lane];
      typename Format::template Prep<T> sa2{}, sb2{};
      [[maybe_unused]] float fs[4];  // float32 scales of the chunk's accumulators d0..d3
      if constexpr (Format::kStagedPrep) {
        sa2 = Format::template StagedChunkPrep<T>(wra, a, k, (l * 4 + t) * Format::kValuesPerChunk);
        sb2 = Format::template StagedChunkPrep<T>(wrb, a, k, (l * 4 + t) * Format::kValuesPerChunk);
      } else if constexpr (Format::kAccumulatorScales) {
        // One float32 per row and block of K (a chunk of 4 lanes never straddles two blocks).
        // Staged in the ring with the window's weights.
        fs[0] = fs[1] = Format::template ChunkScale<LOADS>(scales, g, l, c.w * kWin, a.scale_shift);
        fs[2] = fs[3] = Format::template ChunkScale<LOADS>(scales, g + 8, l, c.w * kWin, a.scale_shift);
      } else {
        sa2 = Format::template PrepareScales<T>(Format::template ChunkScales<LOADS>(scales, g, l, t));
        sb2 = Format::template PrepareScales<T>(Format::template ChunkScales<LOADS>(scales, g + 8, l, t));
      }
      if constexpr (kCols) {
        // The chunk's prepared scales as float32, its halves being columns 2t and 2t + 1: row g
        // for accumulators 0 and 1, row g + 8 for 2 and 3.
        const float2 ca = Cols::template ColumnScales<T>(sa2), cb = Cols::template ColumnScales<T>(sb2);
        fs[0] = ca.x, fs[1] = ca.y, fs[2] = cb.x, fs[3] = cb.y;
      }
      [[maybe_unused]] float2 hs[2];  // kCols2: rows g and g + 8, the chunk's two halves' scales
      if constexpr (kCols2) hs[0] = Cols::template ColumnScales<T>(sa2), hs[1] = Cols::template ColumnScales<T>(sb2);
      // The chunk's x, all words at once and ahead of the decode, so that no mma waits on an
      // x load issued just before it (the compiler otherwise places each load at its use).
      // Lanes past M read another row's pieces (xlane above).
      uint4 xv[MT][Format::kWords];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int wd = 0; wd < Format::kWords; ++wd) {
          if constexpr (kXs) {
            xv[mt][wd] = xs_lane[mt][c.w * kPieces * xs_lanes + xs_off[l * Format::kWords + wd]];
          } else if constexpr (kPath == XPath::kStaged) {
            xv[mt][wd] = xw[kCols ? wd / (Format::kWords / 2) : 0][(l * Format::kWords + wd) * 4];
          } else if constexpr (kCols) {
            // This lane's x piece if it holds B column 2t + h (h: the word's scale block), else zero.
            const int h = wd / (Format::kWords / 2);
            xv[mt][wd] = st[kStageU4 + (l * Format::kWords + wd) * kXSlots + (g == 2 * t + h ? t : kMmaXZeroSlot)];
          } else if constexpr (kPath == XPath::kRing) {
            xv[mt][wd] = st[kStageU4 + (l * Format::kWords + wd) * kXSlots + xlane[mt]];
          } else if constexpr (kAhead) {
            xv[mt][wd] = xnext[l % kXBufs][mt][wd];  // loaded a chunk ahead (load_x; zeros, kCols2)
          } else {
            const uint4* p = XPERM ? reinterpret_cast<const uint4*>(xrow[mt]) + ((c.w * LOADS + l) * Format::kWords + wd) * x_lanes
                                   : reinterpret_cast<const uint4*>(xrow[mt] + k) + wd;
            xv[mt][wd] = LoadKeep16(p);
          }
        }
      }
      if constexpr ((kPath == XPath::kGlobal || kCols2) && kAhead) {
        if (l + 1 < LOADS) {
          load_x(c.w, l + 1);
        } else if constexpr (Format::template XNextUnbranched<MT, LOADS>()) {
          // This warp's next window; after its last, its own first chunk again (an L1 hit, never
          // read). Under the branch below, the path without the load keeps the pieces loaded a
          // chunk before, and ptxas copies them into the loop's x registers every window.
          load_x(c.w + KSPLIT < windows ? c.w + KSPLIT : c.w, 0);
        } else if (c.w + KSPLIT < windows) {
          load_x(c.w + KSPLIT, 0);  // this warp's next window
        }
      }
      // Scales folded into the weight accumulate into acc directly; scales on the accumulator
      // need the chunk's products apart first.
      constexpr bool kChunkScales = Format::kAccumulatorScales || kCols;
      float cacc[MT][4];
      float (*dst)[4] = kChunkScales ? cacc : acc;
      if constexpr (kChunkScales) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) cacc[mt][0] = cacc[mt][1] = cacc[mt][2] = cacc[mt][3] = 0.0f;
      }
      // kCols2: one scale half's products (words 0 to kWords / 2 - 1, then the rest), folded
      // into acc after its last word.
      [[maybe_unused]] float hacc[1][4] = {};
      if constexpr (kCols2) dst = hacc;
      StaticFor<Format::kWords>([&](auto word) {
        constexpr int kW = decltype(word)::value;
        uint32_t pa[4], pb[4];
        if constexpr (kCols || kCols2) {
          Cols::template DecodeCodes<T, kW>(qa, sa2, pa);
          Cols::template DecodeCodes<T, kW>(qb, sb2, pb);
        } else {
          Format::template DecodeWord<T, kW, kAltDecode>(qa, sa2, pa);
          Format::template DecodeWord<T, kW, kAltDecode>(qb, sb2, pb);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          uint32_t px[4];
          XPairs<XPERM || kPath == XPath::kStaged>(xv[mt][kW], px);
          Mma16816<T>(dst[mt], pa[0], pb[0], pa[1], pb[1], px[0], px[1]);
          Mma16816<T>(dst[mt], pa[2], pb[2], pa[3], pb[3], px[2], px[3]);
        }
        if constexpr (kCols2 && kW % (Format::kWords / 2) == Format::kWords / 2 - 1) {
          // d0, d1: row g, x rows 0 and 1 of lane t's chunk; d2, d3: row g + 8.
          constexpr bool kSecond = kW >= Format::kWords / 2;
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            acc[0][r] = fmaf(hacc[0][r], kSecond ? hs[r >> 1].y : hs[r >> 1].x, acc[0][r]);
            hacc[0][r] = 0.0f;
          }
        }
      });
      if constexpr (kChunkScales) {
        // d0, d1: row g; d2, d3: row g + 8.
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[mt][r] = fmaf(cacc[mt][r], fs[r], acc[mt][r]);
      }
    }
  };
  // d0: (row g, x row 2t), d1: (g, 2t + 1), d2: (g + 8, 2t), d3: (g + 8, 2t + 1).
  const T* bias = static_cast<const T*>(a.bias);
  const T* residual = static_cast<const T*>(a.residual);
  // one_wave (per-block kernel, every block resident at once, the launcher's word): what warp 0's
  // store reads besides the accumulators (the global scale, this lane's row_scale values, bias
  // and residual) is fetched once the pipeline's first copies are in flight, the global scale
  // into a register and the rest into L1, so that the store's loads hit L1 instead of each
  // taking a round trip to L2 or DRAM (in the 8B decode step every GEMV has a row scale or a
  // residual, written by the kernel before). Read up front, the global scale's multiply sat
  // ahead of the first weight copy (the compiler placed it there) and every warp waited a round
  // trip for 4 bytes before its weight stream began (Nsight Compute, NVFP4 6144 x 4096 at M = 1,
  // commit f3bd428). In every grid this gained 0.3-0.4 us on o and down and lost 0.2-1.3 on
  // gate_up and 9 on lm_head, whose blocks come in waves (docs/perf-log.md, entries 73 and 76),
  // so grids of several waves read the global scale up front as before.
  // Nothing above reads memory: here the kernel waits for the one before it in the stream where
  // it was launched to overlap it (JAXGEMV_PDL, decoder_layer; at once otherwise), after sending
  // its first windows' weight rows toward L2 where asked (a.l2_first: L2 holds what the kernel
  // before writes, so this is safe whatever wrote the weight). Where a.early_weights allows and x
  // is not in the ring, the wait moves into the pipeline, after the copies of the first windows
  // (weight and scales only) are issued: their DRAM round trip then overlaps the kernel before.
  // (Per-block kernel only: the persistent one, the lm_heads' at M > 1, is launched without it, as
  // the wait and the trigger below cost it 8 registers and a spill, SASS at sm_90.)
  if constexpr (!kXs) {
    if (a.l2_first) {
      const Rows r = rows_of(first_tile);
#pragma unroll
      for (int i = 0; i < kStages - 1; ++i) {
        if (i < count) {
          const uint32_t wbytes = static_cast<uint32_t>(warp + i * KSPLIT) * (64 * LOADS);
#pragma unroll
          for (int l = 0; l < LOADS; ++l) PrefetchL2(r.wa + wbytes + 64 * l), PrefetchL2(r.wb + wbytes + 64 * l);
        }
      }
    }
  }
  // The per-block kernel's x path, known here at run time (the pipeline below is compiled per
  // path): in the ring (kRing) the first copies read x, so they wait first.
  const bool early_copies = !kXs && a.early_weights && (MT != 1 || !MmaOneRowX(MT, a.m) || (KSPLIT > 1 && x_staged));
  if constexpr (!kXs) {
    if (a.early_trigger) LaunchDependents();
    if (!early_copies) GridDependencyWait();
  }
  float gscale = 1.0f;
  if ((kXs || !one_wave) && a.gscale) gscale = __ldg(a.gscale);
  auto prefetch_store = [&] {
    if (kXs || !one_wave || warp != 0) return;
    if (a.gscale) gscale = LoadLateF32(a.gscale);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = min(m0 + mt * 8 + 2 * t + h, a.m - 1);
        if (a.row_scale) PrefetchL1(a.row_scale + m);
        if (residual && a.swiglu) {
          PrefetchL1(residual + static_cast<int64_t>(m) * (a.n / 2) + min(first_tile * 8 + g, a.n / 2 - 1));
        } else if (residual) {
          PrefetchL1(residual + static_cast<int64_t>(m) * a.n + row_of(first_tile, g));
          PrefetchL1(residual + static_cast<int64_t>(m) * a.n + row_of(first_tile, g + 8));
        }
      }
    if (bias) PrefetchL1(bias + row_of(first_tile, g)), PrefetchL1(bias + row_of(first_tile, g + 8));
  };
  auto store = [&](int tile) {
    T* y = static_cast<T*>(a.y);
    const float unit = Format::template Unit<T, kAltDecode>() * gscale;
    // This lane's two rows per m-tile (2t, 2t + 1) take the unit and their row scales (1 without
    // one: exact) in one multiplier each, so the row scale costs no branch per value. With x in
    // shared memory this store sits inside the main loop; its code stays as small as it was
    // with the bias alone, plus one predicated load per value for the residual.
    float mul[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = m0 + mt * 8 + 2 * t + h;
        mul[mt][h] = a.row_scale && m < a.m ? unit * RowScale(a, m) : x_sums && m < a.m ? unit * x_rms : unit;
      }
    if (a.swiglu) {
      // Output column tile x 8 + g from gate row g (accumulators 0, 1: x rows 2t, 2t + 1) and up
      // row g + 8 (2, 3), each through the row scale and its bias first, in float32.
      const int n_out = a.n / 2, j = tile * 8 + g;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int m = m0 + mt * 8 + 2 * t + h;
          if (m < a.m && j < n_out) {
            const int64_t at = static_cast<int64_t>(m) * n_out + j;
            float gate = acc[mt][h] * mul[mt][h], up = acc[mt][2 + h] * mul[mt][h];
            if (bias) gate += Act<T>::ToFloat(bias[tile * 16 + g]), up += Act<T>::ToFloat(bias[tile * 16 + g + 8]);
            float v = gate / (1.0f + __expf(-gate)) * up;
            if (residual) v += Act<T>::ToFloat(residual[at]);
            y[at] = Act<T>::FromFloat(v);
          }
        }
      }
      return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int m = m0 + mt * 8 + 2 * t + (r & 1);
        const int n = tile * 16 + g + (r < 2 ? 0 : 8);
        if (m < a.m && n < a.n) {
          const int64_t at = static_cast<int64_t>(m) * a.n + n;
          float v = acc[mt][r] * mul[mt][r & 1];
          if (bias) v += Act<T>::ToFloat(bias[n]);
          if (residual) v += Act<T>::ToFloat(residual[at]);
          y[at] = Act<T>::FromFloat(v);
        }
      }
    }
  };

  if constexpr (kXs) {
    // x into shared memory, the block's threads splitting its pieces: the oldest cp.async group,
    // so the first wait of the loop below covers it (then a barrier for the other threads').
    const uint4* xsrc = static_cast<const uint4*>(a.x);
    const int tile_pieces = windows * LOADS * Format::kWords * 32;  // one m-tile of fragment-order x
    const int pieces = windows * LOADS * Format::kWords * xs_lanes;
    for (int p = threadIdx.x; p < pieces; p += 32 * kWarps) {
      const int cw = p / xs_lanes, lane_p = p - cw * xs_lanes;
      const int mt = MT == 2 && lane_p >= 32;
      CpAsync16(xs + p, xsrc + mt * tile_pieces + cw * 32 + (lane_p - 32 * mt));
    }
    CpAsyncCommit();
  }
  auto pipeline = [&](auto xr, auto tp) {
    constexpr bool kRingX = decltype(xr)::value == XPath::kRing;
    constexpr int stage_u4 = kStageU4 + (kRingX ? MmaXRingBytes<Format, T, LOADS>() / 16 : 0);
    uint4* const my_ring = ring + warp * kStages * stage_u4;
    // tp: the tile's scales and zero points after the ring (the launcher sized it: tile_prep).
    [[maybe_unused]] uint8_t* const tile = reinterpret_cast<uint8_t*>(ring + kStages * stage_u4);
    if constexpr (decltype(tp)::value) {
      // (Written to depend on tp, so that only the instances that stage tiles check it.)
      static_assert(!decltype(tp)::value || (!kXs && KSPLIT == 1), "one warp per block, one tile per warp");
      StagedRows<Format>::StageTile(tile, a, first_tile, lane);
    }
    if constexpr (kRingX && kBlockCols) {
      // The zero x pieces of block columns, written once (the copies never touch them); the
      // loop's first wait and __syncwarp order them before any read.
      for (int i = lane; i < kStages * kPieces; i += 32)
        my_ring[(i / kPieces) * stage_u4 + kStageU4 + (i % kPieces) * kXSlots + kMmaXZeroSlot] = make_uint4(0, 0, 0, 0);
    }
    // Step i uses stage i % kStages. Every step commits one cp.async group (empty past the
    // end), so "all but the newest kStages - 1 groups complete" always means "step i has landed".
    Cursor ahead{first_tile, kXs ? 0 : warp};
    Rows rows = rows_of(first_tile);
    Stream stream = stream_of(first_tile, ahead.w);
    // The copying cursor's step, and its rows when it enters a new tile.
    auto step_ahead = [&](uint4* st) {
      issue(xr, tp, ahead, rows, stream, st);
      advance(ahead);
      if (kXs && ahead.w == 0) rows = rows_of(ahead.tile);
    };
#pragma unroll
    for (int i = 0; i < kStages - 1; ++i) {
      if (i < count) step_ahead(my_ring + i * stage_u4);
      CpAsyncCommit();
    }
    if constexpr (!kXs && !kRingX) {
      if (early_copies) GridDependencyWait();
    }
    if constexpr ((decltype(xr)::value == XPath::kGlobal || decltype(xr)::value == XPath::kGlobalCols) && kAhead) {
      if (count > 0) load_x(warp, 0);  // after the wait: x is the kernel before's output
    }
    prefetch_store();
    if constexpr (kXs) {
      CpAsyncWait<kStages - 1>();
      __syncthreads();
    }
    // x staged (MmaXStagedBytes), while the first windows' copies are in flight: each lane loads
    // pieces of the warp's windows (its own and other lanes'), pairs them and stores them; the
    // loop's first __syncwarp orders the stores before any read.
    const uint4* xw[2] = {nullptr, nullptr};
    int xstep[2] = {0, 0};
    if constexpr (decltype(xr)::value == XPath::kStaged) {
      constexpr int kWinPieces = MmaXWindowPieces<Format, LOADS>();
      const int per_warp = (windows + KSPLIT - 1) / KSPLIT;
      uint4* const mine = xs + warp * per_warp * kWinPieces;
      uint4* const zero = xs + KSPLIT * per_warp * kWinPieces;
      if constexpr (kBlockCols) {
        // Every warp writes the whole zero window itself (the same zeros), so no warp waits on
        // another's.
        for (int p = lane; p < kWinPieces; p += 32) zero[p] = make_uint4(0, 0, 0, 0);
      }
      const int total = count * kWinPieces;
      constexpr int kBatch = 4;  // loads in flight per lane before their first use
      float ss = 0.0f;  // x_sums: the squares of this lane's pieces (each piece of x is one lane's)
      for (int p0 = 0; p0 < total; p0 += 32 * kBatch) {
        uint4 v[kBatch];
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int p = p0 + 32 * b + lane;
          if (p < total) {
            // Piece p: the warp's window p / kWinPieces; in it, chunk l, word wd, lane t' = r % 4.
            const int r = p % kWinPieces;
            v[b] = LoadKeep16(x_piece(warp + p / kWinPieces * KSPLIT, r / 4 / Format::kWords, r % 4, r / 4 % Format::kWords));
          }
        }
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          const int p = p0 + 32 * b + lane;
          if (p < total) {
            uint32_t px[4];
            XPairs<XPERM>(v[b], px);
            mine[p] = make_uint4(px[0], px[1], px[2], px[3]);
            if (x_sums) ss = SquareSum<T>(v[b], ss);
          }
        }
      }
      // Into shared memory now, so that no register holds it through the loop; the K split's
      // barrier after the loop orders it before warp 0 reads it.
      if (x_sums) xsq[warp][lane] = ss;
      // Lane t's pieces; with block columns only the lanes of column 2t + h read half h's, the
      // others the zero window at every step.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool real = !kBlockCols || g == 2 * t + h;
        xw[h] = (real ? mine : zero) + t;
        xstep[h] = real ? kWinPieces : 0;
      }
    }
    Cursor cur{first_tile, kXs ? 0 : warp};
    for (int i = 0; i < count; ++i) {
      if (i + kStages - 1 < count) step_ahead(my_ring + ((i + kStages - 1) % kStages) * stage_u4);
      CpAsyncCommit();
      CpAsyncWait<kStages - 1>();
      __syncwarp();
      compute(xr, tp, cur, my_ring + (i % kStages) * stage_u4, xw, tile);
      __syncwarp();  // every lane is done with this stage before the next step refills it
      xw[0] += xstep[0], xw[1] += xstep[1];
      if constexpr (kXs) {
        if (cur.w == windows - 1) store(cur.tile), zero_acc();
      }
      advance(cur);
    }
  };
  using Global = std::integral_constant<XPath, XPath::kGlobal>;
  using Ring = std::integral_constant<XPath, XPath::kRing>;
  using NoTile = std::false_type;
  if constexpr (!kXs && MT == 1) {
    if constexpr (kColumns2) {
      pipeline(std::integral_constant<XPath, XPath::kGlobalCols>{}, NoTile{});  // M = 2 (the launcher's word)
    } else if (!MmaOneRowX(MT, a.m)) {
      if constexpr (KSPLIT == 1 && Format::kStagedPrep) {
        if (a.tile_prep) {
          pipeline(Global{}, std::true_type{});
        } else {
          pipeline(Global{}, NoTile{});
        }
      } else {
        pipeline(Global{}, NoTile{});
      }
    } else if constexpr (KSPLIT > 1) {
      if (x_staged) {
        pipeline(std::integral_constant<XPath, XPath::kStaged>{}, NoTile{});
      } else {
        pipeline(Ring{}, NoTile{});
      }
    } else if constexpr (Format::kStagedPrep) {
      if (a.tile_prep) {
        pipeline(Ring{}, std::true_type{});
      } else {
        pipeline(Ring{}, NoTile{});
      }
    } else {
      pipeline(Ring{}, NoTile{});
    }
  } else {
    pipeline(Global{}, NoTile{});
  }
  if constexpr (!kXs) {
    if (!a.early_trigger) LaunchDependents();  // the weight's stream is done: the next kernel may start launching
    if constexpr (KSPLIT > 1) {
      __shared__ float red[KSPLIT - 1][MT * 4][32];  // MmaStaticSharedBytes
      static_assert(sizeof(red) + sizeof(xsq) == MmaStaticSharedBytes<KSPLIT, MT>(),
                    "the launcher's count of static shared memory");
      if (warp > 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r) red[warp - 1][mt * 4 + r][lane] = acc[mt][r];
      }
      __syncthreads();
      if (warp > 0) return;
#pragma unroll
      for (int w = 0; w < KSPLIT - 1; ++w)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[mt][r] += red[w][mt * 4 + r][lane];
      if (x_sums) {
        // The row's sum of squares in a fixed order (warps, then lanes), so that it does not
        // depend on scheduling; rsqrt(sum / K + eps) as RowScale forms it from a given sum.
        float ss = 0.0f;
#pragma unroll
        for (int w = 0; w < KSPLIT; ++w) ss += xsq[w][lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        x_rms = rsqrtf(fmaf(ss, a.rms_inv_k, a.rms_eps));
      }
    }
    if constexpr (MT == 1 && kBlockCols && !kColumns2) {
      if (MmaOneRowX(MT, a.m)) {
        // Block columns: a row's product is the sum of its 8 columns, 2 per lane of the quad;
        // the store then writes d0 (row g) and d2 (row g + 8) from lane t = 0 as x row 0.
        acc[0][0] += acc[0][1], acc[0][2] += acc[0][3];
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
          acc[0][0] += __shfl_xor_sync(0xffffffffu, acc[0][0], o);
          acc[0][2] += __shfl_xor_sync(0xffffffffu, acc[0][2], o);
        }
      }
    }
    if constexpr (kColumns2) {
      // Block columns at M = 2: x row r's product is the sum of columns 2t + r over the quad; the
      // store then writes lane t = 0's d0 / d2 (x row 0) and d1 / d3 (x row 1), and the other
      // lanes' x rows 2t, 2t + 1 lie past M.
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) acc[0][r] += __shfl_xor_sync(0xffffffffu, acc[0][r], o);
    }
    store(first_tile);
  }
}

// ---------------------------------------------------------------------------------------------
// Warp-per-column GEMV, for shapes the tensor-core kernel does not take (K % 128 != 0, or
// devices before SM80). Each lane reads 8 bytes of the row per step (16 values, the smallest
// piece every legal K divides into), so a warp reads 256 contiguous bytes per instruction.
// R rows of x share every weight load and decode (row tiling); the grid's y dimension covers
// the remaining rows.
constexpr int kScalarWarps = 4;

// Where a warp-per-column GEMV's warp works: its lane, its output column (past N for the spare
// warps of the last block) and the first of its R rows of x.
template <int R>
struct WarpColumn {
  int lane = threadIdx.x & 31;
  int n = blockIdx.x * kScalarWarps + (threadIdx.x >> 5);
  int m0 = blockIdx.y * R;
};

// The end of a warp-per-column GEMV: each of the R rows' lane sums reduced across the warp, times
// `unit`, through the epilogue, stored by lane 0 for the rows below M.
template <typename T, int R>
__device__ __forceinline__ void StoreWarpColumn(const float (&acc)[R], const GemvArgs& a, int n, int m0, int lane,
                                                float unit) {
  T* y = static_cast<T*>(a.y);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float v = acc[r];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && m0 + r < a.m)
      y[static_cast<int64_t>(m0 + r) * a.n + n] = Act<T>::FromFloat(Epilogue<T>(v * unit, a, m0 + r, n));
  }
}

template <typename Format, typename T, int R>
__global__ void __launch_bounds__(32 * kScalarWarps) ScalarGemvKernel(GemvArgs a) {
  const auto [lane, n, m0] = WarpColumn<R>{};
  if (n >= a.n) return;
  const int64_t pieces = a.k / 16;
  const uint8_t* wrow = a.w + static_cast<int64_t>(n) * Format::RowBytes(a.k, 0);
  const uint8_t* srow = a.scales + static_cast<int64_t>(n) * Format::ScaleRowBytes(a.k, 0);

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

#pragma unroll 4
  for (int64_t p = lane; p < pieces; p += 32) {
    __half2 wp[8];
    Format::DecodeHalf8(LoadOnce8(wrow + p * 8), __ldg(srow + p), wp);
    float2 wf[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) wf[i] = __half22float2(wp[i]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (m0 + r >= a.m) break;
      const uint4* xp = reinterpret_cast<const uint4*>(static_cast<const T*>(a.x) + static_cast<int64_t>(m0 + r) * a.k + p * 16);
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const uint4 v = LoadKeep16(xp + w);
        const T* xv = reinterpret_cast<const T*>(&v);
        // Pair j of word w is (value 8w + j, value 8w + j + 4).
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          acc[r] = fmaf(wf[4 * w + j].x, Act<T>::ToFloat(xv[j]), acc[r]);
          acc[r] = fmaf(wf[4 * w + j].y, Act<T>::ToFloat(xv[j + 4]), acc[r]);
        }
      }
    }
  }

  StoreWarpColumn<T, R>(acc, a, n, m0, lane, Format::template Unit<__half>() * __ldg(a.gscale));
}

// ---------------------------------------------------------------------------------------------
// Dequantizer: W [N, K] in T, for XLA's dot above the GEMV range. One thread per 16 values.
// gscale == nullptr leaves the global scale out.
template <typename Format, typename T>
__global__ void __launch_bounds__(256) DequantizeKernel(const uint8_t* w, const uint8_t* scales,
                                                        const float* gscale, T* out, int64_t n,
                                                        int64_t k) {
  // The launcher guarantees n * k / 16 < 2^32, so the index split is a 32-bit division.
  const uint32_t per_row = static_cast<uint32_t>(k / 16);
  const uint32_t pieces = static_cast<uint32_t>(n) * per_row;
  const float unit = Format::template Unit<__half>() * (gscale ? __ldg(gscale) : 1.0f);
  for (uint32_t p = blockIdx.x * blockDim.x + threadIdx.x; p < pieces; p += gridDim.x * blockDim.x) {
    const int64_t row = p / per_row, piece = p % per_row;
    __half2 wp[8];
    Format::DecodeHalf8(LoadOnce8(w + row * Format::RowBytes(k, 0) + piece * 8),
                        __ldg(scales + row * Format::ScaleRowBytes(k, 0) + piece), wp);
    alignas(16) T v[16];
#pragma unroll
    for (int wd = 0; wd < 2; ++wd)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(wp[4 * wd + j]);
        v[8 * wd + j] = Act<T>::FromFloat(f.x * unit);
        v[8 * wd + j + 4] = Act<T>::FromFloat(f.y * unit);
      }
    uint4* dst = reinterpret_cast<uint4*>(out + row * k + piece * 16);
    dst[0] = reinterpret_cast<const uint4*>(v)[0];
    dst[1] = reinterpret_cast<const uint4*>(v)[1];
  }
}

}  // namespace jaxgemv
