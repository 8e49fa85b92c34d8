"""`rms_eps`: an RMSNorm in front of the product, y = (x @ W^T) * rsqrt(mean(x^2) + eps) (+ bias +
residual), for every format and variant against a float64 reference; XLA sums the squares, or
(planner.x_sums) the kernel sums them itself, and the kernels' store forms the scale. Under vmap,
the JVP (through the scale) and pjit (K split: each shard's partial product takes the scale of
the whole row), and its errors."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from checks import (ONE_ROW_SPLIT_NK, check_partitioned, check_product, force_one_row_x_path,
                    force_x_in_shared_memory)
from conftest import requires_gpu
from test_epilogue import FORMATS, GPU_CASES, XS_CASES, _call, _case, _variants

# Large enough against mean(x^2) (0.3..2 here) that a store which drops it, or uses the sum where
# the mean belongs, fails the check.
EPS = 0.25


def _rms_scale64(x, eps=EPS):
    x64 = np.asarray(x).astype(np.float64)
    return 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1) + eps)


def _check_rms(y, x, w64, weight_dtype, epilogue, fmt):
    check_product(y, x, w64, epilogue.get("bias"), weight_dtype, _rms_scale64(x), epilogue.get("residual"),
                  rounded_product=fmt == "dense")


def _rms_case(fmt, seed, m, n, k, dtype, bias=True, residual=True):
    """test_epilogue's case without a row scale; `product` is the format's with rms_eps=EPS bound
    (a static argument, so it stays out of the jitted call's operands)."""
    x, w, w64, product, weight_dtype, e = _case(fmt, seed, m, n, k, dtype, bias=bias, row_scale=False,
                                               residual=residual)
    return x, w, w64, functools.partial(product, rms_eps=EPS), weight_dtype, e


@pytest.mark.parametrize("fmt", FORMATS)
def test_rms_cpu(fmt):
    device = jax.devices("cpu")[0]
    for m, n, k, dtype, extras in [(1, 36, 256, jnp.float16, False), (5, 70, 512, jnp.bfloat16, True)]:
        x, w, w64, product, weight_dtype, e = _rms_case(fmt, m * n + k, m, n, k, dtype, bias=extras, residual=extras)
        for variant in _variants(fmt, "cpu", k):
            _check_rms(_call(product, x, w, variant, device, e), x, w64, weight_dtype, e, fmt)


def _reduces(product, x, w, e, device) -> bool:
    """Whether the compiled call (the same as _call's) holds a reduction: XLA's sums of squares."""
    args = jax.device_put((x, w, e.get("bias"), e.get("residual")), device)
    f = jax.jit(lambda x, w, b, r: product(x, w, bias=b, residual=r))
    return re.search(r"\breduce\(", f.lower(*args).compile().as_text()) is not None


@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "int4", "int8"])
@pytest.mark.parametrize("x_sums", ["0", "1"])
def test_rms_cpu_who_sums(fmt, x_sums, monkeypatch):
    # The CPU handlers sum x's squares themselves (the compiled program keeps no reduction), or
    # take XLA's sums (JAXGEMV_XSUMS=0): the same product either way.
    monkeypatch.setenv("JAXGEMV_XSUMS", x_sums)
    device = jax.devices("cpu")[0]
    for m, n, k, dtype in [(1, 36, 256, jnp.float16), (3, 70, 512, jnp.bfloat16)]:
        x, w, w64, product, weight_dtype, e = _rms_case(fmt, m * n + k + 1, m, n, k, dtype)
        _check_rms(_call(product, x, w, "cpu", device, e), x, w64, weight_dtype, e, fmt)
        assert _reduces(product, x, w, e, device) == (x_sums == "0")


