#!/usr/bin/env bash
# Where does the wgmma variant's M = 1 time go that the probe's does not? (perf log 167.) One
# device call on any sm_90 card, repository root, .prebuilt carried (main and the probe binary):
#
#   bash docs/experiments/wgmma_diag.sh
#
# The same counters, read by Nsight Compute on cold caches at the GPU's own clocks, for FP8
# 5120 x 17408 at M = 1: the library's wgmma GEMV and its counters' kernel, "mma"'s GEMV, the read
# kernel on the library's bytes (tools/profile_case.py), and tools/wgmma_probe.cu's
# "KS8 S4 swz split-major" case and its read kernel; then the probe's own timing of that case.
# A duration gap with equal DRAM bytes and an even spread over the SMs (cycles active, max against
# mean) points at the loop; a spread gap at the grid; extra bytes at the loads.
set -u
out=${OUT:-/tmp/jaxgemv-out}
mkdir -p "$out"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed
metrics+=,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,gpc__cycles_elapsed.max
metrics+=,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
metrics+=,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,launch__grid_size
metrics+=,lts__t_sectors_srcunit_tex_op_read.sum,smsp__cycles_active.avg
ncu_csv() {  # TAG KERNEL_REGEX COUNT command...
  local tag=$1 re=$2 count=$3
  shift 3
  timeout 120 ncu --clock-control none --cache-control all -k regex:"$re" -c "$count" --metrics "$metrics" --csv \
    "$@" >"$out/$tag.csv" 2>"$out/$tag.err" || { echo "$tag: ncu failed"; tail -3 "$out/$tag.err"; }
}
if [ "${1:-}" = --one ]; then  # from the run below, inside main's side: one profile
  shift
  ncu_csv "$@"
  exit 0
fi
probe=.prebuilt/wgmma_probe
PROBE_SRC="tools/wgmma_probe.cu tools/probe_util.cuh ffi/stream_read.cuh ffi/cuda_util.cuh"
# shellcheck disable=SC2086
[ -x "$probe" ] && [ "$(cat $PROBE_SRC | sha256sum)" = "$(cat .prebuilt/wgmma_probe.key 2>/dev/null)" ] ||
  { probe=/tmp/wgmma_probe; nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iffi tools/wgmma_probe.cu \
      -o "$probe" >"$out/probe_build.txt" 2>&1 || echo "wgmma_probe: build failed"; }
case_name="KS8 S4 swz split-major"
# shellcheck disable=SC2016
run='
cd "$JAXGEMV_REPO"
for v in wgmma mma; do
  side main env JAXGEMV_VARIANT=$v bash docs/experiments/wgmma_diag.sh --one lib-$v "Fp8Wgmma|MmaGemv|StreamRead" 4 \
    python3 tools/profile_case.py fp8@f16:5120,17408,1
done
'
ncu_csv probe WgmmaFp8Kernel 2 "$probe" 5120 17408 "$case_name"
ncu_csv probe-read StreamRead 2 "$probe" 5120 17408 "$case_name"
timeout 60 "$probe" 5120 17408 "$case_name" 2>&1 | tee "$out/probe.txt"
export JAXGEMV_REPO=$PWD
JAXGEMV_SIDES_LIMIT=240 JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh 2>&1 | tee "$out/sides.txt" | tail -5
python3 - "$out" <<'EOF'
import csv, glob, os, sys
out = sys.argv[1]
want = ["gpu__time_duration.sum", "dram__bytes_read.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__cycles_active.avg", "sm__cycles_active.max", "sm__cycles_active.min", "smsp__inst_executed.sum",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__grid_size", "launch__registers_per_thread"]
short = ["us", "MB", "dram%", "act.avg", "act.max", "act.min", "inst", "warps%", "grid", "regs"]
print(f"{'run':12s} {'kernel':28s} " + " ".join(f"{s:>9s}" for s in short))
for path in sorted(glob.glob(os.path.join(out, "*.csv"))):
    rows = {}
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        name = r["Kernel Name"].replace("void ", "").replace("jaxgemv::", "")
        key = (r["ID"], name[:28])
        rows.setdefault(key, {})[r["Metric Name"]] = (r["Metric Unit"], r["Metric Value"])
    for (i, name), m in rows.items():
        vals = []
        for w in want:
            unit, v = m.get(w, ("", "-"))
            try:
                x = float(v.replace(",", ""))
                if w == "gpu__time_duration.sum":
                    x *= {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3}.get(unit, float("nan"))
                if w == "dram__bytes_read.sum":
                    x = x * {"byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1, "Gbyte": 1e3}.get(unit, float("nan"))
                vals.append(f"{x:9.1f}" if x < 1e7 else f"{x:9.3g}")
            except ValueError:
                vals.append(f"{v:>9s}")
        print(f"{os.path.basename(path)[:-4]:12s} {name:28s} " + " ".join(vals))
EOF
