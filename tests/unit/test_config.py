import pydantic
import pytest

from oscar_ray.config import OscarCacheConfig, QualityConfig


def test_cache_defaults():
    c = OscarCacheConfig()
    assert (c.sink_tokens, c.recent_tokens, c.scale_dtype, c.k_clip_ratio, c.v_clip_ratio) == (64, 256, "float16", 0.96, 0.92)
    assert c.resolved_group_size(128) == 128 and c.resolved_group_size(64) == 64
    assert all(f.description for f in OscarCacheConfig.model_fields.values())
    assert all(f.description for f in QualityConfig.model_fields.values())


@pytest.mark.parametrize("bad,field", [({"sink_tokens": 65}, "sink_tokens"), ({"k_clip_ratio": 1.5}, "k_clip_ratio"),
                                       ({"scale_dtype": "bfloat16"}, "scale_dtype"), ({"group_size": 48}, "group_size"),
                                       ({"sinks": 64}, "sinks")])
def test_cache_rejects_bad_values(bad, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        OscarCacheConfig(**bad)


def test_group_must_divide_head_dim():
    with pytest.raises(ValueError, match="group_size"):
        OscarCacheConfig(group_size=128).resolved_group_size(64)


def test_from_file(tmp_path):
    p = tmp_path / "q.yaml"
    p.write_text("seq_len: 256\ncache:\n  sink_tokens: 0\n")
    cfg = QualityConfig.from_file(p)
    assert cfg.seq_len == 256 and cfg.cache.sink_tokens == 0
    p.write_text("seq_len: 256\ntypo: 1\n")
    with pytest.raises(pydantic.ValidationError, match="typo"):
        QualityConfig.from_file(p)
    with pytest.raises(ValueError, match="not found"):
        QualityConfig.from_file(tmp_path / "none.yaml")


def test_shipped_quality_config_validates():
    from pathlib import Path

    cfg = QualityConfig.from_file(Path(__file__).parents[2] / "configs/quality/smollm2.yaml")
    assert cfg.model == "smollm2"
