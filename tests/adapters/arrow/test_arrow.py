"""Arrow adapter: pyarrow Array / ChunkedArray / Tensor / FixedShapeTensorArray <-> hb.Tensor.

Zero-copy is proven by comparing data addresses (``buffers()[1].address``,
NumPy's ``ctypes.data``); values are compared as bytes, so NaN payloads count.
"""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import io
import warnings
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hurray_bridge as hb
from hurray_bridge import _capsule
from hurray_bridge.descriptor import compact_strides

np = pytest.importorskip("numpy", reason="numpy is not installed")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")

import pyarrow.ipc as ipc  # noqa: E402

from hurray_bridge.adapters import arrow as A  # noqa: E402

# Every primitive type Arrow and Hurray share, with its NumPy spelling.
PRIMITIVES = [
    (hb.int8, np.int8), (hb.int16, np.int16), (hb.int32, np.int32), (hb.int64, np.int64),
    (hb.uint8, np.uint8), (hb.uint16, np.uint16), (hb.uint32, np.uint32),
    (hb.uint64, np.uint64), (hb.float16, np.float16), (hb.float32, np.float32),
    (hb.float64, np.float64),
]
PRIM_IDS = [d.name for d, _ in PRIMITIVES]
LENGTHS = [0, 1, 1000]


def _values(np_dtype: Any, n: int, seed: int = 0) -> np.ndarray:
    """Random bit patterns (NaNs with payloads included for floats)."""
    isz = np.dtype(np_dtype).itemsize
    raw = np.random.default_rng(seed).integers(0, 256, n * isz, dtype=np.uint8)
    return raw.view(np_dtype)


def _addr(arr: pa.Array) -> int:
    return arr.buffers()[1].address


def _bytes(t: hb.Tensor) -> bytes:
    return bytes(t.memoryview())


def _arrow_bytes(arr: pa.Array) -> bytes:
    """The bytes of a primitive array's values (offset applied)."""
    isz = arr.type.bit_width // 8
    n = len(arr)
    if n == 0:
        return b""
    return ctypes.string_at(_addr(arr) + arr.offset * isz, n * isz)


