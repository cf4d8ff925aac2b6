"""Tensor streams with dynamic dimensions (docs/spec/interchange.md §6): framing, validation
of every message against the schema, bounded reads, and files, pipes, sockets, processes."""

from __future__ import annotations

import io
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import DYNAMIC, Descriptor, Layout, Quantization, QuantScheme, Sparse
from hurray_bridge.stream import (
    MESSAGE_MAGIC,
    STREAM_MAGIC,
    StreamReader,
    StreamWriter,
)
from tests.hurray_bridge.test_pickle_shm import make, snapshot

np = pytest.importorskip("numpy", reason="numpy is not installed")

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


def batches(sizes: list[int], width: int = 3, dtype: Any = np.float32) -> list[np.ndarray]:
    rng = np.random.default_rng(sum(sizes) + width)
    return [rng.standard_normal((n, width)).astype(dtype) for n in sizes]


def write_stream(schema: Descriptor, items: list[Any]) -> bytes:
    f = io.BytesIO()
    with StreamWriter(f, schema) as w:
        for x in items:
            w.write(x)
    return f.getvalue()


def read_all(data: bytes, **kw: Any) -> list[hb.Tensor]:
    return list(StreamReader(io.BytesIO(data), **kw))


# ------------------------------------------------------------- round trips
@pytest.mark.parametrize("sizes", [[3, 0, 5, 1], [0], [], [1000]])
def test_dynamic_batch_round_trip(sizes: list[int]) -> None:
    schema = Descriptor([DYNAMIC, 3], hb.float32)
    arrays = batches(sizes)
    got = read_all(write_stream(schema, arrays))
    assert [t.shape for t in got] == [(n, 3) for n in sizes]
    for t, a in zip(got, arrays):
        assert t.descriptor == schema.resolve([a.shape[0]])
        assert bytes(t.memoryview()) == a.tobytes()
        b = t.buffers[0]
        assert (b.ptr == 0) == (b.nbytes == 0)  # an empty batch has a NULL buffer
        assert b.ptr % 64 == 0
        assert not t.readonly and not t.copied


def test_zero_is_a_size_never_dynamic() -> None:
    schema = Descriptor([DYNAMIC, DYNAMIC], hb.int16)
    items = [np.zeros((0, 0), np.int16), np.zeros((0, 4), np.int16), np.ones((2, 0), np.int16),
             np.arange(6, dtype=np.int16).reshape(2, 3)]
    got = read_all(write_stream(schema, items))
    assert [t.shape for t in got] == [(0, 0), (0, 4), (2, 0), (2, 3)]
    assert all(not t.descriptor.is_dynamic for t in got)
    assert np.asarray(got[3]).tolist() == [[0, 1, 2], [3, 4, 5]]


def test_static_schema() -> None:
    schema = Descriptor([2, 2], hb.float64)
    items = [np.eye(2), np.ones((2, 2))]
    got = read_all(write_stream(schema, items))
    assert [np.asarray(t).tolist() for t in got] == [a.tolist() for a in items]


@pytest.mark.parametrize("name", ["bf16", "int4_padded", "c128"])
def test_extended_types(name: str) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")

    rng = np.random.default_rng(1)
    a = {
        "bf16": rng.standard_normal((5, 4)).astype(ml_dtypes.bfloat16),
        "int4_padded": rng.integers(-8, 8, (5, 4)).astype(ml_dtypes.int4),
        "c128": (rng.standard_normal((5, 4)) + 1j).astype(np.complex128),
    }[name]
    t = hb.asarray(a)
    d = t.descriptor
    schema = Descriptor([DYNAMIC, 4], d.dtype, padded=d.padded)
    (got,) = read_all(write_stream(schema, [a]))
    assert snapshot(got) == snapshot(t)


