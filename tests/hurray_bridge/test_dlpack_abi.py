"""The ctypes mirror of dlpack.h v1.3 matches the C ABI (LP64 offsets)."""

from __future__ import annotations

import ctypes
import sys

import pytest

from hurray_bridge import _dlpack as D

pytestmark = pytest.mark.skipif(
    ctypes.sizeof(ctypes.c_void_p) != 8, reason="offsets below are those of LP64 platforms"
)


def _offsets(struct: type[ctypes.Structure]) -> dict[str, int]:
    return {name: getattr(struct, name).offset for name, *_ in struct._fields_}


def test_dlpack_version() -> None:
    assert D.DLPACK_VERSION == (1, 3)
    assert (D.DLPACK_MAJOR_VERSION, D.DLPACK_MINOR_VERSION) == (1, 3)


def test_small_structs() -> None:
    assert ctypes.sizeof(D.DLPackVersion) == 8
    assert _offsets(D.DLPackVersion) == {"major": 0, "minor": 4}
    assert ctypes.sizeof(D.DLDevice) == 8
    assert ctypes.alignment(D.DLDevice) == 4
    assert _offsets(D.DLDevice) == {"device_type": 0, "device_id": 4}
    assert ctypes.sizeof(D.DLDataType) == 4
    assert _offsets(D.DLDataType) == {"code": 0, "bits": 1, "lanes": 2}


def test_dltensor_layout() -> None:
    assert ctypes.sizeof(D.DLTensor) == 48
    assert _offsets(D.DLTensor) == {
        "data": 0,
        "device": 8,
        "ndim": 16,
        "dtype": 20,
        "shape": 24,
        "strides": 32,
        "byte_offset": 40,
    }


def test_legacy_managed_tensor_layout() -> None:
    assert ctypes.sizeof(D.DLManagedTensor) == 64
    assert _offsets(D.DLManagedTensor) == {"dl_tensor": 0, "manager_ctx": 48, "deleter": 56}


def test_versioned_managed_tensor_layout() -> None:
    assert ctypes.sizeof(D.DLManagedTensorVersioned) == 80
    assert _offsets(D.DLManagedTensorVersioned) == {
        "version": 0,
        "manager_ctx": 8,
        "deleter": 16,
        "flags": 24,
        "dl_tensor": 32,
    }


def test_field_types_have_c_widths() -> None:
    sizes = {name: ctypes.sizeof(tp) for name, tp in D.DLTensor._fields_}
    assert sizes == {
        "data": 8,
        "device": 8,
        "ndim": 4,
        "dtype": 4,
        "shape": 8,
        "strides": 8,
        "byte_offset": 8,
    }
    v = {name: ctypes.sizeof(tp) for name, tp in D.DLManagedTensorVersioned._fields_}
    assert v == {"version": 8, "manager_ctx": 8, "deleter": 8, "flags": 8, "dl_tensor": 48}


def test_flags() -> None:
    assert D.FLAG_READ_ONLY == 1
    assert D.FLAG_IS_COPIED == 2
    assert D.FLAG_IS_SUBBYTE_TYPE_PADDED == 4


def test_device_types() -> None:
    expected = {
        "kDLCPU": 1,
        "kDLCUDA": 2,
        "kDLCUDAHost": 3,
        "kDLOpenCL": 4,
        "kDLVulkan": 7,
        "kDLMetal": 8,
        "kDLVPI": 9,
        "kDLROCM": 10,
        "kDLROCMHost": 11,
        "kDLExtDev": 12,
        "kDLCUDAManaged": 13,
        "kDLOneAPI": 14,
        "kDLWebGPU": 15,
        "kDLHexagon": 16,
        "kDLMAIA": 17,
        "kDLTrn": 18,
    }
    assert {m.name: m.value for m in D.DLDeviceType} == expected


def test_capsule_names() -> None:
    assert D.DLTENSOR_NAME == b"dltensor"
    assert D.USED_DLTENSOR_NAME == b"used_dltensor"
    assert D.DLTENSOR_VERSIONED_NAME == b"dltensor_versioned"
    assert D.USED_DLTENSOR_VERSIONED_NAME == b"used_dltensor_versioned"
    assert D.EXCHANGE_API_NAME == b"dlpack_exchange_api"


