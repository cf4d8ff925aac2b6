"""The address of a buffer: the compiled way and the ctypes way agree on every kind of
exporter the loaders and shared memory hand it."""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np
import pytest

from hurray_bridge import _memory


def _exporters() -> list[tuple[str, Any]]:
    m = mmap.mmap(-1, 4096)
    arr = np.arange(64, dtype=np.float32)
    return [
        ("bytearray", bytearray(b"x" * 100)),
        ("bytes", b"immutable bytes"),
        ("anonymous mmap", m),
        ("memoryview slice", memoryview(bytearray(256))[16:80]),
        ("numpy array", arr),
        ("read-only numpy view", arr[8:].view()),
        ("2-D numpy array", np.zeros((4, 8), np.int16)),
    ]


@pytest.mark.parametrize(("kind", "obj"), _exporters(), ids=[k for k, _ in _exporters()])
def test_the_compiled_address_is_the_ctypes_one(kind: str, obj: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if _memory._compiled_address is None:
        pytest.skip("hurray_bridge._speedups not built: only the ctypes way exists")
    compiled = _memory.buffer_address(obj)
    monkeypatch.setattr(_memory, "_compiled_address", None)
    by_ctypes = _memory.buffer_address(obj)
    assert compiled[:3] == by_ctypes[:3]
    assert compiled[0] != 0 and compiled[1] == memoryview(obj).nbytes
    if isinstance(obj, np.ndarray):
        assert compiled[0] == obj.ctypes.data


def test_an_empty_buffer_has_no_address_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _memory.buffer_address(bytearray())[:2] == (0, 0)
    monkeypatch.setattr(_memory, "_compiled_address", None)
    assert _memory.buffer_address(bytearray())[:2] == (0, 0)


def test_a_non_contiguous_buffer_is_refused_before_its_address_is_asked() -> None:
    with pytest.raises(ValueError, match="not contiguous"):
        _memory.buffer_address(np.zeros((4, 4))[:, ::2])
