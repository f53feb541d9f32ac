"""Condense ncu's per-instruction source page (`ncu --page source --print-source sass`, the text that
device_round.sh's `ncusrc` step writes) into where a kernel's warps wait.

    python3 benchmarks/ncu_source_summary.py ncu_source.log [--top 40] > summary.md

Per opcode class: its share of all warp-state samples and of each stall reason; then the main loop
(instructions executed at least half as often as the most executed one) as SASS with its samples
and its two largest stall reasons, so a change's effect on one instruction can be read against
another run.  Only the first kernel of the log is read (one `== variant` block: pass that block).
"""

from __future__ import annotations

import argparse
import collections
import re

# the order of ncu's stall columns in the source page (all samples, then not-issued samples)
REASONS = ["barrier", "branch_resolving", "dispatch", "drain", "imc", "lg", "long_sb", "math", "membar", "mio",
           "misc", "no_inst", "not_selected", "selected", "short_sb", "sleeping", "tex", "wait"]


def parse(text: str) -> list[tuple[str, int, int, dict[str, int]]]:
    """[(SASS, samples, executed, {reason: samples})] of the first kernel's instructions."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Address")]
    if not starts:
        raise SystemExit("no source page in this log (ncu --page source --print-source sass)")
    header = lines[starts[0]]
    src_end = header.index("Warp S")  # the SASS column ends where the sample columns begin
    rows = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("Address"):
            break  # the next kernel's page
        if not line.startswith("0x"):
            continue
        fields = line[src_end:].split()
        sass = line[19:src_end].strip()
        stalls = {r: int(v) if v.isdigit() else 0 for r, v in zip(REASONS, fields[-2 * len(REASONS):-len(REASONS)])}
        rows.append((sass, int(fields[0]), int(fields[3]), stalls))
    return rows


def opcode(sass: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", sass).split(" ")[0].split(".")[0] if sass else "?"


def summary(rows, top: int) -> str:
    total = collections.Counter()
    by_class: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for sass, _, _, stalls in rows:
        total.update(stalls)
        by_class[opcode(sass)].update(stalls)
    n = sum(total.values()) or 1
    out = [f"{n} warp-state samples; by reason: "
           + ", ".join(f"{r} {100 * v / n:.1f}%" for r, v in total.most_common() if v), "",
           "| opcode | samples | largest reasons (% of all samples) |", "|---|---|---|"]
    for cls, c in sorted(by_class.items(), key=lambda x: -sum(x[1].values()))[:top]:
        s = sum(c.values())
        out.append(f"| {cls} | {100 * s / n:.1f}% | "
                   + ", ".join(f"{r} {100 * v / n:.1f}" for r, v in c.most_common(4) if v) + " |")
    most = max(e for _, _, e, _ in rows)
    loop = [r for r in rows if r[2] >= most / 2]
    out += ["", f"Main loop: {len(loop)} instructions executed >= half the maximum ({most}) times", "",
            "| # | SASS | samples | top reasons |", "|---|---|---|---|"]
    for i, (sass, samples, _, stalls) in enumerate(loop):
        reasons = ", ".join(f"{r} {v}" for r, v in sorted(stalls.items(), key=lambda x: -x[1])[:2] if v)
        out.append(f"| {i} | `{sass}` | {samples} | {reasons} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log")
    p.add_argument("--top", type=int, default=16, help="opcode classes in the first table")
    a = p.parse_args()
    with open(a.log) as f:
        print(summary(parse(f.read()), a.top))


if __name__ == "__main__":
    main()
