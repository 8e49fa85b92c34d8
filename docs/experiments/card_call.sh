#!/usr/bin/env bash
# One device call that spends itself by the card it gets (device, repository root, with the run
# tool's carry: [".prebuilt"] after tools/prebuild_sides.sh main; nothing edited under ffi/,
# jaxgemv/ or the build files between the prebuild and the call):
#
#   TIME=S bash docs/experiments/card_call.sh     (S: seconds the call may take in all; 420)
#
# On an H200: next_call.sh's benchmarks (its patches' rounds, then the issues' rows; the issues'
# numbers are the H200's) in 60% of the time, then main's GPU tests in what is left. On any other
# card next_call.sh's short form (one round of its patches' rows), then the whole test suite
# (every GPU test, on 16 workers), the longest tests listed for splitting it between calls.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
total=${TIME:-420}
start=$SECONDS
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $gpu"
case "$gpu" in
  *H200*)
    TESTS=0 LIMIT=$((total * 60 / 100)) bash docs/experiments/next_call.sh
    left=$((total - (SECONDS - start) - 40))
    [ "$left" -gt 60 ] && JAXGEMV_SIDES_REUSE=1 JAXGEMV_TEST_LIMIT=$left JAXGEMV_SIDES_TESTS="main:" \
      JAXGEMV_SIDES_RUN='true' bash tools/device_patches.sh 2>&1 | tee "$out/tests.txt"
    ;;
  *)
    SHORT=1 LIMIT=150 bash docs/experiments/next_call.sh
    JAXGEMV_TEST_LIMIT=$((total - (SECONDS - start) - 50)) JAXGEMV_SIDES_TESTS="main:" JAXGEMV_SIDES_RUN='true' \
      bash tools/device_patches.sh 2>&1 | tee "$out/tests.txt"
    ;;
esac
echo "== card_call: $((SECONDS - start)) s"
