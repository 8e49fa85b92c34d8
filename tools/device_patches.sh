#!/usr/bin/env bash
# Main beside main + each prepared patch, in one call on the lent GPU, without snapshots: the
# patches are docs/experiments/NAME.patch (committed), each side is built in parallel and
# installed with `pip install --target` into a directory of its own, and a side runs by putting
# that directory first on PYTHONPATH. Main is installed normally (plain `python3` runs it).
# tools/device_ab.sh is the other A/B tool: two or three commits as carried snapshots, each
# reinstalled per round (B, A, B) with the decode example and profiles; this one takes the
# committed patches, any number of them, with no reinstall and no carry, and keeps its builds
# for the next call on a warm machine.
#
#   (device, repository root) JAXGEMV_SIDES_RUN='side main python3 -m jaxgemv.bench --format fp8 \
#       --trace --no-baselines --shapes 5120x17408 --m 1 | rows; side NAME python3 -m jaxgemv.bench \
#       --format fp8 --trace --no-baselines --shapes 5120x17408 --m 1 | rows' bash tools/device_patches.sh NAME
#
# JAXGEMV_SIDES_RUN is a bash snippet run from /tmp with two helpers: `side NAME command...` runs
# the command against side NAME ("main" or a patch's name), echoing a header line ("-- NAME:
# command"); `rows` keeps those headers and a benchmark table's rows as "shape M format variant
# kern_us ceil_kern_us % us" (us: the product's time in its timed batches, where kern_us sums its
# kernels' durations; stdin to stdout), and the lines of the benchmark's --kinds.
# JAXGEMV_SIDES_TESTS="NAME:pytest -k filter;..." runs the GPU tests of those sides first
# (JAXGEMV_TEST_WORKERS workers, default 16). Each build's log lands in $OUT; a failed build or
# patch drops its side with a message. JAXGEMV_SIDES_REUSE=1 keeps the builds a call before left
# on a machine still warm (the tests in one call, the benchmarks in the next). A side named
# "a+b" is main with patches a and b applied in that order.
set -uo pipefail
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
repo=$(pwd)
start=$SECONDS
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"

reuse=${JAXGEMV_SIDES_REUSE:-0}
# A side built here beforehand (tools/prebuild_sides.sh, carried as .prebuilt) is unpacked where
# its key says it was built from this very tree; main then runs from /tmp/site-main as the others do.
unpack() {  # NAME TREE
  local name=$1 tree=$2 pack="$repo/.prebuilt/$1"
  [ -f "$pack.tar.xz" ] && [ -f "$pack.key" ] || return 1
  if [ "$(bash "$repo/tools/side_key.sh" "$tree")" != "$(cat "$pack.key")" ]; then
    echo "$name: the prebuilt side was built from other sources; building it here"
    return 1
  fi
  rm -rf "/tmp/site-$name" && mkdir -p "/tmp/site-$name" && xz -dc "$pack.tar.xz" | tar -C "/tmp/site-$name" -xf - &&
    echo "$name: prebuilt"
}
[ "$reuse" = 1 ] && [ -f /tmp/site-main.built ] ||
  { rm -f /tmp/site-main.built; unpack main "$repo" && touch /tmp/site-main.built; } ||
  ( rm -rf /tmp/site-main && python3 -m pip install --no-build-isolation --no-deps -q . \
      -C cmake.define.JAXGEMV_CUDA_ARCHITECTURES=90 >"$out/build-main.log" 2>&1 && touch /tmp/site-main.built ||
      echo "main: build failed (see $out/build-main.log)" ) &
apply_parts() {  # "a+b": patches a then b
  local part
  for part in ${1//+/ }; do git apply "$repo/docs/experiments/$part.patch" || return 1; done
}
for name in "$@"; do
  [ "$reuse" = 1 ] && [ -d "/tmp/site-$name" ] && continue
  (
    rm -rf "/tmp/side-$name" "/tmp/site-$name" && mkdir -p "/tmp/side-$name" && cp -r "$repo/." "/tmp/side-$name" &&
      rm -rf "/tmp/side-$name/.git" "/tmp/side-$name/build" "/tmp/side-$name/.prebuilt" && cd "/tmp/side-$name" &&
      apply_parts "$name" && { unpack "$name" "/tmp/side-$name" ||
      python3 -m pip install --no-build-isolation --no-deps -q --target "/tmp/site-$name" . \
        -C cmake.define.JAXGEMV_CUDA_ARCHITECTURES=90 >"$out/build-${name//+/_}.log" 2>&1; } ||
      { echo "$name: patch or build failed"; rm -rf "/tmp/site-$name"; }
  ) &
done
wait
echo "== builds: $((SECONDS - start)) s"
for log in "$out"/build-*.log; do [ -f "$log" ] && grep -iE "error|spill" "$log" | grep -v " 0 bytes spill" | head -3; done

side() {
  local name=$1
  shift
  echo "-- $name: $*"
  if [ "$name" = main ] && [ ! -d /tmp/site-main ]; then
    "$@"
  elif [ -d "/tmp/site-$name" ]; then
    PYTHONPATH="/tmp/site-$name${PYTHONPATH:+:$PYTHONPATH}" "$@"
  else
    echo "   (no build of $name)"
  fi
}
rows() {
  awk '/^-- / || /^kinds / { print; next }
       NF > 12 && $4 ~ /^[0-9]+$/ && $1 != "shape" {
         v = $6; i = 7; while ($i !~ /^[0-9.]+$/) { v = v " " $i; i++ }
         kern = $(i + 4); ceil = $(i + 6); printf "%-14s %3s %-6s %-14s %7s %7s %4.0f %7s\n", $1, $4, $5, v, kern, ceil, 100 * ceil / kern, $i }'
}
export -f side rows
export JAXGEMV_REPO="$repo"  # the snippet runs from /tmp: the repository's tools are under this

cd /tmp
IFS=';' read -ra test_runs <<<"${JAXGEMV_SIDES_TESTS:-}"
for run in "${test_runs[@]}"; do
  [ -n "$run" ] || continue
  name=${run%%:*}
  echo "== tests $name: ${run#*:}"
  # A patched side runs its own tree's tests (a patch may add some) against its own build.
  tests="$repo/tests"
  [ "$name" = main ] || tests="/tmp/side-$name/tests"
  # At the limit pytest gets SIGINT, not SIGTERM, so that it stops its workers and still prints
  # its summary (what passed and failed so far, and the slowest tests, for splitting the suite
  # between calls); killed 30 s later if it has not exited.
  side "$name" env XLA_PYTHON_CLIENT_PREALLOCATE=false timeout -s INT -k 30 "${JAXGEMV_TEST_LIMIT:-240}" \
    python3 -m pytest -q -p no:benchmark --durations=25 -n "${JAXGEMV_TEST_WORKERS:-16}" -k "${run#*:}" "$tests" \
    >"$out/tests-${name//+/_}.log" 2>&1  # "a+b" as a_b: the run tool brings back plain names only
  echo "pytest exit $?"; grep -E "^(FAILED|ERROR) " "$out/tests-${name//+/_}.log" | head -20
  tail -3 "$out/tests-${name//+/_}.log"
done
echo "== runs"
timeout "${JAXGEMV_SIDES_LIMIT:-400}" bash -c "${JAXGEMV_SIDES_RUN:-}" 2>"$out/runs.err" | tee "$out/runs.txt"
echo "== done: $((SECONDS - start)) s"
