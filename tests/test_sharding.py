"""fp4_matmul under pjit on 8 virtual CPU devices: partitioned, not gathered."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from checks import SHARDING_CASES, check_partitioned, on_cpu

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


def _formats(rng, n=64, k=512):
    """Every weight kind weight_sharding and matmul take, from one float32 [n, k] weight varying
    along K, and the product each is expected to run."""
    w = jnp.asarray(rng.standard_normal((n, k)) * np.linspace(0.5, 2, k), jnp.float32)
    g = jaxgemv.quantize_int4(w, block_size=32, symmetric=False)
    order = jnp.asarray(rng.permutation(k), jnp.int32)
    return {
        "nvfp4": (jaxgemv.quantize_nvfp4(w), jaxgemv.fp4_matmul),
        "fp8": (jaxgemv.quantize_fp8(w), jaxgemv.fp8_matmul),
        "fp8_128x128": (jaxgemv.quantize_fp8(w, block=(128, 128)), jaxgemv.fp8_matmul),
        "int4": (jaxgemv.quantize_int4(w, block_size=32), jaxgemv.int4_matmul),
        "int4_zp_act_order": (jaxgemv.NBitsWeight(g.packed, g.scales, g.zero_points, 4, 32, k, order),
                              jaxgemv.int4_matmul),
        "int8_zp": (jaxgemv.quantize_int8(w, block_size=64, symmetric=False), jaxgemv.int8_matmul),
        "dense": (w.astype(jnp.bfloat16), jaxgemv.dense_matmul),
    }


@pytest.mark.parametrize("case", SHARDING_CASES)
def test_weight_sharding_places_every_format(mesh, case):
    """jaxgemv.weight_sharding: one PartitionSpec of [N, K] places every array of a weight, in the
    weight's own structure; the product on the placed weight is partitioned, never gathered, and
    jaxgemv.matmul runs the format's own product."""
    xspec, wspec, _, k_sharded = SHARDING_CASES[case]
    rng = np.random.default_rng(len(case))
    x = jnp.asarray(rng.standard_normal((M, 512)), jnp.bfloat16)
    f = jax.jit(lambda x, w: jaxgemv.matmul(x, w))
    for name, (w, product) in _formats(rng).items():
        shardings = jaxgemv.weight_sharding(w, mesh, wspec)
        assert jax.tree_util.tree_structure(shardings) == jax.tree_util.tree_structure(w), name
        placed = jax.device_put(w, shardings)
        for leaf, s in zip(jax.tree_util.tree_leaves(placed), jax.tree_util.tree_leaves(shardings)):
            assert leaf.sharding == s, name
        # An act-order weight reads x[..., k_order], which mixes K's shards: x comes whole in K then.
        xs = P(tuple(xspec)[0] if len(xspec) else None, None) if name.endswith("act_order") else xspec
        check_partitioned(f, (x, w), (jax.device_put(x, NamedSharding(mesh, xs)), placed), k_sharded)
        np.testing.assert_array_equal(np.asarray(f(*on_cpu((x, w)))), np.asarray(jax.jit(product)(*on_cpu((x, w)))))


def test_weight_sharding_leaf_specs(mesh):
    rng = np.random.default_rng(3)
    formats = _formats(rng)
    spec = P("a", "b")
    got = {name: [s.spec for s in jax.tree_util.tree_leaves(jaxgemv.weight_sharding(w, mesh, spec))]
           for name, (w, _) in formats.items()}
    assert got["nvfp4"] == [P("a", "b"), P("a", "b"), P()]
    assert got["fp8"] == [P("a", "b"), P("a", "b")]
    # (128, 128) blocks: one scale row for N = 64 does not split 2 ways and stays whole.
    assert got["fp8_128x128"] == [P("a", "b"), P(None, "b")]
    assert got["int4"] == [P("a", "b", None), P("a", "b")]
    assert got["int4_zp_act_order"] == [P("a", "b", None), P("a", "b"), P("a", "b"), P(None)]
    assert got["dense"] == [P("a", "b")]
    both = jaxgemv.weight_sharding(formats["nvfp4"][0], mesh, P(("a", "b"), None))
    assert both.packed.spec == P(("a", "b"), None)


