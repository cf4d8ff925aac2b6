"""Hurray files: named tensors in one file, loaded zero-copy through mmap.

The format is ``docs/spec/container.md``. A file is a 128-byte header, a
table of entries (a UTF-8 name and a wire descriptor per entry, whose buffer
offsets point into the data region), an optional string-to-string metadata
block, and a data region that starts on a page boundary and holds every
non-empty buffer on a 64-byte (or larger, declared) boundary of the file.

Reading treats the file as hostile: every count is bounded by the bytes that
hold it, every offset and length is checked against the data region, and every
defect is a :class:`FormatError` naming the entry and field, raised before any
tensor points at the data. Writing is atomic: a temporary file in the target's
directory, fsync, ``os.replace``, fsync of the directory.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import functools
import io
import itertools
import mmap as _mmap
import operator
import os
import re
import shlex
import stat
import struct
import sys
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from . import _numpy
from ._copy_policy import check_copy
from ._deferred import FileTarget, Job, Pending, Run, box_runs
from ._disk import (
    SUFFIX_FORMATS,
    WRITES_VECTORS,
    _bad_count,
    _fspath,
    _open_regular,
    _write_all,
    _write_vectors,
    atomic_output,
    atomic_temporary,
    check_suffix,
    checkpoint,
    interruptible,
    stale_temporaries,
)
from ._format import (
    _ENTRY,
    _HEADER,
    _HEADER_CRC_AT,
    _META,
    _ZERO44,
    BUFFER_ALIGNMENT,
    FLAG_DATA_CHECKSUMS,
    HEADER_SIZE,
    MAGIC,
    MAX_BUFFER_ALIGNMENT,
    MAX_KEY_BYTES,
    MAX_METADATA_BYTES,
    MAX_NAME_BYTES,
    PAGE_ALIGNMENT,
    VERSION,
    EntryInfo,
    FileIndex,
    _align,
    _entry_error,
    _Header,
    _index_from,
    _pad8,
    _parse_header,
    _parse_index,
    _read_head,
    read_index,
)
from ._format import load_metadata as load_metadata  # named from here by the torch adapter
from ._gc import collection_paused
from ._memory import alloc_aligned, buffer_address
from ._pread import read_all
from ._registry import deferred_save
from ._safetensors_header import (
    looks_like_safetensors,
    read_header_and_descriptors,
)
from ._trailing import high_bits, placed_pieces, set_trailing_bits, written_pieces
from .conversion import asarray, asarray_one
from .descriptor import Descriptor, dense_descriptor
from .dtypes import DType, bool8
from .errors import ClosedFileError, CopyRequiredError, FormatError, UnsupportedError
from .layout import BufferRole, Layout
from .shards import ShardedTensor, _missing_box, check_set
from .tensor import CPU, Buffer, Tensor
from .wire import DENSE_PLACE, BufferEntry, dense_head, encode

__all__ = [
    "BUFFER_ALIGNMENT",
    "HEADER_SIZE",
    "MAGIC",
    "PAGE_ALIGNMENT",
    "VERSION",
    "EntryInfo",
    "FileIndex",
    "TensorFile",
    "dumps",
    "load",
    "loads",
    "read_index",
    "rewrite",
    "save",
    "stale_temporaries",
    # from _disk, kept importable from here: the file-system rules every writer follows
    "SUFFIX_FORMATS",
    "atomic_output",
    "check_suffix",
    "verify",
]

_NAME_PADS = tuple(bytes(n) for n in range(8))  # the zeros after a name of 8k - n bytes
_CHUNK = 4 << 20  # write and checksum in slices that stay in the CPU cache
_PROGRESS = Callable[[int, int], None]


def _fast_crc32() -> Callable[[Any, int], int]:
    """The data checksums' CRC-32: zlib.crc32, or the same function compiled by carry-less
    multiplication where ``_speedups`` was built and the CPU has the instruction (5 to 13
    times as fast as zlib 1.2's; the same value for the same bytes)."""
    try:
        from . import _speedups
    except ImportError:
        return zlib.crc32
    return _speedups.crc32 if getattr(_speedups, "CRC32_CLMUL", False) else zlib.crc32


_crc32 = _fast_crc32()


def _poly_mul(a: int, b: int) -> int:
    """``a * b`` modulo the CRC-32 polynomial, both reflected as the CRC register holds
    them (bit 31 is the coefficient of x^0)."""
    product = 0
    for i in range(32):
        if a & (0x80000000 >> i):
            product ^= b  # a has x^i: add b * x^i
        b = (b >> 1) ^ 0xEDB88320 if b & 1 else b >> 1  # b *= x
    return product


def _py_crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``a + b`` from ``crc1`` of ``a`` and ``crc2`` of ``b`` (``len2`` bytes),
    without reading a byte again: ``crc1`` times x^(8 len2), plus ``crc2`` (the CRC's pre-
    and post-conditioning cancel out). A zip member's checksum from those of its parts;
    the two halves of an entry written at once."""
    # As the compiled one: a negative length would shift right to -1 for ever.
    for name, value, limit in (("crc1", crc1, 32), ("crc2", crc2, 32), ("len2", len2, 64)):
        if not 0 <= operator.index(value) < 1 << limit:
            raise OverflowError(f"crc32_combine: {name} must be in [0, 2**{limit}), "
                                f"got {value}")
    shift, square = 0x80000000, 0x00800000  # x^0, x^8
    while len2:
        if len2 & 1:
            shift = _poly_mul(shift, square)
        square = _poly_mul(square, square)
        len2 >>= 1
    return _poly_mul(shift, crc1) ^ crc2


def _fast_crc32_combine() -> Callable[[int, int, int], int]:
    try:
        from . import _speedups
    except ImportError:
        return _py_crc32_combine
    return getattr(_speedups, "crc32_combine", _py_crc32_combine)  # (an older build lacks it)


_crc32_combine = _fast_crc32_combine()


# From this size (None: never), a file's data is read on a helper thread while the caller's
# thread writes. zlib's CRC-32 (250-400 ms a GiB) runs on a thread of its own; the compiled
# one (~20 ms a GiB) right after each read on the reading thread, where a third thread's
# hand-offs cost more than they would overlap (benchmarks/convert.py).
_THREADED_CRC_BYTES: int | None = 16 << 20
_CRC_THREAD = _crc32 is zlib.crc32
# From this size (None: never), a file's entries are cut in two halves of about as many
# bytes, each read, checksummed and written by one thread (the caller's and a helper),
# each chunk on one core: no chunk crosses from a reading core to a writing one, so where
# the other core is busy this costs what one thread would, and where it is free half.
_SPLIT_BYTES: int | None = 16 << 20




def _pow2_alignment(address: int, cap: int) -> int:
    """Largest power of two (up to ``cap``) dividing ``address``."""
    if address == 0:
        return cap
    return min(cap, address & -address)



class TensorFile(dict[str, "Tensor | ShardedTensor"]):
    """What :func:`load` and :func:`loads` return: ``{name: hb.Tensor}`` plus the file's facts.

    ``metadata`` is the file's string metadata; ``alignment`` is the alignment
    (in bytes) that every non-empty buffer's address is known to have. A sharded
    tensor's entries (``NAME[k]``, see :func:`load`) are one ``hb.ShardedTensor``.
    """

    metadata: dict[str, str]
    alignment: int

    def __init__(self, tensors: Mapping[str, Tensor | ShardedTensor] | None = None,
                 metadata: dict[str, str] | None = None, alignment: int = BUFFER_ALIGNMENT):
        super().__init__(tensors or {})
        self.metadata = {} if metadata is None else metadata
        self.alignment = alignment

    _closed_with: int | None = None  # how many tensors close() dropped; None while open

    def close(self) -> None:
        """Drop this object's tensors. A file's map is unmapped once no tensor taken
        from it is alive (tensors still held stay valid); closing twice is fine. A
        lookup afterwards raises :class:`hb.ClosedFileError`."""
        if self._closed_with is None:
            self._closed_with = len(self)
        self.clear()

    def __getitem__(self, name: str) -> Tensor | ShardedTensor:
        try:
            return super().__getitem__(name)
        except KeyError:
            if self._closed_with is None:
                raise
        raise ClosedFileError(
            f"{name!r}: this file was closed (close(), or the end of its with block), which "
            "dropped its tensors; keep a tensor before closing, or hb.load the file again")

    def __repr__(self) -> str:
        if self._closed_with is None:
            return super().__repr__()
        n = self._closed_with
        # A closed file is empty: printing {} read as a file with no tensors.
        return f"<hb.TensorFile, closed (it held {n} tensor{'s' * (n != 1)})>"

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _verify_data(view: memoryview, h: _Header, entries: Sequence[EntryInfo]) -> None:
    """Check what the index does not cover: data checksums and zero padding.

    ``view`` is the whole file. After this, every byte of the file is checked.
    """
    def read(start: int, stop: int) -> memoryview:
        return view[start:stop]

    _check_head_padding(read, h)
    base = h.data_offset
    for e in entries:
        if e.checksum is None:
            continue
        crc = 0
        for b in e.buffers:
            if b.length:
                crc = _crc32(view[base + b.offset:base + b.offset + b.length], crc)
        _check_checksum(e, crc)
    _check_padding_and_bits(read, h, entries)


# read(start, stop): the file's bytes [start, stop), from a map or read from the file
_Read = Callable[[int, int], "memoryview | bytes"]


def _check_head_padding(read: _Read, h: _Header) -> None:
    if _any_nonzero(read(h.index_end, h.data_offset)):
        raise FormatError("the padding before the data region must be zero", field="data_offset")


def _check_checksum(e: EntryInfo, crc: int) -> None:
    """``crc`` is the CRC-32 of the entry's buffers as the file holds them."""
    if e.checksum is not None and crc != e.checksum:
        raise _entry_error(e.position, e.name, None,
                           f"data checksum mismatch (stored 0x{e.checksum:08x}, computed "
                           f"0x{crc:08x}): the tensor's bytes are corrupt", field="checksum")


def _check_padding_and_bits(read: _Read, h: _Header, entries: Sequence[EntryInfo]) -> None:
    """The padding between buffers is zero, and so are packed sub-byte data's trailing bits."""
    base = h.data_offset
    spans = sorted((b.offset, b.offset + b.length, e.position, j)
                   for e in entries for j, b in enumerate(e.buffers) if b.length)
    for (_, stop, _, _), (off, _, i, j) in itertools.pairwise(spans):
        if off > stop and _any_nonzero(read(base + stop, base + off)):
            raise _entry_error(i, entries[i].name, None, "the padding before this buffer must "
                               "be zero", field=f"buffers[{j}].offset")
    for e in entries:  # element-types.md §4.1 rule 6: packed sub-byte data ends in zero bits
        first = e.buffers[0] if e.buffers else None
        if first is not None and first.length and e.descriptor.trailing_bits:
            at = base + first.offset + first.length - 1
            last = read(at, at + 1)[0]
            if set_trailing_bits(e.descriptor, last):
                mask = 0xFF & ~(0xFF >> e.descriptor.trailing_bits)
                raise _entry_error(
                    e.position, e.name, None,
                    f"the last byte of its packed {e.descriptor.dtype.name} {first.role.name} "
                    f"buffer is 0x{last:02x}: the trailing bits after the last element "
                    f"(mask 0x{mask:02x}) must be zero; load the file and save it again "
                    "(hb.save writes them as zero)", field="buffers[0].trailing_bits")
        if first is not None and first.length and e.descriptor.padded:
            at = base + first.offset
            bad = high_bits(e.descriptor, _FileSpan(read, at, first.length))
            if bad is not None:
                bits = e.descriptor.dtype.bits
                raise _entry_error(
                    e.position, e.name, None,
                    f"element {bad[0]} of its padded {e.descriptor.dtype.name} {first.role.name} "
                    f"buffer is the byte 0x{bad[1]:02x}: the {8 - bits} high bits of each element "
                    f"(mask 0x{0xFF & ~((1 << bits) - 1):02x}) must be zero (element-types.md "
                    "§4.3); load the file and save it again (hb.save writes them as zero)",
                    field="buffers[0].high_bits")


class _FileSpan:
    """``length`` bytes of the file from ``start`` through a :data:`_Read`, as
    ``_trailing.high_bits`` reads a buffer: ``len`` and ``read(k, n)``."""

    __slots__ = ("length", "read_", "start")

    def __init__(self, read: _Read, start: int, length: int) -> None:
        self.read_, self.start, self.length = read, start, length

    def __len__(self) -> int:
        return self.length

    def read(self, k: int, n: int) -> bytes:
        return bytes(self.read_(self.start + k, self.start + k + n))


def _any_nonzero(view: memoryview | bytes) -> bool:
    n = len(view)
    return n > 0 and bytes(view) != bytes(n)


# -------------------------------------------------------------------- memory
class _Mapping:
    """Owner of a mapped (or borrowed) buffer: the last tensor's death releases it.

    For a file, ``view`` is the only export of the mmap; when this object dies
    the view is released, then the mmap, which unmaps the file and closes its
    file descriptor.
    """

    __slots__ = ("__weakref__", "address", "alignment_note", "mm", "path", "stamp", "view")

    def __init__(self, view: memoryview, mm: _mmap.mmap | None = None, path: str | None = None,
                 stamp: tuple[int, int, int, int] | None = None):
        self.view = view
        self.mm = mm
        self.path = path
        self.stamp = stamp  # the mapped file's (device, inode, size, mtime_ns) when mapped
        self.address = buffer_address(view)[0]  # view pins the memory
        # Why many of this file's tensors are unaligned, and the fix; what a copy made
        # for that reason adds to its warning (_copy_policy.alignment_note).
        self.alignment_note: str | None = None

    def __repr__(self) -> str:
        return f"<hurray mapping of {self.path or 'a buffer'}, {len(self.view)} bytes>"


def file_stamp(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one file from its replacement or a rewrite: device, inode, size and
    modification time (ns)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def mapped_file_origin(t: Tensor) -> tuple[str, int, tuple[int, int, int, int]] | None:
    """``(path, file offset of its first byte, the file's stamp when mapped)`` for a tensor
    that points into a file :func:`load` mapped, so that another process can map the same
    bytes (and tell whether the file under ``path`` is still that one); else ``None``."""
    owner = t.owner
    if (type(owner) is not _Mapping or owner.mm is None or owner.path is None
            or owner.stamp is None or not t.nbytes):
        return None
    return owner.path, t.data_ptr - owner.address, owner.stamp


_DENSE = (Layout.ROW_MAJOR, Layout.STRIDED)


def _tensors_over(entries: Sequence[EntryInfo], base: int, owner: object,
                  readonly: bool) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for e in entries:
        d = e.descriptor
        if d.layout in _DENSE and d.quantization is None and d.shard is None:
            # The descriptor was validated when the file was read: the fast dense
            # constructor derives the same single DATA buffer without re-deriving
            # the buffer layout (a checkpoint has hundreds of entries).
            (b,) = e.buffers
            ptr = 0
            if b.length:
                ptr = base + b.offset
                if d.strides is not None:  # the buffer is the span; [0, ..., 0] may be inside
                    ptr += d.dtype.itemsize * sum((n - 1) * -st for n, st in
                                                  zip(d.shape, d.strides, strict=True) if st < 0)
            t = Tensor._dense(ptr, d.shape, d.dtype, strides=d.strides, padded=d.padded,
                              device=CPU, owner=owner, readonly=readonly, copied=False)
            t._desc = d
            out[e.name] = t
            continue
        bufs = [Buffer(b.role, base + b.offset if b.length else 0, b.length) for b in e.buffers]
        out[e.name] = Tensor(d, bufs, device=CPU, owner=owner, readonly=readonly)
    return out


def _file_reader(f: io.BufferedIOBase, data_start: int) -> Callable[[int, memoryview], None]:
    """``read(offset, dest)`` for :func:`_copy_tensors`: fill ``dest`` from ``data_start + offset``.

    A file that ends early was cut (or changed) after its index was read.
    """
    def read(offset: int, dest: memoryview) -> None:
        f.seek(data_start + offset)
        got = 0
        while got < len(dest):
            want = len(dest) - got
            n = f.readinto(dest[got:])
            if not n:
                raise _truncated_read()
            if not 0 < n <= want:
                raise _bad_count("readinto", n, want)
            got += n

    return read


def _truncated_read() -> FormatError:
    return FormatError("truncated: the file ended while a buffer was read (did it change?)",
                       field="file_size")


def _copy_tensors(entries: Sequence[EntryInfo],
                  read: Callable[[int, memoryview], None]) -> dict[str, Tensor]:
    """Tensors in fresh 64-byte aligned memory; ``read(offset, dest)`` fills each buffer."""
    out, jobs = _fresh_tensors(entries)
    for offset, dest in jobs:
        read(offset, dest)
    return out


def _fresh_tensors(entries: Sequence[EntryInfo]
                   ) -> tuple[dict[str, Tensor], list[tuple[int, memoryview]]]:
    """Tensors over fresh 64-byte aligned memory (one allocation per buffer, so each
    tensor's memory goes with it), and ``(data offset, dest)`` for each byte to fill."""
    out: dict[str, Tensor] = {}
    jobs: list[tuple[int, memoryview]] = []
    for e in entries:
        bufs, allocs = [], []
        for b in e.buffers:
            alloc = alloc_aligned(b.length, filled=True)
            if alloc is not None:
                dest = memoryview((ctypes.c_ubyte * b.length).from_address(alloc.ptr)).cast("B")
                jobs.append((b.offset, dest))
                allocs.append(alloc)
            bufs.append(Buffer(b.role, alloc.ptr if alloc else 0, b.length))
        out[e.name] = Tensor(e.descriptor, bufs, device=CPU, owner=tuple(allocs))
    return out, jobs


def _read_tensors(f: Any, entries: Sequence[EntryInfo], data_start: int,
                  check: _Header | None = None) -> dict[str, Tensor]:
    """Tensors in fresh 64-byte aligned memory read from the open file ``f`` (``load(mmap=
    False)``): large positional reads on a few threads (:mod:`._pread`), no copy between.

    With ``check`` (the file's header: ``verify=True``), every byte is checked as
    :func:`verify` checks it, in the same order, but the checksums are computed over the
    memory just read: the file is read once, not once to check and once to load.
    """
    out, jobs = _fresh_tensors(entries)
    fd = f.fileno()
    read = functools.partial(_read_range, fd)
    if check is not None:
        _check_head_padding(read, check)
    read_all(fd, [(data_start + off, dest) for off, dest in jobs], _pread_into)
    if check is not None:
        dests = iter([dest for _, dest in jobs])  # in entry and buffer order, as allocated
        for e in entries:
            crc = 0
            for b in e.buffers:
                if b.length:
                    dest = next(dests)
                    if e.checksum is not None:
                        crc = _crc32(dest, crc)
            _check_checksum(e, crc)
        _check_padding_and_bits(read, check, entries)
        _check_size(fd, check)
    return out


# ------------------------------------------------------------------- reading
# (the index is read and checked by _format: read_index, _read_head)
def _map(f: Any, size: int) -> _mmap.mmap:
    """The open file ``f`` mapped copy-on-write (``MAP_PRIVATE``; container.md §8.2).

    The tensors over it are read-only, but torch has no read-only tensors and ignores
    DLPack's READ_ONLY flag: a write through a read-only map would kill the process
    (SIGSEGV), one through a shared writable map would change the file. A private map
    costs the same to read; a written page becomes this map's own copy.
    """
    try:
        mm = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_COPY)
    except ValueError:  # "cannot mmap an empty file": emptied since its header was read
        raise FormatError("the file changed size while it was opened",
                          field="file_size") from None
    if len(mm) != size:
        mm.close()
        raise FormatError("the file changed size while it was opened", field="file_size")
    return mm


def _mapping(f: Any, size: int, path: str,
             check: Callable[[memoryview], None] | None = None) -> _Mapping:
    """The open file ``f`` mapped (:func:`_map`) as the owner of views into it, after ``check``
    of the whole map (if given); on any failure the map is closed again."""
    mm = _map(f, size)
    view = memoryview(mm)
    try:
        if check is not None:
            check(view)
        return _Mapping(view, mm, path, file_stamp(os.fstat(f.fileno())))
    except BaseException:
        view.release()
        try:
            mm.close()
        except BufferError:  # still exported (an interrupt inside buffer_address): the
            pass  # map goes with its last reference; the first error is the one to see
        raise


def _verify_file(f: Any, h: _Header, entries: Sequence[EntryInfo]) -> None:
    """:func:`_verify_data` of an open file, read in pieces: never through a memory map,
    which a file cut meanwhile turns into SIGBUS (here it is ``file_size: truncated``),
    and which would count the whole file in the resident set."""
    fd = f.fileno()
    read = functools.partial(_read_range, fd)
    _check_head_padding(read, h)
    buf = memoryview(bytearray(min(4 << 20, max((b.length for e in entries if e.checksum
                                                  is not None for b in e.buffers), default=0))))
    for e in entries:
        if e.checksum is not None:
            _check_checksum(e, _regions_crc([_Region(fd, h.data_offset + b.offset, b.length)
                                             for b in e.buffers], buf))
    _check_padding_and_bits(read, h, entries)
    _check_size(fd, h)


def _check_size(fd: int, h: _Header) -> None:
    if os.fstat(fd).st_size != h.file_size:  # a map would have seen it (grown; cut is read)
        raise FormatError("the file changed size while it was opened", field="file_size")


def verify(path: str | os.PathLike[str]) -> FileIndex:
    """Check every byte of a file: the structure, the data checksums and all padding.

    Returns the index on success; raises :class:`FormatError` naming the entry
    and field of the first defect otherwise.
    """
    with _open_regular(path) as f:
        h, entries, meta = _read_head(f)
        _verify_file(f, h, entries)
    _check_shard_entries({e.name: e.descriptor for e in entries})  # after the bytes, as load
    return _index_from(h, entries, meta)


# What hb.load of a folder or a checkpoint index calls (None: ``path`` is no such thing).
# checkpoint_dir, which imports this module, adds its reader here as the package is imported:
# an import of it from here would be a cycle.
_CHECKPOINT_OPENERS: list[Callable[[Any, bool, bool], TensorFile | None]] = []


def load(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], mmap: bool = True, *,
         verify: bool = False) -> TensorFile:
    """Load a Hurray file as ``{name: hb.Tensor}`` (a :class:`TensorFile`, with ``.metadata``).

    With ``mmap=True`` (the default) every tensor points into one copy-on-write
    memory map of the file: nothing is read until it is touched, and the map
    (and its file descriptor) is released when the last tensor dies. The tensors
    are read-only (``readonly`` is set); a consumer that writes anyway (torch)
    changes this load's private copy of the page, seen by every view of this
    load and never by the file or another load (container.md §8.2). With
    ``mmap=False`` each buffer is read into fresh, writable, 64-byte aligned
    memory, with large positional reads on a few threads (for network file
    systems, or when the file may change while its tensors live). ``verify=True``
    checks the data checksums and padding before any tensor is returned (it reads
    the whole file; with ``mmap=False`` in the same pass that loads it).

    ``path`` is a path (an ``int`` is refused: it would be taken as a file
    descriptor and closed) of a regular file: FIFOs, devices and sockets are an
    :class:`UnsupportedError`, before they are opened.

    A safetensors file (known by its content, whatever its name) loads the same
    way (its header is read by :mod:`hurray_bridge._safetensors_header`).

    Sharded tensors: the entries ``NAME[0]``, ``NAME[1]`` ... that have shard
    sections (what :func:`save` writes for a ShardedTensor) are one
    ``hb.ShardedTensor`` under ``NAME``, its shards zero-copy views like any
    entry. One file may hold some of the boxes only (one process's shards): the
    set is then ``partial`` (``is_complete`` is False). ``path`` may also be a
    sequence (list, tuple ...) of files, such as every rank's file of one checkpoint: their
    entries are merged, each sharded tensor's shards from all files together
    must tile its global shape (a missing or overlapping box is a
    :class:`FormatError` naming it and the files), an unsharded name may be in
    one file only, and ``metadata`` keeps the items on which every file agrees.

    A folder, or a checkpoint index (a path ending in ``.json``, such as Hugging Face's
    ``model.safetensors.index.json``), loads every shard file of the checkpoint as one
    mapping, each tensor zero-copy in its own file's map, after checking the files against
    the index (a :class:`hurray_bridge.checkpoint_dir.CheckpointFile`;
    :func:`hurray_bridge.checkpoint_dir.load_checkpoint`, container.md §12).
    """
    # Any Sequence, as annotated (a list[Path] is no list[str | PathLike[str]] to a type
    # checker, so the annotation must be Sequence); str and bytes are Sequences too, but one
    # path each, and byte buffers are no paths at all (os.fspath refuses them by name).
    if isinstance(path, (list, tuple)) or (
            not isinstance(path, (str, bytes, bytearray, memoryview, os.PathLike))
            and isinstance(path, Sequence)):
        return _load_files(path, mmap, verify)
    for opener in _CHECKPOINT_OPENERS:
        checkpoint = opener(path, mmap, verify)
        if checkpoint is not None:
            return checkpoint
    # (a byte buffer, outside the annotation, reaches os.fspath, whose TypeError names it)
    return _grouped(_load_file(path, mmap, verify))  # type: ignore[arg-type]


