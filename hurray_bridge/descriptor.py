"""The Hurray tensor descriptor: shape, element type, layout and their rules.

A :class:`Descriptor` is immutable, hashable and compared by value. Building
one enforces every rule of ``docs/spec/data-model.md`` and ADR-007; anything
that breaks a rule raises :class:`~hurray_bridge.errors.FormatError` naming
the field, whether the descriptor comes from Python or from bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple, NoReturn

from ._dlpack import DLDeviceType
from .dtypes import DType, Kind, all_dtypes, dtype_from_name
from .errors import DynamicShapeError, FormatError
from .layout import BufferRole, Flags, Layout, QuantScheme

__all__ = [
    "DYNAMIC",
    "MAX_RANK",
    "RULES",
    "BufferSpec",
    "Descriptor",
    "Quantization",
    "Rule",
    "Shard",
    "Sparse",
    "compact_strides",
]

DYNAMIC = 0xFFFFFFFFFFFFFFFF
"""The dynamic-dimension sentinel (UINT64_MAX). Never the same thing as 0."""

MAX_RANK = 64
"""Largest rank a descriptor may have (ADR-008)."""

_U64_MAX = 0xFFFFFFFFFFFFFFFF
_I64_MAX = 0x7FFFFFFFFFFFFFFF
_U32_MAX = 0xFFFFFFFF
# The type names the constructor's fast path resolves itself (an alias or an unknown name
# takes the general path, which names the defect).
_KNOWN_NAMES = frozenset(t.name for t in all_dtypes())


def _as_dtype(value: DType | str) -> DType:
    if isinstance(value, DType):
        return value
    if isinstance(value, str):
        return dtype_from_name(value)
    raise FormatError(f"expected an hb.DType or a type name, got {value!r}", field="dtype")


def _as_uint_tuple(values: Iterable[Any], name: str, limit: int = _U64_MAX) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)):
        raise FormatError(f"expected a sequence of integers, got {values!r}", field=name)
    try:
        items = tuple(values)
    except TypeError:
        raise FormatError(f"expected a sequence of integers, got {values!r}", field=name) from None
    if len(items) > MAX_RANK:
        raise FormatError(
            f"rank {len(items)} exceeds the maximum rank {MAX_RANK}; "
            "a descriptor may have at most 64 dimensions (ADR-008)",
            field=name,
        )
    out = []
    for i, v in enumerate(items):
        if isinstance(v, bool) or not isinstance(v, int):
            # operator.index accepts numpy integers and rejects floats, NaN and the like;
            # bool has __index__ too, so it is refused first (True is not a size).
            if isinstance(v, bool):
                raise FormatError(f"{name}[{i}] must be an integer, got {v!r}", field=name)
            try:
                v = v.__index__()
            except (AttributeError, TypeError):
                raise FormatError(
                    f"{name}[{i}] must be an integer, got {v!r}", field=name
                ) from None
        if v < 0 or v > limit:
            raise FormatError(
                f"{name}[{i}] = {v} is out of range [0, {limit}]"
                + ("; sizes cannot be negative" if v < 0 else ""),
                field=name,
            )
        out.append(v)
    return tuple(out)


def _as_int_tuple(values: Any, name: str) -> tuple[int, ...]:
    """Signed integers (strides): the types only; their range is a rule's (RULES)."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise FormatError(f"expected a sequence of integers, got {values!r}", field=name)
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise FormatError(f"{name}[{i}] must be an integer, got {v!r}", field=name)
        out.append(v.__index__())
    return tuple(out)


def _checked_product(values: Iterable[int], what: str) -> int:
    values = tuple(values)
    if 0 in values:
        return 0  # empty whatever the other sizes: never an overflow (ADR-007)
    n = 1
    for v in values:
        n *= v
        if n > _U64_MAX:
            raise FormatError(
                f"{what} overflows 64 bits; the tensor is larger than any buffer can be",
                field="shape",
            )
    return n


def form_name(d: Descriptor) -> str:
    """What a tensor that is not plain dense holds, for the errors that refuse one:
    ``"quantized"``, else its layout's name (``"COO"``, ``"CSR"`` ...)."""
    return "quantized" if d.quantization is not None else d.layout.name


def shape_str(shape: Sequence[int]) -> str:
    """A shape as errors print it: ``[3, 0, 5]``, a dynamic dimension as ``?``."""
    return "[" + ", ".join("?" if d == DYNAMIC else str(d) for d in shape) + "]"


def check_empty_nnz(layout: Layout, shape: Sequence[int], nnz: int) -> None:
    """An empty logical shape holds no index, so a sparse tensor of it stores no entry.

    Every stored entry needs an index below each dimension's size; with a dimension of
    size 0 there is none, duplicates or not. nnz = 0 is valid for any shape (ADR-007 §6).
    The descriptor (rule ``empty-shape-stores-nothing``), and so the wire decoder, and the
    sparse importers call this.
    """
    message = _empty_nnz_message(layout, shape, nnz)
    if message is not None:
        raise FormatError(message, field="sparse.nnz")


def _empty_nnz_message(layout: Layout, shape: Sequence[int], nnz: int) -> str | None:
    if nnz and 0 in shape:
        return (f"{layout.name} shape {shape_str(shape)} is empty (a dimension of size 0 has "
                f"no index), so it can store no entries: nnz must be 0, got nnz = {nnz} "
                "(ADR-007 §6)")
    return None


