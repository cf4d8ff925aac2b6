"""Binary encoding of descriptors (docs/spec/metadata.md).

Little-endian, fixed-size, naturally aligned fields; every section a multiple
of 8 bytes. The decoder treats its input as hostile: it checks the rank before
it reads a shape, bounds every count by the bytes that remain, checks every
reserved byte is zero, and raises nothing but :class:`FormatError`.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from math import prod as _prod
from typing import Any, NamedTuple

from .descriptor import (
    _DESCRIPTOR_SETTERS,
    DYNAMIC,
    MAX_RANK,
    BufferSpec,
    Descriptor,
    Quantization,
    Shard,
    Sparse,
    install_codec,
)
from .dtypes import _BY_TAG as _DTYPE_BY_TAG
from .dtypes import DType, dtype_from_tag
from .errors import FormatError
from .layout import BufferRole, Flags, Layout, QuantScheme

__all__ = [
    "ALIGNMENT",
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "DENSE_PLACE",
    "BufferEntry",
    "decode",
    "dense_head",
    "decode_prefix",
    "encode",
    "encoded_size",
]

MAGIC = b"HRYD"
VERSION = (1, 0)
ALIGNMENT = 64
HEADER_SIZE = 32
BUFFER_ENTRY_SIZE = 24
SPARSE_SIZE = 16
QUANT_SIZE = 16
SHARD_FIXED_SIZE = 16
TILE_FIXED_SIZE = 8
MAX_BUFFERS = 8

# magic, major, minor, flags, rank, type_tag, layout, n_buffers, total_size, reserved
_HEADER = struct.Struct("<4sBBHIBBHQQ")
_SPARSE = struct.Struct("<QBB6s")
_QUANT = struct.Struct("<BBBBiQ")
_SHARD = struct.Struct("<IIii")
_TILE = struct.Struct("<II")
_ENTRY = struct.Struct("<B7sQQ")
_ZERO6 = bytes(6)
_ZERO7 = bytes(7)
_KNOWN_FLAGS = int(Flags.HAS_QUANTIZATION | Flags.HAS_SHARD | Flags.SUBBYTE_PADDED)
_SPARSE_CANONICAL = 0x01
_U64 = {n: struct.Struct(f"<{n}Q") for n in range(MAX_RANK + 1)}
_ROW_MAJOR_CODE = int(Layout.ROW_MAJOR)
_DATA_ROLE_CODE = int(BufferRole.DATA)
_I64 = {n: struct.Struct(f"<{n}q") for n in range(MAX_RANK + 1)}


class BufferEntry(NamedTuple):
    """One row of an encoded buffer table: role, offset into a data region, length."""

    role: BufferRole
    offset: int
    length: int


def _body_size(d: Descriptor, n_buffers: int) -> int:
    size = HEADER_SIZE + 8 * d.rank
    if d.layout == Layout.STRIDED:
        size += 8 * d.rank
    if d.layout == Layout.TILED:
        assert d.tile is not None
        size += TILE_FIXED_SIZE + 8 * len(d.tile)
    if d.layout.is_sparse:
        size += SPARSE_SIZE
    if d.quantization is not None:
        size += QUANT_SIZE
    if d.shard is not None:
        size += SHARD_FIXED_SIZE + 16 * d.rank
    return size + BUFFER_ENTRY_SIZE * n_buffers


def encoded_size(d: Descriptor) -> int:
    """Bytes :func:`encode` will write for ``d``."""
    return _body_size(d, 0 if d.is_dynamic else len(d.buffer_layout()))


def canonical_offsets(lengths: Sequence[int]) -> list[int]:
    """Offsets that pack buffers of ``lengths`` back to back, each 64-byte aligned."""
    offsets, pos = [], 0
    for n in lengths:
        if n == 0:
            offsets.append(0)
            continue
        offsets.append(pos)
        pos += -(-n // ALIGNMENT) * ALIGNMENT
    return offsets


def _placed(i: int, spec: BufferSpec, off: object) -> BufferEntry:
    """The table entry for an offset a caller chose: an aligned u64, 0 for an empty buffer."""
    if isinstance(off, bool) or not isinstance(off, int):
        raise FormatError(
            f"offset of buffers[{i}] ({spec.role.name}) must be an integer, got {off!r}",
            field="buffers.offset",
        )
    if not spec.nbytes:
        off = 0  # rule 3: an empty buffer occupies nothing; its offset is written as 0
    elif not 0 <= off <= DYNAMIC:
        raise FormatError(
            f"offset {off} of buffers[{i}] ({spec.role.name}) is outside [0, 2**64 - 1]",
            field="buffers.offset",
        )
    elif off % ALIGNMENT:
        raise FormatError(
            f"offset {off} of the {spec.role.name} buffer is not 64-byte aligned",
            field="buffers.offset",
        )
    return BufferEntry(spec.role, off, spec.nbytes)


DENSE_PLACE = struct.Struct("<QQ")
"""The last 16 bytes of a placed dense descriptor: its data buffer's offset (0 when the
buffer is empty) and length (see :func:`dense_head`)."""


def dense_head(d: Descriptor) -> bytes:
    """The bytes of a row-major descriptor ``d`` (no quantization, no shard, one data
    buffer) placed by its carrier, up to its one buffer's offset: ``encode(d, [off])`` is
    ``dense_head(d) + DENSE_PLACE.pack(off, nbytes)`` for an aligned ``off`` (0 when empty).

    A writer of many tensors of a few shapes builds it once per shape and packs only the
    place of each.
    """
    rank = len(d.shape)
    return b"".join((
        _HEADER.pack(MAGIC, VERSION[0], VERSION[1], _PADDED_FLAG if d.padded else 0,
                     rank, d.dtype.tag, _ROW_MAJOR_CODE, 1,
                     HEADER_SIZE + 8 * rank + BUFFER_ENTRY_SIZE, 0),
        _U64[rank].pack(*d.shape),
        _ENTRY.pack(_DATA_ROLE_CODE, _ZERO7, 0, 0)[:8]))


def encode(d: Descriptor, offsets: Sequence[int] | None = None) -> bytes:
    """Encode ``d``; ``offsets`` place its buffers in a carrier's data region.

    Without ``offsets`` the buffers are laid out canonically (back to back,
    64-byte aligned, empty buffers at offset 0). A descriptor with a dynamic
    dimension has no buffer table.
    """
    if (d.layout is Layout.ROW_MAJOR and d.quantization is None and d.shard is None
            and offsets is not None and len(offsets) == 1 and DYNAMIC not in d.shape
            and d.rank <= MAX_RANK):
        # A dense tensor placed by its carrier (every entry of a file of plain tensors):
        # when the one offset passes every check of the general path below, the same
        # bytes without its walk over sections this descriptor does not have.
        ((_, nbytes),) = d.buffer_layout()
        off = offsets[0]
        if type(off) is int and (not nbytes or (
                0 <= off and not off % ALIGNMENT and off + nbytes <= DYNAMIC)):
            return dense_head(d) + DENSE_PLACE.pack(off if nbytes else 0, nbytes)
    if d.rank > MAX_RANK:
        # Descriptor() already refuses this; the check guards objects built around it.
        raise FormatError(
            f"rank {d.rank} exceeds the maximum rank {MAX_RANK} (ADR-008)", field="rank"
        )
    specs = () if d.is_dynamic else d.buffer_layout()
    total = _body_size(d, len(specs))
    parts = [
        _HEADER.pack(MAGIC, VERSION[0], VERSION[1], int(d.flags), d.rank, d.dtype.tag,
                     int(d.layout), len(specs), total, 0),
        _U64[d.rank].pack(*d.shape),
        *_section_parts(d),
    ]
    for spec, off in zip(specs, _table_offsets(d, specs, offsets)):
        parts.append(_ENTRY.pack(int(spec.role), _ZERO7, off, spec.nbytes))
    out = b"".join(parts)
    assert len(out) == total
    return out


def _section_parts(d: Descriptor) -> list[bytes]:
    """The encoded sections after the shape: layout's, quantization, shard (metadata.md)."""
    parts = []
    if d.layout == Layout.STRIDED:
        assert d.strides is not None
        parts.append(_I64[d.rank].pack(*d.strides))
    elif d.layout == Layout.TILED:
        assert d.tile is not None
        parts.append(_TILE.pack(len(d.tile), 0))
        parts.append(_U64[len(d.tile)].pack(*d.tile))
    elif d.layout.is_sparse:
        sp = d.sparse
        assert sp is not None
        parts.append(_SPARSE.pack(sp.nnz, sp.index_dtype.tag,
                                  _SPARSE_CANONICAL if sp.canonical else 0, _ZERO6))
    q = d.quantization
    if q is not None:
        parts.append(_QUANT.pack(
            int(q.scheme), q.scale_dtype.tag,
            q.zero_point_dtype.tag if q.zero_point_dtype is not None else 0, 0,
            -1 if q.axis is None else q.axis, q.block_size or 0))
    sh = d.shard
    if sh is not None:
        parts.append(_SHARD.pack(sh.replica_id, 0, sh.device_type, sh.device_id))
        parts.append(_U64[d.rank].pack(*sh.offsets))
        parts.append(_U64[d.rank].pack(*sh.global_shape))
    return parts


