// How int4 / int8 weights in ONNX Runtime's MatMulNBits layout decode on the GPU: the format
// policy for the tensor-core GEMV of ffi/gemv_core.cuh.
//
// Bytes: packed [N, blocks, bs x BITS / 8] (a row is blocks x bs values, the last block padded),
// 4-bit codes low nibble first; scales [N, blocks] in the activations' type; zero points packed
// like the codes [N, ceil(blocks x BITS / 8)], or none (2^(BITS-1)). value = (q - zp) x scale.
#pragma once

#include "common.h"
#include "cuda_util.cuh"
#include "gemv_core.cuh"

namespace jaxgemv {

// A code q as a 16-bit float "magic + q" by writing it under a fixed exponent: fp16 0x6400 is
// 1024 with a spacing of 1 up to 2047, bf16 0x4300 is 128 with a spacing of 1 up to 255. So
// (magic + q) - (magic + zp) is the exact integer q - zp, and one multiply by the scale rounds
// once, as the reference does. 8-bit codes do not fit bf16's 128..255, so with fp16 x they go
// through fp16's magic and with bf16 x through float32's (Nbits::kFloatBias).
template <typename T>
struct NbitsMagic;
template <>
struct NbitsMagic<__half> {
  static constexpr uint32_t kByte = 0x64;  // high byte of 1024 in fp16
};
template <>
struct NbitsMagic<__nv_bfloat16> {
  static constexpr uint32_t kByte = 0x43;  // high byte of 128 in bf16
};

template <int BITS>
struct Nbits : UnitOne {
  static_assert(BITS == 4 || BITS == 8, "4 or 8 bits");
  static constexpr int kValuesPerChunk = 128 / BITS;  // 16 bytes
  static constexpr int kWords = kValuesPerChunk / 8;  // 8 values each
  static constexpr bool kAccumulatorScales = false;   // scales fold into the 16-bit weight
  static constexpr bool kStagedPrep = true;           // scales and zero points staged per window
  // x loaded at each chunk, not a chunk ahead (gemv_core.cuh, load_x): ahead, the kernels grew
  // from 80 to 96 registers at two loads per window (sm_90), and on an H200 (perf log 103, kernel
  // us, M = 1 / 4 / 8) int4 12288 x 4096 went 12.2 / 15.0 / 15.9 -> 13.2 / 16.6 / 22.2 and int8
  // 5120 x 17408 36.6 / 34.6 -> 38.5 / 37.3 at M = 4 / 8, where int8 12288 x 4096 gained 1.3 /
  // 0.9 us at M = 4 / 8 and the rest moved by 0.6 us or less.
  // (The instance held to more blocks per SM takes x ahead whatever this says: gemv_core.cuh.)
  static constexpr bool kXAhead = false;
  // Two x buffers in the two-m-tile instances, 4-bit codes (gemv_core.cuh, load_x; 8-bit ones
  // untimed).
  static constexpr bool kXTwoBuffers = BITS == 4;
  // x's next-window load without a branch in the two-m-tile, two-load instances (gemv_core.cuh,
  // load_x), 4-bit codes: on an H200 (docs/perf-log.md, entry 157, kernel us, four runs) int4
  // 8192 x 28672 at M = 16 went from 56.8-58.2 to 53.1-55.0; one m-tile (M = 2 / 8 under "mma")
  // ran level and keeps the branch, as do the one-load instances (untimed; unbranched, those with
  // x in fragment order rose from 96 to 128 registers with bf16 x, a block per SM fewer), and
  // 8-bit codes lost 3% at M = 16. On an H100 the branch ran 4.5% faster at M = 16 (entry 160,
  // two rounds on one card); the H200's form is kept, the issues' card (the planner cannot tell
  // the two apart).
  template <int MT, int LOADS>
  __device__ static constexpr bool XNextUnbranched() {
    return BITS == 4 && MT == 2 && LOADS == 2;
  }
  // The launcher's rules for this format: K split 6, half the K split and FP8's K split 8 at M = 1
  // (common.h: MmaKSplit6, MmaHalvesKSplit, MmaKSplit8PastOneWave).
  static constexpr MmaFormat kMmaFormat = BITS == 4 ? MmaFormat::kInt4 : MmaFormat::kInt8;
  // x in fragment order always padded to 8 rows, the pieces' stride the constant 32 (Nvfp4::
  // kCompactX): with the stride a runtime value int4 lost 3.5-6 us on 8192 x 28672 at M = 2-8 and
  // 3 us on the 248k-row lm_head at M = 1 (docs/perf-log.md, entry 126); 8-bit codes untimed.
  static constexpr bool kCompactX = false;
  // The two-m-tile instance held to three blocks per SM (x at the chunk) compiles under that
  // register bound for 8-bit codes (gemv_core.cuh, MmaGemvKernel): with bf16 x its K-split-8
  // instances take 80 registers either way, but bounded it ran 5120 x 17408 at M = 16 in 37.5 /
  // 37.6 us against 41.6 / 41.6 (two H200 calls, docs/perf-log.md, entry 111).
  static constexpr bool kBoundTwoTiles = BITS == 8;

