"""`dense_matmul`: y = x @ w^T for a plain fp16/bf16 weight with a small N, at decode time.

Routers, gates and linear-attention projections of hybrid and MoE models run products with
M <= 8, N up to 1024 and K of a few thousand: too few columns to fill the GPU, so XLA's GEMV
leaves most SMs idle. On Hopper a split-K kernel (ffi/dense.cu) serves them: the blocks of a
thread-block cluster share K and add their partials through distributed shared memory in a
fixed order, so the result is the same bits on every run. "auto" runs the kernel where it was
timed at most 0.8x XLA's dot on an H200 (M 4..8, N 32..1024, K 2048..4096; planner.DENSE_AUTO_*)
and XLA's dot with float32 accumulation everywhere else.

The weight is a plain [N, K] array in x's dtype: it shards like any array (N: column-parallel, K:
row-parallel with a psum), and unlike the quantized formats it is differentiable.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from jaxgemv import _ext, planner, sharding
from jaxgemv import _product as _product_mod
from jaxgemv.device import facts_for_lowering


def dense_matmul_reference(x: jax.Array, w: jax.Array, bias: jax.Array | None = None) -> jax.Array:
    """x @ w^T (+ bias) in plain jnp, float32 accumulation, rounded once to x's dtype: the "xla"
    variant, the fallback for every shape the kernel does not serve."""
    y = lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if bias is not None and bias.shape[0]:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


# ----------------------------------------------------------------------------------------------
# Primitive: x [M, K], w [N, K] in x's dtype, bias [N] or [0].

_matmul_p = Primitive("jaxgemv_dense_matmul")


def _matmul_abstract(x, w, bias, *, variant):
    del bias, variant
    return jax.core.ShapedArray((x.shape[0], w.shape[0]), x.dtype)


_matmul_p.def_abstract_eval(_matmul_abstract)
_matmul_p.def_impl(_product_mod.eager_impl(_matmul_p))


def _ffi_matmul(plan: planner.DensePlan):
    def call(x, w, bias):
        out = jax.ShapeDtypeStruct((x.shape[0], w.shape[0]), x.dtype)
        return jax.ffi.ffi_call("jaxgemv_dense_matmul", out)(
            x, w, bias,
            variant=np.int64(_ext.VARIANT_CODES[plan.variant]), splits=np.int64(plan.splits),
            loads=np.int64(plan.loads),
        )

    return call


def _matmul_lowering(platform):
    def rule(ctx, x, w, bias, *, variant):
        m, k = ctx.avals_in[0].shape
        n = ctx.avals_in[1].shape[0]
        plan = planner.plan_dense(m, n, k, facts_for_lowering(ctx, platform), variant)
        fun = dense_matmul_reference if plan.variant == "xla" else _ffi_matmul(plan)
        return mlir.lower_fun(fun, multiple_results=False)(ctx, x, w, bias)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_matmul_p, _matmul_lowering(_platform), platform=_platform)


@functools.lru_cache(maxsize=None)
def _per_device(variant: str, rms, act=None):
    return functools.partial(_bind_per_device, variant=variant, rms=rms, act=act)


def _bind_per_device(x, w, bias, row_scale, residual, *, variant, rms, act):
    """The dense kernels have no row scale, activation or residual in their store: with any of
    them, the product (without the bias) is rounded to x's dtype, then the epilogue runs in XLA."""
    if not row_scale.shape[0] and not residual.shape[0] and act is None:
        return _matmul_p.bind(x, w, bias, variant=variant)
    y = _matmul_p.bind(x, w, jnp.zeros((0,), x.dtype), variant=variant).astype(jnp.float32)
    return _product_mod.apply_epilogue(y, bias, row_scale, residual, x.dtype, rms, act)


