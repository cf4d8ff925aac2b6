"""The checks of a file's data, beyond its index: data checksums, zero padding, and the
zero bits after packed or padded sub-byte elements (container.md §8).

Each check reads the file through a :data:`Read` (a memory map, or positional reads of an
open file), so ``verify``, ``load(verify=True)`` and ``rewrite`` check the same bytes in
the same order.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._trailing import high_bits, set_trailing_bits
from ..errors import FormatError
from .checksums import crc32
from .format import EntryInfo, Header, entry_error
from .pread import read_range
from .regions import Region, regions_crc

__all__ = ["Read", "check_checksum", "check_head_padding", "check_padding_and_bits", "check_size",
           "verify_data", "verify_file"]



def verify_data(view: memoryview, h: Header, entries: Sequence[EntryInfo]) -> None:
    """Check what the index does not cover: data checksums and zero padding.

    ``view`` is the whole file. After this, every byte of the file is checked.
    """
    def read(start: int, stop: int) -> memoryview:
        return view[start:stop]

    check_head_padding(read, h)
    base = h.data_offset
    for e in entries:
        if e.checksum is None:
            continue
        crc = 0
        for b in e.buffers:
            if b.length:
                crc = crc32(view[base + b.offset:base + b.offset + b.length], crc)
        check_checksum(e, crc)
    check_padding_and_bits(read, h, entries)


# read(start, stop): the file's bytes [start, stop), from a map or read from the file
Read = Callable[[int, int], "memoryview | bytes"]


def check_head_padding(read: Read, h: Header) -> None:
    if _any_nonzero(read(h.index_end, h.data_offset)):
        raise FormatError("the padding before the data region must be zero", field="data_offset")


def check_checksum(e: EntryInfo, crc: int) -> None:
    """``crc`` is the CRC-32 of the entry's buffers as the file holds them."""
    if e.checksum is not None and crc != e.checksum:
        raise entry_error(e.position, e.name, None,
                          f"data checksum mismatch (stored 0x{e.checksum:08x}, computed "
                          f"0x{crc:08x}): the tensor's bytes are corrupt", field="checksum")


def check_padding_and_bits(read: Read, h: Header, entries: Sequence[EntryInfo]) -> None:
    """The padding between buffers is zero, and so are packed sub-byte data's trailing bits."""
    base = h.data_offset
    spans = sorted((b.offset, b.offset + b.length, e.position, j)
                   for e in entries for j, b in enumerate(e.buffers) if b.length)
    for (_, stop, _, _), (off, _, i, j) in itertools.pairwise(spans):
        if off > stop and _any_nonzero(read(base + stop, base + off)):
            raise entry_error(i, entries[i].name, None, "the padding before this buffer must "
                              "be zero", field=f"buffers[{j}].offset")
    for e in entries:  # element-types.md §4.1 rule 6: packed sub-byte data ends in zero bits
        first = e.buffers[0] if e.buffers else None
        if first is not None and first.length and e.descriptor.trailing_bits:
            at = base + first.offset + first.length - 1
            last = read(at, at + 1)[0]
            if set_trailing_bits(e.descriptor, last):
                mask = 0xFF & ~(0xFF >> e.descriptor.trailing_bits)
                raise entry_error(
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
                raise entry_error(
                    e.position, e.name, None,
                    f"element {bad[0]} of its padded {e.descriptor.dtype.name} {first.role.name} "
                    f"buffer is the byte 0x{bad[1]:02x}: the {8 - bits} high bits of each element "
                    f"(mask 0x{0xFF & ~((1 << bits) - 1):02x}) must be zero (element-types.md "
                    "§4.3); load the file and save it again (hb.save writes them as zero)",
                    field="buffers[0].high_bits")


class _FileSpan:
    """``length`` bytes of the file from ``start`` through a :data:`Read`, as
    ``_trailing.high_bits`` reads a buffer: ``len`` and ``read(k, n)``."""

    __slots__ = ("length", "read_", "start")

    def __init__(self, read: Read, start: int, length: int) -> None:
        self.read_, self.start, self.length = read, start, length

    def __len__(self) -> int:
        return self.length

    def read(self, k: int, n: int) -> bytes:
        return bytes(self.read_(self.start + k, self.start + k + n))


def _any_nonzero(view: memoryview | bytes) -> bool:
    n = len(view)
    return n > 0 and bytes(view) != bytes(n)


def verify_file(f: Any, h: Header, entries: Sequence[EntryInfo]) -> None:
    """:func:`verify_data` of an open file, read in pieces: never through a memory map,
    which a file cut meanwhile turns into SIGBUS (here it is ``file_size: truncated``),
    and which would count the whole file in the resident set."""
    fd = f.fileno()
    read = functools.partial(read_range, fd)
    check_head_padding(read, h)
    buf = memoryview(bytearray(min(4 << 20, max((b.length for e in entries if e.checksum
                                                  is not None for b in e.buffers), default=0))))
    for e in entries:
        if e.checksum is not None:
            check_checksum(e, regions_crc([Region(fd, h.data_offset + b.offset, b.length)
                                           for b in e.buffers], buf))
    check_padding_and_bits(read, h, entries)
    check_size(fd, h)


def check_size(fd: int, h: Header) -> None:
    if os.fstat(fd).st_size != h.file_size:  # a map would have seen it (grown; cut is read)
        raise FormatError("the file changed size while it was opened", field="file_size")
