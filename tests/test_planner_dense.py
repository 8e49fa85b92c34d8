"""plan_dense at fixed device facts: its answers must not move with the test machine."""

import pytest

from jaxgemv import planner
from jaxgemv.device import DeviceFacts
from jaxgemv.planner import DensePlan, plan_dense

H200 = DeviceFacts("cuda", (9, 0), 132)
A100 = DeviceFacts("cuda", (8, 0), 108)
SMALL = DeviceFacts("cuda", (9, 0), 8)  # a made-up 8-SM Hopper: the column grid alone fills it
CPU = DeviceFacts("cpu")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("JAXGEMV_VARIANT", raising=False)
    monkeypatch.delenv("JAXGEMV_SPLITS", raising=False)


@pytest.mark.parametrize(
    "m, n, k, facts, want",
    [
        # The seed's shapes: 8 splits (at most 64 column tiles x 8 = 512 blocks, under 4 per SM),
        # and loads so that a warp's share of K is one batch: K / 8 / 32 warps / 4 lanes.
        (1, 1, 2048, H200, DensePlan("splitk", splits=8, loads=2)),
        (8, 32, 2048, H200, DensePlan("splitk", splits=8, loads=2)),
        (4, 128, 4096, H200, DensePlan("splitk", splits=8, loads=4)),
        (8, 1024, 4096, H200, DensePlan("splitk", splits=8, loads=4)),
        (2, 1024, 8192, H200, DensePlan("splitk", splits=8, loads=8)),
        # K = 128 is 16 chunks: one per lane of each quad of 4 warps, no split.
        (1, 256, 128, H200, DensePlan("splitk", splits=1, loads=1)),
        # K = 136: 17 chunks over 4 warps, 5 per warp: two loads per lane.
        (3, 7, 136, H200, DensePlan("splitk", splits=1, loads=2)),
        # K = 512: 64 chunks, 4 splits leave 4 per warp (8 would leave 2).
        (1, 64, 512, H200, DensePlan("splitk", splits=4, loads=1)),
        # 64 column tiles already make 8 blocks per SM on 8 SMs: no split.
        (1, 1024, 4096, SMALL, DensePlan("splitk", splits=1, loads=8)),
        (1, 32, 4096, SMALL, DensePlan("splitk", splits=8, loads=4)),
    ],
)
def test_splitk_parameters(m, n, k, facts, want):
    assert plan_dense(m, n, k, facts, "splitk") == want


@pytest.mark.parametrize(
    "m, n, k, facts, kernel",
    [
        # Inside the range timed faster than XLA's dot (planner.DENSE_AUTO_M/N/K): the kernel,
        # with the launch parameters the forced variant gets.
        (4, 32, 2048, H200, True),
        (8, 1024, 4096, H200, True),
        (4, 128, 4096, H200, True),
        (6, 300, 3000, H200, True),
        (8, 32, 4096, SMALL, True),
        # Outside it: XLA's dot. M = 1 and N = 1, where XLA's reduction kernel was faster; M, N
        # and K that were not timed; shapes the kernel cannot take; no clusters; the CPU.
        (1, 32, 2048, H200, False),
        (1, 1024, 4096, H200, False),
        (8, 1, 4096, H200, False),
        (3, 256, 2048, H200, False),
        (9, 32, 2048, H200, False),
        (4, 31, 2048, H200, False),
        (4, 1025, 2048, H200, False),
        (4, 32, 2040, H200, False),
        (8, 32, 4104, H200, False),
        (4, 32, 4092, H200, False),  # K % 8 != 0
        (4, 32, 2048, A100, False),
        (64, 4096, 4096, CPU, False),
        (4, 32, 2048, CPU, False),
    ],
)
def test_auto(m, n, k, facts, kernel):
    got = plan_dense(m, n, k, facts)
    assert got == (plan_dense(m, n, k, facts, "splitk") if kernel else DensePlan("xla"))
    assert got.variant == ("splitk" if kernel else "xla")


