"""Hurray tensor streams over Arrow Flight: a server, ``put`` and ``get``.

A named stream of tensors travels as one Flight stream (docs/spec/interchange.md
§10): the Flight schema is a single ``uint8`` column whose metadata holds the
Hurray stream header and schema descriptor (the bytes a :class:`~hurray_bridge.StreamWriter`
starts with); each tensor is one record batch whose column holds the tensor's
buffers, each at a 64-byte multiple, with the message header and the resolved
descriptor in the batch's ``app_metadata``; an empty batch with an end-of-stream
header closes the stream. The receiver decodes and checks each descriptor against
the schema before it hands out a tensor, and builds that tensor over the record
batch's own memory (no copy) unless the memory is not aligned for its elements.

:class:`FlightTensorServer` keeps the streams put to it in memory, as the record
batches it received, serves them by name and lists them (Flight's ``ListFlights`` and
``GetFlightInfo``; :func:`list_streams` on the client). This module is not imported by
``hurray_bridge.adapters.arrow``: ``pyarrow.flight`` loads only for those who use it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import chain
from typing import Any, NamedTuple

import pyarrow as pa

from hurray_bridge._memory import alloc_aligned, host_view
from hurray_bridge._trailing import verbatim, written_pieces
from hurray_bridge.conversion import asarray_one
from hurray_bridge.descriptor import DYNAMIC, Descriptor
from hurray_bridge.errors import (
    BackendNotAvailableError,
    DynamicShapeError,
    FormatError,
    NotFoundError,
    TransportError,
    UnsupportedError,
)
from hurray_bridge.layout import BufferRole, Layout
from hurray_bridge.stream import (
    _MESSAGE_HEADER,
    _STREAM_HEADER,
    KIND_END,
    KIND_TENSOR,
    MESSAGE_MAGIC,
    check_stream_header,
    conform,
    resolved_schema,
    stream_head,
)
from hurray_bridge.tensor import CPU, Buffer, Tensor
from hurray_bridge.wire import canonical_offsets, decode_prefix, encode

try:
    import pyarrow.flight as flight
except ImportError as exc:  # a pyarrow built without Flight (some conda and source builds)
    raise BackendNotAvailableError("pyarrow.flight", "arrow",
                                   f"this pyarrow was built without Flight ({exc})") from exc

__all__ = ["COLUMN", "SCHEMA_KEY", "FlightTensorReader", "FlightTensorServer", "StreamInfo", "get",
           "list_streams", "put", "stream_schema"]

SCHEMA_KEY = b"hurray.stream"
"""Key of the Flight schema's metadata entry that holds the stream header and schema."""
COLUMN = "hurray"
"""Name of the one ``uint8`` column whose bytes are a message's buffers."""
_UINT8 = pa.uint8()

def _arrow_schema(schema: Descriptor) -> pa.Schema:
    return pa.schema([pa.field(COLUMN, _UINT8, nullable=False)],
                     metadata={SCHEMA_KEY: stream_head(schema)})


@lru_cache(maxsize=64)
def _framing(schema: Descriptor) -> tuple[pa.Schema, int, pa.RecordBatch]:
    """Per schema, what every put of it sends alike: the Flight schema, the size of a
    batch's IPC header and the empty batch that carries the end message."""
    arrow_schema = _arrow_schema(schema)
    return arrow_schema, _header_size(arrow_schema), _empty(arrow_schema)


# Flight schemas already checked, newest first, with the Hurray schemas they carry. Each
# get reads its stream's schema as a new wrapper; comparing it, metadata included, with
# one seen before is one call into Arrow, where reading its metadata and field back
# makes a dozen Python objects on the caches a blocking read has just left cold.
_SEEN: tuple[tuple[pa.Schema, Descriptor], ...] = ()


def _stream_schema(arrow_schema: pa.Schema) -> Descriptor:
    """The Hurray schema a Flight schema carries, checked as a stream header is."""
    global _SEEN
    for seen, schema in _SEEN:
        if arrow_schema.equals(seen, check_metadata=True):
            return schema
    schema = _checked_schema(arrow_schema)
    _SEEN = ((arrow_schema, schema), *_SEEN[:7])
    return schema


