"""The layout of a Hurray file before a byte is written: the plan.

A plan holds each entry's name, encoded descriptor and the pieces its buffers are written
from (views of memory, regions of another file, or parts written elsewhere), the data
offsets, the metadata, and the head (header, table, metadata) once the checksums are known.
"""

from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from .. import _numpy
from .._deferred import Pending
from .._registry import deferred_save
from .._trailing import placed_pieces
from ..conversion import asarray, asarray_one
from ..descriptor import Descriptor, dense_descriptor
from ..dtypes import DType
from ..errors import FormatError, UnsupportedError
from ..shards import ShardedTensor
from ..tensor import Tensor
from ..wire import DENSE_PLACE, dense_head, encode
from .checksums import crc32
from .disk import checkpoint
from .engine import zeros
from .format import (
    BUFFER_ALIGNMENT,
    ENTRY,
    FLAG_DATA_CHECKSUMS,
    HEADER,
    HEADER_CRC_AT,
    HEADER_SIZE,
    MAGIC,
    MAX_BUFFER_ALIGNMENT,
    MAX_KEY_BYTES,
    MAX_METADATA_BYTES,
    MAX_NAME_BYTES,
    META,
    PAGE_ALIGNMENT,
    VERSION,
    ZERO44,
    pad8,
    round_up,
)
from .regions import Piece, Region
from .sharded import check_shard_entries

__all__ = ["SMALL_ENTRIES", "Plan", "PlanEntry", "dense_reader", "encode_metadata",
           "host_entries", "host_tensor", "no_answer", "plan_items", "plan_tensors", "serialise",
           "small_candidate", "small_dense_file"]


_NAME_PADS = tuple(bytes(n) for n in range(8))  # the zeros after a name of 8k - n bytes

# The dense descriptors of the shapes and types saved, and their encoded heads, kept from
# one save to the next (a checkpoint saved again has the same ones): (shape, type tag) ->
# descriptor, and id of a descriptor -> (it, its head), the descriptor held so that its
# id names no other. Each emptied when it reaches _CACHED entries.
_DESCRIPTORS: dict[tuple[tuple[int, ...], int], Descriptor] = {}
_HEADS: dict[int, tuple[Descriptor, bytes]] = {}
_CACHED = 4096
_new_entry = tuple.__new__  # PlanEntry's own __new__ is a Python function: a call more


class PlanEntry(NamedTuple):
    name_bytes: bytes
    descriptor_bytes: bytes
    sources: tuple[Piece, ...]  # the bytes to write, in table order: one
    offsets: tuple[int, ...]  # piece per buffer, or two (_trailing.written_pieces)


@dataclass
class Plan:
    entries: list[PlanEntry]
    metadata: bytes
    n_metadata: int
    alignment: int
    checksums: bool
    table_length: int
    data_offset: int
    data_length: int
    keep_alive: Sequence[object]
    # Entries the processes holding their parts write: (entry index, saver, value, descriptor).
    deferred: Sequence[tuple[int, Any, Any, Descriptor]] = ()

    @property
    def file_size(self) -> int:
        return self.data_offset + self.data_length

    def head(self, crcs: Sequence[int]) -> bytes:
        """Header, table, metadata and the zero padding up to the data region."""
        parts = []
        pack, pads, checksums = ENTRY.pack, _NAME_PADS, self.checksums
        for e, crc in zip(self.entries, crcs, strict=True):
            nb = e.name_bytes
            parts += [pack(len(nb), len(e.descriptor_bytes), crc if checksums else 0, 0),
                      nb, pads[-len(nb) & 7], e.descriptor_bytes]
        parts.append(self.metadata)
        index = b"".join(parts)
        flags = FLAG_DATA_CHECKSUMS if self.checksums else 0
        header = bytearray(HEADER.pack(
            MAGIC, VERSION[0], VERSION[1], flags, len(self.entries), self.n_metadata,
            HEADER_SIZE, self.table_length, HEADER_SIZE + self.table_length, len(self.metadata),
            self.data_offset, self.data_length, self.file_size, self.alignment,
            zlib.crc32(index), ZERO44, 0))
        struct.pack_into("<I", header, HEADER_CRC_AT, zlib.crc32(header[:HEADER_CRC_AT]))
        pad = self.data_offset - HEADER_SIZE - len(index)
        return b"".join((header, index, zeros(pad)))  # (no zero bytes made per save)


