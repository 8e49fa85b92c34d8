"""Greedy decoding with a Llama/Qwen-style transformer whose projections are quantized GEMVs.

The model is a decoder-only transformer with random (seeded) weights: token embedding; per layer
RMSNorm -> grouped-query attention with rotary embeddings and a KV cache -> residual, RMSNorm ->
SwiGLU MLP -> residual; final RMSNorm and lm_head. Every projection goes through `linear`, which
runs `jaxgemv.fp4_matmul` for an NVFP4Weight, `jaxgemv.fp8_matmul` for an FP8Weight (E4M3, one
float32 scale per row and 128 values), `jaxgemv.int4_matmul` for a 4-bit NBitsWeight (blocks of
32, bf16 scales) and XLA's dot for a bf16 array, so one jitted decode step serves every format and
the timings compare like with like. q/k/v and gate/up are fused, as in
serving engines, leaving four GEMVs per layer plus lm_head. As serving engines also do, each
RMSNorm's gain is folded into the next projection's weight, and the products take the rest of the
block with them: qkv, gate_up and lm_head take the norm itself (`rms_eps`: XLA sums the squares
of each row, or at batch 1 qkv's and gate_up's kernels do, and the GEMV's store multiplies by
rsqrt(mean + eps)), gate_up's store applies SwiGLU (`activation="swiglu"`: gate and up rows
interleaved by 8) so down reads the activation directly, and the residual add happens in o's and
down's store (`residual`; around XLA's dot for bf16), so a norm costs at most one small reduction
kernel, not three kernels and an add.

    python examples/decode.py                                  # tiny model, runs on CPU in seconds
    python examples/decode.py --check                          # nvfp4 vs float32 on the same weights
    python examples/decode.py --formats fp8,nvfp4,bf16         # every format, timed
    python examples/decode.py --config 8b --batch 1,4,8        # Qwen3-8B shapes, on a GPU
    python examples/decode.py --dtype f16 --dense-dtype bf16   # fp16 activations against a bf16 model
    python examples/decode.py --attention xla                  # attention by XLA's kernels (default: jaxgemv's)
    python examples/decode.py --no-fuse                        # a layer's kernels as five calls, not one
"""

import argparse
import dataclasses
import functools
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemv


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    eps: float = 1e-6
    # "xla": the rotary embedding, the cache updates and the attention in jnp (XLA's kernels);
    # "jaxgemv": jaxgemv.decode_attention, one kernel per layer for all of them (16-bit models;
    # the float32 reference of --check keeps XLA's, and so does the dense model: format_config).
    attention: str = "xla"
    # With jaxgemv's attention: each layer through jaxgemv.decoder_layer, which launches a layer's
    # five kernels as one custom call where it can (NVFP4 on a GPU at batch 1); False: five calls.
    fuse: bool = True
    # Decode steps per iteration of decode_loop's lax.scan (its `unroll`): each iteration ends in
    # the loop's own condition and bookkeeping, which unrolling shares among `unroll` steps.
    unroll: int = 1


CONFIGS = {
    "tiny": Config(2, 256, 4, 2, 64, 512, 1024, 10_000.0),
    # Qwen3-8B's shapes (Llama-3-8B differs only in intermediate 14336 and vocab 128256). Qwen3's
    # per-head q/k RMSNorm is left out: it involves no projection, so it barely moves the timings.
    "8b": Config(36, 4096, 32, 8, 128, 12288, 151936, 1_000_000.0),
}

PROJECTIONS = ("qkv", "o", "gate_up", "down", "lm_head")


QUANTIZED = (jaxgemv.NVFP4Weight, jaxgemv.FP8Weight, jaxgemv.NBitsWeight)


def is_quantized(w):
    return isinstance(w, QUANTIZED)


def linear(x, w, rms_eps=None, residual=None, activation=None):
    """(x @ w.T) * rms_scale(x) (then SwiGLU) + residual with float32 accumulation, in x's dtype,
    for any weight format (the norm's scale with rms_eps, SwiGLU with activation="swiglu", the
    residual with residual): jaxgemv applies them in its GEMV's store, XLA in the fusion around
    its dot."""
    epilogue = dict(rms_eps=rms_eps, residual=residual, activation=activation)
    if is_quantized(w):
        return jaxgemv.matmul(x, w, **epilogue)  # the format's own product
    y = lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    if rms_eps is not None:
        y = y * rms_scale(x, rms_eps)[..., None]
    if activation is not None:
        y = swiglu(y)
    if residual is not None:
        y = y + residual.astype(jnp.float32)
    return y.astype(x.dtype)


