"""JAXGEMV_TILE_PREP (a diagnostic; ffi/gemv_launch.cuh, TilePrepMode): int4 / int8 products with
one m-tile per block and no K split stage a tile's scales and zero points once for all of K where
they take at most 4 KB at M = 1 and 2 KB above, and each window's in its stage otherwise. The
launchers read the variable once per process, so those product tests run again in processes of
their own with it forced on (every such launch stages its tile, 10 KB ones too) and off (none
does), against the same float64 references and poisoned outputs."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import requires_gpu

TESTS = pathlib.Path(__file__).parent


@requires_gpu
@pytest.mark.parametrize("mode", ["0", "1"])
def test_tile_prep_forced(mode):
    env = dict(os.environ, JAXGEMV_TILE_PREP=mode, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    workers = ["-n", "4"] if importlib.util.find_spec("xdist") else []
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *workers,
                             "-k", "tile_staged or every_ksplit", str(TESTS / "test_nbits.py")],
                            env=env, cwd=TESTS, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout, result.stdout[-2000:]
