"""Hand-built DLPack consumers: ``from_dlpack`` functions that each break (or keep) one
consumer duty, for the conformance kit's consumer checks.

They consume through the bridge's own capsule reader and hand back a NumPy array over
the producer's memory, writable whatever the capsule's flags say, so that a write
reaches the producer. Only float32 is handled: the kit's producer exports nothing else.
"""

from __future__ import annotations

import ctypes
from math import prod
from typing import Any

import numpy as np

from hurray_bridge._capsule import DLView, consume_capsule
from hurray_bridge._dlpack import DLPACK_VERSION
from hurray_bridge._memory import host_array
from hurray_bridge.testing._raw import peek

_KEPT: list[object] = []  # what never_releases holds on to


def _over(view: DLView) -> np.ndarray:
    """A writable float32 array over the consumed memory; keeps ``view.owner`` alive."""
    n = prod(view.shape)
    return np.frombuffer(host_array(view.data, 4 * n, view.owner), np.float32).reshape(view.shape)


def ignores_read_only(x: Any) -> np.ndarray:
    """What PaddlePaddle (and torch 2.13) do: ask for DLPack 1.x, get READ_ONLY, and hand
    out a writable array over that memory anyway."""
    return _over(consume_capsule(x.__dlpack__(max_version=DLPACK_VERSION)))


def ignores_copy(x: Any, copy: bool | None = None) -> np.ndarray:
    """Takes ``copy=`` and neither forwards it nor copies: always the producer's memory."""
    return ignores_read_only(x)


def copies(x: Any, copy: bool | None = None) -> np.ndarray:
    """Always a private copy (the capsule released at once), whatever ``copy`` says."""
    return _copy_of(x.__dlpack__(max_version=DLPACK_VERSION))


def _copy_of(cap: object) -> np.ndarray:
    view = consume_capsule(cap)
    out = _over(view).copy()
    view.owner.release()  # type: ignore[attr-defined]
    return out


def never_releases(x: Any) -> np.ndarray:
    """Shares the memory and never calls the deleter (a leak)."""
    view = consume_capsule(x.__dlpack__(max_version=DLPACK_VERSION))
    _KEPT.append(view.owner)
    return _over(DLView(view.data, view.shape, view.strides, view.code, view.bits, view.lanes,
                        view.device_type, view.device_id, view.flags, view.versioned, None))


def releases_twice(x: Any) -> np.ndarray:
    """Copies, then calls the struct's deleter twice (a double free)."""
    cap = x.__dlpack__(max_version=DLPACK_VERSION)
    raw = peek(cap)
    out = _copy_of(cap)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(raw.deleter)(raw.address)
    return out


def no_deleter_rename(x: Any) -> np.ndarray:
    """Copies and calls the deleter, but leaves the capsule under its fresh name, so the
    producer's capsule destructor would release it a second time."""
    cap = x.__dlpack__(max_version=DLPACK_VERSION)
    raw = peek(cap)
    out = np.frombuffer(ctypes.string_at(raw.data, 24), np.float32).reshape(2, 3).copy()
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(raw.deleter)(raw.address)
    return out


def crashes(x: Any) -> None:
    """Dies at import (a consumer that dereferences garbage)."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGSEGV)


def hangs(x: Any) -> None:
    import time

    time.sleep(3600)


def write_first(x: Any) -> None:
    """A write named by the user: the first element only."""
    x.reshape(-1)[0] = 42.0
