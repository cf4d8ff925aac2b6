"""``hurray --version`` and ``hurray inspect`` start without importing what they do not use.

Counted in a fresh interpreter (not timed): which frameworks and how many of the
package's modules each command imports. ``import hurray_bridge`` imports its
public names on first use, so the command line pays only for the modules a
command needs.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

FRAMEWORKS = ("numpy", "torch", "jax", "pyarrow", "ml_dtypes", "scipy", "cupy", "tensorflow")

SCRIPT = """
import json, runpy, sys
before = set(sys.modules)
sys.argv = ["hurray", *json.loads(sys.argv[1])]
try:
    runpy.run_module("hurray_bridge", run_name="__main__")
except SystemExit as exc:
    status = exc.code
else:
    status = 0
new = sorted(set(sys.modules) - before)
print(json.dumps({"status": status, "modules": new}))
"""


def _imports(*argv: str) -> tuple[object, list[str]]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(argv)], check=True,
                         capture_output=True, text=True, timeout=120)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["status"], got["modules"]


def _frameworks(modules: list[str]) -> list[str]:
    return sorted({m.split(".")[0] for m in modules} & set(FRAMEWORKS))


def test_version_imports_no_framework_and_few_modules() -> None:
    status, modules = _imports("--version")
    assert status == 0
    assert _frameworks(modules) == []
    ours = [m for m in modules if m.startswith("hurray_bridge")]
    # the package, its errors, the descriptor codec (wire, descriptor, dtypes, layout and
    # the compiled decoder), the registry's names and the report formats; before, every
    # module of the package (29)
    assert len(ours) <= 12, ours
    assert "hurray_bridge.container" not in ours and "hurray_bridge.tensor" not in ours


@pytest.mark.parametrize("suffix", ["hurray", "safetensors"])
def test_inspect_imports_no_framework(tmp_path: pathlib.Path, suffix: str) -> None:
    np = pytest.importorskip("numpy")
    import hurray_bridge as hb
    from hurray_bridge import safetensors_io

    path = tmp_path / f"x.{suffix}"
    save = hb.save if suffix == "hurray" else safetensors_io.save
    save(path, {"w": np.ones((2, 3), np.float32)})
    status, modules = _imports("inspect", str(path))
    assert status == 0
    assert _frameworks(modules) == []
    ours = [m for m in modules if m.startswith("hurray_bridge")]
    # what reading a file's index takes (files.format, or the safetensors header), not the
    # loading (files.reading) and saving (files.writing, its plan and data writer) of files,
    # the conversion path, tensors, streams, shared memory...
    for unused in ("container", "files.reading", "files.writing", "files.plan", "files.engine",
                   "files.safetensors", "conversion", "tensor", "shards", "safetensors_io",
                   "stream", "shm", "quant", "adapters"):
        assert f"hurray_bridge.{unused}" not in ours, ours
    # before: 29, every module from the package's own to what hb.load needs (16 with the
    # files package's own __init__, which holds only its docstring)
    assert len(ours) <= 16, ours
    assert "socket" not in modules and "secrets" not in modules  # only saves need them


def test_the_package_import_is_small_and_every_public_name_resolves() -> None:
    script = ("import json, sys; before = set(sys.modules); import hurray_bridge as hb; "
              "new = sorted(m for m in set(sys.modules) - before if m.startswith('hurray')); "
              "names = [n for n in hb.__all__ if getattr(hb, n, None) is None]; "
              "print(json.dumps([new, names, sorted(dir(hb)) == sorted(hb.__all__)]))")
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True,
                         text=True, timeout=120)
    new, unresolved, dir_ok = json.loads(out.stdout.strip().splitlines()[-1])
    # the errors, and the descriptor codec (Descriptor.to_bytes works from the start), with
    # the DLPack table the descriptor names its default device type from (_dlpack)
    assert new == ["hurray_bridge", "hurray_bridge._dlpack", "hurray_bridge._source_tree",
                   "hurray_bridge._speedups", "hurray_bridge.descriptor", "hurray_bridge.dtypes",
                   "hurray_bridge.errors", "hurray_bridge.layout", "hurray_bridge.wire"] or (
        "hurray_bridge._speedups" not in new and len(new) == 8), new
    assert unresolved == []
    assert dir_ok