def _checked_schema(arrow_schema: pa.Schema) -> Descriptor:
    meta = arrow_schema.metadata or {}
    head = meta.get(SCHEMA_KEY)
    if head is None:
        raise FormatError(f"the Flight schema has no {SCHEMA_KEY!r} metadata entry: this is "
                          "not a Hurray tensor stream (put it with hurray_bridge's put())",
                          field="flight.schema")
    if (len(arrow_schema) != 1 or arrow_schema[0].name != COLUMN
            or arrow_schema[0].type != _UINT8):
        raise FormatError(f"the Flight schema must be one uint8 column named {COLUMN!r}, got "
                          f"{arrow_schema.to_string(show_schema_metadata=False)!r}",
                          field="flight.schema")
    return _decode_head(head)


@lru_cache(maxsize=64)
def _decode_head(head: bytes) -> Descriptor:
    """The schema of a stream head (immutable bytes: a repeated get decodes it once)."""
    if len(head) < _STREAM_HEADER.size:
        raise FormatError(f"truncated stream header: {len(head)} of {_STREAM_HEADER.size} "
                          "bytes", field="stream")
    size = check_stream_header(head)
    if len(head) != _STREAM_HEADER.size + size:
        raise FormatError(f"the stream header declares a {size}-byte schema, the metadata "
                          f"entry holds {len(head) - _STREAM_HEADER.size}",
                          field="stream.schema_size")
    return Descriptor.from_bytes(head[_STREAM_HEADER.size:])


def _end_metadata(count: int) -> bytes:
    return _MESSAGE_HEADER.pack(MESSAGE_MAGIC, KIND_END, 0, 0, count, 0, 0)


@lru_cache(maxsize=64)
def _end_buffer(count: int) -> pa.Buffer:
    """The end message's app_metadata as Flight takes it (immutable; puts of a few
    tensors each share one)."""
    return pa.py_buffer(_end_metadata(count))


# ------------------------------------------------------------------ checking
class _Message:
    """One checked message: ``resolved`` (None at the end), and its buffers: ``offsets``
    from ``address``, ``size`` bytes in all, held alive by ``owner`` (a ``pa.Buffer``)."""

    __slots__ = ("address", "offsets", "owner", "resolved", "size")

    def __init__(self, resolved: Descriptor | None, offsets: list[int], owner: pa.Buffer | None,
                 address: int = 0, size: int = 0):
        self.resolved = resolved
        self.offsets = offsets
        self.owner = owner
        self.address = address
        self.size = size


_END = _Message(None, [], None)


@lru_cache(maxsize=256)
def _conforming(schema: Descriptor, raw: bytes) -> tuple[Descriptor, list[int], int, int]:
    """The descriptor of a tensor message's ``app_metadata`` after its header, checked:
    (descriptor, buffer offsets, end of the buffers, entries). Remembered, since a stream
    sends the same bytes for every message of one shape; refusals are not remembered."""
    # The descriptor comes from the sender: decode it as hostile input (it raises
    # FormatError naming the field), then check it conforms to the schema (§2.3).
    try:
        d, entries, size = decode_prefix(raw)
    except FormatError as exc:
        inner = exc.field or "input"
        text = str(exc)[len(inner) + 2:] if exc.field else str(exc)
        raise FormatError(text, field=f"descriptor.{inner}") from None
    tail = raw[size:]
    if len(tail) >= 2 * _BODY_ALIGN or tail.strip(b"\0"):
        raise FormatError(f"{len(tail)} bytes after the descriptor; at most "
                          f"{2 * _BODY_ALIGN - 1} zero bytes (the sender's alignment padding) "
                          "may follow it", field="app_metadata")
    if d.rank != schema.rank:
        raise FormatError(f"rank {d.rank}, the schema {schema!r} has rank {schema.rank}",
                          field="rank")
    dynamic = tuple(d.shape[a] for a, n in enumerate(schema.shape) if n == DYNAMIC)
    try:
        want = resolved_schema(schema, dynamic)
    except (FormatError, DynamicShapeError) as exc:
        raise FormatError(f"shape {list(d.shape)} does not resolve the schema: {exc}",
                          field="shape") from None
    if d != want:
        raise FormatError(f"descriptor {d!r} does not conform to the schema: it resolves to "
                          f"{want!r}", field="descriptor")
    lengths = [e.length for e in entries]
    offsets = [e.offset for e in entries]
    if offsets != canonical_offsets(lengths):
        raise FormatError(f"the buffer table {list(entries)} is not the canonical one",
                          field="buffers")
    end = max((o + n for o, n in zip(offsets, lengths) if n), default=0)
    return d, offsets, end, len(entries)


