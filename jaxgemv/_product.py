"""What every jaxgemv product runs, whatever the weight format: the per-device primitive,
partitioned for pjit (jaxgemv/sharding.py), with vmap over x folded into M and a JVP for x and
bias. These wrap the partitioned call at trace time rather than hiding it in a lowering rule,
because JAX lowers a custom partitioning with devices assigned only when it can see it in the
traced program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import SymbolicZero
from jax.extend.core import Primitive

from jaxgemv import _ext, planner, sharding

#: Activation dtypes every product takes.
ACT_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def check_arrays(name: str, **fields) -> None:
    """Raises TypeError unless every given field of a weight is an array (jax, numpy or a tracer):
    a Python number or list among a weight's leaves would otherwise fail later without naming it."""
    for field, v in fields.items():
        if not (hasattr(v, "dtype") and hasattr(v, "shape") and hasattr(v, "ndim")):
            hint = " (wrap a number as an array, e.g. jnp.float32(s))" if isinstance(v, (int, float)) else ""
            raise TypeError(f"{name}.{field} must be an array, got {type(v).__name__}{hint}")


@functools.lru_cache(maxsize=None)
def _jitted_bind(prim: Primitive, params: tuple) -> Any:
    return jax.jit(functools.partial(prim.bind, **dict(params)))


def eager_impl(prim: Primitive):
    """Outside jit a primitive runs as its own one-op jitted computation (one per parameter set)."""
    return lambda *args, **params: _jitted_bind(prim, tuple(sorted(params.items())))(*args)


#: The operands a product takes after the weight, each optional: bias [N] in x's dtype, added
#: once; row_scale [M] float32, multiplying each row of the float32 product before the bias (an
#: RMSNorm's rsqrt(mean(x^2) + eps) with the norm's gain folded into the weight); residual [M, N]
#: in x's dtype, added last (a residual connection). Absent ones travel as empty arrays.
EPILOGUE = ("bias", "row_scale", "residual")

# `rms`, wherever it appears: an RMSNorm in front of the product (`rms_eps=` of every product) as
# (eps, 1 / K), K the whole product's (not one K shard's). The row_scale operand then carries each
# row's sum of squares of x, computed by XLA beside the product, and the kernels' store forms the
# scale rsqrt(sum / K + eps) where it multiplies by it; where the kernel sums the squares itself
# (kernel_row_scale) the lowering passes it no sums and XLA's reduction goes. None: row_scale, if
# present, is the scale.


#: Activations a quantized product applies in its store (`activation=`), with their FFI codes
#: (ffi/common.h: ProductShape::activation). "swiglu": the weight's N rows are a gate and an up
#: projection interleaved in groups of 8 (interleave_gate_up), and y [..., N / 2] is silu(gate) x up
#: of the float32 products (after the row scale and the bias, before the residual), rounded once.
ACTIVATIONS = {None: 0, "swiglu": 1}
#: Rows per group of gate (then of up) in a SwiGLU weight.
SWIGLU_GROUP = 8


