"""Quality of the torch engine's caches on SmolLM2-135M (CPU): greedy agreement, perplexity and
needle retrieval, every number read through the engine's own paged cache and scheduler.

    .venv/bin/python benchmarks/quality_engine.py agree  --out benchmarks/results/engine_agree.json
    .venv/bin/python benchmarks/quality_engine.py ppl    --out benchmarks/results/engine_ppl.json
    .venv/bin/python benchmarks/quality_engine.py needle --out benchmarks/results/engine_needle.json

Caches ("methods"): bf16 (every page BF16), oscar (the engine default: quick calibration on Emma in
mode "best": per-KV-head R = U·H·P, centred keys/values, fitted clip), oscar-authors (the paper's
settings: per-layer R = U·H·P, fixed clip K 0.96 / V 0.92, no centring), quarot
(rotations: hadamard) and naive (rotations: identity); the three INT2 ones share the INT2 format,
clip ratios (K 0.96 / V 0.92) and the sink 64 / recent 256 windows; quarot-noclip / naive-noclip
are the same without clipping (the paper's baselines); oscar-k3 / quarot-k3 store keys with 3 bits
(unclipped) and values INT2 (3.0 bits/element), the same bytes with either rotation.

Protocol (all methods): a prompt goes through the scheduler's chunked prefill (256-token chunks,
as served: a chunk's own rows attend to each other at full precision, its prefix is read from the
pages, INT2 beyond sink/recent), then tokens are produced one per step by decode steps, whose
attention reads sink BF16 + INT2 history + BF16 recent ring (256-319 tokens, whole pages) exactly
as generation does; ring pages are demoted to INT2 as decoding goes.  Perplexity teacher-forces:
the "decoded" token is the text's next token and its log-probability under the decode step's
logits is recorded, so every scored token is a decode-time prediction.  Jobs run batched (all
sequences of one method in one engine), prefix caching off, pools sized so nothing is preempted.
JSON is rewritten after every engine run so a killed run keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from oscar_ray.engines.torch import TorchEngineConfig  # noqa: E402
from oscar_ray.engines.torch.core import EngineCore  # noqa: E402
from oscar_ray.engines.torch.scheduler import Seq  # noqa: E402

ROT = {"oscar": None, "oscar-authors": None, "oscar-k3": None, "quarot": "hadamard", "naive": "identity",
       "quarot-noclip": "hadamard", "naive-noclip": "identity", "quarot-k3": "hadamard"}
PAGE = 64


def run_info() -> dict:
    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=Path(__file__).parents[1]).stdout.strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")), "machine": platform.node(),
            "cpu": cpu, "threads": torch.get_num_threads(), "torch": torch.__version__}


# oscar-g32: the default calibration with two (s, z) groups of 32 per row of 64 (3.0 bits/element
# instead of 2.5, the paper's two groups per row at d 128) and no key clipping: a scratch sweep of
# 10 needles found key clipping costs retrieval once rows have two groups (4/10 → 7/10)
# oscar-long: the default calibration on 2 × 4096 tokens instead of 4 × 512, so the post-RoPE means
# and statistics also see late positions
VARIANTS = {"oscar-g32": {"group_size": 32, "k_clip": 0.0},
            "oscar-long": {"group_size": None, "k_clip": None, "seq_len": 4096, "n_seqs": 2}}


def variant_rotations(method: str, sink: int) -> str:
    """An artifact for a VARIANTS method: the quick calibration with its clip overrides, cached."""
    from oscar_ray.env import cache_dir
    from oscar_ray.models.loader import load_model
    from oscar_ray.models.rotations import quick_calibration
    from oscar_ray.quant import RotationSet

    v = VARIANTS[method]
    path = cache_dir() / "rotations-variants" / f"{method}-sink{sink}"
    if not (path / "manifest.json").is_file():
        model, tok = load_model("smollm2")
        lengths = {k: v[k] for k in ("seq_len", "n_seqs") if k in v}
        rs = quick_calibration(model, tok, 0.96, 0.92, mode="best", sink_tokens=sink, **lengths)
        k_clip = rs.k_clip if v["k_clip"] is None else torch.full_like(rs.k_clip, v["k_clip"])
        RotationSet(rs.k_rotation, rs.v_rotation, rs.k_eigenvalues, rs.v_eigenvalues, k_clip, rs.v_clip,
                    manifest={**{k: x for k, x in rs.manifest.items() if k != "sha256"}, "variant": method},
                    k_mean=rs.k_mean, v_mean=rs.v_mean).save(path)
    return str(path)


def make_core(method: str, n_seqs: int, max_len: int, sink: int = 64, recent: int = 256) -> EngineCore:
    pages = -(-max_len // PAGE) + 1
    cache = {"sink_tokens": sink, "recent_tokens": recent, "page_size": PAGE}
    rotations = ROT.get(method)
    if method in VARIANTS:
        if VARIANTS[method]["group_size"]:
            cache["group_size"] = VARIANTS[method]["group_size"]
        rotations = variant_rotations(method, sink)
    if method.endswith("-k3"):  # 3-bit keys (stored unclipped), INT2 values: 3.0 bits/element
        cache["key_bits"] = 3
    if method.endswith("-noclip"):  # the paper's baselines clip nothing (OSCAR_SPEC §7.1)
        cache.update(k_clip_ratio=0.0, v_clip_ratio=0.0)
    if method == "bf16":
        pools = {"num_bf16_pages": n_seqs * pages}
    else:
        pools = {"num_int2_pages": n_seqs * pages, "num_bf16_pages": n_seqs * ((sink + recent) // PAGE + 2)}
    cfg = TorchEngineConfig(model="smollm2", kv_cache="bf16" if method == "bf16" else "oscar",
                            rotations=rotations, max_model_len=max_len, max_num_seqs=n_seqs,
                            max_batched_tokens=256, max_queue=max(256, n_seqs), prefix_caching=False,
                            num_threads=2, cache=cache,
                            quick_calibration="authors" if method == "oscar-authors" else "best", **pools)
    return EngineCore(cfg)


def drive(core: EngineCore, jobs: list[tuple[list[int], list[int] | None, int]]) -> list[dict]:
    """jobs: (prompt ids, forced continuation or None for greedy, n tokens).  Returns per job the
    produced tokens and the log-probability of each under the step that produced it."""
    seqs = []
    for i, (prompt, forced, n) in enumerate(jobs):
        s = Seq(f"j{i}", list(prompt), len(prompt), n)
        s.payload = {"forced": forced, "gen": [], "lp": [], "argmax": []}
        core.scheduler.add(s)
        seqs.append(s)
    left = len(seqs)
    while left:
        res = core.step()
        finished = []
        done = [s for s, it in res.plan.items if it.start < s.n_prompt and s.n_written >= s.n_prompt]
        for seq, logits in res.sampled:
            p = seq.payload
            lp = torch.log_softmax(logits.float().cpu(), -1)
            top = int(lp.argmax())
            tok = top if p["forced"] is None else p["forced"][len(p["gen"])]
            p["gen"].append(tok), p["lp"].append(float(lp[tok])), p["argmax"].append(top)
            seq.tokens.append(tok)
            if len(p["gen"]) >= seq.max_new:
                seq.finished = True
                finished.append(seq)
        core.finish_step(finished, done)
        left -= len(finished)
    assert core.scheduler.n_preemptions == 0, "pools too small: a preempted sequence recomputes its cache"
    return [s.payload for s in seqs]


def chat_ids(tok, text: str) -> list[int]:
    r = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(r["input_ids"] if hasattr(r, "keys") else r)  # transformers 5 returns a BatchEncoding


def book_ids(tok, book: str) -> list[int]:
    from oscar_ray.assets import austen_books

    return tok(austen_books()[book], add_special_tokens=False)["input_ids"]


def save(path: str, data: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1))


# --- 1. greedy agreement ---------------------------------------------------------------------------
QUESTIONS = ["Summarise the passage above in three sentences.", "Who are the people in the passage above, and "
             "how do they feel about each other?", "What happens in the passage above? Answer briefly.",
             "Describe the mood of the passage above.", "Write the next paragraph of the story above."]


def cmd_agree(a) -> None:
    from oscar_ray.models.loader import load_tokenizer

    tok = load_tokenizer("smollm2")
    ids = book_ids(tok, a.book)
    rng = random.Random(0)
    prompts = []
    for i in range(a.n):  # passages of 600-1200 book tokens from spread-out offsets, one question each
        n = rng.randint(a.min_len, a.max_len)
        lo = (i * (len(ids) - n)) // a.n
        prompts.append(chat_ids(tok, tok.decode(ids[lo:lo + n]) + "\n\n" + QUESTIONS[i % len(QUESTIONS)]))
    max_len = max(map(len, prompts)) + a.new + 1
    out = {"run": run_info(), "book": a.book, "n_prompts": a.n, "new_tokens": a.new,
           "prompt_tokens": [len(p) for p in prompts], "methods": {}}
    if Path(a.out).exists() and a.resume:  # keep finished methods (each records its own commit)
        old = json.loads(Path(a.out).read_text())
        if old["prompt_tokens"] != out["prompt_tokens"]:
            raise SystemExit(f"{a.out} holds other prompts: cannot resume")
        out["methods"] = {m: v for m, v in old["methods"].items() if m not in a.redo}
    for m in a.methods:
        if m in out["methods"]:
            continue
        t0 = time.time()
        res = drive(make_core(m, a.n, max_len), [(p, None, a.new) for p in prompts])
        out["methods"][m] = {"tokens": [r["gen"] for r in res], "wall_s": round(time.time() - t0, 1),
                             "commit": out["run"]["commit"]}
        save(a.out, out)
        print(m, "done", out["methods"][m]["wall_s"], "s", flush=True)
    ref = out["methods"]["bf16"]["tokens"]
    for m in out["methods"]:
        if m == "bf16":
            continue
        got = out["methods"][m]["tokens"]
        pre = [next((i for i, (x, y) in enumerate(zip(g, r)) if x != y), len(r)) for g, r in zip(got, ref)]
        pos = sum(x == y for g, r in zip(got, ref) for x, y in zip(g, r)) / sum(map(len, ref))
        out["methods"][m]["summary"] = {"mean_prefix": sum(pre) / len(pre), "exact_rate": sum(p == a.new for p in pre)
                                        / len(pre), "token_agreement": pos, "prefix": pre}
        print(m, {k: v for k, v in out["methods"][m]["summary"].items() if k != "prefix"}, flush=True)
    save(a.out, out)


# --- 2. perplexity -------------------------------------------------------------------------------
def cmd_ppl(a) -> None:
    from oscar_ray.models.loader import load_tokenizer

    tok = load_tokenizer("smollm2")
    ids = book_ids(tok, a.book)
    out = {"run": run_info(), "book": a.book, "scored_per_window": a.score, "cells": {}}
    if Path(a.out).exists() and a.resume:  # keep finished cells (each records its own commit)
        out["cells"] = {k: v for k, v in json.loads(Path(a.out).read_text())["cells"].items()
                        if k.split("@")[0] not in a.redo}
    for ctx in a.contexts:
        # windows from spread-out offsets; the last `score` tokens of each are decode-scored
        stride = (len(ids) - ctx) // max(1, a.windows)
        wins = [ids[w * stride:w * stride + ctx] for w in range(a.windows)]
        jobs = [(w[:ctx - a.score - 1], w[ctx - a.score - 1:], a.score + 1) for w in wins]
        for m in a.methods:
            for sink in ([64, 0] if m == "oscar" and ctx in a.sink0_contexts else [64]):
                key = f"{m}@{ctx}" + ("" if sink == 64 else f"@sink{sink}")
                if key in out["cells"]:
                    continue
                t0 = time.time()
                res = drive(make_core(m, len(jobs), ctx + 1, sink=sink), jobs)
                lps = [r["lp"][1:] for r in res]  # the first comes from the prefill's last row: dropped
                nll = -sum(map(sum, lps)) / sum(map(len, lps))
                out["cells"][key] = {"method": m, "context": ctx, "sink": sink, "ppl": math.exp(nll), "nll": nll,
                                     "window_nll": [-sum(x) / len(x) for x in lps], "n_tokens": sum(map(len, lps)),
                                     "argmax": [r["argmax"][1:] for r in res],
                                     "wall_s": round(time.time() - t0, 1), "commit": out["run"]["commit"]}
                save(a.out, out)
                print(key, round(math.exp(nll), 3), out["cells"][key]["wall_s"], "s", flush=True)


# --- 3. needle in a haystack ----------------------------------------------------------------------
COLORS = ["blue", "red", "green", "yellow", "white", "black", "orange", "purple"]
THINGS = ["door", "box", "gate", "chest", "cupboard", "drawer"]


def needle_prompt(tok, hay: list[int], ctx: int, depth: float, rng: random.Random) -> tuple[list[int], str]:
    color, thing, code = rng.choice(COLORS), rng.choice(THINGS), str(rng.randint(1000, 9999))
    fact = f" The secret code of the {color} {thing} is {code}. "
    question = f"\n\nWhat is the secret code of the {color} {thing}? Answer with the number."
    overhead = len(chat_ids(tok, fact + question))
    text = tok.decode(hay[:ctx - overhead - a_new() - 8])  # 8: re-tokenising the cut text may grow it
    cut = text.rfind(". ", 0, int(depth * len(text))) + 1 or int(depth * len(text))  # at a sentence end
    return chat_ids(tok, text[:cut] + fact + text[cut:].lstrip() + question), code


def a_new() -> int:
    return 16  # answer tokens: "The secret code of the orange chest is 1663." is 14 (digits are one token each)


def cmd_needle(a) -> None:
    from oscar_ray.models.loader import load_tokenizer

    tok = load_tokenizer("smollm2")
    ids = book_ids(tok, a.book)
    rng = random.Random(a.seed)
    prompts = []  # one haystack offset per needle index, so methods and depths share haystacks
    for ctx in a.contexts:
        for depth in a.depths:
            for k in range(a.needles):
                off = (k * 7919 * 37) % (len(ids) - ctx)
                p, code = needle_prompt(tok, ids[off:], ctx, depth / 100, rng)
                prompts.append({"context": ctx, "depth": depth, "needle": k, "code": code, "len": len(p), "ids": p})
    out = {"run": run_info(), "book": a.book, "prompts": [{k: v for k, v in p.items() if k != "ids"} for p in prompts],
           "methods": {}}
    if Path(a.out).exists() and a.resume:  # keep finished methods (each records its own commit)
        old = json.loads(Path(a.out).read_text())
        if old["prompts"] != out["prompts"]:
            raise SystemExit(f"{a.out} holds other prompts: cannot resume")
        out["methods"] = {m: v for m, v in old["methods"].items() if m.split("@")[0] not in a.redo}
    max_len = max(p["len"] for p in prompts) + a_new() + 1
    runs = [(m, 64, prompts) for m in a.methods]
    if "oscar" in a.methods and a.sink0_contexts:
        runs.append(("oscar", 0, [p for p in prompts if p["context"] in a.sink0_contexts]))
    for m, sink, todo in runs:
        key = m + ("" if sink == 64 else f"@sink{sink}")
        if key in out["methods"]:
            continue
        t0 = time.time()
        res = []
        for lo in range(0, len(todo), a.batch):  # batches bound the pools' memory (BF16: 188 MiB per 8K)
            part = todo[lo:lo + a.batch]
            res += drive(make_core(m, len(part), max_len, sink=sink), [(p["ids"], None, a_new()) for p in part])
        answers = [tok.decode(r["gen"]) for r in res]
        hits = [p["code"] in ans for p, ans in zip(todo, answers)]
        out["methods"][key] = {"prompts": [prompts.index(p) for p in todo], "answers": answers, "hits": hits,
                               "rate": sum(hits) / len(hits), "wall_s": round(time.time() - t0, 1),
                               "commit": out["run"]["commit"]}
        save(a.out, out)
        print(key, "retrieval", round(sum(hits) / len(hits), 3), out["methods"][key]["wall_s"], "s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("agree")
    g.add_argument("--n", type=int, default=50)
    g.add_argument("--new", type=int, default=64)
    g.add_argument("--min-len", type=int, default=600)
    g.add_argument("--max-len", type=int, default=1200)
    g.add_argument("--book", default="persuasion")
    g.add_argument("--methods", nargs="+", default=["bf16", "oscar"])
    p = sub.add_parser("ppl")
    p.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192])
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--score", type=int, default=128, help="decode-scored tokens at the end of each window")
    p.add_argument("--book", default="prideprejudice")
    p.add_argument("--methods", nargs="+", default=["bf16", "oscar", "quarot", "naive"])
    p.add_argument("--sink0-contexts", type=int, nargs="*", default=[4096], help="also OSCAR with sink_tokens 0 here")
    n = sub.add_parser("needle")
    n.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 6144, 8192])
    n.add_argument("--depths", type=int, nargs="+", default=[10, 30, 50, 70, 90])
    n.add_argument("--needles", type=int, default=1)
    n.add_argument("--batch", type=int, default=10)
    n.add_argument("--seed", type=int, default=0)
    n.add_argument("--book", default="mansfieldpark")
    n.add_argument("--methods", nargs="+", default=["bf16", "oscar"])
    n.add_argument("--sink0-contexts", type=int, nargs="*", default=[2048, 4096])
    for s in (g, p, n):
        s.add_argument("--out", required=True)
        s.add_argument("--resume", action="store_true", help="keep what --out already holds")
        s.add_argument("--redo", nargs="*", default=[], help="with --resume: methods to measure again")
    a = ap.parse_args()
    {"agree": cmd_agree, "ppl": cmd_ppl, "needle": cmd_needle}[a.cmd](a)


if __name__ == "__main__":
    main()
