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
resolved descriptor calls for, capped by ``max_message_bytes``. Both ends take
any binary file object: a file, a pipe, ``socket.makefile()`` or a socket.
"""

from __future__ import annotations

import ctypes
import io
import mmap as _mmap
import os
import struct
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from ._memory import alloc_aligned
from .descriptor import DYNAMIC, Descriptor
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
MESSAGE_MAGIC = b"HRYM"
STREAM_VERSION = (1, 0)
ALIGNMENT = 64
DEFAULT_MAX_MESSAGE_BYTES = 1 << 32
"""Largest message payload a reader accepts unless told otherwise (4 GiB)."""

_LAZY_BYTES = 1 << 20  # messages this large are read into memory committed as it arrives

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


# ------------------------------------------------------------------- writer
class StreamWriter:
    """Write a schema, then one message per :meth:`write`; :meth:`close` ends the stream.

    ``schema`` may have ``DYNAMIC`` dimensions; every tensor written must
    conform to it: same rank, element type, layout and sections, and every
    static dimension equal. ``fileobj`` is any binary file object (or a
    socket); the writer never closes it. With ``flush=True`` every message is
    flushed, so a reader on a pipe or socket sees it at once.

    :meth:`write` after :meth:`close`, or after a write that failed part-way,
    raises ``ValueError`` (as a closed file does).

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
        self._dynamic = [i for i, d in enumerate(schema.shape) if d == DYNAMIC]
        self._flush = flush
        self._pos = 0
        self._seq = 0
        self._closed = False
        self._broken = False
        body = schema.to_bytes()
        head = _STREAM_HEADER.pack(STREAM_MAGIC, *STREAM_VERSION, 0, len(body), 0)
        self._write(head + body + _ZEROS[: _pad(len(head) + len(body))])
        self._flush_now()

    @property
    def schema(self) -> Descriptor:
        return self._schema

    @property
    def messages_written(self) -> int:
        return self._seq

    def _write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        n = view.nbytes
        while view.nbytes:
            written = self._f.write(view)
            if written is None:
                raise BlockingIOError("the stream's file object is non-blocking and is full")
            view = view[written:]
        self._pos += n

    def _flush_now(self) -> None:
        if self._flush and hasattr(self._f, "flush"):
            self._f.flush()

    def _conform(self, obj: Any) -> Tensor:
        from ._registry import asarray

        t = asarray(obj)
        if not t.device.is_host_accessible:
            raise UnsupportedError(
                f"cannot stream a {t.device} tensor: its memory is not on the host; "
                "convert it to a host framework first"
            )
        s = self._schema
        d = t.descriptor
        if d.rank != s.rank:
            raise FormatError(
                f"tensor of shape {list(d.shape)} has rank {d.rank}, the schema {s!r} has rank "
                f"{s.rank}", field="shape",
            )
        for axis, (got, want) in enumerate(zip(d.shape, s.shape)):
            if want != DYNAMIC and got != want:
                raise FormatError(
                    f"axis {axis} has size {got} but the schema fixes it at {want}; only the "
                    f"schema's dynamic axes {self._dynamic} may vary", field="shape",
                )
        resolved = s.resolve([d.shape[a] for a in self._dynamic])
        if d != resolved:
            # A strided view of a row-major schema is the common case: compact it here
            # (the stream holds a copy anyway). Anything else is a different tensor kind.
            plain = Descriptor(d.shape, d.dtype, padded=d.padded)
            if d.layout == Layout.STRIDED and resolved == plain:
                return t.copy()
            raise FormatError(
                f"tensor {d!r} does not conform to the schema: the schema resolves to "
                f"{resolved!r}", field="descriptor",
            )
        return t

    def write(self, tensor: Any) -> None:
        """Send one tensor (an hb.Tensor or any native array ``hb.asarray`` takes)."""
        if self._closed:
            raise ValueError("write() on a closed StreamWriter")
        if self._broken:
            raise ValueError("an earlier write() failed part-way; the stream cannot continue")
        t = self._conform(tensor)
        try:
            self._write_message(t)
        except BaseException:
            self._broken = True  # a partial message is on the wire: never frame another
            raise
        self._seq += 1
        self._flush_now()

    def _write_message(self, t: Tensor) -> None:
        specs = t.descriptor.buffer_layout()
        rank = t.ndim
        shape_bytes = struct.pack(f"<{rank}Q", *t.shape)
        lead = _MESSAGE_HEADER.size + len(shape_bytes)
        payload = len(shape_bytes) + _pad(lead) + sum(_aligned(s.nbytes) for s in specs)
        header = _MESSAGE_HEADER.pack(MESSAGE_MAGIC, KIND_TENSOR, len(specs), rank, self._seq,
                                      payload, 0)
        self._write(header + shape_bytes + _ZEROS[: _pad(lead)])
        for buf in t.buffers:
            if buf.nbytes:
                self._write(t.memoryview(buf.role))
                self._write(_ZEROS[: _pad(buf.nbytes)])

    def close(self) -> None:
        """Write the end-of-stream message (once). The file object stays open."""
        if self._closed:
            return
        self._closed = True
        if self._broken:
            return  # the reader must see a truncated stream, not a clean end
        self._write(_MESSAGE_HEADER.pack(MESSAGE_MAGIC, KIND_END, 0, 0, self._seq, 0, 0)
                    + _ZEROS[: _pad(_MESSAGE_HEADER.size)])
        if hasattr(self._f, "flush"):
            self._f.flush()
        if self._socket_file is not None:
            self._socket_file.close()  # the socket itself stays open

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close()
        elif hasattr(self._f, "flush"):
            self._f.flush()


