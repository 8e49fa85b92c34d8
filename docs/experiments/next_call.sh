#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 300;
#                                                TESTS=1: main's GPU tests of xshare and imma first,
#                                                TEST_LIMIT=S seconds, 120)
#
# On any sm_90 card: the H200's queue of sessions 63-68 ran in session 69 (perf log 170-171), and
# "auto"'s new rules rest on that H200 alone.
# 1. The issues' rows as "auto" plans them (tools/issue_rows.sh; the issues' numbers are the
#    H200's, an H100's are that card's).
# 2. xshare's M = 9-16 rule (planner.XSHARE_AUTO, perf log 170): "mma" against xshare at M = 9 / 16
#    on the shapes it now takes, int4 and int8, two rounds. On an H100 the first timing of that
#    rule since the loop kept its offsets (H100s ran xshare 1-4 us behind "mma" there before).
# 3. The int8 lm_heads' imma rule (planner.IMMA_AUTO_INT8_LM_HEAD, now M <= 4 by the H200's one
#    round, perf log 171): "mma" against imma at M = 4 / 6 / 8, a second round.
#
# SHORT=1: one round of step 2, no step 3 (LIMIT default 150).
# ROWS=0: no step 1 (a call after xs_call.sh on the same warm machine, which ran them).
# PROFILE=1, after them: Nsight Compute on xshare's int4 8192 x 28672 at M = 8 (one m-tile) and 16
#    (two): 12% fewer instructions moved the one-m-tile kernel 1.5% on the H200 (perf log 170), so
#    what it waits on is the question (stall reasons per instruction, tools/ncu_stalls.py).
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export ROWS=${ROWS:-1} B="python3 -m jaxgemv.bench --trace --no-baselines"
run='
[ "${ROWS:-1}" = 1 ] && bash $JAXGEMV_REPO/tools/issue_rows.sh main
for r in 1 2; do
  [ "${SHORT:-0}" = 1 ] && [ "$r" = 2 ] && break
  side main $B --format int4 --variant mma,xshare --shapes 8192x28672 10240x8192 5120x17408 --m 9,16 | rows
  side main $B --format int8 --variant mma,xshare --shapes 10240x8192 34816x5120 5120x17408 --m 9,16 | rows
done
[ "${SHORT:-0}" = 1 ] ||
  side main $B --format int8 --variant mma,imma --shapes 151936x2048 248320x2048 --m 4,6,8 | rows
'
limit=${LIMIT:-300} tests=${TESTS:-0}
if [ "${SHORT:-0}" = 1 ]; then limit=${LIMIT:-150} tests=0; fi
[ "$tests" = 1 ] && export JAXGEMV_SIDES_TESTS="main:xshare or imma" JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-120}
JAXGEMV_SIDES_LIMIT=$limit JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh 2>&1 | tee "$out/bench.txt"
if [ "${PROFILE:-0}" = 1 ]; then
  # shellcheck source=/dev/null
  source tools/ncu_report.sh
  site=""
  [ -d /tmp/site-main ] && site=/tmp/site-main
  for m in 8 16; do
    PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" JAXGEMV_VARIANT=xshare \
      ncu_report "$out" "xshare-m$m" XshareGemv "$PWD/tools" python3 "$PWD/tools/profile_case.py" "int4:8192,28672,$m"
  done
fi
