"""safetensors <-> Hurray files, bit-exact, with no framework and no safetensors package.

The header and its checks are in :mod:`hurray_bridge._safetensors_header` (its
names are re-exported here); :func:`hurray_bridge.load` opens a safetensors file
through :mod:`hurray_bridge.container`. This module writes safetensors files and
converts between the two formats.

Conversions stream the bytes from one memory map into the other file: no
tensor is materialised, and no value is ever cast.
"""

from __future__ import annotations

import json
import mmap as _mmap
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ._safetensors_header import LENGTH as _LEN
from ._safetensors_header import MAX_HEADER_SIZE, SafetensorsEntry, SafetensorsIndex, parse_header
from ._safetensors_header import METADATA_KEY as _METADATA_KEY
from ._safetensors_header import read_header_from as _read_header_from
from .container import (
    _CHUNK,
    BUFFER_ALIGNMENT,
    _encode_metadata,
    _fspath,
    _host_tensor,
    _load_safetensors,
    _open_regular,
    _plan,
    _write_all,
    _write_plan,
    atomic_output,
    check_suffix,
    load,
)
from .descriptor import Descriptor, form_name
from .errors import FormatError, UnsupportedError
from .layout import Layout
from .shards import ShardedTensor

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

_Progress = Callable[[int, int], None]


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
    if isinstance(t, ShardedTensor):  # a Hurray file's NAME[k] shard entries, grouped by load
        raise UnsupportedError(f"entry {name!r} is a sharded tensor; safetensors has no place "
                               "for its shards' positions in the global tensor (hb.assemble it "
                               "first)")
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


# hb.load opens safetensors files through the container's reader, which maps both formats
# the same way; the name stays here for callers that hold the open file already.
load_open = _load_safetensors
