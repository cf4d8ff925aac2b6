"""Element-type names between the kit, its factories and DLPack."""

from __future__ import annotations

from typing import Any

from .._numpy import NAME as NUMPY
from .._registry import get_adapter
from ..dtypes import dtype_from_name

# Element types with no DLPack form of their own -> the one their library exports.
DLPACK_FORM = {"bool": "bool8"}


def numpy_dtype(dtype_name: str) -> Any:
    """The NumPy dtype a NumPy-based factory makes for a Hurray element-type name.

    ``dtype_name`` is what the checks pass to a factory: a Hurray name, which is not
    always a NumPy one (``bool8`` is NumPy's ``bool``, an alias NumPy 2 removed;
    ``bfloat16`` and ``float8_*`` come from ml_dtypes). 1-bit ``bool`` gives NumPy's
    ``bool`` too, as DLPack carries it. Imports NumPy (and ml_dtypes where needed).
    """
    name = dtype_from_name(dtype_name).name
    return get_adapter(NUMPY).native_dtype(dtype_from_name(DLPACK_FORM.get(name, name)))

