"""hb.Tensor and the Arrow PyCapsule interface, with real consumers and producers: pyarrow,
polars, nanoarrow and DuckDB take a tensor directly, and their arrays come back through
``hb.asarray``; zero-copy is proven by comparing buffer addresses.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

import hurray_bridge as hb
from hurray_bridge import _arrow_c
from hurray_bridge.errors import CopyRequiredError, UnsupportedError

np = pytest.importorskip("numpy", reason="numpy is not installed")
pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")

NUMERIC = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
           np.float16, np.float32, np.float64]
SHAPES = [(0,), (7,), (5, 3), (2, 3, 4), (4, 0), (0, 2, 2)]


class OnlyArrowArray:
    """An object that speaks ``__arrow_c_array__`` and nothing else: no DLPack, no adapter."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self.inner.__arrow_c_array__(requested_schema)


def _values_address(arr: Any) -> int:
    """The address of the values buffer of a primitive or fixed_shape_tensor array."""
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    while pa.types.is_fixed_size_list(arr.type):
        arr = arr.values
    return int(arr.buffers()[1].address)


def _source(dtype: Any, shape: tuple[int, ...]) -> Any:
    return (np.arange(int(np.prod(shape))) % 11).astype(dtype).reshape(shape)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_pa_array_of_a_tensor_is_zero_copy(dtype: Any, shape: tuple[int, ...]) -> None:
    src = _source(dtype, shape)
    arr = pa.array(hb.asarray(src))
    assert len(arr) == shape[0]
    if len(shape) == 1:
        assert arr.type == pa.from_numpy_dtype(np.dtype(dtype))
        got = arr.to_numpy(zero_copy_only=False)
    else:
        assert arr.type == pa.fixed_shape_tensor(pa.from_numpy_dtype(np.dtype(dtype)),
                                                 list(shape[1:]))
        got = arr.to_numpy_ndarray() if len(arr) else np.zeros(shape, dtype)
    if src.size:
        assert _values_address(arr) == src.ctypes.data  # zero-copy
    np.testing.assert_array_equal(got, src)


def test_bool_tensors_become_bool8_arrays() -> None:
    src = np.array([True, False, True, True])
    arr = pa.array(hb.asarray(src))
    assert arr.type == pa.bool8()
    assert arr.storage.buffers()[1].address == src.ctypes.data
    assert arr.to_pylist() == [True, False, True, True]


def test_the_array_holds_the_tensor_and_releases_it() -> None:
    t = hb.asarray(np.arange(12.0).reshape(4, 3))
    ref = weakref.ref(t)
    arr = pa.array(t)
    del t
    gc.collect()
    assert ref() is not None
    sliced = arr.slice(1, 2)  # a slice keeps the same memory
    del arr
    gc.collect()
    assert ref() is not None and sliced.to_numpy_ndarray()[0, 0] == 3.0
    del sliced
    gc.collect()
    assert ref() is None and _arrow_c.live_arrow_exports() == 0


def test_pa_array_with_a_type_request() -> None:
    t = hb.asarray(np.arange(6, dtype=np.int32))
    assert pa.array(t, type=pa.int32()).to_pylist() == list(range(6))
    with pytest.raises(UnsupportedError, match="requested_schema"):
        pa.array(t, type=pa.int64())


def test_chunked_array_and_table_of_tensors() -> None:
    a, b = np.arange(6.0).reshape(2, 3), np.arange(6.0, 15.0).reshape(3, 3)
    ca = pa.chunked_array([pa.array(hb.asarray(a)), pa.array(hb.asarray(b))])
    assert ca.num_chunks == 2 and len(ca) == 5
    assert _values_address(ca.chunk(0)) == a.ctypes.data
    table = pa.table({"x": hb.asarray(a)})
    assert _values_address(table.column("x").chunk(0)) == a.ctypes.data
    # Back to one tensor: two chunks are one copy (the arrow adapter joins them).
    whole = hb.asarray(ca)
    np.testing.assert_array_equal(np.from_dlpack(whole), np.concatenate([a, b]))


@pytest.mark.parametrize("shape", [(6,), (2, 3), (2, 2, 2)], ids=str)
def test_a_pyarrow_array_seen_only_through_the_interface(shape: tuple[int, ...]) -> None:
    src = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    arr = pa.array(src.ravel()) if len(shape) == 1 else \
        pa.FixedShapeTensorArray.from_numpy_ndarray(src)
    t = hb.asarray(OnlyArrowArray(arr))
    assert t.shape == shape and t.readonly and not t.copied
    assert t.data_ptr == _values_address(arr)
    np.testing.assert_array_equal(np.from_dlpack(t), src)


