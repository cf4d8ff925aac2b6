"""Tensor streams over Arrow Flight against pyarrow's own Flight and the bridge's socket stream.

One float32 tensor of 1 MiB and one of 64 MiB, over localhost, each way:

- ``get``: ``flight.get`` (checks every message, builds hb.Tensors over the received
  batches) against pyarrow's ``do_get`` of the same bytes as a plain record batch (one
  float32 column, read chunk by chunk, the batches never touched: the goal's peer), for
  information against that ``do_get`` reaching each batch's column buffers (what a
  pyarrow user pays to use the bytes), and against ``hb.StreamReader`` reading the same
  tensor from a localhost TCP socket that ``hb.StreamWriter`` writes on a thread;
- ``put``: ``flight.put`` against pyarrow's ``do_put`` of that plain batch, built once
  (the goal's peer), and, for information, against a ``do_put`` that builds its batch
  from the array in every call, as ``flight.put`` builds its own from the tensor; and for
  1 MiB, a stream of ``STREAM`` tensors in one put against ``do_put`` of as many batches;
- where a 1 MiB put's time goes, for information: pyarrow's ``do_put`` of the messages a
  put sends (the tensor's batch with its app_metadata, and the end message), built once,
  to the plain server against the plain batch (the format's own cost), and
  ``flight.put`` against that same ``do_put`` to our server (what the put's Python
  costs: conforming and framing the tensor in each call).

The servers (ours, pyarrow's plain one, and the socket stream's writer) run in a
child process, as on another machine: in this process their Python handlers would
share the client's GIL. Each side reuses one client (one connection); the plain
server keeps and serves batches as they come, ours checks them too.
Pairs run interleaved (``_timing.compare``), the 1 MiB ones over five times the
rounds; a ratio is the median of per-round ratios, time over time, so 1/ratio is the
throughput ratio (goal: at least 0.9x the peer's throughput, a time ratio of at most
1.11).

``python -m benchmarks flight [--small]``; ``python -m benchmarks.flight``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from typing import Any

import hurray_bridge as hb

from ._timing import compare, ratio

SIZES = (1 << 20, 64 << 20)
# Tensors in one put for the streamed 1 MiB pair: the cost of opening a call and of the
# end-of-stream message is then shared, as in a stream of a model's tensors.
STREAM = 16
SMALL_SIZES = (1 << 20, 8 << 20)


@contextmanager
def _serving(server: Any) -> Iterator[Any]:
    th = threading.Thread(target=server.serve, daemon=True)
    th.start()
    try:
        yield server
    finally:
        server.shutdown()
        th.join(30)


def _plain_server() -> Any:
    import pyarrow.flight as fl

    class Plain(fl.FlightServerBase):  # type: ignore[misc]
        """pyarrow's Flight with nothing added: batches kept and served as they came."""

        def __init__(self) -> None:
            super().__init__("grpc://127.0.0.1:0")
            self.store: dict[bytes, tuple[Any, list[Any]]] = {}

        def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
            self.store[descriptor.path[0]] = (reader.schema, [c.data for c in reader])

        def do_get(self, context: Any, ticket: Any) -> Any:
            schema, batches = self.store[ticket.ticket]
            return fl.GeneratorStream(schema, iter(batches))

    return Plain()


def _stream_server(listener: socket.socket) -> None:
    """Serve the socket stream: each 8-byte request (a size) gets a stream of one tensor."""
    import numpy as np

    conn, _ = listener.accept()
    tensors: dict[int, Any] = {}
    schema = hb.Descriptor([hb.DYNAMIC], hb.float32)
    with conn:
        while True:
            req = conn.recv(8, socket.MSG_WAITALL)
            if len(req) < 8:
                return
            size = int.from_bytes(req, "little")
            if size not in tensors:
                tensors[size] = np.random.default_rng(size).standard_normal(size // 4).astype(
                    np.float32)
            with hb.StreamWriter(conn, schema) as w:
                w.write(tensors[size])