def _bool_tensor(values: list[bool]) -> hb.Tensor:
    """A packed hb.bool tensor built by hand (LSB first, trailing bits zero)."""
    n = len(values)
    nbytes = -(-n // 8)
    buf = (ctypes.c_ubyte * max(nbytes, 1))()
    for i, v in enumerate(values):
        if v:
            buf[i // 8] |= 1 << (i % 8)
    desc = hb.Descriptor((n,), hb.bool)
    return hb.Tensor(desc, [hb.Buffer(hb.BufferRole.DATA, ctypes.addressof(buf) if n else 0,
                                      nbytes)], owner=buf)


def _unpack_bits(data: bytes, n: int) -> list[bool]:
    return [bool(data[i // 8] >> (i % 8) & 1) for i in range(n)]


def _bool8_array(values: list[bool]) -> pa.ExtensionArray:
    return pa.ExtensionArray.from_storage(pa.bool8(), pa.array([int(v) for v in values], pa.int8()))


# ------------------------------------------------------------------------- dtype table
def test_dtype_map_comes_from_the_table() -> None:
    for d, npd in PRIMITIVES:
        assert A.native_dtype(d) == pa.from_numpy_dtype(npd)
        assert A.dtype_of(pa.from_numpy_dtype(npd)) is d
    assert A.native_dtype(hb.bool) == pa.bool_()
    assert A.native_dtype(hb.bool8) == pa.bool8()
    assert A.dtype_of(pa.bool_()) is hb.bool
    assert A.dtype_of(pa.bool8()) is hb.bool8


def test_native_type_is_a_deprecated_alias_of_native_dtype() -> None:
    with pytest.warns(DeprecationWarning, match="native_type is deprecated.*native_dtype"):
        old = A.native_type
    assert old is A.native_dtype and old(hb.int8) == pa.int8()
    assert "native_type" not in A.__all__


@pytest.mark.parametrize("dtype", [hb.bfloat16, hb.complex64, hb.complex128, hb.float8_e4m3fn,
                                   hb.float8_e5m2, hb.float4_e2m1fn, hb.int4, hb.uint2],
                         ids=lambda d: d.name)
def test_types_arrow_lacks_are_refused_by_name(dtype: hb.DType) -> None:
    with pytest.raises(hb.UnsupportedError, match=rf"Arrow has no type for {dtype.name}"):
        A.native_dtype(dtype)
    # A real tensor of that type (through NumPy/ml_dtypes) is refused the same way.
    from hurray_bridge.adapters import numpy as npa

    t = hb.asarray(np.zeros(3, npa.native_dtype(dtype)))
    for kind in (None, "tensor"):
        with pytest.raises(hb.UnsupportedError, match=rf"Arrow has no type for {dtype.name}"):
            A.from_hurray(t, kind=kind)


@pytest.mark.parametrize(
    ("arr", "match"),
    [
        (pa.array(["a", "b"]), "string"),
        (pa.array([1, 2], pa.timestamp("s")), r"arr\.view\(pa\.int64\(\)\)"),
        (pa.array([1, 2], pa.date32()), r"arr\.view\(pa\.int32\(\)\)"),
        (pa.array(["a", "a"]).dictionary_encode(), "dictionary_decode"),
        (pa.array([None, None]), "null"),
        (pa.array([[1, 2]], pa.list_(pa.int32(), 2)), "fixed_shape_tensor"),
        (pa.array([1], pa.decimal128(5, 2)), "decimal"),
    ],
    ids=["string", "timestamp", "date32", "dictionary", "null", "fixed_size_list", "decimal"],
)
def test_arrow_types_without_hurray_type_are_refused(arr: pa.Array, match: str) -> None:
    with pytest.raises(hb.UnsupportedError, match=match):
        A.to_hurray(arr)


@pytest.mark.parametrize(
    "obj",
    [pa.table({"a": [1]}), pa.record_batch({"a": [1]}), pa.scalar(1), pa.py_buffer(b"x")],
    ids=["table", "record_batch", "scalar", "buffer"],
)
def test_other_pyarrow_objects_are_refused(obj: object) -> None:
    with pytest.raises(hb.UnsupportedError, match="converts pyarrow Array, ChunkedArray"):
        hb.asarray(obj)


# ------------------------------------------------------------------ primitive arrays
@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(("dtype", "np_dtype"), PRIMITIVES, ids=PRIM_IDS)
def test_array_to_hurray_is_zero_copy(dtype: hb.DType, np_dtype: Any, n: int) -> None:
    src = _values(np_dtype, n)
    arr = pa.array(src)
    t = A.to_hurray(arr)
    assert (t.shape, t.dtype, t.device) == ((n,), dtype, hb.CPU)
    assert t.readonly and not t.copied
    if n:
        assert t.owner is arr
        assert t.data_ptr == _addr(arr)
    else:
        assert t.data_ptr == 0 and t.nbytes == 0  # ADR-007: NULL and zero bytes
    assert _bytes(t) == src.tobytes()


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(("dtype", "np_dtype"), PRIMITIVES, ids=PRIM_IDS)
def test_array_from_hurray_is_zero_copy(dtype: hb.DType, np_dtype: Any, n: int) -> None:
    src = _values(np_dtype, n, seed=1)
    t = hb.asarray(src)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        arr = A.from_hurray(t)
    assert isinstance(arr, pa.Array) and arr.type == A.native_dtype(dtype)
    assert len(arr) == n and arr.null_count == 0 and arr.offset == 0
    arr.validate(full=True)
    data = arr.buffers()[1]
    if n:
        assert data.address == src.ctypes.data
    else:
        # No allocation: a zero-length buffer at address 0 (as pyarrow's own from_dlpack).
        assert (data.address, data.size) == (0, 0)
    assert _arrow_bytes(arr) == src.tobytes()


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize(("dtype", "np_dtype"), PRIMITIVES, ids=PRIM_IDS)
def test_array_round_trip_keeps_the_buffer(dtype: hb.DType, np_dtype: Any, n: int) -> None:
    arr = pa.array(_values(np_dtype, n, seed=2))
    back = A.from_hurray(A.to_hurray(arr))
    assert back.equals(arr) or np.array_equal(  # NaN != NaN in equals(): compare bytes
        np.frombuffer(_arrow_bytes(back), np.uint8), np.frombuffer(_arrow_bytes(arr), np.uint8))
    assert _arrow_bytes(back) == _arrow_bytes(arr)
    if n:
        assert _addr(back) == _addr(arr)


@pytest.mark.parametrize(("start", "stop"), [(3, None), (3, 10), (999, None), (1000, None)])
@pytest.mark.parametrize(("dtype", "np_dtype"), PRIMITIVES, ids=PRIM_IDS)
def test_sliced_array_pointer_includes_the_offset(
    dtype: hb.DType, np_dtype: Any, start: int, stop: int | None
) -> None:
    src = _values(np_dtype, 1000, seed=3)
    arr = pa.array(src)
    part = arr[start:stop]
    t = A.to_hurray(part)
    expected = src[start:stop]
    assert t.shape == expected.shape
    assert _bytes(t) == expected.tobytes()
    if expected.size:
        assert t.data_ptr == _addr(arr) + start * src.itemsize
        # ... and back to Arrow: still the same memory, now at offset 0.
        back = A.from_hurray(t)
        assert _addr(back) == t.data_ptr and back.offset == 0
    else:
        assert t.data_ptr == 0


@pytest.mark.parametrize(("dtype", "np_dtype"), PRIMITIVES, ids=PRIM_IDS)
def test_copy_true_copies_both_ways(dtype: hb.DType, np_dtype: Any) -> None:
    src = _values(np_dtype, 100, seed=4)
    arr = pa.array(src)
    t = A.to_hurray(arr, copy=True)
    assert t.copied and not t.readonly
    assert t.data_ptr != _addr(arr) and t.data_ptr % 64 == 0
    assert _bytes(t) == src.tobytes()
    out = A.from_hurray(hb.asarray(src), copy=True)
    assert _addr(out) != src.ctypes.data
    assert _arrow_bytes(out) == src.tobytes()


def test_copy_false_is_fine_when_nothing_needs_copying() -> None:
    arr = pa.array(np.arange(10, dtype=np.int32))[2:]
    t = A.to_hurray(arr, copy=False)
    assert t.data_ptr == _addr(arr) + 8
    assert _addr(A.from_hurray(t, copy=False)) == t.data_ptr


# ---------------------------------------------------------------------------- nulls
@pytest.mark.parametrize(
    "arr",
    [pa.array([1, None, 3], pa.int32()), pa.array([1.0, None], pa.float64()),
     pa.array([True, None], pa.bool_()), pa.chunked_array([[1], [None]], pa.int8())],
    ids=["int32", "float64", "bool", "chunked"],
)
def test_nulls_are_refused_with_the_fill_hint(arr: Any) -> None:
    with pytest.raises(hb.UnsupportedError, match=r"null.*fill_null") as info:
        A.to_hurray(arr)
    assert "drop_null" in str(info.value)
    filled = arr.fill_null(0) if not pa.types.is_boolean(arr.type) else arr.fill_null(False)
    A.to_hurray(filled)  # the hint works


def test_nulls_outside_the_slice_do_not_count() -> None:
    arr = pa.array([None, 1, 2], pa.int16())
    t = A.to_hurray(arr[1:])
    assert t.shape == (2,) and _bytes(t) == np.array([1, 2], np.int16).tobytes()
    with pytest.raises(hb.UnsupportedError, match="null"):
        A.to_hurray(arr[:2])


# ----------------------------------------------------------------------------- bool
BOOLS = [bool(b) for b in np.random.default_rng(5).integers(0, 2, 45)]


@pytest.mark.parametrize("offset", [0, 8, 16])
def test_bool_on_a_byte_boundary_is_zero_copy(offset: int) -> None:
    arr = pa.array(BOOLS)
    part = arr[offset:]
    t = A.to_hurray(part, copy=False)
    n = len(BOOLS) - offset
    assert (t.dtype, t.shape, t.nbytes) == (hb.bool, (n,), -(-n // 8))  # ceil(n/8), packed
    assert t.data_ptr == _addr(arr) + offset // 8
    assert t.readonly and not t.copied
    assert _unpack_bits(_bytes(t), n) == BOOLS[offset:]


def test_bool_slice_shares_trailing_bits_and_readers_ignore_them() -> None:
    # arr[8:12] of 16 values: the last byte also holds values 12..15 (set here).
    vals = [False] * 8 + [True, False, True, False] + [True] * 4
    part = pa.array(vals)[8:12]
    t = A.to_hurray(part, copy=False)
    assert _bytes(t) == bytes([0b11110101])  # shared as is: trailing bits not ours to clear
    assert _unpack_bits(_bytes(t), 4) == [True, False, True, False]
    assert A.from_hurray(t).to_pylist() == [True, False, True, False]
    # A copy writes them as zero (Hurray: trailing bits zero on write).
    assert _bytes(A.to_hurray(part, copy=True)) == bytes([0b0101])
    assert A.from_hurray(t, copy=True).buffers()[1].to_pybytes() == bytes([0b0101])


@pytest.mark.parametrize("offset", [1, 3, 7, 9])
def test_bool_off_a_byte_boundary_needs_a_copy(offset: int) -> None:
    part = pa.array(BOOLS)[offset:]
    with pytest.raises(hb.CopyRequiredError, match=rf"bit offset {offset}.*copy=False"):
        A.to_hurray(part, copy=False)
    t = A.to_hurray(part)
    n = len(BOOLS) - offset
    assert t.copied and t.dtype is hb.bool and t.shape == (n,)
    data = _bytes(t)
    assert _unpack_bits(data, n) == BOOLS[offset:]
    if n % 8:  # repacked: trailing bits are zero
        assert data[-1] >> (n % 8) == 0


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000])
def test_hb_bool_to_arrow_is_zero_copy_and_bit_exact(n: int) -> None:
    vals = [bool(b) for b in np.random.default_rng(n).integers(0, 2, n)]
    t = _bool_tensor(vals)
    arr = A.from_hurray(t)
    assert arr.type == pa.bool_() and arr.to_pylist() == vals
    arr.validate(full=True)
    if n:
        assert _addr(arr) == t.data_ptr
    else:
        assert arr.buffers()[1].address == 0
    back = A.to_hurray(arr)
    assert back.dtype is hb.bool and _bytes(back) == _bytes(t)


def test_hb_bool_has_no_arrow_tensor_form() -> None:
    t = A.to_hurray(pa.array([True] * 6))
    with pytest.raises(hb.UnsupportedError, match=r"numbers only.*fixed_shape_tensor"):
        A.from_hurray(t, kind="tensor")


# ---------------------------------------------------------------------------- bool8
@pytest.mark.parametrize("n", LENGTHS)
def test_bool8_both_ways_zero_copy(n: int) -> None:
    vals = [bool(b) for b in np.random.default_rng(7).integers(0, 2, n)]
    arr = _bool8_array(vals)
    t = A.to_hurray(arr)
    assert (t.dtype, t.shape, t.readonly) == (hb.bool8, (n,), True)
    if n:
        assert t.data_ptr == _addr(arr.storage)
    assert _bytes(t) == bytes(vals)
    src = np.array(vals, np.bool_)
    out = A.from_hurray(hb.asarray(src))
    assert isinstance(out, pa.ExtensionArray) and out.type == pa.bool8()
    assert out.to_pylist() == vals
    if n:
        assert _addr(out.storage) == src.ctypes.data
    sliced = arr[1:] if n else arr
    assert _bytes(A.to_hurray(sliced)) == bytes(vals[1:])


# -------------------------------------------------------------------- chunked arrays
def test_chunked_one_chunk_is_zero_copy() -> None:
    chunk = pa.array(np.arange(10, dtype=np.float32))
    t = A.to_hurray(pa.chunked_array([chunk]), copy=False)
    assert t.data_ptr == _addr(chunk) and not t.copied


def test_chunked_several_chunks_copy_only_when_allowed() -> None:
    ch = pa.chunked_array([np.arange(3, dtype=np.int64), np.arange(3, 7, dtype=np.int64)])
    with pytest.raises(hb.CopyRequiredError, match=r"2 chunks.*pass copy=None or copy=True"):
        A.to_hurray(ch, copy=False)
    for copy in (None, True):
        t = A.to_hurray(ch, copy=copy)
        assert t.copied and t.shape == (7,)
        assert _bytes(t) == np.arange(7, dtype=np.int64).tobytes()
        assert t.data_ptr not in (_addr(ch.chunk(0)), _addr(ch.chunk(1)))


def test_chunked_bool_chunks_combine_bit_exact() -> None:
    ch = pa.chunked_array([pa.array(BOOLS[:5]), pa.array(BOOLS)[3:20], pa.array(BOOLS[20:])])
    t = A.to_hurray(ch)
    expected = BOOLS[:5] + BOOLS[3:20] + BOOLS[20:]
    assert t.copied and _unpack_bits(_bytes(t), len(expected)) == expected


@pytest.mark.parametrize(
    ("typ", "shape", "dtype"),
    [(pa.float32(), (0,), hb.float32), (pa.bool_(), (0,), hb.bool),
     (pa.fixed_shape_tensor(pa.int16(), [2, 3]), (0, 2, 3), hb.int16)],
    ids=["float32", "bool", "fixed_shape_tensor"],
)
def test_chunked_zero_chunks_is_an_empty_tensor(typ: pa.DataType, shape: tuple, dtype: hb.DType
                                                ) -> None:
    ch = pa.chunked_array([], typ)
    t = A.to_hurray(ch, copy=False)
    assert (t.shape, t.dtype, t.data_ptr, t.nbytes, t.copied) == (shape, dtype, 0, 0, False)


# ------------------------------------------------------------------------ pa.Tensor
@pytest.mark.parametrize(("dtype", "np_dtype"), PRIMITIVES, ids=PRIM_IDS)
def test_pa_tensor_round_trip_nd(dtype: hb.DType, np_dtype: Any) -> None:
    src = _values(np_dtype, 24, seed=8).reshape(2, 3, 4)
    pt = pa.Tensor.from_numpy(src)
    t = A.to_hurray(pt)
    assert (t.shape, t.dtype, t.strides) == ((2, 3, 4), dtype, None)
    assert t.data_ptr == src.ctypes.data and _bytes(t) == src.tobytes()
    back = A.from_hurray(t)
    assert isinstance(back, pa.Tensor) and back.shape == (2, 3, 4)
    assert back.to_numpy().ctypes.data == src.ctypes.data
    assert back.to_numpy().tobytes() == src.tobytes()


def test_pa_tensor_strides_come_through() -> None:
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4)
    view = base.transpose(2, 0, 1)
    pt = pa.Tensor.from_numpy(view)
    t = A.to_hurray(pt)
    assert t.shape == (4, 2, 3) and t.strides == (1, 12, 4) and t.data_ptr == base.ctypes.data
    assert np.array_equal(np.from_dlpack(t), view)
    back = A.from_hurray(t)
    assert back.strides == view.strides and back.to_numpy().ctypes.data == base.ctypes.data
    assert np.array_equal(back.to_numpy(), view)


@pytest.mark.parametrize(
    "view",
    [lambda a: a[:, ::2], lambda a: a.T, lambda a: np.broadcast_to(a[0], (3, 4))],
    ids=["gap", "transpose", "broadcast"],
)
def test_hb_strided_to_pa_tensor_is_zero_copy(view: Any) -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    v = view(base)
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        pt = A.from_hurray(hb.asarray(v), copy=False)
    n = pt.to_numpy()
    assert n.ctypes.data == v.ctypes.data and n.strides == v.strides
    assert np.array_equal(n, v)


def test_negative_strides_copy_for_pa_tensor() -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    v = base[:, ::-1]
    t = hb.asarray(v)
    with pytest.raises(hb.CopyRequiredError, match="negative strides"):
        A.from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="negative strides"):
        pt = A.from_hurray(t)
    assert np.array_equal(pt.to_numpy(), v)
    assert pt.to_numpy().ctypes.data != base.ctypes.data


def test_pa_tensor_read_only_flag_both_ways() -> None:
    src = np.arange(6, dtype=np.float32).reshape(2, 3)
    src.setflags(write=False)
    pt = A.from_hurray(hb.asarray(src))
    assert not pt.is_mutable
    assert A.to_hurray(pt).readonly
    writable = np.arange(6, dtype=np.float32).reshape(2, 3)
    pt = A.from_hurray(hb.asarray(writable))
    assert pt.is_mutable
    assert not A.to_hurray(pt).readonly


@pytest.mark.parametrize("shape", [(), (3, 0, 5), (0,), (0, 4)], ids=str)
def test_pa_tensor_rank0_and_empty(shape: tuple) -> None:
    src = np.full(shape, 7.5, np.float32)
    t = hb.asarray(src)
    pt = A.from_hurray(t, kind="tensor")
    assert isinstance(pt, pa.Tensor) and pt.shape == shape
    assert np.array_equal(pt.to_numpy(), src)
    back = A.to_hurray(pt)
    assert back.shape == shape
    if src.size == 0:
        assert (back.data_ptr, back.nbytes) == (0, 0)
    else:
        assert back.data_ptr == src.ctypes.data


@pytest.mark.parametrize("exports", [True, False], ids=["export-dlpack", "export-numpy"])
@pytest.mark.parametrize("imports", [True, False], ids=["import-dlpack", "import-numpy"])
def test_pa_tensor_paths_of_older_pyarrow(monkeypatch: pytest.MonkeyPatch, exports: bool,
                                          imports: bool) -> None:
    """pyarrow <= 25 has no Tensor.from_dlpack, < 21 no Tensor.__dlpack__: NumPy views instead."""
    monkeypatch.setattr(A, "_TENSOR_EXPORTS_DLPACK", exports and A._TENSOR_EXPORTS_DLPACK)
    monkeypatch.setattr(A, "_TENSOR_IMPORTS_DLPACK", imports and A._TENSOR_IMPORTS_DLPACK)
    base = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    for src in (base, base.transpose(2, 0, 1), base[0, 0, :1].reshape(()), base[:, :0]):
        pt = A.from_hurray(hb.asarray(src), kind="tensor")
        assert pt.shape == src.shape and np.array_equal(pt.to_numpy(), src)
        if src.size:
            assert pt.to_numpy().ctypes.data == src.ctypes.data
        t = A.to_hurray(pt)
        assert t.shape == src.shape and np.array_equal(np.from_dlpack(t), src)
        assert t.data_ptr == (src.ctypes.data if src.size else 0)
    frozen = base.copy()
    frozen.setflags(write=False)
    pt = A.from_hurray(hb.asarray(frozen))
    assert not pt.is_mutable and A.to_hurray(pt).readonly
    t = A.to_hurray(pa.Tensor.from_numpy(base), copy=True)
    assert t.copied and t.data_ptr != base.ctypes.data


def test_default_kind_follows_the_rank() -> None:
    assert isinstance(A.from_hurray(hb.asarray(np.zeros(3, np.int8))), pa.Array)
    assert isinstance(A.from_hurray(hb.asarray(np.zeros((), np.int8))), pa.Tensor)
    assert isinstance(A.from_hurray(hb.asarray(np.zeros((2, 3), np.int8))), pa.Tensor)
    assert isinstance(A.from_hurray(hb.asarray(np.zeros(3, np.int8)), kind="tensor"), pa.Tensor)


def test_kind_errors() -> None:
    t2 = hb.asarray(np.zeros((2, 3), np.int8))
    with pytest.raises(hb.UnsupportedError, match="kind='array' needs a rank-1"):
        A.from_hurray(t2, kind="array")
    with pytest.raises(hb.UnsupportedError, match="unknown kind 'table'"):
        A.from_hurray(t2, kind="table")
    with pytest.raises(hb.UnsupportedError, match="rank >= 2"):
        A.from_hurray(hb.asarray(np.zeros(3, np.int8)), kind="fixed_shape_tensor")
    with pytest.raises(hb.UnsupportedError, match="numbers only"):
        A.from_hurray(hb.asarray(np.zeros((2, 2), np.bool_)))


# ------------------------------------------------------------ FixedShapeTensorArray
def test_fixed_shape_tensor_from_hurray_zero_copy() -> None:
    src = _values(np.float32, 24, seed=9).reshape(4, 2, 3)
    arr = A.from_hurray(hb.asarray(src), kind="fixed_shape_tensor")
    assert isinstance(arr, pa.FixedShapeTensorArray)
    assert arr.type == pa.fixed_shape_tensor(pa.float32(), [2, 3]) and len(arr) == 4
    arr.validate(full=True)
    assert _addr(arr.storage.values) == src.ctypes.data
    assert arr.to_tensor().to_numpy().tobytes() == src.tobytes()


def test_fixed_shape_tensor_to_hurray_zero_copy() -> None:
    src = _values(np.float32, 24, seed=10).reshape(4, 2, 3)
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(src)
    t = A.to_hurray(arr)
    assert (t.shape, t.dtype, t.strides, t.readonly) == ((4, 2, 3), hb.float32, None, True)
    assert t.data_ptr == _addr(arr.storage.values) == src.ctypes.data
    assert _bytes(t) == src.tobytes()
    back = A.from_hurray(t, kind="fixed_shape_tensor")
    assert back.equals(arr) or _addr(back.storage.values) == src.ctypes.data
    assert _addr(back.storage.values) == src.ctypes.data


def test_fixed_shape_tensor_slices_fold_both_offsets() -> None:
    src = np.arange(10 * 6, dtype=np.int16).reshape(10, 2, 3)
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(src)
    part = arr[3:7]
    t = A.to_hurray(part)
    assert t.shape == (4, 2, 3) and t.data_ptr == src.ctypes.data + 3 * 6 * 2
    assert np.array_equal(np.from_dlpack(t), src[3:7])
    # An offset in the child values array as well as in the list array.
    values = pa.array(np.arange(100, dtype=np.int16))[5:95]
    storage = pa.FixedSizeListArray.from_arrays(values, 6)[2:4]
    ext = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int16(), [2, 3]), storage)
    t = A.to_hurray(ext)
    assert t.data_ptr == _addr(values) + (5 + 12) * 2
    assert np.array_equal(np.from_dlpack(t), np.arange(17, 29, dtype=np.int16).reshape(2, 2, 3))


def test_fixed_shape_tensor_permutation_maps_to_strides() -> None:
    base = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    view = base.transpose(0, 2, 1)  # each tensor (2, 3) stored column-major
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(view)
    assert arr.type.permutation == [1, 0] and arr.type.shape == [3, 2]
    t = A.to_hurray(arr)
    assert t.shape == (4, 2, 3) and t.strides == (6, 1, 2)
    assert t.data_ptr == base.ctypes.data
    assert np.array_equal(np.from_dlpack(t), view)
    # And back: a permuted Arrow type over the same memory that Arrow itself reads right.
    back = A.from_hurray(t, kind="fixed_shape_tensor")
    assert back.type.permutation == [1, 0] and back.type.shape == [3, 2]
    assert _addr(back.storage.values) == base.ctypes.data
    assert np.array_equal(back.to_tensor().to_numpy(), view)


def test_fixed_shape_tensor_ambiguous_permutation_is_refused() -> None:
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(24, dtype=np.int8)), 6)
    typ = pa.fixed_shape_tensor(pa.int8(), [1, 2, 3], permutation=[1, 2, 0])
    with pytest.raises(hb.UnsupportedError, match=r"permutation \[1, 2, 0\] is not its own"):
        A.to_hurray(pa.ExtensionArray.from_storage(typ, storage))


