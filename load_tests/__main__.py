"""CLI: `python -m load_tests run|compare` (see load_tests/README.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .compare import compare, rerender
from .plots import plot_cdfs
from .runner import run_workload, write_json
from .workloads import Workload


def _target(spec: str) -> tuple[str, str]:
    label, sep, url = spec.partition("=")
    if not sep or not label or not url:
        raise argparse.ArgumentTypeError(f"expected LABEL=URL, got {spec!r}")
    return label, url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m load_tests", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="one workload against one target")
    r.add_argument("--target", required=True, help="base URL, e.g. http://127.0.0.1:8000")
    c = sub.add_parser("compare", help="one workload against two targets over a sweep; markdown report")
    c.add_argument("--a", required=True, type=_target, help="LABEL=URL, e.g. bf16=http://127.0.0.1:8000/bf16")
    c.add_argument("--b", required=True, type=_target, help="LABEL=URL")
    c.add_argument("--points", default=None,
                   help="comma list of concurrencies (closed-loop workload) or rates (Poisson); default: the workload's")
    rr = sub.add_parser("report", help="rebuild a compare report and plots from its JSON files")
    rr.add_argument("--dir", required=True)
    rr.add_argument("--name", required=True, help="workload name (the JSON files' prefix)")
    for p in (r, c):
        p.add_argument("--workload", required=True, help="workload YAML (load_tests/workloads/)")
        p.add_argument("--out", required=True, help="run: JSON file (+ .png beside); compare: output directory")
        p.add_argument("--num-requests", type=int, help="override the workload's num_requests")
        p.add_argument("--duration-s", type=float, help="override the workload's duration_s")
        p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback target")
    args = ap.parse_args(argv)

    if args.cmd == "report":
        print(rerender(args.dir, args.name))
        return 0
    w = Workload.from_file(args.workload)
    over = {k: v for k, v in (("num_requests", args.num_requests), ("duration_s", args.duration_s)) if v is not None}
    if over:
        w = w.with_(**over)
    if args.cmd == "run":
        res = asyncio.run(run_workload(args.target, w, args.allow_remote))
        path = write_json(res, args.out)
        plot_cdfs({w.name: res}, path.with_suffix(".png"), w.name)
        print(json.dumps(res["summary"], indent=1))
        return 0 if res["summary"]["ok"] else 1
    points = ([float(x) for x in args.points.split(",")] if args.points
              else [w.concurrency if w.concurrency is not None else w.rate])
    print(asyncio.run(compare(dict([args.a, args.b]), w, points, args.out, args.allow_remote)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
