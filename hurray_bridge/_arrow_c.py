"""The Arrow C Data and C Device Data Interfaces, through ctypes: the Arrow PyCapsule interface.

Two directions, no Arrow library needed:

* export: :func:`export_schema` and :func:`export_array` build the ``ArrowSchema`` and
  ``ArrowArray`` (or ``ArrowDeviceArray``) structs of a dense hb.Tensor over its own
  memory: rank 1 as a primitive array, rank >= 2 as the canonical
  ``arrow.fixed_shape_tensor`` extension over ``fixed_size_list`` (the first dimension is
  the array's length). ``hb.Tensor.__arrow_c_array__`` and friends call them.
* import: :func:`import_arrow` reads the structs of any object with
  ``__arrow_c_array__``, ``__arrow_c_device_array__`` or ``__arrow_c_stream__`` into an
  hb.Tensor over the producer's memory, every field checked first.

Ownership (the C Data Interface's rules): a consumer either moves a struct out of its
capsule (copies it and sets the original's ``release`` to NULL) or leaves it there, and the
capsule's destructor calls ``release`` if it is still set. Every struct we export carries in
``private_data`` a key of :data:`_NODES`, whose entry keeps the tensor and the memory the
struct points to (the one buffer that holds its tree of structs and pointer arrays, the
format and metadata strings) alive until its ``release`` runs. A parent's ``release``
releases the children the consumer did not move.
The callbacks follow ``_capsule``'s rules for exceptions in flight (they reuse its helpers).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import struct
from collections.abc import Callable
from functools import lru_cache, partial
from math import prod
from typing import Any

from ._capsule import (
    _CAPSULE_TYPE,
    _Py_IncRef,
    _PyCapsule_GetName,
    _PyCapsule_GetName_raw,
    _PyCapsule_GetPointer,
    _PyCapsule_GetPointer_raw,
    _PyCapsule_New,
    _restore_exception,
    _save_exception,
)
from ._dlpack import MAX_NDIM, DLDeviceType
from ._memory import alloc_aligned
from ._subbyte import shift_bits
from .dtypes import DType, all_dtypes, bool8
from .errors import CopyRequiredError, FormatError, UnsupportedError

__all__ = ["ArrowView", "export_array", "export_schema", "has_arrow_interface", "import_arrow",
           "live_arrow_exports"]

_c_void_p = ctypes.c_void_p
_c_int64 = ctypes.c_int64


class ArrowSchema(ctypes.Structure):
    _fields_ = [("format", _c_void_p), ("name", _c_void_p), ("metadata", _c_void_p),
                ("flags", _c_int64), ("n_children", _c_int64), ("children", _c_void_p),
                ("dictionary", _c_void_p), ("release", _c_void_p), ("private_data", _c_void_p)]


class ArrowArray(ctypes.Structure):
    _fields_ = [("length", _c_int64), ("null_count", _c_int64), ("offset", _c_int64),
                ("n_buffers", _c_int64), ("n_children", _c_int64), ("buffers", _c_void_p),
                ("children", _c_void_p), ("dictionary", _c_void_p), ("release", _c_void_p),
                ("private_data", _c_void_p)]


class ArrowDeviceArray(ctypes.Structure):
    _fields_ = [("array", ArrowArray), ("device_id", _c_int64), ("device_type", ctypes.c_int32),
                ("sync_event", _c_void_p), ("reserved", _c_int64 * 3)]


class ArrowArrayStream(ctypes.Structure):
    _fields_ = [("get_schema", _c_void_p), ("get_next", _c_void_p),
                ("get_last_error", _c_void_p), ("release", _c_void_p),
                ("private_data", _c_void_p)]


_SCHEMA_RELEASE = ArrowSchema.release.offset
_SCHEMA_PRIVATE = ArrowSchema.private_data.offset
_ARRAY_RELEASE = ArrowArray.release.offset
_ARRAY_PRIVATE = ArrowArray.private_data.offset
_FLAG_NULLABLE = 2  # ARROW_FLAG_NULLABLE: a field may hold nulls (ours hold none)

EXTENSION_NAME = b"ARROW:extension:name"
EXTENSION_METADATA = b"ARROW:extension:metadata"
FIXED_SHAPE_TENSOR = b"arrow.fixed_shape_tensor"
BOOL8 = b"arrow.bool8"

# Arrow's format string of each type of the element-type table's Arrow column: what the
# C Data Interface calls that type. bool8 is int8 storage under the arrow.bool8 extension.
_FORMAT_OF_ARROW_NAME = {
    "bool_": b"b", "bool8": b"c", "int8": b"c", "uint8": b"C", "int16": b"s", "uint16": b"S",
    "int32": b"i", "uint32": b"I", "int64": b"l", "uint64": b"L", "float16": b"e",
    "float32": b"f", "float64": b"g",
}
_FORMAT: dict[int, bytes] = {d.tag: _FORMAT_OF_ARROW_NAME[d.arrow]
                             for d in all_dtypes() if d.arrow in _FORMAT_OF_ARROW_NAME}
_DTYPE_OF_FORMAT: dict[bytes, DType] = {
    f: d for d in all_dtypes() if d is not bool8 and (f := _FORMAT.get(d.tag)) is not None}
_EXPORTABLE = ", ".join(d.name for d in all_dtypes() if d.tag in _FORMAT)

# Capsule names are kept by pointer: static strings, one reference never given back.
_SCHEMA_NAME = b"arrow_schema"
_ARRAY_NAME = b"arrow_array"
_DEVICE_ARRAY_NAME = b"arrow_device_array"
_STREAM_NAME = b"arrow_array_stream"
for _n in (_SCHEMA_NAME, _ARRAY_NAME, _DEVICE_ARRAY_NAME, _STREAM_NAME):
    _Py_IncRef(_n)
_SCHEMA_NAME_ADDR: int = ctypes.cast(ctypes.c_char_p(_SCHEMA_NAME), _c_void_p).value  # type: ignore[assignment]


# -- export -----------------------------------------------------------------------------------

# private_data key -> (what keeps the struct's memory and the tensor alive, the addresses of
# its child structs). Removed by the struct's release callback.
_NODES: dict[int, tuple[tuple[object, ...], tuple[int, ...]]] = {}
# Top-level struct address -> the ctypes struct, until its capsule is destroyed: a consumer
# that moved the struct out left the husk there, and the capsule destructor reads it.
_HUSKS: dict[int, object] = {}
_keys = itertools.count(1)


def live_arrow_exports() -> int:
    """Exported Arrow structs (schemas and arrays, children included) not yet released."""
    return len(_NODES)


def _release(p: int, release_offset: int, private_offset: int,
             _nodes: dict[int, tuple[tuple[object, ...], tuple[int, ...]]] = _NODES,
             _at: Any = _c_void_p.from_address) -> None:
    # The struct, then the children the consumer left in place (a moved child has its own
    # release to come), each marked released as the interface requires. ``held`` keeps
    # the parents' entries, which own the child structs, until the walk is done. Every
    # name is bound as a default: consumers release while module globals are torn down.
    held = []
    todo = [p]
    while todo:
        q = todo.pop()
        node = _nodes.pop(_at(q + private_offset).value or 0, None)
        if node is not None:
            held.append(node)
            todo += [c for c in node[1] if _at(c + release_offset).value]
        _at(q + release_offset).value = None


def _releaser(release_offset: int, private_offset: int) -> Callable[[int | None], None]:
    """The release callback of one struct kind (schema or array), at those offsets."""

    def release(p: int | None, _save: Any = _save_exception,
                _restore: Any = _restore_exception, _rel: Any = _release,
                _offsets: tuple[int, int] = (release_offset, private_offset)) -> None:
        saved = _save()
        try:
            _rel(p or 0, *_offsets)
        finally:
            if saved is not None:
                _restore(saved)

    return release


_release_schema = _releaser(_SCHEMA_RELEASE, _SCHEMA_PRIVATE)
_release_array = _releaser(_ARRAY_RELEASE, _ARRAY_PRIVATE)


def _capsule_destructor(
    c: int | None,
    _save: Any = _save_exception,
    _restore: Any = _restore_exception,
    _get_name: Any = _PyCapsule_GetName_raw,
    _get_pointer: Any = _PyCapsule_GetPointer_raw,
    _schema: tuple[int, bytes] = (_SCHEMA_NAME_ADDR, _SCHEMA_NAME),
    _husks: dict[int, object] = _HUSKS,
    _at: Any = _c_void_p.from_address,
    _string_at: Any = ctypes.string_at,
    _rel: Any = _release,
    _offsets: tuple[int, int, int, int] = (_SCHEMA_RELEASE, _SCHEMA_PRIVATE, _ARRAY_RELEASE,
                                           _ARRAY_PRIVATE),
) -> None:
    # A struct nobody moved out is released here; the husk goes in every case.
    saved = _save()
    try:
        name = _get_name(c)
        is_schema = name == _schema[0]
        p = _get_pointer(c, _schema[1] if is_schema else _string_at(name)) or 0
        # An ArrowDeviceArray starts with its ArrowArray: the same offsets.
        release, private = _offsets[:2] if is_schema else _offsets[2:]
        if _at(p + release).value:
            _rel(p, release, private)
        _husks.pop(p, None)
    finally:
        if saved is not None:
            _restore(saved)


_ReleaseFn = ctypes.CFUNCTYPE(None, _c_void_p)
_RELEASE_SCHEMA = _ReleaseFn(_release_schema)
_RELEASE_ARRAY = _ReleaseFn(_release_array)
_DESTRUCTOR = _ReleaseFn(_capsule_destructor)
for _fn in (_RELEASE_SCHEMA, _RELEASE_ARRAY, _DESTRUCTOR):
    _Py_IncRef(_fn)  # consumers may release after this module is gone
_RELEASE_SCHEMA_ADDR = ctypes.cast(_RELEASE_SCHEMA, _c_void_p).value
_RELEASE_ARRAY_ADDR = ctypes.cast(_RELEASE_ARRAY, _c_void_p).value
_DESTRUCTOR_ADDR = ctypes.cast(_DESTRUCTOR, _c_void_p).value
# The compiled release callbacks, when hurray_bridge._speedups was built, walk the
# exported tree as the two above do, under the exit guard of our DLPack deleters: a
# consumer may release a moved struct after the interpreter is finalised (a C++
# static's destructor), where a ctypes callback asks for the GIL and crashes the
# process; those leave the export to the exiting process instead. The ctypes pair
# stays as the fallback.
COMPILED_RELEASES = False
try:
    from ._speedups import arrow_release_hooks as _arrow_release_hooks
except ImportError:
    pass
else:
    try:
        # The C side sets aside an exception in flight itself: it calls the walk alone.
        _RELEASE_SCHEMA_ADDR, _RELEASE_ARRAY_ADDR = _arrow_release_hooks(
            partial(_release, release_offset=_SCHEMA_RELEASE, private_offset=_SCHEMA_PRIVATE),
            partial(_release, release_offset=_ARRAY_RELEASE, private_offset=_ARRAY_PRIVATE))
        COMPILED_RELEASES = True
    except RuntimeError:  # installed for an earlier copy of this module (a reload)
        pass
# Where an empty array's data buffer points: some consumers read a NULL buffer as missing.
_EMPTY = (ctypes.c_uint64 * 8)()
_EMPTY_ADDR = ctypes.addressof(_EMPTY)


def _encode_metadata(pairs: list[tuple[bytes, bytes]]) -> bytes:
    out = [struct.pack("=i", len(pairs))]
    for k, v in pairs:
        out += [struct.pack("=i", len(k)), k, struct.pack("=i", len(v)), v]
    return b"".join(out)


def _address(b: bytes) -> int:
    # Where the bytes object keeps its contents (no copy): the struct points there, and
    # the node that owns the struct holds the object.
    return ctypes.cast(ctypes.c_char_p(b), _c_void_p).value or 0


# One buffer per exported tree (the structs, their pointer arrays), filled with
# struct.pack_into: one ctypes object to make and free instead of one per struct.
_SCHEMA_SIZE, _ARRAY_SIZE, _DEVICE_SIZE = 72, 80, 128
_pack_schema = struct.Struct("@PPPqqPPPP").pack_into
_pack_array = struct.Struct("@qqqqqPPPPP").pack_into
_pack_device = struct.Struct("@qi4xP3q").pack_into  # after the ArrowArray it starts with
_pack_pointers = struct.Struct("@PP").pack_into
_pack_pointer = struct.Struct("@P").pack_into
assert (ctypes.sizeof(ArrowSchema), ctypes.sizeof(ArrowArray),
        ctypes.sizeof(ArrowDeviceArray)) == (_SCHEMA_SIZE, _ARRAY_SIZE, _DEVICE_SIZE)
_buffer_types: dict[int, Any] = {}

# Strings every export shares: formats, names, bool8's metadata; immortal.
_TEXT: dict[bytes, int] = {b: _address(b) for b in (b"", b"item", *_FORMAT.values())}
_BOOL8_META = _encode_metadata([(EXTENSION_NAME, BOOL8), (EXTENSION_METADATA, b"")])
_BOOL8_META_ADDR = _address(_BOOL8_META)
# value shape -> (list format, extension metadata): a node holds what its struct uses, so
# the cache may be emptied at any time.
_LIST_TYPES: dict[tuple[int, ...], tuple[bytes, bytes]] = {}


def _new_buffer(nbytes: int) -> Any:
    tp = _buffer_types.get(nbytes)
    if tp is None:
        tp = _buffer_types[nbytes] = ctypes.c_uint64 * (nbytes // 8)
    return tp()


def _list_type(value_shape: tuple[int, ...]) -> tuple[bytes, bytes]:
    out = _LIST_TYPES.get(value_shape)
    if out is None:
        if len(_LIST_TYPES) >= 256:
            _LIST_TYPES.clear()
        ext = json.dumps({"shape": list(value_shape)}, separators=(",", ":")).encode()
        out = _LIST_TYPES[value_shape] = (
            b"+w:%d" % prod(value_shape),
            _encode_metadata([(EXTENSION_NAME, FIXED_SHAPE_TENSOR), (EXTENSION_METADATA, ext)]))
    return out


def _value_format(t: Any) -> bytes:
    """The format string of ``t``'s elements; refuses types Arrow has none for."""
    d = t.dtype
    fmt = _FORMAT.get(d.tag)
    if fmt is None:
        raise UnsupportedError(
            f"the Arrow C Data Interface has no type for {d.name} elements: Arrow holds "
            f"{_EXPORTABLE}; convert the values to one of those first (for bfloat16 and the "
            "8-bit floats, float32; quantized and sub-byte integers, dequantize or widen)")
    if d.bits < 8 and t._padded:
        raise UnsupportedError(
            f"a {d.name} tensor in the padded form (one byte per value) has no Arrow form: "
            "Arrow's boolean is bit-packed; pack it first (t.copy() gives the packed form)")
    return fmt


