"""`decode_attention`: one decode step's attention in one kernel, from the fused qkv projection.

A decode step's attention is small (one query per sequence) but, left to XLA, runs as five or six
kernels per layer: the rotary embedding of q and k, the two cache updates, the scores' dot, the
softmax and the values' dot. On an H200 each costs about 1.2-1.8 us plus a launch gap of about
1 us, more than the bytes they move. `decode_attention` does all of it in one kernel
(ffi/attention.cu): it reads qkv as the projection wrote it, rotates q and k, writes k and v into
the caches in place (the caches are aliased to its results, so under jit with the caches carried
or donated nothing is copied), and attends over positions 0..pos with a softmax in float32
(a chunk of scores at a time, with a running maximum), the positions split across the blocks of
a thread-block cluster for long caches. "auto" takes it for short caches only, where it is
measured faster than XLA's path (AUTO_KERNEL_MAX_LEN).

Grouped-query attention: heads query heads share kv_heads KV heads, query head h reading KV head
h // (heads // kv_heads). The caches are [B, kv_heads, T, head_dim] (each KV head's positions
together). Per-sequence positions (pos [B]) allow sequences of different lengths in one batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.extend.core import Primitive
from jax.interpreters import mlir

from jaxgemv import _product as _product_mod
from jaxgemv import sharding
from jaxgemv.device import DeviceFacts, facts_for_lowering
from jaxgemv.planner import check_launch_knobs, env_int

VARIANTS = ("auto", "kernel", "cpu", "xla")

#: The CUDA kernel's head sizes and largest query-head group; other shapes run the "xla" path.
KERNEL_HEAD_DIMS = (64, 128, 256)
KERNEL_MAX_GROUP = 8
#: Positions per block the planner aims for: a cache of T positions is split over
#: min(MAX_SPLITS, next power of two of T / ROWS_PER_BLOCK) blocks of a cluster (sm_90), shared
#: memory permitting. 8 is the portable cluster size; the kernel takes 16 too (non-portable:
#: 16 SMs of one GPC free at once), which the planner leaves alone until it has been measured.
ROWS_PER_BLOCK = 256
MAX_SPLITS = 8
_SMEM_LIMIT = 200 * 1024


def rope_angles(pos: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin [B, head_dim / 2] of the rotate-half rotary embedding at positions pos [B]."""
    half = head_dim // 2
    inv = jnp.float32(theta) ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = pos.astype(jnp.float32)[:, None] * inv
    return jnp.cos(angles), jnp.sin(angles)


