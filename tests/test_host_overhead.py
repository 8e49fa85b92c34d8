"""tools/host_overhead.py on CPU: each setting in a process of its own, a row per case."""

import pathlib
import subprocess
import sys

TOOL = pathlib.Path(__file__).resolve().parent.parent / "tools" / "host_overhead.py"


def test_host_overhead_runs_each_setting():
    out = subprocess.run([sys.executable, str(TOOL), "--calls", "2", "--rounds", "1", "--cases", "nvfp4:1:32:256",
                          "int4:2:48:256", "--settings", "JAXGEMV_OCCUPANCY_CACHE=0", "JAXGEMV_OCCUPANCY_CACHE=1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert "JAXGEMV_OCCUPANCY_CACHE=0" in lines[0] and "JAXGEMV_OCCUPANCY_CACHE=1" in lines[0]
    rows = [ln for ln in lines[2:] if ln.strip()]
    assert [r.split()[0] for r in rows] == ["nvfp4", "int4"]
    for r in rows:  # latency / issue per setting, both positive
        times = [float(v) for v in r.split()[3:] if v != "/"]
        assert len(times) == 4 and all(t > 0 for t in times)


def test_host_overhead_keeps_a_column_per_process():
    """A setting given twice (alternated with another) is two columns, not one overwritten."""
    out = subprocess.run([sys.executable, str(TOOL), "--calls", "2", "--rounds", "1", "--cases", "nvfp4:1:32:256",
                          "--settings", "JAXGEMV_OCCUPANCY_CACHE=1", "JAXGEMV_OCCUPANCY_CACHE=0",
                          "JAXGEMV_OCCUPANCY_CACHE=1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0]
    assert header.count("JAXGEMV_OCCUPANCY_CACHE=1") == 2 and "JAXGEMV_OCCUPANCY_CACHE=1 #2" in header
    row = out.stdout.strip().splitlines()[2]
    assert len([v for v in row.split()[3:] if v != "/"]) == 6


def test_host_overhead_rejects_a_bad_case():
    out = subprocess.run([sys.executable, str(TOOL), "--cases", "int5:1:32:256"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "format must be one of nvfp4, fp8, int4, int8" in out.stderr