def test_packed_int4_stream() -> None:
    schema = Descriptor([DYNAMIC], hb.int4)
    items = [make(Descriptor([n], hb.int4), np.arange(-(-n // 2), dtype=np.uint8) & 0x77)
             for n in (3, 0, 8)]
    got = read_all(write_stream(schema, items))
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]
    assert [g.nbytes for g in got] == [2, 0, 4]


def test_quantized_stream() -> None:
    q = Quantization(QuantScheme.PER_AXIS, "float32", "int8", axis=1)
    schema = Descriptor([DYNAMIC, 3], hb.int8, quantization=q)
    items = [make(schema.resolve([n]), np.arange(3 * n, dtype=np.int8),
                  np.array([0.5, 1.0, 2.0], np.float32), np.array([1, 0, -1], np.int8))
             for n in (2, 0, 4)]
    got = read_all(write_stream(schema, items))
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]
    assert all(b.ptr % 64 == 0 for g in got for b in g.buffers if b.nbytes)


def test_sparse_stream_dynamic_rows() -> None:
    # nnz is fixed by the schema; the row count varies (interchange.md §5).
    schema = Descriptor([DYNAMIC, 4], hb.float32, Layout.CSR, sparse=Sparse(2, "int32"))
    items = [
        make(schema.resolve([2]), np.array([1.0, 2.0], np.float32),
             np.array([0, 1, 2], np.int32), np.array([3, 0], np.int32)),
        make(schema.resolve([5]), np.array([5.0, 6.0], np.float32),
             np.array([0, 0, 0, 2, 2, 2], np.int32), np.array([1, 2], np.int32)),
    ]
    got = read_all(write_stream(schema, items))
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]


def test_strided_input_is_compacted_for_a_row_major_schema() -> None:
    base = np.arange(40, dtype=np.float32).reshape(8, 5)
    schema = Descriptor([DYNAMIC, 5], hb.float32)
    view = base[::-3]
    (got,) = read_all(write_stream(schema, [view]))
    assert got.strides is None and np.asarray(got).tolist() == view.tolist()


def test_buffers_sit_at_64_byte_offsets_in_the_stream() -> None:
    schema = Descriptor([DYNAMIC, 3], hb.uint8)
    items = [np.full((n, 3), n + 1, np.uint8) for n in (1, 7, 0, 30)]
    data = write_stream(schema, items)
    assert data[:4] == STREAM_MAGIC and len(data) % 64 == 0
    # Walk the framing by hand: every message header is 64-aligned, then the shape,
    # padding, and the buffer at the next 64-byte boundary.
    pos = 16 + struct.unpack_from("<I", data, 8)[0]
    pos += -pos % 64
    for a in items:
        assert pos % 64 == 0 and data[pos:pos + 4] == MESSAGE_MAGIC
        payload = struct.unpack_from("<Q", data, pos + 16)[0]
        assert struct.unpack_from("<2Q", data, pos + 32) == a.shape
        start = pos + 64
        assert data[start:start + a.nbytes] == a.tobytes()
        pos += 32 + payload
    assert data[pos:pos + 4] == MESSAGE_MAGIC and data[pos + 4] == 2  # end of stream
    assert pos + 64 == len(data)


def test_reader_api() -> None:
    schema = Descriptor([DYNAMIC], hb.int32)
    data = write_stream(schema, [np.arange(3, dtype=np.int32)])
    r = StreamReader(io.BytesIO(data))
    assert r.schema == schema
    t = r.read()
    assert t is not None and r.messages_read == 1
    assert r.read() is None and r.read() is None  # stays at the end
    w = StreamWriter(io.BytesIO(), schema)
    assert w.schema == schema and w.messages_written == 0
    w.close()
    w.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        w.write(np.arange(2, dtype=np.int32))


def test_tensors_outlive_the_reader() -> None:
    schema = Descriptor([DYNAMIC], hb.float64)
    got = read_all(write_stream(schema, [np.arange(n, dtype=np.float64) for n in (4, 5)]))
    import gc

    gc.collect()
    assert np.asarray(got[0]).tolist() == [0, 1, 2, 3]
    assert np.asarray(got[1]).sum() == 10


# ------------------------------------------------------------ writer errors
@pytest.mark.parametrize("bad, match", [
    (np.zeros((2, 4), np.float32), "axis 1 has size 4"),
    (np.zeros(3, np.float32), "rank 1"),
    (np.zeros((2, 3), np.float64), "does not conform"),
])
def test_writer_refuses_nonconforming_tensors(bad: np.ndarray, match: str) -> None:
    w = StreamWriter(io.BytesIO(), Descriptor([DYNAMIC, 3], hb.float32))
    with pytest.raises(hb.FormatError, match=match):
        w.write(bad)


def test_writer_refuses_device_memory() -> None:
    t = hb.asarray(np.zeros((1, 3), np.float32))
    dev = hb.Tensor(t.descriptor, t.buffers, device=(2, 0), owner=t)
    w = StreamWriter(io.BytesIO(), Descriptor([DYNAMIC, 3], hb.float32))
    with pytest.raises(hb.UnsupportedError, match="host"):
        w.write(dev)


