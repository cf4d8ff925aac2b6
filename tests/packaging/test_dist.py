"""The sdist and the wheel that ``python -m build`` makes: what each holds, what its metadata
claims, and that the sdist builds offline into a wheel that imports, with a C compiler (the
compiled module inside) and without one (the same package in pure Python).

These run when asked: ``HURRAY_DIST`` names a folder holding ``python -m build --outdir``'s
one sdist and one wheel, and ``build-deps/``, the build backend's wheels (``pip download``
of pyproject's ``build-system.requires``). ``.ci/run`` makes it and runs this file; without
it every test here skips, saying so. The builds here run with ``--no-index``: nothing is
downloaded, as on a machine without network that has the build backend at hand.
"""

from __future__ import annotations

import email.parser
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
_DIST = os.environ.get("HURRAY_DIST")

pytestmark = pytest.mark.skipif(
    not _DIST,
    reason="packaging checks run when asked: HURRAY_DIST=<folder with python -m build's "
    "sdist and wheel, and build-deps/> (.ci/run sets it)",
)

# What a setuptools build says when the configuration is deprecated or leaves files out of
# the packages list; either is a finding, since the next setuptools major may refuse it.
_BUILD_WARNING = re.compile(r"Setuptools\w*Warning|is absent from the .?packages|deprecated")


def _one(pattern: str) -> pathlib.Path:
    assert _DIST is not None
    found = sorted(pathlib.Path(_DIST).glob(pattern))
    assert len(found) == 1, f"{_DIST} should hold one {pattern}, holds {found}"
    return found[0]


def _python_files(folder: pathlib.Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*.py")
            if "__pycache__" not in p.parts}


def _installed_files() -> set[str]:
    """The package as a wheel lays it out, read from the source tree: the core's modules, the
    adapters (``adapters/`` installs as ``hurray_bridge/adapters/``), py.typed and the stubs."""
    core = ROOT / "hurray_bridge"
    files = {f"hurray_bridge/{f}" for f in _python_files(core)}
    files |= {f"hurray_bridge/adapters/{f}" for f in _python_files(ROOT / "adapters")}
    files |= {f"hurray_bridge/{p.name}" for p in core.glob("*.pyi")}
    files.add("hurray_bridge/py.typed")
    return files


def _compiled_module() -> str:
    # The wheel is built by this interpreter (python -m build in .ci/run, pip wheel here).
    return f"hurray_bridge/_speedups{sysconfig.get_config_var('EXT_SUFFIX')}"


def _wheel_members(wheel: pathlib.Path) -> set[str]:
    with zipfile.ZipFile(wheel) as z:
        return set(z.namelist())


def _check_wheel_members(wheel: pathlib.Path, compiled: bool) -> None:
    members = _wheel_members(wheel)
    info = wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"
    expected = _installed_files() | {
        f"{info}/{name}" for name in ("METADATA", "WHEEL", "RECORD", "entry_points.txt",
                                      "top_level.txt", "licenses/LICENSE")}
    if compiled:
        expected.add(_compiled_module())
    assert members - expected == set(), f"{wheel.name} holds files it should not"
    assert expected - members == set(), f"{wheel.name} lacks files it should hold"


def test_the_wheel_holds_the_package_and_the_compiled_module_and_nothing_else() -> None:
    wheel = _one("*.whl")
    _check_wheel_members(wheel, compiled=True)
    # Spelled out, since the comparison above derives its list from the same tree.
    members = _wheel_members(wheel)
    assert not [m for m in members if m.endswith((".c", ".h"))], "C sources in the wheel"
    assert not [m for m in members if m.startswith(("tests/", "adapters/", "c/", "docs/"))]
    assert "hurray_bridge/_speedups.pyi" in members and "hurray_bridge/py.typed" in members


def _claimed_versions(classifiers: list[str]) -> list[tuple[int, int]]:
    prefix = "Programming Language :: Python :: 3."
    return sorted((3, int(c[len(prefix):])) for c in classifiers
                  if c.startswith(prefix) and c[len(prefix):].isdigit())


