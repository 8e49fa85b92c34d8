"""The checks every product test shares: against a float64 reference, within twice the error of a
same-precision implementation, never NaN; a call whose output starts as NaN; the sharding layouts
and a partitioned call against the whole one; the environment that forces the x-in-shared-memory
kernel."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def swiglu_np(p):
    """silu(gate) x up of pre-activations [..., N] whose gate and up columns are interleaved by 8
    (jaxgemv.interleave_gate_up), in p's precision: [..., N / 2]."""
    lead, n = p.shape[:-1], p.shape[-1]
    q = p.reshape(*lead, n // 16, 2, 8)
    gate, up = q[..., 0, :], q[..., 1, :]
    return (gate / (1 + np.exp(-gate)) * up).reshape(*lead, n // 2)


def check_product(y, x, w64, bias, weight_dtype, row_scale=None, residual=None, rounded_product=False,
                  activation=None):
    """y against (x @ w64^T) * row_scale + bias (+ residual) in float64, each optional, with
    activation="swiglu" through silu(gate) x up before the residual. The same-precision baseline
    rounds the weight to `weight_dtype` (what a plain implementation of the format would hold),
    multiplies in float32 and rounds the output to x's dtype (and, with `rounded_product`, the
    product before the row scale and residual too, as dense_matmul does); y's error must be at
    most twice that baseline's (plus float32 accumulation noise), in norm and in the worst
    element."""
    x64 = np.asarray(x).astype(np.float64)
    w_same = np.asarray(jnp.asarray(w64, weight_dtype)).astype(np.float32)
    ref, y32 = x64 @ w64.T, np.asarray(x).astype(np.float32) @ w_same.T
    if rounded_product:
        y32 = y32.astype(x.dtype).astype(np.float32)
    for operand, apply in ((row_scale, lambda a, v: a * v[..., None]), (bias, lambda a, v: a + v)):
        if operand is not None:
            ref = apply(ref, np.asarray(operand).astype(np.float64))
            y32 = apply(y32, np.asarray(operand).astype(np.float32))
    if activation is not None:
        assert activation == "swiglu"
        ref, y32 = swiglu_np(ref), swiglu_np(y32)
    if residual is not None:
        ref = ref + np.asarray(residual).astype(np.float64)
        y32 = y32 + np.asarray(residual).astype(np.float32)
    same_prec = y32.astype(x.dtype).astype(np.float64)
    got = np.asarray(y).astype(np.float64)
    assert got.shape == ref.shape
    assert np.all(np.isfinite(got)), "unwritten (poisoned) or non-finite outputs"
    scale = np.linalg.norm(ref)
    assert scale > 0
    err, base = np.linalg.norm(got - ref) / scale, np.linalg.norm(same_prec - ref) / scale
    assert err <= 2 * base + 1e-5, (err, base)
    worst, worst_base = np.max(np.abs(got - ref)), np.max(np.abs(same_prec - ref))
    assert worst <= 2 * worst_base + 1e-5 * np.max(np.abs(ref)), (worst, worst_base)


def poisoned_call(product, x, w, bias, variant, device, **epilogue):
    """product(x, w, bias=, variant=, **epilogue) with its output placed in a donated NaN-filled
    buffer, so any element the kernel does not write stays NaN."""
    m, n = x.shape[0], w.shape[0]
    poison = jax.device_put(jnp.full((m, n), jnp.nan, x.dtype), device)
    args = jax.device_put((x, w, bias, epilogue), device)

    def run(poison, x, w, bias, epilogue):
        del poison
        return product(x, w, bias=bias, variant=variant, **epilogue)

    return jax.jit(run, donate_argnums=0)(poison, *args)


# Layouts on the 2 x 4 `mesh` (conftest.py), by name: (x spec, weight spec, bias spec, K sharded?).
SHARDING_CASES = {
    "column-parallel": (P(), P("b", None), P("b"), False),
    "row-parallel": (P(None, "b"), P(None, "b"), P(), True),
    "data-parallel": (P("a", None), P(), P(), False),
    "data+column": (P("a", None), P("b", None), P("b"), False),
    "data+row": (P("a", "b"), P(None, "b"), P(), True),
    "column+row": (P(), P("a", "b"), P("a"), True),
}


def on_cpu(tree):
    """The arrays of `tree` on the first CPU device: the sharding tests' meshes are the virtual CPU
    devices, so their whole-operand reference runs there too, whatever the default device (a GPU
    on the GPU machine, where the reference would otherwise run another kernel)."""
    return jax.device_put(tree, jax.devices("cpu")[0])


def check_partitioned(f, plain_args, placed_args, k_sharded):
    """jitted f on sharded operands against f on whole ones: the compiled program gathers no
    weight and all-reduces exactly when K is split; the result is bitwise the same, or (K split)
    within a few ulps, each shard's partial being rounded to x's dtype before the float32 sum."""
    want = np.asarray(f(*on_cpu(plain_args)), np.float32)
    got = np.asarray(f(*placed_args), np.float32)
    hlo = f.lower(*placed_args).compile().as_text()
    assert "all-gather" not in hlo
    assert ("all-reduce" in hlo) == k_sharded
    if k_sharded:
        np.testing.assert_allclose(got, want, rtol=0, atol=4 * 2.0**-8 * np.abs(want).max())
    else:
        np.testing.assert_array_equal(got, want)


def force_x_in_shared_memory(monkeypatch, xs_warps: str):
    """The environment that makes the planner run the persistent kernel with x in shared memory
    (blocks of xs_warps warps, no K split, x in fragment order); xs_warps "0": the per-block
    kernel with the same x order and no K split."""
    monkeypatch.setenv("JAXGEMV_XS", xs_warps)
    monkeypatch.setenv("JAXGEMV_KSPLIT", "1")
    monkeypatch.setenv("JAXGEMV_XPERM", "1")


# M = 1 with a K split: x carried in the ring (JAXGEMV_XSTAGE=0) or staged once per warp, paired
# (1; ffi/gemv_core.cuh, MmaXStagedBytes), each forced, with both x orders and two splits. The
# [N, K] cases: K = 1152 deals 9 windows unevenly over a split's warps (at split 8 one takes two,
# the rest one); K = 33280 stages 65 KB of x per block.
ONE_ROW_X_PATHS = [(ksplit, xstage, xperm) for ksplit in ("2", "8") for xstage in ("0", "1") for xperm in ("0", "1")]
ONE_ROW_SPLIT_NK = ((4098, 2048), (36, 1152), (20, 33280))


def force_one_row_x_path(monkeypatch, ksplit: str, xstage: str, xperm: str):
    """The environment that forces one of ONE_ROW_X_PATHS on the planner."""
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    monkeypatch.setenv("JAXGEMV_XSTAGE", xstage)
    monkeypatch.setenv("JAXGEMV_XPERM", xperm)


def force_one_m_tile_blocks(monkeypatch, ksplit: str, xperm: str):
    """M 9-16 as one-m-tile blocks, two per column tile (JAXGEMV_ROWS=1), at a forced K split and
    x order."""
    monkeypatch.setenv("JAXGEMV_ROWS", "1")
    monkeypatch.setenv("JAXGEMV_KSPLIT", ksplit)
    monkeypatch.setenv("JAXGEMV_XPERM", xperm)


def x_fits_beside_rings(xs_warps: str, m: int, k: int) -> bool:
    """Whether a forced persistent plan fits an H200 block: blocks of 16 warps take up to 160 KB of
    rings (int4/int8 with two loads), which leaves room for at most 64 KB of x (M = 16, K = 2048);
    every case of the x-in-shared-memory tests fits blocks of 4 or 8."""
    return int(xs_warps) < 16 or 2 * m * k <= 64 << 10


def cuda_fragment_order_call(monkeypatch, module, op, target: str, *args) -> tuple[str, str]:
    """`op(*args)` lowered for CUDA with an H200's facts and x forced into fragment order (no GPU
    needed): the module's text and its one call of the custom call `target`, for tests of the x
    the handler gets (its shape, xperm, whether a pad precedes it)."""
    import jaxgemv

    monkeypatch.setattr(module, "facts_for_lowering", lambda ctx, platform: jaxgemv.DeviceFacts("cuda", (9, 0), 132))
    monkeypatch.setenv("JAXGEMV_XPERM", "1")
    jax.clear_caches()  # JAX's caches key on the function, not the environment the lowering reads
    checks = [jax.export.DisabledSafetyCheck.custom_call(target)]
    text = jax.export.export(jax.jit(op), platforms=["cuda"], disabled_checks=checks)(*args).mlir_module()
    (call,) = [line for line in text.splitlines() if f"@{target}" in line]
    return text, call
