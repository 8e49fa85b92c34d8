#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main \
#     int4branch deepring
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 330;
#                                                TEST_LIMIT=S: the tests; 120; TESTS=0 skips them)
#
# 1. main against int4branch.patch, two rounds alternating, on whatever card comes: int4's two
#    m-tiles ("mma", M = 9 / 12 / 16) on the M = 16 shapes (docs/perf-log.md, entries
#    157-158: the unbranched x load gained 5-9% on an H200 and may lose on an H100).
# 2. The issues' rows as "auto" plans them (tools/issue_rows.sh; the issues' numbers are the
#    H200's, an H100's rows are logged as such).
# 3. int8 on the lm_heads of issue 6 (151936 x 2048, 248320 x 2048) through "mma" and "imma" at M
#    = 1 / 2 / 4, the second round of entry 158 (imma led by 6-17 us on the wall clock at M = 1,
#    where "auto" takes "mma").
# 4. On an H200 only: int4 at M = 12 / 16 through "mma" and xshare on the M = 16 shapes
#    (xshare's rule was timed on H100s: "mma" at 8192 x 28672, xshare at 34816 x 5120); issue 5's
#    small products at M = 1 (4096 x 2048, 8192 x 2048) on main and deepring, two rounds (entry
#    158: level on an H100).
# 5. main's imma / xshare tests (the handlers' shared checks, session 64), deepring's GPU tests.
#
# SHORT=1: only what the card that came can answer, one round unless named, no tests, ~200 s
# (LIMIT default 200; for a session with little device time left: session 63's fifteen calls found
# no machine, perf log 159). An H100: 1 at M = 12 / 16, then 3 at M = 1 / 2. An H200: 3 at M = 1 /
# 2, 4's xshare at M = 16 and deepring, one round.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export H200=0
case "$gpu" in *H200*) H200=1 ;; esac
run='
for s in main int4branch main int4branch; do
  side $s $B --format int4 --variant mma --shapes 8192x28672 34816x5120 --m 9,12,16 | rows
done
bash $JAXGEMV_REPO/tools/issue_rows.sh main
side main $B --format int8 --variant mma,imma --shapes 151936x2048 248320x2048 --m 1,2,4 | rows
if [ "$H200" = 1 ]; then
  side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 --m 12,16 | rows
  for s in main deepring main deepring; do
    side $s $B --format fp8 --shapes 4096x2048 8192x2048 --m 1 | rows
    side $s $B --format nvfp4 --shapes 4096x2048 8192x2048 --m 1 | rows
  done
fi
'
limit=${LIMIT:-330} tests=${TESTS:-1}
if [ "${SHORT:-0}" = 1 ]; then
  run='
if [ "$H200" = 0 ]; then
  for s in main int4branch main int4branch; do
    side $s $B --format int4 --variant mma --shapes 8192x28672 34816x5120 --m 12,16 | rows
  done
fi
side main $B --format int8 --variant mma,imma --shapes 151936x2048 248320x2048 --m 1,2 | rows
if [ "$H200" = 1 ]; then
  side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 --m 16 | rows
  for s in main deepring; do
    side $s $B --format fp8 --shapes 4096x2048 8192x2048 --m 1 | rows
    side $s $B --format nvfp4 --shapes 4096x2048 8192x2048 --m 1 | rows
  done
fi
'
  limit=${LIMIT:-200} tests=${TESTS:-0}
fi
JAXGEMV_SIDES_LIMIT=$limit JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh int4branch deepring 2>&1 | tee "$out/bench.txt"
if [ "$tests" = 1 ]; then
  JAXGEMV_SIDES_REUSE=1 JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-120} JAXGEMV_SIDES_RUN='true' \
    JAXGEMV_SIDES_TESTS="main:handler_refuses or imma or xshare;deepring:deep_ring or launch_choice" \
    bash tools/device_patches.sh int4branch deepring 2>&1 | tee "$out/tests.txt"
fi
