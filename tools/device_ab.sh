#!/usr/bin/env bash
# A/B of two commits in one call on the lent GPU: both wheels built in parallel, the GPU tests on
# the candidate, then the same benchmark commands on each build, alternating B, A, B so that a
# drift of the machine shows up as a disagreement between the two B runs.
#
#   git archive --format=tar main -o snap.tar; git archive --format=tar next/x -o snapb.tar
#   (device) JAXGEMV_AB_BENCH="--shapes qwen3_lm_head --m 1,8;--format int4 --shapes qwen3_lm_head --m 1,8" \
#            bash tools/device_ab.sh            # snap.tar = A (baseline), snapb.tar = B (candidate)
#   The tars are git-ignored (never committed): the device call names them in its carry list.
#   For the patches of docs/experiments against main, tools/device_patches.sh needs no tars.
#
# JAXGEMV_AB_BENCH: benchmark argument lists separated by ";" (each run with --no-baselines); a
# list may start with VAR=value words, set for that run only (e.g. "JAXGEMV_XS=8 --m 16").
# JAXGEMV_SKIP_TESTS=1 skips the GPU tests; JAXGEMV_TEST_SIDES says which builds run them
# (default "b"), JAXGEMV_TEST_WORKERS with how many pytest-xdist workers (default 8). A third
# build, C, is made from snapc.tar when it is there (a second candidate: tested when
# JAXGEMV_TEST_SIDES names it). JAXGEMV_AB_ROUNDS orders the benchmark rounds
# (default "b1 a1 b2", then "c1" if C was built; "none": no rounds). JAXGEMV_AB_DECODE="nvfp4,bf16"
# also times the 8B decode example of each side's own tree in every round (batch
# JAXGEMV_AB_DECODE_BATCH, default 1; the ms/step lines join the tables);
# JAXGEMV_AB_DECODE_PROFILE=1 profiles it once per side (the "-- ap", "-- bp" tables);
# JAXGEMV_AB_DECODE_ATTENTION=xla runs both with XLA's attention (default jaxgemv, the example's);
# JAXGEMV_AB_ATTENTION="tools/attention_bench.py arguments" times decode_attention in every round
# (lines "attention ..."), JAXGEMV_AB_ATTENTION_PROFILE="1:39 1:16383" (batch:pos) profiles its
# kernel once per side under Nsight Compute;
# JAXGEMV_AB_PROFILE runs Nsight Compute on cases under each side (below). Logs and tables land in
# $OUT.
set -uo pipefail
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$(pwd)
source "$here/tools/ncu_report.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$out/gpu.txt"

rm -rf /tmp/ab-a /tmp/ab-b /tmp/ab-c /tmp/ab-wa /tmp/ab-wb /tmp/ab-wc
mkdir -p /tmp/ab-a /tmp/ab-b
tar -xf "$here/snap.tar" -C /tmp/ab-a && tar -xf "$here/snapb.tar" -C /tmp/ab-b || { echo "need snap.tar and snapb.tar"; exit 1; }
sides="a b"
if [ -f "$here/snapc.tar" ]; then mkdir -p /tmp/ab-c && tar -xf "$here/snapc.tar" -C /tmp/ab-c && sides="a b c"; fi
start=$SECONDS
for side in $sides; do
  ( cd /tmp/ab-$side && python3 -m pip wheel --no-build-isolation --no-deps -q -w /tmp/ab-w$side . \
      -C cmake.define.JAXGEMV_CUDA_ARCHITECTURES=90 >"$out/build-$side.log" 2>&1 ) &
