#!/usr/bin/env bash
# The path of a tools/wgmma_probe.cu binary built from this tree's sources, for the device scripts
# (docs/experiments/next_call.sh, docs/experiments/wgmma_diag.sh); repository root:
#
#   probe=$(bash tools/wgmma_probe_bin.sh LOG)     (empty when the build fails; its log in LOG)
#   bash tools/wgmma_probe_bin.sh --prebuild       (here, before a call: .prebuilt/wgmma_probe and
#                                                   its key, which the run tool's carry takes along)
#
# A binary in .prebuilt is used where its key, the hash of its sources, matches; otherwise it is
# built into /tmp (~40 s on the GPU machine).
set -uo pipefail
src="tools/wgmma_probe.cu tools/probe_util.cuh ffi/stream_read.cuh ffi/cuda_util.cuh"
build() { nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iffi tools/wgmma_probe.cu -o "$1"; }
# shellcheck disable=SC2086
key=$(cat $src | sha256sum)
if [ "${1:-}" = --prebuild ]; then
  mkdir -p .prebuilt && build .prebuilt/wgmma_probe && echo "$key" >.prebuilt/wgmma_probe.key
  exit
fi
if [ -x .prebuilt/wgmma_probe ] && [ "$key" = "$(cat .prebuilt/wgmma_probe.key 2>/dev/null)" ]; then
  echo .prebuilt/wgmma_probe
elif build /tmp/wgmma_probe >"${1:-/dev/null}" 2>&1; then
  echo /tmp/wgmma_probe
fi