def _load_file(path: str | os.PathLike[str], mmap: bool, verify: bool) -> TensorFile:
    """One file's entries as they are (shards one by one): the body of :func:`load`."""
    with _open_regular(path) as f:
        head = f.read(16)
        f.seek(0)
        if head[:4] != MAGIC and looks_like_safetensors(head):
            return _load_safetensors(f, os.fspath(path), mmap=mmap, verify=verify)
        with collection_paused():
            h, entries, meta = _read_head(f)
        if not mmap:
            tensors = _read_tensors(f, entries, h.data_offset, h if verify else None)
            return TensorFile(tensors, meta, BUFFER_ALIGNMENT)
        if h.data_length == 0 and not verify:
            # Nothing to map: every tensor is empty and points nowhere.
            return TensorFile(_tensors_over(entries, 0, None, True), meta, h.alignment)
        owner = _mapping(f, h.file_size, os.fspath(path),
                         (lambda view: _verify_data(view, h, entries)) if verify else None)
    # A page-aligned map: every buffer is aligned as the file says.
    alignment = _pow2_alignment(owner.address + h.data_offset, h.alignment)
    with collection_paused():
        tensors = _tensors_over(entries, owner.address + h.data_offset, owner, True)
    return TensorFile(tensors, meta, alignment)


