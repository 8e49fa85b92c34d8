// Could int4 weights reach the H200's read rate through the integer tensor cores?
//
// The int4 GEMV loops (ffi/nbits.cuh) turn every code into a 16-bit float (magic number, zero
// point, scale: ~420 instructions per 16-row window of 256 values at M = 1) and the H200 needs
// about 4.3 TB/s / 132 SMs of codes per SM: at that rate the loop's issue slots, not DRAM, bound
// it (docs/perf-log.md, open item 2). This probe times the other way to the tensor cores, none of
// it in the library:
//
// - a code q becomes the signed byte 16 (q - 8) with one LOP3 (the nibble in a byte's high half,
//   its top bit flipped: the byte's own sign extension subtracts 8), so a word of eight codes is
//   two registers of IMMA operand in three instructions (mma.sync m16n8k32 s8.s8.s32, native on
//   sm_80 / sm_90; the e4m3 form of that mma is emulated there with F2FP + HMMA, cuobjdump);
// - x goes in as P planes of signed bytes, x = u1 p1 + u2 p2 + u3 p3 (u's powers of two from the
//   row's largest |x|: resolution 2^-19 of it at P = 3, so fp16 and bf16 values at most 2^8 below
//   the row's largest are exact), planes and rows in the mma's eight B columns (P x M <= 8);
// - a block of 32 codes is one mma, and its int32 sums take the row's block scale in float32 (4
//   I2FP + 4 FFMA per mma); the planes' factors, the 1/16 and the rows' sums are applied once at the
//   end.
// The weight streams through a per-warp cp.async ring as in the library (16 rows x 128 bytes a
// window, 16-byte chunks XOR-swizzled by row so that ldmatrix reads them without conflicts), one
// 16-row tile per block, K split over the block's warps. Symmetric int4, blocks of 32, fp16 scales.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iffi tools/imma_probe.cu -o /tmp/imma_probe
//   /tmp/imma_probe [N [K]]          (default 8192 x 28672; prints the error against a float64
//                                     reference and the kernel's cold time beside the read kernel's)
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

constexpr int kWinValues = 256;               // a window: 16 rows x 256 values (128 bytes a row)
constexpr int kStageBytes = 16 * 128 + 16 * 16;  // codes, then 8 fp16 block scales a row

__device__ __forceinline__ void Cp16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void Commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void WaitGroups() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Window `win` of the tile into a stage: 128 chunks of codes (4 a lane), 16 rows of scales.
__device__ __forceinline__ void CopyWindow(uint8_t* stage, const uint8_t* w, const __half* scales, int tile, int k,
                                           int win, int lane) {
  const int64_t row_bytes = k / 2, scale_row = k / 32;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int idx = lane + 32 * i, row = idx >> 3, c = idx & 7;
    Cp16(stage + row * 128 + ((c ^ (row & 7)) << 4),
         w + (static_cast<int64_t>(tile) * 16 + row) * row_bytes + win * (kWinValues / 2) + c * 16);
  }
  if (lane < 16)
    Cp16(stage + 2048 + lane * 16, scales + (static_cast<int64_t>(tile) * 16 + lane) * scale_row + win * 8);
}

// Codes 8t + {0, 2, 4, 6} (even) and 8t + {1, 3, 5, 7} (odd) of word t as bytes 16 (q - 8).
__device__ __forceinline__ uint32_t EvenCodes(uint32_t word) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x88888888, 0xf0f0f0f0, 0x28;" : "=r"(r) : "r"(word << 4));  // (a ^ b) & c
  return r;
}
__device__ __forceinline__ uint32_t OddCodes(uint32_t word) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x88888888, 0xf0f0f0f0, 0x28;" : "=r"(r) : "r"(word));
  return r;
}

