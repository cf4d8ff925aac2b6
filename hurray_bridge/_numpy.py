"""The one door through which the core reaches NumPy and ml_dtypes.

The core imports no framework. It does use NumPy (and ml_dtypes, NumPy's home of
bfloat16, float8 and int4) as compute kernels - gathering strided memory,
unpacking sub-byte values, dequantizing - and only through the two functions
here, so that ``import hurray_bridge`` loads neither and the house-rule test
(tests/cross/test_house_rules.py) can hold every other core module to "no framework".
"""

from __future__ import annotations

from types import ModuleType

from .errors import BackendNotAvailableError

__all__ = ["ml_dtypes", "numpy"]


def numpy() -> ModuleType:
    """NumPy, imported on first use; a BackendNotAvailableError naming the extra if absent."""
    try:
        import numpy
    except ImportError as exc:
        raise BackendNotAvailableError("numpy", "numpy", "this step computes with NumPy") from exc
    return numpy


def ml_dtypes() -> ModuleType:
    """ml_dtypes (bfloat16, float8, int4 ... for NumPy), imported on first use."""
    try:
        import ml_dtypes
    except ImportError as exc:
        raise BackendNotAvailableError("ml_dtypes", "numpy",
                                       "this step needs NumPy's extra element types") from exc
    return ml_dtypes
