"""tools/sass_loop.py: a loop's instruction mix from a SASS listing, and with --jump the path that
forward branches on one predicate leave (no GPU)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import sass_loop  # noqa: E402

# A kernel whose loop (0x0010 .. 0x0080) holds a branch on !P0 around two instructions.
LISTING = """
        Function : _Z4Kernv
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDS.128 R4, [R2] ;
        /*0020*/              @!P0 BRA 0x0050 ;
        /*0030*/                   LDS.U8 R8, [R3] ;
        /*0040*/                   LOP3.LUT R9, R8, 0xf, RZ, 0xc0, !PT ;
        /*0050*/                   PRMT R10, R4, 0x4240, R9 ;
        /*0060*/                   HMUL2 R11, R10, R12 ;
        /*0070*/                   ISETP.GE.AND P1, PT, R13, R14, PT ;
        /*0080*/               @!P1 BRA 0x0010 ;
        /*0090*/                   EXIT ;
"""


def _only(jump, listing=LISTING):
    (name, count, alu, common, cost, _), = sass_loop.loops(listing, "Kern", jump=jump)
    return name, count, alu, dict(common), cost


def test_loop_counts_every_instruction_of_its_body():
    name, count, alu, ops, cost = _only(None)
    assert name.startswith("_Z4Kernv")
    assert count == 8 and ops["LDS"] == 2 and ops["LOP3"] == 1
    assert alu == 3  # LOP3, PRMT, ISETP
    assert abs(cost - (1 + 1 + 1 + 2.2 + 2.2 + 1 + 2.2 + 1)) < 1e-9


def test_jump_leaves_out_the_code_a_taken_branch_skips():
    _, count, alu, ops, cost = _only("!P0")
    assert count == 6 and "LOP3" not in ops and ops["LDS"] == 1
    assert alu == 2
    # A predicate that no branch in the loop tests changes nothing; the backward branch stays.
    assert _only("P3")[1] == 8


def test_main_takes_its_flags_before_or_after_the_arguments(tmp_path, capsys):
    f = tmp_path / "k.sass"
    f.write_text(LISTING)
    assert sass_loop.main(["--jump", "!P0", str(f), "Kern"]) == 0
    assert "loop 6 instructions" in capsys.readouterr().out
    assert sass_loop.main([str(f), "Kern", "--jump", "!P0"]) == 0
    assert "loop 6 instructions" in capsys.readouterr().out
    # --all lists only loops of more than 60 instructions: none here.
    assert sass_loop.main([str(f), "--all", "Kern"]) == 0
    assert "loop" not in capsys.readouterr().out
    assert sass_loop.main(["--jump"]) == 2


def test_jump_zp_finds_the_branch_around_the_zero_point_loads(tmp_path, capsys):
    # The same loop with its zero-point branch on !P2, and a first forward branch on P1 that skips
    # no byte load: `zp` takes !P2 (as "!P0" did above), a fixed "!P0" now leaves the loads in.
    listing = LISTING.replace("@!P0 BRA 0x0050", "@!P2 BRA 0x0050").replace(
        "LDS.128 R4, [R2] ;", "@P1 BRA 0x0020 ;")
    assert _only("zp", listing)[1] == 6 and "LOP3" not in _only("zp", listing)[3]
    assert _only("!P0", listing)[1] == 8
    f = tmp_path / "k.sass"
    f.write_text(listing)
    assert sass_loop.main(["--jump", "zp", str(f), "Kern"]) == 0
    assert "loop 6 instructions" in (out := capsys.readouterr().out) and "branch !P2 taken" in out
    # No LDS.U8 under any branch: nothing is left out, and the line says so.
    f.write_text(LISTING.replace("LDS.U8", "LDS.U16"))
    assert sass_loop.main(["--jump", "zp", str(f), "Kern"]) == 0
    assert "loop 8 instructions" in (out := capsys.readouterr().out) and "no zero-point branch found" in out
