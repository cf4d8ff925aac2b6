"""Many buffers of one file read into memory with large positional reads on a few threads.

``hb.load(path, mmap=False)`` fills every tensor's fresh memory here. On a local disk a
read is a copy out of the page cache and threads change little; on a network file
system (NFS, Lustre, a FUSE mount) each read waits a round trip, and several reads in
flight keep the link busy where one waits. The reads go out in file order, in pieces of
:data:`CHUNK` bytes, so the server (and the kernel's readahead) still sees a forward scan.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from ..errors import FormatError
from .disk import bad_count, checkpoint, interruptible

__all__ = ["CHUNK", "THREADED_BYTES", "THREADS", "pread_into", "read_all", "read_range",
           "truncated_read"]

CHUNK = 8 << 20
"""Bytes per read: large enough that a system call (or a round trip) is noise."""
THREADS = 4
"""Reads in flight at most (the caller's thread is one of them); fewer where this process
has fewer CPUs, but at least two: on a local disk each read is a copy out of the page cache, and
threads beyond the CPUs only contend (measured 1.2x slower with four on two busy cores);
on a network mount each read in flight overlaps another's round trip."""
THREADED_BYTES = 32 << 20
"""Below this many bytes in all, the caller reads alone: starting threads costs more."""

_ReadInto = Callable[[int, memoryview, int], None]


def _pieces(jobs: Sequence[tuple[int, memoryview]]) -> Iterator[tuple[int, memoryview]]:
    for offset, dest in sorted(jobs, key=lambda j: j[0]):
        for at in range(0, len(dest), CHUNK):
            yield offset + at, dest[at:at + CHUNK]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def read_all(fd: int, jobs: Sequence[tuple[int, memoryview]], read_into: _ReadInto, *,
             threads: int | None = None) -> None:
    """Fill each ``dest`` of ``jobs`` (``(file offset, dest)`` pairs) from ``fd``.

    ``read_into(fd, view, offset)`` fills one piece (:func:`pread_into`,
    which raises the truncation error when the file ends early). With more than
    :data:`THREADED_BYTES` in all and ``os.preadv`` available, up to ``threads``
    (default: :data:`THREADS`, or this process's CPUs if fewer, but at least two) read
    at once; the GIL is released during each read.
    When any read fails, the others stop at their next piece and all have returned
    before the error is raised: no thread writes into memory the caller may free.
    """
    total = sum(len(d) for _, d in jobs)
    n = min(THREADS, max(2, _cpus())) if threads is None else threads
    if n <= 1 or total < THREADED_BYTES or not hasattr(os, "preadv"):
        for offset, dest in _pieces(jobs):
            read_into(fd, dest, offset)
        return
    pieces = _pieces(jobs)
    lock = threading.Lock()
    stop = threading.Event()

    def work() -> None:
        try:
            while not stop.is_set():
                with lock:  # a generator is not thread-safe
                    piece = next(pieces, None)
                if piece is None:
                    return
                read_into(fd, piece[1], piece[0])
        except BaseException:
            stop.set()
            raise

    pool = ThreadPoolExecutor(n - 1, thread_name_prefix="hurray-pread")
    try:
        helpers = [pool.submit(work) for _ in range(n - 1)]
        # The caller's thread reads too: a signal (Ctrl-C) ends its read at once, and the
        # helpers then stop at their next piece.
        work()
        for h in helpers:
            h.result()
    finally:
        stop.set()
        pool.shutdown(wait=True, cancel_futures=True)



def truncated_read() -> FormatError:
    return FormatError("truncated: the file ended while a buffer was read (did it change?)",
                       field="file_size")


@interruptible
def pread_into(fd: int, view: memoryview, offset: int) -> None:
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
            raise truncated_read()
        if not 0 < n <= want:
            raise bad_count("preadv", n, want)
        got += n


def read_range(fd: int, start: int, stop: int) -> bytes:
    """The bytes [start, stop) of ``fd`` (a ``Read`` for the checks of :func:`verify_data`)."""
    buf = bytearray(max(0, stop - start))
    pread_into(fd, memoryview(buf), start)
    return bytes(buf)
