"""The one module that touches DLPack capsules (ctypes implementation).

Everything above this module sees capsules only through four functions and
one plain record, :class:`DLView`, so that a compiled implementation can
replace this file without touching the rest of the package:

* :func:`request_capsule` asks a producer for a capsule (versioned first);
* :func:`consume_capsule` takes ownership of a capsule and describes it;
* :func:`make_capsule` exports memory as a fresh capsule;
* :func:`capsule_name` reads a capsule's name.

Ownership rules implemented here (dlpack.h v1.3 and the array API standard):

* A consumer renames the capsule to ``used_dltensor[_versioned]`` when it takes
  the struct; the producer's capsule destructor then does nothing, and the
  consumer calls the struct's deleter exactly once when it is done.
* Our exports keep the producer's object (``owner``) and the struct memory in a
  registry entry that the deleter removes. An export that nobody consumed is
  released by the capsule destructor.

A limit of ctypes (removed by a compiled implementation): NumPy and PyTorch call
deleters while an exception may be in flight (an imported array that dies while
``arr + "x"`` unwinds, for instance), and a ctypes callback cannot hand a pending
exception back to its C caller. Our callbacks take the exception out of the way
first, so the release itself always completes; the exception is then reported
through :func:`sys.unraisablehook`, and the consumer's caller sees
``SystemError`` instead of the original error.
"""

from __future__ import annotations

import atexit
import ctypes
import struct
import sys
import time
from math import prod
from typing import Any

from ._dlpack import (
    DLPACK_VERSION,
    DLTENSOR_NAME,
    DLTENSOR_VERSIONED_NAME,
    MAX_NDIM,
    USED_DLTENSOR_NAME,
    USED_DLTENSOR_VERSIONED_NAME,
)
from .errors import FormatError, HurrayError, UnsupportedError

__all__ = ["DLView", "capsule_name", "consume_capsule", "live_exports", "make_capsule",
           "request_capsule"]

_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p
_c_int = ctypes.c_int

# Our own handle on the Python C API: function objects on the shared
# ``ctypes.pythonapi`` are global, and another library setting different
# argtypes on them would break us (or we them).
_api = ctypes.PyDLL(None, handle=ctypes.pythonapi._handle)


def _cfunc(name: str, restype: Any, *argtypes: Any) -> Any:
    # A prototype built once, at import: no per-call ctypes type creation.
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, _api))


_PyCapsule_New = _cfunc("PyCapsule_New", ctypes.py_object, _c_void_p, _c_char_p, _c_void_p)
_PyCapsule_GetName = _cfunc("PyCapsule_GetName", _c_char_p, ctypes.py_object)
_PyCapsule_GetPointer = _cfunc("PyCapsule_GetPointer", _c_void_p, ctypes.py_object, _c_char_p)
_PyCapsule_SetName = _cfunc("PyCapsule_SetName", _c_int, ctypes.py_object, _c_char_p)
# Variants taking the capsule as a bare address, for the capsule destructor: it runs
# while the capsule is being deallocated, and turning that address into a Python
# object again would resurrect it.
_PyCapsule_GetName_raw = _cfunc("PyCapsule_GetName", _c_void_p, _c_void_p)
_PyCapsule_GetPointer_raw = _cfunc("PyCapsule_GetPointer", _c_void_p, _c_void_p, _c_char_p)
_Py_IncRef = _cfunc("Py_IncRef", None, ctypes.py_object)

_addressof = ctypes.addressof

# Capsule names must be static C strings: a capsule keeps the pointer, not a copy.
# Holding the bytes objects here, plus one reference that is never given back,
# keeps them alive through interpreter shutdown.
_NAME_V = DLTENSOR_VERSIONED_NAME
_NAME_L = DLTENSOR_NAME
_USED_V = USED_DLTENSOR_VERSIONED_NAME
_USED_L = USED_DLTENSOR_NAME
for _name in (_NAME_V, _NAME_L, _USED_V, _USED_L):
    _Py_IncRef(_name)
# Where those strings live: the capsule destructor compares name pointers, one C call
# instead of a string comparison per name.
_NAME_V_ADDR: int = ctypes.cast(_c_char_p(_NAME_V), _c_void_p).value  # type: ignore[assignment]
_NAME_L_ADDR: int = ctypes.cast(_c_char_p(_NAME_L), _c_void_p).value  # type: ignore[assignment]

