"""Reading Hurray and safetensors files: ``hb.load``, ``hb.loads`` and ``verify``.

Reading treats the file as hostile: the index is read and checked by
:mod:`~hurray_bridge.files.format` before any tensor points at the data, the data checks
(``verify=True``) are :mod:`~hurray_bridge.files.data_checks`'. With ``mmap=True`` the
tensors point into one map of the file (:mod:`~hurray_bridge.files.mapping`); with
``mmap=False`` they are read into fresh memory by positional reads
(:mod:`~hurray_bridge.files.pread`). Sharded tensors' entries are grouped by
:mod:`~hurray_bridge.files.sharded`.
"""

from __future__ import annotations

import ctypes
import functools
import io
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from .._copy_policy import check_copy
from .._gc import collection_paused
from .._memory import alloc_aligned
from ..errors import CopyRequiredError, FormatError, UnsupportedError
from ..layout import BufferRole
from ..shards import ShardedTensor, missing_box
from ..tensor import CPU, Buffer, Tensor
from ..wire import BufferEntry
from .checksums import crc32
from .data_checks import (
    check_checksum,
    check_head_padding,
    check_padding_and_bits,
    check_size,
    verify_data,
    verify_file,
)
from .disk import fspath, open_regular, open_regular_raw, readinto_full
from .format import (
    BUFFER_ALIGNMENT,
    HEADER_SIZE,
    MAGIC,
    MAX_BUFFER_ALIGNMENT,
    EntryInfo,
    FileIndex,
    Header,
    check_index_crc,
    compiled_reader,
    compiled_tensors,
    index_from,
    parse_header,
    parse_index,
    parse_metadata,
    read_head,
    read_raw_index,
)
from .mapping import MapOwner, map_file, pow2_alignment, tensors_over, unmap
from .pread import pread_into, read_all, read_range, truncated_read
from .safetensors_header import (
    LENGTH,
    header_bytes,
    looks_like_safetensors,
    read_header_and_descriptors,
    read_metadata,
    read_prefix,
)
from .safetensors_header import compiled_reader as compiled_safetensors_reader
from .safetensors_header import compiled_tensors as compiled_safetensors
from .sharded import check_shard_entries, grouped, shard_group, sharded_tensor
from .tensor_file import TensorFile

__all__ = ["CHECKPOINT_OPENERS", "copy_tensors", "file_reader", "load", "load_file", "load_files",
           "load_safetensors", "loads", "verify"]



def file_reader(f: io.BufferedIOBase, data_start: int) -> Callable[[int, memoryview], None]:
    """``read(offset, dest)`` for :func:`copy_tensors`: fill ``dest`` from ``data_start + offset``.

    A file that ends early was cut (or changed) after its index was read.
    """
    def read(offset: int, dest: memoryview) -> None:
        f.seek(data_start + offset)
        if readinto_full(f, dest) < len(dest):
            raise truncated_read()

    return read


def copy_tensors(entries: Sequence[EntryInfo],
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
                  check: Header | None = None) -> dict[str, Tensor]:
    """Tensors in fresh 64-byte aligned memory read from the open file ``f`` (``load(mmap=
    False)``): large positional reads on a few threads (:mod:`.pread`), no copy between.

    With ``check`` (the file's header: ``verify=True``), every byte is checked as
    :func:`verify` checks it, in the same order, but the checksums are computed over the
    memory just read: the file is read once, not once to check and once to load.
    """
    out, jobs = _fresh_tensors(entries)
    fd = f.fileno()
    read = functools.partial(read_range, fd)
    if check is not None:
        check_head_padding(read, check)
    read_all(fd, [(data_start + off, dest) for off, dest in jobs], pread_into)
    if check is not None:
        dests = iter([dest for _, dest in jobs])  # in entry and buffer order, as allocated
        for e in entries:
            crc = 0
            for b in e.buffers:
                if b.length:
                    dest = next(dests)
                    if e.checksum is not None:
                        crc = crc32(dest, crc)
            check_checksum(e, crc)
        check_padding_and_bits(read, check, entries)
        check_size(fd, check)
    return out


def verify(path: str | os.PathLike[str]) -> FileIndex:
    """Check every byte of a file: the structure, the data checksums and all padding.

    Returns the index on success; raises :class:`FormatError` naming the entry
    and field of the first defect otherwise.
    """
    with open_regular(path) as f:
        h, entries, meta = read_head(f)
        verify_file(f, h, entries)
    check_shard_entries({e.name: e.descriptor for e in entries})  # after the bytes, as load
    return index_from(h, entries, meta)


