"""tools/decode_ab.py: its settings and one round on the tiny config (CPU or GPU)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import decode_ab  # noqa: E402


def test_settings_parse_with_defaults():
    assert decode_ab.parse_setting("nvfp4") == ("nvfp4", {"steps": 32, "unroll": 1, "fuse": 1, "batch": 1, "env": {}})
    assert decode_ab.parse_setting("bf16:steps=128,unroll=2") == (
        "bf16", {"steps": 128, "unroll": 2, "fuse": 1, "batch": 1, "env": {}})
    assert decode_ab.parse_setting("nvfp4:JAXGEMV_TRIGGER=1,steps=8") == (
        "nvfp4", {"steps": 8, "unroll": 1, "fuse": 1, "batch": 1, "env": {"JAXGEMV_TRIGGER": "1"}})


def test_knobs_are_set_and_restored(monkeypatch):
    monkeypatch.setenv("JAXGEMV_EARLY", "1")
    monkeypatch.delenv("JAXGEMV_TRIGGER", raising=False)
    with decode_ab.knobs({"JAXGEMV_EARLY": "0", "JAXGEMV_TRIGGER": "1"}):
        assert os.environ["JAXGEMV_EARLY"] == "0" and os.environ["JAXGEMV_TRIGGER"] == "1"
    assert os.environ["JAXGEMV_EARLY"] == "1" and "JAXGEMV_TRIGGER" not in os.environ


@pytest.mark.parametrize("text, message", [("nvfp5", "format must be one of"),
                                           ("nvfp4:step=3", "unknown key 'step'"),
                                           ("nvfp4:env=3", "unknown key 'env'")])
def test_bad_settings_are_named(text, message):
    with pytest.raises(SystemExit, match=message):
        decode_ab.parse_setting(text)


def test_one_round_prints_every_setting(capsys):
    assert decode_ab.main(["--rounds", "1", "--settings", "nvfp4:steps=2", "nvfp4:steps=3,unroll=2,fuse=0",
                           "bf16:steps=2,batch=2", "nvfp4:steps=2,JAXGEMV_TRIGGER=0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[1:]] == ["nvfp4:steps=2", "nvfp4:steps=3,unroll=2,fuse=0",
                                                       "bf16:steps=2,batch=2", "nvfp4:steps=2,JAXGEMV_TRIGGER=0"]
