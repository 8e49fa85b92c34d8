"""The products' epilogue beyond the bias: y = (x @ W^T) * row_scale + bias + residual, for every
format and variant, against a float64 reference; under vmap, the JVP and pjit; and its errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from checks import check_partitioned, check_product, force_x_in_shared_memory, poisoned_call
from conftest import requires_gpu


def _quantizers(dtype):
    """format -> (quantize float32 [N, K], product, the same-precision baseline's weight dtype)."""
    return {
        "nvfp4": (jaxgemv.quantize_nvfp4, jaxgemv.fp4_matmul, np.float32),
        "fp8": (jaxgemv.quantize_fp8, jaxgemv.fp8_matmul, dtype),
        "int4": (lambda w: jaxgemv.quantize_int4(w, scale_dtype=dtype), jaxgemv.int4_matmul, dtype),
        "int8": (lambda w: jaxgemv.quantize_int8(w, symmetric=False, scale_dtype=dtype), jaxgemv.int8_matmul, dtype),
        "dense": (lambda w: w.astype(dtype), jaxgemv.dense_matmul, dtype),
    }


FORMATS = tuple(_quantizers(jnp.float16))

# (M, N, K, dtype) on the GPU. Every variant: the tensor-core kernel per block (M 1: x in the ring,
# with fp16 block columns for NVFP4; M 3 and 12: x from global memory, one and two m-tiles), the
# warp-per-column kernels, dequantize then dot, and the dense kernels (M <= 8). The persistent
# kernel with x in shared memory (XS_CASES, forced): each warp walks several tiles.
GPU_CASES = [(1, 4098, 2048, jnp.float16), (3, 100, 4096, jnp.bfloat16), (12, 36, 1024, jnp.float16)]
XS_CASES = [(4, 100000, 256, jnp.bfloat16), (12, 4098, 512, jnp.float16)]


def _case(fmt, seed, m, n, k, dtype, bias=True, row_scale=True, residual=True):
    """x varying along K, a weight, and the epilogue operands (row scales spread over 2^-3..2^3,
    so a kernel that drops them fails; a residual of the product's size)."""
    rng = np.random.default_rng(seed)
    quantize, product, weight_dtype = _quantizers(dtype)[fmt]
    w32 = jnp.asarray(rng.standard_normal((n, k)) * np.linspace(0.5, 2.0, k), jnp.float32)
    w = quantize(w32)
    w64 = np.asarray((w if fmt == "dense" else w.dequantize(jnp.float32)), np.float64)
    x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(1.5, 0.5, k), dtype)
    scale = np.sqrt(k)
    epilogue = {}
    if bias:
        epilogue["bias"] = jnp.asarray(rng.standard_normal(n) * scale, dtype)
    if row_scale:
        epilogue["row_scale"] = jnp.asarray(np.exp2(rng.uniform(-3, 3, m)), jnp.float32)
    if residual:
        epilogue["residual"] = jnp.asarray(rng.standard_normal((m, n)) * scale, dtype)
    return x, w, w64, product, weight_dtype, epilogue


def _check(y, x, w64, weight_dtype, epilogue, fmt):
    # dense_matmul rounds its product to x's dtype before the row scale and residual.
    check_product(y, x, w64, epilogue.get("bias"), weight_dtype, epilogue.get("row_scale"), epilogue.get("residual"),
                  rounded_product=fmt == "dense" and ("row_scale" in epilogue or "residual" in epilogue))


def _call(product, x, w, variant, device, epilogue):
    e = dict(epilogue)
    bias = e.pop("bias", None)
    return poisoned_call(product, x, w, bias, variant, device, **e)


def _variants(fmt, platform, k):
    if platform == "cpu":
        return ["cpu", "dequant"] if fmt != "dense" else ["cpu", "xla"]
    return {"nvfp4": ["mma", "scalar", "dequant"], "fp8": ["mma", "scalar", "dequant"], "int4": ["mma", "dequant"],
            "int8": ["mma", "dequant"], "dense": ["splitk", "xla"]}[fmt]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("parts", ["row_scale", "residual", "all"])
def test_epilogue_cpu(fmt, parts):
    # Each operand alone and all three together, every CPU variant; M 1 and 5, ragged N.
    device = jax.devices("cpu")[0]
    for m, n, k, dtype in [(1, 36, 256, jnp.float16), (5, 70, 512, jnp.bfloat16)]:
        flags = dict(bias=parts == "all", row_scale=parts in ("row_scale", "all"), residual=parts in ("residual", "all"))
        x, w, w64, product, weight_dtype, epilogue = _case(fmt, m * n + k, m, n, k, dtype, **flags)
        for variant in _variants(fmt, "cpu", k):
            _check(_call(product, x, w, variant, device, epilogue), x, w64, weight_dtype, epilogue, fmt)


@requires_gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_epilogue_gpu_every_variant(fmt):
    device = jax.devices("gpu")[0]
    for m, n, k, dtype in GPU_CASES:
        if fmt == "dense" and m > 8:
            continue  # the split-K kernel takes M <= 8
        x, w, w64, product, weight_dtype, epilogue = _case(fmt, m * n + k, m, n, k, dtype)
        for variant in _variants(fmt, "gpu", k):
            _check(_call(product, x, w, variant, device, epilogue), x, w64, weight_dtype, epilogue, fmt)


@requires_gpu
@pytest.mark.parametrize("fmt", ["nvfp4", "fp8", "int4", "int8"])
def test_epilogue_gpu_x_in_shared_memory(fmt, monkeypatch):
    force_x_in_shared_memory(monkeypatch, "8")
    device = jax.devices("gpu")[0]
    for m, n, k, dtype in XS_CASES:
        x, w, w64, product, weight_dtype, epilogue = _case(fmt, m + n + k, m, n, k, dtype)
        _check(_call(product, x, w, "mma", device, epilogue), x, w64, weight_dtype, epilogue, fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "dense"])
