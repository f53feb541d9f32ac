"""The calibration job on a real local Ray cluster (2 CPU workers) with the real SmolLM2."""

import json

import pydantic
import pytest
import torch

from oscar_ray.calib_jobs.calibrate import calibrate
from oscar_ray.calib_jobs.worker import KILL_ENV
from oscar_ray.config import CalibrationConfig
from oscar_ray.quant import RotationSet

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(tmp_path, name, **kw) -> CalibrationConfig:
    base = {"model": "smollm2", "token_budget": 1024, "chunk_len": 256, "workers": 2, "checkpoint_every": 1,
            "output": {"path": str(tmp_path / name)}}
    return CalibrationConfig.model_validate({**base, **kw})


def _rel(a, b) -> float:
    return float(torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b))


def test_two_workers_equal_single_process(ray_cluster, tmp_path):
    kw = {"clip_mode": "fit", "clipfit_tokens": 256}
    local = calibrate(_cfg(tmp_path, "local", **kw), log=lambda m: None, local=True)
    dist = calibrate(_cfg(tmp_path, "ray", **kw), log=print)
    assert sorted(dist.c_q) == list(range(30))
    for layer in range(30):
        assert _rel(dist.c_q[layer].layer(), local.c_q[layer].layer()) < 1e-10
        assert _rel(dist.c_s[layer].layer(), local.c_s[layer].layer()) < 1e-10
        assert dist.c_q[layer].rows == local.c_q[layer].rows == 1024 * 3
    a, b = dist.rotations, local.rotations
    # fp32-stored rotations from fp64 statistics equal to 1e-10: equal up to eigenvalue ties
    assert torch.allclose(a.k_rotation, b.k_rotation, atol=1e-4) and torch.allclose(a.v_rotation, b.v_rotation, atol=1e-4)
    assert torch.equal(a.k_clip, b.k_clip) and torch.equal(a.v_clip, b.v_clip)
    # centring is on by default: the merged channel means equal the single-process ones
    assert a.centred and torch.allclose(a.k_mean, b.k_mean, atol=1e-5) and torch.allclose(a.v_mean, b.v_mean, atol=1e-5)
    assert float(a.k_mean.abs().max()) > 0.1  # SmolLM2's post-RoPE keys have real offsets
    back = RotationSet.load(tmp_path / "ray")
    assert back.manifest["token_count"] == 1024 and torch.equal(back.k_mean, a.k_mean)
    print("tokens/s per CPU worker:", dist.tokens_per_s)


def test_killed_worker_resumes_to_the_same_artifact(ray_cluster, tmp_path, monkeypatch):
    clean = calibrate(_cfg(tmp_path, "clean"), log=lambda m: None)
    marker = tmp_path / "killed"
    monkeypatch.setenv(KILL_ENV, f"1:1:{marker}")  # worker 1 exits after its first of two chunks
    killed = calibrate(_cfg(tmp_path, "killed"), log=print)
    assert marker.exists(), "the worker was never killed"
    # same model, data and config → same artifact hash, here even across a worker death
    assert killed.rotations.sha256 == clean.rotations.sha256
    assert json.loads((tmp_path / "killed" / "manifest.json").read_text())["sha256"] == clean.rotations.sha256


def test_bad_inputs_fail_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="model 'nope'"):
        calibrate(_cfg(tmp_path, "x", model="nope"), log=lambda m: None)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(ValueError, match="data"):
        calibrate(_cfg(tmp_path, "x", data={"source": "files", "paths": [str(empty)]}), log=lambda m: None)
    with pytest.raises(pydantic.ValidationError, match="token_budget"):
        _cfg(tmp_path, "x", token_budget=0)
    other = RotationSet(torch.eye(128)[None].repeat(30, 1, 1), torch.eye(128)[None].repeat(30, 1, 1),
                        torch.ones(30, 128), torch.ones(30, 128), torch.ones(30), torch.ones(30),
                        manifest={"n_kv_heads": 8})
    other.save(tmp_path / "taken")
    before = (tmp_path / "taken" / "rotations.safetensors").read_bytes()
    with pytest.raises(ValueError, match="output.path .*head_dim"):
        calibrate(_cfg(tmp_path, "taken"), log=lambda m: None)
    assert (tmp_path / "taken" / "rotations.safetensors").read_bytes() == before
