"""Hand-built DLPack producers: each exercises one corner of the protocol.

They wrap a real array (usually NumPy) so values can be checked, but present
nothing to a consumer except ``__dlpack__`` / ``__dlpack_device__``.
"""

from __future__ import annotations

import ctypes
from typing import Any

from hurray_bridge._dlpack import DLManagedTensorVersioned

_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class DLPackOnly:
    """Forwards the protocol and nothing else, so only the protocol path is used."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def __dlpack__(self, **kwargs: Any) -> object:
        return self._wrapped.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._wrapped.__dlpack_device__()


class LegacyOnly:
    """A pre-2023.12 producer: ``__dlpack__(stream=None)`` and nothing more (older pyarrow)."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, stream: Any = None) -> object:
        self.calls.append({"stream": stream})
        return self._wrapped.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._wrapped.__dlpack_device__()


class IgnoresMaxVersion:
    """Accepts ``max_version`` but always answers a legacy capsule (what JAX does)."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped
        self.calls: list[dict[str, Any]] = []

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None,
                   dl_device: Any = None, copy: Any = None) -> object:
        self.calls.append({"stream": stream, "max_version": max_version})
        return self._wrapped.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._wrapped.__dlpack_device__()


class ByteOffsetProducer:
    """Versioned capsules whose ``data`` sits ``shift`` bytes early, with ``byte_offset = shift``.

    A consumer that ignores ``byte_offset`` reads the wrong bytes (torch did,
    pytorch#168177); one that folds it in reads the array itself.
    """

    def __init__(self, wrapped: Any, shift: int = 16) -> None:
        self._wrapped, self.shift = wrapped, shift

    def __dlpack__(self, **kwargs: Any) -> object:
        kwargs["max_version"] = (1, 0)
        capsule = self._wrapped.__dlpack__(**kwargs)
        p = _get_pointer(capsule, b"dltensor_versioned")
        m = DLManagedTensorVersioned.from_address(p)
        if m.dl_tensor.data:
            m.dl_tensor.data -= self.shift
            m.dl_tensor.byte_offset += self.shift
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._wrapped.__dlpack_device__()
