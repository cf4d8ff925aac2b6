"""Apache Arrow adapter: ``pyarrow`` arrays and tensors <-> ``hb.Tensor``.

What maps to what:

* ``pa.Array`` of a primitive type <-> rank-1 ``hb.Tensor``: the Arrow data
  buffer is shared (slice offsets folded into the pointer). Arrow memory is
  immutable, so the tensor is read-only.
* ``pa.bool_()`` arrays are bit-packed, LSB first: Hurray's 1-bit ``hb.bool``,
  shared when the array's offset is a whole byte. ``pa.bool8()`` (the
  canonical extension type, one byte per value) is ``hb.bool8``.
* ``pa.ChunkedArray``: one chunk is shared; several chunks are combined (a copy).
* ``pa.Tensor`` <-> an N-D ``hb.Tensor`` through DLPack (strides and the
  read-only flag included).
* ``pa.FixedShapeTensorArray`` (canonical extension ``arrow.fixed_shape_tensor``)
  <-> an ``hb.Tensor`` of shape ``(len, *value_shape)``: the leading dimension
  is the batch, the values buffer is shared.

Arrow arrays with nulls are refused: Hurray tensors have no validity bitmap,
and dropping it would turn nulls into whatever bytes sit under them.
NumPy is not needed: buffers are read and built through pyarrow alone.
"""

from __future__ import annotations

import ctypes
import warnings
from functools import lru_cache
from typing import Any, Literal, overload

import pyarrow as pa

from hurray_bridge import _subbyte
from hurray_bridge._copy_policy import check_copy, warn_copy
from hurray_bridge._dlpack import DLDeviceType
from hurray_bridge._memory import HostAllocation, alloc_aligned
from hurray_bridge.conversion import asarray
from hurray_bridge.descriptor import compact_strides, form_name
from hurray_bridge.dtypes import DType, Kind, all_dtypes, bool_, native_types
from hurray_bridge.errors import CopyRequiredError, UnsupportedError
from hurray_bridge.tensor import CPU, Tensor, from_dlpack, host_copy

__all__ = ["DEFERRED_SAVE", "DEVICES", "HOLDS", "HOLD_HOST_MEMORY", "LEGACY_EXPORTS_MUTABLE",
           "NAME", "dtype_of", "fast_export", "fast_import", "from_hurray", "native_dtype",
           "native_dtypes", "special_kind", "to_hurray"]

NAME = "arrow"
"""The target name: ``hb.convert(x, "arrow")``."""
# A legacy DLPack capsule cannot say "read-only"; the core reads one as read-only unless
# the producer's adapter says otherwise here. Arrow arrays are immutable (pyarrow 26
# answers a legacy request for them; a mutable pa.Tensor is told apart in _from_tensor).
LEGACY_EXPORTS_MUTABLE = False
"""Whether Arrow's legacy DLPack capsules carry mutable memory (the comment above
says why); the core reads a legacy capsule as read-only unless its adapter says so."""
HOLD_HOST_MEMORY = None
"""Nothing to hold: memory this framework exports stays valid while the export lives."""
DEFERRED_SAVE = None
"""Saves of its objects are written by the saving process (nothing deferred)."""
_CPU = int(DLDeviceType.kDLCPU)  # a plain int: from_hurray's fast path compares it
HOLDS = frozenset({"dense", "sparse"})
"""Arrays, tensors and fixed-shape tensor arrays; sparse CSR/CSC/COO tensors (``.sparse``)."""
DEVICES = frozenset({_CPU})
"""The host only (kDLCPU): device memory is copied to the host."""

# pa.Tensor.__dlpack__ came in pyarrow 21 (versioned capsules in 26), pa.Tensor.from_dlpack in 26.
_TENSOR_EXPORTS_DLPACK = hasattr(pa.Tensor, "__dlpack__")
_TENSOR_IMPORTS_DLPACK = hasattr(pa.Tensor, "from_dlpack")
KINDS = ("array", "tensor", "fixed_shape_tensor")
"""What ``from_hurray(..., kind=)`` builds: a flat Array, an N-D Tensor, or a batch of tensors."""

_FILL_HINT = (
    "fill them first: arr.fill_null(value) (pyarrow.compute.fill_null), "
    "or drop them: arr.drop_null()"
)


