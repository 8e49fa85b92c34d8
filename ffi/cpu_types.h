// Host-side helpers of the CPU handlers: float16 / bfloat16 <-> float32 (bit-exact, round to
// nearest even), E4M3 decoding, activation loads and stores, a dot product.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "common.h"

namespace jaxgemv {

inline float BitsToFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t b = FloatToBits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // NaN
  b += 0x7fffu + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: man x 2^-24
    float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (man << 13));
  return BitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t b = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;                    // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;                   // rounds to or past infinity
  if (a < 0x38800000u) {                                        // below the smallest normal
    const float v = BitsToFloat(a) * 16777216.0f;               // in units of 2^-24, exact
    uint32_t q = static_cast<uint32_t>(v);
    const float rem = v - static_cast<float>(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
  uint32_t r = a - 0x38000000u;                                 // rebias 127 -> 15
  r += 0xfffu + ((r >> 13) & 1);
  return sign | static_cast<uint16_t>(r >> 13);
}


// E4M3 (no infinities; 0x7f/0xff are NaN) to float32, exactly.
inline float E4m3ToFloat(uint8_t b) {
  const float sign = (b & 0x80) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xf;
  const int man = b & 0x7;
  if (exp == 0xf && man == 0x7) return sign * __builtin_nanf("");
  if (exp == 0) return sign * static_cast<float>(man) * (1.0f / 512.0f);
  return sign * (1.0f + static_cast<float>(man) / 8.0f) * static_cast<float>(1 << exp) / 128.0f;
}

struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int b = 0; b < 256; ++b) value[b] = E4m3ToFloat(static_cast<uint8_t>(b));
  }
};

// Dot products of one weight row w with MB rows of x (x_stride apart) at once, each 8 values of
// w loaded once for all of them. Each row's sum keeps eight independent partial sums (so the
// compiler can keep them in vector lanes), added up in a fixed order: the same for any MB.
template <int MB>
inline void DotRows(const float* x, int64_t x_stride, const float* w, int64_t k, float* out) {
  float acc[MB][8] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8)
    for (int r = 0; r < MB; ++r)
      for (int j = 0; j < 8; ++j) acc[r][j] += x[r * x_stride + i + j] * w[i + j];
  for (int r = 0; r < MB; ++r) {
    float sum = 0.0f;
    for (int j = 0; j < 8; ++j) sum += acc[r][j];
    for (int64_t t = i; t < k; ++t) sum += x[r * x_stride + t] * w[t];
    out[r] = sum;
  }
}

inline float Dot(const float* a, const float* b, int64_t k) {
  float sum;
  DotRows<1>(a, 0, b, k, &sum);
  return sum;
}

inline float LoadAct(const void* base, int64_t i, ffi::DataType t) {
  const uint16_t h = static_cast<const uint16_t*>(base)[i];
  return t == ffi::DataType::F16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

inline void StoreAct(void* base, int64_t i, float v, ffi::DataType t) {
  static_cast<uint16_t*>(base)[i] = t == ffi::DataType::F16 ? FloatToHalf(v) : FloatToBf16(v);
}

// v rounded to the activation type and widened back.
inline float RoundAct(float v, ffi::DataType t) {
  return t == ffi::DataType::F16 ? HalfToFloat(FloatToHalf(v)) : Bf16ToFloat(FloatToBf16(v));
}

// Threads of the CPU handlers: JAXGEMV_CPU_THREADS (1 to 256; checked at trace time by the
// planner), else the machine's hardware threads, at most 64. Read once per process.
inline int CpuThreads() {
  static const int threads = [] {
    const char* v = std::getenv("JAXGEMV_CPU_THREADS");
    const int asked = v && *v ? std::atoi(v) : 0;
    if (asked > 0) return std::min(asked, 256);
    return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 64u));
  }();
  return threads;
}

