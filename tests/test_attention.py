"""decode_attention: rotary embedding, the cache write and grouped-query attention in one call,
against a float64 reference written here in numpy; every variant (the C++ handler and XLA's path
on CPU, the kernel on a GPU, including its cluster splits), ragged caches, per-sequence and
out-of-range positions, a carried decode loop, pjit, and the errors."""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from jaxgemv import _ext, attention
from conftest import requires_gpu

NP_DTYPES = {jnp.float16: np.float16, jnp.bfloat16: ml_dtypes.bfloat16}


def _round(a, dtype):
    return np.asarray(np.asarray(a, np.float64).astype(NP_DTYPES[dtype]), np.float64)


def reference64(qkv, k_cache, v_cache, pos, heads, kv_heads, rope_theta, scale, dtype):
    """The contract in float64: q and k rotated and rounded to dtype, k and v written at pos, then
    softmax(scale q.k) . v over positions 0..pos; NaN rows and no write for positions out of range."""
    qkv = np.asarray(qkv.astype(jnp.float32), np.float64)
    kc = np.asarray(k_cache.astype(jnp.float32), np.float64).copy()
    vc = np.asarray(v_cache.astype(jnp.float32), np.float64).copy()
    b, kvh, t, hd = kc.shape
    half, group = hd // 2, heads // kv_heads
    o = np.full((b, heads * hd), np.nan)
    for i in range(b):
        p = int(pos[i])
        if not 0 <= p < t:
            continue
        q = qkv[i, : heads * hd].reshape(heads, hd)
        k = qkv[i, heads * hd : (heads + kv_heads) * hd].reshape(kv_heads, hd)
        v = qkv[i, (heads + kv_heads) * hd :].reshape(kv_heads, hd)
        if rope_theta is not None:
            ang = p * float(rope_theta) ** (-np.arange(half) / half)
            c, s = np.cos(ang), np.sin(ang)
            rot = lambda x: np.concatenate([x[:, :half] * c - x[:, half:] * s, x[:, half:] * c + x[:, :half] * s], 1)  # noqa: E731
            q, k = _round(rot(q), dtype), _round(rot(k), dtype)
        kc[i, :, p], vc[i, :, p] = k, v
        for h in range(heads):
            sc = kc[i, h // group, : p + 1] @ q[h] * scale
            w = np.exp(sc - sc.max())
            o[i, h * hd : (h + 1) * hd] = (w / w.sum()) @ vc[i, h // group, : p + 1]
    return o, kc, vc


def _case(seed, b, heads, kv_heads, t, hd, dtype):
    """qkv whose values vary along the head dimension, and caches filled with random (non-zero)
    history, so a kernel that skipped rows, heads or dimensions would be seen."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.5, 1.5, hd)
    qkv = rng.standard_normal((b, heads + 2 * kv_heads, hd)) * ramp
    kc = rng.standard_normal((b, kv_heads, t, hd)) * ramp[::-1]
    vc = rng.standard_normal((b, kv_heads, t, hd)) + np.linspace(-1, 1, t)[None, None, :, None]
    return (jnp.asarray(qkv.reshape(b, -1), dtype), jnp.asarray(kc, dtype), jnp.asarray(vc, dtype))


@functools.partial(jax.jit, static_argnames=("heads", "kv_heads", "rope_theta", "scale", "variant"))
def _attend(qkv, kc, vc, pos, *, heads, kv_heads, rope_theta, scale, variant):
    return jaxgemv.decode_attention(qkv, kc, vc, pos, heads=heads, kv_heads=kv_heads, rope_theta=rope_theta,
                                    scale=scale, variant=variant)


def _check(variant, device, seed, b, heads, kv_heads, t, hd, dtype, pos, rope_theta=1e4, scale=None):
    qkv, kc, vc = _case(seed, b, heads, kv_heads, t, hd, dtype)
    pos = np.asarray(pos, np.int32)
    scale64 = 1 / np.sqrt(hd) if scale is None else scale
    want_o, want_k, want_v = reference64(qkv, kc, vc, pos, heads, kv_heads, rope_theta, scale64, dtype)
    args = jax.device_put((qkv, kc, vc, jnp.asarray(pos)), device)
    o, k, v = _attend(*args, heads=heads, kv_heads=kv_heads, rope_theta=rope_theta, scale=scale, variant=variant)
    o, k, v = (np.asarray(a.astype(jnp.float32), np.float64) for a in (o, k, v))
    assert o.shape == (b, heads * hd)
    bad = ~((pos >= 0) & (pos < t))
    assert np.isnan(o[bad]).all(), "out-of-range positions must give NaN rows"
    assert not np.isnan(o[~bad]).any()
    # The caches: exact where nothing was written; the new rows within one rounding of the rotation
    # (float32 angles against float64 ones).
    tol_kv = 2e-2 if dtype == jnp.bfloat16 else 2e-3
    np.testing.assert_allclose(k, want_k, rtol=tol_kv, atol=tol_kv)
    np.testing.assert_array_equal(v, want_v)
    written = np.zeros(k.shape, bool)
    for i, p in enumerate(pos):
        if 0 <= p < t:
            written[i, :, p] = True
    np.testing.assert_array_equal(k[~written], want_k[~written])
    tol = 3e-2 if dtype == jnp.bfloat16 else 4e-3
    good = o[~bad]
    np.testing.assert_allclose(good, want_o[~bad], rtol=tol, atol=tol * np.abs(want_o[~bad]).max())
    assert np.abs(good).max() > 0.05  # a kernel writing zeros fails above; this says the case is not trivial


def _cpu():
    return jax.devices("cpu")[0]


# (b, heads, kv_heads, t, head_dim, positions): ragged caches, groups of 1 to 8 (and 5, which the
# kernel serves with its group of 8), positions at both ends.
CASES = [
    (1, 32, 8, 40, 128, [39]),
    (3, 8, 2, 37, 64, [0, 17, 36]),
    (2, 5, 1, 29, 64, [28, 3]),
    (2, 4, 4, 21, 256, [7, 20]),
    (4, 16, 2, 130, 128, [129, 0, 64, 100]),
]


@pytest.mark.parametrize("variant", ["cpu", "xla"])
@pytest.mark.parametrize("case", CASES)
def test_attention_cpu(variant, case):
    b, heads, kv_heads, t, hd, pos = case
    _check(variant, _cpu(), 1, b, heads, kv_heads, t, hd, jnp.float16, pos)


@pytest.mark.parametrize("variant", ["cpu", "xla"])
def test_attention_cpu_bf16_no_rope_scale(variant):
    _check(variant, _cpu(), 2, 2, 8, 2, 19, 48, jnp.bfloat16, [18, 4], rope_theta=None, scale=0.3)


@pytest.mark.parametrize("variant", ["cpu", "xla"])
def test_attention_cpu_out_of_range(variant):
    _check(variant, _cpu(), 3, 4, 8, 2, 16, 64, jnp.float16, [-1, 16, 5, 1000])


@requires_gpu
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("case", CASES + [
    (1, 32, 8, 600, 128, [599]),            # 4 blocks per KV head (sm_90)
    (2, 32, 8, 3000, 128, [2999, 1234]),    # 8 of 375 rows, most past the shorter sequence's end
    (1, 64, 8, 1000, 64, [999]),            # group 8, head_dim 64
    (2, 8, 8, 700, 256, [0, 699]),          # head_dim 256, a sequence at position 0
])
def test_attention_gpu(dtype, case):
    b, heads, kv_heads, t, hd, pos = case
    _check("kernel", jax.devices("gpu")[0], 4, b, heads, kv_heads, t, hd, dtype, pos)


@requires_gpu
def test_attention_gpu_out_of_range_and_auto():
    gpu = jax.devices("gpu")[0]
    _check("kernel", gpu, 5, 4, 32, 8, 300, 128, jnp.float16, [-1, 300, 5, 299])
    _check("auto", gpu, 6, 2, 12, 2, 50, 96, jnp.float16, [49, 3])  # head_dim 96: XLA's path


@requires_gpu
@pytest.mark.parametrize("splits", ["1", "2", "16"])
def test_attention_gpu_forced_splits(monkeypatch, splits):
    """Every cluster size, with positions that leave most blocks of the cluster without a row (their
    empty states must weigh nothing in the combine) and one that fills them all."""
    monkeypatch.setenv("JAXGEMV_ATTN_SPLITS", splits)
    _check("kernel", jax.devices("gpu")[0], 17, 3, 16, 4, 100, 128, jnp.float16, [0, 5, 99])


@requires_gpu
@pytest.mark.parametrize("splits, case", [
    ("1", (2, 32, 8, 3000, 128, [2999, 1100])),  # chunks of 512 rows: 6, the last ragged; and 3
    ("2", (1, 64, 8, 2500, 64, [2499])),         # chunks of 1024 rows over two blocks of 1250
    ("1", (2, 8, 4, 700, 256, [699, 256])),      # chunks of 256 rows; a second chunk of one row
])
def test_attention_gpu_chunks(monkeypatch, splits, case):
    """More rows per block than one chunk of scores holds: the running maximum and sum carry from
    chunk to chunk."""
    monkeypatch.setenv("JAXGEMV_ATTN_SPLITS", splits)
    b, heads, kv_heads, t, hd, pos = case
    _check("kernel", jax.devices("gpu")[0], 18, b, heads, kv_heads, t, hd, jnp.float16, pos)


HOPPER = jaxgemv.DeviceFacts("cuda", (9, 0), 132)
AMPERE = jaxgemv.DeviceFacts("cuda", (8, 0), 108)


def test_plan_splits_forced(monkeypatch):
    monkeypatch.setenv("JAXGEMV_ATTN_SPLITS", "16")
    assert attention.plan_splits(40, 128, 4, HOPPER) == 16
    with pytest.raises(ValueError, match="clusters need compute capability 9.0"):
        attention.plan_splits(40, 128, 4, AMPERE)
    monkeypatch.setenv("JAXGEMV_ATTN_SPLITS", "3")
    with pytest.raises(ValueError, match="JAXGEMV_ATTN_SPLITS"):
        attention.plan_splits(40, 128, 4, HOPPER)
    monkeypatch.delenv("JAXGEMV_ATTN_SPLITS")
    monkeypatch.setenv("JAXGEMV_PDL", "5")
    with pytest.raises(ValueError, match="JAXGEMV_PDL"):
        attention.plan_splits(40, 128, 4, HOPPER)


def test_auto_variant():
    """auto: the kernel where it is measured faster (short caches, its head sizes), else XLA's path."""
    n = attention.AUTO_KERNEL_MAX_LEN
    assert attention._choose("auto", "cuda", 128, 4, n) == "kernel"
    assert attention._choose("auto", "cuda", 128, 4, n + 1) == "xla"
    assert attention._choose("auto", "cuda", 96, 4, 40) == "xla"
    assert attention._choose("auto", "cpu", 128, 4, 100000) == "cpu"
    assert attention._choose("kernel", "cuda", 128, 4, 100000) == "kernel"


@pytest.mark.skipif(_ext.ATTENTION_SMEM_BYTES is None, reason="the extension was built without CUDA")
def test_attention_smem_bytes_mirrors_the_kernel():
    """The planner's count of the kernel's shared memory (it decides how many splits fit) is the
    CUDA code's own, at every head size, group and split."""
    for hd in (64, 128, 256):
        for g in (1, 2, 4, 8):
            for splits in (1, 2, 4, 8, 16):
                assert attention.attention_smem_bytes(hd, g, splits) == _ext.ATTENTION_SMEM_BYTES(hd, g, splits), \
                    (hd, g, splits)
    assert _ext.ATTENTION_SMEM_BYTES(96, 4, 2) == -1


def test_attention_smem_bytes():
    """The cluster kernel's shared memory: the ring of rows in flight (64 KB) shares its region
    with the streams' sums, so the largest block (head_dim 256, 8 heads, 16 splits: 212 KB) stays
    within the H200's 227 KB and small groups pay for the ring."""
    assert attention.attention_smem_bytes(256, 8, 16) == 4 * (2048 + 512 + 2048 + 32 + 16384 + 16 * (8 * 258 + 8))
    assert attention.attention_smem_bytes(256, 8, 16) <= 227 * 1024
    assert attention.attention_smem_bytes(128, 1, 2) == 4 * (128 + 256 + 512 + 4 + 16384 + 2 * (130 + 1))
    assert attention.attention_smem_bytes(128, 1, 1) == 4 * (128 + 256 + 512 + 4 + 16 * 128)
    for hd, g, splits in [(64, 8, 16), (128, 8, 16), (256, 4, 16), (128, 4, 8)]:
        assert attention.attention_smem_bytes(hd, g, splits) <= 227 * 1024


def test_plan_splits():
    assert attention.plan_splits(40, 128, 4, HOPPER) == 1
    assert attention.plan_splits(600, 128, 4, HOPPER) == 4
    assert attention.plan_splits(100000, 128, 4, HOPPER) == attention.MAX_SPLITS == 8
    assert attention.plan_splits(100000, 128, 4, AMPERE) == 1


def _loop(variant, device, steps, heads, kv_heads, t, hd, dtype, start):
    qkv0, kc, vc = _case(7, 2, heads, kv_heads, t, hd, dtype)
    proj = jnp.asarray(np.random.default_rng(8).standard_normal((qkv0.shape[1], heads * hd)) / np.sqrt(heads * hd),
                       dtype)

    @jax.jit
    def run(qkv, kc, vc, pos):
        def body(carry, _):
            qkv, kc, vc, pos = carry
            o, kc, vc = jaxgemv.decode_attention(qkv, kc, vc, pos, heads=heads, kv_heads=kv_heads, rope_theta=1e6,
                                                 variant=variant)
            qkv = (o.astype(jnp.float32) @ proj.T.astype(jnp.float32)).astype(dtype)
            return (qkv, kc, vc, pos + 1), o
        (_, kc, vc, _), outs = jax.lax.scan(body, (qkv, kc, vc, pos), None, length=steps)
        return outs, kc, vc

    return run(*jax.device_put((qkv0, kc, vc, jnp.asarray(start, jnp.int32)), device))


@pytest.mark.parametrize("variant", ["cpu"])
def test_attention_loop_cpu(variant):
    """Eight steps carried through lax.scan: the caches the call returns are the next step's."""
    got = _loop(variant, _cpu(), 8, 8, 2, 24, 64, jnp.float16, [3, 10])
    want = _loop("xla", _cpu(), 8, 8, 2, 24, 64, jnp.float16, [3, 10])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.float32(g), np.float32(w), rtol=5e-3, atol=5e-3)


@requires_gpu
def test_attention_loop_gpu():
    gpu = jax.devices("gpu")[0]
    got = _loop("kernel", gpu, 8, 32, 8, 600, 128, jnp.float16, [3, 590])
    want = _loop("xla", gpu, 8, 32, 8, 600, 128, jnp.float16, [3, 590])
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.float32(g), np.float32(w), rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("variant", ["cpu", "xla"])
def test_attention_vmap(variant):
    """vmap over a leading axis of every operand (and over qkv and pos only, sharing the caches):
    the same as one call per example."""
    qkv, kc, vc = jax.device_put(_case(12, 6, 8, 2, 20, 64, jnp.float16), _cpu())
    qkv, kc, vc = (a.reshape(2, 3, *a.shape[1:]) for a in (qkv, kc, vc))
    pos = jax.device_put(jnp.asarray([[0, 7, 19], [3, 12, 5]], jnp.int32), _cpu())
    f = lambda q, k, v, p: jaxgemv.decode_attention(q, k, v, p, heads=8, kv_heads=2, rope_theta=1e4,  # noqa: E731
                                                    variant=variant)
    got = jax.jit(jax.vmap(f))(qkv, kc, vc, pos)
    for i in range(2):
        for g, w in zip(got, jax.jit(f)(qkv[i], kc[i], vc[i], pos[i])):
            np.testing.assert_array_equal(np.float32(g[i]), np.float32(w))
    got = jax.jit(jax.vmap(f, in_axes=(0, None, None, 0)))(qkv, kc[0], vc[0], pos)
    for i in range(2):
        for g, w in zip(got, jax.jit(f)(qkv[i], kc[0], vc[0], pos[i])):
            np.testing.assert_array_equal(np.float32(g[i]), np.float32(w))


def test_attention_batch_sharded(mesh):
    """pjit with the batch split over the mesh: the same numbers as on one device."""
    qkv, kc, vc = _case(9, 8, 8, 2, 20, 64, jnp.float16)
    pos = jnp.asarray([0, 3, 19, 7, 8, 11, 2, 5], jnp.int32)
    f = jax.jit(lambda *a: jaxgemv.decode_attention(*a, heads=8, kv_heads=2, rope_theta=1e4))
    want = f(*jax.device_put((qkv, kc, vc, pos), _cpu()))
    spec = lambda nd: NamedSharding(mesh, P(("a", "b"), *([None] * (nd - 1))))  # noqa: E731
    placed = [jax.device_put(a, spec(a.ndim)) for a in (qkv, kc, vc, pos)]
    got = f(*placed)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.float32(g), np.float32(w))


