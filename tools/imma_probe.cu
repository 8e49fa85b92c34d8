// Could int4 and int8 weights reach the H200's read rate through the integer tensor cores?
//
// The int4 GEMV loops (ffi/nbits.cuh) turn every code into a 16-bit float (magic number, zero
// point, scale: ~400 instructions per 16-row window of 256 values at M = 1) and the H200 needs
// about 4.3 TB/s / 132 SMs of codes per SM: at that rate the loop's issue slots, not DRAM, bound
// it (docs/perf-log.md, open item 2). This probe times the other way to the tensor cores, none of
// it in the library:
//
// - a code q becomes the signed byte 16 (q - 8) with one LOP3 (the nibble in a byte's high half,
//   its top bit flipped: the byte's own sign extension subtracts 8), so a word of eight codes is
//   two registers of IMMA operand in three instructions (mma.sync m16n8k32 s8.s8.s32, native on
//   sm_80 / sm_90; the e4m3 form of that mma is emulated there with F2FP + HMMA, cuobjdump); an
//   8-bit code q is the byte q - 128 by flipping its top bit, one LOP3 per four codes;
// - x goes in as P planes of signed bytes, x = u1 p1 + u2 p2 + u3 p3 (u's powers of two from the
//   row's largest |x|: resolution 2^-19 of it at P = 3, so fp16 and bf16 values at most 2^8 below
//   the row's largest are exact), planes and rows in the mma's eight B columns (P x M <= 8);
// - a block of 32 codes is one mma, and its int32 sums take the row's block scale in float32 (4
//   I2FP + 4 FFMA per mma); the planes' factors, the 1/16 and the rows' sums are applied once at the
//   end.
// The weight streams through a per-warp cp.async ring as in the library (16 rows x 256 values a
// window, 16-byte chunks XOR-swizzled by row so that ldmatrix reads them without conflicts), one
// 16-row tile per block, K split over the block's warps. Symmetric codes, blocks of 32, fp16 scales.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi tools/imma_probe.cu -o /tmp/imma_probe
//   /tmp/imma_probe [N [K]]          (default 8192 x 28672; per case the error against a float64
//                                     reference, the kernel's cold time and the read kernel's share of
//                                     it, and the time of x's two small pre-pass kernels apart)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "probe_util.cuh"
#include "stream_read.cuh"