def test_fixed_shape_tensor_from_non_involutive_strides_copies() -> None:
    base = np.arange(2 * 30, dtype=np.int32).reshape(2, 5, 2, 3)
    view = base.transpose(0, 2, 3, 1)  # a 3-cycle: not representable unambiguously
    t = hb.asarray(view)
    with pytest.raises(hb.CopyRequiredError, match="copy=False"):
        A.from_hurray(t, kind="fixed_shape_tensor", copy=False)
    with pytest.warns(hb.CopyWarning):
        arr = A.from_hurray(t, kind="fixed_shape_tensor")
    assert arr.type.permutation is None and arr.type.shape == [2, 3, 5]
    assert np.array_equal(arr.to_tensor().to_numpy(), view)


def test_fixed_shape_tensor_nulls_are_refused() -> None:
    storage = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)), 6)
    typ = pa.fixed_shape_tensor(pa.float32(), [2, 3])
    with_null = pa.Array.from_buffers(storage.type, 2, [pa.py_buffer(b"\x01")],
                                      children=[storage.values])
    with pytest.raises(hb.UnsupportedError, match="fill_null"):
        A.to_hurray(pa.ExtensionArray.from_storage(typ, with_null))
    values = pa.array([1.0, None, 3.0, 4.0, 5.0, 6.0], pa.float32())
    inner_null = pa.FixedSizeListArray.from_arrays(values, 6)
    with pytest.raises(hb.UnsupportedError, match=r"values of this fixed_shape_tensor.*null"):
        A.to_hurray(pa.ExtensionArray.from_storage(typ, inner_null))