def test_weight_sharding_out_shardings_quantize_into_shards(mesh):
    """With jax.eval_shape's weight, the shardings serve as a jit's out_shardings: quantizing
    writes each device's shard, and the product on it is the one on the whole weight."""
    rng = np.random.default_rng(4)
    w = jnp.asarray(rng.standard_normal((64, 512)), jnp.float32)
    quantize = lambda a: jaxgemv.quantize_int4(a, block_size=32, symmetric=False)  # noqa: E731
    shardings = jaxgemv.weight_sharding(jax.eval_shape(quantize, w), mesh, P(None, "b"))
    q = jax.jit(quantize, out_shardings=shardings)(w)
    assert q.packed.sharding.spec == P(None, "b", None) and q.zero_points.sharding.spec == P(None, "b")
    whole = quantize(w)
    for a, b in zip(jax.tree_util.tree_leaves(q), jax.tree_util.tree_leaves(whole)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_weight_sharding_errors(mesh):
    rng = np.random.default_rng(5)
    formats = _formats(rng)
    nv, dense = formats["nvfp4"][0], formats["dense"][0]
    with pytest.raises(ValueError, match=r"weight_sharding: N = 30 does not split 4 ways over mesh axes \('b',\)"):
        jaxgemv.weight_sharding(jaxgemv.quantize_nvfp4(jnp.ones((30, 64))), mesh, P("b", None))
    with pytest.raises(ValueError, match=r"N = 48 does not split 4 ways .* in groups of 16 rows"):
        jaxgemv.weight_sharding(jaxgemv.quantize_nvfp4(jnp.ones((48, 64))), mesh, P("b", None), activation="swiglu")
    # K = 48: 3 scale blocks of 16.
    with pytest.raises(ValueError, match=r"K = 48 does not split 4 ways .* \(w.splits_k\(4\) is False\)"):
        jaxgemv.weight_sharding(jaxgemv.quantize_nvfp4(jnp.ones((8, 48))), mesh, P(None, "b"))
    with pytest.raises(ValueError, match=r"K = 20 does not split 2 ways over mesh axes \('a',\) in multiples of 8"):
        jaxgemv.weight_sharding(jnp.ones((8, 20), jnp.bfloat16), mesh, P(None, "a"))
    with pytest.raises(ValueError, match=r"spec names axis 'c', which the mesh \(axes \('a', 'b'\)\) does not have"):
        jaxgemv.weight_sharding(nv, mesh, P("c", None))
    with pytest.raises(ValueError, match="spec uses a mesh axis twice"):
        jaxgemv.weight_sharding(nv, mesh, P("a", ("b", "a")))
    with pytest.raises(ValueError, match="spec must have at most two entries"):
        jaxgemv.weight_sharding(nv, mesh, P("a", None, None))
    with pytest.raises(ValueError, match="each entry of spec must be None, a mesh axis name or a tuple of them"):
        jaxgemv.weight_sharding(dense, mesh, (3, None))
    with pytest.raises(TypeError, match="spec must be a PartitionSpec"):
        jaxgemv.weight_sharding(nv, mesh, 3)
    with pytest.raises(ValueError, match="activation='gelu': expected None or 'swiglu'"):
        jaxgemv.weight_sharding(nv, mesh, P(), activation="gelu")
    with pytest.raises(TypeError, match="weight_sharding: w must be an NVFP4Weight, FP8Weight, NBitsWeight or an"):
        jaxgemv.weight_sharding(jnp.ones((4,)), mesh, P())
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh, got str"):
        jaxgemv.weight_sharding(nv, "mesh", P())


def test_matmul_dispatches_on_the_weight():
    """jaxgemv.matmul runs the weight's own product with the arguments given (bitwise the same),
    int8 weights included, and names what it takes when w is none of them. On the CPU device,
    whatever the default (variant='cpu' is the CPU handlers')."""
    rng = np.random.default_rng(6)
    x, r = on_cpu((jnp.asarray(rng.standard_normal((3, 512)), jnp.bfloat16),
                   jnp.asarray(rng.standard_normal((3, 32)), jnp.bfloat16)))
    for name, (w, product) in _formats(rng).items():
        w, b = on_cpu((w, jnp.asarray(rng.standard_normal(64), jnp.bfloat16)))
        kw = dict(bias=b, residual=r, rms_eps=1e-5, activation="swiglu", variant="cpu")
        got = jaxgemv.matmul(x, w, **kw)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(product(x, w, **kw)), err_msg=name)
        assert np.abs(np.asarray(got, np.float32)).max() > 0
    with pytest.raises(TypeError, match=r"matmul: w must be a jaxgemv weight \(NVFP4Weight, FP8Weight, NBitsWeight "
                                        r"or an \[N, K\] array\), got list"):
        jaxgemv.matmul(x, [[1.0]])
    with pytest.raises(ValueError, match="int8_matmul: variant='bogus': expected one of"):  # the product's own
        jaxgemv.matmul(x, _formats(rng)["int8_zp"][0], variant="bogus")
