"""The planner at fixed device facts: its answers must not move with the test machine."""

import pytest

from jaxgemv import _ext, planner
from jaxgemv.device import DeviceFacts, combine
from jaxgemv.planner import Plan, plan_fp4

H200 = DeviceFacts("cuda", (9, 0), 132)
A100 = DeviceFacts("cuda", (8, 0), 108)
T4 = DeviceFacts("cuda", (7, 5), 40)
CPU = DeviceFacts("cpu")


@pytest.fixture(autouse=True)
def _without_xshare_auto(monkeypatch):
    """These tests are about the per-block kernel's plans (and imma's): "auto"'s xshare rule, which
    takes some of their shapes first, is off here and tested in test_xshare.py."""
    monkeypatch.setattr(planner, "XSHARE_AUTO", {})


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("JAXGEMV_VARIANT", raising=False)
    monkeypatch.delenv("JAXGEMV_KSPLIT", raising=False)
    monkeypatch.delenv("JAXGEMV_LOADS", raising=False)
    monkeypatch.delenv("JAXGEMV_XPERM", raising=False)
    monkeypatch.delenv("JAXGEMV_ROWS", raising=False)
    monkeypatch.delenv("JAXGEMV_XS", raising=False)
    monkeypatch.delenv("JAXGEMV_XSTAGE", raising=False)
    monkeypatch.delenv("JAXGEMV_PDL", raising=False)
    monkeypatch.delenv("JAXGEMV_EARLY", raising=False)
    monkeypatch.delenv("JAXGEMV_TRIGGER", raising=False)
    monkeypatch.delenv("JAXGEMV_MIN_BLOCKS", raising=False)
    monkeypatch.delenv("JAXGEMV_K6", raising=False)
    monkeypatch.delenv("JAXGEMV_WAVES", raising=False)
    monkeypatch.delenv("JAXGEMV_COLS2", raising=False)
    monkeypatch.delenv("JAXGEMV_TILE_PREP", raising=False)
    monkeypatch.delenv("JAXGEMV_OCCUPANCY_CACHE", raising=False)


@pytest.mark.parametrize(
    "m, n, k, facts, want",
    [
        # lm_head: 15520 column blocks already fill 132 SMs, so no K split.
        # Over 64 MB of weight, x goes over in pair order; up to M = 8 the per-block kernel reads it.
        (4, 248320, 2048, H200, Plan("mma", rows=1, ksplit=1, loads=2, xperm=True)),
        (1, 151936, 2048, H200, Plan("mma", rows=1, ksplit=1, loads=2, xperm=True)),
        # Over 64 MB with a K split: row order at M = 1 (the kernel pairs x), pair order above.
        (1, 8192, 28672, H200, Plan("mma", rows=1, ksplit=8, loads=2)),
        (2, 8192, 28672, H200, Plan("mma", rows=1, ksplit=8, loads=2, xperm=True)),
        # 32 column blocks: 8 warps each split K; 16 windows of 128 allow 2 loads per warp.
        (4, 512, 2048, H200, Plan("mma", rows=1, ksplit=8, loads=2)),
        # K = 512 has 4 windows: the split stops at 4.
        (4, 2048, 512, H200, Plan("mma", rows=1, ksplit=4, loads=1)),
        # M 9..16 holds two m-tiles per warp; from 16 MB of weight (here 17.7) x in fragment order;
        # 320 blocks, more than two per SM: split 4 ways (TWO_TILE_K8_BLOCKS_PER_SM_4BIT).
        (16, 5120, 6144, H200, Plan("mma", rows=2, ksplit=4, loads=2, xperm=True)),
        (16, 4096, 8192, H200, Plan("mma", rows=2, ksplit=8, loads=2, xperm=True)),
        # K = 128 x odd: one 16-byte load per lane and window.
        (1, 4096, 8320, H200, Plan("mma", rows=1, ksplit=8, loads=1)),
        # K % 128 != 0: the warp-per-column kernel, row-tiled once the column grid fills the SMs.
        (4, 4096, 8320 + 16, H200, Plan("scalar", rows=4)),
        (4, 256, 2064, H200, Plan("scalar", rows=1)),
        (1, 4096, 2064, H200, Plan("scalar", rows=1)),
        # Before SM80 there is no mma.m16n8k16 with fp16/bf16 operands.
        (4, 4096, 4096, T4, Plan("scalar", rows=4)),
        # Above the GEMV range: decode once, XLA's dot.
        (planner.GEMV_MAX_M + 1, 4096, 4096, H200, Plan("dequant")),
        # On the CPU the C++ handler up to CPU_HANDLER_MAX_M, decode-then-dot above.
        (planner.CPU_HANDLER_MAX_M, 4096, 4096, CPU, Plan("cpu")),
        (planner.CPU_HANDLER_MAX_M + 1, 4096, 4096, CPU, Plan("dequant")),
        (64, 4096, 4096, CPU, Plan("dequant")),
    ],
)
def test_auto(m, n, k, facts, want):
    assert plan_fp4(m, n, k, facts) == want


