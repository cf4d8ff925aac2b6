"""The data writer: a file's data region written in order, from memory and from file
regions, checksummed as it goes.

A region of another file is read through a few reused buffers (never mapped), so a
conversion's memory does not grow with the file. A large output is written by helper
threads one chunk behind the other (:class:`DataWriter`), or in two halves at once
(:func:`write_data`). The tunables (``_THREADED_CRC_BYTES``, ``_SPLIT_BYTES``,
:data:`CHUNK`) were measured with ``benchmarks/convert.py``.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import functools
import itertools
import os
import sys
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, cast

from .checksums import crc32, crc32_combine
from .disk import WRITES_VECTORS, write_all, write_vectors
from .pread import pread_into
from .regions import Piece, Region

__all__ = ["CHUNK", "RUN", "DataWriter", "Item", "Progress", "Runs", "write_data",
           "write_views", "zeros"]

CHUNK = 4 << 20  # write and checksum in slices that stay in the CPU cache
Progress = Callable[[int, int], None]


# From this size (None: never), a file's data is read on a helper thread while the caller's
# thread writes. zlib's CRC-32 (250-400 ms a GiB) runs on a thread of its own; the compiled
# one (~20 ms a GiB) right after each read on the reading thread, where a third thread's
# hand-offs cost more than they would overlap (benchmarks/convert.py).
_THREADED_CRC_BYTES: int | None = 16 << 20
_CRC_THREAD = crc32 is zlib.crc32
# From this size (None: never), a file's entries are cut in two halves of about as many
# bytes, each read, checksummed and written by one thread (the caller's and a helper),
# each chunk on one core: no chunk crosses from a reading core to a writing one, so where
# the other core is busy this costs what one thread would, and where it is free half.
_SPLIT_BYTES: int | None = 16 << 20


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
_SHORT_PADS = 4096  # the paddings below this many bytes: one view of each length made once
_PADS: dict[int, memoryview] = {}  # length -> the view, as met (most files meet a few)


class DataWriter:
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
    the next chunk raise :class:`_Stopped` (one half of :func:`write_data`).
    With ``start`` (a half that begins inside an entry), the pieces it is given begin at
    file offset ``start`` and only their bytes in [base, base + total) are read, summed
    and written; a piece only checked (:meth:`checksum`) is checked by the half whose
    bytes it comes among.
    """

    def __init__(self, fd: int, base: int, total: int, slots: int, *, durable: bool,
                 progress: Progress | None, positional: bool = False,
                 threaded: bool | None = None, stop: threading.Event | None = None,
                 start: int | None = None, clip: bool = False) -> None:
        self.fd = fd
        self.positional = positional  # written with os.pwrite at its offsets (a split half)
        self.stop = stop  # set: the other half failed, give up at the next chunk
        self.summed: dict[int, int] = {}  # slot -> bytes summed here (read by split halves)
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
        self.buffer_size = max(4096, min(CHUNK, total))  # a small file gets a small buffer
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

    def __enter__(self) -> DataWriter:
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

    def put(self, src: Piece, slot: int | None) -> None:
        n = len(src)
        a, b = self._window(n)
        at = self.end + a  # the file offset of the first byte written
        self.end += n
        if a == b:
            return  # (an empty buffer's offset means nothing: it is never read)
        if (a, b) != (0, n):
            src = src[a:b]
        if isinstance(src, Region):
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

    def put_at(self, at: int, src: Piece, slot: int | None) -> None:
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
            self.crcs[slot] = crc32(src, self.crcs[slot])
        self._vector(src)

    def put_run(self, ats: Sequence[int], srcs: Sequence[memoryview],
                first: int | None) -> None:
        """:meth:`put_at` of each view ``srcs[k]`` at file offset ``ats[k]`` (in order) into
        slot ``first + k``, or into none when ``first`` is None.

        The many small tensors of a checkpoint in one loop, without a call per tensor: a
        view shorter than a buffer, after at most a pad's worth of zeros, joins the pending
        vectors here; any other goes through :meth:`put_at`, as does every view of a writer
        that does not write vectors in this thread."""
        slot = first
        if self.clip or not self.gathers or self.gather is not None or self.summer is not None:
            for at, src in zip(ats, srcs, strict=True):
                self.put_at(at, src, slot)
                if slot is not None:
                    slot += 1
            return
        vectors, crcs, pads = self.vectors, self.crcs, _PADS
        # (the bytes summed per slot matter to a split write's halves only)
        summed = self.summed if self.positional else None
        cap, end, size, most = self.buffer_size, self.end, self.vector_bytes, _GATHER_OPS - 1
        for at, src in zip(ats, srcs, strict=True):
            gap = at - end
            n = len(src)
            if n >= cap or not 0 <= gap < _SHORT_PADS:
                self.end, self.vector_bytes = end, size
                self.put_at(at, src, slot)  # (may write the vectors, or queue chunks)
                vectors, end, size = self.vectors, self.end, self.vector_bytes
            else:
                if gap:
                    pad = pads.get(gap)
                    if pad is None:
                        pad = pads[gap] = _ZERO_PAD[:gap]
                    vectors.append(pad)
                vectors.append(src)
                end = at + n
                size += gap + n
                if slot is not None:
                    if summed is not None:
                        summed[slot] = summed.get(slot, 0) + n
                    crcs[slot] = crc32(src, crcs[slot])
                if size >= cap or len(vectors) >= most:
                    self.end, self.vector_bytes = end, size
                    self._flush_vectors()
                    vectors, size = self.vectors, 0
            if slot is not None:
                slot += 1
        self.end, self.vector_bytes = end, size

    def checksum(self, src: Region, slot: int) -> None:
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
        self.crcs[slot] = crc32(chunk, self.crcs[slot])

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
            write_all(self.fd, chunk.data, self.pos if self.positional else None)
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

    def _gathered(self, src: Region, slot: int | None) -> bool:
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
        write_vectors(self.fd, cast(list[memoryview], views),
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
        pread_into(g.fd, span, g.start)
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
        write_vectors(self.fd, views, self.pos if self.positional else None)
        self._advance(total)

    def _through(self, src: Region, slot: int | None, *, write: bool,
                 at: int = 0) -> None:
        off, end = src.offset, src.offset + src.length
        while off < end:
            j, buf = self._buffer()
            view = buf[:_chunk_length(at + off - src.offset, end - off, len(buf))]
            read = None
            if self.reader is None:
                pread_into(src.fd, view, off)
            else:
                read = self.reader.submit(pread_into, src.fd, view, off)
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
Item = tuple[int, Callable[["DataWriter"], None]]


def zeros(n: int) -> memoryview | bytes:
    """``n`` zero bytes to write (a view of one shared buffer when short enough)."""
    return _ZERO_PAD[:n] if n <= _ZERO_PAD_BYTES else bytes(n)


def write_views(fd: int, views: list[memoryview | bytes]) -> None:
    """Write ``views`` in order at ``fd``'s position, as many in one call as a
    :class:`DataWriter` writes at once (each call a checkpoint, as each of its flushes)."""
    if len(views) <= _GATHER_OPS:  # (no slice, no cast: a small file's one call)
        write_vectors(fd, views)
        return
    for k in range(0, len(views), _GATHER_OPS):
        write_vectors(fd, cast(list[memoryview], views[k:k + _GATHER_OPS]))


RUN = 256  # the pieces of one item of runs (_run_feed): a split write cuts between items


def _run_feed(ats: Sequence[int], srcs: Sequence[memoryview],
             first: int | None) -> Callable[[DataWriter], None]:
    """The feed of an item of small pieces in memory (:meth:`DataWriter.put_run`): one for
    up to :data:`RUN` tensors, where a feed each cost a partial and a call each."""
    return functools.partial(_put_run, ats, srcs, first)


def _put_run(ats: Sequence[int], srcs: Sequence[memoryview], first: int | None,
             out: DataWriter) -> None:
    out.put_run(ats, srcs, first)


class Runs:
    """The items of a data writer in which views in memory go in runs of up to :data:`RUN`
    (:func:`_run_feed`), one item each: the one way both formats' writers build them.

    :meth:`add` a view (a run is closed when full), :meth:`item` any other item (which
    closes the run before it), :meth:`close` at the end; :attr:`items` is the list."""

    __slots__ = ("ats", "first", "items", "srcs", "start")

    def __init__(self) -> None:
        self.items: list[Item] = []
        self.ats: list[int] = []
        self.srcs: list[memoryview] = []
        self.start = 0
        self.first: int | None = None

    def add(self, start: int, at: int, src: memoryview, slot: int | None) -> None:
        """The view ``src`` at file offset ``at``, after zeros from ``start``, summed into
        ``slot`` (None: none); the views of one run have consecutive slots."""
        if not self.ats:
            self.start, self.first = start, slot
        self.ats.append(at)
        self.srcs.append(src)
        if len(self.ats) == RUN:
            self.close()

    def item(self, item: Item) -> None:
        self.close()
        self.items.append(item)

    def close(self) -> None:
        if self.ats:
            self.items.append((self.start, _run_feed(self.ats, self.srcs, self.first)))
            self.ats, self.srcs = [], []


def _split_point(items: Sequence[Item], base: int, total: int) -> tuple[int, int, int] | None:
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


def _cut_at(items: Sequence[Item], mid: int) -> tuple[int, int, int]:
    """:func:`_split_point`'s answer for a cut at file offset ``mid`` (after the first
    item's offset): between two items if one starts there, else inside the one before."""
    j = bisect.bisect_right([at for at, _ in items], mid) - 1
    return (j, j, mid) if items[j][0] == mid else (j + 1, j, mid)


def write_data(fd: int, base: int, total: int, slots: int, items: Sequence[Item], *,
               durable: bool, progress: Progress | None) -> list[int]:
    """Write the data region [base, base + total) of ``fd`` from ``items``; the slots' CRCs.

    A large region is written in two halves at once (:data:`_SPLIT_BYTES`), the second by a
    helper thread with its own writer, at their offsets; a slot summed in both halves (an
    entry the cut goes through) gets the CRC of its two parts combined. Otherwise one
    :class:`DataWriter` writes it all from the file position ``base``.
    """
    split = _split_point(items, base, total)
    if split is None:
        with DataWriter(fd, base, total, slots, durable=durable, progress=progress) as out:
            for _, feed in items:
                feed(out)
            return out.finish()
    return _write_halves(fd, base, total, slots, items, split, durable=durable,
                         progress=progress)


def _write_halves(fd: int, base: int, total: int, slots: int, items: Sequence[Item],
                  split: tuple[int, int, int], *, durable: bool,
                  progress: Progress | None) -> list[int]:
    """:func:`write_data` of a region cut at ``split`` (:func:`_split_point`'s answer): the
    first half on this thread, the second on a helper, each with its own writer."""
    first_end, second_start, mid = split
    inside = first_end != second_start  # the cut goes through an item
    report = _half_reporters(progress, total)
    stop = threading.Event()
    halves = [DataWriter(fd, base, mid - base, slots, durable=durable, progress=report[0],
                         positional=True, threaded=False, stop=stop, clip=inside),
              DataWriter(fd, mid, base + total - mid, slots, durable=durable,
                         start=items[second_start][0] if inside else None,
                         progress=report[1], positional=True, threaded=False, stop=stop)]
    crcs: list[list[int]] = [[], []]
    failed: list[BaseException] = []

    def run(half: int, part: Sequence[Item]) -> None:
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

    signalled = _run_with_helper(lambda: run(0, items[:first_end]),
                                 lambda: run(1, items[second_start:]), stop)
    if signalled is not None:
        raise signalled
    if failed:
        raise failed[0]
    first, second = crcs
    for slot, n in halves[1].summed.items():
        first[slot] = (crc32_combine(first[slot], second[slot], n)
                       if slot in halves[0].summed else second[slot])
    return first


def _half_reporters(progress: Progress | None,
                    total: int) -> tuple[Progress | None, Progress | None]:
    """The progress callbacks of the two halves: each reports its bytes, ``progress`` hears
    their sum."""
    if progress is None:
        return None, None
    done = [0, 0]
    lock = threading.Lock()

    def report(half: int) -> Progress:
        def add(n: int, _total: int) -> None:
            with lock:
                done[half] = n
                progress(done[0] + done[1], total)
        return add

    return report(0), report(1)


def _run_with_helper(first: Callable[[], None], second: Callable[[], None],
                     stop: threading.Event) -> BaseException | None:
    """Run ``second`` on a helper thread and ``first`` on this one, and return once the
    helper has ended, whatever happens; a signal that arrives meanwhile sets ``stop`` and is
    returned (the first one), to be raised then."""
    ended = threading.Lock()
    ended.acquire()
    finished: list[bool] = []  # set before the release: the flag is what the wait trusts

    def second_half() -> None:
        try:
            second()
        finally:
            finished.append(True)
            ended.release()

    helper = threading.Thread(target=second_half, name="hurray-write", daemon=True)
    helper.start()
    signalled: BaseException | None = None
    try:
        first()
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
    return signalled
