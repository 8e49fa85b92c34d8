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

from jaxgemv import planner, sharding

#: Activation dtypes every product takes.
ACT_DTYPES = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


@functools.lru_cache(maxsize=None)
def _jitted_bind(prim: Primitive, params: tuple) -> Any:
    return jax.jit(functools.partial(prim.bind, **dict(params)))


def eager_impl(prim: Primitive):
    """Outside jit a primitive runs as its own one-op jitted computation (one per parameter set)."""
    return lambda *args, **params: _jitted_bind(prim, tuple(sorted(params.items())))(*args)


@dataclasses.dataclass(frozen=True)
class Call:
    """A product's checked arguments: x as [M, K], the bias ([0] when absent) and how to give the
    result back its leading dimensions."""

    x: jax.Array
    bias: jax.Array
    has_bias: bool
    lead: tuple[int, ...]
    n: int

    @property
    def empty(self) -> bool:
        return self.x.shape[0] == 0 or self.n == 0

    def finish(self, y2d: jax.Array | None) -> jax.Array:
        """y [M, N] as [..., N]; None (an empty product) as zeros."""
        if y2d is None:
            return jnp.zeros((*self.lead, self.n), self.x.dtype)
        return y2d.reshape(*self.lead, self.n)


def reference_product(x, w32, bias=None):
    """x @ w32^T (+ bias) in plain jnp, float32 throughout, rounded once to x's dtype: every
    format's reference on its float32 dequantized weight."""
    y = jnp.einsum("...k,nk->...n", x.astype(jnp.float32), w32)
    if bias is not None:
        y = y + bias.astype(jnp.float32)
    return y.astype(x.dtype)


def prepare_call(name: str, x, n: int, k: int, bias, variant: str,
                 variants: tuple[str, ...] = planner.VARIANTS) -> Call:
    """Checks x, bias and variant (one of `variants`) against a weight [N, K] at trace time,
    naming the argument."""
    x = jnp.asarray(x)
    if jnp.dtype(x.dtype) not in ACT_DTYPES:
        raise TypeError(f"{name}: x must be float16 or bfloat16, got {x.dtype}")
    if x.ndim < 1 or x.shape[-1] != k:
        raise ValueError(f"{name}: x must have shape [..., {k}] to match w [{n}, {k}], got {x.shape}")
    if variant not in variants:
        raise ValueError(f"{name}: variant={variant!r}: expected one of {', '.join(variants)}")
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
    return Call(x.reshape(m, k), bias, has_bias, tuple(lead), n)


def build(per_device: Callable, layout: sharding.WeightLayout | None, has_bias: bool, name: str,
          leaf_names: tuple[str, ...], dense: Callable, weight_tangent: Callable | None = None) -> Callable:
    """f(x [M, K], *weight_leaves, bias) -> y [M, N] (bias empty when has_bias is False).

    per_device(x, *leaves, bias): the primitive on one device's operands (hashable).
    layout: how the weight leaves shard (None: no partitioning rule; under pjit the operands are
      then gathered, which is correct and slow).
    dense(leaves, dtype) -> (w [N, K] in dtype, post): the weight for the JVP's dx . w^T, times
      post (a float32 scalar or None) applied to the float32 product.
    weight_tangent(x, leaves, dleaves) -> float32 [M, N]: the product's tangent in the weight, for
      a weight that is differentiable (dense_matmul's); None: a tangent for the weight is an error.
    """
    nleaves = len(leaf_names)
    if layout is not None:
        part = sharding.partitioned(per_device, layout, has_bias)
    else:
        part = lambda x, *rest: per_device(x, *rest) if has_bias else per_device(x, *rest, jnp.zeros((0,), x.dtype))  # noqa: E731

    @custom_vmap
    def mapped(x, *rest):
        return part(x, *rest) if has_bias else part(x, *rest[:nleaves])

    @mapped.def_vmap
    def _fold(axis_size, in_batched, x, *rest):
        """vmap over x folds the mapped axis into M: one product, no per-example loop."""
        del axis_size
        if any(in_batched[1:]):
            raise NotImplementedError(
                f"{name}: vmap over the weight or bias is not supported; map over x only, or use lax.map"
            )
        b, m, k = x.shape
        return mapped(x.reshape(b * m, k), *rest).reshape(b, m, -1), True

    @jax.custom_jvp
    def product(x, *rest):
        return mapped(x, *rest)

    def jvp(primals, tangents):
        """d/dx and d/dbias for adapters trained on a frozen quantized base: dy = dx . dequant(W)^T
        (+ dbias). The quantized weight itself is not differentiable."""
        x, rest = primals[0], primals[1:]
        dx, drest = tangents[0], tangents[1:]
        leaves, dleaves = rest[:nleaves], drest[:nleaves]
        if weight_tangent is None:
            for t, leaf, lname in zip(dleaves, leaves, leaf_names):
                if not isinstance(t, SymbolicZero) and jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
                    raise TypeError(f"{name}: the quantized weight is not differentiable (tangent for w.{lname})")
        y = product(x, *rest)
        dy = jnp.zeros(y.shape, jnp.float32)
        if not isinstance(dx, SymbolicZero):
            w, post = dense(leaves, jnp.dtype(x.dtype))
            dy = lax.dot_general(dx, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            if post is not None:
                dy = dy * post
        if weight_tangent is not None and not all(isinstance(t, SymbolicZero) for t in dleaves):
            dy = dy + weight_tangent(x, leaves, dleaves)
        dbias = drest[nleaves]
        if has_bias and not isinstance(dbias, SymbolicZero):
            dy = dy + dbias.astype(jnp.float32)
        return y, dy.astype(y.dtype)

    product.defjvp(jvp, symbolic_zeros=True)
    return product


def fragment_order(x: jax.Array, loads: int, values_per_chunk: int) -> jax.Array:
    """x [M, K] laid out as the tensor-core kernel reads it (ffi/gemv_core.cuh, XPERM): M padded
    with zero rows to a multiple of 8, then for each 8-row m-tile, K window (4 lanes x loads
    chunks of `values_per_chunk` values), chunk l < loads and word W (8 values), the 32 lanes'
    8 values each, lane = 4 g + t holding row g and values values_per_chunk x t + 8 W .. + 7 of
    the chunk, stored in the decode's pair order 0 4 1 5 2 6 3 7. Returned as [M8, K] (the same
    values, permuted), so a warp's x load is 512 contiguous bytes."""
    m, k = x.shape
    m8 = -(-m // 8) * 8
    words = values_per_chunk // 8
    x = jnp.pad(x, ((0, m8 - m), (0, 0)))
    # value k = window (4 vpc loads) + chunk l (4 vpc) + t vpc + W 8 + half 4 + j  (pair order: j, half)
    x = x.reshape(m8 // 8, 8, k // (4 * values_per_chunk * loads), loads, 4, words, 2, 4)  # tile g win l t W half j
    x = x.transpose(0, 2, 3, 5, 1, 4, 7, 6)  # tile win l W g t j half
    return x.reshape(m8, k)