def test_ksplit_targets_warps_per_sm():
    for facts in (H200, A100):
        for n in (16, 512, 2048, 5120, 16384):
            p = plan_fp4(1, n, 4096, facts)
            blocks = -(-n // 16)
            assert p.ksplit in planner.KSPLITS
            # Either the split reaches the warp target, or it is at its cap, or the grid is large
            # and K short enough that 8 warps would get too few windows each (next test).
            few_windows = 4096 // planner.MMA_K_QUANTUM // 2 < 8 * planner.MIN_WINDOWS_PER_WARP
            fewer = p.ksplit == 4 and few_windows and blocks >= planner.FEWER_SPLITS_MIN_BLOCKS[True] * facts.sm_count
            assert blocks * p.ksplit >= facts.sm_count * planner.TARGET_WARPS_PER_SM or p.ksplit == 8 or fewer


@pytest.mark.parametrize(
    "m, n, k, want",
    [
        # 384 blocks at M = 1: 2 windows per warp at k8, so k4 (measured 9.6 -> 8.3 us).
        (1, 6144, 4096, 4),
        # At M = 8 the same grid keeps k8 (measured 10.9 against 11.5 at k4) ...
        (8, 6144, 4096, 8),
        # ... and 768 blocks take k4 at any M (21.8 -> 16.3 at M = 8).
        (8, 12288, 4096, 4),
        (1, 12288, 4096, 4),
        # 256 blocks: k4 at M = 1 (in the decode step 6.84 -> 6.35 us; cold no faster, no slower),
        # k8 at M = 8 (k4 slower there).
        (1, 4096, 4096, 4),
        (8, 4096, 4096, 8),
        # Enough windows per warp at k8: unchanged.
        (1, 4096, 12288, 8),
        (1, 5120, 17408, 8),
        # Too few blocks to fill the GPU without the split: unchanged.
        (4, 512, 2048, 8),
    ],
)
def test_fewer_splits_for_few_windows_per_warp(m, n, k, want):
    assert plan_fp4(m, n, k, H200).ksplit == want


@pytest.mark.parametrize(
    "m, n, k, four_bit, fp8",
    [
        # Two m-tiles take x ahead, two 8-warp blocks per SM at K split 8 (three for FP8's one-load
        # blocks). 512 blocks: 4-bit codes and FP8 split 4 ways (measured at M = 16: int4 62.5 ->
        # 63.2 us, within spread, NVFP4 59.7 -> 58.3, FP8 107.2 -> 80.0); int8 keeps k8 (97.1 at k4
        # against 88.7).
        (16, 8192, 28672, 4, 4),
        (9, 8192, 28672, 4, 4),
        # 320 blocks: 4-bit codes split 4 ways (int4 38.5 -> 30.2, NVFP4 29.6 -> 28.3), FP8's
        # one-load k8 blocks hold it in one wave (33.3 against 38.4 at k4) ...
        (16, 5120, 17408, 4, 8),
        # ... at M = 17 the same weight is 640 blocks (two m-tile blocks per column tile): k4 by
        # the same counts (not measured).
        (17, 5120, 17408, 4, 4),
        # No more than two blocks per SM: k8 (not measured).
        (16, 4096, 14336, 8, 8),
        # More blocks than six 4-warp blocks per SM hold: unchanged (not measured).
        (16, 16384, 28672, 8, 8),
        (17, 8192, 28672, 8, 8),
    ],
)
def test_two_m_tiles_split_four_ways_above_the_k8_blocks_per_sm(m, n, k, four_bit, fp8):
    assert planner.plan_nbits(m, n, k, 4, 32, H200).ksplit == four_bit
    assert plan_fp4(m, n, k, H200).ksplit == four_bit
    assert planner.plan_fp8(m, n, k, 128, H200).ksplit == fp8
    assert planner.plan_nbits(m, n, k, 8, 32, H200).ksplit == 8  # int8 keeps k8
    assert planner.plan_nbits(8, n, k, 4, 32, H200).ksplit == 8  # one m-tile: its own rules


def test_fewer_splits_leave_forced_splits_alone(monkeypatch):
    monkeypatch.setenv("JAXGEMV_KSPLIT", "8")
    assert plan_fp4(1, 6144, 4096, H200).ksplit == 8


def test_forced_variants_and_their_errors():
    assert plan_fp4(64, 4096, 4096, H200, "mma").variant == "mma"
    assert plan_fp4(1, 4096, 4096, H200, "scalar").variant == "scalar"
    assert plan_fp4(1, 4096, 4096, H200, "dequant") == Plan("dequant")
    assert plan_fp4(1, 64, 64, CPU, "dequant") == Plan("dequant")
    with pytest.raises(ValueError, match=r"K % 128 == 0, got K = 2064"):
        plan_fp4(1, 64, 2064, H200, "mma")
    with pytest.raises(ValueError, match="compute capability 8.0"):
        plan_fp4(1, 64, 4096, T4, "mma")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        plan_fp4(1, 64, 4096, CPU, "scalar")
    with pytest.raises(ValueError, match="only on the CPU platform"):
        plan_fp4(1, 64, 4096, H200, "cpu")
    with pytest.raises(ValueError, match="expected one of"):
        plan_fp4(1, 64, 4096, H200, "fastest")


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("JAXGEMV_VARIANT", "scalar")
    assert plan_fp4(4, 4096, 4096, H200).variant == "scalar"
    # An explicit variant wins over the environment.
    assert plan_fp4(4, 4096, 4096, H200, "mma").variant == "mma"
    monkeypatch.setenv("JAXGEMV_VARIANT", "MMA ")
    assert plan_fp4(4, 4096, 4096, H200).variant == "mma"
    monkeypatch.setenv("JAXGEMV_KSPLIT", "2")
    assert plan_fp4(4, 4096, 4096, H200).ksplit == 2
    monkeypatch.setenv("JAXGEMV_KSPLIT", "3")
    with pytest.raises(ValueError, match="JAXGEMV_KSPLIT='3'"):
        plan_fp4(4, 4096, 4096, H200)
    monkeypatch.setenv("JAXGEMV_KSPLIT", "")
    monkeypatch.setenv("JAXGEMV_LOADS", "1")
    assert plan_fp4(4, 4096, 4096, H200).loads == 1
    monkeypatch.setenv("JAXGEMV_LOADS", "4")
    with pytest.raises(ValueError, match="JAXGEMV_LOADS='4'"):
        plan_fp4(4, 4096, 4096, H200)
    monkeypatch.setenv("JAXGEMV_LOADS", "")
    assert not plan_fp4(4, 2048, 2048, H200).xperm and plan_fp4(4, 4096, 4096, H200).xperm  # 2 / 9 MiB
    monkeypatch.setenv("JAXGEMV_XPERM", "1")
    assert plan_fp4(4, 2048, 2048, H200).xperm
    monkeypatch.setenv("JAXGEMV_XPERM", "0")
    assert not plan_fp4(4, 4096, 4096, H200).xperm
    monkeypatch.setenv("JAXGEMV_XPERM", "yes")
    with pytest.raises(ValueError, match="JAXGEMV_XPERM='yes'"):
        plan_fp4(4, 4096, 4096, H200)
    monkeypatch.setenv("JAXGEMV_VARIANT", "yes")
    with pytest.raises(ValueError, match="JAXGEMV_VARIANT='yes'"):
        plan_fp4(4, 4096, 4096, H200)


def test_forced_rows(monkeypatch):
    # M = 16 as two one-m-tile blocks per column tile: twice the grid, no persistent kernel (its
    # m-tiles are its own), the two-m-tile K-split rule not applied.
    assert plan_fp4(16, 8192, 28672, H200).rows == 2
    assert plan_fp4(16, 151936, 2048, H200).xs_warps
    monkeypatch.setenv("JAXGEMV_ROWS", "1")
    assert plan_fp4(16, 8192, 28672, H200) == Plan("mma", rows=1, ksplit=8, loads=2, xperm=True)
    assert plan_fp4(16, 151936, 2048, H200) == Plan("mma", rows=1, ksplit=1, loads=2, xperm=True)
    assert planner.plan_nbits(12, 8192, 28672, 4, 32, H200).rows == 1
    monkeypatch.setenv("JAXGEMV_XS", "8")
    with pytest.raises(ValueError, match="JAXGEMV_XS=8.*JAXGEMV_ROWS"):
        plan_fp4(16, 151936, 2048, H200)
    monkeypatch.setenv("JAXGEMV_XS", "")
    monkeypatch.setenv("JAXGEMV_ROWS", "2")
    assert plan_fp4(16, 8192, 28672, H200).rows == 2
    with pytest.raises(ValueError, match="JAXGEMV_ROWS=2: two m-tiles need M > 8, got M = 8"):
        plan_fp4(8, 8192, 28672, H200)
    monkeypatch.setenv("JAXGEMV_ROWS", "3")
    with pytest.raises(ValueError, match="JAXGEMV_ROWS='3'"):
        plan_fp4(16, 8192, 28672, H200)


def test_mixed_devices_plan_for_the_weakest():
    both = combine([H200, A100])
    assert both.sm_count == 108 and both.compute_capability == (8, 0)
    assert combine([H200, T4]).compute_capability == (7, 5)


def test_fragment_order_gate():
    # x goes over in fragment order above 64 MB of weight, with two m-tiles (M > 8) of 4-bit
    # codes from 16 MB, and with one m-tile at M = 4-8 from the lines of XPERM_ONE_TILE_MIN_BYTES.
    assert planner.plan_fp4(9, 12288, 4096, H200).xperm  # two m-tiles
    assert planner.plan_fp4(16, 5120, 17408, H200).xperm
    assert planner.plan_nbits(16, 12288, 4096, 4, 32, H200).xperm
    assert not planner.plan_fp4(16, 4096, 4096, H200).xperm  # 9 MiB
    assert planner.plan_fp4(1, 151936, 2048, H200).xperm  # 175 MB
    # 8-bit codes with two m-tiles: the 64 MB line (int8 12288 x 4096 is 51 MiB, FP8 5120 x 17408 85).
    assert not planner.plan_nbits(16, 12288, 4096, 8, 32, H200).xperm
    assert not planner.plan_fp8(16, 12288, 4096, 128, H200).xperm
    assert planner.plan_fp8(16, 5120, 17408, 128, H200).xperm
    # ... but at M = 1 a K split pairs x in the kernel, for every format.
    for m, want in ((1, False), (2, True), (4, True), (8, True)):
        assert planner.plan_fp8(m, 5120, 17408, 128, H200).xperm is want
        assert planner.plan_nbits(m, 5120, 17408, 8, 32, H200, "mma").xperm is want  # ("auto": imma at M <= 2)
        assert planner.plan_fp4(m, 8192, 28672, H200).xperm is want
        assert planner.plan_nbits(m, 8192, 28672, 4, 32, H200, "mma").xperm is want  # ("auto": imma at M = 2)


def _k_around(line: int, weight_bytes) -> tuple[int, int]:
    """The largest K (a multiple of 256) whose weight is under `line` bytes, and the next one."""
    k = 256
    while weight_bytes(k + 256) < line:
        k += 256
    return k, k + 256


@pytest.mark.parametrize("m, line_nvfp4, line_int4, line_8bit", [
    (1, 64, 64, 64), (2, 8, 64, 64), (3, 8, 64, 64), (4, 8, 24, 64), (5, 8, 16, 64), (7, 8, 16, 64), (8, 8, 16, 24),
    (9, 16, 16, 64), (16, 16, 16, 64)])
def test_fragment_order_lines(m, line_nvfp4, line_int4, line_8bit):
    # Every format just under and just over its line (MiB) at N = 8192, where every M splits K: so
    # at M = 1 row order on both sides (the kernel pairs x). NVFP4 reads x unpadded at M < 8
    # (kCompactX) and takes fragment order from 8 MiB there; int4 keeps the pad and its lines.
    assert planner.xperm_min_bytes(m, "nvfp4") == line_nvfp4 << 20
    assert planner.xperm_min_bytes(m, "int4") == line_int4 << 20
    assert planner.xperm_min_bytes(m, "int8") == planner.xperm_min_bytes(m, "fp8") == line_8bit << 20
    n = 8192
    cases = (
        (line_nvfp4, lambda k: planner.fp4_weight_bytes(n, k), lambda k: planner.plan_fp4(m, n, k, H200)),
        (line_int4, lambda k: planner.nbits_weight_bytes(n, k, 4, 32),
         lambda k: planner.plan_nbits(m, n, k, 4, 32, H200)),
        (line_8bit, lambda k: planner.nbits_weight_bytes(n, k, 8, 32),
         lambda k: planner.plan_nbits(m, n, k, 8, 32, H200)),
        (line_8bit, lambda k: planner.fp8_weight_bytes(n, k, 128), lambda k: planner.plan_fp8(m, n, k, 128, H200)),
    )
    for line, weight_bytes, plan in cases:
        under, over = _k_around(line << 20, weight_bytes)
        assert weight_bytes(under) < line << 20 <= weight_bytes(over)
        assert plan(under).variant == plan(over).variant == "mma"
        assert plan(over).ksplit > 1
        assert not plan(under).xperm
        assert plan(over).xperm is (m > 1), (line, over)


def test_x_in_shared_memory_gate(monkeypatch):
    # Persistent blocks with x in shared memory: taken for the large unsplit products with x in
    # fragment order, with the block size that keeps more warps resident (shared memory bound).
    h200 = H200
    # One m-tile (M <= 8): the per-block kernel, measured ahead at M = 2, 4 and 8 (perf log 103).
    assert [planner.plan_fp4(m, 248320, 2048, h200).xs_warps for m in (1, 2, 4, 8)] == [0, 0, 0, 0]
    assert planner.plan_fp8(8, 151936, 4096, 128, h200).xs_warps == 0
    assert planner.plan_nbits(8, 151936, 2048, 4, 32, h200).xs_warps == 0
    assert planner.xs_resident_warps(1, 2048, 2, 8, 4, h200) == 20
    assert planner.xs_resident_warps(8, 2048, 2, 8, 8, h200) == 16
    assert planner.xs_resident_warps(8, 2048, 2, 8, 4, h200) == 12
    # Two m-tiles (9 to 16 rows): x is 64 KB at M = 16, 2 blocks of 4 or 1 of 8 hold 8 warps per
    # SM, one block of 16 holds 16.
    assert planner.plan_fp4(16, 248320, 2048, h200) == planner.Plan("mma", rows=2, ksplit=1, loads=2, xperm=True,
                                                                     xs_warps=16)
    assert [planner.xs_resident_warps(16, 2048, 2, 8, w, h200) for w in (4, 8, 16)] == [8, 8, 16]
    assert planner.plan_fp4(9, 248320, 2048, h200).xs_warps == 8  # x 36 KB: 16 warps as 2 blocks of 8 (a tie)
    # int4 at M = 16: 16 warps' rings (160 KB) and x (64 KB) just fit one block.
    assert planner.xs_resident_warps(16, 2048, 2, 0, 16, h200, planner.NBITS_STAGE_ROW_BYTES) == 16
    assert planner.plan_fp4(17, 248320, 2048, h200).xs_warps == 0  # three m-tiles: per-block kernel
    assert planner.plan_fp4(4, 4096, 4096, h200).xs_warps == 0  # small: x stays row-major, K split
    assert planner.plan_fp8(1, 5120, 17408, 128, h200).xs_warps == 0  # K split
    assert planner.xs_resident_warps(8, 16384, 2, 0, 4, h200) == 0  # x alone is 256 KB
    # int4 at M = 8: 4 stages x (2 x 1024 + 16 x 32) bytes per warp beside x's 32 KB.
    assert planner.xs_resident_warps(8, 2048, 2, 0, 8, h200, planner.NBITS_STAGE_ROW_BYTES) == 16
    assert planner.xs_resident_warps(8, 2048, 2, 0, 4, h200, planner.NBITS_STAGE_ROW_BYTES) == 12
    assert planner.plan_nbits(16, 151936, 2048, 4, 32, h200).xs_warps == 16
    assert planner.plan_fp8(12, 151936, 2048, 128, h200).xs_warps > 0
    monkeypatch.setenv("JAXGEMV_XS", "0")
    assert planner.plan_fp4(1, 248320, 2048, h200).xs_warps == 0
    monkeypatch.setenv("JAXGEMV_XS", "8")
    assert planner.plan_fp4(1, 248320, 2048, h200).xs_warps == 8  # forced, even where auto says no
    assert planner.plan_fp4(12, 248320, 2048, h200) == planner.Plan("mma", rows=2, ksplit=1, loads=2, xperm=True,
                                                                     xs_warps=8)
    with pytest.raises(ValueError, match="JAXGEMV_XS=8: x in shared memory needs M <= 16"):
        planner.plan_fp4(17, 248320, 2048, h200)
    monkeypatch.setenv("JAXGEMV_XS", "3")
    with pytest.raises(ValueError, match="JAXGEMV_XS"):
        planner.plan_fp4(1, 248320, 2048, h200)


def test_int4_one_load_on_short_windows_and_two_to_four_blocks_per_sm():
    # int4 at M = 2-8 with K split 8: one load per window where each warp has at most 4 two-load
    # windows and 2 < blocks per SM <= 4 (planner._int4_one_load, perf log 141), two elsewhere.
    for m in (2, 4, 8):
        for n, k in ((5120, 5120), (6144, 4096), (7168, 5120), (8192, 8192)):  # 320-512 blocks
            plan = planner.plan_nbits(m, n, k, 4, 32, H200)
            assert (plan.variant, plan.ksplit, plan.loads, plan.rows) == ("mma", 8, 1, 1), (m, n, k, plan)
        assert planner.plan_nbits(m, 4096, 4096, 4, 32, H200).loads == 2  # 256 blocks: two per SM
        assert planner.plan_nbits(m, 10240, 8192, 4, 32, H200).loads == 2  # 640: past four
        assert planner.plan_nbits(m, 8448, 8192, 4, 32, H200).loads == 1  # 528: four
        assert planner.plan_nbits(m, 8464, 8192, 4, 32, H200).loads == 2  # 529
        assert planner.plan_nbits(m, 8192, 10240, 4, 32, H200).loads == 2  # 5 windows per warp
        assert planner.plan_nbits(m, 12288, 4096, 4, 32, H200).loads == 2  # K split 4
    # M = 1, two m-tiles and int8 keep two loads; the count is the device's SMs; JAXGEMV_LOADS rules.
    assert planner.plan_nbits(1, 8192, 8192, 4, 32, H200).loads == 2
    assert planner.plan_nbits(16, 4096, 4096, 4, 32, H200).loads == 2
    assert planner.plan_nbits(4, 8192, 8192, 8, 32, H200).loads == 2
    assert planner.plan_nbits(4, 8192, 8192, 4, 32, DeviceFacts("cuda", (9, 0), 100)).loads == 2  # 5.12 per SM


def test_int4_one_load_yields_to_the_environment(monkeypatch):
    monkeypatch.setenv("JAXGEMV_LOADS", "2")
    assert planner.plan_nbits(4, 8192, 8192, 4, 32, H200).loads == 2


def test_fp8_one_load_where_the_grid_puts_a_third_block_on_some_sms():
    # FP8 with K split 8 ways at M = 1: one load per lane and window where 2 < blocks per SM <= 3
    # and K is long (8 two-load windows per warp or more; planner._fp8_one_load, perf log 106),
    # two elsewhere.
    for n in (4608, 5120, 6144):  # 288, 320, 384 blocks on 132 SMs
        assert planner.plan_fp8(1, n, 17408, 128, H200) == planner.Plan("mma", ksplit=8, loads=1, x_stage=-1)
    assert planner.plan_fp8(1, 6336, 17408, 128, H200).loads == 1  # 396 blocks: three per SM
    assert planner.plan_fp8(1, 6352, 17408, 128, H200).loads == 2  # 397: a fourth on one SM
    assert planner.plan_fp8(1, 4224, 17408, 128, H200).loads == 2  # 264 blocks: two per SM
    assert planner.plan_fp8(1, 4240, 17408, 128, H200).loads == 1  # 265
    for n, k in ((3072, 17408), (8192, 17408), (10240, 17408), (8192, 28672), (4096, 12288)):
        assert planner.plan_fp8(1, n, k, 128, H200).loads == 2, (n, k)
    # The rule counts the device's SMs: 320 blocks on 160 SMs are two per SM.
    assert planner.plan_fp8(1, 5120, 17408, 128, DeviceFacts("cuda", (9, 0), 160)).loads == 2
    assert planner.plan_fp8(1, 5120, 17408, 128, DeviceFacts("cuda", (9, 0), 120)).loads == 1
    # Shorter K keeps two loads at any grid (5120 x 6144: 320 blocks, 6 windows per warp), and
    # so do 12288 x 4096 and the unsplit lm_head.
    assert planner.plan_fp8(1, 5120, 6144, 128, H200).loads == 2
    assert planner.plan_fp8(1, 5120, 8192, 128, H200).loads == 1  # 8 windows per warp
    assert planner.plan_fp8(1, 12288, 4096, 128, H200).loads == 2
    assert planner.plan_fp8(1, 248320, 2048, 128, H200).loads == 2
    # M = 2-8 take two loads; M = 9-16 (two m-tiles) keep the long-K gate (17 windows per warp).
    for m in (2, 4, 8):
        assert planner.plan_fp8(m, 5120, 17408, 128, H200).loads == 2
    assert planner.plan_fp8(16, 5120, 17408, 128, H200).loads == 1
    assert planner.plan_fp8(16, 12288, 4096, 128, H200).loads == 2


def test_fp8_long_k_respects_the_loads_override(monkeypatch):
    monkeypatch.setenv("JAXGEMV_LOADS", "2")
    assert planner.plan_fp8(1, 5120, 17408, 128, H200).loads == 2


def _decode_plan():
    return planner.plan_fp4(1, 6144, 4096, H200)


# Knobs the CUDA launchers (or decoder_layer's lowering) read, checked by the planner at trace
# time: the values that leave the plan alone, a rejected one, the error's text and a planner call
# (of some format) that must raise it.
LAUNCH_KNOBS = [
    ("JAXGEMV_PDL", ("0", "1", "2"), "3", r"JAXGEMV_PDL='3': expected one of \(0, 1, 2\)", _decode_plan),
    ("JAXGEMV_PDL", (), "yes", "JAXGEMV_PDL", lambda: planner.plan_fp8(1, 5120, 17408, 128, H200)),
    ("JAXGEMV_EARLY", ("0", "1"), "2", r"JAXGEMV_EARLY='2': expected one of \(0, 1\)", _decode_plan),
    # 0: never the instance held to four blocks per SM, 4: wherever it exists.
    ("JAXGEMV_MIN_BLOCKS", ("0", "4"), "3", r"JAXGEMV_MIN_BLOCKS='3': expected one of \(0, 4\)",
     lambda: planner.plan_nbits(8, 8192, 28672, 4, 32, H200)),
    # 0: never K split 6 in place of K split 8, 1: where it alone fits the grid in one wave, 2:
    # every one-m-tile K-split-8 launch of int4 and NVFP4.
    ("JAXGEMV_K6", ("0", "1", "2"), "3", r"JAXGEMV_K6='3': expected one of \(0, 1, 2\)",
     lambda: planner.plan_nbits(8, 8192, 28672, 4, 32, H200)),
    # 0: the K split as planned, 1: half of it where only the half fits the grid in one wave (M > 1,
    # common.h, MmaHalvesKSplit), K split 8 where K split 4 runs a little past one wave (FP8, M = 1).
    ("JAXGEMV_WAVES", ("0", "1"), "2", r"JAXGEMV_WAVES='2': expected one of \(0, 1\)",
     lambda: planner.plan_fp8(4, 17408, 5120, 128, H200)),
    # 0: never the M = 2 block-column instance (NVFP4 with fp16 x and a K split), 1: wherever it exists.
    ("JAXGEMV_COLS2", ("0", "1"), "2", r"JAXGEMV_COLS2='2': expected one of \(0, 1\)",
     lambda: planner.plan_fp4(2, 8192, 28672, H200)),
    # 0: never a tile's scales staged once (int4 / int8, one m-tile, no K split), 1: wherever it can.
    ("JAXGEMV_TILE_PREP", ("0", "1"), "2", r"JAXGEMV_TILE_PREP='2': expected one of \(0, 1\)",
     lambda: planner.plan_nbits(1, 248320, 2048, 4, 32, H200)),
    # 0: the launcher asks the runtime for blocks per SM on every launch, 1: once per device, kernel
    # and shared memory.
    ("JAXGEMV_OCCUPANCY_CACHE", ("0", "1"), "2", r"JAXGEMV_OCCUPANCY_CACHE='2': expected one of \(0, 1\)",
     lambda: planner.plan_fp4(1, 8192, 28672, H200)),
    ("JAXGEMV_TRIGGER", ("5",), "-1", r"JAXGEMV_TRIGGER='-1': expected an integer from 0 to 31", _decode_plan),
]


@pytest.mark.parametrize("name, good, bad, message, plan", LAUNCH_KNOBS,
                         ids=[f"{k[0]}={k[2]}" for k in LAUNCH_KNOBS])
def test_launch_knobs_checked_at_trace_time(name, good, bad, message, plan, monkeypatch):
    want = _decode_plan()
    for value in good:
        monkeypatch.setenv(name, value)
        assert _decode_plan() == want
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError, match=message):
        plan()


