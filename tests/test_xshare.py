"""The "xshare" variant of int4_matmul / int8_matmul (ffi/xshare.cuh): its plan, scratch size, x
order and errors on CPU, its kernel against float64 on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxgemv
from jaxgemv import _ext, bench, nbits, planner
from jaxgemv.device import DeviceFacts
from checks import check_product, poisoned_call
from conftest import requires_gpu
from test_nbits import _dequant_f64, _random_weight

H100 = DeviceFacts("cuda", (9, 0), 132)
CPU = DeviceFacts("cpu")


# ---------------------------------------------------------------------------------------------
# Plan (CPU)

@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("m, rows", [(1, 1), (8, 1), (9, 2), (16, 2)])
def test_xshare_plan_holds_one_or_two_m_tiles(m, rows, bits):
    plan = planner.plan_nbits(m, 34816, 5120, bits, 32, H100, "xshare")
    assert plan == planner.Plan("xshare", rows=rows)
    assert bench.plan_label(plan) == f"xshare r{rows}"


@pytest.mark.parametrize("m, k, bits, bs, zp, act, why", [
    (17, 4096, 4, 32, False, None, "M <= 16"),
    (2, 4096, 8, 32, True, None, "zero points"),
    (1, 4096, 4, 32, True, None, "zero points"),
    (2, 4096, 4, 32, False, "swiglu", "swiglu"),
    (1, 4096, 4, 16, False, None, "block_size 32-256"),
    (1, 4224, 4, 32, False, None, "multiple of 256"),
    (1, 4224, 8, 32, False, None, "multiple of 256"),
    (1, 1 << 27, 8, 256, False, None, "below"),
])
def test_xshare_refuses_what_it_cannot_run(m, k, bits, bs, zp, act, why):
    with pytest.raises(ValueError, match=why):
        planner.plan_nbits(m, 8192, k, bits, bs, H100, "xshare", zp, act)
    with pytest.raises(ValueError, match="compute capability"):
        planner.plan_nbits(1, 8192, 4096, 4, 32, DeviceFacts("cuda", (7, 5), 40), "xshare")


def test_xshare_from_the_environment_leaves_what_it_cannot_run_to_the_planner(monkeypatch):
    monkeypatch.setenv("JAXGEMV_VARIANT", "xshare")
    assert planner.plan_nbits(12, 34816, 5120, 4, 32, H100).variant == "xshare"
    assert planner.plan_nbits(1, 8192, 8192, 8, 32, H100).variant == "xshare"
    assert planner.plan_nbits(17, 8192, 8192, 4, 32, H100).variant == "mma"
    assert planner.plan_nbits(2, 8192, 8320, 8, 128, H100).variant != "xshare"  # K not whole windows
    assert planner.plan_nbits(2, 8192, 8320, 8, 128, H100).variant == "imma"  # "auto"'s choice, imma's rule too
    assert planner.plan_nbits(4, 8192, 8192, 4, 32, H100, has_zp=True).variant == "mma"
    assert planner.plan_fp8(1, 8192, 4096, 128, H100).variant == "mma"  # other formats: unforced
    assert planner.plan_nbits(1, 8192, 4096, 4, 32, CPU).variant == "cpu"


@pytest.mark.parametrize("m, n, k, bits, facts, has_zp, act, variant", [
    (5, 8192, 28672, 4, H100, False, None, "xshare"),  # int4 M = 2-8 on large products (perf log 152)
    (2, 12288, 16384, 4, H100, False, None, "xshare"),
    (2, 8192, 28672, 4, H100, False, None, "imma"),  # ... but imma's int4 shapes (perf log 155)
    (4, 8192, 16384, 4, H100, False, None, "imma"),
    (8, 34816, 5120, 4, H100, False, None, "xshare"),
    (16, 34816, 5120, 4, H100, False, None, "xshare"),  # M = 9-16 from K = 5120 and 2^26 values
    (9, 8192, 28672, 4, H100, False, None, "xshare"),  # (perf log 170: ahead of "mma"'s two m-tiles)
    (16, 10240, 8192, 4, H100, False, None, "xshare"),
    (16, 5120, 17408, 4, H100, False, None, "xshare"),
    (16, 248320, 2048, 4, H100, False, None, "mma"),  # the lm_heads' K = 2048: "mma"
    (16, 4096, 8192, 4, H100, False, None, "mma"),  # below 2^26 values: untimed
    (1, 8192, 28672, 4, H100, False, None, "mma"),  # int4 M = 1: "mma"
    (4, 10240, 8192, 4, H100, False, None, "mma"),  # short products: "mma"
    (8, 5120, 17408, 4, H100, False, None, "mma"),
    (4, 34816, 5120, 8, H100, False, None, "xshare"),  # int8 on 2^27 values or more, M = 1-4
    (2, 28672, 8192, 8, H100, False, None, "imma"),  # ... but imma's shapes (N <= 28672 and K >= 8192)
    (2, 8192, 28672, 8, H100, False, None, "imma"),
    (6, 8192, 28672, 8, H100, False, None, "imma"),  # M <= 6 at N <= 8192
    (7, 8192, 28672, 8, H100, False, None, "xshare"),
    (8, 28672, 8192, 8, H100, False, None, "xshare"),
    (8, 34816, 5120, 8, H100, False, None, "mma"),  # M = 5-8 only where K >= 8192
    (1, 10240, 8192, 8, H100, False, None, "imma"),  # below 2^27 values: xshare's extra nodes cost more
    (8, 10240, 8192, 8, H100, False, None, "mma"),
    (16, 8192, 28672, 8, H100, False, None, "xshare"),  # M = 9-16 from K = 5120 and 2^26 values
    (16, 28672, 8192, 8, H100, False, None, "xshare"),
    (16, 34816, 5120, 8, H100, False, None, "xshare"),  # (perf log 171 (e))
    (9, 10240, 8192, 8, H100, False, None, "xshare"),
    (16, 5120, 17408, 8, H100, False, None, "xshare"),
    (16, 151936, 2048, 8, H100, False, None, "mma"),
    (2, 4096, 14336, 8, H100, False, None, "imma"),  # smaller: the earlier rules (imma at N <= 8192)
    (2, 8192, 28672, 4, H100, True, None, "mma"),  # what the kernel cannot run keeps the planner's
    (2, 8192, 28672, 4, H100, False, "swiglu", "mma"),
    (2, 8192, 28672, 4, DeviceFacts("cuda", (8, 0), 108), False, None, "mma"),  # timed on sm_90 only
])
def test_auto_takes_xshare_where_it_was_timed_faster(m, n, k, bits, facts, has_zp, act, variant):
    plan = planner.plan_nbits(m, n, k, bits, 32, facts, has_zp=has_zp, activation=act)
    assert plan.variant == variant
    if variant == "xshare":
        assert plan.rows == (1 if m <= 8 else 2)


def test_auto_takes_xshare_where_imma_rule_reaches_but_its_kernel_cannot_run():
    # imma takes blocks of 32-128, xshare 32-256: "auto"'s rules in order, each where its kernel runs.
    assert planner.plan_nbits(2, 8192, 28672, 4, 128, H100).variant == "imma"
    assert planner.plan_nbits(2, 8192, 28672, 4, 256, H100).variant == "xshare"
    assert planner.plan_nbits(2, 28672, 8192, 8, 256, H100).variant == "xshare"
    assert planner.plan_nbits(2, 10240, 8192, 8, 256, H100).variant == "mma"  # below xshare's 2^27 values


def test_auto_xshare_needs_whole_windows_and_blocks_of_32():
    assert planner.plan_nbits(5, 8192, 28928 + 128, 4, 32, H100).variant == "mma"  # K not a multiple of 256
    assert planner.plan_nbits(5, 8192, 28672, 4, 16, H100).variant == "mma"


def test_xshare_scratch_bytes():
    # M rows of float32 sums over N rounded up to whole groups (64 columns on four warps, 128 on
    # eight: 4-bit codes at M > 8).
    assert nbits.xshare_scratch_bytes(1, 200, 4) == 4 * 256
    assert nbits.xshare_scratch_bytes(9, 200, 4) == 4 * 9 * 256
    assert nbits.xshare_scratch_bytes(9, 200, 8) == 4 * 9 * 256
    assert nbits.xshare_scratch_bytes(9, 130, 8) == 4 * 9 * 192
    assert nbits.xshare_scratch_bytes(16, 34816, 4) == 4 * 16 * 34816


@pytest.mark.skipif(_ext.xshare_scratch_bytes is None, reason="a build without CUDA")
def test_xshare_scratch_bytes_mirror_the_kernels():
    for bits in (4, 8):
        for m in (1, 5, 8, 9, 16):
            for n in (16, 130, 200, 1030, 34816):
                assert _ext.xshare_scratch_bytes(m, n, bits) == nbits.xshare_scratch_bytes(m, n, bits), (m, n, bits)


def test_xshare_pair_order():
    x = jnp.arange(32, dtype=jnp.float32).reshape(2, 16)
    got = np.asarray(nbits.xshare_pair_order(x, 4))
    assert got[0].tolist() == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]
    assert got[1].tolist() == (got[0] + 16).tolist()
    got = np.asarray(nbits.xshare_pair_order(x, 8))
    assert got[0].tolist() == [0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15]
    assert got[1].tolist() == (got[0] + 16).tolist()


def test_xshare_on_cpu_fails_at_trace_time_naming_the_variant():
    rng = np.random.default_rng(0)
    w, _, _ = _random_weight(rng, 16, 256, 4, 32, False, jnp.float16)
    x, w = jax.device_put((jnp.ones((1, 256), jnp.float16), w), jax.devices("cpu")[0])
    with pytest.raises(ValueError, match="xshare"):
        jax.jit(lambda x, w: jaxgemv.int4_matmul(x, w, variant="xshare"))(x, w)


# ---------------------------------------------------------------------------------------------
# Kernel (GPU)

# (M, N, K, block size): every M of one and of two m-tiles (x's rows past M are not copied, and
# their sums never stored), ragged N (a cut tile and a cut group), blocks of 32-256 (one to eight
# scales a window, pieces starting inside a 16-byte piece), one window and many. On an H100 or
# H200 these grids are smaller than the persistent grid, so every block takes one window and every
# tile of more than one window is split into pieces, each added into the sums.
XSHARE_CASES = [(1, 200, 256, 32), (2, 1030, 2048, 64), (3, 64, 768, 128), (4, 2051, 1024, 256),
                (5, 40, 4096, 32), (7, 300, 512, 64), (8, 1030, 2304, 32), (9, 200, 1024, 32),
                (12, 2051, 768, 128), (13, 100, 2048, 64), (16, 1030, 1536, 256), (16, 64, 256, 32)]


def _xshare_check(dtype, cases, variant="xshare", bits=4, **epilogue_of):
    device = jax.devices("gpu")[0]
    product = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    for m, n, k, bs in cases:
        rng = np.random.default_rng(m * n + k + bs + bits)
        w, codes, _ = _random_weight(rng, n, k, bits, bs, False, dtype)
        x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k), dtype)
        bias = jnp.asarray(rng.standard_normal(n), dtype)
        extra = {name: make(rng, m, n, dtype) for name, make in epilogue_of.items()}
        y = poisoned_call(product, x, w, bias, variant, device, **extra)
        check_product(y, x, _dequant_f64(w, codes, None), bias, x.dtype, row_scale=extra.get("row_scale"),
                      residual=extra.get("residual"))


DTYPES = pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16], ids=["f16", "bf16"])
BITS = pytest.mark.parametrize("bits", [4, 8], ids=["int4", "int8"])


@requires_gpu
@BITS
@DTYPES
def test_xshare_matches_its_reference(dtype, bits):
    _xshare_check(dtype, XSHARE_CASES, bits=bits)


@requires_gpu
@BITS
def test_xshare_whole_groups_and_pieces(bits):
    # Many more steps than the persistent grid's blocks (2 windows a group, 1024 or 512 groups):
    # most groups lie whole in one block's range, the rest in two pieces; and a grid with one
    # window a group, every piece whole.
    _xshare_check(jnp.bfloat16, [(3, 16384, 512, 32), (12, 16384, 512, 64), (5, 40000, 256, 128)], bits=bits)


@requires_gpu
@BITS
def test_xshare_epilogue(bits):
    row_scale = lambda rng, m, n, dtype: jnp.asarray(rng.uniform(0.5, 2.0, m), jnp.float32)  # noqa: E731
    residual = lambda rng, m, n, dtype: jnp.asarray(rng.standard_normal((m, n)), dtype)  # noqa: E731
    _xshare_check(jnp.float16, [(2, 200, 2048, 32), (11, 300, 1024, 64), (4, 9000, 512, 32)], bits=bits,
                  row_scale=row_scale, residual=residual)


@requires_gpu
@BITS
def test_xshare_rms_eps(bits):
    rng = np.random.default_rng(5)
    w, codes, _ = _random_weight(rng, 300, 2048, bits, 32, False, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((10, 2048)) * 3, jnp.bfloat16)
    product = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    got = product(x, w, rms_eps=1e-5, variant="xshare")
    x64 = np.asarray(x).astype(np.float64)
    rs = 1 / np.sqrt(np.mean(x64 * x64, axis=1) + 1e-5)
    check_product(got, x, _dequant_f64(w, codes, None), None, x.dtype, row_scale=rs)


@requires_gpu
def test_xshare_from_the_environment(monkeypatch):
    monkeypatch.setenv("JAXGEMV_VARIANT", "xshare")
    _xshare_check(jnp.bfloat16, [(6, 520, 1024, 32)], variant="auto")
    _xshare_check(jnp.float16, [(14, 520, 1024, 64)], variant="auto", bits=8)