def _check_exportable(t: Any, compact: bool) -> None:
    if not t.is_dense:
        raise UnsupportedError(
            f"a {t.layout.name} tensor (sparse or quantized) has no Arrow array form: Arrow "
            "arrays are dense; densify it first (hb.convert(x, target, densify=True))")
    if not t.shape:
        raise UnsupportedError(
            "a rank-0 tensor has no Arrow array form (an Arrow array has a length): reshape "
            "it to shape (1,) first")
    if not compact:
        raise UnsupportedError(
            f"an Arrow array holds compact row-major values, and this tensor has strides "
            f"{t.strides} for shape {t.shape}; t.copy() gives a compact tensor to export")
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"the tensor is on {t.device}: the bridge exports host memory to Arrow only "
            "(kDLCPU, kDLCUDAHost, kDLROCMHost, kDLCUDAManaged); copy it to the host first")
    if t.dtype.bits < 8 and len(t.shape) >= 2 and prod(t.shape[1:]) % 8:
        raise UnsupportedError(
            f"a bit-packed {t.dtype.name} tensor of shape {t.shape} has rows of "
            f"{prod(t.shape[1:])} bits, not whole bytes; the bridge exports bit-packed rows of "
            "a multiple of 8 values only")


def _schema_tree(t: Any, fmt: bytes) -> Any:
    """The ArrowSchema of ``t`` (and its child, rank >= 2) in one buffer, registered."""
    meta_addr = _BOOL8_META_ADDR if t.dtype is bool8 else 0
    if len(t.shape) == 1:
        buf = _new_buffer(_SCHEMA_SIZE)
        key = next(_keys)
        _NODES[key] = ((buf,), ())
        _pack_schema(buf, 0, _TEXT[fmt], _TEXT[b""], meta_addr, _FLAG_NULLABLE, 0, 0, 0,
                     _RELEASE_SCHEMA_ADDR, key)
        return buf
    list_fmt, list_meta = _list_type(t.shape[1:])
    buf = _new_buffer(2 * _SCHEMA_SIZE + 8)
    p = ctypes.addressof(buf)
    child = p + _SCHEMA_SIZE + 8
    top_key, child_key = next(_keys), next(_keys)
    _NODES[child_key] = ((buf,), ())
    _NODES[top_key] = ((buf, list_fmt, list_meta), (child,))
    _pack_schema(buf, 0, _address(list_fmt), _TEXT[b""], _address(list_meta), _FLAG_NULLABLE,
                 1, p + _SCHEMA_SIZE, 0, _RELEASE_SCHEMA_ADDR, top_key)
    _pack_pointer(buf, _SCHEMA_SIZE, child)
    _pack_schema(buf, _SCHEMA_SIZE + 8, _TEXT[fmt], _TEXT[b"item"], meta_addr, _FLAG_NULLABLE,
                 0, 0, 0, _RELEASE_SCHEMA_ADDR, child_key)
    return buf


