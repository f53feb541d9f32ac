"""Markdown tables from the JSON that benchmarks/quality_engine.py wrote (no model is run here).

    .venv/bin/python benchmarks/quality_engine_report.py benchmarks/results  > tables.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

NAMES = {"bf16": "BF16 cache", "oscar": "OSCAR (engine default: per KV head, centred, fitted clip)",
         "oscar-authors": "OSCAR (authors' settings)",
         "oscar-g32": "OSCAR, 2 groups of 32 per row (3.0 bits), no K clip",
         "oscar-k3": "OSCAR, 3-bit keys (unclipped) + INT2 values (K 3.5 + V 2.5 = 3.0 bits/element with scales)",
         "quarot-k3": "QuaRot (Hadamard), 3-bit keys (unclipped) + INT2 values (3.0 bits/element, same bytes as OSCAR 3-bit keys)",
         "oscar-long": "OSCAR, calibrated on 2 × 4096 tokens (default: 4 × 512)", "quarot": "QuaRot-INT2 (Hadamard) + clip",
         "naive": "naive INT2 (no rotation) + clip",
         "quarot-noclip": "QuaRot-INT2 (Hadamard), no clip", "naive-noclip": "naive INT2, no clip"}


def _load(root: Path, name: str) -> dict | None:
    p = root / name
    return json.loads(p.read_text()) if p.exists() else None


def _run_line(d: dict) -> str:
    r = d["run"]
    return (f"- run {r['date_utc']} UTC, commit {r['commit']}{' (+ uncommitted changes)' if r['dirty'] else ''}, "
            f"{r['cpu']} ({r['threads']} torch threads, shared with other jobs), torch {r['torch']}")


def agree(d: dict) -> list[str]:
    n = d["prompt_tokens"]
    int2 = [max(0, t - 64 - 256) / t for t in n]
    out = ["## 1. Greedy agreement, OSCAR vs BF16 cache", "", _run_line(d),
           f"- {d['n_prompts']} chat prompts: a `{d['book']}` passage + one of 5 questions; prompt tokens "
           f"min {min(n)} / median {int(statistics.median(n))} / max {max(n)}; at the end of the prompt "
           f"{statistics.mean(int2):.0%} of the context (mean) is INT2 history (all but sink 64 + recent 256-319)",
           f"- greedy, {d['new_tokens']} new tokens, EOS ignored; every prompt of a method in one engine (batched)", "",
           "| cache | mean matching prefix (of %d) | exact-%d agreement | token-level agreement | wall s |" % (
               d["new_tokens"], d["new_tokens"]), "|---|---|---|---|---|"]
    for m, v in d["methods"].items():
        s = v.get("summary")
        if s is None:
            out.append(f"| {NAMES[m]} | (reference) | | | {v['wall_s']} |")
        else:
            out.append(f"| {NAMES[m]} | {s['mean_prefix']:.1f} | {s['exact_rate']:.0%} | {s['token_agreement']:.1%} "
                       f"| {v['wall_s']} |")
    for m, v in d["methods"].items():
        if "summary" in v:
            pre = sorted(v["summary"]["prefix"])
            out += ["", f"{NAMES[m]} matching-prefix lengths (sorted): {pre}"]
    return out


def ppl(d: dict, title: str = "") -> list[str]:
    cells = d["cells"]
    ctxs = sorted({c["context"] for c in cells.values()})
    out = [f"## 2{title}. Perplexity (decode-scored)", "", _run_line(d),
           f"- `{d['book']}` (the quick calibration used `emma`); per context, windows from spread-out offsets; "
           "each window's first T−N−1 tokens are a chunked prefill (256-token chunks), the last N are "
           "teacher-forced decode steps whose log-probabilities are scored (each reads sink BF16 + INT2 "
           "history + BF16 recent ring, as generation reads it); N and the window count per context: "
           + ", ".join(f"{c / 1024:g}K: {len(v['window_nll'])} × {v['n_tokens'] // len(v['window_nll'])}"
                       for c, v in sorted((v["context"], v) for k, v in cells.items() if k.startswith("bf16@"))), "",
           "| cache | " + " | ".join(f"ppl @{c / 1024:g}K" for c in ctxs) + " | "
           + " | ".join(f"Δppl @{c / 1024:g}K" for c in ctxs) + " |", "|---|" + "---|" * (2 * len(ctxs))]
    base = {c: cells.get(f"bf16@{c}") for c in ctxs}
    keys = sorted({k.split("@", 1)[0] + ("@sink0" if k.endswith("@sink0") else "") for k in cells},
                  key=lambda k: (list(NAMES).index(k.split("@")[0]), k))
    for k in keys:
        m, tag = k.split("@")[0], " (sink 0)" if k.endswith("@sink0") else ""
        row = [cells.get(f"{m}@{c}" + ("@sink0" if tag else "")) for c in ctxs]
        p = [f"{r['ppl']:.3f}" if r else "–" for r in row]
        dp = [f"{r['ppl'] - base[c]['ppl']:+.3f} ({r['ppl'] / base[c]['ppl'] - 1:+.1%})" if r and base[c] else "–"
              for r, c in zip(row, ctxs)]
        out.append(f"| {NAMES[m]}{tag} | " + " | ".join(p) + " | " + " | ".join(dp) + " |")
    out += ["", "Per-window NLL (nats/token):", ""]
    for k, c in cells.items():
        out.append(f"- {k}: " + ", ".join(f"{x:.3f}" for x in c["window_nll"]) + f" (wall {c['wall_s']} s"
                   + (f", commit {c['commit']})" if "commit" in c else ")"))
    out += ["", "QuaRot-INT2 vs OSCAR:", ""]
    for c in ctxs:
        o, q, b = cells.get(f"oscar@{c}"), cells.get(f"quarot@{c}"), base[c]
        if o and q and b:
            inc = (q["ppl"] - b["ppl"]) / (o["ppl"] - b["ppl"]) if o["ppl"] != b["ppl"] else float("inf")
            out.append(f"- {c / 1024:g}K: ppl ratio QuaRot/OSCAR {q['ppl'] / o['ppl']:.3f}; "
                       f"ppl-increase ratio (QuaRot−BF16)/(OSCAR−BF16) {inc:.2f}")
    return out


def needle(d: dict, title: str = "") -> list[str]:
    prompts = d["prompts"]
    ctxs = sorted({p["context"] for p in prompts})
    depths = sorted({p["depth"] for p in prompts})
    n = max(p["needle"] for p in prompts) + 1
    out = [f"## 3{title}. Needle in a haystack: {', '.join(f'{c / 1024:g}K' for c in ctxs)}, {n} needle(s) per cell",
           "", _run_line(d),
           f"- haystack `{d['book']}`; needle \"The secret code of the <colour> <thing> is <4 digits>.\" at a "
           "sentence end near the depth; question at the end of the user turn; greedy 16 tokens; hit = the 4 digits "
           "appear in the answer", ""]
    for key, v in d["methods"].items():
        hit = {(prompts[i]["context"], prompts[i]["depth"]): [] for i in v["prompts"]}
        for i, h in zip(v["prompts"], v["hits"]):
            hit[(prompts[i]["context"], prompts[i]["depth"])].append(h)
        cs = sorted({c for c, _ in hit})
        out += [f"**{key}** — retrieval {sum(v['hits'])}/{len(v['hits'])} = {v['rate']:.0%} (wall {v['wall_s']} s"
                + (f", commit {v['commit']})" if "commit" in v else ")"),
                "",
                "| context | " + " | ".join(f"{x}%" for x in depths) + " | row |", "|---|" + "---|" * (len(depths) + 1)]
        for c in cs:
            row = [hit.get((c, x), []) for x in depths]
            allh = [h for r in row for h in r]
            out.append(f"| {c / 1024:g}K | " + " | ".join(f"{sum(r)}/{len(r)}" if r else "–" for r in row)
                       + f" | {sum(allh)}/{len(allh)} |")
        out.append("")
    if "bf16" in d["methods"] and "oscar" in d["methods"]:
        b, o = d["methods"]["bf16"]["rate"], d["methods"]["oscar"]["rate"]
        out.append(f"OSCAR / BF16 retrieval: {o:.0%} / {b:.0%}" + (f" = {o / b:.2f}" if b else ""))
    return out


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results")
    parts = []
    for name, fn in (("engine_agree_smollm2.json", agree), ("engine_ppl_smollm2.json", ppl),
                     ("engine_ppl_smollm2_w4.json", lambda d: ppl(d, "b")),
                     ("engine_ppl_smollm2_8k_w4.json", lambda d: ppl(d, "c")),
                     ("engine_needle_smollm2.json", lambda d: needle(d, "a")),
                     ("engine_needle_smollm2_more.json", lambda d: needle(d, "b")),
                     ("engine_needle_smollm2_long.json", lambda d: needle(d, "c"))):
        d = _load(root, name)
        if d:
            parts += fn(d) + [""]
    print("\n".join(parts))


if __name__ == "__main__":
    main()
