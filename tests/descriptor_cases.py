"""One table of descriptor cases, each accepted or refused with a named field.

tests/cross/test_descriptor_rules.py runs every case through the Python constructor, the
Python decoder (general and dense fast path), the compiled decoder and the C library, and
holds them to the same answer. A case is given by its field values as they stand on the
wire (``Case.wire``), so one entry yields both constructor arguments and bytes; a case that
breaks the bytes themselves (a reserved byte, a truncation) carries a ``patch`` instead, and
one that no encoding can express (strides for a row-major layout) has ``on_wire=False``.

Each rule of ``hurray_bridge.descriptor.RULES`` (the descriptor's and its sections') has at
least one refusing case naming it; the decoder's structural checks, which are no rule of
values, are refused by field alone (``rule=None``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hurray_bridge as hb
from hurray_bridge.dtypes import dtype_from_name

__all__ = ["CASES", "Case", "Wire"]

U64 = 2**64 - 1
DYN = hb.DYNAMIC
_ROW, _STRIDED, _TILED = int(hb.Layout.ROW_MAJOR), int(hb.Layout.STRIDED), int(hb.Layout.TILED)
_COO, _CSR, _CSC = int(hb.Layout.COO), int(hb.Layout.CSR), int(hb.Layout.CSC)
_TENSOR, _AXIS, _BLOCK = (int(hb.QuantScheme.PER_TENSOR), int(hb.QuantScheme.PER_AXIS),
                          int(hb.QuantScheme.PER_BLOCK))


def _tag(name: str) -> int:
    return dtype_from_name(name).tag


@dataclass(frozen=True)
class Wire:
    """A descriptor's fields as the encoding holds them (tags and integers, unchecked).

    ``sparse``: (nnz, index type name, canonical); ``quant``: (scheme, scale type name,
    zero-point type name or None, axis, block size) as written, -1 and 0 for "none";
    ``shard``: (replica, device type, device id, offsets, global shape).
    """

    shape: tuple[int, ...]
    dtype: str
    layout: int = _ROW
    strides: tuple[int, ...] | None = None
    tile: tuple[int, ...] | None = None
    sparse: tuple[int, str, bool] | None = None
    quant: tuple[int, str, str | None, int | None, int] | None = None
    shard: tuple[int, int, int, tuple[int, ...], tuple[int, ...]] | None = None
    padded: bool = False

    def build(self, **overrides: Any) -> hb.Descriptor:
        """Descriptor(...) of these values (``overrides`` replace arguments by name): the
        sections' constructors first, as the decoder calls them."""
        sparse = quant = shard = None
        if self.sparse is not None:
            nnz, itype, canonical = self.sparse
            sparse = hb.Sparse(nnz, dtype_from_name(itype), canonical)
        if self.quant is not None:
            scheme, scale, zp, axis, block = self.quant
            s = hb.QuantScheme(scheme)
            quant = hb.Quantization(
                s, dtype_from_name(scale), None if zp is None else dtype_from_name(zp),
                None if axis == -1 and s == hb.QuantScheme.PER_TENSOR else axis,
                block if s == hb.QuantScheme.PER_BLOCK else (None if block == 0 else block))
        if self.shard is not None:
            replica, dev_type, dev_id, offsets, global_shape = self.shard
            shard = hb.Shard(global_shape, offsets, replica, dev_type, dev_id)
        args = {"shape": self.shape, "dtype": dtype_from_name(self.dtype),
                "layout": hb.Layout(self.layout), "strides": self.strides, "tile": self.tile,
                "sparse": sparse, "quantization": quant, "shard": shard, "padded": self.padded}
        return hb.Descriptor(**{**args, **overrides})

    def encode(self, buffers: list[tuple[int, int, int]] | None = None) -> bytes:
        """The bytes, written without a check; ``buffers`` (role, offset, length) default
        to the table Python computes when the values are valid, else to none."""
        if buffers is None:
            try:
                d = self.build()
            except hb.FormatError:
                buffers = []
            else:
                specs = () if d.is_dynamic else d.buffer_layout()
                offs = hb.wire.canonical_offsets([s.nbytes for s in specs])
                buffers = [(int(s.role), o, s.nbytes) for s, o in zip(specs, offs, strict=True)]
        rank = len(self.shape)
        body = [struct.pack(f"<{rank}Q", *self.shape)]
        if self.strides is not None:
            body.append(struct.pack(f"<{rank}q", *self.strides))
        if self.tile is not None:
            body.append(struct.pack(f"<II{len(self.tile)}Q", len(self.tile), 0, *self.tile))
        if self.sparse is not None:
            nnz, itype, canonical = self.sparse
            body.append(struct.pack("<QBB6x", nnz, _tag(itype), int(canonical)))
        flags = 4 if self.padded else 0
        if self.quant is not None:
            scheme, scale, zp, axis, block = self.quant
            body.append(struct.pack("<BBBBiQ", scheme, _tag(scale), 0 if zp is None else _tag(zp),
                                    0, axis, block))
            flags |= 1
        if self.shard is not None:
            replica, dev_type, dev_id, offsets, global_shape = self.shard
            body.append(struct.pack(f"<IIii{rank}Q{rank}Q", replica, 0, dev_type, dev_id,
                                    *offsets, *global_shape))
            flags |= 2
        body += [struct.pack("<B7xQQ", *b) for b in buffers]
        total = 32 + sum(len(b) for b in body)
        return struct.pack("<4sBBHIBBHQQ", b"HRYD", 1, 0, flags, rank, _tag(self.dtype),
                           self.layout, len(buffers), total, 0) + b"".join(body)


