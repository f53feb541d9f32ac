"""benchmarks/ncu_source_summary.py reads ncu's source page as the device round writes it.

A page in ncu's fixed-width layout (Address, the SASS text up to the first sample column, then the
sample / execution columns and the 18 stall reasons twice: all samples, then not issued), built
here: the per-class shares and the main-loop filter must come out of it, and a log without a
source page must be refused with a message, not a stack trace.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import ncu_source_summary as nss  # noqa: E402

SRC_W = 61  # ncu's width of the Source column


def _row(addr: str, sass: str, executed: int, stalls: dict[str, int]) -> str:
    all_samples = [stalls.get(r, 0) for r in nss.REASONS]
    total = sum(all_samples)
    fields = [total, total, total, executed, executed * 32, executed * 32, 32, 32, 0, 0, 0, "-", "-", "-"]
    fields += all_samples + [0] * len(nss.REASONS)
    return f"{addr:<19}{'    ' + sass:<{SRC_W}}" + " ".join(str(f) for f in fields)


def _page(rows: list[str]) -> str:
    header = f"{'Address':<19}{'Source':<{SRC_W}}Warp S Warp S # Samp Instru"
    return "\n".join(["==PROF== Disconnected", "-" * 40, header, "   tall S tall S les", *rows]) + "\n"


def test_summary_shares_and_main_loop():
    text = _page([
        _row("0x7f0", "LOP3.LUT R36, R107, R36, RZ, 0xfc, !PT", 1000, {"math": 6, "wait": 2}),
        _row("0x7f1", "@!P0 HMMA.16816.F32 R4, R8, R12, R4", 1000, {"wait": 2}),
        _row("0x7f2", "LDG.E R2, [R4.64]", 10, {"long_sb": 10}),  # the prologue: not in the loop
    ])
    rows = nss.parse(text)
    assert [(s.split()[0], n, e) for s, n, e, _ in rows] == [("LOP3.LUT", 8, 1000), ("@!P0", 2, 1000), ("LDG.E", 10, 10)]
    assert nss.opcode(rows[1][0]) == "HMMA" and rows[0][3]["math"] == 6
    out = nss.summary(rows, top=8)
    assert "20 warp-state samples" in out and "long_sb 50.0%" in out and "math 30.0%" in out
    assert "| LOP3 | 40.0% | math 30.0, wait 10.0 |" in out
    assert "Main loop: 2 instructions" in out and "LDG.E" not in out.split("Main loop")[1]


def test_a_log_without_a_source_page_is_refused():
    with pytest.raises(SystemExit, match="no source page"):
        nss.parse("==PROF== Connected\nSection: GPU Speed Of Light Throughput\n")