@pytest.mark.skipif(sys.byteorder != "little", reason="checks little-endian bytes")
def test_structs_round_trip_values() -> None:
    # Writing through the mirror and reading the raw bytes back pins field placement.
    m = D.DLManagedTensorVersioned()
    m.version.major, m.version.minor = 1, 3
    m.flags = D.FLAG_READ_ONLY | D.FLAG_IS_COPIED
    m.dl_tensor.ndim = 3
    m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, 32, 1
    m.dl_tensor.byte_offset = 0x1122334455667788
    raw = bytes(m)
    assert raw[0:8] == (1).to_bytes(4, "little") + (3).to_bytes(4, "little")
    assert raw[24:32] == (3).to_bytes(8, "little")
    assert raw[48:52] == (3).to_bytes(4, "little")
    assert raw[52:56] == bytes([2, 32, 1, 0])
    assert raw[72:80] == (0x1122334455667788).to_bytes(8, "little")


def test_deleter_prototypes_take_one_pointer() -> None:
    for proto, struct in (
        (D.DLManagedTensorDeleter, D.DLManagedTensor),
        (D.DLManagedTensorVersionedDeleter, D.DLManagedTensorVersioned),
    ):
        assert proto._restype_ is None
        assert proto._argtypes_ == (ctypes.POINTER(struct),)


# ---------------------------------------------------- the C sides against this one description
_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def _c_enum(text: str, typedef: str) -> dict[str, int]:
    """``name -> value`` of ``typedef enum { ... } typedef;`` in a C header."""
    import re

    body = re.search(r"typedef enum\s*\{([^}]*)\}\s*" + typedef + r"\s*;", text)
    assert body is not None, f"no enum {typedef}"
    return {m[1]: int(m[2]) for m in re.finditer(r"(\w+)\s*=\s*(\d+)U?", body[1])}


def _c_defines(text: str) -> dict[str, str]:
    import re

    return {m[1]: m[2].strip() for m in re.finditer(r"^#define (\w+) (.+?)(?:/\*.*)?$", text, re.M)}


def test_the_c_library_header_carries_the_same_dlpack_abi() -> None:
    # Python's tables are the description: hurray.h's own copy of dlpack.h (used when no
    # dlpack.h is included first) must name every device type and type code, with its value.
    header = (_ROOT / "c" / "include" / "hurray.h").read_text()
    from hurray_bridge.dtypes import DLPACK_CODE

    assert _c_enum(header, "DLDeviceType") == {m.name: m.value for m in D.DLDeviceType}
    assert _c_enum(header, "DLDataTypeCode") == {m.name: m.value for m in DLPACK_CODE}
    defines = _c_defines(header)
    assert (int(defines["DLPACK_MAJOR_VERSION"]), int(defines["DLPACK_MINOR_VERSION"])) \
        == D.DLPACK_VERSION
    assert [defines[f"DLPACK_FLAG_BITMASK_{n}"] for n in
            ("READ_ONLY", "IS_COPIED", "IS_SUBBYTE_TYPE_PADDED")] \
        == ["(1UL << 0UL)", "(1UL << 1UL)", "(1UL << 2UL)"]
    assert [D.FLAG_READ_ONLY, D.FLAG_IS_COPIED, D.FLAG_IS_SUBBYTE_TYPE_PADDED] == [1, 2, 4]


def test_the_compiled_module_header_carries_the_same_dlpack_abi() -> None:
    header = (_ROOT / "hurray_bridge" / "_speedups_c" / "dlpack_abi.h").read_text()
    from hurray_bridge.dtypes import DLPACK_CODE

    d = _c_defines(header)
    assert (int(d["HB_DLPACK_MAJOR"]), int(d["HB_DLPACK_MINOR"])) == D.DLPACK_VERSION
    assert [d["HB_DLFLAG_READ_ONLY"], d["HB_DLFLAG_IS_COPIED"], d["HB_DLFLAG_SUBBYTE_PADDED"]] \
        == ["(UINT64_C(1) << 0)", "(UINT64_C(1) << 1)", "(UINT64_C(1) << 2)"]
    assert int(d["HB_KDL_CPU"]) == D.DLDeviceType.kDLCPU
    assert int(d["HB_KDL_COMPLEX"]) == DLPACK_CODE.kDLComplex


def test_the_header_checker_sees_a_missing_device_type() -> None:
    text = "typedef enum {\n    kDLCPU = 1, kDLCUDA = 2\n} DLDeviceType;"
    assert _c_enum(text, "DLDeviceType") == {"kDLCPU": 1, "kDLCUDA": 2}
    assert _c_enum(text, "DLDeviceType") != {m.name: m.value for m in D.DLDeviceType}