  // Per row, per chunk: the scales and (magic + zero point) of the blocks the chunk touches, as
  // pairs of T: low half for words 0..kWords/2-1, high half for the rest (two 16-value blocks of
  // a 4-bit chunk), the same block in both halves otherwise.
  // With kFloatBias (8-bit codes, bf16 x) bias is one float32, 2^23 + zp, instead of a pair.
  template <typename T>
  struct Prep {
    uint32_t scales, bias;
  };

  __host__ __device__ static __forceinline__ int64_t Blocks(int64_t k, int shift) { return (k + (int64_t{1} << shift) - 1) >> shift; }
  __device__ static __forceinline__ int64_t RowBytes(int64_t k, int shift) { return (Blocks(k, shift) << shift) * BITS / 8; }
  __device__ static __forceinline__ int64_t ScaleRowBytes(int64_t k, int shift) { return 2 * Blocks(k, shift); }
  template <typename I>  // int64_t for addresses, uint32_t where only the low bits matter
  __host__ __device__ static __forceinline__ I ZeroPointRowBytes(I blocks) {
    return (blocks * BITS + 7) / 8;
  }

  // 8-bit codes with bf16 x: bf16 cannot hold 128 + q for q up to 255, so q and zp go under
  // float32's 2^23 instead (spacing 1 up to 2^24): (2^23 + q) - (2^23 + zp) is q - zp exactly, and
  // |q - zp| <= 255 fits bf16's 8 significant bits, so packing the pair to bf16 is exact too; one
  // multiply by the scale rounds once, as the reference does. Prep::bias is then 2^23 + zp. The
  // loop of the lm_heads' instance went 409 -> 341 instructions per window (sm_90, cuobjdump),
  // and on an H200 (docs/perf-log.md, entry 109, kernel us, two rounds) int8 248320 x 2048 at M =
  // 1 / 4 / 8 went from 148-151 / 155-159 / 159-160 to 138-139 / 144-145 / 149, 5120 x 17408
  // from 35.0 / 36.3 / 34.2 to 32.0 / 31.7 / 30.4 and 8192 x 28672 at M = 1 / 4 from 76.0 / 84.2
  // to 68.1 / 74.7 (M = 8 83.7 both).
  template <typename T>
  static constexpr bool kFloatBias = BITS == 8 && std::is_same_v<T, __nv_bfloat16>;

  // The 16-bit float (magic + zp), in T's own magic for 4-bit codes, in fp16's for 8-bit ones.
  template <typename T>
  __device__ static __forceinline__ uint32_t Bias16(uint32_t zp) {
    constexpr uint32_t magic = (BITS == 8 ? NbitsMagic<__half>::kByte : NbitsMagic<T>::kByte) << 8;
    return magic | zp;
  }