def serve() -> None:
    """The child: both Flight servers and the stream server; stops when stdin closes."""
    from hurray_bridge.adapters.arrow import flight

    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=_stream_server, args=(listener,), daemon=True).start()
    with _serving(flight.FlightTensorServer("grpc://127.0.0.1:0")) as ours, \
            _serving(_plain_server()) as plain:
        print(ours.port, plain.port, listener.getsockname()[1], flush=True)
        sys.stdin.read()


@contextmanager
def _child() -> Iterator[tuple[Any, Any, int]]:
    """The servers' child process; a client of our server and one of pyarrow's plain one
    (each one connection, reused), and the socket stream's port."""
    import os
    import subprocess

    import pyarrow.flight as fl

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.flight", "--serve"], cwd=root,
                             env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        ours, plain, stream = (int(x) for x in child.stdout.readline().split())
        c_ours = fl.connect(f"grpc://127.0.0.1:{ours}")
        c_plain = fl.connect(f"grpc://127.0.0.1:{plain}")
        try:
            yield c_ours, c_plain, stream
        finally:
            c_ours.close()
            c_plain.close()
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(30)


def run(small: bool = False) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.flight as fl

    from hurray_bridge.adapters.arrow import flight

    results: dict[str, Any] = {"timings": [], "ratios": {}, "notes": []}
    rounds = 7 if small else 21
    with _child() as (c_ours, c_plain, stream_port), \
            socket.create_connection(("127.0.0.1", stream_port)) as sock:
        schema = hb.Descriptor([hb.DYNAMIC], hb.float32)
        for size in SMALL_SIZES if small else SIZES:
            label = f"{size >> 20}MiB"
            a = np.random.default_rng(size).standard_normal(size // 4).astype(np.float32)
            batch = pa.record_batch([pa.array(a)], names=["x"])
            desc = fl.FlightDescriptor.for_path(label.encode())
            ticket = fl.Ticket(label.encode())
            request = size.to_bytes(8, "little")

            def hb_put(a: Any = a, label: str = label) -> None:
                flight.put(c_ours, label, [a], schema=schema)

            def pa_put(batch: Any = batch, desc: Any = desc) -> None:
                writer, _ = c_plain.do_put(desc, batch.schema)
                writer.write_batch(batch)
                writer.close()

            def pa_put_fresh(a: Any = a, desc: Any = desc) -> None:
                # What a pyarrow user pays who has an array, not a batch, per put.
                fresh = pa.record_batch([pa.array(a)], names=["x"])
                writer, _ = c_plain.do_put(desc, fresh.schema)
                writer.write_batch(fresh)
                writer.close()

            copies = [0]

            def hb_get(label: str = label, copies: list[int] = copies) -> None:
                reader = flight.get(c_ours, label)
                assert len(list(reader)) == 1
                copies[0] += reader.copies

            def pa_get(ticket: Any = ticket) -> None:
                reader = c_plain.do_get(ticket)
                while True:
                    try:
                        reader.read_chunk()
                    except StopIteration:
                        break

            def pa_get_buffers(ticket: Any = ticket) -> None:
                # What a pyarrow user pays to reach the bytes: each batch's column
                # and its data buffer (pyarrow objects made after a blocking read).
                reader = c_plain.do_get(ticket)
                while True:
                    try:
                        chunk = reader.read_chunk()
                    except StopIteration:
                        break
                    chunk.data.column(0).buffers()

            def stream_get(request: bytes = request) -> None:
                sock.sendall(request)
                assert len(list(hb.StreamReader(sock))) == 1

            def hb_put_stream(a: Any = a, label: str = label) -> None:
                flight.put(c_ours, label + "x16", [a] * STREAM, schema=schema)

            def pa_put_stream(batch: Any = batch, desc: Any = desc) -> None:
                writer, _ = c_plain.do_put(desc, batch.schema)
                for _ in range(STREAM):
                    writer.write_batch(batch)
                writer.close()

            # The Hurray messages of one put, built once: sent by pyarrow alone, they
            # price the format (a second message, app_metadata) against the plain
            # batch, and, to our server, what the put's own Python costs on top.
            arrow_schema, header, end = flight._framing(schema)
            hb_batch, hb_md = flight._batch(hb.asarray(a), 0, arrow_schema, header)
            built = (arrow_schema, hb_batch, pa.py_buffer(hb_md), end, flight._end_buffer(1))

            def prebuilt(client: Any, desc: Any = desc, built: Any = built) -> None:
                schema_, batch_, md_, end_, end_md = built
                writer, _ = client.do_put(desc, schema_)
                writer.write_with_metadata(batch_, md_)
                writer.write_with_metadata(end_, end_md)
                writer.close()

            hb_put()
            pa_put()
            stream_pairs = [] if size > (1 << 20) else [
                (f"put_{label}_stream_of_{STREAM}_vs_pyarrow_do_put", "hb flight.put",
                 hb_put_stream, f"pyarrow do_put ({STREAM} plain batches)", pa_put_stream,
                 "<= 1.11"),
                (f"put_{label}_hurray_messages_vs_plain_batch", "pyarrow do_put (Hurray "
                 "messages, built once)", lambda: prebuilt(c_plain),
                 "pyarrow do_put (plain batch)", pa_put, "informational"),
                (f"put_{label}_vs_its_messages_built_once", "hb flight.put", hb_put,
                 "pyarrow do_put (Hurray messages, built once) to our server",
                 lambda: prebuilt(c_ours), "informational"),
            ]
            pairs = [
                *stream_pairs,
                (f"put_{label}_vs_pyarrow_do_put", "hb flight.put", hb_put,
                 "pyarrow do_put (plain batch)", pa_put, "<= 1.11"),
                (f"put_{label}_vs_pyarrow_do_put_fresh_batch", "hb flight.put", hb_put,
                 "pyarrow do_put (batch built per put)", pa_put_fresh, "informational"),
                (f"get_{label}_vs_pyarrow_do_get", "hb flight.get", hb_get,
                 "pyarrow do_get (plain batch)", pa_get, "<= 1.11"),
                (f"get_{label}_vs_pyarrow_do_get_buffers", "hb flight.get", hb_get,
                 "pyarrow do_get (each batch's buffers reached)", pa_get_buffers,
                 "informational"),
                (f"get_{label}_vs_socket_stream", "hb flight.get", hb_get,
                 "hb StreamReader over a TCP socket", stream_get, "informational"),
            ]
            # A 1 MiB call takes about a millisecond, and one round's ratio moves by
            # tens of percent on a shared machine: take the median of many more.
            n = rounds if size > SIZES[0] else rounds * 5
            for key, na, fa, nb, fb, goal in pairs:
                ta, tb, r = compare(f"{na} {label}", fa, f"{nb} {label}", fb, rounds=n)
                results["timings"] += [ta.as_dict(), tb.as_dict()]
                moved = size * (STREAM if "_stream_of_" in key else 1) / (1 << 20)
                results["ratios"][key] = ratio(
                    r, goal, throughput_vs_peer=round(1 / r, 3),
                    mib_per_s=round(moved / (ta.median_us / 1e6), 1),
                    peer_mib_per_s=round(moved / (tb.median_us / 1e6), 1))
            results["notes"].append(f"{label}: flight.get copied {copies[0]} received "
                                    "tensors for alignment (0 = every one shared the "
                                    "record batch)")
    return results


def steps(n: int = 600) -> dict[str, dict[str, float]]:
    """Where a 1 MiB get's and put's time goes: each step's median µs over ``n`` calls
    of each kind, ours and pyarrow's interleaved call by call, timed between the
    blocking Flight calls (where Python runs on cold caches). pyarrow's steps that have
    no counterpart read 0."""
    import statistics
    import time

    import numpy as np
    import pyarrow as pa
    import pyarrow.flight as fl

    from hurray_bridge.adapters.arrow import flight
    from hurray_bridge.stream import conform

    clock = time.perf_counter_ns
    schema = hb.Descriptor([hb.DYNAMIC], hb.float32)
    a = np.random.default_rng(1).standard_normal((1 << 20) // 4).astype(np.float32)
    batch = pa.record_batch([pa.array(a)], names=["x"])
    desc, ticket = fl.FlightDescriptor.for_path(b"steps"), fl.Ticket(b"steps")
    arrow_schema, header, end = flight._framing(schema)
    get_steps = ["do_get", "schema", "read", "check", "tensor", "read the end"]
    put_steps = ["do_put", "conform", "framing", "write", "write the end", "close"]

    def our_get(c: Any) -> list[int]:
        t = [clock()]
        r = c.do_get(ticket)
        t.append(clock())
        s = flight._stream_schema(r.schema)
        t.append(clock())
        chunk = r.read_chunk()
        t.append(clock())
        msg = flight._check(s, 0, chunk.data, chunk.app_metadata)
        t.append(clock())
        flight._tensor(msg)
        t.append(clock())
        last = r.read_chunk()
        flight._check(s, 1, last.data, last.app_metadata)
        t.append(clock())
        return t

    def plain_get(c: Any) -> list[int]:
        t = [clock()]
        r = c.do_get(ticket)
        t.append(clock())
        _ = r.schema
        t.append(clock())
        chunk = r.read_chunk()
        t.append(clock())
        chunk.data.column(0).buffers()  # what a reader of the bytes pays
        t += [clock(), clock()]
        try:
            r.read_chunk()
        except StopIteration:
            pass
        t.append(clock())
        return t

    def our_put(c: Any) -> list[int]:
        t = [clock()]
        w, _ = c.do_put(desc, arrow_schema)
        t.append(clock())
        x = conform(a, schema)
        t.append(clock())
        b, md = flight._batch(x, 0, arrow_schema, header)
        held = pa.py_buffer(md)
        t.append(clock())
        w.write_with_metadata(b, held)
        t.append(clock())
        w.write_with_metadata(end, flight._end_buffer(1))
        t.append(clock())
        w.close()
        t.append(clock())
        return t

    def plain_put(c: Any) -> list[int]:
        t = [clock()]
        w, _ = c.do_put(desc, batch.schema)
        t += [clock(), clock(), clock()]
        w.write_batch(batch)
        t += [clock(), clock()]
        w.close()
        t.append(clock())
        return t

    out: dict[str, dict[str, float]] = {}
    with _child() as (c_ours, c_plain, _):
        runs = [("put, ours", put_steps, lambda: our_put(c_ours)),
                ("put, pyarrow", put_steps, lambda: plain_put(c_plain)),
                ("get, ours", get_steps, lambda: our_get(c_ours)),
                ("get, pyarrow", get_steps, lambda: plain_get(c_plain))]
        times: dict[str, list[list[int]]] = {name: [] for name, _, _ in runs}
        for _ in range(n):
            for name, _, fn in runs:
                t = fn()
                times[name].append([y - x for x, y in pairwise(t)])
        for name, names, _ in runs:
            cols = list(zip(*times[name]))
            out[name] = {k: statistics.median(c) / 1e3 for k, c in zip(names, cols)}
            out[name]["whole call"] = statistics.median(sum(r) for r in times[name]) / 1e3
    return out


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.flight", description=__doc__)
    p.add_argument("--small", action="store_true", help="1 MiB and 8 MiB, fewer rounds")
    p.add_argument("--steps", type=int, metavar="N", nargs="?", const=600,
                   help="instead, time each step of N (600) 1 MiB gets and puts, ours and "
                        "pyarrow's interleaved")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the child
    args = p.parse_args()
    if args.serve:
        serve()
        return 0
    if args.steps:
        for name, st in steps(args.steps).items():
            print(f"  {name:<13} " + "  ".join(f"{k} {v:.1f}" for k, v in st.items()) + " µs")
        return 0
    res = run(args.small)
    for note in res["notes"]:
        print(f"  note: {note}")
    for t in res["timings"]:
        print(f"  {t['name']:<52} {t['median_us'] / 1e3:10.3f} ms  (IQR {t['iqr_us'] / 1e3:.3f})")
    for k, r in res["ratios"].items():
        print(f"  ratio {k:<40} {r['value']:7.3f}  throughput x{r['throughput_vs_peer']:.3f}"
              f"  ({r['mib_per_s']} vs {r['peer_mib_per_s']} MiB/s)  goal {r['goal']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
