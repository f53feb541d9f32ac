"""BF16-cache vs OSCAR-cache deployments of the CPU default on the same workloads.

    python -m load_tests.faults.cpu_compare --out load_tests/results/cpu \
        --run shared_prefix_chat:1,4,8 --run long_context:1,2

Both apps run in one local Ray cluster (routes /bf16 and /oscar); only one is loaded at a time,
since `compare` runs the targets one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from load_tests.compare import compare
from load_tests.workloads import Workload

from .serving import serve_cpu_default

WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--run", action="append", required=True, help="WORKLOAD:POINTS, e.g. shared_prefix_chat:1,4,8")
    ap.add_argument("--num-requests", type=int)
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    with serve_cpu_default({"bf16": {"kv_cache": "bf16"}, "oscar": {"kv_cache": "oscar"}}, args.port) as urls:
        for spec in args.run:
            name, _, pts = spec.partition(":")
            w = Workload.from_file(WORKLOADS / f"{name}.yaml")
            if args.num_requests:
                w = w.with_(num_requests=args.num_requests)
            points = [float(p) for p in pts.split(",")]
            print(asyncio.run(compare(urls, w, points, args.out)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
