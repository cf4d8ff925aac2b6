"""Memory layouts and buffer roles (see docs/spec/memory-layout.md)."""

from __future__ import annotations

from enum import IntEnum, IntFlag

__all__ = ["BufferRole", "Flags", "Layout", "QuantScheme"]


class Layout(IntEnum):
    """How the logical index space maps onto buffers. Values are the wire tags."""

    ROW_MAJOR = 0x01
    STRIDED = 0x02
    TILED = 0x03
    COO = 0x04
    CSR = 0x05
    CSC = 0x06

    @property
    def is_sparse(self) -> bool:
        return self in (Layout.COO, Layout.CSR, Layout.CSC)


class BufferRole(IntEnum):
    """What a buffer in the buffer table holds. Values are the wire tags."""

    DATA = 1
    VALUES = 2
    INDICES = 3
    INDPTR = 4
    SCALES = 5
    ZERO_POINTS = 6


class Flags(IntFlag):
    """Descriptor header flags (u16 on the wire)."""

    NONE = 0
    HAS_QUANTIZATION = 0x0001
    HAS_SHARD = 0x0002
    SUBBYTE_PADDED = 0x0004


class QuantScheme(IntEnum):
    """Quantization granularity (see docs/spec/quantization.md)."""

    PER_TENSOR = 1
    PER_AXIS = 2
    PER_BLOCK = 3