def test_rms_is_not_a_row_scale():
    # The same sums passed as a plain row scale give a different product: the kernel's flag is live.
    x, w, _, product, _, e = _rms_case("nvfp4", 5, 3, 40, 256, jnp.float16, bias=False,
                                       residual=False)
    got = np.asarray(product(x, w), np.float32)
    x32 = np.asarray(x, np.float32)
    product = product.func  # without rms_eps bound
    plain = np.asarray(product(x, w, row_scale=jnp.asarray(1.0 / np.sqrt(np.mean(x32 * x32, -1) + EPS))), np.float32)
    np.testing.assert_allclose(got, plain, rtol=2e-3, atol=2e-3 * np.abs(plain).max())
    sums = np.asarray(product(x, w, row_scale=jnp.asarray(np.sum(x32 * x32, -1))), np.float32)
    assert np.abs(sums - got).max() > 10 * np.abs(got).max()


@requires_gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_rms_gpu_every_variant(fmt):
    device = jax.devices("gpu")[0]
    for m, n, k, dtype in GPU_CASES:
        if fmt == "dense" and m > 8:
            continue
        x, w, w64, product, weight_dtype, e = _rms_case(fmt, m * n + k, m, n, k, dtype)
        for variant in _variants(fmt, "gpu", k):
            _check_rms(_call(product, x, w, variant, device, e), x, w64, weight_dtype, e, fmt)


@requires_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "int4", "int8"])
@pytest.mark.parametrize("ksplit", ["2", "4", "8"])
def test_rms_gpu_k_split(fmt, ksplit, monkeypatch):
    # The per-block kernel with K split across blocks: the scale applies once, after the sum.
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    device = jax.devices("gpu")[0]
    for m, n, k, dtype in [(1, 1030, 4096, jnp.float16), (5, 260, 2048, jnp.bfloat16)]:
        x, w, w64, product, weight_dtype, e = _rms_case(fmt, m + n + k, m, n, k, dtype)
        _check_rms(_call(product, x, w, "mma", device, e), x, w64, weight_dtype, e, fmt)


@requires_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "int4", "int8"])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit,xstage,xperm", [("2", "1", "0"), ("8", "1", "1"), ("4", "0", "0")])
def test_rms_gpu_one_row_sums(fmt, dtype, ksplit, xstage, xperm, monkeypatch):
    # M = 1 with a K split, the kernel summing x's squares wherever it can (JAXGEMV_XSUMS=1: with
    # x staged, both x orders, windows dealt unevenly, 65 KB of x staged at K = 33280) and the
    # compiled program then holding no reduction; with x forced into the ring (XSTAGE 0) XLA's
    # sums instead. A kernel that drops the scale, or sums only its own warp's share, fails.
    force_one_row_x_path(monkeypatch, ksplit, xstage, xperm)
    monkeypatch.setenv("JAXGEMV_XSUMS", "1")
    device = jax.devices("gpu")[0]
    for n, k in ONE_ROW_SPLIT_NK:
        x, w, w64, product, weight_dtype, e = _rms_case(fmt, n + k + int(ksplit), 1, n, k, dtype)
        _check_rms(_call(product, x, w, "mma", device, e), x, w64, weight_dtype, e, fmt)
        assert _reduces(product, x, w, e, device) == (xstage == "0")


@requires_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "int4", "int8"])
def test_rms_gpu_x_in_shared_memory(fmt, monkeypatch):
    force_x_in_shared_memory(monkeypatch, "8")
    device = jax.devices("gpu")[0]
    for m, n, k, dtype in XS_CASES:
        x, w, w64, product, weight_dtype, e = _rms_case(fmt, m + n + k, m, n, k, dtype)
        _check_rms(_call(product, x, w, "mma", device, e), x, w64, weight_dtype, e, fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "int8", "dense"])
def test_rms_leading_dims_and_vmap(fmt):
    x, w, w64, product, weight_dtype, e = _rms_case(fmt, 3, 6, 40, 256, jnp.bfloat16, bias=False)
    x3, res3 = x.reshape(2, 3, -1), e["residual"].reshape(2, 3, -1)
    y = product(x3, w, residual=res3)
    _check_rms(y.reshape(6, -1), x, w64, weight_dtype, e, fmt)
    ymap = jax.vmap(lambda a, r: product(a, w, residual=r))(x3, res3)
    np.testing.assert_array_equal(np.asarray(ymap), np.asarray(y))


