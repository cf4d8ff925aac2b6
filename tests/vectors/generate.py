"""Regenerate the golden descriptor vectors: ``python tests/vectors/generate.py``.

Each vector is ``NAME.bin`` (the encoded descriptor) and ``NAME.json`` (the
fields a conforming decoder must report). The test suite checks both
byte-for-byte, so a change to the wire format shows up as a diff here.
"""

from __future__ import annotations

import json
import pathlib

import hurray_bridge as hb
from hurray_bridge.wire import decode_prefix

HERE = pathlib.Path(__file__).parent


def vectors() -> dict[str, hb.Descriptor]:
    return {
        "shape_0": hb.Descriptor([0], hb.float32),
        "shape_3_0_5": hb.Descriptor([3, 0, 5], hb.float32),
        "rank_0": hb.Descriptor([], hb.float64),
        "rank_64": hb.Descriptor([1] * 63 + [2], hb.int8),
        "dynamic_batch": hb.Descriptor([hb.DYNAMIC, 128], hb.bfloat16),
        "per_axis_quant_axis_size_0": hb.Descriptor(
            [0, 16], hb.int8,
            quantization=hb.Quantization(hb.QuantScheme.PER_AXIS, hb.float32, hb.int8, axis=0),
        ),
        "empty_csr_nnz_0": hb.Descriptor(
            [4, 5], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(0, hb.int32, canonical=True)
        ),
        "empty_csr_0x5": hb.Descriptor(
            [0, 5], hb.float32, hb.Layout.CSR, sparse=hb.Sparse(0, hb.int64, canonical=True)
        ),
        "empty_int4": hb.Descriptor([2, 0], hb.int4),
        "strided_negative": hb.Descriptor([2, 3], hb.int16, hb.Layout.STRIDED, strides=(-3, 1)),
        "per_block_int4_e8m0": hb.Descriptor(
            [4, 64], hb.int4,
            quantization=hb.Quantization(hb.QuantScheme.PER_BLOCK, hb.float8_e8m0fnu, axis=1,
                                         block_size=32),
        ),
        "shard_box": hb.Descriptor(
            [2, 3], hb.float16, shard=hb.Shard([4, 3], [2, 0], replica_id=1, device_type=2)
        ),
    }


def fields(data: bytes) -> dict[str, object]:
    d, table, size = decode_prefix(data)
    return {
        "rank": d.rank,
        "shape": list(d.shape),
        "dtype": d.dtype.name,
        "type_tag": d.dtype.tag,
        "layout": d.layout.name,
        "flags": int(d.flags),
        "dynamic": d.is_dynamic,
        "empty": d.is_empty,
        "element_count": None if d.is_dynamic else d.element_count,
        "nbytes": None if d.is_dynamic else d.nbytes,
        "buffers": [[e.role.name, e.offset, e.length] for e in table],
        "size": size,
    }


def main() -> None:
    for name, d in vectors().items():
        data = d.to_bytes()
        (HERE / f"{name}.bin").write_bytes(data)
        (HERE / f"{name}.json").write_text(json.dumps(fields(data), indent=1) + "\n")
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()
