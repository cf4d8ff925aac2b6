"""Entries that other processes write: a save planned here, its bytes written there.

A value whose adapter declares ``DEFERRED_SAVE`` (a Dask array, whose chunks live on
the workers of a cluster) is never gathered into the saving process. ``hb.save``
plans the file from the entry's descriptor alone (a :class:`Pending` stands for its
bytes), preallocates the temporary at the planned size, writes the other entries,
and hands the adapter a :class:`FileTarget` and the file offset of each deferred
entry. The adapter has each chunk written where it is computed, with
:func:`write_box`, which answers the CRC-32 of every contiguous run it wrote; the
saver checks that the runs tile the entry and combines their checksums in file
order, then writes the header and renames the temporary (docs/spec/container.md §8).
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from .descriptor import Descriptor
from .errors import FormatError, UnsupportedError

__all__ = ["DeferredSave", "FileTarget", "Pending", "Run", "box_runs", "write_box"]


class Pending:
    """The bytes of a deferred entry in a file plan: a length, nothing to read."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __len__(self) -> int:
        return self.nbytes


class FileTarget(NamedTuple):
    """The preallocated temporary a deferred entry is written into, and how a writer in
    another process makes sure it opened that very file (device, inode and size)."""

    path: str
    device: int
    inode: int
    size: int


class Run(NamedTuple):
    """One contiguous range written: its file offset, length and CRC-32 (0 when the file
    stores no checksums)."""

    offset: int
    length: int
    crc: int


class DeferredSave(Protocol):
    """What an adapter declares as ``DEFERRED_SAVE`` for values it writes itself."""

    def describe(self, obj: Any) -> Descriptor:
        """The row-major descriptor ``obj``'s entry will have (its bytes untouched)."""
        ...

    def write(self, target: FileTarget, jobs: Sequence[tuple[Any, int]],
              checksums: bool) -> list[list[Run]]:
        """Write each ``(obj, file offset)`` of ``jobs``; the runs written, per job."""
        ...


def box_runs(shape: Sequence[int], itemsize: int, start: Sequence[int],
             stop: Sequence[int]) -> Iterator[tuple[int, int]]:
    """The contiguous byte ranges ``(offset in the entry, length)`` that the box
    ``[start, stop)`` of a row-major ``shape`` array covers, in row-major order.

    A box is one range when it spans every axis after its first partial one; otherwise
    one range per index of the axes before that one (a row of a column chunk).
    """
    rank = len(shape)
    if not rank:
        yield 0, itemsize
        return
    if any(b <= a for a, b in zip(start, stop, strict=True)):
        return
    # k: the last axis the box does not span whole; every later axis it spans.
    k = rank - 1
    while k > 0 and start[k] == 0 and stop[k] == shape[k]:
        k -= 1
    strides = [itemsize] * rank
    for ax in range(rank - 2, -1, -1):
        strides[ax] = strides[ax + 1] * shape[ax + 1]
    length = (stop[k] - start[k]) * strides[k]
    index = list(start[:k])
    while True:
        yield sum(i * s for i, s in zip(index, strides)) + start[k] * strides[k], length
        ax = k - 1  # the next outer index, as an odometer over the axes before k
        while ax >= 0:
            index[ax] += 1
            if index[ax] < stop[ax]:
                break
            index[ax] = start[ax]
            ax -= 1
        if ax < 0:
            return


def write_box(target: FileTarget, entry_offset: int, shape: Sequence[int], itemsize: int,
              start: Sequence[int], stop: Sequence[int], data: Any,
              checksums: bool) -> list[Run]:
    """Write one chunk, the box ``[start, stop)`` of an entry at ``entry_offset``, whose
    row-major bytes are ``data`` (any buffer), into ``target``; the runs written.

    Runs in the process that holds the chunk. The temporary is opened for writing by
    name, never created, and refused unless it is the planned file.
    """
    view = memoryview(data).cast("B")
    volume = itemsize
    for a, b in zip(start, stop, strict=True):
        volume *= max(b - a, 0)
    if len(view) != volume:
        raise FormatError(
            f"a chunk of box {list(start)}..{list(stop)} holds {len(view)} bytes, but the box "
            f"needs {volume} ({itemsize}-byte elements): the chunk's shape or type is not the "
            "one the file was planned with (check the array's chunks and dtype)", field="chunk")
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
        for offset, length in box_runs(shape, itemsize, start, stop):
            piece = view[at:at + length]
            pos = entry_offset + offset
            done = 0
            while done < length:
                n = os.pwrite(fd, piece[done:], pos + done)
                if n <= 0:
                    raise OSError(f"pwrite wrote {n} bytes into {target.path!r}")
                done += n
            runs.append(Run(pos, length, zlib.crc32(piece) if checksums else 0))
            at += length
    finally:
        os.close(fd)
    return runs
