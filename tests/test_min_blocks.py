"""JAXGEMV_MIN_BLOCKS and JAXGEMV_K6 (diagnostics; ffi/gemv_launch.cuh, MinBlocksMode and
KSplit6Mode). JAXGEMV_MIN_BLOCKS: the per-block kernel's
K-split-8 instances (one m-tile with x in fragment order, two m-tiles with x in either order)
exist twice, as the compiler allocates them and held to more blocks per SM (four with one m-tile,
three with two, which then keep x at the chunk instead of taking it ahead), and the launcher takes
the bounded one where only it fits the grid in one wave. The launchers read the variable once per
process, so the K-split product tests (every K split, the epilogues) run again in a process of
their own with the bounded instance forced wherever it exists, with the same float64 references
and poisoned outputs. (Unforced, the same tests' 513-block cases at two loads reach it through the
launcher's rule on an H200 where the unbounded instance holds three blocks per SM: NVFP4 and int4
with fp16 x, 70 and 80 registers; so do their M = 16 cases on 320 blocks, two m-tiles, where the
instance with x ahead holds two.) JAXGEMV_K6=2 runs K split 6 in place of every one-m-tile
K-split-8 launch of int4 and NVFP4 (unforced it runs only where K split 8 would take more than one
wave and K split 6 takes one): the same tests and the M = 1 x paths' again, in a process of their
own. (JAXGEMV_WAVES, half the K split at M > 1 and FP8's K split 8 in place of 4 at M = 1, runs on
every H200 unforced: the every-K-split tests' 641-, 1088- and 2177-block cases reach it.)
"""

import dataclasses
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import requires_gpu

TESTS = pathlib.Path(__file__).parent


def _run_forced(tests, **knobs):
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", **knobs)
    files = [str(TESTS / f) for f in ("test_fp4.py", "test_fp8.py", "test_nbits.py", "test_epilogue.py")]
    workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *workers,
                             "-k", tests, *files],
                            env=env, cwd=TESTS, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout, result.stdout[-2000:]


@requires_gpu
def test_bounded_instances_match_their_references():
    _run_forced("every_ksplit or epilogue_gpu", JAXGEMV_MIN_BLOCKS="4")


@requires_gpu
def test_instances_without_x_ahead_match_their_references():
    # int4's x-ahead instance (gemv_core.cuh XAHEAD) runs unforced on the K-split tests' small grids
    # at M = 2-8 (at most 24 warps per SM, common.h TakesXAheadRule); JAXGEMV_XAHEAD=0 sends them
    # back to the instances that load x at the chunk.
    _run_forced("nbits and (every_ksplit or tile_staged or one_load)", JAXGEMV_XAHEAD="0")


@requires_gpu
def test_ksplit6_matches_its_references():
    # With the M = 1 paths: x in the ring and staged (K split 6 replaces K split 8 there too).
    _run_forced("every_ksplit or epilogue_gpu or one_row_x_paths", JAXGEMV_K6="2")


def _choice(fmt, f16, m, n, k, plan, block):
    from jaxgemv import _ext

    return _ext.mma_launch_choice(fmt, f16, m, n, k, plan.rows, plan.ksplit, plan.loads, int(plan.xperm),
                                  plan.xs_warps, plan.x_stage, block)