namespace {

constexpr int kWinValues = 256;  // a window: 16 rows x 256 values
// A window's row of codes (128 bytes of 4-bit codes, 256 of 8-bit ones) and a stage: the 16 rows'
// codes, then their 8 fp16 block scales.
template <int BITS>
constexpr int kRowBytes = kWinValues * BITS / 8;
template <int BITS>
constexpr int kStageBytes = 16 * kRowBytes<BITS> + 16 * 16;

// The ring's copies are the library's (ffi/cuda_util.cuh, reached through stream_read.cuh).
using jaxgemv::CpAsync16;
using jaxgemv::CpAsyncCommit;
using jaxgemv::CpAsyncWait;

// Window `win` of the tile into a stage: its 16-byte chunks (4 or 8 a lane), chunk c of row r at
// chunk position c ^ (r & 7), and 16 rows of scales.
template <int BITS>
__device__ __forceinline__ void CopyWindow(uint8_t* stage, const uint8_t* w, const __half* scales, int tile, int k,
                                           int win, int lane) {
  constexpr int kChunks = kRowBytes<BITS> / 16;
  const int64_t row_bytes = static_cast<int64_t>(k) * BITS / 8, scale_row = k / 32;
#pragma unroll
  for (int i = 0; i < 16 * kChunks / 32; ++i) {
    const int idx = lane + 32 * i, row = idx / kChunks, c = idx % kChunks;
    const int64_t from =
        (static_cast<int64_t>(tile) * 16 + row) * row_bytes + static_cast<int64_t>(win) * kRowBytes<BITS>;
    CpAsync16(stage + row * kRowBytes<BITS> + ((c ^ (row & 7)) << 4), w + from + c * 16);
  }
  if (lane < 16)
    CpAsync16(stage + 16 * kRowBytes<BITS> + lane * 16,
              scales + (static_cast<int64_t>(tile) * 16 + lane) * scale_row + win * 8);
}

// The decodes and the mma are the library's (ffi/cuda_util.cuh, as ffi/imma.cuh uses them).
using jaxgemv::Imma16832;
using jaxgemv::LdMatrixX4;
using jaxgemv::ImmaEven4;
using jaxgemv::ImmaOdd4;

// BITS-bit codes (symmetric, blocks of 32, fp16 scales); KS warps a block (K split), P planes, M
// rows of x; y[m][n] in float32.
template <int BITS, int KS, int P, int M, int STAGES>
__global__ void __launch_bounds__(32 * KS) ImmaGemv(const uint8_t* w, const __half* scales, const uint2* xq,
                                                   const float* factors, float* y, int n, int k) {
  static_assert(P * M <= 8, "the planes of every row in the mma's eight columns");
  constexpr int kCols = P * M, kStage = kStageBytes<BITS>, kRow = kRowBytes<BITS>;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  uint8_t* ring = smem + warp * STAGES * kStage;
  const int windows = k / kWinValues, w0 = warp * windows / KS, w1 = (warp + 1) * windows / KS;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (w0 + s < w1) CopyWindow<BITS>(ring + s * kStage, w, scales, tile, k, w0 + s, lane);
    CpAsyncCommit();
  }
  float acc[4] = {0, 0, 0, 0};
  // ldmatrix's row address for this lane: matrices (rows 0-7, chunk c), (8-15, c), (0-7, c + 1),
  // (8-15, c + 1) for lanes 0-7, 8-15, 16-23, 24-31; each lane gets word t of rows g and g + 8.
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = lane >> 4;
  for (int win = w0; win < w1; ++win) {
    const int i = win - w0;
    if (win + STAGES - 1 < w1)
      CopyWindow<BITS>(ring + ((i + STAGES - 1) % STAGES) * kStage, w, scales, tile, k, win + STAGES - 1, lane);
    CpAsyncCommit();
    CpAsyncWait<STAGES - 1>();
    __syncwarp();
    const uint8_t* stage = ring + (i % STAGES) * kStage;
    const uint4 sg_raw = *reinterpret_cast<const uint4*>(stage + 16 * kRow + g * 16);
    const uint4 sg8_raw = *reinterpret_cast<const uint4*>(stage + 16 * kRow + (g + 8) * 16);
    const uint32_t sgw[4] = {sg_raw.x, sg_raw.y, sg_raw.z, sg_raw.w};
    const uint32_t sg8w[4] = {sg8_raw.x, sg8_raw.y, sg8_raw.z, sg8_raw.w};
    const uint2* xw = xq + (static_cast<int64_t>(win) * 8 * kCols + g) * 4 + t;
    // 4-bit codes: a chunk is a block of 32, an ldmatrix two blocks; 8-bit: an ldmatrix one block.
#pragma unroll
    for (int cp = 0; cp < kRow / 32; ++cp) {
      uint32_t r[4];
      const int c = 2 * cp + lc;
      LdMatrixX4(r, static_cast<uint32_t>(__cvta_generic_to_shared(stage + lr * kRow + ((c ^ (lr & 7)) << 4))));
#pragma unroll
      for (int h = 0; h < (BITS == 4 ? 2 : 1); ++h) {
        const int block = BITS == 4 ? 2 * cp + h : cp;
        uint2 b = make_uint2(0, 0);
        if (g < kCols) b = __ldg(xw + block * kCols * 4);
        int d[4];
        constexpr int kFresh[4] = {0, 0, 0, 0};
        if constexpr (BITS == 4) {
          const uint32_t wg = r[2 * h], wg8 = r[2 * h + 1];
          Imma16832(d, ImmaEven4(wg), ImmaEven4(wg8), ImmaOdd4(wg), ImmaOdd4(wg8), b, kFresh);
        } else {  // an 8-bit code q as the byte q - 128: its top bit flipped
          Imma16832(d, r[0] ^ 0x80808080u, r[1] ^ 0x80808080u, r[2] ^ 0x80808080u, r[3] ^ 0x80808080u, b, kFresh);
        }
        const __half2 s2 = *reinterpret_cast<const __half2*>(&sgw[block >> 1]);
        const __half2 s82 = *reinterpret_cast<const __half2*>(&sg8w[block >> 1]);
        const float sg = (block & 1) ? __high2float(s2) : __low2float(s2);
        const float sg8 = (block & 1) ? __high2float(s82) : __low2float(s82);
        acc[0] = fmaf(static_cast<float>(d[0]), sg, acc[0]);
        acc[1] = fmaf(static_cast<float>(d[1]), sg, acc[1]);
        acc[2] = fmaf(static_cast<float>(d[2]), sg8, acc[2]);
        acc[3] = fmaf(static_cast<float>(d[3]), sg8, acc[3]);
      }
    }
    __syncwarp();
  }
  CpAsyncWait<0>();
  // The K split's sums, then each output from its planes' columns.
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);  // [KS][16 rows][8 columns]
  red[(warp * 16 + g) * 8 + 2 * t] = acc[0];
  red[(warp * 16 + g) * 8 + 2 * t + 1] = acc[1];
  red[(warp * 16 + g + 8) * 8 + 2 * t] = acc[2];
  red[(warp * 16 + g + 8) * 8 + 2 * t + 1] = acc[3];
  __syncthreads();
  if (threadIdx.x < 16 * M) {
    const int row = threadIdx.x & 15, m = threadIdx.x >> 4;
    float out = 0;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      float col = 0;
      for (int ww = 0; ww < KS; ++ww) col += red[(ww * 16 + row) * 8 + m * P + p];
      out = fmaf(col, factors[m * P + p], out);
    }
    if (tile * 16 + row < n) y[static_cast<int64_t>(m) * n + tile * 16 + row] = out * (BITS == 4 ? 1.0f / 16 : 1.0f);
  }
}