def test_x_stage_knob(monkeypatch):
    # Where the M = 1 K-split kernel keeps x is the launcher's choice (-1) unless forced, and
    # forcing it staged where nothing can be staged is an error at trace time, naming the knob.
    assert planner.plan_fp4(1, 6144, 4096, H200).x_stage == -1
    monkeypatch.setenv("JAXGEMV_XSTAGE", "0")
    assert planner.plan_fp4(1, 6144, 4096, H200).x_stage == 0
    monkeypatch.setenv("JAXGEMV_XSTAGE", "1")
    plan = planner.plan_fp4(1, 6144, 4096, H200)
    assert plan.x_stage == 1 and plan.ksplit > 1
    with pytest.raises(ValueError, match="JAXGEMV_XSTAGE=1: x staged needs M = 1 and a K split; this plan has M = 4"):
        planner.plan_fp4(4, 6144, 4096, H200)
    with pytest.raises(ValueError, match="ksplit 1"):
        planner.plan_fp4(1, 248320, 2048, H200)
    monkeypatch.setenv("JAXGEMV_XSTAGE", "2")
    with pytest.raises(ValueError, match="JAXGEMV_XSTAGE='2'"):
        planner.plan_fp4(1, 6144, 4096, H200)


def test_x_sums_rule(monkeypatch):
    # With an RMSNorm in front, the kernel sums x's squares where it stages x (M = 1, K split, per
    # block, x not forced into the ring), up to X_SUMS_MAX_K unless forced; never where the
    # device holds a K shard of x (rms_k != k); always on the CPU handlers; JAXGEMV_XSUMS=0 nowhere.
    decode = planner.plan_fp4(1, 6144, 4096, H200)
    assert planner.x_sums(decode, 1, 4096, 4096)
    assert not planner.x_sums(decode, 1, 4096, None)
    assert not planner.x_sums(decode, 1, 2048, 4096)  # a K shard
    assert not planner.x_sums(planner.plan_fp4(4, 6144, 4096, H200), 4, 4096, 4096)
    lm_head = planner.plan_fp4(1, 248320, 2048, H200)
    assert lm_head.ksplit == 1 and not planner.x_sums(lm_head, 1, 2048, 2048)
    assert not planner.x_sums(Plan("scalar"), 1, 4096, 4096)
    assert not planner.x_sums(Plan("dequant"), 1, 4096, 4096)
    assert planner.x_sums(Plan("cpu"), 7, 100, 100)
    long_k = planner.plan_fp4(1, 5120, 2 * planner.X_SUMS_MAX_K, H200)
    assert long_k.ksplit > 1 and not planner.x_sums(long_k, 1, long_k_k := 2 * planner.X_SUMS_MAX_K, long_k_k)
    monkeypatch.setenv("JAXGEMV_XSUMS", "1")
    assert planner.x_sums(long_k, 1, long_k_k, long_k_k)
    assert not planner.x_sums(planner.plan_fp4(4, 6144, 4096, H200), 4, 4096, 4096)  # forced where it can
    monkeypatch.setenv("JAXGEMV_XSTAGE", "0")
    assert not planner.x_sums(planner.plan_fp4(1, 6144, 4096, H200), 1, 4096, 4096)
    monkeypatch.setenv("JAXGEMV_XSUMS", "0")
    monkeypatch.delenv("JAXGEMV_XSTAGE")
    assert not planner.x_sums(decode, 1, 4096, 4096)
    assert not planner.x_sums(Plan("cpu"), 7, 100, 100)
    monkeypatch.setenv("JAXGEMV_XSUMS", "2")
    with pytest.raises(ValueError, match="JAXGEMV_XSUMS='2'"):
        planner.x_sums(decode, 1, 4096, 4096)


