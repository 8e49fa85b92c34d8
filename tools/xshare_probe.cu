// Would int4 at M = 9-16 reach the read rate if a block's warps shared x through shared memory?
//
// The library's two-m-tile kernel (ffi/gemv_core.cuh, MT = 2) gives each block one 16-row tile and
// splits its K over the block's warps, so every warp loads its own x pieces from global memory: 16
// rows x 2 bytes of x for every half byte of weight, four times the weight's bytes through L1 and
// L2. At 128 registers ptxas issues those loads about 120 instructions ahead of their mma, and on
// an H100 and an H200 one HMMA waiting on them holds 11-34% of the stall samples (docs/perf-log.md,
// entry 147): int4 34816 x 5120 at M = 16 runs at 50% of the read on an H200.
//
// Here a block's W warps take W adjacent tiles over the same K window. The window's x (8 MT rows x
// 256 values, in the decode's pair order) is copied once per block by cp.async into a ring stage
// beside each warp's 16 rows of weight and their scales, the B operands are shared-memory loads,
// and one barrier per window hands the stage on. The grid is persistent and balanced as a stream
// over (tile group, window) steps: block b takes steps [b T / B, (b + 1) T / B) of the T = groups x
// windows, flushing its sums into a float32 output with atomic adds where its range leaves a tile
// group, so every block does the same work to within one window whatever N and K are.
//
// The weight is the library's MatMulNBits layout at blocks of 32 (codes [N, K / 2] low nibble
// first, symmetric: q - 8; bf16 scales [N, K / 32]), x is bf16 [M, K] with each 8 values stored in
// the order (0, 4, 1, 5, 2, 6, 3, 7) (the library's fragment order within a piece), and a code
// decodes as the library's does: bf16 128 + q by writing q under 0x4300, minus 136, times the
// scale, one rounding.
//
// With --nvfp4 the weight is NVFP4 instead (E2M1 codes in the same nibble order, an E4M3 scale per
// 16 values: the same K / 16 bytes of scales a row) with fp16 x, decoded by the library's own
// ffi/nvfp4.cuh (E2m1Pairs, ScalePair): does the design carry over to NVFP4 at M = 2-16? With
// --int8, 8-bit codes (q - 128, fp16 scales at blocks of 32, fp16 x): does it
// carry over to int8 at M = 8-16?
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi \
//     -I"$(python3 -c 'import jax.ffi; print(jax.ffi.include_dir())')" tools/xshare_probe.cu -o /tmp/xshare_probe
//   /tmp/xshare_probe [--nvfp4 | --int8] [N K ...]   (pairs; default 34816 5120 8192 28672: per case the
//                                    error against float64, the cold time with and without the
//                                    output's zeroing and the read kernel's share of it)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "gemv_core.cuh"
#include "nvfp4.cuh"
#include "probe_util.cuh"
#include "stream_read.cuh"
#include "xshare.cuh"

