"""Markdown tables from the JSON of benchmarks/e2e_decode.py and benchmarks/tp_one_rank.py.

    python benchmarks/render_e2e_tp.py e2e /path/e2e.json     # prints the e2e tables
    python benchmarks/render_e2e_tp.py tp /path/tp.json       # prints the TP one-rank table
"""

from __future__ import annotations

import json
import sys


def _ms(d: dict) -> str:
    return f"{d['median_ms']:.2f} ({d['p20_ms']:.2f}–{d['p80_ms']:.2f})"


NAMES = {"bf16": "BF16", "oscar": "OSCAR", "oscar-k3": "OSCAR, 3-bit keys"}


def e2e(res: dict) -> str:
    m = res["modes"]
    bf, others = m["bf16"], [k for k in m if k != "bf16"]
    lines = ["| context | batch | BF16 cache ms/step | " + " | ".join(f"{NAMES[k]} ms/step | {NAMES[k]} / BF16" for k in others)
             + " |", "|---|---|---|" + "---|---|" * len(others)]
    for i, a in enumerate(bf["latency"]):
        cells = [f"{_ms(m[k]['latency'][i])} | {m[k]['latency'][i]['median_ms'] / a['median_ms']:.2f}" for k in others]
        lines.append(f"| {a['context']} | 1 | {_ms(a)} | " + " | ".join(cells) + " |")
    lines += ["", "| cache | KV pools (GiB) | INT2 / BF16 pages | 128K sequences admitted | another fits | "
              "preemptions | context at end | ms/step, all at once | tokens/s |", "|---|---|---|---|---|---|---|---|---|"]
    for k in m:
        r = m[k]
        c, p = r["capacity"], r["pools"]
        lines.append(f"| {NAMES[k]} | {r['store_gib']:.2f} | {p['int2_pages']} / {p['bf16_pages']} | {c['admitted']} | "
                     f"{'yes' if c['another_fits'] else 'no'} | {c['preemptions']} | {c['context_at_end']} | {_ms(c)} | "
                     f"{c['tokens_per_s']:.1f} |")
    lines.append("")
    for k in others:
        ratio = m[k]["capacity"]["admitted"] / max(1, bf["capacity"]["admitted"])
        lines.append(f"Capacity ratio {NAMES[k]} / BF16: {ratio:.2f}× sequences; decode throughput ratio "
                     f"{m[k]['capacity']['tokens_per_s'] / bf['capacity']['tokens_per_s']:.2f}×.")
    return "\n".join(lines)


def tp(rows: list[dict]) -> str:
    lines = ["| model (rank share) | batch | context | OSCAR ms (graph) | BF16 SDPA ms (graph) | BF16 / OSCAR | "
             "OSCAR eager ms | BF16 eager ms | OSCAR / BF16 cache GiB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['batch']} | {r['context']} | error: {r['error'][:120]} | | | | | |")
            continue
        share = f"{r['model']} TP{r['tp']} ({r['layers']} L, {r['q_heads']} q / {r['kv_heads']} kv)"
        lines.append(f"| {share} | {r['batch']} | {r['context']} | {_ms(r['oscar_graph'])} | {_ms(r['bf16_graph'])} "
                     f"({r['sdpa_backend']}) | {r['speedup_graph']:.2f}× | {r['oscar_eager']['median_ms']:.2f} | "
                     f"{r['bf16_eager']['median_ms']:.2f} | {r['oscar_cache_gib']:.2f} / {r['bf16_cache_gib']:.2f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    kind, path = sys.argv[1], sys.argv[2]
    data = json.load(open(path))
    print(e2e(data) if kind == "e2e" else tp(data))