# The residency pin (ffi/common.h: MmaHasBoundedInstance, TakesBoundedInstance): the per-block
# kernel's K-split-8 one-m-tile fragment-order instance also exists held to four blocks per SM,
# and the launcher runs that one where only it holds the whole grid at once. The window is
# (free x SMs, held x SMs] blocks at any SM count; here at fixed counts, with the slots per SM
# the launcher would read from the occupancy API given as arguments (3 and 4 are the H200's for
# the 8-warp blocks; 2 and 3 a kernel one block per SM fuller), so no machine enters into it.
PINNED = Plan("mma", rows=1, ksplit=8, loads=2, xperm=True)


@pytest.mark.parametrize("sms", [132, 48, 36, 28])
@pytest.mark.parametrize("free, held", [(3, 4), (2, 3)])
@pytest.mark.parametrize("m", [2, 8])
def test_bounded_instance_window(sms, free, held, m):
    facts = DeviceFacts("cuda", (9, 0), sms)
    lo, hi = free * sms, held * sms  # blocks: ceil(N / 16) at M <= 8
    takes = lambda blocks: planner.takes_bounded_instance(PINNED, m, 16 * blocks, facts, free, held)
    assert not takes(lo) and takes(lo + 1) and takes(hi) and not takes(hi + 1)
    assert not takes(1) and not takes(4 * hi)
    # A ragged last column block counts as a block.
    assert planner.takes_bounded_instance(PINNED, m, 16 * lo + 1, facts, free, held)
    assert not planner.takes_bounded_instance(PINNED, m, 16 * hi + 1, facts, free, held)
    # No resident slot at all (a kernel that does not fit) never takes it.
    assert not planner.takes_bounded_instance(PINNED, m, 16 * (lo + 1), facts, 0, held)


