"""Tensor streams: a schema with dynamic dimensions, then messages that resolve them.

The framing is specified in ``docs/spec/interchange.md`` §6. In short: a
16-byte stream header and the schema descriptor, then one message per tensor,
each a 32-byte header (magic ``HRYM``, sequence number, payload size), the
tensor's full shape, and its buffers; every message and every buffer starts
at a 64-byte aligned offset from the start of the stream. An end-of-stream
message closes it.

A :class:`StreamReader` checks every message against the schema before it
hands out a tensor (static dimensions equal, dynamic ones resolved, buffer
lengths those of the resolved descriptor) and never allocates more than the
resolved descriptor calls for, capped by ``max_message_bytes``; from a pipe or
socket it commits memory for a message only a bounded step ahead of its bytes.
Both ends take any binary file object: a file, a pipe, ``socket.makefile()`` or
a socket, blocking or not (interchange.md §6.5 says how a failed or
would-block read or write leaves each end).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import io
import mmap as _mmap
import os
import struct
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from ._memory import alloc_aligned, host_view
from ._trailing import written_pieces
from .descriptor import DYNAMIC, BufferSpec, Descriptor
from .errors import DynamicShapeError, FormatError, UnsupportedError
from .layout import Layout
from .tensor import CPU, Buffer, Tensor

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MESSAGE_MAGIC",
    "STREAM_MAGIC",
    "StreamReader",
    "StreamWriter",
]

STREAM_MAGIC = b"HRYS"
"""The four bytes a Hurray stream starts with."""
MESSAGE_MAGIC = b"HRYM"
"""The four bytes each message of a stream starts with."""
STREAM_VERSION = (1, 0)
ALIGNMENT = 64
DEFAULT_MAX_MESSAGE_BYTES = 1 << 32
"""Largest message payload a reader accepts unless told otherwise (4 GiB)."""

# Memory for a message's buffers. A message of _LAZY_BYTES or more is read into an anonymous
# map, whose pages are committed only as the bytes arrive; a smaller one gets an ordinary
# zero-filled allocation (for sizes that recur, much cheaper than fresh pages). From a
# channel that cannot tell its size (a pipe, a socket), a message of _STAGE_BYTES up to
# _LAZY_BYTES is first read into _STAGE_BYTES of memory and gets all of it only once those
# have arrived (then at most 16 times what came): a message that claims more than it sends
# never costs much more than what it sent.
_LAZY_BYTES = 1 << 20
_STAGE_BYTES = 64 << 10

MAX_SCHEMA_BYTES = 4096  # the largest possible descriptor (rank 64, every section) is 2,368 bytes

KIND_TENSOR = 1
KIND_END = 2

# magic, major, minor, flags, schema_size, reserved
_STREAM_HEADER = struct.Struct("<4sBBHII")
# magic, kind, n_buffers, rank, sequence, payload_size, reserved
_MESSAGE_HEADER = struct.Struct("<4sBBHQQQ")
_ZEROS = bytes(ALIGNMENT)


def _pad(n: int) -> int:
    """Bytes of zero padding that bring ``n`` up to a multiple of 64."""
    return -n % ALIGNMENT


def _aligned(n: int) -> int:
    return n + _pad(n)


def _is_socket(obj: Any) -> bool:
    return hasattr(obj, "recv_into") and hasattr(obj, "makefile") and hasattr(obj, "family")


def _binary_file(fileobj: Any, method: str, mode: str) -> None:
    """Refuse what cannot carry a stream, before anything is read or written."""
    if isinstance(fileobj, io.TextIOBase):
        raise UnsupportedError(
            f"fileobj {fileobj!r} is a text stream; a Hurray stream is binary: open it in "
            f"binary mode ('{mode}') or pass its .buffer")
    if not callable(getattr(fileobj, method, None)) and not _is_socket(fileobj):
        raise UnsupportedError(
            f"fileobj must be a binary file object with a {method}() method (a file opened "
            f"'{mode}', a pipe, socket.makefile('{mode}')) or a socket, got "
            f"{type(fileobj).__name__} {fileobj!r:.60}")


@functools.lru_cache(maxsize=256)
def resolved_schema(schema: Descriptor, sizes: tuple[int, ...]) -> Descriptor:
    """``schema.resolve(sizes)``, remembered: a stream resolves the same sizes again and
    again, and building (validating) a descriptor costs more than the rest of a message."""
    return schema.resolve(list(sizes))


@functools.lru_cache(maxsize=256)
def _conformity(schema: Descriptor, d: Descriptor) -> bool:
    """Whether a tensor of descriptor ``d`` conforms to ``schema`` as it is (True) or is a
    strided view to compact (False); a refusal naming the axis or field otherwise.
    Remembered: a stream sends the same shapes again and again (refusals are not)."""
    dynamic = [i for i, n in enumerate(schema.shape) if n == DYNAMIC]
    if d.rank != schema.rank:
        raise FormatError(
            f"tensor of shape {list(d.shape)} has rank {d.rank}, the schema {schema!r} has "
            f"rank {schema.rank}", field="shape",
        )
    for axis, (got, want) in enumerate(zip(d.shape, schema.shape)):
        if want != DYNAMIC and got != want:
            raise FormatError(
                f"axis {axis} has size {got} but the schema fixes it at {want}; only the "
                f"schema's dynamic axes {dynamic} may vary", field="shape",
            )
    resolved = resolved_schema(schema, tuple(d.shape[a] for a in dynamic))
    if d == resolved:
        return True
    # A strided view of a row-major schema is the common case: compact it (the stream
    # holds a copy anyway). Anything else is a different tensor kind.
    if d.layout == Layout.STRIDED and resolved == Descriptor(d.shape, d.dtype, padded=d.padded):
        return False
    raise FormatError(
        f"tensor {d!r} does not conform to the schema: the schema resolves to {resolved!r}",
        field="descriptor",
    )


def conform(obj: Any, schema: Descriptor) -> Tensor:
    """``obj`` as an hb.Tensor that conforms to ``schema`` (interchange.md §2.3), or a refusal.

    A strided view of a row-major schema is compacted (a copy); anything else that
    does not conform raises :class:`~hurray_bridge.FormatError` naming the axis or field.
    """
    from .conversion import asarray_one

    t = asarray_one(obj, what="a stream message")
    if not t.device.is_host_accessible:
        raise UnsupportedError(
            f"cannot stream a {t.device} tensor: its memory is not on the host; "
            "convert it to a host framework first"
        )
    return t if _conformity(schema, t.descriptor) else t.copy()


def stream_head(schema: Descriptor) -> bytes:
    """The stream header and the encoded schema (§6.1), without the padding after them."""
    body = schema.to_bytes()
    return _STREAM_HEADER.pack(STREAM_MAGIC, *STREAM_VERSION, 0, len(body), 0) + body


def check_stream_header(head: Any) -> int:
    """Check the 16-byte stream header at the start of ``head``; the schema's size."""
    magic, major, minor, flags, size, reserved = _STREAM_HEADER.unpack_from(head)
    if magic != STREAM_MAGIC:
        raise FormatError(f"bad stream magic {bytes(magic)!r}, expected {STREAM_MAGIC!r}; "
                          "this is not a Hurray tensor stream", field="stream.magic")
    if major != STREAM_VERSION[0]:
        raise FormatError(f"unsupported stream version {major}.{minor}; this reader reads "
                          f"{STREAM_VERSION[0]}.x", field="stream.version")
    if flags or reserved:
        raise FormatError("reserved stream-header fields must be zero",
                          field="stream.reserved")
    if not 32 <= size <= MAX_SCHEMA_BYTES:
        raise FormatError(f"schema size {size} is outside [32, {MAX_SCHEMA_BYTES}]",
                          field="stream.schema_size")
    return int(size)