// x [M, K] fp16 -> P planes of bytes in the mma's B fragment order (group of 32 values G, column
// m P + p, lane t; the two words' bytes pair with the A operand's: for 4-bit codes values 32 G + 8 t
// + {0, 2, 4, 6} then {1, 3, 5, 7} (ImmaEven4, ImmaOdd4), for 8-bit ones 32 G + 4 t + {0..3} then 32
// G + 16 + 4 t + {0..3}) and the planes' factors. The rows' largest |x| first (as float bits: every
// value is finite and non-negative).
__global__ void RowMax(const __half* x, int k, unsigned* maxbits) {
  const int m = blockIdx.y;
  float v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x)
    v = fmaxf(v, fabsf(__half2float(x[static_cast<int64_t>(m) * k + i])));
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
  if ((threadIdx.x & 31) == 0) atomicMax(maxbits + m, __float_as_uint(v));
}
template <int BITS, int P, int M>
__global__ void Planes(const __half* x, int k, const unsigned* maxbits, uint2* xq, float* factors) {
  constexpr int kCols = P * M;
  const int64_t item = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;  // (G, col, t)
  if (item >= static_cast<int64_t>(k / 32) * kCols * 4) return;
  const int t = item & 3, col = (item >> 2) % kCols, grp = static_cast<int>((item >> 2) / kCols);
  const int m = col / P, p = col % P;
  const float mx = __uint_as_float(maxbits[m]);
  const int e = mx > 0 ? ilogbf(mx) : 0;
  // u1 = 2^(e - 6): |x| / u1 < 128; then 6 and 7 bits more (the residuals stay within 64 units).
  float u[4];
  u[0] = ldexpf(1.0f, e - 6);
  u[1] = u[0] * (1.0f / 64);
  u[2] = u[1] * (1.0f / 128);
  u[3] = u[2] * (1.0f / 128);
  if (grp == 0 && t == 0) factors[col] = u[p];
  uint32_t word[2] = {0, 0};
  for (int half = 0; half < 2; ++half)
    for (int i = 0; i < 4; ++i) {
      const int kk = BITS == 4 ? 32 * grp + 8 * t + 2 * i + half : 32 * grp + 16 * half + 4 * t + i;
      float r = __half2float(x[static_cast<int64_t>(m) * k + kk]);
      int q = 0;
      for (int pp = 0; pp <= p; ++pp) {
        q = static_cast<int>(fminf(127.f, fmaxf(-127.f, rintf(r / u[pp]))));
        r -= q * u[pp];
      }
      word[half] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * i);
    }
  xq[item] = make_uint2(word[0], word[1]);
}

// A weight of BITS-bit codes in `copies` copies (codes, then scales, each copy `stride` bytes)
// and the read kernel's time for one copy's bytes.
struct Weight {
  int bits, n, k, copies;
  int64_t code_bytes, scale_count, bytes, scale_off, stride;
  std::vector<uint8_t> hw;
  std::vector<__half> hs;
  uint8_t* pool;
  double read_us;
};

