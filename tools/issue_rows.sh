#!/usr/bin/env bash
# The issues' performance rows on one build, as a tools/device_patches.sh snippet (its `side` and
# `rows` helpers are exported there):
#
#   JAXGEMV_SIDES_LIMIT=500 JAXGEMV_SIDES_RUN='bash $JAXGEMV_REPO/tools/issue_rows.sh main' \
#     bash tools/device_patches.sh
#
# Each format with the dtype its issue names (NVFP4 and FP8 follow --dtype; the int4 / int8
# formats run bf16 x). Cold weights and the read kernel on the same bytes in the same run
# (jaxgemv.bench), kernel time from the profiler (--trace).
set -uo pipefail
name=${1:-main}
B="python3 -m jaxgemv.bench --trace --no-baselines"
side "$name" $B --format nvfp4 --dtype f16 --shapes 8192x28672 --m 1,2,4,8 | rows
side "$name" $B --format fp8 --dtype f16 --shapes 5120x17408 8192x2048 4096x2048 --m 1 | rows
side "$name" $B --format fp8 --dtype bf16 --shapes 10240x8192 34816x5120 --m 2,4,8 | rows
side "$name" $B --format int4 --shapes 8192x28672 --m 1,4,8,16 | rows
side "$name" $B --format int4 --shapes 34816x5120 --m 16 | rows
side "$name" $B --format int8 --shapes 10240x8192 --m 2,4,8,16 | rows
side "$name" $B --format int4 --shapes 248320x2048 --m 1,8,16 | rows
side "$name" $B --format int8 --shapes 248320x2048 --m 1,8,16 | rows