namespace {

using jaxgemv::CpAsync16;
using jaxgemv::CpAsyncCommit;
using jaxgemv::CpAsyncWait;

constexpr int kWin = 256;  // K values a window

// The weight formats: the template argument F of the kernel, Run and RunShape. Every one takes
// K / 16 bytes of scales a row (int4: a bf16 per 32 values; NVFP4: an E4M3 per 16; int8: an fp16
// per 32): the window's 16 bytes, and lane t's half l of it starts at byte 8 l + 2 t (int4 and int8:
// its block's scale; NVFP4: its two blocks').
constexpr int kInt4 = 0, kNvfp4 = 1, kInt8 = 2;
template <int F>
using ProbeT = std::conditional_t<F == kInt4, __nv_bfloat16, __half>;
// Bytes of codes a row takes in a window: 128 for 4-bit codes, 256 for 8-bit ones.
template <int F>
constexpr int kCodeBytes = F == kInt8 ? 256 : 128;

// A stage: x's window (8 MT rows x 512 bytes), then per warp its tile's 16 rows of codes (CB bytes
// each) and 16 rows of scales (16 bytes: the window's 8 or 16 block scales).
template <int W, int MT, int CB>
struct Stage {
  static constexpr int kX = MT * 8 * 512, kW = 16 * CB, kS = 16 * 16;
  static constexpr int kBytes = kX + W * (kW + kS);
};

// Where 16-byte unit u of an x row and of a code row lands in its stage row (bank-conflict-free
// reads) and the int4 / int8 decodes are the library's xshare variant's (ffi/xshare.cuh), which
// grew from this probe.
using jaxgemv::XshareWUnit;
using jaxgemv::XshareXUnit;

// The mma, the 16-bit pair casts and the copies are the library's (ffi/cuda_util.cuh).
using jaxgemv::AsU32;
using jaxgemv::FromU32;
using jaxgemv::Mma16816;

// The four A pairs that x's unit j (8 values) of the lane's 32 meets, times the scale(s), from the
// lane's words of one row (4-bit: word j, pairs (0, 4), (1, 5), (2, 6), (3, 7); 8-bit: words 2 j and
// 2 j + 1, pairs (0, 2), (1, 3) of each; j is a constant once the loop over j is unrolled). NVFP4
// decodes as the library does (ffi/nvfp4.cuh: E2m1Pairs, the sums in units of 2^-14).
template <int F>
__device__ __forceinline__ void DecodeUnit(const uint32_t (&w)[F == kInt8 ? 8 : 4], int j, uint32_t mask,
                                           uint32_t magic, uint32_t scales, uint32_t (&p)[4]) {
  if constexpr (F == kNvfp4) {
    jaxgemv::E2m1Pairs<__half>(w[j], p);
    const __half2 s2 = FromU32<__half2>(scales), s = j < 2 ? __low2half2(s2) : __high2half2(s2);
#pragma unroll
    for (int i = 0; i < 4; ++i) p[i] = AsU32(__hmul2(FromU32<__half2>(p[i]), s));
  } else {
    using T2 = typename jaxgemv::Act<ProbeT<F>>::T2;
    jaxgemv::XshareDecodeUnit<F == kInt8 ? 8 : 4, ProbeT<F>>(w, j, mask, magic, FromU32<T2>(scales), p);
  }
}

// Half l's scales for the row whose window scales start at `row_scales` in the stage (lane t's
// offset included), prepared once per half.
template <int F>
__device__ __forceinline__ uint32_t ChunkScales(const uint8_t* row_scales, int l) {
  if constexpr (F == kNvfp4) {
    return AsU32(jaxgemv::ScalePair<__half>(*reinterpret_cast<const unsigned short*>(row_scales + 8 * l)));
  } else {
    return AsU32(jaxgemv::Act<ProbeT<F>>::Splat(*reinterpret_cast<const ProbeT<F>*>(row_scales + 8 * l)));
  }
}

// y[M, N] (float32, zeroed) += x[M, K] @ dequant(W[N, K])^T, M = 8 MT. Lane t's values of half l
// of a window are 128 l + 32 t .. + 32: a 16-byte unit of each of its rows for 4-bit codes, two for
// 8-bit ones (--int8: q - 128 with fp16 scales at blocks of 32, fp16 x in the order (0, 2, 1, 3,
// 4, 6, 5, 7) within each 8 values). (A "sums" form for NVFP4, the codes into the mmas unscaled and
// each scale block's float32 sums times its scale, ran no faster and wrong as written: perf log 150.)
template <int F, int W, int MT, int S>
__global__ void __launch_bounds__(32 * W) XShareGemv(const uint8_t* __restrict__ codes,
                                                     const uint8_t* __restrict__ scales,
                                                     const ProbeT<F>* __restrict__ x, float* __restrict__ y,
                                                     int n, int k) {
  using T = ProbeT<F>;
  constexpr int CB = kCodeBytes<F>, kUnits = CB / 16, kCodeCopies = CB / 32, kC = CB / 128;
  using St = Stage<W, MT, CB>;
  constexpr int kXCopies = MT * 8 * 32 / (32 * W);  // x's 16-byte units a thread copies per window
  static_assert(kXCopies >= 1 && MT * 8 * 32 % (32 * W) == 0, "x's units spread evenly over the block");
  extern __shared__ __align__(16) uint8_t smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int windows = k / kWin, groups = n / (16 * W);
  const int64_t row_bytes = static_cast<int64_t>(k) * CB / kWin;
  const int64_t total = static_cast<int64_t>(groups) * windows;
  const int begin = static_cast<int>(total * blockIdx.x / gridDim.x);
  const int count = static_cast<int>(total * (blockIdx.x + 1) / gridDim.x) - begin;

  // The copying cursor (step begin + issued): per thread, its fixed x units (a source at window 0
  // and a destination in the stage), and for the current tile group its code units and (lanes
  // 0-15) one row of scales, set when the cursor enters a group.
  const uint8_t* xsrc[kXCopies];
  int xdst[kXCopies];
#pragma unroll
  for (int c = 0; c < kXCopies; ++c) {
    const int i = threadIdx.x + 32 * W * c, row = i >> 5, u = i & 31;
    xsrc[c] = reinterpret_cast<const uint8_t*>(x + static_cast<int64_t>(row) * k + u * 8);
    xdst[c] = row * 512 + XshareXUnit(u, row) * 16;
  }
  const int wbase = St::kX + warp * (St::kW + St::kS);
  int wdst[kCodeCopies];
#pragma unroll
  for (int c = 0; c < kCodeCopies; ++c) {
    const int i = lane + 32 * c, row = i / kUnits, u = i % kUnits;
    wdst[c] = wbase + row * CB + XshareWUnit<CB>(u, row) * 16;
  }
  const int sdst = wbase + St::kW + (lane & 15) * 16;
  const uint8_t* wsrc[kCodeCopies];
  const uint8_t* ssrc = nullptr;
  auto enter = [&](int group) {
    const int tile = group * W + warp;
#pragma unroll
    for (int c = 0; c < kCodeCopies; ++c) {
      const int i = lane + 32 * c, row = i / kUnits, u = i % kUnits;
      wsrc[c] = codes + (tile * 16 + row) * row_bytes + u * 16;
    }
    ssrc = scales + (tile * 16 + (lane & 15)) * static_cast<int64_t>(k / 16);
  };
  int ig = begin / windows, iw = begin % windows;
  enter(ig);
  auto issue = [&](int slot_bytes) {
    uint8_t* st = smem + slot_bytes;
#pragma unroll
    for (int c = 0; c < kXCopies; ++c) CpAsync16(st + xdst[c], xsrc[c] + iw * (kWin * 2));
#pragma unroll
    for (int c = 0; c < kCodeCopies; ++c) CpAsync16(st + wdst[c], wsrc[c] + iw * CB);
    if (lane < 16) CpAsync16(st + sdst, ssrc + iw * 16);
    if (++iw == windows) {
      iw = 0;
      if (++ig < groups) enter(ig);
    }
  };

  // This lane's reads of a stage: x row 8 mt + g's units 16 l + 4 t + j sit at
  // 16 l + 4 t + (j ^ c) (XUnit, c fixed per lane); code units (4 l + t) kC + c of rows g, g + 8
  // where WUnit puts them.
  const int xc = ((t >> 1) << 1) ^ (g & 1);
  int xoff[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) xoff[j] = g * 512 + (4 * t + (j ^ xc)) * 16;
  int woff[2][kC];
#pragma unroll
  for (int l = 0; l < 2; ++l)
#pragma unroll
    for (int c = 0; c < kC; ++c) woff[l][c] = wbase + g * CB + XshareWUnit<CB>((4 * l + t) * kC + c, g) * 16;
  const int soff = wbase + St::kW + g * 16 + t * 2;

  // In registers (DecodeUnit; n and k are never negative): int4's 0x000F000F and 0x43004300,
  // int8's 0x64646464.
  const uint32_t mask = 0x000F000Fu | (static_cast<uint32_t>(n) >> 31);
  const uint32_t magic = jaxgemv::XshareMagic<F == kInt8 ? 8 : 4, ProbeT<F>>() | (static_cast<uint32_t>(k) >> 31);
  float acc[MT][4] = {};
  int cg = ig, cw = iw;  // the computing cursor (step begin + computed)
  auto flush = [&] {
    const int tile = cg * W + warp;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int m = mt * 8 + 2 * t;
      atomicAdd(y + static_cast<int64_t>(m) * n + tile * 16 + g, acc[mt][0]);
      atomicAdd(y + static_cast<int64_t>(m + 1) * n + tile * 16 + g, acc[mt][1]);
      atomicAdd(y + static_cast<int64_t>(m) * n + tile * 16 + g + 8, acc[mt][2]);
      atomicAdd(y + static_cast<int64_t>(m + 1) * n + tile * 16 + g + 8, acc[mt][3]);
      acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
    }
  };

#pragma unroll
  for (int p = 0; p < S - 1; ++p) {
    if (p < count) issue(p * St::kBytes);
    CpAsyncCommit();
  }
  for (int i = 0; i < count; ++i) {
    CpAsyncWait<S - 2>();
    __syncthreads();  // step i landed for every thread's copies; step i - 1's slot is free
    if (i + S - 1 < count) issue((i + S - 1) % S * St::kBytes);
    CpAsyncCommit();

    const uint8_t* st = smem + (i % S) * St::kBytes;
#pragma unroll
    for (int l = 0; l < 2; ++l) {
      // Rows g and g + 8: this lane's codes of half l (32 values) and their scales.
      uint32_t wa[4 * kC], wb[4 * kC];  // 32 codes: 4 words of 4-bit ones, 8 of 8-bit ones
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const uint4 qa = *reinterpret_cast<const uint4*>(st + woff[l][c]);
        const uint4 qb = *reinterpret_cast<const uint4*>(st + woff[l][c] + 8 * CB);
        wa[4 * c] = qa.x, wa[4 * c + 1] = qa.y, wa[4 * c + 2] = qa.z, wa[4 * c + 3] = qa.w;
        wb[4 * c] = qb.x, wb[4 * c + 1] = qb.y, wb[4 * c + 2] = qb.z, wb[4 * c + 3] = qb.w;
      }
      const uint32_t sa = ChunkScales<F>(st + soff, l), sb = ChunkScales<F>(st + soff + 8 * 16, l);
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // x's unit j: values 8 j .. 8 j + 7 of the lane's 32
        uint32_t a[4], b[4];
        DecodeUnit<F>(wa, j, mask, magic, sa, a);
        DecodeUnit<F>(wb, j, mask, magic, sb, b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint4 xv = *reinterpret_cast<const uint4*>(st + xoff[j] + mt * 8 * 512 + l * 256);
          // The unit's first two pairs in one mma, its last two in the next: slots 2t, 2t + 1 carry
          // the first pair of each, slots 2t + 8, 2t + 9 the second, in A and B alike.
          Mma16816<T>(acc[mt], a[0], b[0], a[1], b[1], xv.x, xv.y);
          Mma16816<T>(acc[mt], a[2], b[2], a[3], b[3], xv.z, xv.w);
        }
      }
    }
    if (++cw == windows || i + 1 == count) {
      flush();
      if (cw == windows) cw = 0, ++cg;
    }
  }
}