def _index_max(t: DType) -> int:
    return (1 << (t.bits - 1)) - 1 if t.kind == Kind.INT else (1 << t.bits) - 1


def check_index_range(layout: Layout, shape: Sequence[int], sparse: Sparse) -> None:
    """The index type holds every value an index buffer may contain (memory-layout.md §5.1).

    A decoder never sees the indices, only the shape and ``nnz``, so the rule is stated on
    them: ``INDPTR`` (CSR/CSC) ends at ``nnz``, and an index of a dimension of size ``n``
    may be as large as ``n - 1``. Without it an int8 CSR with nnz = 200 is written with
    200 wrapped to -56 and read back as if nothing were wrong. With ``nnz = 0`` no index
    is stored; a dynamic dimension is checked when it is resolved.
    """
    message = _index_range_message(layout, shape, sparse)
    if message is not None:
        raise FormatError(message, field="sparse.index_dtype")


def _index_range_message(layout: Layout, shape: Sequence[int], sparse: Sparse) -> str | None:
    if not sparse.nnz:
        return None
    t = sparse.index_dtype
    top = _index_max(t)
    what = None
    if layout != Layout.COO and sparse.nnz > top:
        what = f"nnz = {sparse.nnz} (the last INDPTR entry)"
        need = sparse.nnz
    else:
        dims = range(len(shape)) if layout == Layout.COO else (1 if layout == Layout.CSR else 0,)
        for j in dims:
            if shape[j] != DYNAMIC and shape[j] - 1 > top:
                what = f"dimension {j} has size {shape[j]}, so an index up to {shape[j] - 1}"
                need = shape[j] - 1
                break
    if what is None:
        return None
    wide = next(n for n in ("int16", "int32", "int64", "uint64")
                if need <= _index_max(dtype_from_name(n)))
    return (f"{layout.name} index type {t.name} holds values up to {top}, but {what}; "
            f"use a wider index type ({wide} or wider)")