_CAPSULE_TYPE: type = type(_PyCapsule_New(1, _NAME_L, None))


# -- exceptions in flight -----------------------------------------------------------------
#
# Our deleter and capsule destructor are ctypes callbacks, and consumers call them
# from deallocation paths where an exception may be set. While it is set, CPython
# turns the result of *any* call into SystemError, so the first thing a callback does
# is move the exception out of the way, using only plain bytecode (no calls) until then.

if hasattr(_api, "PyErr_GetRaisedException"):  # Python >= 3.12
    _save_exception = _cfunc("PyErr_GetRaisedException", _c_void_p)
    _PyErr_SetRaisedException = _cfunc("PyErr_SetRaisedException", None, _c_void_p)

    def _restore_exception(saved: Any, _fn: Any = _PyErr_SetRaisedException) -> None:
        _fn(saved)  # ctypes re-raises it here; the callback then reports it

else:
    # PyErr_Fetch needs three out-pointers. They must exist before the callback runs
    # (creating one is a call), and a callback may run on any thread, so a small pool
    # of pre-built slots is claimed with a test-and-set that CPython <= 3.11 cannot
    # interrupt: the GIL only changes hands at calls and backward jumps.
    _PyErr_Fetch = _api.PyErr_Fetch
    _PyErr_Fetch.restype = None
    # Argument converters are calls: with no argtypes the byref objects pass as they are.
    _PyErr_Fetch.argtypes = None  # type: ignore[assignment]
    _PyErr_Restore = _cfunc("PyErr_Restore", None, _c_void_p, _c_void_p, _c_void_p)
    _NSLOTS = 8
    _slot_busy = [0] * _NSLOTS
    _slot_bufs = [(_c_void_p * 3)() for _ in range(_NSLOTS)]
    _slot_refs = [tuple(ctypes.byref(b, 8 * k) for k in range(3)) for b in _slot_bufs]

    def _save_exception(
        _busy: list[int] = _slot_busy,
        _bufs: list[Any] = _slot_bufs,
        _refs: list[tuple[Any, ...]] = _slot_refs,
        _fetch: Any = _PyErr_Fetch,
        _n: int = _NSLOTS,
    ) -> Any:
        i = 0
        while _busy[i]:
            i = (i + 1) % _n
        _busy[i] = 1
        r = _refs[i]
        _fetch(r[0], r[1], r[2])
        b = _bufs[i]
        saved = (b[0], b[1], b[2])
        _busy[i] = 0
        return saved if saved[0] else None

    def _restore_exception(saved: Any, _fn: Any = _PyErr_Restore) -> None:
        _fn(*saved)  # ctypes re-raises it here; the callback then reports it


# -- exports --------------------------------------------------------------------------------
#
# One ctypes buffer per export (uint64 words, so 8-byte aligned) holds the managed
# struct followed by its shape and strides arrays. The registry entry keyed by the
# struct's address keeps that buffer and the owner alive until the deleter runs.

_V_HEAD = "@IIPPQ"  # DLManagedTensorVersioned: version, manager_ctx, deleter, flags
_TENSOR = "PiiiBBHPPQ"  # DLTensor: data, device, ndim, dtype, shape, strides, byte_offset
_V_SIZE = struct.calcsize("@IIPPQ" + _TENSOR)  # 80
_L_SIZE = struct.calcsize("@" + _TENSOR + "PP")  # 64: DLTensor, manager_ctx, deleter
_V_DELETER_OFFSET = struct.calcsize("@IIP")  # 16
_L_DELETER_OFFSET = struct.calcsize("@" + _TENSOR + "P")  # 56

# struct address -> (buffer, owner, offset of the deleter field)
_EXPORTS: dict[int, tuple[Any, object, int]] = {}

# One entry per call of the ctypes deleter still running (list.append and list.pop are
# single calls, so no thread switch splits them): the exit hook waits for these, since
# an owner's release may drop the GIL (munmap, a finaliser's I/O) after the pop.
_DELETER_CALLS: list[None] = []

_DeleterFn = ctypes.CFUNCTYPE(None, _c_void_p)  # both deleters: void (*)(Managed* self)


