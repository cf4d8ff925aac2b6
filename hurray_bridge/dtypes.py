"""The element-type table: the one place every type mapping comes from.

Each Hurray element type has a stable ``uint8`` tag (append-only: a tag is
never reused or renumbered), a name, a bit width and the names under which
each ecosystem knows it. Adapters derive their dtype maps from this table by
looking the names up on the framework module, so a framework version that
lacks a type simply has no mapping for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

__all__ = [
    "bool_",
    "bool8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn",
    "int4",
    "uint4",
    "int2",
    "uint2",
    "DLPACK_CODE",
    "DType",
    "Kind",
    "Tier",
    "all_dtypes",
    "dtype_from_dlpack",
    "dtype_from_name",
    "dtype_from_tag",
    "native_types",
]


class Kind(IntEnum):
    """The family of an element type: boolean, signed or unsigned integer, float, complex."""

    BOOL = 0
    INT = 1
    UINT = 2
    FLOAT = 3
    COMPLEX = 4


class Tier(IntEnum):
    """Tier 1: every conforming implementation must support it. Tier 2: optional."""

    ONE = 1
    TWO = 2


class DLPACK_CODE(IntEnum):
    """DLPack's ``DLDataTypeCode`` values, as dlpack.h numbers them."""

    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLOpaqueHandle = 3
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6
    kDLFloat8_e3m4 = 7
    kDLFloat8_e4m3 = 8
    kDLFloat8_e4m3b11fnuz = 9
    kDLFloat8_e4m3fn = 10
    kDLFloat8_e4m3fnuz = 11
    kDLFloat8_e5m2 = 12
    kDLFloat8_e5m2fnuz = 13
    kDLFloat8_e8m0fnu = 14
    kDLFloat6_e2m3fn = 15
    kDLFloat6_e3m2fn = 16
    kDLFloat4_e2m1fn = 17