// KS warps a block (K split), P planes, M rows of x; y[m][n] in float32.
template <int KS, int P, int M, int STAGES>
__global__ void __launch_bounds__(32 * KS) ImmaGemv(const uint8_t* w, const __half* scales, const uint2* xq,
                                                   const float* factors, float* y, int n, int k) {
  static_assert(P * M <= 8, "the planes of every row in the mma's eight columns");
  constexpr int kCols = P * M;
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x;
  uint8_t* ring = smem + warp * STAGES * kStageBytes;
  const int windows = k / kWinValues, w0 = warp * windows / KS, w1 = (warp + 1) * windows / KS;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (w0 + s < w1) CopyWindow(ring + s * kStageBytes, w, scales, tile, k, w0 + s, lane);
    Commit();
  }
  float acc[4] = {0, 0, 0, 0};
  // ldmatrix's row address for this lane: matrices (rows 0-7, chunk c), (8-15, c), (0-7, c + 1),
  // (8-15, c + 1) for lanes 0-7, 8-15, 16-23, 24-31.
  const int lr = (lane & 7) + ((lane >> 3) & 1) * 8, lc = lane >> 4;
  for (int win = w0; win < w1; ++win) {
    const int i = win - w0;
    if (win + STAGES - 1 < w1)
      CopyWindow(ring + ((i + STAGES - 1) % STAGES) * kStageBytes, w, scales, tile, k, win + STAGES - 1, lane);
    Commit();
    WaitGroups<STAGES - 1>();
    __syncwarp();
    const uint8_t* stage = ring + (i % STAGES) * kStageBytes;
    const uint4 sg_raw = *reinterpret_cast<const uint4*>(stage + 2048 + g * 16);
    const uint4 sg8_raw = *reinterpret_cast<const uint4*>(stage + 2048 + (g + 8) * 16);
    const uint32_t sgw[4] = {sg_raw.x, sg_raw.y, sg_raw.z, sg_raw.w};
    const uint32_t sg8w[4] = {sg8_raw.x, sg8_raw.y, sg8_raw.z, sg8_raw.w};
    const uint2* xw = xq + (static_cast<int64_t>(win) * 8 * kCols + g) * 4 + t;
#pragma unroll
    for (int cp = 0; cp < 4; ++cp) {  // chunk pairs (2 cp, 2 cp + 1)
      uint32_t r[4];
      const int c = 2 * cp + lc;
      const unsigned addr =
          static_cast<unsigned>(__cvta_generic_to_shared(stage + lr * 128 + ((c ^ (lr & 7)) << 4)));
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                   : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                   : "r"(addr));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int chunk = 2 * cp + h;
        const uint32_t wg = r[2 * h], wg8 = r[2 * h + 1];
        uint2 b = make_uint2(0, 0);
        if (g < kCols) b = __ldg(xw + chunk * kCols * 4);
        int d0, d1, d2, d3;
        asm volatile(
            "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%10, %10, %10, %10};"
            : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
            : "r"(EvenCodes(wg)), "r"(EvenCodes(wg8)), "r"(OddCodes(wg)), "r"(OddCodes(wg8)), "r"(b.x), "r"(b.y),
              "r"(0));
        const __half2 s2 = *reinterpret_cast<const __half2*>(&sgw[chunk >> 1]);
        const __half2 s82 = *reinterpret_cast<const __half2*>(&sg8w[chunk >> 1]);
        const float sg = (chunk & 1) ? __high2float(s2) : __low2float(s2);
        const float sg8 = (chunk & 1) ? __high2float(s82) : __low2float(s82);
        acc[0] = fmaf(static_cast<float>(d0), sg, acc[0]);
        acc[1] = fmaf(static_cast<float>(d1), sg, acc[1]);
        acc[2] = fmaf(static_cast<float>(d2), sg8, acc[2]);
        acc[3] = fmaf(static_cast<float>(d3), sg8, acc[3]);
      }
    }
    __syncwarp();
  }
  WaitGroups<0>();
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
    if (tile * 16 + row < n) y[static_cast<int64_t>(m) * n + tile * 16 + row] = out * (1.0f / 16);
  }
}

