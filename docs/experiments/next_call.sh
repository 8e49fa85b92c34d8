#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main \
#     stages4 deepring
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 300;
#                                                TEST_LIMIT=S: the tests; 150; TESTS=0 skips them)
#
# 1. The issues' rows as "auto" plans them (tools/issue_rows.sh; the issues' numbers are the
#    H200's, an H100's rows are logged as such).
# 2. int4 and int8 at M = 1 through "auto", "mma", "imma" and xshare on 8192 x 28672 and the two
#    lm_heads of issue 6 (151936 x 2048, 248320 x 2048; "auto" there at M = 8 / 16 too): the
#    planner's M = 1 choice was timed on H100s only (docs/perf-log.md, entry 146). Then int4 at M
#    = 16 through "mma" and xshare on the two M = 16 shapes (xshare's rule: H100s only).
# 3. The small FP8 / NVFP4 products of issue 5 at M = 1 (4096 x 2048, 8192 x 2048) on main,
#    stages4 (the diagnostic: four ring stages everywhere) and deepring (the four-stage instance
#    where a warp has 3-4 windows), two rounds alternating (docs/experiments/README.md).
# 4. The int4 / int8 GPU tests (entry 157's x-next load in the 4-bit instances) and deepring's own.
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
side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 --m 16 | rows
for s in main stages4 deepring main stages4 deepring; do
  side $s $B --format fp8 --shapes 4096x2048 8192x2048 --m 1 | rows
  side $s $B --format nvfp4 --shapes 4096x2048 8192x2048 --m 1 | rows
done
' bash tools/device_patches.sh stages4 deepring 2>&1 | tee "$out/bench.txt"
if [ "${TESTS:-1}" = 1 ]; then
  T="nbits and (gpu or every_ksplit or blocks_above or x_paths or tile_staged or x_in_shared)"
  JAXGEMV_SIDES_REUSE=1 JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-150} JAXGEMV_SIDES_RUN='true' \
    JAXGEMV_SIDES_TESTS="main:$T;deepring:deep_ring or launch_choice" \
    bash tools/device_patches.sh stages4 deepring 2>&1 | tee "$out/tests.txt"
fi