@dataclass(frozen=True)
class Case:
    """One case: its name, the values, the field every implementation refuses it with (None:
    all accept it) and, for a rule of RULES, that rule's name."""

    name: str
    wire: Wire
    field: str | None
    rule: str | None = None
    patch: Callable[[bytes], bytes] | None = None
    on_wire: bool = True
    kwargs: dict[str, Any] = field(default_factory=dict)

    def raw(self) -> bytes:
        raw = self.wire.encode()
        return raw if self.patch is None else self.patch(raw)


def _put(offset: int, fmt: str, value: int) -> Callable[[bytes], bytes]:
    def patch(raw: bytes) -> bytes:
        out = bytearray(raw)
        at = offset if offset >= 0 else len(raw) + offset
        struct.pack_into(fmt, out, at, value)
        return bytes(out)
    return patch


def _cut(n: int) -> Callable[[bytes], bytes]:
    return lambda raw: raw[:n]


_F32 = Wire((2, 3), "float32")
_F32X4 = Wire((4, 4), "float32")  # 64 bytes: an offset of 2**64 - 64 ends past 2**64 - 1
_I8Q = Wire((4, 64), "int8", quant=(_BLOCK, "float32", None, 1, 32))
_SHARD = Wire((2,), "float32", shard=(0, 1, 0, (2,), (4,)))
_TILE = Wire((4, 4), "float32", _TILED, tile=(2, 2))
_COO2 = Wire((4, 4), "float32", _COO, sparse=(3, "int64", False))