struct Case {
  int n, k;
};

template <int F, int W, int MT, int S>
void Run(const char* name, int n, int k, const ProbeDevice& d, cudaStream_t s, const uint8_t* pool, int64_t stride,
         int64_t scale_off, int copies, double read_us, const std::vector<float>& hx, const std::vector<int>& ref_rows,
         const std::vector<double>& ref) {
  using T = ProbeT<F>;
  constexpr int M = 8 * MT;
  // NVFP4's sums are in units of 2^-14 (ffi/nvfp4.cuh, E2m1Bits<__half>::kUnit).
  const double unit = F == kNvfp4 ? 16384.0 : 1.0;
  if (n % (16 * W) || k % kWin) {
    std::printf("%-16s N must be a multiple of %d and K of %d\n", name, 16 * W, kWin);
    return;
  }
  // x in the decode's pair order within each 8 values: (0, 4, 1, 5, 2, 6, 3, 7) for 4-bit codes,
  // (0, 2, 1, 3, 4, 6, 5, 7) for 8-bit ones.
  std::vector<T> px(static_cast<size_t>(M) * k);
  for (int m = 0; m < M; ++m)
    for (int k8 = 0; k8 < k; k8 += 8)
      for (int i = 0; i < 8; ++i) {
        const int from = F == kInt8 ? (i & 4) + ((i & 3) >> 1) + 2 * (i & 1) : (i >> 1) + 4 * (i & 1);
        px[static_cast<size_t>(m) * k + k8 + i] = T(hx[static_cast<size_t>(m) * k + k8 + from]);
      }
  T* x;
  float* y;
  CK(cudaMalloc(&x, px.size() * sizeof(T)));
  CK(cudaMalloc(&y, static_cast<int64_t>(M) * n * sizeof(float)));
  CK(cudaMemcpy(x, px.data(), px.size() * sizeof(T), cudaMemcpyHostToDevice));
  const int smem = S * Stage<W, MT, kCodeBytes<F>>::kBytes;
  auto* kernel = XShareGemv<F, W, MT, S>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * W, smem));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kernel));
  const int grid = per_sm * d.sms;
  const int64_t ybytes = static_cast<int64_t>(M) * n * sizeof(float);
  auto codes_of = [&](int c) { return pool + c * stride; };
  auto scales_of = [&](int c) { return pool + c * stride + scale_off; };
  // Correctness on copy 0 against float64; a poisoned output stays NaN where nothing is added.
  CK(cudaMemsetAsync(y, 0, ybytes, s));
  kernel<<<grid, 32 * W, smem, s>>>(codes_of(0), scales_of(0), x, y, n, k);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::vector<float> hy(static_cast<size_t>(M) * n);
  CK(cudaMemcpy(hy.data(), y, hy.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0, ref_max = 0;
  for (size_t r = 0; r < ref_rows.size(); ++r)
    for (int m = 0; m < M; ++m) {
      const double want = ref[r * 16 + m], got = unit * hy[static_cast<size_t>(m) * n + ref_rows[r]];
      err = std::max(err, std::isfinite(got) ? std::fabs(got - want) : INFINITY);
      ref_max = std::max(ref_max, std::fabs(want));
    }
  const double us = ColdMicros(s, copies, [&](cudaStream_t st, int c) {
    CK(cudaMemsetAsync(y, 0, ybytes, st));
    kernel<<<grid, 32 * W, smem, st>>>(codes_of(c), scales_of(c), x, y, n, k);
  });
  const double zero_us = CapturedMicros(s, 16, [&](cudaStream_t st) {
    for (int r = 0; r < 16; ++r) CK(cudaMemsetAsync(y, 0, ybytes, st));
  });
  std::printf("%-16s M %2d %4d %3d %5d %9.2e %8.2f %8.2f %6.1f\n", name, M, fa.numRegs, per_sm, grid, err / ref_max, us,
              zero_us, 100.0 * read_us / (us - zero_us));
  CK(cudaFree(x));
  CK(cudaFree(y));
}

// E2M1 code q (sign in bit 3) as its value.
double E2m1Value(int q) {
  static const double kMag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return q & 8 ? -kMag[q & 7] : kMag[q & 7];
}
// E4M3 byte (no sign, exponent 4-9: 2^-3 to 2^2) as its value.
double E4m3Value(uint8_t b) { return std::ldexp(1.0 + (b & 7) / 8.0, (b >> 3) - 7); }

template <int F>
void RunShape(int n, int k, const ProbeDevice& d, cudaStream_t s, const ReadFlags& flags) {
  constexpr bool FP4 = F == kNvfp4, I8 = F == kInt8;
  // K / 16 bytes of scales a row (kInt4 above); K / 2 bytes of codes, K for int8.
  const int64_t row_code_bytes = static_cast<int64_t>(k) * kCodeBytes<F> / kWin;
  const int64_t code_bytes = static_cast<int64_t>(n) * row_code_bytes, scale_bytes = static_cast<int64_t>(n) * (k / 16);
  const int64_t bytes = code_bytes + scale_bytes;
  std::mt19937 rng(n + k);
  std::vector<uint8_t> hw(code_bytes);
  for (auto& b : hw) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> hs(scale_bytes);
  std::uniform_real_distribution<float> us(0.5f, 2.0f);
  if (FP4) {
    for (auto& b : hs) b = static_cast<uint8_t>(((4 + rng() % 6) << 3) | (rng() & 7));
  } else if (I8) {
    for (int64_t i = 0; i < scale_bytes / 2; ++i) {
      const __half v = __float2half(us(rng) * 0.001f);
      std::memcpy(&hs[2 * i], &v, 2);
    }
  } else {
    for (int64_t i = 0; i < scale_bytes / 2; ++i) {
      const __nv_bfloat16 v = __float2bfloat16(us(rng) * 0.01f);
      std::memcpy(&hs[2 * i], &v, 2);
    }
  }
  // The weight's value at (row, kk) as the kernel forms it: int4 bf16((q - 8) x s), one rounding;
  // NVFP4 e2m1 x e4m3, exact in fp16; int8 fp16((q - 128) x s), one rounding.
  auto weight = [&](int row, int kk) -> double {
    if (I8) {
      __half sv;
      std::memcpy(&sv, &hs[static_cast<int64_t>(row) * (k / 16) + 2 * (kk / 32)], 2);
      const int q = hw[static_cast<int64_t>(row) * k + kk] - 128;
      return __half2float(__float2half(q * __half2float(sv)));
    }
    const uint8_t byte = hw[static_cast<int64_t>(row) * (k / 2) + kk / 2];
    const int q = kk & 1 ? byte >> 4 : byte & 15;
    if (FP4) return E2m1Value(q) * E4m3Value(hs[static_cast<int64_t>(row) * (k / 16) + kk / 16]);
    __nv_bfloat16 sv;
    std::memcpy(&sv, &hs[static_cast<int64_t>(row) * (k / 16) + 2 * (kk / 32)], 2);
    return __bfloat162float(__float2bfloat16((q - 8) * __bfloat162float(sv)));
  };
  // x, rounded to the kernel's type, varying along K.
  std::vector<float> hx(16 * static_cast<size_t>(k));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (size_t i = 0; i < hx.size(); ++i) {
    const float v = ux(rng) * (0.5f + static_cast<float>(i % k) / k);
    hx[i] = F != kInt4 ? __half2float(__float2half(v)) : __bfloat162float(__float2bfloat16(v));
  }
  // float64 references of every 13th row (all rows below 4096), the 16 rows of x.
  std::vector<int> ref_rows;
  for (int row = 0; row < n; row += (n > 4096 ? 13 : 1)) ref_rows.push_back(row);
  std::vector<double> ref(ref_rows.size() * 16, 0.0);
  for (size_t r = 0; r < ref_rows.size(); ++r)
    for (int kk = 0; kk < k; ++kk) {
      const double wv = weight(ref_rows[r], kk);
      for (int m = 0; m < 16; ++m) ref[r * 16 + m] += wv * hx[static_cast<size_t>(m) * k + kk];
    }
  const int64_t scale_off = (code_bytes + 255) / 256 * 256, stride = (scale_off + scale_bytes + 255) / 256 * 256;
  const int copies = ColdCopies(bytes, d.l2);
  uint8_t* pool;
  CK(cudaMalloc(&pool, stride * copies));
  for (int c = 0; c < copies; ++c) {
    CK(cudaMemcpy(pool + c * stride, hw.data(), code_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pool + c * stride + scale_off, hs.data(), scale_bytes, cudaMemcpyHostToDevice));
  }
  const double read_us = ColdMicros(s, copies, [&](cudaStream_t st, int c) {
    jaxgemv::StreamReadKernel<<<jaxgemv::kReadBlocksPerSm * d.sms, jaxgemv::kReadThreads, 0, st>>>(
        reinterpret_cast<const uint4*>(pool + c * stride), (scale_off + scale_bytes) / 16, flags.salt, flags.out);
  });
  std::printf("%s %d x %d: %.1f MB, %s x, %d copies; stream read %.2f us, %.2f TB/s\n",
              FP4 ? "nvfp4" : I8 ? "int8" : "int4", n, k, bytes / 1e6, F != kInt4 ? "fp16" : "bf16", copies, read_us,
              bytes / read_us / 1e6);
  std::printf("%-16s %4s %4s %3s %5s %9s %8s %8s %6s\n", "case", "M", "regs", "/SM", "grid", "rel.err", "us", "zero us",
              "%read");
  if constexpr (I8) {
    // A stage holds twice the codes of 4-bit ones (W4: 25.6 KB at two m-tiles, 21.5 KB at one).
    Run<F, 4, 2, 2>("W4 S2", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 4, 2, 3>("W4 S3", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 2, 2, 3>("W2 S3", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 4, 1, 2>("W4 S2", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 4, 1, 3>("W4 S3", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
  } else {
    Run<F, 4, 2, 3>("W4 S3", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 4, 2, 4>("W4 S4", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 8, 2, 3>("W8 S3", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 4, 1, 3>("W4 S3", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
    Run<F, 8, 1, 4>("W8 S4", n, k, d, s, pool, stride, scale_off, copies, read_us, hx, ref_rows, ref);
  }
  CK(cudaFree(pool));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<Case> cases;
  int format = kInt4, i = 1;
  if (argc > 1 && std::strcmp(argv[1], "--nvfp4") == 0) format = kNvfp4, ++i;
  if (argc > 1 && std::strcmp(argv[1], "--int8") == 0) format = kInt8, ++i;
  for (; i + 1 < argc; i += 2) cases.push_back({std::atoi(argv[i]), std::atoi(argv[i + 1])});
  if (cases.empty()) cases = {{34816, 5120}, {8192, 28672}};
  const ProbeDevice d = CurrentProbeDevice();
  std::printf("%s, %d SMs, L2 %.0f MB; median of 7 graph replays, cold; us includes the output's zeroing, %%read "
              "is of the kernel alone\n",
              d.name, d.sms, d.l2 / 1e6);
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const ReadFlags flags = MakeReadFlags();
  for (const Case& c : cases) {
    if (format == kNvfp4) {
      RunShape<kNvfp4>(c.n, c.k, d, s, flags);
    } else if (format == kInt8) {
      RunShape<kInt8>(c.n, c.k, d, s, flags);
    } else {
      RunShape<kInt4>(c.n, c.k, d, s, flags);
    }
  }
  FreeReadFlags(flags);
  return 0;
}