template <int BITS, int KS, int P, int M, int STAGES>
void Run(const char* name, const Weight& wt, const ProbeDevice& d, cudaStream_t s, const std::vector<__half>& hx_all) {
  const int n = wt.n, k = wt.k;
  const int64_t xn = static_cast<int64_t>(M) * k;
  __half* x;
  unsigned* maxbits;
  uint2* xq;
  float *factors, *y;
  CK(cudaMalloc(&x, xn * sizeof(__half)));
  CK(cudaMalloc(&maxbits, M * sizeof(unsigned)));
  CK(cudaMalloc(&xq, static_cast<int64_t>(k / 32) * P * M * 4 * sizeof(uint2)));
  CK(cudaMalloc(&factors, 8 * sizeof(float)));
  CK(cudaMalloc(&y, static_cast<int64_t>(M) * n * sizeof(float)));
  CK(cudaMemcpy(x, hx_all.data(), xn * sizeof(__half), cudaMemcpyHostToDevice));
  const int items = (k / 32) * P * M * 4;
  auto prep = [&](cudaStream_t st) {
    CK(cudaMemsetAsync(maxbits, 0, M * sizeof(unsigned), st));
    RowMax<<<dim3(std::min(64, (k + 255) / 256), M), 256, 0, st>>>(x, k, maxbits);
    Planes<BITS, P, M><<<(items + 255) / 256, 256, 0, st>>>(x, k, maxbits, xq, factors);
  };
  const int smem = std::max(KS * STAGES * kStageBytes<BITS>, KS * 16 * 8 * 4);
  auto* kernel = ImmaGemv<BITS, KS, P, M, STAGES>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * KS, smem));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kernel));
  auto codes_of = [&](int c) { return wt.pool + c * wt.stride; };
  auto scales_of = [&](int c) { return reinterpret_cast<const __half*>(wt.pool + c * wt.stride + wt.scale_off); };
  // Correctness on copy 0 against float64 on the same codes, scales and x, the output poisoned.
  CK(cudaMemsetAsync(y, 0xff, static_cast<int64_t>(M) * n * sizeof(float), s));
  prep(s);
  kernel<<<n / 16, 32 * KS, smem, s>>>(codes_of(0), scales_of(0), xq, factors, y, n, k);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::vector<float> hy(static_cast<size_t>(M) * n);
  CK(cudaMemcpy(hy.data(), y, hy.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0, ref_max = 0;
  const int64_t row_bytes = static_cast<int64_t>(k) * BITS / 8;
  for (int m = 0; m < M; ++m)
    for (int row = 0; row < n; row += (n > 4096 ? 7 : 1)) {
      double ref = 0;
      for (int kk = 0; kk < k; ++kk) {
        int q;
        if constexpr (BITS == 4) {
          const uint8_t byte = wt.hw[row * row_bytes + kk / 2];
          q = (kk & 1 ? byte >> 4 : byte & 15) - 8;
        } else {
          q = wt.hw[row * row_bytes + kk] - 128;
        }
        ref += q * static_cast<double>(__half2float(wt.hs[static_cast<int64_t>(row) * (k / 32) + kk / 32])) *
               __half2float(hx_all[static_cast<int64_t>(m) * k + kk]);
      }
      const double got = hy[static_cast<size_t>(m) * n + row];
      err = std::max(err, std::isfinite(got) ? std::fabs(got - ref) : INFINITY);
      ref_max = std::max(ref_max, std::fabs(ref));
    }
  const double us = ColdMicros(s, wt.copies, [&](cudaStream_t st, int c) {
    kernel<<<n / 16, 32 * KS, smem, st>>>(codes_of(c), scales_of(c), xq, factors, y, n, k);
  });
  const double prep_us = CapturedMicros(s, 16, [&](cudaStream_t st) {
    for (int r = 0; r < 16; ++r) prep(st);
  });
  std::printf("int%d %-21s %4d %3d %5d %6.2f %9.2e %8.2f %6.2f %6.1f %8.2f\n", BITS, name, fa.numRegs, per_sm, n / 16,
              (n / 16.0) / (per_sm * d.sms), err / ref_max, us, wt.bytes / us / 1e6, 100.0 * wt.read_us / us, prep_us);
  CK(cudaFree(x));
  CK(cudaFree(maxbits));
  CK(cudaFree(xq));
  CK(cudaFree(factors));
  CK(cudaFree(y));
}

Weight MakeWeight(int bits, int n, int k, const ProbeDevice& d, cudaStream_t s, const ReadFlags& flags) {
  Weight wt;
  wt.bits = bits, wt.n = n, wt.k = k;
  wt.code_bytes = static_cast<int64_t>(n) * k * bits / 8, wt.scale_count = static_cast<int64_t>(n) * (k / 32);
  wt.bytes = wt.code_bytes + 2 * wt.scale_count;  // as the benchmark counts them: codes and fp16 scales
  std::mt19937 rng(1234 + bits);
  wt.hw.resize(wt.code_bytes);
  for (auto& b : wt.hw) b = static_cast<uint8_t>(rng());
  wt.hs.resize(wt.scale_count);
  std::uniform_real_distribution<float> us(0.5f, 2.0f);
  for (auto& v : wt.hs) v = __float2half(us(rng) * 0.01f);
  const ColdPool cold = UploadCold(wt.hw.data(), wt.code_bytes, wt.hs.data(), 2 * wt.scale_count, d.l2);
  wt.pool = cold.pool, wt.scale_off = cold.scale_off, wt.stride = cold.stride, wt.copies = cold.copies;
  wt.read_us = ColdPoolReadMicros(s, cold, d.sms, flags);
  std::printf("int%d %d x %d: %.1f MB with scales, %d copies; stream read %.2f us, %.2f TB/s\n", bits, n, k,
              wt.bytes / 1e6, wt.copies, wt.read_us, wt.bytes / wt.read_us / 1e6);
  return wt;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 8192, k = argc > 2 ? std::atoi(argv[2]) : 28672;
  if (n % 16 || k % kWinValues) {
    std::printf("N must be a multiple of 16 and K of %d\n", kWinValues);
    return 1;
  }
  const ProbeDevice d = CurrentProbeDevice();
  std::printf("%s, %d SMs, L2 %.0f MB; N x K %d x %d; median of 7 graph replays, cold\n", d.name, d.sms, d.l2 / 1e6, n,
              k);
  std::mt19937 rng(99);
  std::vector<__half> hx(8 * static_cast<int64_t>(k));
  std::uniform_real_distribution<float> ux(-1.0f, 1.0f);
  for (int64_t i = 0; i < static_cast<int64_t>(hx.size()); ++i)  // varies along K, one large value a row
    hx[i] = __float2half(i % k == 77 ? 30.0f : ux(rng) * (1.0f + (i % k) / static_cast<float>(k)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const ReadFlags flags = MakeReadFlags();
  const char* header = "%-26s %4s %3s %5s %6s %9s %8s %6s %6s %8s\n";
  {
    Weight w4 = MakeWeight(4, n, k, d, s, flags);
    std::printf(header, "case", "regs", "/SM", "blks", "waves", "rel.err", "us", "TB/s", "%read", "prep us");
    Run<4, 8, 3, 1, 2>("KS8 P3 M1 S2", w4, d, s, hx);
    Run<4, 8, 3, 1, 3>("KS8 P3 M1 S3", w4, d, s, hx);
    Run<4, 4, 3, 1, 2>("KS4 P3 M1 S2", w4, d, s, hx);
    Run<4, 8, 4, 1, 2>("KS8 P4 M1 S2", w4, d, s, hx);
    Run<4, 8, 3, 2, 2>("KS8 P3 M2 S2", w4, d, s, hx);
    Run<4, 8, 4, 2, 2>("KS8 P4 M2 S2", w4, d, s, hx);
    CK(cudaFree(w4.pool));
  }
  {
    Weight w8 = MakeWeight(8, n, k, d, s, flags);
    std::printf(header, "case", "regs", "/SM", "blks", "waves", "rel.err", "us", "TB/s", "%read", "prep us");
    Run<8, 8, 3, 1, 2>("KS8 P3 M1 S2", w8, d, s, hx);
    Run<8, 8, 3, 1, 3>("KS8 P3 M1 S3", w8, d, s, hx);
    Run<8, 4, 3, 1, 2>("KS4 P3 M1 S2", w8, d, s, hx);
    Run<8, 8, 3, 2, 2>("KS8 P3 M2 S2", w8, d, s, hx);
    CK(cudaFree(w8.pool));
  }
  FreeReadFlags(flags);
  return 0;
}
