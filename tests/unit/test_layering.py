"""Imports only point down the layers of ARCHITECTURE.md; quant/kernels import with torch+triton alone."""

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).parents[2] / "oscar_ray"
# rank of each top-level unit; a module may import units of lower or equal rank (same unit).
RANK = {"_defaults": 0, "env": 0, "assets": 0, "config": 0, "quant": 1, "kernels": 2, "cache": 3, "models": 4,
        "engines": 5, "deployments": 6, "calib_jobs": 6, "cli": 7, "__init__": 7}
SIBLINGS_APART = {("deployments", "calib_jobs"), ("calib_jobs", "deployments")}
# quant/kernels run on the GPU image: torch, triton, safetensors, numpy and the standard library only
LIGHT_ALLOWED = {"torch", "triton", "safetensors", "numpy"}


def _unit(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def _imports(path: Path) -> list[str]:
    """Absolute module names imported by `path` (relative imports resolved), skipping TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text())
    pkg_parts = ["oscar_ray", *path.relative_to(PKG).parent.parts]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
                out += [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                out.append(node.module)
    return out


def test_no_upward_imports():
    problems = []
    for path in PKG.rglob("*.py"):
        me = _unit(path)
        for mod in _imports(path):
            if not mod.startswith("oscar_ray.") or mod == "oscar_ray":
                continue
            other = mod.split(".")[1]
            if other not in RANK:
                problems.append(f"{path}: unknown unit {other}")
            elif RANK[other] > RANK[me] or (me, other) in SIBLINGS_APART:
                problems.append(f"{path.relative_to(PKG)} ({me}) imports {mod} ({other})")
    assert not problems, "\n".join(problems)


def test_light_layers_import_only_torch_stack():
    problems = []
    for unit in ("quant", "kernels"):
        for path in (PKG / unit).rglob("*.py"):
            for mod in _imports(path):
                top = mod.split(".")[0]
                if top == "oscar_ray":
                    if mod.split(".")[1] not in ("quant", "kernels", "_defaults", "env"):
                        problems.append(f"{path}: {mod}")
                elif top not in LIGHT_ALLOWED and top not in sys.stdlib_module_names:
                    problems.append(f"{path}: third-party {mod}")
    assert not problems, "\n".join(problems)


def test_quant_and_kernels_import_without_pydantic_ray_sglang():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pydantic', 'ray', 'sglang', 'transformers', 'yaml', 'httpx'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import oscar_ray.quant, oscar_ray.kernels\n"
        "from oscar_ray import RotationSet, hadamard\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_layering_check_catches_a_violation(tmp_path, monkeypatch):
    # The checker itself must fail on an upward import (guards against a test that cannot fail).
    bad = PKG / "quant" / "_layering_probe.py"
    bad.write_text("from ..deployments import something\n")
    try:
        try:
            test_no_upward_imports()
        except AssertionError as e:
            assert "_layering_probe" in str(e)
        else:
            raise AssertionError("upward import was not detected")
    finally:
        bad.unlink()