# ------------------------------------------------------------------- reader
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
        self._max = m.__index__()
        self._pos = 0
        self._seq = 0
        self._done = False
        self._failed: str | None = None
        head = self._read_exact(_STREAM_HEADER.size, "stream header", eof_ok=False)
        assert head is not None
        magic, major, minor, flags, size, reserved = _STREAM_HEADER.unpack(head)
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
        body = self._read_exact(size, "schema", eof_ok=False)
        assert body is not None
        self._schema = Descriptor.from_bytes(body)
        self._dynamic = [i for i, d in enumerate(self._schema.shape) if d == DYNAMIC]
        self._read_padding("schema")

    @property
    def schema(self) -> Descriptor:
        return self._schema

    @property
    def messages_read(self) -> int:
        return self._seq

    # ------------------------------------------------------------ raw reads
    def _readinto(self, view: memoryview) -> int:
        f = self._f
        if hasattr(f, "readinto"):
            n = f.readinto(view)
        else:
            data = f.read(len(view))
            n = len(data)
            view[:n] = data
        if n is None:
            raise BlockingIOError("the stream's file object is non-blocking and has no data")
        return int(n)

    def _fill(self, view: memoryview, what: str, eof_ok: bool) -> bool:
        got = 0
        want = len(view)
        while got < want:
            n = self._readinto(view[got:])
            if n == 0:
                if got == 0 and eof_ok:
                    return False
                self._failed = "truncated"
                raise FormatError(
                    f"truncated {what}: the stream ended after {got} of its {want} bytes "
                    f"(stream offset {self._pos + got})", field="stream",
                )
            got += n
        self._pos += want
        return True

    def _read_exact(self, n: int, what: str, eof_ok: bool) -> bytes | None:
        buf = bytearray(n)
        if not self._fill(memoryview(buf), what, eof_ok):
            return None
        return bytes(buf)

    def _read_padding(self, what: str) -> None:
        pad = _pad(self._pos)
        if pad:
            data = self._read_exact(pad, f"padding after the {what}", eof_ok=False)
            if data != _ZEROS[:pad]:
                self._fail(f"padding after the {what} must be zero", "padding")

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

    # ------------------------------------------------------------- messages
    def read(self) -> Tensor | None:
        """The next tensor, or ``None`` at the end of the stream."""
        if self._failed is not None:
            raise FormatError(f"the stream is unusable after an earlier error ({self._failed})",
                              field="stream")
        if self._done:
            return None
        raw = self._read_exact(_MESSAGE_HEADER.size, "message header", eof_ok=True)
        if raw is None:
            self._failed = "no end-of-stream message"
            raise FormatError(
                f"the stream ended after {self._seq} messages without an end-of-stream message; "
                "the writer stopped before StreamWriter.close()", field="stream",
            )
        magic, kind, n_buf, rank, seq, payload, reserved = _MESSAGE_HEADER.unpack(raw)
        if magic != MESSAGE_MAGIC:
            self._fail(f"bad message magic {bytes(magic)!r}, expected {MESSAGE_MAGIC!r}", "magic")
        if reserved:
            self._fail("reserved message-header bytes must be zero", "reserved")
        if seq != self._seq:
            self._fail(f"sequence number {seq}, expected {self._seq} (a message was lost, "
                       "repeated or reordered)", "sequence")
        if kind == KIND_END:
            if n_buf or rank or payload:
                self._fail("an end-of-stream message carries no shape and no buffers", "kind")
            self._read_padding("end-of-stream message")
            self._done = True
            if self._socket_file is not None:
                self._socket_file.close()
            return None
        if kind != KIND_TENSOR:
            self._fail(f"unknown message kind {kind}", "kind")
        schema = self._schema
        if rank != schema.rank:
            self._fail(f"message has rank {rank}, the schema {schema!r} has rank {schema.rank}",
                       "rank")
        shape_raw = self._read_exact(8 * rank, "message shape", eof_ok=False)
        assert shape_raw is not None
        shape = struct.unpack(f"<{rank}Q", shape_raw)
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
        lead = _MESSAGE_HEADER.size + 8 * rank
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
        self._read_padding("message shape")
        left = self._available()
        if left is not None and pos > left:
            self._fail(f"message needs {pos} bytes but only {left} remain in the file",
                       "payload_size")
        owner, base = self._message_memory(pos, resolved)
        bufs = []
        if owner is not None:
            region = (ctypes.c_ubyte * pos).from_address(base)
            region_view = memoryview(region).cast("B")
            self._fill(region_view, f"buffers of message {self._seq}", eof_ok=False)
            for s, off in zip(specs, offsets):
                pad = _pad(s.nbytes)
                if pad and bytes(region_view[off + s.nbytes: off + s.nbytes + pad]) != _ZEROS[:pad]:
                    self._fail(f"padding after the {s.role.name} buffer must be zero", "padding")
            region_view.release()
        for s, off in zip(specs, offsets):
            bufs.append(Buffer(s.role, base + off if (owner is not None and s.nbytes) else 0,
                               s.nbytes))
        self._seq += 1
        return Tensor(resolved, bufs, device=CPU, owner=owner)

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
