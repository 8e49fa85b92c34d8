"""examples/decode.py's jitted decode loop under several settings, in one process, in rounds.

The models are built once; each setting is a format and a set of Config / timing fields, and every
round times each setting once (the median of three runs of its DecodeTimer, compiled and
prefilled once), so slow drift of the machine lands on every setting alike. Besides ms per step
it prints the host's dispatch time of one decode_loop call (the least seen from the call to its
return, before the device finishes): that time is spent once per call, so ms per step carries
dispatch / steps of it.

    python tools/decode_ab.py --config 8b --dtype f16 --rounds 3 \
        --settings "nvfp4" "nvfp4:steps=128" "nvfp4:unroll=2" "bf16" "bf16:steps=128"

A setting is FORMAT[:key=value,...] with keys steps, unroll, fuse (0/1), batch, and any of
jaxgemv's trace-time knobs (JAXGEMV_TRIGGER=0, ...), set in the environment while that setting's
loop is traced and compiled (each loop is compiled ahead of time, with JAX's caches cleared first,
so settings that differ only in a knob get executables of their own):

    python tools/decode_ab.py --config 8b --rounds 3 --settings nvfp4 nvfp4:JAXGEMV_TRIGGER=0
"""

import argparse
import contextlib
import dataclasses
import os
import re
import statistics
import sys

import jax

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import decode  # noqa: E402


def parse_setting(text):
    fmt, _, rest = text.partition(":")
    fields = {"steps": 32, "unroll": 1, "fuse": 1, "batch": 1, "env": {}}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key.startswith("JAXGEMV_"):
            fields["env"][key] = value
            continue
        if key not in fields or key == "env":
            raise SystemExit(f"setting {text!r}: unknown key {key!r} (steps, unroll, fuse, batch, JAXGEMV_*)")
        fields[key] = int(value)
    if fmt not in decode.FORMATS:
        raise SystemExit(f"setting {text!r}: format must be one of {decode.FORMATS}")
    return fmt, fields


@contextlib.contextmanager
def knobs(env):
    """The environment with `env` set, restored afterwards."""
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(decode.CONFIGS), default="tiny")
    parser.add_argument("--dtype", choices=("bf16", "f16"), default="f16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-len", type=int, default=8)
    parser.add_argument("--settings", nargs="+", default=["nvfp4", "bf16"])
    args = parser.parse_args(argv)
    settings = [(text, *parse_setting(text)) for text in args.settings]
    formats = sorted({fmt for _, fmt, _ in settings})
    base = dataclasses.replace(decode.CONFIGS[args.config], attention="jaxgemv")
    models = decode.in_dtypes(decode.build_models(base, formats), args.dtype)
    timers = {}
    for text, fmt, f in settings:
        cfg = decode.format_config(dataclasses.replace(base, fuse=bool(f["fuse"]), unroll=f["unroll"]), fmt)
        with knobs(f["env"]):
            jax.clear_caches()  # no lowering traced under another setting's knobs is reused
            timers[text] = decode.DecodeTimer(cfg, models[fmt], f["batch"], args.prompt_len, f["steps"])
        hlo = timers[text].lowered.as_text()
        calls = hlo.count("@jaxgemv_fp4_layer(")
        trig = sorted(set(re.findall(r"trigger = (\d+) : i64", hlo)))
        print(f"{text}: {calls} fused layer call(s) in the loop, trigger {'/'.join(trig) or '-'}", file=sys.stderr)
    results = {text: [] for text, _, _ in settings}
    dispatch = {text: [] for text, _, _ in settings}
    for r in range(args.rounds):
        for text, _, _ in settings:
            runs = []
            for _ in range(3):
                runs.append(timers[text]())
                dispatch[text].append(timers[text].dispatch_ms)
            ms = statistics.median(runs)
            results[text].append(ms)
            print(f"round {r}: {text:<28} {ms:8.3f} ms/step", file=sys.stderr, flush=True)
    print(f"{'setting':<28} {'ms/step (rounds)':<30} {'median':>7} {'dispatch ms':>11}")
    for text, _, _ in settings:
        rounds = " ".join(f"{ms:.3f}" for ms in results[text])
        print(f"{text:<28} {rounds:<30} {statistics.median(results[text]):7.3f} {min(dispatch[text]):11.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