  // Scales and zero points travel in the ring with the window's weights, as NVFP4's do: read per
  // chunk from global memory instead (through L1, prefetched a ring ahead), they made int4 half
  // as fast as NVFP4 on the same bytes: the ring's shared memory leaves L1 a few tens of KB per
  // SM, its hit rate was 44% (21% when fewer registers let more blocks in), and L2 served 70% of
  // its peak for a DRAM stream at 45% (Nsight Compute, 151936 x 2048, commit aaa5169).
  //
  // Per row and window, the aligned 16-byte pieces that hold its scales and zero points: with
  // K a multiple of the window (the kernel's condition) and power-of-two sizes, a window's S =
  // 2 x max(1, kWin / bs) bytes of scales start at a multiple of S from the array's start, so
  // they lie in one aligned piece, or exactly two when S = 32 (4-bit, blocks of 16, two loads);
  // its zero points, at most 8 bytes, in one. The arrays start on 16 bytes (checked at launch), so
  // an aligned piece that holds a byte of the array never crosses a page: reading its other bytes
  // is harmless, and they are never used. Stage layout per row: the first scale piece, then the
  // second one or the zero points; both at once (4-bit, blocks of 16, zero points, two loads) is
  // refused at launch and planned with one load. 32 bytes rather than 48 keep two blocks of 8
  // warps per SM at M = 8 with x in shared memory (jaxgemv/planner.py, NBITS_STAGE_ROW_BYTES).
  static constexpr int kStageRowBytes = 32;
  template <int LOADS>
  __device__ __host__ static constexpr int WindowScaleBytes() {
    return kStageRowBytes;
  }
  template <typename P>
  __device__ static __forceinline__ const P* AlignDown16(const P* p) {
    return reinterpret_cast<const P*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{15});
  }
  // Where each lane copies its piece of a window from, as a cursor (gemv_core.cuh,
  // StagedRows::Cursor: set at the warp's first window of a tile, advanced one step of `wstep`
  // windows per window).
  // All 32 lanes take part: lane & 15 is the row of the tile (`row` its index in the weight), lanes
  // 0-15 copy the first scale piece, 16-31 the second or the zero points. The piece of window w
  // sits at AlignDown16(base + (u >> (shift + 2))), u = m x w x kWin growing by m x wstep x kWin
  // per step, m four times the bytes a block takes: 8 for the scales (2 bytes), BITS / 2 for the
  // zero points (BITS / 8 bytes). Where a window is shorter than a block (4-bit codes, one load,
  // blocks of 256) the scales' offset can come out one byte past the block's, an odd byte of the
  // same aligned piece (each scale starts on an even byte). Per window that is a shift, a 64-bit
  // add, an and and an add; formed from the window's index (the row's offsets, the window's first
  // block, both addresses and a select) it took ~22 instructions of the int4 K-split-6 loop
  // (sm_90); with the weight's stream (and Prep's constant bias) the int4 bf16 K-split-8 loop went
  // from 511 instructions and 79 registers to 492 and 64. Straight-line, one predicated copy:
  // divergent branches around cp.async cost the loop a branch and three padding instructions apiece
  // (cuobjdump).
  struct StageCursor {
    const uint8_t* base;
    uint32_t u, step;
    bool copy;
  };
  template <int LOADS>
  __device__ static __forceinline__ StageCursor StageFrom(const GemvArgs& a, int row, int w, int wstep, int lane) {
    constexpr int kWin = 4 * LOADS * kValuesPerChunk;
    const int shift = a.scale_shift;
    const int64_t blocks = Blocks(a.k, shift);
    const bool two_pieces = (kWin >> shift) == 16;  // 32 bytes of scales
    const int half = (lane >> 4) * 16;
    const bool zp = half != 0 && !two_pieces && a.zero_points;
    const uint32_t m = zp ? BITS / 2 : 8;
    StageCursor c;
    c.base = zp ? a.zero_points + row * ZeroPointRowBytes(blocks) : a.scales + row * blocks * 2 + half;
    c.u = m * static_cast<uint32_t>(w * kWin);
    c.step = m * static_cast<uint32_t>(wstep * kWin);
    c.copy = half == 0 || two_pieces || a.zero_points;
    return c;
  }
  __device__ static __forceinline__ void StageNext(uint8_t* stage, StageCursor& c, const GemvArgs& a, int lane) {
    if (c.copy)
      CpAsync16(stage + (lane & 15) * kStageRowBytes + (lane >> 4) * 16, AlignDown16(c.base + (c.u >> (a.scale_shift + 2))));
    c.u += c.step;
  }
  // The same piece formed from the window's first value k0 (every launch but one m-tile at K split
  // 8 copies so: gemv_core.cuh, kStream).
  template <int LOADS>
  __device__ static __forceinline__ void StageWindow(uint8_t* stage, const GemvArgs& a, int row, int k0, int lane) {
    constexpr int kWin = 4 * LOADS * kValuesPerChunk;
    const int shift = a.scale_shift;
    const int64_t blocks = Blocks(a.k, shift);
    const int first = k0 >> shift;
    const bool two_pieces = (kWin >> shift) == 16;  // 32 bytes of scales
    const int half = (lane >> 4) * 16;
    const uint8_t* s = AlignDown16(a.scales + (row * blocks + first) * 2) + half;
    if (half != 0 && !two_pieces && a.zero_points)
      s = AlignDown16(a.zero_points + row * ZeroPointRowBytes(blocks) + (first * BITS >> 3));
    if (half == 0 || two_pieces || a.zero_points) CpAsync16(stage + (lane & 15) * kStageRowBytes + half, s);
  }