def _load_safetensors(f: Any, path: str, *, mmap: bool = True,
                      verify: bool = False) -> TensorFile:
    """A safetensors file, opened as ``f`` (a regular file at offset 0), as a ``TensorFile``.

    What :func:`hurray_bridge.load` returns for a safetensors file: the tensors
    point into one copy-on-write memory map of the file, read-only as :func:`load`'s
    (``mmap=False``: each is read into fresh, writable, 64-byte aligned memory)
    and ``metadata`` is its ``__metadata__``. The format has no checksums, so ``verify=True`` checks
    what every load checks: the header and that each tensor's bytes are there.
    """
    if sys.byteorder != "little":
        raise UnsupportedError("safetensors is little-endian; this host is big-endian")
    # The descriptors the header was checked by (e.descriptor would build each again).
    with collection_paused():
        idx, descriptors = read_header_and_descriptors(f)
        data = BufferRole.DATA
        entries = [EntryInfo(i, e.name, d, (BufferEntry(data, e.begin, e.end - e.begin),),
                             None)
                   for i, (e, d) in enumerate(zip(idx.entries, descriptors, strict=True))]
    if not mmap:
        return TensorFile(_read_tensors(f, entries, idx.data_start),
                          dict(idx.metadata), BUFFER_ALIGNMENT)
    if idx.file_size == idx.data_start:  # no tensor bytes: nothing to map
        return TensorFile(_tensors_over(entries, 0, None, True), dict(idx.metadata),
                          BUFFER_ALIGNMENT)
    owner = _mapping(f, idx.file_size, path)
    base = owner.address + idx.data_start
    # safetensors places tensors back to back: the guaranteed alignment is what they share
    alignment = BUFFER_ALIGNMENT
    unaligned = 0
    for e in idx.entries:
        if e.end > e.begin:
            alignment = _pow2_alignment(base + e.begin, alignment)
            unaligned += (base + e.begin) % BUFFER_ALIGNMENT != 0
    if unaligned:
        # One text for every tensor of the file: the copy warnings it joins stay identical,
        # so the default filter shows them once per line, with the count a single one lacks.
        out = shlex.quote(os.path.splitext(path)[0] + ".hurray")
        owner.alignment_note = (
            f"{os.path.basename(path)} stores its tensors back to back: {unaligned} of its "
            f"{len(idx.entries)} tensors are not {BUFFER_ALIGNMENT}-byte aligned, and each of "
            f"those is copied too; `hurray convert {shlex.quote(path)} {out}` (or hb.save of "
            f"the loaded file to a .hurray path) aligns them all, once")
    with collection_paused():
        tensors = _tensors_over(entries, base, owner, True)
    return TensorFile(tensors, dict(idx.metadata), alignment)


def loads(buffer: Any, *, copy: bool | None = None, verify: bool = False) -> TensorFile:
    """Load a Hurray file held in memory (bytes, bytearray, memoryview, mmap ...).

    A writable buffer (``bytearray``, a writable memoryview or mmap) is shared:
    the tensors point into it, keep it alive, and are writable. A read-only
    buffer (``bytes``, a read-only memoryview, an ``ACCESS_READ`` mmap) is
    copied: torch, which has no read-only tensors, would otherwise write into an
    immutable object (or fault on a read-only map). ``copy=True`` copies any
    buffer; ``copy=False`` refuses a read-only one (:class:`CopyRequiredError`).
    Copies are 64-byte aligned and writable. Shared tensors' offsets are aligned
    relative to the start of the file, so their addresses are only as aligned
    as ``buffer`` itself: the result's ``alignment`` says what holds. Sharded
    tensors' entries are grouped as by :func:`load`.
    """
    check_copy(copy)
    return _grouped(_loads_entries(buffer, copy, verify))


def _loads_entries(buffer: Any, copy: bool | None, verify: bool) -> TensorFile:
    """The entries of a file in memory as they are: the body of :func:`loads`."""
    try:
        view = memoryview(buffer)
    except TypeError:
        raise FormatError(f"expected a bytes-like object, got {type(buffer).__name__}",
                          field="input") from None
    if not view.c_contiguous:
        raise FormatError("the buffer must be contiguous", field="input")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    h = _parse_header(view[:HEADER_SIZE], view.nbytes)
    entries, meta = _parse_index(h, view[HEADER_SIZE:h.index_end])
    if verify:
        _verify_data(view, h, entries)
    if view.readonly and h.data_length and copy is False:
        raise CopyRequiredError(
            f"hb.loads of a read-only {type(buffer).__name__} ({view.nbytes} bytes) must copy "
            "it, since a consumer that ignores read-only (torch) would write into it, but "
            "copy=False; "
            "pass a writable buffer (a bytearray, or an mmap with ACCESS_WRITE or "
            "ACCESS_COPY), or use hb.load for a file")
    if copy or (view.readonly and h.data_length):
        base = h.data_offset

        def read(offset: int, dest: memoryview) -> None:
            dest[:] = view[base + offset:base + offset + len(dest)]

        return TensorFile(_copy_tensors(entries, read), meta, BUFFER_ALIGNMENT)
    if h.data_length == 0:  # every tensor points nowhere: nothing to copy or protect
        return TensorFile(_tensors_over(entries, 0, None, view.readonly), meta, h.alignment)
    owner = _Mapping(view)
    start = owner.address + h.data_offset
    tensors = _tensors_over(entries, start, owner, False)
    return TensorFile(tensors, meta, _pow2_alignment(start, h.alignment))


