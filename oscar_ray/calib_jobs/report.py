"""Markdown table and PNG plot for a QualityResult."""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from pathlib import Path

from ..quant import int2_region_bits
from .quality import BEST, METHODS, QUERY_AWARE, QualityResult


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or "uncommitted"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def markdown(res: QualityResult) -> str:
    cfg = res.config
    bits = int2_region_bits(res.head_dim, cfg.cache.group_size, 16 if cfg.cache.scale_dtype == "float16" else 32)
    naive = res.overall("naive INT2").attention_error
    quarot = res.overall("QuaRot-INT2").attention_error
    lines = [
        f"# Quantiser quality on real activations: {cfg.model}",
        "",
        f"- date {_dt.date.today().isoformat()}, commit {_commit()}, machine {platform.machine()} CPU, "
        f"{res.seconds:.0f} s",
        f"- fit: {res.tokens['fit']} tokens of `{cfg.calib_book}`; clip fit: {res.tokens['clip_fit']} further "
        f"tokens; evaluation: {res.tokens['eval']} tokens of `{cfg.eval_book}` (another novel), "
        f"sequences of {cfg.seq_len}",
        f"- every method stores 2-bit codes + {cfg.cache.scale_dtype} (s, z) per row of {res.head_dim}: "
        f"{bits:.3f} bits/element; the first {cfg.cache.sink_tokens} tokens of each sequence stay BF16 for every "
        "method (the cache's sink), all later tokens are quantised (no recent window), causal attention over "
        "each whole sequence",
        f"- clip ratios (fixed) K {cfg.cache.k_clip_ratio} / V {cfg.cache.v_clip_ratio}; "
        "attention error = ‖O − Ô‖/‖O‖, logit error = ‖Q(K − K̂)ᵀ‖²/‖QKᵀ‖², both summed over layers",
        "",
        "| method | attention-output error | logit error | vs naive | vs QuaRot-INT2 |",
        "|---|---|---|---|---|",
    ]
    for name in METHODS:
        o = res.overall(name)
        lines.append(f"| {name} | {o.attention_error:.4f} | {o.logit_error:.5f} | "
                     f"{o.attention_error / naive:.3f}× | {o.attention_error / quarot:.3f}× |")
    lines.append("")
    for name, what in (("OSCAR", "the authors' settings"), (BEST, "what `oscar-ray calibrate` writes by default "
                                                             "with per_kv_head and clip_mode fit"),
                       (QUERY_AWARE, "the same rotations and means, keys rounded query-aware; math core, not yet "
                                     "in the cache's write kernels")):
        e = res.overall(name).attention_error
        lines.append(f"Targets for {name} ({what}): ≤ ½ of QuaRot-INT2 ({e / quarot:.3f}×: "
                     f"{'met' if e <= quarot / 2 else 'missed'}) and ≤ ¼ of naive INT2 "
                     f"({e / naive:.3f}×: {'met' if e <= naive / 4 else 'missed'}).")
    lines += ["", "Centred rows subtract per-KV-head key/value channel means measured on the calibration "
              "tokens before INT2 (exact under softmax: oscar_ray/quant/centre.py). Query-aware rounding keeps "
              "the stored (s, z) grid and picks each key code to minimise the logit error e·RᵀC_Q R·eᵀ, "
              "passing each element's rounding error on to the later elements (oscar_ray/quant/feedback.py); "
              "its key clip ratios are fitted on the attention-output error.", "",
              "## Per layer: attention-output error", "",
              "| layer | " + " | ".join(METHODS) + " | fitted clip K/V | centred fitted clip K/V | query-aware K |",
              "|---|" + "---|" * (len(METHODS) + 3)]
    for layer in sorted(res.errors["OSCAR"]):
        cells = " | ".join(f"{res.errors[m][layer].attention_error:.4f}" for m in METHODS)
        lines.append(f"| {layer} | {cells} | {res.clip['k'][layer]:.2f}/{res.clip['v'][layer]:.2f} | "
                     f"{res.clip['k_centred'][layer]:.2f}/{res.clip['v_centred'][layer]:.2f} | "
                     f"{res.clip['k_query_aware'][layer]:.2f} |")
    return "\n".join(lines) + "\n"


def plot(res: QualityResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    layers = sorted(res.errors["OSCAR"])
    for name in METHODS:
        ax.plot(layers, [res.errors[name][l].attention_error for l in layers], marker="o", ms=3, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention-output relative error")
    ax.set_title(f"INT2 KV quantisers on {res.config.model} ({res.tokens['eval']} held-out tokens)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_report(res: QualityResult) -> tuple[Path, Path]:
    out = Path(res.config.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, png = out / f"{res.config.name}.md", out / f"{res.config.name}.png"
    md.write_text(markdown(res))
    plot(res, png)
    return md, png