# ------------------------------------------------------------------- writer
class StreamWriter:
    """Write a schema, then one message per :meth:`write`; :meth:`close` ends the stream.

    ``schema`` may have ``DYNAMIC`` dimensions; every tensor written must
    conform to it: same rank, element type, layout and sections, and every
    static dimension equal. ``fileobj`` is any binary file object (or a
    socket); the writer never closes it. With ``flush=True`` every message is
    flushed, so a reader on a pipe or socket sees it at once.

    :meth:`write` after :meth:`close` raises ``ValueError`` (as a closed file
    does). :attr:`messages_written` counts the messages handed over in full:
    every byte taken by ``fileobj`` and, with ``flush=True``, flushed.

    A write that fails is never repeated by the writer, and it refuses to
    frame anything after one that fails part-way: once some bytes of a
    message (or its flush) have gone, a retried ``write()`` would deliver the
    tensor twice, so every later ``write()`` raises ``ValueError`` and
    :meth:`close` writes no end message (the reader then sees a truncated
    stream). The one exception is a ``BlockingIOError`` from a non-blocking
    ``fileobj`` that took no byte of the message: nothing was sent, the
    writer is unchanged, and the same ``write()`` (or ``close()``) may simply
    be called again.

    Used as a context manager the stream is closed (end-of-stream written) on
    normal exit only: after an exception the reader sees a truncated stream
    and raises, rather than taking a partial stream for a complete one.
    """

    def __init__(self, fileobj: Any, schema: Descriptor, *, flush: bool = True) -> None:
        if not isinstance(schema, Descriptor):
            raise UnsupportedError(  # a TypeError too
                f"schema must be an hb.Descriptor, got {type(schema).__name__} {schema!r:.60}")
        _binary_file(fileobj, "write", "wb")
        self._socket_file = None
        if _is_socket(fileobj):
            fileobj = self._socket_file = fileobj.makefile("wb")
        self._f = fileobj
        self._schema = schema
        self._flush = flush
        self._pos = 0
        self._seq = 0
        self._closed = False
        self._broken = False
        head = stream_head(schema)
        self._write(head + _ZEROS[: _pad(len(head))])
        self._flush_now()

    @property
    def schema(self) -> Descriptor:
        return self._schema

    @property
    def messages_written(self) -> int:
        return self._seq

    def _write(self, data: Any) -> None:
        """Hand ``data`` to the file object; ``_pos`` counts every byte it took."""
        view = memoryview(data).cast("B")
        while view.nbytes:
            try:
                written = self._f.write(view)
            except BlockingIOError as exc:  # a buffered file may have taken part of it
                self._pos += getattr(exc, "characters_written", 0)
                raise
            if written is None:
                raise BlockingIOError("the stream's file object is non-blocking and is full")
            if not 0 < written <= view.nbytes:  # after a write of nothing, trying again loops
                raise OSError(errno.EIO, f"the stream's file object's write() returned "
                                         f"{written!r} for {view.nbytes} bytes (it must take "
                                         f"between 1 and {view.nbytes}, or raise)")
            self._pos += written
            view = view[written:]

    def _send(self, step: Any) -> None:
        """Run ``step`` (which writes one message); after a failure, decide what is left."""
        start = self._pos
        try:
            step()
        except BaseException as exc:
            # (A refusal of the tensor, a bool8 byte that is no bool8 value, comes before
            # its first byte: the stream goes on without it.)
            if not (isinstance(exc, (BlockingIOError, FormatError)) and self._pos == start):
                # Part of the message is on the wire (or its flush failed): framing another
                # one, or the same one again, would corrupt or duplicate it.
                self._broken = True
            raise

    def _flush_now(self) -> None:
        if self._flush and hasattr(self._f, "flush"):
            self._f.flush()

    def write(self, tensor: Any) -> None:
        """Send one tensor (an hb.Tensor or any native array ``hb.asarray`` takes)."""
        if self._closed:
            raise ValueError("write() on a closed StreamWriter")
        if self._broken:
            raise ValueError("an earlier write() failed part-way; the stream cannot continue")
        t = conform(tensor, self._schema)

        def step() -> None:
            self._write_message(t)
            self._flush_now()

        self._send(step)
        self._seq += 1  # counted only once handed over in full

    def _write_message(self, t: Tensor) -> None:
        specs = t.descriptor.buffer_layout()
        rank = t.ndim
        shape_bytes = struct.pack(f"<{rank}Q", *t.shape)
        lead = _MESSAGE_HEADER.size + len(shape_bytes)
        payload = len(shape_bytes) + _pad(lead) + sum(_aligned(s.nbytes) for s in specs)
        header = _MESSAGE_HEADER.pack(MESSAGE_MAGIC, KIND_TENSOR, len(specs), rank, self._seq,
                                      payload, 0)
        views = [t.memoryview(buf.role) for buf in t.buffers]
        written = written_pieces(t.descriptor, views)  # before a byte of it: it may refuse
        self._write(header + shape_bytes + _ZEROS[: _pad(lead)])
        for buf, pieces in zip(t.buffers, written):
            if buf.nbytes:
                for piece in pieces:  # packed sub-byte data: its last byte's trailing bits zero
                    self._write(piece)
                self._write(_ZEROS[: _pad(buf.nbytes)])

    def close(self) -> None:
        """Write the end-of-stream message (once). The file object stays open."""
        if self._closed:
            return
        if self._broken:
            self._closed = True
            return  # the reader must see a truncated stream, not a clean end

        def step() -> None:
            self._write(_MESSAGE_HEADER.pack(MESSAGE_MAGIC, KIND_END, 0, 0, self._seq, 0, 0)
                        + _ZEROS[: _pad(_MESSAGE_HEADER.size)])
            if hasattr(self._f, "flush"):
                self._f.flush()

        try:
            self._send(step)
        except BaseException:
            self._closed = self._broken  # close() again only if nothing went out
            raise
        self._closed = True
        if self._socket_file is not None:
            self._socket_file.close()  # the socket itself stays open

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        elif hasattr(self._f, "flush"):
            # Best effort: a dead peer or a full pipe must not hide the exception that ended
            # the block behind a second one.
            with contextlib.suppress(OSError, ValueError):
                self._f.flush()


