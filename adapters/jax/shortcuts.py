"""hb.convert shortcuts from JAX arrays (the rules: hurray_bridge/_shortcuts.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from hurray_bridge._shortcuts import Entry, entry

__all__ = ["is_jax_array", "makers"]


def is_jax_array(tp: type) -> bool:
    """Whether ``tp`` is jax.Array's one concrete class (its module moved between jaxlib
    releases): the only type these shortcuts serve."""
    return tp.__name__ == "ArrayImpl" and tp.__module__.startswith("jaxlib")


def _to_numpy(tp: type) -> Entry | None:
    if not is_jax_array(tp):
        return None
    asarray = np.asarray

    def jax_to_numpy(x: Any) -> Any:
        # The full path's own pin: memoryview waits for the value and holds the
        # buffer against delete/donation. It refuses non-CPU arrays, deleted
        # ones and the types without a buffer format (bfloat16, float8, int4).
        return asarray(memoryview(x))

    return entry(jax_to_numpy)


def _to_torch(tp: type) -> Entry | None:
    if not is_jax_array(tp):
        return None
    import torch

    from ..torch import warn_readonly

    from_dlpack = torch.from_dlpack

    def jax_to_torch(x: Any) -> Any:
        # Accelerator memory takes the full path, which negotiates a stream with
        # the consumer. JAX's export holds the buffer against delete/donation as
        # the full path's pin does, for every type (bfloat16 too, which has no
        # buffer format); it refuses deleted, multi-device and int4/int2 arrays.
        # (is_deleted first: jaxlib 0.10.2 segfaults on platform() of a deleted array.)
        if x.is_deleted() or x.platform() != "cpu":
            return NotImplemented
        out = from_dlpack(x.__dlpack__())
        if out.numel():
            warn_readonly()  # JAX memory is immutable; the full path's notice, once
        return out

    return entry(jax_to_torch)


def makers() -> dict[str, Callable[[type], Entry | None]]:
    """Target adapter -> maker of the shortcut for an exact source type (None: none)."""
    return {"numpy": _to_numpy, "torch": _to_torch}
