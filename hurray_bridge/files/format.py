"""The Hurray file format's fixed parts: the header, the entry table and the metadata.

``docs/spec/container.md`` §2-§5: the constants and struct layouts, and the
reading and checking of a file's index (header, table, metadata) without its
data. Reading treats the file as hostile: every count is bounded by the bytes
that hold it, every offset and length is checked against the data region, and
every defect is a :class:`FormatError` naming the entry and field.

This module needs only the descriptor codec: ``hurray inspect`` reads a file's
index through it without importing the conversion path, tensors or any
framework. :mod:`hurray_bridge.container` re-exports its public names.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..descriptor import Descriptor
from ..dtypes import DType
from ..errors import FormatError
from ..layout import BufferRole, Layout
from ..wire import BufferEntry, decode_prefix
from .disk import open_regular, readinto_full
from .safetensors_header import looks_like_safetensors

__all__ = [
    "BUFFER_ALIGNMENT",
    "FLAG_DATA_CHECKSUMS",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_BUFFER_ALIGNMENT",
    "PAGE_ALIGNMENT",
    "VERSION",
    "EntryInfo",
    "FileIndex",
    "load_metadata",
    "read_index",
]

MAGIC = b"HRYF"
VERSION = (1, 0)
HEADER_SIZE = 128
PAGE_ALIGNMENT = 4096
"""The data region starts on a multiple of this (when it holds any bytes)."""
BUFFER_ALIGNMENT = 64
"""The smallest (and default) alignment of every non-empty buffer in the file."""
MAX_BUFFER_ALIGNMENT = 1 << 21  # 2 MiB: a huge page; anything larger is a typo or an attack
MAX_NAME_BYTES = 4096
MAX_KEY_BYTES = 4096
MAX_METADATA_BYTES = 16 << 20
FLAG_DATA_CHECKSUMS = 0x0001
_KNOWN_FLAGS = FLAG_DATA_CHECKSUMS

# magic, major, minor, flags, n_entries, n_metadata, table_offset, table_length,
# metadata_offset, metadata_length, data_offset, data_length, file_size,
# alignment, index_crc32, reserved[44], header_crc32
HEADER = struct.Struct("<4sBBHIIQQQQQQQII44sI")
HEADER_CRC_AT = HEADER_SIZE - 4
ENTRY = struct.Struct("<IIII")  # name_length, descriptor_length, data_crc32, reserved
META = struct.Struct("<II")  # key_length, value_length
ZERO44 = bytes(44)
_MIN_DESCRIPTOR = 56  # rank 0, row-major, one buffer: the smallest descriptor a file can hold
_MIN_ENTRY = ENTRY.size + 8 + _MIN_DESCRIPTOR
_MIN_META = META.size + 8

assert HEADER.size == HEADER_SIZE


def pad8(n: int) -> int:
    return -(-n // 8) * 8


def round_up(n: int, a: int) -> int:
    return -(-n // a) * a



# --------------------------------------------------------------------- errors
def entry_error(i: int, name: str | None, exc: FormatError | None, message: str = "",
                field: str | None = None) -> FormatError:
    """A FormatError naming entry ``i`` (and its name when known) and the field."""
    if exc is not None:
        message = str(exc)
        if exc.field and message.startswith(exc.field + ": "):
            message = message[len(exc.field) + 2:]
        field = exc.field
    where = f"entries[{i}]" + (f".{field}" if field else "")
    err = FormatError((f"entry {name!r}: " if name is not None else "") + message, field=where)
    err.entry = name  # type: ignore[attr-defined]
    return err


# ------------------------------------------------------------- parsed index
class Header(NamedTuple):
    version: tuple[int, int]
    flags: int
    n_entries: int
    n_metadata: int
    table_length: int
    metadata_length: int
    data_offset: int
    data_length: int
    file_size: int
    alignment: int
    index_crc: int

    @property
    def index_end(self) -> int:
        return HEADER_SIZE + self.table_length + self.metadata_length


class EntryInfo(NamedTuple):
    """One entry of a file's table: its descriptor and where its buffers lie.

    ``position`` is its place in the table (the ``i`` of ``entries[i]`` in
    errors); ``buffers`` are the wire table: offsets relative to the data
    region. ``checksum`` is the stored CRC-32 of its buffers, or ``None`` if the file
    has no data checksums.
    """

    position: int
    name: str
    descriptor: Descriptor
    buffers: tuple[BufferEntry, ...]
    checksum: int | None

    @property
    def nbytes(self) -> int:
        return sum(b.length for b in self.buffers)


@dataclass(frozen=True)
class FileIndex:
    """Everything a Hurray file says about itself, read without touching its data."""

    version: tuple[int, int]
    flags: int
    alignment: int
    entries: tuple[EntryInfo, ...]
    metadata: dict[str, str]
    data_offset: int
    data_length: int
    file_size: int

    @property
    def has_checksums(self) -> bool:
        return bool(self.flags & FLAG_DATA_CHECKSUMS)


def _describe_magic(magic: bytes, raw: bytes | memoryview) -> str:
    if magic == b"HRYD":
        return "this is a bare Hurray descriptor (HRYD), not a Hurray file (HRYF)"
    if magic[:1] == b"\x93" and bytes(raw[1:6]) == b"NUMPY":
        return "this looks like a NumPy .npy file; convert it with `hurray convert`"
    if looks_like_safetensors(raw):
        return ("this looks like a safetensors file: hb.load(path) opens it, "
                "`hurray convert` converts it")
    return f"bad magic {bytes(magic)!r}, expected {MAGIC!r}: not a Hurray file"


def parse_header(raw: bytes | memoryview, actual_size: int) -> Header:
    """Check the fixed header against the real size of the input. Reads nothing else."""
    if actual_size < HEADER_SIZE or len(raw) < HEADER_SIZE:
        head = bytes(raw[:len(MAGIC)])
        if head != MAGIC[:len(head)]:  # short, and not the start of a Hurray file either
            raise FormatError(f"{_describe_magic(head, raw)} ({actual_size} bytes)",
                              field="magic")
        raise FormatError(
            f"truncated: {actual_size} bytes, the header alone needs {HEADER_SIZE}", field="header")
    (magic, major, minor, flags, n_entries, n_meta, t_off, t_len, m_off, m_len, d_off, d_len,
     f_size, align, icrc, reserved, hcrc) = HEADER.unpack_from(raw, 0)
    if magic != MAGIC:
        raise FormatError(_describe_magic(magic, raw), field="magic")
    if major != VERSION[0]:
        raise FormatError(
            f"unsupported major version {major}.{minor}; this reader supports {VERSION[0]}.x",
            field="version")
    if zlib.crc32(raw[:HEADER_CRC_AT]) != hcrc:
        raise FormatError("header checksum mismatch: the header is corrupt",
                          field="header.checksum")
    if flags & ~_KNOWN_FLAGS:
        raise FormatError(f"unknown flag bits 0x{flags & ~_KNOWN_FLAGS:04x}", field="flags")
    if reserved != ZERO44:
        raise FormatError("reserved header bytes must be zero", field="header.reserved")
    if f_size != actual_size:
        if actual_size < f_size:
            raise FormatError(f"truncated: the header declares {f_size} bytes, "
                              f"{actual_size} are present", field="file_size")
        raise FormatError(f"{actual_size - f_size} bytes follow the declared end of the file "
                          f"({f_size} bytes)", field="file_size")
    if t_off != HEADER_SIZE:
        raise FormatError(f"the entry table must start at {HEADER_SIZE}, not {t_off}",
                          field="table_offset")
    if t_len > f_size - t_off:
        raise FormatError(f"the entry table ({t_len} bytes) extends past the end of the file",
                          field="table_length")
    if t_len % 8:
        raise FormatError(f"table length {t_len} is not a multiple of 8", field="table_length")
    if m_off != t_off + t_len:
        raise FormatError(f"the metadata block must follow the table at {t_off + t_len}, "
                          f"not {m_off}", field="metadata_offset")
    if m_len > MAX_METADATA_BYTES:
        raise FormatError(f"metadata block of {m_len} bytes exceeds the limit of "
                          f"{MAX_METADATA_BYTES}", field="metadata_length")
    if m_len > f_size - m_off:
        raise FormatError(f"the metadata block ({m_len} bytes) extends past the end of the file",
                          field="metadata_length")
    if m_len % 8:
        raise FormatError(f"metadata length {m_len} is not a multiple of 8",
                          field="metadata_length")
    if align < BUFFER_ALIGNMENT or align > MAX_BUFFER_ALIGNMENT or align & (align - 1):
        raise FormatError(f"buffer alignment {align} is not a power of two in "
                          f"[{BUFFER_ALIGNMENT}, {MAX_BUFFER_ALIGNMENT}]", field="alignment")
    index_end = m_off + m_len
    expected = round_up(index_end, max(PAGE_ALIGNMENT, align)) if d_len else index_end
    if d_off != expected:
        raise FormatError(
            f"the data region must start at {expected} (the end of the metadata, rounded up to "
            f"{max(PAGE_ALIGNMENT, align)} when there is data), not {d_off}", field="data_offset")
    if d_off > f_size or d_len != f_size - d_off:
        raise FormatError(f"data region [{d_off}, {d_off + d_len}) does not end at the end of "
                          f"the file ({f_size})", field="data_length")
    if n_entries > t_len // _MIN_ENTRY:
        raise FormatError(f"{n_entries} entries cannot fit in a {t_len}-byte table "
                          f"(an entry takes at least {_MIN_ENTRY} bytes)", field="n_entries")
    if n_meta > m_len // _MIN_META:
        raise FormatError(f"{n_meta} metadata items cannot fit in a {m_len}-byte block",
                          field="n_metadata")
    return Header((major, minor), flags, n_entries, n_meta, t_len, m_len, d_off, d_len, f_size,
                  align, icrc)


def _utf8(raw: bytes, field: str, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                          field=field) from None


def parse_index(h: Header, index: memoryview) -> tuple[list[EntryInfo], dict[str, str]]:
    """Parse and check the table and metadata (``index`` = bytes [128, index_end))."""
    check_index_crc(h, index)
    return _parse_entries(h, index), parse_metadata(h, index)


def check_index_crc(h: Header, index: memoryview) -> None:
    """Refuse an index (table and metadata) whose CRC-32 is not the header's: the first
    check of :func:`parse_index`."""
    if zlib.crc32(index) != h.index_crc:
        raise FormatError("index checksum mismatch: the entry table or metadata is corrupt",
                          field="index.checksum")


def _parse_entries(h: Header, index: memoryview) -> list[EntryInfo]:
    """The entry table read and checked, entry by entry, then the buffers' packing."""
    checksums = bool(h.flags & FLAG_DATA_CHECKSUMS)
    cache: dict[bytes, tuple[Descriptor, tuple[BufferEntry, ...]]] = {}
    entries: list[EntryInfo] = []
    seen: dict[str, int] = {}
    pos, end = 0, h.table_length
    for i in range(h.n_entries):
        if pos + ENTRY.size > end:
            raise entry_error(i, None, None, f"truncated: the table ends at {end}, the entry "
                              f"needs {ENTRY.size} bytes at {pos}")
        name_len, desc_len, crc, reserved = ENTRY.unpack_from(index, pos)
        if reserved:
            raise entry_error(i, None, None, "reserved entry bytes must be zero",
                              field="reserved")
        if not 1 <= name_len <= MAX_NAME_BYTES:
            raise entry_error(i, None, None, f"name length {name_len} is outside "
                              f"[1, {MAX_NAME_BYTES}]", field="name_length")
        if desc_len < _MIN_DESCRIPTOR or desc_len % 8:
            raise entry_error(i, None, None, f"descriptor length {desc_len} is not a multiple "
                              f"of 8 of at least {_MIN_DESCRIPTOR}", field="descriptor_length")
        if crc and not checksums:
            raise entry_error(i, None, None, "non-zero checksum in a file without data "
                              "checksums", field="checksum")
        name_at = pos + ENTRY.size
        desc_at = name_at + pad8(name_len)
        desc_end = desc_at + desc_len
        if desc_end > end:
            raise entry_error(i, None, None, f"truncated: the entry needs bytes up to "
                              f"{desc_end} of a {end}-byte table", field="descriptor_length")
        if any(index[name_at + name_len:desc_at]):
            raise entry_error(i, None, None, "name padding must be zero", field="name")
        name = _utf8(bytes(index[name_at:name_at + name_len]), f"entries[{i}].name", "the name")
        if "\x00" in name:
            raise entry_error(i, name, None, "a name must not contain NUL", field="name")
        if name in seen:
            raise entry_error(i, name, None, f"duplicate name (also entries[{seen[name]}])",
                              field="name")
        seen[name] = i
        d, table = _decode_entry(i, name, index[desc_at:desc_end], cache)
        if d.is_dynamic:
            raise entry_error(i, name, None, "a stored tensor cannot have dynamic dimensions",
                              field="shape")
        for j, b in enumerate(table):
            if not b.length:
                continue
            if b.offset % h.alignment:
                raise entry_error(i, name, None, f"offset {b.offset} is not a multiple of the "
                                  f"file's alignment {h.alignment}",
                                  field=f"buffers[{j}].offset")
            if b.offset > h.data_length or b.length > h.data_length - b.offset:
                raise entry_error(i, name, None, f"{b.role.name} buffer [{b.offset}, "
                                  f"{b.offset + b.length}) extends past the {h.data_length}-byte "
                                  "data region", field=f"buffers[{j}].offset")
        entries.append(EntryInfo(i, name, d, table, crc if checksums else None))
        pos = desc_end
    if pos != end:
        raise FormatError(f"the table is {end} bytes but its {h.n_entries} entries take {pos}",
                          field="table_length")
    _check_packing(h, entries)
    return entries