# ------------------------------------------------------------------------------ dtypes
def _resolve(name: str) -> pa.DataType | None:
    # pa.bool8() (the canonical extension) appeared in pyarrow 18; older versions lack it.
    factory = getattr(pa, name, None)
    return None if factory is None else factory()


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[int, pa.DataType], dict[pa.DataType, DType], dict[type, DType]]:
    """(tag -> Arrow type, Arrow type -> DType, array class -> DType), from the type table.

    Keyed by tag rather than DType: hashing the frozen dataclass hashes all its fields.
    The array-class map is the fast path of to_hurray: each primitive Arrow type has
    its own array class (Int8Array ... DoubleArray, BooleanArray, Bool8Array).
    """
    to_pa = native_types("arrow", _resolve)
    by_class = {type(pa.array([], type=t)): d for d, t in to_pa.items()}
    by_class.pop(pa.ExtensionArray, None)  # only if some pyarrow lacked a dedicated class
    # The hot paths (see to_hurray and from_hurray): whole-byte, non-extension types.
    for cls, d in by_class.items():
        if d.bits >= 8 and not issubclass(cls, pa.ExtensionArray):
            _PLAIN_CLASSES[cls] = (d, d.itemsize)
    for d, t in to_pa.items():
        if d.bits >= 8 and not isinstance(t, pa.ExtensionType):
            _PLAIN_TYPES[d.tag] = t
    return {d.tag: t for d, t in to_pa.items()}, {t: d for d, t in to_pa.items()}, by_class


# Filled by _tables(): array class -> (DType, itemsize), tag -> Arrow type, for the
# primitive types that need no bit or extension handling.
_PLAIN_CLASSES: dict[type, tuple[DType, int]] = {}
_PLAIN_TYPES: dict[int, pa.DataType] = {}
_foreign_buffer = pa.foreign_buffer
_from_buffers = pa.Array.from_buffers


def native_dtype(dtype: DType) -> pa.DataType:
    """The Arrow type of a Hurray element type (``pa.bool_()`` for the 1-bit ``hb.bool``)."""
    try:
        return _tables()[0][dtype.tag]
    except KeyError:
        raise UnsupportedError(
            f"Arrow has no type for {dtype.name} (Arrow arrays and tensors hold bool, "
            f"int8..int64, uint8..uint64 and float16/32/64); convert the values to one of "
            "those first"
        ) from None


def dtype_of(t: pa.DataType) -> DType:
    """The Hurray element type of an Arrow type."""
    try:
        return _tables()[1][t]
    except (KeyError, TypeError):
        pass
    hint = ""
    if pa.types.is_temporal(t) and getattr(t, "bit_width", 0) in (32, 64):
        hint = (f"; a {t} array is stored as integers: view them explicitly with "
                f"arr.view(pa.int{t.bit_width}()) if that is what you want")
    elif pa.types.is_dictionary(t):
        hint = "; decode it first: arr.dictionary_decode()"
    raise UnsupportedError(
        f"Arrow type {t} has no Hurray element type (supported: "
        f"{', '.join(str(v) for v in _tables()[0].values())}){hint}"
    )


# ------------------------------------------------------------------------ helpers
def _refuse_nulls(arr: pa.Array | pa.ChunkedArray, what: str) -> None:
    n = arr.null_count
    if n:
        raise UnsupportedError(
            f"{what} has {n} null(s); a Hurray tensor has no validity bitmap and the bytes "
            f"under a null are undefined, so they are not passed on. To convert it, "
            f"{_FILL_HINT}"
        )


def _require_cpu(buf: pa.Buffer) -> None:
    # Device arrays (C Device Data Interface, pyarrow >= 16) cannot be read from the host.
    # Buffer.is_cpu costs ~40 ns; Array.is_cpu ~700 ns (pyarrow 26), hence the buffer.
    if not buf.is_cpu:
        raise UnsupportedError(
            f"this Arrow array lives on {buf.device_type}; the Arrow adapter reads host "
            "memory only. Copy it to the CPU first (arr.copy_to(pa.default_cpu_memory_manager()))"
        )


