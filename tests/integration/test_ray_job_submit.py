"""`ray job submit` of the calibration entry point against a real `ray start --head` cluster."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).parents[2]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ray_job_submit_writes_the_artifact(tmp_path):
    if not (BIN / "ray").exists():
        pytest.skip("ray CLI not installed in this environment")
    out = tmp_path / "artifact"
    cfg = tmp_path / "calib.yaml"
    cfg.write_text(f"model: smollm2\ntoken_budget: 512\nchunk_len: 256\nworkers: 2\noutput:\n  path: {out}\n")
    port, dash = _free_port(), _free_port()
    # A throwaway loopback cluster: Ray 2.60's token auth is turned off for it, as `ray start` and
    # `ray job submit` would otherwise need a token shared through ~/.ray.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_AUTH_MODE"] = "disabled"
    subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={port}", f"--dashboard-port={dash}",
                    "--num-cpus=2", "--include-dashboard=true", "--disable-usage-stats"],
                   check=True, capture_output=True, timeout=180, env=env)
    try:
        address = f"http://127.0.0.1:{dash}"
        deadline = time.time() + 60
        while True:  # the job server comes up a little after `ray start` returns
            probe = subprocess.run([str(BIN / "ray"), "job", "list", "--address", address],
                                   capture_output=True, text=True, timeout=60, env=env)
            if probe.returncode == 0 or time.time() > deadline:
                break
            time.sleep(2)
        proc = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO), "--",
             sys.executable, "-m", "oscar_ray.calib_jobs.calibrate", "--config", str(cfg)],
            capture_output=True, text=True, timeout=900, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "wrote" in proc.stdout and "pass1" in proc.stdout
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["n_layers"] == 30 and manifest["token_count"] == 512
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, timeout=120, env=env)
