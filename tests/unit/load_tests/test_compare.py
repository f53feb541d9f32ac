"""`compare` against two real local servers: JSON per run, PNG plots and the markdown report."""

from __future__ import annotations

import asyncio
import json

from load_tests.__main__ import main
from load_tests.compare import compare
from load_tests.workloads import Workload

from .sse_server import Server


def test_compare_two_targets_writes_report_plots_and_json(tmp_path):
    w = Workload.from_dict({"name": "cmp", "kind": "shared_prefix_chat", "concurrency": 1, "num_requests": 6,
                            "sampling": {"max_tokens": 3}, "slo": {"ttft_s": 60.0}})
    with Server() as a, Server() as b:
        report = asyncio.run(compare({"bf16": a.url, "oscar": b.url}, w, [1, 2], tmp_path))
        assert a.state.started == b.state.started == 12  # both saw the same 6 requests per point
    text = report.read_text()
    assert "| bf16 | 1 | 6/6 | 0 |" in text and "| oscar | 2 | 6/6 | 0 |" in text
    for name in ("cmp_cdf.png", "cmp_throughput.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    runs = sorted(p.name for p in tmp_path.glob("*.json"))
    assert runs == ["cmp_bf16_concurrency1.json", "cmp_bf16_concurrency2.json",
                    "cmp_oscar_concurrency1.json", "cmp_oscar_concurrency2.json"]
    res = json.loads((tmp_path / "cmp_oscar_concurrency2.json").read_text())
    assert res["label"] == "oscar" and res["workload"]["concurrency"] == 2 and res["summary"]["ok"] == 6


def test_cli_run(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("name: cli\nkind: random_short\nconcurrency: 2\nnum_requests: 3\nsampling: {max_tokens: 2}\n")
    with Server() as s:
        assert main(["run", "--target", s.url, "--workload", str(wl), "--out", str(tmp_path / "o.json")]) == 0
    assert json.loads((tmp_path / "o.json").read_text())["summary"]["ok"] == 3
    assert (tmp_path / "o.png").is_file()


def test_report_rebuilt_from_json(tmp_path):
    w = Workload.from_dict({"name": "re", "kind": "random_short", "concurrency": 1, "num_requests": 2,
                            "sampling": {"max_tokens": 2}})
    with Server() as a, Server() as b:
        first = asyncio.run(compare({"x": a.url, "y": b.url}, w, [1], tmp_path)).read_text()
    (tmp_path / "re_report.md").unlink()
    assert main(["report", "--dir", str(tmp_path), "--name", "re"]) == 0
    again = (tmp_path / "re_report.md").read_text()
    assert again == first and "| x | 1 | 2/2 | 0 |" in again and "43% |" in again  # 3 of 7 prompt tokens cached
