"""safetensors <-> Hurray files, bit-exact, with no framework and no safetensors package.

A safetensors file is an 8-byte little-endian header length ``N``, ``N``
bytes of UTF-8 JSON (``{name: {"dtype", "shape", "data_offsets"}, ...,
"__metadata__": {str: str}}``) and the tensor bytes. The header is parsed here
with the checks the reference implementation makes (safetensors
``tensor.rs``): a 100 MB header cap, offsets inside the data, lengths that
match shape x dtype, and data that is covered exactly, with no hole and no
overlap. Type names come from the element-type table's ``safetensors``
column; a type it lacks is an :class:`UnsupportedError` naming it.

Conversions stream the bytes from one memory map into the other file: no
tensor is materialised, and no value is ever cast.
"""

from __future__ import annotations

import json
import mmap as _mmap
import os
import struct
import sys
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any, NamedTuple

from .container import (
    _CHUNK,
    BUFFER_ALIGNMENT,
    _encode_metadata,
    _fspath,
    _host_tensor,
    _open_regular,
    _plan,
    _write_all,
    _write_plan,
    atomic_output,
    check_suffix,
    load,
)
from .descriptor import MAX_RANK, Descriptor, form_name
from .dtypes import DType, all_dtypes
from .errors import FormatError, UnsupportedError
from .layout import Layout

__all__ = [
    "MAX_HEADER_SIZE",
    "SafetensorsEntry",
    "SafetensorsIndex",
    "hurray_to_safetensors",
    "parse_header",
    "read_header",
    "safetensors_to_hurray",
    "save",
]

MAX_HEADER_SIZE = 100_000_000  # safetensors' own limit (tensor.rs MAX_HEADER_SIZE)
_LEN = struct.Struct("<Q")
_METADATA_KEY = "__metadata__"
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})
_Progress = Callable[[int, int], None]


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


def parse_header(prefix: bytes | memoryview, file_size: int) -> SafetensorsIndex:
    """Parse a safetensors header; ``prefix`` holds at least the first ``8 + N`` bytes."""
    try:
        view = memoryview(prefix).cast("B")
    except TypeError:
        raise FormatError(f"expected bytes, got {type(prefix).__name__}", field="input") from None
    if file_size < _LEN.size or len(view) < _LEN.size:
        raise FormatError(f"truncated: {file_size} bytes, the header length alone needs 8",
                          field="header_length")
    (n,) = _LEN.unpack_from(view, 0)
    if n > MAX_HEADER_SIZE:
        raise FormatError(f"header of {n} bytes exceeds the {MAX_HEADER_SIZE}-byte limit",
                          field="header_length")
    if n > file_size - _LEN.size or len(view) < _LEN.size + n:
        raise FormatError(f"truncated: the header of {n} bytes extends past the end of the "
                          f"file ({file_size} bytes)", field="header_length")
    raw = bytes(view[_LEN.size:_LEN.size + n])
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
    data_start = _LEN.size + n
    data_size = file_size - data_start
    metadata: dict[str, str] = {}
    entries = []
    for name, info in header.items():
        if name == _METADATA_KEY:
            if not isinstance(info, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in info.items()):
                raise FormatError("__metadata__ must map strings to strings",
                                  field=_METADATA_KEY)
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
        dtype = _by_name().get(st)
        if dtype is None:
            raise UnsupportedError(
                f"tensor {name!r} has safetensors dtype {st!r}, which has no Hurray element "
                f"type (the table's safetensors column knows {', '.join(_by_name())})")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(map(_uint, shape)):
            raise FormatError(f"shape must be a list of at most {MAX_RANK} non-negative "
                              f"integers, got {shape!r}"[:300], field=f"{field}.shape")
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
        n_elems = d.element_count
        if dtype.is_subbyte and (n_elems * dtype.bits) % 8:
            raise FormatError(f"{n_elems} {st} elements do not fill whole bytes",
                              field=f"{field}.shape")
        if entry.end - entry.begin != d.nbytes:
            raise FormatError(f"data_offsets span {entry.end - entry.begin} bytes, shape "
                              f"{list(shape)} of {st} needs {d.nbytes}",
                              field=f"{field}.data_offsets")
        entries.append(entry)
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
    return SafetensorsIndex(tuple(entries), metadata, data_start, file_size)


def _read_header_from(f: Any) -> SafetensorsIndex:
    size = os.fstat(f.fileno()).st_size
    head = f.read(_LEN.size)
    if len(head) == _LEN.size:
        (n,) = _LEN.unpack(head)
        if n <= min(MAX_HEADER_SIZE, size - _LEN.size):  # read only what the file justifies
            head += f.read(n)
    return parse_header(head, size)