def test_exception_inside_with_leaves_stream_unterminated() -> None:
    f = io.BytesIO()
    with pytest.raises(RuntimeError):
        with StreamWriter(f, Descriptor([DYNAMIC], hb.int8)) as w:
            w.write(np.arange(3, dtype=np.int8))
            raise RuntimeError("producer failed")
    r = StreamReader(io.BytesIO(f.getvalue()))
    assert r.read() is not None
    with pytest.raises(hb.FormatError, match="without an end-of-stream"):
        r.read()


class FailingSink(io.RawIOBase):
    """Accepts ``limit`` bytes, then fails like a full disk or a closed peer."""

    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.limit = limit

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if len(self.data) + len(b) > self.limit:
            raise OSError("no space left")
        self.data += b
        return len(b)


def test_a_failed_write_poisons_the_writer() -> None:
    sink = FailingSink(64 + 64 + 10)  # header+schema, one message header, then fail
    w = StreamWriter(sink, Descriptor([DYNAMIC], hb.uint8))
    with pytest.raises(OSError, match="no space"):
        w.write(np.zeros(100, np.uint8))
    with pytest.raises(ValueError, match="failed part-way"):
        w.write(np.zeros(1, np.uint8))
    w.close()  # writes no end message after a partial one
    with pytest.raises(hb.FormatError, match="truncated buffers of message 0"):
        list(StreamReader(Unseekable(bytes(sink.data))))


# ------------------------------------------------------------ reader errors
SCHEMA = Descriptor([DYNAMIC, 2], hb.float32)


def one_message(n: int = 2) -> tuple[bytearray, int]:
    """A stream with one message of ``n`` rows, and the offset of that message."""
    data = bytearray(write_stream(SCHEMA, [np.ones((n, 2), np.float32)]))
    first = 16 + struct.unpack_from("<I", data, 8)[0]
    return data, first + (-first % 64)


def header_with(data: bytearray, at: int, **fields: int) -> bytearray:
    magic, kind, n_buf, rank, seq, payload, res = struct.unpack_from("<4sBBHQQQ", data, at)
    vals = dict(kind=kind, n_buf=n_buf, rank=rank, seq=seq, payload=payload, res=res)
    vals.update(fields)
    struct.pack_into("<4sBBHQQQ", data, at, magic, vals["kind"], vals["n_buf"], vals["rank"],
                     vals["seq"], vals["payload"], vals["res"])
    return data


def test_bad_stream_magic_and_version() -> None:
    data, _ = one_message()
    with pytest.raises(hb.FormatError, match="not a Hurray tensor stream"):
        StreamReader(io.BytesIO(b"XXXX" + bytes(data[4:])))
    data[4] = 9
    with pytest.raises(hb.FormatError, match="version 9"):
        StreamReader(io.BytesIO(bytes(data)))
    with pytest.raises(hb.FormatError, match="truncated stream header"):
        StreamReader(io.BytesIO(b"HRYS\x01"))
    with pytest.raises(hb.FormatError, match="schema size"):
        StreamReader(io.BytesIO(struct.pack("<4sBBHII", STREAM_MAGIC, 1, 0, 0, 10**6, 0)))


def test_corrupt_schema_is_a_format_error() -> None:
    data, _ = one_message()
    data[16] ^= 0xFF  # the descriptor's magic
    with pytest.raises(hb.FormatError, match="magic"):
        StreamReader(io.BytesIO(bytes(data)))


def test_static_dim_mismatch_in_a_message() -> None:
    data, at = one_message()
    struct.pack_into("<Q", data, at + 40, 3)  # axis 1 is static (2) in the schema
    with pytest.raises(hb.FormatError, match="axis 1 has size 3, the schema fixes it at 2"):
        read_all(bytes(data))


def test_dynamic_sent_as_size_is_refused() -> None:
    data, at = one_message()
    struct.pack_into("<Q", data, at + 32, DYNAMIC)
    with pytest.raises(hb.FormatError, match="sent as DYNAMIC"):
        read_all(bytes(data))