def _export_deleter(
    p: int | None,
    _exports: dict[int, tuple[Any, object, int]] = _EXPORTS,
    _save: Any = _save_exception,
    _restore: Any = _restore_exception,
    _calls: list[None] = _DELETER_CALLS,
) -> None:
    # Called by consumers, on any thread (ctypes takes the GIL), exactly once per
    # consumed export. Defaults bind everything so that it still works while module
    # globals are being torn down at shutdown.
    saved = _save()
    _calls.append(None)
    try:
        _exports.pop(p, None)  # type: ignore[arg-type]  # frees the struct, releases owner
    finally:
        _calls.pop()
        if saved is not None:
            _restore(saved)


def _capsule_destructor(
    c: int | None,
    _exports: dict[int, tuple[Any, object, int]] = _EXPORTS,
    _save: Any = _save_exception,
    _restore: Any = _restore_exception,
    _get_name: Any = _PyCapsule_GetName_raw,
    _get_pointer: Any = _PyCapsule_GetPointer_raw,
    _v: tuple[int, bytes] = (_NAME_V_ADDR, _NAME_V),
    _l: tuple[int, bytes] = (_NAME_L_ADDR, _NAME_L),
) -> None:
    # A capsule still under its fresh name was never consumed: the deleter is ours to
    # run. A consumer renames with its own string, so our pointer means "fresh".
    saved = _save()
    try:
        name = _get_name(c)
        if name == _v[0]:
            _exports.pop(_get_pointer(c, _v[1]), None)
        elif name == _l[0]:
            _exports.pop(_get_pointer(c, _l[1]), None)
    finally:
        if saved is not None:
            _restore(saved)


_DELETER = _DeleterFn(_export_deleter)
_DESTRUCTOR = ctypes.CFUNCTYPE(None, _c_void_p)(_capsule_destructor)
# Consumers may call these after this module is gone; never let them be freed.
_Py_IncRef(_DELETER)
_Py_IncRef(_DESTRUCTOR)
_DELETER_ADDR: int = ctypes.cast(_DELETER, _c_void_p).value  # type: ignore[assignment]
_DESTRUCTOR_ADDR: int = ctypes.cast(_DESTRUCTOR, _c_void_p).value  # type: ignore[assignment]
# The compiled pair, when hurray_bridge._speedups was built, does the same and also
# keeps an exception that is in flight when a consumer releases our memory (a ctypes
# callback turns it into SystemError). The ctypes pair above stays as the fallback.
COMPILED_DELETERS = False
_stop_foreign_releases: Any = None
try:
    from ._speedups import capsule_hooks as _capsule_hooks
    from ._speedups import stop_foreign_releases as _stop
except ImportError:
    pass
else:
    try:
        _DELETER_ADDR, _DESTRUCTOR_ADDR = _capsule_hooks(_EXPORTS, _NAME_V, _NAME_L)
        COMPILED_DELETERS = True
        _stop_foreign_releases = _stop
    except RuntimeError:  # installed for an earlier copy of this module (a reload)
        pass
_compiled_live: Any
try:
    from ._speedups import live_exports as _compiled_live
except ImportError:
    _compiled_live = None


def live_exports() -> int:
    """Exports whose deleter has not run: this module's (``_EXPORTS``) and those the
    compiled ``Tensor.__dlpack__`` and DLPack C exchange table made (which hold their
    owner in C, not in ``_EXPORTS``)."""
    return len(_EXPORTS) + (0 if _compiled_live is None else int(_compiled_live()))


# Any C function without parameters ignores the pointer it is called with.
_NOOP_ADDR: int = ctypes.cast(_api.Py_IsInitialized, _c_void_p).value  # type: ignore[assignment]


def _threads_without_a_frame() -> int:
    # A ctypes callback on a thread Python has not seen makes its thread state first,
    # then waits for the GIL: until it gets it, that state has no frame. Both maps have
    # an entry per thread state, keyed by thread id, each built in one call under the
    # runtime's lock (a walk of the states from Python could meet one freed meanwhile).
    return len(sys._current_exceptions().keys() - sys._current_frames().keys())