def _table_offsets(d: Descriptor, specs: Sequence[BufferSpec],
                   offsets: Sequence[int] | None) -> list[int]:
    """The offsets the buffer table records: the caller's, checked, or the canonical ones."""
    if offsets is None:
        canonical = canonical_offsets([s.nbytes for s in specs])
        if specs and (end := max(o + s.nbytes for o, s in zip(canonical, specs))) > DYNAMIC:
            # Canonical offsets are aligned, in order and apart; only their end can pass
            # 2**64 - 1, when the padded sizes add up to more than that.
            raise FormatError(
                f"the buffers need {end} bytes of data region once each is padded to 64 "
                "bytes, more than 2**64 - 1",
                field="buffers.offset",
            )
        return canonical
    if len(offsets) != len(specs):
        raise FormatError(f"{len(offsets)} offsets for {len(specs)} buffers", field="buffers")
    entries = [_placed(i, spec, off) for i, (spec, off) in enumerate(zip(specs, offsets))]
    # Rules 4-5 on write as on read, by the decoder's own check: the encoder never
    # writes a table its decoder refuses.
    try:
        _check_buffer_table(d, entries, specs)
    except FormatError as exc:
        raise FormatError(
            f"{exc.args[0]}; give offsets that keep every non-empty buffer inside "
            "2**64 - 1 bytes and apart from the others (wire.canonical_offsets() packs "
            "them)",
            field="buffers.offset",
        ) from None
    return [e.offset for e in entries]