_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")


def _decode_entry(i: int, name: str, raw: memoryview,
                  cache: dict[bytes, tuple[Descriptor, tuple[BufferEntry, ...]]],
                  ) -> tuple[Descriptor, tuple[BufferEntry, ...]]:
    """Decode one entry's descriptor, once per distinct descriptor in the file.

    The layers of a model repeat the same shapes, so the descriptors of a
    checkpoint differ mostly in their buffer offsets. The cache key is the
    descriptor's bytes with the offset fields zeroed: a hit is byte-identical
    to a descriptor that decoded successfully except for its offsets, and the
    only checks that depend on offsets (alignment, no overlap, within range)
    are made for every entry by the caller and by ``_check_packing``.
    """
    n_buf = _U16.unpack_from(raw, 14)[0] if len(raw) >= 16 else 0
    table_at = len(raw) - 24 * n_buf
    key = None
    if n_buf <= 8 and table_at >= 32:
        masked = bytearray(raw)
        for j in range(n_buf):
            _U64.pack_into(masked, table_at + 24 * j + 8, 0)
        key = bytes(masked)
        hit = cache.get(key)
        if hit is not None:
            d, template = hit
            return d, tuple(
                BufferEntry(b.role, _U64.unpack_from(raw, table_at + 24 * j + 8)[0], b.length)
                for j, b in enumerate(template))
    try:
        d, table, size = decode_prefix(raw)
    except FormatError as exc:
        raise entry_error(i, name, exc) from None
    if size != len(raw):
        raise entry_error(i, name, None, f"descriptor takes {size} bytes, the entry says "
                          f"{len(raw)}", field="descriptor_length")
    if key is not None:
        cache[key] = (d, table)
    return d, table