def read_header(path: str | os.PathLike[str]) -> SafetensorsIndex:
    """Read and check a safetensors file's header (not its data)."""
    with _open_regular(path) as f:
        return _read_header_from(f)


def safetensors_to_hurray(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                          checksums: bool = True, fsync: bool = True,
                          progress: _Progress | None = None,
                          alignment: int = BUFFER_ALIGNMENT) -> int:
    """Convert a ``.safetensors`` file to a Hurray file; returns the number of tensors.

    Names, shapes, bytes and the ``__metadata__`` strings carry over unchanged;
    ``alignment`` is the output's buffer alignment (a power of two >= 64).
    """
    check_suffix(dst, "hurray")
    if sys.byteorder != "little":
        raise UnsupportedError("both formats are little-endian; this host is big-endian")
    with _open_regular(src, "src") as f:
        idx = _read_header_from(f)
        mm = _mmap.mmap(f.fileno(), 0, access=_mmap.ACCESS_READ)  # >= 8 bytes: parsed
    views: list[memoryview] = []
    failed = True
    try:
        whole = memoryview(mm)
        views.append(whole)
        if len(whole) != idx.file_size:
            raise FormatError("the file changed size while it was opened", field="file_size")
        items = []
        for e in idx.entries:
            v = whole[idx.data_start + e.begin:idx.data_start + e.end]
            views.append(v)
            items.append((e.name, e.descriptor, [v]))
        plan = _plan(items, idx.metadata, alignment, checksums, [])
        _write_plan(dst, plan, fsync=fsync, progress=progress)
        failed = False
        return len(items)
    finally:
        for v in reversed(views):
            v.release()
        try:
            mm.close()
        except BufferError:
            # Slices of the map are still referenced by the traceback of the error
            # being raised (a full disk, Ctrl-C, a failing progress callback): that
            # error is the one to report; the map closes when they are freed.
            if not failed:
                raise


def _safetensors_view(name: str, t: Any) -> tuple[str, list[int], memoryview]:
    d: Descriptor = t.descriptor
    if d.layout not in (Layout.ROW_MAJOR, Layout.STRIDED) or d.quantization is not None:
        what = form_name(d)
        raise UnsupportedError(f"entry {name!r} is {what}; safetensors holds dense tensors only")
    if d.shard is not None:
        raise UnsupportedError(f"entry {name!r} is a shard; safetensors has no place for its "
                               "position in the global tensor")
    st = d.dtype.safetensors
    if st is None:
        raise UnsupportedError(f"entry {name!r} is {d.dtype.name}, which safetensors cannot "
                               "hold (no name in the element-type table's safetensors column)")
    if d.dtype.is_subbyte:
        if d.padded:
            raise UnsupportedError(f"entry {name!r} is {d.dtype.name} stored one element per "
                                   f"byte; safetensors {st} is packed: pack it first")
        if (d.element_count * d.dtype.bits) % 8:
            raise UnsupportedError(f"entry {name!r} has {d.element_count} {d.dtype.name} "
                                   "elements, which do not fill whole bytes as safetensors "
                                   "requires")
    if d.layout == Layout.STRIDED:
        t = t.copy()  # safetensors is row-major only: gather the strided view
    return st, list(d.shape), t.memoryview()


def hurray_to_safetensors(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                          fsync: bool = True, progress: _Progress | None = None,
                          verify: bool = True) -> int:
    """Convert a Hurray file to ``.safetensors``; returns the number of tensors.

    Dense tensors of the types safetensors names convert bit-exactly (strided
    ones are gathered to row-major); anything else (sparse, quantized, shards,
    types safetensors lacks) is an :class:`UnsupportedError` naming the entry.
    ``verify`` (the default) first checks every byte of ``src``, its data
    checksums included: safetensors has no checksums, so damage that is not
    caught here would pass on unnoticed. A damaged ``src`` is a
    :class:`FormatError` and nothing is written.
    """
    check_suffix(dst, "safetensors")
    tensors = load(src, verify=verify)
    return _write_safetensors(dst, tensors, tensors.metadata, fsync=fsync, progress=progress)