@pytest.mark.parametrize("field, value, match", [
    ("payload", 64 + 64 + 64, "payload of 192 bytes"),
    ("payload", 0, "payload of 0 bytes"),
    ("n_buf", 3, "3 buffers"),
    ("rank", 1, "rank 1"),
    ("seq", 5, "sequence number 5"),
    ("kind", 7, "unknown message kind 7"),
    ("res", 1, "reserved"),
])
def test_lying_message_headers(field: str, value: int, match: str) -> None:
    data, at = one_message()
    header_with(data, at, **{field: value})
    r = StreamReader(io.BytesIO(bytes(data)))
    with pytest.raises(hb.FormatError, match=match):
        r.read()
    with pytest.raises(hb.FormatError, match="unusable"):
        r.read()  # framing may be lost: the reader refuses to guess


def test_size_cap_refuses_before_allocating() -> None:
    data, at = one_message()
    rows = 1 << 40  # 8 TiB of float32 pairs: never allocated
    struct.pack_into("<Q", data, at + 32, rows)
    header_with(data, at, payload=32 + rows * 8)
    with pytest.raises(hb.FormatError, match="max_message_bytes"):
        read_all(bytes(data))
    # A smaller cap applies to ordinary messages too.
    ok, _ = one_message(100)
    with pytest.raises(hb.FormatError, match="more than max_message_bytes=512"):
        read_all(bytes(ok), max_message_bytes=512)
    assert len(read_all(bytes(ok), max_message_bytes=832)) == 1  # 800 bytes + padding


def test_seekable_file_bounds_the_message_by_its_size(tmp_path: Path) -> None:
    data, at = one_message()
    rows = 1 << 20  # 8 MiB claimed, below the cap, but the file is tiny
    struct.pack_into("<Q", data, at + 32, rows)
    header_with(data, at, payload=32 + rows * 8)
    path = tmp_path / "lying.hrys"
    path.write_bytes(bytes(data))
    with open(path, "rb") as f, pytest.raises(hb.FormatError, match="remain in the file"):
        list(StreamReader(f))


