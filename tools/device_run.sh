#!/usr/bin/env bash
# One call on the lent H200 does everything: build the extension, run the GPU tests, run the
# benchmark; logs land in $OUT and a short table is printed last.
#
#   JAXGEMV_COMMIT=<hash> tools/device_run.sh [bench args...]   (repository root, GPU machine)
#
# The copy on the GPU machine has no .git: pass the commit being measured in JAXGEMV_COMMIT so
# that it lands in the logs and the benchmark's JSON.
# Builds machine code for sm_90 only (the GPU at hand) to keep the build short; CI and users
# build the full architecture list. JAXGEMV_TEST_WORKERS: pytest-xdist workers for the GPU tests
# (default 8, under which 285 tests took 171 s; the machine has 16 cores, 16 is untried).
# Optional stages: JAXGEMV_SKIP_TESTS=1, JAXGEMV_SKIP_BENCH=1,
# JAXGEMV_FORMATS="fp8 int4" (the same benchmark for other formats), JAXGEMV_DECODE=1 (the 8B
# decode example and its check), JAXGEMV_DECODE_PROFILE=1 (with JAXGEMV_DECODE_FLOOR=1),
# JAXGEMV_DECODE_KNOBS, JAXGEMV_SMALL, JAXGEMV_SWEEP, JAXGEMV_PROFILE, JAXGEMV_SANITIZE,
# JAXGEMV_ATTENTION_BENCH (below); each stage has a
# time limit (JAXGEMV_*_LIMIT, seconds).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/tools/ncu_report.sh"
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# Several test processes share the GPU: allocate on demand instead of 75% each.
export XLA_PYTHON_CLIENT_PREALLOCATE=false

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/gpu.txt"
echo "commit ${JAXGEMV_COMMIT:-unknown}" | tee -a "$out/gpu.txt"

echo "== build"
( cd "$repo" && python3 -m pip install --no-build-isolation --no-deps -q . \
    -C cmake.define.JAXGEMV_CUDA_ARCHITECTURES=90 ) >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
grep -E "spill|error" "$out/build.log" | grep -v "0 bytes spill" | head -5

# Run from outside the repository so that `import jaxgemv` finds the installed build.
cd /tmp
if [ "${JAXGEMV_SKIP_TESTS:-0}" != "1" ]; then
  echo "== tests"
  # The GPU tests (the rest runs in CI); a stage limit keeps a slow stage from eating the call.
  timeout -s INT -k 30 "${JAXGEMV_TEST_LIMIT:-240}" python3 -m pytest -q -rA -p no:benchmark --durations=25 -n "${JAXGEMV_TEST_WORKERS:-8}" \
    -k "${JAXGEMV_TEST_FILTER:-gpu or ksplit or dequantize}" "$repo/tests" >"$out/tests.log" 2>&1
  echo "pytest exit $?"; tail -5 "$out/tests.log"
fi

# JAXGEMV_SANITIZE="pytest -k filter": those GPU tests again under compute-sanitizer's memcheck
# (one process: slow; keep the filter narrow), e.g. "attention_gpu".
if [ -n "${JAXGEMV_SANITIZE:-}" ]; then
  echo "== compute-sanitizer memcheck: $JAXGEMV_SANITIZE"
  # Without XLA's command buffers (a run with them segfaulted under the sanitizer, session 17).
  timeout "${JAXGEMV_SANITIZE_LIMIT:-240}" env XLA_FLAGS="--xla_gpu_enable_command_buffer=" \
    compute-sanitizer --tool memcheck --print-limit 20 python3 -m pytest -q -x \
    -p no:benchmark -k "$JAXGEMV_SANITIZE" "$repo/tests" >"$out/sanitize.log" 2>&1
  echo "exit $?"; grep -E "ERROR SUMMARY|passed|failed|Invalid|Race" "$out/sanitize.log" | head -10
fi

unset XLA_PYTHON_CLIENT_PREALLOCATE
# JAXGEMV_ATTENTION_BENCH=1: tools/attention_bench.py (decode_attention against XLA's path), with
# JAXGEMV_ATTENTION_ARGS as its arguments (e.g. "--pos 39,127,1023 --trace").
if [ "${JAXGEMV_ATTENTION_BENCH:-0}" = "1" ]; then
  echo "== attention bench"
  timeout "${JAXGEMV_ATTENTION_LIMIT:-180}" python3 "$repo/tools/attention_bench.py" ${JAXGEMV_ATTENTION_ARGS:-} 2>"$out/attention.err" \
    | tee "$out/bench-attention.txt"
