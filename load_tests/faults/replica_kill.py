"""Replica kill mid-load: 2 engine replicas, streams running on both, SIGKILL one replica process.

Checks: every in-flight stream ends (error event, truncated body or success; none hangs past its
timeout); none is garbled (malformed SSE/JSON, or text with U+FFFD); requests sent after the kill
succeed on the surviving replica; Serve brings the replica count back to 2 (time measured).

    python -m load_tests.faults.replica_kill --out load_tests/results/faults/replica_kill.json
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from collections import Counter

from load_tests.runner import run_workload
from load_tests.workloads import Workload

from .serving import replica_processes, running_replicas, save, serve_cpu_default

APP = "kill"


def _wl(n: int, concurrency: int) -> Workload:
    return Workload.from_dict({"name": "kill", "kind": "random_short", "concurrency": concurrency,
                               "num_requests": n, "duration_s": 120, "timeout_s": 120,
                               "sampling": {"max_tokens": 48, "temperature": 0.0, "ignore_eos": True}})


def _in_flight(records: list[dict], at: float) -> list[dict]:
    """Records whose stream was open at `at` (seconds from the run's start)."""
    return [r for r in records if r["start"] <= at < r["start"] + (r["e2e"] or 0.0)]


async def _busiest(procs: list, window_s: float = 1.0) -> tuple:
    """The replica process that used the most CPU over `window_s`, and each one's CPU share: the
    victim must be serving streams (the router may put all 8 on one replica; a first run killed
    an idle one and so tested nothing)."""
    before = [sum(p.cpu_times()[:2]) for p in procs]
    await asyncio.sleep(window_s)
    share = [(sum(p.cpu_times()[:2]) - b) / window_s for p, b in zip(procs, before)]
    return procs[max(range(len(procs)), key=share.__getitem__)], {p.pid: round(c, 2) for p, c in zip(procs, share)}


async def scenario(url: str, kill_after_s: float) -> dict:
    t_load = time.perf_counter()
    load = asyncio.create_task(run_workload(url, _wl(24, 8), with_text=True))
    await asyncio.sleep(kill_after_s)
    victim, cpu_share = await _busiest(replica_processes(APP))
    t_kill = time.perf_counter()
    os.kill(victim.pid, signal.SIGKILL)
    during = await load
    # the runner's clock starts after its GET /v1/models, a few ms after t_load: the window is
    # that much late, far below a 48-token stream's ~5 s
    open_at_kill = _in_flight(during["records"], t_kill - t_load)
    after = await run_workload(url, _wl(8, 2), with_text=True)  # new requests while Serve replaces the replica
    restarted_s = None
    while time.perf_counter() - t_kill < 180:
        if running_replicas(APP) == 2 and any(p.pid != victim.pid for p in replica_processes(APP)) \
                and len(replica_processes(APP)) == 2:
            restarted_s = time.perf_counter() - t_kill
            break
        await asyncio.sleep(1)
    final = await run_workload(url, _wl(6, 2), with_text=True)
    garbled = [r for res in (during, after, final) for r in res["records"]
               if r["error"] == "garbled" or "\ufffd" in (r.get("text") or "")]
    return {"during": during, "after_kill": after, "after_restart": final, "victim_pid": victim.pid,
            "replica_cpu_share_before_kill": cpu_share,
            "kill_at_s": kill_after_s, "replica_back_after_s": restarted_s,
            "verdict": {
                "during_outcomes": dict(Counter(r["error"] or "ok" for r in during["records"])),
                "open_at_kill": len(open_at_kill),
                "open_at_kill_outcomes": dict(Counter(r["error"] or "ok" for r in open_at_kill)),
                # a stream broken off without an error event (client sees a reset / no [DONE])
                "truncated": sum(r["error"] == "truncated" for r in during["records"]),
                "hung": sum(r["error"] == "timeout" for res in (during, after, final) for r in res["records"]),
                "garbled": len(garbled),
                "after_kill_ok": f"{after['summary']['ok']}/{after['summary']['requests']}",
                "after_restart_ok": f"{final['summary']['ok']}/{final['summary']['requests']}",
                "replica_back_after_s": restarted_s,
            }}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--port", type=int, default=8000, help="Serve HTTP port on 127.0.0.1")
    ap.add_argument("--kill-after-s", type=float, default=12.0)
    args = ap.parse_args(argv)
    with serve_cpu_default({APP: {"num_threads": 1}}, args.port, replicas=2, num_cpus=4) as urls:
        res = asyncio.run(scenario(urls[APP], args.kill_after_s))
    v = res["verdict"]
    # in-flight streams on the victim must end with an error event (stream_error), not a reset;
    # requests sent after the kill must all succeed (on the survivor, then on both)
    v["pass"] = (v["hung"] == 0 and v["garbled"] == 0 and v["truncated"] == 0
                 and res["after_kill"]["summary"]["errors"] == {}
                 and res["after_restart"]["summary"]["errors"] == {}
                 and v["replica_back_after_s"] is not None)
    save(res, args.out)
    print(v)
    return 0 if v["pass"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