def save(path: str | os.PathLike[str], mapping: Mapping[str, Any],
         metadata: Mapping[str, str] | None = None, *, fsync: bool = True,
         progress: _Progress | None = None) -> int:
    """Write ``{name: tensor}`` to a ``.safetensors`` file, atomically; returns the count.

    The counterpart of :func:`hb.save` for the safetensors format (which
    :func:`hb.save` refuses to write under a ``.safetensors`` name). Values are
    what :func:`hb.save` takes; they must be dense, of a type safetensors names
    (see :func:`hurray_to_safetensors`). ``metadata`` becomes ``__metadata__``.
    """
    target = _fspath(path, "path")
    check_suffix(target, "safetensors")
    if not isinstance(mapping, Mapping):
        raise UnsupportedError(f"expected a mapping of names to tensors, got "
                               f"{type(mapping).__name__}")
    _encode_metadata(metadata)  # the same rules as a Hurray file's metadata
    tensors = {}
    for name, value in mapping.items():
        if not isinstance(name, str):
            raise UnsupportedError(f"entry names must be str, got {type(name).__name__} "
                                   f"{name!r}")
        tensors[name] = _host_tensor(name, value)
    return _write_safetensors(target, tensors, metadata, fsync=fsync, progress=progress)


def _write_safetensors(dst: str | os.PathLike[str], tensors: Mapping[str, Any],
                       metadata: Mapping[str, str] | None, *, fsync: bool,
                       progress: _Progress | None) -> int:
    check_suffix(dst, "safetensors")
    if sys.byteorder != "little":
        raise UnsupportedError("both formats are little-endian; this host is big-endian")
    header: dict[str, Any] = {}
    if metadata:
        header[_METADATA_KEY] = dict(metadata)
    views, pos = [], 0
    for name, t in tensors.items():
        if name == _METADATA_KEY:
            raise FormatError(f"an entry named {_METADATA_KEY!r} cannot be written to "
                              "safetensors, whose header reserves that key for the metadata: "
                              "rename the entry", field="name")
        st, shape, view = _safetensors_view(name, t)
        header[name] = {"dtype": st, "shape": shape, "data_offsets": [pos, pos + len(view)]}
        views.append(view)
        pos += len(view)
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # safetensors pads its header with spaces to 8 bytes
    if len(raw) > MAX_HEADER_SIZE:
        raise UnsupportedError(f"the safetensors header would be {len(raw)} bytes, over the "
                               f"{MAX_HEADER_SIZE}-byte limit")
    total = pos
    with atomic_output(dst, fsync=fsync) as fd:
        _write_all(fd, _LEN.pack(len(raw)) + raw)
        done = 0
        for view in views:
            for k in range(0, len(view), _CHUNK):
                chunk = view[k:k + _CHUNK]
                _write_all(fd, chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    return len(views)


def load_open(f: Any, path: str, *, mmap: bool = True, verify: bool = False) -> Any:
    """A safetensors file, opened as ``f`` (a regular file at offset 0), as a ``TensorFile``.

    What :func:`hurray_bridge.load` returns for a safetensors file: the tensors
    point into one read-only memory map of the file (``mmap=False``: each is
    read into fresh, writable, 64-byte aligned memory) and ``metadata`` is its
    ``__metadata__``. The format has no checksums, so ``verify=True`` checks
    what every load checks: the header and that each tensor's bytes are there.
    """
    from .container import (
        BUFFER_ALIGNMENT,
        EntryInfo,
        TensorFile,
        _copy_tensors,
        _file_reader,
        _map,
        _Mapping,
        _pow2_alignment,
        _tensors_over,
    )
    from .layout import BufferRole
    from .wire import BufferEntry

    if sys.byteorder != "little":
        raise UnsupportedError("safetensors is little-endian; this host is big-endian")
    idx = _read_header_from(f)
    entries = [EntryInfo(i, e.name, e.descriptor,
                         (BufferEntry(BufferRole.DATA, e.begin, e.end - e.begin),), None)
               for i, e in enumerate(idx.entries)]
    if not mmap:
        return TensorFile(_copy_tensors(entries, _file_reader(f, idx.data_start)),
                          dict(idx.metadata), BUFFER_ALIGNMENT)
    if idx.file_size == idx.data_start:  # no tensor bytes: nothing to map
        return TensorFile(_tensors_over(entries, 0, None, True), dict(idx.metadata),
                          BUFFER_ALIGNMENT)
    mm = _map(f, idx.file_size)
    view = memoryview(mm)
    try:
        owner = _Mapping(view, mm, path)
    except BaseException:
        view.release()
        mm.close()
        raise
    base = owner.address + idx.data_start
    # safetensors places tensors back to back: the guaranteed alignment is what they share
    alignment = BUFFER_ALIGNMENT
    for e in idx.entries:
        if e.end > e.begin:
            alignment = _pow2_alignment(base + e.begin, alignment)
    return TensorFile(_tensors_over(entries, base, owner, True), dict(idx.metadata), alignment)
