"""Times jaxgemv.decode_attention against XLA's path (decode_attention_reference) per layer.

Each case runs `layers` attentions in one jitted call, each on its own pair of caches (as a
model's layers do, so that the caches are not all L2-resident when they outgrow it), with the
caches donated so that both paths update them in place. Reports microseconds per attention
(host time over the call, launch gaps included) and the cache bytes each reads (positions 0..pos
of k and v) per microsecond.

    python tools/attention_bench.py                           # Qwen3-8B heads, a few contexts
    python tools/attention_bench.py --batch 1,8 --pos 39,1023,8191
    python tools/attention_bench.py --trace     # also the device trace: kernel time per layer

With --trace each case also runs once under jax.profiler, and the device timeline gives per layer
the time some kernel ran (busy, the bench's own concatenate included for every variant alike),
the kernels per layer and, for the kernel variant, the attention kernel's own mean duration,
without host or launch overheads (the caches as the loop leaves them: L2-resident at short
positions, cold at long ones).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxgemv


def _ints(text):
    return [int(v) for v in text.split(",")]


def _trace(run, args, layers):
    """(busy us per layer, kernels per layer, attention kernel us each or None) of one traced call."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from decode_profile import summarize, traced_events  # noqa: E402 (tools/ is not a package)

    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            out = run(*args)
            jax.block_until_ready(out)
        events = traced_events(trace_dir)
    if not events:
        return None, out
    s = summarize(events, steps=layers)
    own = [d for name, _, d, _ in events if "DecodeAttention" in name]
    return (s["busy_ms"] * 1e3, s["kernels"], sum(own) / 1e3 / len(own) if own else None), out


def time_case(variant, batch, pos, heads, kv_heads, head_dim, layers, repeats, dtype=jnp.float16, trace=False):
    t = pos + 1
    rng = np.random.default_rng(0)
    qkv = jnp.asarray(rng.standard_normal((batch, (heads + 2 * kv_heads) * head_dim)), dtype)
    caches = [jnp.asarray(rng.standard_normal((batch, kv_heads, t, head_dim)), dtype) for _ in range(2 * layers)]

    @functools.partial(jax.jit, donate_argnums=1)
    def run(qkv, caches, p):
        out, new = qkv, []
        for i in range(layers):
            o, k, v = jaxgemv.decode_attention(out, caches[2 * i], caches[2 * i + 1], p, heads=heads,
                                               kv_heads=kv_heads, rope_theta=1e6, variant=variant)
            out = jnp.concatenate([o, out[:, heads * head_dim:]], axis=1)  # the next layer's qkv
            new += [k, v]
        return out, new

    p = jnp.int32(pos)
    out, caches = run(qkv, caches, p)
    out.block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out, caches = run(qkv, caches, p)
        out.block_until_ready()
        times.append((time.perf_counter() - start) * 1e6 / layers)
    traced = None
    if trace:
        traced, (out, caches) = _trace(run, (qkv, caches, p), layers)
    return statistics.median(times), traced


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=_ints, default=[1, 8])
    parser.add_argument("--pos", type=_ints, default=[39, 1023, 4095, 16383], help="positions (T = pos + 1)")
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=36)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--trace", action="store_true", help="also the device trace's kernel time per layer")
    parser.add_argument("--variants", default="kernel,xla",
                        help="decode_attention variants (auto takes XLA's path past AUTO_KERNEL_MAX_LEN positions)")
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    head = f"{'batch':>5} {'pos':>6} " + " ".join(f"{v + ' us':>10}" for v in variants)
    if args.trace:
        head += " " + " ".join(f"{v + ' busy':>11} {'kernels':>7}" for v in variants) + f" {'kernel us':>9}"
    print(head + f" {'GB/s (' + variants[0] + ')':>14}")
    for batch in args.batch:
        for pos in args.pos:
            res = [time_case(v, batch, pos, args.heads, args.kv_heads, args.head_dim, args.layers, args.repeats,
                             trace=args.trace) for v in variants]
            read = 2 * batch * args.kv_heads * (pos + 1) * args.head_dim * 2
            line = f"{batch:>5} {pos:>6} " + " ".join(f"{u:10.2f}" for u, _ in res)
            if args.trace:
                own = None
                for _, tr in res:
                    if tr is None:
                        line += f" {'-':>11} {'-':>7}"
                    else:
                        line += f" {tr[0]:11.2f} {tr[1]:7.1f}"
                        own = tr[2] if tr[2] is not None else own
                line += f" {own:9.2f}" if own is not None else f" {'-':>9}"
            print(line + f" {read / res[0][0] / 1e3:14.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
