#!/usr/bin/env bash
# xkeep.patch against main on any sm_90 card (device, repository root, with the run tool's carry:
# [".prebuilt"] after `tools/prebuild_sides.sh main xkeep` here):
#
#   LIMIT=240 bash docs/experiments/xkeep_call.sh     (LIMIT: seconds for the benchmarks)
#
# xkeep.patch (perf log 170) keeps the xshare loop's shared-memory offsets in registers, where
# ptxas rebuilt them from the thread index at every use (the two-m-tile int4 loop 608 -> 505
# instructions a window, 1003 -> 782 units, static; the hot path ~474 -> ~376), and gives ptxas
# the registers that shared memory leaves it (__launch_bounds__' blocks per SM: 80 spilled -> 93).
# First its own GPU tests (test_xshare, test_imma's xshare checks), then xshare on main and on the
# patch, the read kernel beside each, two rounds (main, patch, main, patch); "mma" once for scale.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
run='
for s in main xkeep main xkeep; do
  side $s $B --format int4 --variant xshare --shapes 34816x5120 8192x28672 --m 2,8,16 | rows
  side $s $B --format int8 --variant xshare --shapes 8192x28672 --m 1,8,16 | rows
done
side main $B --format int4 --variant mma --shapes 34816x5120 8192x28672 --m 8,16 | rows
'
JAXGEMV_SIDES_TESTS="xkeep:xshare" JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-150} JAXGEMV_SIDES_LIMIT=${LIMIT:-240} \
  JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh xkeep 2>&1 | tee "$out/bench.txt"
echo "== table"
grep -E "^-- |^[0-9]+x[0-9]+ " "$out/runs.txt" | tail -40
