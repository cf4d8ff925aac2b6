"""Automatic garbage collection held off while a call builds objects for every tensor.

Saving or loading a checkpoint of many small tensors makes a dozen or more objects per
tensor, all of them still reachable when the call ends. Each 700 of them starts a young
collection, and every tenth of those an older one; about every 25,000 a full collection
walks the whole heap, which, with torch and JAX imported, takes 0.1-0.2 s, and finds
nothing to free here. :func:`collection_paused` holds automatic collection off for the
length of that loop only (not while bytes are copied), and restores it in ``finally``.

A save holds collection off until it has written its file and let its per-tensor objects
go (:func:`covers_write`), so that none is left to collect when it resumes: resumed while
they lived (the plan of a file is alive until its bytes are written), the first
collection after the pause walked every one of them, about 1 us a tensor, a sixth of what
a save of many small tensors costs. A write of more than :data:`PAUSED_WRITE_BYTES`
resumes collection before its bytes are written instead: collection is then held off
only while objects are built, never for the length of a long copy or flush.

Collection is only delayed: garbage made meanwhile, by this thread or another, is
collected at the next collection after the call. If collection was already off, it stays
off; if another thread turns it off meanwhile, this one turns it back on at the end
(``gc.enable`` is process-wide, and Python offers no count of who turned it off).
"""

from __future__ import annotations

import gc

__all__ = ["PAUSED_WRITE_BYTES", "collection_paused", "covers_write"]

PAUSED_WRITE_BYTES = 64 << 20
"""The largest write (bytes) made with collection paused: tens of milliseconds to the
page cache, a fraction of a second to a slow disk's flush."""


class collection_paused:  # (lower case: to its callers a function, ``with collection_paused():``)
    """Automatic collection off inside the block (if it was on), back on after it.

    A class, not a generator under ``contextlib.contextmanager``, whose machinery cost a
    small save or load more than the pause saved it."""

    __slots__ = ("paused",)

    def __enter__(self) -> None:
        self.paused = gc.isenabled()
        if self.paused:
            gc.disable()

    def __exit__(self, *exc: object) -> None:
        if self.paused:
            gc.enable()


def covers_write(nbytes: int) -> bool:
    """Whether a save that writes ``nbytes`` keeps collection paused while it writes."""
    return nbytes <= PAUSED_WRITE_BYTES
