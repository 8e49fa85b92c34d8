"""Offline estimate of how many waves each planned tensor-core grid takes on an H200, no GPU needed.

    python3 tools/waves.py BUILD_DIR [--min 1.0 --max 1.4]

BUILD_DIR is a scikit-build build directory (`-C build-dir=...`) holding mma/mma_<format>_<type>.cu.
Each is compiled with `ptxas -v` for sm_90 (registers per instance); a small host program prints
the rings' shared memory (MmaRingSharedBytes); the planner gives each product's plan; the held
instance, K split 6 in place of 8, half the K split at M > 1 and FP8's K split 8 at M = 1 are
applied as the launcher applies them (ffi/gemv_launch.cuh, its rules read from ffi/common.h
through _ext; x staged at M = 1 is not: counted with x in the ring, as the K split 6 rule counts
it). The plans are the benchmark's (jaxgemv/bench.py: FORMATS, FP8 blocks of (1, 128), int4 /
int8 of 32). Blocks per SM: 64K registers (256 per warp granule), 228 KB of shared memory (1 KB
reserved per block), 2048 threads, 32 blocks. Prints the grids whose
waves fall in (--min, --max]: where a tail wave runs on an idle device (docs/perf-log.md, entry 127).
An estimate: the launcher reads the occupancy API on the device itself.
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor

import jax.ffi

from jaxgemv import _ext, bench
from jaxgemv.device import DeviceFacts

ROOT = pathlib.Path(__file__).resolve().parent.parent
TAGS = [f"{f}_{t}" for f in ("fp8", "nvfp4", "int4", "int8") for t in ("f16", "bf16")]
SHAPES = {"llama3-8b": [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
          "llama3-70b": [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672)],
          "qwen3-8b": [(6144, 4096), (24576, 4096), (4096, 12288)],
          "qwen3-14b": [(7168, 5120), (5120, 5120), (34816, 5120), (5120, 17408)],
          "qwen3-32b": [(10240, 5120), (5120, 8192), (51200, 5120), (5120, 25600)],
          "bench": [(17408, 5120), (12288, 4096), (8192, 28672), (20480, 4096)]}
SMEM_SRC = r"""
#include "gemv_launch.cuh"
#include "nvfp4.cuh"
#include "fp8.cuh"
#include "nbits.cuh"
#include <cstdio>
using namespace jaxgemv;
template <typename F, typename T, int KS, int LD> void One(const char* tag) {
  printf("%s %d %d %d %d\n", tag, KS, LD, MmaRingSharedBytes<F, T, KS, LD>(false),
         MmaRingSharedBytes<F, T, KS, LD>(true));
}
template <typename F, typename T> void All(const char* tag) {
  One<F, T, 1, 1>(tag); One<F, T, 1, 2>(tag); One<F, T, 2, 1>(tag); One<F, T, 2, 2>(tag); One<F, T, 4, 1>(tag);
  One<F, T, 4, 2>(tag); One<F, T, 6, 1>(tag); One<F, T, 6, 2>(tag); One<F, T, 8, 1>(tag); One<F, T, 8, 2>(tag);
}
int main() {
  All<Fp8E4m3, __half>("fp8_f16"); All<Fp8E4m3, __nv_bfloat16>("fp8_bf16");
  All<Nvfp4, __half>("nvfp4_f16"); All<Nvfp4, __nv_bfloat16>("nvfp4_bf16");
  All<Nbits<4>, __half>("int4_f16"); All<Nbits<4>, __nv_bfloat16>("int4_bf16");
  All<Nbits<8>, __half>("int8_f16"); All<Nbits<8>, __nv_bfloat16>("int8_bf16");
}
"""


def nvcc_flags():
    return ["-std=c++17", "-O3", "-DNDEBUG", "-DJAXGEMV_WITH_CUDA", "--expt-relaxed-constexpr", "-arch=sm_90",
            f"-I{jax.ffi.include_dir()}", f"-I{ROOT / 'ffi'}", f"-I{sysconfig.get_paths()['include']}"]


def registers(build):
    def one(tag):
        src = pathlib.Path(build) / "mma" / f"mma_{tag}.cu"
        out = subprocess.run(["nvcc", *nvcc_flags(), "-Xptxas", "-v", "-c", str(src), "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
        found, name = {}, None
        for line in out.splitlines():
            m = re.search(r"Compiling entry function .(_Z\w+).", line)
            if m:
                name = subprocess.run(["c++filt", m.group(1)], capture_output=True, text=True).stdout
                continue
            m = re.search(r"Used (\d+) registers", line)
            if m and name:
                k = re.search(r"MmaGemvKernel<[^,]+, [^,]+, (\d+), (\d+), (\d+), (true|false), (\d+), (\d+)"
                              r"(?:, (true|false))?>", name)
                if k:  # the M = 2 block-column instances (COLS2) under a key of their own
                    mt, ks, ld, xp, xs, mb = k.groups()[:6]
                    key = (tag, int(mt), int(ks), int(ld), xp == "true", int(xs), int(mb))
                    found[key + (k.group(7) == "true",)] = int(m.group(1))
                name = None
        return found
    regs = {}
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        for found in pool.map(one, TAGS):
            regs.update(found)
    return regs


def ring_bytes():
    with tempfile.TemporaryDirectory() as d:
        src, exe = pathlib.Path(d) / "smem.cu", pathlib.Path(d) / "smem"
        src.write_text(SMEM_SRC)
        subprocess.run(["nvcc", *nvcc_flags(), str(src), "-o", str(exe)], capture_output=True, check=True)
        rows = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split("\n")
    return {(t, int(ks), int(ld)): (int(a), int(b)) for t, ks, ld, a, b in (r.split() for r in rows if r)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("build")
    p.add_argument("--min", type=float, default=1.0)
    p.add_argument("--max", type=float, default=1.4)
    args = p.parse_args()
    regs, rings = registers(args.build), ring_bytes()
    facts, sms = DeviceFacts("cuda", (9, 0), 132), 132

    def per_sm(tag, mt, ks, ld, xp, mb, m, cols2=False):
        r = regs.get((tag, mt, ks, ld, xp, 0, mb, cols2))
        if r is None:
            return 0
        static = ((ks - 1) * mt * 4 + ks) * 32 * 4 if ks > 1 else 0
        smem = rings[(tag, ks, ld)][1 if (mt == 1 and m == 1) else 0] + static
        # Registers: a warp's rounded up to 256, and the warps they allow rounded down to a multiple
        # of four (the SM's four register-file quarters; the runtime's occupancy answer does the same:
        # FP8's one-warp blocks at 80 registers are 24 per SM, not 25, perf log 131).
        warps = 65536 // (-(-r * 32 // 256) * 256) // 4 * 4
        return min(warps // ks, 233472 // (smem + 1024), 2048 // (32 * ks), 32)

    for tag in TAGS:
        fmt = tag.split("_")[0]
        for group, shapes in SHAPES.items():
            for n, k in shapes:
                for m in (1, 2, 4, 8, 16):
                    plan = bench.FORMATS[fmt].plan(m, n, k, facts, "auto")
                    if plan.variant != "mma" or plan.xs_warps:
                        continue
                    mt, ks, ld, xp = plan.rows, plan.ksplit, plan.loads, plan.xperm
                    blocks = -(-n // 16) * -(-m // (8 * mt))
                    # MmaStartKernel: one-warp blocks at M > 1 are the instance under
                    # __launch_bounds__(32, 1) (MIN_BLOCKS 1), M = 2 with a K split the block-column
                    # instance where the format has one (COLS2), every other launch the compiler's.
                    def start(ks_):
                        if m == 2 and mt == 1 and ks_ > 1:
                            c2 = per_sm(tag, mt, ks_, ld, xp, 0, m, cols2=True)
                            if c2:
                                return c2
                        return per_sm(tag, mt, ks_, ld, xp, 1 if (mt == 1 and ks_ == 1 and m > 1) else 0, m)
                    r = r_free = start(ks)
                    if not r:
                        continue
                    held = False  # the held instance (common.h, the launcher's rules through _ext)
                    if _ext.mma_has_bounded_instance(mt, ks, xp):
                        r_held = per_sm(tag, mt, ks, ld, xp, _ext.mma_bounded_blocks(mt), m)
                        if _ext.takes_bounded_instance(blocks, sms, r, r_held):
                            r, held = r_held, True
                    six = False  # TakesKSplit6, before the others; K split 6 is final
                    if mt == 1 and ks == 8 and _ext.ksplit6(fmt, m == 1):
                        r6 = start(6)
                        if _ext.takes_ksplit6(fmt, m, xp, held, False, blocks, sms, r_free, r6):
                            ks, r, held, six = 6, r6, False, True
                    # TakesHalfKSplit at M > 1.
                    if m > 1 and not six and _ext.halves_ksplit(fmt, mt, ks):
                        r2 = start(ks // 2)
                        if _ext.takes_half_ksplit(fmt, tag.endswith("_f16"), mt, ks, k, blocks, sms, r_free, held, r2):
                            ks, r, held = ks // 2, r2, False
                    elif m > 1 and not held and _ext.doubles_ksplit(fmt, mt, ks):  # TakesDoubleKSplit
                        r4 = start(ks * 2)
                        if _ext.takes_double_ksplit(blocks, sms, r, r4):
                            ks, r = ks * 2, r4
                    if (m == 1 and mt == 1 and ks == 4 and _ext.ksplit8_past_one_wave(fmt)
                            and _ext.past_one_wave_by_a_quarter(blocks, sms, r)):
                        continue  # TakesKSplit8OneRow: K split 8 runs, several waves
                    waves = blocks / (r * sms)
                    if args.min < waves <= args.max:
                        print(f"{tag:10s} {group:10s} {n:6d} x {k:<6d} M = {m:2d}  k{ks} l{ld} m-tiles {mt} "
                              f"xperm {int(xp)}  {blocks:5d} blocks, {r:2d} per SM, {waves:.2f} waves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