@atexit.register
def _disarm_exports() -> None:
    # A ctypes callback entered after the interpreter is finalised would crash the
    # process (C++ statics of torch or XLA may release tensors that late). Past this
    # point, exports that are still alive leak instead.
    if _stop_foreign_releases is not None:
        # The compiled deleter also covers the consumers that read the deleter field
        # before this rewrite, or are already waiting for the GIL in it: a thread that
        # gets the GIL during finalisation is ended inside XLA's noexcept destructors,
        # and the process aborts (see _speedups_c/deleters.c). A ctypes callback cannot do that:
        # it asks for the GIL before any of our code runs.
        _stop_foreign_releases(2000)
    else:
        # What the ctypes deleter can have instead: a call already waiting for the GIL
        # is let in now, while it is still safe to take, and one under way (its owner's
        # release may have dropped the GIL) finishes. Bounded by the clock (each sleep
        # may wait a switch interval for the GIL back), since a thread state without a
        # frame may also be a native thread that released the GIL for good.
        end = time.monotonic() + 0.05
        while (_DELETER_CALLS or (_EXPORTS and _threads_without_a_frame() > 0)) and (
                time.monotonic() < end):
            time.sleep(0.001)
    write = ctypes.memmove
    noop = struct.pack("@P", _NOOP_ADDR)
    while True:
        try:  # a collection while the list is built may run a deleter (3.10, 3.11)
            live = list(_EXPORTS.items())
            break
        except RuntimeError:
            continue
    for p, (_buf, _owner, offset) in live:
        write(p + offset, noop, len(noop))


_buffer_types: dict[int, Any] = {}
_packers: dict[tuple[bool, int], Any] = {}


def _packer(versioned: bool, ndim: int) -> Any:
    fmt = (_V_HEAD + _TENSOR) if versioned else ("@" + _TENSOR + "PP")
    packer = struct.Struct(f"{fmt}{ndim}q{ndim}q").pack_into
    _packers[versioned, ndim] = packer
    return packer


