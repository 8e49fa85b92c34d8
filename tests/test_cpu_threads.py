"""The CPU handlers split a product's output rows over threads (ffi/cpu_types.h: ParallelRows,
JAXGEMV_CPU_THREADS, read once per process): each row is computed whole by one thread in a fixed
order, so the output is the same bits whatever the thread count. Each count runs in a process of
its own, on products large enough to be split (N x K x (M + 1) at least 2^18 per thread), with
ragged row counts, every epilogue operand and the activation, and decode attention (threaded over
sequences and KV heads), against one reference process."""

import hashlib
import os

import pytest

import jaxgemv
from conftest import run_side_by_side
from jaxgemv import planner

SCRIPT = r"""
import hashlib, jax, jax.numpy as jnp, numpy as np, jaxgemv
jax.config.update("jax_platforms", "cpu")
rng = np.random.default_rng(3)
h = hashlib.sha256()
for n, k, m in [(1037, 1024, 1), (515, 2048, 5), (96, 4096, 8)]:
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    b = jnp.asarray(rng.standard_normal(n), jnp.bfloat16)
    r = jnp.asarray(rng.standard_normal((m, n)), jnp.bfloat16)
    s = jnp.asarray(rng.uniform(0.5, 2, m), jnp.float32)
    ws = [(jaxgemv.fp4_matmul, jaxgemv.quantize_nvfp4(w)), (jaxgemv.fp8_matmul, jaxgemv.quantize_fp8(w)),
          (jaxgemv.int4_matmul, jaxgemv.quantize_int4(w, symmetric=False)), (jaxgemv.int8_matmul, jaxgemv.quantize_int8(w))]
    for f, q in ws:
        ys = [f(x, q, bias=b, row_scale=s, residual=r, variant="cpu"),
              f(x, q, rms_eps=1e-6, variant="cpu")]
        if n % 16 == 0:
            ys.append(f(x, q, activation="swiglu", variant="cpu"))
        for y in ys:
            h.update(np.asarray(y).tobytes())
    h.update(np.asarray(jaxgemv.dense_matmul(x, jnp.asarray(w, jnp.bfloat16), bias=b, variant="cpu")).tobytes())
    h.update(np.asarray(jaxgemv.fp4_dequantize(jaxgemv.quantize_nvfp4(w), jnp.bfloat16)).tobytes())
for batch, t_len, pos in [(3, 300, [5, 299, 0]), (1, 70, [69])]:
    heads, kvh, hd = 8, 2, 64
    qkv = jnp.asarray(rng.standard_normal((batch, (heads + 2 * kvh) * hd)), jnp.float16)
    kc = jnp.asarray(rng.standard_normal((batch, kvh, t_len, hd)), jnp.float16)
    vc = jnp.asarray(rng.standard_normal((batch, kvh, t_len, hd)), jnp.float16)
    outs = jaxgemv.decode_attention(qkv, kc, vc, jnp.asarray(pos, jnp.int32), heads=heads, kv_heads=kvh,
                                    rope_theta=1e4, variant="cpu")
    for a in outs:
        h.update(np.asarray(a).tobytes())
print("HASH", h.hexdigest())
"""


def _hashes(*threads: str) -> list[str]:
    """The script's hash under each thread count, the processes run side by side (one after
    another they took the longest test's time, ~110 s on the GPU machine's 16 workers)."""
    runs = [(SCRIPT, (), dict(os.environ, JAXGEMV_CPU_THREADS=t, JAX_PLATFORMS="cpu")) for t in threads]
    hashes = []
    for t, (code, out, err) in zip(threads, run_side_by_side(runs)):
        assert code == 0, f"JAXGEMV_CPU_THREADS={t}: {err[-3000:]}"
        hashes.append([line for line in out.splitlines() if line.startswith("HASH")][-1])
    return hashes


def test_cpu_handlers_give_the_same_bits_on_any_thread_count():
    one, three, seven = _hashes("1", "3", "7")
    assert three == one
    assert seven == one


def test_cpu_threads_knob_checked_at_trace_time(monkeypatch):
    facts = jaxgemv.DeviceFacts("cpu")
    monkeypatch.setenv("JAXGEMV_CPU_THREADS", "4")
    assert planner.plan_fp4(1, 64, 64, facts).variant == "cpu"
    for bad in ("-1", "257", "many"):
        monkeypatch.setenv("JAXGEMV_CPU_THREADS", bad)
        with pytest.raises(ValueError, match=rf"JAXGEMV_CPU_THREADS='{bad}': expected an integer from 0 to 256"):
            planner.plan_fp4(1, 64, 64, facts)
        with pytest.raises(ValueError, match="JAXGEMV_CPU_THREADS"):
            planner.plan_dense(1, 64, 64, facts, "cpu")


def test_cpu_products_tool_reports_each_format(capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "tools" / "cpu_products.py"
    spec = importlib.util.spec_from_file_location("cpu_products", path)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main(["--shapes", "64x256", "--m", "1,9", "--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [r[:2] for r in rows] == [["64x256", "1"], ["64x256", "9"]]
    assert all(len(r) == 3 + 4 * 3 and all(float(v) > 0 for v in r[2::] if v != "/") for r in rows)