@pytest.mark.parametrize("sms", [132, 48, 36, 28])
@pytest.mark.parametrize("per_sm", [8, 7, 1])
def test_fp8_one_row_k8_window(sms, per_sm):
    # The launcher's wave rules (ffi/gemv_launch.cuh): half the K split at M > 1 takes the residency
    # pin's window (TakesBoundedInstance, above, with the planned and the halved slots); FP8's K split 8 at
    # M = 1 takes (one wave, 1.25 waves] of the K-split-4 instance (on an H200 at eight blocks per
    # SM: 1057-1320 blocks, so 17408 x 5120's 1088 and 20480 x 4096's 1280 but not 24576 x 4096's
    # 1536). Here at fixed counts, so no machine enters into it.
    wave = per_sm * sms
    takes = lambda blocks: _ext.past_one_wave_by_a_quarter(blocks, sms, per_sm)
    assert not takes(wave) and takes(wave + 1) and takes(wave * 5 // 4) and not takes(wave * 5 // 4 + 1)
    assert not takes(1) and not takes(2 * wave)
    assert not _ext.past_one_wave_by_a_quarter(wave + 1, sms, 0)  # a kernel that does not fit
    if (sms, per_sm) == (132, 8):
        assert takes(1088) and takes(1280) and not takes(1536)


def test_wave_rules_per_format():
    # The per-format side of the launcher's wave rules, defined once in ffi/common.h (the launcher,
    # tools/waves.py and these read it): K split 8 at M = 1 is FP8's alone, and no format halves K split
    # 6 (it is the launcher's own substitute for 8) nor a split of 1; NVFP4 keeps K split 2 at M > 1,
    # where K split 1 lost on 34816 x 5120 (docs/perf-log.md, entry 128).
    assert _ext.ksplit8_past_one_wave("fp8")
    assert not any(_ext.ksplit8_past_one_wave(f) for f in ("nvfp4", "int4", "int8"))
    for f in ("nvfp4", "fp8", "int4", "int8"):
        assert not any(_ext.halves_ksplit(f, rows, ks) for rows in (1, 2) for ks in (1, 6))
        assert _ext.halves_ksplit(f, 1, 4)  # entry 127's rule, every format
    assert not _ext.halves_ksplit("nvfp4", 1, 2) and _ext.halves_ksplit("fp8", 1, 2)
    # K split 8 halves for NVFP4's one m-tile and int8's two (entry 140), not FP8's or int4's two.
    assert _ext.halves_ksplit("nvfp4", 1, 8) and not _ext.halves_ksplit("nvfp4", 2, 8)
    assert _ext.halves_ksplit("int8", 2, 8) and not _ext.halves_ksplit("fp8", 2, 8)
    assert not _ext.halves_ksplit("int4", 2, 8) and not _ext.halves_ksplit("int8", 2, 4)
    assert _ext.halves_ksplit("int4", 1, 8)  # where K split 6 does not hold the grid
    with pytest.raises(ValueError, match="format must be nvfp4, fp8, int4 or int8, got 'int5'"):
        _ext.halves_ksplit("int5", 1, 4)
    with pytest.raises(ValueError, match="got 'int5'"):
        _ext.ksplit6("int5", True)


def test_half_and_double_never_undo_each_other():
    # The launcher re-applies its rules at a substituted split: int4's and NVFP4's two m-tiles halve
    # from K split 4 to 2 and double from 2 to 4, so no grid may take both, or it would go back and
    # forth. Every grid the half takes (K split 2 holds it in one wave) the double leaves, and the
    # reverse.
    for fmt in ("int4", "nvfp4"):
        assert _ext.halves_ksplit(fmt, 2, 4) and _ext.doubles_ksplit(fmt, 2, 2)
        for sms in (1, 48, 132):
            for per4 in range(0, 7):
                for per2 in range(0, 13):
                    for blocks in range(1, 13 * sms + 2, max(1, sms // 4)):
                        half = any(_ext.takes_half_ksplit(fmt, f16, 2, 4, 4096, blocks, sms, per4, False, per2)
                                   for f16 in (False, True))
                        double = _ext.takes_double_ksplit(blocks, sms, per2, per4)
                        assert not (half and double), (fmt, sms, per4, per2, blocks)


def test_half_ksplit_rule():
    # TakesHalfKSplitRule (ffi/common.h) on an H200's 132 SMs: past one wave of the planned instance
    # and within one of the half; not where the held instance runs, except int8's two m-tiles with
    # bf16 x, which halve where the unheld grid's last wave is at most three quarters full (K up to
    # 8192). Arguments: format, x fp16, m-tiles, K split, K, blocks, SMs, per SM unheld, held, per
    # SM of the half.
    rule = _ext.takes_half_ksplit
    # FP8 one m-tile, K split 4 -> 2: seven per SM at 4, fourteen at 2; x's dtype does not matter.
    for f16 in (False, True):
        assert rule("fp8", f16, 1, 4, 8192, 1088, 132, 7, False, 14)
        assert not rule("fp8", f16, 1, 4, 8192, 924, 132, 7, False, 14)  # one wave already
        assert not rule("fp8", f16, 1, 4, 8192, 1849, 132, 7, False, 14)  # the half past one wave too
        assert not rule("fp8", f16, 1, 4, 8192, 1088, 132, 7, True, 14)  # the held instance runs
        assert not rule("fp8", f16, 2, 4, 8192, 1088, 132, 7, False, 14)  # FP8's two m-tiles keep their split
    # NVFP4 one m-tile, K split 8 -> 4: 640 blocks at three per SM, six at 4; int4 at four and six.
    assert rule("nvfp4", False, 1, 8, 8192, 640, 132, 3, False, 6)
    assert not rule("nvfp4", False, 1, 8, 8192, 793, 132, 3, False, 6)
    assert rule("int4", False, 1, 8, 8192, 640, 132, 4, False, 6)
    assert not rule("int4", False, 1, 8, 8192, 528, 132, 4, False, 6)  # one wave at K split 8
    # int8 two m-tiles, K split 8 -> 4: two per SM unheld (264 a wave), five at 4 (660). bf16 x on
    # the last wave, held or not; fp16 x wherever only the half holds the grid, not held.
    for blocks, last_wave, one_wave in [(320, True, True), (384, True, True), (448, True, True), (640, True, True),
                                        (512, False, True), (528, False, True), (768, False, False),
                                        (264, False, False), (198, False, False)]:
        for held in (False, True):
            assert rule("int8", False, 2, 8, 8192, blocks, 132, 2, held, 5) == last_wave, (blocks, held)
            assert rule("int8", True, 2, 8, 8192, blocks, 132, 2, held, 5) == (one_wave and not held), (blocks, held)
    assert not rule("int8", False, 2, 8, 8192, 448, 0, 2, False, 5)
    assert not rule("int8", False, 2, 8, 8192, 448, 132, 0, False, 5)
    # bf16 x measured up to K = 8192 (8192 x 28672 lost 12% halved): longer K keeps K split 8; with
    # fp16 x 8192 x 28672 gained 9% halved.
    assert rule("int8", False, 2, 8, 4096, 384, 132, 2, True, 5)
    assert not rule("int8", False, 2, 8, 8193, 384, 132, 2, True, 5)
    assert rule("int8", True, 2, 8, 28672, 512, 132, 2, False, 5)
    assert rule("fp8", False, 1, 4, 28672, 1088, 132, 7, False, 14)  # the other pairs whatever K
    with pytest.raises(ValueError, match="got 'int5'"):
        rule("int5", False, 1, 4, 8192, 1088, 132, 7, False, 14)


def test_double_ksplit_rule():
    # TakesDoubleKSplitRule (ffi/common.h): int4's and NVFP4's two m-tiles from K split 2, where the
    # planned grid runs past one wave and the doubled one (blocks half as long) ends in fewer than
    # twice its waves. 132 SMs, eight K-split-2 blocks per SM (1056 a wave), four at K split 4 (528).
    assert _ext.doubles_ksplit("int4", 2, 2) and _ext.doubles_ksplit("nvfp4", 2, 2)
    assert not any(_ext.doubles_ksplit(f, 2, 2) for f in ("fp8", "int8"))
    assert not _ext.doubles_ksplit("int4", 1, 2) and not _ext.doubles_ksplit("int4", 2, 4)
    rule = _ext.takes_double_ksplit
    assert rule(2176, 132, 8, 4)  # 34816 x 5120: 3 waves against 5 half-length ones
    assert rule(1089, 132, 8, 4)  # 2 against 3
    assert not rule(1742, 132, 8, 4)  # 2 against 4: no gain
    assert not rule(1056, 132, 8, 4)  # one wave already
    assert not rule(2176, 132, 8, 0) and not rule(2176, 0, 8, 4) and not rule(2176, 132, 0, 4)
    with pytest.raises(ValueError, match="got 'int5'"):
        _ext.doubles_ksplit("int5", 2, 2)


def test_x_ahead_rule():
    # TakesXAheadRule (ffi/common.h): int4's x-ahead instance where the grid leaves at most 24 warps
    # per SM and both instances hold it in one wave. 132 SMs: 320 blocks of 8 warps are 19.4 warps a
    # SM, 512 are 31.
    assert _ext.x_ahead_format("int4") and not any(_ext.x_ahead_format(f) for f in ("nvfp4", "fp8", "int8"))
    rule = _ext.takes_x_ahead
    assert rule(320, 132, 8, 4, 3)  # 5120 x 17408
    assert rule(396, 132, 8, 4, 3) and not rule(397, 132, 8, 4, 3)  # 24 warps a SM; past it
    assert not rule(512, 132, 8, 4, 3)  # 8192 x 28672
    assert not rule(320, 132, 8, 4, 2)  # the x-ahead instance past one wave
    assert not rule(320, 132, 8, 2, 3)  # the planned one past one wave
    assert rule(768, 132, 4, 6, 6) and not rule(768, 132, 4, 6, 5)  # 12288 x 4096 at K split 4
    assert not rule(320, 0, 8, 4, 3) and not rule(320, 132, 8, 0, 3) and not rule(320, 132, 8, 4, 0)
    with pytest.raises(ValueError, match="got 'int5'"):
        _ext.x_ahead_format("int5")


def test_ksplit6_rule_per_format():
    # K split 6 in place of 8 (ffi/common.h, read by the launcher and tools/waves.py): at M = 1 int4
    # and int8 (NVFP4 lost there), at M = 2-8 int4 and NVFP4 (int8 lost), never FP8.
    assert [f for f in ("nvfp4", "fp8", "int4", "int8") if _ext.ksplit6(f, True)] == ["int4", "int8"]
    assert [f for f in ("nvfp4", "fp8", "int4", "int8") if _ext.ksplit6(f, False)] == ["nvfp4", "int4"]
    # 8192 x 28672 on an H200: 512 blocks, three 8-warp blocks per SM (1.29 waves), four 6-warp ones.
    n, sms, k8, k6 = 512, 132, 3, 4

    def takes(f, m, xperm=False, held=False, x_forced=False, blocks=n, per_sm8=k8, per_sm6=k6, sm=sms):
        return _ext.takes_ksplit6(f, m, xperm, held, x_forced, blocks, sm, per_sm8, per_sm6)

    assert [f for f in ("nvfp4", "fp8", "int4", "int8") if takes(f, 1)] == ["int4", "int8"]
    assert not takes("int4", 1, x_forced=True)  # x staged whatever the occupancy: not counted, K split 8
    assert not takes("int4", 1, per_sm8=4)      # K split 8 holds the grid already
    assert not takes("int4", 1, per_sm6=3)      # K split 6 would not hold it either
    assert not takes("int4", 1, per_sm8=0)      # no answer from the runtime: the plan stands
    assert not takes("int4", 1, sm=0)
    assert takes("int4", 1, blocks=396 + 1) and not takes("int4", 1, blocks=396)
    # M = 2-8, x in fragment order: only where the held instance would run, which says the same.
    assert [f for f in ("nvfp4", "fp8", "int4", "int8") if takes(f, 4, xperm=True, held=True)] == ["nvfp4", "int4"]
    assert not takes("int4", 4, xperm=True, held=False)
    assert not takes("nvfp4", 4, xperm=True, held=True, per_sm6=3)
    # M = 2-8, x in row order (no held instance): the M = 1 rule.
    assert takes("nvfp4", 4) and not takes("nvfp4", 4, per_sm8=4) and not takes("int8", 4)


@pytest.mark.parametrize("plan", [
    Plan("mma", rows=2, ksplit=4, loads=2, xperm=True),  # two m-tiles, another K split
    Plan("mma", rows=1, ksplit=4, loads=2, xperm=True),  # another K split
    Plan("mma", rows=1, ksplit=8, loads=2, xperm=False),  # x in row order
    Plan("mma", rows=1, ksplit=1, loads=2, xperm=True, xs_warps=8),  # x in shared memory
    Plan("scalar", rows=4),
])
def test_bounded_instance_only_one_kernel(plan, monkeypatch):
    # Only the K-split-8 kernels (one m-tile: with x in fragment order) have the held instance,
    # forced or not.
    assert not planner.has_bounded_instance(plan)
    assert not planner.takes_bounded_instance(plan, 4, 16 * 400, H200, 3, 4)
    monkeypatch.setenv("JAXGEMV_MIN_BLOCKS", "4")
    assert not planner.takes_bounded_instance(plan, 4, 16 * 400, H200, 3, 4)


def test_bounded_instance_plans(monkeypatch):
    # Through the planners on an H200's 132 SMs: 8192 x 28672 at M = 4 (512 blocks, 1.29 waves at
    # three per SM) takes it in every format that splits K 8 ways there; at M = 1 x is in row order
    # and int4 5120 x 17408 at M = 2 is below the 64 MB where x goes over in fragment order there,
    # so neither has it; at M = 4 it has (fragment order from 24 MB) but its 320 blocks fit one wave.
    for m, plan in ((4, planner.plan_fp4(4, 8192, 28672, H200)), (4, planner.plan_fp8(4, 8192, 28672, 128, H200)),
                    (4, planner.plan_nbits(4, 8192, 28672, 4, 32, H200, "mma")),  # "auto": imma there
                    (8, planner.plan_nbits(8, 8192, 28672, 8, 32, H200))):
        assert planner.has_bounded_instance(plan), plan
        assert planner.takes_bounded_instance(plan, m, 8192, H200, 3, 4)
        assert not planner.takes_bounded_instance(plan, m, 8192, H200, 4, 5)  # one wave already
    assert not planner.has_bounded_instance(planner.plan_fp4(1, 8192, 28672, H200))
    assert not planner.has_bounded_instance(planner.plan_nbits(2, 5120, 17408, 4, 32, H200))
    plan = planner.plan_nbits(4, 5120, 17408, 4, 32, H200)
    assert planner.has_bounded_instance(plan) and not planner.takes_bounded_instance(plan, 4, 5120, H200, 3, 4)
    # The same weights on a 48-SM part: 8192 columns are 512 blocks, past 4 x 48, so not there;
    # 2560 x 114688 (147 MB of int4 codes, 160 blocks) is inside (144, 192].
    small = DeviceFacts("cuda", (8, 9), 48)
    plan = planner.plan_nbits(4, 8192, 28672, 4, 32, small)
    assert not planner.takes_bounded_instance(plan, 4, 8192, small, 3, 4)
    plan = planner.plan_nbits(4, 2560, 114688, 4, 32, small)
    assert planner.has_bounded_instance(plan), plan
    assert planner.takes_bounded_instance(plan, 4, 2560, small, 3, 4)
    # JAXGEMV_MIN_BLOCKS forces the answer where the instance exists.
    monkeypatch.setenv("JAXGEMV_MIN_BLOCKS", "0")
    assert not planner.takes_bounded_instance(plan, 4, 2560, small, 3, 4)
    monkeypatch.setenv("JAXGEMV_MIN_BLOCKS", "4")
    assert planner.takes_bounded_instance(plan, 4, 64, small, 3, 4)


def test_two_m_tile_bounded_instance():
    # int8 at M = 16 on 5120 x 17408 (320 blocks of 16 rows of x): the two-m-tile instance that
    # takes x ahead holds two 8-warp blocks per SM on an H200 (264 at once), the held one, x at
    # the chunk, three (396): the launcher takes the held one (measured 37.6 us against 51.9).
    plan = planner.plan_nbits(16, 5120, 17408, 8, 32, H200)
    assert (plan.rows, plan.ksplit, plan.xperm) == (2, 8, True), plan
    assert planner.has_bounded_instance(plan)
    assert planner.MMA_TWO_TILE_BOUNDED_BLOCKS == 3
    assert planner.takes_bounded_instance(plan, 16, 5120, H200, 2)
    # A block is 16 rows of x: M = 9 is the same grid, M = 17 twice it (640 blocks, past 396).
    assert planner.takes_bounded_instance(plan, 9, 5120, H200, 2)
    assert not planner.takes_bounded_instance(plan, 17, 5120, H200, 2)
    # Two m-tiles have it with x in row order too: FP8 at M = 16 on 6144 x 5120 (384 blocks; 31 MB,
    # x in row order) ran 14.2 us at the chunk and 17.7 ahead.
    plan = planner.plan_fp8(16, 6144, 5120, 128, H200)
    assert (plan.rows, plan.ksplit, plan.xperm) == (2, 8, False), plan
    assert planner.takes_bounded_instance(plan, 16, 6144, H200, 2)
    # 8192 x 28672 (512 blocks): more than either holds at once, so the free one (x ahead).
    plan = planner.plan_nbits(16, 8192, 28672, 8, 32, H200)
    assert planner.has_bounded_instance(plan)
    assert not planner.takes_bounded_instance(plan, 16, 8192, H200, 2)


def test_bounded_instance_rule_matches_the_launcher():
    # The planner's answer against the launcher's own rule (compiled into every build, CUDA or not).
    from jaxgemv import _jaxgemv

    assert _jaxgemv.mma_bounded_blocks() == _jaxgemv.mma_bounded_blocks(1) == planner.MMA_BOUNDED_BLOCKS
    assert _jaxgemv.mma_bounded_blocks(2) == planner.MMA_TWO_TILE_BOUNDED_BLOCKS
    for sms in (1, 28, 36, 48, 132):
        facts = DeviceFacts("cuda", (9, 0), sms)
        for free, held in ((0, 4), (2, 3), (3, 4), (4, 4), (1, 8)):
            for blocks in sorted({1, free * sms, free * sms + 1, held * sms, held * sms + 1, 5 * sms}):
                if blocks < 1:
                    continue
                want = _jaxgemv.takes_bounded_instance(blocks, sms, free, held)
                assert planner.takes_bounded_instance(PINNED, 4, 16 * blocks, facts, free, held) == want, \
                    (blocks, sms, free, held)


def test_benchmark_formats_plan_with_each_formats_planner():
    """The one registry of formats by name (jaxgemv/bench.py: FORMATS, read by the benchmark,
    tools/waves.py, tools/host_overhead.py, tools/cpu_products.py and the launch-choice test) plans
    each format with its own planner and the layouts it times."""
    from jaxgemv import bench

    for m, n, k in [(1, 8192, 28672), (4, 248320, 2048), (16, 17408, 5120), (64, 4096, 4096)]:
        assert bench.FORMATS["nvfp4"].plan(m, n, k, H200, "auto") == plan_fp4(m, n, k, H200)
        assert bench.FORMATS["fp8"].plan(m, n, k, H200, "auto") == planner.plan_fp8(m, n, k, 128, H200)
        assert bench.FORMATS["int4"].plan(m, n, k, H200, "auto") == planner.plan_nbits(m, n, k, 4, 32, H200)
        assert bench.FORMATS["int8"].plan(m, n, k, H200, "dequant") == planner.plan_nbits(
            m, n, k, 8, 32, H200, "dequant")
    with pytest.raises(KeyError):
        bench.FORMATS["int5"]