class _Reader:
    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: memoryview, end: int) -> None:
        self.buf, self.pos, self.end = buf, HEADER_SIZE, end

    def take(self, st: struct.Struct, field: str) -> tuple[int, ...]:
        if self.pos + st.size > self.end:
            raise FormatError(
                f"truncated: needs {st.size} bytes at offset {self.pos}, "
                f"{self.end - self.pos} remain",
                field=field,
            )
        out = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return out


def _dtype(tag: int, field: str) -> DType:
    try:
        return dtype_from_tag(tag)
    except FormatError:
        raise FormatError(f"unknown element type tag {tag}", field=field) from None


# -- the fast path ------------------------------------------------------------------------
#
# Most descriptors are dense (row-major or strided), static, with one DATA buffer and no
# quantization or shard section. _decode_dense reads those with two struct calls and
# accepts one only when every rule the general decoder and descriptor.RULES would apply
# holds (the structural ones here, the rules on values in _dense_nbytes); it returns None
# for anything else, and for anything it would not accept, and the general decoder then
# decides (and names the defect). It never refuses, so it holds no message of its own:
# tests/cross/test_descriptor_rules.py and tests/hurray_bridge/test_perf_paths.py check
# that it accepts exactly what the general path accepts, with an equal result.

_I64_MIN = -(1 << 63)
_U64_MAX = (1 << 64) - 1
_I64_MAX = (1 << 63) - 1
_PADDED_FLAG = int(Flags.SUBBYTE_PADDED)
_ROW_MAJOR, _STRIDED = Layout.ROW_MAJOR, Layout.STRIDED
_DATA_ROLE = BufferRole.DATA
_tuple_new = tuple.__new__
_new_descriptor = object.__new__
(
    _set_shape,
    _set_dtype,
    _set_layout,
    _set_strides,
    _set_tile,
    _set_sparse,
    _set_quantization,
    _set_shard,
    _set_padded,
) = _DESCRIPTOR_SETTERS
# The fast path spells these as literals (a constant load, not a global lookup).
assert (MAGIC, VERSION[0], HEADER_SIZE, ALIGNMENT, MAX_RANK, _PADDED_FLAG) == (
    b"HRYD",
    1,
    32,
    64,
    64,
    4,
)
# 2 * rank + strided -> (the struct of everything after the header: shape, strides and
# one entry; the total size that makes).
_DENSE_BODY: list[tuple[struct.Struct, int] | None] = [None] * (2 * MAX_RANK + 2)


