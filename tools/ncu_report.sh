# Sourced by tools/device_run.sh and tools/device_ab.sh: one Nsight Compute profile and its report.
#
#   ncu_report OUT TAG KERNEL_REGEX TOOLS_DIR command...
#
# Profiles the first kernel matching KERNEL_REGEX that `command` launches (full section set, the
# GPU's own clocks; JAXGEMV_PROFILE_LIMIT seconds, 150 by default) into OUT/TAG.ncu-rep, writes its
# details page (OUT/TAG.txt) and per-instruction samples (OUT/TAG-sass.csv), prints the stall
# summary of TOOLS_DIR/ncu_stalls.py (also OUT/bench-TAG-stalls.txt) and a few headline metrics.
# Returns 1 (after the log's tail) when ncu fails.
ncu_report() {
  local out=$1 tag=$2 kernels=$3 tools=$4
  shift 4
  ( cd /tmp && timeout "${JAXGEMV_PROFILE_LIMIT:-150}" ncu --clock-control none -k regex:"$kernels" -c 1 \
      --set full --import-source no -f -o "$out/$tag" "$@" >"$out/$tag.log" 2>&1 ) \
    || { echo "ncu failed"; tail -5 "$out/$tag.log"; return 1; }
  ncu --import "$out/$tag.ncu-rep" --page details >"$out/$tag.txt" 2>&1
  ncu --import "$out/$tag.ncu-rep" --page source --csv --print-source sass >"$out/$tag-sass.csv" 2>/dev/null
  python3 "$tools/ncu_stalls.py" --top 8 "$out/$tag-sass.csv" | tee "$out/bench-$tag-stalls.txt"
  grep -E "^\s+(Duration|Elapsed Cycles|DRAM Throughput|L1/TEX Hit Rate|L1/TEX Cache Throughput|L2 Hit Rate|L2 Cache Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Dynamic Shared Memory Per Block|Block Limit Shared Mem|Executed Ipc Active|Issue Slots Busy|Mem Pipes Busy|Grid Size|Cluster Size) " \
      "$out/$tag.txt" | sed 's/  */ /g'
}