def test_pyarrow_nulls_and_sliced_booleans_through_the_interface() -> None:
    with pytest.raises(UnsupportedError, match="holds nulls"):
        hb.asarray(OnlyArrowArray(pa.array([1, None, 3])))
    bits = pa.array([True, False, True, True, False, False, True, False, True]).slice(3)
    t = hb.asarray(OnlyArrowArray(bits))
    assert t.dtype == hb.bool and t.copied
    assert bytes(t.memoryview()) == bytes([0b101001])  # the six bits, moved to bit 0
    with pytest.raises(CopyRequiredError):
        hb.asarray(OnlyArrowArray(bits), copy=False)


def test_polars_series_of_a_tensor_and_back() -> None:
    pl = pytest.importorskip("polars", reason="polars is not installed")
    src = np.arange(12, dtype=np.int32).reshape(4, 3)
    s = pl.Series(hb.asarray(src))
    assert len(s) == 4
    back = hb.asarray(s)  # a Series speaks only __arrow_c_stream__
    assert back.shape == (4, 3) and back.data_ptr == src.ctypes.data  # both ways zero-copy
    flat = pl.Series("x", [1.5, 2.5, 3.5])
    t = hb.asarray(flat)
    assert t.dtype == hb.float64 and np.from_dlpack(t).tolist() == [1.5, 2.5, 3.5]
    arr_type = pl.Series([[1, 2], [3, 4]], dtype=pl.Array(pl.Int16, 2))
    u = hb.asarray(arr_type)
    assert (u.shape, u.dtype) == ((2, 2), hb.int16)


def test_polars_series_of_several_chunks_is_joined_by_a_copy() -> None:
    pl = pytest.importorskip("polars", reason="polars is not installed")
    s = pl.concat([pl.Series([1, 2]), pl.Series([3, 4, 5])], rechunk=False)
    assert s.n_chunks() == 2
    t = hb.asarray(s)
    assert t.copied and np.from_dlpack(t).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(CopyRequiredError, match="2 chunks"):
        hb.asarray(s, copy=False)
    with pytest.raises(UnsupportedError, match="holds nulls"):
        hb.asarray(pl.Series([1, None]))


def test_nanoarrow_arrays_both_ways() -> None:
    na = pytest.importorskip("nanoarrow", reason="nanoarrow is not installed")
    src = np.arange(8, dtype=np.uint16).reshape(2, 4)
    c = na.c_array(hb.asarray(src))
    assert c.length == 2 and c.child(0).length == 8
    back = hb.asarray(c)  # a nanoarrow CArray speaks only __arrow_c_array__
    assert back.data_ptr == src.ctypes.data
    t = hb.asarray(na.c_array([1, 2, 3], na.int32()))
    assert (t.shape, t.dtype, np.from_dlpack(t).tolist()) == ((3,), hb.int32, [1, 2, 3])
    s = hb.asarray(na.Array([4.0, 5.0], na.float64()))
    assert np.from_dlpack(s).tolist() == [4.0, 5.0]


def test_duckdb_queries_a_table_built_from_tensors() -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed")
    ids = np.arange(5, dtype=np.int64)
    scores = np.array([0.5, 1.5, 2.5, 3.5, 4.5])
    table = pa.table({"id": hb.asarray(ids), "score": hb.asarray(scores)})
    con = duckdb.connect()
    try:
        con.register("t", table)
        rel = con.sql("SELECT score FROM t WHERE id >= 2 ORDER BY id")
        # duckdb 1.x names it arrow(), 2.x to_arrow_table().
        fetch = getattr(rel, "to_arrow_table", None) or rel.arrow
        out = fetch()
    finally:
        con.close()
    t = hb.asarray(out.column("score"))
    assert np.from_dlpack(t).tolist() == [2.5, 3.5, 4.5]


def test_consumers_alive_at_exit_release_cleanly() -> None:
    # In a child: pyarrow and polars objects over tensors live until the interpreter tears
    # the bridge's modules down, and their release callbacks must still work then.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import numpy as np, pyarrow as pa, hurray_bridge as hb
        src = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
        table = pa.table({"x": hb.asarray(src)})
        flat = pa.array(hb.asarray(np.arange(3)))
        try:
            import polars as pl
            series = pl.Series(hb.asarray(src))
            back = hb.asarray(series)  # held through a released stream's array
        except ImportError:
            pass
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "ok", "")


def test_duckdb_scans_a_tensor_directly() -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed")
    t = hb.asarray(np.arange(12, dtype=np.float32).reshape(4, 3))  # noqa: F841 (scanned by name)
    rel = duckdb.sql("SELECT * FROM t")
    assert [str(x) for x in rel.types] == ["FLOAT[3]"]  # the fixed_shape_tensor's storage
    assert rel.fetchall()[1] == ((3.0, 4.0, 5.0),)
    c = hb.asarray(np.zeros(3, dtype=np.complex64))  # noqa: F841
    with pytest.raises(Exception, match="no type for complex64"):  # duckdb wraps our error
        duckdb.sql("SELECT * FROM c").fetchall()