def _dense_body(rank: int, strided: bool) -> tuple[struct.Struct, int]:
    st = struct.Struct(f"<{rank}Q{rank if strided else 0}qB7sQQ")
    entry = _DENSE_BODY[2 * rank + strided] = (st, HEADER_SIZE + st.size)
    return entry


def _decode_dense(
    data: bytes | bytearray | memoryview,
    n: int,
    _unpack_header: Any = _HEADER.unpack_from,
    _bodies: Any = _DENSE_BODY,
    _dtypes: Any = _DTYPE_BY_TAG,
) -> tuple[Descriptor, int, int, int] | None:
    """``(descriptor, data offset, data length, total size)``, or None (see above)."""
    if n < 32:  # HEADER_SIZE
        return None
    magic, major, _minor, flags, rank, tag, layout_tag, n_buf, total, reserved = _unpack_header(
        data, 0
    )
    # Only SUBBYTE_PADDED (0x4) among the flags: no quantization or shard section.
    if (
        magic != b"HRYD"
        or major != 1
        or n_buf != 1
        or reserved
        or flags & 0xFFFB
        or rank > 64
        or total > n
    ):
        return None
    if layout_tag == 1:
        strided = False
    elif layout_tag == 2 and rank:  # a scalar is row-major only
        strided = True
    else:
        return None
    st, size = _bodies[2 * rank + strided] or _dense_body(rank, strided)
    dtype = _dtypes.get(tag)
    if total != size or dtype is None:
        return None
    vals = st.unpack_from(data, 32)
    # The one buffer entry: DATA role, reserved bytes zero.
    if vals[-4] != 1 or vals[-3] != b"\0\0\0\0\0\0\0":
        return None
    shape = vals[:rank]
    strides = vals[rank: 2 * rank] if strided else None
    nbytes = _dense_nbytes(shape, strides, dtype.bits, flags != 0)
    off = vals[-2]
    if (
        nbytes is None
        or vals[-1] != nbytes
        or (nbytes and (off % 64 or off + nbytes > 0xFFFFFFFFFFFFFFFF))
    ):
        return None
    # Descriptor(...) without __post_init__: every rule it applies was applied above.
    d = _new_descriptor(Descriptor)
    _set_shape(d, shape)
    _set_dtype(d, dtype)
    _set_layout(d, _ROW_MAJOR if strides is None else _STRIDED)
    _set_strides(d, strides)
    _set_tile(d, None)
    _set_sparse(d, None)
    _set_quantization(d, None)
    _set_shard(d, None)
    _set_padded(d, flags != 0)
    return d, off, nbytes, total


