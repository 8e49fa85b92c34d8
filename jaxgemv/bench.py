"""Benchmark: jaxgemv products on real decode shapes, against the streaming-read ceiling and XLA.

    python -m jaxgemv.bench                                  # every named shape, M = 1,2,4,8,16
    python -m jaxgemv.bench --shapes lm_head_248k 4096x4096 --m 1,8 --variant auto,mma,scalar
    python -m jaxgemv.bench --warm --json out.json --plot roofline.png
    python -m jaxgemv.bench --crossover                      # where dequant overtakes the GEMVs
    python -m jaxgemv.bench --trace --shapes 5120x17408      # + kernel and idle time per product
    python -m jaxgemv.bench --format dense --variant auto,splitk   # small-N fp16/bf16 products
    JAX_PLATFORMS=cpu python -m jaxgemv.bench                # tiny shapes, no ceiling

Times are COLD, as a model's decode step sees them: each case cycles through R distinct weight
copies that together exceed 3 x L2, so no product finds its weight in cache. One executable runs
T passes over the R copies; C executables are dispatched back-to-back and we block once, so a
batch of C x T x R products is timed and the per-product time is batch time / (C x T x R).
The ceiling is the `jaxgemv_stream_read` kernel, timed the same way on buffers of each case's
byte count (weight + x + y), so "% of ceiling" compares like with like.

Those are wall-clock times, and they exceed the products' kernel time: on an H200 by 4-8% for
the GEMVs and 15-25% for the ceiling read at 28-92 MB, with the GPU idle under 0.2 us per
product, within calls and between them (docs/perf-log.md, entry 99). Small kernels beside each
product take the rest: XLA's permutation of x (part of the product), each pass's perturbation of
x, and until perf log 102 a salt reduce per ceiling read. --trace (GPU) runs each timed batch
once more under jax.profiler and adds the products' kernel device time and the GPU's idle time
per product, with the ceiling read's kernel time to compare with: the like-for-like figure
against the memory's read rate.

Weights too small for that (past MAX_COPIES copies, e.g. a 4 KB router) are kept cold by a flush
instead: each product first reads one buffer of 2 x L2 (a salted stream_read, so no two flushes
are merged), which evicts everything; the flushes alone are timed the same way and subtracted
("flush" columns). Few arrays per call keep JAX's per-argument host cost out of the numbers.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import datetime
import glob
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jaxgemv
from jaxgemv import _ext, fp4, fp8, nbits, planner
from jaxgemv.device import DeviceFacts, facts_of

# Decode shapes [N, K] (y = x @ W^T, W is [N, K]) from Qwen3-family models.
NAMED_SHAPES: dict[str, tuple[int, int]] = {
    "lm_head_248k": (248320, 2048),
    "qwen3_lm_head": (151936, 2048),
    "proj_8k_2k": (8192, 2048),
    "proj_5k_6k": (5120, 6144),
    "proj_6k_5k": (6144, 5120),
    "down_5k_17k": (5120, 17408),
    "up_12k_4k": (12288, 4096),
    "attn_4k_4k": (4096, 4096),
    "expert_down": (2048, 512),
    "expert_up": (512, 2048),
}
CPU_SHAPES = ("512x256", "256x512")
# dense: the seed's small-N shapes (routers, gates, linear-attention projections).
DENSE_SHAPES = tuple(f"{n}x{k}" for k in (2048, 4096) for n in (1, 32, 128, 256, 512, 1024))
GPU_MS, CPU_MS = (1, 2, 4, 8, 16), (1, 4)
CROSSOVER_SHAPES = ("5120x6144", "12288x4096", "151936x2048")
CROSSOVER_MS = (8, 16, 24, 32, 48, 64, 96, 128)
CROSSOVER_VARIANTS = ("mma", "scalar", "cpu", "dequant")  # the planner rejects what a device lacks
DTYPES = {"f16": jnp.float16, "bf16": jnp.bfloat16}
# Every format's variants (the quantized ones' and dense's); each planner rejects those it lacks.
ALL_VARIANTS = tuple(dict.fromkeys(planner.ENV_VARIANTS + planner.DENSE_VARIANTS))
_SCOPE = "bench_product"  # named scope around each product, to count them in the compiled HLO


def parse_shapes(tokens, check=lambda n, k: None) -> list[tuple[str, int, int]]:
    """Named shapes, `all`, `NxK` or `N,K` -> [(label, N, K)]; raises ValueError naming a bad token.

    `check(N, K)` says why a shape is not allowed (e.g. the format's K granularity), or None."""
    by_dims = {dims: name for name, dims in NAMED_SHAPES.items()}
    out = []
    for tok in tokens:
        if tok in NAMED_SHAPES or tok == "all":
            found = [(name, *NAMED_SHAPES[name]) for name in (NAMED_SHAPES if tok == "all" else [tok])]
        else:
            parts = re.fullmatch(r"\s*(\d+)\s*[x,]\s*(\d+)\s*", tok)
            if not parts or 0 in (n := int(parts[1]), k := int(parts[2])):
                raise ValueError(f"bad shape {tok!r}: expected one of {', '.join(NAMED_SHAPES)}, all, NxK or N,K")
            found = [(by_dims.get((n, k), f"{n}x{k}"), n, k)]
        for _, n, k in found:
            if why := check(n, k):
                raise ValueError(f"bad shape {tok!r}: {why}")
        out += found
    return out


def parse_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise ValueError(f"bad {what} {text!r}: expected positive integers separated by commas")
    return values


# ----------------------------------------------------------------------------------------------
# Formats: one entry per weight format. A new format (fp8, int4, int8) is one more Format.

def dense_dot(x, w):
    """XLA's dot on a dense [N, K] weight in x's dtype, float32 accumulation (dense_matmul's
    "xla" variant)."""
    return jaxgemv.dense_matmul_reference(x, w)


def _nvfp4_random(key, n: int, k: int, dtype=None) -> jaxgemv.NVFP4Weight:
    # Uniform random bytes are uniform random E2M1 codes; scales 2^-3..2^3 keep f16 outputs finite.
    kc, ks = jax.random.split(key)
    packed = jax.random.bits(kc, (n, k // 2), jnp.uint8)
    exps = jax.random.randint(ks, (n, k // 16), -3, 4).astype(jnp.float32)
    return jaxgemv.NVFP4Weight(packed, jnp.exp2(exps).astype(jnp.float8_e4m3fn), jnp.float32(0.01))


def _nvfp4_xla_dequant_matmul(x, w):
    """The baseline a user writes without jaxgemv: decode in plain jnp, then XLA's dot."""
    n, k = w.shape
    vals = fp4.decode_codes(w.packed).reshape(n, k // 16, 16)
    dense = vals * (w.scales.astype(jnp.float32) * w.global_scale)[..., None]
    return dense_dot(x, dense.reshape(n, k).astype(x.dtype))


def _fp8_random(block):
    def make(key, n: int, k: int, dtype=None) -> jaxgemv.FP8Weight:
        # Random bytes with the two NaN codes moved off; scales 2^-8..2^-6 keep f16 outputs finite.
        kc, ks = jax.random.split(key)
        codes = jax.random.bits(kc, (n, k), jnp.uint8)
        codes = jnp.where((codes & 0x7F) == 0x7F, codes ^ 1, codes)
        sn, sk = -(-n // block[0]), -(-k // block[1])
        scales = jnp.exp2(jax.random.uniform(ks, (sn, sk), jnp.float32, -8.0, -6.0))
        return jaxgemv.FP8Weight(lax.bitcast_convert_type(codes, jnp.float8_e4m3fn), scales, block)

    return make


def _fp8_xla_dequant_matmul(x, w):
    """The baseline a user writes without jaxgemv: scale the E4M3 weight in plain jnp, then XLA's dot."""
    return dense_dot(x, fp8.dequantize_reference(w).astype(x.dtype))


def _fp8_format(name: str, block: tuple[int, int]) -> "Format":
    bn, bk = block
    return Format(
        name=name,
        weight_bytes=lambda n, k: n * k + 4 * -(-n // bn) * -(-k // bk),
        random_weight=_fp8_random(block),
        matmul=lambda x, w, variant: jaxgemv.fp8_matmul(x, w, variant=variant),
        plan=lambda m, n, k, facts, variant: planner.plan_fp8(m, n, k, bk, facts, variant),
        xla_dequant_matmul=_fp8_xla_dequant_matmul,
        check=lambda n, k: None,
        launch=("fp8", bk),
    )


def _nbits_random(bits: int, block_size: int, scale_dtype=jnp.bfloat16, zero_points: bool = False):
    def make(key, n: int, k: int, dtype=None) -> jaxgemv.NBitsWeight:
        # Random codes (uniform bytes), scales 2^-8..2^-6, and no zero points (2^(bits-1)) or
        # random ones (uniform bytes, packed like the codes).
        kc, ks, kz = jax.random.split(key, 3)
        blocks = -(-k // block_size)
        packed = jax.random.bits(kc, (n, blocks, block_size * bits // 8), jnp.uint8)
        scales = jnp.exp2(jax.random.uniform(ks, (n, blocks), jnp.float32, -8.0, -6.0)).astype(scale_dtype)
        zp = jax.random.bits(kz, (n, -(-blocks * bits // 8)), jnp.uint8) if zero_points else None
        return jaxgemv.NBitsWeight(packed, scales, zp, bits, block_size, k)

    return make


def _nbits_xla_dequant_matmul(x, w):
    """The baseline a user writes without jaxgemv: unpack and scale in plain jnp, then XLA's dot."""
    return dense_dot(x, nbits.dequantize_reference(w).astype(x.dtype))


def _nbits_format(bits: int, block_size: int = 32, dtype=jnp.bfloat16, zero_points: bool = False) -> "Format":
    product = jaxgemv.int4_matmul if bits == 4 else jaxgemv.int8_matmul

    def weight_bytes(n: int, k: int) -> int:
        blocks = -(-k // block_size)
        return n * blocks * (block_size * bits // 8 + 2) + (n * -(-blocks * bits // 8) if zero_points else 0)

    return Format(
        name=f"int{bits}" + ("" if block_size == 32 else f"_g{block_size}") + ("" if dtype == jnp.bfloat16 else "_f16")
        + ("_zp" if zero_points else ""),
        weight_bytes=weight_bytes,
        random_weight=_nbits_random(bits, block_size, dtype, zero_points),
        matmul=lambda x, w, variant: product(x, w, variant=variant),
        plan=lambda m, n, k, facts, variant: planner.plan_nbits(m, n, k, bits, block_size, facts, variant),
        xla_dequant_matmul=_nbits_xla_dequant_matmul,
        check=lambda n, k: None,
        act_dtype=dtype,  # the scales' dtype, which the product runs in
        launch=(f"int{bits}", block_size),
    )


@dataclasses.dataclass(frozen=True)
class Format:
    name: str
    weight_bytes: Callable[[int, int], int]  # (N, K) -> bytes a product must read
    random_weight: Callable[..., Any]  # (key, N, K, activation dtype) -> random weight pytree, traceable
    matmul: Callable[..., Any]  # (x, w, variant) -> y
    plan: Callable[[int, int, int, DeviceFacts, str], Any]  # Plan / DensePlan; ValueError if rejected
    xla_dequant_matmul: Callable[..., Any] | None  # (x, w) -> y in plain jnp; None: no such baseline
    check: Callable[[int, int], str | None]  # (N, K) -> why the format cannot hold it, or None
    act_dtype: Any = None  # activations this format runs with whatever --dtype says (None: --dtype)
    shapes: tuple[str, ...] | None = None  # default --shapes on a GPU (None: all named shapes)
    # The tensor-core launcher's name for the format and its block size along K (launch_choice).
    launch: tuple[str, int] | None = None


FORMATS: dict[str, Format] = {
    "nvfp4": Format(
        name="nvfp4",
        weight_bytes=lambda n, k: n * k // 2 + n * k // 16 + 4,
        random_weight=_nvfp4_random,
        matmul=lambda x, w, variant: jaxgemv.fp4_matmul(x, w, variant=variant),
        plan=planner.plan_fp4,
        xla_dequant_matmul=_nvfp4_xla_dequant_matmul,
        check=lambda n, k: None if k % 16 == 0 else f"K = {k} is not a multiple of 16",
        launch=("nvfp4", 16),
    ),
    "fp8": _fp8_format("fp8", (1, 128)),
    "fp8_128x128": _fp8_format("fp8_128x128", (128, 128)),
    # ONNX Runtime's blocks of 32 values: the CUDA-core FP8 kernel's layout (the tensor-core one needs 64).
    "fp8_b32": _fp8_format("fp8_b32", (1, 32)),
    "int4": _nbits_format(4),
    "int8": _nbits_format(8),
    # The same with fp16 scales and x (the usual dtype of ONNX Runtime's MatMulNBits models; the
    # kernels decode 16-bit floats per type, so the two are timed apart).
    "int4_f16": _nbits_format(4, dtype=jnp.float16),
    "int8_f16": _nbits_format(8, dtype=jnp.float16),
    # Asymmetric weights (zero points stored, as most MatMulNBits checkpoints have them).
    "int4_zp": _nbits_format(4, zero_points=True),
    "int8_zp": _nbits_format(8, zero_points=True),
    # Groups of 128 values, with and without zero points: the layout GPTQ and AWQ checkpoints load
    # into (NBitsWeight.from_gptq / from_awq), the int4 weights most models ship.
    "int4_g128": _nbits_format(4, 128),
    "int4_g128_zp": _nbits_format(4, 128, zero_points=True),
    # Plain fp16/bf16 [N, K] in the activations' dtype: the baseline that matters is XLA's dot.
    "dense": Format(
        name="dense",
        weight_bytes=lambda n, k: 2 * n * k,
        random_weight=lambda key, n, k, dtype: jax.random.normal(key, (n, k), dtype),
        matmul=lambda x, w, variant: jaxgemv.dense_matmul(x, w, variant=variant),
        plan=planner.plan_dense,
        xla_dequant_matmul=None,
        check=lambda n, k: None,
        shapes=DENSE_SHAPES,
    ),
}


def stream_read(buf: jax.Array, salt: jax.Array | None = None) -> jax.Array:
    """Reads every byte of a uint8 buffer (size % 16 == 0) once: the streaming-read ceiling (CUDA).
    `salt` (any array of 4 bytes or more; the kernel reads its first 4) makes otherwise identical
    calls distinct to XLA."""
    if salt is not None and salt.size * jnp.dtype(salt.dtype).itemsize < 4:
        raise ValueError(f"stream_read: salt must hold at least 4 bytes, got {salt.dtype}{list(salt.shape)}")
    if not jaxgemv.HAS_CUDA:
        raise RuntimeError("stream_read needs jaxgemv built with CUDA")
    salt = jnp.zeros((1,), jnp.uint32) if salt is None else salt
    return jax.ffi.ffi_call("jaxgemv_stream_read", jax.ShapeDtypeStruct((1,), jnp.uint32))(buf, salt)


def _salt_of(x, w) -> jax.Array:
    """One uint32 that differs between passes (x) and weight copies (w's first leaf)."""
    first = lambda a: jnp.sum(a.reshape(-1)[:8].astype(jnp.float32))  # noqa: E731
    v = first(x) + first(jax.tree_util.tree_leaves(w)[0])
    return lax.bitcast_convert_type(v, jnp.uint32).reshape(1)


def _read_like(x: jax.Array, buf: jax.Array) -> jax.Array:
    """The ceiling product: stream_read of buf, salted by x itself. The buffers differ between
    copies and x between passes, so no two reads are the same call and none is merged. The salt
    used to be computed from x and buf: one small reduce per product, a kernel of its own (~1.9
    us each in a graph, by the decode profile of docs/perf-log.md entry 98) timed with every
    ceiling product (perf log 102)."""
    return stream_read(buf, x if x.nbytes >= 4 else _salt_of(x, buf))


# ----------------------------------------------------------------------------------------------
# Timing


@dataclasses.dataclass
class Timing:
    samples_s: list[float]  # per product, one per batch
    calls: int  # C: executables per batch
    rounds: int  # T: passes over the copies per executable
    copies: int  # R
    order: str  # how the products were kept in program order (see compile_products)
    flush_us: float | None = None  # the flush subtracted from every sample (see time_cold)
    # --trace: from one more batch under the profiler, per product: the device time of its kernels,
    # and the time the GPU sat idle between kernels and between calls (see trace_products).
    kernel_us: float | None = None
    gap_us: float | None = None
    kernel_kinds: dict | None = None  # kernel_us by kind of kernel (see kernel_kinds)

    @property
    def us(self) -> float:
        return statistics.median(self.samples_s) * 1e6

    def fields(self, prefix: str) -> dict[str, Any]:
        us = [s * 1e6 for s in self.samples_s]
        out = {f"{prefix}us": self.us, f"{prefix}min_us": min(us), f"{prefix}max_us": max(us),
               f"{prefix}samples_us": us, f"{prefix}calls": self.calls, f"{prefix}rounds": self.rounds,
               f"{prefix}copies": self.copies, f"{prefix}order": self.order}
        if self.flush_us is not None:
            out[f"{prefix}flush_us"] = self.flush_us
        if self.kernel_us is not None:
            out[f"{prefix}kernel_us"] = self.kernel_us
            out[f"{prefix}gap_us"] = self.gap_us
        if self.kernel_kinds is not None:
            out[f"{prefix}kernel_kinds"] = self.kernel_kinds
        return out


def trace_events(trace_dir: str) -> list[tuple[str, int, int, dict]]:
    """(name, start ns, duration ns, stats) of everything on the GPU streams of the newest trace
    jax.profiler wrote under trace_dir, sorted by start ([] when there is none). Memcpy and memset
    events sit on the streams too: they are time the GPU spends. (tools/decode_profile.py reads
    its traces with it too.)"""
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return []
    events = []
    for plane in jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime)).planes:
        if plane.name.startswith("/device:GPU"):
            for line in plane.lines:
                if line.name.startswith("Stream"):
                    events += [(ev.name, ev.start_ns, ev.duration_ns, dict(ev.stats)) for ev in line.events]
    return sorted(events, key=lambda e: e[1])


def kernel_kinds(events: list[tuple], products: int) -> dict[str, float]:
    """The kinds kernel_times counts as a product's own, each with its device us per product,
    longest first: what its "kern us" is made of (the JSON rows' kernel_kinds). XLA numbers each
    instance of a fusion ("loop_transpose_fusion_3"): a product's helper kernels (the x permutation
    of fragment-order products, XLA's dequantize) are one kind per product only with the numbers
    dropped."""
    kinds = [re.sub(r"([._]\d+)+$", "", name) for name, *_ in events]
    counts = collections.Counter(kinds)
    own: dict[str, float] = collections.defaultdict(float)
    for kind, (_, _, d, *_) in zip(kinds, events):
        if counts[kind] >= products:
            own[kind] += d / products / 1e3
    return dict(sorted(own.items(), key=lambda kv: -kv[1]))


def idle_us(events: list[tuple], products: int) -> float:
    """The time between the first kernel's start and the last kernel's end when no kernel ran,
    per product: launch and scheduling time that the wall-clock "us" column holds and the kernels
    do not (overlapping kernels, a dependent launch, count once)."""
    busy, cur_s, cur_e = 0, None, None
    for _, s, d, *_ in events:
        if cur_e is None or s > cur_e:
            busy += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, s + d
        else:
            cur_e = max(cur_e, s + d)
    busy += cur_e - cur_s
    span = max(s + d for _, s, d, *_ in events) - events[0][1]
    return (span - busy) / products / 1e3


def kernel_times(events: list[tuple], products: int) -> tuple[float, float, dict] | None:
    """(kernel us, gap us, kernel_kinds) per product of a trace that holds `products` products.

    Kernel us: the summed durations of the kinds of kernel that ran at least once per product
    (kernel_kinds: the product's own, a GEMV and the permutation of its x, a ceiling read, XLA's
    dot and its helpers); the calls' other kernels (each pass's perturbation of x, the outputs'
    stack) run fewer times and are left out. Gap us: idle_us. None if the trace has no kernels
    (no CUPTI)."""
    if not events:
        return None
    kinds = kernel_kinds(events, products)
    return sum(kinds.values()), idle_us(events, products), kinds


def trace_products(exe, args, products: int, calls: int = 1) -> tuple[float, float, dict] | None:
    """kernel_times of one batch (`calls` calls of exe(*args) dispatched back to back, as timed,
    each running `products` products) under jax.profiler: the gaps then hold the GPU's idle time
    between calls too. None where the trace holds no device kernels (CPU, no CUPTI)."""
    with tempfile.TemporaryDirectory(prefix="jaxgemv-bench-") as d:
        with jax.profiler.trace(d):
            jax.block_until_ready([exe(*args) for _ in range(calls)])
        return kernel_times(trace_events(d), products * calls)


def _schedule(exe) -> list[int]:
    """Product indices in the order the compiled program runs them: first mention in the
    scheduled computations as printed (callees before callers, so a command buffer's body comes
    before the entry computation that calls it), fusion bodies left out."""
    seen: list[int] = []
    for comp in re.split(r"\n(?=\S)", exe.as_text()):
        if re.match(r"%?(fused|wrapped|region|horizontally)", comp):
            continue
        for i in re.findall(rf"/{_SCOPE}(\d+)/", comp):
            if int(i) not in seen:
                seen.append(int(i))
    return seen


# Per call, at most this many bytes of concatenated outputs (a copy kernel spread over T x R
# products) and at least this many products (so that device time, not JAX's host cost per call
# and per argument, sets the pace: with R = 7 copies and one pass, the 28 MB ceiling timed 26 us;
# with ordered passes (and the ceiling kernel's predicated last round, landed together in
# f10282b) 10 us).
_MAX_OUT_BYTES = 64 << 20
_MIN_PRODUCTS = 48
# Products whose output is at least this large come back as separate arrays, not stacked: the
# stack is a copy of every output that the call then waits for, and it was charged to the products.
# On an H200 (NVFP4 151936 x 2048, builds of 947a31b, stacked against apart in one session)
# stacking added 6 us per product at M = 8 (y 2.4 MB: 68.1 against 61.9 us) and 13 us at M = 16
# (136 against 122), and a read-only diagnostic build of the kernel fell from 94% of the ceiling
# at M = 1 to 73% at M = 16 stacked, 91% apart. Below this size the stack costs well under a
# microsecond, while each returned array costs JAX host time per call (see above), which short
# products cannot hide.
_APART_MIN_OUT_BYTES = 256 << 10


def passes_for(rounds: int, copies: int, out_bytes: int) -> int:
    """T: passes over the R copies in one executable."""
    want = max(1, min(rounds, math.ceil(_MIN_PRODUCTS / copies)))
    return max(1, min(want, _MAX_OUT_BYTES // max(1, copies * out_bytes)))


def compile_products(op, x, ws, rounds: int):
    """One executable computing op(x_t, w) for T passes t over the copies w in ws:
    (executable, T, order), where order says how the products were kept in program order.

    Each pass perturbs x (x_t = x (1 + t 2^-10)) so that XLA cannot merge the passes, and every
    output comes back, which keeps every product live: small ones stacked into one array, since JAX
    spends host time per returned array (about 3 us), which would otherwise set the pace for small
    products; large ones apart, since the stack's copy would be timed with them. Left alone, XLA
    schedules the products grouped by weight copy (all passes over copy 0, then copy 1, ...),
    which would time every pass but the first warm. So each product is ordered after the one
    before it: first by an optimization barrier (free, when the backend keeps it as a scheduling
    constraint), else by adding 0 x (the previous product's first output) to x (one tiny fusion
    per product, counted in every timing alike), else one pass. We check the compiled schedule,
    not the intent.
    """
    y0 = jax.eval_shape(op, x, ws[0])
    out_bytes = math.prod(y0.shape) * jnp.dtype(y0.dtype).itemsize
    passes = passes_for(rounds, len(ws), out_bytes)
    apart = out_bytes >= _APART_MIN_OUT_BYTES

    def run(x, ws, passes, order):
        outs = []
        for t in range(passes):
            xt = x if t == 0 else (x * (1 + t / 1024)).astype(x.dtype)
            for i, w in enumerate(ws):
                if outs and order == "barrier":
                    xt, w, _ = lax.optimization_barrier((xt, w, outs[-1]))
                elif outs and order == "data":
                    xt = xt + (outs[-1].reshape(-1)[0] * 0).astype(xt.dtype)
                with jax.named_scope(f"{_SCOPE}{t * len(ws) + i}"):
                    outs.append(op(xt, w))
        # One array (stacking keeps a sharded output where it is), or for large outputs each
        # its own (_APART_MIN_OUT_BYTES).
        return tuple(outs) if apart else jnp.stack(outs)

    if passes > 1:
        for order in ("barrier", "data"):
            exe = jax.jit(run, static_argnums=(2, 3)).lower(x, ws, passes, order).compile()
            if _schedule(exe) == list(range(passes * len(ws))):
                return exe, passes, order
    exe = jax.jit(run, static_argnums=(2, 3)).lower(x, ws, 1, "none").compile()
    return exe, 1, "one pass"


def time_products(ctx: "Ctx", op, x, ws, rounds: int | None = None) -> Timing:
    """Median-able per-product times of op over the weight copies `ws` (see module docstring);
    `rounds`: the most passes over them per executable (default ctx.rounds)."""
    exe, rounds, order = compile_products(op, x, ws, rounds or ctx.rounds)
    if order != ctx.last_order:
        ctx.log(f"note: products ordered by: {order}")
        ctx.last_order = order
    jax.block_until_ready(exe(x, ws))  # warm-up 1: first run (allocations, module load)
    t0 = time.perf_counter()
    jax.block_until_ready(exe(x, ws))  # warm-up 2: estimates one call
    calls = max(1, math.ceil(ctx.min_batch_s / (time.perf_counter() - t0)))
    samples = []
    for _ in range(ctx.batches):
        # Dispatch is asynchronous: the C calls queue on the device while Python returns at
        # once, so as long as one call's device work outlasts its host cost, the wall time of
        # the batch is device time. We block on every result (the GPU runs them in order anyway;
        # the CPU client may not).
        t0 = time.perf_counter()
        outs = [exe(x, ws) for _ in range(calls)]
        jax.block_until_ready(outs)
        samples.append((time.perf_counter() - t0) / (calls * rounds * len(ws)))
        del outs
    traced = trace_products(exe, (x, ws), rounds * len(ws), calls) if ctx.trace else None
    kernel_us, gap_us, kinds = traced or (None, None, None)
    return Timing(samples, calls, rounds, len(ws), order, kernel_us=kernel_us, gap_us=gap_us, kernel_kinds=kinds)


def time_cold(ctx: "Ctx", op, x, ws, flush=None) -> Timing:
    """time_products, or with `flush` (one uint8 buffer of 2 x L2) each product preceded by a
    read of all of it, and the flushes' own time (measured alone, the same way) subtracted."""
    if flush is None:
        return time_products(ctx, op, x, ws)
    pairs = [(w, flush) for w in ws]  # one buffer, passed once per copy (no copy made)

    def read(x, pair):
        return stream_read(pair[1], _salt_of(x, pair[0]))

    def flushed(x, pair):
        r = read(x, pair)
        x, w, r = lax.optimization_barrier((x, pair[0], r))  # the product runs after its flush
        return jnp.concatenate([op(x, w).reshape(-1), r.astype(x.dtype)])

    key = ("flush", len(ws), flush.size, x.shape, jnp.dtype(x.dtype).name)
    if key not in ctx.cache:
        ctx.cache[key] = base = time_products(ctx, lambda x, pair: read(x, pair).astype(x.dtype), x, pairs)
        ctx.log(f"flush {flush.size} B x {len(ws)}: {base.us:.2f} us")
    base, t = ctx.cache[key], time_products(ctx, flushed, x, pairs)
    traced = {}
    if t.kernel_us is not None and base.kernel_us is not None:
        kinds = {k: us - base.kernel_kinds.get(k, 0.0) for k, us in t.kernel_kinds.items()}
        traced = dict(kernel_us=t.kernel_us - base.kernel_us, gap_us=t.gap_us - base.gap_us,
                      kernel_kinds={k: us for k, us in kinds.items() if us > 0.005})
    return dataclasses.replace(t, samples_s=[s - base.us / 1e6 for s in t.samples_s], flush_us=base.us, **traced)


@dataclasses.dataclass
class Ctx:
    facts: DeviceFacts
    gpu: bool
    ceiling: bool
    dtype: Any
    l2_bytes: int
    rounds: int
    batches: int
    min_batch_s: float
    copies: int | None
    baselines: bool
    warm: bool
    trace: bool = False  # --trace: kernel and gap times per product from the profiler
    device_id: int = 0  # the GPU's CUDA ordinal (launch_choice)
    cache: dict = dataclasses.field(default_factory=dict)
    t_start: float = dataclasses.field(default_factory=time.perf_counter)
    last_order: str | None = None
    cases: int = 0  # variant rows to time in this run, and how many are done (the progress count)
    done: int = 0

    def log(self, msg: str) -> None:
        print(f"[{time.perf_counter() - self.t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)


def case_bytes(fmt: Format, n: int, k: int, m: int, itemsize: int) -> int:
    """Bytes one product must move: the weight, x [M, K] and y [M, N]."""
    return fmt.weight_bytes(n, k) + m * k * itemsize + m * n * itemsize


def copies_for(ctx: Ctx, weight_bytes: int) -> int:
    if ctx.copies:
        return ctx.copies
    return max(4, math.ceil(3 * ctx.l2_bytes / weight_bytes)) if ctx.gpu else 2


# Above this many weight copies (weights under ~5.6 MB at 60 MB of L2) JAX's host cost per
# argument sets the pace instead of the device (the 0.6 MB shapes ran 320 copies, T = 1, at
# commit f10282b): FLUSH_COPIES copies and a flush read before each product keep them cold
# instead (time_cold).
MAX_COPIES = 32
FLUSH_COPIES = 4


def copies_and_flush(ctx: Ctx, weight_bytes: int) -> tuple[int, int]:
    """(R copies, flush buffer bytes, 0 for none)."""
    copies = copies_for(ctx, weight_bytes)
    if not ctx.gpu or ctx.copies or copies <= MAX_COPIES:
        return copies, 0
    return FLUSH_COPIES, -(-2 * ctx.l2_bytes // 16) * 16


def make_copies(make, count: int, seed: int) -> list:
    """`count` distinct random arrays, generated on the device one at a time (no host traffic)."""
    gen = jax.jit(make)
    return [gen(jax.random.fold_in(jax.random.key(seed), i)) for i in range(count)]


def plan_label(p, launch: tuple[int, bool, bool, bool] | None = None) -> str:
    """A plan's short name. `launch`: what the CUDA launcher runs for it (launch_choice), whose K
    split replaces the plan's, whose held instance (more blocks per SM) adds "h" and whose x-ahead
    instance " xa"."""
    if p.variant == "splitk":
        return f"splitk s{p.splits} l{p.loads}"
    if p.variant == "mma":
        ksplit, held = (launch[0], launch[1]) if launch else (p.ksplit, False)
        return (f"mma k{ksplit}{'h' if held else ''} l{p.loads}" + (f" r{p.rows}" if p.rows > 1 else "")
                + (" xa" if launch and launch[3] else ""))
    if p.variant == "scalar":
        return f"scalar r{p.rows}"
    if p.variant == "imma":  # launch: the launcher's K split where the plan leaves it (0)
        return f"imma k{launch[0] if launch else p.ksplit} l{p.loads}"
    if p.variant == "xshare":
        return f"xshare r{p.rows}"
    if p.variant == "wgmma":  # the launcher's K split where the plan leaves it (0)
        ksplit = p.ksplit or (launch[0] if launch else 0)
        return f"wgmma k{ksplit}" if ksplit else "wgmma"
    return p.variant


def _cached(ctx: Ctx, key, what: str, op, x, ws, flush=None) -> Timing:
    """Ceilings and baselines depend on (shape, M, dtype), not on the variant: measure them once."""
    if key not in ctx.cache:
        ctx.cache[key] = t = time_cold(ctx, op, x, ws, flush)
        ctx.log(f"{what}: {t.us:.2f} us (R={t.copies} T={t.rounds} C={t.calls})")
    return ctx.cache[key]


def launch_choice(ctx: Ctx, fmt: Format, plan, m: int, n: int, k: int, dtype) -> tuple[int, bool, bool, bool] | None:
    """What the tensor-core launcher runs for `plan` on this GPU, (ksplit, held, x_staged, x_ahead),
    where it decides beyond the plan from the device's occupancy (ffi/gemv_launch.cuh: K split 6 for
    K split 8, the instance held to more blocks per SM, x staged at M = 1, int4's x-ahead instance at
    M = 2-8); None off the GPU, for other
    variants, or without an answer."""
    if ctx.gpu and fmt.launch is not None and getattr(plan, "variant", None) == "imma" and _ext.imma_ksplit is not None:
        name, block = fmt.launch
        ks = plan.ksplit or _ext.imma_ksplit(int(name[3:]), jnp.dtype(dtype) == jnp.bfloat16, m, n, k, block, plan.loads,
                                             ctx.device_id)
        return (ks, False, False, False) if ks else None
    if ctx.gpu and getattr(plan, "variant", None) == "wgmma" and _ext.fp8_wgmma_ksplit is not None:
        return (_ext.fp8_wgmma_ksplit(k, plan.ksplit), False, False, False)
    if not ctx.gpu or fmt.launch is None or getattr(plan, "variant", None) != "mma" or _ext.mma_launch_choice is None:
        return None
    name, block = fmt.launch
    return _ext.mma_launch_choice(name, jnp.dtype(dtype) == jnp.float16, m, n, k, plan.rows, plan.ksplit, plan.loads,
                                  int(plan.xperm), plan.xs_warps, plan.x_stage, block, ctx.device_id)


def bench_variant(ctx: Ctx, fmt: Format, row: dict, x, ws, flush=None) -> None:
    """Times one variant into `row`; a variant the planner rejects for the shape is a skipped row."""
    m, n, k, v = row["m"], row["n"], row["k"], row["requested"]
    ctx.done += 1
    step = f"[{ctx.done}/{ctx.cases}]" if ctx.cases else ""
    try:
        plan = fmt.plan(m, n, k, ctx.facts, v)
    except ValueError as e:
        row.update(variant=f"{v}: skipped", skipped=str(e))
        ctx.log(f"{step} {row['shape']} M={m} {v}: skipped ({e})")
        return
    op = lambda x, w: fmt.matmul(x, w, v)  # noqa: E731
    t = time_cold(ctx, op, x, ws, flush)
    launch = launch_choice(ctx, fmt, plan, m, n, k, x.dtype)
    if launch:
        row.update(launch_ksplit=launch[0], launch_held=launch[1], launch_x_staged=launch[2], launch_x_ahead=launch[3])
    row.update(variant=plan_label(plan, launch), **t.fields(""))
    ctx.log(f"{step} {row['shape']} M={m} {row['variant']}: {t.us:.2f} us (R={t.copies} T={t.rounds} C={t.calls})")
    if ctx.warm:
        # One copy, so as many passes as the cold timing has products per call: with ctx.rounds
        # (8) passes JAX's host cost per call set the pace (H200, FP8 8192 x 2048, commit 379bcbe:
        # "warm" 16-20 us against 9.9-11.0 cold; 7.5-7.7 us per kernel under Nsight Compute).
        row.update(time_products(ctx, op, x, ws[:1], rounds=max(ctx.rounds, _MIN_PRODUCTS)).fields("warm_"))


def finish_row(ctx: Ctx, row: dict, keys: dict) -> None:
    """Adds the ceiling, the baselines and the ratios to a timed row."""
    for what, key in keys.items():
        if key in ctx.cache:
            row.update(ctx.cache[key].fields(f"{what}_"))
    if "us" not in row:
        return
    row["tbps"] = row["bytes"] / row["us"] / 1e6
    if "ceiling_us" in row:
        row["ceiling_tbps"] = row["bytes"] / row["ceiling_us"] / 1e6
        row["pct_ceiling"] = 100 * row["ceiling_us"] / row["us"]
        if row.get("kernel_us") and row.get("ceiling_kernel_us"):
            row["pct_ceiling_kernel"] = 100 * row["ceiling_kernel_us"] / row["kernel_us"]
        if row["pct_ceiling"] > 110:
            row["note"] = "faster than the streaming-read ceiling: check the measurement"
            ctx.log(f"WARNING {row['shape']} M={row['m']} {row['variant']}: {row['note']}")
    for what in ("xla_dot", "xla_dequant"):
        if f"{what}_us" in row:
            row[f"speedup_{what}"] = row[f"{what}_us"] / row["us"]


def bench_shape(ctx: Ctx, fmt: Format, label: str, n: int, k: int, ms, variants, crossover=False) -> list[dict]:
    """All rows of one shape. Each kind of weight copies (the format's, dense, the ceiling's
    buffers) is built once, used for every M and freed before the next, to bound peak memory."""
    dtype = jnp.dtype(fmt.act_dtype or ctx.dtype)
    copies, flush_bytes = copies_and_flush(ctx, fmt.weight_bytes(n, k))
    flush = None
    if flush_bytes:
        flush = make_copies(lambda key: jax.random.bits(key, (flush_bytes,), jnp.uint8), 1, seed=4)[0]
    xs = {m: jax.random.normal(jax.random.key(m), (m, k), dtype) for m in ms}
    nbytes = {m: case_bytes(fmt, n, k, m, dtype.itemsize) for m in ms}
    keys = {m: dict(ceiling=("ceiling", -(-nbytes[m] // 16) * 16, copies), xla_dot=("xla_dot", n, k, m, dtype.name),
                    xla_dequant=("xla_dequant", fmt.name, n, k, m, dtype.name)) for m in ms}
    rows = [dict(shape=label, n=n, k=k, m=m, format=fmt.name, dtype=dtype.name, bytes=nbytes[m], copies=copies,
                 requested=v, **({"flush_bytes": flush_bytes} if flush_bytes else {})) for m in ms for v in variants]

    ws = make_copies(lambda key: fmt.random_weight(key, n, k, dtype), copies, seed=1)
    for row in rows:
        bench_variant(ctx, fmt, row, xs[row["m"]], ws, flush)
    if ctx.baselines and not crossover and fmt.xla_dequant_matmul is not None:
        for m in ms:
            _cached(ctx, keys[m]["xla_dequant"], f"{label} M={m} XLA dequant+dot", fmt.xla_dequant_matmul, xs[m], ws,
                    flush)
    del ws
    if crossover:
        return rows

    if ctx.baselines and any(keys[m]["xla_dot"] not in ctx.cache for m in ms):
        dense = make_copies(lambda key: jax.random.normal(key, (n, k), dtype), copies, seed=2)
        for m in ms:
            _cached(ctx, keys[m]["xla_dot"], f"{label} M={m} XLA dot", dense_dot, xs[m], dense, flush)
        del dense
    if ctx.ceiling:
        for m in ms:
            size = keys[m]["ceiling"][1]
            if keys[m]["ceiling"] not in ctx.cache:
                bufs = make_copies(lambda key: jax.random.bits(key, (size,), jnp.uint8), copies, seed=3)
                _cached(ctx, keys[m]["ceiling"], f"{label} M={m} ceiling", _read_like, xs[m], bufs, flush)
                del bufs
    for row in rows:
        finish_row(ctx, row, keys[row["m"]])
    return rows


def crossover_summary(rows: list[dict]) -> list[dict]:
    """Per shape: the smallest M from which dequant stays faster than the best GEMV variant."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows):
        per_m: dict[int, dict[str, float]] = {}
        for r in rows:
            if r["shape"] == shape and "us" in r:
                per_m.setdefault(r["m"], {})[r["requested"]] = r["us"]
        wins = [m for m, t in sorted(per_m.items())
                if "dequant" in t and len(t) > 1 and t["dequant"] < min(v for k, v in t.items() if k != "dequant")]
        ms = sorted(per_m)
        first = next((m for i, m in enumerate(ms) if all(mm in wins for mm in ms[i:])), None)
        below = [m for m in ms if first is None or m < first]
        out.append(dict(shape=shape, dequant_faster_from_m=first, gemv_max_m=max(below, default=None), measured_m=ms))
    return out


# ----------------------------------------------------------------------------------------------
# Output


def _f(v, spec: str) -> str:
    if v is None:
        return "-"
    if spec == "g":  # three significant digits, never in exponent form
        return np.format_float_positional(v, precision=3, unique=False, fractional=False, trim="-")
    return format(v, spec)


def render_table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(c).rjust(w) if i > 0 else str(c).ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def short_kernel_name(name: str) -> str:
    """A kernel's name for a line of text: a mangled C++ name as its function's own name
    (`_ZN7jaxgemv13MmaGemvKernelI...` -> MmaGemvKernel, through anonymous namespaces), anything
    else as it is."""
    if not name.startswith("_ZN"):
        return name
    pos, last = 3, None
    while m := re.match(r"\d+", name[pos:]):
        pos += len(m.group(0))
        last, pos = name[pos : pos + int(m.group(0))], pos + int(m.group(0))
    return last or name


def kinds_lines(rows: list[dict]) -> list[str]:
    """--kinds: what each traced row's "kern us" is made of, one line per row ("kinds" first, so
    that tools/device_patches.sh's `rows` keeps it): its kinds of kernel, longest first, us each."""
    return [f"kinds {r['shape']} M={r['m']} {r['variant']}: "
            + ", ".join(f"{short_kernel_name(name)} {us:.2f}" for name, us in r["kernel_kinds"].items())
            for r in rows if r.get("kernel_kinds")]


def results_table(rows: list[dict], warm: bool) -> str:
    # The dequantize-then-dot columns only for formats that have that baseline (not dense); the
    # flush column only when small weights were kept cold by a flush (time_cold).
    deq = any(FORMATS[r["format"]].xla_dequant_matmul is not None for r in rows)
    flush = any("flush_us" in r for r in rows)
    traced = any("kernel_us" in r for r in rows)
    header = ["shape", "N", "K", "M", "format", "variant", "us", "spread"] + (["warm us"] if warm else [])
    header += ["TB/s", "% ceil"] + (["kern us", "gap us", "ceil kern", "% ceil kern"] if traced else [])
    header += ["XLA dot us"] + (["XLA deq us"] if deq else []) + ["x dot"]
    header += (["x deq"] if deq else []) + (["flush us"] if flush else [])
    body = []
    for r in rows:
        g = r.get
        spread = f"{r['min_us']:.1f}-{r['max_us']:.1f}" if "us" in r else "-"
        cells = [r["shape"], r["n"], r["k"], r["m"], r["format"], r["variant"], _f(g("us"), ".1f"), spread]
        cells += [_f(g("warm_us"), ".1f")] if warm else []
        cells += [_f(g("tbps"), "g"), _f(g("pct_ceiling"), ".0f")]
        if traced:
            cells += [_f(g("kernel_us"), ".1f"), _f(g("gap_us"), ".1f"), _f(g("ceiling_kernel_us"), ".1f"),
                      _f(g("pct_ceiling_kernel"), ".0f")]
        cells += [_f(g("xla_dot_us"), ".1f")]
        cells += [_f(g("xla_dequant_us"), ".1f")] if deq else []
        cells += [_f(g("speedup_xla_dot"), ".2f")]
        cells += [_f(g("speedup_xla_dequant"), ".2f")] if deq else []
        cells += [_f(g("flush_us"), ".1f")] if flush else []
        body.append(cells)
    table = render_table(header, body)
    if traced:
        table += ("\nkern us: the product's kernels' device time, from one more batch under the profiler; gap us: "
                  "the GPU's idle time per product in that batch (launch and scheduling, in the wall-clock us); "
                  "ceil kern: the ceiling read's kernel time, the % ceil kern column's reference.")
    if flush:
        # The subtraction leaves products of a few microseconds inside the flush's own noise
        # (docs/perf-log.md, entry 12); device times per kernel come from Nsight Compute.
        table += ("\nRows with a flush: kept cold by a 2 x L2 read before each product, its time subtracted; "
                  "at a few us that is within the flush's noise. For cold device times per kernel use "
                  "tools/small_products.py (in the repository) under Nsight Compute.")
    return table


def crossover_table(rows: list[dict], summary: list[dict]) -> str:
    variants = [v for v in CROSSOVER_VARIANTS if any(r["requested"] == v and "us" in r for r in rows)]
    body = []
    for shape, m in dict.fromkeys((r["shape"], r["m"]) for r in rows):
        t = {r["requested"]: r.get("us") for r in rows if r["shape"] == shape and r["m"] == m}
        done = {v: u for v, u in t.items() if u is not None}
        body.append([shape, m] + [_f(t.get(v), ".1f") for v in variants] + [min(done, key=done.get) if done else "-"])
    lines = [render_table(["shape", "M"] + [f"{v} us" for v in variants] + ["fastest"], body), ""]
    for s in summary:
        m, top = s["dequant_faster_from_m"], max(s["measured_m"], default=0)
        lines.append(f"{s['shape']}: dequant is faster from M = {m} on; GEMV wins up to M = {s['gemv_max_m']}" if m
                     else f"{s['shape']}: dequant never stays faster, up to M = {top}")
    lines.append(f"planner.GEMV_MAX_M is {planner.GEMV_MAX_M} (auto runs the GEMV kernels for M <= GEMV_MAX_M)")
    return "\n".join(lines)


def git_commit() -> str | None:
    """The commit measured: JAXGEMV_COMMIT if set (a copy without .git, as on a lent GPU
    machine), else the checkout's HEAD."""
    if os.environ.get("JAXGEMV_COMMIT"):
        return os.environ["JAXGEMV_COMMIT"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        run = lambda *a: subprocess.run(["git", *a], cwd=here, capture_output=True, text=True, timeout=10)  # noqa: E731
        head = run("rev-parse", "--short", "HEAD")
        if head.returncode:
            return None
        dirty = run("status", "--porcelain", "--untracked-files=no").stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def plot(rows: list[dict], path: str) -> None:
    """Roofline-style picture: achieved TB/s against bytes per product, with the measured ceiling."""
    import matplotlib  # optional dependency, checked in main()

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    done = [r for r in rows if "tbps" in r]
    for fam in dict.fromkeys(r["variant"].split()[0] for r in done):
        pts = [r for r in done if r["variant"].split()[0] == fam]
        ax.scatter([r["bytes"] for r in pts], [r["tbps"] for r in pts], label=fam, s=18)
    ceil = sorted({(r["bytes"], r["ceiling_tbps"]) for r in done if "ceiling_tbps" in r})
    if ceil:
        ax.plot(*zip(*ceil), "k--", lw=1, label="stream_read ceiling")
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("bytes per product (weight + x + y)")
    ax.set_ylabel("TB/s")
    ax.set_title(f"jaxgemv, cold weights, {jax.devices()[0].device_kind}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=130, bbox_inches="tight")
    plt.close(fig)


# ----------------------------------------------------------------------------------------------
# CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m jaxgemv.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", metavar="SHAPE",
                   help=f"names ({', '.join(NAMED_SHAPES)}, all), NxK or N,K; default: all on GPU, "
                        f"{' '.join(CPU_SHAPES)} on CPU")
    p.add_argument("--m", help="rows of x, comma-separated (default 1,2,4,8,16; CPU 1,4)")
    p.add_argument("--format", default="nvfp4", choices=sorted(FORMATS))
    p.add_argument("--variant", default="auto", help=f"comma-separated from {', '.join(ALL_VARIANTS)} "
                                                     "(the format's planner rejects what it lacks)")
    p.add_argument("--dtype", default="f16", choices=sorted(DTYPES), help="activation dtype (default f16)")
    p.add_argument("--l2-mb", type=float, default=60.0, help="L2 size; copies exceed 3x it (default 60)")
    p.add_argument("--copies", type=int, help="weight copies R (default: from --l2-mb on GPU, 2 on CPU)")
    p.add_argument("--rounds", type=int, help="passes over the copies per call (default 8 on GPU, 1 on CPU)")
    p.add_argument("--batches", type=int, default=7, help="timed batches (default 7)")
    p.add_argument("--min-batch-ms", type=float, default=20.0, help="minimum batch length (default 20)")
    p.add_argument("--warm", action="store_true", help="also time with one weight copy (L2-resident if it fits)")
    p.add_argument("--no-baselines", action="store_true", help="skip XLA's dot and dequantize-then-dot")
    p.add_argument("--crossover", action="store_true", help="find the M where dequant beats the GEMVs")
    p.add_argument("--trace", action="store_true",
                   help="GPU: also each product's kernel time and idle gaps, from one batch under jax.profiler")
    p.add_argument("--kinds", action="store_true",
                   help="with --trace: after the table, each row's kinds of kernel and their us (what kern us sums)")
    p.add_argument("--json", metavar="PATH", help="write every row and the run's metadata")
    p.add_argument("--plot", metavar="PATH.png", help="draw TB/s against bytes (needs matplotlib)")
    return p


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    gpu = device.platform != "cpu"
    fmt = FORMATS[args.format]
    try:
        default = CROSSOVER_SHAPES if args.crossover and gpu else (fmt.shapes or ["all"]) if gpu else CPU_SHAPES
        shapes = parse_shapes(args.shapes or default, fmt.check)
        ms = parse_ints(args.m, "--m") if args.m else (CROSSOVER_MS if args.crossover else GPU_MS if gpu else CPU_MS)
        variants = CROSSOVER_VARIANTS if args.crossover else tuple(args.variant.split(","))
        for v in variants:
            if v not in ALL_VARIANTS:
                raise ValueError(f"bad variant {v!r}: expected one of {', '.join(ALL_VARIANTS)}")
        for name in ("copies", "rounds", "batches"):
            if getattr(args, name) is not None and getattr(args, name) < 1:
                raise ValueError(f"--{name} must be at least 1")
    except ValueError as e:
        parser.error(str(e))
    if args.kinds and not args.trace:
        parser.error("--kinds needs --trace (the kinds come from the profiler's batch)")
    if args.plot and importlib.util.find_spec("matplotlib") is None:  # fail before a long run, not after
        parser.error("--plot needs matplotlib: pip install matplotlib")
    if gpu and not jaxgemv.HAS_CUDA:
        parser.error("jaxgemv was built without CUDA handlers; rebuild with nvcc on PATH or set JAX_PLATFORMS=cpu")

    ctx = Ctx(facts=facts_of(device), gpu=gpu, ceiling=gpu and not args.crossover,
              dtype=DTYPES[args.dtype], l2_bytes=int(args.l2_mb * 2**20), rounds=args.rounds or (8 if gpu else 1),
              batches=args.batches, min_batch_s=args.min_batch_ms / 1e3, copies=args.copies,
              baselines=not args.no_baselines, warm=args.warm and not args.crossover, trace=args.trace and gpu,
              device_id=getattr(device, "local_hardware_id", None) or 0)
    ctx.cases = len(shapes) * len(ms) * len(variants)
    ctx.log(f"{device.device_kind}, jax {jax.__version__}, {len(shapes)} shapes, M {ms}, variants {variants}: "
            f"{ctx.cases} cases")
    rows = []
    for label, n, k in shapes:
        rows += bench_shape(ctx, fmt, label, n, k, ms, variants, crossover=args.crossover)
    summary = crossover_summary(rows) if args.crossover else None

    if args.json:
        meta = dict(device_kind=device.device_kind, platform=device.platform, jax_version=jax.__version__,
                    git_commit=git_commit(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                    argv=list(sys.argv[1:] if argv is None else argv), l2_mb=args.l2_mb, rounds=ctx.rounds,
                    batches=args.batches, min_batch_ms=args.min_batch_ms,
                    gemv_max_m=planner.GEMV_MAX_M, has_cuda=jaxgemv.HAS_CUDA,
                    env={k: v for k, v in os.environ.items() if k.startswith(("JAXGEMV_", "XLA_FLAGS"))})
        with open(args.json, "w") as f:
            json.dump(dict(meta=meta, rows=rows, crossover=summary), f, indent=1)
    if args.plot and not args.crossover:
        plot(rows, args.plot)
    print(crossover_table(rows, summary) if args.crossover else results_table(rows, ctx.warm))
    kinds = kinds_lines(rows) if args.kinds else []
    if kinds:
        print("\n".join(kinds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
