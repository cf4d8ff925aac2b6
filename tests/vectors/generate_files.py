"""Regenerate the golden Hurray file vectors: ``python tests/vectors/generate_files.py``.

Each vector is ``files/NAME.hurray`` (a whole file, exactly as ``hb.save``
writes it) and ``files/NAME.json`` (every field a conforming reader must
report for it, and every buffer's bytes in hex). The tensors are built by
hand — a descriptor plus buffers taken from NumPy allocations — so the vectors
do not depend on any adapter. ``tests/hurray_bridge/test_container.py`` checks both files
byte for byte; a change of the bytes is a change of the file format.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

import hurray_bridge as hb
from hurray_bridge.container import HEADER_SIZE
from hurray_bridge.files.format import parse_header as _parse_header
from hurray_bridge.files.format import parse_index as _parse_index

HERE = pathlib.Path(__file__).parent / "files"
Q = hb.QuantScheme
R = hb.BufferRole


def tensor(d: hb.Descriptor, *raw: bytes) -> hb.Tensor:
    """An hb.Tensor over NumPy allocations holding ``raw`` (one bytes per buffer)."""
    arrays = [np.frombuffer(r, np.uint8).copy() for r in raw]
    bufs = [hb.Buffer(spec.role, a.ctypes.data if a.size else 0, a.size)
            for spec, a in zip(d.buffer_layout(), arrays, strict=True)]
    return hb.Tensor(d, bufs, owner=arrays)


def pattern(n: int, seed: int) -> bytes:
    """``n`` deterministic bytes that differ from vector to vector."""
    return bytes((i * 37 + seed * 11 + 5) & 0xFF for i in range(n))


def pack(codes: Sequence[int], bits: int) -> bytes:
    """LSB-first packing across the whole tensor, trailing bits zero (element-types.md §4.1)."""
    out = bytearray(-(-len(codes) * bits // 8))
    mask = (1 << bits) - 1
    for i, c in enumerate(codes):
        pos = i * bits
        out[pos // 8] |= (c & mask) << (pos % 8)
    return bytes(out)


def every_dtype() -> dict[str, hb.Tensor]:
    """One [2, 3] tensor of every element type, in tag order, plus padded sub-byte forms."""
    out: dict[str, hb.Tensor] = {}
    for dt in hb.dtypes.all_dtypes():
        d = hb.Descriptor([2, 3], dt)
        if dt.name == "bool8":
            raw = bytes([1, 0, 1, 1, 0, 0])
        elif dt.is_subbyte:
            raw = pack([(i * 5 + dt.tag) for i in range(6)], dt.bits)
        else:
            raw = pattern(d.nbytes, dt.tag)
        out[dt.name] = tensor(d, raw)
    for dt in (hb.int4, hb.uint4, hb.int2, hb.uint2, hb.float4_e2m1fn):
        d = hb.Descriptor([2, 3], dt, padded=True)
        out[f"{dt.name}.padded"] = tensor(d, bytes((i * 3 + dt.tag) & ((1 << dt.bits) - 1)
                                                  for i in range(6)))
    return out


def vectors() -> dict[str, tuple[dict[str, hb.Tensor], dict[str, str] | None, dict[str, Any]]]:
    """name -> (tensors, metadata, save options)."""
    f32 = hb.float32
    csr = hb.Descriptor([4, 5], f32, hb.Layout.CSR, sparse=hb.Sparse(0, hb.int32, canonical=True))
    csr_0x5 = hb.Descriptor([0, 5], f32, hb.Layout.CSR,
                            sparse=hb.Sparse(0, hb.int64, canonical=True))
    coo = hb.Descriptor([4, 5], f32, hb.Layout.COO, sparse=hb.Sparse(3, hb.int64, canonical=True))
    per_axis = hb.Descriptor([3, 4], hb.int8, quantization=hb.Quantization(
        Q.PER_AXIS, hb.float32, hb.int8, axis=0))
    per_axis_0 = hb.Descriptor([0, 16], hb.int8, quantization=hb.Quantization(
        Q.PER_AXIS, hb.float32, hb.int8, axis=0))
    per_block = hb.Descriptor([4, 64], hb.int4, quantization=hb.Quantization(
        Q.PER_BLOCK, hb.float8_e8m0fnu, axis=1, block_size=32))
    strided = hb.Descriptor([2, 3], hb.int16, hb.Layout.STRIDED, strides=(-3, 1))
    small = tensor(hb.Descriptor([3], f32), np.array([1, 2, 3], np.float32).tobytes())
    return {
        "shape_0": ({"x": tensor(hb.Descriptor([0], f32), b"")}, None, {}),
        "shape_3_0_5": ({"x": tensor(hb.Descriptor([3, 0, 5], f32), b"")}, None, {}),
        "empty_csr_nnz_0": ({"x": tensor(csr, b"", bytes(20), b"")}, None, {}),
        "empty_csr_0x5": ({"x": tensor(csr_0x5, b"", bytes(8), b"")}, None, {}),
        "empty_int4": ({"x": tensor(hb.Descriptor([2, 0], hb.int4), b"")}, None, {}),
        "rank_0": ({"x": tensor(hb.Descriptor([], hb.float64),
                                np.float64(-1.25).tobytes())}, None, {}),
        "rank_64": ({"x": tensor(hb.Descriptor([1] * 63 + [2], hb.int8), bytes([7, 0xF8]))},
                    None, {}),
        "every_dtype": (every_dtype(), None, {}),
        "per_axis_quant": ({"w": tensor(
            per_axis, pattern(12, 1), np.array([0.5, 0.25, 2.0], np.float32).tobytes(),
            np.array([0, -1, 3], np.int8).tobytes())}, None, {}),
        "per_axis_quant_axis_size_0": ({"w": tensor(per_axis_0, b"", b"", b"")}, None, {}),
        "per_block_int4_e8m0": ({"w": tensor(per_block, pattern(128, 2),
                                             bytes([127, 126, 128, 125, 127, 127, 129, 120]))},
                                None, {}),
        "sparse_coo": ({"x": tensor(
            coo, np.array([1.5, -2.0, 3.25], np.float32).tobytes(),
            np.array([[0, 1, 3], [2, 0, 4]], np.int64).tobytes())}, None, {}),
        "strided_negative": ({"x": tensor(strided, np.arange(6, dtype=np.int16).tobytes())},
                             None, {}),
        "metadata": ({"x": small}, {"format": "hurray", "note": "grüße ✓", "empty": ""}, {}),
        "no_entries": ({}, None, {}),
        "alignment_4096": ({"a": small, "b": tensor(hb.Descriptor([2], hb.int8), b"\x01\x02")},
                           None, {"alignment": 4096}),
        "no_checksums": ({"x": small}, None, {"checksums": False}),
    }


def fields(data: bytes) -> dict[str, object]:
    """What a conforming reader reports for a file, with every buffer's bytes in hex."""
    view = memoryview(data)
    h = _parse_header(view[:HEADER_SIZE], len(data))
    entries, meta = _parse_index(h, view[HEADER_SIZE:h.index_end])
    out_entries = []
    for e in entries:
        d = e.descriptor
        out_entries.append({
            "name": e.name,
            "dtype": d.dtype.name,
            "type_tag": d.dtype.tag,
            "shape": list(d.shape),
            "layout": d.layout.name,
            "descriptor_flags": int(d.flags),
            "descriptor": hb.wire.encode(d, [b.offset for b in e.buffers]).hex(),
            "buffers": [[b.role.name, b.offset, b.length,
                         bytes(view[h.data_offset + b.offset:h.data_offset + b.offset
                                    + b.length]).hex()] for b in e.buffers],
            "checksum": e.checksum,
        })
    return {
        "file_size": h.file_size,
        "version": list(h.version),
        "flags": h.flags,
        "alignment": h.alignment,
        "data_offset": h.data_offset,
        "data_length": h.data_length,
        "metadata": meta,
        "entries": out_entries,
    }


def main() -> None:
    HERE.mkdir(exist_ok=True)
    for name, (tensors, metadata, options) in vectors().items():
        data = hb.dumps(tensors, metadata, **options)
        (HERE / f"{name}.hurray").write_bytes(data)
        (HERE / f"{name}.json").write_text(json.dumps(fields(data), indent=1,
                                                      ensure_ascii=False) + "\n")
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