  // A tile's scales and zero points staged once for all of K (GemvArgs::tile_prep: the per-block
  // kernel with one m-tile and no K split, where one warp takes every window of one tile: the
  // lm_heads at M = 1-8), in shared memory after the ring, instead of each window's pieces in
  // its stage. The 16 rows' scales are contiguous in the array, and so are their zero points:
  // each is one copy of 16 x its row's bytes, starting on 16 bytes (the arrays do, checked at
  // launch), its last piece cut at the last row of the weight (so no piece runs past the
  // array's last aligned piece). Per window, each row's pieces came again: at K = 2048 and blocks of 32 (no zero
  // points) a row's 128 bytes of scales in 8 halves of a 32-byte L2 sector, twice the sectors
  // of the row's scales read once, and L2 was the kernel's busiest unit (Nsight Compute, int4
  // 248320 x 2048 at M = 1: 88% of its throughput against DRAM's 73%; docs/perf-log.md, entry
  // 113 (f)).
  __host__ __device__ static __forceinline__ int64_t TileStageBytes(int64_t k, int shift, bool zero_points) {
    const int64_t blocks = Blocks(k, shift);
    return 16 * (2 * blocks + (zero_points ? ZeroPointRowBytes(blocks) : 0));
  }
  // Called by all 32 lanes once, before the ring's first copies (so in their group).
  __device__ static __forceinline__ void StageTile(uint8_t* area, const GemvArgs& a, int tile, int lane) {
    const int64_t blocks = Blocks(a.k, a.scale_shift);
    const int sb = static_cast<int>(2 * blocks), rows = min(16, a.n - tile * 16);
    const uint8_t* s = a.scales + static_cast<int64_t>(tile) * 16 * sb;
    for (int p = lane; p < (rows * sb + 15) >> 4; p += 32) CpAsync16(area + 16 * p, s + 16 * p);
    if (a.zero_points) {
      const int zb = static_cast<int>(ZeroPointRowBytes(blocks));
      const uint8_t* z = a.zero_points + static_cast<int64_t>(tile) * 16 * zb;
      for (int p = lane; p < (rows * zb + 15) >> 4; p += 32) CpAsync16(area + 16 * sb + 16 * p, z + 16 * p);
    }
  }
  // StagedRow for a tile staged whole: row (past N: N - 1) of the tile's, window at k0.
  __device__ static __forceinline__ auto TileRow(const uint8_t* area, const GemvArgs& a, int tile, int row, int k0) {
    const uint32_t blocks = static_cast<uint32_t>(Blocks(a.k, a.scale_shift));
    const uint32_t first = static_cast<uint32_t>(k0) >> a.scale_shift;
    const uint32_t zrow = ZeroPointRowBytes(blocks), zfirst = first * BITS >> 3;
    const int r = row - tile * 16;
    WindowRow w;
    w.stage = area;
    w.s = static_cast<int>(r * 2 * blocks + (kLeanPrep ? 2 * first : 0));
    w.z = static_cast<int>(16 * 2 * blocks + r * zrow + (kLeanPrep ? zfirst : 0));
    w.zbit = kLeanPrep ? static_cast<int>(first * BITS & 7) : 0;
    return w;
  }