@pytest.mark.parametrize("bad, match", [
    (dict(heads=6, kv_heads=4), "multiple of kv_heads"),
    (dict(qkv=np.zeros((2, 10), np.float16)), "qkv must be"),
    (dict(qkv=np.zeros((2, 12 * 64), np.float32)), "float16 or bfloat16"),
    (dict(k_cache=np.zeros((2, 2, 20), np.float16)), "k_cache must be 4-D"),
    (dict(k_cache=np.zeros((3, 2, 20, 64), np.float16)), "k_cache must be"),
    (dict(v_cache=np.zeros((2, 2, 21, 64), np.float16)), "v_cache must have"),
    (dict(v_cache=np.zeros((2, 2, 20, 64), ml_dtypes.bfloat16)), "caches must have qkv's dtype"),
    (dict(pos=np.zeros((3,), np.int32)), "pos must be a scalar or"),
    (dict(pos=np.float32(1)), "pos must be an integer"),
    (dict(rope_theta=-1.0), "rope_theta"),
    (dict(variant="fast"), "variant must be one of"),
    (dict(qkv_groups=0), "qkv_groups must be a positive int"),
    (dict(qkv_groups=4), "must divide kv_heads"),
])
def test_attention_errors(bad, match):
    args = dict(qkv=np.zeros((2, 12 * 64), np.float16), k_cache=np.zeros((2, 2, 20, 64), np.float16),
                v_cache=np.zeros((2, 2, 20, 64), np.float16), pos=np.int32(3), heads=8, kv_heads=2)
    args.update(bad)
    arrays = {k: jnp.asarray(v) if isinstance(v, np.ndarray) or np.isscalar(v) and k == "pos" else v
              for k, v in args.items()}
    with pytest.raises((TypeError, ValueError), match=match):
        jaxgemv.decode_attention(arrays.pop("qkv"), arrays.pop("k_cache"), arrays.pop("v_cache"), arrays.pop("pos"),
                                 **arrays)


