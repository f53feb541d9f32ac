"""KubeRay manifests validate against the CRD schemas shipped in shared/kuberay-crds/."""

import copy
import os
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).parents[2]
CRDS = Path(os.environ.get("OSCAR_KUBERAY_CRDS", REPO.parent / "shared" / "kuberay-crds"))
jsonschema = pytest.importorskip("jsonschema")


def _schema(kind_file: str) -> dict:
    path = CRDS / kind_file
    if not path.is_file():
        pytest.skip(f"KubeRay CRDs not found at {CRDS} (set OSCAR_KUBERAY_CRDS)")
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    return version["schema"]["openAPIV3Schema"]


def _errors(manifest: dict, schema: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(manifest)]


def test_calibration_rayjob_is_valid():
    manifest = yaml.safe_load((REPO / "k8s/rayjob-calibrate-glm47.yaml").read_text())
    assert manifest["apiVersion"] == "ray.io/v1" and manifest["kind"] == "RayJob"
    assert _errors(manifest, _schema("ray.io_rayjobs.yaml")) == []
    # the job runs the config file that the dry-run test checks
    assert "configs/calib/glm47.yaml" in manifest["spec"]["entrypoint"]
    assert (REPO / "configs/calib/glm47.yaml").is_file()
    workers = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    gpus = workers["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    cfg = yaml.safe_load((REPO / "configs/calib/glm47.yaml").read_text())
    assert int(gpus) == cfg["gpus_per_worker"] and workers["replicas"] == cfg["workers"]


def test_schema_check_rejects_a_broken_job():
    manifest = yaml.safe_load((REPO / "k8s/rayjob-calibrate-glm47.yaml").read_text())
    broken = copy.deepcopy(manifest)
    broken["spec"]["shutdownAfterJobFinishes"] = "yes"
    broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    errors = _errors(broken, _schema("ray.io_rayjobs.yaml"))
    assert any("shutdownAfterJobFinishes" in e for e in errors) and any("replicas" in e for e in errors), errors
