"""jaxgemv.decoder_layer: against a float64 reference of the layer on the dequantized weights, and
bit for bit against the five separate calls it stands for (fuse=False), on CPU (where the fused
primitive lowers to those calls) and on a GPU (where at batch 1 it is one custom call launching the
five kernels with programmatic dependent launch, ffi/layer.cu)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv
from jaxgemv.layer import fused_plans
from conftest import requires_gpu
from test_attention import _round, reference64

HOPPER = jaxgemv.DeviceFacts("cuda", (9, 0), 132)


def _weight(rng, n, k, fmt="nvfp4"):
    # Columns of uneven size, so a product that dropped or reordered K would be seen.
    w = rng.standard_normal((n, k)) / np.sqrt(k) * np.linspace(0.5, 1.5, k)
    w = jnp.asarray(w, jnp.float32)
    if fmt == "fp8":
        return jaxgemv.quantize_fp8(w, block=(1, 128))
    return jaxgemv.quantize_nvfp4(w)


def _layer_case(seed, b, hidden, heads, kv_heads, hd, inter, t, dtype=jnp.float16, fmts=("nvfp4",) * 4):
    rng = np.random.default_rng(seed)
    ws = dict(qkv=_weight(rng, (heads + 2 * kv_heads) * hd, hidden, fmts[0]),
              o=_weight(rng, hidden, heads * hd, fmts[1]),
              gate_up=_weight(rng, 2 * inter, hidden, fmts[2]),
              down=_weight(rng, hidden, inter, fmts[3]))
    x = jnp.asarray(rng.standard_normal((b, hidden)) * np.linspace(0.5, 2.0, hidden), dtype)
    kc = jnp.asarray(rng.standard_normal((b, kv_heads, t, hd)), dtype)
    vc = jnp.asarray(rng.standard_normal((b, kv_heads, t, hd)) + np.linspace(-1, 1, t)[None, None, :, None], dtype)
    return ws, x, kc, vc


def reference_layer64(ws, x, kc, vc, pos, heads, kv_heads, eps, rope_theta, dtype):
    """The layer in float64 on the dequantized weights, each product's output rounded to dtype
    where the kernels store it."""
    w = {name: np.asarray(v.dequantize(jnp.float32), np.float64) for name, v in ws.items()}
    x = np.asarray(x.astype(jnp.float32), np.float64)
    hd = kc.shape[-1]

    def rms(a):
        return 1 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + eps)

    h = _round((x @ w["qkv"].T) * rms(x), dtype)
    o, kc, vc = reference64(jnp.asarray(h, dtype), kc, vc, pos, heads, kv_heads, rope_theta, 1 / np.sqrt(hd), dtype)
    x_mid = _round(_round(o, dtype) @ w["o"].T + x, dtype)
    p = ((x_mid @ w["gate_up"].T) * rms(x_mid)).reshape(x.shape[0], -1, 2, 8)
    g = _round((p[:, :, 0] / (1 + np.exp(-p[:, :, 0])) * p[:, :, 1]).reshape(x.shape[0], -1), dtype)
    return _round(g @ w["down"].T + x_mid, dtype), kc, vc


@functools.partial(jax.jit, static_argnames=("heads", "kv_heads", "fuse"))
def _run(ws, x, kc, vc, pos, *, heads, kv_heads, fuse):
    return jaxgemv.decoder_layer(x, ws["qkv"], ws["o"], ws["gate_up"], ws["down"], kc, vc, pos, heads=heads,
                                 kv_heads=kv_heads, eps=1e-6, rope_theta=1e4, fuse=fuse)


def _check(device, seed, b, hidden, heads, kv_heads, hd, inter, t, pos, fmts=("nvfp4",) * 4):
    ws, x, kc, vc = _layer_case(seed, b, hidden, heads, kv_heads, hd, inter, t, fmts=fmts)
    pos = np.asarray(pos, np.int32)
    want_y, want_k, want_v = reference_layer64(ws, x, kc, vc, pos, heads, kv_heads, 1e-6, 1e4, jnp.float16)
    args = jax.device_put((ws, x, kc, vc, jnp.asarray(pos)), device)
    fused = _run(*args, heads=heads, kv_heads=kv_heads, fuse=True)
    separate = _run(*args, heads=heads, kv_heads=kv_heads, fuse=False)
    for a, s in zip(fused, separate):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(s))
    y, k, v = (np.asarray(a.astype(jnp.float32), np.float64) for a in fused)
    # The caches: untouched rows exact; the new rows are the qkv product's (float32 sums rounded
    # to float16: within one rounding of the float64 reference's), k's rotated too.
    written = np.zeros(k.shape, bool)
    for i, p in enumerate(pos):
        written[i, :, p] = True
    np.testing.assert_array_equal(k[~written], want_k[~written])
    np.testing.assert_array_equal(v[~written], want_v[~written])
    np.testing.assert_allclose(k[written], want_k[written], rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(v[written], want_v[written], rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(y, want_y, rtol=2e-2, atol=2e-2 * np.abs(want_y).max())
    # y - x is what the layer adds: a layer that returned x (or zeros) fails here.
    x64 = np.asarray(x.astype(jnp.float32), np.float64)
    added, want_added = y - x64, want_y - x64
    assert np.abs(want_added).max() > 0.1
    np.testing.assert_allclose(added, want_added, atol=3e-2 * np.abs(want_added).max())
    return args


# (b, hidden, heads, kv_heads, head_dim, intermediate, cache length, positions)
CASES = [
    (1, 256, 4, 2, 64, 512, 24, [23]),
    (3, 256, 4, 1, 64, 256, 17, [0, 9, 16]),
]


@pytest.mark.parametrize("case", CASES)
def test_layer_cpu(case):
    _check(jax.devices("cpu")[0], 1, *case)


def test_layer_mixed_formats_cpu():
    _check(jax.devices("cpu")[0], 2, 1, 256, 4, 2, 64, 512, 24, [5], fmts=("nvfp4", "fp8", "nvfp4", "fp8"))


@requires_gpu
@pytest.mark.parametrize("case", [
    (1, 1024, 8, 2, 128, 2048, 500, [417]),  # batch 1: the fused call, the cluster attention
    (1, 512, 4, 2, 128, 1024, 64, [40]),     # batch 1: the fused call, one block per head
    (2, 512, 4, 2, 128, 1024, 64, [40, 3]),  # batch 2: five calls (XLA sums the squares)
    (1, 512, 4, 2, 128, 1024, 600, [599]),   # a cache past AUTO_KERNEL_MAX_LEN: five calls
])
def test_layer_gpu(case):
    b, hidden, heads, kv_heads, hd, inter, t, _ = case
    args = _check(jax.devices("gpu")[0], 3, *case)
    hlo = _run.lower(*args, heads=heads, kv_heads=kv_heads, fuse=True).compile().as_text()
    assert ("jaxgemv_fp4_layer" in hlo) == (b == 1 and t <= 512)


@requires_gpu
@pytest.mark.parametrize("trigger", ["0", "31", "23"], ids=["trigger_late", "trigger_early", "trigger_default"])
@pytest.mark.parametrize("t", [64, 500], ids=["short", "cluster"])
def test_layer_gpu_chain(t, trigger, monkeypatch):
    """Several layers over several steps in one executable: each kernel reads what the one before
    wrote (the previous layer's y, the previous step's caches), so a kernel that read its input
    before the kernel before it had finished would change the result; fused and separate must
    agree bit for bit. With 64 positions the attention takes its kernel without a cluster, whose
    first trip of cache rows (the rows earlier steps wrote) the fused call reads before it waits
    for qkv; with 500, the cluster kernel. JAXGEMV_TRIGGER=31 lets each kernel of the fused call
    launch the next at its start (23, the default: all but gate_up), so that the next one's blocks
    sit resident (their first weight windows read) for all of this one's run: the same bits."""
    monkeypatch.setenv("JAXGEMV_TRIGGER", trigger)
    jax.clear_caches()  # the knob is read at trace time
    hidden, heads, kv_heads, hd, inter = 1024, 8, 2, 128, 2048
    layers = [_layer_case(10 + i, 1, hidden, heads, kv_heads, hd, inter, t) for i in range(3)]
    x0 = layers[0][1]
    ws = [c[0] for c in layers]
    caches = [(c[2], c[3]) for c in layers]

    @functools.partial(jax.jit, static_argnames="fuse")
    def run(ws, x, caches, fuse):
        outs = []
        for s in range(4):
            new = []
            for w, (kc, vc) in zip(ws, caches):
                x, kc, vc = jaxgemv.decoder_layer(x, w["qkv"], w["o"], w["gate_up"], w["down"], kc, vc,
                                                  jnp.int32(t - 8 + s), heads=heads, kv_heads=kv_heads, eps=1e-6,
                                                  rope_theta=1e6, fuse=fuse)
                new.append((kc, vc))
            caches = new
            outs.append(x)
        return outs, caches

    assert "jaxgemv_fp4_layer" in run.lower(ws, x0, caches, True).compile().as_text()
    fused = run(ws, x0, caches, True)
    separate = run(ws, x0, caches, False)
    for a, s in zip(jax.tree.leaves(fused), jax.tree.leaves(separate)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(s))
    assert np.abs(np.asarray(fused[0][-1], np.float32) - np.asarray(x0, np.float32)).max() > 0.1