def _buffer_type(nbytes: int) -> Any:
    t = ctypes.c_uint64 * (nbytes // 8)
    _buffer_types[nbytes] = t
    return t


def make_capsule(
    *,
    data: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    code: int,
    bits: int,
    lanes: int = 1,
    device_type: int,
    device_id: int,
    flags: int,
    owner: object,
    versioned: bool,
) -> object:
    """Export memory as a fresh ``dltensor_versioned`` (DLPack 1.3) or legacy ``dltensor`` capsule.

    ``strides`` are in elements. ``owner`` is kept alive until the consumer calls
    the deleter, or, if nobody consumes the capsule, until the capsule is
    destroyed. An empty tensor (a zero in ``shape``) is exported with a NULL data
    pointer. ``flags`` is dropped for a legacy capsule, which has no field for it.
    """
    ndim = len(shape)
    if ndim > MAX_NDIM or len(strides) != ndim:
        raise FormatError(
            f"cannot export rank {ndim} with {len(strides)} strides (rank limit {MAX_NDIM})",
            field="shape",
        )
    if 0 in shape:
        data = 0
    head = _V_SIZE if versioned else _L_SIZE
    nbytes = head + 16 * ndim
    buf = (_buffer_types.get(nbytes) or _buffer_type(nbytes))()
    p = _addressof(buf)
    # shape and strides live right after the struct, also for rank 0: a valid
    # (empty) array is safer than NULL for consumers older than DLPack 1.3.
    shape_p = p + head
    strides_p = shape_p + 8 * ndim
    holder = (buf, owner, _V_DELETER_OFFSET if versioned else _L_DELETER_OFFSET)
    pack = _packers.get((versioned, ndim)) or _packer(versioned, ndim)
    if versioned:
        pack(buf, 0, DLPACK_VERSION[0], DLPACK_VERSION[1], id(holder), _DELETER_ADDR, flags,
             data, device_type, device_id, ndim, code, bits, lanes, shape_p, strides_p, 0,
             *shape, *strides)  # fmt: skip
    else:
        pack(buf, 0, data, device_type, device_id, ndim, code, bits, lanes, shape_p, strides_p,
             0, id(holder), _DELETER_ADDR, *shape, *strides)  # fmt: skip
    _EXPORTS[p] = holder
    try:
        return _PyCapsule_New(p, _NAME_V if versioned else _NAME_L, _DESTRUCTOR_ADDR)
    except BaseException:
        del _EXPORTS[p]
        raise


# -- imports --------------------------------------------------------------------------------

# Foreign memory is read through a ctypes array placed over it (from_address does not
# copy) and unpacked in one go: cheaper than string_at, which copies and converts.
_V_HEAD_SIZE = struct.calcsize(_V_HEAD)  # 32: everything a future major keeps in place
_unpack_v_head = struct.Struct(_V_HEAD).unpack_from
_unpack_tensor = struct.Struct("@" + _TENSOR).unpack_from
_unpack_legacy = struct.Struct("@" + _TENSOR + "PP").unpack_from
_at_v_head = (ctypes.c_char * _V_HEAD_SIZE).from_address
_at_tensor = (ctypes.c_char * (_V_SIZE - _V_HEAD_SIZE)).from_address
_at_legacy = (ctypes.c_char * _L_SIZE).from_address
# rank -> (unpack, at) for the shape and strides arrays, built on first use.
_dims_readers: list[tuple[Any, Any] | None] = [None] * (MAX_NDIM + 1)


def _dims_reader(ndim: int) -> tuple[Any, Any]:
    reader = (struct.Struct(f"@{ndim}q").unpack_from, (ctypes.c_int64 * ndim).from_address)
    _dims_readers[ndim] = reader
    return reader


_foreign_deleters: dict[int, Any] = {}
# Foreign deleters run with the GIL held, as NumPy's and PyTorch's consumers call them.
_ForeignDeleterFn = ctypes.PYFUNCTYPE(None, _c_void_p)


def _call_deleter(p: int, deleter: int) -> None:
    if deleter == _DELETER_ADDR:
        _EXPORTS.pop(p, None)  # our own export, taken back: skip the C round trip
        return
    if not deleter:
        return
    fn = _foreign_deleters.get(deleter)
    if fn is None:
        if len(_foreign_deleters) >= 64:  # a producer making a deleter per tensor
            _foreign_deleters.clear()
        fn = _foreign_deleters[deleter] = _ForeignDeleterFn(deleter)
    fn(p)


class _ManagedTensor:
    """Owns one consumed managed struct; its deleter runs once, when this object goes."""

    __slots__ = ("__weakref__", "_deleter", "_managed")

    def __init__(self, managed: int, deleter: int) -> None:
        self._managed = managed
        self._deleter = deleter

    def release(self, _call: Any = _call_deleter) -> None:
        """Run the producer's deleter now (idempotent); the memory must no longer be used."""
        managed, self._managed = self._managed, 0
        if managed:
            _call(managed, self._deleter)

    __del__ = release

    def __repr__(self) -> str:
        state = f"0x{self._managed:x}" if self._managed else "released"
        return f"<DLPack managed tensor {state}>"


class DLView:
    """What a consumed capsule describes: a plain record, no behaviour.

    ``data`` is the address of element ``[0, ..., 0]`` (``byte_offset`` folded in)
    and 0 for a tensor without elements; ``strides`` are in elements, ``None``
    when the producer passed NULL strides (compact row-major), and ``()`` for
    rank 0. ``owner`` keeps the producer's memory alive: the producer's deleter
    runs exactly once, when ``owner`` is garbage-collected.
    """

    __slots__ = (
        "bits",
        "code",
        "data",
        "device_id",
        "device_type",
        "flags",
        "lanes",
        "owner",
        "shape",
        "strides",
        "versioned",
    )

    data: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    code: int
    bits: int
    lanes: int
    device_type: int
    device_id: int
    flags: int
    versioned: bool
    owner: object

    def __init__(
        self,
        data: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...] | None,
        code: int,
        bits: int,
        lanes: int,
        device_type: int,
        device_id: int,
        flags: int,
        versioned: bool,
        owner: object,
    ) -> None:
        self.data = data
        self.shape = shape
        self.strides = strides
        self.code = code
        self.bits = bits
        self.lanes = lanes
        self.device_type = device_type
        self.device_id = device_id
        self.flags = flags
        self.versioned = versioned
        self.owner = owner

    def __repr__(self) -> str:
        return (
            f"DLView(data=0x{self.data:x}, shape={self.shape}, strides={self.strides}, "
            f"dtype=({self.code}, {self.bits}, {self.lanes}), "
            f"device=({self.device_type}, {self.device_id}), flags={self.flags}, "
            f"versioned={self.versioned})"
        )


def capsule_name(capsule: object) -> str | None:
    """The name of a PyCapsule, or ``None`` for an unnamed capsule or any other object."""
    if type(capsule) is not _CAPSULE_TYPE:
        return None
    name = _PyCapsule_GetName(capsule)
    return None if name is None else name.decode("utf-8", "backslashreplace")


