"""hb.convert shortcuts from NumPy arrays (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hurray_bridge._shortcuts import Entry, entry

__all__ = ["makers"]


def _to_torch(tp: type) -> Entry | None:
    if tp is not np.ndarray:
        return None
    import torch

    from_numpy = torch.from_numpy

    def numpy_to_torch(x: Any) -> Any:
        # torch.from_numpy refuses non-native byte order, negative strides and the
        # types it lacks; read-only arrays it accepts but warns in its own words,
        # where the full path warns in ours.
        return from_numpy(x) if x.flags.writeable else NotImplemented

    return entry(numpy_to_torch)


def _to_arrow(tp: type) -> Entry | None:
    if tp is not np.ndarray:
        return None
    import pyarrow as pa

    # Rank 1 only (other ranks become Arrow tensors); Array.from_dlpack refuses
    # strided memory, bool (bit-packed in Arrow) and complex.
    return entry(pa.Array.from_dlpack, guard=("ndim", 1))


def makers() -> dict[str, Callable[[type], Entry | None]]:
    """Target adapter -> maker of the shortcut for an exact source type (None: none)."""
    return {"torch": _to_torch, "arrow": _to_arrow}
