"""Wall time of one product called on its own, where the FFI handler runs on every call.

Inside a jitted model XLA's command buffers run a handler once, when they capture it; a product
called eagerly, or jitted alone (fewer ops than a command buffer takes), runs its handler each
time, and the handler's host work (the planner's launch decisions, the occupancy queries, the
launch) adds to every call. This times such calls: `latency`, each call waited for before the
next; `issue`, the calls issued back to back with one wait at the end (the host's cost per call
when the device keeps up). Each setting runs in a process of its own, since the launch knobs are
read once per process:

    python3 tools/host_overhead.py --settings JAXGEMV_OCCUPANCY_CACHE=0 JAXGEMV_OCCUPANCY_CACHE=1

A setting may be given more than once (alternating two of them shows how much the order of the
processes moves the numbers); each process gets a column of its own.

Runs on CPU too (the CPU handlers; no occupancy queries there; `--cases nvfp4:1:256:256` keeps
it short).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

CASES = ["nvfp4:1:4096:4096", "nvfp4:4:4096:4096", "fp8:1:4096:4096", "int4:1:4096:4096", "int4:4:12288:4096",
         "nvfp4:1:248320:2048"]


FORMATS = ("nvfp4", "fp8", "int4", "int8")


def parse_case(case: str) -> tuple[str, int, int, int]:
    fmt, m, n, k = case.split(":")
    if fmt not in FORMATS:
        raise ValueError(f"case {case!r}: format must be one of {', '.join(FORMATS)}")
    return fmt, int(m), int(n), int(k)


def one_process(cases: list[str], calls: int, rounds: int) -> list[dict]:
    import jax
    import jax.numpy as jnp

    from jaxgemv import bench

    key = jax.random.PRNGKey(0)
    rows = []
    for fmt, m, n, k in map(parse_case, cases):
        spec = bench.FORMATS[fmt]  # the benchmark's layouts and random weights
        dtype = spec.act_dtype or jnp.float16
        qw = spec.random_weight(key, n, k, dtype)
        x = jax.random.normal(jax.random.fold_in(key, 1), (m, k), jnp.float32).astype(dtype)
        f = jax.jit(lambda x, w, matmul=spec.matmul: matmul(x, w, "auto"))
        f(x, qw).block_until_ready()
        latency, issue = [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(calls):
                f(x, qw).block_until_ready()
            latency.append((time.perf_counter() - t0) / calls * 1e6)
            t0 = time.perf_counter()
            ys = [f(x, qw) for _ in range(calls)]
            jax.block_until_ready(ys)
            issue.append((time.perf_counter() - t0) / calls * 1e6)
        rows.append({"case": f"{fmt} M={m} {n}x{k}", "latency": statistics.median(latency),
                     "issue": statistics.median(issue)})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="*", default=[""],
                   help="NAME=VALUE[,NAME=VALUE] per process ('' for the environment as it is)")
    p.add_argument("--cases", nargs="*", default=CASES, help="FORMAT:M:N:K, FORMAT nvfp4, fp8, int4 or int8")
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    for case in args.cases:
        parse_case(case)
    if args.child:
        print(json.dumps(one_process(args.cases, args.calls, args.rounds)))
        return 0
    results = {}  # one column per process, in order; a setting given twice (to alternate) gets "#2"
    for setting in args.settings:
        env = dict(os.environ)
        for item in filter(None, setting.split(",")):
            name, _, value = item.partition("=")
            env[name] = value
        out = subprocess.run([sys.executable, __file__, "--child", "--calls", str(args.calls), "--rounds",
                              str(args.rounds), "--cases", *args.cases], env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stderr, file=sys.stderr)
            return out.returncode
        label = setting or "(as set)"
        runs = sum(1 for key in results if key == label or key.startswith(label + " #"))
        results[label if runs == 0 else f"{label} #{runs + 1}"] = json.loads(out.stdout.strip().splitlines()[-1])
    width = max(26, *(len(s) for s in results))
    print(f"{'case':28s} " + " ".join(f"{s:>{width}s}" for s in results))
    print(f"{'':28s} " + " ".join(f"{'latency / issue us':>{width}s}" for _ in results))
    for i, row in enumerate(next(iter(results.values()))):
        cells = [f"{r[i]['latency']:12.1f} / {r[i]['issue']:9.1f}" for r in results.values()]
        print(f"{row['case']:28s} " + " ".join(f"{c:>{width}s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
