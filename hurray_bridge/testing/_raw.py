"""The kit's own reader of DLPack capsules: the producer's struct exactly as it was filled in.

A consumer (:func:`hurray_bridge._capsule.consume_capsule`) normalises what the checks
must see - it folds ``byte_offset`` into the data pointer, drops the pointer of an empty
tensor, hides the version and the deleter, and stops at the first defect it meets. So
:func:`peek` reads the struct here, without taking ownership, through the ctypes layouts
of :mod:`hurray_bridge._dlpack` rather than the consumer's unpacking formats, and
:func:`validate` lists every defect at once; ownership then goes through the ordinary
consumer (:func:`take`). A defect in either reading shows as the two disagreeing.

:class:`Watch` counts the calls of a struct's deleter, so that a deleter called twice
is reported instead of freeing the memory twice.
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Sequence
from typing import NamedTuple

from .._capsule import DLView, capsule_name, consume_capsule
from .._dlpack import (
    DLPACK_VERSION,
    FLAG_IS_COPIED,
    FLAG_IS_SUBBYTE_TYPE_PADDED,
    FLAG_READ_ONLY,
    MAX_NDIM,
    DLManagedTensor,
    DLManagedTensorVersioned,
)
from ..dtypes import DType, dtype_from_dlpack
from ._report import Fail

_api = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)  # our own prototypes (see _capsule)
_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
V_NAME, L_NAME = "dltensor_versioned", "dltensor"
_V_DELETER_OFFSET = DLManagedTensorVersioned.deleter.offset  # 16
_L_DELETER_OFFSET = DLManagedTensor.deleter.offset  # 56
_KNOWN_FLAGS = FLAG_READ_ONLY | FLAG_IS_COPIED | FLAG_IS_SUBBYTE_TYPE_PADDED
_ADDRESS_LIMIT = 1 << 48  # bytes: beyond any real address space (x86-64 and aarch64 use 47-52 bits)


class Raw(NamedTuple):
    """A capsule's struct exactly as the producer filled it in (read, not consumed)."""

    name: str
    versioned: bool
    version: tuple[int, int] | None
    flags: int
    data: int
    byte_offset: int
    device: tuple[int, int]
    ndim: int
    code: int
    bits: int
    lanes: int
    shape: tuple[int, ...] | None  # None: NULL, or ndim out of range (not read)
    strides: tuple[int, ...] | None  # None: NULL (or not read)
    deleter: int
    address: int

    @property
    def elements(self) -> int:
        n = 1
        for d in self.shape or ():
            n *= d
        return n

    @property
    def pointer(self) -> int:
        return self.data + self.byte_offset if self.data else 0

    def describe(self) -> str:
        kind = f"DLPack {self.version[0]}.{self.version[1]}" if self.version else "legacy"
        return f"'{self.name}' ({kind})"


def peek(capsule: object) -> Raw:
    """Read a fresh capsule's struct without taking ownership (``Fail``: no DLPack capsule)."""
    name = capsule_name(capsule)
    if name is None:
        what = "an unnamed capsule" if type(capsule).__name__ == "PyCapsule" else (
            f"a {type(capsule).__module__}.{type(capsule).__qualname__} object")
        raise Fail(f"__dlpack__ returned {what}, not a DLPack capsule")
    if name not in (V_NAME, L_NAME):
        hint = " (already consumed)" if name in ("used_" + V_NAME, "used_" + L_NAME) else ""
        raise Fail(f"capsule name {name!r}{hint}, expected '{V_NAME}' or '{L_NAME}'")
    versioned = name == V_NAME
    p: int = _GetPointer(capsule, name.encode())
    if versioned:
        m = DLManagedTensorVersioned.from_address(p)
        version: tuple[int, int] | None = (m.version.major, m.version.minor)
        flags = m.flags
        deleter = ctypes.c_void_p.from_address(p + _V_DELETER_OFFSET).value or 0
        if m.version.major != DLPACK_VERSION[0]:
            # Another major may lay out everything after `flags` differently: read no further.
            return Raw(name, True, version, flags, 0, 0, (0, 0), -1, 0, 0, 0, None, None,
                        deleter, p)
        t = m.dl_tensor
    else:
        lm = DLManagedTensor.from_address(p)
        version, flags = None, 0
        deleter = ctypes.c_void_p.from_address(p + _L_DELETER_OFFSET).value or 0
        t = lm.dl_tensor
    ndim = t.ndim
    shape_p = ctypes.cast(t.shape, ctypes.c_void_p).value
    strides_p = ctypes.cast(t.strides, ctypes.c_void_p).value
    shape = strides = None
    if 0 <= ndim <= MAX_NDIM:
        if ndim == 0:
            shape, strides = (), (() if strides_p else None)
        else:
            if shape_p:
                shape = tuple((ctypes.c_int64 * ndim).from_address(shape_p))
            if strides_p:
                strides = tuple((ctypes.c_int64 * ndim).from_address(strides_p))
    return Raw(name, versioned, version, flags, t.data or 0, t.byte_offset,
                (t.device.device_type, t.device.device_id), ndim, t.dtype.code, t.dtype.bits,
                t.dtype.lanes, shape, strides, deleter, p)


