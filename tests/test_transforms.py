"""fp4_matmul under jax.grad and jax.export; every CUDA handler inside XLA's command buffers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jaxgemv
from conftest import requires_gpu


def _data(seed=0, n=40, k=128, m=3):
    rng = np.random.default_rng(seed)
    w = jaxgemv.quantize_nvfp4(jnp.asarray(rng.standard_normal((n, k)), jnp.float32))
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal(n), jnp.float32)
    return x, w, b


def test_grad_wrt_x_and_bias():
    x, w, b = _data()
    cot = np.random.default_rng(1).standard_normal((3, 40)).astype(np.float32)

    def loss(x, b):
        y = jaxgemv.fp4_matmul(x.astype(jnp.float16), w, bias=b.astype(jnp.float16))
        return jnp.sum(y.astype(jnp.float32) * cot)

    dx, db = jax.grad(loss, argnums=(0, 1))(x, b)
    wd = np.asarray(w.dequantize(jnp.float32), np.float64)
    np.testing.assert_allclose(np.asarray(dx), cot @ wd, rtol=2e-3, atol=2e-3 * np.abs(cot @ wd).max())
    np.testing.assert_allclose(np.asarray(db), cot.sum(0), rtol=0, atol=2e-3 * np.abs(cot.sum(0)).max())


def test_jit_of_grad_and_jvp():
    x, w, _ = _data(2)
    xh = x.astype(jnp.bfloat16)
    t = jnp.ones_like(xh)
    y, dy = jax.jit(lambda x, t: jax.jvp(lambda x: jaxgemv.fp4_matmul(x, w), (x,), (t,)))(xh, t)
    wd = np.asarray(w.dequantize(jnp.float32))
    np.testing.assert_allclose(np.asarray(dy, np.float32), np.ones((3, 128)) @ wd.T, rtol=1e-2, atol=0.05)
    assert y.shape == (3, 40)


def test_weight_is_not_differentiable():
    x, w, _ = _data(3)
    xh = x.astype(jnp.float16)

    def loss(gscale):
        return jnp.sum(jaxgemv.fp4_matmul(xh, jaxgemv.NVFP4Weight(w.packed, w.scales, gscale)).astype(jnp.float32))

    with pytest.raises(TypeError, match="quantized weight is not differentiable"):
        jax.grad(loss)(w.global_scale)


def test_export_round_trip():
    pytest.importorskip("flatbuffers")
    x, w, b = _data(4)
    xh, bh = x.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
    f = jax.jit(lambda x, w, b: jaxgemv.fp4_matmul(x, w, bias=b))
    # The artifact holds a custom call: export must be told it is allowed, and the process that
    # runs it must have jaxgemv imported (which registers the target).
    exp = export.export(f, disabled_checks=[export.DisabledSafetyCheck.custom_call("jaxgemv_fp4_matmul")])(xh, w, bh)
    again = export.deserialize(exp.serialize())
    np.testing.assert_array_equal(np.asarray(again.call(xh, w, bh)), np.asarray(f(xh, w, bh)))


_COMMAND_BUFFER_SCRIPT = r"""
import glob, json, os, re, sys
import jax, jax.numpy as jnp, numpy as np
import jaxgemv

rng = np.random.default_rng(0)
k, n = 2048, 4096
x = jnp.asarray(rng.standard_normal((4, k)) * np.linspace(0.5, 1.5, k), jnp.float16)
w4 = jaxgemv.quantize_nvfp4(jnp.asarray(rng.standard_normal((n, k)), jnp.float32))
w8 = jaxgemv.quantize_fp8(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), block=(1, 128))
wd = jnp.asarray(rng.standard_normal((32, k)) / 45, jnp.float16)

def step(x, w4, w8, wd):
    h = jaxgemv.fp4_matmul(x, w4)
    h = jaxgemv.fp8_matmul(jnp.tanh(h[:, :k]), w8)
    return h, jaxgemv.dense_matmul(x, wd, variant=sys.argv[1])

