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

The same writers refuse a ``bool8`` byte other than 0x00 and 0x01 (element-types.md
§2: a writer must not write one). NumPy holds any byte under ``np.bool_`` that
``frombuffer`` gave it, and a foreign file may too; since which of the two values such
a byte means is the producer's call, not ours, it is refused by name, not changed.

Padded sub-byte data (element-types.md §4.3) is the other way round: the bits above an
element's ``bits`` in its byte MUST be written as zero and MUST be ignored on read, so
the format itself says what ``0xff`` as an int4 is (-1, the low bits). Zeroing them keeps
every value, where refusing would fail data any reader takes (``np.frombuffer`` of raw
bytes as ``ml_dtypes.int4``). So the writers zero them: a run of the buffer that has
some set is written as a masked copy of that run (1 MiB at most), the rest from the
source. ``verify`` reports a file that has them (:func:`high_bits`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from .descriptor import Descriptor
from .dtypes import bool8
from .errors import FormatError
from .layout import Layout

__all__ = ["check_bool8", "check_bool8_bytes", "high_bits", "placed_pieces",
           "set_trailing_bits", "verbatim", "written_pieces"]

Piece = memoryview | bytes
_BOOL8_TAG = bool8.tag  # (a tag names one type: cheaper to compare than the DType)
_NOT_BOOL8 = b"\x00\x01"  # deleted by bytes.translate: what is left is no bool8 value
_STEP = 1 << 20


def check_bool8(d: Descriptor, primary: Any, name: str | None = None) -> None:
    """Refuse a bool8 byte other than 0x00 or 0x01 among ``d``'s elements: a row-major or
    strided data buffer or a sparse one's values (``primary``, a byte view or a file
    region with ``read(start, n)``). A strided buffer's gaps are no elements: when some
    byte of it is no bool8 value, its elements alone are looked at. (Tiled buffers, whose
    edge tiles hold padding, are not checked.)"""
    if d.dtype == bool8 and d.layout != Layout.TILED:
        check_bool8_bytes(primary, name, d if d.layout == Layout.STRIDED else None)


def check_bool8_bytes(primary: Any, name: str | None = None,
                      strided: Descriptor | None = None) -> None:
    """:func:`check_bool8` of bytes that are all elements (a row-major bool8 tensor's, as
    the safetensors writer has them), or, with ``strided``, the elements of that
    descriptor's buffer."""
    read = getattr(primary, "read", None)
    for k in range(0, len(primary), _STEP):
        n = min(_STEP, len(primary) - k)
        chunk = read(k, n) if read is not None else bytes(primary[k:k + n])
        if chunk.translate(None, _NOT_BOOL8):
            if strided is not None:
                whole = read(0, len(primary)) if read is not None else bytes(primary)
                _check_strided(strided, whole, name)
                return
            i = next(j for j, v in enumerate(chunk) if v > 1)
            _refuse(k + i, chunk[i], name)


def _check_strided(d: Descriptor, data: bytes, name: str | None) -> None:
    bad = _first_bad_element(d, data, _NOT_BOOL8)
    if bad is not None:
        _refuse(*bad, name)


def _first_bad_element(d: Descriptor, data: bytes, valid: bytes) -> tuple[int, int] | None:
    """The first element (in row-major order) of a strided one-byte-per-element buffer whose
    byte is not among ``valid``, and that byte; the gaps between elements are no elements."""
    # Element [0, ..., 0] is where the negative strides' dimensions start from.
    shape, strides = d.shape, d.strides_or_compact
    at = sum((n - 1) * -s for n, s in zip(shape, strides, strict=True) if s < 0 and n)
    inner = bool(shape) and strides[-1] == 1  # the innermost elements are contiguous
    run, outer = (shape[-1], shape[:-1]) if inner else (1, shape)
    count = 0
    for idx in itertools.product(*(range(n) for n in outer)):
        off = at + sum(i * s for i, s in zip(idx, strides, strict=False))
        elems = data[off:off + run]
        if elems.translate(None, valid):
            i = next(j for j, v in enumerate(elems) if v not in valid)
            return count + i, elems[i]
        count += run
    return None


def _refuse(element: int, byte: int, name: str | None) -> None:
    what = f"entry {name!r}: " if name is not None else ""
    raise FormatError(f"{what}bool8 element {element} holds the byte {byte:#04x}; only "
                      "0x00 and 0x01 are bool8 values (NumPy: write `a != 0`, a bool8 array "
                      "of the same truth values)", field="data")


def set_trailing_bits(d: Descriptor, last_byte: int) -> int:
    """The trailing bits that are set in ``last_byte``, the primary buffer's last byte."""
    k = d.trailing_bits
    return last_byte & ~(0xFF >> k) & 0xFF if k else 0


# For each sub-byte width: its byte values with the high bits clear (what a padded element
# may hold), and the table that clears them.
_PADDED_VALID = {bits: bytes(range(1 << bits)) for bits in (1, 2, 4)}
_PADDED_MASK = {bits: bytes(b & ((1 << bits) - 1) for b in range(256)) for bits in (1, 2, 4)}


def _chunk(primary: Any, k: int, n: int) -> bytes:
    read = getattr(primary, "read", None)  # a file region (container._Region)
    return read(k, n) if read is not None else bytes(primary[k:k + n])


def _padded_pieces(d: Descriptor, primary: Any) -> tuple[Piece, ...]:
    """A padded sub-byte buffer as the pieces to write: its runs as they are, except the
    runs with a high bit set, masked copies (element-types.md §4.3)."""
    valid, mask = _PADDED_VALID[d.dtype.bits], _PADDED_MASK[d.dtype.bits]
    pieces: list[Piece] = []
    clean_from = 0
    for k in range(0, len(primary), _STEP):
        n = min(_STEP, len(primary) - k)
        chunk = _chunk(primary, k, n)
        if chunk.translate(None, valid):
            if k > clean_from:
                pieces.append(primary[clean_from:k])
            pieces.append(chunk.translate(mask))
            clean_from = k + n
    if not pieces:
        return (primary,)
    if clean_from < len(primary):
        pieces.append(primary[clean_from:])
    return tuple(pieces)


def high_bits(d: Descriptor, primary: Any) -> tuple[int, int] | None:
    """For ``verify``: the first element of a padded sub-byte buffer (``primary``, bytes or
    a file region with ``read(start, n)``) whose byte has a high bit set, and that byte;
    ``None`` when there is none. A strided buffer's gaps are no elements."""
    if not d.padded:
        return None
    valid = _PADDED_VALID[d.dtype.bits]
    for k in range(0, len(primary), _STEP):
        chunk = _chunk(primary, k, min(_STEP, len(primary) - k))
        if chunk.translate(None, valid):
            if d.layout == Layout.STRIDED:
                return _first_bad_element(d, _chunk(primary, 0, len(primary)), valid)
            i = next(j for j, v in enumerate(chunk) if v not in valid)
            return k + i, chunk[i]
    return None


def written_pieces(d: Descriptor, views: Sequence[memoryview],
                   name: str | None = None) -> list[tuple[Piece, ...]]:
    """For each buffer of ``d`` (``views`` in table order), the pieces that make its bytes;
    a ``FormatError`` naming ``name`` for a bool8 byte that is no bool8 value."""
    if views:
        check_bool8(d, views[0], name)
    out: list[tuple[Piece, ...]] = [(v,) for v in views]
    if views and d.padded:  # (padded data has no trailing bits: a byte per element)
        out[0] = _padded_pieces(d, views[0])
    if views and len(views[0]) and d.trailing_bits:  # the primary buffer is the first
        v = views[0]
        last = v[-1]
        if set_trailing_bits(d, last):
            out[0] = (v[:-1], bytes((last & (0xFF >> d.trailing_bits),)))
    return out


def verbatim(d: Descriptor) -> bool:
    """Whether ``d``'s buffers are written as they are: no bool8 byte to check and no
    sub-byte bits to mask (:func:`written_pieces` returns each view as its one piece)."""
    dt = d.dtype
    return dt.bits >= 8 and dt.tag != _BOOL8_TAG


def placed_pieces(
    d: Descriptor, views: Sequence[memoryview], offsets: Sequence[int], name: str | None = None
) -> tuple[tuple[Piece, ...], tuple[int, ...]]:
    """:func:`written_pieces` flattened, each piece with its offset (buffers at ``offsets``)."""
    if len(views) == 1 and verbatim(d):
        return (views[0],), (offsets[0],)  # one buffer, neither checked nor masked
    pieces: list[Piece] = []
    at: list[int] = []
    for parts, off in zip(written_pieces(d, views, name), offsets):
        for p in parts:
            pieces.append(p)
            at.append(off)
            off += len(p)
    return tuple(pieces), tuple(at)