// x [M, K] fp16 -> P planes of bytes in the mma's B fragment order (group of 32 values G, column
// m P + p, lane t: bytes at 32 G + 8 t + {0, 2, 4, 6} then {1, 3, 5, 7}) and the planes' factors.
// The rows' largest |x| first (as float bits: every value is finite and non-negative).
__global__ void RowMax(const __half* x, int k, unsigned* maxbits) {
  const int m = blockIdx.y;
  float v = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < k; i += gridDim.x * blockDim.x)
    v = fmaxf(v, fabsf(__half2float(x[static_cast<int64_t>(m) * k + i])));
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(~0u, v, o));
  if ((threadIdx.x & 31) == 0) atomicMax(maxbits + m, __float_as_uint(v));
}
template <int P, int M>
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
  for (int j = 0; j < 8; ++j) {
    const int kk = 32 * grp + 8 * t + j;
    float r = __half2float(x[static_cast<int64_t>(m) * k + kk]);
    int q = 0;
    for (int pp = 0; pp <= p; ++pp) {
      q = static_cast<int>(fminf(127.f, fmaxf(-127.f, rintf(r / u[pp]))));
      r -= q * u[pp];
    }
    word[j & 1] |= (static_cast<uint32_t>(q) & 0xffu) << (8 * (j >> 1));
  }
  xq[item] = make_uint2(word[0], word[1]);
}

