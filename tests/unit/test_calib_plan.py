from pathlib import Path

import pytest

from oscar_ray.calib_jobs.plan import dry_run
from oscar_ray.config import CalibrationConfig

REPO = Path(__file__).parents[2]


def test_glm47_dry_run_placement():
    cfg = CalibrationConfig.from_file(REPO / "configs/calib/glm47.yaml")
    text = dry_run(cfg)
    print(text)
    assert "92 layers, 96/8 heads, head_dim 128" in text
    assert "2 × (GPUs 8, CPUs 16) = 16 GPUs" in text
    assert "weights per GPU: 41.7 GiB" in text  # 358e9 B of FP8 / 8 GPUs
    assert "statistics per actor: 184.0 MiB" in text  # 92 layers × 8 heads × 2 × 128² × 8 B


def test_dry_run_with_throughput_gives_time():
    cfg = CalibrationConfig.model_validate({**CalibrationConfig.from_file(REPO / "configs/calib/glm47.yaml").model_dump(),
                                            "measured_tokens_per_s": 1000.0})
    assert "expected time: 0.5 min (32 s)" in dry_run(cfg)  # (2·30000 + 4096) tokens / (1000 tok/s · 2 actors)


def test_dry_run_rejects_bad_facts():
    data = CalibrationConfig.from_file(REPO / "configs/calib/glm47.yaml").model_dump()
    data["model_facts"]["head_dim"] = 96
    with pytest.raises(ValueError, match="head_dim"):
        dry_run(CalibrationConfig.model_validate(data))


def test_smollm2_config_validates():
    cfg = CalibrationConfig.from_file(REPO / "configs/calib/smollm2.yaml")
    assert cfg.workers == 2 and cfg.token_budget == 30000
