"""python -m jaxgemv.bench on CPU: one JSON row per case, byte counts, argument errors. No timing asserts."""

import json
import math

import pytest

from jaxgemv import bench
from conftest import requires_cpu_default, requires_gpu

FAST = ["--batches", "2", "--min-batch-ms", "1"]


def _timed(value):
    """A reported time: a finite number. Not its sign: where a flush keeps small weights cold the
    flush's own median is subtracted, and on a busy GPU (tests in parallel) a product can come out
    below it."""
    return isinstance(value, float) and math.isfinite(value)


def _expected_bytes(n, k, m):
    packed, scales, global_scale = n * k // 2, n * k // 16, 4
    x, y = m * k * 2, m * n * 2  # float16 activations in and out
    return packed + scales + global_scale + x + y


@requires_cpu_default
def test_json_rows(tmp_path, capsys):
    path = tmp_path / "b.json"
    argv = ["--shapes", "256,128", "64x256", "--m", "1,3", "--json", str(path), *FAST]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "256x128" in out and "64x256" in out  # the table is on stdout

    data = json.loads(path.read_text())
    rows = data["rows"]
    cases = [(256, 128, 1), (256, 128, 3), (64, 256, 1), (64, 256, 3)]
    assert sorted((r["n"], r["k"], r["m"]) for r in rows) == sorted(cases)
    for r in rows:
        assert r["bytes"] == _expected_bytes(r["n"], r["k"], r["m"])
        assert r["format"] == "nvfp4" and r["dtype"] == "float16" and r["variant"] == "cpu"
        for key in ("us", "min_us", "max_us", "xla_dot_us", "xla_dequant_us", "tbps"):
            assert _timed(r[key]) and r[key] > 0, key  # on CPU no flush is subtracted: positive
        assert r["min_us"] <= r["us"] <= r["max_us"]
        assert len(r["samples_us"]) == 2 and r["calls"] >= 1 and r["copies"] >= 2
        assert "ceiling_us" not in r  # no streaming-read ceiling on CPU
    meta = data["meta"]
    assert meta["platform"] == "cpu" and meta["jax_version"] and meta["date"]


def test_skipped_variant_and_no_baselines(tmp_path):
    path = tmp_path / "b.json"
    argv = ["--shapes", "128,64", "--m", "2", "--variant", "auto,mma", "--no-baselines", "--json", str(path), *FAST]
    assert bench.main(argv) == 0
    auto, mma = json.loads(path.read_text())["rows"]
    assert _timed(auto["us"]) and "xla_dot_us" not in auto
    assert "skipped" in mma and "us" not in mma


def test_warm_column_runs_as_many_products_per_call_as_cold(tmp_path, capsys):
    """--warm times one weight copy with at least _MIN_PRODUCTS passes per call (so the device,
    not JAX's host cost per call, sets the pace) and prints its column."""
    path = tmp_path / "b.json"
    argv = ["--shapes", "64,128", "--m", "2", "--warm", "--no-baselines", "--json", str(path), *FAST]
    assert bench.main(argv) == 0
    assert "warm us" in capsys.readouterr().out
    (row,) = json.loads(path.read_text())["rows"]
    assert _timed(row["warm_us"]) and row["warm_copies"] == 1
    assert row["warm_rounds"] == bench._MIN_PRODUCTS and row["rounds"] < bench._MIN_PRODUCTS


@requires_cpu_default
def test_crossover(tmp_path):
    path = tmp_path / "c.json"
    argv = ["--crossover", "--shapes", "128,64", "--m", "8,64", "--json", str(path), *FAST]
    assert bench.main(argv) == 0
    data = json.loads(path.read_text())
    assert {r["requested"] for r in data["rows"] if "us" in r} == {"cpu", "dequant"}
    assert [s["shape"] for s in data["crossover"]] == ["128x64"]