template <int KS, int P, int M, int STAGES>
void Run(const char* name, int n, int k, const ProbeDevice& d, cudaStream_t s, const uint8_t* pool, int64_t stride,
         int copies, int64_t scale_off, const std::vector<uint8_t>& hw, const std::vector<__half>& hs,
         const std::vector<__half>& hx_all, double read_us, int64_t bytes) {
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
    Planes<P, M><<<(items + 255) / 256, 256, 0, st>>>(x, k, maxbits, xq, factors);
  };
  const int smem = std::max(KS * STAGES * kStageBytes, KS * 16 * 8 * 4);
  auto* kernel = ImmaGemv<KS, P, M, STAGES>;
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 32 * KS, smem));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, kernel));
  // Correctness on copy 0 against float64 on the same codes, scales and x.
  CK(cudaMemsetAsync(y, 0xff, static_cast<int64_t>(M) * n * sizeof(float), s));  // NaN poison
  prep(s);
  auto scales_of = [&](int c) { return reinterpret_cast<const __half*>(pool + c * stride + scale_off); };
  kernel<<<n / 16, 32 * KS, smem, s>>>(pool, scales_of(0), xq, factors, y, n, k);
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  std::vector<float> hy(static_cast<size_t>(M) * n);
  CK(cudaMemcpy(hy.data(), y, hy.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double err = 0, ref_max = 0;
  for (int m = 0; m < M; ++m)
    for (int row = 0; row < n; row += (n > 4096 ? 7 : 1)) {
      double ref = 0;
      for (int kk = 0; kk < k; ++kk) {
        const uint8_t byte = hw[static_cast<int64_t>(row) * (k / 2) + kk / 2];
        const int q = kk & 1 ? byte >> 4 : byte & 15;
        ref += (q - 8) * static_cast<double>(__half2float(hs[static_cast<int64_t>(row) * (k / 32) + kk / 32])) *
               __half2float(hx_all[static_cast<int64_t>(m) * k + kk]);
      }
      const double got = hy[static_cast<size_t>(m) * n + row];
      err = std::max(err, std::isfinite(got) ? std::fabs(got - ref) : INFINITY);
      ref_max = std::max(ref_max, std::fabs(ref));
    }
  const int reps = std::max(copies, 32 / copies * copies);
  const double us = CapturedMicros(s, reps, [&](cudaStream_t st) {
    for (int r = 0; r < reps; ++r)
      kernel<<<n / 16, 32 * KS, smem, st>>>(pool + (r % copies) * stride, scales_of(r % copies), xq, factors, y, n, k);
  });
  const double prep_us = CapturedMicros(s, 16, [&](cudaStream_t st) {
    for (int r = 0; r < 16; ++r) prep(st);
  });
  std::printf("%-26s %4d %3d %5d %7.4f %9.2e %8.2f %6.2f %6.1f %8.2f\n", name, fa.numRegs, per_sm, n / 16,
              (n / 16.0) / (per_sm * d.sms), err / ref_max, us, bytes / us / 1e6, 100.0 * read_us / us, prep_us);
  CK(cudaFree(x));
  CK(cudaFree(maxbits));
  CK(cudaFree(xq));
  CK(cudaFree(factors));
  CK(cudaFree(y));
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 8192, k = argc > 2 ? std::atoi(argv[2]) : 28672;
  if (n % 16 || k % kWinValues) {
    std::printf("N must be a multiple of 16 and K of %d\n", kWinValues);
    return 1;
  }
  const ProbeDevice d = CurrentProbeDevice();
  // The weight's bytes as the benchmark counts them: codes and fp16 scales.
  const int64_t code_bytes = static_cast<int64_t>(n) * k / 2, scale_count = static_cast<int64_t>(n) * (k / 32);
  const int64_t bytes = code_bytes + 2 * scale_count;
  std::printf("%s, %d SMs, L2 %.0f MB; int4 %d x %d (%.1f MB with scales); median of 7 graph replays, cold\n", d.name,
              d.sms, d.l2 / 1e6, n, k, bytes / 1e6);
  std::mt19937 rng(1234);
  std::vector<uint8_t> hw(code_bytes);
  for (auto& b : hw) b = static_cast<uint8_t>(rng());
  std::vector<__half> hs(scale_count), hx(8 * static_cast<int64_t>(k));
  std::uniform_real_distribution<float> us(0.5f, 2.0f), ux(-1.0f, 1.0f);
  for (auto& v : hs) v = __float2half(us(rng) * 0.01f);
  for (int64_t i = 0; i < static_cast<int64_t>(hx.size()); ++i)  // varies along K, one large value a row
    hx[i] = __float2half(i % k == 77 ? 30.0f : ux(rng) * (1.0f + (i % k) / static_cast<float>(k)));

  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Each copy: the codes, then the scales (the kernels and the read kernel rotate over both).
  const int64_t scale_off = (code_bytes + 255) / 256 * 256, stride = (scale_off + 2 * scale_count + 255) / 256 * 256;
  const int copies = ColdCopies(bytes, d.l2);
  uint8_t* pool;
  CK(cudaMalloc(&pool, stride * copies));
  for (int c = 0; c < copies; ++c) {
    CK(cudaMemcpy(pool + c * stride, hw.data(), code_bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pool + c * stride + scale_off, hs.data(), 2 * scale_count, cudaMemcpyHostToDevice));
  }

  uint32_t *salt, *out;
  CK(cudaMalloc(&salt, sizeof(uint32_t)));
  CK(cudaMalloc(&out, sizeof(uint32_t)));
  CK(cudaMemset(salt, 0, sizeof(uint32_t)));
  const int reps = std::max(copies, 32 / copies * copies);
  const double read_us = CapturedMicros(s, reps, [&](cudaStream_t st) {
    for (int r = 0; r < reps; ++r)
      jaxgemv::StreamReadKernel<<<jaxgemv::kReadBlocksPerSm * d.sms, jaxgemv::kReadThreads, 0, st>>>(
          reinterpret_cast<const uint4*>(pool + (r % copies) * stride), (scale_off + 2 * scale_count) / 16, salt, out);
  });
  std::printf("stream read of %.1f MB: %.2f us, %.2f TB/s\n", bytes / 1e6, read_us, bytes / read_us / 1e6);
  std::printf("%-26s %4s %3s %5s %7s %9s %8s %6s %6s %8s\n", "case", "regs", "/SM", "blks", "waves", "rel.err",
              "us", "TB/s", "%read", "prep us");
  Run<8, 3, 1, 2>("KS8 P3 M1 S2", n, k, d, s, pool, stride, copies, scale_off, hw, hs, hx, read_us, bytes);
  Run<8, 3, 1, 3>("KS8 P3 M1 S3", n, k, d, s, pool, stride, copies, scale_off, hw, hs, hx, read_us, bytes);
  Run<4, 3, 1, 2>("KS4 P3 M1 S2", n, k, d, s, pool, stride, copies, scale_off, hw, hs, hx, read_us, bytes);
  Run<8, 4, 1, 2>("KS8 P4 M1 S2", n, k, d, s, pool, stride, copies, scale_off, hw, hs, hx, read_us, bytes);
  Run<8, 3, 2, 2>("KS8 P3 M2 S2", n, k, d, s, pool, stride, copies, scale_off, hw, hs, hx, read_us, bytes);
  Run<8, 4, 2, 2>("KS8 P4 M2 S2", n, k, d, s, pool, stride, copies, scale_off, hw, hs, hx, read_us, bytes);
  return 0;
}