def _array_tree(t: Any, device: bool) -> Any:
    """The ArrowArray (or ArrowDeviceArray) of ``t`` and its child, buffer pointer arrays
    included, in one buffer, registered; each node holds ``t``."""
    head = _DEVICE_SIZE if device else _ARRAY_SIZE
    n = t.shape[0]
    data = t.data_ptr or _EMPTY_ADDR
    if len(t.shape) == 1:
        buf = _new_buffer(head + 16)
        p = ctypes.addressof(buf)
        key = next(_keys)
        _NODES[key] = ((buf, t), ())
        _pack_array(buf, 0, n, 0, 0, 2, 0, p + head, 0, 0, _RELEASE_ARRAY_ADDR, key)
        _pack_pointers(buf, head, 0, data)
    else:
        # [top][top's buffers: validity][top's children][child][child's buffers]
        buf = _new_buffer(head + 16 + _ARRAY_SIZE + 16)
        p = ctypes.addressof(buf)
        child = p + head + 16
        top_key, child_key = next(_keys), next(_keys)
        _NODES[child_key] = ((buf, t), ())
        _NODES[top_key] = ((buf, t), (child,))
        _pack_array(buf, 0, n, 0, 0, 1, 1, p + head, p + head + 8, 0, _RELEASE_ARRAY_ADDR,
                    top_key)
        _pack_pointers(buf, head, 0, child)
        _pack_array(buf, head + 16, n * prod(t.shape[1:]), 0, 0, 2, 0, child + _ARRAY_SIZE, 0,
                    0, _RELEASE_ARRAY_ADDR, child_key)
        _pack_pointers(buf, head + 16 + _ARRAY_SIZE, 0, data)
    if device:
        # Arrow numbers devices as DLPack does; host memory needs no sync event.
        _pack_device(buf, _ARRAY_SIZE, t.device.id, t.device.type, 0, 0, 0, 0)
    return buf


