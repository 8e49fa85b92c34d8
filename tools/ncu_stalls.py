"""Where a profiled kernel's warps stall: the per-instruction CSV of Nsight Compute, summed.

    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > kernel-sass.csv
    python3 tools/ncu_stalls.py kernel-sass.csv [--top 12]

Prints the stall reasons' shares of all warp samples (the "stall_*" columns, issued samples
included: "selected" is a warp issuing), then the instructions that hold the most samples with
their two largest reasons, so that a wait can be tied to the instruction it sits on (entry 71 of
docs/perf-log.md found a multiply that waited on a load ahead of the first weight copy this way).
tools/device_run.sh runs it on every JAXGEMV_PROFILE case.
"""

import argparse
import collections
import csv
import sys


def summarize(path: str, top: int) -> None:
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        print(f"{path}: {e.strerror}")
        return
    # Row 0 names the kernel, row 1 holds the column names, the rest one instruction each.
    if len(rows) < 3:
        print(f"{path}: no instructions")
        return
    header = rows[1]
    reasons = [i for i, h in enumerate(header) if h.startswith("stall_") and "(Not Issued)" not in h]
    if not reasons or "Source" not in header:
        print(f"{path}: no stall_* columns (profile with the SourceCounters section)")
        return
    source = header.index("Source")
    totals: collections.Counter = collections.Counter()
    per_instruction = []
    for row in rows[2:]:
        if len(row) < len(header):
            continue
        counts = {header[i][len("stall_"):]: float(row[i] or 0) for i in reasons}
        totals.update(counts)
        per_instruction.append((sum(counts.values()), row[0][-6:], row[source].strip(), counts))
    total = sum(totals.values())
    print(f"{rows[0][1] if len(rows[0]) > 1 else path}")
    if total == 0:
        print("  no samples")
        return
    print(f"  {int(total)} samples: " + ", ".join(f"{k} {v / total:.0%}" for k, v in totals.most_common(9)))
    per_instruction.sort(key=lambda r: -r[0])
    for samples, address, text, counts in per_instruction[:top]:
        reasons_top = ", ".join(f"{k} {int(v)}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])[:2] if v)
        print(f"  {samples / total:5.1%}  {address}  {text[:60]:<60}  {reasons_top}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="+", help="per-instruction CSV files (ncu --page source --csv --print-source sass)")
    p.add_argument("--top", type=int, default=12, help="instructions to list (default 12)")
    args = p.parse_args(argv)
    for path in args.csv:
        summarize(path, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
