"""tools/small_products.py's report: Nsight Compute CSV in, per-product cold times out (no GPU)."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import small_products  # noqa: E402

HEADER = '"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"'


def _csv(kernels):
    """ncu --csv text for (name, microseconds) rows, with the tool's chatter mixed in."""
    lines = ["==PROF== Connected to process 1", HEADER]
    for i, (name, us) in enumerate(kernels):
        lines.append(f'"{i}","{name}","gpu__time_duration.sum","nsecond","{us * 1000:,.0f}"')
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    reps = small_products.REPEATS
    cases = [dict(shape="a", n=32, k=2048, m=4, format="dense", variant="splitk", bytes=4_000_000),
             dict(shape="a", n=32, k=2048, m=4, format="dense", variant="xla", bytes=4_000_000)]
    (tmp_path / "cases.json").write_text(json.dumps(dict(repeats=reps, cases=cases)))
    marker = ("StreamReadKernel(const uint4*)", 1.0)
    kernels = [("warm-up and compile", 9.0), marker]
    kernels += [("jaxgemv::DenseSplitK<16>", us) for us in (3.0, 3.2, 3.1)]
    kernels += [marker, ("autotuning", 50.0), marker]
    # XLA's dot: two kernels per run.
    for us in (5.0, 5.4, 5.2):
        kernels += [("gemm_fusion_dot", us - 1.0), ("input_reduce_fusion", 1.0)]
    kernels += [marker]
    (tmp_path / "kernels.csv").write_text(_csv(kernels))
    # The reads run: per case one warm-up launch, then REPEATS timed ones; other kernels ignored.
    reads = [("memset", 0.5), marker, ("StreamReadKernel", 2.0), ("StreamReadKernel", 2.2), ("StreamReadKernel", 2.1),
             marker, ("StreamReadKernel", 2.4), ("StreamReadKernel", 2.5), ("StreamReadKernel", 2.6)]
    (tmp_path / "reads.csv").write_text(_csv(reads))
    return tmp_path


def test_report_sums_each_products_kernels_and_divides_by_the_read(files, capsys):
    argv = ["--report", str(files / "kernels.csv"), "--cases", str(files / "cases.json"),
            "--reads-report", str(files / "reads.csv")]
    assert small_products.main(argv) == 0
    rows = {line.split()[2]: line.split() for line in capsys.readouterr().out.splitlines()
            if line.startswith("a ")}
    # splitk: one kernel, median of 3.0 / 3.2 / 3.1; its read median 2.1 us.
    assert rows["splitk"][3:6] == ["1", "3.10", f"{4e6 / 3.1 / 1e6:.3g}"]
    assert rows["splitk"][6:8] == ["2.10", f"{3.1 / 2.1:.2f}"]
    # xla: two kernels per run summed (5.0, 5.4, 5.2); read 2.5 us.
    assert rows["xla"][3:5] == ["2", "5.20"]
    assert rows["xla"][6:8] == ["2.50", f"{5.2 / 2.5:.2f}"]


def test_report_without_reads(files, capsys):
    assert small_products.main(["--report", str(files / "kernels.csv"), "--cases", str(files / "cases.json")]) == 0
    out = capsys.readouterr().out
    assert "read us" not in out and "3.10" in out and "5.20" in out


def test_kernel_metrics_groups_a_kernels_metrics_and_scales_their_units():
    # ncu prints one row per kernel and metric; units differ by version ("ns" or "nsecond").
    text = "\n".join([
        "==PROF== Connected to process 1", HEADER,
        '"0","void jaxgemv::Fp8WgmmaKernel<__half, 8, 1>(jaxgemv::GemvArgs)","gpu__time_duration.sum","ns","40,128"',
        '"0","void jaxgemv::Fp8WgmmaKernel<__half, 8, 1>(jaxgemv::GemvArgs)","dram__bytes_read.sum","Mbyte","92.04"',
        '"0","void jaxgemv::Fp8WgmmaKernel<__half, 8, 1>(jaxgemv::GemvArgs)","smsp__inst_executed.sum","inst","9,816,800"',
        '"1","StreamReadKernel<0>","gpu__time_duration.sum","usecond","32.03"',
        '"1","StreamReadKernel<0>","sm__cycles_active.min","cycle","n/a"',
    ])
    (name0, m0), (name1, m1) = small_products.kernel_metrics(text)
    assert small_products.short_name(name0) == "jaxgemv::Fp8WgmmaKernel" and name1 == "StreamReadKernel<0>"
    assert m0 == pytest.approx({"gpu__time_duration.sum": 40.128, "dram__bytes_read.sum": 92.04e6,
                                "smsp__inst_executed.sum": 9816800.0})
    assert m1 == pytest.approx({"gpu__time_duration.sum": 32.03})
    assert small_products.kernel_rows(text) == [(name0, pytest.approx(40.128)), (name1, pytest.approx(32.03))]
