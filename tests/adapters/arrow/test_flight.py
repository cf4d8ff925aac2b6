"""Hurray tensor streams over Arrow Flight (docs/spec/interchange.md §10), on localhost.

Every server is started on a thread (or in a child process) by a fixture and shut down in
its ``finally``; every call carries a Flight timeout and every join a bound. Zero-copy is
proven by addresses: a received tensor's buffers lie inside the record batch's buffer.
"""

from __future__ import annotations

import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import DYNAMIC, Descriptor, Layout, Quantization, QuantScheme, Sparse
from tests.hurray_bridge.test_pickle_shm import make, snapshot

np = pytest.importorskip("numpy", reason="numpy is not installed")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")
flight = pytest.importorskip("pyarrow.flight", reason="this pyarrow has no Flight")

from hurray_bridge.adapters.arrow import flight as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 30.0


def _serve(srv: Any) -> Iterator[Any]:
    th = threading.Thread(target=srv.serve, daemon=True)
    th.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        th.join(TIMEOUT)
        assert not th.is_alive(), "the Flight server did not stop"


@pytest.fixture
def server() -> Iterator[F.FlightTensorServer]:
    yield from _serve(F.FlightTensorServer("grpc://127.0.0.1:0"))


def round_trip(server: F.FlightTensorServer, items: list[Any], schema: Descriptor | None,
               name: str = "s") -> list[hb.Tensor]:
    assert F.put(server.location, name, items, schema=schema, timeout=TIMEOUT) == len(items)
    with F.get(server.location, name, timeout=TIMEOUT) as reader:
        got = list(reader)
        assert reader.messages_read == len(items)
    return got


# ------------------------------------------------------------- round trips
def test_dynamic_batches_round_trip(server: F.FlightTensorServer) -> None:
    schema = Descriptor([DYNAMIC, 3], hb.float32)
    rng = np.random.default_rng(0)
    items = [rng.standard_normal((n, 3)).astype(np.float32) for n in (3, 0, 5, 1, 1000)]
    got = round_trip(server, items, schema)
    assert [t.shape for t in got] == [a.shape for a in items]
    for t, a in zip(got, items):
        assert bytes(t.memoryview()) == a.tobytes()
        # shared Arrow memory is immutable; a copy (of memory that arrived unaligned) is not
        assert t.readonly != t.copied
    assert got[1].buffers[0].ptr == 0  # an empty batch: a NULL buffer, as everywhere
    with F.get(server.location, "s", timeout=TIMEOUT) as reader:
        assert reader.schema == schema


def test_empty_stream_round_trips_its_schema(server: F.FlightTensorServer) -> None:
    schema = Descriptor([DYNAMIC, DYNAMIC], hb.int16)
    assert F.put(server.location, "empty", [], schema=schema, timeout=TIMEOUT) == 0
    with F.get(server.location, "empty", timeout=TIMEOUT) as reader:
        assert reader.schema == schema
        assert list(reader) == []


def test_schema_defaults_to_the_first_tensor(server: F.FlightTensorServer) -> None:
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    got = round_trip(server, [a, a[::-1]], None)  # a strided view is compacted
    assert [np.asarray(t).tolist() for t in got] == [a.tolist(), a[::-1].tolist()]
    with pytest.raises(hb.FormatError, match="axis 0 has size 2"):
        F.put(server.location, "x", [a, a[:2]], timeout=TIMEOUT)
    with pytest.raises(hb.UnsupportedError, match="schema="):
        F.put(server.location, "x", [], timeout=TIMEOUT)