def _check(schema: Descriptor, seq: int, batch: pa.RecordBatch | None,
           md: pa.Buffer | None) -> _Message:
    """Check one Flight message against the schema (interchange.md §3 and §10)."""
    raw = b"" if md is None else md.to_pybytes()
    if batch is None:  # a metadata-only FlightData message (another writer's)
        raise FormatError("a message with app_metadata but no record batch; every message, "
                          "the end one too, is a record batch of the stream's schema",
                          field=f"message[{seq}].data")
    if len(raw) == _MESSAGE_HEADER.size and raw == _end_metadata(seq) and not batch.num_rows:
        # The one end message that passes every check below (its header is fixed but
        # for the sequence number, and 0 rows have no nulls): the last message of every
        # put, on the path between the client's close() and its return.
        return _END
    if len(raw) < _MESSAGE_HEADER.size:
        raise FormatError(f"app_metadata of {len(raw)} bytes; a message header needs "
                          f"{_MESSAGE_HEADER.size}", field=f"message[{seq}].app_metadata")
    magic, kind, n_buf, rank, got_seq, payload, reserved = _MESSAGE_HEADER.unpack_from(raw)
    if magic != MESSAGE_MAGIC:
        raise FormatError(f"bad message magic {bytes(magic)!r}, expected {MESSAGE_MAGIC!r}",
                          field=f"message[{seq}].magic")
    if reserved:
        raise FormatError("reserved message-header bytes must be zero",
                          field=f"message[{seq}].reserved")
    if got_seq != seq:
        raise FormatError(f"sequence number {got_seq}, expected {seq} (a message was lost, "
                          "repeated or reordered)", field=f"message[{seq}].sequence")
    column = batch.column(0)
    if column.null_count:
        raise FormatError(f"the {COLUMN!r} column has {column.null_count} nulls; it holds "
                          "buffer bytes and may have none", field=f"message[{seq}].column")
    if kind == KIND_END:
        if n_buf or rank or payload or len(raw) != _MESSAGE_HEADER.size or len(column):
            raise FormatError("an end-of-stream message carries no descriptor and no bytes",
                              field=f"message[{seq}].kind")
        return _END
    if kind != KIND_TENSOR:
        raise FormatError(f"unknown message kind {kind}", field=f"message[{seq}].kind")
    try:
        d, offsets, end, n_entries = _conforming(schema, raw[_MESSAGE_HEADER.size:])
    except FormatError as exc:  # name the message as well as the field
        inner = exc.field or "descriptor"
        text = str(exc)[len(inner) + 2:] if exc.field else str(exc)
        raise FormatError(text, field=f"message[{seq}].{inner}") from None
    if rank != d.rank or n_buf != n_entries:
        raise FormatError(f"the header says rank {rank} and {n_buf} buffers, the descriptor "
                          f"rank {d.rank} and {n_entries}", field=f"message[{seq}].header")
    if payload != end or len(column) != end:
        raise FormatError(f"the buffers end at byte {end}; the header says {payload} and the "
                          f"column holds {len(column)}", field=f"message[{seq}].payload_size")
    if not end:
        return _Message(d, offsets, None)
    # A writer other than pyarrow's (which refuses to build one) may send a length that
    # claims more than the buffer holds; reading past it would read foreign memory.
    buf = column.buffers()[1]
    start = column.offset
    if buf is None or buf.size - start < end:
        have = 0 if buf is None else buf.size - start
        raise FormatError(f"the column claims {end} bytes but its buffer holds {have}",
                          field=f"message[{seq}].column")
    return _Message(d, offsets, buf, buf.address + start, end)


@lru_cache(maxsize=256)
def _receiving(d: Descriptor) -> tuple[int, bool]:
    """What every message of a shape needs alike (descriptors are immutable): the
    alignment every buffer of ``d`` needs to be read in place by a typed view, and
    whether ``d`` is a plain row-major tensor (the tensor may then build it again from
    its shape, type and ``padded``)."""
    types = [d.dtype]
    if d.sparse is not None:
        types.append(d.sparse.index_dtype)
    if d.quantization is not None:
        types.append(d.quantization.scale_dtype)
        if d.quantization.zero_point_dtype is not None:
            types.append(d.quantization.zero_point_dtype)
    alignment = max(min(8, t.itemsize) for t in types)
    # Read from the fields (a row-major descriptor has no strides, tile or sparse
    # section), as wire.encode's dense shortcut does, not by building the dense
    # descriptor of d's shape: a sparse or broadcast tensor of a huge shape is valid
    # where that one could not exist.
    return alignment, (d.layout is Layout.ROW_MAJOR and d.quantization is None
                       and d.shard is None)


