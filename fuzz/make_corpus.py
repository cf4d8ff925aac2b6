#!/usr/bin/env python3
"""Write the seed corpus: ``python fuzz/make_corpus.py`` (needs NumPy).

``corpus/descriptor``: the golden descriptor vectors (``tests/vectors/*.bin``)
plus one descriptor of every layout and section. ``corpus/container``: the
golden files (``tests/vectors/files/*.hurray``) plus two small files with
every kind of entry. ``corpus/stream``: streams of each kind the writer makes.
``corpus/capsule``: one forged DLPack capsule of each kind (``fuzz_capsule.seeds``).
Seed names say what they are; files the fuzzer adds (named by their SHA-1)
are kept as they are.
"""

from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import numpy as np

import hurray_bridge as hb
from hurray_bridge import DYNAMIC, Descriptor, Layout, Quantization, QuantScheme, Shard, Sparse

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
from tests.vectors.generate_files import tensor  # noqa: E402

Q = QuantScheme


def descriptors() -> dict[str, Descriptor]:
    return {
        "tiled": Descriptor([5, 7], hb.float16, Layout.TILED, tile=[2, 4]),
        "coo": Descriptor([4, 5, 6], hb.float32, Layout.COO, sparse=Sparse(3, hb.int32, True)),
        "csc": Descriptor([4, 5], hb.float64, Layout.CSC, sparse=Sparse(2, hb.uint16)),
        "csr_dynamic": Descriptor([DYNAMIC, 5], hb.bfloat16, Layout.CSR, sparse=Sparse(2)),
        "per_tensor_zp": Descriptor([3, 4], hb.uint8, quantization=Quantization(
            Q.PER_TENSOR, hb.float32, hb.uint8)),
        "per_axis": Descriptor([3, 4], hb.int4, quantization=Quantization(
            Q.PER_AXIS, hb.float16, hb.int8, axis=0)),
        "shard": Descriptor([2, 3], hb.float32, shard=Shard([4, 6], [2, 3], 1, 2, 3)),
        "padded_int2_strided": Descriptor([3, 2], hb.int2, Layout.STRIDED, strides=[-2, 1],
                                          padded=True),
        "bool_packed": Descriptor([9], hb.bool),
        "dynamic_3d": Descriptor([DYNAMIC, 0, DYNAMIC], hb.complex128),
        "everything": Descriptor([4, 8], hb.float8_e4m3fn, Layout.TILED, tile=[4],
                                 quantization=Quantization(Q.PER_BLOCK, hb.float8_e8m0fnu,
                                                           axis=1, block_size=4),
                                 shard=Shard([8, 8], [4, 0])),
    }


def files() -> dict[str, bytes]:
    coo = Descriptor([4, 5], hb.float32, Layout.COO, sparse=Sparse(2, hb.int32))
    quant = Descriptor([2, 3], hb.int8, quantization=Quantization(
        Q.PER_AXIS, hb.float16, hb.int8, axis=1))
    mixed = {
        "dense": np.arange(12, dtype=np.float32).reshape(3, 4),
        "strided": np.arange(6, dtype=np.int16)[::-2],
        "empty": np.zeros((3, 0, 5), np.float64),
        "coo": tensor(coo, bytes(range(8)), bytes(range(16))),
        "quant": tensor(quant, bytes(range(6)), bytes(range(6)), bytes(range(3))),
        "int4": tensor(Descriptor([5], hb.int4), b"\x21\x43\x05"),
    }
    return {
        "mixed": hb.dumps(mixed, {"format": "test", "ü": "v"}),
        "mixed_no_checksums": hb.dumps(mixed, checksums=False),
        "two_scalars": hb.dumps({"a": np.float64(1.5), "b": np.int8(-3)}),
    }


def streams() -> dict[str, bytes]:
    def write(schema: Descriptor, items: list) -> bytes:
        f = io.BytesIO()
        with hb.StreamWriter(f, schema) as w:
            for x in items:
                w.write(x)
        return f.getvalue()

    rng = np.random.default_rng(0)
    pq = Quantization(Q.PER_AXIS, "float32", "int8", axis=1)
    qschema = Descriptor([DYNAMIC, 3], hb.int8, quantization=pq)
    csr = Descriptor([DYNAMIC, 4], hb.float32, Layout.CSR, sparse=Sparse(2, "int32"))
    return {
        "dynamic_batch": write(Descriptor([DYNAMIC, 3], hb.float32),
                               [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 0, 1)]),
        "empty_stream": write(Descriptor([DYNAMIC], hb.int64), []),
        "static_scalar": write(Descriptor([], hb.float64), [np.float64(2.0), np.float64(-1.0)]),
        "two_dynamic": write(Descriptor([DYNAMIC, 2, DYNAMIC], hb.uint8),
                             [np.arange(n * 2 * m, dtype=np.uint8).reshape(n, 2, m)
                              for n, m in ((1, 3), (2, 0), (3, 1))]),
        "int4_packed": write(Descriptor([DYNAMIC], hb.int4),
                             [tensor(Descriptor([n], hb.int4), bytes(range(-(-n // 2))))
                              for n in (3, 0, 4)]),
        "quantized": write(qschema, [tensor(qschema.resolve([n]), bytes(range(3 * n)),
                                            np.array([0.5, 1, 2], np.float32).tobytes(),
                                            bytes([1, 0, 255])) for n in (2, 0)]),
        "csr": write(csr, [tensor(csr.resolve([2]), np.array([1, 2], np.float32).tobytes(),
                                  np.array([0, 1, 2], np.int32).tobytes(),
                                  np.array([3, 0], np.int32).tobytes())]),
    }


def capsules() -> dict[str, bytes]:
    sys.path.insert(0, str(HERE))
    import fuzz_capsule

    from hurray_bridge.dtypes import all_dtypes

    return fuzz_capsule.seeds(sorted({d.dlpack for d in all_dtypes() if d.dlpack is not None}))


def main() -> None:
    corpus = HERE / "corpus"
    seeds = {
        "descriptor": {p.stem: p.read_bytes() for p in (ROOT / "tests/vectors").glob("*.bin")}
        | {k: d.to_bytes() for k, d in descriptors().items()},
        "container": {p.stem: p.read_bytes()
                      for p in (ROOT / "tests/vectors/files").glob("*.hurray")} | files(),
        "stream": streams(),
        "capsule": capsules(),
    }
    for target, items in seeds.items():
        d = corpus / target
        d.mkdir(parents=True, exist_ok=True)
        for name, data in sorted(items.items()):
            (d / f"seed-{name}").write_bytes(data)
        print(f"{target}: {len(items)} seeds in {d.relative_to(ROOT)}")
    shutil.rmtree(HERE / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
