"""Where a decode step's time goes: the device timeline of examples/decode.py's jitted loop.

Runs `steps` greedy steps of the decode loop under jax.profiler and reads the device trace back
(jax.profiler.ProfileData): per step, the wall time, the span from the first kernel's start to the
last kernel's end, the time some kernel was running (busy) and the idle gaps between kernels; then
the kernels grouped by kind (jaxgemv's GEMVs by format, XLA's fusions by HLO op name with digits
dropped), with count and time per step.

    python tools/decode_profile.py --config 8b --formats nvfp4,bf16 --batch 1 --dtype f16

With --floor, then the read floor of each quantized format's step in the same process: a jitted
loop of the same shape (`steps` iterations, each reading every layer's projections in the step's
order and then lm_head, one buffer per weight so every read is cold) whose kernels are the
streaming-read kernel of the benchmark's ceiling alone, each waiting on the one before as the
GEMVs do, inside XLA's command buffers as the GEMVs are. Its per-projection times are the floor
that the GEMVs' times above compare with (the perf log's "graph-mode read floor", measured here
instead of interpolated from ../shared/H200-MEASURED.md).

On a machine without a GPU the host timeline has no kernels: it says so and exits 0.
"""

import argparse
import collections
import dataclasses
import functools
import os
import re
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
from jax import lax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode  # noqa: E402
from small_products import short_name  # noqa: E402

from jaxgemv.bench import trace_events  # noqa: E402


# (name, start_ns, duration_ns, stats) of the newest trace under a directory, as the benchmark's
# --trace reads it.
traced_events = trace_events


def kind(name, stats):
    """A short label grouping the kernels of one kind across layers; "(graph)" marks those that
    XLA launched inside a command buffer (a CUDA graph)."""
    graph = " (graph)" if "command_buffer" in str(stats.get("hlo_op", "")) else ""
    if "DecodeAttention" in name:
        return "jaxgemv attention" + graph
    if "Gemv" in name or "gemv" in name:
        m = re.search(r"(Nvfp4|Fp8|Nbits|NBits|Dense)\w*", name)
        return "jaxgemv " + (m.group(1) if m else name[:30]) + graph
    label = re.sub(r"(_\d+)+$", "", short_name(name))
    return label[:40] + graph


def summarize(events, steps, projections=()):
    if not events:
        return None
    first = events[0][1]
    end = max(s + d for _, s, d, _ in events)
    busy = 0.0
    cur_s = cur_e = None
    # Idle gaps grouped by the kernel kinds on either side ("the loop's seams": where time goes
    # between kernels, e.g. between one step's last kernel and the next step's first).
    gaps = collections.defaultdict(lambda: [0, 0.0])
    last = None
    for name, s, d, stats in events:
        e = s + d
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
                g = gaps[(last, kind(name, stats))]
                g[0] += 1
                g[1] += s - cur_e
            cur_s, cur_e = s, e
            last = kind(name, stats)
        elif e > cur_e:
            cur_e, last = e, kind(name, stats)
    busy += cur_e - cur_s
    groups = collections.defaultdict(lambda: [0, 0.0])
    gemvs = 0
    for name, _, d, stats in events:
        label = kind(name, stats)
        if label.startswith("jaxgemv") and "attention" not in label and projections:
            # The step's GEMVs run in a fixed order: label each with its projection.
            label += " " + projections[gemvs % len(projections)]
            gemvs += 1
        g = groups[label]
        g[0] += 1
        g[1] += d
    return {
        "span_ms": (end - first) / 1e6 / steps,
        "busy_ms": busy / 1e6 / steps,
        "kernels": len(events) / steps,
        "groups": sorted(((k, c / steps, t / 1e3 / steps) for k, (c, t) in groups.items()),
                         key=lambda g: -g[2]),
        "gaps": sorted(((f"{a} -> {b}", c / steps, t / 1e3 / steps) for (a, b), (c, t) in gaps.items()),
                       key=lambda g: -g[2]),
    }


LAYER_PROJECTIONS = ("qkv", "o", "gate_up", "down")


def weight_bytes(cfg, fmt):
    """Bytes of each projection's weight in `fmt` (all its arrays): one layer's four, and lm_head."""
    key = jax.random.key(0)
    layer = decode._quantized(decode.init_layer(cfg, key), fmt)
    head = decode._quantized(decode.init_head(cfg, key), fmt)
    size = lambda w: sum(leaf.nbytes for leaf in jax.tree.leaves(w))  # noqa: E731
    return {**{p: size(layer[p]) for p in LAYER_PROJECTIONS}, "lm_head": size(head["lm_head"])}


@functools.partial(jax.jit, static_argnums=2)
def _read_loop(layer_bufs, head_buf, steps):
    from jaxgemv.bench import stream_read

    def body(salt, _):
        for bufs in layer_bufs:
            for buf in bufs:
                salt = stream_read(buf, salt)  # each read waits on the one before, as the GEMVs do
        return stream_read(head_buf, salt), None

    salt, _ = lax.scan(body, jnp.zeros((1,), jnp.uint32), None, length=steps)
    return salt