def test_attention_python_int_position():
    qkv, kc, vc = _case(16, 2, 8, 2, 12, 64, jnp.float16)
    got = jaxgemv.decode_attention(qkv, kc, vc, 5, heads=8, kv_heads=2, rope_theta=1e4)
    want = jaxgemv.decode_attention(qkv, kc, vc, jnp.asarray([5, 5], jnp.int32), heads=8, kv_heads=2, rope_theta=1e4)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.float32(g), np.float32(w))


def test_attention_variant_platform_errors():
    qkv, kc, vc = _case(10, 1, 8, 2, 8, 64, jnp.float16)
    with pytest.raises(ValueError, match="CUDA devices only"):
        _attend(*jax.device_put((qkv, kc, vc, jnp.int32(0)), _cpu()), heads=8, kv_heads=2, rope_theta=None,
                scale=None, variant="kernel")


def test_attention_updates_caches_in_place():
    """With the caches donated, or carried through a loop, the compiled step copies neither: the
    call's cache results alias its cache operands."""
    import re

    qkv, kc, vc = _case(11, 2, 8, 2, 20, 64, jnp.float16)
    pos = jnp.zeros((2,), jnp.int32)
    copies = lambda text: [l for l in text.splitlines() if re.search(r"f16\[2,2,20,64\]\S* copy\(", l)]  # noqa: E731
    step = jax.jit(lambda *a: jaxgemv.decode_attention(*a, heads=8, kv_heads=2, rope_theta=1e4), donate_argnums=(1, 2))
    assert not copies(step.lower(qkv, kc, vc, pos).compile().as_text())

    @functools.partial(jax.jit, donate_argnums=(1, 2))
    def loop(qkv, kc, vc, pos):
        def body(carry, _):
            q, k, v, p = carry
            o, k, v = jaxgemv.decode_attention(q, k, v, p, heads=8, kv_heads=2, rope_theta=1e4)
            return (jnp.concatenate([o, o[:, :256]], axis=1), k, v, p + 1), None
        return jax.lax.scan(body, (qkv, kc, vc, pos), None, length=4)[0]

    assert not copies(loop.lower(qkv, kc, vc, pos).compile().as_text())
    # Not donated: XLA must keep the caller's caches, so it copies them once before the call.
    plain = jax.jit(lambda *a: jaxgemv.decode_attention(*a, heads=8, kv_heads=2, rope_theta=1e4))
    assert copies(plain.lower(qkv, kc, vc, pos).compile().as_text())


