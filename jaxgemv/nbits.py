"""int4 / int8 block-quantized weights in ONNX Runtime's MatMulNBits layout: `int4_matmul`,
`int8_matmul`.

Format (ONNX-quantized weights load as they are):
  packed       uint8 [N, ceil(K/bs), bs * bits / 8]   codes; for 4 bits the first value of each
                                                      pair in the low nibble
  scales       float16/bfloat16 [N, ceil(K/bs)]       one per block, in x's dtype
  zero_points  uint8 [N, ceil(ceil(K/bs) * bits / 8)] packed the same way, or None: 2^(bits-1)
  value = (q - zero_point) x scale;  bs (block_size) in {16, 32, 64, 128, 256}

ffi/nbits_cpu.cc is the CPU handler; on CUDA the tensor-core GEMV of the shared core runs with the
4-bit or 8-bit decode (ffi/nbits.cuh, ffi/nbits.cu) up to M = 32 (planner.NBITS_GEMV_MAX_M), and
decode-then-dot beyond it or where K does not fit the kernel's window. variant="imma" runs the
integer tensor cores instead (ffi/imma.cuh, ffi/imma.cu) at M = 1-8, and variant="xshare" a
kernel whose blocks share x's window between their warps (ffi/xshare.cuh, ffi/xshare.cu) at M =
1-16.
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

BLOCK_SIZES = (16, 32, 64, 128, 256)
BITS = (4, 8)
_ACT_DTYPES = _product_mod.ACT_DTYPES


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class NBitsWeight:
    """An [N, K] weight quantized to `bits` per value in blocks of `block_size` along K.

    A pytree of its arrays (packed, scales and, when present, zero_points and k_order); bits,
    block_size and K travel as static data (K is not recoverable from the padded packed array).

    k_order: None, or int32 [K] for a weight stored with its K reordered (GPTQ act-order
    checkpoints, `from_gptq`): stored column j is the weight's column k_order[j]. The products
    then read x[..., k_order] (a gather of M x K values before the kernel), and `dequantize`
    returns the columns in the weight's own order.
    """

    packed: Any
    scales: Any
    zero_points: Any = None
    bits: int = 4
    block_size: int = 32
    k: int = 0
    k_order: Any = None

    def tree_flatten(self):
        # Four children whatever is absent (None is an empty subtree), so that the structure does
        # not depend on the values: a tree mapped to None leaves (as jit does with out_shardings)
        # unflattens to the same structure.
        return (self.packed, self.scales, self.zero_points, self.k_order), (self.bits, self.block_size, self.k)

    @classmethod
    def tree_unflatten(cls, aux, children):
        bits, block_size, k = aux[:3]
        if len(aux) == 3:
            return cls(children[0], children[1], children[2], bits, block_size, k, children[3])
        # Exports written before the four fixed children: only the present arrays, flagged in aux.
        has_zp, has_order = aux[3], aux[4] if len(aux) > 4 else False
        zp = children[2] if has_zp else None
        order = children[-1] if has_order else None
        return cls(children[0], children[1], zp, bits, block_size, k, order)

    @property
    def shape(self) -> tuple[int, int]:
        return self.packed.shape[0], self.k

    def partition_layout(self) -> sharding.WeightLayout:
        """The layout its products partition by under pjit, arrays in tree_flatten's order
        (k_order, past its arrays, stays whole; `splits_k` and `jaxgemv.weight_sharding` read
        it)."""
        return _layout(self.bits, self.block_size, self.zero_points is not None)

    def splits_k(self, ways: int) -> bool:
        """Whether a product against this weight partitions with its K sharded `ways` ways
        (row-parallel under pjit: partial products and one all-reduce). K splits only at whole
        blocks, in pairs for 4-bit codes with zero points (a zero-point byte holds two blocks');
        where it cannot, the product gathers K instead (correct, with a warning). One way always
        holds."""
        return self.partition_layout().shards_k(self.k, ways, "NBitsWeight.splits_k")

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight as a dense [N, K] array (computed in float32, exact, rounded once to `dtype`)."""
        check_weight(self, "NBitsWeight.dequantize: w")
        return dequantize_reference(self).astype(dtype)

    @classmethod
    def from_matmulnbits(cls, b, scales, zero_points=None, *, k: int, bits: int = 4, block_size: int) -> "NBitsWeight":
        """The weight of an ONNX MatMulNBits node from its inputs and attributes as the model stores
        them: `b` uint8 [N, ceil(K/bs), bs * bits / 8]; `scales` [N * ceil(K/bs)] (flat, as ONNX
        Runtime's exporters write it) or [N, ceil(K/bs)]; `zero_points` packed uint8, flat or 2-D, or
        None. Only reshapes (no copy of the codes); zero points stored unpacked in a float type are
        not this layout and are refused."""
        name = "NBitsWeight.from_matmulnbits"
        _product_mod.check_arrays(name, b=b, scales=scales,
                                  **({} if zero_points is None else {"zero_points": zero_points}))
        if b.ndim != 3:
            raise ValueError(f"{name}: b must be 3-D [N, blocks, block_size * bits / 8], got shape {tuple(b.shape)}")
        if bits not in BITS or block_size not in BLOCK_SIZES:
            raise ValueError(f"{name}: bits must be 4 or 8 and block_size one of {BLOCK_SIZES}, got {bits}, {block_size}")
        n, blocks = int(b.shape[0]), int(b.shape[1])
        if int(np.prod(scales.shape)) != n * blocks:
            raise ValueError(f"{name}: scales must hold N x blocks = {n} x {blocks} values, got shape {tuple(scales.shape)}")
        scales = scales.reshape(n, blocks)
        if zero_points is not None:
            if jnp.dtype(zero_points.dtype) != jnp.uint8:
                raise TypeError(f"{name}: zero_points must be packed uint8 (MatMulNBits' packed layout), got "
                                f"{zero_points.dtype}")
            cols = _zp_cols(blocks, bits)
            if int(np.prod(zero_points.shape)) != n * cols:
                raise ValueError(f"{name}: zero_points must hold N x ceil(blocks x bits / 8) = {n} x {cols} bytes, "
                                 f"got shape {tuple(zero_points.shape)}")
            zero_points = zero_points.reshape(n, cols)
        w = cls(b, scales, zero_points, bits, block_size, int(k))
        check_weight(w, f"{name}: w")
        return w

    @classmethod
    def from_gptq(cls, qweight, qzeros, scales, *, bits: int = 4, group_size: int, g_idx=None, zero_offset: int = 1,
                  scale_dtype=None) -> "NBitsWeight":
        """A GPTQ checkpoint's layer (qweight int32 [K / (32 / bits), N], qzeros int32 [groups, N / (32 /
        bits)], scales [groups, N], g_idx optional), repacked into this layout: codes along K,
        zero points stored plus `zero_offset` (1 in GPTQ's original format, 0 in "gptq_v2"), none
        kept where all are 2^(bits-1). group_size -1 is one group per row; groups past 256 values
        repeat their scale over blocks of 128.

        Act-order (desc_act) checkpoints, whose g_idx permutes the groups along K: the weight is
        stored with K reordered so that each group's values are consecutive, and carries that
        order (`k_order`); the products take x as it is and gather it into that order (M x K
        values per call), and `dequantize` gives the checkpoint's own order.

        Runs outside jit, on the host (jaxgemv/checkpoints.py); scales keep their fp16/bf16 type
        unless `scale_dtype` (x's dtype, which the products require of the scales) says otherwise:
        fp16 scales taken to bf16 round to 8 significant bits."""
        from jaxgemv import checkpoints

        return checkpoints.from_gptq(qweight, qzeros, scales, bits=bits, group_size=group_size, g_idx=g_idx,
                                     zero_offset=zero_offset, scale_dtype=scale_dtype)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, *, group_size: int, scale_dtype=None) -> "NBitsWeight":
        """An AWQ (GEMM layout) checkpoint's layer: qweight int32 [K, N / 8] with each word's eight
        codes interleaved, qzeros int32 [groups, N / 8] packed the same way, scales [groups, N];
        repacked into this layout as from_gptq does (4-bit codes)."""
        from jaxgemv import checkpoints

        return checkpoints.from_awq(qweight, qzeros, scales, group_size=group_size, scale_dtype=scale_dtype)


