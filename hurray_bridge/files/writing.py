"""Writing Hurray files: ``hb.save`` and ``hb.dumps``, and the entries other processes write.

A save is atomic (:mod:`~hurray_bridge.files.disk`): a temporary in the target's
directory, its data written and checksummed by :mod:`~hurray_bridge.files.engine`, the
head last (a small file's head and data in one pass once its checksums are known),
fsync, ``os.replace``. Entries whose parts other processes hold (a Dask array)
are written by those processes into the preallocated temporary (:func:`write_box`).
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._deferred import FileTarget, Job, Run, box_runs
from .._gc import collection_paused, covers_write
from .._trailing import written_pieces
from ..descriptor import Descriptor
from ..dtypes import bool8
from ..errors import FormatError, UnsupportedError
from .checksums import crc32, crc32_combine
from .disk import atomic_output, atomic_temporary, bad_count, check_suffix, fspath, write_all
from .engine import (
    CHUNK,
    DataWriter,
    Item,
    Progress,
    Runs,
    write_data,
    write_views,
    zeros,
)
from .format import BUFFER_ALIGNMENT
from .plan import Plan, PlanEntry, plan_tensors, serialise, small_dense_file
from .regions import Piece

__all__ = ["dumps", "save", "write_box", "write_plan"]



def write_plan(path: str | os.PathLike[str], plan: Plan, *, fsync: bool,
               progress: Progress | None = None,
               check: Callable[[Sequence[int]], None] | None = None,
               sums: bool = False) -> None:
    """Write ``plan`` to ``path``, atomically. ``check(crcs)`` runs once every byte is
    written, and an error it raises leaves ``path`` as it was; with ``sums`` the data
    checksums it gets are computed even when the file stores none."""
    slots = len(plan.entries) if plan.checksums or sums else 0
    small = None if progress is not None else _small_file(plan, slots)
    if small is not None:
        # Head and data in one pass, the checksums (of the same views) known first.
        views, crcs = small
        with atomic_output(path, fsync=fsync) as fd:
            views[0] = plan.head(crcs)
            write_views(fd, views)
            if check is not None:
                check(crcs)
        return
    items = _data_items(plan, slots)
    with atomic_output(path, fsync=fsync) as fd:
        # The data first, checksummed as it goes; the head, which holds the
        # checksums, last. Its size is known in advance, so one pass suffices.
        os.lseek(fd, plan.data_offset, os.SEEK_SET)
        crcs = write_data(fd, plan.data_offset, plan.data_length, slots, items,
                          durable=fsync, progress=progress) or [0] * len(plan.entries)
        if check is not None:
            check(crcs)
        os.lseek(fd, 0, os.SEEK_SET)
        write_all(fd, plan.head(crcs))


def _data_items(plan: Plan, slots: int) -> list[Item]:
    """The items of the data writer for ``plan``'s entries (slot ``i`` for entry ``i``
    when ``slots``)."""
    end = plan.data_offset  # where the bytes of the entries so far end

    def feeder(i: int, e: PlanEntry) -> Callable[[DataWriter], None]:
        def feed(out: DataWriter) -> None:
            for src, off in zip(e.sources, e.offsets, strict=True):
                if len(src):
                    out.pad_to(plan.data_offset + off)
                    out.put(src, i if slots else None)
        return feed

    # Entries of one view in memory, the common case, go in runs (engine.Runs), an item a
    # run: an item per entry cost a partial and a call each.
    runs = Runs()
    add, item, base = runs.add, runs.item, plan.data_offset
    with collection_paused():
        for i, e in enumerate(plan.entries):
            sources = e.sources
            if len(sources) == 1 and type(src := sources[0]) is memoryview and len(src):
                at = base + e.offsets[0]
                add(end, at, src, i if slots else None)
                end = at + len(src)
                continue
            if len(sources) == 1:
                # (a partial costs a third of a closure; most entries have one piece)
                if len(src):
                    at = base + e.offsets[0]
                    item((end, functools.partial(_put_one, at, src, i if slots else None)))
                    end = at + len(src)
                else:
                    item((end, _put_none))
                continue
            item((end, feeder(i, e)))
            for src, off in zip(e.sources, e.offsets, strict=True):
                if len(src):
                    end = plan.data_offset + off + len(src)
        runs.close()
    return runs.items


def _small_file(plan: Plan, slots: int) -> tuple[list[memoryview | bytes], list[int]] | None:
    """A file of under a :data:`CHUNK` of data, every entry one view in memory (or none), as
    the views to write from offset 0 (the head's place first, then the data and its
    padding) and the CRCs of the entries' bytes; None for any other file.

    A save of a few tensors spent more on the data writer's set-up (and on two more
    system calls: the head written apart, last) than on its bytes."""
    if plan.data_length >= CHUNK:
        return None
    views: list[memoryview | bytes] = [b""]
    crcs = [0] * len(plan.entries)
    base = end = plan.data_offset
    for i, e in enumerate(plan.entries):
        sources = e.sources
        if len(sources) != 1 or type(src := sources[0]) is not memoryview:
            return None
        if not len(src):
            continue
        at = base + e.offsets[0]
        if at > end:
            views.append(zeros(at - end))
        views.append(src)
        if slots:
            crcs[i] = crc32(src, 0)
        end = at + len(src)
    return views, crcs


def _put_one(at: int, src: Piece, slot: int | None, out: DataWriter) -> None:
    """The feed of an entry of one piece, at file offset ``at``."""
    out.put_at(at, src, slot)


def _put_none(out: DataWriter) -> None:
    """The feed of an entry without bytes."""


def _write_deferred(path: str | os.PathLike[str], plan: Plan, *, fsync: bool) -> None:
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
                    write_all(fd, src)
                    if plan.checksums:
                        crcs[i] = crc32(src, crcs[i])
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
        write_all(fd, plan.head(crcs))


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
            for cut in range(0, length, CHUNK):
                piece = view[at + cut:at + min(length, cut + CHUNK)]
                if checksums:
                    crc = crc32(piece, crc)
                done = 0
                while done < len(piece):
                    n = os.pwrite(fd, piece[done:], pos + cut + done)
                    if n <= 0:
                        raise bad_count("pwrite", n, len(piece) - done)
                    done += n
            runs.append(Run(pos, length, crc))
            at += length
    finally:
        os.close(fd)
    return runs


def _combined(e: PlanEntry, start: int, runs: Sequence[Run]) -> int:
    """The CRC-32 of a deferred entry from its runs, which must tile its bytes exactly."""
    crc, pos, end = 0, start, start + len(e.sources[0])
    for r in sorted(runs):
        if r.offset != pos:
            what = "overlap" if r.offset < pos else "leave a gap"
            raise FormatError(
                f"entry {e.name_bytes.decode()!r}: the chunks written {what} at file offset "
                f"{min(pos, r.offset)}; each byte must be written once (the chunks must tile "
                "the array)", field="chunks")
        crc = crc32_combine(crc, r.crc, r.length)
        pos += r.length
    if pos != end:
        raise FormatError(
            f"entry {e.name_bytes.decode()!r}: the chunks written end at file offset {pos}, "
            f"the entry at {end}; each byte must be written once (the chunks must tile the "
            "array)", field="chunks")
    return crc


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
    check_suffix(fspath(path, "path"), "hurray")
    with collection_paused():
        # A file of plain arrays under a CHUNK of data (and of head), planned in C: the
        # bytes write_plan's small file would be; under 2 CHUNKs, so covers_write holds.
        small = small_dense_file(mapping, metadata, alignment, checksums, CHUNK)
        if small is not None:
            with atomic_output(path, fsync=fsync) as fd:
                write_views(fd, small)
            del small  # (before collection resumes, as the plan below)
            return
        plan = plan_tensors(mapping, metadata, alignment, checksums, defer=True)
        if not plan.deferred and covers_write(plan.file_size):
            write_plan(path, plan, fsync=fsync)
            del plan  # (before collection resumes: none of its objects is left to collect)
            return
    if plan.deferred:
        _write_deferred(path, plan, fsync=fsync)
    else:
        write_plan(path, plan, fsync=fsync)


def dumps(mapping: Mapping[str, Any], metadata: Mapping[str, str] | None = None, *,
          alignment: int = BUFFER_ALIGNMENT, checksums: bool = True) -> bytes:
    """The bytes :func:`save` would write, as a ``bytes`` object."""
    with collection_paused():
        plan = plan_tensors(mapping, metadata, alignment, checksums)
    return serialise(plan)
