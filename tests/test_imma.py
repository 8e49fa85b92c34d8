"""The "imma" variant of int4_matmul / int8_matmul (ffi/imma.cuh): its plan and errors on CPU, its
kernel against float64 on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemv
from jaxgemv import bench, nbits, planner
from jaxgemv.device import DeviceFacts
from checks import check_product, poisoned_call
from conftest import requires_gpu
from test_nbits import _dequant_f64, _random_weight

H100 = DeviceFacts("cuda", (9, 0), 132)
CPU = DeviceFacts("cpu")


# ---------------------------------------------------------------------------------------------
# Plan (CPU)


@pytest.mark.parametrize("bits, k, loads", [(8, 4096, 2), (8, 4224, 1), (4, 4096, 1), (4, 1000, 1), (8, 1000, 2)])
def test_imma_plan_takes_the_wider_window_where_k_fills_it(bits, k, loads):
    # int8 runs windows of 256 values (two loads) where K padded to whole blocks fills them, else
    # 128; int4 runs 256 (one load). K 1000 at blocks of 32 pads to 1024.
    plan = planner.plan_nbits(1, 8192, k, bits, 32, H100, "imma")
    assert (plan.variant, plan.ksplit, plan.loads) == ("imma", 0, loads)


def test_imma_plan_follows_the_launch_knobs(monkeypatch):
    monkeypatch.setenv("JAXGEMV_KSPLIT", "4")
    monkeypatch.setenv("JAXGEMV_LOADS", "2")
    plan = planner.plan_nbits(2, 8192, 8192, 4, 64, H100, "imma")
    assert (plan.ksplit, plan.loads) == (4, 2)


@pytest.mark.parametrize("m, k, bs, has_zp, act, why", [
    (9, 4096, 32, False, None, "M <= 8"),
    (1, 4096, 32, True, None, "zero points"),
    (1, 4096, 32, False, "swiglu", "swiglu"),
    (1, 4096, 16, False, None, "block_size"),
    (1, 4096, 256, False, None, "block_size"),
    (1, 4160, 64, False, None, "multiple of its window"),
    (1, (1 << 24) + 256, 128, False, None, "K up to 16777216"),
])
def test_imma_plan_says_why_it_cannot_run(m, k, bs, has_zp, act, why):
    with pytest.raises(ValueError, match=why):
        planner.plan_nbits(m, 8192, k, 8, bs, H100, "imma", has_zp, act)


def test_imma_needs_cuda_and_sm80():
    with pytest.raises(ValueError, match="CUDA"):
        planner.plan_nbits(1, 8192, 4096, 8, 32, CPU, "imma")
    with pytest.raises(ValueError, match="compute capability 8.0"):
        planner.plan_nbits(1, 8192, 4096, 8, 32, DeviceFacts("cuda", (7, 5), 40), "imma")


def test_imma_from_the_environment_leaves_what_it_cannot_run_to_the_planner(monkeypatch):
    monkeypatch.setenv("JAXGEMV_VARIANT", "imma")
    assert planner.plan_nbits(1, 8192, 4096, 8, 32, H100).variant == "imma"  # not "auto"'s shape
    assert planner.plan_nbits(1, 8192, 4096, 4, 32, H100).variant == "imma"
    assert planner.plan_nbits(9, 8192, 4096, 8, 32, H100).variant == "mma"  # M = 9
    assert planner.plan_nbits(1, 8192, 4096, 8, 32, H100, has_zp=True).variant == "mma"
    # The other formats read it as unforced.
    assert planner.plan_fp8(1, 8192, 4096, 128, H100).variant == "mma"
    assert planner.plan_nbits(1, 8192, 4096, 8, 32, CPU).variant == "cpu"


@pytest.mark.parametrize("m, n, k, bits, facts, has_zp, act, variant", [
    (1, 8192, 28672, 8, H100, False, None, "imma"),  # timed faster (perf log 145)
    (2, 5120, 17408, 8, H100, False, None, "imma"),
    (2, 8192, 8192, 8, H100, False, None, "imma"),
    (3, 8192, 8192, 8, H100, False, None, "imma"),  # M = 3-6: 2-10% faster (perf log 147)
    (6, 4096, 14336, 8, H100, False, None, "imma"),
    (7, 8192, 8192, 8, H100, False, None, "mma"),  # M = 8 lost on one shape of six: not taken past 6
    (1, 8192, 28672, 4, H100, False, None, "mma"),  # int4 at M = 1: 3% slower (perf log 146)
    (2, 8192, 28672, 4, H100, False, None, "imma"),  # int4 at M = 2, N = 8192, K >= 16384: 9-11% faster
    (2, 8192, 16384, 4, H100, False, None, "imma"),
    (2, 8192, 8192, 4, H100, False, None, "mma"),  # shorter K
    (2, 6144, 16384, 4, H100, False, None, "mma"),  # N = 6144: within 2%
    (2, 10240, 8192, 4, H100, False, None, "mma"),  # "mma"'s x-ahead instance: 4% ahead
    (3, 8192, 28672, 4, H100, False, None, "imma"),  # M = 3-4 there: 6-8% (perf log 147)
    (4, 8192, 16384, 4, H100, False, None, "imma"),
    (5, 8192, 28672, 4, H100, False, None, "mma"),  # M = 8 lost
    (4, 6144, 16384, 4, H100, False, None, "mma"),
    (1, 10240, 8192, 8, H100, False, None, "imma"),  # taller grids at M <= 4: 3-9% (perf log 147)
    (4, 28672, 8192, 8, H100, False, None, "imma"),
    (5, 10240, 8192, 8, H100, False, None, "mma"),  # 28672 x 8192 at M = 6: 16% slower
    (1, 32768, 8192, 8, H100, False, None, "mma"),  # taller than timed
    (1, 248320, 2048, 8, H100, False, None, "imma"),  # int8 lm_heads at M <= 4: 1.5-4% (perf log 160)
    (4, 151936, 2048, 8, H100, False, None, "imma"),
    (5, 151936, 2048, 8, H100, False, None, "mma"),  # M = 8 lost 8-10% on an H200 (perf log 171)
    (8, 151936, 2048, 8, H100, False, None, "mma"),
    (9, 151936, 2048, 8, H100, False, None, "mma"),  # past the kernel's M
    (1, 131072, 2048, 8, H100, False, None, "mma"),  # shorter than the lm_heads timed
    (1, 248320, 1024, 8, H100, False, None, "mma"),
    (1, 248320, 2048, 4, H100, False, None, "mma"),  # int4's lm_heads: untimed
    (1, 8192, 4096, 8, H100, False, None, "mma"),  # shorter K not timed
    (1, 8192, 8192, 8, H100, True, None, "mma"),  # zero points: not the kernel's
    (1, 8192, 8192, 8, H100, False, "swiglu", "mma"),
    (1, 8192, 8192, 8, DeviceFacts("cuda", (8, 0), 108), False, None, "mma"),  # sm_80 not timed
])
def test_auto_takes_imma_where_it_was_timed_faster(m, n, k, bits, facts, has_zp, act, variant, monkeypatch):
    # imma's rule alone: xshare's, which "auto" tries first (test_xshare.py), is off here.
    monkeypatch.setattr(planner, "XSHARE_AUTO", {})
    assert planner.plan_nbits(m, n, k, bits, 32, facts, "auto", has_zp, act).variant == variant
    assert planner.plan_nbits(m, n, k, bits, 32, facts, "mma", has_zp, act).variant == "mma"


def test_auto_imma_leaves_what_the_kernel_cannot_run(monkeypatch):
    monkeypatch.setattr(planner, "XSHARE_AUTO", {})
    # Blocks of 256 (the kernel takes 32-128) and a K that does not fill whole windows.
    assert planner.plan_nbits(1, 8192, 8192, 8, 256, H100).variant == "mma"
    assert planner.plan_nbits(1, 8192, 8256, 8, 32, H100).variant == "mma"


def test_imma_scratch_holds_three_planes_a_row():
    # K 1000 at blocks of 32: 32 groups of 32 values; 3 planes x 32 bytes a group and row, 128 bytes
    # of factors.
    assert nbits.imma_scratch_bytes(1000, 32, 1) == 32 * 3 * 32 + 128
    assert nbits.imma_scratch_bytes(4096, 128, 8) == 128 * 24 * 32 + 128


def test_imma_label():
    plan = planner.Plan("imma", ksplit=0, loads=2)
    assert bench.plan_label(plan) == "imma k0 l2"
    assert bench.plan_label(plan, (4, False, False, False)) == "imma k4 l2"


def test_imma_on_cpu_fails_at_trace_time_naming_the_variant():
    rng = np.random.default_rng(0)
    w, _, _ = _random_weight(rng, 16, 256, 8, 32, False, jnp.float16)
    x, w = jax.device_put((jnp.ones((1, 256), jnp.float16), w), jax.devices("cpu")[0])
    with pytest.raises(ValueError, match="imma"):
        jax.jit(lambda x, w: jaxgemv.int8_matmul(x, w, variant="imma"))(x, w)


def test_other_formats_refuse_imma():
    x = jnp.ones((1, 64), jnp.float16)
    w = jaxgemv.quantize_fp8(jnp.ones((16, 64), jnp.float32), block=(1, 64))
    with pytest.raises(ValueError, match="variant='imma'"):
        jaxgemv.fp8_matmul(x, w, variant="imma")


# ---------------------------------------------------------------------------------------------
# Kernel (GPU)

# (M, N, K, block size): ragged N (tiles cut at 7 and 3 rows), K padded to whole blocks (1000 at
# 32 -> 1024), one window per row, many windows (K split 8 with unequal windows per warp), blocks
# of 64 and 128 (int32 sums over two and four groups before the scale), M 1-8 (x's 3 M columns in
# one, two and three mmas of eight, the last one partly empty).
IMMA_CASES = [(1, 199, 1000, 32), (2, 1030, 2048, 32), (1, 35, 256, 64), (2, 48, 5376, 128), (1, 4104, 3072, 64),
              (2, 2051, 1024, 128), (3, 100, 1024, 32), (4, 1030, 2048, 64), (5, 40, 768, 128), (6, 300, 2048, 32),
              (8, 2051, 1024, 32)]


def _imma_check(bits, dtype, cases, *, outlier=False, **epilogue_of):
    f = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    device = jax.devices("gpu")[0]
    for m, n, k, bs in cases:
        rng = np.random.default_rng(m * n + k + bits)
        w, codes, _ = _random_weight(rng, n, k, bits, bs, False, dtype)
        xs = rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k)
        if outlier:  # one value 2^10 above the rest: x's planes keep the rest to 2^-20 of it
            xs[:, k // 3] = 1024.0
        x = jnp.asarray(xs, dtype)
        bias = jnp.asarray(rng.standard_normal(n), dtype)
        extra = {name: make(rng, m, n, dtype) for name, make in epilogue_of.items()}
        y = poisoned_call(f, x, w, bias, "imma", device, **extra)
        check_product(y, x, _dequant_f64(w, codes, None), bias, x.dtype, row_scale=extra.get("row_scale"),
                      residual=extra.get("residual"))


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit", ["", "1", "2", "4", "8"])
def test_imma_every_ksplit(bits, dtype, ksplit, monkeypatch):
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    _imma_check(bits, dtype, IMMA_CASES)


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("loads", ["1", "2"])
def test_imma_every_window(bits, loads, monkeypatch):
    # Windows of 128 and 256 bytes a row: int4 256 / 512 values, int8 128 / 256 (K 1536 fills all).
    monkeypatch.setenv("JAXGEMV_LOADS", loads)
    _imma_check(bits, jnp.bfloat16, [(1, 300, 1536, 32), (2, 40, 1536, 128), (1, 72, 3072, 64), (8, 72, 1536, 32)])


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
def test_imma_epilogue_and_outliers(bits):
    row_scale = lambda rng, m, n, dtype: jnp.asarray(rng.uniform(0.5, 2.0, m), jnp.float32)  # noqa: E731
    residual = lambda rng, m, n, dtype: jnp.asarray(rng.standard_normal((m, n)), dtype)  # noqa: E731
    _imma_check(bits, jnp.float16, [(2, 200, 2048, 32), (7, 200, 1024, 64)], row_scale=row_scale, residual=residual)
    _imma_check(bits, jnp.bfloat16, [(1, 200, 2048, 64), (2, 200, 4096, 32), (8, 100, 2048, 32)], outlier=True)


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
def test_imma_rms_eps(bits):
    # The row scale of an RMSNorm in front, rsqrt(mean(x^2) + eps), from XLA's sums of squares.
    f = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    rng = np.random.default_rng(5)
    w, codes, _ = _random_weight(rng, 300, 2048, bits, 32, False, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((2, 2048)) * 3, jnp.bfloat16)
    got = f(x, w, rms_eps=1e-5, variant="imma")
    x64 = np.asarray(x).astype(np.float64)
    rs = 1 / np.sqrt(np.mean(x64 * x64, axis=1) + 1e-5)
    check_product(got, x, _dequant_f64(w, codes, None), None, x.dtype, row_scale=rs)


@requires_gpu
def test_imma_rows_of_zeros_and_of_nan():
    # A row of zeros gives zeros (its factors from a largest |x| of 0); a NaN in a row makes that
    # row's outputs NaN and leaves the other row alone.
    rng = np.random.default_rng(6)
    w, codes, _ = _random_weight(rng, 64, 512, 4, 32, False, jnp.float16)
    xs = rng.standard_normal((2, 512))
    xs[0] = 0.0
    y = np.asarray(jaxgemv.int4_matmul(jnp.asarray(xs, jnp.float16), w, variant="imma"), np.float64)
    assert np.all(y[0] == 0)
    check_product(y[1:], jnp.asarray(xs[1:], jnp.float16), _dequant_f64(w, codes, None), None, jnp.float16)
    xs[0, 100] = np.nan
    y = np.asarray(jaxgemv.int4_matmul(jnp.asarray(xs, jnp.float16), w, variant="imma"), np.float64)
    assert np.all(np.isnan(y[0])) and np.all(np.isfinite(y[1]))


@requires_gpu
def test_imma_ksplit_choice_is_one_the_kernel_has():
    from jaxgemv import _ext

    # 8192 x 28672 on an H100 / H200: int8 (96 registers at K split 4) and int4 (64 at K split 8)
    # each in one wave (docs/perf-log.md, entry 144).
    assert _ext.imma_ksplit(8, True, 1, 8192, 28672, 32, 2, 0) in (1, 2, 4, 8)
    assert _ext.imma_ksplit(4, True, 1, 8192, 28672, 32, 1, 0) in (1, 2, 4, 8)
    assert _ext.imma_ksplit(8, True, 8, 8192, 28672, 32, 2, 0) in (1, 2, 4, 8)
    assert _ext.imma_ksplit(8, True, 9, 8192, 28672, 32, 2, 0) == 0  # M = 9: not the kernel's


@requires_gpu
@pytest.mark.parametrize("m", [3, 5, 6])
def test_imma_taken_by_auto_matches_its_reference(m):
    # int8 at M = 3-6, N <= 8192, K >= 8192: "auto" runs imma on sm_90 (planner.takes_imma), with
    # the ragged N of a cut tile.
    from jaxgemv.device import facts_of

    device = jax.devices("gpu")[0]
    n, k = 300, 8192
    if facts_of(device).compute_capability >= planner.IMMA_AUTO_MIN_CC:
        assert planner.plan_nbits(m, n, k, 8, 32, facts_of(device)).variant == "imma"
    rng = np.random.default_rng(m)
    w, codes, _ = _random_weight(rng, n, k, 8, 32, False, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
    y = poisoned_call(jaxgemv.int8_matmul, x, w, bias, "auto", device)
    check_product(y, x, _dequant_f64(w, codes, None), bias, x.dtype)


# ---------------------------------------------------------------------------------------------
# The CUDA handlers' own checks (GPU): what the planner refuses for imma and xshare, sent to the
# handler directly, is refused there too, by a message naming the variant.

_HANDLER_CASES = pytest.mark.parametrize("target, case, why", [
    ("imma", "zp", "imma plan: weights with zero points run the 'mma' variant"),
    ("imma", "swiglu", "imma plan: SwiGLU runs the 'mma' variant"),
    ("imma", "rms", "imma plan: the RMSNorm's row scale must come as row_scale"),
    ("imma", "scratch", r"imma plan: the scratch result is too small \(jaxgemv.nbits.imma_scratch_bytes\)"),
    ("xshare", "zp", "xshare plan: weights with zero points run the 'mma' variant"),
    ("xshare", "rms", "xshare plan: the RMSNorm's row scale must come as row_scale"),
    ("xshare", "scratch", r"xshare plan: the scratch result is too small \(jaxgemv.nbits.xshare_scratch_bytes\)"),
])


@requires_gpu
@_HANDLER_CASES
def test_handler_refuses_what_its_plan_cannot_run(target, case, why):
    m, n, k, bits, bs = 1, 64, 1024, 8, 32
    rng = np.random.default_rng(11)
    w, _, _ = _random_weight(rng, n, k, bits, bs, case == "zp", jnp.float16)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float16)
    empty = jnp.zeros((0,), jnp.float16)
    zp = w.zero_points if case == "zp" else jnp.zeros((0,), jnp.uint8)
    cols = n // 2 if case == "swiglu" else n
    need = (nbits.imma_scratch_bytes(k, bs, m) if target == "imma" else nbits.xshare_scratch_bytes(m, n, bits))
    scratch = jax.ShapeDtypeStruct((need - 16 if case == "scratch" else need,), jnp.uint8)
    attrs = dict(rms_eps=np.float32(1e-6 if case == "rms" else -1.0), rms_inv_k=np.float32(1.0 / k),
                 bits=np.int64(bits), block_size=np.int64(bs), has_zp=np.int64(case == "zp"))
    if target == "imma":
        attrs.update(ksplit=np.int64(0), loads=np.int64(1), activation=np.int64(case == "swiglu"))
    call = jax.ffi.ffi_call(f"jaxgemv_nbits_{target}", (jax.ShapeDtypeStruct((m, cols), jnp.float16), scratch))
    with jax.default_device(jax.devices("gpu")[0]):
        with pytest.raises(Exception, match=why):
            jax.block_until_ready(jax.jit(lambda *a: call(*a, **attrs))(x, w.packed, w.scales, zp, empty, empty,
                                                                        empty))