def _repack_bits(src: int, bit_offset: int, n: int) -> HostAllocation | None:
    """Copy ``n`` bits starting ``bit_offset`` bits after ``src`` to fresh, byte-aligned memory.

    LSB-first on both sides (Arrow's and Hurray's bit order); the trailing bits of
    the last byte are written as zero, as Hurray requires of a writer.
    """
    out = alloc_aligned(-(-n // 8))
    if out is None:
        return None
    shift = bit_offset % 8
    raw = ctypes.string_at(src + bit_offset // 8, -(-(shift + n) // 8))
    ctypes.memmove(out.ptr, _subbyte.shift_bits(raw, shift, n), out.nbytes)
    return out


def _flat(arr: pa.Array, copy: bool | None, what: str, owner: object,
          dtype: DType | None = None) -> Tensor:
    """A rank-1 Tensor over a primitive, bool or bool8 array (nulls already refused)."""
    if dtype is None:
        dtype = dtype_of(arr.type)  # bool8 is in the table; other extension types are refused
    if dtype.kind == Kind.BOOL and dtype is not bool_:
        arr = arr.storage  # bool8: an extension type over int8
    n = len(arr)
    if n == 0:
        return Tensor._dense(0, (0,), dtype, strides=None, padded=False, device=CPU, owner=None,
                             readonly=True, copied=bool(copy))
    data = arr.buffers()[1]
    _require_cpu(data)
    if dtype is bool_:
        off = arr.offset
        if copy or off % 8:
            if copy is False:
                raise CopyRequiredError(
                    f"{what} is a boolean array starting at bit offset {off}; Hurray's bit-packed "
                    f"bool starts on a byte, so the bits must be shifted (a copy) but copy=False. "
                    "Pass copy=None or copy=True"
                )
            alloc = _repack_bits(data.address, off, n)
            assert alloc is not None
            return Tensor._dense(alloc.ptr, (n,), dtype, strides=None, padded=False, device=CPU,
                                 owner=alloc, readonly=False, copied=True)
        ptr = data.address + off // 8
    else:
        ptr = data.address + arr.offset * dtype.itemsize
    t = Tensor._dense(ptr, (n,), dtype, strides=None, padded=False, device=CPU, owner=owner,
                      readonly=True, copied=False)
    return t.copy() if copy else t


# ---------------------------------------------------------------------- to Hurray
def _from_fixed_shape(arr: pa.ExtensionArray, copy: bool | None) -> Tensor:
    typ = arr.type
    phys = tuple(typ.shape)
    perm = typ.permutation
    k = len(phys)
    if perm is not None and list(perm) != list(range(k)):
        perm = tuple(perm)
        # The spec: logical dim i is physical dim perm[i]. pyarrow 26.0.1 writes the
        # inverse (FixedShapeTensorArray.from_numpy_ndarray / from_tensor store the argsort
        # of the strides) and its own to_tensor() fails on such arrays. The two readings
        # agree only when the permutation is its own inverse, so only those are accepted.
        if any(perm[p] != i for i, p in enumerate(perm)):
            raise UnsupportedError(
                f"fixed_shape_tensor permutation {list(perm)} is not its own inverse: the "
                "canonical extension spec and pyarrow (26) read it in opposite directions, so "
                "its logical shape is ambiguous. Rebuild the array from a row-major tensor"
            )
        if typ.value_type == pa.bool_():
            raise UnsupportedError(
                "a permuted fixed_shape_tensor of bit-packed bool has no strided Hurray form "
                "(packed bits are not addressable one by one); rebuild it without a permutation"
            )
    else:
        perm = None
    storage = arr.storage
    _refuse_nulls(storage, "this fixed_shape_tensor array")
    size = 1
    for d in phys:
        size *= d
    child = storage.values.slice(storage.offset * size, len(arr) * size)
    _refuse_nulls(child, "the values of this fixed_shape_tensor array")
    flat = _flat(child, copy, "the values of this fixed_shape_tensor array", arr)
    if perm is None:
        shape, strides = (len(arr), *phys), None
    else:
        phys_strides = compact_strides(phys)
        shape = (len(arr), *(phys[p] for p in perm))
        strides = (size, *(phys_strides[p] for p in perm))
    if flat.nbytes == 0:
        strides = None
    return Tensor._dense(flat.data_ptr, shape, flat.dtype, strides=strides, padded=False,
                         device=CPU, owner=flat.owner, readonly=flat.readonly, copied=flat.copied)


def _from_tensor(obj: pa.Tensor, copy: bool | None) -> Tensor:
    if _TENSOR_EXPORTS_DLPACK:
        t = from_dlpack(obj)
    else:
        # Tensor.to_numpy() is a zero-copy view (NumPy is a pyarrow dependency before 16).
        from hurray_bridge._host import to_hurray as host_to_hurray

        t = host_to_hurray(obj.to_numpy())
    if t.readonly == obj.is_mutable:
        # pyarrow <= 25 exports legacy capsules, which cannot say READ_ONLY, and the core
        # reads Arrow's as read-only (LEGACY_EXPORTS_MUTABLE): a pa.Tensor says which it is.
        t = Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=t.strides, padded=False,
                          device=t.device, owner=t.owner, readonly=not obj.is_mutable,
                          copied=t.copied)
    return t.copy() if copy else t


def to_hurray(obj: Any, *, copy: bool | None = None) -> Tensor:
    """A pyarrow Array, ChunkedArray, Tensor or FixedShapeTensorArray as an hb.Tensor.

    Zero-copy whenever Arrow's memory allows; ``copy=None`` copies (and sets
    ``t.copied``) for a boolean array that does not start on a byte and for a
    ChunkedArray of several chunks; ``copy=False`` raises CopyRequiredError there.
    """
    plain = _PLAIN_CLASSES.get(type(obj))
    if plain is not None and not copy:
        # A primitive array of a whole-byte type: the common case, kept shortest.
        if obj.null_count:
            _refuse_nulls(obj, "this Arrow array")
        n = len(obj)
        if n:
            data = obj.buffers()[1]
            if not data.is_cpu:
                _require_cpu(data)
            pdtype, isz = plain
            return Tensor._dense(data.address + obj.offset * isz, (n,), pdtype, strides=None,
                                 padded=False, device=CPU, owner=obj, readonly=True, copied=False)
    dtype = _tables()[2].get(type(obj))
    if dtype is not None:  # a primitive, bool or bool8 array
        _refuse_nulls(obj, "this Arrow array")
        return _flat(obj, copy, "this Arrow array", obj, dtype)
    if isinstance(obj, pa.ChunkedArray):
        return _from_chunked(obj, copy)
    if isinstance(obj, pa.Tensor):
        return _from_tensor(obj, copy)
    if isinstance(obj, pa.Array):
        if isinstance(obj.type, pa.FixedShapeTensorType):
            return _from_fixed_shape(obj, copy)
        if pa.types.is_fixed_size_list(obj.type):
            raise UnsupportedError(
                f"a plain {obj.type} array has no shape of its own; wrap it as a tensor array: "
                "pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(value_type, shape), arr)"
            )
        dtype_of(obj.type)  # refuse unknown types before looking at nulls
        _refuse_nulls(obj, "this Arrow array")
        return _flat(obj, copy, "this Arrow array", obj)
    if isinstance(obj, (pa.SparseCOOTensor, pa.SparseCSRMatrix, pa.SparseCSCMatrix,
                        pa.SparseCSFTensor)):
        raise UnsupportedError(
            f"{type(obj).__name__} is not supported by the Arrow adapter yet; convert it to "
            "scipy.sparse (to_scipy()) or dense (to_tensor()) first"
        )
    kind = type(obj).__name__
    hint = ""
    if isinstance(obj, (pa.Table, pa.RecordBatch)):
        hint = "; pick one column: table.column(name)"
    elif isinstance(obj, pa.Scalar):
        hint = "; wrap it in an array: pa.array([scalar])"
    raise UnsupportedError(
        f"the Arrow adapter converts pyarrow Array, ChunkedArray, Tensor and "
        f"FixedShapeTensorArray, not {kind}{hint}"
    )


def _from_chunked(obj: pa.ChunkedArray, copy: bool | None) -> Tensor:
    n = obj.num_chunks
    if n == 1:
        return to_hurray(obj.chunk(0), copy=copy)
    if n == 0:
        # combine_chunks() of no chunks is an empty array of the type: nothing is copied.
        return to_hurray(obj.combine_chunks(), copy=copy)
    if copy is False:
        raise CopyRequiredError(
            f"this ChunkedArray has {n} chunks in separate buffers and one hb.Tensor needs "
            "them in one buffer (a copy), but copy=False; pass copy=None or copy=True to "
            "combine them, or convert chunk by chunk: [hb.asarray(c) for c in arr.chunks]"
        )
    if not isinstance(obj.type, pa.FixedShapeTensorType):
        dtype_of(obj.type)
    # Refuse nulls before paying for the copy.
    _refuse_nulls(obj, "this ChunkedArray")
    combined = obj.combine_chunks()  # fresh memory, offset 0: shared from here on
    t = to_hurray(combined, copy=None)
    # Nothing else sees that memory (only this tensor holds ``combined``): it is a
    # private copy, so writable like any other copy.
    return Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=t.strides, padded=False, device=CPU,
                         owner=t.owner, readonly=False, copied=True)


# -------------------------------------------------------------------- from Hurray
def _copy(t: Tensor) -> Tensor:
    """A compact host copy; for packed bool also with the trailing bits zeroed."""
    c = t.copy()
    if c.dtype is bool_:
        n = c.shape[0] if c.ndim == 1 else c.descriptor.element_count
        if n % 8:
            last = ctypes.c_ubyte.from_address(c.buffers[0].ptr + c.nbytes - 1)
            last.value &= (1 << (n % 8)) - 1
    return c


def _compact(t: Tensor, copy: bool | None, why: str) -> Tensor:
    if copy is False:
        raise CopyRequiredError(f"{why}, which needs a compact copy, but copy=False")
    if copy is None:
        warn_copy(NAME, why)
    return _copy(t)


def _data_buffer(t: Tensor, n_items: int, typ: pa.DataType) -> pa.Array:
    """A flat Arrow array of ``n_items`` values over the tensor's data (no copy)."""
    b = t.buffers[0]
    # foreign_buffer(base=t) keeps the tensor, and so its producer's memory, alive.
    # An empty tensor gets a zero-length buffer at address 0, as pyarrow's own
    # Array.from_dlpack makes one: nothing is allocated.
    buf = pa.foreign_buffer(b.ptr, b.nbytes, base=t if b.nbytes else None)
    if isinstance(typ, pa.ExtensionType):
        storage = pa.Array.from_buffers(typ.storage_type, n_items, [None, buf], null_count=0)
        return pa.ExtensionArray.from_storage(typ, storage)
    return pa.Array.from_buffers(typ, n_items, [None, buf], null_count=0)


def _to_array(t: Tensor, copy: bool | None) -> pa.Array:
    if t.ndim != 1:
        raise UnsupportedError(
            f"kind='array' needs a rank-1 tensor, got shape {list(t.shape)}; use "
            "kind='tensor' or kind='fixed_shape_tensor' (leading dimension = batch)"
        )
    typ = native_dtype(t.dtype)
    if t.strides is not None:
        t = _compact(t, copy, f"an Arrow array is contiguous; this tensor has stride "
                              f"{t.strides[0]}")
    elif copy:
        t = _copy(t)
    return _data_buffer(t, t.shape[0], typ)


def _to_tensor(t: Tensor, copy: bool | None) -> pa.Tensor:
    if t.dtype.kind == Kind.BOOL:
        raise UnsupportedError(
            f"an Arrow Tensor holds numbers only, not {t.dtype.name}; use "
            "kind='fixed_shape_tensor' (a batch of bool tensors) or kind='array' (rank 1)"
        )
    if t.strides is not None and any(s < 0 for s in t.strides):
        # pyarrow 26.0.1 Tensor.from_dlpack raises ArrowInvalid "negative strides not supported".
        t = _compact(t, copy, f"an Arrow Tensor cannot have negative strides {list(t.strides)}")
    elif copy:
        t = _copy(t)
    if _TENSOR_IMPORTS_DLPACK:
        # Zero-copy, keeps t alive through the capsule, maps READ_ONLY to is_mutable=False;
        # copy=False makes pyarrow fail rather than copy behind our back.
        return pa.Tensor.from_dlpack(t, copy=False)
    # pyarrow <= 25 has no DLPack consumer: go through a zero-copy NumPy view.
    from hurray_bridge._host import from_hurray as host_from_hurray

    return pa.Tensor.from_numpy(host_from_hurray(t, copy=False))


def _permutation(shape: tuple[int, ...], strides: tuple[int, ...]) -> list[int] | None:
    """The spec permutation of a batch of tensors, or None when it has none Arrow can read.

    Batch dimension first and compact; each tensor a permutation of a compact
    row-major block. Only permutations that are their own inverse are written
    (see _from_fixed_shape for why).
    """
    inner_shape, inner = shape[1:], strides[1:]
    size = 1
    for d in inner_shape:
        size *= d
    if shape[0] != 1 and strides[0] != size:
        return None
    # order[j] = the logical dimension stored at physical position j (largest stride first).
    order = sorted(range(len(inner)), key=lambda i: -inner[i])
    phys = [inner_shape[i] for i in order]
    expected = compact_strides(phys)
    if any(inner[order[j]] != expected[j] and phys[j] != 1 for j in range(len(order))):
        return None
    perm = [0] * len(order)
    for j, i in enumerate(order):
        perm[i] = j  # spec: logical dim i is physical dim perm[i]
    if any(perm[p] != i for i, p in enumerate(perm)):
        return None
    return perm


def _to_fixed_shape(t: Tensor, copy: bool | None) -> pa.ExtensionArray:
    if t.ndim < 2:
        raise UnsupportedError(
            f"kind='fixed_shape_tensor' needs rank >= 2 (batch, *value_shape), got shape "
            f"{list(t.shape)}; use kind='array' for rank 1"
        )
    typ = native_dtype(t.dtype)
    perm = None
    if t.strides is not None:
        perm = None if any(s < 0 for s in t.strides) else _permutation(t.shape, t.strides)
        if perm is None:
            t = _compact(t, copy, f"an Arrow tensor array stores each tensor as one row-major "
                                  f"(or permuted) block; strides {list(t.strides)} are not that")
        elif copy:
            t = _copy(t)
    elif copy:
        t = _copy(t)
    value_shape = list(t.shape[1:])
    if perm is not None:
        phys = [0] * len(perm)
        for i, p in enumerate(perm):
            phys[p] = value_shape[i]
        ext = pa.fixed_shape_tensor(typ, phys, permutation=perm)
    else:
        ext = pa.fixed_shape_tensor(typ, value_shape)
    size = 1
    for d in value_shape:
        size *= d
    values = _data_buffer(t, t.shape[0] * size, typ)
    # from_buffers, not FixedSizeListArray.from_arrays: a list size of 0 (shape [3, 0, 5])
    # gives no way to infer the length from the values.
    storage = pa.Array.from_buffers(ext.storage_type, t.shape[0], [None], null_count=0,
                                    children=[values])
    return pa.ExtensionArray.from_storage(ext, storage)


# The result's type follows ``kind`` (FixedShapeTensorArray is an Array); without it, the
# tensor's rank decides, which no type says.
@overload
def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None,
                kind: Literal["array"]) -> pa.Array: ...
