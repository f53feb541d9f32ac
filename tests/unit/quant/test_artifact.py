import json

import pytest
import torch

from oscar_ray.quant import ModelGeometry, RotationSet, fit_rotation


def _set(n_layers=3, d=16, per_head=0) -> RotationSet:
    shape = (n_layers, per_head, d, d) if per_head else (n_layers, d, d)
    def rot():
        a = torch.randn(*shape[:-2], d, d, dtype=torch.float64)
        return torch.linalg.qr(a)[0]
    return RotationSet(rot(), rot(), torch.randn(shape[:-1]), torch.randn(shape[:-1]),
                       torch.full((n_layers,), 0.96), torch.full((n_layers,), 0.92),
                       manifest={"model_id": "test/model", "architecture": "LlamaForCausalLM", "n_kv_heads": 2,
                                 "token_count": 1234, "data_source": "austen:emma"})


@pytest.mark.parametrize("per_head", [0, 2])
def test_round_trip(tmp_path, seed, per_head):
    rs = _set(per_head=per_head)
    digest = rs.save(tmp_path / "a")
    back = RotationSet.load(tmp_path / "a", expect=ModelGeometry(3, 2, 16))
    for name in ("k_rotation", "v_rotation", "k_eigenvalues", "v_eigenvalues", "k_clip", "v_clip"):
        assert torch.equal(getattr(back, name), getattr(rs, name))
    assert back.sha256 == digest and back.per_kv_head == bool(per_head)
    assert back.manifest["token_count"] == 1234
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".tmp")]
    # deterministic bytes: saving the same content again gives the same hash
    assert _copy(rs).save(tmp_path / "b") == digest


def _copy(rs: RotationSet) -> RotationSet:
    return RotationSet(rs.k_rotation.clone(), rs.v_rotation.clone(), rs.k_eigenvalues.clone(),
                       rs.v_eigenvalues.clone(), rs.k_clip.clone(), rs.v_clip.clone(),
                       manifest={k: v for k, v in rs.manifest.items() if k != "sha256"})


def test_corrupted_tensor_file_is_rejected(tmp_path, seed):
    _set().save(tmp_path)
    f = tmp_path / "rotations.safetensors"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    before = f.read_bytes()
    with pytest.raises(ValueError, match="'sha256'.*corrupted"):
        RotationSet.load(tmp_path)
    assert f.read_bytes() == before  # a failed load leaves the artifact untouched


@pytest.mark.parametrize("geometry,field", [(ModelGeometry(4, 2, 16), "n_layers"), (ModelGeometry(3, 2, 32), "head_dim"),
                                            (ModelGeometry(3, 8, 16), "n_kv_heads")])
def test_mismatched_model_is_rejected(tmp_path, seed, geometry, field):
    _set().save(tmp_path)
    with pytest.raises(ValueError, match=f"{field} is"):
        RotationSet.load(tmp_path, expect=geometry)


@pytest.mark.parametrize("edit,field", [(lambda m: m.pop("head_dim"), "head_dim"),
                                        (lambda m: m.update(format_version=9), "format_version"),
                                        (lambda m: m.update(n_layers="3"), "n_layers"),
                                        (lambda m: m.update(head_dim=32), "head_dim")])
def test_bad_manifest_names_the_field(tmp_path, seed, edit, field):
    _set().save(tmp_path)
    mpath = tmp_path / "manifest.json"
    manifest = json.loads(mpath.read_text())
    edit(manifest)
    mpath.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match=field):
        RotationSet.load(tmp_path)


def test_missing_files_and_bad_shapes(tmp_path):
    with pytest.raises(ValueError, match="missing manifest.json"):
        RotationSet.load(tmp_path)
    with pytest.raises(ValueError, match="k_clip"):
        RotationSet(torch.eye(8)[None], torch.eye(8)[None], torch.ones(1, 8), torch.ones(1, 8), torch.ones(2),
                    torch.ones(1))


def _zoo_file(path, rotations, eigenvalues, version, objective, str_keys=False, heads_dict=False):
    layers = {}
    for i, (r, e) in enumerate(zip(rotations, eigenvalues)):
        key = str(i) if str_keys else i
        if heads_dict:
            layers[key] = {"layer_id": i, "heads": {h: {"rotation": r[h], "eigenvalues": e[h]} for h in range(r.shape[0])}}
        else:
            layers[key] = {"layer_id": i, "rotation": r, "eigenvalues": e}
    torch.save({"format_version": version, "objective": objective, "source_grouping": "layer", "layers": layers}, path)


def test_from_rotationzoo_v1(tmp_path, seed):
    c = [torch.randn(64, 16, dtype=torch.float64) for _ in range(2)]
    fits = [fit_rotation(x.T @ x) for x in c]
    rots = [r.float() for r, _ in fits]
    eigs = [e.float() for _, e in fits]
    _zoo_file(tmp_path / "k_rotation_qqt_r_h_pbr.pt", rots, eigs, 1, "qqt_r_h_pbr")
    _zoo_file(tmp_path / "v_rotation_sst_r_h_pbr.pt", rots[::-1], eigs[::-1], 1, "sst_r_h_pbr", str_keys=True)
    rs = RotationSet.from_rotationzoo(tmp_path / "k_rotation_qqt_r_h_pbr.pt", tmp_path / "v_rotation_sst_r_h_pbr.pt",
                                      model_id="Qwen/Qwen3-8B", n_kv_heads=8)
    assert torch.equal(rs.k_rotation[1], rots[1]) and torch.equal(rs.v_rotation[0], rots[1])
    assert rs.k_clip.tolist() == pytest.approx([0.96, 0.96]) and rs.manifest["n_kv_heads"] == 8
    rs.save(tmp_path / "art")
    assert RotationSet.load(tmp_path / "art", expect=ModelGeometry(2, 8, 16)).manifest["objective"] == "qqt_r_h_pbr+sst_r_h_pbr"


@pytest.mark.parametrize("heads_dict", [False, True])
def test_from_rotationzoo_v2_per_head(tmp_path, seed, heads_dict):
    rots = [torch.linalg.qr(torch.randn(3, 8, 8))[0] for _ in range(2)]
    eigs = [torch.randn(3, 8) for _ in range(2)]
    for name in ("k.pt", "v.pt"):
        _zoo_file(tmp_path / name, rots, eigs, 2, "qqt_r_h_pbr", heads_dict=heads_dict)
    rs = RotationSet.from_rotationzoo(tmp_path / "k.pt", tmp_path / "v.pt")
    assert rs.per_kv_head and rs.k_rotation.shape == (2, 3, 8, 8) and rs.n_kv_heads == 3
    assert torch.equal(rs.k_rotation[1, 2], rots[1][2])


def test_rotationzoo_bad_files(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        RotationSet.from_rotationzoo(tmp_path / "nope.pt", tmp_path / "nope.pt")
    torch.save({"format_version": 3, "layers": {}}, tmp_path / "v3.pt")
    with pytest.raises(ValueError, match="format_version 3"):
        RotationSet.from_rotationzoo(tmp_path / "v3.pt", tmp_path / "v3.pt")
    _zoo_file(tmp_path / "gap.pt", [torch.eye(4)] * 2, [torch.ones(4)] * 2, 1, "x")
    state = torch.load(tmp_path / "gap.pt")
    state["layers"][5] = state["layers"].pop(1)
    torch.save(state, tmp_path / "gap.pt")
    with pytest.raises(ValueError, match="0..L-1"):
        RotationSet.from_rotationzoo(tmp_path / "gap.pt", tmp_path / "gap.pt")