class Unseekable(io.RawIOBase):
    """A pipe-like reader: no seek, no size, short reads."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self._data), 7)
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def test_truncated_buffers() -> None:
    data, _ = one_message(10)
    cut = bytes(data[: len(data) - 64 - 40])  # drop the end message and part of the buffer
    with pytest.raises(hb.FormatError, match="truncated buffers of message 0"):
        list(StreamReader(Unseekable(cut)))
    # A seekable file knows before allocating that the bytes are not there.
    with pytest.raises(hb.FormatError, match="needs 128 bytes but only 88 remain"):
        read_all(cut)


def test_short_reads_are_reassembled() -> None:
    items = batches([5, 0, 9])
    data = write_stream(Descriptor([DYNAMIC, 3], hb.float32), items)
    got = list(StreamReader(Unseekable(data)))
    assert [bytes(t.memoryview()) for t in got] == [a.tobytes() for a in items]


def test_nonzero_padding_is_refused() -> None:
    data, at = one_message(1)  # 8 bytes of data, then 56 bytes of padding
    data[at + 64 + 8] = 1
    with pytest.raises(hb.FormatError, match="padding"):
        read_all(bytes(data))


def test_missing_end_of_stream() -> None:
    data, _ = one_message()
    with pytest.raises(hb.FormatError, match="without an end-of-stream"):
        read_all(bytes(data[:-64]))


# ------------------------------------------------------ pipes, sockets, processes
def _produce(f: Any, sizes: list[int]) -> None:
    with StreamWriter(f, SCHEMA) as w:
        for n in sizes:
            w.write(np.full((n, 2), n, np.float32))


def test_over_an_os_pipe() -> None:
    r_fd, w_fd = os.pipe()
    sizes = [1, 0, 4096, 3]  # 4096 rows = 32 KiB: more than a pipe buffer holds at once
    with os.fdopen(r_fd, "rb") as rf:
        wf = os.fdopen(w_fd, "wb", buffering=0)  # raw: partial writes are handled
        th = threading.Thread(target=lambda: (_produce(wf, sizes), wf.close()))
        th.start()
        got = list(StreamReader(rf))
        th.join(TIMEOUT)
    assert [t.shape[0] for t in got] == sizes
    assert all((np.asarray(t) == t.shape[0]).all() for t in got)


def test_over_a_socketpair() -> None:
    a, b = socket.socketpair()
    sizes = [2, 0, 10000]
    with a, b:
        th = threading.Thread(target=_produce, args=(a, sizes))  # a socket object, as it is
        th.start()
        got = list(StreamReader(b))
        th.join(TIMEOUT)
    assert [t.shape[0] for t in got] == sizes
    assert float(np.asarray(got[2]).sum()) == 10000 * 2 * 10000


def test_from_a_subprocess_stdout() -> None:
    code = (
        "import sys, numpy as np, hurray_bridge as hb\n"
        "from hurray_bridge.stream import StreamWriter\n"
        "s = hb.Descriptor([hb.DYNAMIC, 2], hb.float32)\n"
        "with StreamWriter(sys.stdout.buffer, s) as w:\n"
        "    for n in (3, 0, 7):\n"
        "        w.write(np.full((n, 2), n, np.float32))\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        got = list(StreamReader(p.stdout))
    assert p.returncode == 0
    assert [t.shape for t in got] == [(3, 2), (0, 2), (7, 2)]


def test_example_streams_between_processes() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "stream_between_processes.py")],
                         capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "received 6 batches" in out.stdout
    # the empty batch has no mean: it says so rather than printing a made-up 0
    assert "batch 2: shape (0, 16), mean n/a (empty batch)" in out.stdout, out.stdout
    assert "+0.000" not in out.stdout, out.stdout


# ------------------------------------------- non-blocking channels, failed reads and writes
U8 = Descriptor([DYNAMIC], hb.uint8)


def u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, np.uint8)


def first_message_at(data: bytes | bytearray) -> int:
    first = 16 + struct.unpack_from("<I", data, 8)[0]
    return first + (-first % 64)


def smuggling_stream() -> tuple[bytes, int, list[bytes]]:
    """A two-message stream whose first payload holds a well-formed message 0 ('EVIL').

    Returns the stream, the offset where the smuggled message starts (64 bytes into the
    first payload), and the payloads the writer sent.
    """
    inner = write_stream(U8, [u8(b"EVIL")])
    at = first_message_at(inner)
    forged = inner[at:at + 128]  # its header, shape and padding, then 'EVIL' and padding
    sent = [bytes(64) + forged, b"second message"]
    data = write_stream(U8, [u8(p) for p in sent])
    return data, first_message_at(data) + 64 + 64, sent


@pytest.mark.parametrize("buffered", [False, True], ids=["raw", "buffered"])
def test_nonblocking_pipe_resumes_exactly_after_blocking_mid_payload(buffered: bool) -> None:
    # The reader blocks right where a smuggled message starts inside the first payload.
    # The retry that BlockingIOError invites must go on with the same payload, never parse
    # its inside as framing.
    data, split, sent = smuggling_stream()
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    try:
        os.write(w_fd, data[:split])
        with open(r_fd, "rb", buffering=-1 if buffered else 0, closefd=False) as f:
            reader = StreamReader(f)
            with pytest.raises(BlockingIOError):
                reader.read()
            with pytest.raises(BlockingIOError):
                reader.read()  # still nothing new: still resumable
            os.write(w_fd, data[split:])
            os.close(w_fd)
            w_fd = -1
            got = [bytes(t.memoryview()) for t in reader]
    finally:
        os.close(r_fd)
        if w_fd >= 0:
            os.close(w_fd)
    assert got == sent
    assert reader.messages_read == 2


class Stalling(io.RawIOBase):
    """A non-blocking channel: every other readinto finds no data (returns None)."""

    def __init__(self, data: bytes, chunk: int = 7, only_read: bool = False) -> None:
        self._data = memoryview(data)
        self._chunk = chunk
        self._stall = True
        self.stalls = 0
        if only_read:
            self.readinto = None  # type: ignore[assignment]

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes | None:
        b = bytearray(n)
        k = self._next(memoryview(b))
        return None if k is None else bytes(b[:k])

    def readinto(self, b: Any) -> int | None:
        return self._next(b)

    def _next(self, b: Any) -> int | None:
        self._stall = not self._stall
        if not self._stall and self._data.nbytes:
            self.stalls += 1
            return None
        n = min(len(b), len(self._data), self._chunk)
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def read_retrying(f: Any) -> list[bytes]:
    """Read a stream off a non-blocking channel, retrying on BlockingIOError."""
    while True:
        try:
            reader = StreamReader(f)
            break
        except BlockingIOError:
            continue
    got: list[bytes] = []
    while True:
        try:
            t = reader.read()
        except BlockingIOError:
            continue
        if t is None:
            return got
        got.append(bytes(t.memoryview()))


@pytest.mark.parametrize("chunk", [1, 7, 64, 100_000])
@pytest.mark.parametrize("only_read", [False, True], ids=["readinto", "read"])
def test_stalls_anywhere_lose_nothing(chunk: int, only_read: bool) -> None:
    # A stall before every chunk: in the stream header, the schema, every message header,
    # shape, padding and payload. Every byte read before a stall is kept.
    data, _, sent = smuggling_stream()
    rng = np.random.default_rng(chunk)
    more = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (0, 1, 63, 64, 70_000)]
    data = write_stream(U8, [u8(p) for p in sent + more])
    f = Stalling(data, chunk, only_read)
    assert read_retrying(f) == sent + more
    assert f.stalls > 0


def test_construction_on_an_empty_nonblocking_pipe_defers_the_header() -> None:
    data = write_stream(U8, [u8(b"abc")])
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    with open(r_fd, "rb", buffering=0) as f:
        reader = StreamReader(f)  # nothing there yet: the header is read later
        with pytest.raises(BlockingIOError):
            _ = reader.schema
        os.write(w_fd, data[:20])  # the stream header and part of the schema
        with pytest.raises(BlockingIOError):
            reader.read()
        os.write(w_fd, data[20:])
        os.close(w_fd)
        assert reader.schema == U8
        assert [bytes(t.memoryview()) for t in reader] == [b"abc"]


def test_a_deferred_header_is_still_checked() -> None:
    data = b"XXXX" + write_stream(U8, [])[4:]
    f = Stalling(data, 100_000)
    reader = StreamReader(f)  # the first readinto stalls
    with pytest.raises(hb.FormatError, match="not a Hurray tensor stream"):
        reader.read()
    with pytest.raises(hb.FormatError, match="unusable"):
        _ = reader.schema


class Failing(io.RawIOBase):
    """Delivers ``data[:at]``, then raises ``exc`` once, then delivers the rest."""

    def __init__(self, data: bytes, at: int, exc: BaseException) -> None:
        self._data = memoryview(data)
        self._at = at
        self._exc: BaseException | None = exc

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._at == 0 and self._exc is not None:
            exc, self._exc = self._exc, None
            raise exc
        n = min(len(b), len(self._data), self._at if self._exc is not None else len(b))
        b[:n] = self._data[:n]
        self._data = self._data[n:]
        self._at -= n
        return n


@pytest.mark.parametrize("exc", [OSError("device error"), KeyboardInterrupt(),
                                 TimeoutError("timed out")],
                         ids=["OSError", "KeyboardInterrupt", "TimeoutError"])
def test_any_other_error_mid_message_fails_the_reader_closed(exc: BaseException) -> None:
    # Only BlockingIOError says for sure that no byte was taken; after anything else the
    # reader cannot know where it stands, so every later read raises.
    data, split, _ = smuggling_stream()
    reader = StreamReader(Failing(data, split, exc))
    with pytest.raises(type(exc)):
        reader.read()
    for _ in range(2):
        with pytest.raises(hb.FormatError,
                           match=f"unusable after an earlier error.*{type(exc).__name__}"):
            reader.read()


class FlakySink(io.RawIOBase):
    """A sink whose write() or flush() can be told to fail once, or to take nothing."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.flush_error: BaseException | None = None
        self.write_error: BaseException | None = None
        self.full = False

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int | None:
        if self.write_error is not None:
            exc, self.write_error = self.write_error, None
            raise exc
        if self.full:
            self.full = False
            return None  # a non-blocking raw file that is full takes nothing
        self.data += bytes(b)
        return len(b)

    def flush(self) -> None:
        if self.flush_error is not None:
            exc, self.flush_error = self.flush_error, None
            raise exc


