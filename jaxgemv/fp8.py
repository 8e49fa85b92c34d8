"""FP8 block-scaled weights and `fp8_matmul`: y = x @ dequant(W)^T for small M.

Format (two block shapes, both byte-compatible with checkpoints people have):
  data    float8_e4m3fn [N, K]                   one E4M3 code per value
  scales  float32 [ceil(N / bn), ceil(K / bk)]   one per block of bn rows x bk values of K
  block   (bn, bk): (1, bk) with bk in {32, 64, 128, 256} (ONNX Runtime's block-quantized FP8
          weight), or (128, 128) (DeepSeek-V3 / Qwen3-FP8 `weight_scale_inv`)
  value = e4m3 x scale of its block

The CUDA kernels are the NVFP4 tensor-core GEMV's core with an E4M3 decode (blocks of K of 64
values or more), a CUDA-core GEMV for blocks of 32 and K not a multiple of 64 (ffi/fp8.cuh,
ffi/fp8.cu), and on sm_90 the "wgmma" variant, Hopper's FP8 tensor cores with no decode
(ffi/fp8_wgmma.cuh); ffi/fp8_cpu.cc is the CPU handler. All take the scales per row, [N, ceil(K / bk)]: a
(128, 128) weight's scales are repeated over their 128 rows before the call (4 bytes per 128 values, 3% of
the weight's bytes, in one small XLA op that fuses into whatever produced the scales).
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

E4M3_MAX = 448.0
ROW_BLOCKS = (32, 64, 128, 256)  # bk of the (1, bk) layout
BLOCKS = tuple((1, bk) for bk in ROW_BLOCKS) + ((128, 128),)



@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class FP8Weight:
    """An [N, K] weight in E4M3 with float32 block scales; `block` = (bn, bk) is static.

    A pytree of two arrays (data, scales), so it passes through `jit`, can be sharded and can wrap
    arrays loaded from a checkpoint without copying. The block shape travels as static data.
    """

    data: Any
    scales: Any
    block: tuple[int, int] = (1, 128)

    def tree_flatten(self):
        return (self.data, self.scales), tuple(self.block)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, block=tuple(aux))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def partition_layout(self) -> sharding.WeightLayout:
        """The layout its products partition by under pjit, arrays in tree_flatten's order (a
        (bn, bk) block's scales have a row per bn rows; `splits_k` and `jaxgemv.weight_sharding`
        read it)."""
        return _layout(self.block[1])

    def splits_k(self, ways: int) -> bool:
        """Whether a product against this weight partitions with its K sharded `ways` ways
        (row-parallel under pjit: partial products and one all-reduce). K splits only at whole K
        blocks of `block[1]` values; where it cannot, the product gathers K instead (correct,
        with a warning). One way always holds."""
        return self.partition_layout().shards_k(self.shape[1], ways, "FP8Weight.splits_k")

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight as a dense [N, K] array (computed in float32, rounded once to `dtype`)."""
        check_weight(self, "FP8Weight.dequantize: w")
        return dequantize_reference(self).astype(dtype)

    @classmethod
    def from_channel_scales(cls, data, scale, *, block_k: int = 256) -> "FP8Weight":
        """An E4M3 weight with one scale per tensor (a scalar or [1]) or per output row ([N] or [N,
        1]), as per-tensor and per-channel FP8 checkpoints store `weight_scale`, in the (1, block_k)
        layout: each row's scale repeated over its ceil(K / block_k) blocks (4 bytes per block_k
        values: 1.6% of the weight's bytes at 256). Scales in any float type, widened to float32
        (exact)."""
        name = "FP8Weight.from_channel_scales"
        _product_mod.check_arrays(name, data=data, scale=scale)
        if data.ndim != 2:
            raise ValueError(f"{name}: data must be 2-D [N, K], got shape {tuple(data.shape)}")
        if block_k not in ROW_BLOCKS:
            raise ValueError(f"{name}: block_k must be one of {ROW_BLOCKS}, got {block_k}")
        if not jnp.issubdtype(scale.dtype, jnp.floating):
            raise TypeError(f"{name}: scale must be a float array, got {scale.dtype}")
        n, k = data.shape
        shape = tuple(scale.shape)
        if shape in ((), (1,), (1, 1)):
            rows = jnp.broadcast_to(jnp.reshape(scale, ()).astype(jnp.float32), (n, 1))
        elif shape in ((n,), (n, 1)):
            rows = jnp.reshape(scale, (n, 1)).astype(jnp.float32)
        else:
            raise ValueError(f"{name}: scale must be a scalar, [1], [{n}] or [{n}, 1], got shape {shape}")
        w = cls(data, jnp.broadcast_to(rows, _scale_shape(n, k, (1, block_k))), (1, block_k))
        check_weight(w, f"{name}: w")
        return w


