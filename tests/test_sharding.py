"""fp4_matmul under pjit on 8 virtual CPU devices: partitioned, not gathered."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from checks import SHARDING_CASES, check_partitioned

N, K, M = 64, 256, 8


def _data(seed, n=N, k=K, m=M):
    rng = np.random.default_rng(seed)
    w = jaxgemv.quantize_nvfp4(jnp.asarray(rng.standard_normal((n, k)) * np.linspace(0.5, 2, k), jnp.float32))
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
    return x, w, b


def _place(mesh, x, w, b, xspec, wspec, bspec):
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    ws = jaxgemv.NVFP4Weight(put(w.packed, wspec), put(w.scales, wspec), put(w.global_scale, P()))
    return put(x, xspec), ws, put(b, bspec)


_f = jax.jit(lambda x, w, b: jaxgemv.fp4_matmul(x, w, bias=b))


@pytest.mark.parametrize("case", SHARDING_CASES)
def test_partitioned_numerics_and_collectives(mesh, case):
    xspec, wspec, bspec, k_sharded = SHARDING_CASES[case]
    x, w, b = _data(hash(case) % 2**32)
    # The weight is never gathered; partial products are reduced exactly when K is split.
    check_partitioned(_f, (x, w, b), _place(mesh, x, w, b, xspec, wspec, bspec), k_sharded)


def test_bias_added_once_after_the_reduction(mesh):
    x, w, b = _data(5)
    big = jnp.full((N,), 100.0, jnp.bfloat16)
    want = np.asarray(_f(x, w, big), np.float32)
    got = np.asarray(_f(*_place(mesh, x, w, big, P(None, "b"), P(None, "b"), P())), np.float32)
    # A bias added on each of the 4 K shards would be off by 300.
    np.testing.assert_allclose(got, want, atol=2.0)


def test_k_split_inside_a_scale_block_stays_correct(mesh):
    # K = 48 is 3 scale blocks: 4 shards of the packed bytes would split blocks.
    x, w, b = _data(9, k=48)
    assert w.splits_k(3) and not w.splits_k(4)
    want = np.asarray(_f(x, w, b), np.float32)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    ws = jaxgemv.NVFP4Weight(put(w.packed, P(None, "b")), w.scales, w.global_scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = np.asarray(_f(put(x, P(None, "b")), ws, b), np.float32)
    np.testing.assert_allclose(got, want, rtol=0, atol=4 * 2.0**-8 * np.abs(want).max())


def test_rule_keeps_k_whole_when_an_axis_does_not_divide_the_blocks():
    from jaxgemv import sharding

    layout = sharding.WeightLayout(leaves=(("n", ("k", 8)), ("n", ("k", 1)), ()), block=16)
    split, factors = layout.rule(256, (False, False, False), (8,))  # 16 blocks over 8 devices: K may split
    assert "kb" in factors["reduction_factors"]
    whole, factors = layout.rule(256, (False, False, False), (3,))  # 16 blocks do not split 3 ways: K stays whole
    assert "reduction_factors" not in factors and "k" in factors["need_replication_factors"]
    assert whole.startswith("m k,")


def test_weights_say_how_many_ways_k_splits():
    """`splits_k(ways)`: K a whole number of the format's K units (NVFP4 16 values; FP8 its K block,
    whatever its rows; int4 / int8 a block, a pair of them for 4-bit codes with zero points), that
    number divisible by `ways`; one way always."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((32, 384)), jnp.float32)
    nv = jaxgemv.quantize_nvfp4(w)  # 24 blocks
    assert [nv.splits_k(d) for d in (1, 2, 3, 4, 5, 8, 16)] == [True, True, True, True, False, True, False]
    for block in ((1, 128), (128, 128)):  # 3 K blocks
        f8 = jaxgemv.quantize_fp8(w, block=block)
        assert [f8.splits_k(d) for d in (1, 2, 3, 6)] == [True, False, True, False]
    ragged = jaxgemv.quantize_fp8(w[:, :320], block=(1, 128))  # 2.5 blocks: K never splits
    assert ragged.splits_k(1) and not ragged.splits_k(2)
    sym = jaxgemv.quantize_int4(w, block_size=32)  # 12 blocks
    asym = jaxgemv.quantize_int4(w, block_size=32, symmetric=False)  # 6 pairs
    assert [sym.splits_k(d) for d in (4, 12)] == [True, True] and [asym.splits_k(d) for d in (3, 4, 6, 12)] == [
        True, False, True, False]
    assert jaxgemv.quantize_int8(w, block_size=64, symmetric=False).splits_k(6)  # 8-bit: any block
    for bad in (0, -2, 2.0, True, "4"):
        with pytest.raises(ValueError, match="splits_k: ways must be a positive integer"):
            nv.splits_k(bad)
    assert nv.splits_k(np.int64(4))
