// One decoder layer of a Llama / Qwen-style model at decode time with NVFP4 weights, as one call:
// the qkv product (RMSNorm's scale formed in its store), decode attention, the o product plus the
// residual, gate_up (RMSNorm, SwiGLU in its store) and down plus the residual, launched one after
// another on XLA's stream by the handlers that run them as separate calls (ffi/layer.h), the last
// four under a PdlScope (cluster.cuh). Each of those may then launch while the one before finishes
// and waits for its writes in GridDependencyWait; when XLA records this call into its command
// buffer the capture joins the five kernels by programmatic edges, which separate calls (each
// captured into a graph of its own) cannot have (docs/perf-log.md, entry 92). Inside the scope the
// kernel before each launch is the layer's own, which writes activations only, so each reads its
// weights (the attention its cache rows of earlier positions) before it waits (cluster.cuh:
// EarlyReads). qkv is launched as a separate call launches it, without the attribute: the kernel
// before it is XLA's, which may have written anything this call reads (in a command buffer
// the call's first kernel has no programmatic edge to take anyway).
//
// The plans are the ones jaxgemv/layer.py computes for the separate calls, so both ways launch
// the same kernels with the same arguments and agree bit for bit.

#include <cuda_runtime.h>

#include <string>

#include "cluster.cuh"
#include "common.h"
#include "handlers.h"
#include "layer.h"

namespace jaxgemv {
namespace {

constexpr int kPlanFields = 6;  // rows, ksplit, loads, xperm, xs_warps, x_stage (jaxgemv/layer.py)

ffi::Error Fp4LayerCuda(cudaStream_t stream, int32_t device, ffi::AnyBuffer x, ffi::AnyBuffer qkv_packed,
                        ffi::AnyBuffer qkv_scales, ffi::AnyBuffer qkv_gscale, ffi::AnyBuffer o_packed,
                        ffi::AnyBuffer o_scales, ffi::AnyBuffer o_gscale, ffi::AnyBuffer gate_up_packed,
                        ffi::AnyBuffer gate_up_scales, ffi::AnyBuffer gate_up_gscale, ffi::AnyBuffer down_packed,
                        ffi::AnyBuffer down_scales, ffi::AnyBuffer down_gscale, ffi::AnyBuffer k_cache,
                        ffi::AnyBuffer v_cache, ffi::AnyBuffer pos, ffi::AnyBuffer none_act, ffi::AnyBuffer none_f32,
                        ffi::Result<ffi::AnyBuffer> qkv, ffi::Result<ffi::AnyBuffer> att,
                        ffi::Result<ffi::AnyBuffer> x_mid, ffi::Result<ffi::AnyBuffer> act,
                        ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> k_out,
                        ffi::Result<ffi::AnyBuffer> v_out, ffi::Span<const int64_t> plans, float eps, int64_t heads,
                        int64_t kv_heads, float rope_theta, float scale, int64_t splits, int64_t trigger) {
  if (plans.size() != 4 * kPlanFields)
    return Invalid("fp4 layer: plans must hold " + std::to_string(4 * kPlanFields) + " values (four products)");
  for (int i = 0; i < 4; ++i)
    if (plans[i * kPlanFields + 3] != 0 || plans[i * kPlanFields + 4] != 0)
      return Invalid("fp4 layer: the products' plans must take x as it is (xperm 0, xs_warps 0)");
  if (none_act.element_count() != 0 || none_f32.element_count() != 0)
    return Invalid("fp4 layer: the absent-operand placeholders must be empty");
  // (The products' and the attention's own checks take the shapes; the norm's 1 / K is x's.)
  const int64_t hidden = x.dimensions().size() == 2 ? x.dimensions()[1] : 0;
  if (hidden <= 0) return Invalid("fp4 layer: x must be [M, hidden] with hidden > 0");
  const float inv_hidden = 1.0f / static_cast<float>(hidden);
  const auto mma = static_cast<int64_t>(Variant::kMma);
  auto product = [&](int i, ffi::AnyBuffer in, ffi::AnyBuffer packed, ffi::AnyBuffer scales, ffi::AnyBuffer gscale,
                     ffi::AnyBuffer residual, ffi::Result<ffi::AnyBuffer> out, bool rms, int64_t activation) {
    const int64_t* p = &plans[i * kPlanFields];
    return Fp4MatmulCuda(stream, device, in, packed, scales, gscale, none_act, none_f32, residual, out, mma, p[0],
                         p[1], p[2], p[3], p[4], p[5], rms ? eps : -1.0f, rms ? inv_hidden : 0.0f, activation);
  };
  // trigger: which kernels let the next one launch at their start (cluster.cuh: TriggerScope), one
  // bit each in launch order (1 qkv, 2 attention, 4 o, 8 gate_up, 16 down; jaxgemv/layer.py).
  if (trigger < 0 || trigger > 31) return Invalid("fp4 layer: trigger must be a mask of 5 bits (0 to 31)");
  const auto early = [&](int kernel) { return ((trigger >> kernel) & 1) != 0; };
  {
    TriggerScope t(early(0));
    if (auto err = product(0, x, qkv_packed, qkv_scales, qkv_gscale, none_act, qkv, true, 0); err.failure()) return err;
  }
  PdlScope pdl;
  {
    TriggerScope t(early(1));
    if (auto err = DecodeAttentionCuda(stream, device, *qkv, k_cache, v_cache, pos, att, k_out, v_out, heads,
                                       kv_heads, rope_theta, scale, splits);
        err.failure())
      return err;
  }
  {
    TriggerScope t(early(2));
    if (auto err = product(1, *att, o_packed, o_scales, o_gscale, x, x_mid, false, 0); err.failure()) return err;
  }
  {
    TriggerScope t(early(3));
    if (auto err = product(2, *x_mid, gate_up_packed, gate_up_scales, gate_up_gscale, none_act, act, true, 1);
        err.failure())
      return err;
  }
  TriggerScope t(early(4));
  return product(3, *act, down_packed, down_scales, down_gscale, *x_mid, y, false, 0);
}

}  // namespace
}  // namespace jaxgemv

namespace {
template <typename Binding>
auto BindArgs(Binding b) {
  return jaxgemv::AppendBufferArgs<18>(std::move(b));  // x, 4 x 3 weight arrays, caches, pos, 2 empties
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxgemvFp4LayerCuda, jaxgemv::Fp4LayerCuda,
                              BindArgs(xla::ffi::Ffi::Bind()
                                           .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                           .Ctx<xla::ffi::DeviceOrdinal>())
                                  .Ret<xla::ffi::AnyBuffer>()  // qkv
                                  .Ret<xla::ffi::AnyBuffer>()  // attention
                                  .Ret<xla::ffi::AnyBuffer>()  // x + o
                                  .Ret<xla::ffi::AnyBuffer>()  // SwiGLU(gate_up)
                                  .Ret<xla::ffi::AnyBuffer>()  // y
                                  .Ret<xla::ffi::AnyBuffer>()  // k_cache
                                  .Ret<xla::ffi::AnyBuffer>()  // v_cache
                                  .Attr<xla::ffi::Span<const int64_t>>("plans")
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("heads")
                                  .Attr<int64_t>("kv_heads")
                                  .Attr<float>("rope_theta")
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("splits")
                                  .Attr<int64_t>("trigger"),
                              {xla::ffi::Traits::kCmdBufferCompatible});
