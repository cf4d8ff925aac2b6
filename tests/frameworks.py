"""The frameworks a test may need, each optional: a test skips, never errors, without one.

Every framework is an extra (the core is stdlib-only), so no test module imports one
unguarded: it asks for it with :func:`need` (or ``pytest.importorskip``), or takes the
``backend`` fixture (``tests/conftest.py``), which runs once per framework and skips
the ones that are not installed.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import pytest

# hb.convert's target name -> the module that provides it.
MODULES = {"numpy": "numpy", "torch": "torch", "jax": "jax", "arrow": "pyarrow", "cupy": "cupy",
           "tensorflow": "tensorflow", "mlx": "mlx.core", "paddle": "paddle"}
# Module -> target name, for the registry's frameworks that cannot share a process.
_TARGETS = {m: t for t, m in MODULES.items()}


def not_installed(module: str) -> str:
    return f"{module} is not installed"


def apart(module: str) -> str | None:
    """Why ``module`` must not be imported into this process (a framework it cannot share
    one with is imported already: the registry's ``not_with``), or None."""
    from hurray_bridge._registry import kept_apart

    return kept_apart(_TARGETS.get(module, module))


def need(*frameworks: str) -> None:
    """Skip the calling test unless every framework named (target names) is installed and
    can share this process with the frameworks imported already."""
    for fw in frameworks:
        module = MODULES.get(fw, fw)
        why = apart(module)
        if why:
            pytest.skip(why)
        pytest.importorskip(module, reason=not_installed(module))


def optional(module: str) -> Any:
    """``module`` imported, or None when it is not installed or cannot share this process
    with a framework imported already (the tests needing it skip, through ``need``)."""
    if apart(module):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


@dataclass(frozen=True)
class Backend:
    """One framework as a test sees it: its target name, its module, and a way in and out."""

    name: str  # the target name hb.convert takes
    module: ModuleType
    array: Callable[[Any], Any]  # a native array holding a NumPy array's values
    values: Callable[[Any], Any]  # a native array's values, read back as a NumPy array


def _numpy() -> Backend:
    np = importlib.import_module("numpy")
    return Backend("numpy", np, lambda a: a, np.asarray)


def _torch() -> Backend:
    np = importlib.import_module("numpy")
    torch = importlib.import_module("torch")
    return Backend("torch", torch, lambda a: torch.from_numpy(np.ascontiguousarray(a)),
                   lambda x: x.numpy())


def _jax() -> Backend:
    np = importlib.import_module("numpy")
    jnp = importlib.import_module("jax.numpy")
    return Backend("jax", importlib.import_module("jax"), jnp.asarray, np.asarray)


def _arrow() -> Backend:
    np = importlib.import_module("numpy")
    pa = importlib.import_module("pyarrow")

    def array(a: Any) -> Any:  # Arrow arrays are flat; n-D data is a pa.Tensor
        a = np.ascontiguousarray(a)
        return pa.array(a) if a.ndim == 1 else pa.Tensor.from_numpy(a)

    def values(x: Any) -> Any:
        return x.to_numpy() if isinstance(x, pa.Tensor) else x.to_numpy(zero_copy_only=False)

    return Backend("arrow", pa, array, values)


def _cupy() -> Backend:
    cupy = importlib.import_module("cupy")
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver: CuPy imports but cannot reach a device
        devices = 0
    if not devices:
        pytest.skip("cupy needs a CUDA GPU")
    return Backend("cupy", cupy, cupy.asarray, cupy.asnumpy)


def _tensorflow() -> Backend:
    tf = importlib.import_module("tensorflow")
    return Backend("tensorflow", tf, tf.constant, lambda x: x.numpy())


def _mlx() -> Backend:
    np = importlib.import_module("numpy")
    mx = importlib.import_module("mlx.core")

    def array(a: Any) -> Any:  # dtype= named: MLX narrows float64 to float32 when it chooses
        a = np.asarray(a)
        return mx.array(a, dtype=getattr(mx, "bool_" if a.dtype == np.bool_ else a.dtype.name))

    return Backend("mlx", mx, array, lambda x: np.array(x))


def _paddle() -> Backend:
    np = importlib.import_module("numpy")
    paddle = importlib.import_module("paddle")
    return Backend("paddle", paddle, lambda a: paddle.to_tensor(np.ascontiguousarray(a)),
                   lambda x: x.numpy())


_BUILD = {"numpy": _numpy, "torch": _torch, "jax": _jax, "arrow": _arrow, "cupy": _cupy,
          "tensorflow": _tensorflow, "mlx": _mlx, "paddle": _paddle}

# CuPy only where it is installed: without it there is no GPU for it to use either, and a
# case that can never run on a CPU machine would be one more skip in every CPU run. Paddle
# (a large wheel, not in the test extra) likewise only where it is installed.
BACKENDS = ["numpy", "torch", "jax", "arrow", "tensorflow", "mlx"] + [
    fw for fw in ("cupy", "paddle") if importlib.util.find_spec(fw) is not None]


def backend(name: str) -> Backend:
    """The framework ``name`` (a target name), or a skip saying it is not installed."""
    need("numpy", name)  # every backend reads its values back through NumPy
    return _BUILD[name]()
