import os

# Eight virtual CPU devices for the sharding tests; must be set before JAX initialises.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import jax
import pytest


def gpu_available() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


requires_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
