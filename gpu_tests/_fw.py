"""One helper per framework for the CUDA suite: make a device array from host data,
read it back bit-exactly, take its data pointer, and make the views it supports.

The frameworks are passed in (from the session fixtures); nothing here imports
them, so collecting the suite imports neither CuPy nor JAX.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

import hurray_bridge as hb
from hurray_bridge.dtypes import DType, Tier, all_dtypes

FRAMEWORKS = ("torch", "jax", "cupy")
PAIRS = [(a, b) for a in FRAMEWORKS for b in FRAMEWORKS]
# Every type the table marks Tier 1: bool8, int8..64, uint8..64, float16, bfloat16,
# float32, float64, complex64, complex128.
TIER1: list[DType] = [d for d in all_dtypes() if d.tier == Tier.ONE]

# name -> (shape of the base array, view applied to it)
LAYOUTS: dict[str, tuple[tuple[int, ...], str | None]] = {
    "0": ((0,), None),
    "3x0x5": ((3, 0, 5), None),
    "rank0": ((), None),
    "17x33": ((17, 33), None),
    "transposed": ((17, 33), "T"),
    "step": ((17, 33), "step"),  # rows 1, 3, ...; every third column: gaps and an offset
}

_SAME_SIZE_INT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def need_adapter(name: str) -> None:
    """Skip unless ``hurray_bridge.adapters.<name>`` exists and imports."""
    if importlib.util.find_spec(f"hurray_bridge.adapters.{name}") is None:
        pytest.skip(f"hurray_bridge.adapters.{name} is not in this tree yet")
    hb.get_adapter(name)  # an ImportError here is a real failure


def np_dtype(d: DType) -> np.dtype:
    return hb.get_adapter("numpy").native_dtype(d)


def apply_view(a: Any, view: str | None) -> Any:
    """The same view on a NumPy, torch or CuPy array (all spell it alike)."""
    if view is None:
        return a
    if view == "T":
        return a.T
    if view == "step":
        return a[1::2, ::3]
    raise ValueError(view)


def reference(d: DType, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Random host data of type ``d``: random bits for numbers (NaN payloads included)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape, dtype=np.int64))
    dt = np_dtype(d)
    if d.name == "bool8":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    raw = rng.integers(0, 256, size=n * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape)


def same_bits(host: np.ndarray, expected: np.ndarray) -> bool:
    return (host.shape == expected.shape and host.dtype == expected.dtype
            and np.ascontiguousarray(host).tobytes() == np.ascontiguousarray(expected).tobytes())


class _Framework:
    """What every helper answers the same way, from the framework's adapter."""

    name: str

    def native_dtype(self, d: DType) -> Any:
        return hb.get_adapter(self.name).native_dtype(d)

    def supports(self, d: DType) -> bool:
        try:
            self.native_dtype(d)
        except (hb.UnsupportedError, hb.BackendNotAvailableError):
            return False
        return True


class Torch(_Framework):
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.m = torch
        self._int = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def from_numpy(self, a: np.ndarray) -> Any:
        a = np.ascontiguousarray(a)
        if a.dtype.itemsize not in _SAME_SIZE_INT:  # complex128
            return self.m.from_numpy(a).to("cuda:0")
        # Through a same-size integer: torch.from_numpy knows neither bfloat16 (ml_dtypes)
        # nor every unsigned type on every version.
        raw = self.m.from_numpy(a.view(_SAME_SIZE_INT[a.dtype.itemsize])).to("cuda:0")
        return raw.view(self.native_dtype(hb.get_adapter("numpy").dtype_of(a.dtype)))

    def to_numpy(self, x: Any, dt: np.dtype) -> np.ndarray:
        if dt.itemsize not in _SAME_SIZE_INT:
            return x.cpu().numpy()
        return x.view(self._int[dt.itemsize]).cpu().numpy().view(dt)

    def ptr(self, x: Any) -> int:
        return int(x.data_ptr())

    def is_native(self, x: Any) -> bool:
        return isinstance(x, self.m.Tensor) and x.is_cuda

    def dtype_matches(self, x: Any, d: DType) -> bool:
        return x.dtype == self.native_dtype(d)

    def device_index(self, x: Any) -> int:
        return int(x.device.index)

    def make(self, ref: np.ndarray, view: str | None) -> Any:
        return apply_view(self.from_numpy(ref), view)


class Jax(_Framework):
    name = "jax"

    def __init__(self, jax: Any) -> None:
        self.m = jax
        self.gpu = jax.devices("gpu")[0]

    def from_numpy(self, a: np.ndarray) -> Any:
        x = self.m.device_put(np.ascontiguousarray(a), self.gpu)
        x.block_until_ready()
        return x

    def to_numpy(self, x: Any, dt: np.dtype) -> np.ndarray:
        return np.asarray(x)

    def ptr(self, x: Any) -> int:
        return int(x.unsafe_buffer_pointer())

    def is_native(self, x: Any) -> bool:
        return isinstance(x, self.m.Array) and x.devices() == {self.gpu}

    def dtype_matches(self, x: Any, d: DType) -> bool:
        return np.dtype(x.dtype) == np.dtype(self.native_dtype(d))

    def device_index(self, x: Any) -> int:
        (dev,) = x.devices()
        return int(dev.local_hardware_id)

    def make(self, ref: np.ndarray, view: str | None) -> Any:
        # JAX has no views: the "view" is a fresh compact array holding the view's values.
        return self.from_numpy(apply_view(ref, view))


class Cupy(_Framework):
    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.m = cupy

    def from_numpy(self, a: np.ndarray) -> Any:
        a = np.ascontiguousarray(a)
        with self.m.cuda.Device(0):
            if a.dtype.itemsize not in _SAME_SIZE_INT:
                return self.m.asarray(a)
            return self.m.asarray(a.view(_SAME_SIZE_INT[a.dtype.itemsize])).view(a.dtype)

    def to_numpy(self, x: Any, dt: np.dtype) -> np.ndarray:
        if dt.itemsize not in _SAME_SIZE_INT:
            return self.m.asnumpy(x)
        return self.m.asnumpy(x.view(_SAME_SIZE_INT[dt.itemsize])).view(dt)

    def ptr(self, x: Any) -> int:
        return int(x.data.ptr)

    def is_native(self, x: Any) -> bool:
        return isinstance(x, self.m.ndarray)

    def dtype_matches(self, x: Any, d: DType) -> bool:
        return x.dtype == self.native_dtype(d)

    def device_index(self, x: Any) -> int:
        return int(x.device.id)

    def make(self, ref: np.ndarray, view: str | None) -> Any:
        return apply_view(self.from_numpy(ref), view)


HELPERS: dict[str, Any] = {"torch": Torch, "jax": Jax, "cupy": Cupy}
