#!/usr/bin/env bash
# Register / spill / shared-memory report of every kernel in ffi/*.cu for one architecture.
# Usage: tools/resources.sh [sm_90]   (needs nvcc and jax installed; no GPU)
set -euo pipefail
arch=${1:-sm_90}
root=$(cd "$(dirname "$0")/.." && pwd)
inc=$(python3 -c "import jax.ffi; print(jax.ffi.include_dir())")
for f in "$root"/ffi/*.cu; do
  nvcc -std=c++17 -O3 --expt-relaxed-constexpr -gencode=arch=compute_${arch#sm_},code=$arch \
    -Xptxas -v -I"$inc" -I"$root/ffi" -c "$f" -o /dev/null 2>&1
done | python3 -c '
import re, sys
name = None
for line in sys.stdin:
    m = re.search(r"Compiling entry function .(_Z\w+).", line)
    if m:
        name = m.group(1)
        name = re.sub(r"^_ZN7jaxgemv\d+", "", name)
        continue
    m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
    if m and name: stack = m.groups()
    m = re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line) or re.search(r"Used (\d+) registers", line)
    if m and name:
        print(f"{m.group(1):>4} regs  stack/spill {stack[0]}/{stack[1]}  {name}")
        name = None
'