@requires_gpu
def test_gpu_launch_choice_names_the_kernel_that_runs():
    """_ext.mma_launch_choice, the launcher's own decisions without a launch (the benchmark's
    labels): the plan's K split where the launcher keeps it, K split 6 where it substitutes it."""
    import jax

    from jaxgemv import _ext, bench, planner
    from jaxgemv.device import facts_of

    facts = facts_of(jax.devices("gpu")[0])
    # No K split (the lm_head's one-warp blocks at M = 4) and x in shared memory (M = 16): as planned.
    for m in (4, 16):
        plan = planner.plan_nbits(m, 248320, 2048, 4, 32, facts)
        assert _choice("int4", False, m, 248320, 2048, plan, 32) == (1, False, False, False), (m, plan)
    # FP8 8192 x 28672 at M = 4: 512 eight-warp blocks, one wave at the compiler's allocation: as planned.
    plan = planner.plan_fp8(4, 8192, 28672, 128, facts)
    assert _choice("fp8", True, 4, 8192, 28672, plan, 128)[0] == plan.ksplit
    # M = 1 with x staged by the plan (x_stage 1): reported staged, whatever the K split.
    plan = planner.plan_nbits(1, 4096, 4096, 8, 32, facts, "mma")
    if plan.ksplit > 1:
        staged = _choice("int8", False, 1, 4096, 4096, dataclasses.replace(plan, x_stage=1), 32)
        assert staged is not None and staged[2], (plan, staged)
    # int4 8192 x 28672 at M = 4 ("mma"; "auto" takes imma there): K split 8 planned, 8 or 6
    # launched (6 where only it fits one wave).
    plan = planner.plan_nbits(4, 8192, 28672, 4, 32, facts, "mma")
    choice = _choice("int4", False, 4, 8192, 28672, plan, 32)
    assert plan.ksplit == 8 and choice is not None and choice[0] in (6, 8), choice
    if facts.sm_count == 132 and not os.environ.get("JAXGEMV_K6") and not os.environ.get("JAXGEMV_MIN_BLOCKS"):
        # An H100 or H200: 512 blocks, four K-split-8 blocks per SM at the compiler's allocation
        # (64 registers with the weight's stream, gemv_core.cuh kStream), so K split 8 as planned;
        # at M = 1 (x in the ring, 80 registers, three per SM) K split 6 in its place.
        assert choice == (8, False, False, False)
        assert _choice("int4", False, 1, 8192, 28672, planner.plan_nbits(1, 8192, 28672, 4, 32, facts), 32)[0] == 6
    # FP8 17408 x 5120: K split 4 planned at M = 1-8; K split 2 launched at M > 1 where only it fits
    # the 1088 blocks in one wave (TakesHalfKSplit), K split 8 at M = 1 where K split 4 runs a little
    # past one wave (TakesKSplit8OneRow).
    for m in (1, 4):
        plan = planner.plan_fp8(m, 17408, 5120, 128, facts)
        choice = _choice("fp8", False, m, 17408, 5120, plan, 128)
        assert plan.ksplit == 4 and choice is not None and choice[0] in ((4, 8) if m == 1 else (2, 4)), (m, choice)
        if facts.sm_count == 132 and not os.environ.get("JAXGEMV_WAVES"):
            # An H200: at M = 1 eight four-warp blocks per SM (64 registers, 1056 of 1088); at M = 4
            # seven (70 registers, 924) and fourteen two-warp ones.
            assert choice[0] == 8 if m == 1 else choice == (2, False, False, False), (m, choice)
    # NVFP4 keeps K split 4 at M = 1 (common.h, MmaKSplit8PastOneWave).
    plan = planner.plan_fp4(1, 17408, 5120, facts)
    assert _choice("nvfp4", False, 1, 17408, 5120, plan, 16)[0] == plan.ksplit == 4
    # Half the planned K split at M > 1 where only it holds the grid in one wave (TakesHalfKSplit):
    # every choice a split of the plan's or its half, and on an H200 the grids of docs/perf-log.md,
    # entries 128 and 140 (int8 7168 x 5120's K split 8 holds its 448 blocks at four per SM since
    # entry 139, 64 registers, and is kept at M = 4; int8's two m-tiles at M = 16 halve on their
    # last wave, 6144 x 4096 ahead of the held instance, not 8192 x 8192's 512 blocks, 1.94 waves).
    h200 = facts.sm_count == 132 and not os.environ.get("JAXGEMV_WAVES") and not os.environ.get("JAXGEMV_K6") \
        and not os.environ.get("JAXGEMV_MIN_BLOCKS")
    for fmt, m, n, k, halved in [("fp8", 4, 10240, 8192, True), ("fp8", 1, 10240, 8192, False),
                                 ("fp8", 4, 34816, 5120, True), ("int4", 4, 34816, 5120, True),
                                 ("nvfp4", 4, 34816, 5120, False), ("int8", 4, 7168, 5120, False),
                                 ("int4", 16, 10240, 5120, True), ("nvfp4", 16, 10240, 8192, True),
                                 ("nvfp4", 4, 10240, 8192, True), ("int8", 16, 10240, 8192, True),
                                 ("int8", 16, 6144, 4096, True), ("int8", 16, 8192, 8192, False),
                                 ("int4", 4, 10240, 8192, True)]:
        block = bench.FORMATS[fmt].launch[1]  # the benchmark's layouts: FP8 (1, 128), int4 / int8 32
        plan = bench.FORMATS[fmt].plan(m, n, k, facts, "auto")
        choice = _choice(fmt, False, m, n, k, plan, block)
        assert choice is not None and choice[0] in (plan.ksplit, max(1, plan.ksplit // 2)), (fmt, m, n, k, plan, choice)
        if h200 and plan.ksplit > 1 and plan.xs_warps == 0:
            assert choice[0] == (plan.ksplit // 2 if halved else plan.ksplit), (fmt, m, n, k, plan, choice)
    # int8's two m-tiles with fp16 x halve where only the half holds the grid in one wave (common.h,
    # MmaHalvesOnLastWave is bf16 x's): 8192 x 8192 / 28672 (512 blocks, two K-split-8 blocks per SM,
    # five at K split 4), not 12288 x 4096 (768 blocks, past one wave at K split 4 too).
    for n, k, halved in [(8192, 8192, True), (8192, 28672, True), (12288, 4096, False)]:
        plan = bench.FORMATS["int8_f16"].plan(16, n, k, facts, "auto")
        choice = _choice("int8", True, 16, n, k, plan, 32)
        assert choice is not None and choice[0] in (plan.ksplit, plan.ksplit // 2), (n, k, plan, choice)
        if h200 and plan.ksplit == 8 and plan.xs_warps == 0:
            assert choice[0] == (4 if halved else 8), (n, k, plan, choice)
    # Twice the planned K split at M 9-16 (TakesDoubleKSplit): int4's and NVFP4's two m-tiles from K
    # split 2 where the doubled grid ends in fewer waves than twice the planned one's; on an H100 or
    # H200 34816 x 5120 (2176 blocks: three waves at eight K-split-2 blocks per SM, five half as long
    # at four), not 28672 x 4096 (planned at K split 4).
    for fmt, m, n, k, doubled in [("int4", 16, 34816, 5120, True), ("nvfp4", 16, 34816, 5120, True),
                                  ("int4", 12, 51200, 5120, True), ("int4", 16, 28672, 4096, False)]:
        block = bench.FORMATS[fmt].launch[1]
        plan = bench.FORMATS[fmt].plan(m, n, k, facts, "auto")
        choice = _choice(fmt, False, m, n, k, plan, block)
        assert choice is not None and choice[0] in (plan.ksplit, 2 * plan.ksplit), (fmt, m, n, k, plan, choice)
        if h200 and plan.ksplit == 2 and plan.xs_warps == 0:
            assert choice[0] == (4 if doubled else 2), (fmt, m, n, k, plan, choice)
    with pytest.raises(ValueError, match="format must be"):
        _ext.mma_launch_choice("int5", False, 4, 8192, 28672, 1, 8, 2, 1)


def test_launch_choice_without_a_gpu_has_no_answer():
    from conftest import gpu_available
    from jaxgemv import _ext

    if gpu_available():
        pytest.skip("a GPU answers (test_gpu_launch_choice_names_the_kernel_that_runs)")
    if _ext.mma_launch_choice is None:
        assert not _ext.HAS_CUDA  # only a build without CUDA lacks it
        return
    assert _ext.mma_launch_choice("int4", False, 4, 8192, 28672, 1, 8, 2, 1) is None
    with pytest.raises(ValueError, match="format must be"):
        _ext.mma_launch_choice("int5", False, 4, 8192, 28672, 1, 8, 2, 1)
