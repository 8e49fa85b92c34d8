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
metrics+=,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,smsp__inst_executed.sum
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread
ncu_csv() {  # TAG KERNEL_REGEX COUNT command...
  local tag=$1 re=$2 count=$3
  shift 3
  timeout 120 ncu --clock-control none --cache-control all -k regex:"$re" -c "$count" --metrics "$metrics" --csv \
    "$@" >"$out/$tag.csv" 2>"$out/$tag.err" || { echo "$tag: ncu failed"; tail -3 "$out/$tag.err"; }
}
export out metrics
export -f ncu_csv

probe=$(bash tools/wgmma_probe_bin.sh "$out/probe_build.txt")
[ -n "$probe" ] || echo "wgmma_probe: build failed"
case_name="KS8 S4 swz split-major"
ncu_csv probe WgmmaFp8Kernel 2 "$probe" 5120 17408 "$case_name"
ncu_csv probe-read StreamRead 2 "$probe" 5120 17408 "$case_name"
timeout 60 "$probe" 5120 17408 "$case_name" 2>&1 | tee "$out/probe.txt"

# The library's kernels, from main's build (tools/device_patches.sh's side).
# shellcheck disable=SC2016
run='
cd "$JAXGEMV_REPO"
for v in wgmma mma; do
  side main env JAXGEMV_VARIANT=$v bash -c "ncu_csv \"\$@\"" _ lib-$v "Fp8Wgmma|MmaGemv|StreamRead" 4 \
    python3 tools/profile_case.py fp8@f16:5120,17408,1
done
'
JAXGEMV_SIDES_LIMIT=240 JAXGEMV_SIDES_RUN="$run" bash tools/device_patches.sh 2>&1 | tee "$out/sides.txt" | tail -5

# One line per profiled kernel (tools/small_products.py reads the CSV).
python3 - "$out" <<'EOF'
import glob, os, sys
sys.path.insert(0, "tools")
from small_products import kernel_metrics  # noqa: E402
cols = [("us", "gpu__time_duration.sum", 1), ("MB", "dram__bytes_read.sum", 1e-6),
        ("dram%", "dram__throughput.avg.pct_of_peak_sustained_elapsed", 1), ("act.avg", "sm__cycles_active.avg", 1),
        ("act.max", "sm__cycles_active.max", 1), ("act.min", "sm__cycles_active.min", 1),
        ("Minst", "smsp__inst_executed.sum", 1e-6), ("warps%", "sm__warps_active.avg.pct_of_peak_sustained_active", 1),
        ("grid", "launch__grid_size", 1), ("regs", "launch__registers_per_thread", 1)]
print(f"{'run':12s} {'kernel':28s} " + " ".join(f"{c:>9s}" for c, _, _ in cols))
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.csv"))):
    with open(path) as f:
        for name, m in kernel_metrics(f.read()):
            name = name.replace("void ", "").replace("jaxgemv::", "")[:28]
            vals = " ".join(f"{m[k] * scale:9.1f}" if k in m else f"{'-':>9s}" for _, k, scale in cols)
            print(f"{os.path.basename(path)[:-4]:12s} {name:28s} {vals}")
EOF
