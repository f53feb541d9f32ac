"""PNG plots: latency CDFs per target and throughput/goodput vs concurrency (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .client import RequestRecord  # noqa: E402


def _records(result: Mapping[str, Any]) -> list[RequestRecord]:
    return [RequestRecord(**r) for r in result["records"]]


def latency_values(result: Mapping[str, Any], metric: str) -> list[float]:
    recs = [r for r in _records(result) if r.ok]
    if metric == "ttft":
        return [r.ttft for r in recs if r.ttft is not None]
    if metric == "tpot":
        return [r.tpot for r in recs if r.tpot is not None]
    if metric == "itl":
        return [g for r in recs for g in r.itls()]
    if metric == "e2e":
        return [r.e2e for r in recs if r.e2e is not None]
    raise ValueError(f"metric {metric!r} is not one of ttft, tpot, itl, e2e")


def plot_cdfs(results: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "",
              metrics: Sequence[str] = ("ttft", "tpot", "e2e")) -> Path:
    """One panel per metric, one empirical CDF line per labelled result."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.4))
    for ax, metric in zip(axes, metrics):
        for label, res in results.items():
            xs = sorted(latency_values(res, metric))
            if xs:
                ax.step([x * 1000 for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                        label=f"{label} (n={len(xs)})")
        ax.set_xlabel(f"{metric.upper()} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_throughput(sweeps: Mapping[str, Sequence[tuple[float, Mapping[str, Any]]]], path: str | Path,
                    xlabel: str = "concurrency", title: str = "") -> Path:
    """Output tokens/s and goodput (requests/s within SLO) against the swept load, per target."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    for label, points in sweeps.items():
        xs = [x for x, _ in points]
        a.plot(xs, [s["output_tokens_per_s"] for _, s in points], marker="o", label=label)
        b.plot(xs, [s["goodput_requests_per_s"] for _, s in points], marker="o", label=label)
    a.set_ylabel("output tokens/s")
    b.set_ylabel("goodput (requests/s within SLO)")
    for ax in (a, b):
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
