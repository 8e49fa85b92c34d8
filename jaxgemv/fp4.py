"""NVFP4 weights and `fp4_matmul`: y = x @ dequant(W)^T for small M.

Format (byte-compatible with NVIDIA ModelOpt and ONNX Runtime NVFP4 checkpoints):
  packed        uint8 [N, K/2]          E2M1 codes; byte i of a row holds k = 2i in its low nibble
                                         and k = 2i + 1 in its high nibble
  scales        float8_e4m3fn [N, K/16] one scale per 16 consecutive k
  global_scale  float32 []              one per tensor
  value = e2m1 x scale x global_scale

ffi/fp4.cu holds the CUDA kernels and ffi/fp4_cpu.cc the CPU handlers behind the primitives here.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.export
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from jaxgemv import planner, sharding
from jaxgemv import _product as _product_mod
from jaxgemv.device import facts_for_lowering

# Magnitudes of the eight E2M1 codes; bit 3 of a code is the sign.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
E2M1_MAX = 6.0
E4M3_MAX = 448.0
BLOCK = 16

_ACT_DTYPES = _product_mod.ACT_DTYPES


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class NVFP4Weight:
    """An [N, K] weight in NVFP4: packed E2M1 codes, E4M3 block scales, a float32 global scale.

    A pytree of three arrays, so it passes through `jit`, can be sharded and checkpointed, and can
    wrap arrays loaded from an existing checkpoint without copying.
    """

    packed: Any
    scales: Any
    global_scale: Any

    def tree_flatten(self):
        return (self.packed, self.scales, self.global_scale), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux
        return cls(*children)

    @property
    def shape(self) -> tuple[int, int]:
        n, half_k = self.packed.shape
        return n, 2 * half_k

    def partition_layout(self) -> sharding.WeightLayout:
        """The layout its products partition by under pjit, arrays in tree_flatten's order
        (`splits_k` and `jaxgemv.weight_sharding` read it)."""
        return _LAYOUT

    def splits_k(self, ways: int) -> bool:
        """Whether a product against this weight partitions with its K sharded `ways` ways
        (row-parallel under pjit: partial products and one all-reduce). K splits only at whole
        16-value scale blocks; where it cannot, the product gathers K instead (correct, with a
        warning). One way always holds."""
        return self.partition_layout().shards_k(self.shape[1], ways, "NVFP4Weight.splits_k")

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight as a dense [N, K] array (computed in float32, rounded once to `dtype`)."""
        check_weight(self, "NVFP4Weight.dequantize: w")
        return dequantize_reference(self).astype(dtype)

    @classmethod
    def from_modelopt(cls, weight, weight_scale, weight_scale_2) -> "NVFP4Weight":
        """A ModelOpt NVFP4 checkpoint's linear layer as stored: `weight` uint8 [N, K/2],
        `weight_scale` [N, K/16] as float8_e4m3fn or its raw bytes (uint8, as loaders without an
        FP8 type give them), `weight_scale_2` the float32 global scale as a scalar or [1]. Views and
        reshapes only; the result is checked as fp4_matmul checks it."""
        name = "NVFP4Weight.from_modelopt"
        _product_mod.check_arrays(name, weight=weight, weight_scale=weight_scale, weight_scale_2=weight_scale_2)
        if jnp.dtype(weight_scale.dtype) == jnp.uint8:
            weight_scale = (weight_scale.view(jnp.float8_e4m3fn) if isinstance(weight_scale, np.ndarray)
                            else lax.bitcast_convert_type(weight_scale, jnp.float8_e4m3fn))
        if tuple(weight_scale_2.shape) == (1,):
            weight_scale_2 = weight_scale_2.reshape(())
        if jnp.dtype(weight_scale_2.dtype) != jnp.float32 and jnp.issubdtype(weight_scale_2.dtype, jnp.floating):
            weight_scale_2 = weight_scale_2.astype(jnp.float32)  # exact from bf16 / fp16
        w = cls(weight, weight_scale, weight_scale_2)
        check_weight(w, f"{name}: w")
        return w


# jax.export can serialize functions that take or return an NVFP4Weight.
jax.export.register_pytree_node_serialization(
    NVFP4Weight,
    serialized_name="jaxgemv.NVFP4Weight",
    serialize_auxdata=lambda aux: b"",
    deserialize_auxdata=lambda data: None,
)