def test_epilogue_leading_dims_and_vmap(fmt):
    # x [2, 3, K]: row_scale [2, 3], residual [2, 3, N]; vmap over x, row_scale and residual folds
    # them into M, and an unmapped residual is shared by every mapped row block.
    x, w, w64, product, weight_dtype, e = _case(fmt, 3, 6, 40, 256, jnp.bfloat16, bias=False)
    x3, rs3, res3 = x.reshape(2, 3, -1), e["row_scale"].reshape(2, 3), e["residual"].reshape(2, 3, -1)
    y = product(x3, w, row_scale=rs3, residual=res3)
    _check(y.reshape(6, -1), x, w64, weight_dtype, e, fmt)
    ymap = jax.vmap(lambda a, s, r: product(a, w, row_scale=s, residual=r))(x3, rs3, res3)
    np.testing.assert_array_equal(np.asarray(ymap), np.asarray(y))
    shared = jax.vmap(lambda a, s: product(a, w, row_scale=s, residual=res3[0]))(x3, rs3)
    want = product(x3, w, row_scale=rs3, residual=jnp.broadcast_to(res3[0], res3.shape))
    np.testing.assert_array_equal(np.asarray(shared), np.asarray(want))


def test_epilogue_jvp():
    # d/dx, d/drow_scale and d/dresidual against the same derivatives of the plain jnp formula on
    # the dequantized weight.
    x, w, w64, product, _, e = _case("nvfp4", 11, 4, 32, 128, jnp.float16, bias=False)
    w32 = jnp.asarray(w64, jnp.float32)

    def plain(x, s, r):
        y = jnp.einsum("mk,nk->mn", x.astype(jnp.float32), w32) * s[:, None] + r.astype(jnp.float32)
        return y.astype(x.dtype)

    primals = (x, e["row_scale"], e["residual"])
    rng = np.random.default_rng(2)
    tangents = tuple(jnp.asarray(rng.standard_normal(p.shape), p.dtype) for p in primals)
    _, got = jax.jvp(lambda a, s, r: product(a, w, row_scale=s, residual=r), primals, tangents)
    _, want = jax.jvp(plain, primals, tangents)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=2e-2,
                               atol=2e-2 * float(jnp.abs(want.astype(jnp.float32)).max()))
    # Reverse mode through the same JVP: d sum(y) / d row_scale is each row's sum of x . W^T.
    grad = jax.grad(lambda s: product(x, w, row_scale=s, residual=e["residual"]).astype(jnp.float32).sum())
    want_rs = np.asarray(x, np.float64) @ w64.T
    np.testing.assert_allclose(np.asarray(grad(e["row_scale"])), want_rs.sum(axis=1), rtol=2e-2,
                               atol=2e-2 * np.abs(want_rs.sum(axis=1)).max())


@pytest.mark.parametrize("spec", ["column", "row", "data+column"])
def test_epilogue_partitioned(mesh, spec):
    # Column-parallel: the residual shards with y. Row-parallel: the row scale applies to each
    # partial product (it commutes with the sum), the bias and residual once after the all-reduce.
    # Data-parallel: the row scale and the residual shard with x's rows.
    x, w, _, product, _, e = _case("nvfp4", 21, 8, 64, 256, jnp.bfloat16)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    n_axis = None if spec == "row" else "b"
    m_axis = "a" if spec == "data+column" else None
    wspec, xspec = (P(None, "b"), P(None, "b")) if spec == "row" else (P("b", None), P(m_axis, None))
    ws = jaxgemv.NVFP4Weight(put(w.packed, wspec), put(w.scales, wspec), put(w.global_scale, P()))
    placed = (put(x, xspec), ws, put(e["bias"], P(n_axis)), put(e["row_scale"], P(m_axis)),
              put(e["residual"], P(m_axis, n_axis)))
    f = jax.jit(lambda x, w, b, s, r: product(x, w, bias=b, row_scale=s, residual=r))
    check_partitioned(f, (x, w, e["bias"], e["row_scale"], e["residual"]), placed, spec == "row")


def test_epilogue_errors():
    x, w, _, product, _, e = _case("nvfp4", 1, 4, 16, 64, jnp.float16, bias=False)
    with pytest.raises(ValueError, match=r"fp4_matmul: row_scale must have x's leading shape \(4,\)"):
        product(x, w, row_scale=e["row_scale"][:3])
    with pytest.raises(TypeError, match="fp4_matmul: row_scale must be floating point"):
        product(x, w, row_scale=jnp.ones(4, jnp.int32))
    with pytest.raises(ValueError, match=r"fp4_matmul: residual must have the output's shape \(4, 16\)"):
        product(x, w, residual=e["residual"][:, :8])
    with pytest.raises(TypeError, match="fp4_matmul: residual must have x's dtype float16"):
        product(x, w, residual=e["residual"].astype(jnp.bfloat16))
    with pytest.raises(ValueError, match=r"int4_matmul: residual must have the output's shape"):
        _, w4, _, p4, _, _ = _case("int4", 1, 4, 16, 64, jnp.float16)
        p4(x, w4, residual=jnp.zeros((4, 17), jnp.float16))


def test_epilogue_empty_product():
    # M = 0 rows: an empty result; N = 0 likewise, whatever the epilogue.
    x, w, _, product, _, e = _case("nvfp4", 1, 4, 16, 64, jnp.float16)
    y = product(x[:0], w, bias=e["bias"], row_scale=e["row_scale"][:0], residual=e["residual"][:0])
    assert y.shape == (0, 16)
