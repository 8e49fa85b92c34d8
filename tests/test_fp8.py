"""FP8 (E4M3, float32 block scales): format, quantizer, fp8_matmul on every variant against a
float64 reference, errors, transformations and sharding."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from jaxgemv import fp8, planner
from jaxgemv.device import facts_of
from checks import (ONE_ROW_SPLIT_NK, ONE_ROW_X_PATHS, check_partitioned, check_product, cuda_fragment_order_call,
                    force_one_m_tile_blocks, force_one_row_x_path, force_x_in_shared_memory, on_cpu, poisoned_call,
                    x_fits_beside_rings)
from conftest import requires_gpu

DTYPES = [jnp.float16, jnp.bfloat16]
BLOCKS = fp8.BLOCKS

# (M, N, K): M swept, ragged N (1, 36, 130: a partial 128-row block), K below and above one
# tensor-core window (64), K = 192 (three windows: one load per lane), K = 4160 (ragged for
# bk = 128 and 256), K = 48 and 2080 (multiples of 16, not of 64: the CUDA-core kernel only),
# real decode sizes.
SHAPES = (
    [(m, 130, 2048) for m in (1, 2, 3, 4, 5, 8, 16, 17)]
    + [(4, n, 1024) for n in (1, 36, 1026)]
    + [(3, 36, k) for k in (48, 64, 128, 192, 2080, 4160)]
    + [(1, 4096, 4096), (8, 512, 2048)]
)
# CPU: the same minus half the M sweep (each case compiles every variant for every block shape).
CPU_SHAPES = [s for s in SHAPES if s[0] * s[1] * s[2] <= 5_000_000 and s[0] not in (2, 5, 16)] + [(3, 20, 50), (2, 7, 16)]


def _random_weight(rng, n, k, block):
    """E4M3 codes over the whole range (subnormals included, NaN codes excluded) and scales that
    vary per block, in [0.05, 2]: nothing underflows and an all-zeros kernel is far off."""
    codes = rng.integers(0, 256, size=(n, k), dtype=np.uint8)
    codes = np.where((codes & 0x7F) == 0x7F, codes ^ 1, codes).astype(np.uint8)
    data = codes.view(ml_dtypes.float8_e4m3fn)
    sn, sk = -(-n // block[0]), -(-k // block[1])
    scales = rng.uniform(0.05, 2.0, size=(sn, sk)).astype(np.float32)
    return jaxgemv.FP8Weight(jnp.asarray(data), jnp.asarray(scales), block)


def _dequant_f64(w):
    n, k = w.shape
    data = np.asarray(w.data).astype(np.float64)
    s = np.asarray(w.scales).astype(np.float64)
    s = np.repeat(np.repeat(s, w.block[0], axis=0), w.block[1], axis=1)[:n, :k]
    return data * s


def _inputs(seed, m, n, k, dtype, block, with_bias):
    rng = np.random.default_rng(seed)
    w = _random_weight(rng, n, k, block)
    x = rng.standard_normal((m, k)).astype(np.float32) * np.linspace(0.5, 1.5, k, dtype=np.float32)
    bias = jnp.asarray(rng.standard_normal(n), dtype) if with_bias else None
    return jnp.asarray(x, dtype), w, bias


def _check(y, x, w, bias):
    """The baseline rounds e4m3 x scale to x's dtype, as the plain jnp path does."""
    check_product(y, x, _dequant_f64(w), bias, x.dtype)


def _poisoned_call(x, w, bias, variant, device):
    return poisoned_call(jaxgemv.fp8_matmul, x, w, bias, variant, device)


def _variants(platform, k, block, m=1):
    if platform == "cpu":
        return ["auto", "cpu", "dequant"]
    mma = k % 64 == 0 and block[1] >= 64
    wgmma = planner.wgmma_unfit(m, k, block[1], facts_of(jax.devices("gpu")[0])) is None
    return (["auto", "dequant"] + (["mma"] if mma else []) + (["scalar"] if k % 16 == 0 else [])
            + (["wgmma"] if wgmma else []))


def _ids(shapes):
    return [f"M{m}-N{n}-K{k}" for m, n, k in shapes]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=_ids(CPU_SHAPES))