def _weight_tangent(x, leaves, dleaves):
    """d/dw of x . w^T along dw: x . dw^T (float32), so jax.grad gives dw = dy^T . x."""
    return lax.dot_general(x, dleaves[0].astype(x.dtype), (((1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32)


# w [N, K] shards on N (column-parallel) and on K in units of 8 values (row-parallel), so that each
# K shard keeps the 16-byte rows the kernel needs. (Shardy rejects a compound K factor with a
# unit of 1, so "any K" is not an option.) A K that is not a multiple of 8 partitions on N only.
_LAYOUT_K8 = sharding.WeightLayout(leaves=(("n", ("k", 8)),), block=8)
_LAYOUT_N = sharding.WeightLayout(leaves=(("n", ("k", 1)),), block=1, k_split=False)


@functools.lru_cache(maxsize=None)
def _product(variant: str, present: tuple[bool, bool, bool], k8: bool, rms=None, act=None):
    dense = lambda leaves, dtype: (leaves[0].astype(dtype), None)  # noqa: E731
    return _product_mod.build(_per_device(variant, rms, act), _LAYOUT_K8 if k8 else _LAYOUT_N, present, "dense_matmul",
                              ("w",), dense, weight_tangent=_weight_tangent, rms=rms, act=act,
                              plain_per_device=_per_device(variant, rms))


# ----------------------------------------------------------------------------------------------
# Public API


def _check_weight_shape(w) -> None:
    if not hasattr(w, "shape") or not hasattr(w, "dtype"):
        raise TypeError(f"dense_matmul: w must be an array [N, K], got {type(w).__name__}")
    if len(w.shape) != 2:
        raise ValueError(f"dense_matmul: w must be 2-D [N, K], got shape {tuple(w.shape)}")
    if w.shape[1] == 0:
        raise ValueError("dense_matmul: K must be positive")


def _check_weight_dtype(w, x) -> None:
    """After x's checks: w in x's dtype."""
    if jnp.dtype(w.dtype) not in _product_mod.ACT_DTYPES:
        raise TypeError(f"dense_matmul: w must be float16 or bfloat16, got {w.dtype}")
    if w.dtype != x.dtype:
        raise TypeError(f"dense_matmul: w must have x's dtype {x.dtype}, got {w.dtype}")


def dense_matmul(x: jax.Array, w: jax.Array, *, bias: jax.Array | None = None, row_scale: jax.Array | None = None,
                 residual: jax.Array | None = None, rms_eps: float | None = None, activation: str | None = None,
                 variant: str = "auto") -> jax.Array:
    """y = (x @ w^T) * row_scale + bias + residual with float32 accumulation, for a dense weight;
    the three optional (see fp4_matmul; here the row scale, the activation and the residual are
    applied by XLA after the product, which is rounded to x's dtype first).

    Args:
      x: float16 or bfloat16 [..., K]; leading dimensions fold into M.
      w: [N, K] in x's dtype.
      bias: optional [N] in x's dtype, added once after the product.
      row_scale: optional [...] (x's leading shape), one float per row of x.
      residual: optional [..., N] in x's dtype, added last.
      rms_eps: optional number (static), instead of row_scale: the row scale rsqrt(mean(x^2) +
        rms_eps) of an RMSNorm in front (see fp4_matmul); here XLA forms it.
      activation: None, or "swiglu": w's rows are gate and up rows interleaved by 8
        (interleave_gate_up), and y is silu(gate) * up, [..., N / 2] (see fp4_matmul).
      variant: "auto" (the planner: the split-K kernel on sm_90 and later for M 4..8, N 32..1024,
        K 2048..4096 with K % 8 == 0, where it was timed faster; XLA's dot elsewhere, see
        planner.DENSE_AUTO_M/N/K), "splitk" (sm_90, M <= 8, K % 8 == 0), "xla" (CUDA) or "cpu"
        (the C++ handler), "xla" (CPU) to force a path. JAXGEMV_VARIANT in the environment does
        the same when this is "auto" (its "dequant" means "xla" here); JAXGEMV_SPLITS (1, 2, 4, 8,
        16) forces the cluster size.

    Returns:
      [..., N] in x's dtype ([..., N / 2] with activation="swiglu"); bitwise the same on every
      run of the same inputs and plan.
    """
    _check_weight_shape(w)
    n, k = w.shape
    c = _product_mod.prepare_call("dense_matmul", x, n, k, bias, variant, planner.DENSE_VARIANTS, row_scale=row_scale,
                                  residual=residual, rms_eps=rms_eps, activation=activation)
    _check_weight_dtype(w, c.x)
    if c.empty:
        return c.finish(None)
    return c.finish(_product(variant, c.present, k % 8 == 0, c.rms, c.act)(c.x, w, *c.extras))