# What hb.load of a folder or a checkpoint index calls (None: ``path`` is no such thing).
# checkpoint_dir, which imports this module, adds its reader here as the package is imported:
# an import of it from here would be a cycle.
CHECKPOINT_OPENERS: list[Callable[[Any, bool, bool], TensorFile | None]] = []


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
        return load_files(path, mmap, verify)
    for opener in CHECKPOINT_OPENERS:
        checkpoint = opener(path, mmap, verify)
        if checkpoint is not None:
            return checkpoint
    # (a byte buffer, outside the annotation, reaches os.fspath, whose TypeError names it)
    return grouped(load_file(path, mmap, verify))  # type: ignore[arg-type]


def load_file(path: str | os.PathLike[str], mmap: bool, verify: bool) -> TensorFile:
    """One file's entries as they are (shards one by one): the body of :func:`load`."""
    f, st = open_regular_raw(path)
    with f:
        head = os.pread(f.fileno(), 16, 0)
        if head[:4] != MAGIC and looks_like_safetensors(head):
            return load_safetensors(f, os.fspath(path), mmap=mmap, verify=verify, st=st)
        with collection_paused():
            h, index = read_raw_index(f, st.st_size)
        if mmap and not verify and h.data_length and compiled_reader():
            fast = _mapped_hurray(f, os.fspath(path), h, index, st)
            if fast is not None:
                return fast
        with collection_paused():
            entries, meta = parse_index(h, index)
        if not mmap:
            tensors = _read_tensors(f, entries, h.data_offset, h if verify else None)
            return TensorFile(tensors, meta, BUFFER_ALIGNMENT)
        if h.data_length == 0 and not verify:
            # Nothing to map: every tensor is empty and points nowhere.
            return TensorFile(tensors_over(entries, 0, None, True), meta, h.alignment)
        owner = map_file(f, h.file_size, os.fspath(path),
                         (lambda view: verify_data(view, h, entries)) if verify else None, st=st)
    # A page-aligned map: every buffer is aligned as the file says.
    alignment = pow2_alignment(owner.address + h.data_offset, h.alignment)
    with collection_paused():
        tensors = tensors_over(entries, owner.address + h.data_offset, owner, True)
    return TensorFile(tensors, meta, alignment)


def _mapped_hurray(f: Any, path: str, h: Header, index: memoryview,
                   st: os.stat_result) -> TensorFile | None:
    """:func:`load_file` (mapped, without ``verify``) of a file whose entries are all plain
    dense tensors, read by the compiled reader (``format.compiled_tensors``) straight into
    tensors over the map: no entry or buffer object per tensor. ``None`` (the map closed
    again) where it declines or the module was not built: :func:`parse_index` then reads
    the index, so that every refusal is its own, in its order."""
    check_index_crc(h, index)  # parse_index's first refusal, the same
    owner = map_file(f, h.file_size, path, st=st)
    tensors = None
    try:
        with collection_paused():
            tensors = compiled_tensors(h, index, owner.address + h.data_offset, owner)
        if tensors is None:
            unmap(owner)
            return None
        meta = parse_metadata(h, index)
    except BaseException:
        _drop_then_unmap(tensors, owner)
        raise
    # A page-aligned map: every buffer is aligned as the file says.
    return TensorFile(tensors, meta, pow2_alignment(owner.address + h.data_offset, h.alignment))


def _drop_then_unmap(tensors: dict[str, Tensor] | None, owner: MapOwner) -> None:
    """Close the map of a load that failed after its tensors were built (a bad metadata
    block): they are emptied out of their dict first, since the traceback keeps the
    loader's frame, and with it that dict, alive; a tensor read from there after the
    map closed would read unmapped memory. Nothing else has seen them."""
    if tensors is not None:
        tensors.clear()
    unmap(owner)


