"""What every jaxgemv product runs, whatever the weight format: the per-device primitive,
partitioned for pjit (jaxgemv/sharding.py), with vmap over x folded into M and a JVP for x and
bias. These wrap the partitioned call at trace time rather than hiding it in a lowering rule,
because JAX lowers a custom partitioning with devices assigned only when it can see it in the
traced program.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax
from jax.custom_batching import custom_vmap
from jax.custom_derivatives import SymbolicZero

from jaxgemv import sharding


def build(per_device: Callable, layout: sharding.WeightLayout | None, has_bias: bool, name: str,
          leaf_names: tuple[str, ...], dense: Callable) -> Callable:
    """f(x [M, K], *weight_leaves, bias) -> y [M, N] (bias empty when has_bias is False).

    per_device(x, *leaves, bias): the primitive on one device's operands (hashable).
    layout: how the weight leaves shard (None: no partitioning rule; under pjit the operands are
      then gathered, which is correct and slow).
    dense(leaves, dtype) -> (w [N, K] in dtype, post): the weight for the JVP's dx . w^T, times
      post (a float32 scalar or None) applied to the float32 product.
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
