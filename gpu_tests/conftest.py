"""CUDA suite set-up: skip cleanly without a GPU, and set JAX up before anything imports it.

Run on a machine with CUDA torch, JAX (CUDA plugin) and CuPy:
``pip install --no-deps --no-build-isolation -e . && python -m pytest gpu_tests``
(``gpu_tests/run.sh`` does that and more).

Nothing here imports CuPy or JAX at collection time: the frameworks are
imported by the session fixtures below, on first use.
"""

from __future__ import annotations

import os

# Both must be set before jax is imported anywhere in this process.
# JAX would otherwise reserve 75% of the GPU at start-up, starving torch and CuPy.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# 64-bit types round-trip bit-exactly only with x64 on (JAX narrows them silently otherwise,
# jax-ml/jax#11895); the ``jax`` fixture also turns it on in case jax was imported earlier.
os.environ.setdefault("JAX_ENABLE_X64", "1")

import importlib.metadata
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

_HERE = Path(__file__).resolve().parent


def _jax_has_cuda() -> bool:
    """Whether a CUDA build of JAX is installed, judged from distribution metadata only."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if re.fullmatch(r"jax-cuda\d+-(plugin|pjrt)", name):
            return True
        if name == "jaxlib" and "cuda" in (dist.version or ""):
            return True  # the old single-wheel jaxlib+cudaNN builds
    return False


def _why_skip() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install cupy-cuda12x or cupy-cuda13x)"
    if importlib.util.find_spec("jax") is None:
        return "JAX is not installed"
    if not _jax_has_cuda():
        return "JAX has no CUDA plugin installed (jax-cuda12-plugin / jax-cuda13-plugin)"
    return None


SKIP_REASON = _why_skip()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "multi_gpu: needs two or more CUDA devices")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"gpu_tests need a CUDA GPU with torch, JAX and CuPy: "
                                   f"{SKIP_REASON}")
    for item in items:
        if _HERE in Path(item.path).resolve().parents:
            item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if SKIP_REASON is not None:
        return [f"gpu_tests: skipped ({SKIP_REASON})"]
    import torch

    return [f"gpu_tests: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} device(s), "
            f"torch {torch.__version__} (CUDA {torch.version.cuda})"]


# ------------------------------------------------------------------- frameworks
@pytest.fixture(scope="session")
def torch() -> Any:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.fixture(scope="session")
def cupy() -> Any:
    cupy = pytest.importorskip("cupy")
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver/runtime mismatch and the like
        pytest.skip(f"CuPy cannot use CUDA here: {exc}")
    if n == 0:
        pytest.skip("CuPy sees no CUDA device")
    return cupy


@pytest.fixture(scope="session")
def jax() -> Any:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as exc:
        pytest.skip(f"JAX sees no GPU: {exc}")
    if not gpus:
        pytest.skip("JAX sees no GPU")
    return jax


@pytest.fixture(scope="session")
def n_gpus(torch: Any) -> int:
    return int(torch.cuda.device_count())


@pytest.fixture
def two_gpus(n_gpus: int) -> None:
    if n_gpus < 2:
        pytest.skip("single GPU")


@pytest.fixture(scope="session")
def fws(request: pytest.FixtureRequest) -> Any:
    """A factory: ``fws(name)`` -> the helper of framework ``name`` (skips if unusable)."""
    from gpu_tests import _fw

    cache: dict[str, Any] = {}

    def get(name: str) -> Any:
        if name not in cache:
            module = request.getfixturevalue(name)  # torch / jax / cupy fixture
            _fw.need_adapter(name)
            cache[name] = _fw.HELPERS[name](module)
        return cache[name]

    return get