def test_fused_plans():
    # Qwen3-8B's layer at batch 1 on an H200: the fused call, with the planner's own plans.
    chosen = fused_plans(1, 4096, 6144, 4096, 12288, 128, 4, 64, HOPPER)
    assert chosen is not None
    plans, splits = chosen
    assert plans[0] == jaxgemv.plan_fp4(1, 6144, 4096, HOPPER) and plans[3] == jaxgemv.plan_fp4(1, 4096, 12288, HOPPER)
    assert splits == 1
    # Batch 4: XLA sums the squares for the norms, so five calls; so too off CUDA, and where the
    # attention takes XLA's path (a long cache).
    assert fused_plans(4, 4096, 6144, 4096, 12288, 128, 4, 64, HOPPER) is None
    assert fused_plans(1, 4096, 6144, 4096, 12288, 128, 4, 64, jaxgemv.DeviceFacts("cpu")) is None
    assert fused_plans(1, 4096, 6144, 4096, 12288, 128, 4, 100_000, HOPPER) is None


def test_fused_plans_follow_variant(monkeypatch):
    monkeypatch.setenv("JAXGEMV_VARIANT", "scalar")
    assert fused_plans(1, 4096, 6144, 4096, 12288, 128, 4, 64, HOPPER) is None


@pytest.mark.parametrize("bad, match", [
    (dict(qkv=jnp.zeros((512, 256), jnp.float16)), "qkv must be a jaxgemv weight"),
    (dict(o="wrong shape"), "o must be"),
    (dict(x=jnp.zeros((1, 256), jnp.float32)), "x must be float16 or bfloat16"),
    (dict(eps=-1.0), "rms_eps must be finite"),
    (dict(heads=3), "heads"),
    (dict(pos=jnp.zeros((2,), jnp.int32)), "pos must be"),
])
def test_layer_errors(bad, match):
    ws, x, kc, vc = _layer_case(4, 1, 256, 4, 2, 64, 512, 24)
    kw = dict(x=x, qkv=ws["qkv"], o=ws["o"], gate_up=ws["gate_up"], down=ws["down"], heads=4, eps=1e-6)
    if bad.get("o") == "wrong shape":
        bad = dict(o=_weight(np.random.default_rng(0), 256, 128))
    kw.update(bad)
    pos = kw.pop("pos", jnp.int32(3))
    with pytest.raises((TypeError, ValueError), match=match):
        jaxgemv.decoder_layer(kw["x"], kw["qkv"], kw["o"], kw["gate_up"], kw["down"], kc, vc, pos, heads=kw["heads"],
                              kv_heads=2, eps=kw["eps"])