def _deserialize_aux(data: bytes) -> tuple:
    """(bits, block_size, k) from an export; exports written before the four fixed children carry
    (bits, block_size, k, has_zp, has_order), and those before k_order the first four of them."""
    v = [int(a) for a in np.frombuffer(data, np.int64)]
    if len(v) == 3:
        return tuple(v)
    return v[0], v[1], v[2], bool(v[3]), bool(v[4]) if len(v) > 4 else False


jax.export.register_pytree_node_serialization(
    NBitsWeight,
    serialized_name="jaxgemv.NBitsWeight",
    serialize_auxdata=lambda aux: np.asarray(aux, np.int64).tobytes(),
    deserialize_auxdata=_deserialize_aux,
)


def _zp_cols(blocks: int, bits: int) -> int:
    return -(-blocks * bits // 8)


def check_weight(w: Any, name: str, bits: int | None = None) -> None:
    """Raises TypeError/ValueError naming `name` unless `w` is a well-formed NBitsWeight."""
    if not isinstance(w, NBitsWeight):
        raise TypeError(f"{name} must be a jaxgemv.NBitsWeight, got {type(w).__name__}")
    _product_mod.check_arrays(name, packed=w.packed, scales=w.scales,
                              **({} if w.zero_points is None else {"zero_points": w.zero_points}))
    if w.bits not in BITS:
        raise ValueError(f"{name}.bits must be 4 or 8, got {w.bits}")
    if bits is not None and w.bits != bits:
        raise ValueError(f"{name} holds {w.bits}-bit codes; this product takes {bits}-bit weights")
    if w.block_size not in BLOCK_SIZES:
        raise ValueError(f"{name}.block_size must be one of {BLOCK_SIZES}, got {w.block_size}")
    bs, k = w.block_size, w.k
    if k <= 0:
        raise ValueError(f"{name}.k must be positive, got {k}")
    packed = w.packed
    if jnp.dtype(packed.dtype) != jnp.uint8 or packed.ndim != 3:
        raise TypeError(f"{name}.packed must be uint8 [N, blocks, block_size * bits / 8], got {packed.dtype} "
                        f"{tuple(packed.shape)}")
    n, blocks = packed.shape[0], -(-k // bs)
    want = (n, blocks, bs * w.bits // 8)
    if tuple(packed.shape) != want:
        raise ValueError(f"{name}.packed must be {list(want)} for K = {k}, got {list(packed.shape)}")
    if jnp.dtype(w.scales.dtype) not in _ACT_DTYPES or tuple(w.scales.shape) != (n, blocks):
        raise TypeError(f"{name}.scales must be float16 or bfloat16 [{n}, {blocks}], got {w.scales.dtype} "
                        f"{tuple(w.scales.shape)}")
    if w.zero_points is not None:
        zp = w.zero_points
        want_zp = (n, _zp_cols(blocks, w.bits))
        if jnp.dtype(zp.dtype) != jnp.uint8 or tuple(zp.shape) != want_zp:
            raise TypeError(f"{name}.zero_points must be uint8 {list(want_zp)} or None, got {zp.dtype} "
                            f"{tuple(zp.shape)}")
    if w.k_order is not None:
        order = w.k_order
        if not (hasattr(order, "dtype") and hasattr(order, "shape")):
            raise TypeError(f"{name}.k_order must be an array, got {type(order).__name__}")
        if jnp.dtype(order.dtype) != jnp.int32 or tuple(order.shape) != (k,):
            raise TypeError(f"{name}.k_order must be int32 [{k}] (a permutation of K) or None, got {order.dtype} "
                            f"{tuple(order.shape)}")


def _pack(codes: jax.Array, bits: int) -> jax.Array:
    """uint8 codes [..., L] (L even for 4 bits) packed along the last axis, low nibble first."""
    if bits == 8:
        return codes.astype(jnp.uint8)
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(jnp.uint8)


def _unpack(packed: jax.Array, bits: int) -> jax.Array:
    """The inverse of _pack: uint8 codes [..., L]."""
    if bits == 8:
        return packed
    return jnp.stack([packed & 15, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def _quantize(w: jax.Array, bits: int, block_size: int, symmetric: bool, scale_dtype, name: str) -> NBitsWeight:
    w = jnp.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"{name}: w must be 2-D [N, K], got shape {w.shape}")
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise TypeError(f"{name}: w must be a float array, got {w.dtype}")
    if block_size not in BLOCK_SIZES:
        raise ValueError(f"{name}: block_size must be one of {BLOCK_SIZES}, got {block_size}")
    if jnp.dtype(scale_dtype) not in _ACT_DTYPES:
        raise TypeError(f"{name}: scale_dtype must be float16 or bfloat16, got {scale_dtype}")
    n, k = w.shape
    if n == 0 or k == 0:
        raise ValueError(f"{name}: w must be non-empty, got shape {w.shape}")
    blocks = -(-k // block_size)
    qmax = (1 << bits) - 1
    w32 = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, blocks * block_size - k))).reshape(n, blocks, block_size)
    if symmetric:
        half = 1 << (bits - 1)
        amax = jnp.max(jnp.abs(w32), axis=-1)
        scales = (amax / (half - 1)).astype(scale_dtype)
        zp = jnp.full((n, blocks), half, jnp.int32)
    else:
        lo = jnp.minimum(jnp.min(w32, axis=-1), 0.0)
        hi = jnp.maximum(jnp.max(w32, axis=-1), 0.0)
        scales = ((hi - lo) / qmax).astype(scale_dtype)
        s32 = scales.astype(jnp.float32)
        zp = jnp.clip(jnp.round(jnp.where(s32 > 0, -lo / jnp.where(s32 > 0, s32, 1.0), 0.0)), 0, qmax).astype(jnp.int32)
    # A scale past the scale type's range rounds to infinity and decodes to NaN; said here where the
    # values are known (under jit the weight stays as it is: quantize eagerly to be told).
    try:
        wide = np.asarray(jnp.isinf(scales) & jnp.isfinite(jnp.max(jnp.abs(w32), axis=-1)))
    except jax.errors.TracerArrayConversionError:
        wide = None
    if wide is not None and wide.any():
        raise ValueError(f"{name}: block scales overflow scale_dtype {jnp.dtype(scale_dtype).name} (largest "
                         f"{float(jnp.finfo(scale_dtype).max)}; the weight reaches {float(jnp.max(jnp.abs(w32)))}): "
                         "use scale_dtype=bfloat16 or scale the weight down")
    s32 = scales.astype(jnp.float32)[..., None]
    q = jnp.where(s32 > 0, jnp.round(w32 / jnp.where(s32 > 0, s32, 1.0)), 0.0) + zp[..., None]
    codes = jnp.clip(q, 0, qmax).astype(jnp.uint8)
    packed = _pack(codes, bits)
    zero_points = None
    if not symmetric:
        zcodes = zp.astype(jnp.uint8)
        if bits == 4 and blocks % 2:
            zcodes = jnp.pad(zcodes, ((0, 0), (0, 1)))
        zero_points = _pack(zcodes, bits)
    return NBitsWeight(packed, scales, zero_points, bits, block_size, k)


def quantize_int4(w: jax.Array, block_size: int = 32, symmetric: bool = True, scale_dtype=jnp.bfloat16) -> NBitsWeight:
    """Quantizes a float [N, K] weight to 4 bits per value in MatMulNBits layout.

    Symmetric: scale = block amax / 7, no zero points stored (2^3 implied). Asymmetric: scale =
    (max - min) / 15 over the block (range widened to include 0), zero point = round(-min /
    scale). Values round to nearest, ties to even, and clip to [0, 15]. The last block of a row may
    be partial (zero padded).
    """
    return _quantize(w, 4, block_size, symmetric, scale_dtype, "quantize_int4")


def quantize_int8(w: jax.Array, block_size: int = 32, symmetric: bool = True, scale_dtype=jnp.bfloat16) -> NBitsWeight:
    """As quantize_int4, with 8 bits: symmetric scale = amax / 127 (zero point 128), asymmetric
    (max - min) / 255."""
    return _quantize(w, 8, block_size, symmetric, scale_dtype, "quantize_int8")


def _zero_points(w_bits: int, zero_points, n: int, blocks: int) -> jax.Array:
    """int32 [N, blocks]: unpacked zero points, or the implied 2^(bits-1)."""
    if zero_points is None:
        return jnp.full((n, blocks), 1 << (w_bits - 1), jnp.int32)
    return _unpack(zero_points, w_bits)[:, :blocks].astype(jnp.int32)


def _dense(packed, scales, zero_points, *, bits, block_size, k, dtype) -> jax.Array:
    """(q - zp) x scale as [N, K] in `dtype`: exact in float32, rounded once."""
    n, blocks = packed.shape[0], packed.shape[1]
    codes = _unpack(packed, bits).astype(jnp.int32)  # [N, blocks, bs]
    zp = _zero_points(bits, zero_points, n, blocks)
    vals = (codes - zp[..., None]).astype(jnp.float32) * scales.astype(jnp.float32)[..., None]
    return vals.reshape(n, blocks * block_size)[:, :k].astype(dtype)


def dequantize_reference(w: NBitsWeight) -> jax.Array:
    """float32 [N, K] weight in plain jnp, its columns in the weight's own order (k_order
    undone): the fallback and the tests' reference."""
    stored = _dense(w.packed, w.scales, w.zero_points, bits=w.bits, block_size=w.block_size, k=w.k,
                    dtype=jnp.float32)
    if w.k_order is None:
        return stored
    # Column c of the weight is stored column inverse[c]: a scatter of K indices, then a gather
    # of N x K values (instead of scattering the N x K values themselves).
    inverse = jnp.zeros_like(w.k_order).at[w.k_order].set(jnp.arange(w.k, dtype=w.k_order.dtype))
    return jnp.take(stored, inverse, axis=1)


# ----------------------------------------------------------------------------------------------
# Primitive: x [M, K], packed, scales, zero points ([0] when absent), then the epilogue operands
# (jaxgemv/_product.py: EPILOGUE), empty when absent.

_matmul_p = Primitive("jaxgemv_nbits_matmul")


def _matmul_abstract(x, packed, scales, zp, bias, row_scale, residual, *, variant, bits, block_size, has_zp, rms,
                     act):
    del scales, zp, bias, row_scale, residual, variant, bits, block_size, has_zp, rms
    return jax.core.ShapedArray((x.shape[0], _product_mod.out_cols(packed.shape[0], act)), x.dtype)


_matmul_p.def_abstract_eval(_matmul_abstract)


_matmul_p.def_impl(_product_mod.eager_impl(_matmul_p))


def _dequant_then_dot(x, packed, scales, zp, bias, row_scale, residual, *, bits, block_size, has_zp, rms, act):
    w = _dense(packed, scales, zp if has_zp else None, bits=bits, block_size=block_size, k=x.shape[1], dtype=x.dtype)
    y = lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return _product_mod.apply_epilogue(y, bias, row_scale, residual, x.dtype, rms, act)


def imma_scratch_bytes(k: int, block_size: int, m: int) -> int:
    """Bytes of the imma variant's scratch result (ffi/imma.cuh: ImmaScratchBytes): x's three
    planes, 32 bytes per group of 32 values (K padded to whole blocks) and row, then 128 bytes of
    factors."""
    groups = -(-k // block_size) * block_size // 32
    return groups * 3 * m * 32 + 128


def xshare_warps(bits: int, m: int) -> int:
    """Warps a block of the xshare variant's instance for `bits` and M (ffi/xshare.cuh: XshareWarps)."""
    return 4 if bits == 8 or m <= 8 else 8


def xshare_scratch_bytes(m: int, n: int, bits: int) -> int:
    """Bytes of the xshare variant's scratch result (ffi/xshare.cuh: XshareScratchBytes): float32
    sums for M rows of x and N rounded up to whole tile groups (16 rows a warp)."""
    warps = xshare_warps(bits, m)
    return 4 * m * (-(-n // (16 * warps)) * 16 * warps)


def xshare_pair_order(x, bits: int):
    """x [M, K] with each 8 values in the xshare decode's pair order: (0, 4, 1, 5, 2, 6, 3, 7) for
    4-bit codes, (0, 2, 1, 3, 4, 6, 5, 7) for 8-bit ones."""
    m, k = x.shape
    if bits == 4:
        return x.reshape(m, k // 8, 2, 4).swapaxes(-1, -2).reshape(m, k)
    return x.reshape(m, k // 8, 2, 2, 2).swapaxes(-1, -2).reshape(m, k)


def _matmul_lowering(platform):
    def rule(ctx, x, packed, scales, zp, bias, row_scale, residual, *, variant, bits, block_size, has_zp, rms, act):
        m, k = ctx.avals_in[0].shape
        n = ctx.avals_in[1].shape[0]
        plan = planner.plan_nbits(m, n, k, bits, block_size, facts_for_lowering(ctx, platform), variant, has_zp, act)
        if plan.variant == "imma":
            def fun(x, packed, scales, zp, bias, row_scale, residual):
                out = jax.ShapeDtypeStruct((x.shape[0], n), x.dtype)
                scratch = jax.ShapeDtypeStruct((imma_scratch_bytes(k, block_size, x.shape[0]),), jnp.uint8)
                eps, inv_k = rms if rms is not None else (-1.0, 0.0)
                y, _ = jax.ffi.ffi_call("jaxgemv_nbits_imma", (out, scratch))(
                    x, packed, scales, zp, bias, row_scale, residual, ksplit=np.int64(plan.ksplit),
                    loads=np.int64(plan.loads), rms_eps=np.float32(eps), rms_inv_k=np.float32(inv_k),
                    activation=np.int64(0), bits=np.int64(bits), block_size=np.int64(block_size),
                    has_zp=np.int64(has_zp))
                return y
        elif plan.variant == "xshare":
            def fun(x, packed, scales, zp, bias, row_scale, residual):
                out = jax.ShapeDtypeStruct((x.shape[0], n), x.dtype)
                scratch = jax.ShapeDtypeStruct((xshare_scratch_bytes(x.shape[0], n, bits),), jnp.uint8)
                eps, inv_k = rms if rms is not None else (-1.0, 0.0)
                y, _ = jax.ffi.ffi_call("jaxgemv_nbits_xshare", (out, scratch))(
                    xshare_pair_order(x, bits), packed, scales, zp, bias, row_scale, residual, rms_eps=np.float32(eps),
                    rms_inv_k=np.float32(inv_k), bits=np.int64(bits), block_size=np.int64(block_size),
                    has_zp=np.int64(has_zp))
                return y
        elif plan.variant == "dequant":
            fun = functools.partial(_dequant_then_dot, bits=bits, block_size=block_size, has_zp=has_zp, rms=rms,
                                    act=act)
        else:
            def fun(x, packed, scales, zp, bias, row_scale, residual):
                out = jax.ShapeDtypeStruct((x.shape[0], _product_mod.out_cols(packed.shape[0], act)), x.dtype)
                row_scale = _product_mod.kernel_row_scale(plan, x, row_scale, rms)
                x, attrs = _product_mod.kernel_inputs(plan, x, rms, act, values_per_chunk=128 // bits, compact=False)
                return jax.ffi.ffi_call("jaxgemv_nbits_matmul", out)(
                    x, packed, scales, zp, bias, row_scale, residual, **attrs,
                    bits=np.int64(bits), block_size=np.int64(block_size), has_zp=np.int64(has_zp))
        return mlir.lower_fun(fun, multiple_results=False)(ctx, x, packed, scales, zp, bias, row_scale, residual)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_matmul_p, _matmul_lowering(_platform), platform=_platform)


@functools.lru_cache(maxsize=None)
def _per_device(variant: str, bits: int, block_size: int, has_zp: bool, rms, act=None):
    return functools.partial(_bind_per_device, variant=variant, bits=bits, block_size=block_size, has_zp=has_zp,
                             rms=rms, act=act)


def _bind_per_device(x, packed, scales, zp, bias, row_scale, residual, *, variant, bits, block_size, has_zp, rms, act):
    return _matmul_p.bind(x, packed, scales, zp, bias, row_scale, residual, variant=variant, bits=bits, block_size=block_size,
                          has_zp=has_zp, rms=rms, act=act)


@functools.lru_cache(maxsize=None)
def _layout(bits: int, block_size: int, has_zp: bool) -> sharding.WeightLayout:
    """How the arrays partition: on N (and x's M), and on K (row-parallel: partial products summed
    in float32) at whole blocks, where K holds a whole number of them: packed [N, blocks, bytes]
    on blocks, scales [N, blocks] alike, zero points [N, packed blocks] by their bytes. 4-bit zero
    points pack two blocks per byte, so with them K splits in pairs of blocks (a shard with an odd
    number of blocks would start inside a byte); the [0] placeholder of absent zero points stays
    whole. A K that cannot split so (a ragged last block, or blocks that the mesh axis does not
    divide) is kept whole: the weight is gathered along K (correct, slower; with a warning)."""
    pair = 2 if bits == 4 and has_zp else 1
    zp = ("n", ("k", 1)) if has_zp else ("z",)
    return sharding.WeightLayout(leaves=(("n", ("k", pair), "w"), ("n", ("k", pair)), zp), block=pair * block_size)


@functools.lru_cache(maxsize=None)
def _product(variant: str, present: tuple[bool, bool, bool], bits: int, block_size: int, has_zp: bool, k: int, name: str,
             rms=None, act=None):
    layout = _layout(bits, block_size, has_zp)

    def dense(leaves, dtype):
        packed, scales, zp = leaves
        return _dense(packed, scales, zp if has_zp else None, bits=bits, block_size=block_size, k=k, dtype=dtype), None

    return _product_mod.build(_per_device(variant, bits, block_size, has_zp, rms, act), layout, present, name,
                              ("packed", "scales", "zero_points"), dense, rms=rms, act=act,
                              plain_per_device=_per_device(variant, bits, block_size, has_zp, rms))


def _matmul(x, w: NBitsWeight, bias, row_scale, residual, rms_eps, activation, variant: str, bits: int,
            name: str) -> jax.Array:
    check_weight(w, f"{name}: w", bits)
    n, k = w.shape
    c = _product_mod.prepare_call(name, x, n, k, bias, variant, planner.NBITS_VARIANTS, row_scale=row_scale,
                                  residual=residual, rms_eps=rms_eps, activation=activation)
    if jnp.dtype(w.scales.dtype) != jnp.dtype(c.x.dtype):
        raise TypeError(f"{name}: w.scales ({w.scales.dtype}) must be in x's dtype ({c.x.dtype})")
    if c.empty:
        return c.finish(None)
    has_zp = w.zero_points is not None
    zp = w.zero_points if has_zp else jnp.zeros((0,), jnp.uint8)
    # A weight stored with K reordered (k_order) takes x in that order; sums of squares for
    # rms_eps (prepare_call) do not depend on it.
    x = c.x if w.k_order is None else jnp.take(c.x, w.k_order, axis=1)
    product = _product(variant, c.present, bits, w.block_size, has_zp, k, name, c.rms, c.act)
    return c.finish(product(x, w.packed, w.scales, zp, *c.extras))


def int4_matmul(x: jax.Array, w: NBitsWeight, *, bias: jax.Array | None = None, row_scale: jax.Array | None = None,
                residual: jax.Array | None = None, rms_eps: float | None = None, activation: str | None = None,
                variant: str = "auto") -> jax.Array:
    """y = (x @ dequant(w)^T) * row_scale + bias + residual with float32 accumulation, for a 4-bit
    NBitsWeight; the three optional (see fp4_matmul).

    x: float16 or bfloat16 [..., K] (w.scales in the same dtype); bias optional [N] in x's dtype;
    row_scale optional, one float per row of x; residual optional [..., N] in x's dtype; rms_eps
    optional (static), instead of row_scale: the row scale rsqrt(mean(x^2) + rms_eps) of an
    RMSNorm in front (see fp4_matmul); activation optional, "swiglu" (gate and up rows interleaved
    by 8, y [..., N / 2]; see fp4_matmul).
    variant: "auto", "mma", "imma", "xshare" or "dequant" (CUDA), "cpu" or "dequant" (CPU). "imma"
    runs the integer tensor cores with x split into three planes of bytes (ffi/imma.cuh; M <= 8, no
    zero points or activation, blocks of 32-128; x is exact to 2^-20 of its row's largest |x|);
    "auto" takes it where it was timed faster (planner.takes_imma: int8 with K >= 8192 at M <= 6
    where N <= 8192 and M <= 4 where N <= 28672, int4 at M = 2-4 on N = 8192, K >= 16384).
    "xshare" shares x between a block's warps through shared memory (ffi/xshare.cuh; M <= 16, no
    zero points or activation, blocks of 32-256, K a multiple of 256); "auto" takes it on sm_90
    for the large products where it was timed faster (planner.takes_xshare: int4 at M = 2-16, int8
    at M = 1-16, by M, K and N x K) and imma's rule or kernel does not take them first. Returns
    [..., N] in x's dtype.
    """
    return _matmul(x, w, bias, row_scale, residual, rms_eps, activation, variant, 4, "int4_matmul")


def int8_matmul(x: jax.Array, w: NBitsWeight, *, bias: jax.Array | None = None, row_scale: jax.Array | None = None,
                residual: jax.Array | None = None, rms_eps: float | None = None, activation: str | None = None,
                variant: str = "auto") -> jax.Array:
    """As int4_matmul, for an 8-bit NBitsWeight."""
    return _matmul(x, w, bias, row_scale, residual, rms_eps, activation, variant, 8, "int8_matmul")
