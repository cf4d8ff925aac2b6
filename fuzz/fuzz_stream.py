#!/usr/bin/env python3
"""Fuzz target: ``hb.StreamReader`` (tensor streams, docs/spec/interchange.md §6).

Each input is a whole stream. It is read three times: from a seekable
``BytesIO`` (the reader bounds each message by the bytes left), and twice from
a pipe-like object that is not seekable and hands out at most a few bytes per
read: once with ``max_message_bytes`` equal to the input's size, once with the
default cap of 4 GiB (where only the peak-RSS check of the harness stands
between a lying header and the machine's memory). All must raise
``hb.FormatError`` or yield the same tensors; each
tensor must conform to the schema and its buffers be readable; after an error
the reader must refuse to go on, and after the end it must keep returning
``None``.

    python fuzz/fuzz_stream.py fuzz/corpus/stream -max_total_time=300 -max_len=16384
"""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness

NAME = "stream"


class Pipe(io.RawIOBase):
    """A non-seekable reader that returns at most ``chunk`` bytes per call."""

    def __init__(self, data: bytes, chunk: int) -> None:
        self._view = memoryview(data)
        self._pos = 0
        self._chunk = chunk

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), self._chunk, len(self._view) - self._pos)
        b[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n


def load_check() -> _harness.Check:
    import hurray_bridge as hb

    FormatError = hb.FormatError
    DYNAMIC = hb.DYNAMIC

    def run(f: Any, **kw: Any) -> list[tuple[Any, tuple[bytes, ...]]] | type:
        try:
            r = hb.StreamReader(f, **kw)
        except FormatError:
            return FormatError
        schema = r.schema
        hash(schema)
        out = []
        try:
            for t in r:
                d = t.descriptor
                if d.rank != schema.rank or d.dtype != schema.dtype or d.layout != schema.layout:
                    raise _harness.Finding(f"{d!r} does not conform to {schema!r}")
                for got, want in zip(d.shape, schema.shape, strict=True):
                    if got == DYNAMIC or (want != DYNAMIC and got != want):
                        raise _harness.Finding(f"{d!r} does not conform to {schema!r}")
                if [(s.role, s.nbytes) for s in d.buffer_layout()] != [
                        (b.role, b.nbytes) for b in t.buffers]:
                    raise _harness.Finding(f"{d!r}: buffers do not match the descriptor")
                out.append((d, tuple(bytes(t.memoryview(b.role)) for b in t.buffers)))
        except FormatError:
            try:
                r.read()
            except FormatError:
                return FormatError
            raise _harness.Finding("the reader went on after an error") from None
        if r.read() is not None or r.read() is not None:
            raise _harness.Finding("the reader returned a tensor after the end of the stream")
        return out

    def check(data: bytes) -> None:
        a = run(io.BytesIO(data))
        chunk = 1 + (data[-1] % 97 if data else 0)
        b = run(Pipe(data, chunk), max_message_bytes=len(data))
        # And with the default cap (4 GiB): a pipe cannot bound a message by the bytes
        # left, so a header may claim gigabytes; what that costs is watched by the
        # harness's peak-RSS check (memory must be committed only as bytes arrive).
        c = run(Pipe(data, chunk))
        if not a == b == c:
            raise _harness.Finding(f"seekable and pipe reads disagree: {_brief(a)} / "
                                   f"{_brief(b)} / {_brief(c)}")

    return check


def _brief(x: Any) -> str:
    return "FormatError" if isinstance(x, type) else f"{len(x)} tensors"


if __name__ == "__main__":
    _harness.main(NAME, load_check)