@overload
def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None,
                kind: Literal["tensor"]) -> pa.Tensor: ...
@overload
def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None,
                kind: Literal["fixed_shape_tensor"]) -> pa.FixedShapeTensorArray: ...
@overload
def from_hurray(t: Tensor, *, device: Any = None, copy: bool | None = None,
                kind: str | None = None) -> pa.Array | pa.Tensor: ...
def from_hurray(
    t: Tensor, *, device: Any = None, copy: bool | None = None, kind: str | None = None
) -> pa.Array | pa.Tensor:
    """An hb.Tensor as a pyarrow object, sharing its memory unless a copy is needed or asked.

    ``kind``: ``"array"`` (rank 1 -> ``pa.Array``), ``"tensor"`` (any rank ->
    ``pa.Tensor``) or ``"fixed_shape_tensor"`` (rank >= 2 -> FixedShapeTensorArray
    with the leading dimension as the batch). By default rank 1 becomes an Array
    and every other rank a Tensor.
    """
    if (device is None and kind is None and not copy and type(t) is Tensor
            and t._strides is None and len(t._shape) == 1 and t._device.type == _CPU
            and (t._desc is None or t.is_dense)):
        typ = _PLAIN_TYPES.get(t._dtype.tag)
        if typ is not None:
            # Compact rank 1 of a primitive whole-byte type: an Array over the same memory.
            # foreign_buffer(base=t) keeps the tensor, and so its producer's memory, alive.
            # (Tensor's slots are read directly here: a property costs 2-3x a slot read.)
            nbytes = t._nbytes
            buf = _foreign_buffer(t._data, nbytes, base=t if nbytes else None)
            return _from_buffers(typ, t._shape[0], [None, buf], null_count=0)
    if copy is not None and copy is not True and copy is not False:
        check_copy(copy)
    if device not in (None, "cpu", CPU):
        raise UnsupportedError(
            f"the Arrow adapter builds host (CPU) arrays; device={device!r} is not possible"
        )
    if not isinstance(t, Tensor):
        t = asarray(t, copy=False if copy is False else None)
    if kind is None:
        kind = "array" if t.ndim == 1 else "tensor"
    elif kind not in KINDS:
        raise UnsupportedError(f"unknown kind {kind!r}; choose one of {', '.join(KINDS)}")
    if not t.is_dense:
        d = t.descriptor
        what = form_name(d)
        raise UnsupportedError(
            f"the Arrow adapter converts dense tensors, not a {what} one; densify it first"
        )
    native_dtype(t.dtype)  # Arrow lacks the type: say so before copying anything
    if t.dtype is bool_ and t.descriptor.padded:
        raise UnsupportedError(
            "this hb.bool tensor is padded (one byte per value); Arrow's bool is bit-packed "
            "and its one-byte bool is bool8: convert the tensor to bool8 first"
        )
    if not t.device.is_host_accessible:
        if copy is False:
            raise CopyRequiredError(
                f"a {t.device} tensor needs a copy to reach Arrow (host memory), but copy=False"
            )
        if copy is None:
            warn_copy(NAME, f"copied from {t.device} to host memory")
        t = host_copy(t, "Arrow")  # by its producer (dl_device=CPU)
        copy = None  # that was the copy
    if t.device != CPU:
        # Pinned or managed memory: the host reads it directly; Arrow knows it as CPU memory.
        t = Tensor._dense(t.data_ptr, t.shape, t.dtype, strides=t.strides, padded=False,
                          device=CPU, owner=t, readonly=t.readonly, copied=t.copied)
    def empty_overflows(why: object) -> UnsupportedError:
        # Without elements there is no memory to object to: only Arrow's size arithmetic.
        return UnsupportedError(
            f"Arrow cannot hold an empty tensor of shape {list(t.shape)}: its 64-bit offset "
            f"and stride arithmetic overflows ({why})")

    if 0 in t.shape and _empty_offsets_overflow(t):
        # Refused before Arrow is called: pyarrow fails while our capsule is in its hands,
        # and where the capsule's deleter is a ctypes callback (no compiled module) that
        # failure comes back as SystemError instead of ArrowInvalid.
        raise empty_overflows("a byte stride or offset passes 2**63 - 1")
    try:
        if kind == "array":
            return _to_array(t, copy)
        if kind == "tensor":
            return _to_tensor(t, copy)
        return _to_fixed_shape(t, copy)
    except (pa.ArrowInvalid, OverflowError) as exc:
        if 0 not in t.shape:
            raise
        raise empty_overflows(exc) from None


