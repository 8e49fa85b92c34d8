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


def test_check_passes(decode):
    assert decode.main(["--config", "tiny", "--check", "--steps", "16"]) == 0


def test_check_passes_with_fp16_activations(decode):
    assert decode.main(["--config", "tiny", "--check", "--dtype", "f16", "--steps", "8"]) == 0


def test_jaxgemv_attention_timing_and_check(decode):
    """--attention jaxgemv: rotary, cache writes and attention by jaxgemv.decode_attention (on CPU
    its C++ handler), every format's model, and the check against float32 with XLA's attention."""
    assert decode.main(["--config", "tiny", "--steps", "2", "--attention", "jaxgemv"]) == 0
    assert decode.main(["--config", "tiny", "--check", "--dtype", "f16", "--steps", "8", "--attention", "jaxgemv"]) == 0


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


def test_fp8_timing_and_check(decode):
    assert decode.main(["--config", "tiny", "--steps", "2", "--formats", "fp8,bf16"]) == 0
    assert decode.main(["--config", "tiny", "--check", "--formats", "fp8", "--steps", "8"]) == 0


def test_check_needs_a_quantized_format(decode):
    with pytest.raises(SystemExit):
        decode.main(["--config", "tiny", "--check", "--formats", "bf16"])


def test_int4_check(decode):
    assert decode.main(["--config", "tiny", "--check", "--formats", "int4", "--steps", "8"]) == 0
