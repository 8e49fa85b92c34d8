"""dense_matmul: every variant against a float64 reference, errors, transformations, sharding, and
on a GPU the split-K kernel at every cluster size and its bitwise repeatability."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from checks import SHARDING_CASES, check_partitioned, check_product, on_cpu, poisoned_call
from conftest import gpu_available, requires_gpu

DTYPES = [jnp.float16, jnp.bfloat16]

# (M, N, K): M over 1..17 (9 and 17 past the kernel's 8 rows), N ragged against the 16-column
# tile (1, 7, 130) and the seed's largest (1024), K of one window (128), one chunk past whole
# windows (136), the seed's 2048, and 4100 (K % 8 != 0: XLA only).
M_SWEEP, N_SWEEP, K_SWEEP = (1, 2, 3, 5, 8, 9, 17), (1, 7, 32, 130, 1024), (128, 136, 2048, 4100)
SHAPES = sorted(
    {(m, 130, 2048) for m in M_SWEEP}
    | {(3, n, 136) for n in N_SWEEP}
    | {(8, n, 2048) for n in N_SWEEP}
    | {(5, 32, k) for k in K_SWEEP}
    | {(1, 7, k) for k in K_SWEEP}
    | {(8, 1024, 4100), (1, 1024, 4096), (9, 1, 128), (17, 1024, 136), (2, 1, 2048)}
)


def _ids(shapes):
    return [f"M{m}-N{n}-K{k}" for m, n, k in shapes]


def _inputs(seed, m, n, k, dtype, with_bias):
    """x and w random and scaled along K (a wrong K mapping cannot pass), never all zeros."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.5, 1.5, k, dtype=np.float32)
    x = rng.standard_normal((m, k)).astype(np.float32) * ramp
    w = rng.standard_normal((n, k)).astype(np.float32) * ramp[::-1] / np.sqrt(k)
    bias = jnp.asarray(rng.standard_normal(n), dtype) if with_bias else None
    return jnp.asarray(x, dtype), jnp.asarray(w, dtype), bias


def _check(y, x, w, bias):
    """The weight is exact in x's dtype: the baseline is the float32 product rounded once."""
    check_product(y, x, np.asarray(w).astype(np.float64), bias, x.dtype)


def _poisoned_call(x, w, bias, variant, device):
    return poisoned_call(jaxgemv.dense_matmul, x, w, bias, variant, device)


def _splitk_ok(k):
    dev = jax.devices("gpu")[0]
    return k % 8 == 0 and tuple(int(v) for v in str(dev.compute_capability).split(".")) >= (9, 0)


def _variants(platform, m, k):
    if platform == "cpu":
        return ["auto", "cpu", "xla"]
    return ["auto", "xla"] + (["splitk"] if m <= 8 and _splitk_ok(k) else [])


@pytest.mark.parametrize("platform", ["cpu", pytest.param("gpu", marks=requires_gpu)])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids(SHAPES))
def test_matmul(shape, dtype, platform):
    m, n, k = shape
    device = jax.devices(platform)[0]
    for with_bias in (False, True):
        x, w, bias = _inputs(hash((shape, with_bias)) % 2**32, m, n, k, dtype, with_bias)
        for variant in _variants(platform, m, k):
            _check(_poisoned_call(x, w, bias, variant, device), x, w, bias)


def _need_splitk():
    if not _splitk_ok(8):
        pytest.skip("the splitk kernel needs compute capability 9.0")


