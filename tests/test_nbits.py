"""int4 / int8 in the MatMulNBits layout: layout byte for byte, quantizers, and the products on
every variant against a float64 reference."""

import warnings

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jaxgemv
from jaxgemv import nbits
from checks import (ONE_ROW_SPLIT_NK, ONE_ROW_X_PATHS, SHARDING_CASES, check_partitioned, check_product,
                    cuda_fragment_order_call, force_one_m_tile_blocks, force_one_row_x_path, force_x_in_shared_memory,
                    on_cpu, poisoned_call, x_fits_beside_rings)
from conftest import requires_gpu

DTYPES = [jnp.float16, jnp.bfloat16]


def _pack_reference(codes, bits):
    """numpy packer, independent of the library: [N, blocks, bs] codes -> MatMulNBits bytes."""
    if bits == 8:
        return codes.astype(np.uint8)
    out = np.zeros(codes.shape[:-1] + (codes.shape[-1] // 2,), np.uint8)
    for i in range(codes.shape[-1] // 2):
        out[..., i] = codes[..., 2 * i] | (codes[..., 2 * i + 1] << 4)
    return out


def _random_weight(rng, n, k, bits, bs, with_zp, dtype):
    """Codes over the whole range, zero points and scales that vary per block; scales in [0.05, 1]."""
    blocks = -(-k // bs)
    codes = rng.integers(0, 1 << bits, size=(n, blocks, bs), dtype=np.uint8)
    scales = rng.uniform(0.05, 1.0, size=(n, blocks)).astype(np.float32)
    zp = rng.integers(0, 1 << bits, size=(n, blocks), dtype=np.uint8) if with_zp else None
    zp_packed = None
    if with_zp:
        zcodes = zp if bits == 8 or blocks % 2 == 0 else np.pad(zp, ((0, 0), (0, 1)))
        zp_packed = jnp.asarray(_pack_reference(zcodes, bits))
    w = jaxgemv.NBitsWeight(jnp.asarray(_pack_reference(codes, bits)), jnp.asarray(scales, dtype), zp_packed,
                            bits, bs, k)
    return w, codes, zp


def _dequant_f64(w, codes, zp):
    n = codes.shape[0]
    z = zp.astype(np.float64) if zp is not None else np.full(codes.shape[:2], 1 << (w.bits - 1), np.float64)
    vals = (codes.astype(np.float64) - z[..., None]) * np.asarray(w.scales).astype(np.float64)[..., None]
    return vals.reshape(n, -1)[:, : w.k]


def _check(y, x, w64, bias):
    """The baseline rounds (q - zp) x scale to x's dtype, as the plain jnp path does."""
    check_product(y, x, w64, bias, x.dtype)


def _poisoned_call(f, x, w, bias, variant, device):
    return poisoned_call(f, x, w, bias, variant, device)


# (M, N, K, block size): every block size; K from 16 to 12288 with tails that end mid-block;
# N small (8, 24) and large; M 1..17.
CASES = (
    [(m, 24, 256, 32) for m in (1, 2, 3, 5, 8, 16, 17)]
    + [(4, 8, k, bs) for k, bs in ((16, 16), (48, 32), (100, 64), (300, 128), (1000, 256), (12288, 64))]
    + [(2, 1030, 2048, bs) for bs in nbits.BLOCK_SIZES]
)


def _ids(cases):
    return [f"M{m}-N{n}-K{k}-bs{bs}" for m, n, k, bs in cases]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_matmul_cpu(case, bits):
    m, n, k, bs = case
    f = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    device = jax.devices("cpu")[0]
    rng = np.random.default_rng(hash((case, bits)) % 2**32)
    for i, (dtype, with_zp) in enumerate([(jnp.float16, True), (jnp.bfloat16, False)]):
        w, codes, zp = _random_weight(rng, n, k, bits, bs, with_zp, dtype)
        x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k), dtype)
        bias = jnp.asarray(rng.standard_normal(n), dtype) if i == 0 else None
        for variant in ("auto", "cpu", "dequant"):
            _check(_poisoned_call(f, x, w, bias, variant, device), x, _dequant_f64(w, codes, zp), bias)


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_matmul_gpu(bits, case):
    # One test a case, so that parallel workers share them (all cases in one test: 60-90 s on
    # the GPU machine, the suite's tail).
    f = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    device = jax.devices("gpu")[0]
    m, n, k, bs = case
    rng = np.random.default_rng(hash((case, bits)) % 2**32)
    for dtype, with_zp in [(jnp.float16, False), (jnp.bfloat16, True)]:
        w, codes, zp = _random_weight(rng, n, k, bits, bs, with_zp, dtype)
        x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k), dtype)
        variants = ["auto", "dequant"] + (["mma"] if k % (512 // bits) == 0 else [])
        for variant in variants:
            _check(_poisoned_call(f, x, w, None, variant, device), x, _dequant_f64(w, codes, zp), None)


def _check_forced_mma(bits, cases):
    """The forced tensor-core kernel on (M, N, K, block size) cases, with and without zero points,
    against float64 (whatever the environment forces of its launch parameters)."""
    f = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    device = jax.devices("gpu")[0]
    for m, n, k, bs in cases:
        rng = np.random.default_rng(m * n + k + bits)
        for dtype, with_zp in [(jnp.bfloat16, True), (jnp.float16, False)]:
            w, codes, zp = _random_weight(rng, n, k, bits, bs, with_zp, dtype)
            x = jnp.asarray(rng.standard_normal((m, k)) * np.linspace(0.5, 1.5, k), dtype)
            bias = jnp.asarray(rng.standard_normal(n), dtype)
            _check(_poisoned_call(f, x, w, bias, "mma", device), x, _dequant_f64(w, codes, zp), bias)


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("ksplit", ["1", "2", "4", "8"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_every_ksplit(bits, ksplit, xperm, monkeypatch):
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    monkeypatch.setenv("JAXGEMV_XPERM", xperm)
    # M = 13 and 16: two m-tiles (x ahead with a K split) on unequal windows per warp and on 320
    # blocks (the two-m-tile held instance's window on an H200). Half the K split on an H200
    # (gemv_launch.cuh, TakesHalfKSplit, common.h MmaHalvesKSplit; ragged N): M = 4 on N = 17400 (1088
    # blocks) runs K split 4 as 2, on N = 10248 (641 blocks) K split 8 as 4 (int8 and int4), M = 16
    # there (two m-tiles) K split 4 as 2 (int4) and K split 8 as 4 (int8, on its last wave at two
    # K-split-8 blocks per SM, ahead of the held instance; so int8's M = 16 on 320 blocks runs held
    # only under test_bounded_instances_match_their_references), M = 4 on N = 34824 (2177 blocks) K
    # split 2 as 1. Twice the K split (TakesDoubleKSplit): M = 16 on N = 17416 (1089 blocks, two waves
    # at eight K-split-2 blocks per SM, three at four K-split-4 ones) runs int4's K split 2 as 4. M =
    # 6 on N = 8200 (513 blocks, one two-load window per warp at K split 8) plans int4 with one load
    # per window (planner._int4_one_load).
    _check_forced_mma(bits, [(4, 100, 4096, 16), (12, 36, 1024, 128), (1, 4098, 2048, 32), (3, 40, 128, 64),
                             (17, 36, 384, 256), (6, 8200, 2048, 32), (1, 40, 1024, 16), (13, 1030, 3328, 128),
                             (16, 5120, 1024, 32), (4, 17400, 1024, 64), (4, 10248, 1024, 32), (16, 10248, 1024, 128),
                             (4, 34824, 1024, 64), (16, 17416, 1024, 32)])


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("ksplit", ["1", "8"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_one_m_tile_blocks_above_8_rows(bits, ksplit, xperm, monkeypatch):
    # JAXGEMV_ROWS=1: M 9-16 as one-m-tile blocks, two per column tile.
    force_one_m_tile_blocks(monkeypatch, ksplit, xperm)
    _check_forced_mma(bits, [(12, 36, 1024, 32), (16, 100, 2048, 16), (9, 8200, 1024, 128)])


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("ksplit, xstage, xperm", ONE_ROW_X_PATHS)
def test_mma_one_row_x_paths(bits, ksplit, xstage, xperm, monkeypatch):
    force_one_row_x_path(monkeypatch, ksplit, xstage, xperm)
    # At M = 1 each output column of the mma sums one half chunk, scaled after it (block columns,
    # gemv_core.cuh): blocks of 16 put a chunk's halves in two blocks with their own scales and
    # zero points; blocks of 128 and 256 span several lanes' chunks.
    _check_forced_mma(bits, [(1, n, k, bs) for (n, k), bs in zip(ONE_ROW_SPLIT_NK, (32, 32, 64))]
                      + [(1, 40, 1024, bs) for bs in (16, 128, 256)])


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("ksplit", ["2", "4", "8"])
def test_mma_every_ksplit_one_load(bits, ksplit, monkeypatch):
    """At K split 8 each warp copies its windows' scale and zero-point pieces from a cursor
    stepped 8 windows at a time (ffi/nbits.cuh, StageCursor); K split 2 and 4 form them from the
    window's index (StageWindow). At one load per window 4-bit windows of 128 values are shorter
    than blocks of 256 (two windows a block) and 8-bit ones of 64 than blocks of 128 and 256, so
    consecutive windows read the same scale and share a zero-point byte. (tests/test_min_blocks.py
    reruns these under K split 6 and the held instance, which copies from the cursor too.)"""
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    monkeypatch.setenv("JAXGEMV_LOADS", "1")
    _check_forced_mma(bits, [(1, 40, 1280, 256), (4, 100, 1280, 256), (3, 36, 896, 128), (6, 1030, 2304, 16)])


# One m-tile without a K split (M = 1 with x in the ring, M = 2-8 from global memory, M 9-16 as
# two one-m-tile blocks per column tile): a tile's scales and zero points staged once for all of K
# where they take at most 4 KB at M = 1, 2 KB above (GemvArgs::tile_prep; tests/test_tile_prep.py
# runs these forced on and off): scale rows of 2 to 64 bytes, tiles cut by N (6, 8 and 4 rows in
# the last), padded last blocks (K 640 at 256: int4 zero points of 2 bytes per row, 32 per tile),
# blocks of 16 (two per int4 chunk), and tiles of 10 KB (K 4096 at 16) that only the forced launch
# stages whole.
TILE_STAGED_CASES = [(1, 1030, 2048, 128), (1, 1030, 256, 16), (1, 1030, 1152, 128), (1, 1030, 640, 64),
                     (1, 1030, 384, 32), (1, 40, 512, 256), (1, 1030, 640, 256), (1, 100, 1024, 32),
                     (1, 1030, 4096, 16), (5, 1030, 2048, 128), (8, 100, 1024, 32), (3, 1030, 640, 256),
                     (2, 1030, 4096, 16), (12, 40, 512, 256), (16, 1030, 1152, 128)]


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("loads", ["1", "2"])
@pytest.mark.parametrize("xperm", ["0", "1"])
def test_mma_tile_staged_scales(bits, loads, xperm, monkeypatch):
    monkeypatch.setenv("JAXGEMV_XS", "0")  # the per-block kernel
    monkeypatch.setenv("JAXGEMV_ROWS", "1")  # one m-tile per block, two per column tile above M = 8
    monkeypatch.setenv("JAXGEMV_KSPLIT", "1")
    monkeypatch.setenv("JAXGEMV_XPERM", xperm)
    monkeypatch.setenv("JAXGEMV_LOADS", loads)
    window = int(loads) * 512 // bits  # 4 lanes x loads chunks x 128 / bits values
    _check_forced_mma(bits, [c for c in TILE_STAGED_CASES
                             if c[2] % window == 0 and not (loads == "2" and bits == 4 and c[3] == 16)])


@requires_gpu
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("xs", ["0", "4", "8", "16"])
def test_gpu_mma_x_in_shared_memory(bits, xs, monkeypatch):
    # Persistent blocks sharing x in shared memory (see test_fp4): ragged N, several tiles per warp.
    force_x_in_shared_memory(monkeypatch, xs)
    cases = [(1, 4098, 2048, 32), (3, 100, 4096, 16), (8, 36, 256, 128), (6, 100000, 256, 64),
             (12, 4098, 2048, 32), (16, 100, 4096, 16), (9, 100000, 256, 64), (16, 40000, 2048, 32)]
    _check_forced_mma(bits, [c for c in cases if x_fits_beside_rings(xs, c[0], c[2])])


def test_planner_nbits():
    h200 = jaxgemv.DeviceFacts(platform="cuda", compute_capability=(9, 0), sm_count=132)
    assert jaxgemv.plan_nbits(1, 151936, 2048, 4, 32, h200).variant == "mma"
    assert jaxgemv.plan_nbits(8, 151936, 2048, 4, 128, h200).variant == "mma"
    # int8's lm_heads run the integer tensor cores (planner.IMMA_AUTO_INT8_LM_HEAD); with zero
    # points, which imma does not take, the GEMV.
    assert jaxgemv.plan_nbits(1, 151936, 2048, 8, 128, h200).variant == "imma"
    assert jaxgemv.plan_nbits(1, 151936, 2048, 8, 128, h200, has_zp=True).variant == "mma"
    assert jaxgemv.plan_nbits(1, 4096, 4128, 8, 32, h200).variant == "dequant"  # K % 64
    assert jaxgemv.plan_nbits(32, 151936, 2048, 4, 32, h200).variant == "mma"
    assert jaxgemv.plan_nbits(33, 151936, 2048, 4, 32, h200).variant == "dequant"  # past the GEMV range
    assert jaxgemv.plan_nbits(1, 4096, 4160, 4, 32, h200).variant == "dequant"  # K % 128

    with pytest.raises(ValueError, match="K % 128 == 0"):
        jaxgemv.plan_nbits(1, 4096, 4160, 4, 32, h200, "mma")
    with pytest.raises(ValueError, match="no warp-per-column kernel"):
        jaxgemv.plan_nbits(1, 4096, 4096, 4, 32, h200, "scalar")
    # 4-bit blocks of 16 with zero points: a two-load window's scales fill the row's stage.
    assert jaxgemv.plan_nbits(1, 4096, 4096, 4, 16, h200).loads == 2
    assert jaxgemv.plan_nbits(1, 4096, 4096, 4, 16, h200, has_zp=True).loads == 1
    assert jaxgemv.plan_nbits(1, 4096, 4096, 8, 16, h200, has_zp=True).loads == 2


def test_planner_nbits_forced_loads(monkeypatch):
    h200 = jaxgemv.DeviceFacts(platform="cuda", compute_capability=(9, 0), sm_count=132)
    monkeypatch.setenv("JAXGEMV_LOADS", "2")
    assert jaxgemv.plan_nbits(1, 4096, 4096, 4, 32, h200, has_zp=True).loads == 2
    with pytest.raises(ValueError, match="JAXGEMV_LOADS=2: this product takes at most 1 load"):
        jaxgemv.plan_nbits(1, 4096, 4096, 4, 16, h200, has_zp=True)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantizer_layout_and_round_trip(bits, symmetric):
    """The quantizer's bytes equal the reference packer's on its own codes, and weights made of
    representable values come back exactly."""
    rng = np.random.default_rng(bits + 2 * symmetric)
    n, k, bs = 6, 200, 64  # K ends mid-block
    blocks = -(-k // bs)
    qmax = (1 << bits) - 1
    half = 1 << (bits - 1)
    scales = np.exp2(rng.integers(-6, 0, size=(n, blocks))).astype(np.float32)
    if symmetric:
        zp = np.full((n, blocks), half)
        codes = rng.integers(1, qmax + 1, size=(n, blocks, bs))
        codes[:, :, 0] = 1  # q - zp = -(half - 1): the block's amax is (half - 1) x scale
    else:
        zp = rng.integers(1, qmax, size=(n, blocks))
        codes = rng.integers(0, qmax + 1, size=(n, blocks, bs))
        codes[:, :, 0], codes[:, :, 1] = 0, qmax  # min and max hit: (max - min) / qmax = scale
    codes[:, -1, k - (blocks - 1) * bs:] = zp[:, -1:]  # the padding decodes to 0
    dense = ((codes - zp[..., None]) * scales[..., None]).reshape(n, -1)[:, :k]
    quant = nbits.quantize_int4 if bits == 4 else nbits.quantize_int8
    w = quant(jnp.asarray(dense, jnp.float32), bs, symmetric, jnp.bfloat16)
    np.testing.assert_array_equal(np.asarray(w.scales, np.float32), scales)
    np.testing.assert_array_equal(np.asarray(w.dequantize()), dense)
    got_codes = np.asarray(nbits._unpack(w.packed, bits))
    np.testing.assert_array_equal(np.asarray(w.packed), _pack_reference(got_codes, bits))
    if symmetric:
        assert w.zero_points is None
    else:
        np.testing.assert_array_equal(np.asarray(nbits._unpack(w.zero_points, bits))[:, :blocks], zp)


def test_errors_name_the_argument():
    rng = np.random.default_rng(0)
    w, _, _ = _random_weight(rng, 8, 64, 4, 32, True, jnp.float16)
    x = jnp.ones((2, 64), jnp.float16)
    with pytest.raises(TypeError, match="^int4_matmul: w must be a jaxgemv.NBitsWeight"):
        jaxgemv.int4_matmul(x, object())
    with pytest.raises(TypeError, match="^int4_matmul: w.zero_points must be an array, got tuple"):
        jaxgemv.int4_matmul(x, jaxgemv.NBitsWeight(w.packed, w.scales, (1, 2), 4, 32, 64))
    with pytest.raises(ValueError, match="this product takes 8-bit weights"):
        jaxgemv.int8_matmul(x, w)
    with pytest.raises(TypeError, match=r"w.scales \(float16\) must be in x's dtype \(bfloat16\)"):
        jaxgemv.int4_matmul(x.astype(jnp.bfloat16), w)
    with pytest.raises(ValueError, match=r"x must have shape \[..., 64\]"):
        jaxgemv.int4_matmul(x[:, :32], w)
    bad = jaxgemv.NBitsWeight(w.packed, w.scales, w.zero_points, 4, 32, 100)
    with pytest.raises(ValueError, match=r"^int4_matmul: w.packed must be \[8, 4, 16\] for K = 100"):
        jaxgemv.int4_matmul(jnp.ones((2, 100), jnp.float16), bad)
    with pytest.raises(ValueError, match="block_size must be one of"):
        jaxgemv.int4_matmul(x, jaxgemv.NBitsWeight(w.packed, w.scales, None, 4, 48, 64))
    with pytest.raises(TypeError, match="zero_points must be uint8"):
        jaxgemv.int4_matmul(x, jaxgemv.NBitsWeight(w.packed, w.scales, w.zero_points[:, :0], 4, 32, 64))
    with pytest.raises(TypeError, match=r"^int4_matmul: w.k_order must be int32 \[64\] \(a permutation of K\)"):
        jaxgemv.int4_matmul(x, jaxgemv.NBitsWeight(w.packed, w.scales, w.zero_points, 4, 32, 64,
                                                   jnp.arange(32, dtype=jnp.int32)))
    with pytest.raises(TypeError, match=r"^int4_matmul: w.k_order must be an array, got list"):
        jaxgemv.int4_matmul(x, jaxgemv.NBitsWeight(w.packed, w.scales, w.zero_points, 4, 32, 64, list(range(64))))
    cpu_args = jax.device_put((x, w), jax.devices("cpu")[0])
    with pytest.raises(ValueError, match="needs a CUDA device"):
        jax.jit(lambda x, w: jaxgemv.int4_matmul(x, w, variant="mma"))(*cpu_args)
    with pytest.raises(ValueError, match="quantize_int4: block_size must be one of"):
        jaxgemv.quantize_int4(jnp.ones((4, 64)), 24)


def test_grad_vmap_export():
    rng = np.random.default_rng(1)
    w, codes, zp = _random_weight(rng, 12, 100, 4, 32, True, jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((6, 100)), jnp.bfloat16)
    flat = jaxgemv.int4_matmul(x, w)
    mapped = jax.vmap(lambda r: jaxgemv.int4_matmul(r, w))(x.reshape(2, 3, 100))
    np.testing.assert_array_equal(np.asarray(mapped).reshape(6, 12), np.asarray(flat))
    dx = jax.grad(lambda x: jnp.sum(jaxgemv.int4_matmul(x, w).astype(jnp.float32)))(x)
    w64 = _dequant_f64(w, codes, zp)
    err = np.abs(np.asarray(dx[0], np.float64) - w64.sum(axis=0))
    assert np.all(err <= 2.0**-6 * np.abs(w64).sum(axis=0)), err.max()
    pytest.importorskip("flatbuffers")
    allow = [jax.export.DisabledSafetyCheck.custom_call("jaxgemv_nbits_matmul")]
    exported = jax.export.export(jax.jit(jaxgemv.int4_matmul), disabled_checks=allow)(x, w)
    again = jax.export.deserialize(exported.serialize())
    np.testing.assert_array_equal(np.asarray(again.call(x, w)), np.asarray(flat))


def _place_nbits(mesh, w, wspec):
    """w's arrays on the mesh, packed [N, blocks, bytes], scales [N, blocks] and zero points [N,
    packed blocks] split on N and blocks as the 2-D spec wspec says."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    wn, wk = (tuple(wspec) + (None, None))[:2]
    zps = None if w.zero_points is None else put(w.zero_points, P(wn, wk))
    return jaxgemv.NBitsWeight(put(w.packed, P(wn, wk, None)), put(w.scales, P(wn, wk)), zps, w.bits, w.block_size, w.k)


# (bits, zero points): every sharding case for int4 with zero points (K in pairs of blocks), the
# K-split ones for the rest.
NBITS_SHARDED = ([(4, True, case) for case in SHARDING_CASES]
                 + [(bits, zp, case) for bits, zp in ((4, False), (8, True), (8, False))
                    for case in ("row-parallel", "column+row")])


@pytest.mark.parametrize("bits,with_zp,case", NBITS_SHARDED)
def test_sharded_partitions_on_n_and_k(mesh, bits, with_zp, case):
    """Partitioned, never gathered: on N without communication, on K (whole blocks; 4-bit zero
    points in pairs of blocks, one byte each) with one float32 all-reduce; x on M alongside."""
    from jax.sharding import NamedSharding

    xspec, wspec, bspec, k_sharded = SHARDING_CASES[case]
    rng = np.random.default_rng(hash((bits, with_zp, case)) % 2**32)
    w, _, _ = _random_weight(rng, 64, 256, bits, 32, with_zp, jnp.bfloat16)  # 8 blocks: 2 per K shard
    assert w.splits_k(4) and w.splits_k(8) == (not (bits == 4 and with_zp))  # 4-bit zero points: pairs
    x = jnp.asarray(rng.standard_normal((8, 256)), jnp.bfloat16)
    bias = jnp.asarray(rng.standard_normal(64), jnp.bfloat16)
    matmul = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    f = jax.jit(lambda x, w, b: matmul(x, w, bias=b))
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    placed = (put(x, xspec), _place_nbits(mesh, w, wspec), put(bias, bspec))
    check_partitioned(f, (x, w, bias), placed, k_sharded)


def test_sharding_rule_splits_k_at_whole_blocks():
    """The Shardy rule: K a reduction factor where the blocks (pairs of them for 4-bit zero points)
    split over the axis, kept whole otherwise; the absent zero points' placeholder and the bytes
    of a block never shard."""
    layout = nbits._layout(4, 32, True)  # units of 64 values: two blocks, one zero-point byte
    text, factors = layout.rule(256, (False, False, False), (4,))
    assert factors["reduction_factors"] == ("kb",) and text.startswith("m (kb kx)")
    assert "r0x2" in factors["need_replication_factors"]
    text, factors = layout.rule(128, (False, False, False), (4,))  # two units over 4 devices
    assert "reduction_factors" not in factors and text.startswith("m k,")
    text, factors = nbits._layout(8, 32, False).rule(240, (False, False, False), (2,))  # ragged last block
    assert "reduction_factors" not in factors
    text, factors = nbits._layout(4, 32, False).rule(256, (False, False, False), (8,))
    assert factors["reduction_factors"] == ("kb",) and "r2x0" in factors["need_replication_factors"]


def test_k_order(mesh):
    """A weight stored with K reordered (act-order GPTQ, NBitsWeight.k_order): the products take x
    in its own order (gathered into the stored one), on every variant here, under jit, vmap, grad
    and export, and column-parallel under pjit with nothing gathered; dequantize undoes the order."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(21)
    k = 256
    w, codes, zp = _random_weight(rng, 36, k, 4, 32, True, jnp.float16)
    order = rng.permutation(k).astype(np.int32)
    wo = jaxgemv.NBitsWeight(w.packed, w.scales, w.zero_points, 4, 32, k, jnp.asarray(order))
    stored = _dequant_f64(w, codes, zp)
    dense = np.zeros_like(stored)
    dense[:, order] = stored  # the weight's own order: its column order[j] is stored column j
    np.testing.assert_array_equal(np.asarray(wo.dequantize(), np.float64), dense)
    x = jnp.asarray(rng.standard_normal((5, k)), jnp.float16)
    cpu = jax.devices("cpu")[0]
    for variant in ("cpu", "dequant"):
        _check(poisoned_call(jaxgemv.int4_matmul, x, wo, None, variant, cpu), x, dense, None)
    assert len(jax.tree.leaves(wo)) == 4
    f = jax.jit(jaxgemv.int4_matmul)
    flat = f(x, wo)
    mapped = jax.vmap(lambda r: jaxgemv.int4_matmul(r, wo))(x.reshape(5, 1, k))
    np.testing.assert_array_equal(np.asarray(mapped).reshape(5, 36), np.asarray(flat))
    dx = jax.grad(lambda x: jnp.sum(jaxgemv.int4_matmul(x, wo).astype(jnp.float32)))(x)
    err = np.abs(np.asarray(dx[0], np.float64) - dense.sum(axis=0))
    assert np.all(err <= 2.0**-6 * np.abs(dense).sum(axis=0)), err.max()
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    placed = (put(x, P()), jaxgemv.NBitsWeight(put(w.packed, P("b", None, None)), put(w.scales, P("b", None)),
                                                put(w.zero_points, P("b", None)), 4, 32, k, put(wo.k_order, P())))
    check_partitioned(f, (x, wo), placed, False)
    pytest.importorskip("flatbuffers")
    allow = [jax.export.DisabledSafetyCheck.custom_call("jaxgemv_nbits_matmul")]
    again = jax.export.deserialize(jax.export.export(f, disabled_checks=allow)(x, wo).serialize())
    np.testing.assert_array_equal(np.asarray(again.call(x, wo)), np.asarray(flat))
    # Exports written before the fixed children carry the present arrays' flags as well (and
    # before k_order only the zero points'); those weights unflatten from their present arrays.
    assert nbits._deserialize_aux(np.asarray((4, 32, 256), np.int64).tobytes()) == (4, 32, 256)
    assert nbits._deserialize_aux(np.asarray((4, 32, 256, 1), np.int64).tobytes()) == (4, 32, 256, True, False)
    old = nbits._deserialize_aux(np.asarray((4, 32, k, 0, 1), np.int64).tobytes())
    back = jaxgemv.NBitsWeight.tree_unflatten(old, (wo.packed, wo.scales, wo.k_order))
    assert back.zero_points is None and back.k_order is wo.k_order and back.k == k
    # The structure does not depend on which arrays are present: mapped to None leaves (as jit
    # does with out_shardings) a weight keeps it.
    nones = jax.tree_util.tree_map(lambda a: None, wo)
    back = jax.tree_util.tree_map(lambda _, a: a, nones, wo, is_leaf=lambda a: a is None)
    assert back.zero_points is wo.zero_points and back.k_order is wo.k_order


def _old_exports():
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nbits_exports.py")
    spec = importlib.util.spec_from_file_location("nbits_exports", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("case", ["int4_zp", "int4_sym", "int4_order", "int8_zp"])
def test_export_from_before_fixed_children(case):
    """Artifacts exported by 8a08cca^ (tests/data: its NBitsWeight left absent zero points and
    k_order out of the pytree) load in this version, take today's weights and give the product of
    the float64 reference, equal to this version's own on CPU."""
    pytest.importorskip("flatbuffers")
    import os

    fixtures = _old_exports()
    with open(os.path.join(os.path.dirname(fixtures.__file__), f"nbits_export_{case}.bin"), "rb") as fh:
        exported = jax.export.deserialize(bytearray(fh.read()))
    x, w = on_cpu(fixtures.inputs(case))
    y = exported.call(x, w)
    # float64 reference from the bytes unpacked here (low nibble first, zero points packed the same
    # way); stored column j of a reordered weight is x's column order[j].
    bits = w.bits
    nibbles = lambda a: np.stack([a & 15, a >> 4], -1).reshape(*a.shape[:-1], -1)  # noqa: E731
    codes = np.asarray(w.packed) if bits == 8 else nibbles(np.asarray(w.packed))
    zp = None if w.zero_points is None else np.asarray(w.zero_points)
    zp = zp if zp is None or bits == 8 else nibbles(zp)[:, : codes.shape[1]]
    stored = _dequant_f64(w, codes, zp)
    dense = stored.copy()
    if w.k_order is not None:
        dense[:, np.asarray(w.k_order)] = stored
    _check(y, x, dense, None)
    f = jaxgemv.int8_matmul if bits == 8 else jaxgemv.int4_matmul
    np.testing.assert_array_equal(np.asarray(y), np.asarray(jax.jit(f)(x, w)))


@pytest.mark.parametrize("bits,with_zp,k", [(4, True, 128), (4, False, 240), (8, True, 240)])
def test_sharded_k_that_cannot_split_is_kept_whole(mesh, bits, with_zp, k):
    """K sharded where it cannot split at whole blocks: int4 zero points hold two blocks per byte
    (K = 128: 4 blocks, two pairs over 4 devices), or the last block is ragged (K = 240 in blocks
    of 32): a warning, K gathered, the same answer as unsharded."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(k + bits)
    w, _, _ = _random_weight(rng, 64, k, bits, 32, with_zp, jnp.bfloat16)
    assert w.splits_k(1) and not w.splits_k(4)  # what the warning below says
    x = jnp.asarray(rng.standard_normal((8, k)), jnp.bfloat16)
    matmul = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul
    f = jax.jit(matmul)
    want = np.asarray(f(*on_cpu((x, w))), np.float32)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    zps = w.zero_points
    if zps is not None:  # 4-bit: 2 bytes per row do not split 4 ways; keep them whole on K
        zps = put(zps, P(None, "b") if zps.shape[1] % 4 == 0 else P())
    ws = jaxgemv.NBitsWeight(put(w.packed, P(None, "b", None)), put(w.scales, P(None, "b")), zps, bits, 32, k)
    why = "is not a multiple of" if k == 240 else "in blocks of 64 cannot be split 4 ways"
    with pytest.warns(UserWarning, match=f"K = {k} {why}.*computing with K replicated"):
        hlo = f.lower(put(x, P(None, "b")), ws).compile().as_text()
    assert "all-reduce" not in hlo
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = np.asarray(f(put(x, P(None, "b")), ws), np.float32)
    np.testing.assert_array_equal(got, want)


def test_fragment_order_lowering_pads_for_cuda(monkeypatch):
    """int4 / int8 read fragment-ordered x padded to 8 rows whatever M (ffi/nbits.cuh: kCompactX
    false): lowered for CUDA with an H200's facts and x forced into fragment order, the handler gets
    x [8, K] with xperm 1 at M = 4, where FP8 and NVFP4 get it unpadded (test_fp4)."""
    w, _, _ = _random_weight(np.random.default_rng(1), 64, 512, 4, 32, True, jnp.float16)
    x = jnp.ones((4, 512), jnp.float16)
    _, call = cuda_fragment_order_call(monkeypatch, nbits, jaxgemv.int4_matmul, "jaxgemv_nbits_matmul", x, w)
    assert "xperm = 1 : i64" in call
    assert "tensor<8x512xf16>" in call.split("->")[0].split(":")[-1]


def test_quantize_says_when_float16_scales_overflow():
    w = np.full((4, 64), 1e6, np.float32)  # block scale 1e6 / 7 past float16's 65504
    with pytest.raises(ValueError, match="^quantize_int4: block scales overflow scale_dtype float16"):
        jaxgemv.quantize_int4(w, scale_dtype=jnp.float16)
    with pytest.raises(ValueError, match="^quantize_int4: block scales overflow"):
        jaxgemv.quantize_int4(w, symmetric=False, scale_dtype=jnp.float16)
    # The same weight fits bfloat16 scales, and 8-bit codes' float16 scales (1e6 / 127), exactly decoded.
    for q in (jaxgemv.quantize_int4(w), jaxgemv.quantize_int8(w, scale_dtype=jnp.float16)):
        d = np.asarray(q.dequantize(jnp.float32))
        assert np.isfinite(d).all() and np.abs(d / 1e6 - 1).max() < 2e-2


@pytest.mark.parametrize("bits, with_zp", [(4, True), (4, False), (8, True)])
def test_from_matmulnbits_takes_the_flat_onnx_arrays(bits, with_zp):
    """An ONNX model stores scales [N * blocks] and zero points [N * ceil(blocks * bits / 8)] flat:
    the constructor reshapes them, and the product matches the float64 one (blocks odd, K ragged)."""
    rng = np.random.default_rng(bits)
    n, k, bs = 24, 200, 32  # 7 blocks, the last partial
    w, codes, zp = _random_weight(rng, n, k, bits, bs, with_zp, jnp.float16)
    flat_zp = None if w.zero_points is None else np.asarray(w.zero_points).reshape(-1)
    v = jaxgemv.NBitsWeight.from_matmulnbits(np.asarray(w.packed), np.asarray(w.scales).reshape(-1), flat_zp,
                                             k=k, bits=bits, block_size=bs)
    assert v.scales.shape == (n, 7) and (v.zero_points is None) == (not with_zp)
    x = jnp.asarray(rng.standard_normal((3, k)), jnp.float16)
    _check(jaxgemv.int4_matmul(x, v) if bits == 4 else jaxgemv.int8_matmul(x, v), x, _dequant_f64(v, codes, zp), None)
    name = "^NBitsWeight.from_matmulnbits: "
    with pytest.raises(ValueError, match=name + r"scales must hold N x blocks = 24 x 7 values, got shape \(167,\)"):
        jaxgemv.NBitsWeight.from_matmulnbits(w.packed, np.asarray(w.scales).reshape(-1)[:-1], k=k, bits=bits, block_size=bs)
    with pytest.raises(TypeError, match=name + "zero_points must be packed uint8"):
        jaxgemv.NBitsWeight.from_matmulnbits(w.packed, w.scales, np.zeros((n, 7), np.float16), k=k, bits=bits,
                                             block_size=bs)
    with pytest.raises(ValueError, match=name + r"w.packed must be \[24, 9, .* for K = 264, got \[24, 7, "):
        jaxgemv.NBitsWeight.from_matmulnbits(w.packed, w.scales, k=k + 64, bits=bits, block_size=bs)
    with pytest.raises(ValueError, match=name + "b must be 3-D"):
        jaxgemv.NBitsWeight.from_matmulnbits(np.asarray(w.packed).reshape(n, -1), w.scales, k=k, bits=bits, block_size=bs)
