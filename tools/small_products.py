"""Cold device time of small products, kernel by kernel, from Nsight Compute.

Products of a few KB to a few MB are too short to time from the host (launch gaps and the
benchmark's flush subtraction are as large as they are). Nsight Compute flushes every cache
before each kernel it profiles (`--cache-control all`), so its duration of each kernel is a cold
one, measured on the device. This script runs each case's product once to compile and warm up,
then REPEATS times between two marker kernels (a 16-byte stream_read); `--report`
reads Nsight Compute's CSV back, sums the durations of the kernels each product launched (XLA's
dot may be several: a split-K GEMV and its reduction, a convert) and prints the table.

    ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum --csv \\
        python3 tools/small_products.py --cases cases.json --format dense \\
        --shapes 1x2048 32x2048 1024x4096 --m 1,8 --variant splitk,xla > kernels.csv
    python3 tools/small_products.py --report kernels.csv --cases cases.json

The streaming-read ceiling for the same bytes, measured the same way: `--reads` runs the read
kernel on a buffer of each case's bytes, REPEATS times per case and nothing else between them
(so no markers are needed); give its CSV to the report with `--reads-report` for a "read us"
column and each product's time over it.

    ncu ... --csv python3 tools/small_products.py --cases cases.json --reads > reads.csv
    python3 tools/small_products.py --report kernels.csv --reads-report reads.csv --cases cases.json

Without a GPU the run mode works (no markers) so that its cases can be checked anywhere.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import pathlib
import statistics
import sys

import jax
import jax.numpy as jnp

from jaxgemv import bench

MARKER = "StreamReadKernel"  # the marker kernel's name as Nsight Compute prints it (a substring)
REPEATS = 3


def run(args) -> int:
    fmt = bench.FORMATS[args.format]
    gpu = jax.devices()[0].platform == "gpu"
    marker_buf = jnp.zeros((16,), jnp.uint8)
    marker = jax.jit(bench.stream_read) if gpu else None
    cases = []
    for label, n, k in bench.parse_shapes(args.shapes, fmt.check):
        w = jax.jit(lambda key: fmt.random_weight(key, n, k, jnp.dtype(fmt.act_dtype or jnp.float16)))(jax.random.key(n + k))
        for m in bench.parse_ints(args.m, "--m"):
            x = jax.random.normal(jax.random.key(m), (m, k), jnp.dtype(fmt.act_dtype or jnp.float16))
            for variant in args.variant.split(","):
                if variant == "xla-dot":
                    f = jax.jit(bench.dense_dot)
                    wx = jax.random.normal(jax.random.key(1), (n, k), x.dtype)
                else:
                    try:
                        fmt.plan(m, n, k, bench.facts_of(jax.devices()[0]), variant)
                    except ValueError as e:
                        print(f"skip {label} M={m} {variant}: {e}", file=sys.stderr)
                        continue
                    f = jax.jit(lambda x, w, v=variant: fmt.matmul(x, w, v))
                    wx = w
                jax.block_until_ready(f(x, wx))  # compile and warm up: not counted
                if marker:
                    jax.block_until_ready(marker(marker_buf))
                for _ in range(REPEATS):
                    jax.block_until_ready(f(x, wx))
                if marker:
                    jax.block_until_ready(marker(marker_buf))
                cases.append(dict(shape=label, n=n, k=k, m=m, format=fmt.name, variant=variant,
                                  bytes=bench.case_bytes(fmt, n, k, m, x.dtype.itemsize)))
    with open(args.cases, "w") as out:
        json.dump(dict(repeats=REPEATS, cases=cases), out, indent=1)
    print(f"{len(cases)} cases -> {args.cases}", file=sys.stderr)
    return 0


def run_reads(args) -> int:
    """The read kernel on each case's byte count, REPEATS times, cases in order."""
    meta = json.loads(pathlib.Path(args.cases).read_text())
    read = jax.jit(bench.stream_read)
    for case in meta["cases"]:
        buf = jnp.zeros((-(-case["bytes"] // 16) * 16,), jnp.uint8)
        for _ in range(REPEATS + 1):  # the first compiles and warms up: dropped in the report
            jax.block_until_ready(read(buf))
    print(f"{len(meta['cases'])} reads", file=sys.stderr)
    return 0


def read_times(text: str, cases: int) -> list[float]:
    """Median read time per case from a --reads run's CSV (the first launch of each dropped)."""
    rows = [us for name, us in kernel_rows(text) if MARKER in name]
    per = REPEATS + 1
    if len(rows) != per * cases:
        print(f"warning: {len(rows)} read kernels for {cases} cases", file=sys.stderr)
    return [statistics.median(rows[i * per + 1 : (i + 1) * per]) for i in range(len(rows) // per)]


def short_name(kernel: str) -> str:
    """A kernel's name as Nsight Compute or the profiler prints it, without return type, template
    arguments and parameters."""
    return kernel.split("(")[0].split("<")[0].removeprefix("void ")


# Nsight Compute's units, to microseconds for times and to bytes for sizes (it prints "nsecond" or
# "ns" by version and setting); any other unit's values are kept as printed.
UNIT_SCALE = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6,
              "s": 1e6, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def kernel_metrics(text: str) -> list[tuple[str, dict[str, float]]]:
    """(kernel name, {metric: value}) per profiled kernel, in launch order, from ncu --csv (times in
    us, sizes in bytes: UNIT_SCALE)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    kernels: dict[str, tuple[str, dict[str, float]]] = {}
    for r in csv.DictReader(io.StringIO("\n".join(lines))):
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except ValueError:  # a metric the device does not have ("n/a")
            continue
        name, metrics = kernels.setdefault(r["ID"], (r["Kernel Name"], {}))
        metrics[r["Metric Name"]] = value * UNIT_SCALE.get(r.get("Metric Unit", ""), 1.0)
    return list(kernels.values())


def kernel_rows(text: str) -> list[tuple[str, float]]:
    """(kernel name, duration in us) per profiled kernel, in launch order, from ncu --csv."""
    return [(name, m["gpu__time_duration.sum"]) for name, m in kernel_metrics(text) if "gpu__time_duration.sum" in m]


def timed_groups(rows: list[tuple[str, float]]) -> list[list[tuple[str, float]]]:
    """The kernels between each pair of markers: one case's timed repeats each (what lies
    between a closing marker and the next opening one is a warm-up, with any autotuning)."""
    at = [i for i, (name, _) in enumerate(rows) if MARKER in name]
    return [rows[a + 1 : b] for a, b in zip(at[0::2], at[1::2])]


def report(args) -> int:
    meta = json.loads(pathlib.Path(args.cases).read_text())
    with open(args.report) as f:
        groups = timed_groups(kernel_rows(f.read()))
    reads = []
    if args.reads_report:
        with open(args.reads_report) as f:
            reads = read_times(f.read(), len(meta["cases"]))
    out = []
    for i, (case, group) in enumerate(zip(meta["cases"], groups)):
        per_run, left = divmod(len(group), meta["repeats"])
        if left or not per_run:
            print(f"warning: {case['shape']} M={case['m']} {case['variant']}: {len(group)} kernels for "
                  f"{meta['repeats']} runs", file=sys.stderr)
            continue
        runs = [group[i * per_run : (i + 1) * per_run] for i in range(meta["repeats"])]
        totals = [sum(us for _, us in run_) for run_ in runs]
        names = sorted({short_name(name)[-40:] for name, _ in runs[0]})
        us = statistics.median(totals)
        read = [f"{reads[i]:.2f}", f"{us / reads[i]:.2f}"] if i < len(reads) else []
        out.append([case["shape"], case["m"], case["variant"], per_run, f"{us:.2f}", f"{case['bytes'] / us / 1e6:.3g}",
                    *read, " + ".join(names)])
    if len(groups) != len(meta["cases"]):
        print(f"warning: {len(groups)} marker groups for {len(meta['cases'])} cases", file=sys.stderr)
    read_cols = ["read us", "x read"] if reads else []
    print(bench.render_table(["shape", "M", "variant", "kernels", "us (sum, cold)", "TB/s", *read_cols, "kernels"], out))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="cases.json", help="where run mode writes, and report mode reads, the cases")
    p.add_argument("--report", metavar="CSV", help="read ncu's CSV and print the table instead of running")
    p.add_argument("--reads", action="store_true", help="run the read kernel on each case's bytes (cases from --cases)")
    p.add_argument("--reads-report", metavar="CSV", help="with --report: ncu's CSV of a --reads run")
    p.add_argument("--format", default="dense", choices=sorted(bench.FORMATS))
    p.add_argument("--shapes", nargs="+", default=["1x2048", "32x2048", "128x4096", "1024x4096"])
    p.add_argument("--m", default="1,8")
    p.add_argument("--variant", default="splitk,xla",
                   help="comma-separated variants of the format, and xla-dot (XLA's dot on a dense weight)")
    args = p.parse_args(argv)
    if args.report:
        return report(args)
    return run_reads(args) if args.reads else run(args)


if __name__ == "__main__":
    sys.exit(main())