@pytest.mark.parametrize("name", ["bf16", "f16_nan", "c128", "int4_padded", "int4_packed"])
def test_types_round_trip_bit_exact(server: F.FlightTensorServer, name: str) -> None:
    rng = np.random.default_rng(1)
    if name == "int4_packed":  # odd counts: the last byte holds one element
        schema = Descriptor([DYNAMIC], hb.int4)
        items = [make(schema.resolve([n]), rng.integers(0, 256, -(-n // 2)).astype(np.uint8)
                      & (0x77 if n % 2 == 0 else 0x07)) for n in (7, 0, 8, 1)]
    else:
        ml_dtypes = pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
        a = {
            "bf16": lambda: rng.standard_normal((5, 4)).astype(ml_dtypes.bfloat16),
            "f16_nan": lambda: np.array([[0x7E01, 0xFE42, 1, 0x3C00]] * 5,
                                        np.uint16).view(np.float16),
            "c128": lambda: (rng.standard_normal((5, 4)) + 1j).astype(np.complex128),
            "int4_padded": lambda: rng.integers(-8, 8, (5, 4)).astype(ml_dtypes.int4),
        }[name]()
        items = [hb.asarray(a), hb.asarray(a[:0]), hb.asarray(a[:2])]
        d = items[0].descriptor
        schema = Descriptor([DYNAMIC, 4], d.dtype, padded=d.padded)
    got = round_trip(server, items, schema)
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]


def test_quantized_round_trip(server: F.FlightTensorServer) -> None:
    q = Quantization(QuantScheme.PER_AXIS, "float32", "int8", axis=1)
    schema = Descriptor([DYNAMIC, 3], hb.int8, quantization=q)
    items = [make(schema.resolve([n]), np.arange(3 * n, dtype=np.int8),
                  np.array([0.5, 1.0, 2.0], np.float32), np.array([1, 0, -1], np.int8))
             for n in (2, 0, 4)]
    got = round_trip(server, items, schema)
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]
    # DATA, SCALES and ZERO_POINTS share one column, each at a 64-byte offset from its start
    for g in got:
        ptrs = [b.ptr for b in g.buffers if b.nbytes]
        assert [p - ptrs[0] for p in ptrs] == [64 * i for i in range(len(ptrs))]


def test_block_quantized_int4_round_trip(server: F.FlightTensorServer) -> None:
    q = Quantization(QuantScheme.PER_BLOCK, "float16", None, axis=1, block_size=4)
    schema = Descriptor([DYNAMIC, 8], hb.int4, quantization=q)
    rng = np.random.default_rng(3)
    items = [make(schema.resolve([n]), rng.integers(0, 256, 4 * n).astype(np.uint8),
                  rng.standard_normal(2 * n).astype(np.float16)) for n in (3, 0, 1)]
    got = round_trip(server, items, schema)
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]


def test_sparse_round_trip(server: F.FlightTensorServer) -> None:
    schema = Descriptor([DYNAMIC, 4], hb.float32, Layout.CSR, sparse=Sparse(2, "int32"))
    items = [
        make(schema.resolve([2]), np.array([1.0, 2.0], np.float32),
             np.array([0, 1, 2], np.int32), np.array([3, 0], np.int32)),
        make(schema.resolve([5]), np.array([5.0, 6.0], np.float32),
             np.array([0, 0, 0, 2, 2, 2], np.int32), np.array([1, 2], np.int32)),
    ]
    got = round_trip(server, items, schema)
    assert [snapshot(g) for g in got] == [snapshot(t) for t in items]


def test_a_put_replaces_a_stream_of_the_same_name(server: F.FlightTensorServer) -> None:
    round_trip(server, [np.zeros(2, np.uint8)], None, name="a")
    (got,) = round_trip(server, [np.ones(3, np.uint8)], None, name="a")
    assert np.asarray(got).tolist() == [1, 1, 1]
    assert server.names() == ["a"]


def test_a_reader_left_mid_stream_cancels_its_call() -> None:
    # the fixture's shutdown (bounded) would wait on a call still running on the server
    for srv in _serve(F.FlightTensorServer("grpc://127.0.0.1:0")):
        F.put(srv.location, "s", [np.zeros(1 << 16, np.uint8)] * 8, timeout=TIMEOUT)
        with F.get(srv.location, "s", timeout=TIMEOUT) as reader:
            first = next(reader)
        with pytest.raises(StopIteration):
            next(reader)
        assert reader.messages_read == 1 and first.nbytes == 1 << 16


def test_the_server_reports_where_clients_reach_it() -> None:
    # a TCP location bound on port 0 reports the real port; a Unix socket, its path
    folder = tempfile.mkdtemp(prefix="hbf")  # short: a socket path has ~100 bytes at most
    try:
        for where in (flight.Location.for_grpc_tcp("127.0.0.1", 0),
                      f"grpc+unix://{folder}/s.sock"):
            for srv in _serve(F.FlightTensorServer(where)):
                assert not srv.location.endswith(":0")
                (t,) = round_trip(srv, [np.arange(5, dtype=np.int16)], None)
                assert np.asarray(t).tolist() == [0, 1, 2, 3, 4]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ------------------------------------------------------------- zero copy
