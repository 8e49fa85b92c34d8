"""Where a profiled kernel's warps stall: the per-instruction CSV of Nsight Compute, summed.

    ncu --import REPORT.ncu-rep --page source --csv --print-source sass > kernel-sass.csv
    python3 tools/ncu_stalls.py kernel-sass.csv [--top 12]

Prints the stall reasons' shares of all warp samples (the "stall_*" columns, issued samples
included: "selected" is a warp issuing), then the instructions that hold the most samples with
their two largest reasons, so that a wait can be tied to the instruction it sits on (entry 71 of
docs/perf-log.md found a multiply that waited on a load ahead of the first weight copy this way).
tools/device_run.sh runs it on every JAXGEMV_PROFILE case.

Where the CSV has the executed-instruction and request counters (the SourceCounters section),
it adds what the loop executes per 16 HMMA (one K window of a 16-row tile in the tensor-core
GEMV: its instruction count, against the issue slots the read allows a window, perf log 109) with
the opcode mix, and L1 tag requests by opcode: the weight copies (LDGSTS) bypass L1 and count as
misses, so the headline L1 hit rate understates how often x's loads (LDG) hit.
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
    for line in executed(header, rows[2:]):
        print(line)


def _opcode(text: str) -> str:
    """The opcode of a SASS line, without its predicate and modifiers ("@!P0 LDG.E.128 ..." -> LDG)."""
    words = text.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def _number(value: str) -> float:
    try:
        return float(value.replace(",", ""))
    except ValueError:
        return 0.0


def executed(header: list, rows: list) -> list:
    """Lines on the executed instructions per 16 HMMA and the L1 tag requests by opcode, or none
    where the CSV lacks those columns or the kernel runs no HMMA."""
    if "Instructions Executed" not in header or "Source" not in header:
        return []
    source, count = header.index("Source"), header.index("Instructions Executed")
    tags = header.index("L1 Tag Requests Global") if "L1 Tag Requests Global" in header else None
    ops: collections.Counter = collections.Counter()
    requests: collections.Counter = collections.Counter()
    for row in rows:
        if len(row) < len(header):
            continue
        op = _opcode(row[source])
        ops[op] += _number(row[count])
        if tags is not None:
            requests[op] += _number(row[tags])
    if not ops["HMMA"]:
        return []
    window = ops["HMMA"] / 16
    mix = ", ".join(f"{op} {n / window:.0f}" for op, n in ops.most_common(8))
    lines = [f"  executed per 16 HMMA: {sum(ops.values()) / window:.0f} ({mix})"]
    if sum(requests.values()):
        lines.append("  L1 tag requests: " + ", ".join(f"{op} {n:.0f}" for op, n in requests.most_common(4) if n))
    return lines


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
