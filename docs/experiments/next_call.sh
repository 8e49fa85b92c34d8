#!/usr/bin/env bash
# The next device call as one script, the most valuable measurement first, so that a call cut short
# still brings back the front of it (device, repository root, after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main xshare
# here, with the run tool's carry: [".prebuilt"]; limit 600 s):
#
#   bash docs/experiments/next_call.sh
#
# 1. tools/xshare_probe.cu on NVFP4 (both forms: the scale in the weight, the scales on the sums),
#    int4 and int8 (fp16 x); 2. xshare.patch's rows against "mma", and NVFP4's and int8_f16's
#    "mma" rows beside the probe's;
#    3. xshare.patch's GPU tests; 4. on an H200 only, the issues' rows on main and imma against
#    "mma" at M = 1 (int4 8192 x 28672 / 151936 x 2048) and on the taller int8 grids (timed on
#    H100s only so far). docs/experiments/README.md says what each is for and what it predicts.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
inc=$(python3 -c 'import jax.ffi; print(jax.ffi.include_dir())')
nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -I"$inc" -Iffi tools/xshare_probe.cu -o /tmp/xshare_probe \
  2>"$out/probe-build.log" &&
  {
    /tmp/xshare_probe --nvfp4 8192 28672
    /tmp/xshare_probe 34816 5120 8192 28672
    /tmp/xshare_probe --int8 10240 8192 8192 28672
  } 2>&1 | tee "$out/probe.txt"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
JAXGEMV_SIDES_LIMIT=200 JAXGEMV_SIDES_RUN='
side xshare $B --kinds --format int4 --variant mma,xshare --shapes 34816x5120 8192x28672 5120x17408 \
  --m 2,8,16 | rows
side main $B --format nvfp4 --dtype f16 --shapes 8192x28672 --m 2,8,16 | rows
side main $B --format int8_f16 --shapes 10240x8192 8192x28672 --m 8,16 | rows
' bash tools/device_patches.sh xshare 2>&1 | tee "$out/sides.txt"
JAXGEMV_SIDES_REUSE=1 JAXGEMV_TEST_LIMIT=100 JAXGEMV_SIDES_TESTS="xshare:xshare" bash tools/device_patches.sh xshare 2>&1 |
  tee "$out/tests.txt"
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  JAXGEMV_SIDES_REUSE=1 JAXGEMV_SIDES_LIMIT=200 JAXGEMV_SIDES_RUN='
bash $JAXGEMV_REPO/tools/issue_rows.sh main
side main $B --format int4 --variant mma,imma --shapes 8192x28672 151936x2048 --m 1 | rows
side main $B --format int8 --variant mma,imma --shapes 10240x8192 28672x8192 --m 1,2,4,6 | rows
' bash tools/device_patches.sh 2>&1 | tee "$out/h200.txt"
fi
