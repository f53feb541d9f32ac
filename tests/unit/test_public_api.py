"""The public names re-exported from `oscar_ray` resolve, and importing the package stays free of
heavy imports (the GPU image has no pydantic or ray; `import oscar_ray.quant` must work there)."""

import subprocess
import sys

import oscar_ray


def test_every_export_resolves_to_the_object_of_its_module():
    import importlib

    for name, module in oscar_ray._EXPORTS.items():
        assert getattr(oscar_ray, name) is getattr(importlib.import_module(module), name), name


def test_unknown_name_is_an_attribute_error():
    try:
        oscar_ray.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_bare_import_loads_no_torch_pydantic_or_ray():
    code = ("import sys, oscar_ray; bad = [m for m in ('torch', 'pydantic', 'ray') if m in sys.modules]; "
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "", f"import oscar_ray pulled in {out.strip()}"
