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

import numpy as np
import pytest

import hurray_bridge as hb
from hurray_bridge import DYNAMIC, Descriptor, Layout, Quantization, QuantScheme, Sparse
from hurray_bridge.stream import (
    MESSAGE_MAGIC,
    STREAM_MAGIC,
    StreamReader,
    StreamWriter,
)
from tests.test_pickle_shm import make, snapshot

ROOT = Path(__file__).resolve().parents[1]
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
    import ml_dtypes

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
