"""One product on 1 GPU and tensor-parallel over D GPUs of this host, timed cold the benchmark's way.

    python tools/multi_gpu.py                                   # lm_head 248320 x 2048, M = 4, NVFP4, D = 2
    python tools/multi_gpu.py --shape 151936x2048 --m 1,4 --format fp8 --layout n,k

Layout n (column-parallel): every weight leaf whose leading dimension is N is sharded on it,
x is replicated, each GPU computes its slice of y and nothing is communicated. Layout k
(row-parallel): the weight's K-carrying leaves and x are sharded on K, and the partial products
are summed across the GPUs (an all-reduce, inside the timed region). Weight copies are rotated
so that each GPU's share of them passes 3 x L2, as in `python -m jaxgemv.bench`. The sharded
result is also checked against the 1-GPU one.
"""

from __future__ import annotations

import argparse
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxgemv import bench
from jaxgemv.device import facts_of


def leaf_specs(w, n: int, k: int, layout: str):
    """PartitionSpecs of the weight's leaves: N-leading leaves split on N (layout n), or the
    leaves whose last axis runs along K split on it (layout k; scalars and the rest replicated)."""

    def spec(leaf):
        if layout == "n":
            return P("tp") if leaf.ndim >= 1 and leaf.shape[0] == n else P()
        if leaf.ndim == 2 and leaf.shape[0] == n:  # [N, K / values per byte], [N, K / block]
            return P(None, "tp")
        if leaf.ndim == 3 and leaf.shape[0] == n:  # MatMulNBits packed [N, blocks, bytes]
            return P(None, "tp", None)
        return P()

    return jax.tree_util.tree_map(spec, w)


def time_case(ctx, fmt, n: int, k: int, m: int, devices, layout: str):
    mesh = Mesh(np.array(devices), ("tp",))
    dtype = jnp.dtype(fmt.act_dtype or ctx.dtype)
    per_device = fmt.weight_bytes(n, k) / len(devices)
    copies = max(4, math.ceil(3 * ctx.l2_bytes / per_device))
    make = jax.jit(lambda key: fmt.random_weight(key, n, k))
    specs = leaf_specs(jax.eval_shape(make, jax.random.key(0)), n, k, layout)
    shardings = jax.tree_util.tree_map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))
    ws = [jax.device_put(make(jax.random.fold_in(jax.random.key(1), i)), shardings) for i in range(copies)]
    x_spec = P(None, "tp") if layout == "k" and len(devices) > 1 else P()
    x = jax.device_put(jax.random.normal(jax.random.key(m), (m, k), dtype), NamedSharding(mesh, x_spec))
    op = lambda x, w: fmt.matmul(x, w, "auto")  # noqa: E731
    t = bench.time_products(ctx, op, x, ws)
    y = np.asarray(jax.jit(op)(x, ws[0]), np.float32)
    return t, y


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="248320x2048")
    p.add_argument("--m", default="4")
    p.add_argument("--format", default="nvfp4", choices=sorted(bench.FORMATS))
    p.add_argument("--devices", type=int, default=2)
    p.add_argument("--layout", default="n", help="comma-separated from n (column-parallel), k (row-parallel)")
    p.add_argument("--l2-mb", type=float, default=60.0)
    args = p.parse_args(argv)
    (label, n, k), = bench.parse_shapes([args.shape])
    ms = bench.parse_ints(args.m, "--m")
    layouts = args.layout.split(",")
    if not set(layouts) <= {"n", "k"}:
        p.error("--layout: expected n, k or n,k")
    gpus = jax.devices()  # the default backend: the GPUs where there are any
    if len(gpus) < args.devices:
        print(f"needs {args.devices} GPUs, found {len(gpus)}", file=sys.stderr)
        return 2
    fmt = bench.FORMATS[args.format]
    ctx = bench.Ctx(facts=facts_of(gpus[0]), gpu=True, ceiling=False, dtype=jnp.float16,
                    l2_bytes=int(args.l2_mb * 2**20), rounds=8, batches=7, min_batch_s=0.02, copies=None,
                    baselines=False, warm=False)
    rows = []
    for m in ms:
        one, y_ref = time_case(ctx, fmt, n, k, m, gpus[:1], "n")
        for layout in layouts:
            many, y = time_case(ctx, fmt, n, k, m, gpus[: args.devices], layout)
            rel = float(np.linalg.norm(y - y_ref) / np.linalg.norm(y_ref))
            rows.append([label, m, fmt.name, layout, f"{one.us:.1f}", f"{many.us:.1f}", f"{many.us / one.us:.2f}",
                         f"{rel:.1e}"])
            ctx.log(f"{label} M={m} {layout}: 1 GPU {one.us:.1f} us, {args.devices} GPUs {many.us:.1f} us, rel {rel:.1e}")
    header = ["shape", "M", "format", "layout", "1 GPU us", f"{args.devices} GPUs us", "ratio", "rel diff"]
    print(bench.render_table(header, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