@requires_gpu
@pytest.mark.parametrize("splits", ["1", "2", "4", "8", "16"])
def test_every_split_gpu(splits, monkeypatch):
    """Each cluster size forced, on shapes where some warps get no K (K = 136 over 16 x 4 warps),
    ragged N, M from 1 to 8 and a K that takes several iterations per warp."""
    _need_splitk()
    monkeypatch.setenv("JAXGEMV_SPLITS", splits)
    device = jax.devices("gpu")[0]
    for i, (m, n, k) in enumerate([(1, 1, 128), (3, 7, 136), (8, 130, 2048), (5, 1024, 4096), (2, 33, 65536),
                                   (8, 4096, 1024)]):
        x, w, bias = _inputs(m * n + k, m, n, k, DTYPES[i % 2], with_bias=i % 2 == 0)
        _check(_poisoned_call(x, w, bias, "splitk", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("shape", [(1, 32, 2048), (8, 1024, 4096), (4, 1, 4096), (8, 256, 2048)],
                         ids=lambda s: f"M{s[0]}-N{s[1]}-K{s[2]}")
def test_bitwise_repeatable_gpu(shape):
    """100 runs of the same product give the same bits (the reduction order is fixed)."""
    _need_splitk()
    m, n, k = shape
    x, w, bias = _inputs(7, m, n, k, jnp.bfloat16, with_bias=True)
    f = jax.jit(lambda x, w, b: jaxgemv.dense_matmul(x, w, bias=b, variant="splitk"))
    first = np.asarray(f(x, w, bias)).view(np.uint16)
    _check(first.view(jnp.bfloat16), x, w, bias)
    for _ in range(99):
        np.testing.assert_array_equal(np.asarray(f(x, w, bias)).view(np.uint16), first)


def test_errors_name_the_argument():
    x, w, bias = _inputs(2, 2, 36, 128, jnp.float16, True)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        jaxgemv.dense_matmul(x.astype(jnp.float32), w.astype(jnp.float32))
    with pytest.raises(TypeError, match="w must be float16 or bfloat16, got float32"):
        jaxgemv.dense_matmul(x, w.astype(jnp.float32))
    with pytest.raises(TypeError, match="w must have x's dtype float16, got bfloat16"):
        jaxgemv.dense_matmul(x, w.astype(jnp.bfloat16))
    with pytest.raises(TypeError, match="w must be an array"):
        jaxgemv.dense_matmul(x, "w")
    with pytest.raises(ValueError, match=r"w must be 2-D \[N, K\], got shape \(128,\)"):
        jaxgemv.dense_matmul(x, w[0])
    with pytest.raises(ValueError, match=r"x must have shape \[..., 128\] to match w \[36, 128\]"):
        jaxgemv.dense_matmul(x[:, :64], w)
    with pytest.raises(ValueError, match=r"bias must have shape \(36,\)"):
        jaxgemv.dense_matmul(x, w, bias=bias[:5])
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        jaxgemv.dense_matmul(x, w, bias=bias.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="variant='mma': expected one of auto, splitk, xla, cpu"):
        jaxgemv.dense_matmul(x, w, variant="mma")
    if not gpu_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            jax.jit(lambda x, w: jaxgemv.dense_matmul(x, w, variant="splitk")).lower(x, w)


def test_empty_and_leading_dims():
    x, w, bias = _inputs(3, 6, 36, 128, jnp.bfloat16, True)
    assert jaxgemv.dense_matmul(x[:0], w).shape == (0, 36)
    assert jaxgemv.dense_matmul(x, w[:0]).shape == (6, 0)
    flat = np.asarray(jaxgemv.dense_matmul(x, w, bias=bias))
    np.testing.assert_array_equal(np.asarray(jaxgemv.dense_matmul(x.reshape(2, 3, 128), w, bias=bias)).reshape(6, 36),
                                  flat)
    mapped = jax.vmap(lambda r: jaxgemv.dense_matmul(r, w, bias=bias))(x.reshape(2, 3, 128))
    np.testing.assert_array_equal(np.asarray(mapped).reshape(6, 36), flat)
    with pytest.raises(NotImplementedError, match="map over x only"):
        jax.vmap(lambda w: jaxgemv.dense_matmul(x, w))(jnp.stack([w, w]))


def test_grad_wrt_x_w_and_bias():
    """d/dx, d/dw and d/dbias against the same gradients of the jnp reference (float32 math on
    the same fp16 values)."""
    x, w, bias = _inputs(4, 3, 40, 136, jnp.float16, True)
    cot = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)

    def loss(f):
        return lambda x, w, b: jnp.sum(f(x, w, bias=b).astype(jnp.float32) * cot)

    got = jax.grad(loss(jaxgemv.dense_matmul), argnums=(0, 1, 2))(x, w, bias)
    want = jax.grad(loss(jaxgemv.dense_matmul_reference), argnums=(0, 1, 2))(x, w, bias)
    for g, r, name in zip(got, want, ("x", "w", "bias")):
        g32, r32 = np.asarray(g, np.float32), np.asarray(r, np.float32)
        assert g.dtype == r.dtype and g.shape == r.shape, name
        np.testing.assert_allclose(g32, r32, rtol=0, atol=2.0**-9 * np.abs(r32).max(), err_msg=name)
    dx = np.asarray(got[0], np.float64)
    np.testing.assert_allclose(dx, cot @ np.asarray(w, np.float64), rtol=0, atol=2.0**-9 * np.abs(dx).max())

    # jvp in w alone, under jit.
    dw = jnp.ones_like(w)
    _, dy = jax.jit(lambda w, t: jax.jvp(lambda w: jaxgemv.dense_matmul(x, w), (w,), (t,)))(w, dw)
    want_dy = np.asarray(x, np.float32) @ np.ones((136, 40), np.float32)
    np.testing.assert_allclose(np.asarray(dy, np.float32), want_dy, rtol=2.0**-9, atol=2.0**-9 * np.abs(want_dy).max())


def test_export_round_trip():
    pytest.importorskip("flatbuffers")
    x, w, bias = on_cpu(_inputs(5, 4, 36, 256, jnp.bfloat16, True))
    f = jax.jit(lambda x, w, b: jaxgemv.dense_matmul(x, w, bias=b, variant="cpu"))
    allow = [jax.export.DisabledSafetyCheck.custom_call("jaxgemv_dense_matmul")]
    exported = jax.export.export(f, disabled_checks=allow, platforms=["cpu"])(x, w, bias)
    again = jax.export.deserialize(exported.serialize())
    np.testing.assert_array_equal(np.asarray(again.call(x, w, bias)), np.asarray(f(x, w, bias)))


@pytest.mark.parametrize("variant", ["auto", "cpu"])  # auto: XLA's dot on the CPU
@pytest.mark.parametrize("case", SHARDING_CASES)
def test_sharded(mesh, case, variant):
    """Partitioned, not gathered: no all-gather, an all-reduce exactly when K is split, and the
    bias added once after it."""
    xspec, wspec, bspec, k_sharded = SHARDING_CASES[case]
    x, w, _ = _inputs(11, 8, 64, 512, jnp.bfloat16, False)
    bias = jnp.full((64,), 100.0, jnp.bfloat16)  # added on each of 4 K shards it would be 300 off
    f = jax.jit(lambda x, w, b: jaxgemv.dense_matmul(x, w, bias=b, variant=variant))
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    check_partitioned(f, (x, w, bias), (put(x, xspec), put(w, wspec), put(bias, bspec)), k_sharded)


def test_sharded_k_not_a_multiple_of_8(mesh):
    """K = 132 cannot keep 16-byte rows in K shards: the product partitions on N only, and a
    K-sharded x or w is gathered along K (correct, not fast)."""
    x, w, bias = _inputs(12, 4, 64, 132, jnp.float16, True)
    f = jax.jit(lambda x, w, b: jaxgemv.dense_matmul(x, w, bias=b, variant="cpu"))
    want = np.asarray(f(*on_cpu((x, w, bias))), np.float32)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    for xspec, wspec in ((P(), P("b", None)), (P(None, "b"), P(None, "b"))):
        got = np.asarray(f(put(x, xspec), put(w, wspec), put(bias, P())), np.float32)
        np.testing.assert_array_equal(got, want)