def consume_capsule(capsule: object) -> DLView:
    """Take ownership of a DLPack capsule and describe the tensor in it.

    The capsule is renamed to its ``used_`` name. On every failure after that
    point the producer's deleter has already run when the error is raised.
    """
    # The refusals' texts live in functions of their own (below) so that this hand-off
    # path reads in one screen; the path itself makes no call of the bridge's but these.
    if type(capsule) is not _CAPSULE_TYPE:
        raise FormatError(
            f"expected a DLPack capsule, got a {type(capsule).__name__} object", field="capsule"
        )
    name = _PyCapsule_GetName(capsule)
    if name == _NAME_V:
        versioned = True
    elif name == _NAME_L:
        versioned = False
    else:
        raise _not_a_fresh_capsule(name)
    p: int = _PyCapsule_GetPointer(capsule, name)
    _PyCapsule_SetName(capsule, _USED_V if versioned else _USED_L)
    # From here on the struct is ours: every way out must run its deleter once.

    if versioned:
        major, minor, _ctx, deleter, flags = _unpack_v_head(_at_v_head(p))
        managed = _ManagedTensor(p, deleter or 0)
        if major != DLPACK_VERSION[0]:
            # Another major may lay out everything after `flags` differently: read nothing more.
            raise _released(managed, UnsupportedError(
                f"DLPack {major}.{minor} tensors are not supported "
                f"(this build reads major version {DLPACK_VERSION[0]})"
            ))
        data, dev_type, dev_id, ndim, code, bits, lanes, shape_p, strides_p, offset = (
            _unpack_tensor(_at_tensor(p + _V_HEAD_SIZE))
        )
    else:
        (data, dev_type, dev_id, ndim, code, bits, lanes, shape_p, strides_p, offset, _ctx,
         deleter) = _unpack_legacy(_at_legacy(p))  # fmt: skip
        managed = _ManagedTensor(p, deleter or 0)
        flags = 0

    if not 0 <= ndim <= MAX_NDIM:
        raise _released(managed, FormatError(
            f"DLPack tensor has rank {ndim}, outside 0..{MAX_NDIM} "
            f"(the Hurray rank limit is {MAX_NDIM})",
            field="ndim",
        ))
    if ndim == 0:
        shape: tuple[int, ...] = ()
        strides: tuple[int, ...] | None = ()
    else:
        if not shape_p:
            raise _released(managed, FormatError(
                f"DLPack tensor of rank {ndim} has a NULL shape", field="shape"))
        unpack, at = _dims_readers[ndim] or _dims_reader(ndim)
        shape = unpack(at(shape_p))
        if min(shape) < 0:
            raise _released(managed, FormatError(
                f"DLPack tensor has a negative dimension: {shape}", field="shape"))
        # NULL strides: compact row-major, as producers before DLPack 1.2 may send.
        strides = unpack(at(strides_p)) if strides_p else None
    if lanes != 1:
        raise _released(managed, UnsupportedError(
            f"DLPack vector types are not supported (dtype code {code}, bits {bits}, "
            f"lanes {lanes}; lanes must be 1)"
        ))
    if 0 in shape:
        data = 0  # no elements: never hand on a pointer nobody may dereference
    else:
        data = _element_address(managed, data, offset, shape, strides, bits)
    return DLView(
        data, shape, strides, code, bits, lanes, dev_type, dev_id, flags, versioned, managed
    )


def _not_a_fresh_capsule(name: bytes | None) -> FormatError:
    """The refusal of a capsule that is not an unconsumed DLPack tensor, before it is touched."""
    if name == _USED_V or name == _USED_L:
        return FormatError(
            f"DLPack capsule already consumed (name {name.decode()!r}); "
            "a capsule can be consumed only once",
            field="capsule",
        )
    return FormatError(
        f"not a DLPack tensor capsule: name {name!r}, expected 'dltensor_versioned' "
        "or 'dltensor'",
        field="capsule",
    )


def _released(managed: _ManagedTensor, exc: HurrayError) -> HurrayError:
    """``exc``, once the producer's deleter has run: a refusal after the capsule is ours."""
    managed.release()
    return exc


_I64_MAX = (1 << 63) - 1
_U64_MAX = (1 << 64) - 1
_ADDRESS_END = 1 << 64  # one past the last byte of a 64-bit address space
_I64_MIN = -(1 << 63)


