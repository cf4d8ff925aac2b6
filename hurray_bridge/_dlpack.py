"""A ctypes mirror of the DLPack 1.3 C ABI (``dlpack.h``).

Only layouts and constants live here; the code that reads and writes capsules
is in :mod:`hurray_bridge._capsule`. Offsets are those of LP64 platforms
(x86-64 and aarch64 Linux/macOS), which ``tests/hurray_bridge/test_dlpack_abi.py`` pins.

The two managed structs order their fields differently (``dl_tensor`` first in
the legacy one, last in the versioned one), so a consumer must use the capsule
name, never the struct contents, to tell them apart.
"""

from __future__ import annotations

import ctypes
from enum import IntEnum

__all__ = [
    "DLPACK_MAJOR_VERSION",
    "DLPACK_MINOR_VERSION",
    "DLPACK_VERSION",
    "DLTENSOR_NAME",
    "DLTENSOR_VERSIONED_NAME",
    "EXCHANGE_API_NAME",
    "FLAG_IS_COPIED",
    "FLAG_IS_SUBBYTE_TYPE_PADDED",
    "FLAG_READ_ONLY",
    "MAX_NDIM",
    "USED_DLTENSOR_NAME",
    "USED_DLTENSOR_VERSIONED_NAME",
    "DLDataType",
    "DLDevice",
    "DLDeviceType",
    "DLManagedTensor",
    "DLManagedTensorDeleter",
    "DLManagedTensorVersioned",
    "DLManagedTensorVersionedDeleter",
    "DLPackVersion",
    "DLTensor",
]

DLPACK_MAJOR_VERSION = 1
DLPACK_MINOR_VERSION = 3
DLPACK_VERSION: tuple[int, int] = (DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION)

# DLPACK_FLAG_BITMASK_* (DLManagedTensorVersioned.flags).
FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1
FLAG_IS_SUBBYTE_TYPE_PADDED = 1 << 2

# The Hurray rank cap (ADR-008); DLPack itself has none, but a capsule over it is refused.
MAX_NDIM = 64

# Capsule names of the Python protocol. A consumer renames a capsule to the
# "used_" spelling when it takes ownership, which turns the producer's capsule
# destructor into a no-op.
DLTENSOR_NAME = b"dltensor"
USED_DLTENSOR_NAME = b"used_dltensor"
DLTENSOR_VERSIONED_NAME = b"dltensor_versioned"
USED_DLTENSOR_VERSIONED_NAME = b"used_dltensor_versioned"
EXCHANGE_API_NAME = b"dlpack_exchange_api"


class DLDeviceType(IntEnum):
    """``DLDeviceType`` of dlpack.h v1.3, C spellings (values 5 and 6 are unassigned)."""

    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3
    kDLOpenCL = 4
    kDLVulkan = 7
    kDLMetal = 8
    kDLVPI = 9
    kDLROCM = 10
    kDLROCMHost = 11
    kDLExtDev = 12
    kDLCUDAManaged = 13
    kDLOneAPI = 14
    kDLWebGPU = 15
    kDLHexagon = 16
    kDLMAIA = 17
    kDLTrn = 18


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLDevice(ctypes.Structure):
    # device_type is a C enum: 4 bytes on every mainstream ABI.
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),  # in elements, not bytes
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    """Legacy (pre-1.0) managed tensor, capsule name ``"dltensor"``."""


class DLManagedTensorVersioned(ctypes.Structure):
    """Managed tensor of DLPack >= 1.0, capsule name ``"dltensor_versioned"``."""


# void (*deleter)(struct DLManagedTensor[Versioned]* self): frees manager_ctx state and self.
DLManagedTensorDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensorVersionedDeleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))

DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLManagedTensorDeleter),
]

# The header promises that every field up to and including `flags` stays put in
# future majors, so an old consumer can always read the version and call the deleter.
DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", DLManagedTensorVersionedDeleter),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]
