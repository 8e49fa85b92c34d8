"""tools/ncu_stalls.py: a per-instruction Nsight Compute CSV in, stall shares out (no GPU)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import ncu_stalls  # noqa: E402

COLUMNS = ["Address", "Source", "Warp Stall Sampling (All Samples)", "stall_long_sb", "stall_wait", "stall_selected",
           "stall_long_sb (Not Issued)", "stall_wait (Not Issued)"]


def _write(path, rows):
    lines = ['"Kernel Name","void Kern(int)",', ",".join(f'"{c}"' for c in COLUMNS)]
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


def test_shares_and_top_instruction(tmp_path, capsys):
    f = tmp_path / "k.csv"
    # The "(Not Issued)" columns repeat part of the samples and must not be counted twice.
    _write(f, [["0x7f00aa10", "LDG.E R2, [R4]", "2", "0", "1", "1", "0", "1"],
               ["0x7f00aa20", "FMUL R2, R2, 16384", "9", "6", "2", "1", "6", "2"]])
    ncu_stalls.summarize(str(f), top=1)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "void Kern(int)"
    assert out[1].strip() == "11 samples: long_sb 55%, wait 27%, selected 18%"
    assert len(out) == 3 and "FMUL" in out[2] and "81.8%" in out[2] and "long_sb 6, wait 2" in out[2]


def test_missing_and_wrong_files(tmp_path, capsys):
    ncu_stalls.summarize(str(tmp_path / "absent.csv"), top=3)
    f = tmp_path / "other.csv"
    f.write_text('"a"\n"b"\n"c"\n')
    ncu_stalls.summarize(str(f), top=3)
    out = capsys.readouterr().out
    assert "absent.csv: No such file" in out and "no stall_* columns" in out


def test_executed_per_window(tmp_path, capsys):
    # With the SourceCounters columns: executed instructions per 16 HMMA and the L1 tag requests
    # by opcode (predicates and modifiers stripped, thousands separators read).
    cols = COLUMNS + ["Instructions Executed", "L1 Tag Requests Global"]
    lines = ['"Kernel Name","void Kern(int)",', ",".join(f'"{c}"' for c in cols)]
    for row in [["0x7f00aa10", "@!P0 LDG.E.128 R2, [R4]", "2", "1", "1", "0", "1", "1", "32", "32"],
                ["0x7f00aa20", "HMMA.16816.F32.BF16 R8, R4, R2, R8", "3", "3", "0", "0", "3", "0", "64", "0"],
                ["0x7f00aa30", "LDGSTS.E.BYPASS.128 [R1], [R2.64]", "1", "0", "0", "1", "0", "0", "16", "1,024"],
                ["0x7f00aa40", "IMAD.MOV.U32 R1, RZ, RZ, R3", "0", "0", "0", "0", "0", "0", "48", "0"]]:
        lines.append(",".join(f'"{v}"' for v in row))
    f = tmp_path / "k.csv"
    f.write_text("\n".join(lines) + "\n")
    ncu_stalls.summarize(str(f), top=1)
    out = capsys.readouterr().out.splitlines()
    # 160 executed over 64 HMMA = 4 windows of 16: 40 per window, 16 of them HMMA.
    assert out[-2].strip() == "executed per 16 HMMA: 40 (HMMA 16, IMAD 12, LDG 8, LDGSTS 4)"
    assert out[-1].strip() == "L1 tag requests: LDGSTS 1024, LDG 32"


def test_executed_needs_hmma_and_counts():
    header = ["Address", "Source", "Instructions Executed"]
    assert ncu_stalls.executed(header, [["0x1", "FFMA R1, R2, R3, R4", "10"]]) == []
    assert ncu_stalls.executed(["Address", "Source"], [["0x1", "HMMA.16816 R1", ""]]) == []