def load_safetensors(f: Any, path: str, *, mmap: bool = True,
                     verify: bool = False, st: os.stat_result | None = None) -> TensorFile:
    """A safetensors file, opened as ``f`` (a regular file at offset 0), as a ``TensorFile``.

    What :func:`hurray_bridge.load` returns for a safetensors file: the tensors
    point into one copy-on-write memory map of the file, read-only as :func:`load`'s
    (``mmap=False``: each is read into fresh, writable, 64-byte aligned memory)
    and ``metadata`` is its ``__metadata__``. The format has no checksums, so ``verify=True`` checks
    what every load checks: the header and that each tensor's bytes are there.
    """
    if sys.byteorder != "little":
        raise UnsupportedError("safetensors is little-endian; this host is big-endian")
    if mmap and compiled_safetensors_reader():
        fast = _mapped_compiled(f, path, st)
        if fast is not None:
            return fast
        f.seek(0)
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
        return TensorFile(tensors_over(entries, 0, None, True), dict(idx.metadata),
                          BUFFER_ALIGNMENT)
    owner = map_file(f, idx.file_size, path, st=st)
    base = owner.address + idx.data_start
    # safetensors places tensors back to back: the guaranteed alignment is what they share
    alignment = BUFFER_ALIGNMENT
    unaligned = 0
    for e in idx.entries:
        if e.end > e.begin:
            alignment = pow2_alignment(base + e.begin, alignment)
            unaligned += (base + e.begin) % BUFFER_ALIGNMENT != 0
    owner.unaligned = (unaligned, len(idx.entries))
    with collection_paused():
        tensors = tensors_over(entries, base, owner, True)
    return TensorFile(tensors, dict(idx.metadata), alignment)


def _mapped_compiled(f: Any, path: str, st: os.stat_result | None) -> TensorFile | None:
    """:func:`load_safetensors` of a header in the form safetensors' writer gives it, read
    by the compiled reader (``compiled_tensors``) straight into tensors over the map: no
    index, entry or descriptor object per tensor. ``None`` (the map closed again) where the
    reader declines or the module was not built: the Python path then reads it all, so
    that every refusal is its own, in its order."""
    prefix, size = read_prefix(f, None if st is None else st.st_size)
    raw = header_bytes(prefix, size)  # the Python path's first refusals, the same
    data_start = LENGTH.size + len(raw)
    if size == data_start:  # nothing to map: the Python path's own case
        return None
    owner = map_file(f, size, path, st=st)
    tensors = None
    try:
        with collection_paused():
            got = compiled_safetensors(raw, size - data_start, owner.address + data_start,
                                       owner, BUFFER_ALIGNMENT)
        if got is None:
            unmap(owner)
            return None
        tensors, metadata_at, alignment, unaligned = got
        metadata = read_metadata(raw, metadata_at, size - data_start) if metadata_at >= 0 else {}
    except BaseException:
        _drop_then_unmap(tensors, owner)
        raise
    owner.unaligned = (unaligned, len(tensors))
    return TensorFile(tensors, metadata, alignment)


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
    return grouped(_loads_entries(buffer, copy, verify))


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
    h = parse_header(view[:HEADER_SIZE], view.nbytes)
    entries, meta = parse_index(h, view[HEADER_SIZE:h.index_end])
    if verify:
        verify_data(view, h, entries)
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

        return TensorFile(copy_tensors(entries, read), meta, BUFFER_ALIGNMENT)
    if h.data_length == 0:  # every tensor points nowhere: nothing to copy or protect
        return TensorFile(tensors_over(entries, 0, None, view.readonly), meta, h.alignment)
    owner = MapOwner(view)
    start = owner.address + h.data_offset
    tensors = tensors_over(entries, start, owner, False)
    return TensorFile(tensors, meta, pow2_alignment(start, h.alignment))


def load_files(paths: Sequence[Any], mmap: bool, verify: bool,
               opener: Callable[[Any, bool, bool], TensorFile] | None = None) -> TensorFile:
    """:func:`load` of several files, such as every rank's file of one checkpoint; each is
    read by ``opener`` (:func:`load_file` by default)."""
    if not paths:
        raise UnsupportedError("hb.load() of a list needs at least one path")
    order: dict[str, None] = {}  # the names in the order they first appear
    plain: dict[str, tuple[Tensor, str]] = {}
    shards: dict[str, tuple[list[Tensor], list[str]]] = {}
    metas, alignment = [], MAX_BUFFER_ALIGNMENT
    for path in paths:
        where = fspath(path, "path")
        f = (opener or load_file)(path, mmap, verify)
        metas.append(f.metadata)
        alignment = min(alignment, f.alignment)
        for name, t in f.items():
            assert isinstance(t, Tensor)  # load_file does not group
            group = shard_group(name, t.descriptor)
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
        st = sharded_tensor(key, ts, labels, partial=True)
        if not st.is_complete:
            box = missing_box(st.shape, st.boxes)
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