def test_a_failed_flush_counts_nothing_and_refuses_the_retry() -> None:
    sink = FlakySink()
    w = StreamWriter(sink, U8)
    w.write(u8(b"one"))
    sink.flush_error = BrokenPipeError("peer gone")
    with pytest.raises(BrokenPipeError):
        w.write(u8(b"two"))
    assert w.messages_written == 1  # 'two' was not handed over
    with pytest.raises(ValueError, match="failed part-way"):
        w.write(u8(b"two"))  # the retry would deliver 'two' twice
    assert w.messages_written == 1
    w.close()
    got: list[bytes] = []
    with pytest.raises(hb.FormatError, match="without an end-of-stream"):
        for t in StreamReader(io.BytesIO(bytes(sink.data))):
            got.append(bytes(t.memoryview()))
    assert got == [b"one", b"two"]  # 'two' reached the file once, and the end never did


def test_a_write_that_took_nothing_can_be_retried_exactly() -> None:
    sink = FlakySink()
    w = StreamWriter(sink, U8)
    w.write(u8(b"one"))
    sink.full = True
    with pytest.raises(BlockingIOError):
        w.write(u8(b"two"))
    assert w.messages_written == 1
    w.write(u8(b"two"))  # nothing of it was taken: the retry sends it once
    sink.write_error = BlockingIOError(11, "full", 0)  # a buffered file that took 0 bytes
    with pytest.raises(BlockingIOError):
        w.write(u8(b"three"))
    w.write(u8(b"three"))
    sink.full = True
    with pytest.raises(BlockingIOError):
        w.close()  # the end message did not go out: close() is not done
    w.close()
    assert w.messages_written == 3
    assert [bytes(t.memoryview()) for t in StreamReader(io.BytesIO(bytes(sink.data)))] == [
        b"one", b"two", b"three"]


