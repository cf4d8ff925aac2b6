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


# Deleter calls for a struct that was not live (a second call, or garbage): Forged's.
STRAY_RELEASES: list[int] = []


def _release_once(p: int | None) -> None:
    if LIVE.pop(p or 0, None) is None:
        STRAY_RELEASES.append(p or 0)


_CALLBACKS = {f: _Fn(f) for f in (_release, _keep, _destroy, _ignore, _release_once)}


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


class Forged:
    """A hostile producer: its capsule carries exactly the fields it was given.

    Nothing is checked or derived: ``data`` is an address (0 for NULL),
    ``shape=None`` is a NULL shape pointer, ``strides=None`` NULL strides,
    ``ndim`` defaults to ``len(shape)`` but may say anything (the shape and
    strides arrays always hold ``len(shape)`` entries: a consumer that reads
    ``ndim`` of them while ``ndim`` is outside 0..64 reads past them).
    ``reported`` is what ``__dlpack_device__`` returns (by default ``device``);
    ``name`` overrides the capsule name. The caller keeps whatever ``data``
    points at alive (``keep`` holds it, if given); a custom ``name`` must
    outlive the capsule (a module constant). Every request gets a capsule with
    the same fields, whatever it asked for (``dl_device``, ``copy``): a producer
    that ignores them. The deleter removes the struct from :data:`LIVE`, so
    ``producer.live()`` counts exports not yet released; a call for a struct
    that is not live is recorded in :data:`STRAY_RELEASES`.
    """

    def __init__(self, *, data: int = 0, shape: tuple[int, ...] | None = (),
                 strides: tuple[int, ...] | None = None, byte_offset: int = 0,
                 code: int = 2, bits: int = 32, lanes: int = 1,
                 device: tuple[int, int] = (1, 0), reported: Any = None,
                 versioned: bool = True, version: tuple[int, int] = (1, 3), flags: int = 0,
                 ndim: int | None = None, name: bytes | None = None, keep: Any = None) -> None:
        self.data, self.shape, self.strides, self.byte_offset = data, shape, strides, byte_offset
        self.code, self.bits, self.lanes = code, bits, lanes
        self.device = device
        self.reported = device if reported is None else reported
        self.versioned, self.version, self.flags = versioned, version, flags
        self.ndim = len(shape or ()) if ndim is None else ndim
        self.name = name
        self.keep = keep
        self.exports: list[tuple[int, object]] = []  # (struct address, token), in order
        self.requests: list[dict[str, Any]] = []

    def __repr__(self) -> str:
        return (f"Forged(data=0x{self.data:x}, shape={self.shape}, strides={self.strides}, "
                f"byte_offset={self.byte_offset}, dtype=({self.code}, {self.bits}, "
                f"{self.lanes}), device={self.device}, reported={self.reported!r}, "
                f"versioned={self.versioned}, version={self.version}, flags={self.flags}, "
                f"ndim={self.ndim})")

    def live(self) -> int:
        """How many of this producer's exports have not been released yet."""
        # By token, not address: a released struct's address is soon another's.
        return sum(LIVE.get(p, (None,))[-1] is token for p, token in self.exports)

    def __dlpack_device__(self) -> Any:
        return self.reported

    def __dlpack__(self, **kwargs: Any) -> object:
        self.requests.append(kwargs)
        dims = self.shape or ()
        n = max(len(dims), len(self.strides or ()), 1)
        shape_arr = (ctypes.c_int64 * n)(*dims)
        strides_arr = (ctypes.c_int64 * n)(*self.strides) if self.strides is not None else None
        if self.versioned:
            m: Any = DLManagedTensorVersioned()
            m.version.major, m.version.minor = self.version
            m.flags = self.flags
            offset = _V_DELETER
        else:
            m = DLManagedTensor()
            offset = _L_DELETER
        t = m.dl_tensor
        t.data = self.data or None
        t.device.device_type, t.device.device_id = self.device
        t.ndim = self.ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = self.code, self.bits, self.lanes
        if self.shape is not None:
            t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        if strides_arr is not None:
            t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = self.byte_offset
        p = ctypes.addressof(m)
        ctypes.c_void_p.from_address(p + offset).value = _addr(_release_once)
        token = object()
        LIVE[p] = (m, shape_arr, strides_arr, self.keep, token)
        self.exports.append((p, token))
        name = self.name or (V_NAME if self.versioned else L_NAME)
        return _New(p, name, _addr(_destroy))


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