  // Where a row's staged scales and zero points sit, set up once per window. int4 (kLeanPrep)
  // counts a chunk's blocks from the window's first: a window starts on a multiple of its block
  // size or inside one block (both powers of two), so a chunk's blocks lie (its value offset in
  // the window) >> shift past the window's first, and the chunk's prep is a shift, an add and a
  // load (with blocks counted from the row's first, the compiler redid the row's index product
  // per chunk); the (magic + zero point) pair reaches the subtract through an operand selector
  // instead of an integer broadcast. int4's loops (cuobjdump, sm_90, bf16) went 440 -> 424
  // instructions per window in the lm_heads' instance, 452 -> 420 in the K-split-8 one at M = 1,
  // and on an H200 (docs/perf-log.md, entry 112, kernel us, two rounds) 248320 x 2048 at M = 1
  // from 86.3 / 84.1 to 81.0 / 80.8, 8192 x 28672 at M = 4 from 54.8 / 55.3 to 53.8 / 53.2 and at
  // M = 16 5120 x 17408 from 30.1 / 30.2 to 28.8 / 28.9, the rest within their spread. int8 keeps its
  // blocks counted from the row's: in that form (one round) 8192 x 28672 at M = 16 went from 84.0
  // to 98.1 us, 5120 x 17408 from 37.8 to 40.7 (its held two-m-tile instance spilled 16 bytes) and
  // its lm_heads at M = 4 / 8 ran 4-7% slower. Only the low four bits of the global addresses
  // matter (the arrays start on 16 bytes), so 32-bit arithmetic.
  static constexpr bool kLeanPrep = BITS == 4;
  struct WindowRow {
    const uint8_t* stage;
    int s, z, zbit;  // the first block's scale at byte s, its zero point at byte z, bit zbit
  };
  __device__ static __forceinline__ WindowRow StagedRow(const uint8_t* stage, const GemvArgs& a, int r, int row, int k0) {
    const int shift = a.scale_shift;
    const uint32_t blocks = static_cast<uint32_t>(Blocks(a.k, shift));
    const uint32_t first = static_cast<uint32_t>(k0) >> shift;
    const uint32_t zrow = ZeroPointRowBytes(blocks), zfirst = first * BITS >> 3;
    // Without kLeanPrep: offsets of the row's block 0 (negative from the window's first).
    WindowRow w;
    w.stage = stage + r * kStageRowBytes;
    w.s = static_cast<int>(((static_cast<uint32_t>(row) * blocks + first) * 2) & 15) -
          (kLeanPrep ? 0 : static_cast<int>(2 * first));
    w.z = 16 + static_cast<int>((static_cast<uint32_t>(row) * zrow + zfirst) & 15) - (kLeanPrep ? 0 : static_cast<int>(zfirst));
    w.zbit = kLeanPrep ? static_cast<int>(first * BITS & 7) : 0;
    return w;
  }

