"""Run one workload against two targets (e.g. BF16-cache vs OSCAR-cache deployments of one config)
over a sweep of concurrencies (or rates) and write JSON per run, PNG plots and a markdown report.

The order alternates per sweep point (A,B then B,A ...) so slow drift of a shared machine does not
always favour the same target.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .plots import plot_cdfs, plot_throughput
from .runner import run_workload, write_json
from .workloads import Workload


async def compare(targets: dict[str, str], w: Workload, points: list[float], out: str | Path,
                  allow_remote: bool = False) -> Path:
    """`targets`: label -> base URL (two of them). `points`: concurrencies (closed-loop workload)
    or rates (Poisson workload). Returns the report's path."""
    if len(targets) != 2:
        raise ValueError(f"compare takes exactly two targets, got {len(targets)}")
    out = Path(out)
    knob = "concurrency" if w.concurrency is not None else "rate"
    labels = list(targets)
    results: dict[str, list[tuple[float, dict[str, Any]]]] = {k: [] for k in labels}
    for n, p in enumerate(points):
        wp = w.with_(**{knob: int(p) if knob == "concurrency" else float(p)})
        for label in (labels if n % 2 == 0 else labels[::-1]):
            res = await run_workload(targets[label], wp, allow_remote)
            res["label"] = label
            write_json(res, out / f"{w.name}_{label}_{knob}{p:g}.json")
            results[label].append((p, res))
    top = {label: results[label][-1][1] for label in labels}
    plot_cdfs(top, out / f"{w.name}_cdf.png", f"{w.name}, {knob} {points[-1]:g}")
    plot_throughput({k: [(p, r["summary"]) for p, r in v] for k, v in results.items()},
                    out / f"{w.name}_throughput.png", knob, w.name)
    report = out / f"{w.name}_report.md"
    report.write_text(render_report(w, knob, results))
    return report


def _ms(d: dict, key: str) -> str:
    v = d.get(key)
    return "–" if v is None else f"{v * 1000:.0f}"


def _cached(s: dict) -> str:
    return f"{s['cached_prompt_tokens'] / s['prompt_tokens']:.0%}" if s.get("prompt_tokens") else "–"


def rerender(out: str | Path, name: str) -> Path:
    """Rebuild `<name>_report.md` and the plots from the JSON files `compare` wrote in `out`."""
    out = Path(out)
    results: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    w = knob = None
    for path in sorted(out.glob(f"{name}_*.json")):
        res = json.loads(path.read_text())
        w = Workload.from_dict(res["workload"])
        knob = "concurrency" if w.concurrency is not None else "rate"
        results.setdefault(res["label"], []).append((float(res["workload"][knob]), res))
    if w is None:
        raise ValueError(f"no {name}_*.json results in {out}")
    for v in results.values():
        v.sort(key=lambda x: x[0])
    plot_cdfs({k: v[-1][1] for k, v in results.items()}, out / f"{name}_cdf.png", f"{name}, {knob} {v[-1][0]:g}")
    plot_throughput({k: [(p, r["summary"]) for p, r in v] for k, v in results.items()},
                    out / f"{name}_throughput.png", knob, name)
    report = out / f"{name}_report.md"
    report.write_text(render_report(w, knob, results))
    return report


def render_report(w: Workload, knob: str, results: dict[str, list[tuple[float, dict[str, Any]]]]) -> str:
    any_res = next(iter(results.values()))[0][1]
    c = any_res["conditions"]
    lines = [f"# {w.name}: {' vs '.join(results)}", "",
             f"Commit `{c['commit']}`{' (with uncommitted changes in oscar_ray/)' if c['dirty'] else ''}, "
             f"{c['date_utc']}, host `{c['host']}` ({c['cpu']}, {c['cpu_count']} CPUs), model `{c['model']}`.",
             "", "Targets: " + ", ".join(f"**{k}** `{v[0][1]['conditions']['target']}`" for k, v in results.items()),
             "", f"Workload `{w.kind}` ({w.endpoint}), sampling `{json.dumps(w.sampling)}`, prompt "
             f"`{json.dumps(w.params())}`, per point at most {w.num_requests} requests / {w.duration_s:g} s; "
             f"SLO {json.dumps(any_res['summary']['slo'])}. Latencies in ms, successful requests only.", "",
             f"| target | {knob} | ok/sent | errors | TTFT p50/p90/p99 | TPOT p50/p90/p99 | E2E p50/p90/p99 "
             "| out tok/s | req/s | goodput req/s | SLO met | prompt tokens cached |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for label, points in results.items():
        for p, res in points:
            s = res["summary"]
            trip = lambda k: "/".join(_ms(s[k], q) for q in ("p50", "p90", "p99"))  # noqa: E731
            errs = ", ".join(f"{k} {v}" for k, v in s["errors"].items()) or "0"
            att = s["slo_attainment"]
            lines.append(f"| {label} | {p:g} | {s['ok']}/{s['requests']} | {errs} | {trip('ttft_s')} | "
                         f"{trip('tpot_s')} | {trip('e2e_s')} | {s['output_tokens_per_s']:.1f} | "
                         f"{s['requests_per_s']:.2f} | {s['goodput_requests_per_s']:.2f} | "
                         f"{'–' if att is None else f'{att:.0%}'} | {_cached(s)} |")
    lines += ["", f"![latency CDFs]({w.name}_cdf.png)", "", f"![throughput]({w.name}_throughput.png)", ""]
    return "\n".join(lines)