def test_layer_python_int_position_and_donation():
    ws, x, kc, vc = _layer_case(5, 1, 256, 4, 2, 64, 512, 24)

    def layer(x, kc, vc, pos, fuse):
        return jaxgemv.decoder_layer(x, ws["qkv"], ws["o"], ws["gate_up"], ws["down"], kc, vc, pos, heads=4,
                                     kv_heads=2, eps=1e-6, fuse=fuse)

    want = jax.jit(functools.partial(layer, fuse=False))(x, kc, vc, jnp.int32(7))
    step = jax.jit(lambda x, kc, vc: layer(x, kc, vc, 7, True), donate_argnums=(1, 2))
    got = step(x, jnp.array(kc), jnp.array(vc))
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fused_lowering_for_cuda(monkeypatch):
    """What the GPU gets at batch 1, lowered here for CUDA with an H200's facts: one custom call
    for the layer (no separate products), its 18 operands, the caches aliased to its results,
    and the plans the separate calls would take."""
    from jaxgemv import layer as layer_mod

    monkeypatch.setattr(layer_mod, "facts_for_lowering", lambda ctx, platform: HOPPER)
    ws, x, kc, vc = _layer_case(6, 1, 512, 4, 2, 128, 1024, 64)
    f = jax.jit(lambda ws, x, kc, vc: jaxgemv.decoder_layer(x, ws["qkv"], ws["o"], ws["gate_up"], ws["down"], kc, vc,
                                                            jnp.int32(9), heads=4, kv_heads=2, eps=1e-6,
                                                            rope_theta=1e4))
    checks = [jax.export.DisabledSafetyCheck.custom_call("jaxgemv_fp4_layer")]
    text = jax.export.export(f, platforms=["cuda"], disabled_checks=checks)(ws, x, kc, vc).mlir_module()
    calls = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    assert len(calls) == 1 and "@jaxgemv_fp4_layer" in calls[0], calls
    (call,) = calls
    assert call.split("(", 1)[1].split(")", 1)[0].count("%") == 18
    assert "output_operand_aliases" in call and "operand_index = 13" in call and "operand_index = 14" in call
    (plans, splits) = fused_plans(1, 512, 1024, 512, 1024, 128, 2, 64, HOPPER)
    flat = ", ".join(str(int(getattr(p, f))) for p in plans for f in layer_mod.PLAN_FIELDS)
    assert f"plans = dense<[{flat}]> : tensor<24xi64>" in call, call
    assert f"splits = {splits} : i64" in call
    assert f"trigger = {layer_mod.TRIGGER} : i64" in call
    # JAXGEMV_TRIGGER overrides where the kernels let the next one launch, read at trace time
    # (so JAX's caches, which key on the function, not the environment, are cleared first).
    for value in ("0", "13", "31"):
        monkeypatch.setenv("JAXGEMV_TRIGGER", value)
        jax.clear_caches()
        text = jax.export.export(f, platforms=["cuda"], disabled_checks=checks)(ws, x, kc, vc).mlir_module()
        assert f"trigger = {value} : i64" in text
    monkeypatch.setenv("JAXGEMV_TRIGGER", "32")
    jax.clear_caches()
    with pytest.raises(ValueError, match=r"JAXGEMV_TRIGGER='32': expected an integer from 0 to 31"):
        jax.export.export(f, platforms=["cuda"], disabled_checks=checks)(ws, x, kc, vc)


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_layer_vmap_folds_into_the_batch(fuse):
    """vmap over x, the caches and pos: each example's layer as if called alone (the mapped axis
    folds into the batch), the same with the fused primitive as with the separate calls; a shared
    (unmapped) cache is updated per example. vmap over a weight is refused by name."""
    ws, x, kc, vc = _layer_case(7, 2, 256, 4, 2, 64, 512, 24)
    xs = jnp.stack([x, x[::-1] * 0.5])  # [2 examples, 2 sequences, hidden]
    kcs, vcs = jnp.stack([kc, kc * 0.25]), jnp.stack([vc, -vc])
    pos = jnp.asarray([[3, 11], [20, 0]], jnp.int32)

    def layer(x, kc, vc, pos):
        return jaxgemv.decoder_layer(x, ws["qkv"], ws["o"], ws["gate_up"], ws["down"], kc, vc, pos, heads=4,
                                     kv_heads=2, eps=1e-6, rope_theta=1e4, fuse=fuse)

    got = jax.jit(jax.vmap(layer))(xs, kcs, vcs, pos)
    for e in range(2):
        want = jax.jit(layer)(xs[e], kcs[e], vcs[e], pos[e])
        for a, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(a[e]), np.asarray(w))
    assert np.abs(np.asarray(got[0][1], np.float32) - np.asarray(got[0][0], np.float32)).max() > 0.1

    shared = jax.jit(jax.vmap(layer, in_axes=(0, None, None, 0)))(xs, kc, vc, pos)
    for e in range(2):
        want = jax.jit(layer)(xs[e], kc, vc, pos[e])
        for a, w in zip(shared, want):
            np.testing.assert_array_equal(np.asarray(a[e]), np.asarray(w))

    def by_weight(w):
        return jaxgemv.decoder_layer(x, w, ws["o"], ws["gate_up"], ws["down"], kc, vc, pos[0], heads=4, kv_heads=2,
                                     eps=1e-6, fuse=fuse)

    stacked = jax.tree.map(lambda a: jnp.stack([a, a]), ws["qkv"])
    with pytest.raises(NotImplementedError, match="vmap over the weight"):
        jax.vmap(by_weight)(stacked)