def _ci_versions() -> list[tuple[int, int]]:
    """The Pythons .ci/run runs the suite on: its default python3 and ``extra_pythons``."""
    script = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^extra_pythons=\(([^)]*)\)", script, re.M)
    assert m, ".ci/run should name its extra_pythons=(...)"
    default = subprocess.run(["python3", "-c", "import sys; print(*sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.split()
    versions = {(int(default[0]), int(default[1]))}
    versions |= {(int(v.split(".")[0]), int(v.split(".")[1])) for v in m.group(1).split()}
    return sorted(versions)


def test_the_metadata_claims_what_ci_tests() -> None:
    with zipfile.ZipFile(_one("*.whl")) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(name).decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["License"] is None, "the deprecated License field alongside the SPDX one"
    claimed = _claimed_versions(meta.get_all("Classifier") or [])
    assert claimed == _ci_versions(), "each Python the classifiers name is one CI tests"
    lowest = claimed[0]
    assert meta["Requires-Python"] == f">={lowest[0]}.{lowest[1]}"


def test_the_sdist_holds_what_a_build_needs_and_no_tests() -> None:
    sdist = _one("*.tar.gz")
    with tarfile.open(sdist) as t:
        top = sdist.name[: -len(".tar.gz")]
        members = {m.name[len(top) + 1:] for m in t.getmembers() if m.isfile()}
    needed = {"pyproject.toml", "setup.py", "README.md", "LICENSE", "PKG-INFO"}
    needed |= {f"hurray_bridge/{f}" for f in _python_files(ROOT / "hurray_bridge")}
    needed |= {f"adapters/{f}" for f in _python_files(ROOT / "adapters")}
    c_sources = ROOT / "hurray_bridge" / "_speedups_c"
    needed |= {p.relative_to(ROOT).as_posix() for p in c_sources.iterdir()}
    assert needed - members == set(), f"{sdist.name} lacks files a build needs"
    assert not [m for m in members if m.startswith(("tests/", "docs/", ".ci/", "fuzz/"))]


def _build_from_sdist(tmp: pathlib.Path, env_extra: dict[str, str]) -> tuple[pathlib.Path, str]:
    """``pip wheel`` of the sdist without an index: pip makes a fresh build environment and
    installs the backend from build-deps/ only. No configuration file is read, so the
    machine's pip settings (its wheel caches, its indexes) are out of play."""
    assert _DIST is not None
    deps = pathlib.Path(_DIST) / "build-deps"
    assert deps.is_dir(), f"{deps}: the build backend's wheels (pip download) are missing"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "PIP_CONFIG_FILE": os.devnull,
           "TMPDIR": str(tmp), **env_extra}
    out = tmp / "wheel"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-index",
         "--find-links", str(deps), "--wheel-dir", str(out), str(_one("*.tar.gz"))],
        env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, log[-4000:]
    return wheels[0], log


def _import_in_isolation(tmp: pathlib.Path, wheel: pathlib.Path) -> str:
    """Install the wheel into a bare folder and import it from there, with no site-packages
    (``-S``: not this environment's editable install) and the working directory away from
    the source tree; returns what the child printed."""
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(site), str(wheel)],
                   env={**os.environ, "PIP_CONFIG_FILE": os.devnull}, check=True,
                   capture_output=True, timeout=300)
    code = ("import hurray_bridge as hb, hurray_bridge._exchange as x;"
            "d = hb.Descriptor([2, 3], hb.float32);"
            "assert hb.Descriptor.from_bytes(d.to_bytes()) == d;"
            "print(hb.__file__, x.compiled)")
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp, capture_output=True,
                          text=True, env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site)},
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    where, installed = proc.stdout.split()
    assert pathlib.Path(where).is_relative_to(site), f"imported {where}, not the wheel's copy"
    cli = subprocess.run([sys.executable, "-S", "-m", "hurray_bridge", "--version"], cwd=tmp,
                         capture_output=True, text=True, timeout=120,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(site)})
    assert cli.returncode == 0 and cli.stdout.strip(), cli.stderr[-2000:]
    return installed


def test_the_sdist_builds_offline_with_a_c_compiler(tmp_path: pathlib.Path) -> None:
    wheel, log = _build_from_sdist(tmp_path, {})
    assert not _BUILD_WARNING.findall(log), "the build backend warned:\n" + "\n".join(
        ln for ln in log.splitlines() if _BUILD_WARNING.search(ln))
    _check_wheel_members(wheel, compiled=True)
    assert _import_in_isolation(tmp_path, wheel) == "True"


def test_the_sdist_builds_offline_without_a_c_compiler(tmp_path: pathlib.Path) -> None:
    # A compiler that is not there: setup.py's Extension is optional, so the build goes on
    # and the package runs the same steps in Python.
    missing = str(tmp_path / "no-such-compiler" / "cc")
    wheel, log = _build_from_sdist(tmp_path, {"CC": missing, "LDSHARED": f"{missing} -shared"})
    assert "no-such-compiler" in log, "the build did not try the missing compiler"
    _check_wheel_members(wheel, compiled=False)
    assert _import_in_isolation(tmp_path, wheel) == "False"