def compact_strides(shape: Sequence[int]) -> tuple[int, ...]:
    out, step = [], 1
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def validate(raw: Raw, shape: tuple[int, ...] | None = None,
              dtype: str | None = None) -> tuple[list[str], list[str]]:
    """What is wrong with a struct (problems) and what is odd but allowed (notes)."""
    problems: list[str] = []
    notes: list[str] = []
    if raw.version is not None and raw.version[0] != DLPACK_VERSION[0]:
        return [f"DLPack major version {raw.version[0]} (this kit reads 1)"], notes
    if not 0 <= raw.ndim <= MAX_NDIM:
        return [f"ndim {raw.ndim} outside 0..{MAX_NDIM}"], notes
    if raw.shape is None:
        return [f"NULL shape for ndim {raw.ndim}"], notes
    if any(d < 0 for d in raw.shape):
        problems.append(f"negative dimension in shape {raw.shape}")
    if shape is not None and raw.shape != shape:
        problems.append(f"shape {raw.shape}, but the factory was asked for {shape}")
    if raw.lanes != 1:
        problems.append(f"lanes={raw.lanes}: vector element types are not array elements")
    try:
        found: DType | None = dtype_from_dlpack(raw.code, raw.bits, raw.lanes)
    except Exception:
        found = None
        problems.append(f"dtype (code {raw.code}, bits {raw.bits}) is no DLPack element type "
                        "Hurray knows")
    if found is not None and dtype is not None and found.name != dtype:
        problems.append(f"dtype {found.name}, but the factory was asked for {dtype}")
    itemsize = max(1, raw.bits // 8)
    if raw.ndim and raw.strides is None:
        if raw.version is not None and raw.version >= (1, 2):
            problems.append(f"NULL strides in a DLPack {raw.version[0]}.{raw.version[1]} capsule "
                            "(DLPack 1.2 and later require strides when ndim > 0)")
        else:
            notes.append("NULL strides (compact row-major; allowed before DLPack 1.2)")
    if raw.strides:
        span = 0
        garbage = [s for s in raw.strides if abs(s) * itemsize > _ADDRESS_LIMIT]
        if garbage:
            problems.append(f"garbage strides {raw.strides}: a step of {garbage[0]} elements "
                            f"({abs(garbage[0]) * itemsize} bytes) is beyond any address space")
        for d, s in zip(raw.shape, raw.strides, strict=True):
            if d > 1:
                span += abs(s) * (d - 1) * itemsize
        if raw.elements and span >= 1 << 63 and not garbage:
            problems.append(f"strides {raw.strides} with shape {raw.shape} span more than "
                            "2**63 bytes")
    n = raw.elements
    if n and not raw.data:
        problems.append(f"NULL data pointer for a tensor of {n} element(s)")
    if not n and raw.data:
        notes.append("non-NULL data for a 0-element tensor (allowed; DLPack recommends NULL)")
    if raw.versioned and raw.version is not None and raw.version <= DLPACK_VERSION:
        unknown = raw.flags & ~_KNOWN_FLAGS
        if unknown:
            problems.append(f"unknown flag bits 0x{unknown:x} in a DLPack "
                            f"{raw.version[0]}.{raw.version[1]} capsule")
    if raw.byte_offset:
        notes.append(f"byte_offset {raw.byte_offset}")
    return problems, notes


# ------------------------------------------------------------------ watching the deleter
#
# Before consuming (or dropping) a capsule the kit points its struct's deleter at one
# static trampoline that counts the calls and forwards the first one to the producer's
# deleter; a second call is counted and not forwarded, so a double free is reported
# instead of crashing the run. Entries of structs whose deleter never ran stay, so a
# late call still reaches the producer.

_DeleterFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_ForwardFn = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)  # GIL held, as consumers call deleters
_WATCHED: dict[int, list[int]] = {}  # struct address -> [producer's deleter, calls]


def _trampoline(p: int | None, _watched: dict[int, list[int]] = _WATCHED) -> None:
    entry = _watched.get(p or 0)
    if entry is None:
        return
    entry[1] += 1
    if entry[1] == 1 and entry[0]:
        _ForwardFn(entry[0])(p)


_TRAMPOLINE = _DeleterFn(_trampoline)
_TRAMPOLINE_ADDR: int = ctypes.cast(_TRAMPOLINE, ctypes.c_void_p).value  # type: ignore[assignment]


class Watch:
    """Counts the calls of one struct's deleter (installed before the capsule is consumed)."""

    def __init__(self, raw: Raw) -> None:
        self._addr = raw.address
        self._entry = [raw.deleter, 0]
        _WATCHED[raw.address] = self._entry
        offset = _V_DELETER_OFFSET if raw.versioned else _L_DELETER_OFFSET
        ctypes.c_void_p.from_address(raw.address + offset).value = _TRAMPOLINE_ADDR

    @property
    def calls(self) -> int:
        return self._entry[1]

    def close(self) -> None:
        if self._entry[1] and _WATCHED.get(self._addr) is self._entry:
            del _WATCHED[self._addr]


def eventually(condition: Callable[[], bool]) -> bool:
    """``condition()`` now, or after a full garbage collection.

    Reference counting frees almost everything at once; a full collection
    (0.1-0.3 s with torch and JAX loaded) is paid only when the condition is
    not met yet, i.e. only on the way to a failure or for objects in cycles.
    """
    if condition():
        return True
    gc.collect()
    gc.collect()
    return condition()

def take(capsule: object) -> tuple[Raw, DLView]:
    """The struct as the producer filled it in, then the capsule consumed as any consumer does."""
    raw = peek(capsule)
    return raw, consume_capsule(capsule)

