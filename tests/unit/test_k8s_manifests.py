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


# ---- RayServices: schema, one source of truth for serveConfigV2, GPU consistency -------------
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("k8s_render", REPO / "k8s" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)
RAYSERVICES = sorted(render.MANIFESTS.items())


def _gpus(container: dict) -> int:
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


@pytest.mark.parametrize("manifest,config", RAYSERVICES)
def test_rayservice_valid_and_serve_config_is_the_config_file(manifest, config):
    text = (REPO / manifest).read_text()
    m = yaml.safe_load(text)
    assert m["apiVersion"] == "ray.io/v1" and m["kind"] == "RayService"
    assert _errors(m, _schema("ray.io_rayservices.yaml")) == []
    cfg_text = (REPO / config).read_text()
    # byte for byte (comments included) what render.py writes, and the same YAML document
    assert render.render(text, cfg_text) == text, f"stale: run python k8s/render.py ({manifest})"
    assert yaml.safe_load(m["spec"]["serveConfigV2"]) == yaml.safe_load(cfg_text)


@pytest.mark.parametrize("manifest,config", RAYSERVICES)
def test_embedded_serve_config_passes_ray_and_our_schema(manifest, config):
    from ray.serve.schema import ServeDeploySchema

    from oscar_ray.deployments.builder import build_app
    from oscar_ray.deployments.config import ServeAppConfig

    m = yaml.safe_load((REPO / manifest).read_text())
    serve_cfg = yaml.safe_load(m["spec"]["serveConfigV2"])
    schema = ServeDeploySchema.model_validate(serve_cfg)
    assert len(schema.applications) == 1
    app = schema.applications[0]
    assert app.import_path == "oscar_ray.deployments.builder:app_builder"
    cfg = ServeAppConfig.model_validate(app.args)
    assert build_app(cfg) is not None  # engine config checked by the engine's own model where importable

    spec = m["spec"]["rayClusterConfig"]
    assert spec["enableInTreeAutoscaling"] is True
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert all(_gpus(c) == 0 for c in head["template"]["spec"]["containers"])
    (group,) = spec["workerGroupSpecs"]
    (worker,) = group["template"]["spec"]["containers"]
    # one replica's GPUs on one node fit one pod, and the group can hold max_replicas of them
    p = cfg.placement
    per_node = p.total_gpus // p.nnodes if p.total_gpus > 1 else int(cfg.replicas.num_gpus)
    assert 0 < per_node <= _gpus(worker)
    replicas_per_pod = _gpus(worker) // per_node
    max_replicas = cfg.autoscaling.max_replicas if cfg.autoscaling else cfg.replicas.num_replicas
    min_replicas = cfg.autoscaling.min_replicas if cfg.autoscaling else cfg.replicas.num_replicas
    assert group["maxReplicas"] * replicas_per_pod >= max_replicas * cfg.placement.nnodes
    assert group["minReplicas"] * replicas_per_pod >= min_replicas * cfg.placement.nnodes
    mounts = {v["mountPath"]: v["name"] for v in worker["volumeMounts"]}
    vols = {v["name"]: v for v in group["template"]["spec"]["volumes"]}
    assert vols[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "readinessProbe" in worker
    assert int(worker["resources"]["requests"]["cpu"]) >= cfg.replicas.num_cpus


def test_glm47_is_tp8_on_8_gpu_nodes():
    m = yaml.safe_load((REPO / "k8s/rayservice-glm47.yaml").read_text())
    (group,) = m["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert _gpus(group["template"]["spec"]["containers"][0]) == 8
    args = yaml.safe_load(m["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert args["placement"]["tp_size"] == 8 and args["engine"]["config"]["tp_size"] == 8


def test_render_replaces_only_the_block_and_detects_drift(tmp_path):
    text = (REPO / "k8s/rayservice-qwen3-8b.yaml").read_text()
    changed = (REPO / "configs/qwen3-8b.yaml").read_text().replace("max_replicas: 4", "max_replicas: 3")
    new = render.render(text, changed)
    assert new != text and "max_replicas: 3" in new
    assert yaml.safe_load(new)["spec"]["rayClusterConfig"] == yaml.safe_load(text)["spec"]["rayClusterConfig"]
    assert render.render(new, (REPO / "configs/qwen3-8b.yaml").read_text()) == text  # round trip
    with pytest.raises(ValueError, match="serveConfigV2"):
        render.render("kind: RayService\n", "a: 1\n")


def test_schema_check_rejects_a_broken_service():
    m = yaml.safe_load((REPO / "k8s/rayservice-glm47.yaml").read_text())
    m["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] = "on"
    m["spec"]["upgradeStrategy"]["clusterUpgradeOptions"] = {"maxSurgePercent": 50}  # misses required keys
    errors = _errors(m, _schema("ray.io_rayservices.yaml"))
    assert any("enableInTreeAutoscaling" in e for e in errors), errors
    assert any("gatewayClassName" in e for e in errors), errors
