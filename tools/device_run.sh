#!/usr/bin/env bash
# One call on the lent H200 does everything: build the extension, run the GPU tests, run the
# benchmark; logs land in $OUT and a short table is printed last.
#
#   tools/device_run.sh [bench args...]      (from the repository root, on the GPU machine)
#
# Builds machine code for sm_90 only (the GPU at hand) to keep the build short; CI and users
# build the full architecture list.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# Several test processes share the GPU: allocate on demand instead of 75% each.
export XLA_PYTHON_CLIENT_PREALLOCATE=false

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
git -C "$repo" rev-parse --short HEAD 2>/dev/null | tee -a "$out/gpu.txt"

echo "== build"
( cd "$repo" && python3 -m pip install --no-build-isolation --no-deps -q . \
    -C cmake.define.JAXGEMV_CUDA_ARCHITECTURES=90 ) >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
grep -E "spill|error" "$out/build.log" | grep -v "0 bytes spill" | head -5

# Run from outside the repository so that `import jaxgemv` finds the installed build.
cd /tmp
if [ "${JAXGEMV_SKIP_TESTS:-0}" != "1" ]; then
  echo "== tests"
  python3 -m pytest -q "$repo/tests" ${JAXGEMV_TEST_ARGS:--n 8} >"$out/tests.log" 2>&1
  echo "pytest exit $?"; tail -5 "$out/tests.log"
fi

unset XLA_PYTHON_CLIENT_PREALLOCATE
echo "== bench"
python3 -m jaxgemv.bench --json "$out/bench.json" "$@" 2>"$out/bench.err" | tee "$out/bench.txt"
tail -3 "$out/bench.err"
# Launch-parameter sweep on one case (JAXGEMV_SWEEP="shape M"), each ksplit x loads forced.
if [ -n "${JAXGEMV_SWEEP:-}" ]; then
  set -- $JAXGEMV_SWEEP
  echo "== sweep $1 M=$2 (ksplit loads us %ceil)"
  for ks in 1 2 4 8; do for ld in 1 2; do
    r=$(JAXGEMV_KSPLIT=$ks JAXGEMV_LOADS=$ld python3 -m jaxgemv.bench --shapes "$1" --m "$2" \
        --variant mma --no-baselines --json "$out/sweep.json" 2>>"$out/sweep.err" | tail -1)
    echo "$ks $ld $r"
  done; done | tee "$out/sweep.txt"
fi