def _rotate(x, cos, sin):
    """x [B, heads, hd] rotated (rotate-half) in float32, rounded to x's dtype."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def decode_attention_reference(qkv, k_cache, v_cache, pos, *, heads: int, kv_heads: int,
                               rope_theta: float | None = None, scale: float | None = None):
    """decode_attention in plain jnp (the "xla" variant): the same contract, XLA's kernels.

    pos must already be int32 [B]. Returns (o [B, heads * head_dim], k_cache, v_cache)."""
    b, kvh, t, hd = k_cache.shape
    scale = float(1.0 / np.sqrt(hd)) if scale is None else float(scale)
    q = qkv[:, : heads * hd].reshape(b, heads, hd)
    k = qkv[:, heads * hd : (heads + kv_heads) * hd].reshape(b, kv_heads, hd)
    v = qkv[:, (heads + kv_heads) * hd :].reshape(b, kv_heads, hd)
    valid = (pos >= 0) & (pos < t)
    if rope_theta is not None:
        cos, sin = rope_angles(pos, hd, rope_theta)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
    # Out-of-range positions write nothing ("drop" of an index past the end).
    where = jnp.where(valid, pos, t)
    rows = jnp.arange(b)
    k_cache = k_cache.at[rows, :, where].set(k.astype(k_cache.dtype), mode="drop")
    v_cache = v_cache.at[rows, :, where].set(v.astype(v_cache.dtype), mode="drop")
    qg = q.reshape(b, kvh, heads // kvh, hd)
    s = jnp.einsum("bkgd,bktd->bkgt", qg, k_cache, preferred_element_type=jnp.float32) * scale
    s = jnp.where(jnp.arange(t)[None, None, None, :] <= pos[:, None, None, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bkgt,bktd->bkgd", p, v_cache.astype(jnp.float32))
    o = jnp.where(valid[:, None, None, None], o, jnp.nan)
    return o.reshape(b, heads * hd).astype(qkv.dtype), k_cache, v_cache


# ----------------------------------------------------------------------------------------------
# Plan


def kernel_supports(head_dim: int, group: int) -> bool:
    """Whether the CUDA kernel serves these heads (the "xla" path serves the rest)."""
    return head_dim in KERNEL_HEAD_DIMS and 1 <= group <= KERNEL_MAX_GROUP


#: The cluster kernel's ring of cache rows in flight (ffi/attention.cu: kRing slots of 16 KB each,
#: kUnroll 16-byte pieces per thread of 256), in floats.
_RING_FLOATS = 4 * 4 * 256 * 4


def attention_smem_bytes(head_dim: int, g: int, splits: int) -> int:
    """Shared memory of one block of the cluster kernel (ffi/attention.cu: AttentionSmemBytes): q,
    the new key and value, a chunk's scores, the running statistics, the 8 warps' 32 / (head_dim /
    8) streams' sums or the ring of cache rows in flight (they share a region: the larger), and
    rank 0's copy of every block's state. Used for clusters only (splits > 1); without one a block
    holds a single query head, no ring, and needs less."""
    streams = 8 * 32 // (head_dim // 8)
    chunk = 8 * 4 * streams
    cluster = splits * (g * (head_dim + 2) + g) if splits > 1 else 0
    sums_or_ring = max(streams * g * head_dim, _RING_FLOATS) if splits > 1 else streams * g * head_dim
    return 4 * (g * head_dim + 2 * head_dim + g * chunk + 4 * g + sums_or_ring + cluster)


def plan_splits(max_len: int, head_dim: int, group: int, facts: DeviceFacts) -> int:
    """Blocks per (sequence, KV head) for a cache of max_len positions: a power of two up to
    MAX_SPLITS, about ROWS_PER_BLOCK positions each; 1 before sm_90 (no clusters).
    JAXGEMV_ATTN_SPLITS (1, 2, 4, 8, 16) forces it (at 16 the largest heads take 212 KB of
    shared memory per block, within the H200's 227)."""
    forced = env_int("JAXGEMV_ATTN_SPLITS", (1, 2, 4, 8, 16))
    check_launch_knobs()
    if facts.compute_capability < (9, 0):
        if forced not in (None, 1):
            raise ValueError(f"JAXGEMV_ATTN_SPLITS={forced}: clusters need compute capability 9.0")
        return 1
    if forced is not None:
        return forced
    g = 1 if group <= 1 else 2 if group <= 2 else 4 if group <= 4 else 8
    splits = 1
    while splits < MAX_SPLITS and splits * ROWS_PER_BLOCK < max_len:
        splits *= 2
    while splits > 1 and attention_smem_bytes(head_dim, g, splits) > _SMEM_LIMIT:
        splits //= 2
    return splits


#: "auto" takes the kernel for caches of at most this many positions, XLA's path beyond. On the
#: H200 (docs/perf-log.md, entry 90; tools/attention_bench.py --trace, Qwen3-8B heads, 36 layers)
#: the kernel's device time per layer against XLA's six or seven kernels' at batch 1 and 8:
#: 4.5 / 5.5 us against 7.7 / 10.3 at 40 positions, 5.5 / 7.2 against 8.4 / 11.4 at 128, 11.6 /
#: 13.5 against 11.7 / 15.4 at 512; at 1024 it loses (12.1 / 32.7 against 11.7 / 20.5), and at
#: 4096 (19.4 against 16.1): each block keeps one trip of rows in flight, too few bytes for the
#: memory's rate once the rows are many.
AUTO_KERNEL_MAX_LEN = 512


def _choose(variant: str, platform: str, head_dim: int, group: int, max_len: int) -> str:
    if variant == "auto":
        if platform == "cpu":
            return "cpu"
        return "kernel" if kernel_supports(head_dim, group) and max_len <= AUTO_KERNEL_MAX_LEN else "xla"
    if variant == "kernel" and platform != "cuda":
        raise ValueError("decode_attention: variant='kernel' runs on CUDA devices only")
    if variant == "cpu" and platform != "cpu":
        raise ValueError("decode_attention: variant='cpu' runs on the CPU platform only")
    if variant == "kernel" and not kernel_supports(head_dim, group):
        raise ValueError(f"decode_attention: variant='kernel' needs head_dim in {KERNEL_HEAD_DIMS} and at most "
                         f"{KERNEL_MAX_GROUP} query heads per KV head, got head_dim {head_dim}, group {group}")
    return variant


# ----------------------------------------------------------------------------------------------
# Primitive: qkv [B, (H + 2 KVH) hd], k_cache, v_cache [B, KVH, T, hd], pos int32 [B].

_attention_p = Primitive("jaxgemv_decode_attention")
_attention_p.multiple_results = True


def _abstract(qkv, k_cache, v_cache, pos, *, heads, kv_heads, rope_theta, scale, variant):
    del pos, kv_heads, rope_theta, scale, variant
    hd = k_cache.shape[-1]
    o = jax.core.ShapedArray((qkv.shape[0], heads * hd), qkv.dtype)
    return [o, jax.core.ShapedArray(k_cache.shape, k_cache.dtype), jax.core.ShapedArray(v_cache.shape, v_cache.dtype)]


_attention_p.def_abstract_eval(_abstract)
_attention_p.def_impl(_product_mod.eager_impl(_attention_p))


def _lowering(platform):
    def rule(ctx, qkv, k_cache, v_cache, pos, *, heads, kv_heads, rope_theta, scale, variant):
        _, _, t, hd = ctx.avals_in[1].shape
        chosen = _choose(variant, platform, hd, heads // kv_heads, t)
        if chosen == "xla":
            fun = functools.partial(decode_attention_reference, heads=heads, kv_heads=kv_heads,
                                    rope_theta=rope_theta, scale=scale)
            return mlir.lower_fun(lambda *a: list(fun(*a)), multiple_results=True)(ctx, qkv, k_cache, v_cache, pos)
        splits = 1 if chosen == "cpu" else plan_splits(t, hd, heads // kv_heads, facts_for_lowering(ctx, platform))

        def call(qkv, k_cache, v_cache, pos):
            outs = (jax.ShapeDtypeStruct((qkv.shape[0], heads * hd), qkv.dtype),
                    jax.ShapeDtypeStruct(k_cache.shape, k_cache.dtype),
                    jax.ShapeDtypeStruct(v_cache.shape, v_cache.dtype))
            return list(jax.ffi.ffi_call("jaxgemv_decode_attention", outs, input_output_aliases={1: 1, 2: 2})(
                qkv, k_cache, v_cache, pos, heads=np.int64(heads), kv_heads=np.int64(kv_heads),
                rope_theta=np.float32(rope_theta if rope_theta is not None else 0.0), scale=np.float32(scale),
                splits=np.int64(splits)))

        return mlir.lower_fun(call, multiple_results=True)(ctx, qkv, k_cache, v_cache, pos)

    return rule


for _platform in ("cpu", "cuda"):
    mlir.register_lowering(_attention_p, _lowering(_platform), platform=_platform)


# ----------------------------------------------------------------------------------------------
# Public API


def _check(qkv, k_cache, v_cache, pos, heads, kv_heads, rope_theta, scale, variant, qkv_groups=1):
    name = "decode_attention"
    for arg, value in (("qkv", qkv), ("k_cache", k_cache), ("v_cache", v_cache), ("pos", pos)):
        if not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"{name}: {arg} must be an array, got {type(value).__name__}")
    if not isinstance(heads, (int, np.integer)) or not isinstance(kv_heads, (int, np.integer)):
        raise TypeError(f"{name}: heads and kv_heads must be Python ints")
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{name}: heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    if jnp.dtype(qkv.dtype) not in _product_mod.ACT_DTYPES:
        raise TypeError(f"{name}: qkv must be float16 or bfloat16, got {qkv.dtype}")
    if qkv.ndim != 2:
        raise ValueError(f"{name}: qkv must be 2-D [B, (heads + 2 kv_heads) head_dim], got shape {tuple(qkv.shape)}")
    if k_cache.ndim != 4:
        raise ValueError(f"{name}: k_cache must be 4-D [B, kv_heads, T, head_dim], got shape {tuple(k_cache.shape)}")
    b, kvh, t, hd = k_cache.shape
    if kvh != kv_heads or b != qkv.shape[0]:
        raise ValueError(f"{name}: k_cache must be [B={qkv.shape[0]}, kv_heads={kv_heads}, T, head_dim], "
                         f"got shape {tuple(k_cache.shape)}")
    if t < 1 or hd < 2 or hd % 2:
        raise ValueError(f"{name}: the caches need T >= 1 and an even head_dim, got shape {tuple(k_cache.shape)}")
    if qkv.shape[1] != (heads + 2 * kv_heads) * hd:
        raise ValueError(f"{name}: qkv must be [B, (heads + 2 kv_heads) x head_dim] = [{b}, "
                         f"{(heads + 2 * kv_heads) * hd}] for head_dim {hd}, got shape {tuple(qkv.shape)}")
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"{name}: v_cache must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    if k_cache.dtype != qkv.dtype or v_cache.dtype != qkv.dtype:
        raise TypeError(f"{name}: the caches must have qkv's dtype {qkv.dtype}, got {k_cache.dtype} and {v_cache.dtype}")
    if not jnp.issubdtype(pos.dtype, jnp.integer):
        raise TypeError(f"{name}: pos must be an integer scalar or [B] array, got {pos.dtype}")
    if pos.ndim > 1 or (pos.ndim == 1 and pos.shape[0] != b):
        raise ValueError(f"{name}: pos must be a scalar or [B={b}], got shape {tuple(pos.shape)}")
    if rope_theta is not None and not (float(rope_theta) > 0):
        raise ValueError(f"{name}: rope_theta must be a positive number or None, got {rope_theta}")
    if scale is not None and not np.isfinite(float(scale)):
        raise ValueError(f"{name}: scale must be a finite number or None, got {scale}")
    if variant not in VARIANTS:
        raise ValueError(f"{name}: variant must be one of {VARIANTS}, got {variant!r}")
    if not isinstance(qkv_groups, (int, np.integer)) or qkv_groups < 1:
        raise ValueError(f"{name}: qkv_groups must be a positive int, got {qkv_groups!r}")
    if kv_heads % qkv_groups:
        raise ValueError(f"{name}: qkv_groups ({qkv_groups}) must divide kv_heads ({kv_heads})")


def decode_attention(qkv: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos, *, heads: int, kv_heads: int,
                     rope_theta: float | None = None, scale: float | None = None, variant: str = "auto",
                     qkv_groups: int = 1) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step's attention: rotary embedding, cache update and grouped-query attention.

    Args:
      qkv: float16 or bfloat16 [B, (heads + 2 kv_heads) head_dim], a fused projection's output:
        the query heads, then the key heads, then the value heads.
      k_cache, v_cache: [B, kv_heads, T, head_dim] in qkv's dtype. Pass them back in the next
        step as returned: under jit they are updated in place (donate them, or carry them in a
        loop, so that XLA need not keep the old ones).
      pos: an int, an int32 scalar or [B], each sequence's position: its key and value are written at pos,
        and it attends to positions 0..pos. A position outside [0, T) is a run-time value, so
        it cannot be refused at trace time: that sequence's output is NaN and its caches are left
        as they were.
      heads, kv_heads: the query and KV head counts (static); heads a multiple of kv_heads.
      rope_theta: the rotary embedding's base (static; rotate-half layout, applied to q and k in
        float32 and rounded to qkv's dtype), or None for no rotation.
      scale: the scores' scale (static), 1 / sqrt(head_dim) when None.
      variant: "auto" (CUDA: the kernel for head_dim 64, 128 or 256 with at most 8 query heads per
        KV head and caches of at most AUTO_KERNEL_MAX_LEN positions, where it is measured faster,
        XLA's path otherwise; CPU: the C++ handler), "kernel" (CUDA), "cpu" (CPU) or "xla" (any
        platform: decode_attention_reference).
      qkv_groups: qkv's columns as this many consecutive groups, group j holding query heads j x
        heads / qkv_groups onwards, then its key heads, then its value heads (static; 1: the plain
        layout above). This is the layout of a qkv projection split across devices by heads: with
        qkv's columns and the caches' KV heads sharded over mesh axes whose size divides
        qkv_groups, each device attends with its own heads and no data moves. Unsharded, the
        groups are regathered into the plain layout first (one copy of qkv).

    Returns:
      (o [B, heads x head_dim] in qkv's dtype, k_cache, v_cache): o's head h is query head h's
      softmax(scale q.k) . v over positions 0..pos, in float32 rounded once.
    """
    if isinstance(pos, (int, np.integer)) and not isinstance(pos, bool):
        pos = jnp.asarray(pos, jnp.int32)
    _check(qkv, k_cache, v_cache, pos, heads, kv_heads, rope_theta, scale, variant, qkv_groups)
    b, _, _, hd = k_cache.shape
    pos, scale, rope_theta = static_params(pos, scale, rope_theta, b, hd)
    if b == 0:
        return jnp.zeros((0, heads * hd), qkv.dtype), k_cache, v_cache
    call = _partitioned(int(heads), int(kv_heads), rope_theta, scale, variant, int(qkv_groups))
    o, k_cache, v_cache = call(qkv, k_cache, v_cache, pos)
    return o, k_cache, v_cache


def static_params(pos, scale, rope_theta, b: int, head_dim: int):
    """pos as int32 [B], and the primitive's static scale (1 / sqrt(head_dim) when None) and
    rope_theta as Python floats (decoder_layer binds the same)."""
    pos = jnp.broadcast_to(jnp.asarray(pos, jnp.int32), (b,))
    scale = float(1.0 / np.sqrt(head_dim)) if scale is None else float(scale)
    return pos, scale, None if rope_theta is None else float(rope_theta)


def plain_layout(qkv: jax.Array, heads: int, kv_heads: int, groups: int) -> jax.Array:
    """qkv [B, W] in `groups` head groups (decode_attention's qkv_groups) -> the plain layout (all
    query heads, then all key heads, then all value heads)."""
    if groups == 1:
        return qkv
    b = qkv.shape[0]
    hd = qkv.shape[1] // (heads + 2 * kv_heads)
    hq, hk = heads // groups * hd, kv_heads // groups * hd
    g = qkv.reshape(b, groups, hq + 2 * hk)
    return jnp.concatenate([g[:, :, :hq].reshape(b, -1), g[:, :, hq : hq + hk].reshape(b, -1),
                            g[:, :, hq + hk :].reshape(b, -1)], axis=1)


def fold_batch(axis_size: int, arrays, batched) -> list:
    """vmap's mapped axis folded into the batch axis after it: [A, B, ...] -> [A B, ...], an
    array that is not mapped broadcast to every example first (decode_attention's and
    decoder_layer's batching rules)."""
    arrays = [a if mapped else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, mapped in zip(arrays, batched)]
    return [a.reshape(axis_size * a.shape[1], *a.shape[2:]) for a in arrays]


def unfold_batch(axis_size: int, arrays) -> tuple:
    """fold_batch undone on results: [A B, ...] -> [A, B, ...]."""
    return tuple(a.reshape(axis_size, a.shape[0] // axis_size, *a.shape[1:]) for a in arrays)


@functools.lru_cache(maxsize=None)
def _partitioned(heads, kv_heads, rope_theta, scale, variant, groups):
    """The primitive for these static parameters, partitioned along the batch and the head groups
    under pjit, with vmap folded into the batch."""
    def inner(qkv, k_cache, v_cache, pos, shards=1):
        # One device's share of `shards` head groups: heads / shards query heads over its own
        # groups / shards groups.
        h, kvh, g = heads // shards, kv_heads // shards, groups // shards
        return tuple(_attention_p.bind(plain_layout(qkv, h, kvh, g), k_cache, v_cache, pos, heads=h, kv_heads=kvh,
                                       rope_theta=rope_theta, scale=scale, variant=variant))

    part = sharding.partitioned_attention(inner, groups)

    @custom_vmap
    def mapped(qkv, k_cache, v_cache, pos):
        return part(qkv, k_cache, v_cache, pos)

    @mapped.def_vmap
    def _fold(axis_size, in_batched, qkv, k_cache, v_cache, pos):
        """vmap folds the mapped axis into the batch: one call for every sequence of every example
        (an operand that is not mapped is shared: each example gets its own updated caches)."""
        outs = mapped(*fold_batch(axis_size, (qkv, k_cache, v_cache, pos), in_batched))
        return unfold_batch(axis_size, outs), (True,) * len(outs)

    return mapped