fi
# Nsight Compute on decode_attention: JAXGEMV_ATTENTION_PROFILE="1:39 1:16383" (batch:pos, Qwen3-8B
# heads, one layer, cold caches): the full section set and the per-instruction stall samples.
for case in ${JAXGEMV_ATTENTION_PROFILE:-}; do
  echo "== profile decode_attention batch:pos $case"
  ncu_report "$out" "prof-attention-${case/:/_}" DecodeAttention "$repo/tools" python3 "$repo/tools/attention_bench.py" \
    --batch "${case%:*}" --pos "${case#*:}" --layers 1 --repeats 1 --variants kernel
done
if [ "${JAXGEMV_SKIP_BENCH:-0}" != "1" ]; then
  echo "== bench"
  timeout "${JAXGEMV_BENCH_LIMIT:-420}" python3 -m jaxgemv.bench --json "$out/bench.json" "$@" \
    2>"$out/bench.err" | tee "$out/bench.txt"
  tail -3 "$out/bench.err"
fi
# More formats with the same benchmark arguments: JAXGEMV_FORMATS="fp8 int4".
for fmt in ${JAXGEMV_FORMATS:-}; do
  echo "== bench $fmt"
  timeout "${JAXGEMV_BENCH_LIMIT:-420}" python3 -m jaxgemv.bench --format "$fmt" --json "$out/bench-$fmt.json" "$@" \
    2>"$out/bench-$fmt.err" | tee "$out/bench-$fmt.txt"
done
# The 8B decode example (issue 3's numbers): JAXGEMV_DECODE=1 times nvfp4, fp8 and dense f16 at
# batch 1, 4, 8, then checks nvfp4 against float32 over 32 greedy steps.
# JAXGEMV_DECODE_ATTENTION="xla jaxgemv": the same per attention (examples/decode.py --attention;
# default jaxgemv, the example's), and the decode profile below too.
if [ "${JAXGEMV_DECODE:-0}" = "1" ]; then
  for att in ${JAXGEMV_DECODE_ATTENTION:-jaxgemv}; do
    echo "== decode 8b, $att attention"
    timeout "${JAXGEMV_DECODE_LIMIT:-300}" python3 "$repo/examples/decode.py" --config 8b --batch 1,4,8 \
      --formats "${JAXGEMV_DECODE_FORMATS:-nvfp4,fp8,bf16}" --dtype f16 --attention "$att" 2>&1 \
      | tee "$out/decode-$att.txt" | tail -12
    timeout "${JAXGEMV_DECODE_LIMIT:-300}" python3 "$repo/examples/decode.py" --config 8b --check --dtype f16 \
      --batch 1 --attention "$att" 2>&1 | tee "$out/decode-check-$att.txt" | tail -5
  done
fi
# Where the 8B decode step's time goes (tools/decode_profile.py): JAXGEMV_DECODE_PROFILE=1, formats
# in JAXGEMV_DECODE_FORMATS (default nvfp4,bf16; the decode stage above reads it too). The same
# profile under planner knobs, NVFP4 only, one run per setting separated by ";" (each forces every
# product of the step, so read the per-projection rows); each setting recompiles the loop (~60-80 s
# on the H200):
#   JAXGEMV_DECODE_KNOBS="JAXGEMV_KSPLIT=2;JAXGEMV_KSPLIT=8;JAXGEMV_LOADS=1"
# JAXGEMV_DECODE_FLOOR=1 adds the read floor of the quantized formats' steps to the default
# profile (decode_profile.py --floor: per projection, the streaming-read kernel on its bytes in the
# same kind of loop, ~4.3 GB of buffers for NVFP4 at 8B).
profile_decode() {  # output name, formats, VAR=value settings...; $profile_args: more arguments
  local name=$1 formats=$2
  shift 2
  timeout "${JAXGEMV_DECODE_LIMIT:-300}" env "$@" python3 "$repo/tools/decode_profile.py" --config 8b --batch 1 \
    --formats "$formats" --dtype f16 --top 16 ${profile_args:-} 2>"$out/$name.err" | tee "$out/$name.txt"
}
if [ "${JAXGEMV_DECODE_PROFILE:-0}" = "1" ]; then
  for att in ${JAXGEMV_DECODE_ATTENTION:-jaxgemv}; do
    echo "== decode profile 8b, $att attention"
    profile_args="--attention $att $([ "${JAXGEMV_DECODE_FLOOR:-0}" = "1" ] && echo --floor)" \
      profile_decode "decode-profile-$att" "${JAXGEMV_DECODE_FORMATS:-nvfp4,bf16}"
  done
