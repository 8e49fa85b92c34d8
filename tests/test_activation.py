"""activation="swiglu": a gate and an up projection in one weight, their rows interleaved by 8
(jaxgemv.interleave_gate_up), and y = silu(gate) x up of the float32 products (after the row scale
and the bias, before the residual), [..., N / 2]; every quantized format and variant against a
float64 reference, under vmap, the JVP and pjit, and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from checks import (ONE_ROW_SPLIT_NK, check_partitioned, check_product, force_one_row_x_path,
                    force_x_in_shared_memory, poisoned_call, swiglu_np)
from conftest import requires_gpu
from test_epilogue import _quantizers

FORMATS = ("nvfp4", "fp8", "int4", "int8")
EPS = 0.25


def _case(fmt, seed, m, f, k, dtype, bias=True, row_scale=True, residual=True):
    """x varying along K, a SwiGLU weight of 2f rows (gate and up drawn apart, then interleaved and
    quantized), its float64 dequantization, and the epilogue operands (residual [m, f])."""
    rng = np.random.default_rng(seed)
    quantize, product, weight_dtype = _quantizers(dtype)[fmt]
    ramp = np.linspace(0.5, 2.0, k)
    gate = rng.standard_normal((f, k)) * ramp
    up = rng.standard_normal((f, k)) * ramp[::-1]
    w = quantize(jnp.asarray(jaxgemv.interleave_gate_up(gate, up), jnp.float32))
    w64 = np.asarray(w if fmt == "dense" else w.dequantize(jnp.float32), np.float64)
    x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(1.5, 0.5, k) / np.sqrt(k) * 4, dtype)
    e = {}
    if bias:
        e["bias"] = jnp.asarray(rng.standard_normal(2 * f), dtype)
    if row_scale:
        e["row_scale"] = jnp.asarray(np.exp2(rng.uniform(-1, 1, m)), jnp.float32)
    if residual:
        e["residual"] = jnp.asarray(rng.standard_normal((m, f)), dtype)
    return x, w, w64, product, weight_dtype, e


def _call(product, x, w, variant, device, e, **kw):
    e = dict(e)
    bias = e.pop("bias", None)
    return poisoned_call(lambda *a, **k: product(*a, activation="swiglu", **kw, **k), x, w, bias, variant, device,
                         **e)


def _check(y, x, w64, weight_dtype, e, rms=False, rounded_product=False):
    row_scale = e.get("row_scale")
    if rms:
        x64 = np.asarray(x).astype(np.float64)
        row_scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1) + EPS)
    assert y.shape == (x.shape[0], w64.shape[0] // 2)
    check_product(y, x, w64, e.get("bias"), weight_dtype, row_scale, e.get("residual"), rounded_product=rounded_product,
                  activation="swiglu")


def test_interleave_gate_up():
    gate = np.arange(24 * 3).reshape(24, 3)
    up = -gate
    w = np.asarray(jaxgemv.interleave_gate_up(gate, up))
    assert w.shape == (48, 3)
    for j in range(3):
        np.testing.assert_array_equal(w[16 * j : 16 * j + 8], gate[8 * j : 8 * j + 8])
        np.testing.assert_array_equal(w[16 * j + 8 : 16 * j + 16], up[8 * j : 8 * j + 8])
    np.testing.assert_array_equal(np.asarray(jaxgemv.interleave_gate_up(gate[:, 0], up[:, 0])), w[:, 0])
    with pytest.raises(ValueError, match="interleave_gate_up: F .* must be a multiple of 8, got 12"):
        jaxgemv.interleave_gate_up(gate[:12], up[:12])
    with pytest.raises(ValueError, match="interleave_gate_up: gate and up must have the same shape"):
        jaxgemv.interleave_gate_up(gate, up[:16])


@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu_cpu(fmt):
    # M 1 and 5, every CPU variant, with and without the other epilogue operands, and with an
    # RMSNorm in front (the CPU handler then sums x's squares too).
    device = jax.devices("cpu")[0]
    for m, f, k, dtype, extras in [(1, 16, 256, jnp.float16, False), (5, 40, 512, jnp.bfloat16, True)]:
        x, w, w64, product, weight_dtype, e = _case(fmt, m * f + k, m, f, k, dtype, bias=extras, row_scale=extras,
                                                    residual=extras)
        for variant in ("cpu", "dequant"):
            _check(_call(product, x, w, variant, device, e), x, w64, weight_dtype, e)
            e_rms = {key: v for key, v in e.items() if key != "row_scale"}
            _check(_call(product, x, w, variant, device, e_rms, rms_eps=EPS), x, w64, weight_dtype, e_rms, rms=True)


def test_swiglu_is_gate_times_up():
    # The same as silu(x . gate^T) * (x . up^T) from two plain products: which half is the gate
    # matters (silu is not symmetric), and so does the interleaving.
    x, w, w64, product, _, _ = _case("nvfp4", 3, 4, 24, 256, jnp.float16, bias=False,
                                     row_scale=False, residual=False)
    y = np.asarray(product(x, w, activation="swiglu"), np.float32)
    both = np.asarray(product(x, w), np.float32)
    want = swiglu_np(both.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=4e-3, atol=4e-3 * np.abs(want).max())
    swapped = swiglu_np(both.reshape(4, -1, 2, 8)[:, :, ::-1].reshape(4, -1).astype(np.float64))
    assert np.abs(swapped - want).max() > 0.1 * np.abs(want).max()


@requires_gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu_gpu_every_variant(fmt, monkeypatch):
    # The tensor-core kernel per block (M 1: x in the ring or staged, NVFP4 fp16 with block
    # columns; M 3 and 12: x from global memory, one and two m-tiles) and decode-then-dot; the
    # warp-per-column kernels cannot pair gate and up, so the planner's scalar choice (forced here
    # through the environment) decodes instead.
    device = jax.devices("gpu")[0]
    for m, f, k, dtype in [(1, 2056, 2048, jnp.float16), (3, 48, 4096, jnp.bfloat16), (12, 24, 1024, jnp.float16)]:
        x, w, w64, product, weight_dtype, e = _case(fmt, m * f + k, m, f, k, dtype)
        for variant in ("mma", "dequant"):
            _check(_call(product, x, w, variant, device, e), x, w64, weight_dtype, e)
        if fmt in ("nvfp4", "fp8"):
            monkeypatch.setenv("JAXGEMV_VARIANT", "scalar")
            _check(_call(product, x, w, "auto", device, e), x, w64, weight_dtype, e)
            monkeypatch.delenv("JAXGEMV_VARIANT")


@requires_gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ksplit,xstage,xperm", [("2", "1", "0"), ("8", "0", "1"), ("4", "1", "1")])
def test_swiglu_gpu_one_row_paths(fmt, ksplit, xstage, xperm, monkeypatch):
    # M = 1 with a K split, x staged or in the ring, both x orders; with the norm's sums in the
    # kernel too where x is staged.
    force_one_row_x_path(monkeypatch, ksplit, xstage, xperm)
    device = jax.devices("gpu")[0]
    for n, k in ONE_ROW_SPLIT_NK:
        f = n // 2 // 8 * 8
        x, w, w64, product, weight_dtype, e = _case(fmt, n + k, 1, f, k, jnp.bfloat16, row_scale=False)
        _check(_call(product, x, w, "mma", device, e, rms_eps=EPS), x, w64, weight_dtype, e, rms=True)


@requires_gpu
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ksplit", ["4", "8"])
def test_swiglu_gpu_fragment_order_k_split(fmt, ksplit, monkeypatch):
    # A decode step's gate_up at batch 2-8 above planner.XPERM_ONE_TILE_MIN_BYTES: x in fragment
    # order with a K split, the norm's row scale from XLA's sums, SwiGLU, bias and residual in the
    # store (at M = 8 x needs no padding, at 3 it does).
    monkeypatch.setenv("JAXGEMV_XPERM", "1")
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    device = jax.devices("gpu")[0]
    for m, f, k, dtype in [(3, 48, 4096, jnp.bfloat16), (8, 264, 2048, jnp.float16)]:
        x, w, w64, product, weight_dtype, e = _case(fmt, m * f + k, m, f, k, dtype, row_scale=False)
        _check(_call(product, x, w, "mma", device, e, rms_eps=EPS), x, w64, weight_dtype, e, rms=True)


@requires_gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_swiglu_gpu_x_in_shared_memory(fmt, monkeypatch):
    # The persistent kernel, whose store runs inside its loop, one tile after another per warp.
    force_x_in_shared_memory(monkeypatch, "8")
    device = jax.devices("gpu")[0]
    for m, f, k, dtype in [(4, 50000, 256, jnp.bfloat16), (12, 2048, 512, jnp.float16)]:
        x, w, w64, product, weight_dtype, e = _case(fmt, m + f + k, m, f, k, dtype)
        _check(_call(product, x, w, "mma", device, e), x, w64, weight_dtype, e)


@pytest.mark.parametrize("fmt", ["nvfp4", "int8"])
def test_swiglu_leading_dims_and_vmap(fmt):
    x, w, w64, product, weight_dtype, e = _case(fmt, 3, 6, 16, 256, jnp.bfloat16, bias=False, row_scale=False)
    x3, r3 = x.reshape(2, 3, -1), e["residual"].reshape(2, 3, -1)
    y = product(x3, w, residual=r3, activation="swiglu")
    assert y.shape == (2, 3, 16)
    _check(y.reshape(6, -1), x, w64, weight_dtype, e)
    ymap = jax.vmap(lambda a, r: product(a, w, residual=r, activation="swiglu"))(x3, r3)
    np.testing.assert_array_equal(np.asarray(ymap), np.asarray(y))


def test_swiglu_jvp_and_grad():
    # d/dx, d/dbias, d/drow_scale and d/dresidual through silu(gate) * up, against the plain jnp
    # formula on the dequantized weight; reverse mode through the same JVP.
    x, w, w64, product, _, e = _case("nvfp4", 11, 4, 16, 128, jnp.float16)
    w32 = jnp.asarray(w64, jnp.float32)

    def plain(x, b, s, r):
        p = jnp.einsum("mk,nk->mn", x.astype(jnp.float32), w32) * s[:, None] + b.astype(jnp.float32)
        q = p.reshape(p.shape[0], -1, 2, 8)
        return (jax.nn.silu(q[:, :, 0]) * q[:, :, 1]).reshape(p.shape[0], -1) + r.astype(jnp.float32)

    def ours(x, b, s, r):
        return product(x, w, bias=b, row_scale=s, residual=r, activation="swiglu").astype(jnp.float32)

    primals = (x, e["bias"], e["row_scale"], e["residual"])
    rng = np.random.default_rng(2)
    tangents = tuple(jnp.asarray(rng.standard_normal(p.shape), p.dtype) for p in primals)
    _, got = jax.jvp(ours, primals, tangents)
    _, want = jax.jvp(plain, primals, tangents)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=2e-2 * float(jnp.abs(want).max()))
    x32 = x.astype(jnp.float32)
    rest = primals[1:]
    g = jax.grad(lambda a: ours(a.astype(x.dtype), *rest).sum())(x32)
    g_want = jax.grad(lambda a: plain(a, *rest).sum())(x32)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_want), rtol=3e-2, atol=3e-2 * float(jnp.abs(g_want).max()))


@pytest.mark.parametrize("spec", ["column", "row", "data+column", "data+row"])
def test_swiglu_partitioned(mesh, spec):
    # Column-parallel: each device holds whole 16-row groups of gate and up, and writes its
    # columns of y. Row-parallel: the partial pre-activations are summed, then the activation
    # applies once, with the bias, and the residual after it.
    x, w, w64, product, weight_dtype, e = _case("nvfp4", 21, 8, 64, 256, jnp.bfloat16)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    k_split = spec in ("row", "data+row")
    m_axis = "a" if spec.startswith("data") else None
    n_axis = None if k_split else "b"
    wspec, xspec = (P(None, "b"), P(m_axis, "b")) if k_split else (P("b", None), P(m_axis, None))
    ws = jaxgemv.NVFP4Weight(put(w.packed, wspec), put(w.scales, wspec), put(w.global_scale, P()))
    placed = (put(x, xspec), ws, put(e["bias"], P(n_axis)), put(e["row_scale"], P(m_axis)),
              put(e["residual"], P(m_axis, n_axis)))
    f = jax.jit(lambda x, w, b, s, r: product(x, w, bias=b, row_scale=s, residual=r, activation="swiglu"))
    check_partitioned(f, (x, w, e["bias"], e["row_scale"], e["residual"]), placed, k_split)
    _check(f(*placed), x, w64, weight_dtype, e)


def test_swiglu_partitioned_uneven_groups(mesh):
    # N = 48 rows (3 groups of 16) cannot split 4 ways at group boundaries: N stays whole, with a
    # warning, and the result is still right.
    x, w, w64, product, weight_dtype, e = _case("nvfp4", 5, 2, 24, 256, jnp.bfloat16, row_scale=False)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    ws = jaxgemv.NVFP4Weight(put(w.packed, P("b", None)), put(w.scales, P("b", None)), put(w.global_scale, P()))
    f = jax.jit(lambda x, w, b, r: product(x, w, bias=b, residual=r, activation="swiglu"))
    with pytest.warns(UserWarning, match="cannot be split 4 ways at group boundaries"):
        y = f(put(x, P()), ws, put(e["bias"], P()), put(e["residual"], P()))
    _check(y, x, w64, weight_dtype, e)


def test_swiglu_errors():
    x, w, _, product, _, e = _case("nvfp4", 1, 4, 16, 64, jnp.float16, bias=False)
    with pytest.raises(ValueError, match=r"fp4_matmul: activation='gelu': expected None or 'swiglu'"):
        product(x, w, activation="gelu")
    with pytest.raises(ValueError, match=r"fp4_matmul: residual must have the output's shape \(4, 16\)"):
        product(x, w, residual=jnp.zeros((4, 32), jnp.float16), activation="swiglu")
    with pytest.raises(ValueError, match="fp4_matmul: activation='swiglu' runs on the 'mma', 'dequant' or 'cpu'"):
        product(x, w, activation="swiglu", variant="scalar")
    w24 = jaxgemv.quantize_nvfp4(jnp.ones((24, 64), jnp.float32))
    with pytest.raises(ValueError, match="fp4_matmul: activation=.swiglu. needs w.s N"):
        product(x, w24, activation="swiglu")
    _, w8, _, p8, _, _ = _case("int8", 1, 4, 16, 64, jnp.float16)
    with pytest.raises(ValueError, match="int8_matmul: activation=1: expected None or 'swiglu'"):
        p8(x, w8, activation=1)


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=requires_gpu)])
def test_swiglu_dense(platform):
    # dense_matmul's SwiGLU, applied by XLA after its kernel (the split-K kernel on the GPU, M <= 8,
    # and XLA's dot; the C++ handler on CPU), with and without the other epilogue operands and the
    # norm in front.
    device = jax.devices(platform)[0]
    variants = ("cpu", "xla") if platform == "cpu" else ("splitk", "xla")
    # dense_matmul rounds its product to x's dtype before the epilogue, which XLA applies.
    for m, f, k, dtype in [(1, 16, 256, jnp.float16), (5, 40, 2048, jnp.bfloat16)]:
        x, w, w64, product, weight_dtype, e = _case("dense", m + f + k, m, f, k, dtype)
        for variant in variants:
            for extras in (e, {}):
                _check(_call(product, x, w, variant, device, extras), x, w64, weight_dtype, extras,
                       rounded_product=True)
            e_rms = {key: v for key, v in e.items() if key != "row_scale"}
            _check(_call(product, x, w, variant, device, e_rms, rms_eps=EPS), x, w64, weight_dtype, e_rms, rms=True,
                   rounded_product=True)


def test_swiglu_dense_grad_and_partitioned(mesh):
    # d/dx and d/dw through the activation (the dense weight is differentiable), against plain jnp;
    # under pjit with N split at whole groups and with K split (the activation after the sum).
    x, w, w64, _, weight_dtype, e = _case("dense", 7, 4, 32, 256, jnp.bfloat16, row_scale=False)

    def plain(x, w):
        p = jnp.einsum("mk,nk->mn", x.astype(jnp.float32), w.astype(jnp.float32))
        q = p.reshape(p.shape[0], -1, 2, 8)
        return (jax.nn.silu(q[:, :, 0]) * q[:, :, 1]).reshape(p.shape[0], -1)

    ours = lambda x, w: jaxgemv.dense_matmul(x, w, activation="swiglu").astype(jnp.float32)  # noqa: E731
    for arg in (0, 1):
        got = jax.grad(lambda *a: ours(*a).sum(), argnums=arg)(x, w).astype(jnp.float32)
        want = jax.grad(lambda *a: plain(*a).sum(), argnums=arg)(x, w).astype(jnp.float32)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=3e-2,
                                   atol=3e-2 * float(jnp.abs(want).max()))
    f = jax.jit(lambda x, w, b, r: jaxgemv.dense_matmul(x, w, bias=b, residual=r, activation="swiglu"))
    for wspec, xspec, k_split in ((P("b", None), P(), False), (P(None, "b"), P(None, "b"), True)):
        n_axis = None if k_split else "b"
        placed = (jax.device_put(x, NamedSharding(mesh, xspec)),
                  jax.device_put(w, jaxgemv.weight_sharding(w, mesh, wspec, activation="swiglu")),
                  jax.device_put(e["bias"], NamedSharding(mesh, P(n_axis))),
                  jax.device_put(e["residual"], NamedSharding(mesh, P(None, n_axis))))
        check_partitioned(f, (x, w, e["bias"], e["residual"]), placed, k_split)
        _check(f(*placed), x, w64, weight_dtype, e, rounded_product=True)