  // The chunk at value k of the row, kin of the window: its blocks' scales and (magic + zero
  // point) pairs.
  template <typename T>
  __device__ static __forceinline__ Prep<T> StagedChunkPrep(const WindowRow& w, const GemvArgs& a, int k, int kin) {
    const int shift = a.scale_shift;
    const int b = (kLeanPrep ? kin : k) >> shift;  // counted from w's block
    // A 4-bit chunk spans 32 values: two blocks when they are 16 wide (b is then even).
    const bool two = BITS == 4 && shift == 4;
    const unsigned short* s = reinterpret_cast<const unsigned short*>(w.stage + w.s + 2 * b);
    const uint32_t s0 = s[0];
    Prep<T> p;
    p.scales = s0 | (static_cast<uint32_t>(two ? s[1] : s0) << 16);
    uint32_t z0 = 1u << (BITS - 1), z1 = z0;
    if constexpr (BITS == 4) {
      // Without zero points 4-bit codes' bias is a constant, set before the branch so that the
      // path without them carries no instruction for it (formed after the branch, it cost that
      // path three integer instructions per chunk and row: two moves and the or of the magic), and
      // int4's K-split-8 instance with x in fragment order takes 64 registers instead of 71
      // (docs/perf-log.md, entry 139). 8-bit codes form it after the branch: set before it, their
      // fp16 two-m-tile K-split-8 instance took 104 registers instead of 80 (sm_90, ptxas -v).
      p.bias = Bias16<T>(z0) | (Bias16<T>(z0) << 16);
      if (a.zero_points) {
        const int zb = w.zbit + b * BITS;
        const uint32_t byte = w.stage[w.z + (zb >> 3)];
        if (two) {
          z0 = byte & 15u, z1 = byte >> 4;
        } else {
          z0 = z1 = (byte >> (zb & 7)) & 15u;
        }
        p.bias = Bias16<T>(z0) | (Bias16<T>(z1) << 16);
      }
    } else {
      if (a.zero_points) z0 = z1 = w.stage[w.z + ((w.zbit + b * BITS) >> 3)];
      if constexpr (kFloatBias<T>) {
        p.bias = 0x4b000000u | z0;  // 2^23 + zp as a float32 (8-bit codes: one block per chunk)
      } else {
        p.bias = Bias16<T>(z0) | (Bias16<T>(z1) << 16);
      }
    }
    return p;
  }

