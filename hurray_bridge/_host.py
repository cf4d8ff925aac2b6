"""Host arrays: NumPy views of host memory, the one host path every adapter shares.

NumPy is the core's compute kernel (reached through ``_numpy.py``), and a NumPy array
is the form in which adapters hand host memory to each other's kernels: the NumPy
adapter, JAX's sub-byte and shard assembly, Arrow's sparse buffers and CuPy's host
copies all view host memory through the functions here, so that no adapter imports
another. Importing this module imports NumPy (only adapters and NumPy-computing steps
import it; ``import hurray_bridge`` does not).

NumPy's own DLPack refuses bfloat16, float8 and the sub-byte ml_dtypes types; the
functions here read and build arrays from their pointer, shape and strides instead, so
every type of the element-type table that ml_dtypes knows comes through zero-copy.
ml_dtypes stores one sub-byte element per byte: those arrays are Hurray's padded form.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from . import _subbyte
from ._copy_policy import check_copy, warn_copy
from ._memory import _byte_array, _byte_arrays, host_array
from ._numpy import ml_dtypes, numpy
from .dtypes import DType, bool8, native_types
from .errors import (
    BackendNotAvailableError,
    CopyRequiredError,
    UnsupportedError,
    not_a_tensor,
)
from .tensor import CPU, Tensor, host_copy

_CPU = CPU.type  # a plain int: tensor_view is the hot path of every host export

if TYPE_CHECKING:
    import numpy as np
else:
    np = numpy()

__all__ = ["bool8_dirty", "check_sizes", "clean_bool8", "dense_bytes", "dtype_of",
           "from_hurray", "native_dtype", "native_dtypes", "tensor_view", "to_hurray"]

# The element-type table's column, the kernel's own module name, and the name that
# copies and refusals on this path report.
_NAME = np.__name__


def _resolve(entry: str) -> Any:
    module, _, name = entry.partition(":")
    if module == _NAME:
        return np.dtype(getattr(np, name))
    try:
        extra = ml_dtypes()
    except BackendNotAvailableError:
        return None
    t = getattr(extra, name, None)
    return None if t is None else np.dtype(t)


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[DType, np.dtype], dict[np.dtype, DType]]:
    to_np = native_types(_NAME, _resolve)
    from_np = {v: k for k, v in to_np.items()}
    # The per-call lookups: keyed by tag (hashing a DType hashes all its fields, two of
    # them enums with Python-level __hash__), filled here once.
    _BY_TAG.update((d.tag, v) for d, v in to_np.items())
    _FROM_NP.update(from_np)
    for d, v in to_np.items():
        try:
            np.empty(1, v).data  # noqa: B018  (a buffer export, or the error)
        except (ValueError, TypeError, BufferError):
            continue  # ml_dtypes types have no buffer-protocol format
        _BUFFER_TAGS.add(d.tag)
    _DENSE.update((v, d) for d, v in to_np.items()
                  if d.tag in _BUFFER_TAGS and d.tag != _BOOL8_TAG and d.bits >= 8)
    return to_np, from_np


_BY_TAG: dict[int, np.dtype] = {}
_FROM_NP: dict[np.dtype, DType] = {}
# The dtypes whose arrays dense_bytes takes (whole-byte, buffer-exporting, not bool8): one
# lookup per array where the three tests cost three.
_DENSE: dict[np.dtype, DType] = {}
_BOOL8_TAG = bool8.tag
_BUFFER_TAGS: set[int] = set()  # element types whose arrays export a buffer (see to_hurray)
_addressof = ctypes.addressof
_from_buffer = ctypes.c_char.from_buffer
_ndarray = np.ndarray
_frombuffer = np.frombuffer


def native_dtype(dtype: DType) -> np.dtype:
    """The NumPy dtype of a Hurray element type (ml_dtypes for the extended ones)."""
    dt = _BY_TAG.get(dtype.tag)
    if dt is not None:
        return dt
    try:
        return _tables()[0][dtype]
    except KeyError:
        if dtype.numpy and dtype.numpy.startswith("ml_dtypes:"):
            raise BackendNotAvailableError("ml_dtypes", _NAME,
                                           f"NumPy needs ml_dtypes for {dtype.name}") from None
        raise UnsupportedError(f"NumPy has no dtype for {dtype.name}") from None


def native_dtypes() -> dict[DType, np.dtype]:
    """Every Hurray element type NumPy holds (ml_dtypes for the extended ones), with its dtype."""
    return dict(_tables()[0])


def dtype_of(dt: np.dtype) -> DType:
    """The Hurray element type of a NumPy dtype."""
    d = _FROM_NP.get(dt)
    if d is not None:
        return d
    try:
        return _tables()[1][dt]
    except KeyError:
        raise UnsupportedError(
            f"NumPy dtype {dt} has no Hurray element type (supported: "
            f"{', '.join(sorted(d.name for d in _tables()[0]))})"
        ) from None


# --------------------------------------------------------------------- to Hurray
def dense_bytes(obj: Any) -> tuple[DType, tuple[int, ...], memoryview] | None:
    """A plain NumPy array's element type, shape and bytes (a flat read-only-or-not view
    of its memory), when a writer may copy those bytes as they are: an ``np.ndarray``
    (no subclass) holding elements, C-contiguous, in native byte order, of a whole-byte
    type of the table other than bool8 (whose bytes a writer checks) that NumPy exports
    through the buffer protocol. Else None, and the writer takes the general path
    (:func:`to_hurray`).

    A save of many small arrays spends most of its time building an hb.Tensor per array;
    this is what the file needs of one, at a fifth of the cost.
    """
    if type(obj) is not _ndarray:
        return None
    dtype = _DENSE.get(obj.dtype)
    if dtype is None:
        if _FROM_NP:
            return None
        _tables()  # (the first call fills the lookups)
        dtype = _DENSE.get(obj.dtype)
        if dtype is None:
            return None
    view = memoryview(obj)  # type: ignore[arg-type]  # (ndarray exports a buffer)
    if not view.c_contiguous or not view.nbytes:
        return None  # (a view with no bytes cannot be cast)
    return dtype, obj.shape, view.cast("B")


def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A NumPy array (or scalar) as an hb.Tensor; zero-copy unless ``copy=True``."""
    if type(obj) is _ndarray:
        a, copied = obj, False
    else:
        a = obj if isinstance(obj, np.ndarray) else np.asarray(obj)
        copied = a is not obj and not isinstance(obj, np.generic)
    dt = a.dtype
    if not dt.isnative:
        if copy is False:
            raise CopyRequiredError(f"array has non-native byte order ({a.dtype}); copy=False")
        a = a.astype(a.dtype.newbyteorder("="))
        dt = a.dtype
        copied = True
    dtype = _FROM_NP.get(dt) or dtype_of(dt)
    strides = None
    flags = a.flags
    if not a.size:
        ptr = 0
    elif flags.c_contiguous:
        # The address through the buffer protocol: __array_interface__ builds a whole
        # dict for it (~7x the cost). Writable arrays with a buffer format only.
        if flags.writeable and dtype.tag in _BUFFER_TAGS:
            ptr = _addressof(_from_buffer(a))  # type: ignore[arg-type]
        else:
            ptr = a.__array_interface__["data"][0]
    else:
        isz = a.itemsize
        if any(s % isz for s in a.strides):
            if copy is False:
                raise CopyRequiredError(f"strides {a.strides} are not multiples of itemsize {isz}")
            a, copied = np.ascontiguousarray(a), True
            flags = a.flags
        else:
            strides = tuple(s // isz for s in a.strides)
        ptr = a.__array_interface__["data"][0]
    t = Tensor._dense(ptr, a.shape, dtype, strides=strides, padded=dtype.bits < 8, device=CPU,
                      owner=a, readonly=not flags.writeable, copied=copied)
    return t.copy() if copy else t


# ------------------------------------------------------------------- from Hurray
def _unpacked(t: Tensor) -> np.ndarray:
    """A packed sub-byte or 1-bit tensor as the padded NumPy array (a copy)."""
    raw = np.frombuffer(t.memoryview(), np.uint8)
    n = 1
    for d in t.shape:
        n *= d
    codes = _subbyte.unpack(raw, n, t.dtype.bits).reshape(t.shape)
    if t.dtype.bits == 1:
        return codes.astype(np.bool_)
    return codes.view(native_dtype(t.dtype))


_INTP_MAX = int(np.iinfo(np.intp).max)


def check_sizes(shape: tuple[int, ...], itemsize: int) -> None:
    """NumPy's own size limits, which hold for arrays without elements too: every
    dimension, and the product of the non-zero ones times the item size, fit in intp."""
    n = itemsize
    for d in shape:
        if d > _INTP_MAX:
            raise UnsupportedError(
                f"NumPy cannot hold shape {list(shape)}: dimension {d} is above {_INTP_MAX} "
                f"(2**{_INTP_MAX.bit_length()} - 1), NumPy's largest (intp); convert to torch "
                "or keep the hb.Tensor")
        if d:
            n *= d
    if n > _INTP_MAX:
        raise UnsupportedError(
            f"NumPy cannot hold shape {list(shape)} of {itemsize}-byte elements: the product of "
            f"its non-zero dimensions times the item size is {n}, above "
            f"2**{_INTP_MAX.bit_length()} - 1 (NumPy's limit, for arrays without elements "
            "too); convert to torch or keep the hb.Tensor")


def tensor_view(t: Tensor) -> Any:
    """The NumPy array over an hb.Tensor's memory, for the common hand-off: compact CPU
    memory of a whole-byte type, holding elements. ``NotImplemented`` for any other
    tensor (:func:`from_hurray` then takes its general steps).

    What ``from_hurray(t)`` gives such a tensor, and never a copy: hb.convert's shortcut
    for an hb.Tensor to NumPy (``_shortcuts.learn``) is this function.
    """
    if not (t._strides is None and t._device.type == _CPU and (t._desc is None or t.is_dense)):
        return NotImplemented
    # An array over the same memory, through the buffer protocol of a ctypes array that
    # holds t (and so its producer's memory). np.frombuffer is ~2.5x cheaper than
    # np.ndarray(buffer=). (Tensor's slots are read directly here: a property costs 2-3x a
    # slot read.)
    dtype = t._dtype
    nbytes = t._nbytes
    if not nbytes or dtype.bits < 8:
        return NotImplemented
    dt = _BY_TAG.get(dtype.tag) or native_dtype(dtype)
    # host_array(t._data, nbytes, t), inlined (a call is a tenth of this path).
    buf = (_byte_arrays.get(nbytes) or _byte_array(nbytes)).from_address(t._data)
    buf._hb_owner = t
    out = _frombuffer(memoryview(buf).toreadonly() if t._readonly else buf, dt)
    shape = t._shape
    return out if len(shape) == 1 else out.reshape(shape)


tensor_view_python = tensor_view


def _compiled_tensor_view() -> Any:
    """:func:`tensor_view` with the read-only views made in C (``_speedups``' NumPy entry
    of hb.Tensor: one array, no ctypes holder), the Python function answering every other
    tensor; ``None`` without the compiled module. The same arrays, but for their base: the
    tensor itself, which keeps the memory alive and lends no writable buffer, so that the
    array can no more be made writable than the Python view's read-only memoryview."""
    from . import _exchange

    core = getattr(np, "_core", None) or np.core
    descrs = {d: native_dtype(d) for d in native_dtypes() if d.bits >= 8}
    return _exchange.numpy_entry(Tensor, core._multiarray_umath._ARRAY_API, np.ndarray,
                                 descrs, tensor_view_python)


tensor_view = _compiled_tensor_view() or tensor_view_python


def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None) -> np.ndarray:
    """An hb.Tensor as a NumPy array: a view of its memory unless a copy is needed or asked."""
    if type(t) is not Tensor and not isinstance(t, Tensor):
        raise not_a_tensor(t, _NAME)
    if device is None and not copy:
        out = tensor_view(t)
        if out is not NotImplemented:
            return out
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if device is not None and device not in ("cpu", CPU):
        raise UnsupportedError(f"NumPy arrays live on the CPU; device={device!r} is not possible")
    if not t.is_dense:
        raise UnsupportedError(
            f"NumPy has no {t.descriptor.layout.name} arrays; densify the tensor first"
        )
    check_sizes(t.shape, (t.dtype.bits + 7) >> 3)
    if not t.device.is_host_accessible:
        if copy is False:
            raise CopyRequiredError(f"a {t.device} tensor needs a copy to reach NumPy; copy=False")
        # The producer copies to host on the consumer's behalf (dl_device=CPU); a
        # producer that answers with device memory anyway is refused there.
        return from_hurray(host_copy(t, "NumPy"), copy=False)
    if t.dtype.is_subbyte and not t.descriptor.padded:
        if copy is False:
            raise CopyRequiredError(
                f"packed {t.dtype.name} must be unpacked (NumPy stores one element per byte); "
                "copy=False"
            )
        if copy is None:
            warn_copy(_NAME, f"packed {t.dtype.name} unpacked to one element per byte")
        return _unpacked(t)
    dt = native_dtype(t.dtype)
    shape = t.shape
    if t.nbytes == 0:
        # No allocation for an empty result; writable exactly when the source is.
        out = np.ndarray(shape, dt, buffer=b"" if t.readonly else bytearray())
        return out.copy() if copy else out
    buf = t.memoryview()  # keeps t (and so the producer's memory) alive
    isz = dt.itemsize
    if t.strides is None:
        out = np.ndarray(shape, dt, buffer=buf)
    else:
        offset = (t.data_ptr - t.buffers[0].ptr)
        # A size-1 dimension's stride is never used: one beyond intp becomes 0.
        out = np.ndarray(shape, dt, buffer=buf, offset=offset,
                         strides=tuple(s * isz if d != 1 or abs(s * isz) <= _INTP_MAX else 0
                                       for d, s in zip(shape, t.strides)))
    if copy:
        return out.copy()
    return out


def bool8_dirty(data: int, nbytes: int, owner: object) -> bool:
    """Whether the ``nbytes`` bool8 bytes at host address ``data`` (elements only, no
    gaps) hold a byte other than 0x00 and 0x01: one NumPy pass. The spec lets a reader
    not look; a framework known to misread such bytes (JAX, TensorFlow, Paddle, MLX read
    2 or 255 as neither false nor true) is handed a :func:`clean_bool8` copy instead."""
    return nbytes > 0 and int(_np_max(np.frombuffer(host_array(data, nbytes, owner),
                                                     np.uint8))) > 1


def clean_bool8(t: Tensor) -> Tensor:
    """Make every byte of compact host bool8 ``t`` other than 0x00 into 0x01 (the truth value
    NumPy's ``a != 0`` gives), in place: ``t`` is the caller's own copy. Returns ``t``."""
    if t.nbytes:
        view = np.frombuffer(host_array(t.data_ptr, t.nbytes, t), np.uint8)
        np.not_equal(view, 0, out=view.view(np.bool_))
    return t


_np_max = np.max
