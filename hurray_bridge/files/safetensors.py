"""safetensors <-> Hurray files, bit-exact, with no framework and no safetensors package.

The header and its checks are in :mod:`hurray_bridge._safetensors_header` (its
names are re-exported here); :func:`hurray_bridge.load` opens a safetensors file
through :mod:`hurray_bridge.files.reading`. This module writes safetensors files and
converts between the two formats.

Conversions copy the bytes from one file into the other through a few reused
buffers (``engine.DataWriter``): no tensor is materialised, no value is
ever cast, and the memory used does not grow with the file.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from .._gc import collection_paused, covers_write
from .._trailing import check_bool8_bytes
from ..descriptor import Descriptor, dense_descriptor, form_name
from ..dtypes import DType
from ..errors import FormatError, HurrayError, UnsupportedError
from ..layout import Layout
from ..shards import ShardedTensor
from ..tensor import Tensor
from .convert import safetensors_plan
from .data_checks import check_checksum, check_head_padding, check_padding_and_bits, verify_file
from .disk import atomic_output, check_suffix, fspath, open_regular, write_all
from .engine import CHUNK, DataWriter, Item, Runs, write_data, write_views
from .format import BUFFER_ALIGNMENT, FLAG_DATA_CHECKSUMS, MAGIC, EntryInfo, Header, read_head
from .plan import dense_reader, encode_metadata, host_tensor, no_answer, small_candidate
from .pread import read_range
from .reading import copy_tensors, file_reader, load, load_safetensors
from .regions import Piece, Region
from .safetensors_header import LENGTH as _LEN
from .safetensors_header import (
    MAX_HEADER_SIZE,
    SafetensorsEntry,
    SafetensorsIndex,
    parse_header,
    read_header,
)
from .safetensors_header import METADATA_KEY as _METADATA_KEY
from .writing import write_plan

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
    with open_regular(src, "src") as f:
        plan, count = safetensors_plan(f, alignment, checksums)
        write_plan(dst, plan, fsync=fsync, progress=progress)
    return count


class _Out(NamedTuple):
    """One tensor of a safetensors output, and where its bytes come from."""

    name: str
    dtype: str  # the safetensors name
    shape: list[int]
    nbytes: int
    # (bytes, checksum slot or None, written?): a piece that is only read is checked
    pieces: tuple[tuple[Piece, int | None, bool], ...]


def _safetensors_dtype(name: str, d: Descriptor) -> str:
    """The safetensors type of entry ``name``, or the error that says why it has none."""
    if name == _METADATA_KEY:
        raise FormatError(f"an entry named {_METADATA_KEY!r} cannot be written to "
                          "safetensors, whose header reserves that key for the metadata: "
                          "rename the entry", field="name")
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
    return st


def _out_of(name: str, t: Tensor | ShardedTensor) -> _Out:
    """A tensor in memory as a safetensors entry (a strided one gathered to row-major)."""
    if isinstance(t, ShardedTensor):  # what hb.load makes of NAME[k] shard entries
        raise UnsupportedError(f"entry {name!r} is a sharded tensor; safetensors has no place "
                               "for its shards' positions in the global tensor (hb.assemble it "
                               "first)")
    d = t.descriptor
    st = _safetensors_dtype(name, d)
    if d.layout == Layout.STRIDED:
        t = t.copy()  # safetensors is row-major only: gather the strided view
    view = t.memoryview()
    return _Out(name, st, list(d.shape), len(view), ((view, None, True),))


def hurray_to_safetensors(src: str | os.PathLike[str], dst: str | os.PathLike[str], *,
                          fsync: bool = True, progress: _Progress | None = None,
                          verify: bool = True) -> int:
    """Convert a Hurray file to ``.safetensors``; returns the number of tensors.

    Dense tensors of the types safetensors names convert bit-exactly (strided
    ones are gathered to row-major); anything else (sparse, quantized, shards,
    types safetensors lacks) is an :class:`UnsupportedError` naming the entry.
    ``verify`` (the default) checks every byte of ``src``, its data
    checksums included, as it copies them: safetensors has no checksums, so
    damage that is not caught here would pass on unnoticed. A damaged ``src``
    is a :class:`FormatError` (the one :func:`hurray_bridge.files.reading.verify` raises) and
    nothing is written. ``fsync=False`` keeps the write atomic but not durable.
    """
    check_suffix(dst, "safetensors")
    with open_regular(src) as f:
        if f.read(len(MAGIC)) == MAGIC:
            f.seek(0)
            return _from_hurray(f, fspath(src, "path"), dst, fsync=fsync, progress=progress,
                                verify=verify)
    # Not a Hurray file: load opens a safetensors file too, and names anything else.
    tensors = load(src, verify=verify)
    return _write_safetensors(dst, [_out_of(name, t) for name, t in tensors.items()],
                              tensors.metadata, fsync=fsync, progress=progress)


def _from_hurray(f: Any, path: str, dst: str | os.PathLike[str], *, fsync: bool,
                 progress: _Progress | None, verify: bool) -> int:
    """:func:`hurray_to_safetensors` of the Hurray file open as ``f``, in one pass.

    Each tensor's bytes are copied from the file; with ``verify`` the copy
    computes the data checksums on the way and the padding is read as well,
    in the order :func:`hurray_bridge.files.reading.verify` checks them, and any defect raises
    before the output replaces ``dst`` (so nothing is written).
    """
    h, entries, meta = read_head(f)
    try:
        dtypes = [_safetensors_dtype(e.name, e.descriptor) for e in entries]
    except (FormatError, UnsupportedError):
        if verify:
            verify_file(f, h, entries)  # a damaged file is refused as damaged first
        raise
    fd = f.fileno()
    sums = verify and bool(h.flags & FLAG_DATA_CHECKSUMS)
    gathered = _gather(f, h, [e for e in entries if e.descriptor.layout == Layout.STRIDED])
    outs = []
    for e, st in zip(entries, dtypes, strict=True):
        (b,) = e.buffers  # a dense tensor has its data buffer alone
        stored = Region(fd, h.data_offset + b.offset, b.length)
        slot = e.position if sums and e.checksum is not None else None
        view = gathered.get(e.name)
        if view is None:
            pieces: tuple[tuple[Piece, int | None, bool], ...] = ((stored, slot, True),)
        else:  # the gathered copy is written, the stored span checked
            pieces = ((view, None, True),) if slot is None else (
                (stored, slot, False), (view, None, True))
        outs.append(_Out(e.name, st, list(e.descriptor.shape),
                         b.length if view is None else len(view), pieces))
    read = functools.partial(read_range, fd)

    def check(crcs: Sequence[int]) -> None:  # what verify checks after the index, in order
        if sums:
            for e in entries:
                check_checksum(e, crcs[e.position])
        check_padding_and_bits(read, h, entries)

    if verify:
        check_head_padding(read, h)
    return _write_safetensors(dst, outs, meta, fsync=fsync, progress=progress,
                              slots=len(entries) if sums else 0,
                              check=check if verify else None)


def _gather(f: Any, h: Header, strided: Sequence[EntryInfo]) -> dict[str, memoryview]:
    """Row-major copies of the strided entries of the open Hurray file ``f``, by name.

    Each entry's span is read into memory (a memory map of the file, which a file cut
    meanwhile would turn into SIGBUS, is not used), gathered, and let go.
    """
    read = file_reader(f, h.data_offset)
    return {e.name: copy_tensors([e], read)[e.name].copy().memoryview() for e in strided}


def save(path: str | os.PathLike[str], mapping: Mapping[str, Any],
         metadata: Mapping[str, str] | None = None, *, fsync: bool = True,
         progress: _Progress | None = None) -> int:
    """Write ``{name: tensor}`` to a ``.safetensors`` file, atomically; returns the count.

    The counterpart of :func:`hb.save` for the safetensors format (which
    :func:`hb.save` refuses to write under a ``.safetensors`` name). Values are
    what :func:`hb.save` takes; they must be dense, of a type safetensors names
    (see :func:`hurray_to_safetensors`). ``metadata`` becomes ``__metadata__``.
    """
    target = fspath(path, "path")
    check_suffix(target, "safetensors")
    if not isinstance(mapping, Mapping):
        raise UnsupportedError(f"expected a mapping of names to tensors, got "
                               f"{type(mapping).__name__}")
    encode_metadata(metadata)  # the same rules as a Hurray file's metadata
    values: dict[str, Tensor | tuple[DType, tuple[int, ...], memoryview]] = {}
    dense = dense_reader()  # plain host arrays need no hb.Tensor (as in hb.save)
    with collection_paused():
        # A file of plain arrays under a CHUNK of data (and of header), planned in C: the
        # bytes _write_safetensors' small file would be; covered (covers_write) as hb.save's.
        small = None if progress is not None else _small_pieces(mapping, metadata)
        if small is not None:
            with atomic_output(target, fsync=fsync) as fd:
                write_views(fd, small)
            del small
            return len(mapping)
        for name, value in mapping.items():
            if not isinstance(name, str):
                raise UnsupportedError(f"entry names must be str, got {type(name).__name__} "
                                       f"{name!r}")
            parts = None if dense is None else dense(value)
            values[name] = host_tensor(name, value) if parts is None else parts
        names = _DENSE_NAMES
        outs = [_out_of(name, v) if isinstance(v, Tensor) else _dense_out(name, v, names)
                for name, v in values.items()]
        if covers_write(sum(o.nbytes for o in outs)):
            del values  # (this call's objects go before collection resumes; see _gc)
            count = _write_safetensors(target, outs, metadata, fsync=fsync, progress=progress)
            del outs
            return count
    return _write_safetensors(target, outs, metadata, fsync=fsync, progress=progress)


# The safetensors name of each element type (by tag) that a plain array of it was saved as.
_DENSE_NAMES: dict[int, str] = {}

# The compiled planner of small files of plain dense arrays (_speedups_c/small_files.c),
# or None where hurray_bridge._speedups was not built (or built before it had one).
_small: Callable[..., list[bytes | memoryview] | None] | None
try:
    from .._speedups import small_safetensors as _small
except ImportError:
    _small = None


def _small_pieces(mapping: Mapping[str, Any],
                  metadata: Mapping[str, str] | None) -> list[bytes | memoryview] | None:
    """The bytes of a safetensors file of ``mapping`` as pieces to write from offset 0
    (the length and header, then each array's bytes), planned in C, when ``mapping`` is
    a dict whose every value is a plain dense array (``_host.dense_bytes``) of a type
    safetensors names, with under a :data:`CHUNK` of data and of header: what
    :func:`_write_safetensors` writes for it, byte for byte. ``None`` for anything else,
    and where the compiled module was not built."""
    if _small is None or not small_candidate(mapping):
        return None
    meta = _HEADER_JSON.encode(dict(metadata)).encode("utf-8") if metadata else b""
    return _small(mapping, meta, MAX_HEADER_SIZE, CHUNK, _describe_array)


def _describe_array(value: Any) -> tuple[bytes | None, tuple[int, ...], int, object, type]:
    """What the compiled planner needs of an array, once per (type, dtype, shape): the
    text of its header object up to its offsets (``{"dtype":"F32","shape":[2,3],
    "data_offsets":[``; None for a value the Python path writes another way), its shape,
    its byte count, and its ``dtype`` and type, which the kept answer holds (see
    ``_speedups_c/small_files.c``)."""
    dense = dense_reader()
    parts = None if dense is None else dense(value)  # (asked of a contiguous array only)
    if parts is None:
        return no_answer(value)
    dtype, shape, view = parts
    try:
        st = _safetensors_dtype("", dense_descriptor(shape, dtype))
    except HurrayError:  # a type safetensors cannot hold: the Python path says so
        return no_answer(value)
    text = _HEADER_JSON.encode({"dtype": st, "shape": list(shape), "data_offsets": [0, 0]})
    return (text[:-len("0,0]}")].encode("utf-8"), shape, view.nbytes, value.dtype,
            type(value))


def _dense_out(name: str, parts: tuple[DType, tuple[int, ...], memoryview],
               names: dict[int, str]) -> _Out:
    """:func:`_out_of` of a plain host array (``plan.dense_reader``'s parts):
    ``names`` keeps the safetensors name of each element type met (tag -> name), which
    for such arrays depends on the type alone (:data:`_DENSE_NAMES`, kept between saves)."""
    dtype, shape, view = parts
    st = names.get(dtype.tag)
    if st is None or name == _METADATA_KEY:
        st = names[dtype.tag] = _safetensors_dtype(name, dense_descriptor(shape, dtype))
    return _new_out(_Out, (name, st, list(shape), len(view), ((view, None, True),)))


_new_out = tuple.__new__  # _Out's own __new__ is a Python function: a call more a tensor


# What json.dumps(header, separators=(",", ":"), ensure_ascii=False) writes, without the
# encoder json.dumps builds at every call given options.
_HEADER_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _write_safetensors(dst: str | os.PathLike[str], outs: Sequence[_Out],
                       metadata: Mapping[str, str] | None, *, fsync: bool,
                       progress: _Progress | None, slots: int = 0,
                       check: Callable[[Sequence[int]], None] | None = None) -> int:
    """Write ``outs`` to ``dst``, atomically; ``check(crcs)`` (of the ``slots`` the pieces
    name) runs once every byte is written, and an error it raises leaves ``dst`` as it was."""
    check_suffix(dst, "safetensors")
    if sys.byteorder != "little":
        raise UnsupportedError("both formats are little-endian; this host is big-endian")
    header: dict[str, Any] = {}
    if metadata:
        header[_METADATA_KEY] = dict(metadata)
    pos = 0
    with collection_paused():
        for o in outs:
            if o.dtype == "BOOL":  # row-major here: every byte written is an element
                for piece, _slot, written in o.pieces:
                    if written:
                        check_bool8_bytes(piece, o.name)
            header[o.name] = {"dtype": o.dtype, "shape": o.shape,
                              "data_offsets": [pos, pos + o.nbytes]}
            pos += o.nbytes
        try:
            raw = _HEADER_JSON.encode(header).encode("utf-8")
        except UnicodeEncodeError:  # (the metadata was checked: a name)
            raise _not_utf8(header) from None
    raw += b" " * (-len(raw) % 8)  # safetensors pads its header with spaces to 8 bytes
    if len(raw) > MAX_HEADER_SIZE:
        raise UnsupportedError(f"the safetensors header would be {len(raw)} bytes, over the "
                               f"{MAX_HEADER_SIZE}-byte limit")
    head = _LEN.pack(len(raw)) + raw

    views = None if progress is not None or slots or pos >= CHUNK else _small_views(outs)
    if views is not None:
        # A small save's head and data in one pass (as hb.save's small files).
        with atomic_output(dst, fsync=fsync) as fd:
            write_views(fd, [head, *views])
        return len(outs)
    items = _data_items(outs, len(head))
    with atomic_output(dst, fsync=fsync) as fd:
        write_all(fd, head)
        crcs = write_data(fd, len(head), pos, slots, items, durable=fsync, progress=progress)
        if check is not None:
            check(crcs)
    return len(outs)


def _not_utf8(header: Mapping[str, Any]) -> FormatError:
    """The error for the first name of ``header`` that UTF-8 cannot encode (a lone
    surrogate, as os.fsdecode makes of undecodable bytes)."""
    for name in header:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            return FormatError(f"entry name {name!r} is not encodable as UTF-8 ({exc.reason}); "
                               "a safetensors header is UTF-8 JSON: rename the entry",
                               field="name")
    return FormatError("the safetensors header is not encodable as UTF-8", field="name")


def _small_views(outs: Sequence[_Out]) -> list[memoryview | bytes] | None:
    """The data of ``outs`` as the views to write after the head, when each output is one
    view in memory that nothing checksums; else None."""
    views: list[memoryview | bytes] = []
    for o in outs:
        if len(o.pieces) != 1:
            return None
        piece, slot, written = o.pieces[0]
        if slot is not None or not written or type(piece) is not memoryview:
            return None
        views.append(piece)
    return views


def _data_items(outs: Sequence[_Out], start: int) -> list[Item]:
    """The items of the data writer for ``outs``, whose bytes begin at file offset
    ``start``."""

    def feeder(o: _Out) -> Callable[[DataWriter], None]:
        if len(o.pieces) == 1 and o.pieces[0][2]:
            piece, slot, _ = o.pieces[0]  # (a partial costs a third of a closure)
            return functools.partial(_put_piece, piece, slot)

        def feed(out: DataWriter) -> None:
            for piece, slot, written in o.pieces:
                if written:
                    out.put(piece, slot)
                else:
                    assert isinstance(piece, Region) and slot is not None
                    out.checksum(piece, slot)
        return feed

    # Outputs of one view in memory and no checksum (a save's), the common case, go in
    # runs (engine.Runs), an item a run, not a partial each.
    runs = Runs()
    add, item, at = runs.add, runs.item, start
    with collection_paused():
        for o in outs:
            if len(o.pieces) == 1:
                piece, slot, written = o.pieces[0]
                if slot is None and written and type(piece) is memoryview:
                    add(at, at, piece, None)
                    at += o.nbytes
                    continue
            item((at, feeder(o)))
            at += o.nbytes
        runs.close()
    return runs.items


def _put_piece(piece: Piece, slot: int | None, out: DataWriter) -> None:
    """The feed of an output of one piece, written."""
    out.put(piece, slot)


# hb.load opens safetensors files through files.reading's reader, which maps both formats
# the same way; the name stays here for callers that hold the open file already.
load_open = load_safetensors