def _capsule(buf: Any, name: bytes) -> object:
    p = ctypes.addressof(buf)
    _HUSKS[p] = buf
    try:
        return _PyCapsule_New(p, name, _DESTRUCTOR_ADDR)
    except BaseException:
        del _HUSKS[p]
        raise


def export_schema(t: Any, compact: bool) -> object:
    """``t.__arrow_c_schema__()``: an ``arrow_schema`` capsule describing the hb.Tensor ``t``
    as an array (``compact``: its values are row-major without gaps)."""
    _check_exportable(t, compact)
    return _capsule(_schema_tree(t, _value_format(t)), _SCHEMA_NAME)


def _storage_formats(p: int) -> list[bytes]:
    """The format strings of a schema and its first children, outermost first."""
    out = []
    path = "requested_schema"
    for _ in range(MAX_NDIM + 1):
        if not p:  # (a NULL child pointer: reading it would crash the interpreter)
            raise FormatError("the requested schema has a NULL child ArrowSchema; pass a "
                              "schema the producer built whole", field=path)
        s = ArrowSchema.from_address(p)
        if not s.format:
            raise FormatError("the requested schema has a NULL format", field="format")
        out.append(ctypes.string_at(s.format))
        if s.n_children != 1 or not s.children:
            break
        p = _c_void_p.from_address(s.children).value or 0
        path += ".children[0]"
    return out