# ----------------------------------------------------------- sharded entries
# A sharded tensor NAME is stored as one ordinary entry per shard, NAME[0], NAME[1] ...,
# each with its shard section (container.md §4.1): nothing in the format changes, and a
# reader that does not group them still reads every shard.
_SHARD_NAME = re.compile(r"(.+)\[(0|[1-9][0-9]*)\]", re.DOTALL)


def _shard_group(name: str, d: Descriptor) -> str | None:
    """The sharded tensor an entry belongs to, or ``None`` for an entry of its own."""
    if name[-1:] != "]" or d.shard is None:
        return None
    m = _SHARD_NAME.fullmatch(name)
    return None if m is None else m[1]


def _check_shard_names(entries: Mapping[str, Descriptor]) -> None:
    """Refuse a file in which a sharded tensor's name is also an entry of its own."""
    for name, d in entries.items():
        group = _shard_group(name, d)
        if group is not None and group in entries and _shard_group(group, entries[group]) is None:
            raise FormatError(
                f"entry {group!r} and the shard entry {name!r} both claim the name {group!r} "
                "(entries NAME[k] with shard sections are the shards of NAME); rename one",
                field="name")


def _global(first: Descriptor) -> Descriptor:
    """The global descriptor of the set that a shard entry opens."""
    assert first.shard is not None
    return Descriptor(first.shard.global_shape, first.dtype, padded=first.padded)


def _set_error(group: str, labels: list[str], exc: FormatError) -> FormatError:
    """A shard-set refusal with the entries (and files) in place of ``shards[i]``."""
    message = str(exc)
    if exc.field and message.startswith(exc.field + ": "):
        message = message[len(exc.field) + 2:]
    message = re.sub(r"shards\[(\d+)\]", lambda m: labels[int(m[1])], message)
    return FormatError(f"sharded tensor {group!r}: {message}", field="shards")


def _sharded(group: str, shards: list[Tensor], labels: list[str],
             partial: bool) -> ShardedTensor:
    """The shards of one group as a ShardedTensor; errors name the entries (and files)."""
    try:
        return ShardedTensor(_global(shards[0].descriptor), shards, partial=partial)
    except FormatError as exc:
        raise _set_error(group, labels, exc) from None


def _check_shard_entries(entries: Mapping[str, Descriptor]) -> None:
    """Refuse what a grouping reader refuses in one file (container.md §4.1), from the
    descriptors alone: a name that is a sharded tensor and an entry, and each group's
    shard set (partial sets allowed, as in one process's file). Writers call it before
    they write a byte, so that none writes a file its own reader rejects; ``verify`` calls
    it so that it rejects what ``load`` does."""
    _check_shard_names(entries)
    groups: dict[str, list[str]] = {}
    for name, d in entries.items():
        group = _shard_group(name, d) if name[-1:] == "]" else None
        if group is not None:
            groups.setdefault(group, []).append(name)
    for group, names in groups.items():
        descs = [entries[n] for n in names]
        try:
            check_set(_global(descs[0]), descs, partial=True)
        except FormatError as exc:
            raise _set_error(group, [f"entry {n!r}" for n in names], exc) from None


def _grouped(tensors: TensorFile) -> TensorFile:
    """``tensors`` with each sharded tensor's entries replaced by one partial ShardedTensor,
    at the place of its first shard (``tensors`` itself when there are none)."""
    groups: dict[str, list[str]] = {}
    for name, t in tensors.items():
        # The name first: most entries are decided without reading their descriptor.
        group = _shard_group(name, t.descriptor) if name[-1:] == "]" else None
        if group is not None:
            groups.setdefault(group, []).append(name)
    if not groups:
        return tensors
    _check_shard_names({name: t.descriptor for name, t in tensors.items()})
    out: dict[str, Tensor | ShardedTensor] = {}
    for name, t in tensors.items():
        group = _shard_group(name, t.descriptor)
        if group is None:
            out[name] = t
        elif group not in out:
            names = groups[group]
            # (a ShardedTensor's own descriptor has no shard section: it is never grouped)
            out[group] = _sharded(group, [t for n in names if isinstance(t := tensors[n], Tensor)],
                                  [f"entry {n!r}" for n in names], partial=True)
    return TensorFile(out, tensors.metadata, tensors.alignment)


def _load_files(paths: Sequence[Any], mmap: bool, verify: bool,
                opener: Callable[[Any, bool, bool], TensorFile] | None = None) -> TensorFile:
    """:func:`load` of several files, such as every rank's file of one checkpoint; each is
    read by ``opener`` (:func:`_load_file` by default)."""
    if not paths:
        raise UnsupportedError("hb.load() of a list needs at least one path")
    order: dict[str, None] = {}  # the names in the order they first appear
    plain: dict[str, tuple[Tensor, str]] = {}
    shards: dict[str, tuple[list[Tensor], list[str]]] = {}
    metas, alignment = [], MAX_BUFFER_ALIGNMENT
    for path in paths:
        where = _fspath(path, "path")
        f = (opener or _load_file)(path, mmap, verify)
        metas.append(f.metadata)
        alignment = min(alignment, f.alignment)
        for name, t in f.items():
            assert isinstance(t, Tensor)  # _load_file does not group
            group = _shard_group(name, t.descriptor)
            label = f"{where}: entry {name!r}"
            key = name if group is None else group
            other = plain[key][1] if key in plain else (
                shards[key][1][0] if group is None and key in shards else None)
            if other is not None:
                raise FormatError(
                    f"{label} and {other} both claim the name {key!r}; only the shards of a "
                    "sharded tensor (entries NAME[k]) may be spread over files: keep one "
                    "copy (save it from one process only)", field="name")
            order[key] = None
            if group is None:
                plain[name] = (t, label)
            else:
                ts, labels = shards.setdefault(group, ([], []))
                ts.append(t)
                labels.append(label)
    out: dict[str, Tensor | ShardedTensor] = {}
    for key in order:
        if key in plain:
            out[key] = plain[key][0]
            continue
        ts, labels = shards[key]
        st = _sharded(key, ts, labels, partial=True)
        if not st.is_complete:
            box = _missing_box(st.shape, st.boxes)
            at = (f"box {box} of global shape {list(st.shape)} is in no file given"
                  if box is not None else
                  f"the files given do not cover its global shape {list(st.shape)}")
            raise FormatError(
                f"sharded tensor {key!r}: {at}; pass every rank's file (one file alone "
                "loads as a partial set)", field="shards")
        out[key] = st
    meta = dict(metas[0])
    for m in metas[1:]:
        meta = {k: v for k, v in meta.items() if m.get(k) == v}
    return TensorFile(out, meta, alignment)


# ------------------------------------------------------------------- writing
class _Region:
    """``length`` bytes of the open file ``fd`` from ``offset``: a source for the writers.

    A region is read through a few small reused buffers (:class:`_DataWriter`),
    never mapped, so a conversion's memory does not grow with the file. It
    slices like the memoryview it stands for (``_trailing.written_pieces``
    takes both).
    """

    __slots__ = ("fd", "length", "offset")

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd = fd
        self.offset = offset
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, key: int | slice) -> Any:
        if isinstance(key, slice):
            start, stop, step = key.indices(self.length)
            if step != 1:
                raise ValueError("a file region slices with step 1 only")
            return _Region(self.fd, self.offset + start, max(0, stop - start))
        byte = bytearray(1)
        _pread_into(self.fd, memoryview(byte), self.offset + range(self.length)[key])
        return byte[0]

    def read(self, start: int, n: int) -> bytes:
        """``n`` bytes from ``start`` (``_trailing`` reads a bool8 region's this way)."""
        out = bytearray(n)
        _pread_into(self.fd, memoryview(out), self.offset + start)
        return bytes(out)


_Piece = memoryview | bytes | _Region