@pytest.mark.parametrize("shape", [(0, 2, 3), (3, 0, 5)], ids=str)
def test_fixed_shape_tensor_empty(shape: tuple) -> None:
    t = hb.asarray(np.zeros(shape, np.float32))
    arr = A.from_hurray(t, kind="fixed_shape_tensor")
    arr.validate(full=True)
    assert len(arr) == shape[0] and arr.type.shape == list(shape[1:])
    back = A.to_hurray(arr)
    assert (back.shape, back.data_ptr, back.nbytes) == (shape, 0, 0)


def test_fixed_shape_tensor_of_bits() -> None:
    vals = [bool(b) for b in np.random.default_rng(11).integers(0, 2, 4 * 6)]
    flat = _bool_tensor(vals)
    t = hb.Tensor._dense(flat.data_ptr, (4, 2, 3), hb.bool, strides=None, padded=False,
                         device=hb.CPU, owner=flat, readonly=True, copied=False)
    arr = A.from_hurray(t, kind="fixed_shape_tensor")
    assert arr.type.value_type == pa.bool_()
    assert _addr(arr.storage.values) == flat.data_ptr
    assert [b for row in arr.storage.to_pylist() for b in row] == vals
    back = A.to_hurray(arr)
    assert back.shape == (4, 2, 3) and back.data_ptr == flat.data_ptr
    # Rows of 3 bits: the second row starts at bit 3, off a byte, so a slice copies.
    odd = A.from_hurray(hb.Tensor._dense(flat.data_ptr, (8, 3), hb.bool, strides=None,
                                         padded=False, device=hb.CPU, owner=flat, readonly=True,
                                         copied=False), kind="fixed_shape_tensor")
    with pytest.raises(hb.CopyRequiredError):
        A.to_hurray(odd[1:], copy=False)
    assert _unpack_bits(_bytes(A.to_hurray(odd[1:])), 21) == vals[3:]