def swiglu(p):
    """silu(gate) * up of [..., 2F] pre-activations whose gate and up rows come interleaved in
    groups of 8 (jaxgemv.interleave_gate_up: how gate_up is stored here), [..., F]."""
    q = p.reshape(*p.shape[:-1], -1, 2, 8)
    return (jax.nn.silu(q[..., 0, :]) * q[..., 1, :]).reshape(*p.shape[:-1], -1)


def rms_scale(x, eps):
    """RMSNorm's row scale rsqrt(mean(x^2) + eps), float32 [...]. The norm's gain is folded into
    the next projection's columns (init_layer), so RMSNorm(x) @ W^T = (x @ (W g)^T) * rms_scale(x):
    the projection reads the residual stream as it is and scales its rows in its epilogue."""
    x32 = x.astype(jnp.float32)
    return lax.rsqrt(jnp.mean(x32 * x32, axis=-1) + eps)


def rope(x, pos, theta):
    """Rotary embedding in the rotate-half layout of Llama/Qwen checkpoints; x is [B, heads, hd]."""
    half = x.shape[-1] // 2
    angles = pos.astype(jnp.float32) * theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attention(q, k_cache, v_cache, pos):
    """One query per sequence against cache positions 0..pos; q [B, H, hd], caches [B, KVH, T, hd].

    The caches keep each KV head's positions together, the layout both products read: with
    positions outermost ([B, T, KVH, hd]) the step XLA compiled for the CPU copied both caches of
    every layer into that order before its dots, on every step.
    """
    b, kv_heads, t, hd = k_cache.shape
    q = q.reshape(b, kv_heads, -1, hd)  # the query heads that share one KV head sit together
    s = jnp.einsum("bkgd,bktd->bkgt", q, k_cache, preferred_element_type=jnp.float32) / np.sqrt(hd)
    s = jnp.where(jnp.arange(t) <= pos, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    o = jnp.einsum("bkgt,bktd->bkgd", p, v_cache, preferred_element_type=jnp.float32)
    return o.reshape(b, -1).astype(q.dtype)


def _step(cfg, params, cache, tokens, pos):
    """Feeds tokens [B] at position pos; returns (logits [B, V], greedy next tokens, cache).

    Activations take the embedding's dtype, so the float32 reference model runs through here too.
    Layers are unrolled rather than scanned: slicing a stacked weight inside a loop would make XLA
    copy it before each GEMV, adding memory traffic the benchmark is meant to measure without.
    """
    x = params["embed"][tokens]
    b, d = x.shape[0], cfg.head_dim
    nq, nkv = cfg.heads * d, cfg.kv_heads * d
    k_all, v_all = list(cache["k"]), list(cache["v"])
    for i, p in enumerate(params["layers"]):
        if cfg.attention == "jaxgemv" and x.dtype != jnp.float32 and is_quantized(p["qkv"]):
            x, k_all[i], v_all[i] = jaxgemv.decoder_layer(x, p["qkv"], p["o"], p["gate_up"], p["down"], k_all[i],
                                                          v_all[i], pos, heads=cfg.heads, kv_heads=cfg.kv_heads,
                                                          eps=cfg.eps, rope_theta=cfg.rope_theta, fuse=cfg.fuse)
            continue
        qkv = linear(x, p["qkv"], rms_eps=cfg.eps)
        if cfg.attention == "jaxgemv" and qkv.dtype != jnp.float32:
            att, k_all[i], v_all[i] = jaxgemv.decode_attention(qkv, k_all[i], v_all[i], pos, heads=cfg.heads,
                                                               kv_heads=cfg.kv_heads, rope_theta=cfg.rope_theta)
        else:
            q = rope(qkv[:, :nq].reshape(b, cfg.heads, d), pos, cfg.rope_theta)
            k = rope(qkv[:, nq : nq + nkv].reshape(b, cfg.kv_heads, d), pos, cfg.rope_theta)
            v = qkv[:, nq + nkv :].reshape(b, cfg.kv_heads, d)
            k_all[i] = lax.dynamic_update_slice(k_all[i], k[:, :, None].astype(k_all[i].dtype), (0, 0, pos, 0))
            v_all[i] = lax.dynamic_update_slice(v_all[i], v[:, :, None].astype(v_all[i].dtype), (0, 0, pos, 0))
            att = attention(q, k_all[i], v_all[i], pos)
        x = linear(att, p["o"], residual=x)
        x = linear(linear(x, p["gate_up"], rms_eps=cfg.eps, activation="swiglu"), p["down"], residual=x)
    logits = linear(x, params["lm_head"], rms_eps=cfg.eps)
    return logits, jnp.argmax(logits, axis=-1).astype(jnp.int32), {"k": tuple(k_all), "v": tuple(v_all)}


decode_step = jax.jit(_step, static_argnums=0, donate_argnums=2)


@functools.partial(jax.jit, static_argnums=(0, 5), donate_argnums=2)
def decode_loop(cfg, params, cache, tokens, pos, steps):
    """`steps` greedy decode steps from position pos in one executable (lax.scan); returns the
    tokens [steps, B] and the cache. A model's step as its own call pays JAX's host dispatch for
    every weight array (~500 for an 8B NVFP4 model) each time, which takes longer than the
    quantized step's device work; the loop pays it once.
    """

    def body(carry, _):
        tokens, cache, pos = carry
        _, tokens, cache = _step(cfg, params, cache, tokens, pos)
        return (tokens, cache, pos + 1), tokens

    (_, cache, _), out = lax.scan(body, (tokens, cache, pos), None, length=steps, unroll=cfg.unroll)
    return out, cache


def init_cache(cfg, batch, max_len, dtype):
    """Per layer, keys and values [B, KV heads, T, hd] as arrays of their own, updated in place:
    with one stacked cache each layer's attention reads a slice of it, which XLA may copy into a
    buffer of its own first (as it would a stacked weight's; see _step)."""
    shape = (batch, cfg.kv_heads, max_len, cfg.head_dim)
    return {"k": tuple(jnp.zeros(shape, dtype) for _ in range(cfg.layers)),
            "v": tuple(jnp.zeros(shape, dtype) for _ in range(cfg.layers))}


def _dense(key, n, k, gain=None):
    # 1/sqrt(fan_in) keeps each projection's output at the scale of its input, so activations
    # and logits stay O(1) at any depth instead of vanishing or blowing up. `gain`: the RMSNorm
    # gain [K] in front of this projection, folded into its columns (see rms_scale).
    w = jax.random.normal(key, (n, k), jnp.float32) * k**-0.5
    return (w if gain is None else w * gain).astype(jnp.bfloat16)


def _gain(n):
    """An RMSNorm gain at initialization: ones, as Llama/Qwen initialize it; a checkpoint's trained
    gains fold into the weight the same way. (A random spread here put the tiny model's check on
    a near-tie of two logits, which the float32 reference itself broke either way.)"""
    return jnp.ones((n,), jnp.float32)


@functools.partial(jax.jit, static_argnums=0)
def init_layer(cfg, key):
    kq, ko, kg, kd = jax.random.split(key, 4)
    return {
        "qkv": _dense(kq, (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, cfg.hidden, _gain(cfg.hidden)),
        "o": _dense(ko, cfg.hidden, cfg.heads * cfg.head_dim),
        # gate and up rows interleaved by 8 (from a checkpoint: jaxgemv.interleave_gate_up(w_gate, w_up)).
        "gate_up": _dense(kg, 2 * cfg.intermediate, cfg.hidden, _gain(cfg.hidden)),
        "down": _dense(kd, cfg.hidden, cfg.intermediate),
    }


@functools.partial(jax.jit, static_argnums=0)
def init_head(cfg, key):
    ke, kh = jax.random.split(key)
    return {
        "embed": jax.random.normal(ke, (cfg.vocab, cfg.hidden), jnp.float32).astype(jnp.bfloat16),
        "lm_head": _dense(kh, cfg.vocab, cfg.hidden, _gain(cfg.hidden)),
    }


QUANTIZERS = {
    "nvfp4": jax.jit(jaxgemv.quantize_nvfp4),
    "fp8": jax.jit(functools.partial(jaxgemv.quantize_fp8, block=(1, 128))),
    # int4 scales are in the activations' dtype: bf16 here (with --dtype f16 use nvfp4 or fp8).
    "int4": jax.jit(functools.partial(jaxgemv.quantize_int4, block_size=32)),
}
FORMATS = ("nvfp4", "fp8", "int4", "bf16")


def _quantized(tree, fmt):
    """The same dict with its projections in `fmt` (bf16: as they are); other entries are shared."""
    if fmt not in QUANTIZERS:
        return tree
    return {name: QUANTIZERS[fmt](w) if name in PROJECTIONS else w for name, w in tree.items()}


def format_config(cfg, fmt):
    """The config one format's model runs with. The dense model is the baseline, XLA's bf16 (or
    fp16) step as a JAX user has it today, so its attention stays XLA's whatever --attention says."""
    return cfg if fmt in QUANTIZERS else dataclasses.replace(cfg, attention="xla")


def build_models(cfg, formats, seed=0):
    """Weights per format, built on the default device one layer at a time.

    Only one layer's float32 temporaries exist at once, and a bf16 layer is dropped as soon as it
    is quantized unless bf16 is wanted too, so an 8B model needs ~16 GB (bf16) + ~5 GB (nvfp4)
    + ~8.5 GB (fp8).
    """
    key = jax.random.key(seed)
    head = init_head(cfg, jax.random.fold_in(key, cfg.layers))
    models = {fmt: {**_quantized(head, fmt), "layers": []} for fmt in formats}
    for i in range(cfg.layers):
        layer = init_layer(cfg, jax.random.fold_in(key, i))
        for fmt in formats:
            models[fmt]["layers"].append(_quantized(layer, fmt))
    return models


def dense_copy(params, dtype):
    """The same model with every weight dequantized to `dtype`, so XLA runs it in that precision."""
    return jax.tree.map(lambda w: w.dequantize(dtype) if is_quantized(w) else w.astype(dtype), params,
                        is_leaf=is_quantized)


def with_activations(params, dtype):
    """The same model computing in `dtype`: activations follow the embedding's dtype, and dense
    weights are cast to match (quantized weights serve any activation dtype as they are)."""
    cast = lambda w: w if is_quantized(w) or w.dtype == jnp.float32 else w.astype(dtype)  # noqa: E731
    return jax.tree.map(cast, params, is_leaf=is_quantized)


def in_dtypes(models, dtype, dense_dtype=None):
    """Each format's model computing in its dtype ("bf16" or "f16"): the quantized formats in
    `dtype`, the dense model in `dense_dtype` (default `dtype`)."""
    dense_dtype = dense_dtype or dtype
    want = {fmt: dtype if fmt in QUANTIZERS else dense_dtype for fmt in models}
    return {fmt: with_activations(m, jnp.float16) if want[fmt] == "f16" else m for fmt, m in models.items()}


def nbytes(params):
    return sum(leaf.nbytes for leaf in jax.tree.leaves(params))


class DecodeTimer:
    """Times runs of `steps` greedy steps in one jitted loop (decode_loop), every run over the
    same positions following a prompt prefilled one token at a time; the loop is compiled ahead of
    time and run once on construction, so that what the environment said then (jaxgemv's trace-time
    knobs) is what every run executes. Calling it returns milliseconds per step of one run and
    keeps, in `dispatch_ms`, the host's time from the call to its return (before the device
    finishes); `lowered` is the loop's lowering, for a look at what it calls."""

    def __init__(self, cfg, params, batch, prompt_len, steps, seed=0):
        self.cfg, self.params, self.steps = cfg, params, steps
        prompt = jax.random.randint(jax.random.key(seed + 1), (batch, prompt_len), 0, cfg.vocab, jnp.int32)
        self.cache = init_cache(cfg, batch, prompt_len + steps, params["embed"].dtype)
        for pos in range(prompt_len):
            _, self.tokens, self.cache = decode_step(cfg, params, self.cache, prompt[:, pos], jnp.int32(pos))
        self.pos = jnp.int32(prompt_len)
        self.lowered = decode_loop.lower(cfg, params, self.cache, self.tokens, self.pos, steps)
        self._loop = self.lowered.compile()
        self.dispatch_ms = None
        self()

    def __call__(self):
        start = time.perf_counter()
        out, self.cache = self._loop(self.params, self.cache, self.tokens, self.pos)
        self.dispatch_ms = (time.perf_counter() - start) * 1e3
        out.block_until_ready()
        return (time.perf_counter() - start) * 1e3 / self.steps


def time_decode(cfg, params, batch, prompt_len, steps, seed=0, repeats=3):
    """Milliseconds per decode step of `repeats` runs (DecodeTimer)."""
    run = DecodeTimer(cfg, params, batch, prompt_len, steps, seed)
    return [run() for _ in range(repeats)]


def check(cfg, params, batch, prompt_len, steps, seed=0, name="nvfp4"):
    """Compares the quantized model's logits with float32 on its dequantized weights, step by step.

    The quantized model (`name`) decodes greedily and its tokens are fed to every model, so all see the same
    sequence. A bf16 XLA model on the same weights (rounded once to bf16) is measured alongside:
    rounding activations to bf16 alone costs most of a percent of logit error at two layers, and
    more with depth (about 2e-2 at 36 layers of hidden 256, measured on CPU), so its numbers show
    how much of the quantized model's error the kernel could own. With --dtype f16 (3 more mantissa bits) the
    activation rounding stays well inside the 1e-2 budget at 8B depth.
    Returns {name: (max relative logit error, fraction of agreeing greedy tokens)}.
    """
    act = params["embed"].dtype
    models = {name: params, "dense xla": dense_copy(params, act)}
    models["f32"] = dense_copy(params, jnp.float32)
    prompt = jax.random.randint(jax.random.key(seed + 1), (batch, prompt_len), 0, cfg.vocab, jnp.int32)
    caches = {name: init_cache(cfg, batch, prompt_len + steps, m["embed"].dtype) for name, m in models.items()}
    errors = {n: [] for n in (name, "dense xla")}
    agree = {n: [] for n in errors}
    # On GPUs a float32 dot may default to TF32, which would make the reference the noisier model.
    greedy = None  # the quantized model's tokens, fed to every model once the prompt is used up
    with jax.default_matmul_precision("highest"):
        for pos in range(prompt_len + steps):
            fed = prompt[:, pos] if pos < prompt_len else greedy
            logits = {}
            for n, model in models.items():
                out, _, caches[n] = decode_step(cfg, model, caches[n], fed, jnp.int32(pos))
                logits[n] = np.asarray(out, np.float64)
            greedy = logits[name].argmax(-1)
            if pos >= prompt_len:
                ref = logits["f32"]
                for n in errors:
                    diff = np.linalg.norm(logits[n] - ref, axis=-1) / np.linalg.norm(ref, axis=-1)
                    errors[n].extend(diff)
                    agree[n].extend(logits[n].argmax(-1) == ref.argmax(-1))
    return {n: (max(errors[n]), float(np.mean(agree[n]))) for n in errors}


def _int_list(text):
    values = [int(v) for v in text.split(",") if v]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def _formats(text):
    values = [v for v in text.split(",") if v]
    if not values or set(values) - set(FORMATS):
        raise argparse.ArgumentTypeError(f"expected formats from {','.join(FORMATS)}, got {text!r}")
    return values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    parser.add_argument("--formats", type=_formats, default=["nvfp4", "bf16"], help="e.g. nvfp4,fp8,bf16")
    parser.add_argument("--batch", type=_int_list, default=[1], help="batch sizes, e.g. 1,4,8")
    parser.add_argument("--steps", type=int, default=32, help="decode steps to time (to check: at most 32)")
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--check", action="store_true",
                        help="the first quantized format of --formats vs float32 on its weights; exit 1 on failure")
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16",
                        help="activation dtype (the dense model's weights follow it); see check()")
    parser.add_argument("--dense-dtype", choices=("bf16", "f16"), default=None,
                        help="the dense model's dtype, weights and activations (default: --dtype's); "
                             "--dtype f16 --dense-dtype bf16 times the quantized models against a bf16 model")
    parser.add_argument("--attention", choices=("xla", "jaxgemv"), default="jaxgemv",
                        help="attention of every format's model: XLA's kernels, or jaxgemv.decode_attention")
    parser.add_argument("--no-fuse", action="store_true",
                        help="with jaxgemv's attention, a layer's kernels as five calls instead of "
                             "jaxgemv.decoder_layer's one where it can (NVFP4 on a GPU at batch 1)")
    parser.add_argument("--unroll", type=int, default=1, help="decode steps per iteration of the jitted loop")
    parser.add_argument("--repeats", type=int, default=5,
                        help="timed runs of the loop per format and batch, the formats alternating")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.prompt_len < 1 or args.unroll < 1 or args.repeats < 1:
        parser.error("--steps, --prompt-len, --unroll and --repeats must be at least 1")
    cfg = dataclasses.replace(CONFIGS[args.config], attention=args.attention, fuse=not args.no_fuse,
                              unroll=args.unroll)
    checked = next((f for f in args.formats if f in QUANTIZERS), None)
    if args.check and checked is None:
        parser.error("--check needs a quantized format in --formats")
    formats = [checked] if args.check else args.formats
    if "int4" in formats and args.dtype != "bf16":
        parser.error("int4 weights carry bf16 scales here and run with bf16 activations; drop --dtype f16")
    dense_dtype = args.dense_dtype or args.dtype
    models = in_dtypes(build_models(cfg, formats), args.dtype, dense_dtype)
    sizes = ", ".join(f"{fmt} {nbytes(models[fmt]) / 2**20:.1f} MiB" for fmt in formats)
    platform = jax.devices()[0].platform
    print(f"{args.config}: {cfg.layers} layers, hidden {cfg.hidden}, vocab {cfg.vocab} on {platform}; {sizes}; "
          f"{cfg.attention} attention" + (" (the dense model: XLA's)" if cfg.attention != "xla" else ""))

    if args.check:
        batch, steps = max(args.batch), min(args.steps, 32)
        results = check(cfg, models[checked], batch, args.prompt_len, steps, name=checked)
        print(f"vs float32 on the dequantized weights, {steps} steps, batch {batch}:")
        for name, (err, agreement) in results.items():
            print(f"{name:>8}: max relative logit error {err:.2e}, greedy agreement {agreement:.1%}")
        err, agreement = results[checked]
        ok = err <= 1e-2 and agreement >= 0.95
        print(f"{checked} needs error <= 1e-2 and agreement >= 95%: {'PASS' if ok else 'FAIL'}")
        return 0 if ok else 1

    # "bf16" names the dense 16-bit model; with --dtype f16 (or --dense-dtype f16) its weights are float16.
    label = {"nvfp4": "nvfp4", "fp8": "fp8", "int4": "int4", "bf16": f"dense {dense_dtype}"}
    # Per batch, the formats' runs alternate (round r times every format once), so that a drift of
    # the machine over the minutes a batch takes lands on every format alike; each format's figure
    # is the median of its runs.
    results = {}
    for batch in args.batch:
        timers = {fmt: DecodeTimer(format_config(cfg, fmt), models[fmt], batch, args.prompt_len, args.steps)
                  for fmt in formats}
        runs = {fmt: [] for fmt in formats}
        for _ in range(args.repeats):
            for fmt in formats:
                runs[fmt].append(timers[fmt]())
        del timers
        for fmt in formats:
            ms = results[fmt, batch] = statistics.median(runs[fmt])
            print(f"{label[fmt]:>10} batch {batch:>2}: {ms:8.3f} ms/step {batch * 1e3 / ms:9.1f} tokens/s"
                  f"   ({len(runs[fmt])} runs {min(runs[fmt]):.3f}-{max(runs[fmt]):.3f})")
    print(f"\n{'format':>10} {'batch':>5} {'ms/step':>9} {'vs dense':>8}")
    for (fmt, batch), ms in results.items():
        base = results.get(("bf16", batch))
        print(f"{label[fmt]:>10} {batch:>5} {ms:9.3f} {f'{base / ms:.2f}x' if base else '-':>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
