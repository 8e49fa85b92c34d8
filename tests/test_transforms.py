"""fp4_matmul under jax.grad and jax.export."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

import jaxgemv


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
