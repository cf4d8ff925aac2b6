"""The one door through which the core reaches NumPy and ml_dtypes.

The core imports no framework. It does use NumPy (and ml_dtypes, NumPy's home of
bfloat16, float8 and int4) as compute kernels - gathering strided memory,
unpacking sub-byte values, dequantizing - and only through the two functions
here, so that ``import hurray_bridge`` loads neither and the house-rule test
(tests/cross/test_house_rules.py) can hold every other core module to "no framework".
"""

from __future__ import annotations

import sys
from types import ModuleType

from .errors import BackendNotAvailableError

__all__ = ["NAME", "loaded", "ml_dtypes", "numpy"]

NAME = "numpy"
"""NumPy's module name, which is also the target name of the adapter over the core's host
path (``hb.convert(x, NAME)``): the one place the core spells it."""


def numpy(why: str = "this step computes with NumPy") -> ModuleType:
    """NumPy, imported on first use; a BackendNotAvailableError naming the extra (and
    ``why`` it is needed) if absent."""
    try:
        import numpy
    except ImportError as exc:
        raise BackendNotAvailableError(NAME, NAME, why) from exc
    return numpy


def loaded() -> ModuleType | None:
    """NumPy when some code imported it already, else None (never imports it)."""
    return sys.modules.get(NAME)


def ml_dtypes() -> ModuleType:
    """ml_dtypes (bfloat16, float8, int4 ... for NumPy), imported on first use."""
    try:
        import ml_dtypes
    except ImportError as exc:
        raise BackendNotAvailableError("ml_dtypes", NAME,
                                       "this step needs NumPy's extra element types") from exc
    return ml_dtypes
