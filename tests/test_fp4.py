"""NVFP4: format, quantizer, and fp4_matmul on every variant against a float64 reference."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jaxgemv
from jaxgemv import fp4
from checks import (ONE_ROW_SPLIT_NK, ONE_ROW_X_PATHS, check_product, cuda_fragment_order_call,
                    force_one_m_tile_blocks, force_one_row_x_path, force_x_in_shared_memory, poisoned_call,
                    x_fits_beside_rings)
from conftest import gpu_available, requires_gpu

DTYPES = [jnp.float16, jnp.bfloat16]

# (M, N, K): M swept at a ragged N, ragged N and awkward K (16, 32: below one tensor-core
# window; 8320 = 65 windows of 128, not a multiple of 256 or 512), real decode shapes.
SHAPES = (
    [(m, 1026, 2048) for m in (1, 2, 3, 4, 5, 8, 16, 17, 64)]
    + [(4, n, 2048) for n in (1, 36, 4098)]
    + [(3, 36, k) for k in (16, 32, 128, 8320)]
    + [(8, 1026, 8320), (17, 36, 128), (2, 4098, 512), (1, 512, 2048), (4, 2048, 512)]
)
CPU_SHAPES = [s for s in SHAPES if s[0] * s[1] * s[2] <= 40_000_000]


def _random_weight(rng, n, k, gscale=0.0125):
    """Codes, scales and global scale that vary along K; scales in [2^-3, 2^3] so nothing
    underflows and an all-zeros kernel is far from the answer."""
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scale_vals = np.exp2(rng.uniform(-3, 3, size=(n, k // 16))).astype(ml_dtypes.float8_e4m3fn)
    return jaxgemv.NVFP4Weight(jnp.asarray(packed), jnp.asarray(scale_vals), jnp.float32(gscale))


def _dequant_f64(w):
    lut = np.concatenate([fp4.E2M1_VALUES, -fp4.E2M1_VALUES]).astype(np.float64)
    p = np.asarray(w.packed)
    vals = np.stack([lut[p & 15], lut[p >> 4]], axis=-1).reshape(p.shape[0], -1)
    scales = np.repeat(np.asarray(w.scales).astype(np.float64), 16, axis=1)
    return vals * scales * float(w.global_scale)


def _inputs(seed, m, n, k, dtype, with_bias):
    rng = np.random.default_rng(seed)
    w = _random_weight(rng, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32) * np.linspace(0.5, 1.5, k, dtype=np.float32)
    x = jnp.asarray(x, dtype)
    bias = jnp.asarray(rng.standard_normal(n), dtype) if with_bias else None
    return x, w, bias


def _check(y, x, w, bias):
    """NVFP4 weights are exact in float32: the baseline is a float32 product rounded to x's dtype."""
    check_product(y, x, _dequant_f64(w), bias, np.float32)


def _poisoned_call(x, w, bias, variant, device):
    return poisoned_call(jaxgemv.fp4_matmul, x, w, bias, variant, device)


def _variants(platform, k):
    if platform == "cpu":
        return ["auto", "cpu", "dequant"]
    return ["auto", "scalar", "dequant"] + (["mma"] if k % 128 == 0 else [])


def _case_ids(shapes):
    return [f"M{m}-N{n}-K{k}" for m, n, k in shapes]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=_case_ids(CPU_SHAPES))
