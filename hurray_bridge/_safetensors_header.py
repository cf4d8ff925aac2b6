"""The safetensors header: its parser and the index it describes (no framework, no
safetensors package).

A safetensors file is an 8-byte little-endian header length ``N``, ``N``
bytes of UTF-8 JSON (``{name: {"dtype", "shape", "data_offsets"}, ...,
"__metadata__": {str: str}}``) and the tensor bytes. The header is parsed here
with the checks the reference implementation makes (safetensors
``tensor.rs``): a 100 MB header cap, offsets inside the data, lengths that
match shape x dtype, and data that is covered exactly, with no hole and no
overlap. Type names come from the element-type table's ``safetensors``
column; a type it lacks is an :class:`UnsupportedError` naming it.

Below both :mod:`hurray_bridge.container`, whose ``load`` opens safetensors files
too, and :mod:`hurray_bridge.safetensors_io`, the converters and the writer, which
build on the container.
"""

from __future__ import annotations

import json
import os
import struct
from functools import lru_cache
from typing import Any, NamedTuple

from ._disk import checkpoint
from .descriptor import DYNAMIC, MAX_RANK, Descriptor
from .dtypes import DType, all_dtypes
from .errors import FormatError, UnsupportedError

MAX_HEADER_SIZE = 100_000_000  # safetensors' own limit (tensor.rs MAX_HEADER_SIZE)
LENGTH = struct.Struct("<Q")  # the header length N, before the JSON
METADATA_KEY = "__metadata__"  # the one key of the JSON that is no tensor
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