def check_weight(w: Any, name: str) -> None:
    """Raises TypeError/ValueError naming `name` unless `w` is a well-formed NVFP4Weight."""
    if not isinstance(w, NVFP4Weight):
        raise TypeError(f"{name} must be a jaxgemv.NVFP4Weight, got {type(w).__name__}")
    _product_mod.check_arrays(name, packed=w.packed, scales=w.scales, global_scale=w.global_scale)
    packed, scales, gscale = w.packed, w.scales, w.global_scale
    if jnp.dtype(packed.dtype) != jnp.uint8 or packed.ndim != 2:
        raise TypeError(f"{name}.packed must be uint8 [N, K/2], got {packed.dtype} {packed.shape}")
    n, k = packed.shape[0], 2 * packed.shape[1]
    if k == 0 or k % BLOCK:
        raise ValueError(f"{name}: K = {k} must be a positive multiple of {BLOCK}")
    if jnp.dtype(scales.dtype) != jnp.float8_e4m3fn or tuple(scales.shape) != (n, k // BLOCK):
        raise TypeError(
            f"{name}.scales must be float8_e4m3fn [{n}, {k // BLOCK}], got {scales.dtype} {tuple(scales.shape)}"
        )
    if jnp.dtype(gscale.dtype) != jnp.float32 or gscale.ndim != 0:
        raise TypeError(f"{name}.global_scale must be a float32 scalar, got {gscale.dtype} {gscale.shape}")


def _round_to_e2m1_codes(v: jax.Array) -> jax.Array:
    """4-bit codes of the E2M1 values nearest to v (ties to the even code), saturating at +-6."""
    a = jnp.minimum(jnp.abs(v), E2M1_MAX)
    # Midpoints between neighbouring magnitudes; at a tie the even code wins, so the comparison is
    # strict where the lower code is even and inclusive where the upper one is.
    code = (
        (a > 0.25).astype(jnp.uint8)
        + (a >= 0.75)
        + (a > 1.25)
        + (a >= 1.75)
        + (a > 2.5)
        + (a >= 3.5)
        + (a > 5.0)
    ).astype(jnp.uint8)
    return jnp.where(jnp.signbit(v), code | 8, code).astype(jnp.uint8)


def quantize_nvfp4(w: jax.Array) -> NVFP4Weight:
    """Quantizes a float [N, K] weight (K % 16 == 0) to NVFP4.

    The global scale maps the tensor's absolute maximum onto 6 x 448 so that block scales use the
    E4M3 range; each block scale is its block's amax / 6 divided by the global scale, rounded to
    E4M3; each value is divided by its block's scale and rounded to the nearest E2M1 value, ties to
    even.
    """
    w = jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"quantize_nvfp4: w must be 2-D [N, K], got shape {w.shape}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"quantize_nvfp4: w must be a float array, got {w.dtype}")
    n, k = w.shape
    if k == 0 or k % BLOCK:
        raise ValueError(f"quantize_nvfp4: K = {k} must be a positive multiple of {BLOCK}")
    w32 = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(w32))
    gscale = jnp.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), 1.0).astype(jnp.float32)
    blocks = w32.reshape(n, k // BLOCK, BLOCK)
    block_amax = jnp.max(jnp.abs(blocks), axis=-1)
    scales = (block_amax / E2M1_MAX / gscale).astype(jnp.float8_e4m3fn)
    denom = scales.astype(jnp.float32)[..., None] * gscale
    q = jnp.where(denom > 0, blocks / jnp.where(denom > 0, denom, 1.0), 0.0)
    codes = _round_to_e2m1_codes(q).reshape(n, k)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return NVFP4Weight(packed.astype(jnp.uint8), scales, gscale)


def decode_codes(packed: jax.Array) -> jax.Array:
    """E2M1 values (float32 [N, K]) of packed codes, low nibble first."""
    lut = jnp.asarray(np.concatenate([E2M1_VALUES, -E2M1_VALUES]))
    lo = lut[(packed & 15).astype(jnp.int32)]
    hi = lut[(packed >> 4).astype(jnp.int32)]
    return jnp.stack([lo, hi], axis=-1).reshape(packed.shape[0], -1)


def dequantize_reference(w: NVFP4Weight) -> jax.Array:
    """float32 [N, K] weight in plain jnp: the fallback and the tests' reference."""
    vals = decode_codes(w.packed)
    scales = jnp.repeat(w.scales.astype(jnp.float32), BLOCK, axis=1)
    return vals * scales * w.global_scale


def fp4_matmul_reference(x: jax.Array, w: NVFP4Weight, bias: jax.Array | None = None, row_scale=None,
                         residual=None, rms_eps=None, activation=None) -> jax.Array:
    """fp4_matmul in plain jnp with float32 accumulation."""
    return _product_mod.reference_product(x, dequantize_reference(w), bias, row_scale, residual, rms_eps, activation)


# ----------------------------------------------------------------------------------------------
# Primitives

_matmul_p = Primitive("jaxgemv_fp4_matmul")
_dequantize_p = Primitive("jaxgemv_fp4_dequantize")


def _matmul_abstract(x, packed, scales, gscale, bias, row_scale, residual, *, variant, rms, act):
    del scales, gscale, bias, row_scale, residual, variant, rms
    return jax.core.ShapedArray((x.shape[0], _product_mod.out_cols(packed.shape[0], act)), x.dtype)


def _dequantize_abstract(packed, scales, gscale, *, dtype, apply_global_scale):
    del scales, gscale, apply_global_scale
    return jax.core.ShapedArray((packed.shape[0], 2 * packed.shape[1]), dtype)


_matmul_p.def_abstract_eval(_matmul_abstract)
_dequantize_p.def_abstract_eval(_dequantize_abstract)


_matmul_p.def_impl(_product_mod.eager_impl(_matmul_p))
_dequantize_p.def_impl(_product_mod.eager_impl(_dequantize_p))


def _dequant_then_dot(x, packed, scales, gscale, bias, row_scale, residual, *, rms, act):
    """The path above the GEMV range: decode W once into x's dtype, then XLA's dot.

    The decoded weight leaves out the global scale: e2m1 x E4M3 needs 6 significant bits and lies
    in [2^-10, 2688], so it is exact in fp16 and bf16, and the global scale is applied to the
    float32 product. This path is then as accurate as the GEMV kernels, where decoding the full
    value into 16 bits would round every weight.
    """
    w = _dequantize_p.bind(packed, scales, gscale, dtype=jnp.dtype(x.dtype), apply_global_scale=False)
    y = lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return _product_mod.apply_epilogue(y * gscale, bias, row_scale, residual, x.dtype, rms, act)


def _ffi_matmul(plan: planner.Plan, rms, act):
    def call(x, packed, scales, gscale, bias, row_scale, residual):
        out = jax.ShapeDtypeStruct((x.shape[0], _product_mod.out_cols(packed.shape[0], act)), x.dtype)
        row_scale = _product_mod.kernel_row_scale(plan, x, row_scale, rms)
        x, attrs = _product_mod.kernel_inputs(plan, x, rms, act, values_per_chunk=32, compact=True)
        return jax.ffi.ffi_call("jaxgemv_fp4_matmul", out)(x, packed, scales, gscale, bias, row_scale, residual,
                                                           **attrs)

    return call


def lowering_plan(m: int, n: int, k: int, facts, variant: str = "auto", act=None) -> planner.Plan:
    """The plan fp4_matmul's lowering runs an [M, K] x [N, K] product with (jaxgemv/layer.py's
    fused call takes the same, so that both launch the same kernels)."""
    return _product_mod.with_activation(planner.plan_fp4(m, n, k, facts, variant), act)


def _matmul_lowering(platform):
    def rule(ctx, x, packed, scales, gscale, bias, row_scale, residual, *, variant, rms, act):
        x_aval, w_aval = ctx.avals_in[0], ctx.avals_in[1]
        m, k = x_aval.shape
        n = w_aval.shape[0]
        plan = lowering_plan(m, n, k, facts_for_lowering(ctx, platform), variant, act)
        if plan.variant == "dequant":
            fun = functools.partial(_dequant_then_dot, rms=rms, act=act)
        else:
            fun = _ffi_matmul(plan, rms, act)
        return mlir.lower_fun(fun, multiple_results=False)(ctx, x, packed, scales, gscale, bias, row_scale, residual)

    return rule


def _dequantize_lowering(ctx, packed, scales, gscale, *, dtype, apply_global_scale):
    del dtype  # carried by the result type
    return jax.ffi.ffi_lowering("jaxgemv_fp4_dequantize")(
        ctx, packed, scales, gscale, apply_global_scale=np.int64(apply_global_scale)
    )


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_matmul_p, _matmul_lowering(_platform), platform=_platform)
    mlir.register_lowering(_dequantize_p, _dequantize_lowering, platform=_platform)


