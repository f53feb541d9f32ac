"""Summary statistics of a run: latency percentiles, throughput, errors by kind, goodput under an SLO.

All numbers come from the `RequestRecord`s (times measured on this side of the socket), so the
same function summarises a live run and a JSON file read back later.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from .client import CANCELLED, RequestRecord
from .workloads import SLO

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default 'linear'); None when empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def dist(values: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    out["n"] = len(values)
    return out


def meets_slo(rec: RequestRecord, slo: SLO) -> bool:
    """A successful request within every bound that is set (a bound on TPOT holds vacuously for a
    one-token answer, which has no TPOT)."""
    if not rec.ok:
        return False
    if slo.tpot_s is not None and rec.tpot is not None and rec.tpot > slo.tpot_s:
        return False
    for bound, value in ((slo.ttft_s, rec.ttft), (slo.e2e_s, rec.e2e)):
        if bound is not None and (value is None or value > bound):
            return False
    return True


def summarize(records: Sequence[RequestRecord], slo: SLO, wall_s: float | None = None) -> dict[str, Any]:
    """Counts, latency distributions (successful requests only), throughput over the run's wall
    time (first start to last end unless `wall_s` is given), errors by kind and goodput."""
    ok = [r for r in records if r.ok]
    if wall_s is None:
        ends = [r.start + (r.e2e or 0.0) for r in records]
        wall_s = max(ends) - min(r.start for r in records) if records else 0.0
    errors = Counter(r.error for r in records if r.error is not None and r.error != CANCELLED)
    good = sum(meets_slo(r, slo) for r in ok)
    out_tokens = sum(r.output_tokens for r in ok)
    per = 1 / wall_s if wall_s > 0 else 0.0
    return {
        "requests": len(records),
        "ok": len(ok),
        "cancelled": sum(r.error == CANCELLED for r in records),
        "errors": dict(sorted(errors.items())),
        "error_codes": dict(sorted(Counter(f"{r.error}:{r.error_code}" for r in records
                                           if r.error not in (None, CANCELLED) and r.error_code).items())),
        "wall_s": wall_s,
        "ttft_s": dist([r.ttft for r in ok if r.ttft is not None]),
        "tpot_s": dist([r.tpot for r in ok if r.tpot is not None]),
        "itl_s": dist([g for r in ok for g in r.itls()]),
        "e2e_s": dist([r.e2e for r in ok if r.e2e is not None]),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "cached_prompt_tokens": sum(r.cached_tokens for r in ok),
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens * per,
        "requests_per_s": len(ok) * per,
        "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s},
        "slo_met": good,
        "goodput_requests_per_s": good * per,
        "slo_attainment": good / len(records) if records else None,
    }