@pytest.mark.parametrize("bad", ["12x34x5", "lm_head_9000", "0,128", "256,100"])
def test_bad_shape_is_a_clear_error(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--shapes", bad])
    assert exc.value.code == 2
    assert repr(bad) in capsys.readouterr().err


def test_bad_m_and_variant(capsys):
    for argv, word in ((["--m", "1,x"], "1,x"), (["--variant", "fastest"], "fastest")):
        with pytest.raises(SystemExit):
            bench.main(["--shapes", "64,64", *argv])
        assert word in capsys.readouterr().err


def test_parse_shapes_names():
    assert bench.parse_shapes(["lm_head_248k", "4096x4096", "512,2048"]) == [
        ("lm_head_248k", 248320, 2048),
        ("attn_4k_4k", 4096, 4096),
        ("expert_up", 512, 2048),
    ]
    assert len(bench.parse_shapes(["all"])) == len(bench.NAMED_SHAPES)


def test_products_run_pass_by_pass():
    """Several passes over the copies run in program order (each copy re-read only after all the
    others), whatever XLA's scheduler would prefer; every product's output comes back."""
    import jax
    import jax.numpy as jnp

    import jaxgemv

    x = jax.random.normal(jax.random.key(0), (2, 64), jnp.float16)
    ws = [jaxgemv.quantize_nvfp4(jax.random.normal(jax.random.key(i), (32, 64))) for i in range(3)]
    op = lambda x, w: jaxgemv.fp4_matmul(x, w)  # noqa: E731
    exe, passes, order = bench.compile_products(op, x, ws, rounds=4)
    assert passes == 4 and order in ("barrier", "data")
    assert bench._schedule(exe) == list(range(12))
    y = exe(x, ws)
    assert y.shape == (12, 2, 32)  # one output per product, stacked
    first = jnp.stack([op(x, w) for w in ws])
    assert jnp.array_equal(y[:3], first)  # pass 0 uses x itself


def test_large_outputs_come_back_apart(monkeypatch):
    """Outputs at or above _APART_MIN_OUT_BYTES come back one array per product, in program order,
    so that no stacking copy is timed with them."""
    import jax
    import jax.numpy as jnp

    import jaxgemv

    monkeypatch.setattr(bench, "_APART_MIN_OUT_BYTES", 2 * 32 * 2)  # this product's y, [2, 32] fp16
    x = jax.random.normal(jax.random.key(0), (2, 64), jnp.float16)
    ws = [jaxgemv.quantize_nvfp4(jax.random.normal(jax.random.key(i), (32, 64))) for i in range(3)]
    op = lambda x, w: jaxgemv.fp4_matmul(x, w)  # noqa: E731
    exe, passes, order = bench.compile_products(op, x, ws, rounds=2)
    assert passes == 2 and bench._schedule(exe) == list(range(6))
    ys = exe(x, ws)
    assert isinstance(ys, tuple) and len(ys) == 6 and all(y.shape == (2, 32) for y in ys)
    for w, y in zip(ws, ys[:3]):
        assert jnp.array_equal(y, op(x, w))  # pass 0 uses x itself
    assert not jnp.array_equal(ys[3], ys[0])  # pass 1 a perturbed x


def test_passes_bounded_by_output_bytes():
    assert bench.passes_for(8, 4, 1024) == 8
    assert bench.passes_for(8, 320, 1024) == 1  # already many products per call
    assert bench.passes_for(8, 4, 32 << 20) == 1  # outputs too large to concatenate T times


@pytest.mark.parametrize("fmt", ["fp8", "fp8_128x128", "fp8_b32"])
def test_fp8_formats(tmp_path, fmt):
    path = tmp_path / "b.json"
    assert bench.main(["--format", fmt, "--shapes", "192,256", "--m", "2", "--json", str(path), *FAST]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    bn = 128 if fmt == "fp8_128x128" else 1
    scale_bytes = 4 * -(-192 // bn) * (8 if fmt == "fp8_b32" else 2)  # K blocks of 32, else of 128
    assert row["bytes"] == 192 * 256 + scale_bytes + 2 * 256 * 2 + 2 * 192 * 2
    assert row["format"] == fmt and _timed(row["us"]) and _timed(row["xla_dequant_us"])


@pytest.mark.parametrize("fmt", ["int4", "int8", "int4_f16", "int8_f16", "int4_zp", "int8_zp", "int4_g128",
                                 "int4_g128_zp"])
def test_nbits_formats(tmp_path, fmt):
    path = tmp_path / "b.json"
    # --dtype asks the other type: the format's scales decide.
    dtype = "bf16" if fmt.endswith("_f16") else "f16"
    assert bench.main(["--format", fmt, "--shapes", "64,256", "--m", "1", "--dtype", dtype, "--json", str(path),
                       *FAST]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    bits = int(fmt[3])
    bs = 128 if "_g128" in fmt else 32
    assert bench.FORMATS[fmt].launch == (f"int{bits}", bs)
    weight = 64 * (256 // bs) * (bs * bits // 8 + 2)  # codes and one 16-bit scale per block
    zero_points = 64 * -(-(256 // bs) * bits // 8) if fmt.endswith("_zp") else 0  # packed like the codes
    assert row["bytes"] == weight + zero_points + 256 * 2 + 64 * 2
    assert row["dtype"] == ("float16" if fmt.endswith("_f16") else "bfloat16")  # the scales' dtype
    assert row["format"] == fmt and _timed(row["us"]) and _timed(row["xla_dequant_us"])


@requires_cpu_default
def test_dense_format(tmp_path):
    path = tmp_path / "b.json"
    argv = ["--format", "dense", "--shapes", "1x2048", "32x256", "--m", "1,8", "--variant", "auto,cpu,splitk",
            "--json", str(path), *FAST]
    assert bench.main(argv) == 0
    rows = json.loads(path.read_text())["rows"]
    assert len(rows) == 12
    for r in rows:
        assert r["bytes"] == 2 * r["n"] * r["k"] + 2 * r["m"] * (r["k"] + r["n"])
        assert "xla_dequant_us" not in r and _timed(r["xla_dot_us"])  # no dequantize baseline for dense
        if r["requested"] == "splitk":
            assert "skipped" in r  # a CUDA kernel
        else:
            assert _timed(r["us"]) and r["variant"] == {"auto": "xla", "cpu": "cpu"}[r["requested"]]


def test_small_weights_are_kept_cold_by_a_flush():
    ctx = bench.Ctx(facts=None, gpu=True, ceiling=True, dtype=None, l2_bytes=60 << 20, rounds=8, batches=1,
                    min_batch_s=0.0, copies=None, baselines=True, warm=False)
    assert bench.copies_and_flush(ctx, 8 << 20) == (23, 0)  # 23 copies pass 3 x L2
    copies, flush = bench.copies_and_flush(ctx, 4096)  # a 4 KB router: 46080 copies otherwise
    assert copies == bench.FLUSH_COPIES and flush % 16 == 0
    assert flush >= 2 * ctx.l2_bytes  # each flush evicts the whole L2
    assert bench.copies_and_flush(ctx, 600 << 10)[1] > 0  # expert 512 x 2048 NVFP4: 315 copies otherwise


def test_time_cold_with_a_flush_runs_and_subtracts(monkeypatch):
    """The flush path on CPU, with stream_read (a CUDA kernel) replaced by a jnp read of the same
    buffer: products and flushes compile in order, one flush buffer serves every copy, and the
    flushes' own time is subtracted."""
    import jax
    import jax.numpy as jnp

    import jaxgemv

    monkeypatch.setattr(bench, "stream_read", lambda buf, salt: (jnp.sum(buf, dtype=jnp.uint32) ^ salt).reshape(1))
    ctx = bench.Ctx(facts=None, gpu=False, ceiling=False, dtype=jnp.float16, l2_bytes=1 << 20, rounds=4, batches=2,
                    min_batch_s=0.0, copies=None, baselines=False, warm=False)
    x = jax.random.normal(jax.random.key(0), (2, 64), jnp.float16)
    ws = [jaxgemv.quantize_nvfp4(jax.random.normal(jax.random.key(i), (32, 64))) for i in range(3)]
    flush = jax.random.bits(jax.random.key(9), (1 << 16,), jnp.uint8)
    t = bench.time_cold(ctx, lambda x, w: jaxgemv.fp4_matmul(x, w), x, ws, flush)
    base = ctx.cache[("flush", 3, flush.size, x.shape, "float16")]
    assert t.flush_us == base.us and t.rounds == 4 and t.copies == 3
    assert len(t.samples_s) == 2


def test_flushed_rows_carry_a_note():
    """Rows timed with a flush subtracted say how far to trust them and where device times are."""
    row = dict(shape="s", n=512, k=2048, m=4, format="nvfp4", variant="mma k8 l2", us=4.0, min_us=3.5, max_us=5.0,
               tbps=0.15, pct_ceiling=70.0, xla_dot_us=6.0, xla_dequant_us=9.0, speedup_xla_dot=1.5,
               speedup_xla_dequant=2.25)
    plain = bench.results_table([row], warm=False)
    assert "flush" not in plain and "4.0" in plain
    flushed = bench.results_table([dict(row, flush_us=36.0)], warm=False)
    assert "36.0" in flushed and "tools/small_products.py" in flushed.splitlines()[-1]


def test_kernel_times_count_each_products_kernels_and_the_idle_gaps():
    """Four products of one 10 us kernel each, 2 us apart, beside a kernel that ran once per pass
    (x's perturbation, left out): 10 us of kernels and 2 us of idle GPU per product."""
    us = 1000  # ns
    events = [("perturb", 0, 1 * us)]
    start = 1 * us
    for _ in range(4):
        start += 2 * us
        events.append(("MmaGemvKernel", start, 10 * us))
        start += 10 * us
    kernel_us, gap_us, _ = bench.kernel_times(events, products=4)
    assert kernel_us == pytest.approx(10.0)
    assert gap_us == pytest.approx(2.0)  # 4 gaps of 2 us over 4 products
    # Overlapping kernels (a dependent launch) count once in the busy time: no negative gaps.
    kernel_us, gap_us, _ = bench.kernel_times([("a", 0, 10 * us), ("a", 5 * us, 10 * us)], products=2)
    assert kernel_us == pytest.approx(10.0) and gap_us == pytest.approx(0.0)
    assert bench.kernel_times([], products=3) is None


def test_kernel_times_count_a_products_numbered_helpers():
    """XLA numbers each fusion it emits: a transpose of x before each of 3 products runs as
    loop_transpose_fusion_1, _2, _3, one kind, counted with the products; a fusion once per call
    (the outputs' stack) is not."""
    us = 1000
    events, start = [], 0
    for i in range(3):
        events.append((f"loop_transpose_fusion_{i + 1}", start, 1 * us))
        events.append(("MmaGemvKernel", start + 1 * us, 10 * us))
        start += 11 * us
    events.append(("concatenate_fusion.7", start, 2 * us))
    kernel_us, gap_us, _ = bench.kernel_times(events, products=3)
    assert kernel_us == pytest.approx(11.0) and gap_us == pytest.approx(0.0)
    kinds = bench.kernel_kinds(events, products=3)
    assert list(kinds) == ["MmaGemvKernel", "loop_transpose_fusion"]  # longest first
    assert kinds["MmaGemvKernel"] == pytest.approx(10.0) and kinds["loop_transpose_fusion"] == pytest.approx(1.0)


@requires_cpu_default
def test_trace_on_cpu_has_no_kernels(tmp_path, capsys):
    """--trace is a GPU column: on CPU the run ignores it; the profiler path itself runs and finds no
    device kernels."""
    import jax
    import jax.numpy as jnp

    path = tmp_path / "b.json"
    assert bench.main(["--shapes", "64,128", "--m", "1", "--trace", "--no-baselines", "--json", str(path), *FAST]) == 0
    (row,) = json.loads(path.read_text())["rows"]
    assert "kernel_us" not in row and "kern us" not in capsys.readouterr().out
    exe = jax.jit(lambda x: x * 2).lower(jnp.ones(4)).compile()
    assert bench.trace_products(exe, (jnp.ones(4),), products=1) is None


def test_stream_read_salt_must_hold_four_bytes():
    import jax.numpy as jnp

    with pytest.raises(ValueError, match="salt must hold at least 4 bytes"):
        bench.stream_read(jnp.zeros(16, jnp.uint8), jnp.zeros(1, jnp.float16))


@requires_gpu
def test_gpu_stream_read_takes_x_as_its_salt():
    """The ceiling's read salted by the product's x (any dtype, its first 4 bytes), or by one
    uint32: both read the buffer and return one uint32."""
    import jax
    import jax.numpy as jnp

    buf = jax.random.bits(jax.random.key(0), (1 << 20,), jnp.uint8)
    for salt in (jnp.ones((3, 64), jnp.float16), jnp.zeros((1,), jnp.uint32)):
        out = jax.jit(bench.stream_read)(buf, salt)
        assert out.shape == (1,) and out.dtype == jnp.uint32


def test_traced_rows_show_kernel_columns():
    row = dict(shape="s", n=5120, k=17408, m=1, format="fp8", variant="mma k8 l1", us=34.5, min_us=33.8, max_us=35.6,
               tbps=2.66, pct_ceiling=80.0, kernel_us=31.0, gap_us=3.1, ceiling_kernel_us=24.0,
               pct_ceiling_kernel=77.4)
    table = bench.results_table([row], warm=False)
    assert "kern us" in table and "31.0" in table and "3.1" in table and "77" in table.splitlines()[2]


def test_kinds_lines_name_each_rows_kernels():
    """--kinds: one line per traced row, its kinds of kernel longest first, jaxgemv's mangled names
    shortened to the function's."""
    gemv = "_ZN7jaxgemv13MmaGemvKernelINS_5NbitsILi4EEE13__nv_bfloat16Li1ELi4ELi2ELb1ELi0ELi0EEEvNS_8GemvArgsEibb"
    assert bench.short_kernel_name(gemv) == "MmaGemvKernel"
    assert bench.short_kernel_name("_ZN7jaxgemv12_GLOBAL__N_119FragmentOrderKernelEPK5uint4P5uint4iiiii") == \
        "FragmentOrderKernel"
    assert bench.short_kernel_name("loop_transpose_fusion") == "loop_transpose_fusion"
    assert bench.short_kernel_name("_ZN") == "_ZN"
    rows = [dict(shape="up_12k_4k", m=4, variant="mma k4 l2", kernel_kinds={gemv: 12.25, "loop_pad_fusion": 0.5}),
            dict(shape="cpu_row", m=1, variant="cpu")]
    assert bench.kinds_lines(rows) == ["kinds up_12k_4k M=4 mma k4 l2: MmaGemvKernel 12.25, loop_pad_fusion 0.50"]


def test_kinds_needs_trace():
    with pytest.raises(SystemExit):
        bench.main(["--kinds", "--shapes", "64,128", "--m", "1"])


def test_finish_row_compares_kernel_times():
    ceiling = bench.Timing([24.5e-6], 1, 1, 4, "barrier", kernel_us=23.0, gap_us=1.5)
    ctx = bench.Ctx(facts=None, gpu=True, ceiling=True, dtype=None, l2_bytes=60 << 20, rounds=8, batches=1,
                    min_batch_s=0.0, copies=None, baselines=False, warm=False, cache={"c": ceiling})
    row = dict(shape="s", m=1, variant="mma", bytes=92_000_000, us=30.0, kernel_us=28.75)
    bench.finish_row(ctx, row, {"ceiling": "c"})
    assert row["ceiling_kernel_us"] == 23.0 and row["pct_ceiling_kernel"] == pytest.approx(80.0)
    assert row["pct_ceiling"] == pytest.approx(100 * 24.5 / 30.0)


def test_plan_label_names_what_the_launcher_runs():
    """The variant column: the plan's K split, or the launcher's where it substitutes one (K split
    6 for 8), with "h" where it runs the instance held to more blocks per SM and " xa" where int4's
    x-ahead instance."""
    from jaxgemv import planner

    plan = planner.Plan("mma", rows=1, ksplit=8, loads=2, xperm=True, xs_warps=0, x_stage=-1)
    assert bench.plan_label(plan) == "mma k8 l2"
    assert bench.plan_label(plan, (6, False, False, False)) == "mma k6 l2"
    assert bench.plan_label(plan, (8, True, False, False)) == "mma k8h l2"
    assert bench.plan_label(plan, (8, False, False, True)) == "mma k8 l2 xa"
    two = planner.Plan("mma", rows=2, ksplit=4, loads=2, xperm=True, xs_warps=0, x_stage=-1)
    assert bench.plan_label(two, (4, True, False, False)) == "mma k4h l2 r2"
