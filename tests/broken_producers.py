"""Hand-made DLPack producers for the conformance kit: one correct, the others broken.

:class:`HandMade` is a complete, correct producer written with ctypes over a
NumPy array: it builds the managed struct itself, gives it a deleter and a
capsule destructor, and honours ``max_version``, ``copy``, ``dl_device`` and
``stream``. Each subclass breaks exactly one rule; :data:`BROKEN` says which
checks of :func:`hurray_bridge.testing.check_producer` it must fail (and the
correct one must fail none).

Each class has a ``factory(shape, dtype_name)`` classmethod, so
``tests.broken_producers:IgnoresCopy.factory`` names a factory for the pytest
plugin and for ``hurray check``.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from hurray_bridge._dlpack import (
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    DLManagedTensor,
    DLManagedTensorVersioned,
)

_api = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)
_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", _api)
)
# Raw-address variants for the capsule destructor, which must not resurrect the capsule.
_IsValidRaw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api)
)
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)

# Capsule names must outlive every capsule: module constants, never released.
V_NAME = b"dltensor_versioned"
L_NAME = b"dltensor"
TYPO_NAME = b"dltensor_version"  # what WrongCapsuleName uses for its versioned capsules
_V_DELETER = DLManagedTensorVersioned.deleter.offset
_L_DELETER = DLManagedTensor.deleter.offset
_FRESH = ((V_NAME, _V_DELETER), (TYPO_NAME, _V_DELETER), (L_NAME, _L_DELETER))

_Fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_Call = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)

# struct address -> everything the export keeps alive (struct, shape/strides arrays, owners)
LIVE: dict[int, tuple[Any, ...]] = {}


def _release(p: int | None) -> None:
    LIVE.pop(p or 0, None)


def _keep(p: int | None) -> None:
    """A deleter that frees nothing: the export (and its producer object) stays forever."""


def _destroy(capsule: int | None) -> None:
    # Like NumPy's: only a capsule under a fresh name still owns its struct, and the
    # deleter is read from the struct.
    for name, offset in _FRESH:
        if _IsValidRaw(capsule, name):
            p = _GetPointerRaw(capsule, name)
            fn = ctypes.c_void_p.from_address(p + offset).value
            if fn:
                _Call(fn)(p)
            return


def _ignore(capsule: int | None) -> None:
    """A capsule destructor that never calls the deleter of an unconsumed capsule."""


_CALLBACKS = {f: _Fn(f) for f in (_release, _keep, _destroy, _ignore)}


def _addr(fn: Any) -> int:
    return ctypes.cast(_CALLBACKS[fn], ctypes.c_void_p).value  # type: ignore[return-value]


class HandMade:
    """A correct CPU producer over a NumPy array (read-only arrays export READ_ONLY)."""

    versioned_name = V_NAME
    deleter = staticmethod(_release)
    destructor = staticmethod(_destroy)

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    @classmethod
    def factory(cls, shape: tuple[int, ...], dtype: str) -> HandMade:
        return cls(np.arange(math.prod(shape)).astype(dtype).reshape(shape))

    @property
    def readonly(self) -> bool:
        return not self.array.flags.writeable

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> object:
        if stream is not None:
            raise BufferError(f"stream must be None for CPU memory, got {stream!r}")
        if dl_device is not None and tuple(dl_device) != (1, 0):
            raise BufferError(f"cannot export to device {tuple(dl_device)}: CPU memory only")
        a = self.array
        versioned = max_version is not None and max_version[0] >= 1
        if not versioned and not copy and not a.flags.writeable and a.size:
            self._legacy_read_only()
        a, flags = self._copy(a) if copy else (a, self._shared_flags(a))
        return self._export(a, flags, versioned)

    # --- hooks the broken producers override
    def _copy(self, a: np.ndarray) -> tuple[np.ndarray, int]:
        return a.copy(), FLAG_IS_COPIED

    def _shared_flags(self, a: np.ndarray) -> int:
        return 0 if a.flags.writeable else FLAG_READ_ONLY

    def _legacy_read_only(self) -> None:
        # A legacy capsule cannot say read-only: refuse it, as NumPy does.
        raise BufferError("read-only memory in a legacy capsule (no READ_ONLY flag): "
                          "pass max_version=(1, 0) or copy=True")

    def _layout(self, a: np.ndarray) -> tuple[int, tuple[int, ...]]:
        data = a.ctypes.data if a.size else 0  # no elements: NULL
        return data, tuple(s // a.itemsize for s in a.strides)

    # --- the struct
    def _export(self, a: np.ndarray, flags: int, versioned: bool) -> object:
        data, strides = self._layout(a)
        ndim = a.ndim
        shape_arr = (ctypes.c_int64 * max(ndim, 1))(*a.shape)
        strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
        code = {"b": 6, "i": 0, "u": 1, "f": 2, "c": 5}[a.dtype.kind]
        if versioned:
            m: Any = DLManagedTensorVersioned()
            m.version.major, m.version.minor = 1, 3
            m.flags = flags
            t, offset = m.dl_tensor, _V_DELETER
        else:
            m = DLManagedTensor()
            t, offset = m.dl_tensor, _L_DELETER
        t.data = data or None
        t.device.device_type, t.device.device_id = 1, 0
        t.ndim = ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, a.dtype.itemsize * 8, 1
        t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
        p = ctypes.addressof(m)
        ctypes.c_void_p.from_address(p + offset).value = _addr(self.deleter)
        LIVE[p] = (m, shape_arr, strides_arr, a, self)
        name = self.versioned_name if versioned else L_NAME
        return _New(p, name, _addr(self.destructor))


class WrongCapsuleName(HandMade):
    """Names its versioned capsules 'dltensor_version': no consumer recognises them."""

    versioned_name = TYPO_NAME


class LeakyDestructor(HandMade):
    """The capsule destructor never calls the deleter: an unconsumed capsule leaks."""

    destructor = staticmethod(_ignore)


class LeakyDeleter(HandMade):
    """The deleter is called but frees nothing: every export leaks its producer object."""

    deleter = staticmethod(_keep)


class GarbageEmptyStrides(HandMade):
    """Empty tensors: a non-NULL data pointer and uninitialised-looking strides."""

    def _layout(self, a: np.ndarray) -> tuple[int, tuple[int, ...]]:
        if a.size:
            return super()._layout(a)
        return a.ctypes.data, tuple(0x7FFF_DEAD_BEEF_0000 - 8 * i for i in range(a.ndim))


class DeviceLie(HandMade):
    """``__dlpack_device__`` claims CUDA while the capsules hold CPU memory."""

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


class IgnoresCopy(HandMade):
    """``copy=True`` shares the memory anyway (and says nothing)."""

    def _copy(self, a: np.ndarray) -> tuple[np.ndarray, int]:
        return a, 0


class DropsReadOnly(HandMade):
    """Read-only memory exported without READ_ONLY (its arrays are read-only)."""

    @classmethod
    def factory(cls, shape: tuple[int, ...], dtype: str) -> HandMade:
        obj = super().factory(shape, dtype)
        obj.array.flags.writeable = False
        return obj

    def _shared_flags(self, a: np.ndarray) -> int:
        return 0


class LegacyReadOnly(HandMade):
    """Read-only memory handed out in a legacy capsule (which has no READ_ONLY flag)."""

    @classmethod
    def factory(cls, shape: tuple[int, ...], dtype: str) -> HandMade:
        obj = super().factory(shape, dtype)
        obj.array.flags.writeable = False
        return obj

    def _legacy_read_only(self) -> None:
        pass  # hb.Tensor did this until the legacy export refused read-only memory


class ReadOnlyHandMade(HandMade):
    """The correct producer over read-only arrays: READ_ONLY is set, and a legacy
    request (which could not carry it) is refused."""

    @classmethod
    def factory(cls, shape: tuple[int, ...], dtype: str) -> HandMade:
        obj = super().factory(shape, dtype)
        obj.array.flags.writeable = False
        return obj


# producer class -> the checks it must fail (exactly these)
BROKEN: dict[type[HandMade], frozenset[str]] = {
    HandMade: frozenset(),
    ReadOnlyHandMade: frozenset(),
    WrongCapsuleName: frozenset({"versioned_capsule"}),
    LeakyDestructor: frozenset({"unconsumed_capsule"}),
    LeakyDeleter: frozenset({"deleter_once", "unconsumed_capsule"}),
    GarbageEmptyStrides: frozenset({"empty_tensors"}),
    DeviceLie: frozenset({"dlpack_device", "dl_device"}),
    IgnoresCopy: frozenset({"copy_true"}),
    DropsReadOnly: frozenset({"read_only_flag"}),
    LegacyReadOnly: frozenset({"read_only_flag"}),
}
