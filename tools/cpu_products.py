"""The quantized products on the CPU platform: the C++ handler (variant "cpu") against
decode-then-dot (XLA's dot on the decoded weight) and XLA's bf16 dot on the dense weight, the
numbers behind the planner's CPU_HANDLER_MAX_M. Wall-clock ms per call, best of --repeats, weights
resident (the CPU has no cold/warm distinction worth drawing here).

    python3 tools/cpu_products.py --shapes 4096x4096 --m 1,8,16,64 [--threads N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4096x4096"], help="N x K")
    p.add_argument("--m", default="1,8,16,64", help="rows of x, comma-separated")
    p.add_argument("--formats", default="nvfp4,fp8,int4,int8")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="JAXGEMV_CPU_THREADS for this process (0: the machine's)")
    args = p.parse_args(argv)
    if args.threads:
        os.environ["JAXGEMV_CPU_THREADS"] = str(args.threads)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

    import jax
    import numpy as np

    def best(f, *a):
        f(*a).block_until_ready()
        ts = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            f(*a).block_until_ready()
            ts.append(time.perf_counter() - t)
        return min(ts) * 1e3

    formats = args.formats.split(",")
    # On the CPU platform whatever the default device is (a test process may hold a GPU).
    with jax.default_device(jax.devices("cpu")[0]):
        return _table(args, formats, best, np.random.default_rng(0))


def _table(args, formats, best, rng) -> int:
    import jax
    import jax.numpy as jnp

    from jaxgemv import bench

    print(f"{'shape':>12} {'M':>3} {'bf16 dot':>9}  " + "  ".join(f"{f + ' cpu/dequant':>20}" for f in formats))
    key = jax.random.PRNGKey(0)
    for shape in args.shapes:
        n, k = (int(v) for v in shape.split("x"))
        wd = jax.random.normal(key, (n, k), jnp.bfloat16)
        # The benchmark's layouts and random weights (int4 / int8: blocks of 32, bf16 scales).
        qs = {f: bench.FORMATS[f].random_weight(key, n, k, jnp.bfloat16) for f in formats}
        dot = jax.jit(lambda x, w: jnp.dot(x, w.T, preferred_element_type=jnp.float32).astype(x.dtype))
        for m in (int(v) for v in args.m.split(",")):
            x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
            cells = []
            for f in formats:
                prod = bench.FORMATS[f].matmul
                ms = [best(jax.jit(lambda x, q, v=v: prod(x, q, v)), x, qs[f]) for v in ("cpu", "dequant")]
                cells.append(f"{ms[0]:>9.2f} / {ms[1]:>8.2f}")
            print(f"{shape:>12} {m:>3} {best(dot, x, wd):>9.2f}  " + "  ".join(f"{c:>20}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
