import pytest

from oscar_ray import assets


def test_offline_without_cache_gives_actionable_error(tmp_path, monkeypatch):
    monkeypatch.setenv("OSCAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("OSCAR_OFFLINE", "1")
    with pytest.raises(assets.AssetError, match="OSCAR_OFFLINE.*setup.sh"):
        assets.smollm2_gguf()
    with pytest.raises(assets.AssetError, match="OSCAR_OFFLINE"):
        assets.austen_books()


def test_verification_rejects_a_tampered_file(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(b"hello")
    digest = assets.sha256_file(f)
    assert assets._verified(f, digest)
    f.write_bytes(b"hellO")  # same size; the marker is keyed on mtime too, and the hash is redone
    import os
    os.utime(f, ns=(1, 1))
    assert not assets._verified(f, digest)
    with pytest.raises(assets.AssetError, match="does not match"):
        assets._check(f, digest, "blob")


def test_cache_dir_is_outside_the_repo(monkeypatch, tmp_path):
    from pathlib import Path

    from oscar_ray import env

    monkeypatch.delenv("OSCAR_CACHE_DIR", raising=False)
    repo = Path(__file__).parents[2].resolve()
    assert repo not in env.cache_dir().resolve().parents