def _grouped(qkv, heads, kv_heads, groups):
    """The plain layout [q heads | k heads | v heads] rearranged (in numpy) into qkv_groups groups,
    each [its q heads | its k heads | its v heads]."""
    a = np.asarray(qkv.astype(jnp.float32))
    b = a.shape[0]
    hd = a.shape[1] // (heads + 2 * kv_heads)
    q = a[:, : heads * hd].reshape(b, groups, -1)
    k = a[:, heads * hd : (heads + kv_heads) * hd].reshape(b, groups, -1)
    v = a[:, (heads + kv_heads) * hd :].reshape(b, groups, -1)
    return jnp.asarray(np.concatenate([q, k, v], axis=2).reshape(b, -1), qkv.dtype)


@pytest.mark.parametrize("variant", ["cpu", "xla"])
def test_attention_qkv_groups(variant):
    """qkv in head groups gives what the plain layout gives."""
    qkv, kc, vc, pos = jax.device_put((*_case(13, 2, 8, 4, 20, 64, jnp.float16), jnp.asarray([4, 19], jnp.int32)),
                                      _cpu())
    f = functools.partial(jaxgemv.decode_attention, heads=8, kv_heads=4, rope_theta=1e4, variant=variant)
    want = jax.jit(f)(qkv, kc, vc, pos)
    for groups in (2, 4):
        got = jax.jit(functools.partial(f, qkv_groups=groups))(_grouped(qkv, 8, 4, groups), kc, vc, pos)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.float32(g), np.float32(w))


