#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main xselect \
#     xselect_min
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 360;
#                                                TEST_LIMIT=S: each side's tests; 150)
#
# 1. On an H200 only: the issues' rows as "auto" plans them (the issues' numbers are the H200's).
# 2. xselect.patch and xselect_min.patch against main (docs/perf-log.md, entry 156: x's
#    next-window load without a branch, 3-24% fewer instructions in the x-ahead loops of M = 2-16,
#    registers both ways, the two forms differently), two rounds, the sides alternating: NVFP4
#    fp16 and FP8 bf16 where the issues' rows run, int4 and int8 at M = 2-16 where "mma" takes x
#    ahead (auto and "mma" forced), NVFP4 bf16 at M = 4 / 16.
# 3. The GPU tests of both on the paths they change (TESTS=0 skips them).
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export ISSUE_ROWS=0
case "$gpu" in *H200*) ISSUE_ROWS=1 ;; esac
JAXGEMV_SIDES_LIMIT=${LIMIT:-360} JAXGEMV_SIDES_RUN='
[ "$ISSUE_ROWS" = 1 ] && bash $JAXGEMV_REPO/tools/issue_rows.sh main
for s in main xselect xselect_min main xselect xselect_min; do
  side $s $B --format nvfp4 --dtype f16 --shapes 8192x28672 --m 2,4,8,16 | rows
  side $s $B --format fp8 --dtype bf16 --shapes 10240x8192 --m 2,4,8,16 | rows
  side $s $B --format int4 --variant auto,mma --shapes 8192x28672 --m 2,8,16 | rows
  side $s $B --format int8 --variant auto,mma --shapes 10240x8192 --m 8,16 | rows
  side $s $B --format nvfp4 --dtype bf16 --shapes 8192x28672 --m 4,16 | rows
done
' bash tools/device_patches.sh xselect xselect_min 2>&1 | tee "$out/bench.txt"
if [ "${TESTS:-1}" = 1 ]; then
  T="every_ksplit or blocks_above or x_paths or min_blocks or x_in_shared or matmul_gpu or swiglu"
  JAXGEMV_SIDES_REUSE=1 JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-150} JAXGEMV_SIDES_RUN='true' \
    JAXGEMV_SIDES_TESTS="xselect:$T;xselect_min:$T" bash tools/device_patches.sh xselect xselect_min 2>&1 |
    tee "$out/tests.txt"
fi