# ------------------------------------------------------------------- reader
class _Payload:
    """The buffers of a message being read: all a resumed read needs to go on exactly."""

    __slots__ = ("base", "got", "offsets", "owner", "resolved", "size", "specs", "view")

    def __init__(self, resolved: Descriptor, specs: list[Any], offsets: list[int], size: int,
                 owner: object, base: int, room: int) -> None:
        self.resolved = resolved
        self.specs = specs
        self.offsets = offsets
        self.size = size
        self.got = 0
        self.owner: object = None
        self.base = 0
        self.view: memoryview | None = None
        self.place(owner, base, room)

    def place(self, owner: object, base: int, room: int) -> None:
        """Read on into ``room`` bytes at ``base`` (owned by ``owner``), the bytes so far first."""
        view = host_view(base, room, owner) if room else None
        if self.view is not None:
            assert view is not None
            view[: self.got] = self.view[: self.got]
            self.view.release()
        self.owner, self.base, self.view = owner, base, view


class StreamReader:
    """Read a stream written by :class:`StreamWriter`; iterate to get ``hb.Tensor``\\ s.

    The header and schema are read (and checked) on construction. Each
    message is checked against the schema before its buffers are read:
    the shape it carries must keep every static dimension and give every
    dynamic one a size (0 is a size; ``DYNAMIC`` is refused), its buffer
    count and payload size must be those the resolved descriptor implies,
    and that payload may not exceed ``max_message_bytes`` (nor, for a
    seekable file, the bytes left in it). Only then is memory allocated.
    Any violation raises :class:`~hurray_bridge.FormatError`; the stream
    cannot be read further after one.

    On a non-blocking ``fileobj`` a read that finds no data raises
    ``BlockingIOError`` and keeps every byte it took: the next :meth:`read`
    goes on from exactly there, in the middle of a message if need be. If
    the header is not there yet when the reader is made, it is read (and
    checked) by the first :meth:`read` or :attr:`schema` instead. Any other
    exception during a read (an ``OSError``, a timeout, ``KeyboardInterrupt``)
    leaves the reader unable to know how many bytes were taken, so every
    later read raises ``FormatError``.

    Each tensor owns fresh 64-byte aligned memory and stays valid after the
    reader moves on.
    """

    def __init__(self, fileobj: Any, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        m = max_message_bytes
        if isinstance(m, bool) or not hasattr(m, "__index__"):
            raise UnsupportedError(f"max_message_bytes must be an integer number of bytes, got "
                                   f"{type(m).__name__} {m!r}")
        if m.__index__() < 0:
            raise FormatError(f"max_message_bytes must be >= 0, got {m!r}",
                              field="max_message_bytes")
        if not callable(getattr(fileobj, "readinto", None)):
            _binary_file(fileobj, "read", "rb")
        self._socket_file = None
        if _is_socket(fileobj):
            fileobj = self._socket_file = fileobj.makefile("rb")
        self._f = fileobj
        self._has_readinto = callable(getattr(fileobj, "readinto", None))
        self._max = m.__index__()
        self._pos = 0  # stream offset of the unit being read: the header, or a message
        self._seq = 0
        self._done = False
        self._failed: str | None = None
        # The fixed part of the unit being read (stream header, schema and padding, or a
        # message's header, shape and padding), as far as it has arrived.
        self._lead = bytearray(_STREAM_HEADER.size + MAX_SCHEMA_BYTES + ALIGNMENT)
        self._lead_view = memoryview(self._lead)
        self._have = 0
        self._payload: _Payload | None = None  # a message whose buffers are being read
        self._schema: Descriptor | None = None
        self._dynamic: list[int] = []
        try:
            self._guard(self._read_head)
        except BlockingIOError:
            pass  # a non-blocking channel with the header still to come: read() reads it

    @property
    def schema(self) -> Descriptor:
        if self._schema is None:
            self._guard(self._read_head)
        assert self._schema is not None
        return self._schema

    @property
    def messages_read(self) -> int:
        return self._seq

    def _guard(self, step: Any) -> Any:
        """Run one reading step; after anything but ``BlockingIOError`` the stream is done."""
        if self._failed is not None:
            raise FormatError(f"the stream is unusable after an earlier error ({self._failed})",
                              field="stream")
        try:
            return step()
        except BlockingIOError:
            raise  # every byte taken so far is kept: the next call resumes exactly there
        except BaseException as exc:
            if self._failed is None:
                self._failed = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            raise

    # ------------------------------------------------------------ raw reads
    def _readinto(self, view: memoryview) -> int:
        f = self._f
        data = None
        if self._has_readinto:
            n = f.readinto(view)
        else:
            data = f.read(len(view))
            n = None if data is None else len(data)
        if n is None:
            raise BlockingIOError("the stream's file object is non-blocking and has no data")
        if not 0 <= n <= len(view):  # bytes it cannot have placed: nothing after is trusted
            raise OSError(errno.EIO, f"the stream's file object returned {n!r} bytes for a "
                                     f"read of {len(view)} (it must be between 0 and "
                                     f"{len(view)})")
        if data is not None and n:
            view[:n] = data
        return int(n)

    def _truncated(self, what: str, got: int, want: int, offset: int) -> FormatError:
        self._failed = "truncated"
        return FormatError(f"truncated {what}: the stream ended after {got} of its {want} bytes "
                           f"(stream offset {offset})", field="stream")

    def _gather(self, n: int, start: int, what: str, eof_ok: bool = False) -> bool:
        """Have the unit's first ``n`` bytes; ``start`` is where the part called ``what`` begins.

        ``False`` only when ``eof_ok`` and the stream ended before the unit's first byte.
        """
        while self._have < n:
            k = self._readinto(self._lead_view[self._have:n])
            if k == 0:
                if eof_ok and self._have == 0:
                    return False
                raise self._truncated(what, self._have - start, n - start,
                                      self._pos + self._have)
            self._have += k
        return True

    def _gather_padding(self, end: int, what: str) -> int:
        """Read and check the zero padding after the unit's first ``end`` bytes; new length."""
        full = _aligned(end)
        self._gather(full, end, f"padding after the {what}")
        if self._lead[end:full] != _ZEROS[: full - end]:
            self._fail(f"padding after the {what} must be zero", "padding")
        return full

    def _next_unit(self, n: int) -> None:
        self._pos += n
        self._have = 0

    def _fail(self, message: str, field: str) -> None:
        self._failed = message
        raise FormatError(message, field=f"message[{self._seq}].{field}")

    def _available(self) -> int | None:
        """Bytes left in a seekable file; ``None`` for pipes and sockets."""
        f = self._f
        try:
            if not f.seekable():
                return None
            fd = f.fileno()
            return os.fstat(fd).st_size - f.tell()
        except (AttributeError, OSError, ValueError):
            try:
                here = f.tell()
                end = f.seek(0, os.SEEK_END)
                f.seek(here)
                return int(end - here)
            except (AttributeError, OSError, ValueError):
                return None

    # ----------------------------------------------------- header and messages
    def _read_head(self) -> None:
        if self._schema is not None:
            return
        self._gather(_STREAM_HEADER.size, 0, "stream header")
        size = check_stream_header(self._lead)
        end = _STREAM_HEADER.size + size
        self._gather(end, _STREAM_HEADER.size, "schema")
        schema = Descriptor.from_bytes(bytes(self._lead[_STREAM_HEADER.size:end]))
        self._next_unit(self._gather_padding(end, "schema"))
        self._schema = schema
        self._dynamic = [i for i, d in enumerate(schema.shape) if d == DYNAMIC]

    def read(self) -> Tensor | None:
        """The next tensor, or ``None`` at the end of the stream."""
        result: Tensor | None = self._guard(self._read_message)
        return result

    def _read_message(self) -> Tensor | None:
        self._read_head()
        if self._done:
            return None
        if self._payload is None:
            if not self._begin_message():
                return None
        p = self._payload
        assert p is not None
        if p.view is not None:
            while p.got < p.size:
                if p.got == len(p.view):  # staged: the bytes have earned the whole message
                    owner, base = self._message_memory(p.size, p.resolved)
                    p.place(owner, base, p.size)
                k = self._readinto(p.view[p.got:])
                if k == 0:
                    raise self._truncated(f"buffers of message {self._seq}", p.got, p.size,
                                          self._pos + p.got)
                p.got += k
            for s, off in zip(p.specs, p.offsets):
                pad = _pad(s.nbytes)
                if pad and p.view[off + s.nbytes: off + s.nbytes + pad] != _ZEROS[:pad]:
                    self._fail(f"padding after the {s.role.name} buffer must be zero", "padding")
            p.view.release()
        self._payload = None
        self._pos += p.size
        bufs = [Buffer(s.role, p.base + off if (p.owner is not None and s.nbytes) else 0,
                       s.nbytes) for s, off in zip(p.specs, p.offsets)]
        self._seq += 1
        return Tensor(p.resolved, bufs, device=CPU, owner=p.owner)

    def _begin_message(self) -> bool:
        """Read and check a message's fixed part; set up its payload. ``False`` at the end.

        Every check runs again on the bytes kept when a read resumes: they are the same
        bytes, so the outcome is too.
        """
        if not self._gather(_MESSAGE_HEADER.size, 0, "message header", eof_ok=True):
            self._failed = "no end-of-stream message"
            raise FormatError(
                f"the stream ended after {self._seq} messages without an end-of-stream message; "
                "the writer stopped before StreamWriter.close()", field="stream",
            )
        magic, kind, n_buf, rank, seq, payload, reserved = _MESSAGE_HEADER.unpack_from(self._lead)
        if magic != MESSAGE_MAGIC:
            self._fail(f"bad message magic {bytes(magic)!r}, expected {MESSAGE_MAGIC!r}", "magic")
        if reserved:
            self._fail("reserved message-header bytes must be zero", "reserved")
        if seq != self._seq:
            self._fail(f"sequence number {seq}, expected {self._seq} (a message was lost, "
                       "repeated or reordered)", "sequence")
        if kind == KIND_END:
            self._end_of_stream(n_buf, rank, payload)
            return False
        if kind != KIND_TENSOR:
            self._fail(f"unknown message kind {kind}", "kind")
        lead = _MESSAGE_HEADER.size + 8 * rank
        resolved, specs = self._message_descriptor(rank, lead)
        offsets, pos = [], 0
        for s in specs:
            offsets.append(pos)
            pos += _aligned(s.nbytes)
        expected = 8 * rank + _pad(lead) + pos
        if n_buf != len(specs):
            self._fail(f"{n_buf} buffers, the resolved descriptor {resolved!r} calls for "
                       f"{len(specs)}", "n_buffers")
        if payload != expected:
            self._fail(f"payload of {payload} bytes, the resolved descriptor {resolved!r} "
                       f"implies {expected}", "payload_size")
        if pos > self._max:
            self._fail(
                f"message needs {pos} bytes for {resolved!r}, more than max_message_bytes="
                f"{self._max}; raise the limit if such tensors are expected", "payload_size",
            )
        full = self._gather_padding(lead, "message shape")
        owner, base, room = self._payload_memory(pos, resolved)
        self._payload = _Payload(resolved, list(specs), offsets, pos, owner, base, room)
        self._next_unit(full)
        return True

    def _end_of_stream(self, n_buf: int, rank: int, payload: int) -> None:
        """Check the end-of-stream message (no shape, no buffers) and end the stream."""
        if n_buf or rank or payload:
            self._fail("an end-of-stream message carries no shape and no buffers", "kind")
        self._next_unit(self._gather_padding(_MESSAGE_HEADER.size, "end-of-stream message"))
        self._done = True
        if self._socket_file is not None:
            self._socket_file.close()

    def _message_descriptor(self, rank: int, lead: int
                            ) -> tuple[Descriptor, tuple[BufferSpec, ...]]:
        """Read a message's shape and resolve the schema by it: (the message's descriptor,
        its buffers' layout). The shape must agree with the schema's rank and fixed axes."""
        schema = self._schema
        assert schema is not None
        if rank != schema.rank:
            self._fail(f"message has rank {rank}, the schema {schema!r} has rank {schema.rank}",
                       "rank")
        self._gather(lead, _MESSAGE_HEADER.size, "message shape")
        shape = struct.unpack_from(f"<{rank}Q", self._lead, _MESSAGE_HEADER.size)
        for axis, (got, want) in enumerate(zip(shape, schema.shape)):
            if want != DYNAMIC and got != want:
                self._fail(f"axis {axis} has size {got}, the schema fixes it at {want}", "shape")
            if want == DYNAMIC and got == DYNAMIC:
                self._fail(f"axis {axis} is sent as DYNAMIC; a message must give it a size "
                           "(0 is a valid size)", "shape")
        try:
            resolved = schema.resolve([shape[a] for a in self._dynamic])
            specs = resolved.buffer_layout()
        except (FormatError, DynamicShapeError) as exc:
            self._fail(f"sizes {list(shape)} do not resolve the schema: {exc}", "shape")
            raise  # unreachable: _fail raises
        return resolved, specs

    def _payload_memory(self, pos: int, resolved: Descriptor) -> tuple[object, int, int]:
        """Where a payload of ``pos`` bytes is read to: (owner, address, room). A stream of
        unknown length stages mid-sized payloads in one reused block; a file refuses a
        payload longer than what is left of it."""
        left = self._available()
        if left is not None and pos > left:
            self._fail(f"message needs {pos} bytes but only {left} remain in the file",
                       "payload_size")
        if left is None and _STAGE_BYTES <= pos < _LAZY_BYTES:
            stage = alloc_aligned(_STAGE_BYTES)
            assert stage is not None
            return stage, stage.ptr, _STAGE_BYTES
        owner, base = self._message_memory(pos, resolved)
        return owner, base, pos

    def _message_memory(self, n: int, resolved: Descriptor) -> tuple[object, int]:
        """Fresh 64-byte aligned memory for ``n`` bytes of buffers: (owner, address)."""
        if n == 0:
            return None, 0
        if n < _LAZY_BYTES:
            alloc = alloc_aligned(n)
            assert alloc is not None
            return alloc, alloc.ptr
        # A large message gets an anonymous map: the kernel commits its pages only as the
        # bytes arrive. From a pipe or socket the reader cannot check the claimed size
        # against anything but max_message_bytes, and a zero-filled allocation would make
        # a 256-byte header claiming 4 GiB cost 4 GiB of RAM (and seconds of memset)
        # before the stream turns out to be truncated; now it costs what was sent.
        try:
            mm = _mmap.mmap(-1, n)
        except (OSError, OverflowError, MemoryError) as exc:
            self._fail(f"message needs {n} bytes for {resolved!r}, which cannot be mapped "
                       f"({exc}); lower max_message_bytes={self._max} to refuse such "
                       "messages up front", "payload_size")
            raise  # unreachable: _fail raises
        region = (ctypes.c_ubyte * n).from_buffer(mm)  # holds the map open while it lives
        return region, ctypes.addressof(region)

    def __iter__(self) -> Iterator[Tensor]:
        while True:
            t = self.read()
            if t is None:
                return
            yield t

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._socket_file is not None:
            self._socket_file.close()
