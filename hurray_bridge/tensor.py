"""``hb.Tensor``: a descriptor, its buffers, and the owner that keeps them alive.

A Tensor made from a DLPack producer points into the producer's memory (no
copy) and holds the producer's managed tensor; the producer's deleter runs
exactly once, when the last reference to that memory dies. A Tensor is
itself a DLPack producer, so ``numpy.from_dlpack(t)``, ``torch.from_dlpack(t)``
and ``jax.numpy.from_dlpack(t)`` accept it directly.
"""

from __future__ import annotations

import ctypes
import operator
from collections.abc import Sequence
from math import prod
from typing import Any, NamedTuple

from . import _capsule, _exchange, _subbyte
from ._copy_policy import check_copy
from ._dlpack import (
    DLPACK_VERSION,
    FLAG_IS_COPIED,
    FLAG_IS_SUBBYTE_TYPE_PADDED,
    FLAG_READ_ONLY,
    DLDeviceType,
)
from ._memory import alloc_aligned, host_view
from .descriptor import Descriptor, compact_strides, dense_descriptor, form_name
from .dtypes import DType, dtype_from_dlpack
from .errors import CopyRequiredError, FormatError, UnsupportedError
from .layout import BufferRole, Layout

__all__ = [
    "CPU", "Buffer", "Device", "Tensor", "canonical_bytes", "from_dlpack", "from_native",
    "from_producer",
    "host_copy",
]

_D = DLDeviceType
# Plain ints, not enum members: these are read on every import and export, where an
# IntEnum comparison costs more than an int one.
_CPU = int(_D.kDLCPU)
_PINNED = frozenset({int(_D.kDLCUDAHost), int(_D.kDLROCMHost)})
# Device types whose memory the host can read directly (pinned and managed memory).
_HOST_ACCESSIBLE = frozenset({_CPU, *_PINNED, int(_D.kDLCUDAManaged)})
# Devices where DLPack's stream argument means something.
_STREAMED = frozenset({int(_D.kDLCUDA), int(_D.kDLROCM), int(_D.kDLCUDAManaged)})


class Device(NamedTuple):
    """A DLPack device: ``(device_type, device_id)``."""

    type: int
    id: int = 0

    @property
    def is_host_accessible(self) -> bool:
        return self.type in _HOST_ACCESSIBLE

    def __str__(self) -> str:
        try:
            name = DLDeviceType(self.type).name.removeprefix("kDL").lower()
        except ValueError:
            name = f"device{self.type}"
        return f"{name}:{self.id}"


CPU = Device(_CPU, 0)
"""The host: DLPack device type 1 (``kDLCPU``), id 0."""
_I64_MAX = 2**63 - 1
_new = object.__new__


class Buffer(NamedTuple):
    """One entry of a tensor's buffer table. ``ptr`` is 0 for a zero-length buffer."""

    role: BufferRole
    ptr: int
    nbytes: int


_tuple_new = tuple.__new__
_DATA = BufferRole.DATA


def _is_compact(shape: Sequence[int], strides: Sequence[int]) -> bool:
    # Strides of size-1 dimensions carry no information (producers disagree on them).
    expected = 1
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != expected:
            return False
        expected *= d
    return True


