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
own.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

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
def test_ksplit6_matches_its_references():
    # With the M = 1 paths: x in the ring and staged (K split 6 replaces K split 8 there too).
    _run_forced("every_ksplit or epilogue_gpu or one_row_x_paths", JAXGEMV_K6="2")