@dataclass(frozen=True, slots=True)
class DType:
    """One Hurray element type.

    ``numpy`` is ``"module:name"`` (NumPy itself or ml_dtypes); the other
    framework columns are attribute names on the framework module, or ``None``
    where the framework has no such type.
    """

    tag: int
    name: str
    bits: int
    kind: Kind
    tier: Tier
    dlpack: tuple[int, int] | None
    numpy: str | None
    torch: str | None
    jax: str | None
    arrow: str | None
    onnx: int | None
    safetensors: str | None

    @property
    def is_subbyte(self) -> bool:
        return self.bits < 8

    @property
    def itemsize(self) -> int:
        """Bytes per element in the unpacked (padded) form: 1 for sub-byte types."""
        return max(1, self.bits // 8)

    def __repr__(self) -> str:
        return f"hb.{self.name}"

    def __str__(self) -> str:
        return self.name


_C = DLPACK_CODE
_B, _I, _U, _F, _X = Kind.BOOL, Kind.INT, Kind.UINT, Kind.FLOAT, Kind.COMPLEX
_1, _2 = Tier.ONE, Tier.TWO

# tag, name, bits, kind, tier, dlpack, numpy, torch, jax, arrow, onnx, safetensors
_TABLE: tuple[DType, ...] = tuple(
    DType(*row)
    for row in (
        (1, "bool", 1, _B, _2, None, None, None, None, "bool_", None, None),
        (2, "bool8", 8, _B, _1, (_C.kDLBool, 8), "numpy:bool_", "bool", "bool_", "bool8", 9, "BOOL"),
        (3, "int8", 8, _I, _1, (_C.kDLInt, 8), "numpy:int8", "int8", "int8", "int8", 3, "I8"),
        (4, "int16", 16, _I, _1, (_C.kDLInt, 16), "numpy:int16", "int16", "int16", "int16", 5, "I16"),
        (5, "int32", 32, _I, _1, (_C.kDLInt, 32), "numpy:int32", "int32", "int32", "int32", 6, "I32"),
        (6, "int64", 64, _I, _1, (_C.kDLInt, 64), "numpy:int64", "int64", "int64", "int64", 7, "I64"),
        (7, "uint8", 8, _U, _1, (_C.kDLUInt, 8), "numpy:uint8", "uint8", "uint8", "uint8", 2, "U8"),
        (8, "uint16", 16, _U, _1, (_C.kDLUInt, 16), "numpy:uint16", "uint16", "uint16", "uint16", 4, "U16"),
        (9, "uint32", 32, _U, _1, (_C.kDLUInt, 32), "numpy:uint32", "uint32", "uint32", "uint32", 12, "U32"),
        (10, "uint64", 64, _U, _1, (_C.kDLUInt, 64), "numpy:uint64", "uint64", "uint64", "uint64", 13, "U64"),
        (11, "float16", 16, _F, _1, (_C.kDLFloat, 16), "numpy:float16", "float16", "float16", "float16", 10, "F16"),
        (12, "bfloat16", 16, _F, _1, (_C.kDLBfloat, 16), "ml_dtypes:bfloat16", "bfloat16", "bfloat16", None, 16, "BF16"),
        (13, "float32", 32, _F, _1, (_C.kDLFloat, 32), "numpy:float32", "float32", "float32", "float32", 1, "F32"),
        (14, "float64", 64, _F, _1, (_C.kDLFloat, 64), "numpy:float64", "float64", "float64", "float64", 11, "F64"),
        (15, "complex64", 64, _X, _1, (_C.kDLComplex, 64), "numpy:complex64", "complex64", "complex64", None, 14, "C64"),
        (16, "complex128", 128, _X, _1, (_C.kDLComplex, 128), "numpy:complex128", "complex128", "complex128", None, 15, None),
        (17, "float8_e4m3fn", 8, _F, _2, (_C.kDLFloat8_e4m3fn, 8), "ml_dtypes:float8_e4m3fn", "float8_e4m3fn", "float8_e4m3fn", None, 17, "F8_E4M3"),
        (18, "float8_e5m2", 8, _F, _2, (_C.kDLFloat8_e5m2, 8), "ml_dtypes:float8_e5m2", "float8_e5m2", "float8_e5m2", None, 19, "F8_E5M2"),
        (19, "float8_e4m3fnuz", 8, _F, _2, (_C.kDLFloat8_e4m3fnuz, 8), "ml_dtypes:float8_e4m3fnuz", "float8_e4m3fnuz", "float8_e4m3fnuz", None, 18, "F8_E4M3FNUZ"),
        (20, "float8_e5m2fnuz", 8, _F, _2, (_C.kDLFloat8_e5m2fnuz, 8), "ml_dtypes:float8_e5m2fnuz", "float8_e5m2fnuz", "float8_e5m2fnuz", None, 20, "F8_E5M2FNUZ"),
        (21, "float8_e8m0fnu", 8, _F, _2, (_C.kDLFloat8_e8m0fnu, 8), "ml_dtypes:float8_e8m0fnu", "float8_e8m0fnu", "float8_e8m0fnu", None, 24, "F8_E8M0"),
        (22, "float4_e2m1fn", 4, _F, _2, (_C.kDLFloat4_e2m1fn, 4), "ml_dtypes:float4_e2m1fn", "float4_e2m1fn_x2", "float4_e2m1fn", None, 23, "F4"),
        (23, "int4", 4, _I, _2, (_C.kDLInt, 4), "ml_dtypes:int4", None, "int4", None, 22, None),
        (24, "uint4", 4, _U, _2, (_C.kDLUInt, 4), "ml_dtypes:uint4", None, "uint4", None, 21, None),
        (25, "int2", 2, _I, _2, (_C.kDLInt, 2), "ml_dtypes:int2", None, "int2", None, 26, None),
        (26, "uint2", 2, _U, _2, (_C.kDLUInt, 2), "ml_dtypes:uint2", None, "uint2", None, 25, None),
    )
)

_BY_TAG: dict[int, DType] = {d.tag: d for d in _TABLE}
_BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}
# (code, bits) -> DType; (kDLUInt, 1) is not DLPack-standard, so bit-packed bool has no entry.
_BY_DLPACK: dict[tuple[int, int], DType] = {d.dlpack: d for d in _TABLE if d.dlpack is not None}
# A few aliases users type.
_ALIASES = {"bool_": "bool8", "half": "float16", "float": "float32", "double": "float64"}


def all_dtypes() -> tuple[DType, ...]:
    """Every element type, in tag order."""
    return _TABLE


def native_types(column: str, resolve: Callable[[str], Any]) -> dict[DType, Any]:
    """Map each Hurray type to a framework's own type object, derived from this table.

    ``column`` names the table column (``"torch"``, ``"jax"`` ...); ``resolve``
    turns its entry into the framework's object, or ``None`` when the
    installed version lacks it (that type then has no mapping).
    """
    out: dict[DType, Any] = {}
    for d in _TABLE:
        name = getattr(d, column)
        if name is None:
            continue
        native = resolve(name)
        if native is not None:
            out[d] = native
    return out


