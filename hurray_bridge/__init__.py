"""hurray_bridge: zero-copy tensor interchange through Hurray descriptors.

Importing this package loads the standard library only; frameworks are
imported by their adapters, and only when a conversion needs them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import _source_tree  # noqa: F401  (first: lets a source checkout find adapters/)
from . import wire as _wire  # noqa: F401  (installs Descriptor.to_bytes/from_bytes' codec)
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

# Every other public name is imported on first use (PEP 562's module __getattr__): the
# command line (``hurray --version``, ``hurray inspect``) and a program that needs one
# part do not pay for the import of all of them. Type checkers read the imports below.
if TYPE_CHECKING:
    from . import dtypes, quant, shards, shm, sparse, stream
    from ._registry import get_adapter
    from .conversion import asarray, convert
    from .descriptor import (
        DYNAMIC,
        MAX_RANK,
        BufferSpec,
        Descriptor,
        Quantization,
        Shard,
        Sparse,
    )
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
    from .files.reading import load, loads
    from .files.writing import dumps, save
    from .layout import BufferRole, Flags, Layout, QuantScheme
    from .quant import dequantize, pack_subbyte, quantize, unpack_subbyte
    from .shards import Box, ShardedTensor, assemble, grid_boxes, split
    from .sparse import densify
    from .stream import StreamReader, StreamWriter
    from .tensor import CPU, Buffer, Device, Tensor, from_dlpack

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


# name -> (module, attribute in it; None: the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    **{m: (m, None) for m in ("dtypes", "quant", "shards", "shm", "sparse", "stream")},
    # Not exported, reached as ``hb.container`` ...: these modules were imported by the first
    # hb.load or hb.save, which now import the ``files`` modules they re-export from.
    **{m: (m, None) for m in ("container", "safetensors_io", "checkpoint_dir")},
    "get_adapter": ("_registry", "get_adapter"),
    **{n: ("files.reading", n) for n in ("load", "loads")},
    **{n: ("files.writing", n) for n in ("dumps", "save")},
    "convert": ("conversion", "convert"),
    **{n: ("descriptor", n) for n in ("DYNAMIC", "MAX_RANK", "BufferSpec", "Descriptor",
                                       "Quantization", "Shard", "Sparse")},
    **{n: ("dtypes", n) for n in (
        "DType", "bfloat16", "bool8", "complex64", "complex128", "float4_e2m1fn",
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
        "float8_e8m0fnu", "float16", "float32", "float64", "int2", "int4", "int8", "int16",
        "int32", "int64", "uint2", "uint4", "uint8", "uint16", "uint32", "uint64")},
    "bool": ("dtypes", "bool_"),
    **{n: ("layout", n) for n in ("BufferRole", "Flags", "Layout", "QuantScheme")},
    **{n: ("quant", n) for n in ("dequantize", "pack_subbyte", "quantize", "unpack_subbyte")},
    **{n: ("shards", n) for n in ("Box", "ShardedTensor", "assemble", "grid_boxes", "split")},
    "densify": ("sparse", "densify"),
    **{n: ("stream", n) for n in ("StreamReader", "StreamWriter")},
    **{n: ("tensor", n) for n in ("CPU", "Buffer", "Device", "Tensor", "from_dlpack")},
}


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (and then held here, so asked once)."""
    import importlib

    if name == "asarray":
        from ._exchange import front
        from .conversion import asarray

        # hb.asarray: the tensors of a type an adapter registered with the compiled import
        # (torch's) are read in C, everything else by conversion.asarray (_exchange.py).
        value: Any = front(asarray, positional_copy=True, name="asarray")
    elif name in _LAZY:
        module, attr = _LAZY[name]
        value = importlib.import_module(f"{__name__}.{module}")
        if module in ("files.reading", "container"):
            # hb.load of a folder or a checkpoint index reads through checkpoint_dir, which
            # adds its reader to files.reading's list as it is imported (files.reading cannot
            # import it: checkpoint_dir imports files.reading).
            importlib.import_module(f"{__name__}.checkpoint_dir")
        if attr is not None:
            value = getattr(value, attr)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value