@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64])
def test_received_tensors_share_the_record_batch(server: F.FlightTensorServer,
                                                 dtype: Any) -> None:
    a = np.arange((1 << 20) // np.dtype(dtype).itemsize).astype(dtype)  # 1 MiB
    (t,) = round_trip(server, [a], None)
    buf = t.owner
    assert isinstance(buf, pa.Buffer)  # the record batch's own buffer, not a copy of it
    assert buf.address <= t.data_ptr and t.data_ptr + t.nbytes <= buf.address + buf.size
    assert not t.copied and t.readonly
    # the sender placed the body 32 past a 64-byte offset of a message gRPC reassembled
    # at 16 past malloc's (16-aligned) pointer, so every element type is aligned
    assert t.data_ptr % 16 == 0
    assert bytes(t.memoryview()) == a.tobytes()


def test_a_sent_tensor_is_handed_to_flight_without_a_copy() -> None:
    a = np.arange(1000, dtype=np.float32)
    t = hb.asarray(a)
    arrow_schema = F._arrow_schema(Descriptor([DYNAMIC], hb.float32))
    batch, md = F._batch(t, 0, arrow_schema, F._header_size(arrow_schema))
    assert batch.column(0).buffers()[1].address == a.ctypes.data
    assert md[:4] == b"HRYM"


@pytest.mark.parametrize("header", [136, 200, 20000])
def test_the_padding_puts_the_body_32_past_a_64_byte_offset(header: int) -> None:
    # The FlightData protobuf: IPC header (tag, varint length), app_metadata (tag, varint
    # length, which counts the padding), then the body's 2-byte tag and varint length.
    def varint(n: int) -> int:
        return max(1, -(-n.bit_length() // 7))

    for md in range(300):  # across 127/128, where app_metadata's varint grows a byte
        for body in (8, 1 << 20, 1 << 26):
            pad = F._body_padding(header, md, body)
            at = (1 + varint(header) + header + 1 + varint(md + pad) + md + pad
                  + 2 + varint(body))
            assert at % 64 == 32 and 0 <= pad < 128, (md, body, pad)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                    reason="the placement is glibc malloc's (large blocks mapped 16 past a page)")
def test_a_large_received_tensor_is_64_byte_aligned_and_shared(
        server: F.FlightTensorServer) -> None:
    # Above glibc's largest mmap threshold (32 MiB) gRPC's reassembled message starts 32
    # past a 64-byte boundary, where the padding puts the body's offset: both the server
    # (put) and the client (get) find it 64-aligned, in the message's own memory.
    a = np.arange((40 << 20) // 4, dtype=np.float32)
    assert F.put(server.location, "big", [a], timeout=TIMEOUT) == 1
    (batch, _), _end = server._streams[b"big"][1]
    assert batch.column(0).buffers()[1].address % 64 == 0
    with F.get(server.location, "big", timeout=TIMEOUT) as reader:
        (t,) = list(reader)
        assert reader.copies == 0
    buf = t.owner
    assert isinstance(buf, pa.Buffer) and not t.copied
    assert buf.address <= t.data_ptr and t.data_ptr + t.nbytes <= buf.address + buf.size
    assert t.data_ptr % 64 == 0
    assert np.array_equal(np.asarray(t), a)


def test_a_sender_may_pad_up_to_the_bound() -> None:
    # Another sender may place its body differently: up to 127 zero bytes (twice the
    # 64-byte period, for the varint corner) are its business, one more is refused.
    schema = Descriptor([DYNAMIC, 3], hb.float32)
    _, batch, md = _good(schema, np.ones((2, 3), np.float32))
    end = 32 + len(Descriptor([2, 3], hb.float32).to_bytes())
    msg = F._check(schema, 0, batch, pa.py_buffer(md[:end] + bytes(127)))
    assert msg.resolved == Descriptor([2, 3], hb.float32)
    with pytest.raises(hb.FormatError, match=r"message\[0\]\.app_metadata: 128 bytes"):
        F._check(schema, 0, batch, pa.py_buffer(md[:end] + bytes(128)))


def test_a_schema_seen_before_is_taken_only_when_equal_metadata_and_all() -> None:
    # A get compares its stream's schema with those already checked: a schema equal in
    # its fields but carrying another Hurray schema, or a broken one, is checked afresh.
    a, b = Descriptor([DYNAMIC], hb.float32), Descriptor([DYNAMIC, 2], hb.int8)
    assert F.stream_schema(F._arrow_schema(a)) == a
    assert F.stream_schema(F._arrow_schema(a)) == a  # a new wrapper of a schema seen
    assert F.stream_schema(F._arrow_schema(b)) == b
    broken = F._arrow_schema(a).with_metadata({F.SCHEMA_KEY: b"HRYS" + bytes(60)})
    with pytest.raises(hb.FormatError, match=r"stream"):
        F.stream_schema(broken)
    with pytest.raises(hb.FormatError, match=r"flight\.schema.*one uint8 column"):
        F.stream_schema(pa.schema([pa.field(F.COLUMN, pa.int8(), nullable=False)],
                                  metadata=F._arrow_schema(a).metadata))


@pytest.mark.parametrize("dtype", [hb.float32, hb.int4, hb.bool8, hb.bfloat16])
def test_a_received_dense_tensor_is_the_general_paths_tensor(dtype: hb.DType) -> None:
    # The common message skips the buffer table's checks: what it builds is what the
    # general constructor builds from the same message.
    schema = Descriptor([DYNAMIC, 3], dtype)
    d = schema.resolve([4])
    (spec,) = d.buffer_layout()
    _, batch, md = _good(schema, make(d, np.arange(spec.nbytes, dtype=np.uint8) % 2))
    msg = F._check(schema, 0, batch, pa.py_buffer(md))
    t = F._tensor(msg)
    assert msg.resolved == d and F._receiving(d)[1]
    general = hb.Tensor(d, [hb.Buffer(s.role, msg.address + o, s.nbytes)
                            for s, o in zip(d.buffer_layout(), msg.offsets)],
                        owner=msg.owner, readonly=True)
    assert t.descriptor == general.descriptor == d
    assert t.buffers == general.buffers and t.data_ptr == general.data_ptr
    assert t.readonly and not t.copied and t.owner is msg.owner
    assert snapshot(t) == snapshot(general)
    q = Quantization(QuantScheme.PER_AXIS, "float32", "int8", axis=1)
    assert not F._receiving(Descriptor([4, 3], hb.int8, quantization=q))[1]


def test_a_tensor_whose_dense_form_could_not_exist_is_received(
        server: F.FlightTensorServer) -> None:
    # A sparse tensor of a huge shape, and a broadcast one, hold a few bytes; the dense
    # tensor of their shape would need more than 2**64 - 1. Telling a plain message
    # from others must not build that dense descriptor.
    coo = Descriptor([2**31, 2**31], hb.float32, Layout.COO,
                     sparse=Sparse(nnz=1, index_dtype=hb.int64))
    items = [make(coo, np.array([1.5], np.float32), np.array([[5], [7]], np.int64))]
    assert [snapshot(g) for g in round_trip(server, items, coo)] == [snapshot(items[0])]
    wide = Descriptor([2**62], hb.float64, Layout.STRIDED, strides=[0])
    assert not F._receiving(coo)[1] and not F._receiving(wide)[1]


def test_unaligned_memory_is_copied_and_reported() -> None:
    a = np.arange(16, dtype=np.float64)
    raw = pa.py_buffer(b"\0" + a.tobytes())
    body = raw.slice(1)  # an address 8-aligned memory can never have
    assert body.address % 8
    d = Descriptor([16], hb.float64)
    t = F._tensor(F._Message(d, [0], body, body.address, body.size))
    assert t.copied and not t.readonly and t.data_ptr % 64 == 0
    assert np.asarray(t).tolist() == a.tolist()


# ------------------------------------------------------------- refusals
def test_unknown_name_is_a_not_found_error(server: F.FlightTensorServer) -> None:
    round_trip(server, [np.zeros(1, np.uint8)], None, name="here")
    with pytest.raises(hb.NotFoundError, match="'missing'") as info:
        list(F.get(server.location, "missing", timeout=TIMEOUT))
    assert isinstance(info.value, KeyError) and "'here'" in str(info.value)


def test_bad_arguments_are_refused(server: F.FlightTensorServer) -> None:
    with pytest.raises(hb.UnsupportedError, match="non-empty str"):
        F.put(server.location, "", [np.zeros(1)], timeout=TIMEOUT)
    with pytest.raises(hb.UnsupportedError, match="location must be"):
        F.get(8815, "s")
    with pytest.raises(hb.FormatError, match="timeout"):
        F.get(server.location, "s", timeout=-1)
    with pytest.raises(hb.UnsupportedError, match="schema must be"):
        F.put(server.location, "s", [], schema="float32")  # type: ignore[arg-type]


def test_a_failed_put_leaves_nothing_behind(server: F.FlightTensorServer) -> None:
    schema = Descriptor([DYNAMIC, 2], hb.float32)
    ok = np.zeros((1, 2), np.float32)
    with pytest.raises(hb.FormatError, match="axis 1 has size 3"):
        F.put(server.location, "half", [ok, np.zeros((1, 3), np.float32)], schema=schema,
              timeout=TIMEOUT)

    def failing() -> Iterator[Any]:
        yield ok
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError, match="producer died"):
        F.put(server.location, "half", failing(), schema=schema, timeout=TIMEOUT)
    assert server.names() == []
    with pytest.raises(hb.NotFoundError):
        F.get(server.location, "half", timeout=TIMEOUT)


def _raw_put(server: F.FlightTensorServer, arrow_schema: Any,
             messages: list[tuple[Any, bytes]]) -> None:
    client = flight.connect(server.location)
    try:
        writer, _ = client.do_put(flight.FlightDescriptor.for_path(b"raw"), arrow_schema,
                                  options=flight.FlightCallOptions(timeout=TIMEOUT))
        for batch, md in messages:
            writer.write_with_metadata(batch, pa.py_buffer(md))
        writer.close()
    finally:
        client.close()


def _good(schema: Descriptor, a: Any) -> tuple[Any, Any, bytes]:
    arrow_schema = F._arrow_schema(schema)
    batch, md = F._batch(hb.asarray(a), 0, arrow_schema, F._header_size(arrow_schema))
    return arrow_schema, batch, md


CORRUPTIONS = {
    # (what is done to the app_metadata, the field the refusal names)
    "descriptor magic": (lambda md: md[:32] + b"XRYD" + md[36:], "magic"),
    "descriptor truncated": (lambda md: md[:40], "header"),
    "static axis changed": (lambda md: md[:32] + _other_shape(md) + md[32 + 72:], "descriptor"),
    "buffer length": (lambda md: md[:32 + 72 - 8] + (4).to_bytes(8, "little") + md[32 + 72:],
                      "descriptor.buffers[0].length"),
    "sequence": (lambda md: md[:8] + (7).to_bytes(8, "little") + md[16:], "sequence"),
    "payload size": (lambda md: md[:16] + (1).to_bytes(8, "little") + md[24:], "payload_size"),
    "trailing junk": (lambda md: md + b"\1", "app_metadata"),
    "padding past the bound": (lambda md: md + bytes(128), "app_metadata"),
}


def _other_shape(md: bytes) -> bytes:
    """A valid descriptor of the same length whose static axis differs from the schema's."""
    assert hb.Descriptor.from_bytes(md[32:32 + 72]) == Descriptor([2, 3], hb.float32)
    return Descriptor([2, 5], hb.float32).to_bytes()


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_message_is_refused_at_put(server: F.FlightTensorServer, case: str) -> None:
    corrupt, field = CORRUPTIONS[case]
    arrow_schema, batch, md = _good(Descriptor([DYNAMIC, 3], hb.float32),
                                    np.ones((2, 3), np.float32))
    # the server's FormatError (a ValueError) reaches a plain Flight client as ArrowInvalid
    with pytest.raises(pa.ArrowInvalid, match=rf"message\[0\]\.[\w.]*{re.escape(field)}"):
        _raw_put(server, arrow_schema, [(batch, corrupt(md))])
    assert server.names() == []


def test_a_plain_record_batch_stream_is_refused_at_put(server: F.FlightTensorServer) -> None:
    arrow_schema = pa.schema([pa.field("x", pa.float32())])
    batch = pa.record_batch([pa.array([1.0], pa.float32())], schema=arrow_schema)
    with pytest.raises(pa.ArrowInvalid, match=r"flight\.schema"):
        _raw_put(server, arrow_schema, [(batch, b"")])
    assert server.names() == []


class _Scripted(F.FlightTensorServer):
    """Serves one stream as scripted: messages edited, an error or an early stop."""

    def __init__(self, script: Any) -> None:
        super().__init__("grpc://127.0.0.1:0")
        self.script = script

    def do_get(self, context: Any, ticket: Any) -> Any:
        arrow_schema, messages, _ = self._streams[ticket.ticket]
        return flight.GeneratorStream(arrow_schema, self.script(messages))


def _scripted(script: Any) -> Iterator[_Scripted]:
    srv = _Scripted(script)
    yield from _serve(srv)


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_message_is_refused_at_get(case: str) -> None:
    corrupt, field = CORRUPTIONS[case]

    def script(messages: list[Any]) -> Iterator[Any]:
        (batch, md), *rest = messages
        yield batch, pa.py_buffer(corrupt(md.to_pybytes()))
        yield from rest

    for srv in _scripted(script):
        schema = Descriptor([DYNAMIC, 3], hb.float32)
        F.put(srv.location, "s", [np.ones((2, 3), np.float32)], schema=schema, timeout=TIMEOUT)
        with F.get(srv.location, "s", timeout=TIMEOUT) as reader:
            with pytest.raises(hb.FormatError, match=rf"message\[0\]\.[\w.]*{re.escape(field)}"):
                next(reader)
            with pytest.raises(StopIteration):  # nothing after a refusal
                next(reader)


def test_a_server_failing_mid_stream_raises_naming_the_count() -> None:
    def script(messages: list[Any]) -> Iterator[Any]:
        yield from messages[:2]
        raise RuntimeError("disk on fire")

    for srv in _scripted(script):
        items = [np.full(4, i, np.int32) for i in range(5)]
        F.put(srv.location, "s", items, timeout=TIMEOUT)
        reader = F.get(srv.location, "s", timeout=TIMEOUT)
        got = [next(reader), next(reader)]
        with pytest.raises(hb.TransportError, match=r"after 2 whole tensors.*disk on fire"):
            next(reader)
        assert [np.asarray(t).tolist() for t in got] == [[0] * 4, [1] * 4]


def test_a_stream_that_stops_before_its_end_is_not_taken_as_whole() -> None:
    def script(messages: list[Any]) -> Iterator[Any]:
        yield from messages[:-2]  # no end-of-stream message, no last tensor

    for srv in _scripted(script):
        F.put(srv.location, "s", [np.zeros(3, np.uint8)] * 3, timeout=TIMEOUT)
        reader = F.get(srv.location, "s", timeout=TIMEOUT)
        with pytest.raises(hb.FormatError, match="ended after 2 tensors without an end"):
            list(reader)


_CHILD = """
import sys, time, threading
import numpy as np
import pyarrow.flight as flight
from hurray_bridge.adapters.arrow import flight as F

class Slow(F.FlightTensorServer):
    def do_get(self, context, ticket):
        schema, messages, _ = self._streams[ticket.ticket]
        def gen():
            yield messages[0]
            time.sleep(120)  # the parent kills this process here
            yield from messages[1:]
        return flight.GeneratorStream(schema, gen())

srv = Slow("grpc://127.0.0.1:0")
threading.Thread(target=srv.serve, daemon=True).start()
F.put(srv.location, "s", [np.arange(1000, dtype=np.float32)] * 3, timeout=30)
print(srv.location, flush=True)
time.sleep(120)
"""


def test_a_server_killed_mid_stream_raises_naming_the_count() -> None:
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE,
                             text=True, cwd=ROOT, env=_child_env())
    try:
        location = _read_line(child, TIMEOUT)
        reader = F.get(location, "s", timeout=TIMEOUT)
        first = next(reader)
        child.kill()
        child.wait(TIMEOUT)
        with pytest.raises(hb.TransportError, match="after 1 whole tensors"):
            next(reader)
        assert np.asarray(first).tolist() == list(range(1000))
    finally:
        child.kill()
        child.wait(TIMEOUT)
        assert child.stdout is not None
        child.stdout.close()


def _child_env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _read_line(child: subprocess.Popen[str], timeout: float) -> str:
    """The child's first line of output, or a failure after ``timeout`` seconds."""
    line: list[str] = []
    th = threading.Thread(target=lambda: line.append(child.stdout.readline()),  # type: ignore[union-attr]
                          daemon=True)
    th.start()
    th.join(timeout)
    assert line and line[0].strip(), f"the child server did not start (rc={child.poll()})"
    return line[0].strip()


def test_a_bool8_tensor_is_checked_and_handed_to_flight_without_a_copy() -> None:
    # bool8 leaves the framing's plain-buffer shortcut (its bytes are checked) but a
    # valid one is still sent from its own memory.
    a = np.array([True, False, True] * 100)
    schema = Descriptor([DYNAMIC], hb.bool8)
    arrow_schema = F._arrow_schema(schema)
    batch, _ = F._batch(hb.asarray(a), 0, arrow_schema, F._header_size(arrow_schema))
    assert batch.column(0).buffers()[1].address == a.ctypes.data
    bad = np.frombuffer(bytes([0, 1, 2]), dtype=np.bool_)  # 2 is no bool8 value
    with pytest.raises(hb.FormatError, match="bool8"):
        F._batch(hb.asarray(bad), 0, arrow_schema, F._header_size(arrow_schema))


def test_messages_of_one_shape_share_their_framing_but_not_their_header() -> None:
    # The encoded descriptor and padding are remembered per descriptor; the sequence
    # number is each message's own, and the receiver checks each message in full.
    schema = Descriptor([DYNAMIC, 4], hb.float32)
    arrow_schema = F._arrow_schema(schema)
    header = F._header_size(arrow_schema)
    a, b = np.ones((3, 4), np.float32), np.zeros((5, 4), np.float32)
    mds = [F._batch(hb.asarray(x), seq, arrow_schema, header)
           for seq, x in enumerate([a, b, a])]
    n = F._MESSAGE_HEADER.size
    assert mds[0][1][n:] == mds[2][1][n:] != mds[1][1][n:]  # the tail after the header
    assert mds[0][1] != mds[2][1]  # sequence numbers 0 and 2
    for seq, (batch, md) in enumerate(mds):
        msg = F._check(schema, seq, batch, pa.py_buffer(md))
        assert msg.resolved is not None and msg.resolved.shape[0] in (3, 5)
    with pytest.raises(hb.FormatError, match="sequence number 2, expected 1"):
        F._check(schema, 1, mds[2][0], pa.py_buffer(mds[2][1]))


END_CASES = {
    # (end message edited, the field its refusal names): none may pass as the end
    "one row": (lambda md, seq: (1, md), "kind"),
    "sequence": (lambda md, seq: (0, F._end_metadata(seq + 1)), "sequence"),
    "a byte more": (lambda md, seq: (0, md + b"\0"), "kind"),
    "reserved": (lambda md, seq: (0, md[:24] + b"\1" + md[25:]), "reserved"),
    "payload": (lambda md, seq: (0, md[:16] + (8).to_bytes(8, "little") + md[24:]), "kind"),
}


@pytest.mark.parametrize("case", sorted(END_CASES))
def test_an_end_message_passes_only_as_the_exact_end(case: str) -> None:
    # The exact end message is recognised by one comparison; anything else takes the
    # full path and is refused there, naming the field.
    schema = Descriptor([DYNAMIC], hb.uint8)
    arrow_schema = F._arrow_schema(schema)
    good = F._end_metadata(3)
    assert F._check(schema, 3, F._empty(arrow_schema), pa.py_buffer(good)) is F._END
    rows, md = END_CASES[case][0](good, 3)
    batch = pa.record_batch([pa.array([0] * rows, pa.uint8())], schema=arrow_schema)
    with pytest.raises(hb.FormatError, match=rf"message\[3\]\.{END_CASES[case][1]}"):
        F._check(schema, 3, batch, pa.py_buffer(md))


def test_a_metadata_only_message_is_refused_at_put(server: F.FlightTensorServer) -> None:
    # Flight lets a writer send app_metadata without a batch; a Hurray stream has none.
    schema = Descriptor([DYNAMIC], hb.uint8)
    client = flight.connect(server.location)
    try:
        writer, _ = client.do_put(flight.FlightDescriptor.for_path(b"raw"),
                                  F._arrow_schema(schema),
                                  options=flight.FlightCallOptions(timeout=TIMEOUT))
        writer.write_metadata(pa.py_buffer(F._end_metadata(0)))
        with pytest.raises(pa.ArrowInvalid, match=r"message\[0\]\.data: .*no record batch"):
            writer.close()
    finally:
        client.close()
    assert server.names() == []
    with pytest.raises(hb.FormatError, match=r"message\[0\]\.data"):
        F._check(schema, 0, None, pa.py_buffer(F._end_metadata(0)))


def test_a_put_keeps_a_stream_of_many_tensors_in_order(server: F.FlightTensorServer) -> None:
    # Each message's app_metadata buffer is replaced by the next one's while Flight may
    # still hold it; every tensor still arrives whole and in order.
    items = [np.full(1000 + i, i, np.int32) for i in range(40)]
    got = round_trip(server, items, Descriptor([DYNAMIC], hb.int32))
    assert [np.asarray(t).tolist() for t in got] == [x.tolist() for x in items]


# ------------------------------------------------------------- listing
def test_list_flights_and_get_flight_info_describe_each_stream(
        server: F.FlightTensorServer) -> None:
    schema = Descriptor([DYNAMIC, 3], hb.float32)
    F.put(server.location, "b/one", [np.ones((2, 3), np.float32), np.ones((5, 3), np.float32)],
          schema=schema, timeout=TIMEOUT)
    F.put(server.location, "a/two", [np.arange(10, dtype=np.int16)], timeout=TIMEOUT)
    F.put(server.location, "b/empty", [], schema=schema, timeout=TIMEOUT)
    client = flight.connect(server.location)
    try:
        options = flight.FlightCallOptions(timeout=TIMEOUT)
        infos = list(client.list_flights(options=options))
        assert [i.descriptor.path for i in infos] == [[b"b/one"], [b"a/two"], [b"b/empty"]]
        one = client.get_flight_info(flight.FlightDescriptor.for_path(b"b/one"), options)
        assert (one.total_records, one.total_bytes) == (2, (2 + 5) * 3 * 4)
        assert F.stream_schema(one.schema) == schema
        (endpoint,) = one.endpoints
        with F.get(client, endpoint.ticket.ticket.decode(), timeout=TIMEOUT) as reader:
            assert [t.shape for t in reader] == [(2, 3), (5, 3)]
        with pytest.raises(KeyError, match="no stream named 'none'"):  # gRPC NOT_FOUND
            client.get_flight_info(flight.FlightDescriptor.for_path(b"none"), options)
        with pytest.raises(pa.ArrowInvalid, match=r"flight\.descriptor"):
            client.get_flight_info(flight.FlightDescriptor.for_command(b"b/one"), options)
    finally:
        client.close()
    assert F.list_streams(server, "b/", timeout=TIMEOUT) == [
        F.StreamInfo("b/one", schema, 2, 84), F.StreamInfo("b/empty", schema, 0, 0)]
    (two,) = F.list_streams(server.location, "a", timeout=TIMEOUT)
    assert two == F.StreamInfo("a/two", Descriptor([10], hb.int16), 1, 20)


def test_a_listed_stream_counts_the_bytes_of_its_buffers_not_their_gaps(
        server: F.FlightTensorServer) -> None:
    # A quantized tensor's three buffers sit at 64-byte offsets in its message's column:
    # 6 + 12 + 3 bytes of buffers in a column of 131.
    q = Quantization(QuantScheme.PER_AXIS, "float32", "int8", axis=1)
    t = make(Descriptor([2, 3], hb.int8, quantization=q), np.arange(6, dtype=np.int8),
             np.array([0.5, 1, 2], np.float32), np.array([1, 0, -1], np.int8))
    F.put(server.location, "q", [t, t], timeout=TIMEOUT)
    (info,) = F.list_streams(server, timeout=TIMEOUT)
    assert info.tensors == 2 and info.nbytes == 2 * sum(b.nbytes for b in t.buffers) == 42


def test_a_failed_put_is_not_listed(server: F.FlightTensorServer) -> None:
    def failing() -> Iterator[Any]:
        yield np.ones(4, np.float32)
        raise RuntimeError("producer failed")

    with pytest.raises(RuntimeError):
        F.put(server.location, "half", failing(), timeout=TIMEOUT)
    assert F.list_streams(server, timeout=TIMEOUT) == []


def test_list_streams_refusals() -> None:
    with pytest.raises(hb.UnsupportedError, match="prefix must be a str"):
        F.list_streams("grpc://127.0.0.1:1", b"a")  # type: ignore[arg-type]
    with pytest.raises(hb.TransportError, match="could not list the streams"):
        F.list_streams("grpc://127.0.0.1:1", timeout=5)


class _Foreign(flight.FlightServerBase):  # type: ignore[misc]
    """A Flight server of another kind: it lists a plain table."""

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[Any]:
        schema = pa.schema([pa.field("x", pa.float32())])
        yield flight.FlightInfo(schema, flight.FlightDescriptor.for_path(b"table"),
                                [flight.FlightEndpoint(b"table", [])], total_records=3)


def test_list_streams_of_another_kind_of_server_is_a_format_error() -> None:
    for srv in _serve(_Foreign("grpc://127.0.0.1:0")):
        with pytest.raises(hb.FormatError, match=r"flight\.schema.*not a Hurray tensor stream"):
            F.list_streams(f"grpc://127.0.0.1:{srv.port}", timeout=TIMEOUT)
