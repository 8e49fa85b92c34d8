#!/usr/bin/env bash
# xshare's one-m-tile kernel (int4, M <= 8) in two more shapes against main's (four warps, three
# ring stages), one device call on any sm_90 card (repository root, carry [".prebuilt"] after
#   JAXGEMV_PREBUILD_PYTHON=/root/.pyenv/versions/3.12.1/bin/python bash tools/prebuild_sides.sh main xs4stage xs8warp xsacc2 \
#     xs4stage+xsacc2
# here):
#   xs4stage.patch  four ring stages (four blocks per SM instead of five: 3 x 8.5 KB of codes in
#                   flight a block instead of 2, 16 warps an SM instead of 20)
#   xs8warp.patch   eight warps a block (three blocks per SM: 24 warps; x's window copied once per
#                   eight tiles instead of four, half the barriers per byte)
#   xsacc2.patch    a unit's two mmas into two accumulator sets: two dependent chains of eight mmas
#                   a window instead of one of sixteen (91 registers instead of 83, still five
#                   blocks per SM)
# Perf log 170 left the one-m-tile loop on the H200 at 70-71% of the read with 12% fewer
# instructions moving it 1.5%: not bound by its issue. If it waits on the bytes in flight, the
# four stages gain; if on x's copies and the barrier, the eight warps; if on the mmas' one
# dependent chain, the two accumulator sets (and xs4stage+xsacc2 whether two gains add). The
# issues' rows on main last (session 69 ran them on the same kernels).
#
#   bash docs/experiments/xs_call.sh     (LIMIT=S: the benchmarks stop after S seconds, 330;
#                                         TESTS=0: no GPU tests first)
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export B="python3 -m jaxgemv.bench --trace --no-baselines"
run='
for r in 1 2; do
  for s in main xs4stage xs8warp xsacc2 xs4stage+xsacc2; do
    side $s $B --format int4 --variant xshare --shapes 8192x28672 34816x5120 10240x8192 --m 2,8 | rows
  done
done
bash $JAXGEMV_REPO/tools/issue_rows.sh main
'
if [ "${TESTS:-1}" = 1 ]; then
  export JAXGEMV_SIDES_TESTS="main:xshare or imma;xs8warp:xshare;xsacc2:xshare" JAXGEMV_TEST_LIMIT=${TEST_LIMIT:-100}
fi
JAXGEMV_SIDES_LIMIT=${LIMIT:-330} JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh xs4stage xs8warp xsacc2 xs4stage+xsacc2 2>&1 |
  tee "$out/bench.txt"
