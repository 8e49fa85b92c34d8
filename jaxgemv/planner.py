"""Kernel selection: one pure function of static shapes and device facts.

Each gate below says what it rests on: an H200 measurement (docs/perf-log.md has the runs) or,
where none has been made yet, the reasoning, marked as such. The planner is unit-tested at fixed
device facts, so its answers do not move with the test machine. `variant=` on the public ops and
the JAXGEMV_VARIANT / JAXGEMV_KSPLIT / JAXGEMV_LOADS / JAXGEMV_XPERM / JAXGEMV_ROWS environment
variables override it for A/B runs; bad values are rejected, never ignored.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from jaxgemv import _ext
from jaxgemv.device import DeviceFacts

#: Variants a user may force. "auto" asks the planner.
VARIANTS = ("auto", "mma", "scalar", "dequant", "cpu")

# Above this M the weight is decoded once into x's dtype and XLA's tensor-core GEMM runs on it.
# The GEMV kernels read 0.56 bytes per weight per pass over 16 rows of x, while the decode path
# writes and reads 2 more bytes per weight. Measured on an H200 at commit 77e58ee, before the
# shared-memory ring and the benchmark's ordered passes (`python -m jaxgemv.bench --crossover`),
# 12288 x 4096: mma 28 / 45 / 81 us, decode+dot 79 / 79 / 80 us at M = 16 / 32 / 64, so the GEMV
# won through M = 32. Not re-measured on the current kernel.
GEMV_MAX_M = 32

# mma.sync.m16n8k16 with fp16/bf16 operands exists from SM80 on.
MMA_MIN_CC = (8, 0)
# One K window of the tensor-core kernel is 128 values per 16-byte load per lane.
MMA_K_QUANTUM = 128
# Warps per SM that keep enough 16-byte loads in flight to cover HBM latency on Hopper: about
# 32 KB per SM at 4.3 TB/s and ~1 us loaded latency. Reasoning, checked on one shape with the
# register-pipelined kernel (commit 40c7aa4): on lm_head (M = 4) ksplit 1 and 2 were within 2% and
# 4 was 13% slower (docs/perf-log.md, entry 2). At f1534ef the ring's shared memory capped a
# block of 8 warps at 3 per SM (24 warps), so this target was not reached; down_proj 5120 x 17408
# at M = 4 ran k4 31.8 us against this rule's k8 38.8 us (f1534ef). Open item 2 of the perf log.
TARGET_WARPS_PER_SM = 32
KSPLITS = (1, 2, 4, 8)
# ... but not at fewer two-load windows per warp than this, once the column grid alone has
# FEWER_SPLITS_MIN_BLOCKS[M == 1] blocks per SM: at M = 1 x travels in the ring with the weight,
# at M > 1 every chunk loads x from L1 and more warps hide that. NVFP4 on an H200, cold, one
# session each, k8 against k4 (spread +-0.5 us): at M = 1 (commit 69e7664 and 86cbe24) 6144 x
# 4096 (384 blocks) 9.6-9.8 -> 8.2-8.3 us, 12288 x 4096 (768) 14.5 -> 13.7, 8192 x 2048 (512) 7.7
# -> 7.2, FP8 8192 x 2048 9.3 -> 8.4, while the 256-block shapes did not move (NVFP4 4096 x 4096
# 7.2-7.4 / 7.2-7.3, FP8 4096 x 2048 5.8 / 6.0) and k2 was slower everywhere (8.2-9.9 on the
# first two); at M = 8 (86cbe24) 12288 x 4096 gained (21.8 -> 16.3), 8192 x 2048 (under 4 blocks
# per SM, so k8) did not move for NVFP4 (8.6 / 8.7) and gained for FP8 (10.6 -> 9.7), and 6144 x
# 4096 and the 256-block shapes lost (10.9 -> 11.5, 8.0 -> 10.1, FP8 6.4 -> 8.0). 4096 x 12288
# and 5120 x 17408 (6 and 8.5 windows per warp at k8) kept k8 within spread or ahead (14.0 /
# 13.7, 23.5 / 24.3). int4 and int8 take the same rule, not measured. In the 8B decode step,
# where each GEMV follows the kernel that writes its x (perf log 66, kernel times averaged over 288
# calls each, one H200 session), 4096 x 4096 at M = 1 ran 6.84 us at k8 and 6.35 at k4, so at M = 1
# the rule starts at 1 block per SM (it started at 2, from the cold no-difference above).
MIN_WINDOWS_PER_WARP = 4
FEWER_SPLITS_MIN_BLOCKS = (4, 1)  # blocks per SM, at M > 1 and at M = 1
# Two m-tiles (M 9-16) with a K split take x a chunk ahead (ffi/gemv_core.cuh): 96-128 registers
# for 8-warp blocks of 4-bit codes and int8, two per SM on an H200, 88 for FP8 at two loads, 72 at
# one (three). Split 4 ways, their 4-warp blocks fit four to six per SM. H200, cold, --trace, one
# machine, kernel us, M = 16, forced k4 / k8 (docs/perf-log.md, entry 111):
#                    8192 x 28672 (512 blocks)    5120 x 17408 (320 blocks)
#   int4 (bf16 x)        63.2 / 62.5                  30.2 / 38.5
#   NVFP4 (bf16 x)       58.3 / 59.7                  28.3 / 29.6
#   int8 (bf16 x)        97.1 / 88.7                  47.7 / 51.9
#   FP8 (fp16 x)         80.0 / 107.2 (one load)      38.4 / 33.3 (one load)
# So 4-bit codes split 4 ways above two blocks per SM (where two 8-warp blocks per SM would not
# hold the grid), FP8 above three (its one-load k8 blocks, three per SM), int8 keeps k8; above
# TWO_TILE_K4_MAX_BLOCKS_PER_SM every split takes several waves and k8 stays (not measured).
# Before x came ahead (entry 110) the same weight ran at k4 / k8 int4 91.6 / 107.5, NVFP4 83.0 /
# 114.8, int8 151.6 / 137.0, and k2 was slower everywhere.
TWO_TILE_K8_BLOCKS_PER_SM_4BIT = 2
TWO_TILE_K8_BLOCKS_PER_SM_FP8 = 3
TWO_TILE_K4_MAX_BLOCKS_PER_SM = 6

# The tensor-core kernel pairs weight values (k, k + 4) within each group of 8, so x must be paired
# the same way: 4 byte permutes per 8 values of x, a sixth of the kernel's integer instructions,
# and that pipe was what bounded it. Above this weight size x is permuted by XLA before the call
# instead (one small transpose, a few microseconds of launch that only large products repay).
# The 64 MB line is reasoning; lm_head M = 1 went from 103 to 90 us with this and the other
# integer-pipe cuts of the same commit (docs/perf-log.md, entry 3).
XPERM_MIN_BYTES = 64 << 20
# ... except at M = 1 with a K split, where the kernel pairs x itself once per warp (staged, or in
# its ring) and the transpose is a kernel and a launch gap more. On an H200 at 35cdb7e (perf log
# 104; cold, --trace, one machine, M = 1, wall us, fragment order -> row order), every product
# that the 64 MB line sent to fragment order:
#   NVFP4  8192 x 28672  45.0 -> 43.9   28672 x 8192  44.6 -> 44.3
#   FP8    5120 x 17408  34.8 -> 31.9   28672 x 4096  39.4 -> 37.0   8192 x 28672  78.2 -> 76.2
#          28672 x 8192  72.5 -> 71.1
#   int4   8192 x 28672  49.7 -> 49.6   28672 x 8192  46.5 -> 47.3
#   int8   5120 x 17408  38.7 -> 38.6   28672 x 4096  42.2 -> 40.9   8192 x 28672  83.1 -> 81.4
#          28672 x 8192  82.0 -> 81.1
# (kernel time, the transpose's included: FP8 -0.2 to -2.3 us, int8 -0.7 to +1.7, the 4-bit
# formats +0.3 to +1.8; the transpose's launch gap is the rest). At M = 4 / 8 on 5120 x 17408 row
# order went both ways (FP8 kernel 33.0 / 31.8 -> 32.5 / 33.2, int8 36.8 / 34.8 -> 37.3 / 38.5),
# so M > 1 keeps the line.
# With two m-tiles (M 9-16) x in row order is 16 rows read at a K-row stride per chunk, twice the
# loads of one m-tile, and for 4-bit codes (a 16-byte weight piece meets 64 bytes of x per row)
# fragment order paid for its transpose from 16 MB of weight on an H200 (commit 0d31688, forced
# by JAXGEMV_XPERM, cold, us, row order -> fragment order):
#   NVFP4 12288 x 4096 (28 MB) M = 16  23.6-23.9 -> 18.2   5120 x 17408 (50 MB) M = 16  44.5-44.9 -> 33.0
#   int4  12288 x 4096         M = 16  30.3-30.6 -> 26.2   5120 x 17408         M = 16  57.3-57.6 -> 42.5
# 8-bit codes meet half as much x per weight byte, and there it did not pay (commit 1c5f3da):
#   FP8   12288 x 4096 (50 MB) M = 16  24.9 -> 25.0-25.3   int8 12288 x 4096 27.6 -> 28.6-29.2,
#   int8  5120 x 17408 (89 MB) M = 16  49.3 -> 50.7-51.1   (over 64 MB: the line below keeps it)
# Below 16 MB the transpose (a kernel of its own, ~2 us) weighs against a product of a few
# microseconds: not measured there, so not taken.
XPERM_TWO_TILE_MIN_BYTES = 16 << 20
# One m-tile at M = 4-8: x in row order is M rows read per chunk, so its cost grows with M where
# fragment order's stays flat (it pads x to 8 rows, whatever M), and with x in fragment order the
# launcher's held instance, and so K split 6, can run. On an H200 at a8dc033 (perf log 123; kernel
# us, --trace, the transpose included, one call, JAXGEMV_XPERM 0 -> 1), M = 8:
#   int4 (bf16 x)  4096 x 4096 (9 MiB) 7.7 -> 8.0   6144 x 4096 (13.5) 10.1 -> 10.1
#                  5120 x 6144 (16.9) 12.3 -> 11.6  12288 x 4096 (27) 16.0 -> 12.8
#                  5120 x 17408 (48) 27.2 -> 23.0   17408 x 5120 32.5 -> 23.6   8192 x 8192 27.7 -> 15.8
#   NVFP4 (fp16 x) 4096 x 4096 7.6 -> 6.6   6144 x 4096 9.8 -> 8.6   5120 x 6144 11.9 -> 10.0
#                  12288 x 4096 14.4 -> 12.3   17408 x 5120 32.8 -> 21.6   8192 x 8192 25.5 -> 14.8
#   int8           4096 x 4096 (17 MiB) 9.7 -> 10.3   6144 x 4096 (25.5) 11.9 -> 11.0
#                  5120 x 6144 15.4 -> 13.5   12288 x 4096 22.3 -> 20.6   4096 x 12288 22.2 -> 20.5
# (NVFP4 with bf16 x and int4 with zero points alike); at M = 4 the 4-bit products gained from 27
# MiB (12288 x 4096 int4 15.1 -> 13.9, 17408 x 5120 29.3 -> 24.2, 8192 x 8192 24.7 -> 17.0; 4096
# x 12288 and 5120 x 17408 within 2.6% either way) and lost below (5120 x 6144 +0-4.5%), int8
# lost 0.5-7.4% at M = 2 / 4, and the 4-bit ones at M = 2 went both ways (-14% to +3%, 8192 x
# 8192's gain being K split 6, which row order now takes too: gemv_launch.cuh). A second call at
# bed05bd (these lines, 8-bit from M = 5) timed M = 6: int4 / NVFP4 (fp16 x) 5120 x 6144 11.7 ->
# 11.6 / 11.2 -> 11.3, 12288 x 4096 15.5 -> 14.1 / 13.7 -> 13.5, 17408 x 5120 30.6 -> 25.0 / 30.2
# -> 23.3; but FP8 (fp16 x) at M = 6 lost 4-11% from 25 to 51 MiB (6144 x 4096 9.8 -> 10.9, 12288
# x 4096 19.7 -> 20.5) and at M = 8 gained 2-5% there (9.9 -> 9.7, 11.7 -> 11.3, 20.0 -> 19.0;
# 4096 x 12288 16.9 -> 17.1). Fragment order pads x to 8 rows in XLA, which at M = 8 is no pad
# at all; below 8 the same call ran 1.0-1.5 us longer than at M = 8 (FP8 12288 x 4096: 20.4 / 20.5 /
# 19.0 at M = 4 / 6 / 8). So 8-bit codes at M = 8 only (int8 at M = 5-7, timed later at a42dce8:
# 6144 x 4096 11.8-11.9 -> 12.1-12.2, 12288 x 4096 21.8-22.1 -> 21.9-22.1).
# Since a42dce8 FP8 and NVFP4 read x unpadded at M < 8 (ffi/nvfp4.cuh: kCompactX; int4 / int8 keep
# the pad, which their loops pay for). On an H200 there (perf log 126, JAXGEMV_XPERM 0 -> 1, M = 2
# / 4 / 6), NVFP4 gained at every size timed: bf16 x 4096 x 4096 (9 MiB) 6.9 / 7.2 / 7.3 -> 6.5 /
# 6.6 / 6.6, 6144 x 4096 9.0 / 9.2 / 9.3 -> 8.3 / 8.3 / 8.4, 4096 x 12288 12.7 / 13.4 / 14.2 -> 11.7
# / 11.7 / 11.8; fp16 x 5120 x 6144 10.6 / 10.8 -> 9.8 / 9.9, 12288 x 4096 13.1 / 13.3 -> 12.1 /
# 12.2 (M = 2 / 4). FP8 (fp16 x) went both ways: 6144 x 4096 and 12288 x 4096 0.1-0.4 us faster,
# 4096 x 12288 16.1-16.5 -> 17.5-17.9; it keeps 8-bit codes' line. Per format, (from M, line):
XPERM_ONE_TILE_MIN_BYTES = {
    "nvfp4": ((2, 8 << 20),),  # below 8 MiB untimed
    "int4": ((5, 16 << 20), (4, 24 << 20)),
    "int8": ((8, 24 << 20),),
    "fp8": ((8, 24 << 20),),
}


def xperm_min_bytes(m: int, fmt: str) -> int:
    """The weight size from which a product of M rows in format `fmt` ("nvfp4", "fp8", "int4" or
    "int8") takes x in fragment order."""
    if m > 8:
        return XPERM_TWO_TILE_MIN_BYTES if fmt in ("nvfp4", "int4") else XPERM_MIN_BYTES
    for from_m, line in XPERM_ONE_TILE_MIN_BYTES[fmt]:
        if m >= from_m:
            return line
    return XPERM_MIN_BYTES


# x in shared memory (ffi/gemv_core.cuh, XS_WARPS): persistent blocks of 4, 8 or 16 warps share one
# copy of x, so the per-chunk x loads stop going through L1 and L2. Taken where x is already in
# fragment order (XPERM_MIN_BYTES), the plan has no K split (so many column tiles that every warp
# gets several), M >= XS_MIN_M and x fits. Block size: whichever of 4, 8 and 16 warps keeps more warps
# resident per SM under shared memory (each warp's ring plus the block's x). Measured on an H200
# at commit 310676e, NVFP4, fp16, cold (us, x in shared memory against not):
#   248320 x 2048  M = 1 / 4 / 8:  96.1 / 99.8 / 106.9  against  91.3 / 112.4 / 141.7
#   151936 x 2048  M = 1 / 4 / 8:  66.3 / 64.0 / 71.2   against  62.2 / 74.8 / 91.1
# so M = 1, where x is four lanes' loads per chunk, kept the per-block kernel. FP8 on the same
# lm_heads (x in shared memory, 153.5 / 160.0 at M = 1 / 4) matched its earlier per-block times
# (154.3 / 159.1, 5f31f1c). Since then the per-block kernel's ring and x path have changed, and on
# one m-tile it is now ahead: on an H200 at 8adc22a (perf log 103; kernel us, --trace, the same
# warm machine, x in shared memory -> per-block, M = 2 / 4 / 8):
#   NVFP4 248320 x 2048   87.7 / 88.0 / 88.1  ->  80.2 / 81.5 / 84.8
#         151936 x 4096  104.8 / 104.5 / 103.6 -> 100.4 / 101.4 / 103.2
#   FP8   248320 x 2048  144.8 / 147.4 / 146.4 -> 138.4 / 141.5 / 147.5
#         151936 x 4096  176.6 / 176.3 / 175.1 -> 174.1 / 176.5 / 177.5
#   int4  248320 x 2048  101.4 / 101.7 / 104.6 ->  90.4 / 94.4 / 97.4
#         151936 x 4096  121.9 / 124.6 / 122.1 -> 115.6 / 117.7 / 126.5
#   int8  248320 x 2048  165.9 / 167.0 / 175.9 -> 153.9 / 153.3 / 156.3
#         151936 x 4096  201.1 / 201.9 / 200.4 -> 189.3 / 191.0 / 188.8
# so x goes into shared memory only with two m-tiles (M = 9-16); at M = 8 FP8 gives up 1-2 us
# and int4 at K = 4096 4.4, where the others gain 0.4-20.
XS_MIN_M = 9
# From 9 to 16 rows it holds two m-tiles of x (64 KB at K = 2048). On an H200 (A/B builds of
# c0fe916, one session, outputs apart), 151936 x 2048 at M = 16: NVFP4 74.4 us against the
# per-block kernel's 88.4 (with its 3 stages); int4 82.2, int8 128.9, FP8 115.6, where the
# per-block kernel had taken 123.8 (int4, 4 stages, outputs stacked), 208.9 and 168.8 (commit
# 75b1588); at c906a2f FP8 114.0 against 153.6 per-block (3 stages), in one run.
XS_MAX_M = 16
# Blocks of 16 warps: where x is large (two m-tiles, 64 KB at K = 2048) a block of 4 or 8 warps
# leaves room for only 8 warps per SM, and Nsight Compute found M = 16 on 151936 x 2048 (NVFP4,
# 2 blocks of 4 warps per SM) waiting on its own instructions: 2 warps per scheduler, 47% of
# cycles with none eligible, fixed-latency waits 33% of stall samples (docs/perf-log.md entry 50).
# One block of 16 warps holds the same x once for twice the warps. On an H200 (commit 1316776
# against 2f69c84, one call, rounds B A B, cold, us), M = 12 / 16, before -> after:
#   NVFP4 151936 x 2048  75.9 / 75.9    ->  69.6-70.3 / 69.4-69.7;  248320 x 2048  121.1 / 120.3 -> 107-108 / 109-110
#   FP8                  106.0 / 106.1  ->  96.2-97.3 / 97.1;                      169.4 / 171.8 -> 153-155 / 153-155
#   int4                 81.4 / 81.7    ->  75.2-76.5 / 75.6-76.6;                 130.4 / 133.4 -> 119-121 / 122-124
#   int8                 125.1 / 126.3  ->  116-120 / 118;                         202.5 / 206.0 -> 193-196 / 190-196
XS_WARPS = (4, 8, 16)
MMA_STAGES, MMA_STAGE_BYTES_PER_LOAD = 4, 2 * 32 * 16  # ffi/gemv_core.cuh: MmaStages<true>, MmaStageBytes
# Shared memory per SM and the most one block may take, by compute capability (CUDA guide).
SMEM_PER_SM = {(8, 0): 164 << 10, (8, 7): 164 << 10, (9, 0): 228 << 10, (10, 0): 228 << 10}
SMEM_PER_SM_DEFAULT = 100 << 10
SMEM_RESERVED_PER_BLOCK = 1 << 10


def xs_resident_warps(m: int, k: int, loads: int, scale_bytes: int, xs_warps: int, facts: DeviceFacts,
                      stage_scale_bytes: int = 0) -> int:
    """Warps per SM of the x-in-shared-memory kernel with blocks of `xs_warps` warps (shared
    memory bound). Staged scale bytes per row of a stage: `scale_bytes` per load (NVFP4 8, FP8 4)
    plus `stage_scale_bytes` whatever the loads (int4/int8: NBITS_STAGE_ROW_BYTES)."""
    per_sm = SMEM_PER_SM.get(facts.compute_capability, SMEM_PER_SM_DEFAULT)
    ring = xs_warps * MMA_STAGES * (loads * (MMA_STAGE_BYTES_PER_LOAD + 16 * scale_bytes) + 16 * stage_scale_bytes)
    block = ring + 2 * m * k + SMEM_RESERVED_PER_BLOCK
    if block > per_sm - SMEM_RESERVED_PER_BLOCK:
        return 0
    return min(per_sm // block, 32) * xs_warps


# Scalar kernel: one warp per output column, four columns per block. Its row-tiling gate follows the
# ONNX Runtime H200 measurements of the same scheme (tiling lost where the column grid did not
# cover the SMs); not yet re-measured on this kernel.
SCALAR_COLS_PER_BLOCK = 4
SCALAR_MAX_ROWS = 4


@dataclasses.dataclass(frozen=True)
class Plan:
    """A kernel variant and its launch parameters (all static)."""

    variant: str
    rows: int = 1  # scalar: x rows per block; mma: 8-row m-tiles held per warp (1 or 2)
    ksplit: int = 1  # mma: warps per block that split K
    loads: int = 1  # mma: 16-byte weight loads per lane per row per K window (1 or 2)
    xperm: bool = False  # mma: x is handed over in the decode's pair order (see XPERM_MIN_BYTES)
    xs_warps: int = 0  # mma: warps per persistent block sharing x in shared memory (0: off; see XS_WARPS)
    # mma, M = 1 with a K split: each warp's x staged once in shared memory, pre-paired (1), or
    # carried in the ring (0); -1: the launcher decides per device (ffi/gemv_launch.cuh: StageX).
    x_stage: int = -1


def _pow2_at_least(v: int) -> int:
    p = 1
    while p < v:
        p *= 2
    return p


def env_variant(variants: tuple[str, ...] = VARIANTS, aliases: dict[str, str] | None = None,
                op: str = "the quantized products") -> str:
    """JAXGEMV_VARIANT, validated against `variants` after `aliases` (unset or empty: "auto")."""
    value = os.environ.get("JAXGEMV_VARIANT", "").strip().lower() or "auto"
    value = (aliases or {}).get(value, value)
    if value not in variants:
        raise ValueError(f"JAXGEMV_VARIANT={value!r}: {op} takes one of {', '.join(variants)}")
    return value


def env_int(name: str, allowed: tuple[int, ...]) -> int | None:
    """An integer launch-parameter override from the environment, validated (unset or empty
    means the planner's choice)."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) not in allowed:
        contiguous = len(allowed) > 4 and tuple(allowed) == tuple(range(allowed[0], allowed[-1] + 1))
        expected = f"an integer from {allowed[0]} to {allowed[-1]}" if contiguous else f"one of {allowed}"
        raise ValueError(f"{name}={value!r}: expected {expected}")
    return int(value)


# decoder_layer's trigger masks (jaxgemv/layer.py: TRIGGER): one bit per kernel of its call.
TRIGGER_MASKS = tuple(range(32))


# Blocks per SM of the per-block kernel's held instance (ffi/common.h, MmaBoundedBlocks): one
# m-tile's, and two m-tiles' (those keep x at the chunk instead of taking it ahead).
MMA_BOUNDED_BLOCKS = _ext.mma_bounded_blocks(1)
MMA_TWO_TILE_BOUNDED_BLOCKS = _ext.mma_bounded_blocks(2)
# JAXGEMV_MIN_BLOCKS (ffi/gemv_launch.cuh, MinBlocksMode): 0 never takes the per-block kernel's
# held instance, MMA_BOUNDED_BLOCKS takes it wherever it exists (held to MMA_BOUNDED_BLOCKS blocks
# per SM with one m-tile, MMA_TWO_TILE_BOUNDED_BLOCKS with two); unset, the launcher takes it
# where only it puts the whole grid in one wave (takes_bounded_instance).
MIN_BLOCKS_MODES = (0, MMA_BOUNDED_BLOCKS)


def has_bounded_instance(plan: Plan) -> bool:
    """Whether `plan` runs a kernel that also exists held to more blocks per SM: the per-block
    tensor-core kernel with K split 8 ways, one m-tile with x in fragment order or two m-tiles
    (ffi/common.h, MmaHasBoundedInstance; x in shared memory is another kernel)."""
    return (plan.variant == "mma" and not plan.xs_warps
            and _ext.mma_has_bounded_instance(plan.rows, plan.ksplit, plan.xperm))


def takes_bounded_instance(plan: Plan, m: int, n: int, facts: DeviceFacts, free_per_sm: int,
                           bounded_per_sm: int | None = None) -> bool:
    """Whether the CUDA launcher runs `plan` on its instance held to more blocks per SM (its own
    rule, ffi/common.h: TakesBoundedInstance, through the extension): where the grid, ceil(N / 16)
    x ceil(M / (8 x rows)) blocks, is more than the compiler's instance holds at once
    (`free_per_sm` blocks on each of the device's SMs) and no more than the held one does
    (`bounded_per_sm`, by default what it is held to). The launcher reads both from the occupancy
    API on the device itself (on an H200, 3 and 4 for the one-m-tile 8-warp blocks of NVFP4, int4
    and int8, 2 and 3 for int8's two-m-tile ones); they are arguments here so that the window can
    be checked at any SM count.
    JAXGEMV_MIN_BLOCKS (0 / 4) forces the answer where the instance exists."""
    if not has_bounded_instance(plan):
        return False
    mode = env_int("JAXGEMV_MIN_BLOCKS", MIN_BLOCKS_MODES)
    if mode is not None:
        return mode == MMA_BOUNDED_BLOCKS
    if bounded_per_sm is None:
        bounded_per_sm = _ext.mma_bounded_blocks(plan.rows)
    blocks = -(-n // 16) * -(-m // (8 * plan.rows))
    return _ext.takes_bounded_instance(blocks, facts.sm_count, free_per_sm, bounded_per_sm)


def check_launch_knobs() -> None:
    """JAXGEMV_PDL, JAXGEMV_EARLY, JAXGEMV_MIN_BLOCKS, JAXGEMV_K6, JAXGEMV_WAVES, JAXGEMV_COLS2,
    JAXGEMV_XAHEAD, JAXGEMV_TILE_PREP and JAXGEMV_OCCUPANCY_CACHE (diagnostics read by the CUDA
    launchers, ffi/cluster.cuh: PdlMode, EarlyReadsAllowed; ffi/gemv_launch.cuh: MinBlocksMode,
    KSplit6Mode, WavesMode, Columns2Mode, XAheadMode, TilePrepMode, OccupancyCacheOn) and
    JAXGEMV_TRIGGER (read by decoder_layer's lowering), checked by the planners so that a bad
    value fails at trace time."""
    env_int("JAXGEMV_PDL", (0, 1, 2))
    env_int("JAXGEMV_EARLY", (0, 1))
    env_int("JAXGEMV_MIN_BLOCKS", MIN_BLOCKS_MODES)
    env_int("JAXGEMV_K6", (0, 1, 2))
    env_int("JAXGEMV_WAVES", (0, 1))
    env_int("JAXGEMV_COLS2", (0, 1))
    env_int("JAXGEMV_XAHEAD", (0, 1, 2))
    env_int("JAXGEMV_TRIGGER", TRIGGER_MASKS)
    env_int("JAXGEMV_TILE_PREP", (0, 1))
    env_int("JAXGEMV_OCCUPANCY_CACHE", (0, 1))


# Threads of the C++ CPU handlers (ffi/cpu_types.h: CpuThreads, ParallelRows): unset or 0, the
# machine's hardware threads (at most 64); each product splits its output rows over them where
# every thread gets at least 2^18 multiply-adds, and each row is computed whole by one thread, so
# results do not depend on the count.
CPU_THREADS = tuple(range(0, 257))


def check_cpu_knobs() -> None:
    """JAXGEMV_CPU_THREADS (read by the CPU handlers once per process), checked at trace time."""
    env_int("JAXGEMV_CPU_THREADS", CPU_THREADS)


def mma_eligible(k: int, facts: DeviceFacts, quantum: int = MMA_K_QUANTUM) -> str | None:
    """None if the tensor-core kernel serves this K on this device, else the reason it does not.
    `quantum`: values of K per window at one load per lane (128 for NVFP4, 64 for FP8)."""
    if facts.platform != "cuda":
        return "the tensor-core kernel needs a CUDA device"
    if facts.compute_capability < MMA_MIN_CC:
        return f"the tensor-core kernel needs compute capability 8.0, the device has {facts.compute_capability}"
    if k % quantum:
        return f"the tensor-core kernel needs K % {quantum} == 0, got K = {k}"
    return None


def plan_mma(m: int, n: int, k: int, facts: DeviceFacts, ksplit: int | None = None, weight_bytes: int = 0,
             quantum: int = MMA_K_QUANTUM, scale_bytes: int = 0,
             one_load: Callable[[int, int], bool] | None = None,
             stage_scale_bytes: int = 0, max_loads: int = 2, fmt: str = "nvfp4",
             two_tile_k8_per_sm: int = 0) -> Plan:
    """Launch parameters of the tensor-core kernel for weights in format `fmt` (xperm_min_bytes).

    A warp owns 16 output columns, so the grid is ceil(N / 16) column blocks (times the 16-row
    m-tile passes for M > 16). KSplit warps per block restore the memory parallelism that the
    16-column warps lose on narrow N: lm_head (N = 248320) has 15520 blocks and needs no split,
    N = 512 has 32 blocks and takes 8 warps each. Two 16-byte pieces per lane and row per window
    (loads=2, K % 256 == 0, at least one window per warp) halve the steps per byte; a warp's
    shared-memory ring holds the window it decodes and the next one in flight (three in flight
    with x in shared memory; ffi/gemv_core.cuh), so shared memory (~5.6 KB per warp at loads=2
    and M = 1, 9 KB with x in shared memory; at M = 1 with a K split the launcher may stage x
    after the rings instead, 2K bytes per block, where that keeps the blocks per SM the grid
    uses), as much as registers, bounds the warps per SM; with
    few windows per warp the split is smaller (MIN_WINDOWS_PER_WARP). With x in shared memory
    (XS_WARPS) the blocks are persistent instead, one per resident slot. `one_load`: with K
    split 8 ways and two loads chosen, a format's measured rule for going back to one load per
    lane, given the grid's blocks and each warp's two-load windows (FP8: `_fp8_one_load`).
    """
    rows = 1 if m <= 8 else 2
    # JAXGEMV_ROWS=1 runs M > 8 as one-m-tile blocks, one per 8 rows of x and column tile (the
    # blocks of a tile next to each other, so that the second reads the weight from L2), for A/B
    # runs against the two-m-tile instance; 2 needs M > 8.
    forced_rows = env_int("JAXGEMV_ROWS", (1, 2))
    if forced_rows == 2 and m <= 8:
        raise ValueError(f"JAXGEMV_ROWS=2: two m-tiles need M > 8, got M = {m}")
    rows = forced_rows or rows
    blocks = -(-n // 16) * -(-m // (8 * rows))
    windows = k // quantum
    if ksplit is None:
        want = -(-facts.sm_count * TARGET_WARPS_PER_SM // blocks)
        ksplit = min(KSPLITS[-1], _pow2_at_least(want))
        # A warp with only one or two windows never gets its ring (2 stages, ffi/gemv_core.cuh)
        # past the first fill: split 4 ways, not 8, below MIN_WINDOWS_PER_WARP two-load windows
        # per warp at 8, once the column grid alone is large enough (FEWER_SPLITS_MIN_BLOCKS).
        min_blocks = facts.sm_count * FEWER_SPLITS_MIN_BLOCKS[m == 1]
        if ksplit == 8 and blocks >= min_blocks and windows // 2 < 8 * MIN_WINDOWS_PER_WARP:
            ksplit = 4
        # Two m-tiles: the format's k8 blocks per SM (0: always k8), TWO_TILE_K8_BLOCKS_PER_SM_*.
        k4_from, k4_to = two_tile_k8_per_sm * facts.sm_count, TWO_TILE_K4_MAX_BLOCKS_PER_SM * facts.sm_count
        if ksplit == 8 and rows == 2 and two_tile_k8_per_sm and k4_from < blocks <= k4_to:
            ksplit = 4
    loads = 1
    if windows % 2 == 0 and windows // 2 >= ksplit:
        loads = 2
    forced_loads = env_int("JAXGEMV_LOADS", (1, 2))
    if forced_loads and forced_loads > max_loads:
        raise ValueError(f"JAXGEMV_LOADS={forced_loads}: this product takes at most {max_loads} load(s) per window")
    loads = min(forced_loads or loads, max_loads)
    ksplit = max(1, min(ksplit, windows // loads))
    while ksplit not in KSPLITS:
        ksplit -= 1
    if forced_loads is None and one_load and loads == 2 and ksplit == 8 and one_load(blocks, windows // 2 // 8):
        loads = 1
    xperm = env_int("JAXGEMV_XPERM", (0, 1))
    if xperm is None:
        xperm = weight_bytes >= xperm_min_bytes(m, fmt)
        xperm = xperm and not (m == 1 and ksplit > 1)
    xperm = bool(xperm)
    fits = {w: xs_resident_warps(m, k, loads, scale_bytes, w, facts, stage_scale_bytes) for w in XS_WARPS}
    xs = env_int("JAXGEMV_XS", (0, *XS_WARPS))
    own_rows = rows == (1 if m <= 8 else 2)  # the persistent kernel's m-tiles: one up to M = 8, two above
    if xs is None:
        xs = (max(XS_WARPS, key=lambda w: (fits[w], -w))
              if xperm and ksplit == 1 and own_rows and XS_MIN_M <= m <= XS_MAX_M else 0)
        xs = xs if xs and fits[xs] else 0
    elif xs and (m > XS_MAX_M or ksplit != 1 or not xperm or not fits[xs] or not own_rows):
        raise ValueError(f"JAXGEMV_XS={xs}: x in shared memory needs M <= {XS_MAX_M}, ksplit 1, xperm 1, its own "
                         f"m-tiles (no JAXGEMV_ROWS) and x ({2 * m * k} bytes) fitting in shared memory beside "
                         f"{xs} warps' rings")
    # JAXGEMV_XSTAGE forces where the M = 1 K-split kernel keeps x (tests run both); otherwise the
    # launcher chooses, since the choice turns on blocks per SM, which the device's registers and
    # shared memory decide.
    x_stage = env_int("JAXGEMV_XSTAGE", (0, 1))
    check_launch_knobs()
    if x_stage == 1 and (m != 1 or ksplit == 1):
        raise ValueError(f"JAXGEMV_XSTAGE=1: x staged needs M = 1 and a K split; "
                         f"this plan has M = {m}, ksplit {ksplit}")
    return Plan("mma", rows=rows, ksplit=ksplit, loads=loads, xperm=xperm, xs_warps=xs,
                x_stage=-1 if x_stage is None else x_stage)


# An RMSNorm in front of the product (rms_eps=): at M = 1 with a K split the per-block kernel
# loads each warp's share of x once before its loop and stages it in shared memory (ffi/
# gemv_core.cuh, MmaXStagedBytes), so it can sum the squares of those values itself, a few FMAs
# per lane on registers it holds anyway, and the reduction XLA runs in front of the product (a
# kernel of its own, twice per layer in the 8B decode step: 72 of ~1.25 us per step, plus their
# launch gaps; docs/perf-log.md, entry 78) goes. The launch then stages x whatever its occupancy
# rule would say (ffi/gemv_launch.cuh: StageX), so "auto" takes it only up to this K, where the
# staged x (2K bytes per block) is small beside the ring. Reasoning; the decode's K (4096,
# 12288) is where it was measured. The CPU handlers sum the squares themselves at any shape.
X_SUMS_MAX_K = 16384


def x_sums(plan: Plan, m: int, k: int, rms_k: int | None) -> bool:
    """Whether a product with an RMSNorm in front has its kernel sum the squares of x's rows
    instead of taking them from XLA (the row scale operand then stays empty and XLA drops the
    reduction). rms_k: the K the norm runs over (None: no norm); a device whose x holds only a
    K shard (rms_k != k) takes the sums from XLA, which adds the shards up. JAXGEMV_XSUMS=1 takes
    it wherever the kernel can, 0 nowhere."""
    if rms_k is None or rms_k != k:
        return False
    forced = env_int("JAXGEMV_XSUMS", (0, 1))
    if forced == 0:
        return False
    if plan.variant == "cpu":
        return True
    able = (plan.variant == "mma" and m == 1 and plan.rows == 1 and plan.ksplit > 1 and not plan.xs_warps
            and plan.x_stage != 0)
    return able and (forced == 1 or k <= X_SUMS_MAX_K)


def plan_scalar(m: int, n: int, facts: DeviceFacts) -> Plan:
    """Launch parameters of the warp-per-column kernel.

    Row tiling (several x rows per block, sharing each weight load and decode) removes M from the
    grid, so it is used only when the column grid alone covers a wave: with fewer column blocks
    than SMs, splitting M across blocks is what fills the GPU.
    """
    col_blocks = -(-n // SCALAR_COLS_PER_BLOCK)
    if m == 1 or col_blocks < facts.sm_count:
        return Plan("scalar", rows=1)
    return Plan("scalar", rows=min(SCALAR_MAX_ROWS, _pow2_at_least(m)))


def fp4_weight_bytes(n: int, k: int) -> int:
    """Bytes of an NVFP4 [N, K] weight: packed codes and E4M3 block scales."""
    return n * k // 2 + n * k // 16


# On the CPU platform "auto" runs the C++ handler up to this M and decode-then-dot (XLA's dot)
# above it: the handler's cost grows with M (a dot per row of x and weight row), XLA's GEMM barely
# does. On the 2-core development machine (`python3 tools/cpu_products.py --m 1,8,16,64`, ms,
# 4096 x 4096, bf16 x, handler / decode-then-dot, session 42's last commit) NVFP4 ran 4.5 / 32.0
# at M = 1, 11.7 / 15.5 at M = 8, 18.3 / 15.9 at M = 16 and 65.5 / 18.4 at M = 64; FP8 9.2 /
# 22.3, 12.5 / 14.7, 19.9 / 14.2, 68.3 / 15.3; int4 8.9 / 24.1, 15.7 / 16.7, 23.0 / 15.3, 69.5 /
# 17.5; int8 3.0 / 18.5, 9.4 / 13.4, 16.7 / 13.6, 66.8 / 14.5 (XLA's bf16 dot on the dense weight:
# 21-28 throughout).
CPU_HANDLER_MAX_M = 8


def env_own_variant(variant: str, own: tuple[str, ...], op: str = "the quantized products") -> tuple[str, bool]:
    """What every planner does with "auto" first: read JAXGEMV_VARIANT. Returns (variant,
    forced_by_env): one of the format's own kernels (`own`: imma and xshare for int4 / int8, wgmma
    for FP8) as forced by the environment, which leaves the products it cannot run to the planner;
    another format's own as "auto" (unforced); anything else as named."""
    if variant != "auto":
        return variant, False
    variant = env_variant(ENV_VARIANTS, op=op)
    if variant in own:
        return variant, True
    return ("auto" if variant in NBITS_ONLY_VARIANTS + FP8_ONLY_VARIANTS else variant), False


def _resolve(variant: str, facts: DeviceFacts, fmt: str, scalar: bool, m: int) -> tuple[str, Plan | None]:
    """What every format's planner does first: read JAXGEMV_VARIANT for "auto", validate, and
    settle the CPU platform and the forced decode-then-dot path. Returns (variant, plan), plan
    None when the format's own gates decide."""
    variant, _ = env_own_variant(variant, ())
    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}: expected one of {', '.join(VARIANTS)}")
    if facts.platform == "cpu":
        check_cpu_knobs()
        if variant == "cpu" or (variant == "auto" and m <= CPU_HANDLER_MAX_M):
            return variant, Plan("cpu")
        if variant in ("auto", "dequant"):
            return variant, Plan("dequant")
        raise ValueError(f"variant={variant!r} needs a CUDA device; on CPU use 'cpu' or 'dequant'")
    if variant == "cpu":
        raise ValueError("variant='cpu' runs only on the CPU platform")
    if variant == "dequant":
        return variant, Plan("dequant")
    if variant == "scalar" and not scalar:
        raise ValueError(f"variant='scalar': {fmt} has no warp-per-column kernel; use 'mma' or 'dequant'")
    return variant, None


def plan_fp4(m: int, n: int, k: int, facts: DeviceFacts, variant: str = "auto") -> Plan:
    """Chooses how to compute an [M, K] x [N, K]^T product against an NVFP4 weight."""
    variant, fixed = _resolve(variant, facts, "NVFP4", scalar=True, m=m)
    if fixed:
        return fixed
    ksplit = env_int("JAXGEMV_KSPLIT", KSPLITS)
    mma = lambda: plan_mma(m, n, k, facts, ksplit, fp4_weight_bytes(n, k), scale_bytes=8,  # noqa: E731
                           two_tile_k8_per_sm=TWO_TILE_K8_BLOCKS_PER_SM_4BIT)
    if variant == "mma":
        reason = mma_eligible(k, facts)
        if reason:
            raise ValueError(f"variant='mma': {reason}")
        return mma()
    if variant == "scalar":
        return plan_scalar(m, n, facts)

    if m > GEMV_MAX_M:
        return Plan("dequant")
    return mma() if mma_eligible(k, facts) is None else plan_scalar(m, n, facts)


# FP8 (E4M3, float32 block scales). The tensor-core kernel reads 16 values per 16-byte piece, so
# a window is 64 values per load, and a chunk of 4 lanes (64 consecutive values) must sit in one
# scale block: block_k a power of two, at least 64. The GEMV range reaches M = 32, as NVFP4's:
# on an H200 at commit 75b1588, cold, block 128, the forced kernel against decode-then-dot took
#   151936 x 2048  M = 16 / 32:  168.8 / 259.8 us  against  551.2 / 546.9
#   12288 x 4096   M = 16 / 32:   29.6 /  48.8 us  against   97.1 /  99.5
# so the crossover lies above 32 (not measured there; GEMV_MAX_M's reasoning applies).
FP8_MMA_K_QUANTUM = 64
FP8_GEMV_MAX_M = 32
# One 16-byte load per lane and window instead of two, with K split 8 ways. First (commit 4046864)
# a gate on long K: one load from FP8_ONE_LOAD_MIN_WINDOWS two-load windows per warp, from 5120 x
# 17408 alone (k8 l1 37.3 / 38.2 us at M = 1 / 4 against l2 38.8 / 43.1). Then M = 2-8 left it
# (FP8_TWO_LOADS_M; on an H200 at a066b30, perf log 105, kernel us, one load -> two, M = 1 / 4 / 8:
#   5120 x 17408   30.1 / 33.5 / 32.0  ->  31.6 / 30.4 / 29.5
#   8192 x 28672   71.7 / 78.2 / 75.5  ->  68.2 / 73.1 / 71.3
#   4096 x 12288   18.4 / 21.4 / 22.4  ->  17.3 / 19.4 / 20.8 ).
# At M = 1 the window count is not what decides (perf log 106; one H200, ef1d44c, cold, --trace,
# kernel us, JAXGEMV_LOADS=1 against 2, K split 8 unless noted; blocks = N / 16 on 132 SMs):
#   N x K            blocks/SM  l1    l2   |  N x K            blocks/SM  l1    l2
#   3072 x 17408       1.45    22.5  19.6  |  5120 x 8192        2.42    16.3  16.6
#   4096 x 12288       1.94    18.2  17.1  |  5120 x 28672       2.42    49.5  48.6
#   4096 x 14336       1.94    20.3  19.9  |  8192 x 17408       3.88    43.4  41.3
#   4608 x 17408       2.18    29.6  31.1  |  8192 x 28672       3.88    69.5  65.5
#   5120 x 17408       2.42    29.9  31.8  |  10240 x 17408      4.85    65.4  51.0
#   5632 x 17408       2.67    30.5  32.4  |  12288 x 4096       5.82    17.6  17.8
#   6144 x 17408       2.91    32.1  33.3  |  14336 x 4096       6.79    19.5  19.8
# (28672 x 8192, K split 4: 69.1 against 65.3.) One load won where the grid puts a third block on
# some SMs and not a fourth (2 < blocks/SM <= 3), by 0.3-1.9 us, except 5120 x 28672 (0.9 us the
# other way: by the launcher's arithmetic its 57 KB of x is staged at one load and rides the
# ring at two); everywhere else two loads won, by up to 14.4 us, where the old gate chose one
# (10240 x 17408, 8192 x 28672, 3072 x 17408, ...). Nsight Compute at two loads on 5120 x 17408
# (320 blocks): SM active cycles 37.5K min, 46.9K mean, 60.2K max, the SMs with three blocks
# taking ~1.5x those with two; the one-load profile did not run, so why one load does better
# there is not known.
# So at M = 1 one load needs both: the first gate (no shorter K was timed with one load: 5120 x
# 6144 and 6144 x 5120, 320 and 384 blocks, keep two) and 2 < blocks/SM <= 3. M = 9-16 (two
# m-tiles) was not measured and keeps the first gate alone.
FP8_ONE_LOAD_MIN_WINDOWS = 8
FP8_TWO_LOADS_M = range(2, 9)


def _fp8_one_load(m: int, facts: DeviceFacts) -> Callable[[int, int], bool]:
    """FP8's rule for one load per lane and window with K split 8 ways (the table above)."""
    def rule(blocks: int, windows_per_warp: int) -> bool:
        if m in FP8_TWO_LOADS_M or windows_per_warp < FP8_ONE_LOAD_MIN_WINDOWS:
            return False
        return m > 1 or 2 * facts.sm_count < blocks <= 3 * facts.sm_count
    return rule


def fp8_weight_bytes(n: int, k: int, block_k: int) -> int:
    """Bytes an FP8 product reads: E4M3 codes and float32 scales per row and block of K."""
    return n * k + 4 * n * -(-k // block_k)


def fp8_mma_eligible(k: int, block_k: int, facts: DeviceFacts) -> str | None:
    reason = mma_eligible(k, facts, FP8_MMA_K_QUANTUM)
    if reason:
        return reason
    if block_k < 64 or block_k & (block_k - 1):
        return f"the FP8 tensor-core kernel needs a K block that is a power of two and at least 64, got {block_k}"
    return None


# The CUDA-core FP8 kernel (ffi/fp8.cuh) takes what the tensor-core one does not: K blocks of 32
# values and K a multiple of 16 but not of 64 (16-byte pieces of 16 codes, each inside one block).
# It reads the weight once per 4 rows of x (1 byte per value per pass, 2 passes at M = 8), where
# decode-then-dot writes 2 bytes per value and reads them back. Measured on an H200 (commit
# f6f5af0, the branch of 67ea764 before a rebase; blocks of 32, fp16, cold, us, scalar against
# decode-then-dot, two rounds each):
#   5120 x 17408  M = 1 / 4 / 8:  35.6-35.9 / 100.2-100.9 / 156.2-157.3  against  164.3-165.0 (each M)
#   8192 x 2048   M = 1 / 4 / 8:  9.7 / 15.5-15.6 / 26.0-26.3           against  37.5 / 32.4-34.0 / 31.8
# so it wins up to M = 8, barely there on the large shape (its passes add ~55 us per 4 rows).
FP8_SCALAR_MAX_M = 8


def fp8_scalar_eligible(k: int, block_k: int, facts: DeviceFacts) -> str | None:
    if facts.platform != "cuda":
        return "the FP8 scalar kernel needs a CUDA device"
    if k % 16:
        return f"the FP8 scalar kernel needs K % 16 == 0, got K = {k}"
    if block_k < 16 or block_k & (block_k - 1):
        return f"the FP8 scalar kernel needs a K block that is a power of two and at least 16, got {block_k}"
    return None


def _mma_or_dequant(variant: str, m: int, max_m: int, reason: str | None) -> Plan | None:
    """For formats whose only kernel is the tensor-core one: None to run it, or the dequantize path
    ("auto" above max_m or where the kernel cannot run). A forced "mma" it cannot run raises."""
    if variant == "mma":
        if reason:
            raise ValueError(f"variant='mma': {reason}")
        return None
    return Plan("dequant") if m > max_m or reason else None


# FP8 takes one more variant, "wgmma": Hopper's FP8 tensor cores with the codes as they are and x as
# E4M3 planes (ffi/fp8_wgmma.cuh). Built for sm_90a alone, so only compute capability 9.0 runs it.
# Forced by variant="wgmma" (an error where it cannot run) or JAXGEMV_VARIANT=wgmma (the products it
# cannot run keep the planner's choice).
FP8_ONLY_VARIANTS = ("wgmma",)
FP8_VARIANTS = VARIANTS + FP8_ONLY_VARIANTS
WGMMA_CC = (9, 0)
WGMMA_MAX_M = 8  # x's planes: 3 M columns (fp16) in wgmma's N <= 24
WGMMA_K_QUANTUM = 128  # a window: one 128-byte swizzled row of codes
WGMMA_MAX_K = 1 << 24  # a tile's 64 rows of codes within 32-bit offsets (ffi/fp8_wgmma.cuh: kWgMaxK)
WGMMA_MIN_BLOCK_K = 32  # every k32 step inside one scale block


def wgmma_unfit(m: int, k: int, block_k: int, facts: DeviceFacts, activation=None) -> str | None:
    """None where the wgmma kernel runs the FP8 product, else why not."""
    if facts.platform != "cuda":
        return "it needs a CUDA device"
    if facts.compute_capability != WGMMA_CC:
        return (f"it is built for sm_90a and needs compute capability {WGMMA_CC[0]}.{WGMMA_CC[1]}, the device "
                f"has {facts.compute_capability[0]}.{facts.compute_capability[1]}")
    if m > WGMMA_MAX_M:
        return f"it takes M <= {WGMMA_MAX_M}, got M = {m}"
    if activation is not None:
        return "activation='swiglu' runs the 'mma' variant"
    if k % WGMMA_K_QUANTUM or k > WGMMA_MAX_K:
        return f"it needs K a multiple of {WGMMA_K_QUANTUM} up to {WGMMA_MAX_K}, got K = {k}"
    if block_k < WGMMA_MIN_BLOCK_K or block_k & (block_k - 1):
        return f"it needs a K block that is a power of two and at least {WGMMA_MIN_BLOCK_K}, got {block_k}"
    return None


def plan_wgmma(m: int, k: int, block_k: int, facts: DeviceFacts, activation=None) -> tuple[Plan | None, str | None]:
    """The wgmma plan (K split 0: the launcher's choice, ffi/fp8_wgmma.cu; JAXGEMV_KSPLIT forces
    it), or None and why not."""
    why = wgmma_unfit(m, k, block_k, facts, activation)
    return (Plan("wgmma", ksplit=env_int("JAXGEMV_KSPLIT", KSPLITS) or 0), None) if why is None else (None, why)


# "auto" does not take it: on an H100 (docs/perf-log.md, entry 165; 37d0648 prebuilt, cold, kernel
# us summed, "mma" against wgmma, fp16 / bf16 x) it ran
#   5120 x 17408   M = 1: 36.0 / 37.0 against 38.0 / 38.0   M = 8: 35.4 / 36.8 against 69.3 / 50.1
#   10240 x 8192   M = 1: 33.5 / 33.9 against 36.4 / 36.1   M = 8: 33.6 / 33.4 against 55.9 / 50.3
#   34816 x 5120   M = 1: 66.5 / 69.3 against 68.3 / 67.9   M = 8: 67.6 / 67.9 against 106.4 / 92.3
#   4096 x 2048    M = 1:  5.7 /  5.8 against  8.4 /  8.2
# within 3% at best (34816 x 5120 at M = 1-2), behind wherever x's planes cost more (M >= 4) or the
# second launch (the K split's counters) and the ring's fill weigh (small products). The H200, where
# "mma"'s FP8 loop is issue-bound (75-82% of the read), is where it may win at M = 1-2; untimed.


def plan_fp8(m: int, n: int, k: int, block_k: int, facts: DeviceFacts, variant: str = "auto",
             activation=None) -> Plan:
    """Chooses how to compute an [M, K] x [N, K]^T product against an FP8 block-scaled weight."""
    variant, forced_by_env = env_own_variant(variant, FP8_ONLY_VARIANTS, "fp8_matmul")
    if variant == "wgmma":
        plan, why = plan_wgmma(m, k, block_k, facts, activation)
        if plan is not None:
            return plan
        if not forced_by_env:
            raise ValueError(f"variant='wgmma' cannot run this product: {why}")
        variant = "auto"  # JAXGEMV_VARIANT=wgmma: the rest keep the planner's choice
    variant, fixed = _resolve(variant, facts, "FP8", scalar=True, m=m)
    if fixed:
        return fixed
    scalar_reason = fp8_scalar_eligible(k, block_k, facts)
    if variant == "scalar":
        if scalar_reason:
            raise ValueError(f"variant='scalar': {scalar_reason}")
        return plan_scalar(m, n, facts)
    mma_reason = fp8_mma_eligible(k, block_k, facts)
    if variant == "auto" and mma_reason and not scalar_reason and m <= FP8_SCALAR_MAX_M:
        return plan_scalar(m, n, facts)
    ksplit = env_int("JAXGEMV_KSPLIT", KSPLITS)
    fallback = _mma_or_dequant(variant, m, FP8_GEMV_MAX_M, mma_reason)
    return fallback or plan_mma(m, n, k, facts, ksplit, fp8_weight_bytes(n, k, block_k), FP8_MMA_K_QUANTUM,
                                scale_bytes=4, fmt="fp8", one_load=_fp8_one_load(m, facts),
                                two_tile_k8_per_sm=TWO_TILE_K8_BLOCKS_PER_SM_FP8)


# int4 / int8 (MatMulNBits). The tensor-core kernel reads 16 bytes per piece: 32 4-bit values or
# 16 8-bit ones, so a window is 128 or 64 values per load. Scales (in x's dtype) fold into the
# decoded weight, rounding once as the reference does, for any block size. The GEMV range reaches
# M = 32: on an H200 at commit 75b1588, cold, block 32, no zero points, the forced kernel against
# decode-then-dot took (us)
#   int4 151936 x 2048  M = 16 / 32:  124.9 / 159.5  against  932.8 / 916.2
#   int4 12288 x 4096   M = 16 / 32:   30.4 /  58.8  against  (not timed) / 161.1
#   int8 151936 x 2048  M = 16 / 32:  208.9 / 323.2  against  557.1 / 546.1
#   int8 12288 x 4096   M = 16 / 32:   34.8 /  53.6  against   99.0 /  99.0
# (the decode path writes the whole bf16 weight first), so the crossover lies above 32, not measured.
NBITS_GEMV_MAX_M = 32
# Scale and zero-point bytes staged per row of a ring stage (ffi/nbits.cuh, kStageRowBytes): the
# aligned 16-byte piece holding the window's scales, then the second such piece or the zero points.
NBITS_STAGE_ROW_BYTES = 32


# int4 at M = 2-8 with K split 8 takes one load per window where each warp has at most
# INT4_ONE_LOAD_MAX_WINDOWS two-load windows and the grid puts more than two blocks and at most four
# on an SM (INT4_ONE_LOAD_BLOCKS_PER_SM; four is what the K-split-8 instance holds, 64 registers):
# a two-stage ring of two-load windows barely gets past its fill there, and one load gives each
# warp twice the windows. Why a grid of two blocks per SM or fewer, or past four, loses with one
# load is not known. On an H100 (docs/perf-log.md, entry 141; f249382, kernel us, JAXGEMV_LOADS=1
# against the plan's two, M = 2 / 8, bf16 x unless noted; two rounds within 0.3 where marked *):
#   N x K          windows a warp, blocks a SM   two loads      one load
#   4096 x 4096        2, 1.94                   7.7 /  8.3     8.1 /  8.6
#   5120 x 5120        2, 2.42                  10.7 / 11.8    10.4 / 11.4
#   6144 x 4096 *      2, 2.91                  10.2 / 11.1     9.8 / 10.5   (fp16 x the same)
#   7168 x 5120        2, 3.39                  13.8 / 15.2    12.6 / 13.0   (M = 2: K split 6 at two)
#   8192 x 8192 *      4, 3.88                  19.7 / 20.1    18.6 / 18.3   (fp16 x 19.8 / 20.1 -> 18.7 / 18.3)
#   10240 x 8192       4, 4.85                  27.3 / 31.9    31.7 / 30.4   (fp16 x 27.5 / 31.9 -> 31.6 / 30.5)
#   4096 x 14336       7, 1.94                  19.0 / 19.1    20.2 / 19.3 *
#   8192 x 28672      14, 3.88                  59.0 / 59.9    61.2 / 59.8 *
#   5120 x 17408     8.5, 2.42                  25.9 / 27.5    26.3 / 26.0 *
# K split 4 and 2 at 4 windows a warp went both ways (12288 x 4096 16.7 / 14.7 -> 15.2 / 14.8;
# 28672 x 4096, which the launcher then halves to K split 2, 34.0 / 32.0 -> 32.4 / 36.7) and keep two
# loads, as do M = 1 (its own ring of x), two m-tiles and int8 (not timed).
INT4_ONE_LOAD_MAX_WINDOWS = 4
INT4_ONE_LOAD_BLOCKS_PER_SM = (2, 4)  # more than the first, at most the second


def _int4_one_load(m: int, facts: DeviceFacts) -> Callable[[int, int], bool]:
    """int4's rule for one load per lane and window with K split 8 ways (the table above)."""
    low, high = INT4_ONE_LOAD_BLOCKS_PER_SM

    def rule(blocks: int, windows_per_warp: int) -> bool:
        return (2 <= m <= 8 and windows_per_warp <= INT4_ONE_LOAD_MAX_WINDOWS
                and low * facts.sm_count < blocks <= high * facts.sm_count)
    return rule


def nbits_max_loads(bits: int, block_size: int, has_zp: bool) -> int:
    """Loads per window the kernel takes: a two-load 4-bit window with blocks of 16 has 32 bytes of
    scales, which leave no room in the row's stage for zero points (ffi/nbits.cuh), so one load."""
    return 1 if bits == 4 and block_size == 16 and has_zp else 2


def nbits_weight_bytes(n: int, k: int, bits: int, block_size: int) -> int:
    blocks = -(-k // block_size)
    return n * blocks * (block_size * bits // 8 + 2)


# int4 / int8 take one more variant, "imma": the integer tensor cores with x as three planes of
# bytes (ffi/imma.cuh). Forced by variant="imma" (an error where it cannot run) or by
# JAXGEMV_VARIANT=imma (the products it cannot run keep the planner's choice). "auto" takes it
# where it was timed faster than "mma" (IMMA_AUTO_*), on an H100, bf16 x, in us per product (the
# wall clock of the timed batches, which for "mma" at M > 1 holds the kernel that puts x in
# fragment order and its launch, and for "imma" its prep kernel overlapped with the GEMV).
# int8 (K >= 8192): entry 145, M = 1 / 2, 8192 x 28672 99.8 / 101.9 -> 94.2 / 95.1,
# 8192 x 8192 31.4 / 34.5 -> 30.3 / 31.5, 5120 x 17408 43.0 / 43.4 -> 41.0 / 42.0 (fp16 the same
# within 1 us); entry 147, M = 3-8 since x's planes travel in the ring (entry 146), two rounds on
# six shapes (8192 x 28672 / 8192 / 16384, 6144 x 16384, 5120 x 17408, 4096 x 14336): M = 3, 4
# and 6 faster on every shape and round by 2-10% (8192 x 28672 at M = 4 101.0 -> 95.2), M = 8
# faster on five shapes and 1.5-2% slower on 5120 x 17408, so taken up to M = 6; the same on an
# H200 (one round: M = 3-6 1-14% faster on four of those shapes, M = 8 level to 18% slower).
# Taller grids (entry 147, H100, two rounds): 10240 x 8192 and 28672 x 8192 at M = 1 / 2 / 4 3-9%
# faster (28672 x 8192 at M = 2 103.4 -> 93.8), but 28672 x 8192 at M = 6 16% slower (imma at K
# split 1 there, three mmas per chunk): past N = 8192 up to M = 4, and N up to 28672, the tallest
# timed.
# int8 lm_heads (N >= 151936, K >= 2048, M <= 4; M <= 8 until entry 171): entry 158 and two calls of
# entry 160, three rounds on H100s, 151936 x 2048 and 248320 x 2048 at M = 1 / 2 / 4, fp16 x: the
# kernel 3-4% faster (imma at K split 1: 248320 x 2048 at M = 1 194.9 -> 187.5 us), the wall clock
# 7-12 us (199.3 -> 187.1), every shape, M and round; at M = 8 (one round) 1.5-3% and 6-14 us (210.9
# -> 196.4), and bf16 x at M = 1 as fp16. On an H200 (perf log 171, one round, bf16 x, kernel us
# "mma" -> imma) M = 1 and 4 held (151936 x 2048 86.3 -> 83.5 and 89.2 -> 87.5, 248320 x 2048 135.3
# -> 129.8 and 139.2 -> 135.0) and M = 8 lost 8-10% (90.4 -> 99.3, 142.7 -> 154.0; the wall clock
# 1-6 us): taken to M = 4 (M = 5-7 untimed on either card).
# int4 (N = 8192, K >= 16384): entry 146, M = 2 gained 9-11% (8192 x 28672 61.5 -> 56.2, 8192 x
# 16384 37.7 -> 33.4, where "mma" runs K split 8 without its x-ahead instance); entry 147, M = 3 /
# 4 6-8% (8192 x 28672 63.0 / 63.2 -> 58.7 / 59.1, 8192 x 16384 38.0 / 38.1 -> 35.2 / 35.1).
# Elsewhere (N = 4096-6144 or 10240, or K = 8192) int4 at M = 1-4 went -6% to +5%, and at M = 8
# it lost (entry 147: 8192 x 28672 64.4 -> 65.4, 10240 x 8192 24.8 -> 27.4): not taken; nor is
# 8192 x 28672 at M = 1, 3% slower (entries 146 and 147; 8192 x 16384 there 4% faster). For both,
# shorter K and devices before sm_90 were not timed.
NBITS_VARIANTS = VARIANTS + ("imma", "xshare")
# Variants of int4 / int8 alone: the other formats read JAXGEMV_VARIANT set to one of them as unforced.
NBITS_ONLY_VARIANTS = ("imma", "xshare")
# What JAXGEMV_VARIANT may name: every format's variants, each planner taking its own.
ENV_VARIANTS = NBITS_VARIANTS + FP8_ONLY_VARIANTS
IMMA_AUTO_BITS = 8
IMMA_AUTO_INT8_MN = ((4, 28672), (6, 8192))  # int8: (largest M, largest N), either
IMMA_AUTO_MIN_K = 8192
IMMA_AUTO_INT8_LM_HEAD = (4, 151936, 2048)  # int8: largest M, least N, least K
IMMA_AUTO_INT4_M = (2, 4)  # M from, to
IMMA_AUTO_INT4_N = 8192
IMMA_AUTO_INT4_MIN_K = 16384
IMMA_AUTO_MIN_CC = (9, 0)
IMMA_MIN_CC = (8, 0)  # mma.sync m16n8k32 with s8 operands
IMMA_MAX_M = 8  # x's three planes a row: 3 M columns in up to three mmas of eight (ffi/imma.cuh)
IMMA_MAX_K = 1 << 24  # K padded to whole blocks (ffi/imma.cuh: the copies' 32-bit offsets in a tile)
IMMA_BLOCK_SIZES = (32, 64, 128)
# Window rows of 128 x loads bytes (ffi/imma.cuh: ImmaWindow): int8 at two loads (256 values, the
# probe's 97%), int4 at one (256 values, the probe's best, at 64 registers); either takes one load
# where K does not fill the wider window.
IMMA_LOADS = {4: 1, 8: 2}


def imma_window(bits: int, loads: int) -> int:
    """Values a row of the imma kernel's window holds."""
    return 128 * loads * 8 // bits


def _kernel_variant_unfit(m: int, facts: DeviceFacts, has_zp: bool, activation, min_cc: tuple[int, int],
                         max_m: int) -> str | None:
    """What int4 / int8's kernels beside "mma" (imma, xshare) refuse alike, or None."""
    if facts.platform != "cuda":
        return "it needs a CUDA device"
    if facts.compute_capability < min_cc:
        return f"it needs compute capability {min_cc[0]}.{min_cc[1]}, the device has {facts.compute_capability}"
    if m > max_m:
        return f"it takes M <= {max_m}, got M = {m}"
    if has_zp:
        return "weights with zero points run the 'mma' variant"
    if activation is not None:
        return "activation='swiglu' runs the 'mma' variant"
    return None


def imma_unfit(m: int, k: int, bits: int, block_size: int, facts: DeviceFacts, has_zp: bool, activation,
               loads: int) -> str | None:
    """None where the imma kernel runs the product at `loads`, else why not."""
    why = _kernel_variant_unfit(m, facts, has_zp, activation, IMMA_MIN_CC, IMMA_MAX_M)
    if why:
        return why
    if block_size not in IMMA_BLOCK_SIZES:
        return f"it takes block_size in {IMMA_BLOCK_SIZES}, got {block_size}"
    window = imma_window(bits, loads)
    padded = -(-k // block_size) * block_size
    if padded > IMMA_MAX_K:
        return f"it takes K up to {IMMA_MAX_K} (padded to whole blocks), got K = {k} (padded {padded})"
    if block_size > window or padded % window:
        return (f"it needs K padded to whole blocks to be a multiple of its window ({window} values), "
                f"got K = {k} (padded {padded})")
    return None


def plan_imma(m: int, k: int, bits: int, block_size: int, facts: DeviceFacts, has_zp: bool = False,
              activation=None) -> tuple[Plan | None, str | None]:
    """The imma plan (K split 0: the launcher's choice, ffi/imma.cu; JAXGEMV_KSPLIT and
    JAXGEMV_LOADS force them), or None and why not."""
    loads = env_int("JAXGEMV_LOADS", (1, 2))
    choices = (loads,) if loads else (IMMA_LOADS[bits], 1)
    why = None
    for ld in dict.fromkeys(choices):
        why = imma_unfit(m, k, bits, block_size, facts, has_zp, activation, ld)
        if why is None:
            return Plan("imma", ksplit=env_int("JAXGEMV_KSPLIT", KSPLITS) or 0, loads=ld), None
    return None, why


def takes_imma(m: int, n: int, k: int, bits: int, facts: DeviceFacts) -> bool:
    """Whether "auto" runs an int4 / int8 product through imma where the kernel takes it (the
    shapes and device where it was timed faster: IMMA_AUTO_*)."""
    if facts.platform != "cuda" or facts.compute_capability < IMMA_AUTO_MIN_CC:
        return False
    if bits == IMMA_AUTO_BITS:
        lm_m, lm_n, lm_k = IMMA_AUTO_INT8_LM_HEAD
        if m <= lm_m and n >= lm_n and k >= lm_k:
            return True
        return k >= IMMA_AUTO_MIN_K and any(m <= mm and n <= nn for mm, nn in IMMA_AUTO_INT8_MN)
    return IMMA_AUTO_INT4_M[0] <= m <= IMMA_AUTO_INT4_M[1] and n == IMMA_AUTO_INT4_N and k >= IMMA_AUTO_INT4_MIN_K


# "xshare" (ffi/xshare.cuh): symmetric int4 / int8 at M = 1-16 with x shared by a block's warps
# through shared memory, a persistent grid balanced over (tile group, window) steps, its sums added
# into a float32 scratch result and stored by a kernel after. Forced by variant="xshare" (an error
# where it cannot run) or JAXGEMV_VARIANT=xshare (the products it cannot run keep the planner's
# choice). "auto" takes it on sm_90 where it was timed faster than "mma" and "imma" (H100,
# docs/perf-log.md, entries 152-153): large products only (small ones are a few windows a block,
# the ring's fill and the flush uncovered), int4 at M = 2-8 (2-5%) and at M = 9-16 (entry 152: 4%
# on 34816 x 5120 where 8192 x 28672 lost 10% to "mma"'s two m-tiles; since entry 170, on an H200,
# 12-14% ahead there and on 2^26-value products, below); int8 on products of 2^27
# values or more at M = 1-4 (3-12%), at M = 5-8 with K >= 8192 (34816 x 5120 lost 2%) and at M =
# 9-16 with K >= 8192 (8192 x 28672 gained 8% and 28672 x 8192 13-14%), but not where imma's rule
# takes int8 (M <= 4 with N <= 28672, M <= 6 with N <= 8192, K >= 8192): there imma ran 1.4-6.6
# us ahead on the wall clock (28672 x 8192 and 5120 x 17408 at M = 1-4, entry 153), whose summed
# kernels xshare led by 1-4 us, and xshare's memset and store kernel cost more than its kernel
# saves on 10240 x 8192 and 5120 x 17408 (2^26.3 and 2^26.4 values: 2-3 us behind "mma" on the wall
# clock at M = 1-8). Nor where imma's rule takes int4 (M = 2-4, N = 8192, K >= 16384): entry 155,
# imma 1-4 us ahead on the wall clock at M = 2 / 3 / 4, 8192 x 16384 32.7 / 35.0 / 34.9 against
# 36.8 / 37.5 / 37.5, 8192 x 28672 56.3 / 58.5 / 58.8 against 59.3 / 59.6 / 59.9 (two rounds),
# where xshare's summed kernels led by 1-6 us. Shorter int4 products (10240 x 8192 and 5120 x
# 17408) lost 5-20%. At M = 9-16 the two-m-tile loop with its shared offsets kept in registers
# (perf log 170, an H200): int4 8192 x 28672 at M = 9 / 12 / 16 48.5 / 48.4 / 48.3 us of kernel
# against "mma"'s two m-tiles 55.2 / 56.2 / 56.0 (wall 52.3 against 57.8-58.9), 10240 x 8192 and
# 5120 x 17408 at M = 16 21.5 / 23.2 against 24.9 / 26.0; int8 10240 x 8192 at M = 9 / 16 28.5 /
# 29.3 against 32.0 / 30.7, 34816 x 5120 54.5 / 57.0 against 63.4 / 63.8 (one round each, every
# row ahead on the wall clock too); int4's lm_head (248320 x 2048, K = 2048) lost, 123.5 against
# 113.6. So M = 9-16 from K = 5120 and 2^26 values for both (the H100s' rows of entries 152-153,
# 1-4 us behind "mma" there before that loop, were not timed again; int8 5120 x 17408, which the
# rule now reaches, was level with "mma" on an H100 before it and is untimed on an H200).
XSHARE_MIN_CC = (8, 0)  # cp.async and bf16 mma.sync
XSHARE_MAX_M = 16
XSHARE_WINDOW = 256  # K values a window (ffi/xshare.cuh: kXshareWin)
XSHARE_MAX_K = 1 << 27  # a tile's 16 rows of codes within 2^31 bytes (ffi/xshare.cu: CheckXshare)
XSHARE_AUTO_MIN_CC = (9, 0)
# "auto"'s shapes: bits -> ((first M, last M, least K, largest K, least N x K), ...), any row. K
# from 5120, the shortest timed (the lm_heads' K = 2048, a few windows a tile group: int4 at M = 16
# lost there).
XSHARE_AUTO = {
    4: ((2, 8, 5120, 1 << 27, 1 << 27), (9, 16, 5120, 1 << 27, 1 << 26)),
    8: ((1, 4, 5120, 1 << 27, 1 << 27), (5, 8, 8192, 1 << 27, 1 << 27), (9, 16, 5120, 1 << 27, 1 << 26)),
}


def xshare_unfit(m: int, k: int, bits: int, block_size: int, facts: DeviceFacts, has_zp: bool,
                 activation) -> str | None:
    """None where the xshare kernel runs the product, else why not."""
    why = _kernel_variant_unfit(m, facts, has_zp, activation, XSHARE_MIN_CC, XSHARE_MAX_M)
    if why:
        return why
    if block_size < 32:
        return f"it takes block_size 32-256, got {block_size}"
    if k % XSHARE_WINDOW or k >= XSHARE_MAX_K:
        return f"it needs K a multiple of {XSHARE_WINDOW} below {XSHARE_MAX_K}, got K = {k}"
    return None


def plan_xshare(m: int, k: int, bits: int, block_size: int, facts: DeviceFacts, has_zp: bool = False,
                activation=None) -> tuple[Plan | None, str | None]:
    """The xshare plan (one m-tile to M = 8, two above), or None and why not."""
    why = xshare_unfit(m, k, bits, block_size, facts, has_zp, activation)
    return (Plan("xshare", rows=1 if m <= 8 else 2), None) if why is None else (None, why)


def takes_xshare(m: int, n: int, k: int, bits: int, facts: DeviceFacts) -> bool:
    """Whether "auto"'s xshare rule covers an int4 / int8 product (the shapes and device where it
    was timed faster than "mma": XSHARE_AUTO); plan_nbits tries imma's rule before it."""
    if facts.platform != "cuda" or facts.compute_capability < XSHARE_AUTO_MIN_CC:
        return False
    return any(m0 <= m <= m1 and k0 <= k <= k1 and n * k >= nk for m0, m1, k0, k1, nk in XSHARE_AUTO.get(bits, ()))


# int4 / int8's kernels beside "mma": name -> ("auto"'s rule, the plan or why not), in the order
# "auto" tries their rules (imma ahead of xshare on the wall clock wherever both were timed).
NBITS_KERNELS = {"imma": (takes_imma, plan_imma), "xshare": (takes_xshare, plan_xshare)}


def plan_nbits(m: int, n: int, k: int, bits: int, block_size: int, facts: DeviceFacts, variant: str = "auto",
               has_zp: bool = False, activation=None) -> Plan:
    """Chooses how to compute an [M, K] x [N, K]^T product against an int4 / int8 weight."""
    variant, forced_by_env = env_own_variant(variant, NBITS_ONLY_VARIANTS, "int4_matmul / int8_matmul")
    if variant in NBITS_KERNELS:
        plan, why = NBITS_KERNELS[variant][1](m, k, bits, block_size, facts, has_zp, activation)
        if plan is not None:
            return plan
        if not forced_by_env:
            raise ValueError(f"variant={variant!r} cannot run this product: {why}")
        variant = "auto"  # JAXGEMV_VARIANT=imma / xshare: the rest keep the planner's choice
    if variant == "auto":
        # "auto"'s kernel rules in order, each where its kernel runs the product.
        for takes, plan_of in NBITS_KERNELS.values():
            if takes(m, n, k, bits, facts):
                plan, _ = plan_of(m, k, bits, block_size, facts, has_zp, activation)
                if plan is not None:
                    return plan
    variant, fixed = _resolve(variant, facts, "int4/int8", scalar=False, m=m)
    if fixed:
        return fixed
    ksplit = env_int("JAXGEMV_KSPLIT", KSPLITS)
    quantum = 512 // bits  # 4 lanes x 16 bytes
    fallback = _mma_or_dequant(variant, m, NBITS_GEMV_MAX_M, mma_eligible(k, facts, quantum))
    return fallback or plan_mma(m, n, k, facts, ksplit, nbits_weight_bytes(n, k, bits, block_size), quantum,
                                stage_scale_bytes=NBITS_STAGE_ROW_BYTES, max_loads=nbits_max_loads(bits, block_size, has_zp),
                                fmt=f"int{bits}", two_tile_k8_per_sm=TWO_TILE_K8_BLOCKS_PER_SM_4BIT if bits == 4 else 0,
                                one_load=_int4_one_load(m, facts) if bits == 4 else None)


# Dense fp16/bf16 weights with a small N (jaxgemv/dense.py, ffi/dense.cu): routers, gates and
# linear-attention projections at decode. "splitk" is the cluster kernel; "xla" is XLA's dot with
# float32 accumulation (what a user writes without jaxgemv, and the path for every shape the
# kernel does not serve); "cpu" the C++ handler. "dequant" is accepted as "xla" (for a dense weight
# decode-then-dot is the dot), so that one JAXGEMV_VARIANT=dequant A/B run moves every format to
# XLA. Where "auto" takes the kernel (DENSE_AUTO_*) was timed per kernel (tools/small_products.py);
# the launch parameters below are the kernel's limits and reasoning, not yet swept.
DENSE_VARIANTS = ("auto", "splitk", "xla", "cpu")
DENSE_SPLITS = (1, 2, 4, 8, 16)  # blocks per cluster; 16 needs the non-portable cluster size
DENSE_LOADS = (1, 2, 4, 8)  # 16-byte loads per lane and weight row in flight per iteration
# The kernel's fixed tile (ffi/dense.cu): 16 columns per cluster, 4 warps per block.
DENSE_COLS = 16
DENSE_WARPS = 4
# Thread-block clusters and distributed shared memory exist from sm_90 on.
DENSE_MIN_CC = (9, 0)
# x rides in the n8 slot of mma.m16n8k16: at most 8 rows. Above, XLA's GEMM has rows to tile.
DENSE_MAX_M = 8
# 16-byte weight loads need rows that start on 16 bytes: K a multiple of 8 fp16/bf16 values.
DENSE_K_ALIGN = 8
# Blocks per SM the grid aims at: 4 blocks of 4 warps is what the kernel's registers allow
# (ffi/dense.cu, kMinBlocks); 16 warps per SM with 1 KB per load step each in flight (2 rows x 16 B
# x 32 lanes), 64 KB per SM at 4 loads: above the ~32-40 KB that covers HBM latency. Reasoning,
# unmeasured; to be timed.
DENSE_BLOCKS_PER_SM = 4
# Clusters of 8 are portable; 16 only by the environment override until it is timed.
DENSE_MAX_AUTO_SPLITS = 8
# Where "auto" picks the kernel: the products where it beat XLA's dot by at least 1 / 0.8, cold,
# timed kernel by kernel under Nsight Compute on an H200 at commit 3141897 (every cache flushed
# before each kernel; docs/h200-dense.md):
#   JAXGEMV_SMALL="dense splitk,xla 1,4,8 1x2048 32x2048 ... 1024x4096" tools/device_run.sh
# M = 4 and 8, N = 32..1024, K = 2048 and 4096: 0.54-0.79 x XLA (3.2-6.3 us against 5.1-7.9 us:
# XLA runs a GEMM fusion and a separate reduction there, two kernels). M = 1 at every N, and
# N = 1 at every M: XLA's one reduction kernel is 0.1-1.0 us faster (2.2-5.3 us), so XLA.
# M = 2, 3 and 5-7, N between 2 and 31 and K outside 2048..4096 were not timed and stay with
# XLA, except M = 5-7 inside the range: the kernel's time does not depend on M (x is the n8 slot
# of the mma; 4 and 8 took the same time within 0.2 us) and XLA ran the same two kernels at 4 and 8.
DENSE_AUTO_M = (4, 8)
DENSE_AUTO_N = (32, 1024)
DENSE_AUTO_K = (2048, 4096)


@dataclasses.dataclass(frozen=True)
class DensePlan:
    """How dense_matmul runs: a variant and, for "splitk", its launch parameters (static)."""

    variant: str
    splits: int = 1  # splitk: blocks of a cluster that share K (the cluster size)
    loads: int = 1  # splitk: 16-byte chunks per lane and weight row per iteration


def dense_splitk_eligible(m: int, n: int, k: int, facts: DeviceFacts) -> str | None:
    """None if the split-K kernel can run this product on this device, else why not."""
    if facts.platform != "cuda":
        return "the splitk kernel needs a CUDA device"
    if facts.compute_capability < DENSE_MIN_CC:
        return f"the splitk kernel needs compute capability 9.0 (clusters), the device has {facts.compute_capability}"
    if m > DENSE_MAX_M:
        return f"the splitk kernel takes M <= {DENSE_MAX_M}, got M = {m}"
    if k % DENSE_K_ALIGN:
        return f"the splitk kernel needs K % {DENSE_K_ALIGN} == 0 (16-byte rows), got K = {k}"
    return None


def plan_splitk(m: int, n: int, k: int, facts: DeviceFacts) -> DensePlan:
    """Launch parameters of the split-K kernel.

    Splits: a cold product of a few hundred KB costs one DRAM latency if all of it is requested at
    once, so spread K over as many blocks as there are places for: grow the cluster while the grid
    is below DENSE_BLOCKS_PER_SM blocks per SM and every warp keeps at least one chunk per lane
    of its quad (4 chunks). N = 1024, K = 4096 on 132 SMs: 64 column tiles x 8 = 512 blocks, under
    528; N = 32: 2 x 8 = 16 blocks (capped at 8 per cluster). K = 128: 16 chunks, one split.
    Loads: enough that a warp's whole share of K is one batch of loads (at most 8 per row, which
    fills the kernel's 128 registers), so no lane waits for a load to return before issuing the
    next: K = 4096, 8 splits: 512 chunks / 32 warps = 16 per warp, 4 per lane of a quad.
    """
    tiles = -(-n // DENSE_COLS)
    chunks = k // 8
    splits = env_int("JAXGEMV_SPLITS", DENSE_SPLITS)
    if splits is None:
        splits = 1
        while (splits * 2 <= DENSE_MAX_AUTO_SPLITS and tiles * splits < DENSE_BLOCKS_PER_SM * facts.sm_count
               and chunks >= 2 * splits * DENSE_WARPS * 4):
            splits *= 2
    per_warp = -(-chunks // (splits * DENSE_WARPS))
    loads = min(DENSE_LOADS[-1], _pow2_at_least(-(-per_warp // 4)))
    return DensePlan("splitk", splits=splits, loads=loads)


def plan_dense(m: int, n: int, k: int, facts: DeviceFacts, variant: str = "auto") -> DensePlan:
    """Chooses how to compute an [M, K] x [N, K]^T product against a dense fp16/bf16 weight."""
    if variant == "auto":
        variant = env_variant(DENSE_VARIANTS, {"dequant": "xla"}, "dense_matmul")
    if variant == "dequant":
        variant = "xla"
    if variant not in DENSE_VARIANTS:
        raise ValueError(f"variant={variant!r}: expected one of {', '.join(DENSE_VARIANTS)}")
    if variant == "xla":
        return DensePlan("xla")
    if facts.platform == "cpu":
        # On the CPU XLA's dot (Eigen) beats the plain C++ handler, which stays as the forced
        # "cpu" variant for tests: `JAX_PLATFORMS=cpu python -m jaxgemv.bench --format dense
        # --shapes 1x2048 32x4096 --m 1,8 --variant cpu,xla` on the 2-core development machine
        # (commit e01c5c5 plus this change): 24 / 616 us against 13 / 64 us at M = 1.
        check_cpu_knobs()
        if variant == "auto":
            return DensePlan("xla")
        if variant == "cpu":
            return DensePlan("cpu")
        raise ValueError(f"variant={variant!r} needs a CUDA device; on CPU use 'cpu' or 'xla'")
    if variant == "cpu":
        raise ValueError("variant='cpu' runs only on the CPU platform")
    reason = dense_splitk_eligible(m, n, k, facts)
    if variant == "splitk":
        if reason:
            raise ValueError(f"variant='splitk': {reason}")
        return plan_splitk(m, n, k, facts)
    inside = all(lo <= v <= hi for v, (lo, hi) in ((m, DENSE_AUTO_M), (n, DENSE_AUTO_N), (k, DENSE_AUTO_K)))
    if reason or not inside:
        return DensePlan("xla")
    return plan_splitk(m, n, k, facts)