fi
if [ -n "${JAXGEMV_DECODE_KNOBS:-}" ]; then
  IFS=';' read -ra knob_sets <<<"$JAXGEMV_DECODE_KNOBS"
  for i in "${!knob_sets[@]}"; do
    echo "== decode profile 8b, nvfp4, ${knob_sets[$i]}"
    profile_decode "decode-knobs-$i" nvfp4 ${knob_sets[$i]}
  done
fi
# Small products timed kernel by kernel under Nsight Compute (tools/small_products.py), with the
# read kernel on the same bytes timed the same way: JAXGEMV_SMALL="FORMAT VARIANTS M SHAPE...",
# several separated by ";", e.g. "dense splitk,xla 1,4,8 1x2048 32x4096; nvfp4 auto 4 512x2048".
if [ -n "${JAXGEMV_SMALL:-}" ]; then
  # Nsight Compute crashed the process when it profiled XLA's autotuning (commit 3669779): a
  # first run without it fills JAX's compilation cache, so the profiled run compiles nothing.
  export JAX_COMPILATION_CACHE_DIR=/tmp/jaxgemv-jax-cache JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
  ncu_time="ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum --csv"
  small="$repo/tools/small_products.py"
  IFS=';' read -ra specs <<<"$JAXGEMV_SMALL"
  i=0
  for spec in "${specs[@]}"; do
    set -- $spec
    fmt=$1 variants=$2 ms=$3; shift 3
    i=$((i + 1)); tag=small$i-$fmt
    echo "== small products $fmt"
    lim=${JAXGEMV_SMALL_LIMIT:-240}
    timeout "$lim" python3 "$small" --cases "$out/$tag.json" --format "$fmt" --variant "$variants" --m "$ms" \
        --shapes "$@" >/dev/null 2>"$out/$tag-warm.err"
    timeout "$lim" $ncu_time python3 "$small" --cases "$out/$tag.json" --format "$fmt" --variant "$variants" \
        --m "$ms" --shapes "$@" >"$out/$tag-kernels.csv" 2>"$out/$tag.err" || { echo "ncu failed"; tail -5 "$out/$tag.err"; }
    timeout "$lim" $ncu_time python3 "$small" --cases "$out/$tag.json" --reads >"$out/$tag-reads.csv" 2>>"$out/$tag.err" \
      || { echo "ncu (reads) failed"; tail -5 "$out/$tag.err"; }
    python3 "$small" --report "$out/$tag-kernels.csv" --reads-report "$out/$tag-reads.csv" --cases "$out/$tag.json" \
      2>&1 | tee "$out/bench-$tag.txt"
  done
  unset JAX_COMPILATION_CACHE_DIR JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES
fi
# Launch-parameter sweep on one case: JAXGEMV_SWEEP="shape M ksplit:loads ...", each forced.
if [ -n "${JAXGEMV_SWEEP:-}" ]; then
  set -- $JAXGEMV_SWEEP
  shape=$1 m=$2; shift 2
  echo "== sweep $shape M=$m"
  for kl in "$@"; do
    r=$(JAXGEMV_KSPLIT=${kl%:*} JAXGEMV_LOADS=${kl#*:} timeout 120 python3 -m jaxgemv.bench \
        --shapes "$shape" --m "$m" --variant mma --no-baselines 2>>"$out/sweep.err" | tail -1)
    echo "ksplit:loads $kl | $r"
  done | tee "$out/sweep.txt"
fi
# Nsight Compute on a few cases: JAXGEMV_PROFILE="nvfp4:248320,2048,4 fp8:5120,17408,1". The full
# section set goes to $OUT (report, details page, per-instruction SASS samples as CSV); a few
# headline metrics are printed.
for case in ${JAXGEMV_PROFILE:-}; do
  echo "== profile $case"
  ncu_report "$out" "prof-$(echo "$case" | tr ':,' '__')" "MmaGemv|ScalarGemv" "$repo/tools" \
    python3 "$repo/tools/profile_case.py" "$case"
done
# Fewer files come back than a run can write: everything but the tables goes into one archive.
( cd "$out" && ls | grep -vE '^(bench.*\.txt|gpu\.txt|logs\.tgz)$' >/tmp/jaxgemv-logs.lst && \
  tar czf logs.tgz -T /tmp/jaxgemv-logs.lst && xargs rm -f </tmp/jaxgemv-logs.lst )
