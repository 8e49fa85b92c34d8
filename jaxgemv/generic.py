"""One product for every weight format: `matmul(x, w)` dispatches on what w is."""

from __future__ import annotations

import jax

from jaxgemv.dense import dense_matmul
from jaxgemv.fp4 import NVFP4Weight, fp4_matmul
from jaxgemv.fp8 import FP8Weight, fp8_matmul
from jaxgemv.nbits import NBitsWeight, int4_matmul, int8_matmul


def product_for(w, name: str = "matmul", dense: bool = True):
    """The product function for weight w (`name` and the argument it came in, for the error);
    dense=False refuses a plain array."""
    if isinstance(w, NVFP4Weight):
        return fp4_matmul
    if isinstance(w, FP8Weight):
        return fp8_matmul
    if isinstance(w, NBitsWeight):
        return int4_matmul if w.bits == 4 else int8_matmul
    if dense and hasattr(w, "shape") and hasattr(w, "dtype"):
        return dense_matmul
    kinds = "NVFP4Weight, FP8Weight, NBitsWeight" + (" or an [N, K] array" if dense else "")
    raise TypeError(f"{name} must be a jaxgemv weight ({kinds}), got {type(w).__name__}")


def matmul(x: jax.Array, w, *, bias: jax.Array | None = None, row_scale: jax.Array | None = None,
           residual: jax.Array | None = None, rms_eps: float | None = None, activation: str | None = None,
           variant: str = "auto") -> jax.Array:
    """y = x @ w^T with the epilogue, for whatever w is: `fp4_matmul` for an NVFP4Weight,
    `fp8_matmul` for an FP8Weight, `int4_matmul` / `int8_matmul` for an NBitsWeight of 4 / 8
    bits, `dense_matmul` for a plain [N, K] array in x's dtype. The arguments are theirs (see
    fp4_matmul); `variant` names one of the chosen product's variants. A model whose layers mix
    formats calls this one function."""
    f = product_for(w, "matmul: w")
    return f(x, w, bias=bias, row_scale=row_scale, residual=residual, rms_eps=rms_eps, activation=activation,
             variant=variant)
