"""The example scripts run and succeed (streams and Ray have their own tests)."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib
from typing import Any

import pytest

from tests.frameworks import need

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _run(name: str) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_torch_to_jax_state_dict_crosses_zero_copy() -> None:
    need("torch", "jax")
    out = _run("torch_to_jax.py")
    assert "torch -> jax: 339/339 zero-copy" in out
    assert "jax -> torch: 339/339 zero-copy" in out
    assert "OK: every tensor crossed zero-copy" in out
    # timed on warm calls, as benchmarks/ times: a median over rounds, and a ratio
    timing = re.search(r"time per tensor, median of (\d+) warm rounds .* \(ratio ([\d.]+)\)", out)
    assert timing and int(timing[1]) >= 15 and 0 < float(timing[2]) < 100, out
    assert re.search(r"single 1000x64 float32 hand-off, median of \d+ warm rounds", out), out


def test_gpu_pipeline_says_why_it_does_not_run_without_cuda() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: the GPU suite runs gpu_pipeline.py for real")
    out = _run("gpu_pipeline.py")
    assert "CUDA" in out


def test_gpu_benchmark_says_why_it_does_not_run_without_cuda() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: gpu_tests/run.sh runs benchmarks.gpu_bench for real")
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_bench"], capture_output=True,
                         text=True, timeout=300, cwd=EXAMPLES.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no CUDA device" in out.stdout


def test_gpu_suite_skips_with_its_reason_and_imports_no_cupy_to_collect(tmp_path: Any) -> None:
    # Issue 10: on a machine without CUDA every GPU test skips and says why, and
    # collecting the suite imports neither CuPy nor JAX. A stand-in `cupy` package on
    # the path makes an import at collection time visible (CuPy is not installed here).
    torch = pytest.importorskip("torch", reason="torch is not installed")

    if torch.cuda.is_available():
        pytest.skip("CUDA is available: gpu_tests/run.sh runs the GPU suite for real")
    (tmp_path / "cupy").mkdir()
    (tmp_path / "cupy" / "__init__.py").write_text("raise ImportError('stand-in cupy imported')\n")
    (tmp_path / "collect_probe.py").write_text(
        "import json, sys\n"
        "def pytest_collection_finish(session):\n"
        "    print('LOADED', json.dumps(sorted(m for m in ('cupy', 'jax') if m in sys.modules)))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path), str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")]))
    # -n 0: in this process, where the probe looks (pyproject's addopts ask for workers).
    out = subprocess.run([sys.executable, "-m", "pytest", "gpu_tests", "-q", "-rs", "-p",
                          "collect_probe", "-p", "no:cacheprovider", "-n", "0"],
                         capture_output=True,
                         text=True, timeout=600, cwd=EXAMPLES.parent, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "LOADED []" in out.stdout, out.stdout[-3000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+ skipped in [\d.]+s( \(.*\))?", summary), summary
    assert int(summary.split()[0]) > 1000  # the whole suite was collected, not a part
    reasons = [ln for ln in out.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert reasons and all("no CUDA device" in ln for ln in reasons), reasons[:3]


def _readme_block(first_line: str) -> str:
    """The README's ```python block that starts with ``first_line``."""
    text = (EXAMPLES.parent / "README.md").read_text(encoding="utf-8")
    for block in re.findall(r"```python\n(.*?)```", text, flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"no README python block starts with {first_line!r}")


def test_readme_tour_runs_and_its_copy_false_line_raises() -> None:
    """The tour as written: every line runs, the copy=False one raises CopyRequiredError,
    and the line after it copies with a CopyWarning (run in a fresh interpreter)."""
    need("torch", "jax")
    block = _readme_block("import hurray_bridge as hb\nimport torch\n")
    lines = block.splitlines()
    at = next(i for i, ln in enumerate(lines) if "copy=False" in ln)
    assert "raises CopyRequiredError" in lines[at]
    code = "\n".join([
        "import warnings",
        *lines[:at],
        "try:",
        "    " + lines[at],
        "except hb.CopyRequiredError as exc:",
        "    print('raised:', exc)",
        "else:",
        "    raise SystemExit('the copy=False line did not raise')",
        "with warnings.catch_warnings(record=True) as caught:",
        "    warnings.simplefilter('always')",
        *["    " + ln for ln in lines[at + 1:]],
        "assert any(issubclass(w.category, hb.CopyWarning) for w in caught), caught",
        "print('ok')",
    ])
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "raised: JAX would have to copy" in res.stdout and res.stdout.endswith("ok\n")


def test_the_license_pyproject_names_is_there() -> None:
    root = EXAMPLES.parent
    with open(root / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (root / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_readme_arrow_lines_run_and_share_memory(tmp_path: pathlib.Path) -> None:
    """The README's Arrow/Parquet lines as written (in a fresh interpreter, in a scratch
    folder for the Parquet file); the line commented "True" is checked to be True."""
    need("pyarrow", "polars", "jax", "torch")
    block = _readme_block("import numpy as np, pyarrow as pa, pyarrow.parquet as pq")
    lines = [f"assert {ln.split('#')[0].strip()}" if ln.rstrip().endswith("# True, no copy")
             or "# True:" in ln else ln for ln in block.splitlines()]
    assert any(ln.startswith("assert ") for ln in lines), block
    code = "\n".join([*lines, "print('ok')"])
    # Run from the scratch folder: the checkout goes first on the path, as it is here.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(EXAMPLES.parent), os.environ.get("PYTHONPATH", "")) if p)}
    res = subprocess.run([sys.executable, "-W", "ignore::UserWarning", "-c", code],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.endswith("ok\n") and (tmp_path / "x.parquet").exists()