def _check_packing(h: Header, entries: Sequence[EntryInfo]) -> None:
    """Buffers tile the data region: no overlap, no gap beyond alignment padding."""
    spans = sorted((b.offset, b.offset + b.length, e.position, j)
                   for e in entries for j, b in enumerate(e.buffers) if b.length)
    prev_end, prev = 0, None
    for off, stop, i, j in spans:
        if off < prev_end:
            assert prev is not None
            raise entry_error(i, entries[i].name, None,
                              f"buffer [{off}, {stop}) overlaps entries[{prev[0]}].buffers"
                              f"[{prev[1]}] ({entries[prev[0]].name!r})",
                              field=f"buffers[{j}].offset")
        if off != round_up(prev_end, h.alignment):
            raise entry_error(i, entries[i].name, None,
                              f"a gap of {off - prev_end} bytes precedes this buffer; buffers "
                              "follow each other with only alignment padding between them",
                              field=f"buffers[{j}].offset")
        prev_end, prev = stop, (i, j)
    if prev_end != h.data_length:
        raise FormatError(f"the data region is {h.data_length} bytes but its buffers end at "
                          f"{prev_end}", field="data_length")


def parse_metadata(h: Header, index: memoryview) -> dict[str, str]:
    """The metadata block of ``index`` (bytes [128, index_end)) read and checked: the last
    step of :func:`parse_index`."""
    meta: dict[str, str] = {}
    pos, end = h.table_length, h.table_length + h.metadata_length
    for k in range(h.n_metadata):
        f = f"metadata[{k}]"
        if pos + META.size > end:
            raise FormatError(f"truncated: the item needs {META.size} bytes at {pos}", field=f)
        key_len, value_len = META.unpack_from(index, pos)
        if not 1 <= key_len <= MAX_KEY_BYTES:
            raise FormatError(f"key length {key_len} is outside [1, {MAX_KEY_BYTES}]",
                              field=f"{f}.key")
        body = pos + META.size
        stop = body + pad8(key_len + value_len)
        if stop > end:
            raise FormatError(f"truncated: the item needs bytes up to {stop} of the metadata "
                              "block", field=f"{f}.value")
        key = _utf8(bytes(index[body:body + key_len]), f"{f}.key", "the key")
        if "\x00" in key:
            raise FormatError("a key must not contain NUL", field=f"{f}.key")
        if key in meta:
            raise FormatError(f"duplicate key {key!r}", field=f"{f}.key")
        value = _utf8(bytes(index[body + key_len:body + key_len + value_len]), f"{f}.value",
                      "the value")
        if any(index[body + key_len + value_len:stop]):
            raise FormatError("item padding must be zero", field=f"{f}.value")
        meta[key] = value
        pos = stop
    if pos != end:
        raise FormatError(f"the metadata block is {end - h.table_length} bytes but its "
                          f"{h.n_metadata} items take {pos - h.table_length}",
                          field="metadata_length")
    return meta


