// Decode attention for the CPU platform: ffi/attention.h's contract in plain C++, for CI and
// machines without a GPU, threaded over (sequence, KV head). Positions are visited in order and
// the softmax is formed exactly (max, then sums), so the result is deterministic.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention.h"
#include "cpu_types.h"
#include "handlers.h"

namespace jaxgemv {
namespace {

ffi::Error DecodeAttentionCpu(ffi::AnyBuffer qkv, ffi::AnyBuffer k_cache, ffi::AnyBuffer v_cache, ffi::AnyBuffer pos,
                              ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> k_out,
                              ffi::Result<ffi::AnyBuffer> v_out, int64_t heads, int64_t kv_heads, float rope_theta,
                              float scale, int64_t splits) {
  AttentionShape s;
  if (auto err = CheckDecodeAttention(qkv, k_cache, v_cache, pos, *o, *k_out, *v_out, heads, kv_heads, &s);
      err.failure())
    return err;
  if (splits != 1) return Invalid("decode_attention: the CPU handler takes splits = 1");
  const int64_t hd = s.head_dim, half = hd / 2, g_size = s.group(), t_len = s.max_len;
  const size_t elem = 2;  // float16 and bfloat16
  // The results alias the caches under jit; where they do not, the caches are copied first.
  if (k_out->untyped_data() != k_cache.untyped_data())
    std::memcpy(k_out->untyped_data(), k_cache.untyped_data(), k_cache.element_count() * elem);
  if (v_out->untyped_data() != v_cache.untyped_data())
    std::memcpy(v_out->untyped_data(), v_cache.untyped_data(), v_cache.element_count() * elem);
  void* kc = k_out->untyped_data();
  void* vc = v_out->untyped_data();
  const void* in = qkv.untyped_data();
  const int32_t* positions = static_cast<const int32_t*>(pos.untyped_data());

  const bool rotate = rope_theta > 0.0f;
  // One task per (sequence, KV head): its new key and value into the caches, then the query heads
  // that share them. Tasks touch disjoint cache rows and outputs, and each computes what the serial
  // loop did in the same order, so the result does not depend on the threads (ParallelRows).
  ParallelRows(s.batch * kv_heads, 2 * g_size * t_len * hd, [&](int64_t i0, int64_t i1) {
    std::vector<float> cosv(half), sinv(half), head(hd), scores(t_len), acc(hd);
    // A head of qkv's row b, from column c0, rotated (rope) or not, rounded to the activation type.
    auto load_head = [&](int64_t b, int64_t c0, bool rot, float* dst) {
      for (int64_t d = 0; d < hd; ++d) dst[d] = LoadAct(in, b * s.qkv_width() + c0 + d, s.dtype);
      if (!rot) return;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = dst[i], x2 = dst[i + half];
        dst[i] = RoundAct(x1 * cosv[i] - x2 * sinv[i], s.dtype);
        dst[i + half] = RoundAct(x2 * cosv[i] + x1 * sinv[i], s.dtype);
      }
    };
    for (int64_t task = i0; task < i1; ++task) {
      const int64_t b = task / kv_heads, kh = task % kv_heads;
      const int64_t p = positions[b];
      if (p < 0 || p >= t_len) {
        for (int64_t i = kh * g_size * hd; i < (kh + 1) * g_size * hd; ++i)
          StoreAct(o->untyped_data(), b * heads * hd + i, std::numeric_limits<float>::quiet_NaN(), s.dtype);
        continue;
      }
      for (int64_t i = 0; i < half; ++i) {
        const float angle =
            static_cast<float>(p) * RopeInvFreq(rope_theta, static_cast<int>(i), static_cast<int>(half));
        cosv[i] = std::cos(angle);
        sinv[i] = std::sin(angle);
      }
      // The new key and value into the caches at position p.
      const int64_t base = (b * kv_heads + kh) * t_len * hd;
      load_head(b, (heads + kh) * hd, rotate, head.data());
      for (int64_t d = 0; d < hd; ++d) StoreAct(kc, base + p * hd + d, head[d], s.dtype);
      load_head(b, (heads + kv_heads + kh) * hd, false, head.data());
      for (int64_t d = 0; d < hd; ++d) StoreAct(vc, base + p * hd + d, head[d], s.dtype);
      for (int64_t h = kh * g_size; h < (kh + 1) * g_size; ++h) {
        load_head(b, h * hd, rotate, head.data());
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t <= p; ++t) {
          float dot = 0.0f;
          for (int64_t d = 0; d < hd; ++d) dot += head[d] * LoadAct(kc, base + t * hd + d, s.dtype);
          scores[t] = dot * scale;
          mx = std::max(mx, scores[t]);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t <= p; ++t) sum += (scores[t] = std::exp(scores[t] - mx));
        // Each output d sums over t in order, as a loop over t per d would; positions outer so
        // that a cache row is read contiguously.
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t <= p; ++t)
          for (int64_t d = 0; d < hd; ++d) acc[d] += scores[t] * LoadAct(vc, base + t * hd + d, s.dtype);
        for (int64_t d = 0; d < hd; ++d) StoreAct(o->untyped_data(), (b * heads + h) * hd + d, acc[d] / sum, s.dtype);
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jaxgemv

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvDecodeAttentionCpu, jaxgemv::DecodeAttentionCpu,
                              jaxgemv::BindDecodeAttention(xla::ffi::Ffi::Bind()));