exe = jax.jit(step).lower(x, w4, w8, wd).compile()
outs = [exe(x, w4, w8, wd) for _ in range(3)]  # with command buffers: replays of the recorded graph
# Older XLA outlines command buffers in the HLO (computations named command_buffer*); newer XLA
# forms them from the thunk sequence, which --xla_dump_to writes out after its passes run.
text = exe.as_text()
bodies = [c for c in re.split(r"\n(?=\S)", text) if re.match(r"%?command_buffer", c)]
hlo_inside = sorted(set(re.findall(r'custom_call_target="(jaxgemv_\w+)"', "\n".join(bodies))))
# Without command buffers there may be no after-passes file: the sequence as compiled then.
dumps = (sorted(glob.glob(os.path.join(sys.argv[2], "*jit_step*thunk_sequence_after_thunk_passes.txt")))
         or sorted(glob.glob(os.path.join(sys.argv[2], "*jit_step*thunk_sequence.txt"))))
thunks = open(dumps[-1]).read() if dumps else None
top = re.findall(r"^\d+: (k\w+)", thunks, re.M) if thunks else None
print(json.dumps(dict(hlo_inside=hlo_inside, top=top, thunks=(thunks or "")[:3000],
                      outs=[[np.asarray(o, np.float32).tolist() for o in out] for out in outs])))
"""


@requires_gpu
@pytest.mark.parametrize("dense_variant", ["splitk"])
def test_gpu_products_run_inside_command_buffers(dense_variant, tmp_path):
    """The CUDA handlers are command-buffer compatible: with XLA told to put custom calls into
    command buffers (CUDA graphs), they land inside one and their replays give the results of
    the plain run."""
    import json
    import os
    import subprocess
    import sys

    def run(flags, dump):
        env = dict(os.environ, XLA_FLAGS=f"{flags} --xla_dump_to={dump}", XLA_PYTHON_CLIENT_PREALLOCATE="false")
        done = subprocess.run([sys.executable, "-c", _COMMAND_BUFFER_SCRIPT, dense_variant, str(dump)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    graphs = run("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
                 tmp_path / "graphs")
    plain = run("--xla_gpu_enable_command_buffer=", tmp_path / "plain")
    if graphs["top"] is None:
        # XLA that outlines command buffers in the HLO.
        assert {"jaxgemv_fp4_matmul", "jaxgemv_fp8_matmul", "jaxgemv_dense_matmul"} <= set(graphs["hlo_inside"])
        assert plain["hlo_inside"] == []
    else:
        # Top-level thunks: with command buffers the three custom calls sit inside one (none is
        # left on its own); without, they are top-level custom-call thunks.
        assert "kCommandBuffer" in graphs["top"] and "kCustomCall" not in graphs["top"], graphs["thunks"]
        assert "kCommandBuffer" not in plain["top"] and plain["top"].count("kCustomCall") >= 3, plain["thunks"]
    for out in graphs["outs"]:
        for got, want in zip(out, plain["outs"][0]):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_jax_older_than_the_floor_is_refused_at_import():
    """jaxgemv/_ext.py refuses a jax older than MIN_JAX with a message (on jax 0.7.0-0.7.1 the
    sharding tests fail; before the explicit `import jax.export`, 0.7 failed at import with an
    attribute error). Told an older version, a fresh interpreter must refuse; told the floor, it
    must import."""
    import subprocess
    import sys

    def run(version):
        code = f"import jax; jax.__version__ = {version!r}; import jaxgemv; print(jaxgemv.HAS_CUDA)"
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)

    old = run("0.7.1")
    assert old.returncode != 0 and "jaxgemv needs jax 0.7.2 or later; this is jax 0.7.1" in old.stderr
    floor = run("0.7.2")
    assert floor.returncode == 0, floor.stderr
