"""`decoder_layer`: one decode step of a pre-norm Llama / Qwen-style transformer layer.

    y, k_cache, v_cache = jaxgemv.decoder_layer(x, qkv, o, gate_up, down, k_cache, v_cache, pos,
                                                heads=32, kv_heads=8, eps=1e-6, rope_theta=1e6)

is, with each RMSNorm's gain folded into the columns of the projection after it (so the norm is
its row scale, formed in that product's store):

    h = fp4_matmul(x, qkv, rms_eps=eps)
    a, k_cache, v_cache = decode_attention(h, k_cache, v_cache, pos, heads=..., kv_heads=..., ...)
    x_mid = fp4_matmul(a, o, residual=x)
    y = fp4_matmul(fp4_matmul(x_mid, gate_up, rms_eps=eps, activation="swiglu"), down, residual=x_mid)

(fp8_matmul, int4_matmul or int8_matmul for weights in those formats). With four NVFP4 weights on
a GPU, where each of the four products' plans needs nothing of XLA around its kernel (M = 1 with
a K split: the kernel sums x's squares itself) and the attention takes its kernel, the five
kernels are launched by one custom call (ffi/layer.cu), with programmatic dependent launch
between them: under XLA's command buffers that call is captured as one graph whose kernels may
each start while the one before finishes, which five separate calls cannot do (docs/perf-log.md,
entry 92). Anywhere else, the same primitive lowers to the five calls, and the two ways launch
the same kernels with the same plans and agree bit for bit.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.extend.core import Primitive
from jax.interpreters import mlir

from jaxgemv import _product as _product_mod
from jaxgemv import attention as _attention
from jaxgemv import fp4 as _fp4
from jaxgemv import planner, sharding
from jaxgemv.device import DeviceFacts, facts_for_lowering
from jaxgemv.generic import product_for

# The fields of a product's plan that the fused call takes, in ffi/layer.cu's order.
PLAN_FIELDS = ("rows", "ksplit", "loads", "xperm", "xs_warps", "x_stage")

# Which of the fused call's kernels let the next one launch at their start instead of once their
# weight or cache stream is done (ffi/cluster.cuh: TriggerScope), one bit each in launch order: 1
# qkv, 2 attention, 4 o, 8 gate_up, 16 down (whose next kernel is outside the call: no effect).
# All but gate_up: its early trigger lets down's blocks take their first weight windows while
# gate_up's last wave still streams, which lost 33-50 us per 8B step against this mask, where
# the others' gained (docs/perf-log.md, entry 97). JAXGEMV_TRIGGER (0 to 31) overrides it at
# trace time. Every mask computes the same bits; only when the next kernel's blocks become
# resident and issue their first reads moves.
TRIGGER = 1 | 2 | 4 | 16


def fused_plans(m: int, hidden: int, qkv_n: int, o_k: int, inter: int, head_dim: int, group: int, max_len: int,
                facts: DeviceFacts) -> tuple[tuple[planner.Plan, ...], int] | None:
    """The four products' plans and the attention's splits of the fused call for these shapes on
    `facts`, or None where the layer runs as separate calls: off CUDA, where a product's plan is
    not the tensor-core kernel taking x as it is and, for the two behind an RMSNorm, summing x's
    squares itself (planner.x_sums), or where the attention takes XLA's path. The plans are the
    ones the separate calls would take (fp4_matmul's lowering), so both ways run the same kernels."""
    if facts.platform != "cuda":
        return None
    shapes = ((qkv_n, hidden, None, True), (hidden, o_k, None, False), (2 * inter, hidden, "swiglu", True),
              (hidden, inter, None, False))
    plans = []
    for n, k, act, rms in shapes:
        plan = _fp4.lowering_plan(m, n, k, facts, act=act)
        if plan.variant != "mma" or plan.xperm or plan.xs_warps or (rms and not planner.x_sums(plan, m, k, k)):
            return None
        plans.append(plan)
    if _attention._choose("auto", facts.platform, head_dim, group, max_len) != "kernel":
        return None
    return tuple(plans), _attention.plan_splits(max_len, head_dim, group, facts)


# ----------------------------------------------------------------------------------------------
# Primitive: x [M, hidden], the four weights' leaves (packed, scales as uint8, global scale),
# k_cache, v_cache [M, KVH, T, hd], pos int32 [M] -> y [M, hidden], k_cache, v_cache.

_layer_p = Primitive("jaxgemv_fp4_decoder_layer")
_layer_p.multiple_results = True


def _abstract(x, *rest, **params):
    del params
    k_cache, v_cache = rest[12], rest[13]
    return [jax.core.ShapedArray(x.shape, x.dtype), jax.core.ShapedArray(k_cache.shape, k_cache.dtype),
            jax.core.ShapedArray(v_cache.shape, v_cache.dtype)]


_layer_p.def_abstract_eval(_abstract)
_layer_p.def_impl(_product_mod.eager_impl(_layer_p))


def _separate(x, *rest, heads, kv_heads, rope_theta, scale, eps):
    """The layer as five per-device primitives (what the separate public calls bind on one device)."""
    qkv, o, gate_up, down = (rest[3 * i : 3 * i + 3] for i in range(4))
    k_cache, v_cache, pos = rest[12:]
    none_act, none_f32 = jnp.zeros((0,), x.dtype), jnp.zeros((0,), jnp.float32)

    def product(a, w, row_scale=none_f32, residual=none_act, rms=None, act=None):
        return _fp4._bind_per_device(a, *w, none_act, row_scale, residual, variant="auto", rms=rms, act=act)

    rms = (eps, 1.0 / x.shape[1])
    h = product(x, qkv, row_scale=_product_mod.sums_of_squares(x), rms=rms)
    a, k_cache, v_cache = _attention._attention_p.bind(h, k_cache, v_cache, pos, heads=heads, kv_heads=kv_heads,
                                                        rope_theta=rope_theta, scale=scale, variant="auto")
    x_mid = product(a, o, residual=x)
    g = product(x_mid, gate_up, row_scale=_product_mod.sums_of_squares(x_mid), rms=rms, act="swiglu")
    return [product(g, down, residual=x_mid), k_cache, v_cache]


def _lowering(platform):
    def rule(ctx, x, *rest, heads, kv_heads, rope_theta, scale, eps):
        params = dict(heads=heads, kv_heads=kv_heads, rope_theta=rope_theta, scale=scale, eps=eps)
        m, hidden = ctx.avals_in[0].shape
        qkv_n, o_k, gu_n = ctx.avals_in[1].shape[0], 2 * ctx.avals_in[4].shape[1], ctx.avals_in[7].shape[0]
        _, _, t, hd = ctx.avals_in[13].shape
        chosen = None
        if platform == "cuda":
            chosen = fused_plans(m, hidden, qkv_n, o_k, gu_n // 2, hd, heads // kv_heads, t,
                                 facts_for_lowering(ctx, platform))
        if chosen is None:
            return mlir.lower_fun(functools.partial(_separate, **params), multiple_results=True)(ctx, x, *rest)
        plans, splits = chosen
        trigger = planner.env_int("JAXGEMV_TRIGGER", planner.TRIGGER_MASKS)
        trigger = TRIGGER if trigger is None else trigger

        def call(x, *rest):
            k_cache, v_cache = rest[12], rest[13]
            hq = heads * hd
            outs = (jax.ShapeDtypeStruct((m, qkv_n), x.dtype), jax.ShapeDtypeStruct((m, hq), x.dtype),
                    jax.ShapeDtypeStruct((m, hidden), x.dtype), jax.ShapeDtypeStruct((m, gu_n // 2), x.dtype),
                    jax.ShapeDtypeStruct((m, hidden), x.dtype), jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                    jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype))
            flat = np.array([getattr(p, f) for p in plans for f in PLAN_FIELDS], np.int64)
            res = jax.ffi.ffi_call("jaxgemv_fp4_layer", outs, input_output_aliases={13: 5, 14: 6})(
                x, *rest, jnp.zeros((0,), x.dtype), jnp.zeros((0,), jnp.float32), plans=flat,
                eps=np.float32(eps), heads=np.int64(heads), kv_heads=np.int64(kv_heads),
                rope_theta=np.float32(rope_theta if rope_theta is not None else 0.0), scale=np.float32(scale),
                splits=np.int64(splits), trigger=np.int64(trigger))
            return [res[4], res[5], res[6]]

        return mlir.lower_fun(call, multiple_results=True)(ctx, x, *rest)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_layer_p, _lowering(_platform), platform=_platform)


# ----------------------------------------------------------------------------------------------
# Public API


def decoder_layer(x: jax.Array, qkv, o, gate_up, down, k_cache: jax.Array, v_cache: jax.Array, pos, *, heads: int,
                  kv_heads: int, eps: float, rope_theta: float | None = None, scale: float | None = None,
                  fuse: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step of a pre-norm transformer layer (RMSNorm, grouped-query attention with a
    KV cache, RMSNorm, SwiGLU MLP, both with residual connections).

    Args:
      x: float16 or bfloat16 [B, hidden], the residual stream (one token per sequence).
      qkv: the fused q, k, v projection [(heads + 2 kv_heads) head_dim, hidden], the first
        RMSNorm's gain folded into its columns (W * g).
      o: [hidden, heads x head_dim].
      gate_up: [2 F, hidden], gate and up rows interleaved by 8 (interleave_gate_up), the second
        RMSNorm's gain folded into its columns.
      down: [hidden, F].
        The four weights are jaxgemv weights (NVFP4Weight, FP8Weight or NBitsWeight), not
        necessarily all of one format.
      k_cache, v_cache, pos: as decode_attention takes them (caches [B, kv_heads, T, head_dim] in
        x's dtype, updated in place under jit; pos an int, int32 scalar or [B]).
      heads, kv_heads, rope_theta, scale: as decode_attention takes them.
      eps: both RMSNorms' epsilon (static).
      fuse: with four NVFP4 weights, run the layer as one primitive that a GPU launches as one
        custom call where the plans allow (module docstring) and as the separate calls otherwise.
        Under vmap (over x, the caches and pos) the mapped axis folds into the batch, as it does
        for the separate calls. Under pjit it partitions along the batch (each device runs the
        layer for its sequences, nothing gathered); it needs every weight whole, so weights
        sharded for tensor parallelism are gathered for it (correct, slow; a warning names
        them): pass fuse=False
        there, which binds the separate public calls, each with its own partitioning (the
        row-parallel products' all-reduces included). Other formats always take the separate
        calls.

    Returns:
      (y [B, hidden] in x's dtype, k_cache, v_cache).
    """
    name = "decoder_layer"
    mats = [product_for(w, f"decoder_layer: {arg}", dense=False)
            for w, arg in ((qkv, "qkv"), (o, "o"), (gate_up, "gate_up"), (down, "down"))]
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"{name}: x must be an array, got {type(x).__name__}")
    if jnp.dtype(x.dtype) not in _product_mod.ACT_DTYPES or x.ndim != 2:
        raise TypeError(f"{name}: x must be float16 or bfloat16 [B, hidden], got {x.dtype} {tuple(x.shape)}")
    hidden = x.shape[1]
    if not hasattr(k_cache, "shape") or k_cache.ndim != 4:
        raise ValueError(f"{name}: k_cache must be 4-D [B, kv_heads, T, head_dim]")
    hd = k_cache.shape[-1]
    if not isinstance(heads, (int, np.integer)) or not isinstance(kv_heads, (int, np.integer)) or kv_heads < 1:
        raise TypeError(f"{name}: heads and kv_heads must be positive Python ints")
    if heads < 1 or heads % kv_heads:
        raise ValueError(f"{name}: heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    expected = {"qkv": ((heads + 2 * kv_heads) * hd, hidden), "o": (hidden, heads * hd),
                "gate_up": (gate_up.shape[0], hidden), "down": (hidden, gate_up.shape[0] // 2)}
    for arg, w in (("qkv", qkv), ("o", o), ("gate_up", gate_up), ("down", down)):
        if tuple(w.shape) != expected[arg]:
            raise ValueError(f"{name}: {arg} must be [{expected[arg][0]}, {expected[arg][1]}] for x {tuple(x.shape)} "
                             f"and head_dim {hd} (k_cache's last axis), got {tuple(w.shape)}")
    if gate_up.shape[0] % 16:
        raise ValueError(f"{name}: gate_up must have a multiple of 16 rows (gate and up interleaved by 8), "
                         f"got {gate_up.shape[0]}")
    eps = _product_mod._check_rms_eps(name, eps, None)
    if isinstance(pos, (int, np.integer)) and not isinstance(pos, bool):
        pos = jnp.asarray(pos, jnp.int32)
    # decode_attention's own checks (caches, pos, heads, rope_theta, scale), before either path.
    _attention._check(jax.ShapeDtypeStruct((x.shape[0], (heads + 2 * kv_heads) * hd), x.dtype), k_cache, v_cache,
                      pos, heads, kv_heads, rope_theta, scale, "auto")
    if not fuse or not all(m is _fp4.fp4_matmul for m in mats) or x.shape[0] == 0:
        h = mats[0](x, qkv, rms_eps=eps)
        a, k_cache, v_cache = _attention.decode_attention(h, k_cache, v_cache, pos, heads=heads, kv_heads=kv_heads,
                                                          rope_theta=rope_theta, scale=scale)
        x_mid = mats[1](a, o, residual=x)
        g = mats[2](x_mid, gate_up, rms_eps=eps, activation="swiglu")
        return mats[3](g, down, residual=x_mid), k_cache, v_cache
    for arg, w in (("qkv", qkv), ("o", o), ("gate_up", gate_up), ("down", down)):
        _fp4.check_weight(w, f"decoder_layer: {arg}")
    pos, scale, rope_theta = _attention.static_params(pos, scale, rope_theta, x.shape[0], hd)
    leaves = []
    for w in (qkv, o, gate_up, down):
        leaves += [w.packed, jax.lax.bitcast_convert_type(w.scales, jnp.uint8), w.global_scale]
    fused = _fused(int(heads), int(kv_heads), rope_theta, scale, eps)
    y, k_cache, v_cache = fused(x, *leaves, k_cache, v_cache, pos)
    return y, k_cache, v_cache


@functools.lru_cache(maxsize=None)
def _fused(heads, kv_heads, rope_theta, scale, eps):
    """The fused primitive for these static parameters, partitioned along the batch under pjit
    (jaxgemv/sharding.py: partitioned_layer) and with vmap folded into the batch."""

    def inner(x, *rest):
        return tuple(_layer_p.bind(x, *rest, heads=heads, kv_heads=kv_heads, rope_theta=rope_theta, scale=scale,
                                   eps=eps))

    part = sharding.partitioned_layer(inner)

    @custom_vmap
    def mapped(x, *rest):
        return part(x, *rest)

    @mapped.def_vmap
    def _fold(axis_size, in_batched, x, *rest):
        """vmap over x, the caches and pos folds the mapped axis into the batch: one layer for every
        sequence of every example (an operand that is not mapped is shared: each example gets its
        own updated caches). At a batch above 1 the layer takes the separate calls' kernels."""
        if any(in_batched[1:13]):
            raise NotImplementedError("decoder_layer: vmap over the weights is not supported; map over x, the "
                                      "caches and pos only, or use lax.map")
        x, k_cache, v_cache, pos = _attention.fold_batch(axis_size, (x, *rest[12:]),
                                                         (in_batched[0], *in_batched[13:]))
        outs = mapped(x, *rest[:12], k_cache, v_cache, pos)
        return _attention.unfold_batch(axis_size, outs), (True,) * len(outs)

    return mapped
