"""Runs a few GEMV cases once each, for Nsight Compute to profile on the GPU machine:

    ncu --clock-control none -k regex:"MmaGemv|ScalarGemv|StreamRead" --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats python3 tools/profile_case.py 248320,2048,4

Each case is N,K,M (float16 activations, the planner's variant); a stream_read of the same bytes
follows each GEMV so the profile holds the ceiling kernel beside it.
"""

import sys

import jax
import jax.numpy as jnp

import jaxgemv
from jaxgemv.bench import stream_read


def main(cases):
    for case in cases:
        n, k, m = (int(v) for v in case.split(","))
        key = jax.random.key(n + k + m)
        packed = jax.random.bits(key, (n, k // 2), jnp.uint8)
        scales = jnp.full((n, k // 16), 0.5, jnp.float8_e4m3fn)
        w = jaxgemv.NVFP4Weight(packed, scales, jnp.float32(0.01))
        x = jax.random.normal(key, (m, k), jnp.float16)
        jax.block_until_ready(jax.jit(jaxgemv.fp4_matmul)(x, w))
        if jax.devices()[0].platform != "gpu":
            continue
        buf = jax.random.bits(key, (n * k // 2 + n * k // 16,), jnp.uint8)
        jax.block_until_ready(jax.jit(stream_read)(buf))


if __name__ == "__main__":
    main(sys.argv[1:])