def interleave_gate_up(gate, up):
    """The weight (or bias) of a SwiGLU product: gate and up, both [F, ...] with F a multiple of 8,
    as [2F, ...] with rows 16j..16j+7 gate rows 8j..8j+7 and rows 16j+8..16j+15 the same up rows.
    Interleave before quantizing, so that every format's row-wise blocks stay within one row."""
    gate, up = jnp.asarray(gate), jnp.asarray(up)
    if gate.shape != up.shape or gate.ndim < 1:
        raise ValueError(f"interleave_gate_up: gate and up must have the same shape [F, ...], got {gate.shape} "
                         f"and {up.shape}")
    f = gate.shape[0]
    if f % SWIGLU_GROUP:
        raise ValueError(f"interleave_gate_up: F (rows of gate and up) must be a multiple of {SWIGLU_GROUP}, got {f}")
    g = gate.reshape(f // SWIGLU_GROUP, 1, SWIGLU_GROUP, *gate.shape[1:])
    u = up.reshape(f // SWIGLU_GROUP, 1, SWIGLU_GROUP, *up.shape[1:])
    return jnp.concatenate([g, u], axis=1).reshape(2 * f, *gate.shape[1:])


def swiglu(p32: jax.Array) -> jax.Array:
    """silu(gate) x up of float32 pre-activations [M, N] with gate and up interleaved by 8: [M, N / 2]."""
    m, n = p32.shape
    p = p32.reshape(m, n // (2 * SWIGLU_GROUP), 2, SWIGLU_GROUP)
    return (jax.nn.silu(p[:, :, 0]) * p[:, :, 1]).reshape(m, n // 2)


def apply_activation(p32: jax.Array, act) -> jax.Array:
    return p32 if act is None else swiglu(p32)


def row_scale_of(row_scale: jax.Array, rms) -> jax.Array:
    """The float32 row scale the store multiplies by: row_scale as given, or (rms) formed from the
    rows' sums of squares."""
    row_scale = row_scale.astype(jnp.float32)
    if rms is None:
        return row_scale
    eps, inv_k = rms
    return lax.rsqrt(row_scale * jnp.float32(inv_k) + jnp.float32(eps))


def kernel_row_scale(plan: planner.Plan, x: jax.Array, row_scale: jax.Array, rms) -> jax.Array:
    """The row scale operand as the handler takes it, x [M, K] being one device's: with `rms`,
    empty where the kernel sums the squares of x itself (planner.x_sums), so that the reduction
    XLA traced for it has no user left and is dropped; else as given."""
    if rms is not None and planner.x_sums(plan, x.shape[0], x.shape[1], round(1 / rms[1])):
        return jnp.zeros((0,), jnp.float32)
    return row_scale


def x_order(plan: planner.Plan, m: int, compact: bool) -> int:
    """The handlers' xperm for a plan and M rows (ffi/common.h: CheckXOrder): 0 x as it is, 1 in
    fragment order in 8-row m-tiles (M padded), 2 in fragment order unpadded, which one m-tile of
    M < 8 rows without x in shared memory takes where the format's kernels read x so (`compact`:
    FP8 and NVFP4, their kCompactX; fragment_order's `compact`)."""
    if not plan.xperm:
        return 0
    return 2 if compact and m < 8 and plan.rows == 1 and not plan.xs_warps else 1


def kernel_inputs(plan: planner.Plan, x: jax.Array, rms, act, *, values_per_chunk: int,
                  compact: bool) -> tuple[jax.Array, dict[str, np.int64 | np.float32]]:
    """x as the tensor-core kernel of `plan` reads it and the attributes every quantized product's
    handler takes before its format's own (ffi/common.h: BindProduct): the plan with x's order
    (x_order, from the format's `compact`, so that x's layout and the handler's xperm are one
    decision), `rms` (rms_eps < 0: none; CheckEpilogue), then the activation's code (ACTIVATIONS)."""
    order = x_order(plan, x.shape[0], compact)
    if order:
        x = fragment_order(x, plan.loads, values_per_chunk, compact=order == 2)
    eps, inv_k = rms if rms is not None else (-1.0, 0.0)
    return x, dict(variant=np.int64(_ext.VARIANT_CODES[plan.variant]), rows=np.int64(plan.rows),
                   ksplit=np.int64(plan.ksplit), loads=np.int64(plan.loads), xperm=np.int64(order),
                   xs_warps=np.int64(plan.xs_warps), x_stage=np.int64(plan.x_stage), rms_eps=np.float32(eps),
                   rms_inv_k=np.float32(inv_k), activation=np.int64(ACTIVATIONS[act]))


def with_activation(plan: planner.Plan, act) -> planner.Plan:
    """A plan that can apply `act`: the warp-per-column kernels cannot (a warp holds one column,
    not a gate and up pair), so a product with an activation that the planner (or JAXGEMV_VARIANT)
    sends to them decodes and runs XLA's dot instead. A variant="scalar" argument with an
    activation is refused before this (prepare_call)."""
    return planner.Plan("dequant") if act is not None and plan.variant == "scalar" else plan


def out_cols(n: int, act) -> int:
    """Columns of y for a weight of N rows."""
    return n if act is None else n // 2


@dataclasses.dataclass(frozen=True)
class Call:
    """A product's checked arguments: x as [M, K], the epilogue operands (empty when absent;
    row_scale as [M], residual as [M, N_out]) and how to give the result back its leading
    dimensions. n: y's columns (N, or N / 2 with an activation)."""

    x: jax.Array
    bias: jax.Array
    has_bias: bool
    lead: tuple[int, ...]
    n: int
    row_scale: jax.Array | None = None
    residual: jax.Array | None = None
    rms: tuple[float, float] | None = None  # row_scale holds sums of squares (see `rms` above)
    act: str | None = None  # ACTIVATIONS

    @property
    def empty(self) -> bool:
        return self.x.shape[0] == 0 or self.n == 0

    @property
    def present(self) -> tuple[bool, bool, bool]:
        """Which of EPILOGUE the call has."""
        return self.has_bias, self.row_scale is not None, self.residual is not None

    @property
    def extras(self) -> tuple[jax.Array, ...]:
        """The present epilogue operands, in EPILOGUE order."""
        return tuple(a for a, p in zip((self.bias, self.row_scale, self.residual), self.present) if p)

    def finish(self, y2d: jax.Array | None) -> jax.Array:
        """y [M, N] as [..., N]; None (an empty product) as the epilogue on zeros."""
        if y2d is None:
            n_w = 2 * self.n if self.act else self.n  # the weight's rows
            y = jnp.zeros((int(np.prod(self.lead)) if self.lead else 1, n_w), jnp.float32)
            if self.has_bias:
                y = y + self.bias.astype(jnp.float32)
            y = apply_activation(y, self.act)
            if self.residual is not None:
                y = y + self.residual.astype(jnp.float32)
            y2d = y.astype(self.x.dtype)
        return y2d.reshape(*self.lead, self.n)


def full_extras(x: jax.Array, present: tuple[bool, bool, bool], extras) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The present epilogue operands (in EPILOGUE order) with empties in the absent slots."""
    it = iter(extras)
    return tuple(next(it) if p else e for p, e in zip(present, sharding.empty_epilogue(x)))


def apply_epilogue(y32: jax.Array, bias, row_scale, residual, dtype, rms=None, act=None) -> jax.Array:
    """The epilogue in plain jnp on a float32 [M, N] product (empty operands skipped), rounded
    once to dtype: what every kernel's store does."""
    if row_scale.shape[0]:
        y32 = y32 * row_scale_of(row_scale, rms)[:, None]
    if bias.shape[0]:
        y32 = y32 + bias.astype(jnp.float32)
    y32 = apply_activation(y32, act)
    if residual.shape[0]:
        y32 = y32 + residual.astype(jnp.float32)
    return y32.astype(dtype)


def reference_product(x, w32, bias=None, row_scale=None, residual=None, rms_eps=None, activation=None):
    """x @ w32^T, times row_scale (or, with rms_eps, rsqrt(mean(x^2) + rms_eps)), plus bias,
    through the activation, plus residual, in plain jnp, float32 throughout, rounded once to x's
    dtype: every format's reference on its float32 dequantized weight."""
    y = jnp.einsum("...k,nk->...n", x.astype(jnp.float32), w32)
    if rms_eps is not None:
        x32 = x.astype(jnp.float32)
        y = y * lax.rsqrt(jnp.mean(x32 * x32, axis=-1) + jnp.float32(rms_eps))[..., None]
    if row_scale is not None:
        y = y * jnp.asarray(row_scale, jnp.float32)[..., None]
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    if activation is not None:
        lead = y.shape[:-1]
        y = swiglu(y.reshape(-1, y.shape[-1])).reshape(*lead, -1)
    if residual is not None:
        y = y + residual.astype(jnp.float32)
    return y.astype(x.dtype)


def sums_of_squares(x: jax.Array) -> jax.Array:
    """x's rows' sums of squares in float32: the row-scale operand a product with `rms` takes."""
    x32 = x.astype(jnp.float32)
    return jnp.sum(x32 * x32, axis=-1)


def _check_rms_eps(name: str, rms_eps, row_scale) -> float:
    if row_scale is not None:
        raise ValueError(f"{name}: pass row_scale or rms_eps, not both (rms_eps forms the row scale from x)")
    if isinstance(rms_eps, (bool, np.bool_)) or not isinstance(rms_eps, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name}: rms_eps must be a Python or NumPy number (a static value), got "
                        f"{type(rms_eps).__name__}")
    eps = float(rms_eps)
    if not (np.isfinite(eps) and eps >= 0):
        raise ValueError(f"{name}: rms_eps must be finite and >= 0, got {rms_eps}")
    return eps


def prepare_call(name: str, x, n: int, k: int, bias, variant: str,
                 variants: tuple[str, ...] = planner.VARIANTS, row_scale=None, residual=None,
                 rms_eps=None, activation=None) -> Call:
    """Checks x, the epilogue operands, the activation and variant (one of `variants`) against a
    weight [N, K] at trace time, naming the argument. With rms_eps, the row scale operand becomes
    x's rows' sums of squares (float32, computed here, in XLA) and the call carries `rms`."""
    x = jnp.asarray(x)
    if jnp.dtype(x.dtype) not in ACT_DTYPES:
        raise TypeError(f"{name}: x must be float16 or bfloat16, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"{name}: x must have shape [..., {k}] to match w [{n}, {k}], got {x.shape}")
    if variant not in variants:
        raise ValueError(f"{name}: variant={variant!r}: expected one of {', '.join(variants)}")
    if not isinstance(activation, (str, type(None))) or activation not in ACTIVATIONS:
        raise ValueError(f"{name}: activation={activation!r}: expected None or 'swiglu'")
    if activation is not None:
        if n % (2 * SWIGLU_GROUP):
            raise ValueError(f"{name}: activation='swiglu' needs w's N (gate and up rows, interleave_gate_up) to be a "
                             f"multiple of {2 * SWIGLU_GROUP}, got N = {n}")
        if variant == "scalar":
            raise ValueError(f"{name}: activation='swiglu' runs on the 'mma', 'dequant' or 'cpu' variant, not 'scalar'")
    n_out = out_cols(n, activation)
    has_bias = bias is not None
    if not has_bias:
        bias = jnp.zeros((0,), x.dtype)
    else:
        bias = jnp.asarray(bias)
        if bias.shape != (n,):
            raise ValueError(f"{name}: bias must have shape ({n},), got {bias.shape}")
        if bias.dtype != x.dtype:
            raise TypeError(f"{name}: bias must have x's dtype {x.dtype}, got {bias.dtype}")
    lead = x.shape[:-1]
    m = int(np.prod(lead)) if lead else 1
    rms = None
    if rms_eps is not None:
        rms = (_check_rms_eps(name, rms_eps, row_scale), 1.0 / k)
        row_scale = sums_of_squares(x)
    if row_scale is not None:
        row_scale = jnp.asarray(row_scale)
        if not jnp.issubdtype(row_scale.dtype, jnp.floating):
            raise TypeError(f"{name}: row_scale must be floating point (it is used as float32), got {row_scale.dtype}")
        if row_scale.shape != lead:
            raise ValueError(f"{name}: row_scale must have x's leading shape {lead} (one value per row of x), "
                             f"got {row_scale.shape}")
        row_scale = row_scale.astype(jnp.float32).reshape(m)
    if residual is not None:
        residual = jnp.asarray(residual)
        if residual.shape != (*lead, n_out):
            raise ValueError(f"{name}: residual must have the output's shape {(*lead, n_out)}, got {residual.shape}")
        if residual.dtype != x.dtype:
            raise TypeError(f"{name}: residual must have x's dtype {x.dtype}, got {residual.dtype}")
        residual = residual.reshape(m, n_out)
    return Call(x.reshape(m, k), bias, has_bias, tuple(lead), n_out, row_scale, residual, rms, activation)


def build(per_device: Callable, layout: sharding.WeightLayout | None, present: tuple[bool, bool, bool], name: str,
          leaf_names: tuple[str, ...], dense: Callable, weight_tangent: Callable | None = None,
          rms: tuple[float, float] | None = None, act: str | None = None,
          plain_per_device: Callable | None = None) -> Callable:
    """f(x [M, K], *weight_leaves, *epilogue) -> y [M, N_out], the epilogue operands those of
    EPILOGUE that `present` flags, in that order.

    per_device(x, *leaves, bias, row_scale, residual): the primitive on one device's operands
      (hashable), absent epilogue operands empty.
    layout: how the weight leaves shard (None: no partitioning rule; under pjit the operands are
      then gathered, which is correct and slow).
    dense(leaves, dtype) -> (w [N, K] in dtype, post): the weight for the JVP's dx . w^T, times
      post (a float32 scalar or None) applied to the float32 product.
    weight_tangent(x, leaves, dleaves) -> float32 [M, N]: the product's tangent in the weight, for
      a weight that is differentiable (dense_matmul's); None: a tangent for the weight is an error.
    rms: the `rms` that per_device was built with (the row scale operand holds sums of squares);
      the JVP differentiates through the scale it forms.
    act: the activation per_device applies (ACTIVATIONS; y has N / 2 columns with "swiglu"), and
      plain_per_device the same product without it, which a K split runs before its sum.
    """
    nleaves = len(leaf_names)
    has_bias, has_row_scale, has_residual = present
    if layout is not None:
        part = sharding.partitioned(per_device, layout, present, act, plain_per_device)
    else:
        part = lambda x, *rest: per_device(x, *rest[:nleaves], *full_extras(x, present, rest[nleaves:]))  # noqa: E731

    @custom_vmap
    def mapped(x, *rest):
        return part(x, *rest)

    @mapped.def_vmap
    def _fold(axis_size, in_batched, x, *rest):
        """vmap over x (and the row scale and residual) folds the mapped axis into M: one product,
        no per-example loop."""
        leaves_b = in_batched[1 : 1 + nleaves]
        extras_b = in_batched[1 + nleaves :]
        extras = list(rest[nleaves:])
        slots = [i for i, p in enumerate(present) if p]  # EPILOGUE index of each present operand
        if any(leaves_b) or any(b for b, slot in zip(extras_b, slots) if slot == 0):
            raise NotImplementedError(
                f"{name}: vmap over the weight or bias is not supported; map over x only (with row_scale and "
                "residual, if given), or use lax.map"
            )
        if not in_batched[0]:
            x = jnp.broadcast_to(x, (axis_size, *x.shape))
        b, m, k = x.shape
        for j, (batched, slot) in enumerate(zip(extras_b, slots)):
            if slot == 0:
                continue
            e = extras[j] if batched else jnp.broadcast_to(extras[j], (axis_size, *extras[j].shape))
            extras[j] = e.reshape(b * m, *e.shape[2:])
        y = mapped(x.reshape(b * m, k), *rest[:nleaves], *extras)
        return y.reshape(b, m, -1), True

    @jax.custom_jvp
    def product(x, *rest):
        return mapped(x, *rest)

    def jvp(primals, tangents):
        """d/dx, d/dbias, d/drow_scale and d/dresidual for adapters trained on a frozen quantized
        base: dy = s (dx . dequant(W)^T) + ds (x . dequant(W)^T) (+ dbias + dresidual), s the row
        scale (with rms formed from the sums of squares q, s = rsqrt(q / K + eps), so ds =
        -s^3 / (2K) dq), then through the activation at the float32 pre-activation, if any. The
        quantized weight itself is not differentiable."""
        x, rest = primals[0], primals[1:]
        dx, drest = tangents[0], tangents[1:]
        leaves, dleaves = rest[:nleaves], drest[:nleaves]
        bias, row_scale, residual = full_extras(x, present, rest[nleaves:])
        dextras = iter(drest[nleaves:])
        dbias, drow_scale, dresidual = (next(dextras) if p else None for p in present)
        if weight_tangent is None:
            for t, leaf, lname in zip(dleaves, leaves, leaf_names):
                if not isinstance(t, SymbolicZero) and jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
                    raise TypeError(f"{name}: the quantized weight is not differentiable (tangent for w.{lname})")
        y = product(x, *rest)
        # dy: the tangent of the float32 product before the activation and the residual.
        dy = jnp.zeros((y.shape[0], 2 * y.shape[1] if act else y.shape[1]), jnp.float32)
        scale = row_scale_of(row_scale, rms) if has_row_scale else None

        def plain(a):  # a . dequant(W)^T in float32
            w, post = dense(leaves, jnp.dtype(x.dtype))
            p = lax.dot_general(a, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            return p if post is None else p * post

        if not isinstance(dx, SymbolicZero):
            t = plain(dx)
            dy = dy + (t * scale[:, None] if has_row_scale else t)
        if weight_tangent is not None and not all(isinstance(t, SymbolicZero) for t in dleaves):
            t = weight_tangent(x, leaves, dleaves)
            dy = dy + (t * scale[:, None] if has_row_scale else t)
        if has_row_scale and not isinstance(drow_scale, SymbolicZero):
            ds = drow_scale.astype(jnp.float32)
            if rms is not None:
                ds = ds * (-0.5 * rms[1]) * scale**3
            dy = dy + plain(x) * ds[:, None]
        if has_bias and not isinstance(dbias, SymbolicZero):
            dy = dy + dbias.astype(jnp.float32)
        if act is not None:
            # Through the activation at the float32 pre-activation p = (x . W^T) s + bias.
            p = plain(x)
            if has_row_scale:
                p = p * scale[:, None]
            if has_bias:
                p = p + bias.astype(jnp.float32)
            dy = jax.jvp(lambda q: apply_activation(q, act), (p,), (dy,))[1]
        if has_residual and not isinstance(dresidual, SymbolicZero):
            dy = dy + dresidual.astype(jnp.float32)
        return y, dy.astype(y.dtype)

    product.defjvp(jvp, symbolic_zeros=True)
    return product


def fragment_order(x: jax.Array, loads: int, values_per_chunk: int, compact: bool = False) -> jax.Array:
    """x [M, K] laid out as the tensor-core kernel reads it (ffi/gemv_core.cuh, XPERM): M padded
    with zero rows to a multiple of 8, then for each 8-row m-tile, K window (4 lanes x loads
    chunks of `values_per_chunk` values), chunk l < loads and word W (8 values), the 32 lanes'
    8 values each, lane = 4 g + t holding row g and values values_per_chunk x t + 8 W .. + 7 of
    the chunk, stored in the decode's pair order 0 4 1 5 2 6 3 7. Returned as [M8, K] (the same
    values, permuted), so a warp's x load is 512 contiguous bytes. `compact` (M <= 8): the one
    m-tile's M rows only, 4 M lanes' pieces per word, [M, K] (x_order 2: no pad before the
    transpose, 64 M contiguous bytes per warp load)."""
    m, k = x.shape
    if compact and m > 8:
        raise ValueError(f"fragment_order: compact needs M <= 8, got {m}")
    m8 = m if compact else -(-m // 8) * 8
    words = values_per_chunk // 8
    if compact:
        x = x.reshape(m, k // (4 * values_per_chunk * loads), loads, 4, words, 2, 4)  # g win l t W half j
        return x.transpose(1, 2, 4, 0, 3, 6, 5).reshape(m, k)  # win l W g t j half
    if m8 != m:
        x = jnp.pad(x, ((0, m8 - m), (0, 0)))
    # value k = window (4 vpc loads) + chunk l (4 vpc) + t vpc + W 8 + half 4 + j  (pair order: j, half)
    x = x.reshape(m8 // 8, 8, k // (4 * values_per_chunk * loads), loads, 4, words, 2, 4)  # tile g win l t W half j
    x = x.transpose(0, 2, 3, 5, 1, 4, 7, 6)  # tile win l W g t j half
    return x.reshape(m8, k)