def read_floor(cfg, fmt, steps, trace_dir):
    """The step's weights read by the streaming-read kernel alone (see the module docstring):
    prints ms per step and, per projection, the read's time against the projection's bytes."""
    if jax.default_backend() != "gpu":
        print(f"\n== read floor, {fmt} weights: needs a GPU (the streaming-read kernel is CUDA)")
        return
    sizes = weight_bytes(cfg, fmt)
    buf = lambda n: jnp.ones((-(-n // 16) * 16,), jnp.uint8)  # noqa: E731
    layer_bufs = [[buf(sizes[p]) for p in LAYER_PROJECTIONS] for _ in range(cfg.layers)]
    head_buf = buf(sizes["lm_head"])
    _read_loop(layer_bufs, head_buf, steps).block_until_ready()
    walls = []
    for _ in range(3):
        start = time.perf_counter()
        _read_loop(layer_bufs, head_buf, steps).block_until_ready()
        walls.append((time.perf_counter() - start) * 1e3 / steps)
    with jax.profiler.trace(trace_dir):
        _read_loop(layer_bufs, head_buf, steps).block_until_ready()
    reads = [e for e in traced_events(trace_dir) if "StreamRead" in e[0]]
    wall = sorted(walls)[1]
    print(f"\n== read floor, {fmt} weights: {wall:.3f} ms/step untraced")
    if not reads:
        print("no kernels in the device trace (no GPU, or no CUPTI)")
        return
    order = [p for _ in range(cfg.layers) for p in LAYER_PROJECTIONS] + ["lm_head"]
    times = collections.defaultdict(list)
    for i, (_, _, d, _) in enumerate(reads):
        times[order[i % len(order)]].append(d / 1e3)
    print(f"{'projection':<12} {'MB':>8} {'reads':>6} {'us each':>8} {'TB/s':>6}")
    for p in order[: len(LAYER_PROJECTIONS)] + ["lm_head"]:
        us = sum(times[p]) / len(times[p])
        print(f"{p:<12} {sizes[p] / 1e6:8.1f} {len(times[p]):6d} {us:8.2f} {sizes[p] / us / 1e6:6.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(decode.CONFIGS), default="tiny")
    parser.add_argument("--formats", type=decode._formats, default=["nvfp4", "bf16"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="bf16")
    parser.add_argument("--attention", choices=("xla", "jaxgemv"), default="jaxgemv",
                        help="the models' attention (examples/decode.py --attention)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="a layer's kernels as five calls (examples/decode.py --no-fuse)")
    parser.add_argument("--top", type=int, default=16, help="kernel kinds listed per format")
    parser.add_argument("--trace-dir", default=None, help="keep the traces here")
    parser.add_argument("--floor", action="store_true",
                        help="then the read floor of each quantized format's step (module docstring)")
    args = parser.parse_args(argv)
    base = dataclasses.replace(decode.CONFIGS[args.config], attention=args.attention, fuse=not args.no_fuse)
    for fmt in args.formats:
        cfg = decode.format_config(base, fmt)  # the dense model keeps XLA's attention
        models = decode.build_models(cfg, [fmt])
        params = models[fmt]
        if args.dtype == "f16":
            params = decode.with_activations(params, jnp.float16)
        # time_decode compiles and warms the loop; the traced run below reuses the executable.
        walls = decode.time_decode(cfg, params, args.batch, args.prompt_len, args.steps)
        prompt = jnp.zeros((args.batch,), jnp.int32)
        cache = decode.init_cache(cfg, args.batch, args.prompt_len + args.steps, params["embed"].dtype)
        pos = jnp.int32(args.prompt_len)
        out, cache = decode.decode_loop(cfg, params, cache, prompt, pos, args.steps)
        out.block_until_ready()
        trace_dir = os.path.join(args.trace_dir, fmt) if args.trace_dir else tempfile.mkdtemp()
        with jax.profiler.trace(trace_dir):
            start = time.perf_counter()
            out, cache = decode.decode_loop(cfg, params, cache, prompt, pos, args.steps)
            out.block_until_ready()
            traced_ms = (time.perf_counter() - start) * 1e3 / args.steps
        # The GEMVs of one step, in launch order: four per layer, then lm_head.
        projections = [p for _ in range(cfg.layers) for p in LAYER_PROJECTIONS] + ["lm_head"]
        s = summarize(traced_events(trace_dir), args.steps, projections)
        wall = sorted(walls)[len(walls) // 2]
        print(f"\n== {fmt} batch {args.batch}: {wall:.3f} ms/step untraced, {traced_ms:.3f} traced")
        if s is None:
            print("no kernels in the device trace (no GPU, or no CUPTI)")
            del models, params, cache
            continue
        gap = s["span_ms"] - s["busy_ms"]
        print(f"per step: span {s['span_ms']:.3f} ms, kernels busy {s['busy_ms']:.3f} ms, "
              f"idle between kernels {gap:.3f} ms over {s['kernels']:.0f} kernels "
              f"({gap * 1e3 / max(s['kernels'], 1):.2f} us each)")
        print(f"{'kind':<50} {'per step':>8} {'us/step':>9} {'us each':>8}")
        for k, c, t in s["groups"][: args.top]:
            print(f"{k:<50} {c:8.1f} {t:9.1f} {t / c:8.2f}")
        print(f"{'idle gaps, between':<70} {'per step':>8} {'us/step':>8} {'us each':>8}")
        for k, c, t in s["gaps"][: args.top]:
            print(f"{k[:70]:<70} {c:8.1f} {t:8.1f} {t / c:8.2f}")
        del models, params, cache
    if args.floor:
        for fmt in args.formats:
            if fmt not in decode.QUANTIZERS:
                continue
            trace_dir = os.path.join(args.trace_dir, fmt + "-floor") if args.trace_dir else tempfile.mkdtemp()
            read_floor(cfg, fmt, args.steps, trace_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