def index_from(h: Header, entries: Sequence[EntryInfo], meta: dict[str, str]) -> FileIndex:
    return FileIndex(h.version, h.flags, h.alignment, tuple(entries), meta, h.data_offset,
                     h.data_length, h.file_size)


# ------------------------------------------------------------------- reading
def _read_exact(f: Any, n: int) -> bytearray:
    data = bytearray(n)
    got = readinto_full(f, memoryview(data))
    if got != n:
        raise FormatError(f"truncated: wanted {n} bytes, read {got} (did the file change "
                          "while it was read?)", field="file_size")
    return data


def read_head(f: Any) -> tuple[Header, list[EntryInfo], dict[str, str]]:
    h, index = read_raw_index(f)
    entries, meta = parse_index(h, index)
    return h, entries, meta


def read_raw_index(f: Any, size: int | None = None) -> tuple[Header, memoryview]:
    """The checked header of the file open as ``f`` (at offset 0) and its index's bytes
    (table and metadata), read but not yet checked (:func:`parse_index` checks them).
    ``size``: the file's, where the caller has its stat already."""
    if size is None:
        size = os.fstat(f.fileno()).st_size
    h = parse_header(f.read(HEADER_SIZE), size)
    return h, memoryview(_read_exact(f, h.index_end - HEADER_SIZE)).toreadonly()


