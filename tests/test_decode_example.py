"""examples/decode.py end to end on the tiny config: timing runs and the NVFP4-vs-float32 check."""

import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "decode.py"


@pytest.fixture(scope="module")
def decode():
    spec = importlib.util.spec_from_file_location("decode_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_timing_runs_both_formats(decode):
    assert decode.main(["--config", "tiny", "--steps", "4", "--batch", "1,2"]) == 0


def test_dense_dtype_of_its_own(decode, capsys):
    """--dtype f16 --dense-dtype bf16: the quantized model in fp16 activations against a bf16 dense
    model (issue 3's baseline), in one table."""
    assert decode.main(["--config", "tiny", "--steps", "2", "--dtype", "f16", "--dense-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "dense bf16" in out and "dense f16" not in out


def test_check_passes(decode):
    assert decode.main(["--config", "tiny", "--check", "--steps", "16"]) == 0


def test_check_passes_with_fp16_activations(decode):
    assert decode.main(["--config", "tiny", "--check", "--dtype", "f16", "--steps", "8"]) == 0


def test_xla_attention_timing_and_check(decode):
    """--attention xla: rotary, cache writes and attention in jnp (the default, jaxgemv's
    decode_attention, runs its C++ handler on CPU in the tests above)."""
    assert decode.main(["--config", "tiny", "--steps", "2", "--attention", "xla"]) == 0
    assert decode.main(["--config", "tiny", "--check", "--dtype", "f16", "--steps", "8", "--attention", "xla"]) == 0


def test_dense_model_keeps_xla_attention(decode):
    """The dense model is the XLA baseline: its config keeps XLA's attention under --attention
    jaxgemv, the quantized formats' take jaxgemv's."""
    cfg = decode.dataclasses.replace(decode.CONFIGS["tiny"], attention="jaxgemv")
    assert decode.format_config(cfg, "bf16").attention == "xla"
    assert decode.format_config(cfg, "nvfp4").attention == "jaxgemv"
    assert decode.format_config(cfg, "fp8").attention == "jaxgemv"


def test_sharded_example_partitions_and_matches():
    import jax

    if len(jax.local_devices()) < 2:
        pytest.skip("needs several local devices (conftest asks for 8 CPU devices)")
    spec = importlib.util.spec_from_file_location("sharded_decode_example", EXAMPLE.with_name("sharded_decode.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Returns 1 if a weight is gathered or the logits drift from the unsharded model's.
    assert module.main(["--steps", "2"]) == 0
    assert module.main(["--steps", "2", "--format", "fp8"]) == 0  # FP8: a 2-device mesh (2 K blocks)
    assert module.main(["--steps", "2", "--format", "int4"]) == 0  # o and down split on K too


def test_fp8_timing_and_check(decode):
    assert decode.main(["--config", "tiny", "--steps", "2", "--formats", "fp8,bf16"]) == 0
    assert decode.main(["--config", "tiny", "--check", "--formats", "fp8", "--steps", "8"]) == 0


def test_check_needs_a_quantized_format(decode):
    with pytest.raises(SystemExit):
        decode.main(["--config", "tiny", "--check", "--formats", "bf16"])


def test_int4_check(decode):
    assert decode.main(["--config", "tiny", "--check", "--formats", "int4", "--steps", "8"]) == 0


def test_unrolled_loop_gives_the_same_tokens(decode):
    """--unroll: several steps per iteration of the jitted loop, the same greedy tokens (with a
    step count that is not a multiple of it, so lax.scan's remainder runs too)."""
    import dataclasses

    import jax.numpy as jnp

    cfg = dataclasses.replace(decode.CONFIGS["tiny"], attention="jaxgemv")
    params = decode.build_models(cfg, ["nvfp4"])["nvfp4"]
    tokens = jnp.array([3, 7], jnp.int32)
    outs = []
    for unroll in (1, 3):
        c = dataclasses.replace(cfg, unroll=unroll)
        cache = decode.init_cache(c, 2, 8, params["embed"].dtype)
        out, _ = decode.decode_loop(c, params, cache, tokens, jnp.int32(0), 7)
        outs.append(out)
    assert outs[0].shape == (7, 2)
    assert (outs[0] == outs[1]).all()
    assert decode.main(["--config", "tiny", "--steps", "3", "--unroll", "2", "--formats", "nvfp4"]) == 0
    with pytest.raises(SystemExit):
        decode.main(["--config", "tiny", "--unroll", "0"])