class Tensor:
    """A Hurray tensor: descriptor, buffer table, device and owner.

    Most users get one from :func:`hurray_bridge.asarray` or
    :func:`hurray_bridge.from_dlpack`. Building one by hand takes a descriptor
    and one :class:`Buffer` per entry of ``descriptor.buffer_layout()``; the
    caller promises that ``owner`` keeps that memory alive.
    """

    # _base0/_nbytes: buffer 0 (start, length); _data: element [0, ..., 0]. The buffer
    # table itself (_buffers) is built on first use: most hand-offs never read it. _dl
    # belongs to the compiled DLPack export (shape and strides as int64, made on first
    # use by its borrowed DLTensor): unset otherwise.
    __slots__ = (
        "__weakref__",
        "_base0",
        "_buffers",
        "_copied",
        "_data",
        "_desc",
        "_device",
        "_dl",
        "_dtype",
        "_nbytes",
        "_owner",
        "_padded",
        "_readonly",
        "_shape",
        "_source",
        "_strides",
    )

    def __init__(
        self,
        descriptor: Descriptor,
        buffers: Sequence[Buffer | tuple[BufferRole, int, int]],
        *,
        device: Device | tuple[int, int] = CPU,
        owner: object = None,
        readonly: bool = False,
        copied: bool = False,
    ) -> None:
        if not isinstance(descriptor, Descriptor):
            raise UnsupportedError(  # a TypeError too
                f"descriptor must be an hb.Descriptor, got {type(descriptor).__name__}")
        specs = descriptor.buffer_layout()
        try:
            bufs = tuple(Buffer(*b) for b in buffers)
        except TypeError:
            raise UnsupportedError(
                f"buffers must be a sequence of hb.Buffer(role, ptr, nbytes), one per entry of "
                f"descriptor.buffer_layout(), got {buffers!r:.80}") from None
        if len(bufs) != len(specs):
            raise FormatError(
                f"{len(bufs)} buffers given, the descriptor calls for {len(specs)}", field="buffers"
            )
        for i, (b, s) in enumerate(zip(bufs, specs)):
            try:
                BufferRole(b.role)
            except ValueError:
                raise FormatError(f"buffer {i} has role {b.role!r}, which is not a buffer role; "
                                  f"the descriptor calls for {s.role.name}",
                                  field=f"buffers[{i}].role") from None
            if b.role != s.role or b.nbytes != s.nbytes:
                raise FormatError(
                    f"buffer {i} is ({BufferRole(b.role).name}, {b.nbytes} bytes), "
                    f"the descriptor calls for ({s.role.name}, {s.nbytes} bytes)",
                    field=f"buffers[{i}]",
                )
            if b.nbytes and not b.ptr:
                raise FormatError(
                    f"buffer {i} has {b.nbytes} bytes at a NULL pointer", field=f"buffers[{i}]"
                )
        # Zero-length buffers are NULL whatever pointer the caller had (ADR-007 §4).
        bufs = tuple(Buffer(BufferRole(b.role), b.ptr if b.nbytes else 0, b.nbytes) for b in bufs)
        self._desc: Descriptor | None = descriptor
        self._buffers: tuple[Buffer, ...] | None = bufs
        b0 = bufs[0]
        self._base0 = b0.ptr
        self._nbytes = b0.nbytes
        data = b0.ptr
        if b0.nbytes and descriptor.strides is not None:
            data += (
                sum((d - 1) * -s for d, s in zip(descriptor.shape, descriptor.strides) if s < 0)
                * descriptor.dtype.itemsize
            )
        self._data = data
        self._shape = descriptor.shape
        self._dtype = descriptor.dtype
        self._strides = descriptor.strides
        self._padded = descriptor.padded
        try:
            self._device = Device(*device)
        except TypeError:
            raise UnsupportedError(f"device must be a (device_type, device_id) pair (an "
                                   f"hb.Device), got {device!r}") from None
        self._owner = owner
        self._readonly = bool(readonly)
        self._copied = bool(copied)
        self._source: Any = None

    @classmethod
    def _dense(
        cls,
        ptr: int,
        shape: tuple[int, ...],
        dtype: DType,
        *,
        strides: tuple[int, ...] | None,
        padded: bool,
        device: Device,
        owner: object,
        readonly: bool,
        copied: bool,
        source: Any = None,
    ) -> Tensor:
        """Fast constructor for a dense tensor whose element [0..0] is at ``ptr``.

        The descriptor is built (and validated) only when someone asks for it.
        """
        self = _new(cls)
        self._desc = None
        self._buffers = None
        self._shape = shape
        self._dtype = dtype
        self._strides = strides
        self._padded = padded
        self._device = device
        self._owner = owner
        self._readonly = readonly
        self._copied = copied
        self._source = source
        n = prod(shape)
        if n == 0:
            self._base0 = self._data = self._nbytes = 0
            return self
        bits = dtype.bits
        if strides is None:
            self._base0 = self._data = ptr
            self._nbytes = -(-n * bits // 8) if bits < 8 and not padded else n * (bits >> 3 or 1)
            return self
        span, back = 1, 0
        for d, s in zip(shape, strides):
            if s < 0:
                back -= (d - 1) * s
                span -= (d - 1) * s
            else:
                span += (d - 1) * s
        isz = bits >> 3 or 1
        self._data = ptr
        self._base0 = ptr - back * isz
        self._nbytes = span * isz
        return self

    # ------------------------------------------------------------ properties
    @property
    def descriptor(self) -> Descriptor:
        if self._desc is None:
            if self._strides is None:
                self._desc = dense_descriptor(self._shape, self._dtype, self._padded)
            else:
                self._desc = Descriptor(self._shape, self._dtype, Layout.STRIDED,
                                        self._strides, padded=self._padded)
        return self._desc

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> DType:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def layout(self) -> Layout:
        if self._desc is not None:
            return self._desc.layout
        return Layout.ROW_MAJOR if self._strides is None else Layout.STRIDED

    @property
    def strides(self) -> tuple[int, ...] | None:
        """Element strides of a strided tensor; ``None`` when compact row-major."""
        return self._strides

    @property
    def device(self) -> Device:
        return self._device

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        bufs = self._buffers
        if bufs is None:
            bufs = self._buffers = (_tuple_new(Buffer, (_DATA, self._base0, self._nbytes)),)
        return bufs

    @property
    def readonly(self) -> bool:
        """The memory must not be written (e.g. it came from a read-only NumPy array)."""
        return self._readonly

    @property
    def copied(self) -> bool:
        """Some step on the way here copied the data (never silently: this says so)."""
        return self._copied

    @property
    def owner(self) -> object:
        return self._owner

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def is_dense(self) -> bool:
        d = self._desc
        return d is None or (
            d.layout in (Layout.ROW_MAJOR, Layout.STRIDED) and d.quantization is None
        )

    @property
    def data_ptr(self) -> int:
        """Address of element [0, ..., 0] of a dense tensor; 0 when it is empty."""
        return self._data

    def buffer(self, role: BufferRole) -> Buffer:
        for b in self.buffers:
            if b.role == role:
                return b
        raise KeyError(f"this tensor has no {BufferRole(role).name} buffer")

    def memoryview(self, role: BufferRole = BufferRole.DATA) -> memoryview:
        """Raw bytes of one buffer (host memory only); keeps the tensor alive."""
        if self._device.type not in _HOST_ACCESSIBLE:
            raise UnsupportedError(f"cannot view {self._device} memory from the host")
        if role == _DATA and self._buffers is None:
            return host_view(self._base0, self._nbytes, self, self._readonly)
        b = self.buffer(role)
        return host_view(b.ptr, b.nbytes, self, self._readonly)

    def __repr__(self) -> str:
        dims = ", ".join(map(str, self._shape))
        extra = "" if self._strides is None else f", strides={list(self._strides)}"
        d = self._desc
        if d is not None and d.layout.is_sparse and d.sparse is not None:
            extra += f", layout={d.layout.name}, nnz={d.sparse.nnz}"
        if d is not None and d.quantization is not None:
            extra += f", quantization={d.quantization.scheme.name}"
        if self._padded:
            extra += ", padded"
        flags = "".join(
            (", readonly" if self._readonly else "", ", copied" if self._copied else "")
        )
        return (
            f"hb.Tensor(shape=[{dims}], dtype={self._dtype.name}, device={self._device}"
            f"{extra}{flags})"
        )

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        # NumPy calls this, so NumPy is loaded: the adapter imports nothing new.
        from ._numpy import NAME
        from ._registry import get_adapter

        out = get_adapter(NAME).from_hurray(self, copy=copy)
        return out if dtype is None else out.astype(dtype, copy=False)

    # -------------------------------------------------------------- pickling
    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickle as the wire descriptor plus the raw buffers.

        With protocol 5 the buffers travel out of band (``pickle.PickleBuffer``),
        so multiprocessing, concurrent.futures and Ray can move them without a
        copy through the pickle stream. No Python objects of any framework are
        pickled: the receiver rebuilds an hb.Tensor over the bytes it got.
        """
        if not self._device.is_host_accessible:
            raise UnsupportedError(
                f"cannot pickle a {self._device} tensor: its memory is not on the host; "
                "convert it to a host framework first"
            )
        from pickle import PickleBuffer

        from ._trailing import written_pieces
        from .wire import encode

        views = [self.memoryview(b.role) for b in self.buffers]
        # Packed sub-byte data leaves with zero trailing bits, padded with zero high bits: a
        # buffer that has one set travels as a copy (of that buffer only), masked.
        views = [v if len(p) == 1 and p[0] is v else memoryview(bytearray().join(p))
                 for v, p in zip(views, written_pieces(self.descriptor, views))]
        payload: list[Any] = (
            [PickleBuffer(v) for v in views]
            if protocol >= 5
            else [bytes(v) if self._readonly else bytearray(v) for v in views]
        )
        return _rebuild, (encode(self.descriptor), payload, self._readonly)

    # ------------------------------------------------------------------ copy
    def copy(self) -> Tensor:
        """A compact row-major copy in fresh 64-byte aligned host memory."""
        if not self._device.is_host_accessible:
            raise UnsupportedError(
                f"hb.Tensor.copy() copies host memory only; {self._device} needs its framework "
                "(use hb.convert(..., copy=True))"
            )
        if not self.is_dense:
            bufs = []
            owners = []
            for b in self.buffers:
                alloc = alloc_aligned(b.nbytes)
                if alloc is not None:
                    ctypes.memmove(alloc.ptr, b.ptr, b.nbytes)
                owners.append(alloc)
                bufs.append(Buffer(b.role, alloc.ptr if alloc else 0, b.nbytes))
            return Tensor(self.descriptor, bufs, device=CPU, owner=tuple(owners), copied=True)
        n_bytes = (
            Descriptor(self._shape, self._dtype, padded=self._padded).nbytes
            if self._strides is not None
            else self.nbytes
        )
        alloc = alloc_aligned(n_bytes)
        if alloc is not None:
            if self._strides is None:
                ctypes.memmove(alloc.ptr, self._base0, n_bytes)
            else:
                _gather(alloc.ptr, self.data_ptr, self._shape, self._strides, self._dtype.itemsize)
        return Tensor._dense(alloc.ptr if alloc else 0, self._shape, self._dtype, strides=None,
                             padded=self._padded, device=CPU, owner=alloc, readonly=False,
                             copied=True)

    # ------------------------------------------------- Arrow PyCapsule interface
    def _arrow_compact(self) -> bool:
        return self._strides is None or _is_compact(self._shape, self._strides)

    def __arrow_c_schema__(self) -> object:
        """The Arrow type of this tensor as an array, an ``arrow_schema`` capsule: rank 1 a
        primitive type, rank >= 2 ``arrow.fixed_shape_tensor`` over its first dimension
        (docs/spec/interchange.md, "The Arrow PyCapsule interface")."""
        from ._arrow_c import export_schema

        return export_schema(self, self._arrow_compact())

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        """This tensor as an Arrow array over its own memory (no copy): the
        ``arrow_schema`` and ``arrow_array`` capsules of the Arrow PyCapsule interface.

        The array keeps the tensor alive until its consumer releases it. A
        ``requested_schema`` other than the tensor's own type is refused (no cast).
        """
        from ._arrow_c import export_array

        return export_array(self, self._arrow_compact(), requested_schema)

    def __arrow_c_device_array__(self, requested_schema: object = None,
                                 **kwargs: Any) -> tuple[object, object]:
        """:meth:`__arrow_c_array__` with the device: an ``arrow_device_array`` capsule
        (host memory only, with no sync event). Keywords this version does not know are
        accepted when ``None``, as the interface asks, and refused otherwise."""
        from ._arrow_c import export_array

        unknown = {k: v for k, v in kwargs.items() if v is not None}
        if unknown:
            raise UnsupportedError(
                f"__arrow_c_device_array__ got keywords it does not know: {unknown!r}; "
                "this version takes requested_schema only")
        return export_array(self, self._arrow_compact(), requested_schema, device=True)

    # --------------------------------------------------------------- DLPack
    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        t = self._device.type
        try:
            return DLDeviceType(t), self._device.id
        except ValueError:
            return t, self._device.id  # type: ignore[return-value]

    def __dlpack__(
        self,
        *,
        stream: int | Any | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object:
        """Export as a DLPack capsule (Python array API semantics).

        Versioned (DLPack 1.x) when ``max_version >= (1, 0)``, legacy otherwise.
        A device tensor forwards the request to the object it came from, so
        that producer synchronises with the consumer's ``stream``.

        A legacy capsule has no READ_ONLY flag: one of read-only memory is refused
        with ``BufferError`` (as NumPy refuses it) unless ``copy=True`` asks for a
        private copy. ``hb.convert(t, "jax")`` still hands read-only memory to JAX
        without a copy (JAX arrays are immutable).
        """
        return self._export(stream, max_version, dl_device, copy, False)

    def _export(self, stream: Any, max_version: Any, dl_device: Any, copy: Any,
                immutable: bool) -> object:
        """``__dlpack__``; ``immutable``: the consumer never writes what it imports (JAX,
        through :func:`for_immutable_consumer`), so a legacy capsule may carry read-only
        memory."""
        # The refusals' texts live in functions of their own (below the class) so that this
        # hand-off path reads in one screen; the path itself makes no call but the capsule.
        try:
            versioned = max_version is not None and max_version[0] >= 1
        except (TypeError, IndexError, KeyError):
            raise UnsupportedError(f"max_version must be a (major, minor) tuple of integers or "
                                   f"None, got {max_version!r}") from None
        if copy is not None and copy is not True and copy is not False and copy not in (0, 1):
            raise UnsupportedError(f"copy must be True, False or None, got {copy!r}")
        d = self._desc
        if d is not None and (d.layout not in _DENSE_LAYOUTS or d.quantization is not None):
            raise _no_dlpack_form(d)
        device = self._device
        target = device if dl_device is None else _dl_target(dl_device)
        if self._source is not None and device.type not in _HOST_ACCESSIBLE:
            return _forward(self._source, stream, max_version, dl_device, copy)
        if (
            dl_device is not None
            and target != device
            and not (target == CPU and device.type in _HOST_ACCESSIBLE)
        ):
            raise _no_move(device, target, copy)
        if stream is not None and stream != -1 and device.type not in _STREAMED:
            raise UnsupportedError(f"stream must be None on {self._device}, got {stream!r}")
        dl = self._dtype.dlpack
        if dl is None:
            raise _no_dlpack_code(self._dtype)
        src = self
        flags = 0
        if copy:
            src = self.copy()
            flags |= FLAG_IS_COPIED
        elif self._readonly:
            if not versioned and not immutable and self._nbytes:
                raise _legacy_read_only(copy)
            flags |= FLAG_READ_ONLY
        if src._padded:
            if not versioned:
                raise _legacy_padded(self._dtype)
            flags |= FLAG_IS_SUBBYTE_TYPE_PADDED
        code, bits = dl
        shape = src._shape
        if shape and max(shape) > _I64_MAX:
            raise _beyond_int64("a dimension", shape, None)
        strides = src._strides
        if strides is None:
            strides = _COMPACT.get(shape) or _compact(shape)
            if not src._nbytes and strides and max(strides) > _I64_MAX:
                # Only an empty shape can get there ([0, 2**40, 2**40]): sizes, not memory.
                raise _beyond_int64("compact strides", shape, strides)
        return _capsule.make_capsule(
            data=src._data,
            shape=shape,
            strides=strides,
            code=code,
            bits=bits,
            lanes=1,
            device_type=target.type,
            device_id=target.id,
            flags=flags,
            owner=src,
            versioned=versioned,
        )


def _no_dlpack_form(d: Descriptor) -> UnsupportedError:
    """The refusal of a sparse or quantized tensor's export: DLPack carries dense ones only."""
    return UnsupportedError(
        f"a {form_name(d)} tensor has no DLPack form (DLPack carries dense tensors only); "
        "convert it with hb.convert() to a framework that supports it"
    )


def _dl_target(dl_device: Any) -> Device:
    """The device a consumer asked the export for (``dl_device``), as a Device."""
    try:
        return Device(*dl_device)
    except TypeError:
        raise UnsupportedError(f"dl_device must be a (device_type, device_id) pair or None, "
                               f"got {dl_device!r}") from None


def _no_move(device: Device, target: Device, copy: Any) -> UnsupportedError | CopyRequiredError:
    """The refusal of an export to another device: the bridge moves no data itself."""
    if copy is False:
        return CopyRequiredError(f"export to {target} needs a copy from {device} but copy=False")
    return UnsupportedError(
        f"cannot export a {device} tensor to {target}: the bridge does not move "
        "data between devices itself; convert with the framework's adapter"
    )


def _no_dlpack_code(dtype: DType) -> UnsupportedError:
    """The refusal of a type DLPack has no code for."""
    return UnsupportedError(
        f"{dtype.name} has no DLPack type code; convert it with hb.convert() "
        "(for 1-bit bool: to arrow, or unpack to bool8)"
    )


def _legacy_padded(dtype: DType) -> UnsupportedError:
    """The refusal of padded sub-byte data in a legacy capsule, which has no flag for it."""
    return UnsupportedError(
        f"padded {dtype.name} needs a versioned DLPack capsule to say it is "
        "padded; the consumer asked for a legacy one"
    )


def _beyond_int64(what: str, shape: tuple[int, ...], strides: tuple[int, ...] | None
                  ) -> UnsupportedError:
    """The refusal of a shape (or its compact strides) beyond DLPack's int64 fields."""
    if strides is None:
        return UnsupportedError(
            f"shape {list(shape)} has {what} above 2**63 - 1, which DLPack's "
            "int64 shape cannot hold"
        )
    return UnsupportedError(
        f"shape {list(shape)} has {what} {list(strides)}, beyond DLPack's "
        "int64 strides (2**63 - 1); no DLPack consumer can take it")


def _legacy_read_only(copy: Any) -> UnsupportedError | CopyRequiredError:
    """The refusal of a legacy capsule over read-only memory (both are BufferErrors)."""
    # Most callers are a framework's from_dlpack, whose user cannot pass max_version: the
    # advice they can follow comes first, the one for authors of a consumer after it.
    why = ("this hb.Tensor's memory is read-only, and a legacy DLPack capsule (what "
           "jax.numpy.from_dlpack and other consumers ask for when they pass no max_version "
           "or one below (1, 0)) has no READ_ONLY flag to say so: the consumer would get "
           "write access")
    fix = ("use hb.convert(t, 'jax') instead, which hands read-only memory to JAX without a "
           "copy (hb.convert(t, '<framework>') for the others); a DLPack consumer you write "
           "can ask with max_version=(1, 0) or later, where READ_ONLY travels with the "
           "memory, or with copy=True for a private copy")
    if copy is None:
        return UnsupportedError(f"{why}; {fix}")
    return CopyRequiredError(f"{why}, and copy=False forbids the private copy that would be "
                             f"safe; {fix}")


class _ImmutableConsumer:
    """An hb.Tensor as a DLPack producer for a consumer that never writes what it imports.

    JAX arrays are immutable and JAX asks only for legacy capsules, which cannot say
    read-only: for such a consumer, and only through this wrapper, a legacy capsule of
    read-only memory is safe. The bridge's adapters make one for the consumers they
    know to be immutable; everything else goes through ``Tensor.__dlpack__``.
    """

    __slots__ = ("_t",)

    def __init__(self, t: Tensor) -> None:
        self._t = t

    def __dlpack_device__(self) -> tuple[DLDeviceType, int]:
        return self._t.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> object:
        return self._t._export(stream, max_version, dl_device, copy, True)


def for_immutable_consumer(t: Tensor) -> Tensor | _ImmutableConsumer:
    """``t`` as the producer to hand a consumer whose arrays are immutable (JAX).

    A writable tensor is returned as it is; a read-only one is wrapped so that its
    legacy export is allowed (see ``Tensor.__dlpack__``).
    """
    return _ImmutableConsumer(t) if t._readonly else t


_DENSE_LAYOUTS = frozenset({Layout.ROW_MAJOR, Layout.STRIDED})
# Compact strides by shape: exports of the same shapes recur (a model's layers).
_COMPACT: dict[tuple[int, ...], tuple[int, ...]] = {}


def _compact(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(_COMPACT) >= 1024:
        _COMPACT.clear()
    strides = _COMPACT[shape] = compact_strides(shape)
    return strides


def canonical_bytes(t: Tensor) -> bytes:
    """A host tensor's values as compact bytes, sub-byte elements one code per byte.

    Packed and padded forms of the same values (and 1-bit ``bool`` against
    ``bool8``) give the same bytes, so tests and reports compare them directly.
    """
    if not t.descriptor.element_count:
        return b""
    c = t if t.strides is None else t.copy()
    raw = bytes(c.memoryview())
    if not t.dtype.is_subbyte:
        return raw
    bits, n = t.dtype.bits, t.descriptor.element_count
    if c.descriptor.padded:
        mask = (1 << bits) - 1
        return bytes(b & mask for b in raw[:n])
    return bytes(_subbyte.unpack(raw, n, bits))


def _rebuild(desc: bytes, payload: list[Any], readonly: bool) -> Tensor:
    """Unpickle: a Tensor over the buffers pickle handed back.

    No copy, except of a ``bytes`` payload (how pickle carries read-only memory in
    band, or what a caller hands back out of band): an immutable object the bridge
    never shares, since torch would write into it (container.md §8.2). Other
    read-only buffers (an object store's) are shared read-only, as they were handed.
    """
    from ._memory import buffer_address
    from .wire import decode

    d = decode(desc)
    bufs, keep = [], []
    ro = readonly
    for spec, obj in zip(d.buffer_layout(), payload):
        ptr, n, obj_ro, view = buffer_address(obj)
        if n != spec.nbytes:
            raise FormatError(
                f"pickled {spec.role.name} buffer has {n} bytes, "
                f"the descriptor calls for {spec.nbytes}",
                field="buffers",
            )
        keeper: object = view
        if n and isinstance(view.obj, bytes):  # a memoryview of one too
            alloc = alloc_aligned(n)
            assert alloc is not None
            ctypes.memmove(alloc.ptr, ptr, n)
            ptr, obj_ro, keeper = alloc.ptr, False, alloc
        bufs.append(Buffer(spec.role, ptr, n))
        keep.append(keeper)
        ro = ro or (obj_ro and n > 0)  # b"" is read-only but holds nothing to protect
    return Tensor(d, bufs, device=CPU, owner=tuple(keep), readonly=ro)


def _forward(source: Any, stream: Any, max_version: Any, dl_device: Any, copy: Any) -> object:
    kwargs = {
        k: v
        for k, v in (
            ("stream", stream),
            ("max_version", max_version),
            ("dl_device", dl_device),
            ("copy", copy),
        )
        if v is not None
    }
    try:
        return source.__dlpack__(**kwargs)
    except TypeError:
        if "max_version" not in kwargs and "dl_device" not in kwargs and "copy" not in kwargs:
            raise
        # An older producer without the 2023.12 keywords: only stream is safe to pass.
        return source.__dlpack__(**({"stream": stream} if stream is not None else {}))


def _gather(dst: int, src: int, shape: tuple[int, ...], strides: tuple[int, ...], isz: int) -> None:
    """Copy a strided host tensor to compact row-major memory at ``dst``."""
    from ._numpy import loaded

    np = loaded()
    total = prod(shape)
    if np is not None:
        # NumPy is loaded anyway in this process: let it do the strided walk in C.
        # (A size-1 dimension's stride is never used: 0 keeps it within intp.)
        byte_strides = tuple(s * isz if d != 1 else 0 for d, s in zip(shape, strides))
        if len(shape) < 64:
            src_arr = np.lib.stride_tricks.as_strided(
                np.frombuffer((ctypes.c_ubyte * 1).from_address(src), np.uint8, 1),
                shape=(*shape, isz),
                strides=(*byte_strides, 1),
                writeable=False,
            )
            dst_arr = np.frombuffer((ctypes.c_ubyte * (total * isz)).from_address(dst),
                                    np.uint8)
            dst_arr.reshape(*shape, isz)[...] = src_arr
            return
        # Rank 64 is NumPy's limit too: no room for the byte dimension, so each element
        # is one opaque isz-byte item.
        item = np.dtype(f"V{isz}")
        src_arr = np.lib.stride_tricks.as_strided(
            np.frombuffer((ctypes.c_ubyte * isz).from_address(src), item, 1),
            shape=shape, strides=byte_strides, writeable=False)
        dst_arr = np.frombuffer((ctypes.c_ubyte * (total * isz)).from_address(dst), item)
        dst_arr.reshape(shape)[...] = src_arr
        return
    inner = isz * shape[-1] if strides[-1] == 1 else isz
    run_dims = shape[:-1] if strides[-1] == 1 else shape
    pos = dst
    idx = [0] * len(run_dims)
    for _ in range(total * isz // inner):
        off = sum(i * s for i, s in zip(idx, strides)) * isz
        ctypes.memmove(pos, src + off, inner)
        pos += inner
        for k in range(len(run_dims) - 1, -1, -1):
            idx[k] += 1
            if idx[k] < run_dims[k]:
                break
            idx[k] = 0


def _release(view: _capsule.DLView) -> None:
    """Run a refused capsule's deleter now, not whenever the traceback lets go of it."""
    release = getattr(view.owner, "release", None)
    if release is not None:
        release()


def from_dlview(view: _capsule.DLView, source: Any = None, *,
                legacy_mutable: bool = False) -> Tensor:
    """Build a Tensor over the memory a consumed capsule describes (no copy).

    A legacy capsule has no READ_ONLY flag: its memory is read-only unless
    ``legacy_mutable`` says its producer hands out memory that may be written
    (:func:`hurray_bridge._registry.legacy_exports_mutable`).
    A refusal releases the capsule's memory (its deleter runs) before it is raised.
    """
    try:
        dtype = dtype_from_dlpack(view.code, view.bits, view.lanes)
    except UnsupportedError:
        _release(view)
        raise
    padded = bool(view.flags & FLAG_IS_SUBBYTE_TYPE_PADDED) and dtype.is_subbyte
    shape = view.shape
    strides = view.strides
    n = prod(shape)
    if n == 0 or strides is None or _is_compact(shape, strides):
        strides = None
    elif dtype.is_subbyte and not padded:
        _release(view)
        raise FormatError(
            f"packed {dtype.name} with non-compact strides {strides} is not addressable",
            field="strides",
        )
    else:
        # The stride of a size-1 dimension is never multiplied by anything but 0, and
        # producers put anything there. One whose byte stride no int64 holds would make
        # every consumer's byte arithmetic overflow: it becomes the compact value.
        # (Only a size-1 dimension can hold such a stride: the import bounded the span.)
        limit = _I64_MAX // (dtype.itemsize or 1)
        if (max(strides) > limit or min(strides) < -limit) and any(
                d == 1 and not -limit <= st <= limit for d, st in zip(shape, strides)):
            compact = compact_strides(shape)
            strides = tuple(c if d == 1 and not -limit <= st <= limit else st
                            for d, st, c in zip(shape, strides, compact))
    return Tensor._dense(view.data if n else 0, shape, dtype, strides=strides, padded=padded,
                         device=Device(view.device_type, view.device_id), owner=view.owner,
                         readonly=(bool(view.flags & FLAG_READ_ONLY) if view.versioned
                                   else not legacy_mutable),
                         copied=bool(view.flags & FLAG_IS_COPIED), source=source)


_NO_STREAM: Any = object()


# Host memory types: one address space per process, so a device_id says nothing there.
_ONE_HOST = frozenset({_CPU, *_PINNED})


def _reported_device(reported: Any) -> Device:
    """What ``__dlpack_device__`` returned, checked: two non-negative integers.

    ``device_id`` may be ``None`` for host memory (kDLCPU, kDLCUDAHost, kDLROCMHost),
    which has one device only: PaddlePaddle 3.3.1 reports its CPU tensors as
    ``(kDLCPU, None)``, and NumPy and torch accept that. It means device 0. On every
    other device type ``None`` does not say which device, and is refused.
    """
    try:
        dev_type, dev_id = reported
        dev_type = operator.index(dev_type)
        if dev_id is None and dev_type in _ONE_HOST:
            dev_id = 0
        elif dev_id is None and dev_type >= 0:
            kind = str(Device(dev_type)).partition(":")[0]
            raise FormatError(
                f"__dlpack_device__ returned {reported!r}: device_id None is accepted only for "
                "host memory, which has one device (kDLCPU, kDLCUDAHost, kDLROCMHost); on a "
                f"{kind} device it does not say which one holds the memory: the producer "
                "must report a device_id",
                field="device")
        dev = Device(dev_type, operator.index(dev_id))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, FormatError):
            raise
        dev = None
    if dev is None or dev.type < 0 or dev.id < 0:
        raise FormatError(f"__dlpack_device__ returned {reported!r}; expected a (device_type, "
                          "device_id) pair of non-negative integers", field="device")
    return dev


def from_native(obj: Any, copy: bool | None = None) -> Tensor:
    """A dense native array (through its adapter), a DLPack producer or an hb.Tensor as an
    hb.Tensor: ``hb.asarray`` without its routing of sparse and quantized objects, for the
    modules that ``hb.asarray`` routes to (which cannot call it back)."""
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if isinstance(obj, Tensor):
        return obj.copy() if copy else obj
    from ._registry import adapter_for

    adapter = adapter_for(obj)
    if adapter is not None:
        t: Tensor = adapter.to_hurray(obj, copy=copy)
        return t
    return from_producer(obj, copy)


def from_producer(obj: Any, copy: bool | None) -> Tensor:
    """The end of every "any array to hb.Tensor" path: :func:`from_dlpack` for an object
    with ``__dlpack__`` that no adapter claimed, then the Arrow PyCapsule interface
    (``__arrow_c_array__``, ``__arrow_c_device_array__``, ``__arrow_c_stream__``), else
    the error naming what is accepted."""
    if hasattr(obj, "__dlpack__"):
        return from_dlpack(obj, copy=copy)
    from ._arrow_c import has_arrow_interface, import_arrow

    if has_arrow_interface(obj):
        v = import_arrow(obj, copy)
        t = Tensor._dense(v.data, v.shape, v.dtype, strides=None, padded=False, device=CPU,
                          owner=v.owner, readonly=not v.copied, copied=v.copied)
        return t.copy() if copy and not v.copied else t
    from ._registry import ADAPTERS

    raise UnsupportedError(
        f"cannot convert {type(obj).__module__}.{type(obj).__qualname__} to hb.Tensor: "
        f"it is not an array of {', '.join(ADAPTERS)} and has neither __dlpack__ nor the "
        "Arrow PyCapsule interface (__arrow_c_array__, __arrow_c_stream__)"
    )


def from_dlpack(obj: Any, *, copy: bool | None = None, stream: Any = _NO_STREAM) -> Tensor:
    """Import any DLPack producer as an :class:`hb.Tensor`.

    Zero-copy unless ``copy=True``. ``stream`` is what the producer is asked to
    synchronise with; by default nothing (-1) on devices with streams, since
    the bridge itself never touches the memory. Asks for a versioned capsule and accepts
    a legacy one from producers that refuse or ignore ``max_version``.
    """
    if copy is not None and copy is not True and copy is not False and copy not in (0, 1):
        raise UnsupportedError(f"copy must be True, False or None, got {copy!r}")
    if isinstance(obj, Tensor):
        return obj.copy() if copy else obj
    if not hasattr(obj, "__dlpack__"):
        raise UnsupportedError(
            f"{type(obj).__module__}.{type(obj).__qualname__} is not a DLPack producer "
            "(it has no __dlpack__ method)"
        )
    try:
        reported = obj.__dlpack_device__()
    except AttributeError:
        reported = CPU
    dev = _reported_device(reported)
    # The bridge never touches device memory on import, so it asks for no
    # synchronisation (-1); consumers get theirs when they import from us.
    if stream is _NO_STREAM:
        stream = -1 if dev.type in _STREAMED else None
    t = None
    if _exchange.compiled and (stream is None or (type(stream) is int and stream == -1)):
        # The producer type's DLPack C exchange table, where it has one and no adapter
        # claims the type: the same struct as a capsule, without __dlpack__'s call. It
        # synchronises nothing, which is what stream -1 (or None) asks for. Whatever it
        # or the checks refuse takes the capsule path, which names the reason.
        t = _exchange.import_exchange(obj)
        if t is not None and not _device_agrees(dev, t._device):
            t = None  # released here; the capsule path refuses it in its own words
    if t is None:
        try:
            capsule = _capsule.request_capsule(obj, stream=stream)
        except Exception:
            if stream != -1:
                raise
            # "-1: do not synchronise" is optional in the standard, and some producers
            # misread it (jaxlib 0.11 takes it for a stream handle): ask for the
            # legacy default stream instead, which every producer must accept.
            capsule = _capsule.request_capsule(obj, stream=None)
        view = _capsule.consume_capsule(capsule)
        if not _device_agrees(dev, (view.device_type, view.device_id)):
            _release(view)
            raise FormatError(
                f"__dlpack_device__ says {dev} but the capsule says "
                f"{Device(view.device_type, view.device_id)}",
                field="device",
            )
        if view.versioned:
            t = from_dlview(view)
        else:
            from ._registry import legacy_exports_mutable

            t = from_dlview(view, legacy_mutable=legacy_exports_mutable(type(obj)))
    if not dev.is_host_accessible:
        t._source = obj
    if dev.type in _PINNED:
        t._device = dev
    if copy:
        return t.copy()
    if t._nbytes and t._device.is_host_accessible:
        from ._registry import host_memory_hold

        hold = host_memory_hold(type(obj))
        if hold is not None:  # before anything reads the shared memory (torch: resize_)
            hold(obj)
    return t


def _device_agrees(reported: Device, exported: tuple[int, int]) -> bool:
    """Whether the device a capsule (or exchange table) gives fits ``__dlpack_device__``."""
    return (tuple(exported) == reported
            # Pinned-host producers (torch) report kDLCUDAHost but put kDLCPU in the capsule.
            or reported.type in _PINNED
            # jax labels cpu:k arrays (1, 0) outside, (1, k) inside
            or reported.type == exported[0] == _CPU)


def host_copy(t: Tensor, consumer: str) -> Tensor:
    """A host copy of the device tensor ``t``, made by the producer it came from.

    For consumers that read host memory only (NumPy, Arrow). The producer is asked with
    ``dl_device=(kDLCPU, 0)`` and ``copy=True``, the array API's request for a copy on
    another device; what it raises passes through. An answer the host cannot read (a
    producer that ignored ``dl_device``) is refused here, before ``consumer`` sees it.
    """
    capsule = t.__dlpack__(max_version=DLPACK_VERSION, dl_device=CPU, copy=True)
    view = _capsule.consume_capsule(capsule)
    if view.device_type not in _HOST_ACCESSIBLE:
        _release(view)
        raise UnsupportedError(
            f"{consumer} reads host memory only; asked for a host copy of this {t.device} "
            f"tensor (dl_device=(1, 0), copy=True), its producer answered with "
            f"{Device(view.device_type, view.device_id)} memory. Copy it to the host in its "
            "own framework first (x.cpu(), cupy.asnumpy(x)), or convert it to a framework "
            f"that runs on {t.device}"
        )
    return from_dlview(view)


def _install_compiled() -> None:
    """The compiled ``__dlpack__`` / ``__dlpack_device__`` and the DLPack C exchange table
    of hb.Tensor, where hurray_bridge._speedups was built (see _exchange.py)."""
    from .dtypes import _BY_DLPACK, Kind

    dtypes = [(d, int(code), bits, d.kind is Kind.COMPLEX)
              for (code, bits), d in _BY_DLPACK.items() if bits == d.bits]
    _exchange.install(Tensor, device_type=Device, cpu=CPU,
                      cpu_dl=Tensor._dense(0, (0,), dtypes[0][0], strides=None, padded=False,
                                           device=CPU, owner=None, readonly=False,
                                           copied=False).__dlpack_device__(),
                      unsupported=UnsupportedError, row_major=Layout.ROW_MAJOR,
                      strided=Layout.STRIDED, dtypes=dtypes)


_install_compiled()
