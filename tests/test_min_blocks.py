"""JAXGEMV_MIN_BLOCKS (a diagnostic; ffi/gemv_launch.cuh, MinBlocksMode): the per-block kernel's
K-split-8 instances (one m-tile with x in fragment order, two m-tiles with x in either order)
exist twice, as the compiler allocates them and held to more blocks per SM (four with one m-tile,
three with two, which then keep x at the chunk instead of taking it ahead), and the launcher takes
the bounded one where only it fits the grid in one wave. The launchers read the variable once per
process, so the K-split product tests (every K split, the epilogues) run again in a process of
their own with the bounded instance forced wherever it exists, with the same float64 references
and poisoned outputs. (Unforced, the same tests' 513-block cases at two loads reach it through the
launcher's rule on an H200 where the unbounded instance holds three blocks per SM: NVFP4 and int4
with fp16 x, 70 and 80 registers; so do their M = 16 cases on 320 blocks, two m-tiles, where the
instance with x ahead holds two.)
"""

import importlib.util
import os
import pathlib
import subprocess
import sys

from conftest import requires_gpu

TESTS = pathlib.Path(__file__).parent


@requires_gpu
def test_bounded_instances_match_their_references():
    env = dict(os.environ, JAXGEMV_MIN_BLOCKS="4", XLA_PYTHON_CLIENT_PREALLOCATE="false")
    files = [str(TESTS / f) for f in ("test_fp4.py", "test_fp8.py", "test_nbits.py", "test_epilogue.py")]
    workers = ["-n", "8"] if importlib.util.find_spec("xdist") else []
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *workers,
                             "-k", "every_ksplit or epilogue_gpu", *files],
                            env=env, cwd=TESTS, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout, result.stdout[-2000:]
