#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 300;
#                                                TEST_LIMIT=S: the tests; 150; TESTS=0 skips them)
#
# 1. The issues' rows as "auto" plans them (tools/issue_rows.sh; the issues' numbers are the
#    H200's, an H100's rows are logged as such).
# 2. int4 and int8 at M = 1 through "auto", "mma", "imma" and "xshare" on 8192 x 28672 and the two lm_heads of issue
#    6 (151936 x 2048, 248320 x 2048; "auto" there at M = 8 / 16 too): the planner's M = 1
#    choice was timed on H100s only (docs/perf-log.md, entry 146).
# 3. The int4 / int8 GPU tests (entry 157's x-next load in the 4-bit instances).
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
JAXGEMV_SIDES_LIMIT=${LIMIT:-300} JAXGEMV_SIDES_RUN='
bash $JAXGEMV_REPO/tools/issue_rows.sh main
side main $B --format int4 --variant auto,mma,imma,xshare --shapes 8192x28672 151936x2048 248320x2048 --m 1 | rows
side main $B --format int8 --variant auto,mma,imma,xshare --shapes 8192x28672 151936x2048 248320x2048 --m 1 | rows
side main $B --format int4 --shapes 151936x2048 248320x2048 --m 8,16 | rows
side main $B --format int8 --shapes 151936x2048 248320x2048 --m 8,16 | rows
' bash tools/device_patches.sh 2>&1 | tee "$out/bench.txt"
if [ "${TESTS:-1}" = 1 ]; then
  T="nbits and (gpu or every_ksplit or blocks_above or x_paths or tile_staged or x_in_shared)"
  JAXGEMV_SIDES_REUSE=1 JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-150} JAXGEMV_SIDES_RUN='true' \
    JAXGEMV_SIDES_TESTS="main:$T" bash tools/device_patches.sh 2>&1 | tee "$out/tests.txt"
fi
