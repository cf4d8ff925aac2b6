#!/usr/bin/env python3
"""Fuzz target: the Hurray file reader (``hb.loads``, ``read_index``, ``verify``, ``hb.load``).

Each input is a whole file. It is read twice: as it is (where the header and
index checksums stop almost every mutation early), and "resealed" -- with
both checksums recomputed over the mutated bytes, what a hostile writer would
do -- so that the structural checks behind the checksums get fuzzed too.

For each of the two, ``hb.loads`` must either raise ``hb.FormatError`` or
return tensors whose every buffer lies inside the input and can be read;
``loads(copy=True)`` must then give the same bytes; ``loads(verify=True)``
must agree with ``verify(path)``; and the path readers (``read_index``,
``verify``, ``load`` with and without mmap) must accept exactly what
``loads`` accepts, leaving no file descriptor or map open. The path readers
run on every input that parses and on one in eight of those that do not.

    python fuzz/fuzz_container.py fuzz/corpus/container -max_total_time=300 -max_len=16384
"""

from __future__ import annotations

import gc
import os
import struct
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness

NAME = "container"
_TMPDIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def reseal(data: bytes) -> bytes:
    """Recompute the index and header CRCs over whatever the header now declares."""
    if len(data) < 128:
        return data
    buf = bytearray(data)
    t_len, m_len = struct.unpack_from("<Q", buf, 24)[0], struct.unpack_from("<Q", buf, 40)[0]
    end = min(len(buf), 128 + min(t_len, len(buf)) + min(m_len, len(buf)))
    struct.pack_into("<I", buf, 76, zlib.crc32(buf[128:end]))
    struct.pack_into("<I", buf, 124, zlib.crc32(buf[:124]))
    return bytes(buf)


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def load_check() -> _harness.Check:
    import hurray_bridge as hb
    from hurray_bridge import container

    FormatError = hb.FormatError
    fd, path = tempfile.mkstemp(prefix="hb-fuzz-", suffix=".hurray", dir=_TMPDIR)
    os.close(fd)
    import atexit

    atexit.register(lambda: os.path.exists(path) and os.unlink(path))

    def outcome(fn: Any) -> Any:
        try:
            return fn()
        except FormatError:
            return FormatError

    def one(raw: bytes, always_paths: bool) -> None:
        # A bytearray is shared (a bytes object would be copied): the tensors must then
        # point inside the input, which _check_file checks.
        shared = bytearray(raw)
        tf = outcome(lambda: hb.loads(shared))
        if tf is not FormatError:
            _check_file(hb, raw, tf)
            copied = hb.loads(raw, copy=True)
            for name, t in tf.items():
                c = copied[name]
                if c.descriptor != t.descriptor or [_bytes(c, b.role) for b in c.buffers] != [
                        _bytes(t, b.role) for b in t.buffers]:
                    raise _harness.Finding(f"loads(copy=True) differs for {name!r}")
            copied = c = None
        if tf is FormatError and not always_paths:
            return
        verified = outcome(lambda: hb.loads(raw, verify=True))
        with open(path, "wb") as f:
            f.write(raw)
        fds = _fds()
        index = outcome(lambda: container.read_index(path))
        ver = outcome(lambda: container.verify(path))
        loaded = outcome(lambda: hb.load(path))
        unmapped = outcome(lambda: hb.load(path, mmap=False))
        if (index is FormatError) != (tf is FormatError):
            raise _harness.Finding(f"read_index and loads disagree: {index} / {type(tf)}")
        if (loaded is FormatError) != (tf is FormatError) or (
                (unmapped is FormatError) != (tf is FormatError)):
            raise _harness.Finding("load(path) and loads disagree")
        if (ver is FormatError) != (verified is FormatError):
            raise _harness.Finding("verify(path) and loads(verify=True) disagree")
        if tf is not FormatError:
            if list(index.metadata.items()) != list(tf.metadata.items()) or [
                    e.name for e in index.entries] != list(tf):
                raise _harness.Finding("read_index and loads disagree on the contents")
            for name, t in tf.items():
                for other in (loaded, unmapped):
                    u = other[name]
                    if u.descriptor != t.descriptor or [
                            _bytes(u, b.role) for b in u.buffers] != [
                            _bytes(t, b.role) for b in t.buffers]:
                        raise _harness.Finding(f"load(path) differs from loads for {name!r}")
        tf = loaded = unmapped = verified = index = ver = t = u = other = None
        if _fds() > fds:
            gc.collect()  # the map closes when its last tensor dies; a cycle may hold one
            if _fds() > fds:
                raise _harness.Finding(f"file descriptors leaked: {fds} -> {_fds()}")

    def check(data: bytes) -> None:
        sample = zlib.crc32(data) % 8 == 0
        one(data, sample)
        sealed = reseal(data)
        if sealed != data:
            one(sealed, sample)

    return check


def _bytes(t: Any, role: Any) -> bytes:
    return bytes(t.memoryview(role))


def _check_file(hb: Any, raw: bytes, tf: Any) -> None:
    """Every tensor of a loaded file is usable and points inside the input."""
    if not isinstance(tf, dict) or not isinstance(tf.metadata, dict):
        raise _harness.Finding(f"loads returned {type(tf)}")
    for name, t in tf.items():
        d = t.descriptor
        hash(d)
        repr(t)
        if d.is_dynamic:
            raise _harness.Finding(f"{name!r}: a loaded tensor has dynamic dimensions")
        specs = d.buffer_layout()
        if [(s.role, s.nbytes) for s in specs] != [(b.role, b.nbytes) for b in t.buffers]:
            raise _harness.Finding(f"{name!r}: buffers do not match the descriptor")
        owner = t.owner
        for b in t.buffers:
            if not b.nbytes:
                if b.ptr:
                    raise _harness.Finding(f"{name!r}: an empty buffer has a pointer")
                continue
            lo = owner.address
            if not lo <= b.ptr or b.ptr + b.nbytes > lo + len(raw):
                raise _harness.Finding(f"{name!r}: {b} lies outside the input")
            if bytes(t.memoryview(b.role)) != raw[b.ptr - lo:b.ptr - lo + b.nbytes]:
                raise _harness.Finding(f"{name!r}: buffer bytes differ from the input")
        if t.is_dense and d.dtype.dlpack is not None and not (d.padded and d.dtype.is_subbyte):
            # A dense tensor goes on to a consumer: our own DLPack export must accept it.
            # An empty tensor may have a dimension above 2**63 - 1, or compact strides
            # above it ([0, 2**40, 2**40]), both valid in a file: DLPack's int64 shape and
            # strides cannot say them, and the export refuses, as documented.
            from hurray_bridge import _capsule

            try:
                capsule = t.__dlpack__(max_version=(1, 0))
            except hb.UnsupportedError:
                from hurray_bridge.descriptor import compact_strides

                # the strides the export computes (a 0 counts as 1), as Python integers
                strides = compact_strides(d.shape) if d.strides is None else d.strides
                if max(d.shape) <= 2**63 - 1 and max(map(abs, strides), default=0) <= 2**63 - 1:
                    raise
            else:
                _capsule.consume_capsule(capsule).owner.release()


if __name__ == "__main__":
    _harness.main(NAME, load_check, prepare=reseal)