def test_fixed_shape_tensor_copy_true_and_bool8_values() -> None:
    src = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(src)
    t = A.to_hurray(arr, copy=True)
    assert t.copied and not t.readonly and t.data_ptr != src.ctypes.data
    assert np.array_equal(np.from_dlpack(t), src)
    out = A.from_hurray(hb.asarray(src), kind="fixed_shape_tensor", copy=True)
    assert _addr(out.storage.values) != src.ctypes.data
    assert np.array_equal(out.to_tensor().to_numpy(), src)
    flags = np.random.default_rng(12).integers(0, 2, (3, 2, 2)).astype(np.bool_)
    b8 = A.from_hurray(hb.asarray(flags), kind="fixed_shape_tensor")
    assert b8.type.value_type == pa.bool8()
    assert _addr(b8.storage.values.storage) == flags.ctypes.data
    back = A.to_hurray(b8)
    assert back.dtype is hb.bool8 and back.data_ptr == flags.ctypes.data
    assert np.array_equal(np.from_dlpack(back), flags)


def test_other_extension_types_are_refused() -> None:
    uuids = pa.ExtensionArray.from_storage(pa.uuid(), pa.array([b"0" * 16], pa.binary(16)))
    with pytest.raises(hb.UnsupportedError, match="uuid"):
        A.to_hurray(uuids)