def _tensor(msg: _Message) -> Tensor:
    """The tensor of a checked message, over the record batch's memory where it can be."""
    d = msg.resolved
    assert d is not None
    if msg.owner is None:
        return Tensor(d, [Buffer(s.role, 0, 0) for s in d.buffer_layout()], device=CPU,
                      readonly=True)
    base, owner, copied = msg.address, msg.owner, False
    alignment, dense = _receiving(d)
    if base % alignment:
        # Flight puts a batch's body wherever gRPC's message has it (measured: any byte
        # offset for small messages); typed views need aligned elements, so copy, once,
        # into 64-byte aligned memory and say so through Tensor.copied.
        alloc = alloc_aligned(msg.size)
        assert alloc is not None
        ctypes.memmove(alloc.ptr, base, msg.size)
        base, owner, copied = alloc.ptr, alloc, True
    # Arrow memory is immutable; the copy is private, and writable.
    if dense:  # the common case, without the buffer table's checks (the message's were)
        return Tensor._dense(base + msg.offsets[0], d.shape, d.dtype, strides=None,
                             padded=d.padded, device=CPU, owner=owner, readonly=not copied,
                             copied=copied)
    bufs = [Buffer(s.role, base + off if s.nbytes else 0, s.nbytes)
            for s, off in zip(d.buffer_layout(), msg.offsets)]
    return Tensor(d, bufs, device=CPU, owner=owner, readonly=not copied, copied=copied)


# ------------------------------------------------------------------ sending
# Where a body starts in its FlightData message, modulo _BODY_ALIGN (see _body_padding).
_BODY_ALIGN = 64
_BODY_AT = 32