# What fp4_matmul runs: the per-device primitive above, wrapped by jaxgemv/_product.py
# (partitioned for pjit, vmap over x folded into M, a JVP for x and bias).

# packed [N, K/2]: 8 bytes per 16-value block; scales [N, K/16]: one; global scale: a scalar.
_LAYOUT = sharding.WeightLayout(leaves=(("n", ("k", 8)), ("n", ("k", 1)), ()), block=16)


@functools.lru_cache(maxsize=None)
def _per_device(variant: str, rms, act=None):
    return functools.partial(_bind_per_device, variant=variant, rms=rms, act=act)


def _bind_per_device(x, packed, scales, gscale, bias, row_scale, residual, *, variant, rms, act):
    return _matmul_p.bind(x, packed, scales, gscale, bias, row_scale, residual, variant=variant, rms=rms, act=act)


def _dense_for_jvp(leaves, dtype):
    """The weight decoded exactly without the global scale, which multiplies the float32 product."""
    packed, scales, gscale = leaves
    return _dequantize_p.bind(packed, scales, gscale, dtype=dtype, apply_global_scale=False), gscale


@functools.lru_cache(maxsize=None)
def _product(variant: str, present: tuple[bool, bool, bool], rms=None, act=None):
    """f(x [M, K], packed, scales (as uint8), global_scale, *epilogue) -> y [M, N_out]."""
    return _product_mod.build(_per_device(variant, rms, act), _LAYOUT, present, "fp4_matmul",
                              ("packed", "scales", "global_scale"), _dense_for_jvp, rms=rms, act=act,
                              plain_per_device=_per_device(variant, rms))