@pytest.mark.parametrize("n", [1, 16, 100, 512, 1024])
@pytest.mark.parametrize("k", [128, 256, 1000, 2048, 4096, 16384])
def test_splitk_invariants(n, k):
    p = plan_dense(1, n, k, H200, "splitk")
    tiles, chunks = -(-n // 16), k // 8
    per_warp = -(-chunks // (p.splits * planner.DENSE_WARPS))
    assert p.splits in planner.DENSE_SPLITS and p.splits <= planner.DENSE_MAX_AUTO_SPLITS
    assert p.loads in planner.DENSE_LOADS
    # One batch of loads per warp unless the batch is at its cap.
    assert per_warp <= 4 * p.loads or p.loads == planner.DENSE_LOADS[-1]
    # Each split keeps a warp busy, and the grid stops growing at its target.
    if p.splits > 1:
        assert chunks >= p.splits * planner.DENSE_WARPS * 4
        assert tiles * p.splits // 2 < planner.DENSE_BLOCKS_PER_SM * H200.sm_count


def test_forced_variants_and_their_errors():
    assert plan_dense(64, 4096, 4100, H200, "xla") == DensePlan("xla")
    assert plan_dense(1, 64, 64, CPU, "xla") == DensePlan("xla")
    assert plan_dense(1, 64, 64, CPU, "cpu") == DensePlan("cpu")
    assert plan_dense(8, 4096, 64, H200, "splitk").variant == "splitk"  # any N, K % 8 == 0
    assert plan_dense(1, 64, 64, H200, "dequant") == DensePlan("xla")
    with pytest.raises(ValueError, match=r"K % 8 == 0 \(16-byte rows\), got K = 4100"):
        plan_dense(1, 64, 4100, H200, "splitk")
    with pytest.raises(ValueError, match="M <= 8, got M = 9"):
        plan_dense(9, 64, 4096, H200, "splitk")
    with pytest.raises(ValueError, match=r"compute capability 9.0"):
        plan_dense(1, 64, 4096, A100, "splitk")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        plan_dense(1, 64, 4096, CPU, "splitk")
    with pytest.raises(ValueError, match="only on the CPU platform"):
        plan_dense(1, 64, 4096, H200, "cpu")
    with pytest.raises(ValueError, match="expected one of auto, splitk, xla, cpu"):
        plan_dense(1, 64, 4096, H200, "mma")


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("JAXGEMV_VARIANT", "xla")
    assert plan_dense(1, 32, 2048, H200) == DensePlan("xla")
    # An explicit variant wins over the environment.
    assert plan_dense(1, 32, 2048, H200, "splitk").variant == "splitk"
    monkeypatch.setenv("JAXGEMV_VARIANT", " SplitK")
    assert plan_dense(1, 2048, 2048, H200).variant == "splitk"  # forced past the N gate
    monkeypatch.setenv("JAXGEMV_VARIANT", "dequant")  # the other formats' name for XLA's dot
    assert plan_dense(1, 32, 2048, H200) == DensePlan("xla")
    monkeypatch.setenv("JAXGEMV_VARIANT", "mma")
    with pytest.raises(ValueError, match="JAXGEMV_VARIANT='mma': dense_matmul takes one of"):
        plan_dense(1, 32, 2048, H200)
    monkeypatch.delenv("JAXGEMV_VARIANT")

    monkeypatch.setenv("JAXGEMV_SPLITS", "16")
    assert plan_dense(1, 32, 4096, H200, "splitk") == DensePlan("splitk", splits=16, loads=2)
    monkeypatch.setenv("JAXGEMV_SPLITS", "1")
    assert plan_dense(1, 32, 2048, H200, "splitk") == DensePlan("splitk", splits=1, loads=8)
    for bad in ("3", "32", "eight", "-1"):
        monkeypatch.setenv("JAXGEMV_SPLITS", bad)
        with pytest.raises(ValueError, match=f"JAXGEMV_SPLITS='{bad}'"):
            plan_dense(1, 32, 2048, H200, "splitk")
    # The split override does not turn the kernel on where the planner picks XLA.
    monkeypatch.setenv("JAXGEMV_SPLITS", "2")
    assert plan_dense(9, 32, 2048, H200) == DensePlan("xla")