def plain_entry(raw: bytes) -> tuple[Descriptor, tuple[int, ...], DType, bool, int] | None:
    """``(descriptor, shape, element type, padded, buffer length)`` of an entry's
    descriptor bytes ``raw`` when they decode, as :func:`parse_index` decodes them, to a
    static dense row-major tensor with one DATA buffer; ``None`` for any other descriptor
    and any defect (without its message). What the compiled reader of entry tables
    (:func:`compiled_tensors`) asks once for each distinct descriptor of a file."""
    try:
        d, table, size = decode_prefix(raw)
    except FormatError:
        return None
    if (size != len(raw) or d.layout is not Layout.ROW_MAJOR or d.strides is not None
            or d.quantization is not None or d.shard is not None or d.is_dynamic or len(table) != 1
            or table[0].role != BufferRole.DATA):
        return None
    return d, d.shape, d.dtype, d.padded, table[0].length


# The compiled reader of entry tables (_speedups_c/hry_index.c), or None where
# hurray_bridge._speedups was not built (or built before it had one).
_compiled: Callable[..., dict[str, Any] | None] | None
try:
    from .._speedups import hurray_tensors as _compiled
except ImportError:
    _compiled = None


def compiled_reader() -> bool:
    """Whether :func:`compiled_tensors` may read a file (the compiled module was built):
    without it a caller skips the steps that serve it alone (the map made first)."""
    return _compiled is not None


def compiled_tensors(h: Header, index: memoryview, base: int, owner: object
                     ) -> dict[str, Any] | None:
    """hb.load's tensors of the entry table in ``index`` (:func:`read_raw_index`; its CRC
    checked) over the mapped data at address ``base``, read in C: ``{name: Tensor}`` in
    entry order, read-only, each with its descriptor, as ``mapping.tensors_over`` builds
    them from :func:`parse_index`'s entries.

    ``None`` when the compiled module is absent, or an entry is not a plain dense
    tensor, or anything is wrong: :func:`parse_index` then reads the table and names the
    defect. Where both read a table they agree
    (tests/hurray_bridge/test_container_compiled.py)."""
    if _compiled is None:
        return None
    return _compiled(index[:h.table_length], h.n_entries,
                     bool(h.flags & FLAG_DATA_CHECKSUMS), h.data_length, h.alignment, base,
                     owner, plain_entry)


def read_index(path: str | os.PathLike[str]) -> FileIndex:
    """Read and check a file's header, table and metadata (not its data)."""
    with open_regular(path) as f:
        return index_from(*read_head(f))


def load_metadata(path: str | os.PathLike[str]) -> dict[str, str]:
    """A file's string metadata, without mapping its data."""
    return read_index(path).metadata

