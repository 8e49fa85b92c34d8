"""The "wgmma" variant of fp8_matmul (ffi/fp8_wgmma.cuh): its plan and errors on CPU, its kernel
against float64 on an sm_90 GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemv
from jaxgemv import bench, fp8, planner
from jaxgemv.device import DeviceFacts, facts_of
from checks import check_product, poisoned_call
from conftest import gpu_available, requires_gpu
from test_fp8 import _dequant_f64, _random_weight

H100 = DeviceFacts("cuda", (9, 0), 132)
A100 = DeviceFacts("cuda", (8, 0), 108)
B200 = DeviceFacts("cuda", (10, 0), 148)
CPU = DeviceFacts("cpu")


# ---------------------------------------------------------------------------------------------
# Plan (CPU)


@pytest.mark.parametrize("block_k", [32, 64, 128, 256])
def test_wgmma_plan_leaves_the_k_split_to_the_launcher(block_k):
    assert planner.plan_fp8(1, 5120, 17408, block_k, H100, "wgmma") == planner.Plan("wgmma", ksplit=0)
    assert planner.plan_fp8(8, 64, 128, block_k, H100, "wgmma") == planner.Plan("wgmma", ksplit=0)


def test_wgmma_plan_follows_the_k_split_knob(monkeypatch):
    monkeypatch.setenv("JAXGEMV_KSPLIT", "2")
    assert planner.plan_fp8(4, 8192, 8192, 128, H100, "wgmma").ksplit == 2


@pytest.mark.parametrize("m, k, block_k, act, facts, why", [
    (9, 4096, 128, None, H100, "M <= 8"),
    (1, 4160, 128, None, H100, "multiple of 128"),  # a whole 64-value window, not a 128-value one
    (1, 2080, 32, None, H100, "multiple of 128"),
    (1, 4096, 128, "swiglu", H100, "swiglu"),
    (1, 4096, 128, None, A100, "compute capability 9.0, the device has 8.0"),
    (1, 4096, 128, None, B200, "compute capability 9.0, the device has 10.0"),  # sm_90a code runs on 9.0 alone
    (1, 4096, 128, None, CPU, "needs a CUDA device"),
])
def test_wgmma_plan_says_why_it_cannot_run(m, k, block_k, act, facts, why):
    with pytest.raises(ValueError, match=f"variant='wgmma' cannot run this product: .*{why}"):
        planner.plan_fp8(m, 8192, k, block_k, facts, "wgmma", act)


def test_wgmma_from_the_environment_leaves_what_it_cannot_run_to_the_planner(monkeypatch):
    int4_plan = planner.plan_nbits(1, 8192, 4096, 4, 32, H100)
    monkeypatch.setenv("JAXGEMV_VARIANT", "wgmma")
    assert planner.plan_fp8(1, 8192, 4096, 128, H100).variant == "wgmma"
    assert planner.plan_fp8(9, 8192, 4096, 128, H100).variant == "mma"  # M = 9
    assert planner.plan_fp8(1, 8192, 4096, 128, A100).variant == "mma"
    # Other formats take it as unforced, and FP8 takes int4 / int8's own as unforced.
    assert planner.plan_nbits(1, 8192, 4096, 4, 32, H100) == int4_plan
    monkeypatch.setenv("JAXGEMV_VARIANT", "imma")
    assert planner.plan_fp8(1, 8192, 4096, 128, H100).variant == "mma"


def test_wgmma_scratch_holds_the_k_split_sums_and_counters():
    # With a K split (K = 4096: 32 windows of 128 values, K split 8 unless forced) 64 float32 sums
    # per tile, split and row of x, and a counter per tile (N = 200: 4 tiles); 16 bytes without.
    per_tile = lambda ks, m: 4 * (ks * m * 64 * 4 + 4)  # noqa: E731
    assert fp8.wgmma_scratch_bytes(1, 200, 4096, 0) == per_tile(8, 1)
    assert fp8.wgmma_scratch_bytes(3, 200, 4096, 2) == per_tile(2, 3)
    assert fp8.wgmma_scratch_bytes(8, 200, 256, 0) == 16  # K split 1: two windows
    assert fp8.wgmma_scratch_bytes(4, 200, 4096, 1) == 16


def test_wgmma_ksplit_choice():
    # The largest of 8, 4, 2 that leaves a block four windows of 128 values, else 1; a forced one
    # as forced, at most one block a window.
    assert [fp8.wgmma_ksplit(k, 0) for k in (128, 1024, 2048, 4096, 17408)] == [1, 2, 4, 8, 8]
    assert fp8.wgmma_ksplit(4096, 2) == 2 and fp8.wgmma_ksplit(256, 8) == 2


@pytest.mark.skipif(jaxgemv._ext.fp8_wgmma_scratch_bytes is None, reason="a build without CUDA")
def test_wgmma_scratch_bytes_and_ksplit_mirror_the_kernel():
    for m in range(1, 9):
        for n, k in ((1, 128), (200, 2048), (5120, 17408), (130, 640)):
            for ksplit in (0, 1, 2, 4, 8):
                assert fp8.wgmma_scratch_bytes(m, n, k, ksplit) == jaxgemv._ext.fp8_wgmma_scratch_bytes(
                    m, n, k, ksplit), (m, n, k, ksplit)
                assert fp8.wgmma_ksplit(k, ksplit) == jaxgemv._ext.fp8_wgmma_ksplit(k, ksplit)


def test_wgmma_label():
    plan = planner.Plan("wgmma", ksplit=0)
    assert bench.plan_label(plan) == "wgmma"
    assert bench.plan_label(plan, (8, False, False, False)) == "wgmma k8"


def test_wgmma_on_cpu_fails_at_trace_time_naming_the_variant():
    w = jaxgemv.quantize_fp8(jnp.ones((16, 256), jnp.float32))
    x, w = jax.device_put((jnp.ones((1, 256), jnp.float16), w), jax.devices("cpu")[0])
    with pytest.raises(ValueError, match="wgmma"):
        jax.jit(lambda x, w: jaxgemv.fp8_matmul(x, w, variant="wgmma"))(x, w)


def test_other_formats_refuse_wgmma():
    x = jnp.ones((1, 256), jnp.float16)
    w = jaxgemv.quantize_int4(jnp.ones((16, 256), jnp.float32), block_size=32)
    with pytest.raises(ValueError, match="variant='wgmma'"):
        jaxgemv.int4_matmul(x, w, variant="wgmma")


# ---------------------------------------------------------------------------------------------
# Kernel (sm_90 GPU)


def _sm90() -> bool:
    return gpu_available() and facts_of(jax.devices("gpu")[0]).compute_capability == planner.WGMMA_CC


requires_sm90 = pytest.mark.skipif(not _sm90(), reason="needs a compute capability 9.0 GPU (wgmma, sm_90a)")

# (M, N, K, block): ragged N (tiles cut at 1, 7 and 2 rows), one window (K split 1), two (K split
# 1 at the launcher's rule), many (K split 8, windows unequal among the splits), every block shape
# (four, two, one scale a window; one per two windows at 256; (128, 128)), M 1-8 (x's planes in
# 8, 16 and 24 columns, partly empty).
WGMMA_CASES = [(1, 65, 128, (1, 128)), (2, 199, 256, (1, 32)), (1, 1030, 4480, (1, 64)), (3, 130, 2048, (128, 128)),
               (4, 300, 1152, (1, 256)), (5, 64, 3072, (1, 32)), (6, 1000, 1024, (1, 128)), (8, 2050, 2048, (1, 64)),
               (7, 40, 17408, (128, 128))]


def _wgmma_check(dtype, cases, *, outlier=False, **epilogue_of):
    device = jax.devices("gpu")[0]
    for m, n, k, block in cases:
        rng = np.random.default_rng(m * n + k)
        w = _random_weight(rng, n, k, block)
        xs = rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k)
        if outlier:  # one value 2^10 above the rest of its group (small: fp16 y holds its products)
            xs = xs / 64
            xs[:, k // 3] = 16.0
        x = jnp.asarray(xs, dtype)
        bias = jnp.asarray(rng.standard_normal(n), dtype)
        extra = {name: make(rng, m, n, dtype) for name, make in epilogue_of.items()}
        y = poisoned_call(jaxgemv.fp8_matmul, x, w, bias, "wgmma", device, **extra)
        check_product(y, x, _dequant_f64(w), bias, x.dtype, row_scale=extra.get("row_scale"),
                      residual=extra.get("residual"))


@requires_sm90
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit", ["", "1", "2", "4", "8"])
def test_wgmma_every_ksplit(dtype, ksplit, monkeypatch):
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    _wgmma_check(dtype, WGMMA_CASES)


@requires_sm90
def test_wgmma_epilogue_and_outliers():
    row_scale = lambda rng, m, n, dtype: jnp.asarray(rng.uniform(0.5, 2.0, m), jnp.float32)  # noqa: E731
    residual = lambda rng, m, n, dtype: jnp.asarray(rng.standard_normal((m, n)), dtype)  # noqa: E731
    _wgmma_check(jnp.float16, [(2, 200, 2048, (1, 128)), (7, 200, 1024, (128, 128))], row_scale=row_scale,
                 residual=residual)
    _wgmma_check(jnp.float16, [(1, 200, 2048, (1, 64)), (8, 100, 2048, (1, 128))], outlier=True)
    _wgmma_check(jnp.bfloat16, [(1, 200, 2048, (1, 64)), (2, 200, 4096, (1, 32)), (8, 100, 2048, (1, 128))],
                 outlier=True)


@requires_sm90
def test_wgmma_rms_eps():
    # The row scale of an RMSNorm in front, rsqrt(mean(x^2) + eps), from XLA's sums of squares.
    rng = np.random.default_rng(5)
    w = _random_weight(rng, 300, 2048, (1, 128))
    x = jnp.asarray(rng.standard_normal((2, 2048)) * 3, jnp.bfloat16)
    got = jaxgemv.fp8_matmul(x, w, rms_eps=1e-5, variant="wgmma")
    x64 = np.asarray(x).astype(np.float64)
    rs = 1 / np.sqrt(np.mean(x64 * x64, axis=1) + 1e-5)
    check_product(got, x, _dequant_f64(w), None, x.dtype, row_scale=rs)


@requires_sm90
def test_wgmma_rows_of_zeros_and_of_nan():
    # A row of zeros gives zeros (its factors from a largest |x| of 0); a NaN in a row makes that
    # row's outputs NaN and leaves the other row alone.
    rng = np.random.default_rng(6)
    w = _random_weight(rng, 64, 512, (1, 128))
    xs = rng.standard_normal((2, 512))
    xs[0] = 0.0
    y = np.asarray(jaxgemv.fp8_matmul(jnp.asarray(xs, jnp.float16), w, variant="wgmma"), np.float64)
    assert np.all(y[0] == 0)
    check_product(y[1:], jnp.asarray(xs[1:], jnp.float16), _dequant_f64(w), None, jnp.float16)
    xs[0, 100] = np.nan
    y = np.asarray(jaxgemv.fp8_matmul(jnp.asarray(xs, jnp.float16), w, variant="wgmma"), np.float64)
    assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1]))


@requires_sm90
def test_wgmma_under_jit_with_other_products():
    # Twice in one jitted function with a dense op between (K split 2, then 1): each call's
    # scratch result and counters are its own.
    rng = np.random.default_rng(8)
    w1, w2 = _random_weight(rng, 512, 1024, (1, 128)), _random_weight(rng, 1024, 512, (128, 128))
    x = jnp.asarray(rng.standard_normal((3, 1024)), jnp.bfloat16)

    @jax.jit
    def two(x):
        h = jaxgemv.fp8_matmul(x, w1, variant="wgmma")
        return jaxgemv.fp8_matmul(jnp.tanh(h), w2, variant="wgmma")

    h = jaxgemv.fp8_matmul(x, w1, variant="mma")
    want = jaxgemv.fp8_matmul(jnp.tanh(h), w2, variant="mma")
    got = two(x)
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=0.05, atol=0.05 * float(
        np.max(np.abs(np.asarray(want, np.float32)))))
