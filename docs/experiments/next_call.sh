#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main deepring
# here, with the run tool's carry: [".prebuilt"]; change nothing under ffi/, jaxgemv/ or the build
# files after the prebuild, or the machine builds it again):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 300;
#                                                TESTS=1: main's GPU tests of FP8, imma, xshare, PDL,
#                                                TEST_LIMIT=S seconds, 150; FP8's, 187, passed on an
#                                                H100 in session 67)
#
# Everything queued here wants an H200: on any other card the script says so and stops (H100s
# answered the rest in sessions 64-68, perf log 160-169; `TIME=420 bash docs/experiments/card_call.sh`
# validates main on any card instead).
# 1. The issues' rows as "auto" plans them (tools/issue_rows.sh), and the lm_heads of issue 6
#    (151936 x 2048, 248320 x 2048) at M = 1 for int4 and int8 (int8 now through imma).
# 2. FP8 through "mma" against wgmma on issue 5's shapes, M = 1 / 2 / 4 / 8, fp16 and bf16 x: on
#    H100s wgmma ran level with "mma" at best (perf log 165-169; its kernel alone 2% ahead of
#    "mma"'s at M = 1 under Nsight Compute, the counters' launch ~2 us behind on the wall); the
#    H200's FP8 "mma" loop is the issue-bound one. If wgmma wins there, "auto" needs a fact that
#    tells an H200 from an H100 (both 132 SMs, compute capability 9.0): the memory bandwidth.
# 3. int4 through "mma" and imma at M = 1 / 8 (8192 x 28672, 248320 x 2048): imma's decode is 43%
#    fewer issue units a window, and the H200's int4 loop is the issue-bound one; imma at M = 1 was
#    2 us behind "mma" on an H100 and was never timed on an H200.
# 4. int8 on those lm_heads through "mma" and "imma" at M = 1 / 4 / 8, fp16 and bf16 x: the rule
#    that takes imma there (planner.IMMA_AUTO_INT8_LM_HEAD) was timed on H100s (1.5-4%).
# 5. int4 at M = 12 / 16 through "mma" and xshare on the M = 16 shapes (xshare's rule was
#    timed on H100s); issue 5's small products at M = 1 (4096 x 2048, 8192 x 2048) on main and
#    deepring, two rounds (entry 158: level on an H100).
# PROBE=1 runs tools/wgmma_probe.cu first (perf log 163-164, 167).
#
# SHORT=1: the benchmarks alone, one round, ~150 s (LIMIT default 150).
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export H200=0
case "$gpu" in *H200*) H200=1 ;; esac
run='
bash $JAXGEMV_REPO/tools/issue_rows.sh main
side main $B --format int4 --shapes 151936x2048 248320x2048 --m 1 | rows
side main $B --format int8 --shapes 151936x2048 248320x2048 --m 1 | rows
for d in f16 bf16; do
  side main $B --format fp8 --dtype $d --variant mma,wgmma --shapes 5120x17408 10240x8192 34816x5120 --m 1,2,4,8 | rows
done
side main $B --format fp8 --variant mma,wgmma --shapes 8192x2048 4096x2048 --m 1,4,8 | rows
side main $B --format int4 --variant mma,imma --shapes 8192x28672 248320x2048 --m 1,8 | rows
side main $B --format int8 --variant mma,imma --shapes 151936x2048 248320x2048 --m 1,4,8 | rows
side main $B --format int8 --dtype bf16 --variant mma,imma --shapes 151936x2048 248320x2048 --m 1 | rows
side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 --m 12,16 | rows
for s in main deepring main deepring; do
  [ "${SHORT:-0}" = 1 ] && [ "$s" = main ] && [ -n "${once:-}" ] && break
  once=1
  side $s $B --format fp8 --shapes 4096x2048 8192x2048 --m 1 | rows
  side $s $B --format nvfp4 --shapes 4096x2048 8192x2048 --m 1 | rows
done
'
# PROBE=1, on any card: tools/wgmma_probe.cu (perf log 163), FP8 (1, 128) weights through wgmma with no
#    decode, against the read kernel (tools/wgmma_probe_bin.sh: the binary carried in .prebuilt,
#    else built there, ~40 s).
if [ "${PROBE:-0}" = 1 ]; then
  probe=$(bash tools/wgmma_probe_bin.sh "$out/wgmma_build.txt")
  if [ -n "$probe" ]; then timeout 150 "$probe" 2>&1 | tee "$out/wgmma.txt"; else echo "wgmma_probe: build failed"; fi
fi
limit=${LIMIT:-300} tests=${TESTS:-0}
if [ "${SHORT:-0}" = 1 ]; then limit=${LIMIT:-150} tests=0; fi
if [ "$H200" != 1 ]; then
  echo "$gpu: the queue here is for an H200 (see the top); nothing run"
  exit 0
fi
sides="main deepring"
[ "$tests" = 1 ] && export JAXGEMV_SIDES_TESTS="main:wgmma or test_fp8 or imma or xshare or pdl" \
  JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-150}
# shellcheck disable=SC2086
JAXGEMV_SIDES_LIMIT=$limit JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh ${sides#main} 2>&1 | tee "$out/bench.txt"
