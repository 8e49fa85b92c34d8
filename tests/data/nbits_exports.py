"""The NBitsWeight export fixtures: jit(int4_matmul) / jit(int8_matmul) exported for CPU, one
artifact per case, by the jaxgemv that imports this module. The committed artifacts were written
by 8a08cca^ (the last commit whose NBitsWeight left absent arrays out of its pytree) so that
tests/test_nbits.py checks today's jaxgemv runs them:

    git worktree add /tmp/old 8a08cca^ && cp <a built _jaxgemv*.so> /tmp/old/jaxgemv/ && python3 -c "
    import sys, runpy; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]
    sys.path.insert(0, '/tmp/old'); runpy.run_path('tests/data/nbits_exports.py', run_name='__main__')"

(the editable install's finder is dropped so that the old tree's jaxgemv is the one imported).
"""

from __future__ import annotations

import os

import numpy as np

CASES = ("int4_zp", "int4_sym", "int4_order", "int8_zp")
N, K, BS, M = 24, 256, 32, 3


def inputs(case: str):
    """(x, w) for a case, the same arrays in every version: codes, scales and zero points drawn
    from a seed of the case's own, scales and x in fp16."""
    import jax.numpy as jnp

    import jaxgemv

    bits = 8 if case.startswith("int8") else 4
    rng = np.random.default_rng(CASES.index(case) + 100)
    blocks = K // BS
    packed = rng.integers(0, 256, (N, blocks, BS * bits // 8), dtype=np.uint8)
    scales = (rng.random((N, blocks)) * 0.1 + 0.01).astype(np.float16)
    zp = None if case == "int4_sym" else rng.integers(0, 256, (N, -(-blocks * bits // 8)), dtype=np.uint8)
    order = rng.permutation(K).astype(np.int32) if case == "int4_order" else None
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float16)
    w = jaxgemv.NBitsWeight(jnp.asarray(packed), jnp.asarray(scales), None if zp is None else jnp.asarray(zp), bits,
                            BS, K, None if order is None else jnp.asarray(order))
    return x, w


def export(case: str):
    import jax

    import jaxgemv

    x, w = inputs(case)
    f = jaxgemv.int8_matmul if w.bits == 8 else jaxgemv.int4_matmul
    allow = [jax.export.DisabledSafetyCheck.custom_call("jaxgemv_nbits_matmul")]
    return jax.export.export(jax.jit(f), disabled_checks=allow, platforms=["cpu"])(x, w)


if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    for case in CASES:
        with open(os.path.join(here, f"nbits_export_{case}.bin"), "wb") as fh:
            fh.write(export(case).serialize())
        print(case, "written")