CASES: tuple[Case, ...] = (
    # --- accepted: every layout and section, empty, scalar, dynamic, rank 64 --------------
    Case("dense", _F32, None),
    Case("scalar", Wire((), "float64"), None),
    Case("empty", Wire((0, 5), "bfloat16"), None),
    Case("rank 64", Wire((1,) * 64, "uint8"), None),
    Case("dynamic", Wire((DYN, 128), "float16"), None),
    Case("strided negative", Wire((3, 2), "int32", _STRIDED, strides=(-2, 1)), None),
    Case("strided zero", Wire((3, 2), "int32", _STRIDED, strides=(0, 0)), None),
    Case("packed int4", Wire((5,), "int4"), None),
    Case("padded int4 strided", Wire((5,), "int4", _STRIDED, strides=(2,), padded=True), None),
    Case("tiled", _TILE, None),
    Case("coo", _COO2, None),
    Case("csr", Wire((3, 4), "float32", _CSR, sparse=(2, "int32", True)), None),
    Case("csc", Wire((3, 4), "float32", _CSC, sparse=(0, "uint8", False)), None),
    Case("per-block", _I8Q, None),
    Case("per-tensor zp", Wire((4,), "uint8", quant=(_TENSOR, "float16", "uint8", -1, 0)), None),
    Case("shard", _SHARD, None),
    Case("index type just wide enough", Wire((2, 2), "float32", _CSR, sparse=(127, "int8", False)),
         None),
    Case("large stride", Wire((2,), "uint8", _STRIDED, strides=(-(2**62),)), None),
    Case("largest stride", Wire((1,), "uint8", _STRIDED, strides=(-(2**63 - 1),)), None),
    # --- descriptor.RULES, each refused ----------------------------------------------------
    Case("padded float32", Wire((4,), "float32", padded=True), "flags", "padded-needs-subbyte"),
    Case("strided scalar", Wire((), "float32", _STRIDED, strides=()), "layout",
         "scalar-is-row-major"),
    Case("coo scalar", Wire((), "float32", _COO, sparse=(0, "int64", False)), "layout",
         "scalar-is-row-major"),
    Case("strided without strides", Wire((2,), "float32", _STRIDED), "strides",
         "strided-needs-strides", on_wire=False),
    Case("strides when row-major", Wire((2,), "float32", strides=(1,)), "strides",
         "strides-only-when-strided", on_wire=False),
    Case("strides of another rank", Wire((2,), "float32", _STRIDED, strides=(1, 1)), "strides",
         "one-stride-per-dimension", on_wire=False),
    Case("strided dynamic", Wire((DYN, 2), "float32", _STRIDED, strides=(2, 1)), "strides",
         "strided-needs-static-shape"),
    Case("stride -2**63", Wire((2, 2), "float32", _STRIDED, strides=(-(2**63), 1)), "strides",
         "stride-range"),
    Case("packed strided", Wire((4,), "int4", _STRIDED, strides=(1,)), "strides",
         "packed-is-not-strided"),
    Case("zero tile", Wire((4, 4), "float32", _TILED, tile=(0,)), "tile", "tile-sizes"),
    Case("no tile", Wire((4, 4), "float32", _TILED, tile=()), "tile", "tile-sizes"),
    Case("dynamic tile", Wire((4, 4), "float32", _TILED, tile=(DYN, 2)), "tile", "tile-sizes"),
    Case("tile when row-major", Wire((4,), "float32", tile=(2,)), "tile",
         "tile-only-when-tiled", on_wire=False),
    Case("coo without section", Wire((4,), "float32", _COO), "sparse", "sparse-needs-section",
         on_wire=False),
    Case("section when dense", Wire((4,), "float32", sparse=(1, "int64", False)), "sparse",
         "section-only-when-sparse", on_wire=False),
    Case("csr of rank 1", Wire((4,), "float32", _CSR, sparse=(1, "int64", False)), "layout",
         "compressed-is-rank-2"),
    Case("entries in an empty shape", Wire((0, 3), "float32", _COO, sparse=(1, "int64", False)),
         "sparse.nnz", "empty-shape-stores-nothing"),
    Case("canonical nnz > cells", Wire((2, 2), "float32", _COO, sparse=(5, "int64", True)),
         "sparse.nnz", "canonical-nnz-fits"),
    Case("int8 indptr to 200", Wire((2, 2), "float32", _CSR, sparse=(200, "int8", False)),
         "sparse.index_dtype", "index-type-holds-indices"),
    Case("uint8 index of 300 columns", Wire((2, 300), "float32", _COO, sparse=(1, "uint8", False)),
         "sparse.index_dtype", "index-type-holds-indices"),
    Case("quantization not a section", _F32, "quantization", "quantization-is-section",
         on_wire=False, kwargs={"quantization": "per-tensor"}),
    Case("quantized float32", Wire((4,), "float32", quant=(_TENSOR, "float32", None, -1, 0)),
         "quantization", "quantized-storage-type"),
    Case("quantized e8m0", Wire((4,), "float8_e8m0fnu", quant=(_TENSOR, "float32", None, -1, 0)),
         "quantization", "quantized-storage-type"),
    Case("axis past the rank", Wire((4,), "int8", quant=(_AXIS, "float32", None, 3, 0)),
         "quantization.axis", "quantization-axis-in-rank"),
    Case("axis -1 per-axis", Wire((4,), "int8", quant=(_AXIS, "float32", None, -1, 0)),
         "quantization.axis", "quantization-axis-in-rank"),
    Case("dynamic axis", Wire((DYN,), "int8", quant=(_AXIS, "float32", None, 0, 0)),
         "quantization.axis", "quantization-axis-static"),
    Case("shard not a section", _F32, "shard", "shard-is-section", on_wire=False,
         kwargs={"shard": (0, 0)}),
    Case("dynamic shard", Wire((DYN,), "float32", shard=(0, 1, 0, (0,), (4,))), "shape",
         "shard-shape-static"),
    Case("shard box of another rank", Wire((2,), "float32"), "shard", "shard-box-rank",
         on_wire=False, kwargs={"shard": hb.Shard((4, 4), (0, 0))}),
    Case("shard box outside", Wire((2,), "float32", shard=(0, 1, 0, (3,), (4,))), "shard.offsets",
         "shard-box-inside"),
    Case("2**64 elements", Wire((2**32, 2**32), "uint8"), "shape", "element-count-fits"),
    Case("strided span past int64", Wire((2, 2), "uint8", _STRIDED, strides=(2**62, 2**62)),
         "strides", "strided-span-fits"),
    Case("2**65 bytes", Wire((2**62,), "float64"), "shape", "bytes-fit"),
    Case("scales past 2**64 bytes", Wire((2**60, 2**3), "int8",
                                         quant=(_AXIS, "float64", "float64", 0, 0)),
         "shape", "bytes-fit"),
    # --- the sections' rules (Sparse, Quantization, Shard), each refused ------------------
    Case("nnz 2**64 - 1", Wire((4,), "float32", _COO, sparse=(U64, "int64", False)),
         "sparse.nnz", "nnz-is-a-count"),
    Case("float index type", Wire((4,), "float32", _COO, sparse=(1, "float32", False)),
         "sparse.index_dtype", "integer-index-type"),
    Case("int8 scale", Wire((4,), "int8", quant=(_TENSOR, "int8", None, -1, 0)),
         "quantization.scale_dtype", "float-scale-type"),
    Case("bool zero point", Wire((4,), "int8", quant=(_TENSOR, "float32", "bool8", -1, 0)),
         "quantization.zero_point_dtype", "numeric-zero-point-type"),
    Case("per-tensor with an axis", Wire((4,), "int8", quant=(_TENSOR, "float32", None, 0, 0)),
         "quantization.axis", "per-tensor-has-no-axis"),
    Case("per-axis without an axis", Wire((4,), "int8", quant=(_AXIS, "float32", None, None, 0)),
         "quantization.axis", "axis-given", on_wire=False),
    Case("block size 0", Wire((4,), "int8", quant=(_BLOCK, "float32", None, 0, 0)),
         "quantization.block_size", "block-size-given"),
    Case("per-axis block size", Wire((4,), "int8", quant=(_AXIS, "float32", None, 0, 5)),
         "quantization.block_size", "block-size-only-per-block"),
    Case("dynamic global shape", Wire((2,), "float32", shard=(0, 1, 0, (0,), (DYN,))),
         "shard.global_shape", "shard-static"),
    Case("negative replica", Wire((2,), "float32", shard=(-1, 1, 0, (0,), (4,))),
         "shard.replica_id", "shard-replica-id-range", on_wire=False),
    Case("negative device type", Wire((2,), "float32", shard=(0, -1, 0, (0,), (4,))),
         "shard.device_type", "shard-device-type-range"),
    Case("negative device id", Wire((2,), "float32", shard=(0, 1, -3, (0,), (4,))),
         "shard.device_id", "shard-device-id-range"),
    # --- the decoder's structure (bytes only) ----------------------------------------------
    Case("bad magic", _F32, "magic", patch=_put(0, "<B", ord("X"))),
    Case("major version 2", _F32, "version", patch=_put(4, "<B", 2)),
    Case("header reserved", _F32, "header.reserved", patch=_put(24, "<Q", 1)),
    Case("unknown flag", _F32, "flags", patch=_put(6, "<H", 8)),
    Case("rank 65", _F32, "rank", patch=_put(8, "<I", 65)),
    Case("9 buffers", _F32, "n_buffers", patch=_put(14, "<H", 9)),
    Case("declares more than there is", _F32, "total_size", patch=_put(16, "<Q", 10**6)),
    Case("declares less than a header", _F32, "total_size", patch=_put(16, "<Q", 8)),
    Case("sections longer than declared", _F32, "total_size", patch=lambda r: r + bytes(8)),
    Case("short header", _F32, "header", patch=_cut(31)),
    Case("unknown type tag", _F32, "type_tag", patch=_put(12, "<B", 255)),
    Case("unknown layout", _F32, "layout", patch=_put(13, "<B", 9)),
    Case("tile reserved", _TILE, "tile.reserved", patch=_put(32 + 16 + 4, "<I", 1)),
    Case("more tiles than dims", _TILE, "tile", patch=_put(32 + 16, "<I", 3)),
    Case("sparse reserved", _COO2, "sparse.reserved", patch=_put(32 + 16 + 10, "<B", 1)),
    Case("unknown sparse flag", _COO2, "sparse.reserved", patch=_put(32 + 16 + 9, "<B", 2)),
    Case("unknown index type", _COO2, "sparse.index_type", patch=_put(32 + 16 + 8, "<B", 255)),
    Case("quantization reserved", _I8Q, "quantization.reserved", patch=_put(32 + 16 + 3, "<B", 1)),
    Case("unknown scheme", _I8Q, "quantization.scheme", patch=_put(32 + 16, "<B", 9)),
    Case("unknown scale type", _I8Q, "quantization.scale_type", patch=_put(32 + 16 + 1, "<B", 255)),
    Case("shard reserved", _SHARD, "shard.reserved", patch=_put(32 + 8 + 4, "<I", 1)),
    Case("entry reserved", _F32, "buffers[0].reserved", patch=_put(-23, "<B", 1)),
    Case("unknown role", _F32, "buffers[0].role", patch=_put(-24, "<B", 99)),
    Case("wrong role", _F32, "buffers[0].role", patch=_put(-24, "<B", int(hb.BufferRole.VALUES))),
    Case("wrong length", _F32, "buffers[0].length", patch=_put(-8, "<Q", 4)),
    Case("unaligned offset", _F32, "buffers[0].offset", patch=_put(-16, "<Q", 8)),
    Case("offset past 2**64", _F32X4, "buffers[0].offset", patch=_put(-16, "<Q", 2**64 - 64)),
    Case("overlap", _COO2, "buffers[1].offset", patch=_put(-16, "<Q", 0)),
    Case("dynamic with a buffer", Wire((DYN,), "float32"), "n_buffers",
         patch=lambda r: Wire((DYN,), "float32").encode([(1, 0, 0)])),
    Case("a buffer missing", _F32, "n_buffers", patch=lambda r: _F32.encode([])),
    Case("truncated shape", _F32, "shape", patch=lambda r: _put(16, "<Q", 40)(r[:40])),
    Case("truncated entry", _F32, "buffers[0]", patch=lambda r: _put(16, "<Q", 60)(r[:60])),
)