@pytest.mark.parametrize("fmt", ["nvfp4", "dense"])
def test_rms_jvp_and_grad(fmt):
    # d/dx through the norm's scale as well as the product, against the plain jnp formula on the
    # dequantized weight; reverse mode through the same JVP.
    x, w, w64, product, _, e = _rms_case(fmt, 11, 4, 32, 128, jnp.float16, bias=False)
    w32 = jnp.asarray(w64, jnp.float32)

    def plain(x, r):
        x32 = x.astype(jnp.float32)
        s = jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1) + EPS)
        y = jnp.einsum("mk,nk->mn", x32, w32) * s[:, None] + r.astype(jnp.float32)
        return y.astype(x.dtype)

    primals = (x, e["residual"])
    rng = np.random.default_rng(2)
    tangents = tuple(jnp.asarray(rng.standard_normal(p.shape), p.dtype) for p in primals)
    _, got = jax.jvp(lambda a, r: product(a, w, residual=r), primals, tangents)
    _, want = jax.jvp(plain, primals, tangents)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2,
                               atol=2e-2 * float(jnp.abs(want.astype(jnp.float32)).max()))
    # The scale's own derivative matters: along dx = x the normalized product barely moves (only
    # eps keeps it from being scale-invariant), where the product alone would move by y itself.
    _, along_x = jax.jvp(lambda a: product(a, w), (x,), (x,))
    y0 = np.asarray(product(x, w), np.float32)
    assert np.abs(np.asarray(along_x, np.float32)).max() < 0.3 * np.abs(y0).max()
    x32 = x.astype(jnp.float32)
    g = jax.grad(lambda a: product(a.astype(x.dtype), w).astype(jnp.float32).sum())(x32)
    g_want = jax.grad(lambda a: plain(a, jnp.zeros_like(e["residual"])).astype(jnp.float32).sum())(x32)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_want), rtol=3e-2, atol=3e-2 * float(jnp.abs(g_want).max()))


@pytest.mark.parametrize("spec", ["column", "row", "data+row"])
def test_rms_partitioned(mesh, spec):
    # Row-parallel: XLA's sums of squares all-reduce over the K shards, and every shard's partial
    # product takes the whole row's scale (1 / K of the whole product, not of its shard).
    x, w, w64, product, weight_dtype, e = _rms_case("nvfp4", 21, 8, 64, 256, jnp.bfloat16)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    k_split = spec != "column"
    m_axis = "a" if spec == "data+row" else None
    n_axis = None if k_split else "b"
    wspec, xspec = (P(None, "b"), P(m_axis, "b")) if k_split else (P("b", None), P())
    ws = jaxgemv.NVFP4Weight(put(w.packed, wspec), put(w.scales, wspec), put(w.global_scale, P()))
    placed = (put(x, xspec), ws, put(e["bias"], P(n_axis)), put(e["residual"], P(m_axis, n_axis)))
    f = jax.jit(lambda x, w, b, r: product(x, w, bias=b, residual=r))
    check_partitioned(f, (x, w, e["bias"], e["residual"]), placed, k_split)
    _check_rms(f(*placed), x, w64, weight_dtype, e, "nvfp4")


def test_rms_errors():
    x, w, _, product, _, _ = _case("nvfp4", 1, 4, 16, 64, jnp.float16, bias=False)
    with pytest.raises(ValueError, match="fp4_matmul: pass row_scale or rms_eps, not both"):
        product(x, w, row_scale=jnp.ones(4), rms_eps=1e-6)
    with pytest.raises(TypeError, match="fp4_matmul: rms_eps must be a Python or NumPy number"):
        product(x, w, rms_eps=jnp.float32(1e-6))
    with pytest.raises(TypeError, match="int8_matmul: rms_eps must be a Python or NumPy number"):
        _, w8, _, p8, _, _ = _case("int8", 1, 4, 16, 64, jnp.float16)
        p8(x, w8, rms_eps="1e-6")
    for bad in (-1e-6, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="fp4_matmul: rms_eps must be finite and >= 0"):
            product(x, w, rms_eps=bad)
    with pytest.raises(TypeError, match="rms_eps must be a Python or NumPy number"):
        jax.jit(lambda e: product(x, w, rms_eps=e))(1e-6)
