"""Runs a few GEMV cases once each, for Nsight Compute to profile on the GPU machine:

    ncu --clock-control none -k regex:"MmaGemv|ScalarGemv|StreamRead" --section SpeedOfLight \\
        --section Occupancy --section WarpStateStats python3 tools/profile_case.py nvfp4:248320,2048,4

Each case is [FORMAT[@DTYPE]:]N,K,M (a format of `python -m jaxgemv.bench`, nvfp4 if left out;
the format's activation dtype, else DTYPE (bf16 or f16), else float16; the planner's variant
unless JAXGEMV_VARIANT forces one); a stream_read of the same bytes follows each GEMV so the
profile holds the ceiling kernel beside it.
"""

import sys

import jax
import jax.numpy as jnp

from jaxgemv.bench import DTYPES, FORMATS, case_bytes, stream_read


def main(cases):
    for case in cases:
        name, _, dims = case.rpartition(":")
        name, _, act = name.partition("@")
        fmt = FORMATS[name or "nvfp4"]
        n, k, m = (int(v) for v in dims.split(","))
        key = jax.random.key(n + k + m)
        w = jax.jit(lambda key: fmt.random_weight(key, n, k))(key)
        dtype = jnp.dtype(fmt.act_dtype or DTYPES[act or "f16"])
        x = jax.random.normal(key, (m, k), dtype)
        jax.block_until_ready(jax.jit(lambda x, w: fmt.matmul(x, w, "auto"))(x, w))
        if jax.devices()[0].platform != "gpu":
            continue
        size = -(-case_bytes(fmt, n, k, m, dtype.itemsize) // 16) * 16
        buf = jax.random.bits(key, (size,), jnp.uint8)
        jax.block_until_ready(jax.jit(stream_read)(buf))


if __name__ == "__main__":
    main(sys.argv[1:])
