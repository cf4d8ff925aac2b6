"""Regions of open files as sources of bytes for the writers, read in pieces, never mapped."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .checksums import crc32
from .pread import pread_into

__all__ = ["Piece", "Region", "regions_crc"]



# ------------------------------------------------------------------- writing
class Region:
    """``length`` bytes of the open file ``fd`` from ``offset``: a source for the writers.

    A region is read through a few small reused buffers (:class:`DataWriter`),
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
            return Region(self.fd, self.offset + start, max(0, stop - start))
        byte = bytearray(1)
        pread_into(self.fd, memoryview(byte), self.offset + range(self.length)[key])
        return byte[0]

    def read(self, start: int, n: int) -> bytes:
        """``n`` bytes from ``start`` (``_trailing`` reads a bool8 region's this way)."""
        out = bytearray(n)
        pread_into(self.fd, memoryview(out), self.offset + start)
        return bytes(out)


Piece = memoryview | bytes | Region


def regions_crc(regions: Sequence[Region], buf: memoryview | None = None) -> int:
    """CRC-32 of the regions' bytes in order, read in pieces of ``buf`` (a buffer of at
    most 4 MiB, the regions' size, by default)."""
    if buf is None or not len(buf):
        buf = memoryview(bytearray(min(4 << 20, max(1, sum(len(r) for r in regions)))))
    crc = 0
    for r in regions:
        for at in range(0, len(r), len(buf)):
            n = min(len(buf), len(r) - at)
            pread_into(r.fd, buf[:n], r.offset + at)
            crc = crc32(buf[:n], crc)
    return crc
