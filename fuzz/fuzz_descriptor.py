#!/usr/bin/env python3
"""Fuzz target: ``hb.Descriptor.from_bytes`` / ``hurray_bridge.wire.decode``.

Every input either decodes or raises ``hb.FormatError``. A decoded descriptor
must be fully usable (hash, repr, sizes, buffer table) and its encoding is
canonical: re-encoding it with the offsets it was read with gives back the
input byte for byte, but for two fields a reader ignores: the minor version
(any 1.x is read, 1.0 is written) and a zero-length buffer's offset (rule 3 of
metadata.md §8: ignored on read, written as 0). When ``hurray_bridge._speedups``
is built, its dense fast path must answer every input as wire.py's Python one.
See ``fuzz/README.md``.

    python fuzz/fuzz_descriptor.py fuzz/corpus/descriptor -max_total_time=300
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness

NAME = "descriptor"
_ENTRY_AT = struct.Struct("<B7sQQ")


def load_check() -> _harness.Check:
    import hurray_bridge as hb
    from hurray_bridge import wire

    FormatError = hb.FormatError

    compiled = wire._decode_dense is not wire._decode_dense_python

    def check(data: bytes) -> None:
        if compiled:  # the compiled dense fast path answers as the Python one, always
            c, py = wire._decode_dense(data, len(data)), wire._decode_dense_python(data, len(data))
            if c != py or (c is not None and repr(c[0]) != repr(py[0])):
                raise _harness.Finding(f"compiled and Python dense decoders differ: {c} / {py}")
        try:
            d = hb.Descriptor.from_bytes(data)
        except FormatError:
            return
        _usable(hb, d)
        d2, table, size = wire.decode_prefix(data)
        if d2 != d or size != len(data):
            raise _harness.Finding(f"decode and decode_prefix disagree: {d!r} / {d2!r}")
        again = wire.encode(d, [e.offset if e.length else 0 for e in table])
        expected = bytearray(data)
        expected[5] = wire.VERSION[1]  # a reader accepts any minor version; a writer writes its own
        at = len(data) - wire.BUFFER_ENTRY_SIZE * len(table)
        for j, e in enumerate(table):
            if not e.length:  # rule 3: a reader ignores a zero-length buffer's offset
                struct.pack_into("<Q", expected, at + 24 * j + 8, 0)
        if again != bytes(expected):
            raise _harness.Finding(f"{d!r} re-encodes to different bytes")
        if hb.Descriptor.from_bytes(d.to_bytes()) != d:
            raise _harness.Finding(f"{d!r} does not round-trip through canonical offsets")

    return check


def _usable(hb: Any, d: Any) -> None:
    hash(d)
    repr(d)
    assert d.rank <= hb.MAX_RANK
    if d.is_dynamic:
        return
    specs = d.buffer_layout()
    assert d.element_count >= 0 and d.nbytes == specs[0].nbytes
    assert 1 <= len(specs) <= 8 and all(s.nbytes >= 0 for s in specs)


def prepare(data: bytes) -> bytes:
    return data


if __name__ == "__main__":
    _harness.main(NAME, load_check, prepare=prepare)