def dtype_from_tag(tag: int) -> DType:
    """The element type with wire tag ``tag``; an unknown tag is a FormatError (field ``type_tag``)."""
    try:
        return _BY_TAG[tag]
    except KeyError:
        from .errors import FormatError

        raise FormatError(f"unknown element type tag {tag}", field="type_tag") from None


def dtype_from_name(name: str) -> DType:
    """The element type called ``name`` (or one of its aliases); an unknown name is an UnsupportedError."""
    try:
        return _BY_NAME[_ALIASES.get(name, name)]
    except KeyError:
        from .errors import UnsupportedError

        raise UnsupportedError(
            f"unknown element type {name!r}; known: {', '.join(_BY_NAME)}"
        ) from None


def dtype_from_dlpack(code: int, bits: int, lanes: int = 1) -> DType:
    """The Hurray type of a DLPack ``(code, bits, lanes)`` triple."""
    from .errors import UnsupportedError

    if lanes != 1:
        raise UnsupportedError(f"DLPack vector types are not supported (lanes={lanes}, must be 1)")
    try:
        return _BY_DLPACK[(code, bits)]
    except KeyError:
        raise UnsupportedError(
            f"DLPack dtype (code={code}, bits={bits}) has no Hurray element type"
        ) from None



# Module-level constants (``hb.float32`` ...); ``bool_`` is exported as ``hb.bool``.
bool_ = _BY_NAME["bool"]
"""1-bit boolean, bit-packed LSB-first (ADR-009); exported as ``hb.bool``."""
bool8 = _BY_NAME["bool8"]
"""Boolean stored in one byte (0 or 1): DLPack's and NumPy's ``bool``."""
int8 = _BY_NAME["int8"]
"""8-bit signed integer."""
int16 = _BY_NAME["int16"]
"""16-bit signed integer."""
int32 = _BY_NAME["int32"]
"""32-bit signed integer."""
int64 = _BY_NAME["int64"]
"""64-bit signed integer."""
uint8 = _BY_NAME["uint8"]
"""8-bit unsigned integer."""
uint16 = _BY_NAME["uint16"]
"""16-bit unsigned integer."""
uint32 = _BY_NAME["uint32"]
"""32-bit unsigned integer."""
uint64 = _BY_NAME["uint64"]
"""64-bit unsigned integer."""
float16 = _BY_NAME["float16"]
"""IEEE 754 half precision: 1 sign, 5 exponent, 10 mantissa bits."""
bfloat16 = _BY_NAME["bfloat16"]
"""Brain float: 1 sign, 8 exponent, 7 mantissa bits (float32's range)."""
float32 = _BY_NAME["float32"]
"""IEEE 754 single precision."""
float64 = _BY_NAME["float64"]
"""IEEE 754 double precision."""
complex64 = _BY_NAME["complex64"]
"""Complex number of two float32 (real, then imaginary)."""
complex128 = _BY_NAME["complex128"]
"""Complex number of two float64 (real, then imaginary)."""
float8_e4m3fn = _BY_NAME["float8_e4m3fn"]
"""8-bit float, 4 exponent and 3 mantissa bits; finite only (NaN, no infinity)."""
float8_e5m2 = _BY_NAME["float8_e5m2"]
"""8-bit float, 5 exponent and 2 mantissa bits, with infinities and NaNs."""
float8_e4m3fnuz = _BY_NAME["float8_e4m3fnuz"]
"""8-bit float, 4 exponent and 3 mantissa bits; finite, no negative zero (NaN is 0x80)."""
float8_e5m2fnuz = _BY_NAME["float8_e5m2fnuz"]
"""8-bit float, 5 exponent and 2 mantissa bits; finite, no negative zero (NaN is 0x80)."""
float8_e8m0fnu = _BY_NAME["float8_e8m0fnu"]
"""8-bit power of two (exponent only, unsigned): the scale type of MX block formats."""
float4_e2m1fn = _BY_NAME["float4_e2m1fn"]
"""4-bit float, 2 exponent and 1 mantissa bit; finite only. Packed two per byte LSB-first (ADR-011)."""
int4 = _BY_NAME["int4"]
"""4-bit signed integer, packed two per byte LSB-first (ADR-011)."""
uint4 = _BY_NAME["uint4"]
"""4-bit unsigned integer, packed two per byte LSB-first (ADR-011)."""
int2 = _BY_NAME["int2"]
"""2-bit signed integer, packed four per byte LSB-first (ADR-011)."""
uint2 = _BY_NAME["uint2"]
"""2-bit unsigned integer, packed four per byte LSB-first (ADR-011)."""
