"""Entries that other processes write: a save planned here, its bytes written there.

A value whose adapter declares ``DEFERRED_SAVE`` (a Dask array, whose chunks live on
the workers of a cluster) is never gathered into the saving process. ``hb.save``
plans the file from the entry's descriptor alone (a :class:`Pending` stands for its
bytes), preallocates the temporary at the planned size, writes the other entries,
and hands the adapter a :class:`FileTarget` and the file offset of each deferred
entry. The adapter has each chunk written where it is computed, with
:func:`container.write_box`, which answers the CRC-32 of every contiguous run it wrote; the
saver checks that the runs tile the entry and combines their checksums in file
order, then writes the header and renames the temporary (docs/spec/container.md §8).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol

from .descriptor import Descriptor

__all__ = ["DeferredSave", "FileTarget", "Job", "Pending", "Run", "box_runs"]


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


class Job(NamedTuple):
    """One deferred entry to write: the value, the file offset of its bytes, its planned
    (row-major) descriptor and its name."""

    value: Any
    offset: int
    descriptor: Descriptor
    name: str


class DeferredSave(Protocol):
    """What an adapter declares as ``DEFERRED_SAVE`` for values it writes itself."""

    def describe(self, obj: Any) -> Descriptor:
        """The row-major descriptor ``obj``'s entry will have (its bytes untouched)."""
        ...

    def write(self, target: FileTarget, jobs: Sequence[Job],
              checksums: bool) -> list[list[Run]]:
        """Write each of ``jobs``, chunk by chunk, with ``container.write_box`` in the
        processes that hold the chunks; the runs written, per job."""
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
