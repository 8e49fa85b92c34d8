"""examples/decode.py's model, tensor-parallel over every local device.

Projections are sharded the Megatron way: q/k/v, gate/up and lm_head column-parallel (weight
sharded on N: each device computes its slice of the output, no communication), o and down
row-parallel (weight sharded on K: partial products and one all-reduce each). The weights are
placed with NamedSharding and the same jitted decode step runs unchanged: jaxgemv partitions its
products instead of gathering the weights.

    python examples/sharded_decode.py                 # 8 virtual CPU devices when no GPU is present
    python examples/sharded_decode.py --config 8b     # every local GPU
    python examples/sharded_decode.py --format fp8    # or int4 (bf16 activations)

The mesh takes the most local devices that split every row-parallel weight at its scale-block
boundaries (all 8 for NVFP4's 16-value blocks and int4's 32-value blocks on the tiny config, 2 for
FP8's 128-value blocks).

It prints ms per step, the all-reduces and weight gathers in the compiled step (no weight is
gathered), and the relative difference of the logits from the same model run unsharded.
"""

import os
import sys

# Virtual CPU devices must be requested before JAX starts; the flag only affects the CPU platform.
_count = sys.argv[sys.argv.index("--cpu-devices") + 1] if "--cpu-devices" in sys.argv else "8"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_count}")

import argparse
import importlib.util
import pathlib
import re
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jaxgemv

_spec = importlib.util.spec_from_file_location("decode", pathlib.Path(__file__).with_name("decode.py"))
decode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(decode)

COLUMN_PARALLEL = ("qkv", "gate_up", "lm_head")
ROW_PARALLEL = ("o", "down")


def tp_size(params, devices: int) -> int:
    """The most devices (at most `devices`) over which every row-parallel weight's K splits at
    whole scale blocks (each quantized weight's `splits_k` says)."""
    weights = [layer[name] for layer in params["layers"] for name in ROW_PARALLEL]
    return max(d for d in range(1, devices + 1) if all(w.splits_k(d) for w in weights))


def shard(params, mesh):
    """Places every projection column- or row-parallel over the mesh axis "tp"; the rest is
    replicated. Quantized weights shard their codes and block scales alike."""

    def place(name, w):
        spec = P("tp", None) if name in COLUMN_PARALLEL else P(None, "tp") if name in ROW_PARALLEL else P()
        if decode.is_quantized(w) or w.ndim == 2:  # every array of the weight, from one spec of [N, K]
            act = "swiglu" if name == "gate_up" else None
            return jax.device_put(w, jaxgemv.weight_sharding(w, mesh, spec, activation=act))
        return jax.device_put(w, NamedSharding(mesh, P()))

    def place_dict(tree):
        return {name: place(name, w) for name, w in tree.items()}

    return {**place_dict({k: v for k, v in params.items() if k != "layers"}),
            "layers": [place_dict(layer) for layer in params["layers"]]}


def collectives(cfg, params, batch):
    """(all-reduces, all-gathers of weight codes) in the compiled decode step. The other
    all-gathers move activations between the column- and row-parallel layouts (a few KB)."""
    cache = decode.init_cache(cfg, batch, 8, params["embed"].dtype)
    tokens = jnp.zeros((batch,), jnp.int32)
    hlo = decode.decode_step.lower(cfg, params, cache, tokens, jnp.int32(0)).compile().as_text()
    reduces = re.findall(r"= \S+ all-reduce(?:-start)?\(", hlo)
    weight_gathers = re.findall(r"= (?:u8|f8e4m3fn)\[\S* all-gather(?:-start)?\(", hlo)
    return len(reduces), len(weight_gathers)


def first_logits(cfg, params, batch):
    cache = decode.init_cache(cfg, batch, 4, params["embed"].dtype)
    tokens = jnp.arange(batch, dtype=jnp.int32)
    logits, _, _ = decode.decode_step(cfg, params, cache, tokens, jnp.int32(0))
    return np.asarray(logits, np.float32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", choices=sorted(decode.CONFIGS), default="tiny")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--cpu-devices", type=int, default=8, help="virtual CPU devices when no GPU is present")
    p.add_argument("--format", choices=("nvfp4", "fp8", "int4"), default="nvfp4")
    args = p.parse_args(argv)
    cfg = decode.CONFIGS[args.config]
    params = decode.build_models(cfg, [args.format])[args.format]
    devices = jax.local_devices()
    devices = devices[: tp_size(params, len(devices))]
    mesh = Mesh(np.array(devices), ("tp",))
    print(f"{len(devices)} x {devices[0].device_kind}, config {args.config}, batch {args.batch}")
    want = first_logits(cfg, params, args.batch)
    sharded = shard(params, mesh)
    del params
    got = first_logits(cfg, sharded, args.batch)
    reduces, gathers = collectives(cfg, sharded, args.batch)
    times = decode.time_decode(cfg, sharded, args.batch, prompt_len=4, steps=args.steps)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    print(f"tensor-parallel {args.format}: {statistics.median(times):.2f} ms/step; the compiled step has {reduces} "
          f"all-reduces and gathers {gathers} weights")
    print(f"logits vs unsharded: relative difference {rel:.2e}")
    return 0 if rel < 2e-2 and gathers == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