def _varint_size(n: int) -> int:
    return max(1, -(-n.bit_length() // 7))


def _header_size(arrow_schema: pa.Schema) -> int:
    """Bytes of the IPC header Flight sends before a non-empty batch of this schema.

    The same for every non-empty batch: its fields are fixed-width and non-zero.
    """
    one = pa.RecordBatch.from_arrays([pa.array([0], type=pa.uint8())], schema=arrow_schema)
    return int(pa.ipc.read_message(one.serialize()).metadata.size)


def _body_padding(header: int, md: int, body: int) -> int:
    """Zero bytes to append to ``md`` bytes of app_metadata so the body starts at
    ``_BODY_AT`` modulo ``_BODY_ALIGN`` from the start of the FlightData message.

    A FlightData message is a protobuf: the IPC header (field 2), app_metadata
    (field 3), then the body (field 1000, a 2-byte tag), each after its varint
    length. A message that arrives in several pieces is reassembled by gRPC into one
    allocation whose bytes start 16 past malloc's pointer (the slice's reference count
    comes first); glibc maps a large allocation at 16 past a page. A body at 32 modulo
    64 is then 64-aligned there, and 16-aligned wherever malloc is (docs/spec §10.2).
    """
    before = 1 + _varint_size(header) + header + 1 + 2 + _varint_size(body)
    # The padding is counted in app_metadata's own varint length: find a pad whose
    # length has the varint size it was computed for (near 128 one may not exist below
    # 64, hence the bound of 2 * _BODY_ALIGN the receiver allows).
    for v in (_varint_size(md), _varint_size(md) + 1):
        pad = (_BODY_AT - (before + v + md)) % _BODY_ALIGN
        for p in (pad, pad + _BODY_ALIGN):
            if _varint_size(md + p) == v:
                return p
    return 0  # unreachable for app_metadata under 16 KiB


class _Layout(NamedTuple):
    """What every message of one resolved descriptor sends alike."""

    offsets: tuple[int, ...]  # the buffers' canonical offsets
    end: int  # where the buffers end: the column's length and payload_size
    n_buffers: int
    tail: bytes  # app_metadata after the message header: descriptor, padding (§10.2)
    whole: bool  # one buffer that goes to Flight as it is
    role: BufferRole  # the first buffer's


@lru_cache(maxsize=256)
def _layout(d: Descriptor, header: int) -> _Layout:
    """The :class:`_Layout` of ``d`` (remembered: descriptors are immutable and shared
    per shape, and a put runs this between two blocking Flight calls, on cold caches)."""
    specs = d.buffer_layout()
    lengths = [s.nbytes for s in specs]
    offsets = canonical_offsets(lengths)
    end = max((o + n for o, n in zip(offsets, lengths) if n), default=0)
    tail = encode(d, offsets)
    if end:  # IPC pads the body to 8 bytes
        tail += bytes(_body_padding(header, _MESSAGE_HEADER.size + len(tail), -(-end // 8) * 8))
    return _Layout(tuple(offsets), end, len(specs), tail, len(lengths) == 1 and verbatim(d),
                   specs[0].role if specs else BufferRole.DATA)


_EMPTY = pa.py_buffer(b"")


def _batch(t: Tensor, seq: int, arrow_schema: pa.Schema,
           header: int) -> tuple[pa.RecordBatch, bytes]:
    """One tensor as a record batch and its app_metadata; no copy for one plain buffer."""
    d = t.descriptor
    lay = _layout(d, header)
    end, whole = lay.end, lay.whole
    if not whole and end:
        # bool8 bytes are checked, sub-byte ones may need masking (then copied).
        views = [t.memoryview(s.role) for s in d.buffer_layout()]
        pieces = written_pieces(d, views)
        whole = len(pieces) == 1 and len(pieces[0]) == 1 and pieces[0][0] is views[0]
    if end == 0:
        data = _EMPTY
    elif whole:
        # The tensor's own memory goes to Flight, which sends it without copying;
        # ``base`` keeps the tensor (and its owner) alive while Flight holds the buffer.
        # (Without strides the one buffer starts at element 0: no buffer table to build.)
        ptr = t.data_ptr if d.strides is None else t.buffer(lay.role).ptr
        data = pa.foreign_buffer(ptr, end, base=t)
    else:
        data = _gathered(lay.offsets, end, pieces)
    column = pa.Array.from_buffers(_UINT8, end, [None, data], null_count=0)
    batch = pa.RecordBatch.from_arrays([column], schema=arrow_schema)
    md = _MESSAGE_HEADER.pack(MESSAGE_MAGIC, KIND_TENSOR, lay.n_buffers, d.rank, seq, end,
                              0) + lay.tail
    return batch, md


def _gathered(offsets: tuple[int, ...], end: int, pieces: Any) -> pa.Buffer:
    """Several buffers (or masked sub-byte bytes) in one column: gathered at their
    64-byte offsets into fresh (zeroed) memory."""
    alloc = alloc_aligned(end)
    assert alloc is not None
    dst = host_view(alloc.ptr, end, alloc)
    for off, parts in zip(offsets, pieces):
        for part in parts:
            dst[off:off + len(part)] = part
            off += len(part)
    dst.release()
    return pa.foreign_buffer(alloc.ptr, end, base=alloc)


def _name_bytes(name: object) -> bytes:
    if not isinstance(name, str) or not name:
        raise UnsupportedError(f"a stream name must be a non-empty str, got "
                               f"{type(name).__name__} {name!r:.60}")
    return name.encode("utf-8")


def _client(location: Any) -> tuple[Any, bool]:
    """A Flight client for ``location`` and whether this call owns (and closes) it."""
    if isinstance(location, flight.FlightClient):
        return location, False
    if isinstance(location, FlightTensorServer):
        location = location.location
    if not isinstance(location, (str, flight.Location)):
        raise UnsupportedError(
            f"location must be a Flight URI such as 'grpc://127.0.0.1:8815', a "
            f"pyarrow.flight.Location, a FlightClient or a FlightTensorServer, got "
            f"{type(location).__name__} {location!r:.60}")
    return flight.connect(location), True


def _options(timeout: float | None) -> Any:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not timeout > 0):
        raise FormatError(f"timeout must be a positive number of seconds or None, got "
                          f"{timeout!r}", field="timeout")
    return _NO_TIMEOUT if timeout is None else flight.FlightCallOptions(timeout=timeout)


_NO_TIMEOUT = flight.FlightCallOptions()


@lru_cache(maxsize=256)
def _put_descriptor(key: bytes) -> Any:
    return flight.FlightDescriptor.for_path(key)


def _first_line(exc: BaseException) -> str:
    """The server's message without the traceback and gRPC context Flight appends."""
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    text = str(text).split(". Detail:")[0].split(". gRPC client debug context")[0]
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def put(location: Any, name: str, tensors: Iterable[Any], *, schema: Descriptor | None = None,
        timeout: float | None = None) -> int:
    """Send ``tensors`` to a :class:`FlightTensorServer` as the stream ``name``; their count.

    ``schema`` may have ``DYNAMIC`` dimensions (``hb.Descriptor((hb.DYNAMIC, 128),
    hb.float32)``); every tensor must conform to it, as for :class:`~hurray_bridge.StreamWriter`.
    Without it the first tensor's descriptor is the schema (then every tensor has its
    shape), and an empty ``tensors`` needs one. ``location`` is a Flight URI, a
    ``pyarrow.flight.Location``, a ``FlightClient`` (reused, left open) or the server
    itself. A dense tensor's memory is handed to Flight without a copy.

    The server keeps the stream only once its end arrives: if ``tensors`` raises, the
    server discards what came and the exception propagates; a server that fails or
    goes away raises :class:`~hurray_bridge.TransportError`. An existing stream of
    the same name is replaced.
    """
    key = _name_bytes(name)
    options = _options(timeout)
    items = iter(tensors)
    first: list[Tensor] = []
    if schema is None:
        obj = next(items, _NOTHING)
        if obj is _NOTHING:
            raise UnsupportedError(f"put({name!r}, []) has no tensor to take a schema from; "
                                   "pass schema=hb.Descriptor(...) to send an empty stream")
        t = asarray_one(obj, what="a stream message")
        d = t.descriptor
        # A strided view's schema is its compact descriptor (conform() compacts the view).
        t = conform(t, Descriptor(d.shape, d.dtype, padded=d.padded) if d.strides else d)
        schema = t.descriptor
        first.append(t)  # conforms: conform() hands it back as it is
    elif not isinstance(schema, Descriptor):
        raise UnsupportedError(f"schema must be an hb.Descriptor, got {type(schema).__name__} "
                               f"{schema!r:.60}")
    arrow_schema, header, end = _framing(schema)
    client, own = _client(location)
    sent = 0
    try:
        try:
            writer, _ = client.do_put(_put_descriptor(key), arrow_schema, options=options)
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise TransportError(f"put({name!r}) could not open the stream at {location!r}: "
                                 f"{_first_line(exc)}") from exc
        try:
            for obj in chain(first, items):
                batch, md = _batch(conform(obj, schema), sent, arrow_schema, header)
                # Held here until the next message, or the end: the last reference to a
                # Python-backed buffer is then dropped on this thread, not on one of
                # gRPC's, which would wait for the GIL.
                held = pa.py_buffer(md)
                writer.write_with_metadata(batch, held)
                sent += 1
            writer.write_with_metadata(end, _end_buffer(sent))
            writer.close()
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            raise TransportError(f"put({name!r}) failed after {sent} tensors were sent (the "
                                 f"server keeps none of them): {_first_line(exc)}") from exc
        except BaseException:
            # No end-of-stream message: the server discards the partial stream.
            try:
                writer.close()
            except (flight.FlightError, pa.ArrowException, OSError):
                pass
            raise
    finally:
        if own:
            client.close()
    return sent


_NOTHING = object()


def _empty(arrow_schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], type=pa.uint8())], schema=arrow_schema)


# ------------------------------------------------------------------ receiving
class FlightTensorReader:
    """The tensors of one Flight stream, checked one by one; an iterator of ``hb.Tensor``.

    Each tensor shares the record batch's memory (read-only) unless that memory is
    not aligned for its elements; then it is a 64-byte aligned copy with
    ``Tensor.copied`` set, and :attr:`copies` counts it. A tensor is handed out only
    once its message has been checked in full, and the iteration ends only at the
    stream's end-of-stream message: a stream that stops before it raises
    :class:`~hurray_bridge.FormatError`, a server that fails or goes away
    :class:`~hurray_bridge.TransportError`, each naming how many tensors arrived.
    """

    def __init__(self, stream: Any, name: str, close: Any = None) -> None:
        self._stream = stream
        self._name = name
        self._close = close
        self._seq = 0
        self._done = False
        self._ended = False
        self.copies = 0
        """How many tensors were copied because their memory was not aligned."""
        try:
            arrow_schema = stream.schema
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            self.close()
            raise _failure(exc, name, 0) from exc
        try:
            self._schema = _stream_schema(arrow_schema)
        except BaseException:
            self.close()
            raise

    @property
    def schema(self) -> Descriptor:
        """The stream's schema (it may have ``DYNAMIC`` dimensions)."""
        return self._schema

    @property
    def messages_read(self) -> int:
        """How many tensors have been handed out."""
        return self._seq

    def __iter__(self) -> FlightTensorReader:
        return self

    def __next__(self) -> Tensor:
        if self._done:
            raise StopIteration
        try:
            chunk = self._stream.read_chunk()
        except StopIteration:
            self.close()
            raise FormatError(f"the Flight stream {self._name!r} ended after {self._seq} "
                              "tensors without an end-of-stream message; the sender stopped "
                              "before its end", field="stream") from None
        except (flight.FlightError, pa.ArrowException, OSError) as exc:
            self.close()
            raise _failure(exc, self._name, self._seq) from exc
        try:
            msg = _check(self._schema, self._seq, chunk.data, chunk.app_metadata)
        except BaseException:
            self.close()
            raise
        if msg.resolved is None:
            self._ended = True
            self.close()
            raise StopIteration
        t = _tensor(msg)
        self.copies += t.copied
        self._seq += 1
        return t

    def close(self) -> None:
        """Stop reading; the tensors already handed out stay valid."""
        if not self._done and not self._ended:
            # Left mid-stream: cancel the call, or the server's side of it runs on.
            try:
                self._stream.cancel()
            except (flight.FlightError, pa.ArrowException, OSError):
                pass
        self._done = True
        if self._close is not None:
            close, self._close = self._close, None
            close()

    def __enter__(self) -> FlightTensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _failure(exc: BaseException, name: str, count: int) -> Exception:
    if isinstance(exc, KeyError):  # the server's KeyError travels as gRPC NOT_FOUND
        return NotFoundError(f"no tensor stream named {name!r} on the Flight server: "
                             f"{_first_line(exc)}; put() it first")
    return TransportError(f"the Flight stream {name!r} failed after {count} whole tensors "
                          f"(no partial tensor was returned): {_first_line(exc)}")


def get(location: Any, name: str, *, timeout: float | None = None) -> FlightTensorReader:
    """The tensors of the stream ``name`` on a :class:`FlightTensorServer`, as an iterator.

    ``location`` is as for :func:`put`; ``timeout`` bounds the whole call in seconds.
    An unknown name raises :class:`~hurray_bridge.NotFoundError` (a ``KeyError``).
    """
    key = _name_bytes(name)
    options = _options(timeout)
    client, own = _client(location)
    try:
        stream = client.do_get(flight.Ticket(key), options=options)
    except (flight.FlightError, pa.ArrowException, OSError) as exc:
        if own:
            client.close()
        raise _failure(exc, name, 0) from exc
    return FlightTensorReader(stream, name, client.close if own else None)


# ------------------------------------------------------------------ the server
class FlightTensorServer(flight.FlightServerBase):
    """A Flight server that stores tensor streams by name and serves them back.

    ``location`` is a URI or a ``pyarrow.flight.Location``:
    ``FlightTensorServer("grpc://127.0.0.1:0")`` binds a free port (:attr:`port`,
    and :attr:`location` says where clients reach it), ``"grpc+unix:///path"`` a socket;
    :meth:`serve` blocks until :meth:`shutdown` (run it on a thread). A put stream is
    checked message by message, as :func:`get` checks it, and is kept (its record
    batches as received, no copy) only once its end-of-stream message arrives.
    """

    def __init__(self, location: Any = "grpc://127.0.0.1:0", **kwargs: Any) -> None:
        super().__init__(location, **kwargs)
        uri = str(location.uri.decode() if isinstance(location, flight.Location) else location)
        # A TCP URI ends in its port, which may be 0 (bind any): clients need the real one.
        self._uri = uri if uri.startswith("grpc+unix") else uri.rsplit(":", 1)[0] + ":{port}"
        self._streams: dict[bytes, _Held] = {}
        self._lock = threading.Lock()

    @property
    def location(self) -> str:
        """The URI clients connect to, with the port the server bound."""
        return self._uri.format(port=self.port)

    def names(self) -> list[str]:
        """The names of the streams held, in the order they were first put."""
        with self._lock:
            return [k.decode("utf-8", "replace") for k in self._streams]

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        """Receive one stream; keep it once it has ended cleanly."""
        key = _path_key(descriptor)
        arrow_schema = reader.schema
        schema = _stream_schema(arrow_schema)
        kept: list[tuple[pa.RecordBatch, Any]] = []
        ended = False
        nbytes = 0
        for chunk in reader:
            if ended:
                raise FormatError("a message after the end-of-stream message",
                                  field=f"message[{len(kept)}]")
            data, md = chunk
            msg = _check(schema, len(kept), data, md)
            ended = msg is _END
            if not ended:  # the buffers' bytes, not the column's (which holds their gaps)
                nbytes += _buffer_bytes(msg.resolved)
            kept.append((data, md))
        if not ended:
            raise FormatError(f"the stream {key!r} ended after {len(kept)} tensors without an "
                              "end-of-stream message; nothing was kept", field="stream")
        with self._lock:
            self._streams[key] = _Held(arrow_schema, kept, nbytes)

    def do_get(self, context: Any, ticket: Any) -> Any:
        """Serve a stream by name (the ticket); a ``KeyError`` for an unknown one."""
        held = self._entry(ticket.ticket)
        return flight.GeneratorStream(held.schema, iter(held.messages))

    def get_flight_info(self, context: Any, descriptor: Any) -> Any:
        """A stream's ``FlightInfo``, by its path descriptor; a ``KeyError`` for an unknown
        one. Its schema is the stream's Flight schema (:func:`stream_schema` reads the
        Hurray schema from it), ``total_records`` the number of tensors, ``total_bytes``
        the bytes of their buffers, and its one endpoint's ticket the name (on this
        server)."""
        key = _path_key(descriptor)
        return _info(key, self._entry(key))

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[Any]:
        """The ``FlightInfo`` of every stream held (as :meth:`get_flight_info`), in the
        order they were first put; a non-empty ``criteria`` keeps the names that start
        with those UTF-8 bytes."""
        with self._lock:
            held = list(self._streams.items())
        for key, entry in held:
            if key.startswith(criteria or b""):
                yield _info(key, entry)

    def _entry(self, key: bytes) -> _Held:
        with self._lock:
            entry = self._streams.get(key)
            held = sorted(self._streams)
        if entry is None:
            shown = ", ".join(repr(k.decode("utf-8", "replace")) for k in held[:8]) or "none"
            raise KeyError(f"no stream named {key.decode('utf-8', 'replace')!r} (held: {shown})")
        return entry


def _path_key(descriptor: Any) -> bytes:
    """The stream name of a Flight descriptor, which must be a one-element path."""
    path = descriptor.path  # a new list at each read
    if descriptor.descriptor_type != _PATH or len(path) != 1:
        raise FormatError(f"a stream is named by a one-element path descriptor "
                          f"(FlightDescriptor.for_path(name)), got {descriptor!r}",
                          field="flight.descriptor")
    return bytes(path[0])


_PATH = flight.DescriptorType.PATH


class _Held(NamedTuple):
    """A stream a server keeps: its Flight schema, its messages as received (the end one
    last) and the bytes of its tensors' buffers."""

    schema: pa.Schema
    messages: list[tuple[pa.RecordBatch, Any]]
    nbytes: int


@lru_cache(maxsize=256)
def _buffer_bytes(d: Descriptor | None) -> int:
    return 0 if d is None else sum(s.nbytes for s in d.buffer_layout())


def _info(key: bytes, held: _Held) -> Any:
    return flight.FlightInfo(held.schema, flight.FlightDescriptor.for_path(key),
                             [flight.FlightEndpoint(key, [])],
                             total_records=len(held.messages) - 1,  # the end message is none
                             total_bytes=held.nbytes, ordered=True)


class StreamInfo(NamedTuple):
    """What a :class:`FlightTensorServer` says of one stream it holds."""

    name: str
    schema: Descriptor
    """The stream's schema (it may have ``DYNAMIC`` dimensions)."""
    tensors: int
    nbytes: int
    """The bytes of all its tensors' buffers."""


def stream_schema(arrow_schema: pa.Schema) -> Descriptor:
    """The Hurray schema a stream's Flight schema carries (the schema of a ``FlightInfo``
    from a :class:`FlightTensorServer`), checked; a ``FormatError`` for any other schema."""
    return _stream_schema(arrow_schema)


def list_streams(location: Any, prefix: str = "", *,
                 timeout: float | None = None) -> list[StreamInfo]:
    """The streams a :class:`FlightTensorServer` holds (Flight's ``ListFlights``), in the
    order they were first put, those whose names start with ``prefix``.

    ``location`` and ``timeout`` are as for :func:`get`; a server that fails or cannot
    be reached raises :class:`~hurray_bridge.TransportError`, one that lists a flight
    that is no Hurray stream :class:`~hurray_bridge.FormatError`.
    """
    if not isinstance(prefix, str):
        raise UnsupportedError(f"prefix must be a str, got {type(prefix).__name__} "
                               f"{prefix!r:.60}")
    options = _options(timeout)
    client, own = _client(location)
    try:
        infos = list(client.list_flights(prefix.encode("utf-8"), options=options))
    except (flight.FlightError, pa.ArrowException, OSError) as exc:
        raise TransportError(f"list_streams() could not list the streams at {location!r}: "
                             f"{_first_line(exc)}") from exc
    finally:
        if own:
            client.close()
    # Checked as any reply is: another Flight server may list flights of its own kind.
    return [StreamInfo(_path_key(i.descriptor).decode("utf-8", "replace"),
                       _stream_schema(i.schema), i.total_records, i.total_bytes)
            for i in infos]
