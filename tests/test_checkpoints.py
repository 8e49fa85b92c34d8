"""GPTQ and AWQ checkpoints repacked into the MatMulNBits layout (jaxgemv/checkpoints.py): the
checkpoints are built here with packers of their own, dequantized the way the formats describe
(unpack the words, reorder AWQ's columns, (q - zero) x scale per group), and compared exactly with
the repacked weight, then through int4_matmul / int8_matmul against float64."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jaxgemv
from checks import check_product

AWQ_REVERSE = [0, 4, 1, 5, 2, 6, 3, 7]  # output column 8c + i <- the word's code at shift 4 x AWQ_REVERSE[i]


def _pack_words(codes, bits, axis):
    """uint8 codes -> int32 words of 32 / bits codes along `axis`, code j at shift j x bits."""
    p = 32 // bits
    c = np.moveaxis(codes.astype(np.uint32), axis, -1)
    c = c.reshape(c.shape[:-1] + (c.shape[-1] // p, p))
    words = np.zeros(c.shape[:-1], np.uint32)
    for j in range(p):
        words |= c[..., j] << np.uint32(j * bits)
    return np.moveaxis(words.view(np.int32), -1, axis)


def _unpack_words(words, bits, axis):
    p = 32 // bits
    w = np.moveaxis(words.view(np.uint32), axis, -1)
    out = np.stack([(w >> np.uint32(j * bits)) & np.uint32((1 << bits) - 1) for j in range(p)], axis=-1)
    return np.moveaxis(out.reshape(w.shape[:-1] + (-1,)), -1, axis).astype(np.int64)


def _gptq(rng, n, k, bits, group, zeros=None):
    """A GPTQ layer: codes [K, N], zero points [G, N] (stored minus one), fp16 scales [G, N]."""
    g = -(-k // group)
    codes = rng.integers(0, 1 << bits, size=(k, n))
    zp = rng.integers(1, 1 << bits, size=(g, n)) if zeros is None else np.full((g, n), zeros)
    scales = rng.uniform(0.01, 0.1, size=(g, n)).astype(np.float16)
    npad = -(-n // (32 // bits)) * (32 // bits) - n
    qzeros = _pack_words(np.pad(zp - 1, ((0, 0), (0, npad))), bits, 1)
    return _pack_words(codes, bits, 0), qzeros, scales


def _gptq_dense(qweight, qzeros, scales, bits, group, offset=1, g_idx=None):
    """[N, K] float64 the way GPTQ describes it: unpack along K and N, zero plus one, per group
    (of each k: g_idx, k // group by default)."""
    iw = _unpack_words(qweight, bits, 0)
    n = qweight.shape[1]
    iz = _unpack_words(qzeros, bits, 1)[:, :n] + offset
    gk = np.arange(iw.shape[0]) // group if g_idx is None else g_idx
    return ((iw - iz[gk]) * scales.astype(np.float64)[gk]).T


def _awq(rng, n, k, group):
    g = -(-k // group)
    codes = rng.integers(0, 16, size=(k, n))
    zp = rng.integers(0, 16, size=(g, n))
    scales = rng.uniform(0.01, 0.1, size=(g, n)).astype(np.float16)

    def pack(c):  # column 8c + i to the shift 4 x AWQ_REVERSE[i]
        c = c.reshape(c.shape[0], -1, 8).astype(np.uint32)
        words = np.zeros(c.shape[:2], np.uint32)
        for i in range(8):
            words |= c[..., i] << np.uint32(4 * AWQ_REVERSE[i])
        return words.view(np.int32)

    return pack(codes), pack(zp), scales


def _awq_dense(qweight, qzeros, scales, group):
    def unpack(words):  # shift order, then the columns put back
        u = _unpack_words(words, 4, 1)
        rev = np.arange(u.shape[1]).reshape(-1, 8)[:, AWQ_REVERSE].reshape(-1)
        return u[:, rev]

    iw, iz = unpack(qweight), unpack(qzeros)
    gk = np.arange(iw.shape[0]) // group
    return ((iw - iz[gk]) * scales.astype(np.float64)[gk]).T


def _product_check(w, dense, rng):
    x = jnp.asarray(rng.standard_normal((3, w.k)), jnp.dtype(w.scales.dtype))
    f = jaxgemv.int4_matmul if w.bits == 4 else jaxgemv.int8_matmul
    check_product(f(x, w), x, dense, None, x.dtype)


@pytest.mark.parametrize("bits, n, k, group", [(4, 40, 512, 128), (4, 24, 200, 32), (8, 36, 256, 64),
                                               (4, 16, 1024, 512), (4, 16, 300, -1), (8, 12, 384, -1)])
def test_gptq(bits, n, k, group):
    rng = np.random.default_rng(bits + n + k)
    kk = -(-k // (32 // bits)) * (32 // bits)  # K packs whole words
    g = kk if group == -1 else group
    qweight, qzeros, scales = _gptq(rng, n, kk, bits, g)
    dense = _gptq_dense(qweight, qzeros, scales, bits, g)
    w = jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, bits=bits, group_size=group,
                                      g_idx=np.arange(kk) // g)
    assert w.shape == (n, kk) and w.zero_points is not None
    np.testing.assert_array_equal(np.asarray(w.dequantize(), np.float64), dense)
    _product_check(w, dense, rng)


@pytest.mark.parametrize("bits, n, k, group", [(4, 40, 512, 128), (4, 24, 200, 32), (8, 16, 384, 64)])
def test_gptq_act_order(bits, n, k, group):
    """desc_act: g_idx assigns the k of each group in a permuted order (a random one here; K = 200
    leaves a last group of 8). The weight is stored with K in group order and carries the order:
    dequantize gives the checkpoint's own order, and the products take x as it is."""
    rng = np.random.default_rng(bits + n + k + 1)
    g_idx = rng.permutation(k) // group
    qweight, qzeros, scales = _gptq(rng, n, k, bits, group)
    dense = _gptq_dense(qweight, qzeros, scales, bits, group, g_idx=g_idx)
    w = jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, bits=bits, group_size=group, g_idx=g_idx)
    order = np.asarray(w.k_order)
    assert w.k_order.dtype == jnp.int32 and sorted(order.tolist()) == list(range(k))
    assert np.array_equal(g_idx[order], np.arange(k) // group)  # stored in group order
    np.testing.assert_array_equal(np.asarray(w.dequantize(), np.float64), dense)
    stored = jaxgemv.NBitsWeight(w.packed, w.scales, w.zero_points, bits, w.block_size, k)  # the order dropped
    np.testing.assert_array_equal(np.asarray(stored.dequantize(), np.float64), dense[:, order])
    x = jnp.asarray(rng.standard_normal((3, k)), jnp.float16)
    f = jax.jit(jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul)
    check_product(f(x, w), x, dense, None, x.dtype)
    # The identity order keeps none.
    w2 = jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, bits=bits, group_size=group, g_idx=np.arange(k) // group)
    assert w2.k_order is None
    np.testing.assert_array_equal(np.asarray(w2.dequantize(), np.float64),
                                  _gptq_dense(qweight, qzeros, scales, bits, group))


def test_gptq_symmetric_keeps_no_zero_points():
    rng = np.random.default_rng(0)
    qweight, qzeros, scales = _gptq(rng, 32, 256, 4, 128, zeros=8)  # stored 7, the implied 8
    w = jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, group_size=128, scale_dtype=jnp.bfloat16)
    assert w.zero_points is None and w.scales.dtype == jnp.bfloat16
    dense = _gptq_dense(qweight, qzeros, scales.astype(jnp.bfloat16).astype(np.float32), 4, 128)
    np.testing.assert_array_equal(np.asarray(w.dequantize(), np.float64), dense)
    _product_check(w, dense, rng)


@pytest.mark.parametrize("n, k, group", [(32, 256, 128), (16, 512, 64), (24, 2048, -1)])
def test_awq(n, k, group):
    rng = np.random.default_rng(n + k)
    g = k if group == -1 else group
    qweight, qzeros, scales = _awq(rng, n, k, g)
    dense = _awq_dense(qweight, qzeros, scales, g)
    w = jaxgemv.NBitsWeight.from_awq(qweight, qzeros, scales, group_size=group)
    np.testing.assert_array_equal(np.asarray(w.dequantize(), np.float64), dense)
    _product_check(w, dense, rng)


def test_checkpoint_errors():
    rng = np.random.default_rng(1)
    qweight, qzeros, scales = _gptq(rng, 16, 256, 4, 128)
    name = "^NBitsWeight.from_gptq: "
    with pytest.raises(ValueError, match=name + "g_idx does not give every group 128 values of K"):
        jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, group_size=128, g_idx=np.arange(256) % 3)
    with pytest.raises(ValueError, match=name + r"g_idx must be integer \[K\] = \[256\]"):
        jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, group_size=128, g_idx=np.zeros(128, np.int32))
    with pytest.raises(ValueError, match=name + "a zero point reaches 16"):
        jaxgemv.NBitsWeight.from_gptq(qweight, _pack_words(np.full((2, 16), 15), 4, 1), scales, group_size=128)
    with pytest.raises(ValueError, match=name + r"2 groups of 128 values along K = 256 need"):
        jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales[:1], group_size=128)
    with pytest.raises(TypeError, match=name + "scales are float32; pass scale_dtype"):
        jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales.astype(np.float32), group_size=128)
    with pytest.raises(TypeError, match=name + "qweight must be int32"):
        jaxgemv.NBitsWeight.from_gptq(qweight.astype(np.float32), qzeros, scales, group_size=128)
    with pytest.raises(TypeError, match=name + "qweight is traced; convert checkpoints outside jax.jit"):
        jax.jit(lambda q: jaxgemv.NBitsWeight.from_gptq(q, qzeros, scales, group_size=128).scales)(qweight)
    with pytest.raises(ValueError, match="^NBitsWeight.from_awq: qzeros must have qweight's 2 columns"):
        jaxgemv.NBitsWeight.from_awq(np.zeros((256, 2), np.int32), np.zeros((2, 3), np.int32),
                                     np.ones((2, 16), np.float16), group_size=128)
    with pytest.raises(ValueError, match=name + "group_size 40 is not a multiple of a block size"):
        jaxgemv.NBitsWeight.from_gptq(qweight, qzeros, scales, group_size=40)