class SafetensorsEntry(NamedTuple):
    """One tensor of a safetensors file; ``begin``/``end`` are relative to its data."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def descriptor(self) -> Descriptor:
        return Descriptor(self.shape, self.dtype)


class SafetensorsIndex(NamedTuple):
    entries: tuple[SafetensorsEntry, ...]
    metadata: dict[str, str]
    data_start: int  # 8 + N: where the tensor bytes begin in the file
    file_size: int


@lru_cache(maxsize=1)
def _by_name() -> dict[str, DType]:
    return {d.safetensors: d for d in all_dtypes() if d.safetensors is not None}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise FormatError(f"duplicate key {k!r} in the JSON header", field="header")
        out[k] = v
    return out


def _uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def looks_like_safetensors(head: bytes | memoryview) -> bool:
    """Whether a file's first bytes are safetensors' own: the 8-byte header length, then
    the ``{`` of its JSON header (how every reader here tells the format by content)."""
    return len(head) >= 9 and bytes(head[8:9]) == b"{"


def parse_header(prefix: bytes | memoryview, file_size: int) -> SafetensorsIndex:
    """Parse a safetensors header; ``prefix`` holds at least the first ``8 + N`` bytes."""
    return _parse(prefix, file_size)[0]


def _parse(prefix: bytes | memoryview,
           file_size: int) -> tuple[SafetensorsIndex, list[Descriptor]]:
    """:func:`parse_header`, and the descriptor of each entry it checked them by."""
    try:
        view = memoryview(prefix).cast("B")
    except TypeError:
        raise FormatError(f"expected bytes, got {type(prefix).__name__}", field="input") from None
    if file_size < LENGTH.size or len(view) < LENGTH.size:
        raise FormatError(f"truncated: {file_size} bytes, the header length alone needs 8",
                          field="header_length")
    (n,) = LENGTH.unpack_from(view, 0)
    if n > MAX_HEADER_SIZE:
        raise FormatError(f"header of {n} bytes exceeds the {MAX_HEADER_SIZE}-byte limit",
                          field="header_length")
    if n > file_size - LENGTH.size or len(view) < LENGTH.size + n:
        raise FormatError(f"truncated: the header of {n} bytes extends past the end of the "
                          f"file ({file_size} bytes)", field="header_length")
    raw = bytes(view[LENGTH.size:LENGTH.size + n])
    if not raw.startswith(b"{"):
        raise FormatError("the JSON header must start with '{'", field="header")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError as exc:
        raise FormatError(f"the header is not valid UTF-8 ({exc.reason} at byte {exc.start})",
                          field="header") from None
    except RecursionError:
        raise FormatError("the JSON header is nested too deeply", field="header") from None
    except ValueError as exc:  # json.JSONDecodeError, and FormatError from the hook
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"the header is not valid JSON: {exc}", field="header") from None
    if not isinstance(header, dict):
        raise FormatError("the JSON header must be an object", field="header")
    data_start = LENGTH.size + n
    data_size = file_size - data_start
    metadata: dict[str, str] = {}
    entries = []
    descriptors = []
    by_name = _by_name()
    for k, (name, info) in enumerate(header.items()):
        if not k & 1023:
            checkpoint()  # a header of many tensors takes seconds
        if name == METADATA_KEY:
            if not isinstance(info, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
                raise FormatError("__metadata__ must map strings to strings",
                                  field=METADATA_KEY)
            metadata = info
            continue
        field = f"tensors[{name!r}]"
        if not isinstance(info, dict) or set(info) != _ENTRY_KEYS:
            raise FormatError(f"must be an object with exactly {sorted(_ENTRY_KEYS)}",
                              field=field)
        st = info["dtype"]
        shape = info["shape"]
        offsets = info["data_offsets"]
        if not isinstance(st, str):
            raise FormatError(f"dtype must be a string, got {st!r}", field=f"{field}.dtype")
        dtype = by_name.get(st)
        if dtype is None:
            raise UnsupportedError(
                f"tensor {name!r} has safetensors dtype {st!r}, which has no Hurray element "
                f"type (the table's safetensors column knows {', '.join(_by_name())})")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(map(_uint, shape)):
            raise FormatError(f"shape must be a list of at most {MAX_RANK} non-negative "
                              f"integers, got {shape!r}"[:300], field=f"{field}.shape")
        if DYNAMIC in shape:  # (a descriptor would take it for an unknown size)
            raise FormatError(f"shape {shape!r} has a dimension of 2**64 - 1 elements, which "
                              "no file holds (Hurray reads that value as a dynamic "
                              "dimension; safetensors has none)"[:300], field=f"{field}.shape")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_uint, offsets))
                or offsets[0] > offsets[1] or offsets[1] > data_size):
            if (isinstance(offsets, list) and len(offsets) == 2 and all(map(_uint, offsets))
                    and offsets[0] <= offsets[1]):  # well formed, past the end: a short file
                raise FormatError(f"truncated: data_offsets {offsets!r} end past the "
                                  f"{data_size} bytes of data the file holds"[:300],
                                  field=f"{field}.data_offsets")
            raise FormatError(f"data_offsets {offsets!r} must be [begin, end] with "
                              f"0 <= begin <= end <= {data_size}"[:300],
                              field=f"{field}.data_offsets")
        entry = SafetensorsEntry(name, dtype, tuple(shape), offsets[0], offsets[1])
        try:
            d = entry.descriptor
        except FormatError as exc:
            raise FormatError(f"tensor {name!r}: {exc}", field=f"{field}.shape") from None
        if dtype.is_subbyte and (d.element_count * dtype.bits) % 8:
            raise FormatError(f"{d.element_count} {st} elements do not fill whole bytes",
                              field=f"{field}.shape")
        ((_, nbytes),) = d.buffer_layout()  # a dense tensor's one buffer: d.nbytes
        if entry.end - entry.begin != nbytes:
            raise FormatError(f"data_offsets span {entry.end - entry.begin} bytes, shape "
                              f"{list(shape)} of {st} needs {nbytes}",
                              field=f"{field}.data_offsets")
        entries.append(entry)
        descriptors.append(d)
    # Like safetensors: sorted by offset, the tensors cover the data exactly.
    pos = 0
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        if e.begin != pos:
            what = "overlaps the previous tensor" if e.begin < pos else f"leaves a hole at {pos}"
            raise FormatError(f"tensor {e.name!r} at [{e.begin}, {e.end}) {what}",
                              field=f"tensors[{e.name!r}].data_offsets")
        pos = e.end
    if pos != data_size:
        raise FormatError(f"the tensors cover {pos} bytes of data, the file holds {data_size}",
                          field="data")
    return SafetensorsIndex(tuple(entries), metadata, data_start, file_size), descriptors


def read_header_from(f: Any) -> SafetensorsIndex:
    """The checked header of a safetensors file open as ``f`` (at offset 0)."""
    return read_header_and_descriptors(f)[0]


def read_header_and_descriptors(f: Any) -> tuple[SafetensorsIndex, list[Descriptor]]:
    """:func:`read_header_from`, and each entry's descriptor (made once, for a converter)."""
    size = os.fstat(f.fileno()).st_size
    head = f.read(LENGTH.size)
    if len(head) == LENGTH.size:
        (n,) = LENGTH.unpack(head)
        if n <= min(MAX_HEADER_SIZE, size - LENGTH.size):  # read only what the file justifies
            head += f.read(n)
    return _parse(head, size)