def export_array(t: Any, compact: bool, requested_schema: object = None, *,
                 device: bool = False) -> tuple[object, object]:
    """``t.__arrow_c_array__()`` (or, with ``device``, ``__arrow_c_device_array__``): the
    ``arrow_schema`` and ``arrow_array`` (``arrow_device_array``) capsules of the hb.Tensor
    ``t`` (``compact``: its values are row-major without gaps).

    The array points into ``t``'s memory and keeps ``t`` alive until the consumer releases
    it. ``requested_schema`` is honoured when it asks for the type ``t`` has (with or
    without the extension type's metadata); any other request is refused: the bridge does
    not cast.
    """
    _check_exportable(t, compact)
    fmt = _value_format(t)
    if requested_schema is not None:
        if (type(requested_schema) is not _CAPSULE_TYPE
                or _PyCapsule_GetName(requested_schema) != _SCHEMA_NAME):
            raise UnsupportedError(
                f"requested_schema must be an 'arrow_schema' capsule, got "
                f"{type(requested_schema).__name__}")
        wanted = _storage_formats(_PyCapsule_GetPointer(requested_schema, _SCHEMA_NAME))
        ours = [fmt] if len(t.shape) == 1 else [_list_type(t.shape[1:])[0], fmt]
        if wanted != ours:
            raise UnsupportedError(
                f"requested_schema asks for format {b' / '.join(wanted).decode(errors='replace')!r}"
                f" and this {t.dtype.name} tensor of shape {t.shape} is "
                f"{b' / '.join(ours).decode()!r}: the bridge exports its own type without a "
                "cast; ask for none and cast on the consumer's side")
    schema = _capsule(_schema_tree(t, fmt), _SCHEMA_NAME)
    array = _array_tree(t, device)
    return schema, _capsule(array, _DEVICE_ARRAY_NAME if device else _ARRAY_NAME)


# -- import -----------------------------------------------------------------------------------

_METHODS = ("__arrow_c_array__", "__arrow_c_device_array__", "__arrow_c_stream__")


@lru_cache(maxsize=256)
def _arrow_method(tp: type) -> str | None:
    # Per type, once: a missing attribute costs microseconds on some types (a metaclass
    # with __getattr__), and the protocol is looked up on the type anyway.
    return next((m for m in _METHODS if hasattr(tp, m)), None)


def has_arrow_interface(obj: Any) -> bool:
    """Whether ``obj`` speaks the Arrow PyCapsule interface for arrays or streams."""
    return _arrow_method(type(obj)) is not None  # type: ignore[arg-type]  # types are hashable


_MAX_METADATA = 1 << 20  # bytes of one key or value; far more than any type's metadata


def _read_metadata(p: int | None) -> dict[bytes, bytes]:
    if not p:
        return {}
    (n,) = struct.unpack("=i", ctypes.string_at(p, 4))
    if not 0 <= n <= 1024:
        raise FormatError(f"schema metadata has {n} entries, outside 0..1024", field="metadata")
    out = {}
    pos = p + 4
    for _ in range(n):
        pair = []
        for _what in ("key", "value"):
            (k,) = struct.unpack("=i", ctypes.string_at(pos, 4))
            if not 0 <= k <= _MAX_METADATA:
                raise FormatError(f"schema metadata {_what} length {k}, outside 0..{_MAX_METADATA}",
                                  field="metadata")
            pair.append(ctypes.string_at(pos + 4, k))
            pos += 4 + k
        out[pair[0]] = pair[1]
    return out


class _Type:
    """A parsed schema: the element type, the value shape of each array slot, and per
    level (outermost first) the list size of each fixed_size_list above the values."""

    __slots__ = ("dtype", "list_sizes", "shape")

    def __init__(self, dtype: DType, shape: tuple[int, ...], list_sizes: tuple[int, ...]) -> None:
        self.dtype = dtype
        self.shape = shape
        self.list_sizes = list_sizes


def _parse_schema(p: int, path: str = "schema", depth: int = 1) -> _Type:
    if not p:
        raise FormatError("NULL ArrowSchema", field=path)
    if depth > MAX_NDIM:  # checked going down: a schema that is its own child never ends
        raise FormatError(f"fixed_size_list nested over {MAX_NDIM} levels (is a schema its "
                          f"own child?), over the rank limit {MAX_NDIM}", field=path)
    s = ArrowSchema.from_address(p)
    if not s.release:
        raise FormatError("the ArrowSchema is already released (release is NULL)",
                          field=f"{path}.release")
    if not s.format:
        raise FormatError("the ArrowSchema has a NULL format string", field=f"{path}.format")
    fmt = ctypes.string_at(s.format)
    if s.dictionary:
        raise UnsupportedError(
            f"{path} is dictionary-encoded (format {fmt.decode(errors='replace')!r}): a tensor "
            "holds values, not indices into a dictionary; decode it on the producer's side "
            "first")
    meta = _read_metadata(s.metadata)
    ext = meta.get(EXTENSION_NAME)
    shown = fmt.decode(errors="replace")
    if fmt in _DTYPE_OF_FORMAT:
        if s.n_children != 0:
            raise FormatError(f"a primitive type (format {shown!r}) has {s.n_children} "
                              "children, expected 0", field=f"{path}.n_children")
        dtype = _DTYPE_OF_FORMAT[fmt]
        if ext == BOOL8 and fmt == b"c":
            dtype = bool8
        elif ext is not None:
            raise UnsupportedError(
                f"{path} has the extension type {ext.decode(errors='replace')!r} over format "
                f"{shown!r}; the bridge reads arrow.bool8 and arrow.fixed_shape_tensor only; pass "
                "the storage array instead")
        return _Type(dtype, (), ())
    if fmt.startswith(b"+w:"):
        size_text = fmt[3:]
        if not size_text.isdigit() or len(size_text) > 18:
            raise FormatError(f"fixed_size_list format {shown!r} has no valid list size",
                              field=f"{path}.format")
        size = int(size_text)
        if s.n_children != 1 or not s.children:
            raise FormatError(f"a fixed_size_list has {s.n_children} children, expected 1",
                              field=f"{path}.n_children")
        inner = _parse_schema(_c_void_p.from_address(s.children).value or 0,
                              f"{path}.children[0]", depth + 1)
        shape = (size, *inner.shape)
        if ext == FIXED_SHAPE_TENSOR:
            if inner.shape:
                raise UnsupportedError(
                    f"{path}: an arrow.fixed_shape_tensor of nested lists is not a tensor "
                    "type the extension defines (its value type is a primitive type)")
            shape = _fixed_shape(meta.get(EXTENSION_METADATA, b""), size, path)
        elif ext is not None:
            raise UnsupportedError(
                f"{path} has the extension type {ext.decode(errors='replace')!r}; the bridge "
                "reads arrow.bool8 and arrow.fixed_shape_tensor only")
        if len(shape) + 1 > MAX_NDIM:
            raise FormatError(f"the array's tensors have rank {len(shape) + 1}, over the "
                              f"limit {MAX_NDIM}", field=f"{path}.format")
        return _Type(inner.dtype, shape, (size, *inner.list_sizes))
    raise UnsupportedError(
        f"{path} has Arrow format {shown!r}, which is no tensor type: the bridge reads "
        "primitive numbers and booleans, fixed_size_list of them and arrow.fixed_shape_tensor "
        "(variable-size lists, strings, structs and the like need a copy through their "
        "framework)")


