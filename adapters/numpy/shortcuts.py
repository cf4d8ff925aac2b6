"""NumPy's fast hooks for hb.convert's shortcuts (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

import numpy as np

from hurray_bridge._shortcuts import EXPORTER, NDARRAY, Entry, entry

__all__ = ["fast_export", "fast_import"]


def fast_import(tp: type) -> dict[str, Entry | None]:
    """A NumPy array is itself a host ndarray and a DLPack exporter (no subclass: a
    masked array or a matrix is not what the full path reads)."""
    if tp is not np.ndarray:
        return {}
    return {NDARRAY: None, EXPORTER: None}


def fast_export() -> dict[str, Entry | None]:
    """A host ndarray is already the result; an exporter goes through np.from_dlpack."""
    # An exporter's read-only capsule NumPy honours - except for empty arrays, which
    # it makes writable (hence nonempty). copy=False (never a copy on CPU anyway) keeps
    # NumPy from retrying the legacy protocol after a producer's refusal (Arrow's, of
    # nulls), which would draw that producer's deprecation warning before the full
    # path's own error.
    return {NDARRAY: None,
            EXPORTER: entry(np.from_dlpack, kwargs={"copy": False}, nonempty=True)}