done
wait
echo "== builds: $((SECONDS - start)) s"
install() {
  python3 -m pip install --no-deps -q --force-reinstall /tmp/ab-w$1/*.whl >"$out/install-$1.log" 2>&1 \
    || { echo "install $1 failed"; tail -5 "$out/build-$1.log"; exit 1; }
}

cd /tmp
# The GPU tests of each side in JAXGEMV_TEST_SIDES (default: the candidate, b; "b c" also tests a
# second candidate when C is built).
if [ "${JAXGEMV_SKIP_TESTS:-0}" != "1" ]; then
  for side in ${JAXGEMV_TEST_SIDES:-b}; do
    [ -d "/tmp/ab-w$side" ] || { echo "no build $side to test"; continue; }
    install "$side"
    XLA_PYTHON_CLIENT_PREALLOCATE=false timeout "${JAXGEMV_TEST_LIMIT:-240}" python3 -m pytest -q -rA \
      -p no:benchmark -n "${JAXGEMV_TEST_WORKERS:-8}" -k "${JAXGEMV_TEST_FILTER:-gpu or ksplit or dequantize}" \
      /tmp/ab-$side/tests >"$out/tests-$side.log" 2>&1
    echo "== GPU tests of $side: pytest exit $?"
    tail -1 "$out/tests-$side.log"; grep -E "^(FAILED|ERROR)" "$out/tests-$side.log" | head -10
  done
fi

IFS=';' read -ra benches <<<"${JAXGEMV_AB_BENCH:---shapes qwen3_lm_head --m 1,4,8}"
run() {  # side, round
  for i in "${!benches[@]}"; do
    local envs=() args=()
    for word in ${benches[$i]}; do
      if [ ${#args[@]} -eq 0 ] && [[ $word =~ ^[A-Z_][A-Z0-9_]*= ]]; then envs+=("$word"); else args+=("$word"); fi
    done
    [ ${#envs[@]} -gt 0 ] && echo "# ${envs[*]}" >>"$out/ab-$1$2.txt"
    timeout "${JAXGEMV_BENCH_LIMIT:-200}" env ${envs[@]+"${envs[@]}"} python3 -m jaxgemv.bench "${args[@]}" --no-baselines \
      --json "$out/$1$2-$i.json" 2>>"$out/bench-$1$2.err" | grep -vE "^(shape|-)" >>"$out/ab-$1$2.txt"
  done
  if [ -n "${JAXGEMV_AB_DECODE:-}" ]; then
    # The example of this side's tree (a change to the model is part of what is compared); a
    # compilation cache per side keeps later rounds from recompiling.
    JAX_COMPILATION_CACHE_DIR=/tmp/ab-jcache-$1 JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
      timeout "${JAXGEMV_DECODE_LIMIT:-240}" python3 /tmp/ab-$1/examples/decode.py --config 8b \
      --batch "${JAXGEMV_AB_DECODE_BATCH:-1}" --formats "$JAXGEMV_AB_DECODE" --dtype f16 \
      --attention "${JAXGEMV_AB_DECODE_ATTENTION:-jaxgemv}" 2>>"$out/decode-$1$2.err" \
      | grep -E " batch +[0-9]+:" | sed "s/^/decode /" >>"$out/ab-$1$2.txt"
  fi
  if [ -n "${JAXGEMV_AB_ATTENTION:-}" ]; then
    timeout "${JAXGEMV_ATTENTION_LIMIT:-120}" python3 /tmp/ab-$1/tools/attention_bench.py $JAXGEMV_AB_ATTENTION \
      2>>"$out/attention-$1$2.err" | sed "s/^/attention /" >>"$out/ab-$1$2.txt"
  fi
}
default_rounds="b1 a1 b2"
[ "$sides" = "a b c" ] && default_rounds="b1 a1 b2 c1"
rounds=${JAXGEMV_AB_ROUNDS:-$default_rounds}
[ "$rounds" = "none" ] && rounds=""  # only the profiles below
for step in $rounds; do
  side=${step:0:1}
  install "$side"
  run "$side" "${step:1}"
done
# JAXGEMV_AB_DECODE_PROFILE=1: after the rounds, each side's own 8B decode step profiled once
# (tools/decode_profile.py of its tree, NVFP4, batch 1): kernels per step and their kinds, so
# that a change to the step's kernel count shows beside its time.
profiled=""
if [ "${JAXGEMV_AB_DECODE_PROFILE:-0}" = "1" ]; then
  for side in $sides; do
    install "$side"
    timeout "${JAXGEMV_DECODE_LIMIT:-240}" python3 /tmp/ab-$side/tools/decode_profile.py --config 8b --batch 1 \
      --formats nvfp4 --dtype f16 --top 12 --attention "${JAXGEMV_AB_DECODE_ATTENTION:-jaxgemv}" \
      >"$out/ab-${side}p.txt" 2>"$out/decode-profile-$side.err"
    profiled="$profiled ${side}p"
  done
fi
echo "== rounds ($rounds): a snap.tar, b snapb.tar, c snapc.tar; columns: shape N K M format variant us spread TB/s %ceil"
for f in $(echo $rounds $profiled | tr ' ' '\n' | sort -u); do echo "-- $f"; cat "$out/ab-$f.txt"; done | tee "$out/bench-ab.txt"
# JAXGEMV_AB_PROFILE="nvfp4:6144,4096,1 ...": Nsight Compute on each case under each side's build
# (the first MmaGemv/ScalarGemv kernel, full sections; JAXGEMV_PROFILE_LIMIT seconds each, 150 by
# default), the stall summary of tools/ncu_stalls.py and a few headline metrics printed per side.
for side in $([ -n "${JAXGEMV_AB_PROFILE:-}" ] && echo $sides); do
  install "$side"
  for case in $JAXGEMV_AB_PROFILE; do
    echo "== profile $case on $side"
    ncu_report "$out" "prof-$side-$(echo "$case" | tr ':,' '__')" "MmaGemv|ScalarGemv" "/tmp/ab-$side/tools" \
      python3 "/tmp/ab-$side/tools/profile_case.py" "$case"
  done
done
# decode_attention's kernel under Nsight Compute, per side: duration, stall summary, headline metrics.
for side in $([ -n "${JAXGEMV_AB_ATTENTION_PROFILE:-}" ] && echo $sides); do
  install "$side"
  for case in $JAXGEMV_AB_ATTENTION_PROFILE; do
    echo "== profile decode_attention batch:pos $case on $side"
    ncu_report "$out" "prof-$side-attention-${case/:/_}" DecodeAttention "/tmp/ab-$side/tools" \
      python3 "/tmp/ab-$side/tools/attention_bench.py" --batch "${case%:*}" --pos "${case#*:}" --layers 1 \
      --repeats 1 --variants kernel
  done
done
# The device tool brings back a few files: everything but the tables goes into one archive.
( cd "$out" && ls | grep -vE '^(bench-ab\.txt|gpu\.txt|logs\.tgz)$' >/tmp/ab-logs.lst && \
  tar czf logs.tgz -T /tmp/ab-logs.lst && xargs rm -f </tmp/ab-logs.lst )