@settings(max_examples=200, deadline=None)
@given(
    which=st.sampled_from(range(len(PRIMITIVES) + 1)),
    n=st.integers(0, 80),
    start=st.integers(0, 80),
    length=st.integers(0, 80),
)
def test_any_slice_round_trips_bit_exact(which: int, n: int, start: int, length: int) -> None:
    if which == len(PRIMITIVES):  # bool: any bit offset
        vals = [bool(b) for b in np.random.default_rng(n).integers(0, 2, n)]
        part = pa.array(vals, pa.bool_())[start:start + length]
        t = A.to_hurray(part)
        expect = vals[start:start + length]
        assert _unpack_bits(_bytes(t), len(expect)) == expect
        assert t.copied == bool(expect and part.offset % 8)
        assert A.from_hurray(t).to_pylist() == expect
        return
    _, np_dtype = PRIMITIVES[which]
    src = _values(np_dtype, n, seed=n)
    part = pa.array(src)[start:start + length]
    t = A.to_hurray(part, copy=False)
    expect = src[start:start + length]
    assert _bytes(t) == expect.tobytes()
    back = A.from_hurray(t, copy=False)
    assert _arrow_bytes(back) == expect.tobytes()
    if expect.size:
        assert t.data_ptr == _addr(part) + part.offset * src.itemsize == _addr(back)