def _name_bytes(name: object, what: str, limit: int) -> bytes:
    if not isinstance(name, str):
        raise UnsupportedError(f"{what} must be a str, got {type(name).__name__} {name!r}")
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FormatError(f"{what} {name!r} is not encodable as UTF-8 ({exc.reason})",
                          field="name") from None
    if not 1 <= len(raw) <= limit:
        raise FormatError(f"{what} {name[:40]!r} is {len(raw)} bytes of UTF-8; it must be "
                          f"1 to {limit}", field="name")
    if 0 in raw:  # (an int: a bytes operand is first tried as one, and fails, slowly)
        raise FormatError(f"{what} {name!r} contains NUL", field="name")
    return raw


def encode_metadata(metadata: Mapping[str, str] | None) -> tuple[bytes, int]:
    if metadata is None:
        return b"", 0
    if not isinstance(metadata, Mapping):
        raise UnsupportedError(f"metadata must be a mapping of str to str, got "
                               f"{type(metadata).__name__}")
    parts, size = [], 0
    for key, value in metadata.items():
        k = _name_bytes(key, "metadata key", MAX_KEY_BYTES)
        if not isinstance(value, str):
            raise UnsupportedError(f"metadata value for {key!r} must be a str, got "
                                   f"{type(value).__name__}")
        try:
            v = value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FormatError(f"metadata value for {key!r} is not encodable as UTF-8 "
                              f"({exc.reason})", field="metadata") from None
        item = META.size + pad8(len(k) + len(v))
        size += item
        if size > MAX_METADATA_BYTES:
            raise FormatError(f"metadata exceeds the limit of {MAX_METADATA_BYTES} bytes",
                              field="metadata")
        parts += [META.pack(len(k), len(v)), k, v, bytes(item - META.size - len(k) - len(v))]
    return b"".join(parts), len(metadata)


def host_entries(name: str, value: Any) -> list[tuple[str, Tensor]]:
    """The entries a value becomes: itself, or ``NAME[k]`` per shard of a sharded tensor."""
    if not isinstance(value, (Tensor, ShardedTensor)):
        try:
            value = asarray(value)  # a torch DTensor gives this process's ShardedTensor
        except UnsupportedError as exc:
            raise UnsupportedError(f"entry {name!r}: {exc}") from exc
    if not isinstance(value, ShardedTensor):
        return [(name, host_tensor(name, value))]
    if not len(value):
        raise UnsupportedError(f"entry {name!r} is a sharded tensor without shards; a file "
                               "holds a sharded tensor as its shards (give it an empty one)")
    return [(f"{name}[{k}]", host_tensor(f"{name}[{k}]", t)) for k, t in enumerate(value)]


def host_tensor(name: str, value: Any) -> Tensor:
    try:
        t = value if isinstance(value, Tensor) else asarray_one(value, what="a file entry")
    except UnsupportedError as exc:
        raise UnsupportedError(f"entry {name!r}: {exc}") from exc
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"entry {name!r} lives on {t.device}; Hurray files are written from host memory: "
            "copy it to the CPU first (tensor.cpu(), jax.device_get(x), cupy.asnumpy(x))")
    return t


def dense_reader() -> Callable[[Any], tuple[DType, tuple[int, ...], memoryview] | None] | None:
    """``_host.dense_bytes`` once the host kernel is imported, else None (the core never
    imports it to save a file: no value can then be one of its arrays)."""
    global _dense_bytes
    if _dense_bytes is None:
        if _numpy.loaded() is None:
            return None
        from .._host import dense_bytes
        _dense_bytes = dense_bytes
    return _dense_bytes


_dense_bytes: Callable[[Any], tuple[DType, tuple[int, ...], memoryview] | None] | None = None




