"""Typical user code, as a user's type checker sees hurray_bridge.

tests/typing/test_typing.py checks this file with ``mypy --strict`` and with pyright's
strict mode: each ``assert_type`` is an expectation both tools check (a mismatch is an
error), so the file is the typed API's specification by example. The test also runs
:func:`main`, whose ``isinstance`` checks hold the same types to what the calls return.

Not here: CuPy (no GPU in CI; its results are ``Any``, as are Arrow's, since neither
framework ships type information) and the Arrow adapter's ``from_hurray`` (its
``pyarrow`` types are unknown to pyright's strict mode without pyarrow stubs).
"""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any, assert_type

import jax
import numpy as np
import numpy.typing as npt
import torch

import hurray_bridge as hb
from hurray_bridge.adapters.jax import from_hurray as jax_from_hurray
from hurray_bridge.adapters.numpy import from_hurray as numpy_from_hurray
from hurray_bridge.adapters.torch import from_hurray as torch_from_hurray
from hurray_bridge.container import TensorFile


def torch_to_jax_and_back() -> None:
    w = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    j = hb.convert(w, "jax")
    assert_type(j, jax.Array)
    n = hb.convert(j, "numpy")
    assert_type(n, npt.NDArray[Any])
    back = hb.convert(n, "torch", copy=True)
    assert_type(back, torch.Tensor)
    assert isinstance(j, jax.Array) and isinstance(n, np.ndarray)
    assert isinstance(back, torch.Tensor) and bool((back == w).all())
    # Every parameter by name, and the aliases of the target names.
    assert_type(hb.convert(np.ones(3), "pytorch", device="cpu", copy=None, densify=False),
                torch.Tensor)
    assert_type(hb.convert(w, "np", copy=False), npt.NDArray[Any])
    assert_type(hb.convert(j, "jax", None, None), jax.Array)
    assert_type(hb.convert(w, "arrow"), Any)


def to_any(x: torch.Tensor, target: str) -> Any:
    return assert_type(hb.convert(x, target), Any)  # a target named at run time: Any


def hurray_tensors() -> None:
    w = np.arange(6.0)
    t = hb.asarray(w)
    assert_type(t, hb.Tensor | hb.ShardedTensor)
    assert isinstance(t, hb.Tensor)  # one device: a Tensor (narrows the type, too)
    shape: tuple[int, ...] = t.shape
    assert shape == (6,)
    d = hb.from_dlpack(torch.zeros(2, 3), copy=True)
    assert_type(d, hb.Tensor)
    assert_type(torch_from_hurray(d), torch.Tensor)
    assert_type(jax_from_hurray(d), jax.Array)
    assert_type(numpy_from_hurray(d), npt.NDArray[Any])
    assert isinstance(numpy_from_hurray(d), np.ndarray)


def files(folder: Path) -> None:
    a, b = folder / "a.hurray", folder / "b.hurray"
    hb.save(a, {"w": torch.ones(3)}, metadata={"epoch": "3"})
    hb.save(str(b), {"v": np.zeros(2)})
    f = hb.load(a)
    assert_type(f, TensorFile)
    assert f.metadata == {"epoch": "3"}
    with hb.load(str(a), mmap=False, verify=True) as g:
        assert_type(g["w"], hb.Tensor | hb.ShardedTensor)
    # Several files: a list of str or of Path, a tuple, any sequence.
    names: list[str] = [str(a), str(b)]
    paths: list[Path] = [a, b]
    for many in (hb.load(names), hb.load(paths), hb.load((a, str(b))), hb.load(deque(paths))):
        assert sorted(many) == ["v", "w"]
    raw: bytes = hb.dumps({"w": np.ones(2)})
    assert_type(hb.loads(raw, copy=True), TensorFile)


def errors() -> None:
    s = torch.arange(16.0).reshape(4, 4)[:, ::2]  # gaps between elements: JAX takes none
    try:
        hb.convert(s, "jax", copy=False)
    except hb.CopyRequiredError as exc:
        assert_type(exc, hb.CopyRequiredError)
        assert isinstance(exc, hb.HurrayError) and isinstance(exc, BufferError)
    else:
        raise AssertionError("copy=False was not refused")
    try:
        hb.convert(s, "theano")
    except hb.UnsupportedError as exc:
        assert "unknown target" in str(exc)


def main(folder: Path) -> None:
    torch_to_jax_and_back()
    assert isinstance(to_any(torch.zeros(2), "numpy"), np.ndarray)
    hurray_tensors()
    files(folder)
    errors()