# ----------------------------------------------------------------- strided rank 1
def test_strided_rank1_needs_a_compact_copy() -> None:
    src = np.arange(20, dtype=np.float64)
    t = hb.asarray(src[::2])
    with pytest.raises(hb.CopyRequiredError, match=r"stride 2.*copy=False"):
        A.from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="stride 2"):
        arr = A.from_hurray(t)
    assert arr.to_pylist() == src[::2].tolist()
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        assert A.from_hurray(t, copy=True).to_pylist() == src[::2].tolist()
    with pytest.warns(hb.CopyWarning, match="stride -1"):
        assert A.from_hurray(hb.asarray(src[::-1])).to_pylist() == src[::-1].tolist()


# ------------------------------------------------------- across frameworks (pointers)
def test_numpy_to_hb_to_arrow_pointer_identity() -> None:
    src = np.arange(1000, dtype=np.float32)
    arr = hb.convert(src, "arrow")
    assert isinstance(arr, pa.Array) and _addr(arr) == src.ctypes.data


def test_arrow_to_hb_to_numpy_pointer_identity_and_read_only() -> None:
    arr = pa.array(np.arange(1000, dtype=np.int64))[10:]
    out = hb.convert(arr, "numpy")
    assert out.ctypes.data == _addr(arr) + 80
    assert not out.flags.writeable  # Arrow memory is immutable
    assert np.array_equal(out, np.arange(10, 1000))


def test_arrow_to_hb_to_torch_pointer_identity() -> None:
    torch = pytest.importorskip("torch")
    arr = pa.array(np.arange(100, dtype=np.float32))[5:]
    if importlib.util.find_spec("hurray_bridge.adapters.torch") is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch may warn that the memory is read-only
            x = hb.convert(arr, "torch")
    else:
        x = torch.from_dlpack(A.to_hurray(arr))
    assert x.data_ptr() == _addr(arr) + 20
    assert x.tolist() == list(range(5, 100))


