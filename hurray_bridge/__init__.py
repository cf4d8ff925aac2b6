"""hurray_bridge: zero-copy tensor interchange through Hurray descriptors.

Importing this package loads the standard library only; frameworks are
imported by their adapters, and only when a conversion needs them.
"""

from __future__ import annotations

from . import (
    _source_tree,  # noqa: F401  (first: lets a source checkout find adapters/)
    checkpoint_dir,  # noqa: F401  (hb.load of a folder or an index reads through it)
    dtypes,
    quant,
    shards,
    shm,
    sparse,
    stream,
)
from ._exchange import front as _import_front
from ._registry import get_adapter
from .container import dumps, load, loads, save
from .conversion import asarray as _asarray
from .conversion import convert
from .descriptor import DYNAMIC, MAX_RANK, BufferSpec, Descriptor, Quantization, Shard, Sparse
from .dtypes import (
    DType,
    bfloat16,
    bool8,
    complex64,
    complex128,
    float4_e2m1fn,
    float8_e4m3fn,
    float8_e4m3fnuz,
    float8_e5m2,
    float8_e5m2fnuz,
    float8_e8m0fnu,
    float16,
    float32,
    float64,
    int2,
    int4,
    int8,
    int16,
    int32,
    int64,
    uint2,
    uint4,
    uint8,
    uint16,
    uint32,
    uint64,
)
from .dtypes import bool_ as bool
from .errors import (
    BackendNotAvailableError,
    ClosedFileError,
    CopyRequiredError,
    CopyWarning,
    DynamicShapeError,
    FormatError,
    HurrayError,
    NotFoundError,
    TransportError,
    UnsupportedError,
)
from .layout import BufferRole, Flags, Layout, QuantScheme
from .quant import dequantize, pack_subbyte, quantize, unpack_subbyte
from .shards import Box, ShardedTensor, assemble, grid_boxes, split
from .sparse import densify
from .stream import StreamReader, StreamWriter
from .tensor import CPU, Buffer, Device, Tensor, from_dlpack

# hb.asarray: the tensors of a type an adapter registered with the compiled import
# (torch's) are read in C, everything else by conversion.asarray (see _exchange.py).
asarray = _import_front(_asarray, positional_copy=True, name="asarray")

__version__ = "0.1.0"

__all__ = [
    "DYNAMIC",
    "MAX_RANK",
    "CPU",
    "BackendNotAvailableError",
    "ClosedFileError",
    "Buffer",
    "BufferRole",
    "BufferSpec",
    "CopyRequiredError",
    "CopyWarning",
    "DType",
    "Device",
    "Descriptor",
    "DynamicShapeError",
    "Flags",
    "FormatError",
    "HurrayError",
    "Layout",
    "NotFoundError",
    "QuantScheme",
    "Quantization",
    "Shard",
    "Sparse",
    "Tensor",
    "TransportError",
    "UnsupportedError",
    "asarray",
    "bfloat16",
    "bool",
    "bool8",
    "complex64",
    "complex128",
    "convert",
    "dtypes",
    "dumps",
    "float4_e2m1fn",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float16",
    "float32",
    "float64",
    "from_dlpack",
    "get_adapter",
    "int2",
    "int4",
    "int8",
    "int16",
    "int32",
    "int64",
    "load",
    "loads",
    "save",
    "uint2",
    "uint4",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    # sharding, streams, shared memory (issue 7)
    "Box",
    "ShardedTensor",
    "StreamReader",
    "StreamWriter",
    "assemble",
    "grid_boxes",
    "shards",
    "shm",
    "split",
    "stream",
    # sparse layouts, quantization, sub-byte packing (issue 5)
    "densify",
    "dequantize",
    "pack_subbyte",
    "quant",
    "quantize",
    "sparse",
    "unpack_subbyte",
]


def __dir__() -> list[str]:
    return __all__
