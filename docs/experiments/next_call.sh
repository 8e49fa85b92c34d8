#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh \
#     main xsscale xsmbar xsscale+xsmbar xssums
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 330;
#                                                TESTS=1: main's xshare and imma GPU tests and the
#                                                patches' xshare tests first, TEST_LIMIT=S each, 80)
#
# On any sm_90 card (the question is the H200's, perf log 172; an H100's answer is that card's).
# Perf log 172 read xshare's one-m-tile kernel on the H200 as held by each warp's latency, with
# the block barrier 6-7% of the stall samples and the scale copy's address 3.9% (an IMAD waiting
# to overwrite the registers the LDGSTS before it still reads):
#   xsscale.patch   the scales' copy first in each window's copies (its address no longer lands on
#                   those registers; the loop 449 -> 443 instructions, the lanes >= 16 predicated
#                   instead of branched around)
#   xsmbar.patch    no block barrier: each stage's copies arrive on an mbarrier as they land, each
#                   warp waits only for the copies of the step it computes and marks the stage read
#                   on a second one, and refills the stage it read a step before as soon as every
#                   warp has read it (at once where they have, else after its own step)
#   xssums.patch    at blocks of 128 values or more, the scales on the float32 sums: the codes
#                   into the mmas unscaled, each half window's mmas into sums of their own, 4 FFMA
#                   a half for the decode's HMUL2 (int4 one m-tile 449 -> 412 instructions a window,
#                   96 registers, five blocks per SM as before)
# 1. Two rounds of main / xsscale / xsmbar / xsscale+xsmbar: int4 xshare at M = 2 / 8 / 16 on 8192
#    x 28672 and 34816 x 5120; int8 xshare at M = 4 / 16 on 10240 x 8192 (both patches change
#    every xshare instance); main / xssums on int4 with blocks of 128 (int4_g128) at M = 2 / 8 /
#    16 on the same two shapes (blocks of 32 keep main's loop).
# 2. The issues' rows on main (tools/issue_rows.sh).
# PROFILE=1, after them: Nsight Compute on xsmbar's int4 8192 x 28672 at M = 8 (what its warps
#    wait on without the barrier).
# SHORT=1: one round of step 1, no step 2 (LIMIT default 150).
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
sides="xsscale xsmbar xsscale+xsmbar xssums"
export SIDES="main xsscale xsmbar xsscale+xsmbar"
run='
for r in 1 2; do
  [ "${SHORT:-0}" = 1 ] && [ "$r" = 2 ] && break
  for s in $SIDES; do
    side $s $B --format int4 --variant xshare --shapes 8192x28672 34816x5120 --m 2,8,16 | rows
    side $s $B --format int8 --variant xshare --shapes 10240x8192 --m 4,16 | rows
  done
  for s in main xssums; do
    side $s $B --format int4_g128 --variant xshare --shapes 8192x28672 34816x5120 --m 2,8,16 | rows
  done
done
[ "${SHORT:-0}" = 1 ] || bash $JAXGEMV_REPO/tools/issue_rows.sh main
'
limit=${LIMIT:-330} tests=${TESTS:-0}
if [ "${SHORT:-0}" = 1 ]; then limit=${LIMIT:-150} tests=0; fi
if [ "$tests" = 1 ]; then
  export JAXGEMV_SIDES_TESTS="main:xshare or imma;xsscale:xshare;xsmbar:xshare;xsscale+xsmbar:xshare;xssums:xshare"
  export JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-80}
fi
# shellcheck disable=SC2086
JAXGEMV_SIDES_LIMIT=$limit JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh $sides 2>&1 | tee "$out/bench.txt"
if [ "${PROFILE:-0}" = 1 ] && [ -d /tmp/site-xsmbar ]; then
  # shellcheck source=/dev/null
  source tools/ncu_report.sh
  PYTHONPATH="/tmp/site-xsmbar${PYTHONPATH:+:$PYTHONPATH}" JAXGEMV_VARIANT=xshare \
    ncu_report "$out" "xsmbar-m8" XshareGemv "$PWD/tools" python3 "$PWD/tools/profile_case.py" "int4:8192,28672,8"
fi