def compact_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Row-major element strides of a compact tensor of ``shape``."""
    strides = [0] * len(shape)
    acc = 1
    for i in range(len(shape) - 1, -1, -1):
        strides[i] = acc
        acc *= max(shape[i], 1)
    return tuple(strides)


class BufferSpec(NamedTuple):
    """A buffer the descriptor calls for: its role and exact byte length."""

    role: BufferRole
    nbytes: int


@dataclass(frozen=True, slots=True)
class Quantization:
    """How stored elements map to real values: ``real = (q - zero_point) * scale``.

    ``axis`` is required for per-axis and per-block schemes, ``block_size`` for
    per-block. ``zero_point_dtype`` is ``None`` for symmetric schemes.
    """

    scheme: QuantScheme
    scale_dtype: DType = field(default_factory=lambda: dtype_from_name("float32"))
    zero_point_dtype: DType | None = None
    axis: int | None = None
    block_size: int | None = None

    def __post_init__(self) -> None:
        try:
            scheme = QuantScheme(self.scheme)
        except ValueError:
            raise FormatError(
                f"unknown quantization scheme {self.scheme!r}", field="quantization.scheme"
            ) from None
        object.__setattr__(self, "scheme", scheme)
        object.__setattr__(self, "scale_dtype", _as_dtype(self.scale_dtype))
        if self.zero_point_dtype is not None:
            object.__setattr__(self, "zero_point_dtype", _as_dtype(self.zero_point_dtype))
        _apply(self, _QUANTIZATION_RULES)

    def scales_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """Shape of the scale (and zero-point) array for a tensor of ``shape``."""
        if self.scheme == QuantScheme.PER_TENSOR:
            return ()
        assert self.axis is not None
        if self.scheme == QuantScheme.PER_AXIS:
            return (shape[self.axis],)
        assert self.block_size is not None
        n = shape[self.axis]
        return (*shape[: self.axis], -(-n // self.block_size), *shape[self.axis + 1 :])


@dataclass(frozen=True, slots=True)
class Sparse:
    """Sparse-layout parameters: stored-entry count, index type, canonical flag.

    ``canonical`` claims the indices are sorted (row-major for COO and CSR,
    column-major for CSC) with no duplicates. ``nnz = 0`` is valid whatever the
    shape (ADR-007 §6).
    """

    nnz: int
    index_dtype: DType = field(default_factory=lambda: dtype_from_name("int64"))
    canonical: bool = False

    def __post_init__(self) -> None:
        (nnz,) = _as_uint_tuple((self.nnz,), "sparse.nnz")
        object.__setattr__(self, "nnz", nnz)
        object.__setattr__(self, "index_dtype", _as_dtype(self.index_dtype))
        object.__setattr__(self, "canonical", bool(self.canonical))
        _apply(self, _SPARSE_RULES)


@dataclass(frozen=True, slots=True)
class Shard:
    """Where this tensor sits in a larger one: a box in the global index space.

    The descriptor's own shape is the box's size; ``offsets`` place it in
    ``global_shape``. No dimension of either may be dynamic.
    """

    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    replica_id: int = 0
    device_type: int = int(DLDeviceType.kDLCPU)
    device_id: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "global_shape",
                           _as_uint_tuple(self.global_shape, "shard.global_shape"))
        object.__setattr__(self, "offsets", _as_uint_tuple(self.offsets, "shard.offsets"))
        _apply(self, _SHARD_RULES)


class _BufferTableCache:
    """The buffer table and hash of a descriptor, kept once known: a descriptor never
    changes, a file of many small tensors asks for its table several times each (plan,
    encode, check), and a stream's tensors key the caches of their shape by it. A
    slot of this base, not a dataclass field: no value, so not compared, copied, pickled
    or listed by ``dataclasses.fields``; unset until asked (the decoders never set it)."""

    __slots__ = ("_hash", "_specs")
    _hash: int


@dataclass(frozen=True, slots=True, eq=True)
class Descriptor(_BufferTableCache):
    """A complete, validated description of a tensor's logical content and layout.

    Parameters
    ----------
    shape:
        Dimension sizes; 0 is an empty dimension, :data:`DYNAMIC` an unresolved one.
    dtype:
        An :class:`~hurray_bridge.DType` or its name.
    layout:
        A :class:`Layout`; row-major by default.
    strides:
        Element strides, required for (and only for) ``Layout.STRIDED``.
    tile:
        Tile sizes of the innermost dimensions, for ``Layout.TILED``.
    sparse:
        :class:`Sparse` parameters, for COO, CSR and CSC.
    quantization, shard:
        Optional sections.
    padded:
        Sub-byte elements stored one per byte instead of packed.
    """

    shape: tuple[int, ...]
    dtype: DType
    layout: Layout = Layout.ROW_MAJOR
    strides: tuple[int, ...] | None = None
    tile: tuple[int, ...] | None = None
    sparse: Sparse | None = None
    quantization: Quantization | None = None
    shard: Shard | None = None
    padded: bool = False

    def __post_init__(self) -> None:
        if type(self.dtype) is str and self.dtype in _KNOWN_NAMES:
            object.__setattr__(self, "dtype", dtype_from_name(self.dtype))
        if (type(self.shape) is tuple and type(self.dtype) is DType
                and self.layout is Layout.ROW_MAJOR and self.padded is False
                and self.strides is None and self.tile is None and self.sparse is None
                and self.quantization is None and self.shard is None
                and len(self.shape) <= MAX_RANK):
            # The common case (a dense tensor as files and DLPack hand them over): accepted
            # here when RULES would accept it, without the general path's conversions. It
            # never refuses: anything else goes on to the rules, which name the defect.
            n = 1
            for v in self.shape:
                if type(v) is not int or not 0 <= v < DYNAMIC:
                    break  # another kind of value, or a dynamic dimension: the full path
                n *= v
            else:
                dt = self.dtype
                nbytes = -(-n * dt.bits // 8) if dt.is_subbyte else n * dt.itemsize
                if n <= _U64_MAX and nbytes <= _U64_MAX:
                    object.__setattr__(self, "_specs", (BufferSpec(BufferRole.DATA, nbytes),))
                    return
        self._normalize()
        _apply(self, _rules_for(self))

    def __hash__(self) -> int:
        # Explicit, so that dataclass() leaves it: hashing the fields anew (tuples and
        # the nested sections) cost more than the cache lookups that ask for it.
        try:
            return self._hash
        except AttributeError:
            h = hash((self.shape, self.dtype, self.layout, self.strides, self.tile,
                      self.sparse, self.quantization, self.shard, self.padded))
            object.__setattr__(self, "_hash", h)
            return h

    def _normalize(self) -> None:
        """Field values to their types (tuples of ints, DType, Layout, bool): refusals of
        values no encoding can hold. What the values may be is RULES' business."""
        object.__setattr__(self, "shape", _as_uint_tuple(self.shape, "shape"))
        object.__setattr__(self, "dtype", _as_dtype(self.dtype))
        layout = self.layout
        if type(layout) is not Layout:  # (an Enum call costs more than the rest here)
            try:
                layout = Layout(layout)
            except ValueError:
                raise FormatError(f"unknown layout {layout!r}", field="layout") from None
            object.__setattr__(self, "layout", layout)
        if self.padded not in (True, False):  # 0, 1 and NumPy bools compare equal
            raise FormatError(f"padded must be True or False, got {self.padded!r}",
                              field="flags")
        object.__setattr__(self, "padded", bool(self.padded))
        if self.strides is not None:
            object.__setattr__(self, "strides", _as_int_tuple(self.strides, "strides"))
        if self.tile is not None or layout == Layout.TILED:
            object.__setattr__(self, "tile", _as_uint_tuple(self.tile or (), "tile"))

    # ------------------------------------------------------------------ basics
    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_dynamic(self) -> bool:
        return DYNAMIC in self.shape

    @property
    def is_empty(self) -> bool:
        """True when some dimension is 0 (known even while others are dynamic)."""
        return 0 in self.shape

    @property
    def flags(self) -> Flags:
        f = Flags.NONE
        if self.quantization is not None:
            f |= Flags.HAS_QUANTIZATION
        if self.shard is not None:
            f |= Flags.HAS_SHARD
        if self.padded:
            f |= Flags.SUBBYTE_PADDED
        return f

    def _require_static(self, what: str) -> None:
        if DYNAMIC in self.shape:
            dims = [i for i, d in enumerate(self.shape) if d == DYNAMIC]
            raise DynamicShapeError(
                f"cannot compute {what}: dimension(s) {dims} are dynamic; "
                "call resolve() with their sizes first"
            )

    @property
    def element_count(self) -> int:
        self._require_static("element_count")
        return _checked_product(self.shape, "element count")

    def _bytes_for(self, count: int, dtype: DType, padded: bool = False) -> int:
        if dtype.is_subbyte and not padded:
            return -(-count * dtype.bits // 8)  # packed: no partial byte for an empty tensor
        return count * dtype.itemsize

    @property
    def strides_or_compact(self) -> tuple[int, ...]:
        """Element strides: the stored ones, or the compact row-major ones."""
        self._require_static("strides")
        if self.strides is not None:
            return self.strides
        return compact_strides(self.shape)

    def _data_elements(self) -> int:
        """Elements the primary buffer holds (span for strided, padding for tiled)."""
        n = self.element_count
        if n == 0:
            return 0
        if self.layout == Layout.STRIDED:
            assert self.strides is not None
            return 1 + sum((d - 1) * abs(s) for d, s in zip(self.shape, self.strides))
        if self.layout == Layout.TILED:
            assert self.tile is not None
            k = len(self.tile)
            outer = self.shape[: self.rank - k]
            inner = [-(-d // t) * t for d, t in zip(self.shape[self.rank - k :], self.tile)]
            return _checked_product((*outer, *inner), "tiled extent")
        if self.layout.is_sparse:
            assert self.sparse is not None
            return self.sparse.nnz
        return n

    @property
    def trailing_bits(self) -> int:
        """Bits of the primary buffer's last byte that lie after the last element (0 … 7).

        Non-zero only for packed sub-byte data whose elements end inside a byte. They
        are the high bits of that byte (the packing is LSB-first), written as zero and
        ignored on read (element-types.md §4.1 rule 6).
        """
        if not self.dtype.is_subbyte or self.padded:
            return 0
        self._require_static("trailing_bits")
        return -self._data_elements() * self.dtype.bits % 8

    @property
    def nbytes(self) -> int:
        """Byte length of the primary buffer (data, or values for sparse layouts)."""
        self._require_static("nbytes")
        return self._bytes_for(self._data_elements(), self.dtype, self.padded)

    def buffer_layout(self) -> tuple[BufferSpec, ...]:
        """Every buffer this descriptor calls for, in canonical order, with exact lengths."""
        known = getattr(self, "_specs", None)
        if known is None:
            known = self._buffer_layout()
            object.__setattr__(self, "_specs", known)
        return known

    def _buffer_layout(self) -> tuple[BufferSpec, ...]:
        self._require_static("the buffer table")
        specs: list[BufferSpec] = []
        if self.layout.is_sparse:
            sp = self.sparse
            assert sp is not None
            isz = sp.index_dtype.itemsize
            specs.append(BufferSpec(BufferRole.VALUES, self.nbytes))
            if self.layout == Layout.COO:
                specs.append(BufferSpec(BufferRole.INDICES, self.rank * sp.nnz * isz))
            else:
                n_ptr = (self.shape[0] if self.layout == Layout.CSR else self.shape[1]) + 1
                specs.append(BufferSpec(BufferRole.INDPTR, n_ptr * isz))
                specs.append(BufferSpec(BufferRole.INDICES, sp.nnz * isz))
        else:
            specs.append(BufferSpec(BufferRole.DATA, self.nbytes))
        q = self.quantization
        if q is not None:
            count = _checked_product(q.scales_shape(self.shape), "scale count")
            specs.append(BufferSpec(BufferRole.SCALES, count * q.scale_dtype.itemsize))
            if q.zero_point_dtype is not None:
                specs.append(
                    BufferSpec(BufferRole.ZERO_POINTS, count * q.zero_point_dtype.itemsize)
                )
        return tuple(specs)

    # ------------------------------------------------------------- transforms
    def resolve(self, sizes: Mapping[int, int] | Sequence[int]) -> Descriptor:
        """Supply the dynamic dimensions and return the resolved descriptor.

        ``sizes`` is either a mapping ``{axis: size}`` or a sequence giving one
        size per dynamic dimension, in order. Static dimensions are never
        changed: naming one is an error, even with its own value. 0 is a valid
        size (an empty dimension), never "dynamic".
        """
        dyn = [i for i, d in enumerate(self.shape) if d == DYNAMIC]
        if isinstance(sizes, Mapping):
            items = dict(sizes)
        else:
            try:
                seq = list(sizes)
            except TypeError:
                raise DynamicShapeError(
                    f"resolve() takes a mapping {{axis: size}} or a sequence of sizes, got "
                    f"{sizes!r}") from None
            if len(seq) != len(dyn):
                raise DynamicShapeError(
                    f"resolve() got {len(seq)} sizes for {len(dyn)} dynamic dimension(s) {dyn}"
                )
            items = dict(zip(dyn, seq))
        shape = list(self.shape)
        for axis, size in items.items():
            if not isinstance(axis, int) or not -self.rank <= axis < self.rank:
                raise DynamicShapeError(f"axis {axis!r} is out of range for rank {self.rank}")
            axis %= self.rank
            if shape[axis] != DYNAMIC:
                raise DynamicShapeError(
                    f"axis {axis} is static (size {shape[axis]}); "
                    "only dynamic dimensions can be resolved"
                )
            if isinstance(size, bool) or not hasattr(size, "__index__"):
                raise DynamicShapeError(f"size for axis {axis} must be an integer, got {size!r}")
            size = size.__index__()
            if not 0 <= size < DYNAMIC:
                raise DynamicShapeError(
                    f"size {size} for axis {axis} is out of range [0, 2**64 - 2]"
                )
            shape[axis] = size
        return Descriptor(
            tuple(shape),
            self.dtype,
            self.layout,
            self.strides,
            self.tile,
            self.sparse,
            self.quantization,
            self.shard,
            self.padded,
        )

    # --------------------------------------------------------------- encoding
    def to_bytes(self) -> bytes:
        """The binary encoding of ``docs/spec/metadata.md``."""
        return (_codec.encode or _no_codec())(self)

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> Descriptor:
        """Decode untrusted bytes; any defect raises :class:`FormatError`."""
        return (_codec.decode or _no_codec())(data)

    def __repr__(self) -> str:
        parts = [f"shape={shape_str(self.shape)}", f"dtype={self.dtype.name}"]
        if self.layout != Layout.ROW_MAJOR:
            parts.append(f"layout={self.layout.name}")
        if self.strides is not None:
            parts.append(f"strides={list(self.strides)}")
        if self.tile is not None:
            parts.append(f"tile={list(self.tile)}")
        if self.sparse is not None:
            parts.append(
                f"nnz={self.sparse.nnz}, index={self.sparse.index_dtype.name}"
                + (", canonical" if self.sparse.canonical else "")
            )
        if self.padded:
            parts.append("padded")
        if self.quantization is not None:
            parts.append(f"quantization={self.quantization.scheme.name}")
        if self.shard is not None:
            parts.append(f"shard@{list(self.shard.offsets)}")
        return f"Descriptor({', '.join(parts)})"


# ---------------------------------------------------------------------------- the rules
#
# Every rule a descriptor's values obey, once. Each class runs its own rules, in this
# order, on its normalized values (each rule may assume those before it hold): Sparse,
# Quantization and Shard when built, Descriptor after them. The wire decoder builds those
# objects from what it read after its structural checks (magic, version, reserved bytes,
# truncation, tags), so it applies these rules and no copy of them. The C library
# (c/src/descriptor.c) and the compiled decoder built from it follow the same rules:
# tests/cross/test_descriptor_rules.py runs one table of cases (tests/descriptor_cases.py)
# through all four and holds them to the same answer, field by field.

_Check = Callable[[Any], "str | None"]


class Rule(NamedTuple):
    """One rule of a descriptor's values: the class it applies to (``"Descriptor"``,
    ``"Sparse"``, ``"Quantization"`` or ``"Shard"``), its name, the field it guards, and its
    check: given the object, the message it is refused with (the value, the limit, the
    fix), or None when the rule holds."""

    subject: str
    name: str
    field: str
    check: _Check
    needs: str | None = None
    """What the rule is about, when it can only break where the descriptor has it (a
    name _features() gives): Descriptor() skips it otherwise. None: always checked."""


_RULES: list[Rule] = []


def _rule(subject: type, name: str, field: str,
          needs: str | None = None) -> Callable[[_Check], _Check]:
    def add(check: _Check) -> _Check:
        _RULES.append(Rule(subject.__name__, name, field, check, needs))
        return check
    return add


def _apply(obj: object, rules: tuple[Rule, ...]) -> None:
    for rule in rules:
        message = rule.check(obj)
        if message is not None:
            raise FormatError(message, field=rule.field, rule=rule.name)


@_rule(Sparse, "nnz-is-a-count", "sparse.nnz")
def _nnz_is_a_count(sp: Sparse) -> str | None:
    if sp.nnz == _U64_MAX:
        return f"nnz = {sp.nnz} is out of range [0, {_U64_MAX - 1}]; 2**64 - 1 counts nothing"
    return None


@_rule(Sparse, "integer-index-type", "sparse.index_dtype")
def _integer_index_type(sp: Sparse) -> str | None:
    idx = sp.index_dtype
    if idx.kind not in (Kind.INT, Kind.UINT) or idx.is_subbyte:
        return f"sparse index type must be an integer type of 8 bits or more, got {idx}"
    return None


@_rule(Quantization, "float-scale-type", "quantization.scale_dtype")
def _float_scale_type(q: Quantization) -> str | None:
    if q.scale_dtype.kind != Kind.FLOAT or q.scale_dtype.is_subbyte:
        return f"scale type must be a float type of 8 bits or more, got {q.scale_dtype}"
    return None


@_rule(Quantization, "numeric-zero-point-type", "quantization.zero_point_dtype")
def _numeric_zero_point_type(q: Quantization) -> str | None:
    zp = q.zero_point_dtype
    if zp is not None and (zp.kind not in (Kind.INT, Kind.UINT, Kind.FLOAT) or zp.is_subbyte):
        return f"zero-point type must be an integer or float type, got {zp}"
    return None


@_rule(Quantization, "per-tensor-has-no-axis", "quantization.axis")
def _per_tensor_has_no_axis(q: Quantization) -> str | None:
    if q.scheme == QuantScheme.PER_TENSOR and (q.axis is not None or q.block_size is not None):
        return "a per-tensor scheme takes neither axis nor block_size"
    return None


@_rule(Quantization, "axis-given", "quantization.axis")
def _axis_given(q: Quantization) -> str | None:
    a = q.axis
    if q.scheme != QuantScheme.PER_TENSOR and (a is None or isinstance(a, bool)
                                               or not isinstance(a, int)):
        return f"{q.scheme.name} needs an integer axis, got {a!r}"
    return None


@_rule(Quantization, "block-size-given", "quantization.block_size")
def _block_size_given(q: Quantization) -> str | None:
    bs = q.block_size
    if q.scheme == QuantScheme.PER_BLOCK and (
            isinstance(bs, bool) or not isinstance(bs, int) or not 1 <= bs <= _U64_MAX - 1):
        return f"per-block quantization needs a block_size >= 1, got {bs!r}"
    return None


@_rule(Quantization, "block-size-only-per-block", "quantization.block_size")
def _block_size_only_per_block(q: Quantization) -> str | None:
    if q.scheme == QuantScheme.PER_AXIS and q.block_size is not None:
        return "only per-block quantization takes a block_size"
    return None


@_rule(Shard, "shard-static", "shard.global_shape")
def _shard_static(sh: Shard) -> str | None:
    if DYNAMIC in sh.global_shape or DYNAMIC in sh.offsets:
        return "shard descriptors must not use dynamic dimensions"
    return None


def _shard_id_rule(name: str, lo: int, hi: int) -> None:
    @_rule(Shard, f"shard-{name.replace('_', '-')}-range", f"shard.{name}")
    def check(sh: Shard) -> str | None:
        v = getattr(sh, name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            return f"{name} must be an integer in [{lo}, {hi}], got {v!r}"
        return None


_shard_id_rule("replica_id", 0, _U32_MAX)
_shard_id_rule("device_type", 0, 0x7FFFFFFF)
_shard_id_rule("device_id", 0, 0x7FFFFFFF)


@_rule(Descriptor, "padded-needs-subbyte", "flags", "padded")
def _padded_needs_subbyte(d: Descriptor) -> str | None:
    if d.padded and not d.dtype.is_subbyte:
        return (f"the padded form applies to sub-byte types only, not {d.dtype}; "
                "drop padded (SUBBYTE_PADDED)")
    return None


@_rule(Descriptor, "scalar-is-row-major", "layout", "other-layout")
def _scalar_is_row_major(d: Descriptor) -> str | None:
    if not d.shape and d.layout != Layout.ROW_MAJOR:
        return f"a scalar (rank 0) must be row-major, not {d.layout.name}"
    return None


@_rule(Descriptor, "strided-needs-strides", "strides", "strided-layout")
def _strided_needs_strides(d: Descriptor) -> str | None:
    if d.layout == Layout.STRIDED and d.strides is None:
        return "the strided layout needs strides"
    return None


@_rule(Descriptor, "strides-only-when-strided", "strides", "strides-elsewhere")
def _strides_only_when_strided(d: Descriptor) -> str | None:
    if d.layout != Layout.STRIDED and d.strides is not None:
        return f"strides given for the {d.layout.name} layout"
    return None


@_rule(Descriptor, "one-stride-per-dimension", "strides", "strides")
def _one_stride_per_dimension(d: Descriptor) -> str | None:
    if d.strides is not None and len(d.strides) != len(d.shape):
        return f"{len(d.strides)} strides for rank {len(d.shape)}"
    return None


@_rule(Descriptor, "strided-needs-static-shape", "strides", "strides")
def _strided_needs_static_shape(d: Descriptor) -> str | None:
    # Strides of a dynamic shape would be computed from unknown sizes.
    if d.strides is not None and DYNAMIC in d.shape:
        return "the strided layout needs a static shape"
    return None


@_rule(Descriptor, "stride-range", "strides", "strides")
def _stride_range(d: Descriptor) -> str | None:
    for i, s in enumerate(d.strides or ()):
        if not -_I64_MAX <= s <= _I64_MAX:  # -2**63 has no magnitude in int64
            return f"strides[{i}] = {s} is outside [-(2**63 - 1), 2**63 - 1]"
    return None


@_rule(Descriptor, "packed-is-not-strided", "strides", "strides")
def _packed_is_not_strided(d: Descriptor) -> str | None:
    if d.strides is not None and d.dtype.is_subbyte and not d.padded:
        return (f"packed {d.dtype} cannot be strided (elements are not byte-addressable); "
                "use the padded form")
    return None


@_rule(Descriptor, "tile-sizes", "tile", "tiled-layout")
def _tile_sizes(d: Descriptor) -> str | None:
    tile, rank = d.tile, len(d.shape)
    if d.layout == Layout.TILED and tile is not None and (
            not 1 <= len(tile) <= rank or 0 in tile or DYNAMIC in tile):
        return f"tile {tile} must give 1..{rank} positive static sizes for the innermost dims"
    return None


@_rule(Descriptor, "tile-only-when-tiled", "tile", "tile-elsewhere")
def _tile_only_when_tiled(d: Descriptor) -> str | None:
    if d.layout != Layout.TILED and d.tile is not None:
        return f"tile given for the {d.layout.name} layout"
    return None


@_rule(Descriptor, "sparse-needs-section", "sparse", "sparse-layout")
def _sparse_needs_section(d: Descriptor) -> str | None:
    if d.layout.is_sparse and not isinstance(d.sparse, Sparse):
        return f"the {d.layout.name} layout needs a Sparse section"
    return None


@_rule(Descriptor, "section-only-when-sparse", "sparse", "sparse-elsewhere")
def _section_only_when_sparse(d: Descriptor) -> str | None:
    if not d.layout.is_sparse and d.sparse is not None:
        return f"a Sparse section given for the {d.layout.name} layout"
    return None


@_rule(Descriptor, "compressed-is-rank-2", "layout", "sparse-layout")
def _compressed_is_rank_2(d: Descriptor) -> str | None:
    if d.layout in (Layout.CSR, Layout.CSC) and len(d.shape) != 2:
        return f"{d.layout.name} needs rank 2, got rank {len(d.shape)}"
    return None


@_rule(Descriptor, "empty-shape-stores-nothing", "sparse.nnz", "sparse")
def _empty_shape_stores_nothing(d: Descriptor) -> str | None:
    return None if d.sparse is None else _empty_nnz_message(d.layout, d.shape, d.sparse.nnz)


@_rule(Descriptor, "canonical-nnz-fits", "sparse.nnz", "sparse")
def _canonical_nnz_fits(d: Descriptor) -> str | None:
    sp = d.sparse
    if sp is not None and sp.canonical and DYNAMIC not in d.shape:
        cells = _checked_product(d.shape, "element count")
        if sp.nnz > cells:
            return (f"canonical (duplicate-free) {d.layout.name} has nnz {sp.nnz} "
                    f"but the shape holds only {cells} elements")
    return None


@_rule(Descriptor, "index-type-holds-indices", "sparse.index_dtype", "sparse")
def _index_type_holds_indices(d: Descriptor) -> str | None:
    return None if d.sparse is None else _index_range_message(d.layout, d.shape, d.sparse)


@_rule(Descriptor, "quantization-is-section", "quantization", "quantization")
def _quantization_is_section(d: Descriptor) -> str | None:
    q = d.quantization
    if q is not None and not isinstance(q, Quantization):
        return f"expected a Quantization, got {q!r}"
    return None


@_rule(Descriptor, "quantized-storage-type", "quantization", "quantization")
def _quantized_storage_type(d: Descriptor) -> str | None:
    t = d.dtype
    storable = t.kind in (Kind.INT, Kind.UINT) or (
        t.kind == Kind.FLOAT and t.bits <= 8 and t.name != "float8_e8m0fnu"
    )  # e8m0 has no sign or mantissa: a scale format, not a storage one
    if d.quantization is not None and not storable:
        return f"quantized storage must be an integer, float8 or float4 type, not {t}"
    return None


@_rule(Descriptor, "quantization-axis-in-rank", "quantization.axis", "quantization")
def _quantization_axis_in_rank(d: Descriptor) -> str | None:
    q = d.quantization
    if q is not None and q.axis is not None and not 0 <= q.axis < len(d.shape):
        return f"quantization axis {q.axis} is out of range for rank {len(d.shape)}"
    return None


@_rule(Descriptor, "quantization-axis-static", "quantization.axis", "quantization")
def _quantization_axis_static(d: Descriptor) -> str | None:
    q = d.quantization
    if q is not None and q.axis is not None and d.shape[q.axis] == DYNAMIC:
        return (f"quantization axis {q.axis} is dynamic; its size must be static "
                "(data-model.md, dynamic dimensions rule 3)")
    return None


@_rule(Descriptor, "shard-is-section", "shard", "shard")
def _shard_is_section(d: Descriptor) -> str | None:
    if d.shard is not None and not isinstance(d.shard, Shard):
        return f"expected a Shard, got {d.shard!r}"
    return None


@_rule(Descriptor, "shard-shape-static", "shape", "shard")
def _shard_shape_static(d: Descriptor) -> str | None:
    if d.shard is not None and DYNAMIC in d.shape:
        return "a shard descriptor must not have dynamic dimensions"
    return None


@_rule(Descriptor, "shard-box-rank", "shard", "shard")
def _shard_box_rank(d: Descriptor) -> str | None:
    sh, rank = d.shard, len(d.shape)
    if sh is not None and (len(sh.global_shape) != rank or len(sh.offsets) != rank):
        return (f"shard box has rank {len(sh.offsets)}/{len(sh.global_shape)}, "
                f"tensor rank {rank}")
    return None


@_rule(Descriptor, "shard-box-inside", "shard.offsets", "shard")
def _shard_box_inside(d: Descriptor) -> str | None:
    sh = d.shard
    if sh is not None:
        for i, (o, n, g) in enumerate(zip(sh.offsets, d.shape, sh.global_shape)):
            if o + n > g:
                return f"shard box dim {i} spans [{o}, {o + n}) outside the global size {g}"
    return None


# Refuse shapes whose byte size cannot exist: checked once here so that every later size
# computation is known to fit in 64 bits. A dynamic shape has no size yet: resolve() checks.
@_rule(Descriptor, "element-count-fits", "shape")
def _element_count_fits(d: Descriptor) -> str | None:
    if DYNAMIC not in d.shape and _product(d.shape) > _U64_MAX:
        return "element count overflows 64 bits; the tensor is larger than any buffer can be"
    return None


@_rule(Descriptor, "strided-span-fits", "strides", "strides")
def _strided_span_fits(d: Descriptor) -> str | None:
    if d.strides is not None and 0 not in d.shape:
        span = 1
        for n, s in zip(d.shape, d.strides):
            span += (n - 1) * abs(s)
        if span > _I64_MAX:
            return "the strided span overflows int64"
    return None


@_rule(Descriptor, "bytes-fit", "shape")
def _bytes_fit(d: Descriptor) -> str | None:
    if DYNAMIC not in d.shape:
        total = sum(s.nbytes for s in d.buffer_layout())
        if total > _U64_MAX:
            return f"the tensor needs {total} bytes, more than 2**64 - 1"
    return None


RULES: tuple[Rule, ...] = tuple(_RULES)
"""Every rule of a descriptor's values, each class's in the order it applies them."""

_SPARSE_RULES, _QUANTIZATION_RULES, _SHARD_RULES, _DESCRIPTOR_RULES = (
    tuple(r for r in RULES if r.subject == c.__name__)
    for c in (Sparse, Quantization, Shard, Descriptor))

_RULES_BY_FEATURES: dict[tuple[object, ...], tuple[Rule, ...]] = {}


def _features(layout: Layout, padded: bool, strides: bool, tile: bool, sparse: bool,
              quantization: bool, shard: bool) -> set[str]:
    """What a descriptor has beyond a dense row-major shape: the values of Rule.needs."""
    has = {"padded": padded, "strides": strides, "tile": tile, "sparse": sparse,
           "quantization": quantization, "shard": shard,
           "other-layout": layout != Layout.ROW_MAJOR,
           "strided-layout": layout == Layout.STRIDED,
           "tiled-layout": layout == Layout.TILED,
           "sparse-layout": layout.is_sparse,
           "strides-elsewhere": strides and layout != Layout.STRIDED,
           "tile-elsewhere": tile and layout != Layout.TILED,
           "sparse-elsewhere": sparse and not layout.is_sparse}
    return {name for name, on in has.items() if on}


def _rules_for(d: Descriptor) -> tuple[Rule, ...]:
    """The Descriptor rules that can break for what ``d`` has, in RULES' order: a rule
    whose ``needs`` ``d`` lacks holds (its check returns None there), so it is skipped."""
    key = (d.layout, d.padded, d.strides is not None, d.tile is not None,
           d.sparse is not None, d.quantization is not None, d.shard is not None)
    rules = _RULES_BY_FEATURES.get(key)
    if rules is None:
        present = _features(*key)
        rules = _RULES_BY_FEATURES[key] = tuple(
            r for r in _DESCRIPTOR_RULES if r.needs is None or r.needs in present)
    return rules


def _product(values: Sequence[int]) -> int:
    n = 1
    for v in values:
        n *= v
    return n


@lru_cache(maxsize=4096)
def dense_descriptor(shape: tuple[int, ...], dtype: DType, padded: bool = False) -> Descriptor:
    """The row-major descriptor of ``shape`` and ``dtype``, built and checked once per
    combination: descriptors are immutable, and the tensors of a checkpoint share a few
    shapes and types, so each of its tensors need not build and check its own."""
    return Descriptor(shape, dtype, padded=padded)


# The binary codec lives in wire.py, which builds descriptors and so sits above this
# module. The dependency of to_bytes/from_bytes on it is inverted, in the open: wire.py
# calls install_codec() when it is imported, and the package's __init__ imports wire.py
# before any caller can reach a Descriptor.
class _Codec:
    """wire.encode and wire.decode, once wire.py has installed them."""

    encode: Callable[[Descriptor], bytes] | None = None
    decode: Callable[[bytes | bytearray | memoryview], Descriptor] | None = None


_codec = _Codec()


def install_codec(encode: Callable[[Descriptor], bytes],
                  decode: Callable[[bytes | bytearray | memoryview], Descriptor]) -> None:
    """Bind :meth:`Descriptor.to_bytes` and :meth:`Descriptor.from_bytes` to the wire codec
    (called by :mod:`hurray_bridge.wire` only, when it is imported)."""
    _codec.encode, _codec.decode = encode, decode


def _no_codec() -> NoReturn:
    raise RuntimeError("Descriptor.to_bytes() and from_bytes() need hurray_bridge.wire, "
                       "which is not imported yet (import hurray_bridge imports it)")


# The slots' own setters (the class's __setattr__ refuses, being frozen), in field order:
# wire.py's fast decoder builds descriptors whose rules it has checked itself.
_DESCRIPTOR_SETTERS = tuple(
    Descriptor.__dict__[f].__set__
    for f in (
        "shape",
        "dtype",
        "layout",
        "strides",
        "tile",
        "sparse",
        "quantization",
        "shard",
        "padded",
    )
)
