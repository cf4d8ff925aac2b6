"""The typed API as a user's type checker sees it: ``user_code.py`` beside this file
under ``mypy --strict`` and under pyright's strict mode, each in a child process, and
then run, so that the types it expects are the ones the calls return.

The package is checked as a wheel lays it out (``adapters/`` as
``hurray_bridge/adapters/``, see ``[tool.setuptools.package-dir]``): in a source checkout
there is no ``hurray_bridge/adapters/`` for a type checker to find, and an editable
install reaches it through an import hook, which type checkers do not run. As for any
installed package, what the tools report is about the user's file only (mypy:
``follow_imports = silent``; pyright: the file is the one it includes).

A negative control keeps each tool honest: the same file with one wrong expectation
must fail, on that line.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks import need

need("numpy", "torch", "jax")  # user_code.py uses all three, and so do its expected types

ROOT = Path(__file__).resolve().parents[2]
USER_CODE = Path(__file__).with_name("user_code.py")
# What each tool must refuse: torch.Tensor where hb.convert(..., "jax") gives a jax.Array.
WRONG = ('\n\ndef wrong() -> None:\n'
         '    assert_type(hb.convert(torch.zeros(1), "jax"), torch.Tensor)\n')
TIMEOUT = 600  # a cold mypy run reads torch's and JAX's annotations: 20-60 s here


def _package_files(folder: str, names: list[str]) -> list[str]:
    """shutil.copytree's ``ignore``: keep folders, sources, stubs and py.typed (no build
    outputs: a type checker reads _speedups.pyi, not the compiled module)."""
    return [n for n in names
            if not (n.endswith((".py", ".pyi")) or n == "py.typed"
                    or (n != "__pycache__" and os.path.isdir(os.path.join(folder, n))))]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package as the wheel installs it."""
    out = tmp_path_factory.mktemp("site")
    shutil.copytree(ROOT / "hurray_bridge", out / "hurray_bridge", ignore=_package_files)
    shutil.copytree(ROOT / "adapters", out / "hurray_bridge" / "adapters",
                    ignore=_package_files)
    return out


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy_cache")  # shared: the second run reads torch once


def _user_file(folder: Path, extra: str = "") -> tuple[Path, int]:
    """user_code.py (plus ``extra``) in ``folder``, and the 1-based number of its last line."""
    text = USER_CODE.read_text() + extra
    path = folder / "user_code.py"
    path.write_text(text)
    return path, text.count("\n")


def _mypy(site: Path, cache: Path, folder: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (the test extra installs it)")
    config = folder / "mypy.ini"
    config.write_text("[mypy]\n")  # the user's settings, not this project's pyproject.toml
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--strict",
         "--follow-imports=silent", "--cache-dir", str(cache), "--no-error-summary",
         "user_code.py"],
        cwd=folder, env={**os.environ, "MYPYPATH": str(site)}, capture_output=True,
        text=True, timeout=TIMEOUT)


def _pyright(site: Path, folder: Path) -> tuple[int, list[dict[str, Any]], str]:
    """pyright's exit status, its diagnostics and its raw output."""
    if importlib.util.find_spec("pyright") is not None:
        command = [sys.executable, "-m", "pyright"]
    elif shutil.which("pyright"):
        command = [str(shutil.which("pyright"))]
    else:
        pytest.skip("pyright is not installed (the test extra installs pyright[nodejs], which "
                    "brings its own Node.js)")
    config = folder / "pyrightconfig.json"
    config.write_text(json.dumps({"include": ["user_code.py"], "extraPaths": [str(site)],
                                  "typeCheckingMode": "strict"}))
    done = subprocess.run(
        [*command, "--outputjson", "--pythonpath", sys.executable, "-p", str(config)],
        cwd=folder, env={**os.environ, "PYRIGHT_PYTHON_IGNORE_WARNINGS": "1"},
        capture_output=True, text=True, timeout=TIMEOUT)
    try:
        diagnostics = json.loads(done.stdout)["generalDiagnostics"]
    except (ValueError, KeyError):
        pytest.fail(f"pyright gave no report (exit {done.returncode}):\n{done.stdout}"
                    f"\n{done.stderr}")
    return done.returncode, diagnostics, done.stdout


def test_mypy_strict_accepts_the_user_code(site: Path, mypy_cache: Path,
                                           tmp_path: Path) -> None:
    _user_file(tmp_path)
    done = _mypy(site, mypy_cache, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "", done.stdout


def test_mypy_strict_refuses_a_wrong_expectation(site: Path, mypy_cache: Path,
                                                 tmp_path: Path) -> None:
    _, last = _user_file(tmp_path, WRONG)
    done = _mypy(site, mypy_cache, tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f'user_code.py:{last}: error: Expression is of type "Array", not "Tensor"  '
        "[assert-type]"], done.stdout


def test_pyright_strict_accepts_the_user_code(site: Path, tmp_path: Path) -> None:
    _user_file(tmp_path)
    code, diagnostics, out = _pyright(site, tmp_path)
    assert code == 0 and diagnostics == [], out


def test_pyright_strict_refuses_a_wrong_expectation(site: Path, tmp_path: Path) -> None:
    _, last = _user_file(tmp_path, WRONG)
    code, diagnostics, out = _pyright(site, tmp_path)
    assert code == 1, out
    found = [(d["rule"], d["range"]["start"]["line"] + 1) for d in diagnostics]
    assert found == [("reportAssertTypeFailure", last)], out


def test_the_user_code_runs_and_its_types_hold(tmp_path: Path) -> None:
    from tests.typing import user_code

    user_code.main(tmp_path)  # its isinstance checks: the declared types are the real ones