def _dense_nbytes(shape: tuple[int, ...], strides: tuple[int, ...] | None, bits: int,
                  padded: bool) -> int | None:
    """The data buffer's length when RULES accept this dense descriptor, else None: the
    rules on the padded form, packed strides, the element count, span and byte size."""
    if padded and bits >= 8:
        return None  # the padded form is for sub-byte types only
    packed = bits < 8 and not padded
    if DYNAMIC in shape:
        return None  # dynamic dimensions have no buffer table
    count = _prod(shape)
    if count > 0xFFFFFFFFFFFFFFFF:
        return None
    if strides is not None:
        if packed or _I64_MIN in strides:
            return None
        if count:
            span = 1
            for d, s in zip(shape, strides, strict=True):
                span += (d - 1) * (s if s >= 0 else -s)
            if span > 0x7FFFFFFFFFFFFFFF:
                return None
            count = span
    nbytes = -(-count * bits // 8) if packed else count * (bits >> 3 or 1)
    return nbytes if nbytes <= 0xFFFFFFFFFFFFFFFF else None


_decode_dense_python = _decode_dense
# The same function compiled, when hurray_bridge._speedups was built (~8x faster); the
# Python one above stays the reference that tests/hurray_bridge/test_perf_paths.py compares it with.
try:
    from . import _speedups
except ImportError:
    pass
else:
    _speedups.dense_decoder_setup(
        Descriptor,
        [_DTYPE_BY_TAG.get(tag) for tag in range(256)],
        [d.bits if (d := _DTYPE_BY_TAG.get(tag)) is not None else 0 for tag in range(256)],
        _ROW_MAJOR,
        _STRIDED,
        tuple(Descriptor.__dict__[f] for f in (
            "shape", "dtype", "layout", "strides", "tile", "sparse", "quantization", "shard",
            "padded")),
    )
    _decode_dense = _speedups.decode_dense  # type: ignore[assignment]


def _byte_length(data: object) -> int:
    """len() of bytes/bytearray and of a flat byte memoryview; -1 for anything else."""
    tp = type(data)
    if tp is bytes or tp is bytearray:
        return len(data)  # type: ignore[arg-type]
    if tp is memoryview:
        view: memoryview = data  # type: ignore[assignment]
        if view.format == "B" and view.ndim == 1 and view.c_contiguous:
            return len(view)
    return -1


def decode_prefix(
    data: bytes | bytearray | memoryview,
) -> tuple[Descriptor, tuple[BufferEntry, ...], int]:
    """Decode one descriptor at the start of ``data``.

    Returns the descriptor, its buffer table and the number of bytes it took.
    """
    n = _byte_length(data)
    if n >= 0:
        fast = _decode_dense(data, n)
        if fast is not None:
            d, off, length, total = fast
            return d, (_tuple_new(BufferEntry, (_DATA_ROLE, off, length)),), total
    try:
        buf = memoryview(data).cast("B")
    except TypeError:
        raise FormatError(f"expected bytes, got {type(data).__name__}", field="input") from None
    flags, rank, dtype, layout, n_buf, total = _read_header(buf)
    r = _Reader(buf, total)
    shape = r.take(_U64[rank], "shape")
    strides, tile, sparse = _read_layout_section(r, layout, rank)
    quant = _read_quantization(r) if flags & Flags.HAS_QUANTIZATION else None
    shard = _read_shard(r, rank) if flags & Flags.HAS_SHARD else None
    entries = [_read_entry(r, i) for i in range(n_buf)]
    if r.pos != total:
        raise FormatError(
            f"declared size {total} but the sections take {r.pos} bytes", field="total_size"
        )
    # The structure is read; every rule of the values is Descriptor's (descriptor.RULES).
    d = Descriptor(shape, dtype, layout, strides, tile, sparse, quant, shard,
                   bool(flags & Flags.SUBBYTE_PADDED))
    _check_buffer_table(d, entries)
    return d, tuple(entries), total


def _read_header(buf: memoryview) -> tuple[int, int, DType, Layout, int, int]:
    """The header's structural checks, in the order every decoder makes them (the C
    library's too): ``(flags, rank, dtype, layout, n_buffers, total_size)``."""
    if len(buf) < HEADER_SIZE:
        raise FormatError(
            f"truncated: {len(buf)} bytes, the header alone needs {HEADER_SIZE}", field="header"
        )
    magic, major, minor, flags, rank, tag, layout_tag, n_buf, total, reserved = _HEADER.unpack_from(
        buf, 0
    )
    if magic != MAGIC:
        raise FormatError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}", field="magic")
    if major != VERSION[0]:
        raise FormatError(
            f"unsupported major version {major}.{minor}; this reader supports {VERSION[0]}.x",
            field="version",
        )
    if reserved:
        raise FormatError("reserved header bytes must be zero", field="header.reserved")
    if flags & ~_KNOWN_FLAGS:
        raise FormatError(f"unknown flag bits 0x{flags & ~_KNOWN_FLAGS:04x}", field="flags")
    if rank > MAX_RANK:
        raise FormatError(
            f"rank {rank} exceeds the maximum rank {MAX_RANK} (ADR-008)", field="rank"
        )
    if n_buf > MAX_BUFFERS:
        raise FormatError(
            f"{n_buf} buffers; a descriptor has at most {MAX_BUFFERS}", field="n_buffers"
        )
    if total > len(buf):
        raise FormatError(
            f"truncated: declares {total} bytes, {len(buf)} available", field="total_size"
        )
    if total < HEADER_SIZE:
        raise FormatError(f"declared size {total} is smaller than the header", field="total_size")
    dtype = _dtype(tag, "type_tag")
    try:
        layout = Layout(layout_tag)
    except ValueError:
        raise FormatError(f"unknown layout tag {layout_tag}", field="layout") from None
    return flags, rank, dtype, layout, n_buf, total