@interruptible
def _pread_into(fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``offset`` of ``fd`` (leaving its file position alone where possible)."""
    checkpoint()
    preadv = getattr(os, "preadv", None)
    got = 0
    while got < len(view):
        want = len(view) - got
        if preadv is not None:
            n = preadv(fd, [view[got:]], offset + got)
        else:  # no positional read here (Windows): the region's file is read by nobody else
            os.lseek(fd, offset + got, os.SEEK_SET)
            data = os.read(fd, want)
            n = len(data)
            view[got:got + min(n, want)] = data[:want]
        if not n:
            raise _truncated_read()
        if not 0 < n <= want:
            raise _bad_count("preadv", n, want)
        got += n


def _read_range(fd: int, start: int, stop: int) -> bytes:
    """The bytes [start, stop) of ``fd`` (a ``_Read`` for the checks of :func:`_verify_data`)."""
    buf = bytearray(max(0, stop - start))
    _pread_into(fd, memoryview(buf), start)
    return bytes(buf)


class _PlanEntry(NamedTuple):
    name_bytes: bytes
    descriptor_bytes: bytes
    sources: tuple[_Piece, ...]  # the bytes to write, in table order: one
    offsets: tuple[int, ...]  # piece per buffer, or two (_trailing.written_pieces)


@dataclass
class _Plan:
    entries: list[_PlanEntry]
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
        pack, pads, checksums = _ENTRY.pack, _NAME_PADS, self.checksums
        for e, crc in zip(self.entries, crcs, strict=True):
            nb = e.name_bytes
            parts += [pack(len(nb), len(e.descriptor_bytes), crc if checksums else 0, 0),
                      nb, pads[-len(nb) & 7], e.descriptor_bytes]
        parts.append(self.metadata)
        index = b"".join(parts)
        flags = FLAG_DATA_CHECKSUMS if self.checksums else 0
        header = bytearray(_HEADER.pack(
            MAGIC, VERSION[0], VERSION[1], flags, len(self.entries), self.n_metadata,
            HEADER_SIZE, self.table_length, HEADER_SIZE + self.table_length, len(self.metadata),
            self.data_offset, self.data_length, self.file_size, self.alignment,
            zlib.crc32(index), _ZERO44, 0))
        struct.pack_into("<I", header, _HEADER_CRC_AT, zlib.crc32(header[:_HEADER_CRC_AT]))
        pad = self.data_offset - HEADER_SIZE - len(index)
        return b"".join((header, index, bytes(pad)))


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
    if b"\x00" in raw:
        raise FormatError(f"{what} {name!r} contains NUL", field="name")
    return raw


def _encode_metadata(metadata: Mapping[str, str] | None) -> tuple[bytes, int]:
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
        item = _META.size + _pad8(len(k) + len(v))
        size += item
        if size > MAX_METADATA_BYTES:
            raise FormatError(f"metadata exceeds the limit of {MAX_METADATA_BYTES} bytes",
                              field="metadata")
        parts += [_META.pack(len(k), len(v)), k, v, bytes(item - _META.size - len(k) - len(v))]
    return b"".join(parts), len(metadata)


def _host_entries(name: str, value: Any) -> list[tuple[str, Tensor]]:
    """The entries a value becomes: itself, or ``NAME[k]`` per shard of a sharded tensor."""
    if not isinstance(value, (Tensor, ShardedTensor)):
        try:
            value = asarray(value)  # a torch DTensor gives this process's ShardedTensor
        except UnsupportedError as exc:
            raise UnsupportedError(f"entry {name!r}: {exc}") from exc
    if not isinstance(value, ShardedTensor):
        return [(name, _host_tensor(name, value))]
    if not len(value):
        raise UnsupportedError(f"entry {name!r} is a sharded tensor without shards; a file "
                               "holds a sharded tensor as its shards (give it an empty one)")
    return [(f"{name}[{k}]", _host_tensor(f"{name}[{k}]", t)) for k, t in enumerate(value)]


def _host_tensor(name: str, value: Any) -> Tensor:
    try:
        t = value if isinstance(value, Tensor) else asarray_one(value, what="a file entry")
    except UnsupportedError as exc:
        raise UnsupportedError(f"entry {name!r}: {exc}") from exc
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"entry {name!r} lives on {t.device}; Hurray files are written from host memory: "
            "copy it to the CPU first (tensor.cpu(), jax.device_get(x), cupy.asnumpy(x))")
    return t


def _dense_reader() -> Callable[[Any], tuple[DType, tuple[int, ...], memoryview] | None] | None:
    """``_host.dense_bytes`` once the host kernel is imported, else None (the core never
    imports it to save a file: no value can then be one of its arrays)."""
    if _numpy.loaded() is None:
        return None
    from ._host import dense_bytes
    return dense_bytes


def _plan(items: Sequence[tuple[str, Descriptor, Sequence[_Piece] | memoryview]],
          metadata: Mapping[str, str] | None, alignment: int, checksums: bool,
          keep_alive: Sequence[object]) -> _Plan:
    """Lay out a file: ``items`` are (name, descriptor, one byte view or file region per
    buffer), or (name, row-major descriptor from ``dense_descriptor``, the byte view of
    its one data buffer) for bytes written as they are (``_host.dense_bytes``)."""
    if (isinstance(alignment, bool) or not isinstance(alignment, int)
            or not BUFFER_ALIGNMENT <= alignment <= MAX_BUFFER_ALIGNMENT
            or alignment & (alignment - 1)):
        raise FormatError(f"alignment must be a power of two in [{BUFFER_ALIGNMENT}, "
                          f"{MAX_BUFFER_ALIGNMENT}], got {alignment!r}", field="alignment")
    meta, n_meta = _encode_metadata(metadata)
    entries, names, cursor, table = [], set(), 0, 0
    heads: dict[int, bytes] = {}  # id of a shared dense descriptor -> its encoded head
    for k, (name, d, sources) in enumerate(items):
        if not k & 1023:
            checkpoint()  # a file of many entries plans for seconds
        nb = _name_bytes(name, "entry name", MAX_NAME_BYTES)
        if name in names:
            raise FormatError(f"duplicate entry name {name!r}", field="name")
        names.add(name)
        if type(sources) is memoryview:
            # A dense entry whose bytes are written as they are: its descriptor's bytes
            # are the head shared by its shape and type, then its place (wire.dense_head;
            # d outlives the plan in dense_descriptor's cache and in items, so its id
            # names it).
            head = heads.get(id(d))
            if head is None:
                head = heads[id(d)] = dense_head(d)
            n = len(sources)
            cursor = -(-cursor // alignment) * alignment
            entries.append(_PlanEntry(nb, head + DENSE_PLACE.pack(cursor, n), (sources,),
                                      (cursor,)))
            table += _ENTRY.size + _pad8(len(nb)) + len(head) + DENSE_PLACE.size
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
                cursor = _align(cursor, alignment)
                offsets.append(cursor)
                cursor += len(s)
            else:
                offsets.append(0)
        desc = encode(d, offsets)
        if isinstance(sources[0], Pending):  # written elsewhere, whole bytes, one buffer
            entries.append(_PlanEntry(nb, desc, tuple(sources), tuple(offsets)))
            table += _ENTRY.size + _pad8(len(nb)) + len(desc)
            continue
        # Each buffer as the pieces to write: packed sub-byte data ends with zero bits.
        # (A file region slices like the view it stands for.)
        views = cast(Sequence[memoryview], sources)
        entries.append(_PlanEntry(nb, desc, *placed_pieces(d, views, offsets, name)))
        table += _ENTRY.size + _pad8(len(nb)) + len(desc)
    index_end = HEADER_SIZE + table + len(meta)
    data_offset = _align(index_end, max(PAGE_ALIGNMENT, alignment)) if cursor else index_end
    return _Plan(entries, meta, n_meta, alignment, checksums, table, data_offset, cursor,
                 keep_alive)


def _plan_tensors(mapping: Mapping[str, Any], metadata: Mapping[str, str] | None,
                  alignment: int, checksums: bool, *, defer: bool = False) -> _Plan:
    """The plan of a file of ``mapping``; with ``defer``, values whose adapter writes them
    from where their parts live (``_deferred``) are planned without reading them."""
    if sys.byteorder != "little":
        raise UnsupportedError("Hurray files are little-endian; this host is big-endian")
    if not isinstance(mapping, Mapping):
        raise UnsupportedError(f"expected a mapping of names to tensors, got "
                               f"{type(mapping).__name__}")
    items: list[tuple[str, Descriptor, Sequence[_Piece] | memoryview]] = []
    keep: list[object] = []
    deferred = []
    # The host kernel's plain arrays are planned from their type, shape and bytes, without
    # an hb.Tensor each (_host.dense_bytes says which); no such array exists unless the
    # kernel was imported.
    dense = _dense_reader()
    # (shape, type tag) -> descriptor: dense_descriptor's own key hashes the DType, whose
    # hash is Python code over all its fields.
    descriptors: dict[tuple[tuple[int, ...], int], Descriptor] = {}
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise UnsupportedError(f"entry names must be str, got {type(name).__name__} "
                                   f"{name!r}")
        parts = None if dense is None else dense(value)
        if parts is not None:
            dtype, shape, view = parts
            d = descriptors.get((shape, dtype.tag))
            if d is None:
                d = descriptors[shape, dtype.tag] = dense_descriptor(shape, dtype)
            keep.append(value)
            items.append((name, d, view))
            continue
        saver = deferred_save(type(value)) if defer else None
        if saver is not None:
            d = saver.describe(value)
            deferred.append((len(items), saver, value, d))
            # Not a piece to write: _plan places it, _write_deferred leaves it to the saver.
            items.append((name, d, [cast(_Piece, Pending(d.nbytes))]))
            continue
        for entry, t in _host_entries(name, value):
            keep.append(t)
            items.append((entry, t.descriptor, [t.memoryview(b.role) for b in t.buffers]))
    _check_shard_entries({name: d for name, d, _ in items})
    plan = _plan(items, metadata, alignment, checksums, keep)
    plan.deferred = deferred
    return plan


_RING = 4  # buffers in flight: one read, one checksummed, one written, one to spare
_WRITEBACK_BYTES = 32 << 20


@functools.lru_cache(maxsize=1)
def _start_writeback() -> Callable[[int, int, int], object] | None:
    """``start(fd, offset, length)``: have the kernel begin writing a range to the disk.

    Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait:
    a durable write calls it as it goes, so the disk works while the copy does
    and the final fsync (which alone makes the data durable) has little left to
    do. ``None`` where there is no such call.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return lambda fd, offset, length: fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE


_CHUNK_ALIGN = 2 << 20  # a huge page: where the chunks of a large write begin and end


def _chunk_length(at: int, n: int, cap: int) -> int:
    """How much of ``n`` bytes written at file offset ``at`` the next chunk of a writer with
    ``cap``-byte buffers takes: a chunk cut short of the end ends on a multiple of
    ``_CHUNK_ALIGN`` (with buffers at least that large).

    Writes that begin and end at huge-page boundaries let the page cache hold the file in
    large pages; 4 MiB chunks cut anywhere left it in small ones, and reading the file
    back through a memory map then took three times the page faults.
    """
    if cap < _CHUNK_ALIGN:
        return min(n, cap)
    return min(n, (at + cap) // _CHUNK_ALIGN * _CHUNK_ALIGN - at)


class _Chunk(NamedTuple):
    data: memoryview | bytes
    read: Future[None] | None  # the read that fills ``data`` from a file region, if any
    write: bool


class _Gather:
    """Regions of one file, near one another, and padding, to be read and written at once."""

    __slots__ = ("end", "fd", "ops", "start")

    def __init__(self, fd: int, start: int) -> None:
        self.fd, self.start, self.end = fd, start, start  # the span of the file read
        self.ops: list[tuple[int, int, int | None]] = []  # (at in the span or -1: zeros, n, slot)


_GATHER_GAP = 64 << 10  # bytes between two regions read (and dropped) to read them at once
_GATHER_OPS = 1024  # pieces of one gather, so the list of views stays short
_ZERO_PAD = memoryview(bytes(64 << 10))
_ZERO_PAD_BYTES = len(_ZERO_PAD)


class _DataWriter:
    """Writes a file's data in order, from memory and from file regions, checksumming it.

    It keeps ``slots`` CRC-32s (one per entry): :meth:`put` writes a piece and
    adds its bytes to a slot's CRC (or to none), :meth:`checksum` adds a
    region's bytes to a slot without writing them, :meth:`finish` waits for the
    last chunk and returns the CRCs. A region is read into one of a few reused
    buffers, checksummed and written from there: the checksum is that of
    exactly the bytes written, and the memory used does not grow with the file.

    From ``_THREADED_CRC_BYTES``, a large output goes through helper threads,
    one chunk behind the other: a helper reads, another computes the CRCs (or,
    with the compiled CRC-32, the reading one after each read), and the caller's
    thread writes (os.preadv, the CRC-32s and os.write release the GIL). Each
    stage keeps the chunks in order (one worker each), so each slot's CRC is
    chained in order.
    ``base`` is the file offset of the first byte written (the file position
    of ``fd``; with ``positional``, each chunk is written at its offset with
    os.pwrite instead), which progress counts from. ``stop``, once set, makes
    the next chunk raise :class:`_Stopped` (one half of :func:`_write_data`).
    With ``start`` (a half that begins inside an entry), the pieces it is given begin at
    file offset ``start`` and only their bytes in [base, base + total) are read, summed
    and written; a piece only checked (:meth:`checksum`) is checked by the half whose
    bytes it comes among.
    """

    def __init__(self, fd: int, base: int, total: int, slots: int, *, durable: bool,
                 progress: _PROGRESS | None, positional: bool = False,
                 threaded: bool | None = None, stop: threading.Event | None = None,
                 start: int | None = None, clip: bool = False) -> None:
        self.fd = fd
        self.positional = positional  # written with os.pwrite at its offsets (a split half)
        self.stop = stop  # set: the other half failed, give up at the next chunk
        self.summed: dict[int, int] = {}  # slot -> bytes summed here
        self.base = self.pos = self.unstarted = base  # unstarted: no writeback asked from here
        # Where the pieces given so far end (pos: where the written bytes do); with clip,
        # the bytes outside [base, base + total) are skipped.
        self.end = base if start is None else start
        self.clip = clip or start is not None
        self.total = total
        self.crcs = [0] * slots
        self.progress = progress
        self.writeback = _start_writeback() if durable else None
        if threaded is None:
            threaded = _THREADED_CRC_BYTES is not None and total >= _THREADED_CRC_BYTES
        self.reader = ThreadPoolExecutor(1, thread_name_prefix="hurray-read") if threaded else None
        # The checksums on a thread of their own (zlib's), or after each read on the reading
        # thread (the compiled CRC-32, ~15x faster): one worker each, so in order either way.
        self.summer = (None if not (threaded and slots) else self.reader if not _CRC_THREAD
                       else ThreadPoolExecutor(1, thread_name_prefix="hurray-crc"))
        self.depth = _RING if threaded else 1
        self.buffer_size = max(4096, min(_CHUNK, total))  # a small file gets a small buffer
        self.window: collections.deque[_Chunk] = collections.deque()
        self.sums: list[Future[None]] = []  # of chunks in memory (no buffer to wait for)
        self.ring: list[memoryview] = []
        self.busy: list[Future[None] | None] = []  # the CRC still reading each buffer
        self.turn = 0
        # Without helper threads, small regions of one file that follow each other, and the
        # padding between them, are read in one call and written in one: a file of many
        # small tensors would otherwise cost two system calls and a chunk's work each.
        self.gathers = self.reader is None and WRITES_VECTORS
        self.gather: _Gather | None = None
        # Likewise small pieces in memory, and the padding between them, wait here and are
        # written in one call (never while a gather is pending: each flushes the other).
        self.vectors: list[memoryview | bytes] = []
        self.vector_bytes = 0

    def __enter__(self) -> _DataWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        for pool in (self.reader, self.summer):  # the reads first: a CRC may wait for one
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    def _window(self, n: int) -> tuple[int, int]:
        """The part [a, b) of the next ``n`` bytes that this writer writes."""
        if not self.clip:
            return 0, n
        a = min(max(self.base - self.end, 0), n)
        return a, max(a, min(self.base + self.total - self.end, n))

    def pad_to(self, at: int) -> None:
        """Zeros up to file offset ``at`` (the alignment padding before a buffer)."""
        if at <= self.end:
            return
        a, b = self._window(at - self.end)
        self.end = at
        if a == b:
            return
        if b - a <= len(_ZERO_PAD):
            # Between two regions read at once, or pieces written at once, written with
            # them: a view of the one zero buffer, so padding takes no memory (a longer
            # run ends it).
            if self.gather is not None:
                self.gather.ops.append((-1, b - a, None))
                return
            if self.gathers:
                self._vector(_ZERO_PAD[:b - a])
                return
        self._flush_gather()
        self._queue(_Chunk(bytes(b - a), None, True))

    def put(self, src: _Piece, slot: int | None) -> None:
        n = len(src)
        a, b = self._window(n)
        at = self.end + a  # the file offset of the first byte written
        self.end += n
        if a == b:
            return  # (an empty buffer's offset means nothing: it is never read)
        if (a, b) != (0, n):
            src = src[a:b]
        if isinstance(src, _Region):
            if not (self.gathers and self._gathered(src, slot)):
                self._flush_gather()
                self._through(src, slot, write=True, at=at)
            return
        if self.gathers and len(src) < self.buffer_size:
            if self.gather is not None:
                self._flush_gather()
            if slot is not None:
                self._sum(slot, src, None, None)
            self._vector(src)
            return
        self._flush_gather()
        k = 0
        while k < len(src):
            chunk = src[k:k + _chunk_length(at + k, len(src) - k, self.buffer_size)]
            if slot is not None:
                self._sum(slot, chunk, None, None)
            self._queue(_Chunk(chunk, None, True))
            k += len(chunk)

    def put_at(self, at: int, src: _Piece, slot: int | None) -> None:
        """:meth:`pad_to` ``at``, then :meth:`put` ``src``: one step for the common piece
        of a file of many small tensors (bytes in memory, shorter than a buffer, written
        with others in one call), the two otherwise."""
        gap = at - self.end
        n = len(src)
        if (type(src) is not memoryview or self.clip or not self.gathers
                or self.gather is not None or not 0 <= gap <= _ZERO_PAD_BYTES
                or n >= self.buffer_size or self.summer is not None):
            self.pad_to(at)
            self.put(src, slot)
            return
        if gap:
            self._vector(_ZERO_PAD[:gap])
        self.end = at + n
        if slot is not None:
            self.summed[slot] = self.summed.get(slot, 0) + n
            self.crcs[slot] = _crc32(src, self.crcs[slot])
        self._vector(src)

    def checksum(self, src: _Region, slot: int) -> None:
        if not src.length or (self.clip and not self.base <= self.end < self.base + self.total):
            return  # (a split half: the other checks it)
        self._flush_gather()
        self._through(src, slot, write=False)

    def finish(self) -> list[int]:
        """The CRC-32 of each slot, once every chunk is written and summed."""
        self._flush_gather()
        while self.window:
            self._complete(self.window.popleft())
        for fut in itertools.chain(self.sums, self.busy):
            if fut is not None:
                fut.result()
        return self.crcs

    def _add(self, slot: int, chunk: memoryview | bytes, read: Future[None] | None) -> None:
        if read is not None:
            read.result()  # the bytes are in the buffer (or the read failed, and so does this)
        self.crcs[slot] = _crc32(chunk, self.crcs[slot])

    def _sum(self, slot: int, chunk: memoryview | bytes, read: Future[None] | None,
             buffer: int | None) -> None:
        self.summed[slot] = self.summed.get(slot, 0) + len(chunk)
        if self.summer is None:
            self._add(slot, chunk, read)
            return
        fut = self.summer.submit(self._add, slot, chunk, read)
        if buffer is None:
            self.sums.append(fut)
        else:
            self.busy[buffer] = fut  # the buffer is reused once this has run

    def _queue(self, chunk: _Chunk) -> None:
        self.window.append(chunk)
        if len(self.window) >= self.depth:  # so fewer than depth chunks are ever queued
            self._complete(self.window.popleft())

    def _complete(self, chunk: _Chunk) -> None:
        if chunk.read is not None:
            chunk.read.result()
        if self.stop is not None and self.stop.is_set():
            raise _Stopped
        if chunk.write:
            _write_all(self.fd, chunk.data, self.pos if self.positional else None)
            self._advance(len(chunk.data))

    def _buffer(self) -> tuple[int, memoryview]:
        """A free buffer. The chunk that used it last is ``depth`` or more chunks back, so it
        has left the window (it is written); its CRC is awaited here."""
        if not self.ring:
            self.ring = [memoryview(bytearray(self.buffer_size)) for _ in range(self.depth)]
            self.busy = [None] * self.depth
        j = self.turn % self.depth
        self.turn += 1
        fut = self.busy[j]
        if fut is not None:
            self.busy[j] = None
            fut.result()
        return j, self.ring[j]

    def _gathered(self, src: _Region, slot: int | None) -> bool:
        """Whether ``src`` joined the pending gather (a new one, if it is small enough)."""
        g, n = self.gather, src.length
        if n >= self.buffer_size:  # a buffer's worth: read alone
            return False
        if g is not None and (
                src.fd != g.fd or not 0 <= src.offset - g.end <= _GATHER_GAP
                or src.offset + n - g.start > self.buffer_size or len(g.ops) >= _GATHER_OPS):
            self._flush_gather()
            g = None
        if g is None:
            if self.vectors:
                self._flush_vectors()
            g = self.gather = _Gather(src.fd, src.offset)
        g.ops.append((src.offset - g.start, n, slot))
        g.end = src.offset + n
        return True

    def _vector(self, piece: memoryview | bytes) -> None:
        self.vectors.append(piece)
        self.vector_bytes += len(piece)
        if self.vector_bytes >= self.buffer_size or len(self.vectors) >= _GATHER_OPS:
            self._flush_vectors()

    def _flush_vectors(self) -> None:
        views, self.vectors = self.vectors, []
        total, self.vector_bytes = self.vector_bytes, 0
        if self.stop is not None and self.stop.is_set():
            raise _Stopped
        _write_vectors(self.fd, cast(list[memoryview], views),
                       self.pos if self.positional else None)
        self._advance(total)

    def _flush_gather(self) -> None:
        """Write what waits: the pending gather (its span read in one call, its regions
        summed, written in one) or the pending pieces in memory (written in one)."""
        if self.vectors:
            self._flush_vectors()
        g, self.gather = self.gather, None
        if g is None:
            return
        _, buf = self._buffer()
        span = buf[:g.end - g.start]
        _pread_into(g.fd, span, g.start)
        views, total = [], 0
        for at, n, slot in g.ops:
            if at < 0:
                piece = _ZERO_PAD[:n]
            else:
                piece = span[at:at + n]
                if slot is not None:
                    self._sum(slot, piece, None, None)
            views.append(piece)
            total += n
        if self.stop is not None and self.stop.is_set():
            raise _Stopped
        _write_vectors(self.fd, views, self.pos if self.positional else None)
        self._advance(total)

    def _through(self, src: _Region, slot: int | None, *, write: bool,
                 at: int = 0) -> None:
        off, end = src.offset, src.offset + src.length
        while off < end:
            j, buf = self._buffer()
            view = buf[:_chunk_length(at + off - src.offset, end - off, len(buf))]
            read = None
            if self.reader is None:
                _pread_into(src.fd, view, off)
            else:
                read = self.reader.submit(_pread_into, src.fd, view, off)
            if slot is not None:
                self._sum(slot, view, read, j)
            self._queue(_Chunk(view, read, write))
            off += len(view)

    def _advance(self, n: int) -> None:
        self.pos += n
        if self.writeback is not None and self.pos - self.unstarted >= _WRITEBACK_BYTES:
            self.writeback(self.fd, self.unstarted, self.pos - self.unstarted)
            self.unstarted = self.pos
        if self.progress is not None:
            self.progress(self.pos - self.base, self.total)


class _Stopped(Exception):
    """The other half of a split write failed: this half stops (its error is the one raised)."""


# One item of a data region: (file offset where its bytes, padding first, begin; feed), where
# feed(writer) puts the item's pieces, in order. A split never cuts an item.
_Item = tuple[int, Callable[["_DataWriter"], None]]


def _split_point(items: Sequence[_Item], base: int, total: int) -> tuple[int, int, int] | None:
    """Where a split write of ``items`` cuts [base, base + total), or None: (the end of the
    first half's items, the start of the second's, the file offset of the second half's
    first byte). Between two items near the middle, else inside the item that holds the
    middle: both halves are then given it, each writing its own bytes of it."""
    if (_SPLIT_BYTES is None or total < _SPLIT_BYTES or not items
            or not hasattr(os, "preadv") or not hasattr(os, "pwrite")):
        return None  # without positional reads and writes, two threads would share a position
    middle = base + total // 2
    if len(items) > 1:
        k = min(range(1, len(items)), key=lambda j: abs(items[j][0] - middle))
        if abs(items[k][0] - middle) <= total / 4:
            return k, k, items[k][0]
    # The halves meet at a huge page where one lies between (see _chunk_length), else at
    # a page, else anywhere.
    mid = next((m for m in (middle - middle % _CHUNK_ALIGN, middle - middle % 4096, middle)
                if m > base), middle)
    if not base < mid < base + total:
        return None  # fewer than two bytes
    return _cut_at(items, mid)


def _cut_at(items: Sequence[_Item], mid: int) -> tuple[int, int, int]:
    """:func:`_split_point`'s answer for a cut at file offset ``mid`` (after the first
    item's offset): between two items if one starts there, else inside the one before."""
    j = bisect.bisect_right([at for at, _ in items], mid) - 1
    return (j, j, mid) if items[j][0] == mid else (j + 1, j, mid)


def _write_data(fd: int, base: int, total: int, slots: int, items: Sequence[_Item], *,
                durable: bool, progress: _PROGRESS | None) -> list[int]:
    """Write the data region [base, base + total) of ``fd`` from ``items``; the slots' CRCs.

    A large region is written in two halves at once (:data:`_SPLIT_BYTES`), the second by a
    helper thread with its own writer, at their offsets; a slot summed in both halves (an
    entry the cut goes through) gets the CRC of its two parts combined. Otherwise one
    :class:`_DataWriter` writes it all from the file position ``base``.
    """
    split = _split_point(items, base, total)
    if split is None:
        with _DataWriter(fd, base, total, slots, durable=durable, progress=progress) as out:
            for _, feed in items:
                feed(out)
            return out.finish()
    first_end, second_start, mid = split
    inside = first_end != second_start  # the cut goes through an item
    done = [0, 0]
    lock = threading.Lock()

    def report(half: int) -> _PROGRESS | None:
        if progress is None:
            return None

        def add(n: int, _total: int) -> None:
            with lock:
                done[half] = n
                progress(done[0] + done[1], total)
        return add

    stop = threading.Event()
    halves = [_DataWriter(fd, base, mid - base, slots, durable=durable, progress=report(0),
                          positional=True, threaded=False, stop=stop, clip=inside),
              _DataWriter(fd, mid, base + total - mid, slots, durable=durable,
                          start=items[second_start][0] if inside else None,
                          progress=report(1), positional=True, threaded=False, stop=stop)]
    crcs: list[list[int]] = [[], []]
    failed: list[BaseException] = []

    def run(half: int, part: Sequence[_Item]) -> None:
        try:
            with halves[half] as out:
                for _, feed in part:
                    feed(out)
                crcs[half] = out.finish()
        except _Stopped:
            pass
        except BaseException as exc:
            stop.set()
            failed.append(exc)

    ended = threading.Lock()
    ended.acquire()
    finished: list[bool] = []  # set before the release: the flag is what the wait trusts

    def second_half() -> None:
        try:
            run(1, items[second_start:])
        finally:
            finished.append(True)
            ended.release()

    helper = threading.Thread(target=second_half, name="hurray-write", daemon=True)
    helper.start()
    signalled: BaseException | None = None
    try:
        run(0, items[:first_end])
    except BaseException as exc:  # (run keeps its own errors: this is a signal between them)
        stop.set()
        signalled = exc
    # No write may follow the return: the caller then closes the descriptor (whose number
    # the next open reuses) and removes the file. So a signal that arrives while the helper
    # is waited for (KeyboardInterrupt) stops it, and is raised once it has ended. (Waited
    # for on a lock of its own: Python 3.11 marks a thread ended when its join is
    # interrupted, while it still runs. A signal may also land once the lock is taken,
    # before the loop sees it: the flag ends the loop, and the timeout bounds a wait on
    # a lock this thread then holds itself.)
    while not finished:
        try:
            ended.acquire(timeout=0.05)
        except BaseException as exc:
            stop.set()
            signalled = signalled or exc
    helper.join()
    if signalled is not None:
        raise signalled
    if failed:
        raise failed[0]
    first, second = crcs
    for slot, n in halves[1].summed.items():
        first[slot] = (_crc32_combine(first[slot], second[slot], n)
                       if slot in halves[0].summed else second[slot])
    return first


def _write_plan(path: str | os.PathLike[str], plan: _Plan, *, fsync: bool,
                progress: _PROGRESS | None = None,
                check: Callable[[Sequence[int]], None] | None = None,
                sums: bool = False) -> None:
    """Write ``plan`` to ``path``, atomically. ``check(crcs)`` runs once every byte is
    written, and an error it raises leaves ``path`` as it was; with ``sums`` the data
    checksums it gets are computed even when the file stores none."""
    slots = len(plan.entries) if plan.checksums or sums else 0
    items: list[_Item] = []
    end = plan.data_offset  # where the bytes of the entries so far end

    def feeder(i: int, e: _PlanEntry) -> Callable[[_DataWriter], None]:
        def feed(out: _DataWriter) -> None:
            for src, off in zip(e.sources, e.offsets, strict=True):
                if len(src):
                    out.pad_to(plan.data_offset + off)
                    out.put(src, i if slots else None)
        return feed

    with collection_paused():
        for i, e in enumerate(plan.entries):
            if len(e.sources) == 1:
                # (a partial costs a third of a closure; most entries have one piece)
                src = e.sources[0]
                if len(src):
                    at = plan.data_offset + e.offsets[0]
                    items.append((end, functools.partial(_put_one, at, src,
                                                         i if slots else None)))
                    end = at + len(src)
                else:
                    items.append((end, _put_none))
                continue
            items.append((end, feeder(i, e)))
            for src, off in zip(e.sources, e.offsets, strict=True):
                if len(src):
                    end = plan.data_offset + off + len(src)
    with atomic_output(path, fsync=fsync) as fd:
        # The data first, checksummed as it goes; the head, which holds the
        # checksums, last. Its size is known in advance, so one pass suffices.
        os.lseek(fd, plan.data_offset, os.SEEK_SET)
        crcs = _write_data(fd, plan.data_offset, plan.data_length, slots, items,
                           durable=fsync, progress=progress) or [0] * len(plan.entries)
        if check is not None:
            check(crcs)
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, plan.head(crcs))


def _put_one(at: int, src: _Piece, slot: int | None, out: _DataWriter) -> None:
    """The feed of an entry of one piece, at file offset ``at``."""
    out.put_at(at, src, slot)


def _put_none(out: _DataWriter) -> None:
    """The feed of an entry without bytes."""


def _write_deferred(path: str | os.PathLike[str], plan: _Plan, *, fsync: bool) -> None:
    """Write ``plan``, whose deferred entries the processes holding their parts write into
    the preallocated temporary (``_deferred``), atomically."""
    with atomic_temporary(path, fsync=fsync) as (fd, tmp):
        os.ftruncate(fd, plan.file_size)  # the gaps and padding read as zeros
        st = os.fstat(fd)
        crcs = [0] * len(plan.entries)
        pending = {i for i, *_ in plan.deferred}
        for i, e in enumerate(plan.entries):
            if i in pending:
                continue
            for src, off in zip(e.sources, e.offsets, strict=True):
                if len(src):
                    os.lseek(fd, plan.data_offset + off, os.SEEK_SET)
                    _write_all(fd, src)
                    if plan.checksums:
                        crcs[i] = _crc32(src, crcs[i])
        target = FileTarget(tmp, st.st_dev, st.st_ino, plan.file_size)
        by_saver: dict[int, tuple[Any, list[int], list[Job]]] = {}
        for i, saver, value, d in plan.deferred:
            e = plan.entries[i]
            _, index, jobs = by_saver.setdefault(id(saver), (saver, [], []))
            index.append(i)
            jobs.append(Job(value, plan.data_offset + e.offsets[0], d, e.name_bytes.decode()))
        for saver, index, jobs in by_saver.values():
            written = saver.write(target, jobs, plan.checksums)
            for i, job, runs in zip(index, jobs, written, strict=True):
                crcs[i] = _combined(plan.entries[i], job.offset, runs)
        os.lseek(fd, 0, os.SEEK_SET)
        _write_all(fd, plan.head(crcs))


def write_box(target: FileTarget, job: Job, start: Sequence[int], stop: Sequence[int],
              data: Any, checksums: bool) -> list[Run]:
    """Write one chunk of a deferred entry, its box ``[start, stop)``, whose row-major bytes
    are ``data`` (any buffer), into ``target``; the runs written.

    Runs in the process that holds the chunk (``job.value`` is not used here). The bytes
    are checked and masked as every save's are (a bool8 byte that is no bool8 value is
    refused; padded sub-byte elements are written with their high bits clear). The
    temporary is opened for writing by name, never created, and refused unless it is the
    planned file.
    """
    d = job.descriptor
    itemsize = d.dtype.itemsize
    view = memoryview(data).cast("B")
    volume = itemsize
    for a, b in zip(start, stop, strict=True):
        volume *= max(b - a, 0)
    if len(view) != volume:
        raise FormatError(
            f"entry {job.name!r}: a chunk of box {list(start)}..{list(stop)} holds {len(view)} "
            f"bytes, but the box needs {volume} ({itemsize}-byte elements): the chunk's shape "
            "or type is not the one the file was planned with (check the array's chunks and "
            "dtype)", field="chunk")
    if volume and (d.padded or d.dtype == bool8):
        flat = Descriptor((volume // itemsize,), d.dtype, padded=d.padded)
        (pieces,) = written_pieces(flat, [view], f"{job.name} (the chunk at {list(start)})")
        if len(pieces) > 1 or pieces[0] is not view:
            view = memoryview(b"".join(bytes(p) for p in pieces))
    try:
        fd = os.open(target.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise UnsupportedError(
            f"the save's temporary {target.path!r} cannot be opened here: this process does "
            "not see the saving process's file system; save where every worker sees that "
            "path (a shared file system, or a cluster on this machine)") from None
    runs = []
    try:
        st = os.fstat(fd)
        if ((st.st_dev, st.st_ino, st.st_size) != target[1:]
                or not stat.S_ISREG(st.st_mode)):
            raise UnsupportedError(
                f"{target.path!r} here is not the save's temporary (device {st.st_dev}, inode "
                f"{st.st_ino}, {st.st_size} bytes; planned {target.device}, {target.inode}, "
                f"{target.size}): another file system holds that path; save where every "
                "worker sees the same file")
        at = 0
        for offset, length in box_runs(d.shape, itemsize, start, stop):
            pos, crc = job.offset + offset, 0
            # In cache-sized slices: each checksummed right before it is written.
            for cut in range(0, length, _CHUNK):
                piece = view[at + cut:at + min(length, cut + _CHUNK)]
                if checksums:
                    crc = _crc32(piece, crc)
                done = 0
                while done < len(piece):
                    n = os.pwrite(fd, piece[done:], pos + cut + done)
                    if n <= 0:
                        raise _bad_count("pwrite", n, len(piece) - done)
                    done += n
            runs.append(Run(pos, length, crc))
            at += length
    finally:
        os.close(fd)
    return runs


def _combined(e: _PlanEntry, start: int, runs: Sequence[Run]) -> int:
    """The CRC-32 of a deferred entry from its runs, which must tile its bytes exactly."""
    crc, pos, end = 0, start, start + len(e.sources[0])
    for r in sorted(runs):
        if r.offset != pos:
            what = "overlap" if r.offset < pos else "leave a gap"
            raise FormatError(
                f"entry {e.name_bytes.decode()!r}: the chunks written {what} at file offset "
                f"{min(pos, r.offset)}; each byte must be written once (the chunks must tile "
                "the array)", field="chunks")
        crc = _crc32_combine(crc, r.crc, r.length)
        pos += r.length
    if pos != end:
        raise FormatError(
            f"entry {e.name_bytes.decode()!r}: the chunks written end at file offset {pos}, "
            f"the entry at {end}; each byte must be written once (the chunks must tile the "
            "array)", field="chunks")
    return crc


def rewrite(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
            alignment: int = BUFFER_ALIGNMENT, checksums: bool = True, fsync: bool = True,
            verify: bool = True, progress: _PROGRESS | None = None) -> int:
    """Write the Hurray file ``src`` again as ``dst`` with another buffer ``alignment``,
    with or without data checksums; returns the number of tensors, as :func:`load`
    counts them (a sharded tensor's entries count once).

    Names, descriptors, metadata and every tensor's bytes carry over, in the file's
    order. The data is read in chunks, never mapped, so memory stays flat whatever the
    file's size. With ``verify`` (the default) every byte of ``src`` is checked as
    :func:`verify` checks it, in the same pass as the copy, and a defect raises before
    ``dst`` is replaced. The shard sets of a file with sharded tensors are checked as
    :func:`load` checks them. A safetensors file (which :func:`load` knows by its
    content) is converted as ``safetensors_io.safetensors_to_hurray`` converts it.
    """
    check_suffix(dst, "hurray")
    if sys.byteorder != "little":
        raise UnsupportedError("Hurray files are little-endian; this host is big-endian")

    with _open_regular(src, "src") as f:
        head = f.read(16)
        f.seek(0)
        if head[:4] != MAGIC and looks_like_safetensors(head):
            # Safetensors content (load reads a file by what it holds): converted as a
            # safetensors input is, its bytes read in chunks, never mapped.
            plan, count = _safetensors_plan(f, alignment, checksums)
            _write_plan(dst, plan, fsync=fsync, progress=progress)
            return count
        h, entries, meta = _read_head(f)
        order, count = _as_loaded(entries)  # as load then save would write them
        shard_sets = None
        if any(_shard_group(e.name, e.descriptor) is not None for e in entries):
            shard_sets = functools.partial(_check_shard_entries,
                                           {e.name: e.descriptor for e in entries})
        fd = f.fileno()
        read = functools.partial(_read_range, fd)
        regions = [[_Region(fd, h.data_offset + b.offset, b.length) for b in e.buffers]
                   for e in entries]
        if shard_sets is not None and not verify:
            shard_sets()  # a load checks them whether or not it verifies
        try:
            plan = _plan([(name, e.descriptor, regions[e.position]) for e, name in order],
                         meta or None, alignment, checksums, [])
        except FormatError:
            if verify:
                # The plan's refusals (a byte that is no bool8 value, which it reads; a name
                # that renumbered shards clash with) are a save's: what load(verify=True)
                # finds first (damage, then a bad shard set) is the error, as it reports it.
                _verify_file(f, h, entries)
                if shard_sets is not None:
                    shard_sets()
            raise
        out = {e.position: i for i, (e, _) in enumerate(order)}  # input entry -> output
        sums = bool(h.flags & FLAG_DATA_CHECKSUMS)

        def check(crcs: Sequence[int]) -> None:  # in the order load(verify=True) checks
            if sums:
                for e in entries:
                    i, r = out[e.position], regions[e.position]
                    # A buffer written with bits cleared (trailing bits, padded high bits)
                    # was summed as written: the file's own bytes are summed again.
                    src = plan.entries[i].sources
                    same = len(src) == len(r) and all(a is b for a, b in zip(src, r))
                    crc = crcs[i] if same else _regions_crc(r)
                    _check_checksum(e, crc)
            _check_padding_and_bits(read, h, entries)
            if shard_sets is not None:
                shard_sets()  # after the bytes, as a load checks them

        if verify:
            _check_head_padding(read, h)
        _write_plan(dst, plan, fsync=fsync, progress=progress,
                    check=check if verify else None, sums=verify and sums)
    return count


def _safetensors_plan(f: Any, alignment: int, checksums: bool) -> tuple[_Plan, int]:
    """The plan of the Hurray file that the open safetensors file ``f`` converts to (its
    tensors read from ``f`` in chunks when written), and its number of tensors."""
    idx, descriptors = read_header_and_descriptors(f)
    fd, start = f.fileno(), idx.data_start
    items = [(e.name, d, [_Region(fd, start + e.begin, e.end - e.begin)])
             for e, d in zip(idx.entries, descriptors, strict=True)]
    return _plan(items, idx.metadata, alignment, checksums, []), len(items)


def _as_loaded(entries: Sequence[EntryInfo]) -> tuple[list[tuple[EntryInfo, str]], int]:
    """The entries in the order and under the names that :func:`load` then :func:`save`
    give them (each sharded tensor's shards at the place of its first, in table order,
    numbered from 0), and the number of tensors that load counts."""
    groups: dict[str, list[EntryInfo]] = {}
    keys: list[str | EntryInfo] = []
    for e in entries:
        group = _shard_group(e.name, e.descriptor)
        if group is None:
            keys.append(e)
        else:
            if group not in groups:
                groups[group] = []
                keys.append(group)
            groups[group].append(e)
    order: list[tuple[EntryInfo, str]] = []
    for k in keys:
        if isinstance(k, str):
            order += [(e, f"{k}[{i}]") for i, e in enumerate(groups[k])]
        else:
            order.append((k, k.name))
    return order, len(keys)


def _regions_crc(regions: Sequence[_Region], buf: memoryview | None = None) -> int:
    """CRC-32 of the regions' bytes in order, read in pieces of ``buf`` (a buffer of at
    most 4 MiB, the regions' size, by default)."""
    if buf is None or not len(buf):
        buf = memoryview(bytearray(min(4 << 20, max(1, sum(len(r) for r in regions)))))
    crc = 0
    for r in regions:
        for at in range(0, len(r), len(buf)):
            n = min(len(buf), len(r) - at)
            _pread_into(r.fd, buf[:n], r.offset + at)
            crc = _crc32(buf[:n], crc)
    return crc


def _serialise(plan: _Plan) -> bytes:
    parts: list[Any] = [b""]
    crcs, pos = [], 0
    for e in plan.entries:
        crc = 0
        for src, off in zip(e.sources, e.offsets, strict=True):
            if not len(src):
                continue
            assert not isinstance(src, _Region)  # dumps plans tensors in memory only
            if off > pos:
                parts.append(bytes(off - pos))
            parts.append(src)
            if plan.checksums:
                crc = _crc32(src, crc)
            pos = off + len(src)
        crcs.append(crc)
    parts[0] = plan.head(crcs)
    return b"".join(parts)


def save(path: str | os.PathLike[str], mapping: Mapping[str, Any],
         metadata: Mapping[str, str] | None = None, *, alignment: int = BUFFER_ALIGNMENT,
         checksums: bool = True, fsync: bool = True) -> None:
    """Write ``{name: tensor}`` to a Hurray file, atomically.

    Values are ``hb.Tensor`` or anything :func:`hb.asarray` accepts, in host
    memory (device tensors raise :class:`UnsupportedError`: copy them to the
    CPU first). Every layout a descriptor describes is stored as it is: a
    strided tensor's span, sparse and quantized tensors' every buffer, packed or
    padded sub-byte data. ``metadata`` is an optional ``{str: str}``.
    ``checksums`` stores a CRC-32 of each entry's bytes (checked by
    :func:`verify` and ``load(verify=True)``); ``alignment`` raises the buffer
    alignment above 64 bytes; ``fsync=False`` skips the flushes that make the
    write durable (it stays atomic).

    ``path`` must not name another format (``.safetensors``, ``.npy``,
    ``.npz``: a :class:`FormatError`; write safetensors with
    :func:`hurray_bridge.safetensors_io.save`), and must be missing or a regular
    file (a FIFO or device is an :class:`UnsupportedError`); a replaced file's
    permission bits are kept. See :func:`atomic_output`.
    """
    check_suffix(_fspath(path, "path"), "hurray")
    with collection_paused():
        plan = _plan_tensors(mapping, metadata, alignment, checksums, defer=True)
    if plan.deferred:
        _write_deferred(path, plan, fsync=fsync)
    else:
        _write_plan(path, plan, fsync=fsync)


def dumps(mapping: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
          alignment: int = BUFFER_ALIGNMENT, checksums: bool = True) -> bytes:
    """The bytes :func:`save` would write, as a ``bytes`` object."""
    with collection_paused():
        plan = _plan_tensors(mapping, metadata, alignment, checksums)
    return _serialise(plan)