def test_attention_heads_sharded(mesh):
    """Head groups split over one mesh axis and the batch over the other: each device attends with
    its own heads and sequences, nothing is gathered, and the numbers are the single device's."""
    import re

    qkv, kc, vc = _case(14, 4, 16, 8, 24, 64, jnp.float16)
    pos = jnp.asarray([0, 9, 23, 15], jnp.int32)
    grouped = _grouped(qkv, 16, 8, 4)
    f = jax.jit(functools.partial(jaxgemv.decode_attention, heads=16, kv_heads=8, rope_theta=1e4, qkv_groups=4))
    want = f(*jax.device_put((grouped, kc, vc, pos), _cpu()))
    placed = (jax.device_put(grouped, NamedSharding(mesh, P("a", "b"))),
              jax.device_put(kc, NamedSharding(mesh, P("a", "b", None, None))),
              jax.device_put(vc, NamedSharding(mesh, P("a", "b", None, None))),
              jax.device_put(pos, NamedSharding(mesh, P("a"))))
    text = f.lower(*placed).compile().as_text()
    assert not re.search(r"all-gather|all-to-all|collective-permute", text)
    got = f(*placed)
    assert got[0].sharding.spec[:2] == P("a", "b")[:2]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.float32(g), np.float32(w))


def test_attention_groups_that_do_not_split(mesh):
    """Two head groups over a 4-way axis: the heads are not split there, with a warning that says
    so (Shardy may still split the groups over part of the axis), the same numbers."""
    qkv, kc, vc = _case(15, 2, 16, 8, 16, 64, jnp.float16)
    pos = jnp.asarray([3, 15], jnp.int32)
    grouped = _grouped(qkv, 16, 8, 2)
    f = jax.jit(functools.partial(jaxgemv.decode_attention, heads=16, kv_heads=8, rope_theta=1e4, qkv_groups=2))
    want = f(*jax.device_put((grouped, kc, vc, pos), _cpu()))
    placed = (jax.device_put(grouped, NamedSharding(mesh, P(None, "b"))),
              jax.device_put(kc, NamedSharding(mesh, P(None, "b", None, None))),
              jax.device_put(vc, NamedSharding(mesh, P(None, "b", None, None))), pos)
    with pytest.warns(UserWarning, match=r"2 head group\(s\) cannot be split 4 ways .*heads replicated"):
        got = f(*placed)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.float32(g), np.float32(w))