def test_a_write_that_took_part_of_a_message_breaks_the_writer() -> None:
    sink = FlakySink()
    w = StreamWriter(sink, U8)
    sink.write_error = BlockingIOError(11, "full", 10)  # 10 bytes of the header were taken
    with pytest.raises(BlockingIOError):
        w.write(u8(b"one"))
    assert w.messages_written == 0
    with pytest.raises(ValueError, match="failed part-way"):
        w.write(u8(b"one"))


class Miscounting(io.RawIOBase):
    """A file object whose write() (after ``good`` right ones) or readinto() (once ``good``
    bytes are read) reports ``count(len)`` bytes."""

    def __init__(self, count: Any, good: int = 0, data: bytes = b"") -> None:
        self.count = count
        self.good = good
        self.data = bytearray()
        self.source = memoryview(data)
        self.delivered = 0

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        if self.good:
            self.good -= 1
            self.data += bytes(b)
            return len(b)
        return int(self.count(len(b)))

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self.source))
        b[:n] = self.source[:n]
        self.source = self.source[n:]
        self.delivered += n
        return n if self.delivered <= self.good else int(self.count(len(b)))


@pytest.mark.parametrize("count", [lambda n: 0, lambda n: n + 1, lambda n: -1],
                         ids=["nothing", "more than given", "negative"])
def test_a_write_that_reports_an_impossible_count_raises_instead_of_looping(count: Any) -> None:
    # A write() that keeps returning 0 once made the writer call it forever.
    with pytest.raises(OSError, match=r"write\(\) returned"):
        StreamWriter(Miscounting(count), U8)  # the stream header
    sink = Miscounting(count, good=1)
    w = StreamWriter(sink, U8)
    with pytest.raises(OSError, match=r"write\(\) returned") as e:
        w.write(u8(b"one"))
    assert not isinstance(e.value, BlockingIOError)
    with pytest.raises(ValueError, match="failed part-way"):
        w.write(u8(b"one"))


@pytest.mark.parametrize("good", [0, 70], ids=["stream header", "message"])
def test_a_read_that_reports_more_bytes_than_asked_fails_the_reader(good: int) -> None:
    data = write_stream(U8, [u8(b"one"), u8(b"two")])
    source = Miscounting(lambda n: n + 1, good=good, data=data)  # the header is 64 bytes
    if not good:
        with pytest.raises(OSError, match=r"returned .* bytes for a read of"):
            StreamReader(source)
        return
    reader = StreamReader(source)
    with pytest.raises(OSError, match=r"returned .* bytes for a read of"):
        reader.read()
    with pytest.raises(hb.FormatError, match=r"unusable after an earlier error.*OSError"):
        reader.read()