jax.export.register_pytree_node_serialization(
    FP8Weight,
    serialized_name="jaxgemv.FP8Weight",
    serialize_auxdata=lambda aux: np.asarray(aux, np.int64).tobytes(),
    deserialize_auxdata=lambda data: tuple(int(v) for v in np.frombuffer(data, np.int64)),
)


def _scale_shape(n: int, k: int, block: tuple[int, int]) -> tuple[int, int]:
    bn, bk = block
    return -(-n // bn), -(-k // bk)


def check_weight(w: Any, name: str) -> None:
    """Raises TypeError/ValueError naming `name` unless `w` is a well-formed FP8Weight."""
    if not isinstance(w, FP8Weight):
        raise TypeError(f"{name} must be a jaxgemv.FP8Weight, got {type(w).__name__}")
    _product_mod.check_arrays(name, data=w.data, scales=w.scales)
    block = tuple(w.block)
    if block not in BLOCKS:
        raise ValueError(f"{name}.block must be one of {BLOCKS}, got {block}")
    data, scales = w.data, w.scales
    if jnp.dtype(data.dtype) != jnp.float8_e4m3fn or data.ndim != 2:
        raise TypeError(f"{name}.data must be float8_e4m3fn [N, K], got {data.dtype} {tuple(data.shape)}")
    n, k = data.shape
    if k == 0:
        raise ValueError(f"{name}: K must be positive")
    want = _scale_shape(n, k, block)
    if jnp.dtype(scales.dtype) != jnp.float32 or tuple(scales.shape) != want:
        raise TypeError(
            f"{name}.scales must be float32 {list(want)} for block {block}, got {scales.dtype} {tuple(scales.shape)}"
        )


def quantize_fp8(w: jax.Array, block: tuple[int, int] = (1, 128)) -> FP8Weight:
    """Quantizes a float [N, K] weight to E4M3 with float32 block scales.

    Each block's scale is its absolute maximum / 448 (so the block uses the whole E4M3 range),
    and each value is divided by its scale and rounded to the nearest E4M3 value, ties to even.
    Ragged tails are fine: the last block of a row or column may be partial.
    """
    w = jnp.asarray(w)
    block = tuple(block)
    if block not in BLOCKS:
        raise ValueError(f"quantize_fp8: block must be one of {BLOCKS}, got {block}")
    if w.ndim != 2:
        raise ValueError(f"quantize_fp8: w must be 2-D [N, K], got shape {w.shape}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"quantize_fp8: w must be a float array, got {w.dtype}")
    n, k = w.shape
    if n == 0 or k == 0:
        raise ValueError(f"quantize_fp8: w must be non-empty, got shape {w.shape}")
    bn, bk = block
    sn, sk = _scale_shape(n, k, block)
    w32 = jnp.pad(w.astype(jnp.float32), ((0, sn * bn - n), (0, sk * bk - k)))
    amax = jnp.max(jnp.abs(w32.reshape(sn, bn, sk, bk)), axis=(1, 3))
    scales = (amax / E4M3_MAX).astype(jnp.float32)
    full = jnp.repeat(jnp.repeat(scales, bn, axis=0), bk, axis=1)
    q = jnp.where(full > 0, w32 / jnp.where(full > 0, full, 1.0), 0.0)
    data = jnp.clip(q, -E4M3_MAX, E4M3_MAX)[:n, :k].astype(jnp.float8_e4m3fn)
    return FP8Weight(data, scales, block)


def row_scales(w: FP8Weight) -> jax.Array:
    """float32 [N, ceil(K / bk)]: the block scales repeated over their rows (what the kernels take)."""
    bn = w.block[0]
    if bn == 1:
        return w.scales
    return jnp.repeat(w.scales, bn, axis=0)[: w.data.shape[0]]


def dequantize_reference(w: FP8Weight) -> jax.Array:
    """float32 [N, K] weight in plain jnp: the fallback and the tests' reference."""
    k = w.data.shape[1]
    scales = jnp.repeat(row_scales(w), w.block[1], axis=1)[:, :k]
    return w.data.astype(jnp.float32) * scales


def fp8_matmul_reference(x: jax.Array, w: FP8Weight, bias: jax.Array | None = None, row_scale=None,
                         residual=None, rms_eps=None, activation=None) -> jax.Array:
    """fp8_matmul in plain jnp with float32 accumulation."""
    return _product_mod.reference_product(x, dequantize_reference(w), bias, row_scale, residual, rms_eps, activation)


# ----------------------------------------------------------------------------------------------
# Primitive: x [M, K], data as uint8 [N, K], row scales float32 [N, ceil(K / bk)], then the
# epilogue operands (jaxgemv/_product.py: EPILOGUE), empty when absent.

_matmul_p = Primitive("jaxgemv_fp8_matmul")


def _matmul_abstract(x, data, scales, bias, row_scale, residual, *, variant, block_k, rms, act):
    del scales, bias, row_scale, residual, variant, block_k, rms
    return jax.core.ShapedArray((x.shape[0], _product_mod.out_cols(data.shape[0], act)), x.dtype)


_matmul_p.def_abstract_eval(_matmul_abstract)


_matmul_p.def_impl(_product_mod.eager_impl(_matmul_p))


def _dense(data_u8, scales, block_k: int, dtype) -> jax.Array:
    """The weight as [N, K] in `dtype`: e4m3 x scale in float32, rounded once."""
    k = data_u8.shape[1]
    codes = lax.bitcast_convert_type(data_u8, jnp.float8_e4m3fn).astype(jnp.float32)
    return (codes * jnp.repeat(scales, block_k, axis=1)[:, :k]).astype(dtype)


def _dequant_then_dot(x, data, scales, bias, row_scale, residual, *, block_k, rms, act):
    """Above the GEMV range (and for shapes the kernel does not take): decode W into x's dtype,
    then XLA's dot with float32 accumulation."""
    w = _dense(data, scales, block_k, x.dtype)
    y = lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return _product_mod.apply_epilogue(y, bias, row_scale, residual, x.dtype, rms, act)


def _ffi_matmul(plan: planner.Plan, block_k: int, rms, act):
    def call(x, data, scales, bias, row_scale, residual):
        out = jax.ShapeDtypeStruct((x.shape[0], _product_mod.out_cols(data.shape[0], act)), x.dtype)
        row_scale = _product_mod.kernel_row_scale(plan, x, row_scale, rms)
        x, attrs = _product_mod.kernel_inputs(plan, x, rms, act, values_per_chunk=16, compact=True)
        return jax.ffi.ffi_call("jaxgemv_fp8_matmul", out)(
            x, data, scales, bias, row_scale, residual, **attrs, block_k=np.int64(block_k),
        )

    return call


WGMMA_MIN_WINDOWS = 4  # ffi/fp8_wgmma.cuh: kWgMinWindows


def wgmma_ksplit(k: int, ksplit: int) -> int:
    """The K split the wgmma launcher runs (ffi/fp8_wgmma.cuh: WgKSplit): a forced one (the plan's
    ksplit) at most one block a window of 128 values, else the largest of 8, 4, 2 that leaves every
    block WGMMA_MIN_WINDOWS windows, else 1."""
    windows = k // 128
    if ksplit > 0:
        return min(ksplit, windows)
    return next((ks for ks in (8, 4, 2) if windows >= WGMMA_MIN_WINDOWS * ks), 1)


def wgmma_scratch_bytes(m: int, n: int, k: int, ksplit: int) -> int:
    """Bytes of the wgmma variant's scratch result (ffi/fp8_wgmma.cuh: WgScratchBytes): with a K
    split, float32 sums per 64-row tile, split, row of x and tile row, then an int32 counter per
    tile; 16 bytes without one."""
    ks, tiles = wgmma_ksplit(k, ksplit), -(-n // 64)
    return tiles * ks * m * 64 * 4 + tiles * 4 if ks > 1 else 16


def _ffi_wgmma(plan: planner.Plan, block_k: int, rms):
    def call(x, data, scales, bias, row_scale, residual):
        (m, k), n = x.shape, data.shape[0]
        out = jax.ShapeDtypeStruct((m, n), x.dtype)
        scratch = jax.ShapeDtypeStruct((wgmma_scratch_bytes(m, n, k, plan.ksplit),), jnp.uint8)
        eps, inv_k = rms if rms is not None else (-1.0, 0.0)
        y, _ = jax.ffi.ffi_call("jaxgemv_fp8_wgmma", (out, scratch))(
            x, data, scales, bias, row_scale, residual, ksplit=np.int64(plan.ksplit), rms_eps=np.float32(eps),
            rms_inv_k=np.float32(inv_k), activation=np.int64(0), block_k=np.int64(block_k))
        return y

    return call


def _matmul_lowering(platform):
    def rule(ctx, x, data, scales, bias, row_scale, residual, *, variant, block_k, rms, act):
        m, k = ctx.avals_in[0].shape
        n = ctx.avals_in[1].shape[0]
        plan = _product_mod.with_activation(
            planner.plan_fp8(m, n, k, block_k, facts_for_lowering(ctx, platform), variant, act), act)
        if plan.variant == "wgmma":
            fun = _ffi_wgmma(plan, block_k, rms)
        elif plan.variant == "dequant":
            fun = functools.partial(_dequant_then_dot, block_k=block_k, rms=rms, act=act)
        else:
            fun = _ffi_matmul(plan, block_k, rms, act)
        return mlir.lower_fun(fun, multiple_results=False)(ctx, x, data, scales, bias, row_scale, residual)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_matmul_p, _matmul_lowering(_platform), platform=_platform)


@functools.lru_cache(maxsize=None)
def _per_device(variant: str, block_k: int, rms, act=None):
    return functools.partial(_bind_per_device, variant=variant, block_k=block_k, rms=rms, act=act)


def _bind_per_device(x, data, scales, bias, row_scale, residual, *, variant, block_k, rms, act):
    return _matmul_p.bind(x, data, scales, bias, row_scale, residual, variant=variant, block_k=block_k, rms=rms,
                          act=act)


@functools.lru_cache(maxsize=None)
def _layout(block_k: int) -> sharding.WeightLayout:
    # data [N, K]: bk bytes per block; row scales [N, ceil(K / bk)]: one. K is split only at block
    # boundaries; with a ragged last block the rule keeps K whole (sharding.WeightLayout) and
    # the weight partitions on N alone.
    return sharding.WeightLayout(leaves=(("n", ("k", block_k)), ("n", ("k", 1))), block=block_k)


@functools.lru_cache(maxsize=None)
def _product(variant: str, present: tuple[bool, bool, bool], block_k: int, k: int, rms=None, act=None):
    layout = _layout(block_k)
    dense = lambda leaves, dtype: (_dense(leaves[0], leaves[1], block_k, dtype), None)  # noqa: E731
    return _product_mod.build(_per_device(variant, block_k, rms, act), layout, present, "fp8_matmul",
                              ("data", "scales"), dense, rms=rms, act=act,
                              plain_per_device=_per_device(variant, block_k, rms))


# ----------------------------------------------------------------------------------------------
# Public API


def fp8_matmul(x: jax.Array, w: FP8Weight, *, bias: jax.Array | None = None, row_scale: jax.Array | None = None,
               residual: jax.Array | None = None, rms_eps: float | None = None, activation: str | None = None,
               variant: str = "auto") -> jax.Array:
    """y = (x @ dequant(w)^T) * row_scale + bias + residual with float32 accumulation, rounded
    once; each of the three optional (see fp4_matmul).

    Args:
      x: float16 or bfloat16 [..., K]; leading dimensions fold into M.
      w: an FP8Weight of shape [N, K].
      bias: optional [N] in x's dtype, added once after the product.
      row_scale: optional [...] (x's leading shape), one float per row of x, multiplying that
        row's float32 product before the bias: an RMSNorm in front of the product is
        rsqrt(mean(x^2) + eps) here, with the norm's gain folded into w's columns.
      residual: optional [..., N] in x's dtype, added last (a residual connection).
      rms_eps: optional number (static), instead of row_scale: an RMSNorm in front of the
        product, its gain folded into w's columns; the row scale is rsqrt(mean(x^2) + rms_eps)
        (see fp4_matmul).
      activation: None, or "swiglu" (gate and up rows interleaved by 8; y is [..., N / 2]; see
        fp4_matmul).
      variant: "auto" (the planner), or "mma", "wgmma", "scalar", "dequant" (CUDA) / "cpu",
        "dequant" (CPU) to force a path. "wgmma" runs Hopper's FP8 tensor cores on the codes as
        they are, x split into E4M3 planes (ffi/fp8_wgmma.cuh; compute capability 9.0, M <= 8, K a
        multiple of 128, no activation). JAXGEMV_VARIANT in the environment does the same when
        this is "auto" (JAXGEMV_VARIANT=wgmma leaves what it cannot run to the planner).

    Returns:
      [..., N] in x's dtype ([..., N / 2] with activation="swiglu").
    """
    check_weight(w, "fp8_matmul: w")
    n, k = w.shape
    c = _product_mod.prepare_call("fp8_matmul", x, n, k, bias, variant, planner.FP8_VARIANTS, row_scale=row_scale,
                                  residual=residual, rms_eps=rms_eps, activation=activation)
    if c.empty:
        return c.finish(None)
    data = lax.bitcast_convert_type(w.data, jnp.uint8)
    return c.finish(_product(variant, c.present, w.block[1], k, c.rms, c.act)(c.x, data, row_scales(w), *c.extras))
