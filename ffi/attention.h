// Decode attention (jaxgemv/attention.py): the contract shared by the CPU and CUDA handlers.
//
// One new token per sequence. Operands: qkv [B, (H + 2 KVH) hd], the fused projection's output
// (the H query heads, then the KVH key heads, then the KVH value heads, hd values each); the
// caches k_cache and v_cache [B, KVH, T, hd] in qkv's type; pos int32 [B], each sequence's
// position. Results: o [B, H hd] in qkv's type, and the two caches, aliased to the operands.
//
// For each sequence b with 0 <= pos[b] < T: q and the new k get the rotary embedding of position
// pos[b] when rope_theta > 0 (the rotate-half layout: dimension i < hd / 2 pairs with i + hd / 2
// at the angle pos theta^(-2i / hd), in float32, then rounded to qkv's type); k and v are written
// into the caches at position pos[b]; query head h (KV head h / (H / KVH)) attends to positions 0
// .. pos[b] with scores scale q.k in float32, softmax in float32, and o is the float32 weighted
// sum of v rounded once. A sequence whose pos is outside [0, T) leaves the caches untouched and
// gets NaN in every output: the position is a run-time value, so this is how a bad one shows.
#pragma once

#include <cmath>
#include <cstdint>

#include "common.h"

namespace jaxgemv {

struct AttentionShape {
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0, max_len = 0;
  ffi::DataType dtype = ffi::DataType::F16;
  int64_t group() const { return heads / kv_heads; }
  int64_t qkv_width() const { return (heads + 2 * kv_heads) * head_dim; }
};

inline ffi::Error CheckDecodeAttention(const ffi::AnyBuffer& qkv, const ffi::AnyBuffer& k_cache,
                                       const ffi::AnyBuffer& v_cache, const ffi::AnyBuffer& pos,
                                       const ffi::AnyBuffer& o, const ffi::AnyBuffer& k_out,
                                       const ffi::AnyBuffer& v_out, int64_t heads, int64_t kv_heads,
                                       AttentionShape* out) {
  if (heads < 1 || kv_heads < 1 || heads % kv_heads != 0)
    return Invalid("decode_attention: heads must be a positive multiple of kv_heads");
  auto qd = qkv.dimensions();
  if (!IsActivationType(qkv.element_type()) || qd.size() != 2)
    return Invalid("decode_attention: qkv must be float16 or bfloat16 [B, (heads + 2 kv_heads) head_dim]");
  const int64_t b = qd[0];
  if (qd[1] % (heads + 2 * kv_heads) != 0)
    return Invalid("decode_attention: qkv's width must be (heads + 2 kv_heads) x head_dim");
  const int64_t hd = qd[1] / (heads + 2 * kv_heads);
  auto kd = k_cache.dimensions();
  if (kd.size() != 4 || kd[0] != b || kd[1] != kv_heads || kd[3] != hd || k_cache.element_type() != qkv.element_type())
    return Invalid("decode_attention: k_cache must be [B, kv_heads, T, head_dim] in qkv's type");
  const int64_t t = kd[2];
  auto vd = v_cache.dimensions();
  if (vd.size() != 4 || vd[0] != b || vd[1] != kv_heads || vd[2] != t || vd[3] != hd ||
      v_cache.element_type() != qkv.element_type())
    return Invalid("decode_attention: v_cache must have k_cache's shape and type");
  auto pd = pos.dimensions();
  if (pos.element_type() != ffi::DataType::S32 || pd.size() != 1 || pd[0] != b)
    return Invalid("decode_attention: pos must be int32 [B]");
  auto od = o.dimensions();
  if (od.size() != 2 || od[0] != b || od[1] != heads * hd || o.element_type() != qkv.element_type())
    return Invalid("decode_attention: o must be [B, heads x head_dim] in qkv's type");
  if (k_out.dimensions().size() != 4 || k_out.element_count() != k_cache.element_count() ||
      v_out.element_count() != v_cache.element_count() || k_out.element_type() != qkv.element_type() ||
      v_out.element_type() != qkv.element_type())
    return Invalid("decode_attention: the cache results must have the caches' shapes");
  if (hd % 2 != 0 || t < 1) return Invalid("decode_attention: head_dim must be even and T positive");
  *out = AttentionShape{b, heads, kv_heads, hd, t, qkv.element_type()};
  return ffi::Error::Success();
}

// The rotary angle's frequency of dimension pair i (< hd / 2): theta^(-i / (hd / 2)) in float32,
// as jnp computes theta ** (-arange(half) / half).
inline float RopeInvFreq(float theta, int i, int half) {
  return std::pow(theta, -static_cast<float>(i) / static_cast<float>(half));
}

// qkv, k_cache, v_cache, pos -> o, k_cache, v_cache; the plan's attrs. `splits`: the CUDA kernel's
// blocks per (sequence, KV head), a thread-block cluster that shares the positions (1 on the CPU).
template <typename Binding>
auto BindDecodeAttention(Binding b) {
  return AppendBufferArgs<4>(std::move(b))  // qkv, k_cache, v_cache, pos
      .template Ret<ffi::AnyBuffer>()       // o
      .template Ret<ffi::AnyBuffer>()       // k_cache (aliased)
      .template Ret<ffi::AnyBuffer>()       // v_cache (aliased)
      .template Attr<int64_t>("heads")
      .template Attr<int64_t>("kv_heads")
      .template Attr<float>("rope_theta")
      .template Attr<float>("scale")
      .template Attr<int64_t>("splits");
}

}  // namespace jaxgemv
