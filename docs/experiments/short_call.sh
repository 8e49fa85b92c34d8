#!/usr/bin/env bash
# next_call.sh's decisions in the fewest device seconds, for a session with little device time
# left (session 63: fifteen calls found no machine): what only this card can answer, one round
# unless named.
#   LIMIT=S bash docs/experiments/short_call.sh   (run tool: carry [".prebuilt"]; S default 200)
# H100: int4branch against main, two rounds (int4 "mma" M = 12 / 16, the M = 16 shapes),
#       then int8 "mma" / imma on the lm_heads at M = 1 / 2 (the second round of perf log 158).
# H200: int8 "mma" / imma on the lm_heads at M = 1 / 2, int4 "mma" / xshare at M = 16, issue 5's
#       small products on main and deepring.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
export H200=0
case "$gpu" in *H200*) H200=1 ;; esac
JAXGEMV_SIDES_LIMIT=${LIMIT:-200} JAXGEMV_SIDES_RUN='
if [ "$H200" = 0 ]; then
  for s in main int4branch main int4branch; do
    side $s $B --format int4 --variant mma --shapes 8192x28672 34816x5120 --m 12,16 | rows
  done
  side main $B --format int8 --variant mma,imma --shapes 151936x2048 248320x2048 --m 1,2 | rows
else
  side main $B --format int8 --variant mma,imma --shapes 151936x2048 248320x2048 --m 1,2 | rows
  side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 --m 16 | rows
  for s in main deepring; do
    side $s $B --format fp8 --shapes 4096x2048 8192x2048 --m 1 | rows
    side $s $B --format nvfp4 --shapes 4096x2048 8192x2048 --m 1 | rows
  done
fi
' bash tools/device_patches.sh int4branch deepring 2>&1 | tee "$out/bench.txt"
