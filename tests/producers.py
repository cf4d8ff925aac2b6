"""Fake DLPack producers for the CPU test suite.

Each producer here is self-contained (it needs only ``hurray_bridge``) and
records how it was asked for its memory, so tests can check what the bridge
sends to a producer, not just what it gets back.

:class:`FakeCUDAProducer` claims CUDA device memory at an address that does
not exist on this machine. The bridge must never dereference device memory on
the host, so any test that touches that address crashes loudly instead of
passing by accident.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from hurray_bridge import _capsule
from hurray_bridge._dlpack import FLAG_READ_ONLY
from hurray_bridge.descriptor import compact_strides
from hurray_bridge.dtypes import DType, float32

__all__ = ["FAKE_CUDA_ADDRESS", "FakeCUDAProducer"]

# Not mapped in any process here (a canonical user-space address far above any heap),
# 256-byte aligned like a real cudaMalloc result. Never read or written.
FAKE_CUDA_ADDRESS = 0x7F3A_C000_0000

_KDLCUDA = 2


class _Export:
    """The owner of one exported capsule; counts its release (the producer's deleter)."""

    __slots__ = ("__weakref__", "producer")

    def __init__(self, producer: FakeCUDAProducer) -> None:
        self.producer = producer

    def __del__(self) -> None:
        p = self.producer
        with p._lock:
            p.released += 1


class FakeCUDAProducer:
    """A DLPack producer that says its tensor lives on ``cuda:<device_id>``.

    ``__dlpack__`` follows the Python array API signature, records each call's
    keyword arguments in :attr:`calls`, and answers like a CUDA library would:

    * ``stream`` is recorded (the fake has no work to synchronise); ``0`` is
      refused with ``BufferError`` because DLPack disallows it on CUDA;
    * ``dl_device`` other than its own device raises ``BufferError`` (with a
      message saying ``copy=False`` when that was asked), since the fake has no
      memory to copy from;
    * ``copy=True`` raises ``BufferError`` for the same reason;
    * ``max_version >= (1, 0)`` gets a versioned capsule, anything else a
      legacy one.

    :attr:`exported` counts capsules made, :attr:`released` counts deleter
    calls (an export that nobody consumed is released with its capsule).
    """

    def __init__(
        self,
        shape: Sequence[int] = (4, 3),
        dtype: DType = float32,
        *,
        strides: Sequence[int] | None = None,
        address: int = FAKE_CUDA_ADDRESS,
        device_id: int = 0,
        readonly: bool = False,
    ) -> None:
        if dtype.dlpack is None:
            raise ValueError(f"{dtype.name} has no DLPack type code")
        self.shape = tuple(int(d) for d in shape)
        if strides is None:
            strides = compact_strides(self.shape)
        self.strides = tuple(int(s) for s in strides)
        if len(self.strides) != len(self.shape):
            raise ValueError("strides must have one entry per dimension")
        self.dtype = dtype
        self.address = address
        self.device_id = device_id
        self.readonly = readonly
        self.calls: list[dict[str, Any]] = []
        self.exported = 0
        self.released = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"FakeCUDAProducer(shape={list(self.shape)}, dtype={self.dtype.name}, "
                f"cuda:{self.device_id} @ 0x{self.address:x})")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_KDLCUDA, self.device_id)

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        self.calls.append(
            {"stream": stream, "max_version": max_version, "dl_device": dl_device, "copy": copy}
        )
        if stream == 0:
            raise BufferError("stream=0 is not allowed on CUDA (DLPack: ambiguous default stream)")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            if copy is False:
                raise BufferError(
                    f"export to {tuple(dl_device)} needs a copy from cuda:{self.device_id}, "
                    "but copy=False"
                )
            raise BufferError(f"FakeCUDAProducer has no memory to copy to {tuple(dl_device)}")
        if copy:
            raise BufferError("FakeCUDAProducer has no memory to copy (copy=True)")
        versioned = max_version is not None and max_version[0] >= 1
        code, bits = self.dtype.dlpack  # type: ignore[misc]
        flags = FLAG_READ_ONLY if self.readonly else 0
        capsule = _capsule.make_capsule(
            data=self.address, shape=self.shape, strides=self.strides, code=code, bits=bits,
            lanes=1, device_type=_KDLCUDA, device_id=self.device_id, flags=flags,
            owner=_Export(self), versioned=versioned,
        )
        with self._lock:
            self.exported += 1
        return capsule

    @property
    def last_call(self) -> dict[str, Any]:
        return self.calls[-1]
