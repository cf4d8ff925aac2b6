"""The example scripts run and succeed (streams and Ray have their own tests)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def _run(name: str) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_torch_to_jax_state_dict_crosses_zero_copy() -> None:
    out = _run("torch_to_jax.py")
    assert "torch -> jax: 339/339 zero-copy" in out
    assert "jax -> torch: 339/339 zero-copy" in out
    assert "OK: every tensor crossed zero-copy" in out


def test_gpu_pipeline_says_why_it_does_not_run_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():  # the GPU suite runs it for real
        return
    out = _run("gpu_pipeline.py")
    assert "CUDA" in out


def test_gpu_benchmark_says_why_it_does_not_run_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():  # gpu_tests/run.sh runs it for real
        return
    out = subprocess.run([sys.executable, "-m", "benchmarks.gpu_bench"], capture_output=True,
                         text=True, timeout=300, cwd=EXAMPLES.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no CUDA device" in out.stdout