def _sharded_case(mesh, wspec):
    """Batch 8 over all 8 devices, weights placed with wspec on every array that has rows."""
    ws, x, kc, vc = _layer_case(8, 8, 256, 4, 2, 64, 512, 24)
    pos = jnp.asarray([0, 3, 23, 7, 8, 11, 2, 5], jnp.int32)
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    batch = lambda a: put(a, P(("a", "b"), *([None] * (a.ndim - 1))))  # noqa: E731
    placed_ws = {name: jax.tree.map(lambda a: put(a, wspec if a.ndim == 2 else P()), w) for name, w in ws.items()}
    return (ws, x, kc, vc, pos), (placed_ws, batch(x), batch(kc), batch(vc), batch(pos))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "separate"])
def test_layer_batch_sharded(mesh, fuse):
    """pjit with the batch over the 8 devices and the weights replicated: the same bits as on one
    device, the outputs and caches left sharded along the batch, and no collective in the step
    (each device runs its sequences' layer; nothing is gathered)."""
    whole, placed = _sharded_case(mesh, P())
    want = _run(*jax.device_put(whole, jax.devices("cpu")[0]), heads=4, kv_heads=2, fuse=fuse)
    got = _run(*placed, heads=4, kv_heads=2, fuse=fuse)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert got[0].sharding.spec[0] == ("a", "b") and got[1].sharding.spec[0] == ("a", "b")
    hlo = _run.lower(*placed, heads=4, kv_heads=2, fuse=fuse).compile().as_text()
    for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"):
        assert op not in hlo, op


def test_layer_fused_with_sharded_weights_gathers_them(mesh):
    """Weights sharded on their rows (tensor-parallel placement): the fused layer needs them whole
    and gathers them (fuse=False keeps them sharded); the numbers are the same either way."""
    whole, placed = _sharded_case(mesh, P("b", None))
    want = _run(*jax.device_put(whole, jax.devices("cpu")[0]), heads=4, kv_heads=2, fuse=True)
    with pytest.warns(UserWarning, match=r"decoder_layer\(fuse=True\) takes every weight whole, and qkv.packed, "
                      r"qkv.scales, o.packed, o.scales \.\.\. arrive sharded: .*pass fuse=False"):
        got = _run(*placed, heads=4, kv_heads=2, fuse=True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert "all-gather" in _run.lower(*placed, heads=4, kv_heads=2, fuse=True).compile().as_text()