def _element_address(managed: _ManagedTensor, data: int, offset: int, shape: tuple[int, ...],
                     strides: tuple[int, ...] | None, bits: int) -> int:
    """The address of element ``[0, ..., 0]`` of a tensor with elements, once its bytes are
    known to lie in the address space (buffer-protocol.md §1); refuses the capsule otherwise.

    Every sum and product here is exact (Python integers): nothing can wrap. An element
    counts as at least one byte (packed sub-byte data takes less, never more).
    """
    if not data:
        managed.release()
        extra = f" and byte_offset {offset}" if offset else ""
        raise FormatError(
            f"NULL data pointer{extra} for a tensor of {prod(shape)} elements (shape {shape}); "
            "only a tensor without elements may have NULL data",
            field="data",
        )
    p = data + offset
    if p >= _ADDRESS_END:
        managed.release()
        raise FormatError(
            f"data 0x{data:x} + byte_offset {offset} = 0x{p:x} is past 2**64 - 1, outside the "
            "64-bit address space",
            field="byte_offset",
        )
    isz = (bits + 7) >> 3 or 1
    if not strides:  # NULL (compact row-major), or rank 0
        lo, hi = 0, prod(shape) - 1  # in elements, from element [0, ..., 0]
    else:
        if min(strides) == _I64_MIN:
            managed.release()
            i = strides.index(_I64_MIN)
            raise FormatError(
                f"strides[{i}] = {_I64_MIN} is outside [-(2**63 - 1), 2**63 - 1] (strides "
                f"{strides}, shape {shape})",
                field="strides",
            )
        lo = hi = 0
        for d, s in zip(shape, strides):
            if s < 0:
                lo += (d - 1) * s
            else:
                hi += (d - 1) * s
    if strides and prod(shape) > _U64_MAX:  # strides of 0 (a broadcast): few bytes, or not
        managed.release()
        raise FormatError(
            f"shape {shape} has {prod(shape)} elements, more than 2**64 - 1 (the format's "
            f"element count is 64-bit), though strides {strides} make them share memory",
            field="shape",
        )
    first = p + lo * isz
    end = p + (hi + 1) * isz
    span = end - first
    if span > _I64_MAX or first < 0 or end > _ADDRESS_END:
        managed.release()
        field = "shape" if strides is None else "strides"
        what = f"shape {shape}" + ("" if strides is None else f", strides {strides}")
        if span > _I64_MAX:
            why = (f"spans {span} bytes ({isz}-byte elements), more than 2**63 - 1, the "
                   "most any memory object can hold")
        elif first < 0:
            why = (f"reaches {-first} bytes below address 0 from 0x{p:x}: outside the "
                   "64-bit address space")
            field = "strides"
        else:
            why = (f"ends {end - _ADDRESS_END} bytes past 2**64 (from 0x{p:x}, {span} "
                   "bytes): outside the 64-bit address space")
            field = "data" if field == "shape" else field
        raise FormatError(f"the tensor of {what} {why}", field=field)
    return p



def request_capsule(
    obj: Any,
    *,
    stream: Any = None,
    copy: bool | None = None,
    dl_device: tuple[int, int] | None = None,
) -> object:
    """Ask ``obj.__dlpack__`` for a capsule, versioned if the producer can make one.

    ``max_version=(1, 3)`` is always sent; ``stream``, ``copy`` and ``dl_device``
    only when not ``None``. A producer that predates those keywords (it raises
    ``TypeError``) is asked again with ``stream`` alone, as the array API standard
    recommends; it then cannot have honoured ``copy`` or ``dl_device``, which the
    caller sees in the capsule (legacy, no ``IS_COPIED`` flag, its own device).
    Producers may answer with a legacy capsule anyway (JAX does);
    :func:`consume_capsule` goes by the capsule's name.
    """
    try:
        method = obj.__dlpack__
    except AttributeError:
        raise UnsupportedError(
            f"{type(obj).__module__}.{type(obj).__qualname__} does not implement __dlpack__"
        ) from None
    kwargs: dict[str, Any] = {"max_version": DLPACK_VERSION}
    if stream is not None:
        kwargs["stream"] = stream
    if copy is not None:
        kwargs["copy"] = copy
    if dl_device is not None:
        kwargs["dl_device"] = dl_device
    try:
        return method(**kwargs)
    except TypeError:
        if stream is None:
            return method()
        return method(stream=stream)