def _empty_offsets_overflow(t: Tensor) -> bool:
    """Whether Arrow's offset arithmetic overflows for ``t``, an empty tensor.

    Arrow computes every byte stride and the largest offset, sum((n - 1) * |stride|),
    in int64 whatever the element count; a tensor with elements has a span the import
    bounded below 2**63 bytes, so only an empty one can pass it.
    """
    item = max(1, t.dtype.bits // 8)
    strides = compact_strides(t.shape) if t.strides is None else t.strides  # as exported
    limit = 2**63 - 1
    span = 0
    for n, s in zip(t.shape, strides):
        b = abs(s) * item
        if b > limit:
            return True
        span += max(n - 1, 0) * b
    return span > limit


def native_dtypes() -> dict[DType, Any]:
    """Every Hurray element type Arrow holds, with its Arrow type."""
    by_tag = _tables()[0]
    return {d: by_tag[d.tag] for d in all_dtypes() if d.tag in by_tag}


def special_kind(obj: Any) -> str | None:
    """None: sparse Arrow tensors are told apart by their type before this adapter sees
    them, and every other refusal stands."""
    return None


def fast_import(tp: type) -> dict[str, Any]:
    """hb.convert's fast import for Arrow arrays (``.shortcuts``)."""
    from .shortcuts import fast_import as hook

    return hook(tp)


def fast_export() -> dict[str, Any]:
    """hb.convert's fast export to Arrow arrays (``.shortcuts``)."""
    from .shortcuts import fast_export as hook

    return hook()


def __getattr__(name: str) -> Any:
    # The name this adapter used before the adapter contract, still importable.
    if name == "native_type":
        warnings.warn("hurray_bridge.adapters.arrow.native_type is deprecated (every adapter "
                      "says native_dtype); use native_dtype", DeprecationWarning, stacklevel=2)
        return native_dtype
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
