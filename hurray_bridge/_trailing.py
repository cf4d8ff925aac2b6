"""Packed sub-byte data leaves the process with its trailing bits zero.

element-types.md §4.1 rule 6: the bits after the last element of a packed sub-byte
buffer (the high bits of its last byte) are written as zero. Producers do not always
keep them so: an Arrow boolean slice shares its parent's bitmap byte, and JAX leaves
them uninitialised. Every writer -- files (``container._plan``), streams, pickle and
shared memory -- therefore hands its buffers through :func:`written_pieces`, which
returns each buffer as the pieces to write: the buffer itself, or, when its last byte
has a trailing bit set, all but that byte (a view of the source, no copy) and the
masked byte. The source is never modified (it may be read-only, or someone else's).
:func:`set_trailing_bits` is the reader's side of the same rule, for ``verify``.
"""

from __future__ import annotations

from collections.abc import Sequence

from .descriptor import Descriptor

__all__ = ["placed_pieces", "set_trailing_bits", "written_pieces"]

Piece = memoryview | bytes


def set_trailing_bits(d: Descriptor, last_byte: int) -> int:
    """The trailing bits that are set in ``last_byte``, the primary buffer's last byte."""
    k = d.trailing_bits
    return last_byte & ~(0xFF >> k) & 0xFF if k else 0


def written_pieces(d: Descriptor, views: Sequence[memoryview]) -> list[tuple[Piece, ...]]:
    """For each buffer of ``d`` (``views`` in table order), the pieces that make its bytes."""
    out: list[tuple[Piece, ...]] = [(v,) for v in views]
    if views and len(views[0]) and d.trailing_bits:  # the primary buffer is the first
        v = views[0]
        last = v[-1]
        if set_trailing_bits(d, last):
            out[0] = (v[:-1], bytes((last & (0xFF >> d.trailing_bits),)))
    return out


def placed_pieces(
    d: Descriptor, views: Sequence[memoryview], offsets: Sequence[int]
) -> tuple[tuple[Piece, ...], tuple[int, ...]]:
    """:func:`written_pieces` flattened, each piece with its offset (buffers at ``offsets``)."""
    pieces: list[Piece] = []
    at: list[int] = []
    for parts, off in zip(written_pieces(d, views), offsets):
        for p in parts:
            pieces.append(p)
            at.append(off)
            off += len(p)
    return tuple(pieces), tuple(at)