# ----------------------------------------------------------------------------------------------
# Public API


def fp4_matmul(x: jax.Array, w: NVFP4Weight, *, bias: jax.Array | None = None, row_scale: jax.Array | None = None,
               residual: jax.Array | None = None, rms_eps: float | None = None, activation: str | None = None,
               variant: str = "auto") -> jax.Array:
    """y = (x @ dequant(w)^T) * row_scale + bias + residual with float32 accumulation, rounded
    once; each of the three optional.

    Args:
      x: float16 or bfloat16 [..., K]; leading dimensions fold into M.
      w: an NVFP4Weight of shape [N, K].
      bias: optional [N] in x's dtype, added once after the product.
      row_scale: optional [...] (x's leading shape), one float per row of x, multiplying that
        row's float32 product before the bias: an RMSNorm in front of the product is
        rsqrt(mean(x^2) + eps) here, with the norm's gain folded into w's columns.
      residual: optional [..., N] in x's dtype, added last (a residual connection).
      rms_eps: optional number (static), instead of row_scale: an RMSNorm in front of the
        product, its gain folded into w's columns. The row scale is then rsqrt(mean(x^2) +
        rms_eps) per row of x: XLA sums the squares (at M = 1 with a K split the kernel
        does, planner.x_sums), the kernel's store forms the rest.
      activation: None, or "swiglu": w's rows are a gate and an up projection interleaved by 8
        (interleave_gate_up, N a multiple of 16), and the store writes silu(gate) * up of the
        float32 products (after row_scale and bias, before residual): y is [..., N / 2].
      variant: "auto" (the planner), or "mma", "scalar", "dequant" (CUDA) / "cpu", "dequant" (CPU)
        to force a path. JAXGEMV_VARIANT in the environment does the same when this is "auto".

    Returns:
      [..., N] in x's dtype ([..., N / 2] with activation="swiglu").
    """
    check_weight(w, "fp4_matmul: w")
    n, k = w.shape
    c = _product_mod.prepare_call("fp4_matmul", x, n, k, bias, variant, row_scale=row_scale, residual=residual,
                                  rms_eps=rms_eps, activation=activation)
    if c.empty:
        return c.finish(None)
    scales = lax.bitcast_convert_type(w.scales, jnp.uint8)
    return c.finish(_product(variant, c.present, c.rms, c.act)(c.x, w.packed, scales, w.global_scale, *c.extras))


def fp4_dequantize(w: NVFP4Weight, dtype=jnp.bfloat16) -> jax.Array:
    """The dense [N, K] weight in float16 or bfloat16, decoded by the jaxgemv kernel."""
    check_weight(w, "fp4_dequantize: w")
    dtype = jnp.dtype(dtype)
    if dtype not in _ACT_DTYPES:
        raise TypeError(f"fp4_dequantize: dtype must be float16 or bfloat16, got {dtype}")
    scales = lax.bitcast_convert_type(w.scales, jnp.uint8)
    return _dequantize_p.bind(w.packed, scales, w.global_scale, dtype=dtype, apply_global_scale=True)