// f(begin, end) over rows [0, n) in contiguous ranges, one per thread, the calling thread taking
// the first; as many threads as give each at least kMinWork multiply-adds (`work` per row), so
// small products stay on the calling thread. Each row is computed whole by one thread with the
// same arithmetic, so the result does not depend on the number of threads. Where a thread cannot
// be started its range runs on the calling thread.
template <typename F>
void ParallelRows(int64_t n, int64_t work, F&& f) {
  constexpr int64_t kMinWork = int64_t{1} << 18;
  const int64_t threads = std::min<int64_t>({CpuThreads(), n, std::max<int64_t>(1, n * work / kMinWork)});
  if (threads <= 1) {
    f(int64_t{0}, n);
    return;
  }
  const int64_t chunk = (n + threads - 1) / threads;
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads - 1));
  for (int64_t t = 1; t < threads; ++t) {
    const int64_t begin = t * chunk, end = std::min(n, begin + chunk);
    if (begin >= end) break;
    try {
      pool.emplace_back([&f, begin, end] { f(begin, end); });
    } catch (const std::system_error&) {
      f(begin, end);
    }
  }
  f(int64_t{0}, std::min(n, chunk));
  for (auto& th : pool) th.join();
}

// y = (x @ W^T) * row_scale + bias + residual one weight row at a time (each of the three
// optional: s.has_*): decode_row(n, out) writes row n of W in float32 (K values); the activations
// are widened once. The CPU handlers of every quantized format share it.
template <typename DecodeRow>
void RowByRowProduct(const void* x, const void* bias, const void* row_scale, const void* residual, void* y,
                     const ProductShape& s, DecodeRow&& decode_row) {
  std::vector<float> xf(static_cast<size_t>(s.m * s.k));
  for (int64_t i = 0; i < s.m * s.k; ++i) xf[i] = LoadAct(x, i, s.dtype);
  const auto* rs = static_cast<const float*>(row_scale);
  // s.rms_from_x: each row's RMSNorm scale from its own sum of squares, formed here.
  std::vector<float> x_rms(s.rms_from_x ? static_cast<size_t>(s.m) : 0);
  for (int64_t m = 0; m < static_cast<int64_t>(x_rms.size()); ++m)
    x_rms[m] = 1.0f / std::sqrt(Dot(xf.data() + m * s.k, xf.data() + m * s.k, s.k) * s.rms_inv_k + s.rms_eps);
  // SwiGLU (s.activation): the float32 pre-activations first, then each output from its gate and
  // up rows (16j + i and 16j + 8 + i for output 8j + i).
  std::vector<float> pre(s.activation ? static_cast<size_t>(s.m * s.n) : 0);
  // Rows in parallel (ParallelRows): decode_row must be safe to call from several threads at once
  // (it reads the weight and writes only `out`); each output element is written by one thread.
  ParallelRows(s.n, s.k * (s.m + 1), [&](int64_t n0, int64_t n1) {
    std::vector<float> wrow(static_cast<size_t>(s.k)), dots(static_cast<size_t>(s.m));
    for (int64_t n = n0; n < n1; ++n) {
      decode_row(n, wrow.data());
      int64_t r = 0;  // rows of x four at a time, then one
      for (; r + 4 <= s.m; r += 4) DotRows<4>(xf.data() + r * s.k, s.k, wrow.data(), s.k, dots.data() + r);
      for (; r < s.m; ++r) DotRows<1>(xf.data() + r * s.k, s.k, wrow.data(), s.k, dots.data() + r);
      const float b = s.has_bias ? LoadAct(bias, n, s.dtype) : 0.0f;
      for (int64_t m = 0; m < s.m; ++m) {
        float v = dots[m];
        if (s.has_row_scale) v *= s.rms_eps >= 0.0f ? 1.0f / std::sqrt(rs[m] * s.rms_inv_k + s.rms_eps) : rs[m];
        if (s.rms_from_x) v *= x_rms[m];
        v += b;
        if (s.activation) {
          pre[m * s.n + n] = v;
          continue;
        }
        if (s.has_residual) v += LoadAct(residual, m * s.n + n, s.dtype);
        StoreAct(y, m * s.n + n, v, s.dtype);
      }
    }
  });
  if (!s.activation) return;
  const int64_t n_out = s.n_out();
  for (int64_t m = 0; m < s.m; ++m)
    for (int64_t j = 0; j < n_out; ++j) {
      const int64_t gate = m * s.n + (j / 8) * 16 + j % 8;
      const float g = pre[gate], u = pre[gate + 8];
      float v = g / (1.0f + std::exp(-g)) * u;
      if (s.has_residual) v += LoadAct(residual, m * n_out + j, s.dtype);
      StoreAct(y, m * n_out + j, v, s.dtype);
    }
}

}  // namespace jaxgemv