def test_asarray_finds_the_arrow_adapter() -> None:
    arr = pa.array([1, 2, 3], pa.uint16())
    t = hb.asarray(arr)
    assert t.dtype is hb.uint16 and t.data_ptr == _addr(arr)
    assert hb.get_adapter("arrow") is A and hb.get_adapter("pyarrow") is A


# ------------------------------------------------------------------------ lifetime
def test_arrow_array_lives_while_the_tensor_or_a_consumer_lives() -> None:
    arr = pa.array(np.arange(50, dtype=np.int32))
    ref = weakref.ref(arr)
    t = A.to_hurray(arr)
    del arr
    gc.collect()
    assert ref() is not None
    consumer = np.from_dlpack(t)
    del t
    gc.collect()
    assert ref() is not None
    assert consumer.sum() == sum(range(50))
    del consumer
    gc.collect()
    assert ref() is None


def test_hb_source_lives_while_the_arrow_result_lives() -> None:
    for kind in ("array", "tensor", "fixed_shape_tensor"):
        src = np.arange(24, dtype=np.float64).reshape(4, 6)
        if kind == "array":
            src = src.reshape(-1)
        ref = weakref.ref(src)
        out = A.from_hurray(hb.asarray(src), kind=kind)
        del src
        gc.collect()
        assert ref() is not None, kind
        # Derived Arrow objects keep the memory too.
        derived = out.slice(1) if kind != "tensor" else out
        del out
        gc.collect()
        assert ref() is not None, kind
        del derived
        gc.collect()
        assert ref() is None, kind


def test_fixed_shape_tensor_source_lives_while_the_tensor_lives() -> None:
    arr = pa.FixedShapeTensorArray.from_numpy_ndarray(np.ones((3, 2, 2), np.float32))
    ref = weakref.ref(arr)
    t = A.to_hurray(arr)
    del arr
    gc.collect()
    assert ref() is not None
    del t
    gc.collect()
    assert ref() is None


# ---------------------------------------------------------- empty arrays downstream
def test_empty_result_survives_arrow_machinery() -> None:
    arr = A.from_hurray(hb.asarray(np.zeros(0, np.int32)))
    assert arr.buffers()[1].address == 0
    assert pa.concat_arrays([arr, pa.array([1], pa.int32())]).to_pylist() == [1]
    sink = io.BytesIO()
    batch = pa.record_batch([arr], names=["a"])
    with ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    assert ipc.open_stream(sink.getvalue()).read_all().num_rows == 0
    assert len(pa.Array._import_from_c_capsule(*arr.__arrow_c_array__())) == 0


# -------------------------------------------------------------------------- devices
class FakeCuda:
    """A producer that claims CUDA memory (backed by host memory nobody dereferences)."""

    def __init__(self, host: np.ndarray) -> None:
        self.host = host

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: bool | None = None) -> object:
        if dl_device is not None and tuple(dl_device) == (1, 0):
            return self.host.copy().__dlpack__(max_version=max_version)
        code, bits = hb.dtypes.dtype_from_name(self.host.dtype.name).dlpack  # type: ignore[misc]
        return _capsule.make_capsule(
            data=self.host.ctypes.data, shape=self.host.shape,
            strides=compact_strides(self.host.shape), code=code, bits=bits, device_type=2,
            device_id=0, flags=0, owner=self.host, versioned=True)


def test_device_tensor_is_copied_to_host_only_when_allowed() -> None:
    host = np.arange(8, dtype=np.float32)
    t = hb.from_dlpack(FakeCuda(host))
    assert t.device == hb.Device(2, 0)
    with pytest.raises(hb.CopyRequiredError, match=r"cuda:0.*copy=False"):
        A.from_hurray(t, copy=False)
    with pytest.warns(hb.CopyWarning, match="cuda:0"):
        arr = A.from_hurray(t)
    assert arr.to_pylist() == host.tolist() and _addr(arr) != host.ctypes.data
    with warnings.catch_warnings():
        warnings.simplefilter("error", hb.CopyWarning)
        assert A.from_hurray(t, copy=True).to_pylist() == host.tolist()


def test_device_argument_must_be_the_host() -> None:
    t = hb.asarray(np.zeros(3, np.int8))
    assert len(A.from_hurray(t, device="cpu")) == 3
    with pytest.raises(hb.UnsupportedError, match="host"):
        A.from_hurray(t, device="cuda")


def test_non_dense_tensors_are_refused() -> None:
    desc = hb.Descriptor((2, 3), hb.float32, hb.Layout.CSR,
                         sparse=hb.Sparse(nnz=0, index_dtype=hb.int32))
    indptr = (ctypes.c_int32 * 3)()  # all zero: no stored entries
    t = hb.Tensor(desc, [hb.Buffer(b.role, ctypes.addressof(indptr) if b.nbytes else 0, b.nbytes)
                         for b in desc.buffer_layout()], owner=indptr)
    with pytest.raises(hb.UnsupportedError, match="dense"):
        A.from_hurray(t)