def plan_items(items: Sequence[tuple[str, Descriptor, Sequence[Piece] | memoryview]],
               metadata: Mapping[str, str] | None, alignment: int, checksums: bool,
               keep_alive: Sequence[object]) -> Plan:
    """Lay out a file: ``items`` are (name, descriptor, one byte view or file region per
    buffer), or (name, row-major descriptor from ``dense_descriptor``, the byte view of
    its one data buffer) for bytes written as they are (``_host.dense_bytes``)."""
    if (isinstance(alignment, bool) or not isinstance(alignment, int)
            or not BUFFER_ALIGNMENT <= alignment <= MAX_BUFFER_ALIGNMENT
            or alignment & (alignment - 1)):
        raise FormatError(f"alignment must be a power of two in [{BUFFER_ALIGNMENT}, "
                          f"{MAX_BUFFER_ALIGNMENT}], got {alignment!r}", field="alignment")
    meta, n_meta = encode_metadata(metadata)
    entries: list[PlanEntry] = []
    names: set[str] = set()
    cursor = table = 0
    dense_size = ENTRY.size + DENSE_PLACE.size
    heads, place = _HEADS, DENSE_PLACE.pack
    for k, (name, d, sources) in enumerate(items):
        if not k & 1023:
            checkpoint()  # a file of many entries plans for seconds
        try:
            nb = name.encode("utf-8")
        except (AttributeError, UnicodeEncodeError):
            nb = b""
        if type(name) is not str or not 0 < len(nb) <= MAX_NAME_BYTES or 0 in nb:
            nb = _name_bytes(name, "entry name", MAX_NAME_BYTES)  # (refuses, naming why)
        names.add(name)
        if len(names) <= k:  # (the set did not grow: a name met before)
            raise FormatError(f"duplicate entry name {name!r}", field="name")
        if type(sources) is memoryview:
            # A dense entry whose bytes are written as they are: its descriptor's bytes
            # are the head shared by its shape and type, then its place (wire.dense_head).
            cached = heads.get(id(d))
            if cached is None or cached[0] is not d:
                if len(heads) >= _CACHED:
                    heads.clear()
                cached = heads[id(d)] = (d, dense_head(d))
            head = cached[1]
            n = len(sources)
            cursor = -(-cursor // alignment) * alignment
            entries.append(_new_entry(PlanEntry, (nb, head + place(cursor, n), (sources,),
                                                  (cursor,))))
            table += dense_size + (len(nb) + 7) // 8 * 8 + len(head)
            cursor += n
            continue
        specs = d.buffer_layout()
        if len(sources) != len(specs) or (
                len(sources[0]) != specs[0].nbytes if len(specs) == 1 else any(
                    len(s) != sp.nbytes for s, sp in zip(sources, specs, strict=True))):
            raise FormatError(f"entry {name!r}: buffers do not match the descriptor",
                              field="buffers")
        offsets = []
        for s in sources:
            if len(s):
                cursor = round_up(cursor, alignment)
                offsets.append(cursor)
                cursor += len(s)
            else:
                offsets.append(0)
        desc = encode(d, offsets)
        if isinstance(sources[0], Pending):  # written elsewhere, whole bytes, one buffer
            entries.append(PlanEntry(nb, desc, tuple(sources), tuple(offsets)))
            table += ENTRY.size + pad8(len(nb)) + len(desc)
            continue
        # Each buffer as the pieces to write: packed sub-byte data ends with zero bits.
        # (A file region slices like the view it stands for.)
        views = cast(Sequence[memoryview], sources)
        entries.append(PlanEntry(nb, desc, *placed_pieces(d, views, offsets, name)))
        table += ENTRY.size + pad8(len(nb)) + len(desc)
    index_end = HEADER_SIZE + table + len(meta)
    data_offset = round_up(index_end, max(PAGE_ALIGNMENT, alignment)) if cursor else index_end
    return Plan(entries, meta, n_meta, alignment, checksums, table, data_offset, cursor,
                keep_alive)


def plan_tensors(mapping: Mapping[str, Any], metadata: Mapping[str, str] | None,
                 alignment: int, checksums: bool, *, defer: bool = False) -> Plan:
    """The plan of a file of ``mapping``; with ``defer``, values whose adapter writes them
    from where their parts live (``_deferred``) are planned without reading them."""
    if sys.byteorder != "little":
        raise UnsupportedError("Hurray files are little-endian; this host is big-endian")
    if not isinstance(mapping, Mapping):
        raise UnsupportedError(f"expected a mapping of names to tensors, got "
                               f"{type(mapping).__name__}")
    items: list[tuple[str, Descriptor, Sequence[Piece] | memoryview]] = []
    keep: list[object] = []
    deferred = []
    # The host kernel's plain arrays are planned from their type, shape and bytes, without
    # an hb.Tensor each (_host.dense_bytes says which); no such array exists unless the
    # kernel was imported.
    dense = dense_reader()
    # (shape, type tag) -> descriptor: dense_descriptor's own key hashes the DType, whose
    # hash is Python code over all its fields.
    descriptors = _DESCRIPTORS
    sharded = False  # whether an entry has a shard section (a dense array has none)
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise UnsupportedError(f"entry names must be str, got {type(name).__name__} "
                                   f"{name!r}")
        parts = None if dense is None else dense(value)
        if parts is not None:
            dtype, shape, view = parts
            d = descriptors.get((shape, dtype.tag))
            if d is None:
                if len(descriptors) >= _CACHED:
                    descriptors.clear()
                d = descriptors[shape, dtype.tag] = dense_descriptor(shape, dtype)
            keep.append(value)
            items.append((name, d, view))
            continue
        saver = deferred_save(type(value)) if defer else None
        if saver is not None:
            d = saver.describe(value)
            sharded = sharded or d.shard is not None
            deferred.append((len(items), saver, value, d))
            # Not a piece to write: plan_items places it, _write_deferred leaves it to the saver.
            items.append((name, d, [cast(Piece, Pending(d.nbytes))]))
            continue
        for entry, t in host_entries(name, value):
            keep.append(t)
            sharded = sharded or t.descriptor.shard is not None
            items.append((entry, t.descriptor, [t.memoryview(b.role) for b in t.buffers]))
    if sharded:  # (else no entry is a shard, and there is nothing to check)
        check_shard_entries({name: d for name, d, _ in items})
    plan = plan_items(items, metadata, alignment, checksums, keep)
    plan.deferred = deferred
    return plan


# The compiled planner of small files of plain dense arrays (_speedups_c/small_files.c), or
# None where hurray_bridge._speedups was not built (or built before it had one).
_small: Callable[..., list[bytes | memoryview] | None] | None
try:
    from .._speedups import small_file as _small
except ImportError:
    _small = None


def small_dense_file(mapping: Mapping[str, Any], metadata: Mapping[str, str] | None,
                     alignment: int, checksums: bool,
                     limit: int) -> list[bytes | memoryview] | None:
    """The bytes of a file of ``mapping`` as pieces to write from offset 0 (the head, then
    each array's bytes after its padding), planned in C without a :class:`Plan`, when
    ``mapping`` is a dict whose every value is a plain dense array (``_host.dense_bytes``),
    with under ``limit`` bytes of data and of head: what :func:`plan_tensors` and
    :meth:`Plan.head` give for it, byte for byte. ``None`` for anything else, and where
    the compiled module was not built: :func:`plan_tensors` then plans the file and
    raises its errors."""
    if (_small is None or not small_candidate(mapping) or type(alignment) is not int
            or alignment & (alignment - 1)
            or not BUFFER_ALIGNMENT <= alignment <= MAX_BUFFER_ALIGNMENT
            or type(checksums) is not bool):
        return None
    meta, n_meta = b"", 0
    if metadata is not None:
        try:
            meta, n_meta = encode_metadata(metadata)
        except Exception:  # plan_tensors raises it (or its own), after what it checks first
            return None
    return _small(mapping, alignment, checksums, meta, n_meta, limit, _describe_array)


SMALL_ENTRIES = 1 << 16
"""The most entries the compiled planners take (each is at least 64 bytes of a small
file's 4 MiB in a Hurray file; more go to the Python planner without the planner's
snapshot of every item first)."""


def small_candidate(mapping: object) -> bool:
    """Whether a compiled planner of small files (either format's) may be asked about
    ``mapping``: a dict of 1 to :data:`SMALL_ENTRIES` entries, the host kernel imported
    (else no value can be one of its arrays), a little-endian host."""
    return (type(mapping) is dict and 0 < len(mapping) <= SMALL_ENTRIES
            and dense_reader() is not None and sys.byteorder == "little")


def no_answer(value: Any) -> tuple[None, tuple[()], int, object, type]:
    """A describe's "no" to a compiled planner of small files: it holds the value's
    dtype and type, as a "yes" does (see ``_speedups_c/small_files.c``)."""
    return None, (), 0, value.dtype, type(value)


def _describe_array(value: Any) -> tuple[bytes | None, tuple[int, ...], int, object, type]:
    """What the compiled planner needs of an array, once per (type, dtype, shape): its
    descriptor's bytes up to its buffer's place (``wire.dense_head``; None for a value
    :func:`plan_tensors` plans another way), its shape, its byte count, and its ``dtype``
    and type, which the kept answer holds (see ``_speedups_c/small_files.c``)."""
    dense = dense_reader()
    parts = None if dense is None else dense(value)  # (asked of a contiguous array only)
    if parts is None:
        return no_answer(value)
    dtype, shape, view = parts
    return (dense_head(dense_descriptor(shape, dtype)), shape, view.nbytes, value.dtype,
            type(value))


def serialise(plan: Plan) -> bytes:
    parts: list[Any] = [b""]
    crcs, pos = [], 0
    for e in plan.entries:
        crc = 0
        for src, off in zip(e.sources, e.offsets, strict=True):
            if not len(src):
                continue
            assert not isinstance(src, Region)  # dumps plans tensors in memory only
            if off > pos:
                parts.append(bytes(off - pos))
            parts.append(src)
            if plan.checksums:
                crc = crc32(src, crc)
            pos = off + len(src)
        crcs.append(crc)
    parts[0] = plan.head(crcs)
    return b"".join(parts)