def test_matmul_cpu(shape, dtype):
    m, n, k = shape
    device = jax.devices("cpu")[0]
    for i, block in enumerate(BLOCKS):
        x, w, bias = _inputs(hash((shape, block)) % 2**32, m, n, k, dtype, block, with_bias=i % 2 == 0)
        for variant in _variants("cpu", k, block):
            _check(_poisoned_call(x, w, bias, variant, device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=_ids(SHAPES))
def test_matmul_gpu(shape, dtype):
    m, n, k = shape
    device = jax.devices("gpu")[0]
    for i, block in enumerate(BLOCKS):
        x, w, bias = _inputs(hash((shape, block)) % 2**32, m, n, k, dtype, block, with_bias=i % 2 == 1)
        for variant in _variants("gpu", k, block, m):
            _check(_poisoned_call(x, w, bias, variant, device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("ksplit", ["1", "8"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_one_m_tile_blocks_above_8_rows(ksplit, xperm, monkeypatch):
    # JAXGEMV_ROWS=1: M 9-16 as one-m-tile blocks, two per column tile.
    force_one_m_tile_blocks(monkeypatch, ksplit, xperm)
    device = jax.devices("gpu")[0]
    for dtype in DTYPES:
        for (m, n, k), block in [((12, 36, 1024), (1, 128)), ((16, 100, 2048), (128, 128)),
                                 ((9, 8200, 1024), (1, 128))]:
            x, w, bias = _inputs(m * n + k, m, n, k, dtype, block, with_bias=True)
            _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit", ["1", "2", "4", "8"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_every_ksplit(ksplit, xperm, dtype, monkeypatch):
    # fp16 and bf16 take different decode paths: fp16 hands its codes to the mma unscaled.
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    monkeypatch.setenv("JAXGEMV_XPERM", xperm)
    device = jax.devices("gpu")[0]
    # M = 5 and 8 with the split's warps taking unequal numbers of windows (gemv_core.cuh, load_x);
    # M = 6 on 513 blocks (FP8's unbounded instance already holds four blocks per SM on an H200, so
    # the launcher keeps it; tests/test_min_blocks.py forces the bounded one); M = 13 and 16: two
    # m-tiles, x ahead with a K split, on unequal windows per warp and on 320 blocks. On an H200
    # (gemv_launch.cuh, TakesHalfKSplit and TakesKSplit8OneRow; ragged N): N = 17400 (1088 blocks)
    # runs K split 4 as K split 2 at M = 4 and as K split 8 at M = 1; N = 10248 (641 blocks) K split 8
    # as 4 at M = 4 (M = 16, two m-tiles, keeps its split: common.h, MmaHalvesKSplit); N = 34824 (2177
    # blocks) K split 2 as 1 at M = 4.
    for (m, n, k), block in [((4, 100, 4096), (1, 128)), ((12, 36, 1024), (128, 128)),
                             ((1, 4098, 2048), (1, 256)), ((3, 40, 64), (1, 64)), ((17, 36, 256), (1, 64)),
                             ((5, 36, 1152), (1, 128)), ((8, 1030, 3328), (128, 128)), ((6, 8200, 1024), (1, 128)),
                             ((13, 1030, 3328), (128, 128)), ((16, 5120, 1024), (1, 128)), ((4, 17400, 1024), (128, 128)),
                             ((1, 17400, 1024), (1, 128)), ((4, 10248, 1024), (1, 128)), ((16, 10248, 1024), (128, 128)),
                             ((4, 34824, 1024), (1, 128))]:
        x, w, bias = _inputs(m * n + k, m, n, k, dtype, block, with_bias=True)
        _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
@pytest.mark.parametrize("ksplit, xstage, xperm", ONE_ROW_X_PATHS)
def test_mma_one_row_x_paths(ksplit, xstage, xperm, dtype, monkeypatch):
    force_one_row_x_path(monkeypatch, ksplit, xstage, xperm)
    device = jax.devices("gpu")[0]
    for (n, k), block in zip(ONE_ROW_SPLIT_NK, [(1, 256), (1, 128), (1, 128)]):
        x, w, bias = _inputs(n + k, 1, n, k, dtype, block, with_bias=True)
        _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@requires_gpu
@pytest.mark.parametrize("xs", ["0", "4", "8", "16"])
def test_gpu_mma_x_in_shared_memory(xs, monkeypatch):
    # Persistent blocks sharing x in shared memory (see test_fp4): ragged N, several tiles per warp.
    force_x_in_shared_memory(monkeypatch, xs)
    device = jax.devices("gpu")[0]
    for (m, n, k), block, dtype in [((1, 4098, 2048), (1, 128), jnp.float16), ((3, 100, 4096), (128, 128), jnp.bfloat16),
                                    ((8, 36, 256), (1, 64), jnp.float16), ((5, 100000, 256), (1, 256), jnp.bfloat16),
                                    ((2, 100001, 512), (128, 128), jnp.float16), ((12, 4098, 2048), (1, 128), jnp.float16),
                                    ((16, 100, 4096), (128, 128), jnp.bfloat16), ((9, 100000, 256), (1, 256), jnp.bfloat16),
                                    ((16, 40000, 2048), (128, 128), jnp.float16)]:
        if not x_fits_beside_rings(xs, m, k):
            continue
        x, w, bias = _inputs(m * n + k, m, n, k, dtype, block, with_bias=True)
        _check(_poisoned_call(x, w, bias, "mma", device), x, w, bias)


@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f16", "bf16"])
def test_smallest_codes_survive_every_variant(dtype, m):
    """Only subnormal E4M3 codes (exponent field 0): with fp16 x the GPU decode hands them to the
    mma as fp16 subnormals (value x 2^-8); a kernel that flushed them would return zeros here."""
    rng = np.random.default_rng(17)
    n, k, block = 40, 512, (128, 128)
    codes = (rng.integers(1, 8, size=(n, k)) | (rng.integers(0, 2, size=(n, k)) << 7)).astype(np.uint8)
    scales = rng.uniform(0.5, 2.0, size=(1, k // 128)).astype(np.float32)
    w = jaxgemv.FP8Weight(jnp.asarray(codes.view(ml_dtypes.float8_e4m3fn)), jnp.asarray(scales), block)
    x = jnp.asarray(rng.standard_normal((m, k)), dtype)
    device = jax.devices()[0]
    for variant in _variants(device.platform, k, block, m):
        _check(_poisoned_call(x, w, None, variant, device), x, w, None)


@pytest.mark.parametrize("block", BLOCKS, ids=str)
def test_quantize_round_trip_is_exact_on_representable_weights(block):
    """A weight built from E4M3 values times power-of-two scales, each block holding +-448,
    comes back exactly; ragged blocks included."""
    rng = np.random.default_rng(3)
    n, k = 150, 300
    w = _random_weight(rng, n, k, block)
    exps = rng.integers(-8, 2, size=w.scales.shape)
    scales = np.exp2(exps).astype(np.float32)
    data = np.asarray(w.data).astype(np.float32)
    bn, bk = block
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            data[i * bn, j * bk] = 448.0  # the block's amax is 448 x its scale
    dense = data * np.repeat(np.repeat(scales, bn, axis=0), bk, axis=1)[:n, :k]
    q = jaxgemv.quantize_fp8(jnp.asarray(dense), block)
    np.testing.assert_array_equal(np.asarray(q.scales), scales)
    np.testing.assert_array_equal(np.asarray(q.dequantize(jnp.float32)), dense)


def test_quantize_handles_zero_blocks_and_ragged_tails():
    w = jnp.zeros((130, 300)).at[5, 7].set(1.75)  # amax / 448 = 2^-8: exact
    q = jaxgemv.quantize_fp8(w, (128, 128))
    assert q.scales.shape == (2, 3)
    np.testing.assert_array_equal(np.asarray(q.dequantize()), np.asarray(w))


def test_pytree_and_shape():
    x, w, _ = _inputs(1, 2, 36, 128, jnp.float16, (128, 128), False)
    leaves, tree = jax.tree_util.tree_flatten(w)
    assert len(leaves) == 2
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert again.block == (128, 128) and again.shape == (36, 128)
    y = jax.jit(lambda x, w: jaxgemv.fp8_matmul(x, w))(x, w)
    _check(y, x, w, None)


def test_errors_name_the_argument():
    x, w, bias = _inputs(2, 2, 36, 128, jnp.float16, (1, 128), True)
    with pytest.raises(TypeError, match="^fp8_matmul: w must be a jaxgemv.FP8Weight"):
        jaxgemv.fp8_matmul(x, "w")
    with pytest.raises(TypeError, match="^fp8_matmul: w.data must be an array, got list"):
        jaxgemv.fp8_matmul(x, jaxgemv.FP8Weight([1, 2], w.scales, w.block))
    with pytest.raises(ValueError, match="^fp8_matmul: w.block must be one of"):
        jaxgemv.fp8_matmul(x, jaxgemv.FP8Weight(w.data, w.scales, (1, 100)))
    with pytest.raises(TypeError, match=r"w.scales must be float32 \[36, 1\]"):
        jaxgemv.fp8_matmul(x, jaxgemv.FP8Weight(w.data, w.scales.astype(jnp.float16), (1, 128)))
    with pytest.raises(TypeError, match=r"w.scales must be float32 \[36, 2\]"):
        jaxgemv.fp8_matmul(x, jaxgemv.FP8Weight(w.data, w.scales, (1, 64)))
    with pytest.raises(TypeError, match="w.data must be float8_e4m3fn"):
        jaxgemv.fp8_matmul(x, jaxgemv.FP8Weight(w.data.astype(jnp.float16), w.scales, (1, 128)))
    with pytest.raises(TypeError, match="x must be float16 or bfloat16"):
        jaxgemv.fp8_matmul(x.astype(jnp.float32), w)
    with pytest.raises(ValueError, match=r"x must have shape \[..., 128\]"):
        jaxgemv.fp8_matmul(x[:, :64], w)
    with pytest.raises(ValueError, match=r"bias must have shape \(36,\)"):
        jaxgemv.fp8_matmul(x, w, bias=bias[:5])
    with pytest.raises(TypeError, match="bias must have x's dtype"):
        jaxgemv.fp8_matmul(x, w, bias=bias.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match="variant='bogus'"):
        jaxgemv.fp8_matmul(x, w, variant="bogus")
    with pytest.raises(ValueError, match="quantize_fp8: block must be one of"):
        jaxgemv.quantize_fp8(jnp.ones((4, 64)), (2, 64))


def test_planner_fp8():
    h200 = jaxgemv.DeviceFacts(platform="cuda", compute_capability=(9, 0), sm_count=132)
    assert jaxgemv.plan_fp8(1, 5120, 17408, 128, h200).variant == "mma"
    assert jaxgemv.plan_fp8(4, 8192, 2048, 128, h200).loads == 2
    assert jaxgemv.plan_fp8(4, 8192, 192, 64, h200).loads == 1  # three windows
    assert jaxgemv.plan_fp8(32, 8192, 2048, 128, h200).variant == "mma"
    assert jaxgemv.plan_fp8(33, 8192, 2048, 128, h200).variant == "dequant"  # past the GEMV range
    # Blocks of 32 values split a tensor-core chunk, K = 2080 is not a multiple of 64: the CUDA-core
    # kernel up to M = 8, decode-then-dot above; K = 2056 is not a multiple of 16 (its pieces).
    assert jaxgemv.plan_fp8(4, 8192, 2048, 32, h200) == jaxgemv.Plan("scalar", rows=4)
    assert jaxgemv.plan_fp8(1, 8192, 2080, 128, h200) == jaxgemv.Plan("scalar", rows=1)
    assert jaxgemv.plan_fp8(9, 8192, 2048, 32, h200).variant == "dequant"
    assert jaxgemv.plan_fp8(4, 8192, 2056, 128, h200).variant == "dequant"
    with pytest.raises(ValueError, match="power of two and at least 64"):
        jaxgemv.plan_fp8(4, 8192, 2048, 32, h200, "mma")
    assert jaxgemv.plan_fp8(4, 8192, 2048, 128, h200, "scalar").variant == "scalar"
    with pytest.raises(ValueError, match=r"variant='scalar': the FP8 scalar kernel needs K % 16 == 0, got K = 2056"):
        jaxgemv.plan_fp8(4, 8192, 2056, 128, h200, "scalar")
    cpu = jaxgemv.DeviceFacts(platform="cpu", compute_capability=(0, 0), sm_count=1)
    assert jaxgemv.plan_fp8(4, 64, 128, 128, cpu).variant == "cpu"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        jaxgemv.plan_fp8(4, 64, 128, 128, cpu, "mma")


def test_leading_dims_vmap_grad_export():
    x, w, bias = _inputs(5, 6, 36, 128, jnp.bfloat16, (1, 64), True)
    flat = jaxgemv.fp8_matmul(x, w, bias=bias)
    np.testing.assert_array_equal(np.asarray(jaxgemv.fp8_matmul(x.reshape(2, 3, 128), w, bias=bias)).reshape(6, 36),
                                  np.asarray(flat))
    mapped = jax.vmap(lambda r: jaxgemv.fp8_matmul(r, w, bias=bias))(x.reshape(2, 3, 128))
    np.testing.assert_array_equal(np.asarray(mapped).reshape(6, 36), np.asarray(flat))

    # d/dx of sum(y) is the column sums of dequant(W); d/dbias is M per column.
    f = lambda x, b: jnp.sum(jaxgemv.fp8_matmul(x, w, bias=b).astype(jnp.float32))  # noqa: E731
    dx, db = jax.grad(f, argnums=(0, 1))(x, bias)
    w64 = _dequant_f64(w)
    # bf16 weights and a bf16 result: a few ulps of the column's absolute sum.
    err = np.abs(np.asarray(dx[0], np.float64) - w64.sum(axis=0))
    assert np.all(err <= 2.0**-6 * np.abs(w64).sum(axis=0)), err.max()
    np.testing.assert_array_equal(np.asarray(db, np.float32), np.full(36, 6.0, np.float32))
    with pytest.raises(TypeError, match="not differentiable"):
        jax.grad(lambda s: jnp.sum(jaxgemv.fp8_matmul(x, jaxgemv.FP8Weight(w.data, s, w.block)).astype(
            jnp.float32)))(w.scales)

    pytest.importorskip("flatbuffers")
    allow = [jax.export.DisabledSafetyCheck.custom_call("jaxgemv_fp8_matmul")]
    exported = jax.export.export(jax.jit(lambda x, w: jaxgemv.fp8_matmul(x, w)), disabled_checks=allow)(x, w)
    again = jax.export.deserialize(exported.serialize())
    np.testing.assert_array_equal(np.asarray(again.call(x, w)), np.asarray(jaxgemv.fp8_matmul(x, w)))


@pytest.mark.parametrize("case", ["column-parallel", "row-parallel", "data+column"])
def test_sharded(mesh, case):
    """Partitioned, not gathered: no all-gather, an all-reduce exactly when K is split."""
    xspec, wspec, k_sharded = {"column-parallel": (P(), P("b", None), False),
                               "row-parallel": (P(None, "b"), P(None, "b"), True),
                               "data+column": (P("a", None), P("b", None), False)}[case]
    x, w, _ = _inputs(11, 8, 64, 512, jnp.bfloat16, (1, 128), False)
    f = jax.jit(jaxgemv.fp8_matmul)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    placed = (put(x, xspec), jaxgemv.FP8Weight(put(w.data, wspec), put(w.scales, wspec), w.block))
    check_partitioned(f, (x, w), placed, k_sharded)


def test_sharded_ragged_k_partitions_on_n(mesh):
    """K = 200 in blocks of 128 (a ragged last block): N still partitions, without a gather; a
    K-sharded one keeps K whole with a warning that says why, and gives the same answer."""
    x, w, _ = _inputs(13, 8, 64, 200, jnp.bfloat16, (1, 128), False)
    f = jax.jit(jaxgemv.fp8_matmul)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    placed = (put(x, P("a", None)), jaxgemv.FP8Weight(put(w.data, P("b", None)), put(w.scales, P("b", None)), w.block))
    check_partitioned(f, (x, w), placed, False)
    want = np.asarray(f(*on_cpu((x, w))), np.float32)
    ws = jaxgemv.FP8Weight(put(w.data, P(None, "b")), put(w.scales, P()), w.block)
    with pytest.warns(UserWarning, match="K = 200 is not a multiple of 128, the unit it splits in"):
        got = np.asarray(f(put(x, P(None, "b")), ws), np.float32)
    np.testing.assert_array_equal(got, want)


def test_x_sharded_on_k_across_more_devices_than_blocks(mesh):
    """K = 256 in blocks of 128 on an 8-way axis: K cannot split at block boundaries, so the rule
    keeps it whole (it used to hand the partitioner a 2-way sub-axis sharding it cannot express)."""
    x, w, _ = _inputs(12, 1, 64, 256, jnp.bfloat16, (1, 128), False)
    flat = Mesh(np.array(jax.devices("cpu")[:8]), ("tp",))
    put = lambda a, spec: jax.device_put(a, NamedSharding(flat, spec))  # noqa: E731
    f = jax.jit(jaxgemv.fp8_matmul)
    want = np.asarray(f(*on_cpu((x, w))), np.float32)
    for wspec in (P(), P("tp", None)):
        ws = jaxgemv.FP8Weight(put(w.data, wspec), put(w.scales, wspec), w.block)
        np.testing.assert_array_equal(np.asarray(f(put(x, P(None, "tp")), ws), np.float32), want)


@pytest.mark.parametrize("m, want", [(3, 2), (8, 1)])
def test_compact_fragment_order_lowering_for_cuda(m, want, monkeypatch):
    """FP8 reads x in fragment order unpadded at M < 8 (ffi/fp8.cuh: kCompactX): lowered for CUDA
    with an H200's facts and x forced into fragment order, the handler gets x [M, K] with xperm 2
    at M = 3 (no pad in the module), [8, K] with xperm 1 at M = 8."""
    w = jaxgemv.quantize_fp8(jax.random.normal(jax.random.key(0), (64, 512), jnp.float32), block=(1, 128))
    x = jnp.ones((m, 512), jnp.bfloat16)
    text, call = cuda_fragment_order_call(monkeypatch, fp8, jaxgemv.fp8_matmul, "jaxgemv_fp8_matmul", x, w)
    assert f"xperm = {want} : i64" in call
    assert f"tensor<{m}x512xbf16>" in call.split("->")[0].split(":")[-1]
    assert "stablehlo.pad" not in text


@pytest.mark.parametrize("scale_shape", [(), (1,), (36,), (36, 1)])
def test_from_channel_scales(scale_shape):
    """Per-tensor and per-channel FP8 checkpoints: each row's scale repeated over its K blocks, the
    product against float64 of code x scale (K = 4160: a partial last block at block_k = 256)."""
    rng = np.random.default_rng(len(scale_shape))
    n, k = 36, 4160
    codes = _random_weight(rng, n, k, (1, 128)).data
    scale = rng.uniform(0.05, 2.0, size=scale_shape).astype(np.float32)
    w = jaxgemv.FP8Weight.from_channel_scales(codes, jnp.asarray(scale, jnp.bfloat16))
    assert w.block == (1, 256) and w.scales.shape == (36, 17) and w.scales.dtype == jnp.float32
    s64 = np.asarray(jnp.asarray(scale, jnp.bfloat16), np.float64).reshape(-1, 1)
    np.testing.assert_array_equal(np.asarray(w.dequantize(), np.float64), np.asarray(codes, np.float64) * s64)
    x = jnp.asarray(rng.standard_normal((3, k)), jnp.bfloat16)
    _check(jaxgemv.fp8_matmul(x, w), x, w, None)
    name = "^FP8Weight.from_channel_scales: "
    with pytest.raises(ValueError, match=name + r"scale must be a scalar, \[1\], \[36\] or \[36, 1\], got shape \(35,\)"):
        jaxgemv.FP8Weight.from_channel_scales(codes, jnp.ones((35,), jnp.float32))
    with pytest.raises(ValueError, match=name + "block_k must be one of"):
        jaxgemv.FP8Weight.from_channel_scales(codes, jnp.float32(1), block_k=100)
    with pytest.raises(TypeError, match=name + "w.data must be float8_e4m3fn"):
        jaxgemv.FP8Weight.from_channel_scales(jnp.ones((n, k), jnp.float16), jnp.float32(1))
