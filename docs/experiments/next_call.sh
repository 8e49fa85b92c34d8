#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main
# here, with the run tool's carry: [".prebuilt"]; limit 600 s; change nothing under ffi/, jaxgemv/
# or the build files after the prebuild, or the machine builds it again: 138 s in session 59):
#
#   bash docs/experiments/next_call.sh          (LIMIT=S: the benchmarks stop after S seconds; 500)
#
# 1. The issues' rows as "auto" plans them (on an H200 these are the issues' numbers); 2. int4's
#    imma against "mma" and xshare at M = 1-4 on 8192 x 28672, where imma's int4 rule stands (M = 1
#    was 3% slower on an H100 and is untimed on an H200, where the loops bind on issue and imma's
#    decode is a few instructions a word); 3. int8's "auto" rule of entry 153 on the wall clock:
#    imma, xshare and "mma" side by side where the rule moved (10240 x 8192, 5120 x 17408, 28672 x
#    8192, 8192 x 28672 at M = 1-8) and "auto" itself; 4. int4 and int8 xshare against "mma" on the
#    large products (the rule's other rows).
#    docs/perf-log.md, entries 153-154.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
JAXGEMV_SIDES_LIMIT=${LIMIT:-500} JAXGEMV_SIDES_RUN='
bash $JAXGEMV_REPO/tools/issue_rows.sh main
side main $B --format int4 --variant auto,imma,mma,xshare --shapes 8192x28672 --m 1,2,4 | rows
side main $B --format int8 --variant auto,imma,xshare,mma --shapes 10240x8192 5120x17408 28672x8192 8192x28672 \
  --m 1,2,4,6,8 | rows
side main $B --format int4 --variant auto,mma,xshare --shapes 8192x28672 34816x5120 --m 2,8,16 | rows
side main $B --format int8 --variant auto,mma,xshare --shapes 34816x5120 28672x8192 --m 16 | rows
' bash tools/device_patches.sh 2>&1 | tee "$out/bench.txt"