  // pairs[j] = (value 8W + j, value 8W + j + 4) of the chunk: (q - zp) x scale in T, rounded once
  // as the reference does, or with SCALED false the exact integers q - zp (|q - zp| <= 255 has at
  // most 8 significant bits, which fp16 and bf16 both hold).
  template <typename T, int W, bool SCALED>
  __device__ static __forceinline__ void Decode(const uint4& raw, const Prep<T>& prep, uint32_t (&pairs)[4]) {
    using T2 = typename Act<T>::T2;
    const bool high = W >= kWords / 2;
    const T2 scale = high ? Act<T>::High(FromU32<T2>(prep.scales)) : Act<T>::Low(FromU32<T2>(prep.scales));
    uint32_t h[4];  // (magic + q) pairs, as 16-bit floats (fp16 for 8-bit codes)
    if constexpr (BITS == 4) {
      const uint32_t q = W == 0 ? raw.x : W == 1 ? raw.y : W == 2 ? raw.z : raw.w;
      const uint32_t even = q & 0x0f0f0f0fu, odd = (q >> 4) & 0x0f0f0f0fu;  // values 0 2 4 6, 1 3 5 7
      constexpr uint32_t m = NbitsMagic<T>::kByte;
      h[0] = __byte_perm(even, m, 0x4240);  // values 0, 4
      h[1] = __byte_perm(odd, m, 0x4240);   // 1, 5
      h[2] = __byte_perm(even, m, 0x4341);  // 2, 6
      h[3] = __byte_perm(odd, m, 0x4341);   // 3, 7
    } else {
      const uint32_t q0 = W == 0 ? raw.x : raw.z, q1 = W == 0 ? raw.y : raw.w;  // values 0-3, 4-7
      if constexpr (kFloatBias<T>) {
        // Value j of each word as the float32 2^23 + q (byte 0 <- q's byte j, bytes 1-3 <- those
        // of 2^23 + zp, which are 0, 0 and 0x4b: the bias register is the permute's second source,
        // so its selector stays an immediate), less 2^23 + zp, packed to a bf16 pair (F2FP, exact):
        // 6 instructions per pair with the scale against 7 through fp16 (its subtract, two
        // widenings and the pack).
        const float zb = __uint_as_float(prep.bias);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float lo = __uint_as_float(__byte_perm(q0, prep.bias, 0x7650u | j)) - zb;
          const float hi = __uint_as_float(__byte_perm(q1, prep.bias, 0x7650u | j)) - zb;
          const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
          pairs[j] = AsU32(SCALED ? __hmul2(v, scale) : v);
        }
        return;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j)  // byte 0 <- q0 byte j, byte 2 <- q1 byte j (selector nibbles 0, 2)
        h[j] = (__byte_perm(q0, q1, j | ((4 + j) << 8)) & 0x00ff00ffu) | 0x64006400u;
    }
    // (magic + zp) of the word's block in both halves (kLeanPrep: an operand selector, as for the
    // scale).
    const T2 bias = kLeanPrep ? (high ? Act<T>::High(FromU32<T2>(prep.bias)) : Act<T>::Low(FromU32<T2>(prep.bias)))
                              : FromU32<T2>(high ? (prep.bias >> 16) * 0x10001u : (prep.bias & 0xffffu) * 0x10001u);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const T2 v = __hsub2(FromU32<T2>(h[j]), bias);
      pairs[j] = AsU32(SCALED ? __hmul2(v, scale) : v);
    }
  }
  template <typename T, int W, bool /*ALT*/ = false>  // one decode: ALT is ignored
  __device__ static __forceinline__ void DecodeWord(const uint4& raw, const Prep<T>& prep, uint32_t (&pairs)[4]) {
    Decode<T, W, true>(raw, prep, pairs);
  }
  template <typename T, int W>
  __device__ static __forceinline__ void DecodeCodes(const uint4& raw, const Prep<T>& prep, uint32_t (&pairs)[4]) {
    Decode<T, W, false>(raw, prep, pairs);
  }

  // Block columns (gemv_core.cuh, M = 1), 4-bit codes: the mma takes the exact q - zp
  // (DecodeCodes), each of its eight output columns sums one half chunk (words 0-1 or 2-3, each
  // inside one scale block), and the two scales multiply those float32 sums, 4 fma per chunk
  // instead of a multiply per decoded pair (64 per window). Unlike NVFP4's scaled-down codes,
  // integers times x stay in float32's normal range for bf16 x too. The M = 1 loops (cuobjdump,
  // sm_90, bf16) went 476 -> 440 instructions per window in the lm_heads' instance and 493 -> 452
  // in the K-split-8 one, and on an H200 (docs/perf-log.md, entry 110, kernel us, two rounds)
  // int4 8192 x 28672 at M = 1 from 49.8 / 49.2 to 45.4 / 46.3, 5120 x 17408 23.3 / 23.2 to
  // 22.9 / 22.9, the lm_heads within their spread (248320 x 2048 89.5 / 90.0 against 90.3 /
  // 88.8). 8-bit codes keep the scale in the weight: their loops shrank 4% (342 -> 329, one
  // multiply per 8-bit pair) and their lm_head did not move (143.6 / 144.1 against 143.9 / 150.3).
  template <typename T>
  __device__ static constexpr bool BlockColumns() {
    return BITS == 4;
  }
  static constexpr bool kColumnsWherePlanned = true;
  // The chunk's two half scales as float32, the first half's in x (Prep::scales' low half).
  template <typename T>
  __device__ static __forceinline__ float2 ColumnScales(const Prep<T>& prep) {
    return Act<T>::ToFloat2(FromU32<typename Act<T>::T2>(prep.scales));
  }
};

}  // namespace jaxgemv
