import jax
import pytest


def gpu_available() -> bool:
    try:
        return bool(jax.devices("gpu"))
    except RuntimeError:
        return False


requires_gpu = pytest.mark.skipif(not gpu_available(), reason="needs a CUDA GPU")
