"""Instruction mix of the main loop of each kernel in a SASS listing (no GPU needed).

    nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_90,code=sm_90 \\
        -I"$(python3 -c 'import jax.ffi; print(jax.ffi.include_dir())')" -Iffi -c ffi/fp4.cu -o /tmp/fp4.o
    cuobjdump -sass /tmp/fp4.o > /tmp/fp4.sass
    python3 tools/sass_loop.py /tmp/fp4.sass 'Nvfp4E6__halfLi1ELi1ELi2ELb1ELi0E'

Where the CUDA toolkit has no cuobjdump (nvcc-only installs), the wheel has one:
`pip download --no-deps nvidia-cuda-cuobjdump` and unzip it (nvidia/cu13/bin/cuobjdump).

For every function whose mangled name matches the pattern: the longest backward-branch body
(the main loop), its instruction count, how many are integer/logic (ALU) instructions, and the
most frequent opcodes, and its cost in units (UNITS below: an instruction's price against the
weight stream, measured per kind). Static counts: a loop body that holds both sides of a runtime branch
counts both (docs/perf-log.md, entry 14, compares these against the SM's issue budget).

    python3 tools/sass_loop.py --all /tmp/fp4.sass 'Nvfp4E6__halfLi1ELi1ELi2ELb1ELi0E'

With --all, every backward branch over more than 60 instructions instead, in address order: a
kernel compiled with several pipelines (the per-block kernel's M = 1 loop with x in its ring and
its M > 1 loop) has one such loop each, and the longest span can be two loops and the code
between them. Dynamic counts per window come from Nsight Compute (executed instructions over
the windows of the product; docs/perf-log.md, open item 2).

With --jump P (a predicate as SASS writes it, e.g. '!P0'), the forward branches `@P BRA` inside
each loop count as taken: the code they jump over is left out, which is the loop as a run
executes it when that predicate holds (a uniform condition such as "no zero points"; which
predicate that is, read from the listing: the branch around the LDS.U8 of the zero points):

    python3 tools/sass_loop.py --all --jump '!P0' /tmp/nbits.sass 'NbitsILi4EEE13__nv_bfloat16Li1ELi6E'

`--jump zp` finds that predicate in each loop itself: the first forward branch whose skipped code
holds an LDS.U8 (the zero points' byte loads of the int4 / int8 chunk prep). The predicate differs
between builds and between the loops of one kernel (!P0 in one, !P2 in a patched build's), so a
fixed one can leave a loop's zero-point code in without a word; the line then names the predicate
it took, or says none was found.
"""

import re
import sys
from collections import Counter

ALU = {"LOP3", "PRMT", "SHF", "IADD3", "ISETP", "LEA", "SEL", "VIADD", "MOV", "VIADDMNMX", "IMNMX", "PLOP3", "UIADD3"}

# What an instruction of each kind costs a window against the weight stream, in FFMAs
# (tools/tile_read_probe.cu `pipes`, docs/perf-log.md entry 117: the marginal time of 192 of a
# kind per window, the stream hot in L2, one H200). Kinds not listed count 1 (memory, HMMA,
# branches: unpriced).
UNITS = {"FFMA": 1.0, "FMUL": 1.0, "FADD": 1.0, "HFMA2": 1.0, "HADD2": 1.0, "HMUL2": 1.0, "IADD3": 1.4,
         "VIADD": 1.4, "IMAD": 2.0, "LOP3": 2.2, "PRMT": 2.2, "SHF": 2.2, "LEA": 2.2, "ISETP": 2.2, "SEL": 2.2,
         "MOV": 2.2, "F2FP": 2.2}


def units(opcodes) -> float:
    """The priced cost of a loop's opcodes with their modifiers (UNITS; IMAD.HI 5, IMAD.WIDE ~3.2)."""
    total = 0.0
    for op in opcodes:
        if op.startswith("IMAD.HI"):
            total += 5.0
        elif op.startswith("IMAD.WIDE"):
            total += 3.2
        else:
            total += UNITS.get(op.split(".")[0], 1.0)
    return total


def taken(body: list[str], addresses: list[int], predicate: str) -> list[str]:
    """The loop body without the code that forward branches on `predicate` jump over."""
    kept, skip_to = [], None
    branch = re.compile(r"@" + re.escape(predicate) + r"\s+BRA\s+0x([0-9a-f]+)")
    for ln, a in zip(body, addresses):
        if skip_to is not None and a < skip_to:
            continue
        skip_to = None
        kept.append(ln)
        m = branch.search(ln)
        if m and int(m.group(1), 16) > a:
            skip_to = int(m.group(1), 16)
    return kept


def zero_point_predicate(body: list[str], addresses: list[int]) -> str | None:
    """The predicate of the first forward branch in a loop body whose skipped code holds an
    LDS.U8 (`--jump zp`), or None."""
    for i, (ln, a) in enumerate(zip(body, addresses)):
        m = re.search(r"@(!?U?P\d+)\s+BRA\s+0x([0-9a-f]+)", ln)
        if m and int(m.group(2), 16) > a:
            target = int(m.group(2), 16)
            if any("LDS.U8" in b for b, at in zip(body[i + 1 :], addresses[i + 1 :]) if at < target):
                return m.group(1)
    return None


def loops(listing: str, pattern: str, every: bool = False, jump: str | None = None):
    for func in re.split(r"\n\s*Function : ", listing)[1:]:
        name = func.split("\n")[0]
        if not re.search(pattern, name):
            continue
        lines = [ln for ln in func.split("\n") if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
        addr = [int(re.search(r"/\*([0-9a-f]{4})\*/", ln).group(1), 16) for ln in lines]
        spans = []
        for i, ln in enumerate(lines):
            m = re.search(r"BRA\s+0x([0-9a-f]+)", ln)
            if m and int(m.group(1), 16) < addr[i] and int(m.group(1), 16) in addr:
                spans.append((addr.index(int(m.group(1), 16)), i))
        if not spans:
            continue
        if every:
            spans = [sp for sp in spans if sp[1] - sp[0] > 60]
        else:
            spans = [max(spans, key=lambda sp: sp[1] - sp[0])]
        for j, i in spans:
            body = lines[j : i + 1]
            predicate = zero_point_predicate(body, addr[j : i + 1]) if jump == "zp" else jump
            if predicate:
                body = taken(body, addr[j : i + 1], predicate)
            full = [re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", ln).group(1) for ln in body]
            ops = Counter(op.split(".")[0] for op in full)
            yield name, len(body), sum(v for k, v in ops.items() if k in ALU), ops.most_common(12), units(full), predicate


def main(argv) -> int:
    every = "--all" in argv
    argv = [a for a in argv if a != "--all"]
    jump = None
    if "--jump" in argv:
        i = argv.index("--jump")
        if i + 1 >= len(argv):
            print(__doc__)
            return 2
        jump = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if len(argv) != 2:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        for name, count, alu, common, cost, predicate in loops(f.read(), argv[1], every, jump):
            taken_by = ""
            if jump == "zp":
                taken_by = f" (zero-point branch {predicate} taken)" if predicate else " (no zero-point branch found)"
            print(f"{name[:90]}\n  loop {count} instructions, {cost:.0f} units, ALU {alu}{taken_by}: {common}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
