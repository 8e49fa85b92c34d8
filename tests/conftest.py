import os
import subprocess
import sys

# Eight virtual CPU devices for the sharding tests; must be set before JAX initialises.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax
import numpy as np
import pytest
from jax.sharding import Mesh


def gpu_available() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


requires_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
# Tests of what the benchmark reports on the CPU platform, where it runs on the default device:
# on a machine with a GPU they would time the GPU's kernels instead (CI, without one, runs them).
requires_cpu_default = pytest.mark.skipif(jax.default_backend() != "cpu",
                                          reason="checks the CPU platform's rows; the default device is a GPU")


@pytest.fixture(scope="module")
def mesh():
    """The 8 virtual CPU devices as a 2 x 4 mesh, axes "a" and "b" (the sharding tests')."""
    devices = jax.devices("cpu")
    if len(devices) < 8:
        pytest.skip("needs 8 CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    return Mesh(np.array(devices[:8]).reshape(2, 4), ("a", "b"))


def run_side_by_side(runs, timeout=600):
    """Runs `python -c SCRIPT ARGS...` once per (script, args, env) in `runs`, the processes side by
    side (tests that compare whole processes under different settings: one after another each
    compiling its own products was the GPU suite's tail). Returns [(returncode, stdout, stderr)]."""
    procs = [subprocess.Popen([sys.executable, "-c", script, *args], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for script, args, env in runs]
    try:
        outs = [proc.communicate(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return [(proc.returncode, out, err) for proc, (out, err) in zip(procs, outs)]