def _fixed_shape(text: bytes, size: int, path: str) -> tuple[int, ...]:
    where = f"{path}.metadata[ARROW:extension:metadata]"
    try:
        doc = json.loads(text)
        shape = doc["shape"]
        # int64 as Arrow's own: with a zero elsewhere the product checks nothing, and a
        # larger size is no descriptor's (2**64 - 1 would read as a dynamic dimension).
        if not (isinstance(shape, list)
                and all(type(d) is int and 0 <= d <= (1 << 63) - 1 for d in shape)):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise FormatError(f"arrow.fixed_shape_tensor metadata {text[:80]!r} has no valid "
                          "'shape' (a list of integers in 0..2**63 - 1)", field=where) from None
    perm = doc.get("permutation")
    if perm is not None and perm != list(range(len(shape))):
        raise UnsupportedError(
            f"{path}: an arrow.fixed_shape_tensor with permutation {perm} is not read through "
            "the capsule interface; pass the array object itself where an adapter claims it "
            "(the Arrow adapter reads permutations), or make it row-major first")
    if prod(shape) != size:
        raise FormatError(f"arrow.fixed_shape_tensor shape {shape} has {prod(shape)} "
                          f"elements, and its fixed_size_list holds {size}", field=where)
    return tuple(shape)


def _count_valid(bitmap: int, start: int, n: int) -> int:
    raw = ctypes.string_at(bitmap + start // 8, -(-(start % 8 + n) // 8))
    bits = (int.from_bytes(raw, "little") >> (start % 8)) & ((1 << n) - 1)
    return bits.bit_count()


def _locate(p: int, typ: _Type, level: int, first: int, count: int, path: str) -> tuple[int, int]:
    """``(address, bit offset)`` of the values behind slots ``[first, first + count)`` of
    the array at ``p``; refuses nulls and every field that does not add up."""
    if not p:
        raise FormatError("NULL ArrowArray", field=path)
    a = ArrowArray.from_address(p)
    if not a.release:
        raise FormatError("the ArrowArray is already released (release is NULL)",
                          field=f"{path}.release")
    if a.length < 0 or a.offset < 0:
        raise FormatError(f"length {a.length} and offset {a.offset} must not be negative",
                          field=f"{path}.length")
    if a.offset > (1 << 63) - 1 - a.length:
        raise FormatError(f"offset {a.offset} + length {a.length} is past 2**63 - 1: no "
                          "buffer has such slots", field=f"{path}.offset")
    if first + count > a.length:
        raise FormatError(f"the parent array needs slots {first}..{first + count} of this "
                          f"array, and it has {a.length}", field=f"{path}.length")
    if a.dictionary:
        raise FormatError("a dictionary array without a dictionary type",
                          field=f"{path}.dictionary")
    leaf = level == len(typ.list_sizes)
    n_buffers, n_children = (2, 0) if leaf else (1, 1)
    if a.n_buffers != n_buffers or a.n_children != n_children:
        raise FormatError(f"{a.n_buffers} buffers and {a.n_children} children, the type "
                          f"calls for {n_buffers} and {n_children}", field=f"{path}.n_buffers")
    if not a.buffers:
        raise FormatError("NULL buffers array", field=f"{path}.buffers")
    phys = a.offset + first
    if not -1 <= a.null_count <= a.length:
        raise FormatError(f"null_count {a.null_count} is outside -1..{a.length} (the length)",
                          field=f"{path}.null_count")
    validity = _c_void_p.from_address(a.buffers).value
    if count and (a.null_count > 0 or (a.null_count == -1 and validity
                                       and _count_valid(validity, phys, count) != count)):
        raise UnsupportedError(
            f"{path} holds nulls: a tensor has no validity bitmap, and dropping it would "
            "turn the nulls into whatever bytes are under them; fill them first "
            "(the producer's fill_null)")
    if not leaf:
        if not a.children:
            raise FormatError("NULL children array", field=f"{path}.children")
        size = typ.list_sizes[level]
        return _locate(_c_void_p.from_address(a.children).value or 0, typ, level + 1,
                       phys * size, count * size, f"{path}.children[0]")
    data = _c_void_p.from_address(a.buffers + 8).value
    if not data:
        if count:
            raise FormatError(f"NULL data buffer for {count} values", field=f"{path}.buffers[1]")
        return 0, 0
    bits = typ.dtype.bits
    # The C interface carries no buffer sizes, so a lying offset cannot be caught in
    # general; values that would end past the address space are a lie on their face
    # (and an address over 64 bits breaks every consumer with an OverflowError).
    if data + -(-(phys + count) * bits // 8) > (1 << 64) - 1:
        raise FormatError(f"offset {a.offset}: slots up to {phys + count} of "
                          f"{typ.dtype.name} from address {data:#x} end past the address "
                          "space", field=f"{path}.offset")
    return data + phys * bits // 8, phys * bits % 8


# Foreign callbacks by address: a ctypes function object is costly to make, and a
# producer has a few callbacks for all its arrays.
_foreign: dict[tuple[Any, int], Any] = {}


def _foreign_fn(proto: Any, address: int) -> Any:
    fn = _foreign.get((proto, address))
    if fn is None:
        if len(_foreign) >= 64:  # a producer making a callback per array
            _foreign.clear()
        fn = _foreign[proto, address] = proto(address)
    return fn


class _ArrowRelease:
    """Owns a moved ArrowArray: its ``release`` runs once, when this object goes."""

    __slots__ = ("__weakref__", "_array")

    def __init__(self, array: ArrowArray) -> None:
        self._array = array

    def release(self, _fn: Any = _foreign_fn, _proto: Any = _ReleaseFn,
                _addressof: Any = ctypes.addressof) -> None:
        """Release the array now (idempotent); its memory must no longer be used."""
        # Bound as defaults: a tensor alive at exit is freed after module globals go.
        a = self._array
        if a.release:
            _fn(_proto, a.release)(_addressof(a))

    __del__ = release


class ArrowView:
    """What an imported Arrow array describes, for ``tensor.py`` to wrap: a plain record.

    ``data`` is the address of the first value (0 without values), ``owner`` keeps the
    memory valid (the producer's capsule or released array, or a fresh allocation when
    ``copied``).
    """

    __slots__ = ("copied", "data", "dtype", "owner", "shape")

    def __init__(self, data: int, shape: tuple[int, ...], dtype: DType, owner: object,
                 copied: bool) -> None:
        self.data = data
        self.shape = shape
        self.dtype = dtype
        self.owner = owner
        self.copied = copied


def _view_of(p: int, typ: _Type, owner: object, copy: bool | None) -> ArrowView:
    length = ArrowArray.from_address(p).length if p else 0
    if length < 0:
        raise FormatError(f"length {length} must not be negative", field="array.length")
    shape = (length, *typ.shape)
    n = prod(shape)
    dtype = typ.dtype
    if n * dtype.itemsize > (1 << 63) - 1:
        raise FormatError(f"{n} values of {dtype.name} are more bytes than 2**63 - 1",
                          field="array.length")
    addr, bit = _locate(p, typ, 0, 0, length, "array")
    if bit:  # a bit-packed boolean array sliced within a byte
        if copy is False:
            raise CopyRequiredError(
                f"the {n} booleans start {bit} bits into a byte and a bit-packed tensor "
                "starts on a byte: sharing needs a copy, but copy=False")
        out = alloc_aligned(-(-n // 8))
        if out is not None:
            ctypes.memmove(out.ptr, shift_bits(ctypes.string_at(addr, -(-(bit + n) // 8)),
                                               bit, n), out.nbytes)
        return ArrowView(0 if out is None else out.ptr, shape, dtype, out, True)
    return ArrowView(addr if n else 0, shape, dtype, owner, False)


def _capsule_pointer(capsule: object, name: bytes, what: str) -> int:
    if type(capsule) is not _CAPSULE_TYPE or _PyCapsule_GetName(capsule) != name:
        raise FormatError(f"{what} returned {type(capsule).__name__} {capsule!r:.60} where an "
                          f"{name.decode()!r} capsule belongs", field=what)
    p: int = _PyCapsule_GetPointer(capsule, name)
    return p


def _pair(out: Any, what: str) -> tuple[object, object]:
    if not (isinstance(out, tuple) and len(out) == 2):
        raise FormatError(f"{what} returned {type(out).__name__}, expected a (schema, array) "
                          "pair of capsules", field=what)
    return out[0], out[1]


def import_arrow(obj: Any, copy: bool | None = None) -> ArrowView:
    """What an object that speaks the Arrow PyCapsule interface holds, for an hb.Tensor.

    Tried in order: ``__arrow_c_array__``, ``__arrow_c_device_array__`` (host memory only),
    ``__arrow_c_stream__``. A primitive array is rank 1; a ``fixed_size_list`` (nested or
    not) or ``arrow.fixed_shape_tensor`` array is rank >= 2, its length the first dimension.
    The view shares the producer's memory (immutable: Arrow's), keeping the producer's
    array until its owner is freed; a stream of several chunks, and a boolean array
    starting within a byte, are copied (refused under ``copy=False``); ``copy=True`` is
    the caller's to honour.
    """
    tp = type(obj)
    method = _arrow_method(tp)  # type: ignore[arg-type]
    if method == "__arrow_c_array__":
        sc, ac = _pair(obj.__arrow_c_array__(), "__arrow_c_array__")
        typ = _parse_schema(_capsule_pointer(sc, _SCHEMA_NAME, "__arrow_c_array__"))
        p = _capsule_pointer(ac, _ARRAY_NAME, "__arrow_c_array__")
        return _view_of(p, typ, ac, copy)
    if method == "__arrow_c_device_array__":
        sc, ac = _pair(obj.__arrow_c_device_array__(), "__arrow_c_device_array__")
        typ = _parse_schema(_capsule_pointer(sc, _SCHEMA_NAME, "__arrow_c_device_array__"))
        p = _capsule_pointer(ac, _DEVICE_ARRAY_NAME, "__arrow_c_device_array__")
        dev = ArrowDeviceArray.from_address(p)
        if dev.device_type != DLDeviceType.kDLCPU:
            raise UnsupportedError(
                f"the Arrow device array is on device type {dev.device_type} (id "
                f"{dev.device_id}); the bridge imports Arrow device arrays in CPU memory "
                "(kDLCPU) only; import it through DLPack, or copy it to the CPU first")
        return _view_of(p, typ, ac, copy)
    if method == "__arrow_c_stream__":
        return _import_stream(obj, copy)
    raise UnsupportedError(f"{tp.__module__}.{tp.__qualname__} does not speak the Arrow "
                           "PyCapsule interface (no __arrow_c_array__ or __arrow_c_stream__)")


_GetSchemaFn = ctypes.CFUNCTYPE(ctypes.c_int, _c_void_p, _c_void_p)
_GetNextFn = ctypes.CFUNCTYPE(ctypes.c_int, _c_void_p, _c_void_p)
_GetErrorFn = ctypes.CFUNCTYPE(ctypes.c_char_p, _c_void_p)
_MAX_CHUNKS = 1 << 20


def _stream_error(st: ArrowArrayStream, p: int, rc: int, what: str) -> FormatError:
    msg = _foreign_fn(_GetErrorFn, st.get_last_error)(p) if st.get_last_error else None
    detail = msg.decode(errors="replace") if msg else "no message"
    return FormatError(f"the Arrow stream's {what} failed with error {rc}: {detail}",
                       field=f"stream.{what}")


def _import_stream(obj: Any, copy: bool | None) -> ArrowView:
    cap = obj.__arrow_c_stream__()
    p = _capsule_pointer(cap, _STREAM_NAME, "__arrow_c_stream__")
    st = ArrowArrayStream.from_address(p)
    if not st.release or not st.get_schema or not st.get_next:
        raise FormatError("the ArrowArrayStream is released or lacks get_schema/get_next",
                          field="stream")
    schema = ArrowSchema()
    rc = _foreign_fn(_GetSchemaFn, st.get_schema)(p, ctypes.addressof(schema))
    if rc:
        raise _stream_error(st, p, rc, "get_schema")
    try:
        typ = _parse_schema(ctypes.addressof(schema))
    finally:
        if schema.release:
            _foreign_fn(_ReleaseFn, schema.release)(ctypes.addressof(schema))
    chunks: list[_ArrowRelease] = []
    get_next = _foreign_fn(_GetNextFn, st.get_next)
    for _ in range(_MAX_CHUNKS):
        a = ArrowArray()
        rc = get_next(p, ctypes.addressof(a))
        if rc:
            raise _stream_error(st, p, rc, "get_next")
        if not a.release:
            break
        hold = _ArrowRelease(a)
        if a.length:
            chunks.append(hold)
    else:
        raise FormatError(f"the Arrow stream has more than {_MAX_CHUNKS} chunks", field="stream")
    del cap  # the stream is released; the arrays it gave live on
    share = False if copy is False else None
    parts = [_view_of(ctypes.addressof(h._array), typ, h, share) for h in chunks]
    if not parts:
        return ArrowView(0, (0, *typ.shape), typ.dtype, None, False)
    if len(parts) == 1:
        return parts[0]
    if copy is False:
        raise CopyRequiredError(
            f"the Arrow stream has {len(parts)} chunks and a tensor is one block of memory: "
            "joining them is a copy, but copy=False; pass copy=None, or combine the chunks "
            "on the producer's side (combine_chunks, rechunk)")
    return _join(parts, typ)


def _nbytes(v: ArrowView) -> int:
    n = prod(v.shape)
    return -(-n // 8) if v.dtype.bits < 8 else n * v.dtype.itemsize


def _join(parts: list[ArrowView], typ: _Type) -> ArrowView:
    n = sum(t.shape[0] for t in parts)
    shape = (n, *typ.shape)
    if typ.dtype.bits < 8:
        # Bit-packed rows: pack by concatenating the bit strings (chunks may end mid-byte).
        total, acc = 0, 0
        for t in parts:
            k = prod(t.shape)
            acc |= int.from_bytes(ctypes.string_at(t.data, _nbytes(t)), "little") << total
            total += k
        raw = (acc & ((1 << total) - 1)).to_bytes(-(-total // 8), "little")
        out = alloc_aligned(len(raw))
        if out is not None:
            ctypes.memmove(out.ptr, raw, len(raw))
    else:
        out = alloc_aligned(sum(map(_nbytes, parts)))
        pos = 0 if out is None else out.ptr
        for t in parts:
            ctypes.memmove(pos, t.data, _nbytes(t))
            pos += _nbytes(t)
    return ArrowView(0 if out is None else out.ptr, shape, typ.dtype, out, True)