def _read_layout_section(
    r: _Reader, layout: Layout, rank: int
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None, Sparse | None]:
    """``(strides, tile, sparse)``: the one the layout has, the others None."""
    if layout == Layout.STRIDED:
        return r.take(_I64[rank], "strides"), None, None
    if layout == Layout.TILED:
        n_tile, tres = r.take(_TILE, "tile")
        if tres:
            raise FormatError("reserved tile bytes must be zero", field="tile.reserved")
        if n_tile > rank:
            raise FormatError(f"{n_tile} tile sizes for rank {rank}", field="tile")
        return None, r.take(_U64[n_tile], "tile"), None
    if layout.is_sparse:
        nnz, itag, sflags, sres = r.take(_SPARSE, "sparse")
        if sres != _ZERO6 or sflags & ~_SPARSE_CANONICAL:
            raise FormatError("reserved sparse bytes must be zero", field="sparse.reserved")
        return None, None, Sparse(nnz, _dtype(itag, "sparse.index_type"),
                                  bool(sflags & _SPARSE_CANONICAL))
    return None, None, None


def _read_quantization(r: _Reader) -> Quantization:
    scheme, stag, ztag, qres, axis, block = r.take(_QUANT, "quantization")
    if qres:
        raise FormatError("reserved quantization byte must be zero", field="quantization.reserved")
    try:
        qscheme = QuantScheme(scheme)
    except ValueError:
        raise FormatError(
            f"unknown quantization scheme {scheme}", field="quantization.scheme"
        ) from None
    return Quantization(
        qscheme,
        _dtype(stag, "quantization.scale_type"),
        _dtype(ztag, "quantization.zero_point_type") if ztag else None,
        None if axis == -1 and qscheme == QuantScheme.PER_TENSOR else axis,
        block if qscheme == QuantScheme.PER_BLOCK else (None if block == 0 else block),
    )


