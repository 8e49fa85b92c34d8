#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main
# here, with the run tool's carry: [".prebuilt"]; limit 600 s):
#
#   bash docs/experiments/next_call.sh
#
# 1. The xshare variant's GPU tests; 2. xshare against "mma" on the shapes "auto"'s rule was set
#    from and those it reaches untimed (int4 28672 x 8192, int8 28672 x 8192 and 5120 x 17408), at
#    M = 1-16, int4 and int8 (bf16 x) and int8 with fp16 x, imma beside them on the untimed int8
#    shapes; 3. the issues' rows as "auto" plans them. docs/perf-log.md, entry 152.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
JAXGEMV_TEST_LIMIT=120 JAXGEMV_SIDES_TESTS="main:xshare" bash tools/device_patches.sh 2>&1 | tee "$out/tests.txt"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
JAXGEMV_SIDES_REUSE=1 JAXGEMV_SIDES_LIMIT=400 JAXGEMV_SIDES_RUN='
side main $B --format int4 --variant mma,xshare --shapes 8192x28672 34816x5120 28672x8192 --m 1,2,4,8,16 | rows
side main $B --format int8 --variant mma,xshare --shapes 10240x8192 8192x28672 34816x5120 28672x8192 5120x17408 \
  --m 1,2,4,8,16 | rows
side main $B --format int8_f16 --variant mma,xshare --shapes 10240x8192 8192x28672 --m 2,8,16 | rows
side main $B --format int8 --variant imma --shapes 28672x8192 5120x17408 --m 1,2,4 | rows
bash $JAXGEMV_REPO/tools/issue_rows.sh main
' bash tools/device_patches.sh 2>&1 | tee "$out/bench.txt"