def test_matmul_cpu(shape, dtype):
    m, n, k = shape
    device = jax.devices("cpu")[0]
    x, w, bias = _inputs(hash(shape) % 2**32, m, n, k, dtype, with_bias=(m + n) % 2 == 0)
    for variant in _variants("cpu", k):
        _check(_poisoned_call(x, w, bias, variant, device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=_case_ids(SHAPES))
def test_matmul_gpu(shape, dtype):
    m, n, k = shape
    device = jax.devices("gpu")[0]
    # Every variant runs on the same inputs; bias alternates between variants and between
    # neighbouring shapes, so each variant meets both over the table.
    for i, variant in enumerate(_variants("gpu", k)):
        with_bias = (i + SHAPES.index(shape)) % 2 == 1
        x, w, bias = _inputs(hash((shape, with_bias)) % 2**32, m, n, k, dtype, with_bias)
        _check(_poisoned_call(x, w, bias, variant, device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit", ["1", "2", "4", "8"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_every_ksplit(ksplit, xperm, dtype, monkeypatch):
    # fp16 and bf16 take different paths: at M = 1 fp16 keeps its scale blocks apart in the mma's
    # columns (block columns, gemv_core.cuh).
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    monkeypatch.setenv("JAXGEMV_XPERM", xperm)
    device = jax.devices("gpu")[0]
    # M = 5 and 8 at K = 1152 and 3328 (9 one-load, 13 two-load windows): the split's warps take
    # unequal numbers of windows, so a warp's last window loads no next x (gemv_core.cuh, load_x).
    # M = 6 on N = 8200 (513 blocks) at two loads: at K split 8 with x in fragment order the
    # unbounded instance holds three blocks per SM on an H200 (fp16: 70 registers), and 513 need
    # four, so the launcher takes the instance held to four (common.h, TakesBoundedInstance).
    # M = 13 and 16: two m-tiles take x ahead with a K split, M = 13 on unequal windows per warp,
    # M = 16 on 320 blocks (the two-m-tile held instance's window on an H200, 264 to 396 blocks).
    # Half the K split where the planned one's grid takes more than one wave and half of it one
    # (gemv_launch.cuh, TakesHalfKSplit; ragged N, on an H200): M = 4 on N = 17400 (1088 blocks) runs
    # K split 4 as 2, and M = 16 on N = 10248 (641 blocks, two m-tiles) K split 4 as 2; M = 4 there
    # K split 8 as 4 (three K-split-8 blocks per SM, six at K split 4: common.h, MmaHalvesKSplit).
    # Twice the K split (TakesDoubleKSplit): M = 16 on N = 17416 (1089 blocks, two m-tiles) K split
    # 2 as 4.
    # M = 2 with fp16 x and a K split: block columns for two rows (gemv_core.cuh, COLS2), on unequal
    # windows per warp (1030 x 3328, ragged N) and on 513 blocks.
    for m, n, k in [(4, 100, 4096), (12, 36, 1024), (1, 4098, 2048), (3, 40, 128), (17, 36, 256), (5, 36, 1152),
                    (8, 1030, 3328), (6, 8200, 2048), (13, 1030, 3328), (16, 5120, 1152), (4, 17400, 1024),
                    (4, 10248, 1024), (16, 10248, 1024), (2, 1030, 3328), (2, 8200, 2048), (2, 36, 1152),
                    (16, 17416, 1024)]:
        x, w, bias = _inputs(m * n + k, m, n, k, dtype, with_bias=True)
        _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("ksplit", ["1", "8"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_one_m_tile_blocks_above_8_rows(ksplit, xperm, monkeypatch):
    # JAXGEMV_ROWS=1: M 9-16 as one-m-tile blocks, two per column tile (the second m-block's x
    # rows and, in fragment order, its own m-tile of x).
    force_one_m_tile_blocks(monkeypatch, ksplit, xperm)
    device = jax.devices("gpu")[0]
    for dtype in DTYPES:
        for m, n, k in [(12, 36, 1024), (16, 100, 2048), (9, 8200, 1024)]:
            x, w, bias = _inputs(m * n + k, m, n, k, dtype, with_bias=True)
            _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit, xstage, xperm", ONE_ROW_X_PATHS)
def test_mma_one_row_x_paths(ksplit, xstage, xperm, dtype, monkeypatch):
    force_one_row_x_path(monkeypatch, ksplit, xstage, xperm)
    device = jax.devices("gpu")[0]
    for n, k in ONE_ROW_SPLIT_NK:
        x, w, bias = _inputs(n + k, 1, n, k, dtype, with_bias=True)
        _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("xs", ["0", "4", "8", "16"])
def test_gpu_mma_x_in_shared_memory(xs, monkeypatch):
    # Persistent blocks sharing x in shared memory: ragged N, fewer tiles than warps, and (N =
    # 100000) several tiles per warp, so each warp's ring runs on across tile boundaries; M = 9-16
    # holds two m-tiles of x. xs "0": the per-block kernel on the same cases, x in fragment order
    # and no K split (the planner's choice for the lm_heads at M = 2-8 since perf log 103).
    force_x_in_shared_memory(monkeypatch, xs)
    device = jax.devices("gpu")[0]
    for m, n, k, dtype in [(1, 4098, 2048, jnp.float16), (3, 100, 4096, jnp.bfloat16), (8, 36, 256, jnp.float16),
                           (5, 1030, 128, jnp.bfloat16), (8, 100000, 256, jnp.bfloat16), (2, 100001, 512, jnp.float16),
                           (12, 4098, 2048, jnp.float16), (16, 100, 4096, jnp.bfloat16), (9, 100000, 256, jnp.float16),
                           (16, 40000, 2048, jnp.bfloat16)]:
        if not x_fits_beside_rings(xs, m, k):
            continue
        x, w, bias = _inputs(m * n + k, m, n, k, dtype, with_bias=True)
        _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_dequantize_matches_reference(dtype):
    rng = np.random.default_rng(7)
    w = _random_weight(rng, 40, 96)
    # The float32 decode rounds once, like the float64 reference rounded to float32.
    np.testing.assert_array_equal(np.asarray(w.dequantize(jnp.float32)), _dequant_f64(w).astype(np.float32))
    for device in {jax.devices()[0], jax.devices("cpu")[0]}:
        got = jax.jit(jaxgemv.fp4_dequantize, static_argnums=1)(jax.device_put(w, device), dtype)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(w.dequantize(dtype)))


@pytest.mark.parametrize("loads", [1, 2])
def test_fragment_order(loads):
    """Element by element against the layout the kernel indexes (gemv_core.cuh, XPERM)."""
    m, k = 11, 512
    x = np.arange(m * k, dtype=np.float32).reshape(m, k)
    from jaxgemv import _product
    got = np.asarray(_product.fragment_order(jnp.asarray(x), loads, values_per_chunk=32)).reshape(-1)
    assert got.size == 16 * k
    pair = [0, 4, 1, 5, 2, 6, 3, 7]
    windows = k // (128 * loads)
    for tile in range(2):
        for win in range(windows):
            for l in range(loads):
                for word in range(4):
                    for lane in range(32):
                        g, t = divmod(lane, 4)
                        base = ((((tile * windows + win) * loads + l) * 4 + word) * 32 + lane) * 8
                        row = tile * 8 + g
                        col = win * 128 * loads + (l * 4 + t) * 32 + word * 8
                        want = [x[row, col + p] if row < m else 0 for p in pair]
                        np.testing.assert_array_equal(got[base : base + 8], want)


@pytest.mark.parametrize("loads, values_per_chunk", [(1, 16), (2, 16), (1, 32), (2, 32)])
def test_fragment_order_compact(loads, values_per_chunk):
    """x_order 2: one m-tile of M <= 8 rows without the padding, each group of 32 lanes' pieces
    cut to its first 4 M (rows 0 .. M - 1); at M = 8 the same array as the padded order."""
    from jaxgemv import _product
    k = 4 * values_per_chunk * loads * 3
    for m in range(1, 9):
        x = jnp.asarray(np.arange(m * k, dtype=np.float32).reshape(m, k) + 1)
        padded = np.asarray(_product.fragment_order(x, loads, values_per_chunk)).reshape(-1, 32, 8)
        compact = np.asarray(_product.fragment_order(x, loads, values_per_chunk, compact=True))
        assert compact.shape == (m, k)
        np.testing.assert_array_equal(compact.reshape(-1, 4 * m, 8), padded[:, : 4 * m])
    with pytest.raises(ValueError, match="compact needs M <= 8"):
        _product.fragment_order(jnp.ones((9, k)), loads, values_per_chunk, compact=True)


def test_x_order_of_plans():
    from jaxgemv import _product
    from jaxgemv.planner import Plan
    split, xs = Plan("mma", rows=1, ksplit=8, loads=2, xperm=True), Plan("mma", rows=1, ksplit=1, loads=2, xperm=True,
                                                                        xs_warps=8)
    assert [_product.x_order(split, m, True) for m in (1, 4, 7, 8)] == [2, 2, 2, 1]
    assert [_product.x_order(split, m, False) for m in (1, 4, 7, 8)] == [1, 1, 1, 1]  # int4 / int8: padded
    assert _product.x_order(xs, 4, True) == 1  # x in shared memory: 8-row m-tiles
    assert _product.x_order(Plan("mma", rows=2, ksplit=4, loads=2, xperm=True), 12, True) == 1
    assert _product.x_order(Plan("mma", rows=1, ksplit=8, loads=2), 4, True) == 0


@pytest.mark.parametrize("m, want", [(4, 2), (8, 1)])
def test_compact_fragment_order_lowering_for_cuda(m, want, monkeypatch):
    """Lowered for CUDA with an H200's facts and x forced into fragment order: at M < 8 the handler
    gets x unpadded with xperm 2, at M = 8 padded (no pad to do) with xperm 1."""
    x, w, _ = _inputs(4, m, 64, 512, jnp.float16, False)
    text, call = cuda_fragment_order_call(monkeypatch, fp4, jaxgemv.fp4_matmul, "jaxgemv_fp4_matmul", x, w)
    assert f"xperm = {want} : i64" in call
    assert call.split("(", 1)[1].split(")", 1)[0].count("%") == 7
    assert f"tensor<{m}x512xf16>" in call.split("->")[0].split(":")[-1]
    assert "stablehlo.pad" not in text


def test_leading_dims_and_vmap():
    x, w, bias = _inputs(3, 6, 36, 64, jnp.bfloat16, with_bias=True)
    flat = jaxgemv.fp4_matmul(x, w, bias=bias)
    nested = jaxgemv.fp4_matmul(x.reshape(2, 3, 64), w, bias=bias)
    np.testing.assert_array_equal(np.asarray(nested).reshape(6, 36), np.asarray(flat))
    mapped = jax.vmap(lambda r: jaxgemv.fp4_matmul(r, w, bias=bias))(x.reshape(2, 3, 64))
    np.testing.assert_array_equal(np.asarray(mapped).reshape(6, 36), np.asarray(flat))
    with pytest.raises(NotImplementedError, match="vmap over the weight"):
        jax.vmap(lambda b: jaxgemv.fp4_matmul(x, w, bias=b))(jnp.stack([bias, bias]))


def test_quantize_round_trip_exact_on_representable_weights():
    rng = np.random.default_rng(11)
    n, k = 24, 128
    codes = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    codes[:, ::16] = rng.choice([7, 15], size=(n, k // 16))  # every block reaches |6|
    scales = np.exp2(rng.integers(-6, 8, size=(n, k // 16))).astype(np.float32)
    scales *= rng.choice([1.0, 1.125, 1.5, 1.875], size=scales.shape)
    scales = np.minimum(scales, 448.0)
    scales[0, 0] = 448.0  # the tensor's amax is 6 x 448 x global_scale
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    w = jaxgemv.NVFP4Weight(jnp.asarray(packed), jnp.asarray(scales.astype(ml_dtypes.float8_e4m3fn)),
                            jnp.float32(2.0**-10))
    q = jaxgemv.quantize_nvfp4(w.dequantize())
    np.testing.assert_array_equal(np.asarray(q.packed), np.asarray(w.packed))
    np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8), np.asarray(w.scales).view(np.uint8))
    assert float(q.global_scale) == float(w.global_scale)


def test_e2m1_rounding_ties_to_even_and_saturates():
    v = jnp.array([0.0, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 7.0, -0.75, -100.0])
    want = [0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 10, 15]
    np.testing.assert_array_equal(np.asarray(fp4._round_to_e2m1_codes(v)), want)


def test_quantize_accuracy():
    w = jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)
    err = jnp.linalg.norm(jaxgemv.quantize_nvfp4(w).dequantize() - w) / jnp.linalg.norm(w)
    assert float(err) < 0.12  # NVFP4 on Gaussian data: about 9% relative error


def test_errors_name_the_argument():
    x, w, bias = _inputs(0, 2, 36, 64, jnp.float16, with_bias=True)
    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        jaxgemv.fp4_matmul(x.astype(jnp.float32), w)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 64\]"):
        jaxgemv.fp4_matmul(x[:, :32], w)
    with pytest.raises(TypeError, match="^fp4_matmul: w must be a jaxgemv.NVFP4Weight"):
        jaxgemv.fp4_matmul(x, jnp.zeros((36, 64), jnp.float16))
    with pytest.raises(TypeError, match="^fp4_dequantize: w must be a jaxgemv.NVFP4Weight"):
        jaxgemv.fp4_dequantize(jnp.zeros((36, 64), jnp.float16))
    with pytest.raises(TypeError, match=r"^fp4_matmul: w.global_scale must be an array, got float \(wrap"):
        jaxgemv.fp4_matmul(x, jaxgemv.NVFP4Weight(w.packed, w.scales, 1.0))
    with pytest.raises(ValueError, match=r"bias must have shape \(36,\)"):
        jaxgemv.fp4_matmul(x, w, bias=bias[:5])
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        jaxgemv.fp4_matmul(x, w, bias=bias.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="variant='fast'"):
        jaxgemv.fp4_matmul(x, w, variant="fast")
    bad_scales = jaxgemv.NVFP4Weight(w.packed, w.scales.astype(jnp.float32), w.global_scale)
    with pytest.raises(TypeError, match=r"^fp4_matmul: w.scales must be float8_e4m3fn \[36, 4\]"):
        jaxgemv.fp4_matmul(x, bad_scales)
    with pytest.raises(ValueError, match="K = 40 must be a positive multiple of 16"):
        jaxgemv.quantize_nvfp4(jnp.ones((4, 40)))
    if not gpu_available():
        with pytest.raises(ValueError, match="needs a CUDA device"):
            jax.jit(lambda x: jaxgemv.fp4_matmul(x, w, variant="mma"))(x)


def test_weight_is_a_pytree():
    _, w, _ = _inputs(0, 1, 8, 32, jnp.float16, with_bias=False)
    leaves, tree = jax.tree_util.tree_flatten(w)
    assert len(leaves) == 3
    assert jax.tree_util.tree_unflatten(tree, leaves).shape == (8, 32)
    y = jax.jit(lambda w, x: jaxgemv.fp4_matmul(x, w))(w, jnp.ones((1, 32), jnp.float16))
    assert y.shape == (1, 8)


@pytest.mark.parametrize("m", [1, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_smallest_codes_survive_every_variant(dtype, m):
    """Codes +-0.5 (e2m1 1 and 9) decode to 16-bit subnormals before the scale multiply on the
    GPU paths, and at M = 1 with fp16 x (block columns) go into the mma as subnormals; a kernel
    that flushed them would return zeros here."""
    rng = np.random.default_rng(13)
    n, k = 48, 256
    codes = rng.choice(np.array([1, 9], np.uint8), size=(n, k))
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    scales = np.exp2(rng.uniform(-3, 3, size=(n, k // 16))).astype(ml_dtypes.float8_e4m3fn)
    w = jaxgemv.NVFP4Weight(jnp.asarray(packed), jnp.asarray(scales), jnp.float32(0.03))
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    device = jax.devices()[0]
    for variant in _variants("cpu" if device.platform == "cpu" else "gpu", k):
        _check(_poisoned_call(x, w, None, variant, device), x, w, None)


@pytest.mark.parametrize("raw_scales, gscale_shape, as_numpy", [(True, (1,), True), (False, (), False),
                                                                (True, (), False)])
def test_from_modelopt(raw_scales, gscale_shape, as_numpy):
    """A ModelOpt layer as loaders hand it over: scales as float8 or their raw bytes, the global
    scale as a scalar or [1], numpy or device arrays; the product against float64."""
    rng = np.random.default_rng(7)
    w = _random_weight(rng, 36, 256)
    scales = np.asarray(w.scales)
    scales = scales.view(np.uint8) if raw_scales else scales
    gs = np.full(gscale_shape, 0.0125, np.float32)
    wrap = (lambda a: a) if as_numpy else jnp.asarray
    v = jaxgemv.NVFP4Weight.from_modelopt(wrap(np.asarray(w.packed)), wrap(scales), wrap(gs))
    assert v.scales.dtype == jnp.float8_e4m3fn and v.global_scale.shape == ()
    np.testing.assert_allclose(np.asarray(v.dequantize(), np.float64), _dequant_f64(w), rtol=1e-6)  # float32 products
    x = jnp.asarray(rng.standard_normal((2, 256)), jnp.float16)
    check_product(jaxgemv.fp4_matmul(x, v), x, _dequant_f64(w), None, x.dtype)
    with pytest.raises(TypeError, match=r"^NVFP4Weight.from_modelopt: w.scales must be float8_e4m3fn \[36, 16\]"):
        jaxgemv.NVFP4Weight.from_modelopt(w.packed, scales[:, :8], gs)
