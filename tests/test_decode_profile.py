"""tools/decode_profile.py's summary of a device timeline, on synthetic kernel events (no GPU)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import decode_profile  # noqa: E402

GEMV = "void jaxgemv::MmaGemvKernel<jaxgemv::Nvfp4, __half, 1, 8, 2, true, 0>(jaxgemv::GemvArgs, int)"
GRAPH = {"hlo_op": "command_buffer"}


def test_busy_time_merges_overlaps_and_gaps_are_the_rest():
    # ns: [0, 10) and [5, 20) overlap (busy 20), then a gap of 10, then [30, 35): busy 25 of a
    # 35 ns span, over 2 steps.
    events = [("loop_add_fusion_3", 0, 10, {}), ("input_reduce_fusion", 5, 15, {}), (GEMV, 30, 5, GRAPH)]
    s = decode_profile.summarize(events, steps=2)
    assert s["span_ms"] == pytest.approx(35 / 1e6 / 2)
    assert s["busy_ms"] == pytest.approx(25 / 1e6 / 2)
    assert s["kernels"] == 1.5


def test_kernels_grouped_by_kind_and_gemvs_by_projection():
    events, t = [], 0
    for _ in range(2):  # two steps of a one-layer model: qkv, o, gate_up, down, lm_head
        for name in (GEMV, "loop_add_fusion_1", GEMV, "loop_add_fusion_22", GEMV, GEMV, GEMV):
            events.append((name, t, 1000, GRAPH if "Gemv" in name else {}))
            t += 2000
    projections = ["qkv", "o", "gate_up", "down", "lm_head"]
    groups = {k: (c, us) for k, c, us in decode_profile.summarize(events, 2, projections)["groups"]}
    for p in projections:
        assert groups[f"jaxgemv Nvfp4 (graph) {p}"] == (1.0, 1.0)
    assert groups["loop_add_fusion"] == (2.0, 2.0)  # digits dropped: one kind across layers


def test_idle_gaps_grouped_by_the_kinds_on_either_side():
    # Two steps of [qkv-like GEMV, fusion]: the gap inside a step (GEMV -> fusion, 2 ns) and the
    # one between steps (fusion -> GEMV, 5 ns), each once per step; an overlapping kernel moves
    # the busy interval's end and so the kind the next gap starts from.
    events = [(GEMV, 0, 10, GRAPH), ("loop_add_fusion_1", 12, 3, {}), ("input_reduce_fusion", 13, 7, {}),
              (GEMV, 25, 10, GRAPH), ("loop_add_fusion_1", 37, 3, {}), ("input_reduce_fusion", 38, 7, {})]
    gaps = {k: (c, us) for k, c, us in decode_profile.summarize(events, 2)["gaps"]}
    assert gaps == {"jaxgemv Nvfp4 (graph) -> loop_add_fusion": (2 / 2, 4 / 1e3 / 2),
                    "input_reduce_fusion -> jaxgemv Nvfp4 (graph)": (1 / 2, 5 / 1e3 / 2)}


def test_no_events():
    assert decode_profile.summarize([], steps=4) is None


def test_floor_reads_the_step_weights_bytes():
    # The read floor reads, per projection, exactly the bytes of that projection's weight.
    cfg = decode_profile.decode.CONFIGS["tiny"]
    sizes = decode_profile.weight_bytes(cfg, "nvfp4")
    d, f = cfg.hidden, cfg.intermediate
    n = {"qkv": (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim, "o": d, "gate_up": 2 * f, "down": d, "lm_head": cfg.vocab}
    k = {"qkv": d, "o": cfg.heads * cfg.head_dim, "gate_up": d, "down": f, "lm_head": d}
    for p in n:
        assert sizes[p] == n[p] * k[p] // 2 + n[p] * k[p] // 16 + 4  # codes, E4M3 scales, global scale


def test_floor_without_a_gpu_says_so(capsys):
    if decode_profile.jax.default_backend() == "gpu":
        pytest.skip("runs the floor on a GPU")
    assert decode_profile.main(["--formats", "nvfp4", "--steps", "2", "--floor"]) == 0
    assert "read floor, nvfp4 weights: needs a GPU" in capsys.readouterr().out


def test_attention_kernel_has_its_own_label_and_keeps_the_projections_in_order():
    attention = "void jaxgemv::(anonymous namespace)::DecodeAttentionKernel<__half, 128, 1, false>(AttentionArgs)"
    events, t = [], 0
    for name in (GEMV, attention, GEMV, GEMV, GEMV, GEMV):  # qkv, attention, o, gate_up, down, lm_head
        events.append((name, t, 1000, GRAPH))
        t += 2000
    s = decode_profile.summarize(events, steps=1, projections=["qkv", "o", "gate_up", "down", "lm_head"])
    labels = {k for k, _, _ in s["groups"]}
    assert labels == {"jaxgemv attention (graph)"} | {f"jaxgemv Nvfp4 (graph) {p}"
                                                     for p in ("qkv", "o", "gate_up", "down", "lm_head")}


def test_attention_bench_runs_on_cpu(capsys):
    import attention_bench

    assert attention_bench.main(["--batch", "1", "--pos", "5", "--heads", "4", "--kv-heads", "2", "--head-dim", "64",
                                 "--layers", "1", "--repeats", "1", "--variants", "auto,xla", "--trace"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:4] == ["batch", "pos", "auto", "us"]
    assert lines[1].split()[:2] == ["1", "5"]