class ReadOnly:
    """A file object with read() alone, which returns more than it is asked for."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        return self.data + b"extra"


def test_a_read_method_that_returns_too_much_is_refused() -> None:
    with pytest.raises(OSError, match=r"returned .* bytes for a read of"):
        StreamReader(ReadOnly(write_stream(U8, [u8(b"one")])))


def test_dead_peer_counts_nothing() -> None:
    r_fd, w_fd = os.pipe()
    f = open(w_fd, "wb")  # buffered: the message fits, the flush finds no reader
    try:
        w = StreamWriter(f, U8)  # the header goes out while the reader is there
        os.close(r_fd)
        with pytest.raises(BrokenPipeError):
            w.write(u8(b"lost"))
        assert w.messages_written == 0
        with pytest.raises(ValueError, match="failed part-way"):
            w.write(u8(b"lost"))
    finally:
        with pytest.raises(BrokenPipeError):
            f.close()  # its buffer still holds the message it could not send


def test_retrying_writer_on_a_nonblocking_pipe_never_duplicates() -> None:
    # A producer that retries each BlockingIOError on a buffered non-blocking pipe, draining
    # the pipe in between. Messages fit the file's buffer, so the pipe fills up in flush().
    # Whatever arrives, no message arrives twice, and messages_written is what was sent.
    r_fd, w_fd = os.pipe()
    os.set_blocking(r_fd, False)
    os.set_blocking(w_fd, False)
    received = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(r_fd, 1 << 16)
            except BlockingIOError:
                return
            if not chunk:
                return
            received.extend(chunk)

    sent = blocked = 0
    try:
        with open(w_fd, "wb", closefd=False) as f:
            w = StreamWriter(f, U8)
            for i in range(200):
                msg = np.full(1000, i % 251, np.uint8)
                try:
                    while True:
                        try:
                            w.write(msg)
                            sent += 1
                            break
                        except BlockingIOError:
                            blocked += 1
                            drain()  # then retry, as BlockingIOError invites
                except ValueError:
                    break  # the writer refuses after a write that failed part-way
            counted = w.messages_written
            drain()
            os.set_blocking(w_fd, True)
            w.close()
            f.flush()
        os.close(w_fd)
        w_fd = -1
        drain()
    finally:
        os.close(r_fd)
        if w_fd >= 0:
            os.close(w_fd)
    assert blocked > 0  # the pipe did fill up
    got: list[int] = []
    try:
        for t in StreamReader(io.BytesIO(bytes(received))):
            got.append(int(np.asarray(t)[0]))
    except hb.FormatError:
        pass  # the writer stopped part-way: a truncated stream
    assert got == [i % 251 for i in range(len(got))]  # in order, none twice
    assert counted == sent <= len(got)


# ------------------------------------------------- memory before the bytes arrive
CLAIMS = [(64 << 10) - 64, 64 << 10, 256 << 10, (1 << 20) - 64, 1 << 20, 64 << 20]


@pytest.mark.parametrize("claim, sent", [(c, n) for c in CLAIMS
                                         for n in (0, 64 << 10, (64 << 10) + 1) if n < c])
@pytest.mark.parametrize("channel", ["pipe", "unseekable"])
def test_a_pipe_message_claiming_much_allocates_little_before_its_bytes(
        claim: int, sent: int, channel: str) -> None:
    # The bound of docs/impl/robustness.md: traced allocation <= 16 x input + 256 KiB, for
    # a message that claims `claim` bytes and sends `sent` of them before the stream ends.
    import tracemalloc

    data = bytearray(write_stream(U8, [u8(bytes(10))]))
    at = first_message_at(data)
    del data[at + 64:]  # the header and shape only
    struct.pack_into("<Q", data, at + 32, claim)
    header_with(data, at, payload=8 + 24 + claim)
    raw = bytes(data) + bytes(sent)
    if channel == "pipe":
        r_fd, w_fd = os.pipe()
        th = threading.Thread(target=lambda: (os.write(w_fd, raw), os.close(w_fd)))
        th.start()  # a pipe holds 64 KiB at most: the writer waits for the reader
        f: Any = open(r_fd, "rb", buffering=0)
    else:
        f = Unseekable(raw)
    tracemalloc.start()
    try:
        with pytest.raises(hb.FormatError, match="truncated buffers of message 0"):
            list(StreamReader(f))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        f.close()
        if channel == "pipe":
            th.join(TIMEOUT)
    assert peak <= 16 * len(raw) + (256 << 10), (len(raw), claim, peak)


def test_messages_around_the_allocation_steps_read_back() -> None:
    # Sizes on both sides of the 64 KiB stage and the 1 MiB map, from a file (allocated up
    # front) and from a stalling pipe (staged, then grown, resumed across every stall).
    rng = np.random.default_rng(3)
    k64, m1 = 64 << 10, 1 << 20
    sizes = [k64 - 64, k64 - 1, k64, k64 + 1, 300_000, m1 - 64, m1 - 1, m1, m1 + 1]
    items = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    data = write_stream(U8, items)
    got = list(StreamReader(io.BytesIO(data)))
    assert [bytes(t.memoryview()) for t in got] == [a.tobytes() for a in items]
    assert all(t.buffers[0].ptr % 64 == 0 for t in got)
    assert read_retrying(Stalling(data, 4099)) == [a.tobytes() for a in items]