def _read_shard(r: _Reader, rank: int) -> Shard:
    replica, shres, dev_type, dev_id = r.take(_SHARD, "shard")
    if shres:
        raise FormatError("reserved shard bytes must be zero", field="shard.reserved")
    offsets = r.take(_U64[rank], "shard.offsets")
    global_shape = r.take(_U64[rank], "shard.global_shape")
    return Shard(global_shape, offsets, replica, dev_type, dev_id)


def _read_entry(r: _Reader, i: int) -> BufferEntry:
    role_tag, eres, off, length = r.take(_ENTRY, f"buffers[{i}]")
    if eres != _ZERO7:
        raise FormatError(
            "reserved buffer-entry bytes must be zero", field=f"buffers[{i}].reserved"
        )
    try:
        role = BufferRole(role_tag)
    except ValueError:
        raise FormatError(f"unknown buffer role {role_tag}", field=f"buffers[{i}].role") from None
    return BufferEntry(role, off, length)


def _check_buffer_table(
    d: Descriptor, entries: list[BufferEntry], specs: Sequence[BufferSpec] | None = None
) -> None:
    """metadata.md §8 rules 1-5, entry by entry (``specs``: ``d.buffer_layout()`` if known)."""
    if d.is_dynamic:
        if entries:
            raise FormatError(
                "a descriptor with dynamic dimensions has no buffer table", field="n_buffers"
            )
        return
    if specs is None:
        specs = d.buffer_layout()
    if len(entries) != len(specs):
        raise FormatError(
            f"{len(entries)} buffers, the descriptor calls for {len(specs)}", field="n_buffers"
        )
    spans = []
    for i, (entry, spec) in enumerate(zip(entries, specs)):
        name = f"buffers[{i}]"
        if entry.role != spec.role:
            raise FormatError(
                f"role {entry.role.name}, expected {spec.role.name}", field=f"{name}.role"
            )
        if entry.length != spec.nbytes:
            raise FormatError(
                f"{spec.role.name} length {entry.length} disagrees with the {spec.nbytes} "
                "bytes the descriptor implies",
                field=f"{name}.length",
            )
        if entry.length == 0:
            continue  # a zero-length buffer is never dereferenced; its offset means nothing
        if entry.offset % ALIGNMENT:
            raise FormatError(
                f"offset {entry.offset} is not a multiple of {ALIGNMENT}", field=f"{name}.offset"
            )
        if entry.offset + entry.length > DYNAMIC:
            raise FormatError(
                f"offset {entry.offset} + length {entry.length} exceeds 2**64 - 1 "
                "(overflows 64 bits)",
                field=f"{name}.offset",
            )
        spans.append((entry.offset, entry.offset + entry.length, name))
    spans.sort()
    for (a_start, end, a), (start, b_end, b) in itertools.pairwise(spans):
        if start < end:
            raise FormatError(
                f"{b} [{start}, {b_end}) overlaps {a} [{a_start}, {end}); buffers of "
                "non-zero length must not overlap",
                field=f"{b}.offset",
            )


def decode(data: bytes | bytearray | memoryview) -> Descriptor:
    """Decode exactly one descriptor; trailing bytes are an error."""
    tp = type(data)
    n = len(data) if tp is bytes or tp is bytearray else _byte_length(data)
    if n >= 0:
        fast = _decode_dense(data, n)
        if fast is not None and fast[3] == n:
            return fast[0]
    d, _, size = decode_prefix(data)
    n = memoryview(data).nbytes
    if size != n:
        raise FormatError(f"{n - size} trailing bytes after the descriptor", field="total_size")
    return d


# Descriptor.to_bytes() and Descriptor.from_bytes() are these two (descriptor.py cannot
# import this module, which builds descriptors: see install_codec there).
install_codec(encode, decode)
